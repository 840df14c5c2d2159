/* The GPT's non-GEMM kernels on their own, one thread, process CPU time, best of 30:
 *   attention: em_scaled_dot_product_attention forward and backward (causal, q, k, v head
 *   views of [N, T, 128] tensors as MultiheadAttention makes them), the fused kernel
 *   (src/backends/cpu/cpu_attention.c) against the composition (EMBER_ATTENTION=composed:
 *   matmul, mask add, softmax, matmul), with the allocator's peak over the pass;
 *   GELU: the vector kernels (src/backends/cpu/cpu_vmath.c) forward and backward, ns per
 *   element, on 1M elements.
 * Usage: bench_transformer_ops [batch context]...   (default 32 64 8 256: the bench GPT's
 * size and a longer context) */
#include <ember/ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "backends/cpu/cpu_vmath.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* [N, T, 128] as heads [N, 4, T, 32] */
static em_tensor *heads(em_tensor *x, int64_t n, int64_t t) {
    return em_transpose(em_reshape(x, EM_SHAPE(n, t, 4, 32)), 1, 2);
}

static void attention(int64_t n, int64_t t, bool fused) {
    if (fused) unsetenv("EMBER_ATTENTION");
    else setenv("EMBER_ATTENTION", "composed", 1);
    em_scope s = em_scope_begin();
    em_tensor *x[3], *g = em_randn(EM_SHAPE(n, 4, t, 32), EM_OPTS(0));
    for (int i = 0; i < 3; i++) {
        x[i] = em_randn(EM_SHAPE(n, t, 128), EM_OPTS(0));
        em_set_requires_grad(x[i], true);
    }
    double fwd = 1e30, bwd = 1e30;
    int64_t peak = 0;
    for (int r = 0; r < 30; r++) {
        em_scope it = em_scope_begin();
        int64_t base = em_memory_allocated(EM_DEVICE_CPU);
        em_memory_reset_peak_stats(EM_DEVICE_CPU);
        double t0 = cpu_now();
        em_tensor *y = em_scaled_dot_product_attention(heads(x[0], n, t), heads(x[1], n, t), heads(x[2], n, t), NULL,
                                                       0.0, true);
        double t1 = cpu_now();
        em_backward_with(y, g, false);
        double t2 = cpu_now();
        int64_t p = em_memory_max_allocated(EM_DEVICE_CPU) - base;
        fwd = t1 - t0 < fwd ? t1 - t0 : fwd;
        bwd = t2 - t1 < bwd ? t2 - t1 : bwd;
        peak = p > peak ? p : peak;
        for (int i = 0; i < 3; i++) em_set_grad(x[i], NULL);
        em_scope_end(it);
    }
    if (em_failed()) printf("attention: %s\n", em_last_error());
    printf("attention N %3lld T %4lld causal %-8s forward %8.1f us  backward %8.1f us  peak over the pass %7.2f MB\n",
           (long long)n, (long long)t, fused ? "fused" : "composed", 1e6 * fwd, 1e6 * bwd, (double)peak / 1e6);
    em_scope_end(s);
    unsetenv("EMBER_ATTENTION");
}

static void gelu(void) {
    enum { N = 1 << 20 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *g = malloc(sizeof(float) * N);
    if (!x || !y || !g) {
        free(x), free(y), free(g);
        return;
    }
    for (int i = 0; i < N; i++) {
        x[i] = (float)((i * 37) % 2000) / 500.0f - 2.0f;
        g[i] = 1.0f;
    }
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < 30; r++) {
        double t0 = cpu_now();
        em__cpu_vgelu_f32(x, y, N);
        double t1 = cpu_now();
        em__cpu_vgelu_backward_f32(g, x, y, N);
        double t2 = cpu_now();
        fwd = t1 - t0 < fwd ? t1 - t0 : fwd;
        bwd = t2 - t1 < bwd ? t2 - t1 : bwd;
    }
    printf("gelu %s 1M elements: forward %.3f ns, backward %.3f ns per element\n", em__cpu_vmath_isa(), 1e9 * fwd / N,
           1e9 * bwd / N);
    free(x), free(y), free(g);
}

int main(int argc, char **argv) {
    em_set_num_threads(1);
    int64_t shapes[16] = {32, 64, 8, 256};
    int ns = 2;
    if (argc > 2) {
        ns = 0;
        for (int i = 1; i + 1 < argc && ns < 8; i += 2) {
            shapes[2 * ns] = atoll(argv[i]);
            shapes[2 * ns + 1] = atoll(argv[i + 1]);
            if (shapes[2 * ns] > 0 && shapes[2 * ns + 1] > 0) ns++;
        }
    }
    for (int i = 0; i < ns; i++) {
        attention(shapes[2 * i], shapes[2 * i + 1], true);
        attention(shapes[2 * i], shapes[2 * i + 1], false);
    }
    gelu();
    return em_failed() ? 1 : 0;
}
