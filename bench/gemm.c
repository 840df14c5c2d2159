/* The built-in GEMM (src/backends/cpu/cpu_gemm.c) against OpenBLAS, one thread each, on
 * square row-major problems: GFLOP/s (best of repeats) per size, dtype and instruction set.
 * Built only when the build has OpenBLAS (it is the reference).
 * Usage: bench_gemm [sizes...]   (default 64 128 256 512 1024 2048) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/cpu_gemm.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* best seconds per call over repeats filling about 0.3 s (at least 3 calls) */
#define TIMED(call)                                                 \
    do {                                                            \
        best = 1e30;                                                \
        double spent = 0;                                           \
        for (int r = 0; r < 3 || spent < 0.3; r++) {                \
            double t0 = now();                                      \
            call;                                                   \
            double dt = now() - t0;                                 \
            spent += dt;                                            \
            if (dt < best) best = dt;                               \
        }                                                           \
    } while (0)

int main(int argc, char **argv) {
    static const int defaults[] = {64, 128, 256, 512, 1024, 2048};
    int sizes[32], ns = 0;
    for (int i = 1; i < argc && ns < 32; i++) sizes[ns++] = atoi(argv[i]);
    if (!ns) {
        ns = 6;
        memcpy(sizes, defaults, sizeof defaults);
    }
    openblas_set_num_threads(1);
    static const char *const isas[] = {"generic", "avx2", "avx512"};
    printf("one thread; GFLOP/s (best of repeats); ratio = built-in (best set) / OpenBLAS\n");
    printf("%-5s %6s %10s", "dtype", "n", "OpenBLAS");
    for (int s = 0; s < 3; s++) printf(" %10s", isas[s]);
    printf(" %7s\n", "ratio");
    for (int dbl = 0; dbl < 2; dbl++)
        for (int i = 0; i < ns; i++) {
            int n = sizes[i];
            if (n < 1 || n > 16384) continue;
            size_t es = dbl ? 8 : 4, cnt = (size_t)n * (size_t)n;
            char *a = malloc(cnt * es), *b = malloc(cnt * es), *c = malloc(cnt * es);
            if (!a || !b || !c) return 1;
            for (size_t k = 0; k < cnt; k++) {
                double v = (double)((k * 2654435761u) % 1000) / 1000.0 - 0.5;
                if (dbl) ((double *)a)[k] = v, ((double *)b)[k] = -v;
                else ((float *)a)[k] = (float)v, ((float *)b)[k] = (float)-v;
            }
            double flops = 2.0 * n * n * n, best;
            if (dbl) TIMED(cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, (double *)a, n,
                                       (double *)b, n, 0.0, (double *)c, n));
            else TIMED(cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, (float *)a, n,
                                   (float *)b, n, 0.0f, (float *)c, n));
            double blas = flops / best / 1e9, top = 0;
            printf("%-5s %6d %10.1f", dbl ? "f64" : "f32", n, blas);
            for (int s = 0; s < 3; s++) {
                if (!em__cpu_gemm_use(isas[s])) {
                    printf(" %10s", "-");
                    continue;
                }
                if (dbl) TIMED(em__cpu_gemm_f64(n, n, n, (double *)a, n, 1, (double *)b, n, 1, (double *)c, n));
                else TIMED(em__cpu_gemm_f32(n, n, n, (float *)a, n, 1, (float *)b, n, 1, (float *)c, n));
                double g = flops / best / 1e9;
                if (g > top) top = g;
                printf(" %10.1f", g);
            }
            printf(" %7.2f\n", top / blas);
            free(a), free(b), free(c);
        }
    return 0;
}
