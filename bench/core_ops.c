/* Core op costs, printed as "key value" lines for bench/run_core.sh:
 *   tiny_add_ns_t{1,2}     a 1-element add (dispatch + allocation + kernel), ns per op
 *   linear16_ns_t{1,2}     a 16x16 linear forward (matmul + bias add), ns per op
 *   stream_gbs_t{1,2}      a C loop a[i] = b[i] + c[i] over 64M floats, GB/s (12 bytes/element),
 *                          one thread, timed alternately with the kernels below
 *   add_out_gbs_t{1,2}     the CPU add kernel a = b + c into an existing tensor (what the loop does)
 *   add_inplace_gbs_t{1,2} em_add_(a, b, 1): a += b (no write-allocate, so it can beat the loop)
 *   add_gbs_t{1,2}         em_add(b, c) into a new tensor: allocation and first touch included
 * Each number is the best of several repeats (the machine is shared). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>
#include "backends/backend.h"
#include "core/tensor_impl.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define REPEATS 5

static double tiny_add_ns(void) {
    em_tensor *a = em_ones(EM_SHAPE(1), (em_opts){0}), *b = em_ones(EM_SHAPE(1), (em_opts){0});
    const int n = 100000;
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) em_release(em_add(a, b));
        double t = (now() - t0) / n * 1e9;
        if (t < best) best = t;
    }
    em_release(a);
    em_release(b);
    return best;
}

static double linear16_ns(void) {
    em_manual_seed(0);
    em_tensor *x = em_randn(EM_SHAPE(16, 16), (em_opts){0}), *w = em_randn(EM_SHAPE(16, 16), (em_opts){0});
    em_tensor *bias = em_randn(EM_SHAPE(16), (em_opts){0});
    const int n = 50000;
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) {
            em_tensor *y = em_matmul(x, w);
            em_release(em_add(y, bias));
            em_release(y);
        }
        double t = (now() - t0) / n * 1e9;
        if (t < best) best = t;
    }
    em_release(x);
    em_release(w);
    em_release(bias);
    return best;
}

#define BIG_N ((int64_t)64 << 20)

/* The baseline a C programmer writes (restrict lets the compiler vectorize it). */
__attribute__((noinline)) static void stream_add(float *restrict a, const float *restrict b,
                                                 const float *restrict c, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + c[i];
}

/* The loop and the kernels alternate over the same memory, so machine noise hits both alike. */
static void big_add_gbs(double *stream, double *kernel, double *inplace, double *outofplace) {
    em_tensor *a = em_zeros(EM_SHAPE(BIG_N), (em_opts){0}), *b = em_ones(EM_SHAPE(BIG_N), (em_opts){0});
    em_tensor *c = em_ones(EM_SHAPE(BIG_N), (em_opts){0});
    double best_s = 1e30, best_k = 1e30, best_in = 1e30, best_out = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        stream_add(em_data_ptr(a), em_data_ptr(b), em_data_ptr(c), BIG_N);
        double ts = now() - t0;
        if (ts < best_s) best_s = ts;
        t0 = now();
        em_cpu_backend.binary(EM_OP_ADD, a, b, c);
        double tk = now() - t0;
        if (tk < best_k) best_k = tk;
        t0 = now();
        em_add_(a, b, 1.0);
        double t = now() - t0;
        if (t < best_in) best_in = t;
        t0 = now();
        em_tensor *d = em_add(b, c);
        t = now() - t0;
        em_release(d);
        if (t < best_out) best_out = t;
    }
    em_release(a);
    em_release(b);
    em_release(c);
    *stream = 12.0 * (double)BIG_N / best_s / 1e9;
    *kernel = 12.0 * (double)BIG_N / best_k / 1e9;
    *inplace = 12.0 * (double)BIG_N / best_in / 1e9;
    *outofplace = 12.0 * (double)BIG_N / best_out / 1e9;
}

int main(void) {
    for (int t = 1; t <= 2; t++) {
        em_set_num_threads(t);
        printf("tiny_add_ns_t%d %.1f\n", t, tiny_add_ns());
        printf("linear16_ns_t%d %.1f\n", t, linear16_ns());
        double gs, gk, gi, go;
        big_add_gbs(&gs, &gk, &gi, &go);
        printf("stream_gbs_t%d %.2f\n", t, gs);
        printf("add_out_gbs_t%d %.2f\n", t, gk);
        printf("add_inplace_gbs_t%d %.2f\n", t, gi);
        printf("add_gbs_t%d %.2f\n", t, go);
    }
    if (em_failed()) {
        fprintf(stderr, "error: %s\n", em_last_error());
        return 1;
    }
    return 0;
}
