/* The bf16 GEMMs of bench/run_amp.sh's training steps (forward, input gradient and weight
 * gradient of each Linear, with the layouts the step uses), the language models' forward
 * products at 512 rows (a 1B and Llama-2-7B's Linears: prefill and fine-tuning; the fused
 * loss's 256-row chunk against a 128256-id head) and the squares, through Ember's AMX
 * kernel (cpu_amx.c) and through oneDNN's matmul (cpu_dnnl.c), on 1 and 2 threads:
 * microseconds and GFLOP/s, the best of repeats filling 0.2 s, and which is faster. What
 * cpu_amx.c's claim to beat oneDNN rests on. Without AMX (AVX512-BF16 only, as on AMD Zen 4)
 * the oneDNN column alone, which shows how each GEMM of the steps compares with the bf16 peak.
 * Usage: bench_lowp_shapes [threads...]   (default 1 2) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>
#include "backends/cpu/cpu_amx.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef em_status (*gemm_fn)(const em_lowp_gemm *);

/* best seconds per call, or -1 when the path refuses */
static double timed(gemm_fn f, const em_lowp_gemm *g) {
    if (f(g) != EM_OK) {
        em_clear_error();
        return -1;
    }
    double best = 1e30, spent = 0;
    for (int r = 0; r < 5 || spent < 0.2; r++) {
        double t0 = now();
        f(g);
        double dt = now() - t0;
        spent += dt;
        if (dt < best) best = dt;
    }
    return best;
}

typedef struct shape { const char *what; long P, K, Q; int xt, yt; } shape;

int main(int argc, char **argv) {
    if (!em__cpu_amx_runs(EM_BF16) && !em__cpu_dnnl_runs(EM_BF16)) {
        printf("skipped: neither Ember's AMX kernel nor oneDNN runs bf16 here (%s)\n", em_cpu_matmul_impl(EM_BF16));
        return 0;
    }
    printf("bf16 matmul: %s\n", em_cpu_matmul_impl(EM_BF16));
    int threads[8] = {1, 2}, nt = 2;
    if (argc > 1) {
        nt = 0;
        for (int i = 1; i < argc && nt < 8; i++) threads[nt++] = atoi(argv[i]);
    }
    static shape shapes[64];
    int n = 0;
    const long dims[][4] = {{784, 256, 10, 0}, {784, 512, 512, 10}, {4096, 4096, 4096, 4096}};
    const long batches[] = {256, 1024};
    for (int m = 0; m < 3; m++)
        for (int b = 0; b < 2; b++)
            for (int l = 0; l < 3 && dims[m][l + 1]; l++) {
                long B = batches[b], in = dims[m][l], out = dims[m][l + 1];
                static char names[64][48];
                snprintf(names[n], sizeof names[n], "b%ld %ld->%ld fwd", B, in, out);
                shapes[n] = (shape){names[n], B, in, out, 0, 1}; /* X W^T */
                n++;
                if (l > 0) {
                    snprintf(names[n], sizeof names[n], "b%ld %ld->%ld dX", B, in, out);
                    shapes[n] = (shape){names[n], B, out, in, 0, 0}; /* G W */
                    n++;
                }
                snprintf(names[n], sizeof names[n], "b%ld %ld->%ld dW", B, in, out);
                shapes[n] = (shape){names[n], out, B, in, 1, 0}; /* G^T X */
                n++;
            }
    const shape lm[] = {{"lm 1B 2048->2048", 512, 2048, 2048, 0, 1},   {"lm 1B 2048->8192", 512, 2048, 8192, 0, 1},
                        {"lm 1B 8192->2048", 512, 8192, 2048, 0, 1},   {"lm 1B loss chunk", 256, 2048, 128256, 0, 1},
                        {"lm 7B 4096->4096", 512, 4096, 4096, 0, 1},   {"lm 7B 4096->11008", 512, 4096, 11008, 0, 1},
                        {"lm 7B 11008->4096", 512, 11008, 4096, 0, 1}};
    for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++) shapes[n++] = lm[i];
    for (long s = 1024; s <= 4096; s *= 2) shapes[n++] = (shape){"square", s, s, s, 0, 0};
    long maxe = 0;   /* elements of the largest operand */
    for (int i = 0; i < n; i++) {
        long e[3] = {shapes[i].P * shapes[i].K, shapes[i].K * shapes[i].Q, shapes[i].P * shapes[i].Q};
        for (int k = 0; k < 3; k++)
            if (e[k] > maxe) maxe = e[k];
    }
    unsigned short *x = malloc(2 * (size_t)maxe), *y = malloc(2 * (size_t)maxe), *z = malloc(2 * (size_t)maxe);
    if (!x || !y || !z) return 1;
    for (long i = 0; i < maxe; i++) {
        x[i] = (unsigned short)(0x3f80 ^ (rand() & 0x807f)); /* +-[1, 2) */
        y[i] = (unsigned short)(0x3f80 ^ (rand() & 0x807f));
    }
    printf("%-22s %5s %5s %5s %2s %2s %3s %10s %10s %9s %9s %s\n", "GEMM", "P", "K", "Q", "xt", "yt", "thr", "amx_us",
           "onednn_us", "amx_GF/s", "dnnl_GF/s", "amx/onednn time");
    for (int t = 0; t < nt; t++) {
        em_set_num_threads(threads[t]);
        for (int i = 0; i < n; i++) {
            const shape *s = &shapes[i];
            em_lowp_gemm g = {EM_BF16, s->P, s->Q, s->K, x, y, z, s->xt, s->yt, s->xt ? s->P : s->K,
                              s->yt ? s->K : s->Q, s->Q, false, NULL, false};
            double a = timed(em__cpu_amx_gemm, &g), d = timed(em__cpu_dnnl_gemm, &g);
            double fl = 2.0 * (double)s->P * (double)s->Q * (double)s->K;
            if (a < 0) /* under 32 rows or columns: the AMX kernel leaves these to oneDNN */
                printf("%-22s %5ld %5ld %5ld %2d %2d %3d %10s %10.1f %9s %9.1f (oneDNN's)\n", s->what, s->P, s->K, s->Q,
                       s->xt, s->yt, threads[t], "-", d * 1e6, "-", fl / d / 1e9);
            else
                printf("%-22s %5ld %5ld %5ld %2d %2d %3d %10.1f %10.1f %9.1f %9.1f %.2f\n", s->what, s->P, s->K, s->Q,
                       s->xt, s->yt, threads[t], a * 1e6, d * 1e6, fl / a / 1e9, d > 0 ? fl / d / 1e9 : 0,
                       d > 0 ? a / d : 0);
        }
    }
    free(x);
    free(y);
    free(z);
    return 0;
}
