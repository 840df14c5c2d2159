/* OpenCL backend benchmarks, each against a peer measured in the same run:
 *   1. copy bandwidth host <-> device (64 MiB) vs memcpy of the same bytes;
 *   2. launch latency: many tiny kernels queued, one finish (backend level and through the
 *      public API), and one op + finish;
 *   3. matmul GFLOP/s: Ember's tiled kernel vs CLBlast (when present) on the same OpenCL
 *      device, vs OpenBLAS sgemm on the same CPU;
 *   4. a few memory-bound ops (4M floats) on the OpenCL device vs Ember's CPU backend.
 * Usage: bench_opencl [device index]   (e.g. POCL_DEVICES=pthread ./build/bench_opencl 0) */
#include <cblas.h>
#include <ember/ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/opencl/opencl_internal.h"
#include "backends/gpu/gpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die_if_failed(const char *what) {
    if (em_failed()) {
        fprintf(stderr, "%s: %s\n", what, em_last_error());
        exit(1);
    }
}

static void bench_copies(int dev) {
    const em_backend *be = &em__opencl_backend;
    size_t bytes = 64u << 20;
    char *host = malloc(bytes), *host2 = malloc(bytes);
    memset(host, 1, bytes);
    memset(host2, 2, bytes);
    void *buf = NULL;
    if (be->raw_alloc(dev, bytes, &buf) != EM_OK) die_if_failed("alloc");
    be->copy_h2d(dev, buf, 0, host, bytes, false); /* first touch */
    int reps = 5;
    double t0 = now();
    for (int i = 0; i < reps; i++) be->copy_h2d(dev, buf, 0, host, bytes, false);
    double h2d = now() - t0;
    t0 = now();
    for (int i = 0; i < reps; i++) be->copy_d2h(dev, host2, buf, 0, bytes);
    double d2h = now() - t0;
    t0 = now();
    for (int i = 0; i < reps; i++) memcpy(host2, host, bytes);
    double mc = now() - t0;
    double gb = (double)bytes * reps / 1e9;
    printf("copy 64 MiB: host->device %.2f GB/s, device->host %.2f GB/s, memcpy %.2f GB/s "
           "(h2d/memcpy %.2f)\n", gb / h2d, gb / d2h, gb / mc, mc / h2d);
    be->raw_free(dev, buf);
    free(host);
    free(host2);
}

static void bench_latency(em_device d) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_SHAPE(1), EM_OPTS(.device = d));
    em_tensor *one = em_ones(EM_SHAPE(1), EM_OPTS(.device = d));
    em_device_synchronize(d);
    const em_backend *be = &em__opencl_backend;
    int n = 10000;
    /* warm: compile the kernels used below */
    be->run(&(em_op_call){.op = EM_OP_FILL, .dtype = x->dtype, .dst = {x}, .f = {1.0}});
    em_add_(x, one, 1.0);
    em_device_synchronize(d);
    double t0 = now();
    for (int i = 0; i < n; i++) be->run(&(em_op_call){.op = EM_OP_FILL, .dtype = x->dtype, .dst = {x}, .f = {(double)i}});
    em_device_synchronize(d);
    double backend_us = (now() - t0) / n * 1e6;
    t0 = now();
    for (int i = 0; i < n; i++) em_add_(x, one, 1.0);
    em_device_synchronize(d);
    double api_us = (now() - t0) / n * 1e6;
    t0 = now();
    for (int i = 0; i < 1000; i++) {
        be->run(&(em_op_call){.op = EM_OP_FILL, .dtype = x->dtype, .dst = {x}, .f = {(double)i}});
        em_device_synchronize(d);
    }
    double sync_us = (now() - t0) / 1000 * 1e6;
    die_if_failed("latency");
    printf("launch: %.2f us per queued kernel (backend fill, %d then one finish), %.2f us per "
           "em_add_ (public API), %.1f us per op + finish\n", backend_us, n, api_us, sync_us);
    em_scope_end(s);
}

/* seconds per matmul of [m,k] @ [k,n] on device d; gemm_hook false: Ember's kernel only */
static double time_matmul(em_device d, int m, int k, int n, bool allow_hook, int reps) {
    em_scope s = em_scope_begin();
    em_manual_seed(1);
    em_tensor *a = em_rand(EM_SHAPE(m, k), EM_OPTS(.device = d));
    em_tensor *b = em_rand(EM_SHAPE(k, n), EM_OPTS(.device = d));
    em_tensor *c = em_empty(EM_SHAPE(m, n), EM_OPTS(.device = d));
    em_gpu g = em__ocl_gpu;
    if (!allow_hook) g.gemm = NULL;
    em__gpu_matmul_with(&g, c, a, b); /* warm (compiles) */
    em_device_synchronize(d);
    double t0 = now();
    for (int i = 0; i < reps; i++) em__gpu_matmul_with(&g, c, a, b);
    em_device_synchronize(d);
    double t = (now() - t0) / reps;
    die_if_failed("matmul");
    em_scope_end(s);
    return t;
}

static double time_openblas(int m, int k, int n, int reps) {
    float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
    float *c = malloc(sizeof(float) * (size_t)m * n);
    for (long i = 0; i < (long)m * k; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < (long)k * n; i++) b[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
    double t0 = now();
    for (int i = 0; i < reps; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
    double t = (now() - t0) / reps;
    free(a);
    free(b);
    free(c);
    return t;
}

static void bench_matmul(em_device d) {
    const int shapes[][3] = {{64, 784, 256}, {256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024}};
    bool clblast = em__ocl_clblast_enabled();
    printf("matmul f32 GFLOP/s   (m x k x n)   ember-kernel   %s   openblas-sgemm\n",
           clblast ? "clblast" : "(clblast not loaded)");
    for (int i = 0; i < 4; i++) {
        int m = shapes[i][0], k = shapes[i][1], n = shapes[i][2];
        double flop = 2.0 * m * k * n;
        int reps = flop > 1e9 ? 3 : 10;
        double te = time_matmul(d, m, k, n, false, reps);
        double tc = clblast ? time_matmul(d, m, k, n, true, reps) : 0;
        double tb = time_openblas(m, k, n, reps);
        printf("  %4d x %4d x %4d   %8.1f   %8.1f   %8.1f\n", m, k, n, flop / te / 1e9,
               clblast ? flop / tc / 1e9 : 0.0, flop / tb / 1e9);
    }
}

/* milliseconds per call of an op on device d (10 calls after a warm-up) */
static double time_op(em_device d, int which) {
    em_scope s = em_scope_begin();
    int64_t n = 1 << 22;
    em_manual_seed(3);
    em_tensor *a = em_rand(EM_SHAPE(n), EM_OPTS(.device = d)), *b = em_rand(EM_SHAPE(n), EM_OPTS(.device = d));
    em_tensor *m = em_view(a, EM_SHAPE(4096, 1024));
    double t = 0;
    for (int rep = 0; rep < 11; rep++) {
        em_device_synchronize(d);
        double t0 = now();
        em_scope q = em_scope_begin();
        switch (which) {
        case 0: em_add(a, b); break;
        case 1: em_exp(a); break;
        case 2: em_sum(m, EM_DIMS(1), false); break;
        case 3: em_softmax(m, 1); break;
        default: em_contiguous(em_transpose(m, 0, 1)); break;
        }
        em_scope_end(q);
        em_device_synchronize(d);
        if (rep) t += now() - t0;
    }
    die_if_failed("ops");
    em_scope_end(s);
    return t / 10 * 1e3;
}

static void bench_ops(em_device d) {
    static const char *names[] = {"add 4M f32", "exp 4M f32", "sum rows of 4096x1024",
                                  "softmax rows of 4096x1024", "transpose 4096x1024 (copy)"};
    printf("op (ms per call)                 opencl     cpu backend\n");
    for (int i = 0; i < 5; i++)
        printf("  %-28s %8.2f   %8.2f\n", names[i], time_op(d, i), time_op(EM_DEVICE_CPU, i));
}

int main(int argc, char **argv) {
    /* CLBlast is compared whenever it is installed, whatever the default */
    if (!getenv("EMBER_OPENCL_GEMM")) setenv("EMBER_OPENCL_GEMM", "clblast", 1);
    int dev = argc > 1 ? atoi(argv[1]) : 0;
    if (em_device_count(EM_OPENCL) <= dev) {
        printf("no OpenCL device %d (%s)\n", dev, em_device_unavailable_reason(EM_OPENCL));
        return 0;
    }
    em_device d = EM_DEVICE(EM_OPENCL, dev);
    em_device_props p;
    em_device_get_props(d, &p);
    printf("opencl:%d: %s (%s, driver %s, %d compute units)\n", dev, p.name, p.vendor, p.driver,
           p.compute_units);
    bench_copies(dev);
    bench_latency(d);
    bench_matmul(d);
    bench_ops(d);
    return 0;
}
