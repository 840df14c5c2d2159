/* Seed 000 "CUDA 기초와 GPU 프로그래밍" (CUDA basics and GPU programming), in C.
 *
 * The seed checks for a GPU, picks a device (CUDA, then MPS, then the CPU), moves tensors
 * with .to() / .cuda() / .cpu(), reads GPU memory statistics, frees memory, moves a model
 * to the GPU and splits a batch over several GPUs (DataParallel: em_data_parallel here).
 * The comments quote what the seed's Python prints; this program prints the same facts for
 * this machine, so on a machine without a GPU it shows "False", "0" and "cpu" where the seed
 * shows a GPU. CI gives it two PoCL devices, so DataParallel runs over two devices there. */
#include <ember/ember.h>
#include <ember/memory.h>
#include "seed_common.h"

/* ---- 1. Is there a GPU? ---- */
static void check_gpu(void) {
    printf("== GPU availability\n");
    /* print(torch.cuda.is_available())   # True / False */
    printf("cuda available: %s\n", py_bool(em_device_available(EM_CUDA)));
    if (!em_device_available(EM_CUDA)) printf("  (why not: %s)\n", em_device_unavailable_reason(EM_CUDA));
    /* print(torch.cuda.device_count())   # e.g. 1 */
    printf("cuda device count: %d\n", em_device_count(EM_CUDA));
    /* if torch.cuda.is_available(): print(torch.cuda.get_device_name(0))   # e.g. NVIDIA GeForce RTX 4090 */
    if (em_device_available(EM_CUDA)) {
        em_device_props p;
        SEED_CHECK(em_device_get_props(EM_DEVICE(EM_CUDA, 0), &p) == EM_OK);
        printf("cuda:0 name: %s\n", p.name);
    }
    /* print(torch.backends.mps.is_available())   # True (Mac M series) */
    printf("mps available: %s\n", py_bool(em_device_available(EM_MPS)));
    /* Ember also knows OpenCL devices (what torch does not have). */
    printf("opencl available: %s (%d device%s)\n", py_bool(em_device_available(EM_OPENCL)),
           em_device_count(EM_OPENCL), em_device_count(EM_OPENCL) == 1 ? "" : "s");
}

/* ---- 2. Choose a device: CUDA -> MPS -> CPU ---- */
static em_device choose_device(void) {
    printf("\n== Device selection\n");
    em_device device;
    if (em_device_available(EM_CUDA)) device = EM_DEVICE(EM_CUDA, -1); /* torch.device('cuda') */
    else if (em_device_available(EM_MPS)) device = EM_DEVICE(EM_MPS, -1);
    else device = EM_DEVICE_CPU;
    /* print(f"사용 디바이스: {device}")   # "Using device: cuda" with a GPU */
    printf("Using device: %s\n", em_device_str(device).s);
    /* The same priority in one call, which also tries an OpenCL GPU and honours EMBER_DEVICE. */
    em_device a = em_device_auto();
    printf("em_device_auto(): %s (%s)\n", em_device_str(a).s, em_device_auto_reason());
    return device;
}

/* ---- 3. Moving tensors ---- */
static void move_tensors(em_device device) {
    printf("\n== Moving tensors with em_to\n");
    em_tensor *x = em_randn(EM_SHAPE(3, 4), EM_OPTS(0));
    print_device_of("x.device: ", x); /* cpu */
    em_tensor *x_gpu = em_to(x, device);
    SEED_CHECK(x_gpu);
    print_device_of("x_gpu.device: ", x_gpu); /* cuda:0 (with a GPU) */
    em_tensor *y = em_zeros(EM_SHAPE(3, 4), EM_OPTS(.device = device)); /* created on the device */
    SEED_CHECK(y);
    print_device_of("y.device: ", y); /* cuda:0 */

    /* x.cuda() / x_gpu.cpu() / x.cuda(1) */
    em_tensor *xc = em_to(x, EM_DEVICE(EM_CUDA, -1));
    if (xc) print_device_of("x.cuda().device: ", xc);
    else print_expected_error("x.cuda()"); /* no CUDA: a clear error, not a crash */
    em_tensor *x1 = em_to(x, EM_DEVICE(EM_CUDA, 1));
    if (x1) print_device_of("x.cuda(1).device: ", x1);
    else print_expected_error("x.cuda(1)");

    /* The same moves between two devices this machine does have. */
    em_device other = second_device();
    em_tensor *xo = em_to(x, other);
    SEED_CHECK(xo);
    em_tensor *back = em_cpu(xo);
    SEED_CHECK(back);
    printf("x -> %s -> cpu: devices %s, %s; a copy each way: %s\n", em_device_str(other).s,
           em_device_str(em_device_of(xo)).s, em_device_str(em_device_of(back)).s,
           py_bool(xo != x && back != xo && back != x) /* False when only the CPU exists */);
}

/* ---- 4. Memory ---- */
static void memory_report(em_device d) {
    em_device_props p;
    SEED_CHECK(em_device_get_props(d, &p) == EM_OK);
    /* torch.cuda.memory_allocated(0) / memory_reserved(0) */
    printf("  allocated: %.1f MB\n", em_memory_allocated(d) / (1024.0 * 1024.0));
    printf("  reserved:  %.1f MB\n", em_memory_reserved(d) / (1024.0 * 1024.0));
    /* torch.cuda.get_device_properties(0).total_memory */
    printf("  total:     %.1f GB\n", p.total_memory / (1024.0 * 1024.0 * 1024.0));
}

static void memory_management(em_device device) {
    printf("\n== Memory on %s (%s)\n", em_device_str(device).s, device_name(device).s);
    memory_report(device);
    /* large_tensor = torch.randn(10000, 10000, device='cuda'); del large_tensor
     * (1000 x 1000 here: 4 MB keeps the example quick) */
    em_scope s = em_scope_begin();
    em_tensor *large = em_randn(EM_SHAPE(1000, 1000), EM_OPTS(.device = device));
    SEED_CHECK(large);
    printf("after creating a 1000x1000 float32 tensor:\n");
    memory_report(device);
    em_scope_end(s); /* del large_tensor: the scope releases it (no gc.collect() needed) */
    printf("after releasing it (the allocator keeps the memory cached):\n");
    memory_report(device);
    SEED_CHECK(em_memory_empty_cache(device) == EM_OK); /* torch.cuda.empty_cache() */
    printf("after em_memory_empty_cache:\n");
    memory_report(device);
}

/* ---- 5. A model on the device, and DataParallel ---- */
/* nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)) */
static em_module *mlp_new(void) {
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    SEED_CHECK(m);
    return m;
}

static void print_shape(const char *label, const em_tensor *t) {
    printf("%s[", label);
    for (int i = 0; i < em_ndim(t); i++) printf(i ? ", %lld" : "%lld", (long long)em_size(t, i));
    printf("]\n");
}

/* model = nn.DataParallel(model); output = model(x)
 * em_data_parallel keeps one replica of the model on every device (made once, not at every
 * forward as PyTorch does); em_dp_forward splits the batch along dim 0 as torch.chunk does,
 * runs the replicas at once (a thread each) and gathers the outputs on the first device. */
static em_tensor *data_parallel(em_module *model, const em_device *devs, int n, em_tensor *batch) {
    em_dp *dp = em_data_parallel(model, devs, n);
    SEED_CHECK(dp);
    em_tensor *output = em_dp_forward(dp, batch);
    SEED_CHECK(output);
    int64_t rows = em_size(batch, 0), chunk = (rows + n - 1) / n;   /* 64 rows: 32 + 32 on two devices */
    for (int i = 0; i < n && i * chunk < rows; i++)
        printf("  %s: %lld samples\n", em_device_str(em_dp_device(dp, i)).s,
               (long long)(rows - i * chunk < chunk ? rows - i * chunk : chunk));
    /* Training works the same way: em_dp_backward runs every replica's backward at once and
     * sums the gradients into the model's (the "합산" of the seed's picture); em_dp_step
     * steps the model and copies it into every replica, so they stay identical. */
    em_optimizer *opt = em_sgd(model, 0.01);
    SEED_CHECK(opt && em_zero_grad(opt) == EM_OK);
    em_tensor *target = em_randint(0, 10, EM_SHAPE(rows), EM_OPTS(.dtype = EM_I64, .device = devs[0]));
    em_tensor *loss = em_cross_entropy(em_dp_forward(dp, batch), target, 0.0);
    SEED_CHECK(em_dp_backward(dp, loss) == EM_OK && em_dp_step(dp, opt) == EM_OK);
    printf("one DataParallel training step: loss %.4f\n", em_item(loss));
    em_named_tensor mine[4], theirs[4];
    SEED_CHECK(em_module_parameters(model, mine, 4) == 4 && em_module_parameters(em_dp_replica(dp, n - 1), theirs, 4) == 4);
    em_tensor *gap = em_max(em_abs(em_sub(em_cpu(mine[0].tensor), em_cpu(theirs[0].tensor))), EM_ALL_DIMS, false);
    SEED_CHECK(gap && em_item(gap) == 0.0);
    printf("replica on %s equals the model after the step: %s\n", em_device_str(devs[n - 1]).s, py_bool(em_item(gap) == 0.0));
    em_optim_free(opt);
    em_dp_free(dp);
    return output;
}

static void model_on_device(em_device device) {
    printf("\n== A model on %s\n", em_device_str(device).s);
    em_module *model = mlp_new();
    SEED_CHECK(module_on(model, EM_DEVICE_CPU));
    /* model = model.to(device): every parameter moves; the model is the same object */
    SEED_CHECK(em_module_to(model, device) == EM_OK);
    SEED_CHECK(module_on(model, device));
    em_tensor *x = em_to(em_randn(EM_SHAPE(32, 784), EM_OPTS(0)), device); /* x = torch.randn(32, 784).to(device) */
    em_tensor *output = em_forward(model, x);                               /* output = model(x) */
    SEED_CHECK(output && em_size(output, 0) == 32 && em_size(output, 1) == 10);
    print_shape("output.shape: ", output);      /* torch.Size([32, 10]) */
    print_device_of("output.device: ", output); /* cuda:0 */
    SEED_CHECK(em_device_equal(em_device_of(output), device));

    /* if torch.cuda.device_count() > 1: print(f"GPU {n}개 사용"); model = nn.DataParallel(model) */
    em_device devs[16];
    int n = device.type == EM_CPU ? 1 : em_device_count(device.type);
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) devs[i] = EM_DEVICE(device.type, i);
    if (n > 1) {
        printf("Using %d %s devices\n", n, em_device_type_name(device.type)); /* "GPU 2개 사용" */
    } else if (device.type != EM_CPU) {
        /* one device of its kind: show the split over it and the CPU instead */
        devs[n++] = EM_DEVICE_CPU;
        printf("one %s device: DataParallel's split shown over %s and cpu\n", em_device_type_name(device.type),
               em_device_str(device).s);
    }
    em_tensor *batch = em_randn(EM_SHAPE(64, 784), EM_OPTS(0)); /* x = torch.randn(64, 784).to(device) */
    if (n > 1) {
        /* the split changes nothing: the same batch on one device gives the same numbers */
        em_tensor *one = em_forward(model, em_to(batch, device));
        output = data_parallel(model, devs, n, batch);
        em_tensor *diff = em_max(em_abs(em_sub(output, one)), EM_ALL_DIMS, false);
        SEED_CHECK(diff);
        printf("largest difference from one device: %g\n", em_item(diff));
        SEED_CHECK(em_item(diff) < 1e-4);
    } else {
        printf("only the CPU: no DataParallel split\n");
        output = em_forward(model, em_to(batch, device));
    }
    SEED_CHECK(output && em_size(output, 0) == 64);
    print_shape("output.shape: ", output); /* torch.Size([64, 10]) */
    em_module_free(model);
}

int main(void) {
    em_scope scope = em_scope_begin(); /* every tensor made below is released at its end */
    em_manual_seed(0);
    check_gpu();
    em_device device = choose_device();
    move_tensors(device);
    /* Without CUDA or MPS the seed's GPU parts run on the second device this machine has
     * (an OpenCL device), or on the CPU. */
    em_device gpu = device.type == EM_CPU ? second_device() : device;
    memory_management(gpu);
    model_on_device(gpu);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
