/* nn: Linear init and forward, activations, Dropout, Sequential names and repr, losses
 * against hand-computed values, moving modules in place, and a leak-free training loop. */
#include <stdlib.h>
#include <unistd.h>
#include "test.h"

static void test_linear(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_module *lin = em_nn_linear(20, 8);
    CHECK(lin != NULL);
    em_named_tensor ps[4];
    CHECK(em_module_parameters(lin, ps, 4) == 2);
    CHECK(!strcmp(ps[0].name, "weight") && !strcmp(ps[1].name, "bias"));
    CHECK(em_ndim(ps[0].tensor) == 2 && em_size(ps[0].tensor, 0) == 8 && em_size(ps[0].tensor, 1) == 20);
    CHECK(em_requires_grad(ps[0].tensor) && em_is_leaf(ps[0].tensor));
    CHECK(em_module_num_parameters(lin) == 20 * 8 + 8);
    /* U(-1/sqrt(20), 1/sqrt(20)): inside the bound, and spread over it */
    double bound = 1 / sqrt(20.0);
    double mx = em_item(em_max(em_abs(ps[0].tensor), EM_ALL_DIMS, false));
    CHECK(mx <= bound && mx > 0.8 * bound);
    CHECK(em_item(em_max(em_abs(ps[1].tensor), EM_ALL_DIMS, false)) <= bound);
    CHECK(fabs(em_item(em_mean(ps[0].tensor, EM_ALL_DIMS, false))) < 0.1 * bound);
    /* forward = x W^T + b */
    em_tensor *x = em_randn(EM_SHAPE(5, 20), (em_opts){0});
    em_tensor *y = em_forward(lin, x);
    CHECK(y && em_size(y, 0) == 5 && em_size(y, 1) == 8);
    CHECK(em_requires_grad(y));
    float yv[40], wv[160], bv[8], xv[100];
    CHECK_OK(em_copy_to_host(y, yv, sizeof yv));
    CHECK_OK(em_copy_to_host(ps[0].tensor, wv, sizeof wv));
    CHECK_OK(em_copy_to_host(ps[1].tensor, bv, sizeof bv));
    CHECK_OK(em_copy_to_host(x, xv, sizeof xv));
    for (int i = 0; i < 5; i++)
        for (int o = 0; o < 8; o++) {
            double acc = bv[o];
            for (int k = 0; k < 20; k++) acc += (double)xv[i * 20 + k] * wv[o * 20 + k];
            CHECK_NEAR(yv[i * 8 + o], acc, 1e-5);
        }
    /* batched input [2, 5, 20] */
    CHECK(em_ndim(em_forward(lin, em_randn(EM_SHAPE(2, 5, 20), (em_opts){0}))) == 3);
    /* the wrong input width is an error, not a crash */
    CHECK(em_forward(lin, em_randn(EM_SHAPE(5, 19), (em_opts){0})) == NULL);
    CHECK(em_failed());
    em_clear_error();
    em_module *nb = em_nn_linear_ex(3, 2, false);
    CHECK(em_module_parameters(nb, NULL, 0) == 1);
    em_module_free(nb);
    em_module_free(lin);
    em_scope_end(s);
}

static void test_activations(void) {
    em_scope s = em_scope_begin();
    double v[4] = {-2, -0.5, 0.5, 2};
    em_tensor *x = em_from_data(v, EM_F64, EM_SHAPE(4), EM_OPTS(.dtype = EM_F64));
    em_module *mods[4] = {em_nn_relu(), em_nn_gelu(), em_nn_sigmoid(), em_nn_tanh()};
    for (int i = 0; i < 4; i++) {
        em_tensor *y = em_forward(mods[i], x);
        double out[4];
        CHECK_OK(em_copy_to_host(y, out, sizeof out));
        for (int k = 0; k < 4; k++) {
            double t = v[k];
            double want = i == 0 ? (t > 0 ? t : 0)
                        : i == 1 ? 0.5 * t * (1 + erf(t / sqrt(2.0)))
                        : i == 2 ? 1 / (1 + exp(-t)) : tanh(t);
            CHECK_NEAR(out[k], want, 1e-12);
        }
        em_module_free(mods[i]);
    }
    em_module *f = em_nn_flatten();
    em_tensor *y = em_forward(f, em_zeros(EM_SHAPE(2, 3, 4), (em_opts){0}));
    CHECK(em_ndim(y) == 2 && em_size(y, 1) == 12);
    em_module_free(f);
    em_scope_end(s);
}

static void test_dropout(void) {
    em_scope s = em_scope_begin();
    em_module *d = em_nn_dropout(0.25);
    em_tensor *x = em_ones(EM_SHAPE(100, 100), EM_OPTS(.requires_grad = true));
    em_tensor *y = em_forward(d, x);
    float *v = malloc(10000 * sizeof *v);
    CHECK_OK(em_copy_to_host(y, v, 10000 * sizeof *v));
    int zeros = 0, scaled = 0;
    for (int i = 0; i < 10000; i++) {
        if (v[i] == 0) zeros++;
        else if (fabsf(v[i] - 1 / 0.75f) < 1e-6) scaled++;
    }
    CHECK(zeros + scaled == 10000);
    CHECK(zeros > 2250 && zeros < 2750); /* 2500 expected, sd 43 */
    /* gradient flows through the same mask */
    CHECK_OK(em_backward(em_sum(y, EM_ALL_DIMS, false)));
    float g[10000];
    CHECK_OK(em_copy_to_host(em_grad(x), g, sizeof g));
    bool same = true;
    for (int i = 0; i < 10000; i++) same = same && g[i] == v[i];
    CHECK(same);
    free(v);
    /* eval: identity */
    em_module_eval(d);
    CHECK(!em_module_is_training(d));
    em_tensor *e = em_forward(d, x);
    CHECK(em_item(em_sum(e, EM_ALL_DIMS, false)) == 10000.0);
    em_module_free(d);
    CHECK(em_nn_dropout(1.5) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "dropout probability has to be between 0 and 1, but got 1.5");
    em_scope_end(s);
}

static void test_sequential(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    CHECK(m != NULL);
    em_named_tensor ps[8];
    int n = em_module_parameters(m, ps, 8);
    CHECK(n == 4);
    const char *want[4] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    for (int i = 0; i < 4 && i < n; i++) CHECK(!strcmp(ps[i].name, want[i]));
    CHECK(em_module_num_parameters(m) == 784 * 256 + 256 + 256 * 10 + 10);
    char repr[512];
    em_module_format(m, repr, sizeof repr);
    CHECK(!strcmp(repr, "Sequential(\n"
                        "  (0): Linear(in_features=784, out_features=256, bias=True)\n"
                        "  (1): ReLU()\n"
                        "  (2): Linear(in_features=256, out_features=10, bias=True)\n"
                        ")"));
    em_tensor *y = em_forward(m, em_randn(EM_SHAPE(3, 784), (em_opts){0}));
    CHECK(y && em_size(y, 0) == 3 && em_size(y, 1) == 10);
    /* nesting gives dotted names and indented reprs */
    em_module *outer = em_nn_sequential(em_nn_flatten(), em_nn_sequential(em_nn_linear(4, 2), em_nn_tanh()));
    n = em_module_parameters(outer, ps, 8);
    CHECK(n == 2 && !strcmp(ps[0].name, "1.0.weight") && !strcmp(ps[1].name, "1.0.bias"));
    em_module_format(outer, repr, sizeof repr);
    CHECK(strstr(repr, "  (1): Sequential(\n    (0): Linear(in_features=4, out_features=2, bias=True)\n    (1): Tanh()\n  )\n)") != NULL);
    em_module_eval(outer);
    CHECK(!em_module_is_training(em_module_child(em_module_child(outer, 1), 0)));
    /* a failed constructor inside the list: NULL, the others freed, first error kept */
    em_module *bad = em_nn_sequential(em_nn_linear(4, 2), em_nn_dropout(-1), em_nn_relu());
    CHECK(bad == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "dropout probability");
    em_module_free(outer);
    em_module_free(m);
    em_scope_end(s);
}

/* log_softmax by hand, in double */
static void ref_log_softmax(const double *z, int c, double *out) {
    double mx = z[0], sum = 0;
    for (int i = 1; i < c; i++) mx = z[i] > mx ? z[i] : mx;
    for (int i = 0; i < c; i++) sum += exp(z[i] - mx);
    for (int i = 0; i < c; i++) out[i] = z[i] - mx - log(sum);
}

static void test_losses(void) {
    em_scope s = em_scope_begin();
    double z[12] = {1.0, -0.5, 2.0, 0.1, 0.3, 0.3, -1.0, 0.0, 3.0, -2.0, 1.5, 0.25};
    int64_t t[3] = {2, 0, 3};
    em_tensor *logits = em_from_data(z, EM_F64, EM_SHAPE(3, 4), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *target = em_from_data(t, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64));
    for (int k = 0; k < 2; k++) {
        double eps = k ? 0.1 : 0.0, want = 0;
        for (int i = 0; i < 3; i++) {
            double lp[4];
            ref_log_softmax(z + 4 * i, 4, lp);
            for (int c = 0; c < 4; c++) want -= ((c == t[i]) * (1 - eps) + eps / 4) * lp[c] / 3;
        }
        em_tensor *loss = em_cross_entropy(logits, target, eps);
        CHECK(loss && em_ndim(loss) == 0);
        CHECK_NEAR(em_item(loss), want, 1e-12);
    }
    /* gradient of mean cross entropy: (softmax - onehot) / N */
    CHECK_OK(em_backward(em_cross_entropy(logits, target, 0.0)));
    double g[12], lp[4];
    CHECK_OK(em_copy_to_host(em_grad(logits), g, sizeof g));
    ref_log_softmax(z + 4, 4, lp);
    CHECK_NEAR(g[4 + 0], (exp(lp[0]) - 1) / 3, 1e-12);
    CHECK_NEAR(g[4 + 1], exp(lp[1]) / 3, 1e-12);
    /* nll on log-probs equals cross entropy on logits */
    double ce = em_item(em_cross_entropy(logits, target, 0.0));
    CHECK_NEAR(em_item(em_nll_loss(em_log_softmax(logits, 1), target)), ce, 1e-12);
    /* probability targets */
    em_tensor *probs = em_to_dtype(em_one_hot(target, 4), EM_F64);
    CHECK_NEAR(em_item(em_cross_entropy(logits, probs, 0.0)), ce, 1e-12);
    /* [N, C, d] logits with [N, d] targets */
    em_tensor *l3 = em_permute(em_reshape(logits, EM_SHAPE(1, 3, 4)), EM_DIMS(0, 2, 1));
    CHECK_NEAR(em_item(em_cross_entropy(l3, em_reshape(target, EM_SHAPE(1, 3)), 0.0)), ce, 1e-12);
    /* mse */
    em_tensor *a = em_from_data(z, EM_F64, EM_SHAPE(12), EM_OPTS(.dtype = EM_F64));
    em_tensor *b = em_zeros(EM_SHAPE(12), EM_OPTS(.dtype = EM_F64));
    double sq = 0;
    for (int i = 0; i < 12; i++) sq += z[i] * z[i] / 12;
    CHECK_NEAR(em_item(em_mse_loss(a, b)), sq, 1e-12);
    /* errors */
    CHECK(em_cross_entropy(logits, em_zeros(EM_SHAPE(4), EM_OPTS(.dtype = EM_I64)), 0.0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "expected target size [3], got [4]");
    CHECK(em_cross_entropy(logits, target, 1.5) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "label_smoothing");
    em_scope_end(s);
}

/* em_module_to_dtype swaps storage inside the existing tensors: handles stay valid. */
static void test_module_to(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(3, 4), em_nn_relu(), em_nn_linear(4, 2));
    em_named_tensor before[4], after[4];
    em_module_parameters(m, before, 4);
    float w0[12];
    CHECK_OK(em_copy_to_host(before[0].tensor, w0, sizeof w0));
    em_optimizer *opt = em_adam(m, 1e-2);
    em_tensor *x = em_randn(EM_SHAPE(5, 3), (em_opts){0});
    CHECK_OK(em_backward(em_sum(em_forward(m, x), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(opt));
    CHECK(em_dtype_of(em_optim_state(opt, before[0].tensor, "exp_avg")) == EM_F32);
    CHECK_OK(em_module_to_dtype(m, EM_F64));
    em_module_parameters(m, after, 4);
    for (int i = 0; i < 4; i++) {
        CHECK(after[i].tensor == before[i].tensor);
        CHECK(em_dtype_of(before[i].tensor) == EM_F64);
        CHECK(em_requires_grad(before[i].tensor));
        CHECK(em_dtype_of(em_grad(before[i].tensor)) == EM_F64);
        CHECK(em_dtype_of(em_optim_state(opt, before[i].tensor, "exp_avg_sq")) == EM_F64);
    }
    /* values survive the move, and training goes on in the new dtype */
    double w1[12];
    CHECK_OK(em_copy_to_host(before[0].tensor, w1, sizeof w1));
    for (int i = 0; i < 12; i++) CHECK_NEAR(w1[i], w0[i], 0.011); /* one Adam step of 1e-2 */
    CHECK_OK(em_zero_grad(opt));
    CHECK(em_grad(before[0].tensor) == NULL);
    CHECK_OK(em_backward(em_sum(em_forward(m, em_to_dtype(x, EM_F64)), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(opt));
    CHECK(em_optim_steps(opt) == 2);
    CHECK(em_module_to_dtype(m, EM_I64) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "floating point");
    /* to the same device: nothing changes */
    CHECK_OK(em_module_to(m, EM_DEVICE_CPU));
    CHECK(em_dtype_of(before[0].tensor) == EM_F64);
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
}

/* An optimizer follows moves of any part of its module's tree: a child moved alone (the
 * optimizer is on an ancestor), the whole tree moved (one optimizer on a child); and a
 * module freed before its optimizer leaves the optimizer usable and freeable. */
static void test_optimizer_follows_moves_and_frees(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(3, 4), em_nn_linear(4, 2));
    em_module *first = em_module_child(m, 0), *second = em_module_child(m, 1);
    em_optimizer *whole = em_adam(m, 1e-2), *part = em_sgd_ex(second, (em_sgd_opts){.lr = 0.1, .momentum = 0.9});
    em_tensor *x = em_randn(EM_SHAPE(5, 3), (em_opts){0});
    CHECK_OK(em_backward(em_sum(em_forward(m, x), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(whole));
    CHECK_OK(em_step(part));
    em_named_tensor p1[2], p2[2];
    CHECK(em_module_parameters(first, p1, 2) == 2 && em_module_parameters(second, p2, 2) == 2);
    CHECK_OK(em_module_to_dtype(first, EM_F64)); /* the optimizer listens on the parent */
    CHECK(em_dtype_of(em_optim_state(whole, p1[0].tensor, "exp_avg")) == EM_F64);
    CHECK(em_dtype_of(em_optim_state(whole, p2[0].tensor, "exp_avg")) == EM_F32);
    CHECK_OK(em_module_to_dtype(m, EM_F64));     /* and one on a child of the moved tree */
    CHECK(em_dtype_of(em_optim_state(part, p2[0].tensor, "momentum_buffer")) == EM_F64);
    CHECK(em_dtype_of(em_optim_state(whole, p2[1].tensor, "exp_avg_sq")) == EM_F64);
    em_optim_free(part);                         /* stops listening: the next move must not reach it */
    CHECK_OK(em_module_to_dtype(m, EM_F32));
    CHECK(em_dtype_of(em_optim_state(whole, p2[0].tensor, "exp_avg")) == EM_F32);
    em_tensor *w = em_keep(p1[0].tensor);
    em_module_free(m);                           /* before its optimizer */
    CHECK_OK(em_zero_grad(whole));
    CHECK(em_grad(w) == NULL);
    em_optim_free(whole);
    em_release(w);
    em_scope_end(s);
}

/* A whole training loop inside scopes; under ASan/LSan nothing may leak. */
static void test_training_loop(void) {
    em_manual_seed(3);
    em_module *m = em_nn_sequential(em_nn_linear(8, 16), em_nn_gelu(), em_nn_dropout(0.1), em_nn_linear(16, 3));
    em_optimizer *opt = em_adamw(m, 1e-2);
    em_scope s0 = em_scope_begin();
    em_tensor *x = em_keep(em_randn(EM_SHAPE(32, 8), (em_opts){0}));
    em_tensor *y = em_keep(em_argmax(em_matmul(x, em_randn(EM_SHAPE(8, 3), (em_opts){0})), 1, false));
    em_scope_end(s0);
    double first = 0, last = 0;
    int64_t mem_after_first = 0;
    bool mem_flat = true;
    for (int step = 0; step < 60; step++) {
        em_scope s = em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(loss));
        CHECK(em_clip_grad_norm(m, 5.0) >= 0);
        CHECK_OK(em_step(opt));
        double v = em_item(loss);
        if (step == 0) first = v;
        last = v;
        em_scope_end(s);
        /* after the first step (which creates Adam's state) every step frees all it made:
         * activations, the graph, temporaries; only parameters, grads and state remain */
        int64_t mem = em_memory_allocated(EM_DEVICE_CPU);
        if (step == 1) mem_after_first = mem;
        if (step > 1 && mem != mem_after_first) mem_flat = false;
    }
    CHECK(mem_after_first > 0);
    CHECK(mem_flat);
    CHECK(last < 0.5 * first);
    em_release(x);
    em_release(y);
    em_optim_free(opt);
    em_module_free(m);
}

/* A custom module written against the public module API. */
typedef struct scale_ctx { double k; } scale_ctx;
static em_tensor *scale_forward(em_module *m, em_tensor *x) {
    em_named_tensor p[1];
    em_module_parameters(m, p, 1);
    return em_mul(em_mul_scalar(x, ((scale_ctx *)em_module_ctx(m))->k), p[0].tensor);
}
static const em_module_ops scale_ops = {.name = "Scale", .forward = scale_forward, .free_ctx = free};

static void test_custom_module(void) {
    em_scope s = em_scope_begin();
    scale_ctx *c = malloc(sizeof *c);
    c->k = 2.0;
    em_module *m = em_module_new(&scale_ops, c);
    CHECK_OK(em_module_add_parameter(m, "gain", em_ones(EM_SHAPE(3), (em_opts){0})));
    CHECK_OK(em_module_add_buffer(m, "running", em_zeros(EM_SHAPE(3), (em_opts){0})));
    CHECK(em_module_add_parameter(m, "gain", em_ones(EM_SHAPE(3), (em_opts){0})) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already exists");
    em_named_tensor b[2];
    CHECK(em_module_buffers(m, b, 2) == 1 && !strcmp(b[0].name, "running"));
    em_tensor *y = em_forward(m, em_full(EM_SHAPE(3), 1.5, (em_opts){0}));
    CHECK_NEAR(em_item(em_sum(y, EM_ALL_DIMS, false)), 9.0, 1e-6);
    CHECK_OK(em_backward(em_sum(y, EM_ALL_DIMS, false)));
    em_named_tensor p[1];
    em_module_parameters(m, p, 1);
    CHECK_NEAR(em_item(em_sum(em_grad(p[0].tensor), EM_ALL_DIMS, false)), 9.0, 1e-6);
    em_module_free(m);
    em_scope_end(s);
}

static void test_save_load(void) {
    em_scope s = em_scope_begin();
    char path[128];
    snprintf(path, sizeof path, "/tmp/ember_test_nn_%d.safetensors", (int)getpid());
    em_manual_seed(1);
    em_module *a = em_nn_sequential(em_nn_linear(3, 4), em_nn_relu(), em_nn_linear(4, 2));
    em_manual_seed(2);
    em_module *b = em_nn_sequential(em_nn_linear(3, 4), em_nn_relu(), em_nn_linear(4, 2));
    em_named_tensor pa[4], pb[4];
    em_module_parameters(a, pa, 4);
    em_module_parameters(b, pb, 4);
    CHECK(em_item(em_max(em_abs(em_sub(pa[0].tensor, pb[0].tensor)), EM_ALL_DIMS, false)) > 0);
    CHECK_OK(em_module_save(a, path));
    em_tensor *handle = pb[0].tensor;
    CHECK_OK(em_module_load(b, path));
    em_module_parameters(b, pb, 4);
    CHECK(pb[0].tensor == handle); /* loaded in place */
    for (int i = 0; i < 4; i++) {
        CHECK(!strcmp(pa[i].name, pb[i].name));
        CHECK(em_item(em_max(em_abs(em_sub(pa[i].tensor, pb[i].tensor)), EM_ALL_DIMS, false)) == 0);
        CHECK(em_requires_grad(pb[i].tensor));
    }
    /* a different architecture: PyTorch's strict messages, and nothing changed */
    em_module *c = em_nn_sequential(em_nn_linear(3, 5), em_nn_relu(), em_nn_linear(5, 2), em_nn_linear(2, 2));
    em_named_tensor pc[6];
    em_module_parameters(c, pc, 6);
    double before = em_item(em_sum(pc[0].tensor, EM_ALL_DIMS, false));
    CHECK(em_module_load(c, path) == EM_ERR_FORMAT);
    const char *msg = em_last_error();
    CHECK(strstr(msg, "Missing key(s) in state_dict: \"3.weight\", \"3.bias\"") != NULL);
    CHECK(strstr(msg, "size mismatch for 0.weight: copying a param with shape torch.Size([4, 3]) from "
                      "checkpoint, the shape in current model is torch.Size([5, 3]).") != NULL);
    em_clear_error();
    CHECK(em_item(em_sum(pc[0].tensor, EM_ALL_DIMS, false)) == before);
    em_module *d = em_nn_sequential(em_nn_linear(3, 4));
    CHECK(em_module_load(d, path) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "Unexpected key(s) in state_dict: \"2.bias\", \"2.weight\"");
    CHECK(em_module_load(a, "/nonexistent/x.safetensors") != EM_OK);
    em_clear_error();
    remove(path);
    em_module_free(a);
    em_module_free(b);
    em_module_free(c);
    em_module_free(d);
    em_scope_end(s);
}

/* On every non-CPU device: the model and the optimizer's state move there in place, a step
 * runs there, and the result matches the same step on the CPU. */
static em_device g_dev;

static void test_module_to_device(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(11);
    em_module *m = em_nn_sequential(em_nn_linear(6, 5), em_nn_tanh(), em_nn_linear(5, 3));
    em_manual_seed(11);
    em_module *ref = em_nn_sequential(em_nn_linear(6, 5), em_nn_tanh(), em_nn_linear(5, 3));
    em_optimizer *opt = em_adam(m, 1e-2), *ref_opt = em_adam(ref, 1e-2);
    em_tensor *x = em_randn(EM_SHAPE(4, 6), (em_opts){0});
    em_tensor *y = em_randint(0, 3, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    /* one step on the CPU first, so that there is state to move */
    for (int k = 0; k < 2; k++) {
        em_module *mm = k ? ref : m;
        em_optimizer *oo = k ? ref_opt : opt;
        CHECK_OK(em_backward(em_cross_entropy(em_forward(mm, x), y, 0.0)));
        CHECK_OK(em_step(oo));
    }
    em_named_tensor ps[4];
    em_module_parameters(m, ps, 4);
    em_tensor *w = ps[0].tensor;
    CHECK_OK(em_module_to(m, g_dev));
    CHECK(em_device_equal(em_device_of(w), g_dev));
    CHECK(em_device_equal(em_device_of(em_grad(w)), g_dev));
    CHECK(em_device_equal(em_device_of(em_optim_state(opt, w, "exp_avg")), g_dev));
    /* a second step on the device, the same step on the CPU */
    CHECK_OK(em_zero_grad(opt));
    CHECK_OK(em_zero_grad(ref_opt));
    em_tensor *loss = em_cross_entropy(em_forward(m, em_to(x, g_dev)), em_to(y, g_dev), 0.1);
    em_tensor *ref_loss = em_cross_entropy(em_forward(ref, x), y, 0.1);
    CHECK(loss && em_device_equal(em_device_of(loss), g_dev));
    CHECK_OK(em_backward(loss));
    CHECK_OK(em_backward(ref_loss));
    CHECK_OK(em_step(opt));
    CHECK_OK(em_step(ref_opt));
    CHECK_NEAR(em_item(loss), em_item(ref_loss), 1e-5);
    em_named_tensor rp[4];
    em_module_parameters(ref, rp, 4);
    for (int i = 0; i < 4; i++) {
        double d = em_item(em_max(em_abs(em_sub(em_cpu(ps[i].tensor), rp[i].tensor)), EM_ALL_DIMS, false));
        CHECK(d < 1e-5);
    }
    /* and back */
    CHECK_OK(em_module_to(m, EM_DEVICE_CPU));
    CHECK(em_device_equal(em_device_of(em_optim_state(opt, w, "exp_avg_sq")), EM_DEVICE_CPU));
    em_optim_free(opt);
    em_optim_free(ref_opt);
    em_module_free(m);
    em_module_free(ref);
    em_scope_end(s);
}

/* A user's mistakes with layers and losses: a status and a message, nothing leaked. */
static void test_user_errors(void) {
    em_scope s = em_scope_begin();
    CHECK(em_nn_linear(-1, 3) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_nn_linear: features must be >= 0, got in=-1, out=3");
    em_module *relu = em_nn_relu();
    CHECK(em_sequential_append(relu, em_nn_dropout(0.5)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_sequential_append: not a Sequential module");
    em_module_free(relu);
    CHECK(em_nn_sequential(em_nn_relu(), NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_nn_sequential: a module is NULL (its constructor failed)");
    /* Dropout describes itself as PyTorch prints it */
    em_module *d = em_nn_dropout(0.25);
    char buf[128];
    CHECK(em_module_format(d, buf, sizeof buf) > 0);
    CHECK(strstr(buf, "Dropout(p=0.25, inplace=False)") != NULL);
    em_module_free(d);

    em_tensor *logits = em_ones(EM_SHAPE(2, 3), (em_opts){0});
    em_tensor *cls = em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_I64));
    CHECK(em_cross_entropy(logits, NULL, 0.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: target is NULL");
    CHECK(em_nll_loss(NULL, cls) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "nll_loss: input is NULL");
    CHECK(em_cross_entropy(em_ones(EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_I32)), cls, 0.0) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "cross_entropy: expected a floating input, got int32");
    CHECK(em_cross_entropy(em_scalar(1.0, (em_opts){0}), cls, 0.0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cross_entropy: input must have a class dimension (got a 0-d tensor)");
    CHECK(em_cross_entropy(logits, em_ones(EM_SHAPE(2, 4), (em_opts){0}), 0.0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cross_entropy: probability targets must have the input's shape [2, 3], got [2, 4]");
    CHECK(em_nll_loss(logits, em_zeros(EM_SHAPE(2), (em_opts){0})) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "nll_loss: expected class indices (an integer target), got float32");
    em_scope_end(s);
}

int main(void) {
    RUN(test_linear);
    RUN(test_activations);
    RUN(test_dropout);
    RUN(test_sequential);
    RUN(test_losses);
    RUN(test_module_to);
    RUN(test_optimizer_follows_moves_and_frees);
    RUN(test_training_loop);
    RUN(test_custom_module);
    RUN(test_save_load);
    RUN(test_user_errors);
    const em_device_type types[] = {EM_CUDA, EM_OPENCL, EM_MPS};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < em_device_count(types[t]); i++) {
            g_dev = EM_DEVICE(types[t], i);
            printf("     on %s:\n", em_device_str(g_dev).s);
            RUN(test_module_to_device);
        }
    em_clear_error();
    return test_summary();
}
