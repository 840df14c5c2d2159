/* Seed 002 "GPU" (a glossary entry: Graphics Processing Unit), in C.
 *
 * The seed's code prints what PyTorch knows about the GPU (availability, count, current
 * device, name, memory), runs a model under mixed precision (an autocast region, and a
 * GradScaler for training steps), mentions DataParallel and
 * DistributedDataParallel, empties the cache, benchmarks a matmul in TFLOPS and queries
 * nvidia-smi. The comments quote the seed; without CUDA the GPU parts run on the next
 * device this machine has (an OpenCL device, or the CPU). */
#include <time.h>
#include <ember/ember.h>
#include <ember/memory.h>
#include "seed_common.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void gpu_info(void) {
    printf("== What Ember knows about CUDA\n");
    printf("CUDA available: %s\n", py_bool(em_device_available(EM_CUDA))); /* CUDA available: True */
    printf("GPU count: %d\n", em_device_count(EM_CUDA));                     /* GPU count: 1 */
    if (em_device_available(EM_CUDA)) {
        printf("Current device: %d\n", em_device_current(EM_CUDA).index);     /* Current device: 0 */
        printf("Device name: %s\n", device_name(EM_DEVICE(EM_CUDA, 0)).s);    /* Device name: NVIDIA H100 ... */
    } else {
        /* torch.cuda.current_device() raises without CUDA; Ember says why. */
        printf("Current device / Device name: none (%s)\n", em_device_unavailable_reason(EM_CUDA));
    }
}

/* def print_gpu_memory(): allocated, reserved and total in GB */
static void print_gpu_memory(em_device d) {
    const double gb = 1024.0 * 1024.0 * 1024.0;
    em_device_props p;
    SEED_CHECK(em_device_get_props(d, &p) == EM_OK);
    printf("Allocated: %.2f GB\n", em_memory_allocated(d) / gb);
    printf("Reserved: %.2f GB\n", em_memory_reserved(d) / gb);
    printf("Total: %.2f GB\n", p.total_memory / gb);
}

static void model_and_mixed_precision(em_device device) {
    printf("\n== A model on %s, in float32 and under autocast (float16)\n", em_device_str(device).s);
    /* model = torch.nn.Linear(1000, 1000).to(device); data = torch.randn(128, 1000).to(device) */
    em_module *model = em_nn_linear(1000, 1000);
    SEED_CHECK(model && em_module_to(model, device) == EM_OK);
    SEED_CHECK(module_on(model, device));
    em_tensor *data = em_to(em_randn(EM_SHAPE(128, 1000), EM_OPTS(0)), device);
    em_tensor *out32 = em_forward(model, data); /* output = model(data) */
    SEED_CHECK(out32 && em_device_equal(em_device_of(out32), device));
    /* with torch.cuda.amp.autocast():  # Mixed Precision
     *     output = model(data)
     * An autocast region for the device's type: Linear runs in float16 on float16 casts of the
     * input and of the float32 weights (the model itself stays float32). */
    em_autocast ac = em_autocast_begin(device.type, EM_F16);
    em_tensor *out16 = em_forward(model, data);
    SEED_CHECK(em_autocast_end(ac) == EM_OK);
    SEED_CHECK(out16);
    em_tensor *diff = em_max(em_abs(em_sub(em_to_dtype(out16, EM_F32), out32)), EM_ALL_DIMS, false);
    SEED_CHECK(diff);
    printf("output dtype %s, largest difference from float32: %.4f\n", em_dtype_name(em_dtype_of(out16)),
           em_item(diff));
    SEED_CHECK(em_dtype_of(out16) == EM_F16 && em_item(diff) < 0.05); /* float16 keeps ~3 digits */
    SEED_CHECK(em_dtype_of(module_param(model, "weight")) == EM_F32);

    /* Training under autocast in float16 pairs it with a GradScaler (torch.cuda.amp.GradScaler):
     * scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
     * The loss (mse_loss) runs in float32; the gradients land on the float32 weights. */
    em_optimizer *opt = em_sgd(model, 0.01);
    em_grad_scaler *scaler = em_grad_scaler_new(em_grad_scaler_defaults());
    SEED_CHECK(opt && scaler);
    for (int step = 0; step < 3; step++) {
        ac = em_autocast_begin(device.type, EM_F16);
        em_tensor *loss = em_mse_loss(em_forward(model, data), em_detach(out32));
        SEED_CHECK(em_autocast_end(ac) == EM_OK && loss && em_dtype_of(loss) == EM_F32);
        SEED_CHECK(em_zero_grad(opt) == EM_OK);
        SEED_CHECK(em_backward(em_grad_scaler_scale(scaler, loss)) == EM_OK);
        SEED_CHECK(em_grad_scaler_step(scaler, opt) == EM_OK);   /* skipped on the device on inf/NaN */
        SEED_CHECK(em_grad_scaler_update(scaler) == EM_OK);
    }
    printf("3 scaled steps: loss scale %g, %lld skipped\n", em_grad_scaler_get_scale(scaler),
           (long long)em_grad_scaler_skipped_steps(scaler));
    SEED_CHECK(em_grad_scaler_skipped_steps(scaler) == 0);
    em_grad_scaler_free(scaler);
    em_optim_free(opt);
    print_gpu_memory(device);

    /* if torch.cuda.device_count() > 1: model = torch.nn.DataParallel(model)
     * DataParallel is not in Ember as a module; seed 000 writes out what it does. */
    int n = device.type == EM_CPU ? 1 : em_device_count(device.type);
    if (n > 1) printf("Using %d %s devices\n", n, em_device_type_name(device.type)); /* Using 2 GPUs */
    /* model = DistributedDataParallel(model) (torchrun, NCCL): a program of its own, started
     * as several processes: examples/seed_002_ddp.c (em_dist_init, em_ddp). */
    em_module_free(model);
}

static void empty_cache(em_device device) {
    SEED_CHECK(em_memory_empty_cache(device) == EM_OK); /* torch.cuda.empty_cache() */
    printf("\nafter empty_cache:\n");
    print_gpu_memory(device);
}

/* def benchmark_gpu(size=10000, iterations=100) -- smaller here so the example stays quick */
static void benchmark(em_device device, int64_t size, int iterations) {
    printf("\n== Matmul benchmark on %s\n", em_device_str(device).s);
    em_scope s = em_scope_begin();
    em_tensor *a = em_randn(EM_SHAPE(size, size), EM_OPTS(.device = device));
    em_tensor *b = em_randn(EM_SHAPE(size, size), EM_OPTS(.device = device));
    SEED_CHECK(a && b);
    SEED_CHECK(em_device_synchronize(device) == EM_OK); /* torch.cuda.synchronize() */
    double start = now_s();
    for (int i = 0; i < iterations; i++) {
        em_scope it = em_scope_begin();
        SEED_CHECK(em_matmul(a, b)); /* c = torch.matmul(a, b), freed at the scope's end */
        em_scope_end(it);
    }
    SEED_CHECK(em_device_synchronize(device) == EM_OK);
    double elapsed = now_s() - start;
    double flops = 2.0 * (double)size * (double)size * (double)size * iterations;
    printf("Matrix size: %lldx%lld\n", (long long)size, (long long)size);
    printf("Time: %.3fs, TFLOPS: %.4f\n", elapsed, flops / elapsed / 1e12);
    em_scope_end(s);
}

/* nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv,noheader */
static void smi_query(em_device_type type) {
    printf("\n== name, memory.used, memory.total, utilization (%s devices)\n", em_device_type_name(type));
    int n = type == EM_CPU ? 1 : em_device_count(type);
    for (int i = 0; i < n; i++) {
        em_device_props p;
        SEED_CHECK(em_device_get_props(EM_DEVICE(type, i), &p) == EM_OK);
        char used[32] = "[N/A]";
        if (p.free_memory >= 0)
            snprintf(used, sizeof used, "%lld MiB", (long long)((p.total_memory - p.free_memory) >> 20));
        /* utilization needs NVML (the cuda backend); no other device reports it */
        printf("%s, %s, %lld MiB, [N/A]\n", p.name, used, (long long)(p.total_memory >> 20));
    }
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(2);
    gpu_info();
    /* device = torch.device("cuda" if torch.cuda.is_available() else "cpu") */
    em_device device = em_device_available(EM_CUDA) ? EM_DEVICE(EM_CUDA, -1) : EM_DEVICE_CPU;
    printf("device: %s\n", em_device_str(device).s);
    em_device gpu = device.type == EM_CPU ? second_device() : device;
    model_and_mixed_precision(gpu);
    empty_cache(gpu);
    benchmark(gpu, 256, 10);
    smi_query(gpu.type);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
