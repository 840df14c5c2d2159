/* Core op costs, printed as "key value" lines for bench/run_core.sh:
 *   tiny_add_ns_t{1,2}     a 1-element add (dispatch + allocation + kernel), ns per op
 *   linear16_ns_t{1,2}     a 16x16 linear forward (matmul + bias add), ns per op
 *   stream_gbs             a C loop a[i] = b[i] + c[i] over 64M floats, GB/s (12 bytes/element)
 *   add_inplace_gbs_t{1,2} em_add_(a, b, 1) over 64M floats, GB/s (same traffic)
 *   add_gbs_t{1,2}         em_add(b, c) into a new tensor (allocation included), GB/s
 * Each number is the best of several repeats (the machine is shared). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>

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

static double stream_gbs(void) {
    float *a = aligned_alloc(64, BIG_N * 4), *b = aligned_alloc(64, BIG_N * 4), *c = aligned_alloc(64, BIG_N * 4);
    for (int64_t i = 0; i < BIG_N; i++) { a[i] = 0; b[i] = (float)i; c[i] = 1; }
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        stream_add(a, b, c, BIG_N);
        double t = now() - t0;
        if (t < best) best = t;
    }
    volatile float sink = a[BIG_N - 1];
    (void)sink;
    free(a);
    free(b);
    free(c);
    return 12.0 * (double)BIG_N / best / 1e9;
}

static void big_add_gbs(double *inplace, double *outofplace) {
    em_tensor *a = em_zeros(EM_SHAPE(BIG_N), (em_opts){0}), *b = em_ones(EM_SHAPE(BIG_N), (em_opts){0});
    em_tensor *c = em_ones(EM_SHAPE(BIG_N), (em_opts){0});
    double best_in = 1e30, best_out = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
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
    *inplace = 12.0 * (double)BIG_N / best_in / 1e9;
    *outofplace = 12.0 * (double)BIG_N / best_out / 1e9;
}

int main(void) {
    printf("stream_gbs %.2f\n", stream_gbs());
    for (int t = 1; t <= 2; t++) {
        em_set_num_threads(t);
        printf("tiny_add_ns_t%d %.1f\n", t, tiny_add_ns());
        printf("linear16_ns_t%d %.1f\n", t, linear16_ns());
        double gi, go;
        big_add_gbs(&gi, &go);
        printf("add_inplace_gbs_t%d %.2f\n", t, gi);
        printf("add_gbs_t%d %.2f\n", t, go);
    }
    if (em_failed()) {
        fprintf(stderr, "error: %s\n", em_last_error());
        return 1;
    }
    return 0;
}
