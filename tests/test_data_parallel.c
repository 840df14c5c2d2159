/* DataParallel (include/ember/parallel.h): over two devices it trains as one device does
 * (losses within 1e-5 for 100 steps, the replicas bit-identical to the model after every
 * step), the batch splits as torch.chunk, and bad input gives clear errors. ctest runs it
 * with two PoCL devices (EMBER_TWO_POCL_TESTS). */
#include <stdlib.h>
#include "test.h"
#include <ember/amp.h>

static em_module *mlp(void) {
    return em_nn_sequential(em_nn_linear(20, 32), em_nn_relu(), em_nn_linear(32, 5));
}

static int opencl_devices(void) {
    return em_device_available(EM_OPENCL) ? em_device_count(EM_OPENCL) : 0;
}

/* Largest |a - b| over every parameter of two modules (on any devices). */
static double params_diff(em_module *a, em_module *b) {
    em_named_tensor pa[8], pb[8];
    int n = em_module_parameters(a, pa, 8);
    if (n != em_module_parameters(b, pb, 8)) return INFINITY;
    double worst = 0;
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *d = em_max(em_abs(em_sub(em_cpu(pa[i].tensor), em_cpu(pb[i].tensor))), EM_ALL_DIMS, false);
        double v = d ? em_item(d) : INFINITY;
        if (v > worst || v != v) worst = v;
    }
    em_scope_end(s);
    return worst;
}

/* The batches of the comparison: fixed, on the CPU. */
#define STEPS 100
#define BATCH 32

/* 100 Adam steps of the same model and batches on `dev` alone and with DataParallel over
 * devs: the losses agree within 1e-5 and every replica equals the model bit for bit. */
static void compare_training(const em_device *devs, int n) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_tensor *xs = em_randn(EM_SHAPE(STEPS, BATCH, 20), EM_OPTS(0));
    em_tensor *ys = em_randint(0, 5, EM_SHAPE(STEPS, BATCH), EM_OPTS(.dtype = EM_I64));
    em_manual_seed(1);
    em_module *single = mlp();
    em_manual_seed(1);
    em_module *model = mlp();
    CHECK(single && model && xs && ys);
    if (!single || !model) goto out;
    CHECK(params_diff(single, model) == 0.0);
    CHECK_OK(em_module_to(single, devs[0]));
    CHECK_OK(em_module_to(model, devs[0]));
    em_optimizer *o1 = em_adam(single, 1e-2), *o2 = em_adam(model, 1e-2);
    em_dp *dp = em_data_parallel(model, devs, n);
    CHECK(dp && o1 && o2);
    if (!dp || !o1 || !o2) goto free_opt;
    CHECK(em_dp_device_count(dp) == n && em_dp_module(dp) == model && em_dp_replica(dp, 0) == model);
    for (int i = 1; i < n; i++) CHECK(em_device_equal(em_device_of(em_forward(em_dp_replica(dp, i), em_zeros(EM_SHAPE(1, 20), EM_OPTS(.device = devs[i])))), devs[i]));
    double worst = 0, worst_replica = 0;
    for (int step = 0; step < STEPS; step++) {
        em_scope it = em_scope_begin();
        em_tensor *x = em_select(xs, 0, step), *y = em_select(ys, 0, step);
        em_tensor *yd = em_to(y, devs[0]);
        CHECK_OK(em_zero_grad(o1));
        em_tensor *l1 = em_cross_entropy(em_forward(single, em_to(x, devs[0])), yd, 0.0);
        CHECK_OK(em_backward(l1));
        CHECK_OK(em_step(o1));
        CHECK_OK(em_zero_grad(o2));
        em_tensor *out = em_dp_forward(dp, x);   /* x on the CPU: scattered from there */
        CHECK(out && em_device_equal(em_device_of(out), devs[0]) && em_size(out, 0) == BATCH);
        em_tensor *l2 = em_cross_entropy(out, yd, 0.0);
        CHECK_OK(em_dp_backward(dp, l2));
        CHECK_OK(em_dp_step(dp, o2));
        double d = fabs(em_item(l1) - em_item(l2));
        if (!(d <= worst)) worst = d;
        for (int i = 1; i < n; i++) {
            double r = params_diff(model, em_dp_replica(dp, i));
            if (!(r <= worst_replica)) worst_replica = r;
        }
        em_scope_end(it);
        if (em_failed()) break;
    }
    printf("  %s..%s: largest loss difference %.3g, replicas differ by %.3g, parameters by %.3g\n",
           em_device_str(devs[0]).s, em_device_str(devs[n - 1]).s, worst, worst_replica, params_diff(model, single));
    CHECK(worst <= 1e-5);
    CHECK(worst_replica == 0.0);
    CHECK(params_diff(model, single) <= 1e-4);
free_opt:
    em_dp_free(dp);
    em_optim_free(o1);
    em_optim_free(o2);
out:
    em_module_free(single);
    em_module_free(model);
    em_scope_end(s);
}

static void test_two_opencl_devices(void) {
    if (opencl_devices() < 2) SKIP("needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\"), found %d", opencl_devices());
    em_device devs[] = {EM_DEVICE(EM_OPENCL, 0), EM_DEVICE(EM_OPENCL, 1)};
    compare_training(devs, 2);
}

static void test_cpu_and_opencl(void) {
    if (opencl_devices() < 1) SKIP("needs an OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_device devs[] = {EM_DEVICE_CPU, EM_DEVICE(EM_OPENCL, 0)};
    compare_training(devs, 2);
    em_device rev[] = {EM_DEVICE(EM_OPENCL, 0), EM_DEVICE_CPU};
    compare_training(rev, 2);
}

static void test_one_device(void) {
    em_device cpu[] = {EM_DEVICE_CPU};
    compare_training(cpu, 1);
}

/* Two devices the machine has: two OpenCL ones, else the CPU and one, else none (0). */
static int two_devices(em_device *devs) {
    int n = opencl_devices();
    if (n >= 2) devs[0] = EM_DEVICE(EM_OPENCL, 0), devs[1] = EM_DEVICE(EM_OPENCL, 1);
    else if (n == 1) devs[0] = EM_DEVICE_CPU, devs[1] = EM_DEVICE(EM_OPENCL, 0);
    else return 0;
    return 2;
}

/* torch.chunk's split: 3 rows over 2 devices are 2 + 1; 1 row uses only the first device
 * (PyTorch's DataParallel with a batch smaller than its device count); either way the
 * output has every row, on devices[0], and backward works. */
static void test_small_batches(void) {
    em_device devs[2];
    if (!two_devices(devs)) SKIP("needs a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_module *model = mlp();
    CHECK_OK(em_module_to(model, devs[0]));
    em_optimizer *opt = em_sgd(model, 0.1);
    em_dp *dp = em_data_parallel(model, devs, 2);
    CHECK(dp != NULL);
    for (int rows = 1; rows <= 3 && dp; rows++) {
        em_tensor *x = em_randn(EM_SHAPE(rows, 20), EM_OPTS(0));
        em_tensor *out = em_dp_forward(dp, x);
        CHECK(out && em_size(out, 0) == rows && em_size(out, 1) == 5);
        /* the same numbers as the model alone */
        em_tensor *ref = em_forward(model, em_to(x, devs[0]));
        em_tensor *d = em_max(em_abs(em_sub(out, ref)), EM_ALL_DIMS, false);
        CHECK(d && em_item(d) <= 1e-5);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_dp_backward(dp, em_sum(out, EM_ALL_DIMS, false)));
        em_named_tensor p[4];
        CHECK(em_module_parameters(model, p, 4) == 4);
        CHECK(em_grad(p[0].tensor) != NULL);
        /* the replica's own gradients were handed over: none left behind */
        em_named_tensor r[4];
        CHECK(em_module_parameters(em_dp_replica(dp, 1), r, 4) == 4);
        CHECK(em_grad(r[0].tensor) == NULL);
        CHECK_OK(em_dp_step(dp, opt));
        CHECK(params_diff(model, em_dp_replica(dp, 1)) == 0.0);
    }
    /* an input that requires grad: the replicas' backwards leave it alone (no graph into it) */
    em_tensor *xg = em_randn(EM_SHAPE(4, 20), EM_OPTS(.requires_grad = true));
    CHECK_OK(em_zero_grad(opt));
    CHECK_OK(em_dp_backward(dp, em_sum(em_dp_forward(dp, xg), EM_ALL_DIMS, false)));
    CHECK(em_grad(xg) == NULL);
    /* no grad mode: an output and no graph kept */
    em_grad_mode g = em_no_grad_begin();
    em_tensor *out = em_dp_forward(dp, em_randn(EM_SHAPE(4, 20), EM_OPTS(0)));
    em_no_grad_end(g);
    CHECK(out && !em_requires_grad(out) && em_size(out, 0) == 4);
    CHECK(em_dp_backward(dp, em_sum(out, EM_ALL_DIMS, false)) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "no em_dp_forward output with a graph");
    em_dp_free(dp);
    em_optim_free(opt);
    em_module_free(model);
    em_scope_end(s);
}

static void test_bad_arguments(void) {
    em_scope s = em_scope_begin();
    em_module *model = mlp();
    em_device cpu[] = {EM_DEVICE_CPU, EM_DEVICE_CPU};
    CHECK(em_data_parallel(model, cpu, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 1 to 64 devices, got 0 (an empty device list)");
    CHECK(em_data_parallel(model, NULL, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the device list is NULL");
    CHECK(em_data_parallel(NULL, cpu, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the module is NULL");
    CHECK(em_data_parallel(model, cpu, 2) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "device cpu is listed twice (entries 0 and 1)");
    em_device missing[] = {EM_DEVICE_CPU, EM_DEVICE(EM_OPENCL, 7)};
    CHECK(em_data_parallel(model, missing, 2) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "device 1 (opencl:7) does not exist");
    /* an earlier, unrelated error neither stops a valid call nor hides a new one */
    em_error(EM_ERR_SHAPE, "earlier");
    em_dp *one = em_data_parallel(model, cpu, 1);
    CHECK(one != NULL);
    em_dp_free(one);
    CHECK(em_data_parallel(model, cpu, 2) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "device cpu is listed twice");

    em_device devs[2];
    if (two_devices(devs)) {
        /* the model elsewhere than devices[0]: PyTorch's error */
        em_device wrong[] = {devs[1], devs[0]};
        CHECK_OK(em_module_to(model, devs[0]));
        CHECK(em_data_parallel(model, wrong, 2) == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "module must have its parameters and buffers on device");
        em_dp *dp = em_data_parallel(model, devs, 2);
        CHECK(dp != NULL);
        /* an empty batch, a 0-dim input */
        CHECK(em_dp_forward(dp, em_zeros(EM_SHAPE(0, 20), EM_OPTS(0))) == NULL);
        CHECK_ERROR(EM_ERR_SHAPE, "an empty batch (dim 0 has size 0)");
        CHECK(em_dp_forward(dp, em_scalar(1.0, EM_OPTS(0))) == NULL);
        CHECK_ERROR(EM_ERR_SHAPE, "a 0-dim tensor");
        CHECK(em_dp_forward(dp, NULL) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, "input is NULL");
        /* a replica fails on its own thread: the caller gets the error, naming the replica */
        CHECK(em_dp_forward(dp, em_randn(EM_SHAPE(4, 19), EM_OPTS(0))) == NULL);
        CHECK_ERROR(EM_ERR_SHAPE, "em_dp_forward: replica 0 on ");
        CHECK(!em_failed());
        /* backward with no forward, with a loss that does not use the output */
        CHECK(em_dp_backward(dp, em_sum(em_randn(EM_SHAPE(2), EM_OPTS(.requires_grad = true)), EM_ALL_DIMS, false)) != EM_OK);
        CHECK_ERROR(EM_ERR_AUTOGRAD, "no em_dp_forward output");
        em_tensor *out = em_dp_forward(dp, em_randn(EM_SHAPE(4, 20), EM_OPTS(0)));
        CHECK(out != NULL);
        em_tensor *other = em_sum(em_randn(EM_SHAPE(2), EM_OPTS(.requires_grad = true)), EM_ALL_DIMS, false);
        CHECK(em_dp_backward(dp, other) == EM_ERR_AUTOGRAD);
        CHECK_ERROR(EM_ERR_AUTOGRAD, "the loss does not depend on the output");
        /* the model moved away from devices[0] after em_data_parallel */
        CHECK_OK(em_module_to(model, devs[1]));
        CHECK(em_dp_forward(dp, em_randn(EM_SHAPE(4, 20), EM_OPTS(0))) == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "module must have its parameters and buffers on device");
        CHECK_OK(em_module_to(model, devs[0]));
        /* the model gained a parameter */
        CHECK_OK(em_module_add_parameter(model, "extra", em_zeros(EM_SHAPE(2), EM_OPTS(.device = devs[0]))));
        CHECK(em_dp_forward(dp, em_randn(EM_SHAPE(4, 20), EM_OPTS(0))) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, "gained or lost parameters");
        CHECK(em_dp_step(dp, NULL) == EM_ERR_ARGUMENT);
        CHECK_ERROR(EM_ERR_ARGUMENT, "the optimizer is NULL");
        em_dp_free(dp);
    } else {
        test_skip("the two-device errors need a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    }
    em_dp_free(NULL);
    CHECK(em_dp_forward(NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the em_dp is NULL");
    em_module_free(model);
    em_scope_end(s);
}

/* em_dp_sync after weights change outside em_dp_step (a checkpoint loaded, a manual edit). */
static void test_sync(void) {
    em_device devs[2];
    if (!two_devices(devs)) SKIP("needs a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_module *model = mlp();
    CHECK_OK(em_module_to(model, devs[0]));
    em_dp *dp = em_data_parallel(model, devs, 2);
    CHECK(dp && params_diff(model, em_dp_replica(dp, 1)) == 0.0);
    em_named_tensor p[4];
    CHECK(em_module_parameters(model, p, 4) == 4);
    em_grad_mode g = em_no_grad_begin();
    CHECK_OK(em_add_(p[0].tensor, em_ones_like(p[0].tensor), 1.0));
    em_no_grad_end(g);
    CHECK(params_diff(model, em_dp_replica(dp, 1)) > 0.5);
    CHECK_OK(em_dp_sync(dp));
    CHECK(params_diff(model, em_dp_replica(dp, 1)) == 0.0);
    /* a replica's repr is the model's (it shares the modules' private data) */
    char a[512], b[512];
    em_module_format(model, a, sizeof a);
    em_module_format(em_dp_replica(dp, 1), b, sizeof b);
    CHECK(!strcmp(a, b) && strstr(a, "in_features=20"));
    em_dp_free(dp);
    em_module_free(model);
    em_scope_end(s);
}

/* The replicas follow the model into eval mode (no dropout) and back; a dtype change of the
 * model after em_data_parallel is an error, not replicas silently computing in the old one. */
static void test_mode_and_dtype(void) {
    em_device devs[2];
    if (!two_devices(devs)) SKIP("needs a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_module *model = em_nn_sequential(em_nn_linear(20, 32), em_nn_dropout(0.5), em_nn_linear(32, 5));
    CHECK_OK(em_module_to(model, devs[0]));
    em_dp *dp = em_data_parallel(model, devs, 2);
    CHECK(dp != NULL);
    em_tensor *x = em_randn(EM_SHAPE(8, 20), EM_OPTS(0));
    em_module_eval(model);
    em_grad_mode g = em_no_grad_begin();
    em_tensor *out = em_dp_forward(dp, x);
    em_tensor *ref = em_forward(model, em_to(x, devs[0]));
    em_tensor *d = em_max(em_abs(em_sub(out, ref)), EM_ALL_DIMS, false);
    CHECK(d && em_item(d) <= 1e-5);   /* a replica still training would drop half its units */
    CHECK(!em_module_is_training(em_module_child(em_dp_replica(dp, 1), 1)));
    em_module_train(model);
    CHECK(em_dp_forward(dp, x) != NULL);
    CHECK(em_module_is_training(em_module_child(em_dp_replica(dp, 1), 1)));
    em_no_grad_end(g);
    CHECK_OK(em_module_to_dtype(model, EM_F64));
    CHECK(em_dp_forward(dp, x) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "the module's dtype changed after em_data_parallel");
    em_dp_free(dp);
    em_module_free(model);
    em_scope_end(s);
}

/* A custom module: its ctx (shared by the replicas) names a device it refuses; its weight is
 * reached through the module, as parallel.h asks. */
typedef struct picky_ctx { em_device refuse; } picky_ctx;

static em_tensor *picky_forward(em_module *m, em_tensor *x) {
    const picky_ctx *c = em_module_ctx(m);
    if (em_device_equal(em_device_of(x), c->refuse)) {
        em_error(EM_ERR_BACKEND, "picky: refuses to run on %s", em_device_str(c->refuse).s);
        return NULL;
    }
    em_named_tensor w[1];
    if (em_module_parameters(m, w, 1) != 1) return NULL;
    return em_matmul(x, w[0].tensor);
}

static const em_module_ops picky_ops = {.name = "Picky", .forward = picky_forward, .free_ctx = free};

/* A failure on a worker thread (replica 1) reaches the caller naming that replica, leaves no
 * error on any thread and nothing allocated (ASan's leak check); a custom module replicates
 * (shared ctx, own weight) and computes what the model computes. */
static void test_custom_module_and_worker_failure(void) {
    em_device devs[2];
    if (!two_devices(devs)) SKIP("needs a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    picky_ctx *c = malloc(sizeof *c);
    CHECK(c != NULL);
    if (!c) goto out;
    c->refuse = EM_DEVICE(EM_CUDA, 7);   /* nothing at first */
    em_module *m = em_module_new(&picky_ops, c);
    CHECK_OK(em_module_add_parameter(m, "weight", em_randn(EM_SHAPE(20, 5), EM_OPTS(0))));
    CHECK_OK(em_module_to(m, devs[0]));
    em_dp *dp = em_data_parallel(m, devs, 2);
    CHECK(dp != NULL);
    em_tensor *x = em_randn(EM_SHAPE(6, 20), EM_OPTS(0));
    em_tensor *out = em_dp_forward(dp, x);
    em_tensor *ref = em_forward(m, em_to(x, devs[0]));
    em_tensor *d = em_max(em_abs(em_sub(out, ref)), EM_ALL_DIMS, false);
    CHECK(d && em_item(d) <= 1e-5);
    CHECK(em_module_ctx(em_dp_replica(dp, 1)) == c);
    CHECK_OK(em_dp_backward(dp, em_sum(out, EM_ALL_DIMS, false)));
    c->refuse = devs[1];
    CHECK(em_dp_forward(dp, x) == NULL);
    char want[96];
    snprintf(want, sizeof want, "em_dp_forward: replica 1 on %s failed: Picky(): picky: refuses", em_device_str(devs[1]).s);
    CHECK_ERROR(EM_ERR_BACKEND, want);
    CHECK(!em_failed());
    c->refuse = EM_DEVICE(EM_CUDA, 7);
    CHECK(em_dp_forward(dp, x) != NULL);   /* the worker's error did not stick to its thread */
    em_dp_free(dp);
    em_module_free(m);   /* frees ctx once: the replica never did */
out:
    em_scope_end(s);
}

/* The largest |a - b| of two tensors on any devices. */
static double tensor_diff(em_tensor *a, em_tensor *b) {
    em_scope s = em_scope_begin();
    em_tensor *d = em_max(em_abs(em_sub(em_cpu(a), em_cpu(b))), EM_ALL_DIMS, false);
    double v = d ? em_item(d) : INFINITY;
    em_scope_end(s);
    return v;
}

/* Autocast reaches every replica: the caller's region is entered on each worker thread, so
 * the gathered output is in the low dtype (a float32 replica output would promote the cat
 * to float32). With the gradient scaler the gradients are summed before unscale, one inf
 * check decides for all: a step with an inf gradient is skipped on every replica (the model
 * and each replica keep their parameters, bit for bit); a clean one moves them together. */
static void amp_over(const em_device *devs, int n, em_dtype low) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_module *model = mlp();
    CHECK_OK(em_module_to(model, devs[0]));
    em_optimizer *opt = em_adam(model, 1e-2);
    em_dp *dp = em_data_parallel(model, devs, n);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    em_tensor *x = em_randn(EM_SHAPE(BATCH, 20), EM_OPTS(0));
    em_tensor *y = em_to(em_randint(0, 5, EM_SHAPE(BATCH), EM_OPTS(.dtype = EM_I64)), devs[0]);
    CHECK(dp && opt && sc && x && y);
    if (!dp || !opt || !sc) goto out;
    em_named_tensor p[4];
    CHECK(em_module_parameters(model, p, 4) == 4);
    for (int step = 0; step < 3; step++) {
        em_scope it = em_scope_begin();
        CHECK_OK(em_zero_grad(opt));
        em_autocast ac0 = em_autocast_begin(devs[0].type, low);
        em_autocast ac1 = devs[1].type != devs[0].type ? em_autocast_begin(devs[1].type, low)
                                                       : (em_autocast){.depth = -1};
        em_tensor *out = em_dp_forward(dp, x);
        CHECK(out && em_dtype_of(out) == low);
        em_tensor *loss = em_cross_entropy(out, y, 0.0);
        CHECK_OK(em_autocast_end(ac1));
        CHECK_OK(em_autocast_end(ac0));
        CHECK(loss && em_dtype_of(loss) == EM_F32);
        CHECK_OK(em_dp_backward(dp, em_grad_scaler_scale(sc, loss)));
        em_tensor *before = em_clone(p[0].tensor);
        if (step == 1) {   /* an inf in the summed gradient of another parameter */
            em_grad_mode gm = em_no_grad_begin();
            CHECK_OK(em_fill_(em_narrow(em_grad(p[3].tensor), 0, 1, 1), INFINITY));
            em_no_grad_end(gm);
        }
        CHECK_OK(em_grad_scaler_step(sc, opt));
        CHECK_OK(em_grad_scaler_update(sc));
        CHECK_OK(em_dp_sync(dp));
        double moved = tensor_diff(p[0].tensor, before);
        if (step == 1) CHECK(moved == 0.0);
        else CHECK(moved > 0.0);
        for (int i = 1; i < n; i++) CHECK(params_diff(model, em_dp_replica(dp, i)) == 0.0);
        em_scope_end(it);
    }
    CHECK(em_grad_scaler_skipped_steps(sc) == 1);
    CHECK(em_grad_scaler_get_scale(sc) == 32768.0);
    printf("  %s over %s,%s: outputs in %s, 1 of 3 steps skipped on every replica, replicas identical\n",
           em_dtype_name(low), em_device_str(devs[0]).s, em_device_str(devs[1]).s, em_dtype_name(low));
out:
    em_grad_scaler_free(sc);
    em_dp_free(dp);
    em_optim_free(opt);
    em_module_free(model);
    em_scope_end(s);
}

static void test_amp_and_scaler(void) {
    em_device devs[2];
    if (!two_devices(devs)) SKIP("needs a second device (OpenCL): %s", em_device_unavailable_reason(EM_OPENCL));
    amp_over(devs, 2, EM_BF16);
    amp_over(devs, 2, EM_F16);
    if (opencl_devices() >= 1) {   /* a CPU replica and an OpenCL one: a region for each type */
        em_device mixed[] = {EM_DEVICE(EM_OPENCL, 0), EM_DEVICE_CPU};
        amp_over(mixed, 2, EM_BF16);
    }
}

int main(void) {
    RUN(test_one_device);
    RUN(test_two_opencl_devices);
    RUN(test_cpu_and_opencl);
    RUN(test_small_batches);
    RUN(test_bad_arguments);
    RUN(test_sync);
    RUN(test_mode_and_dtype);
    RUN(test_custom_module_and_worker_failure);
    RUN(test_amp_and_scaler);
    /* where ctest promised two OpenCL devices, having fewer is a failure, not a skip */
    const char *want = getenv("EMBER_TEST_OPENCL_DEVICES");
    if (want && em_device_available(EM_OPENCL)) CHECK(em_device_count(EM_OPENCL) == atoi(want));
    em_clear_error();
    return test_summary();
}
