/* conv2d in bfloat16 / float16 against float32 on the shapes of `ember train --model cnn`
 * (batch 64): Ember's three passes (forward, backward to the data, backward to the weights,
 * as autograd calls them) on the CPU, through oneDNN (bf16: its own bf16 kernels; f16 and
 * bf16 with EMBER_CPU_LOWP_GEMM=portable: float32 copies) and through the portable im2col
 * path. Times are the minimum over reps of the calling thread's CPU time (with one thread,
 * oneDNN runs on the calling thread too), so other processes' load barely moves them.
 * Usage: bench_conv_lowp [threads] [reps]   (default 1 thread, 20 reps) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>
#include "core/internal_api.h"

typedef struct shape {
    const char *name;
    int64_t n, c, h, w, o, k, pad;
} shape;

static const shape shapes[] = {{"conv1 64x1x28x28 -> 16, k5 p2", 64, 1, 28, 28, 16, 5, 2},
                               {"conv2 64x16x14x14 -> 32, k5", 64, 16, 14, 14, 32, 5, 0}};

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double flops_fwd(const shape *s) {
    int64_t oh = s->h + 2 * s->pad - s->k + 1, ow = s->w + 2 * s->pad - s->k + 1;
    return 2.0 * (double)(s->n * s->o * oh * ow * s->c * s->k * s->k);
}

static void bench(const shape *s, em_dtype dt, bool portable, bool lowp_portable, const char *impl, int reps) {
    if (lowp_portable) setenv("EMBER_CPU_LOWP_GEMM", "portable", 1);
    bool prev = em__conv_force_portable(portable);
    em_scope sc = em_scope_begin();
    em_grad_mode gm = em_no_grad_begin();
    em_tensor *x = em_to_dtype(em_randn(EM_SHAPE(s->n, s->c, s->h, s->w), EM_OPTS(0)), dt);
    em_tensor *w = em_to_dtype(em_randn(EM_SHAPE(s->o, s->c, s->k, s->k), EM_OPTS(0)), dt);
    em_tensor *b = em_to_dtype(em_randn(EM_SHAPE(s->o), EM_OPTS(0)), dt);
    int64_t xs[4] = {s->n, s->c, s->h, s->w}, ws[4] = {s->o, s->c, s->k, s->k};
    int64_t win[11] = {s->k, s->k, 1, 1, s->pad, s->pad, 1, 1, 1, 0, 0};
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = -2; r < reps; r++) {
        em_scope it = em_scope_begin();
        double t0 = cpu_now();
        em_tensor *y = em_conv2d(x, w, b, EM_HW1(1), EM_HW1(s->pad), EM_HW1(1), 1);
        double t1 = cpu_now();
        em_tensor *gx = em__conv2d_backward_input(y, w, xs, win);
        double t2 = cpu_now();
        em_tensor *gw = em__conv2d_backward_weight(y, x, ws, win);
        double t3 = cpu_now();
        if (!y || !gx || !gw) {
            fprintf(stderr, "%s %s: %s\n", s->name, impl, em_last_error());
            em_clear_error();
            em_scope_end(it);
            break;
        }
        double t[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int k = 0; r >= 0 && k < 3; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
        em_scope_end(it);
    }
    double f = flops_fwd(s), all = best[0] + best[1] + best[2];
    printf("conv %-30s %-34s fwd %7.3f ms | bwd data %7.3f ms | bwd weights %7.3f ms | all %7.3f ms %6.1f GFLOP/s\n",
           s->name, impl, 1e3 * best[0], 1e3 * best[1], 1e3 * best[2], 1e3 * all, 3 * f / all / 1e9);
    em_no_grad_end(gm);
    em_scope_end(sc);
    em__conv_force_portable(prev);
    if (lowp_portable) unsetenv("EMBER_CPU_LOWP_GEMM");
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 20;
    if (reps < 1) reps = 20;
    em_set_num_threads(threads);
    printf("threads %d, min of %d reps, the calling thread's CPU time\n", threads, reps);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        bench(s, EM_F32, false, false, "float32 (oneDNN)", reps);
        bench(s, EM_BF16, false, false, "bfloat16 (oneDNN bf16)", reps);
        bench(s, EM_BF16, false, true, "bfloat16 (oneDNN on f32 copies)", reps);
        bench(s, EM_F16, false, false, "float16 (oneDNN on f32 copies)", reps);
        bench(s, EM_F32, true, false, "float32 (im2col)", reps);
        bench(s, EM_BF16, true, false, "bfloat16 (im2col)", reps);
    }
    return 0;
}
