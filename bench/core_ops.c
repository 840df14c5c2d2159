/* Core op costs, printed as "key value" lines for bench/run_core.sh:
 *   tiny_add_ns_t{1,2}     a 1-element add (dispatch + allocation + kernel), ns per op
 *   linear16_ns_t{1,2}     a 16x16 linear forward (matmul + bias add), ns per op
 *   stream_gbs_t{1,2}      a C loop a[i] = b[i] + c[i] over 64M floats, GB/s (12 bytes/element),
 *                          one thread, timed alternately with the kernels below
 *   add_out_gbs_t{1,2}     the CPU add kernel a = b + c into an existing tensor (what the loop does)
 *   add_inplace_gbs_t{1,2} em_add_(a, b, 1): a += b (no write-allocate, so it can beat the loop)
 *   add_gbs_t{1,2}         em_add(b, c) into a new tensor: allocation and first touch included
 * Each number is the best of several repeats, and the 1- and 2-thread runs alternate inside
 * every repeat, so the shared machine's noise falls on both alike. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>
#include "backends/backend.h"
#include "core/tensor_impl.h"

#define REPEATS 7
#define BIG_N ((int64_t)64 << 20)
#define NMEASURES 6

static const char *const names[NMEASURES] = {"tiny_add_ns", "linear16_ns", "stream_gbs", "add_out_gbs",
                                             "add_inplace_gbs", "add_gbs"};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The baseline a C programmer writes (restrict lets the compiler vectorize it). */
__attribute__((noinline)) static void stream_add(float *restrict a, const float *restrict b,
                                                 const float *restrict c, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + c[i];
}

typedef struct inputs {
    em_tensor *one_a, *one_b;          /* [1] */
    em_tensor *x, *w, *bias;           /* 16x16 linear */
    em_tensor *a, *b, *c;              /* 64M floats */
} inputs;

/* One repeat of every measure at the current thread count; seconds (per op for tiny ones). */
static void run_once(const inputs *in, double *t) {
    const int windows = 10, ntiny = 10000, nlin = 5000; /* short windows: a preemption spoils one */
    t[0] = t[1] = 1e30;
    for (int w = 0; w < windows; w++) {
        double t0 = now();
        for (int i = 0; i < ntiny; i++) em_release(em_add(in->one_a, in->one_b));
        double dt = (now() - t0) / ntiny;
        if (dt < t[0]) t[0] = dt;
        t0 = now();
        for (int i = 0; i < nlin; i++) {
            em_tensor *y = em_matmul(in->x, in->w);
            em_release(em_add(y, in->bias));
            em_release(y);
        }
        dt = (now() - t0) / nlin;
        if (dt < t[1]) t[1] = dt;
    }
    double t0 = now();
    stream_add(em_data_ptr(in->a), em_data_ptr(in->b), em_data_ptr(in->c), BIG_N);
    t[2] = now() - t0;
    t0 = now();
    em__cpu_backend.run(&(em_op_call){.op = EM_OP_ADD, .dtype = EM_F32, .dst = {in->a}, .src = {in->b, in->c}});
    t[3] = now() - t0;
    t0 = now();
    em_add_(in->a, in->b, 1.0);
    t[4] = now() - t0;
    t0 = now();
    em_tensor *d = em_add(in->b, in->c);
    t[5] = now() - t0;
    em_release(d);
}

int main(void) {
    em_manual_seed(0);
    inputs in = {
        em_ones(EM_SHAPE(1), (em_opts){0}), em_ones(EM_SHAPE(1), (em_opts){0}),
        em_randn(EM_SHAPE(16, 16), (em_opts){0}), em_randn(EM_SHAPE(16, 16), (em_opts){0}),
        em_randn(EM_SHAPE(16), (em_opts){0}),
        em_zeros(EM_SHAPE(BIG_N), (em_opts){0}), em_ones(EM_SHAPE(BIG_N), (em_opts){0}),
        em_ones(EM_SHAPE(BIG_N), (em_opts){0}),
    };
    double best[2][NMEASURES];
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < NMEASURES; k++) best[t][k] = 1e30;
    for (int r = 0; r < REPEATS; r++)
        for (int t = 0; t < 2; t++) {
            double s[NMEASURES];
            em_set_num_threads(t + 1);
            run_once(&in, s);
            for (int k = 0; k < NMEASURES; k++)
                if (s[k] < best[t][k]) best[t][k] = s[k];
        }
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < NMEASURES; k++) {
            double v = k < 2 ? best[t][k] * 1e9 : 12.0 * (double)BIG_N / best[t][k] / 1e9;
            printf("%s_t%d %.2f\n", names[k], t + 1, v);
        }
    em_release(in.one_a); em_release(in.one_b); em_release(in.x); em_release(in.w); em_release(in.bias);
    em_release(in.a); em_release(in.b); em_release(in.c);
    if (em_failed()) {
        fprintf(stderr, "error: %s\n", em_last_error());
        return 1;
    }
    return 0;
}
