/* The f32 GEMMs of `ember train`'s step (the 784-256-10 MLP at batch 64 and 256, with the
 * transposes the step uses) and a few squares, one thread: OpenBLAS, oneDNN's dnnl_sgemm and the
 * built-in AVX-512 GEMM; microseconds and GFLOP/s, the best of repeats filling 0.2 s. What
 * cpu_sgemm_dnnl.c's per-shape choice is based on; "auto" is the one it makes.
 * Usage: bench_sgemm_shapes [batch...] [gpt]   (default 64 256; "gpt": the products of
 * `ember train --model gpt`'s step at bench/run_gpt.sh's size, 2048 tokens, d_model 128) */
#include <stdio.h>
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/cpu_gemm.h"
#include "backends/cpu/cpu_sgemm_dnnl.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define TIMED(call)                                                 \
    do {                                                            \
        best = 1e30;                                                \
        double spent = 0;                                           \
        for (int r = 0; r < 5 || spent < 0.2; r++) {                \
            double t0 = now();                                      \
            call;                                                   \
            double dt = now() - t0;                                 \
            spent += dt;                                            \
            if (dt < best) best = dt;                               \
        }                                                           \
    } while (0)

typedef struct shape { const char *name; bool ta, tb; int m, n, k; } shape;

static void run(const shape *s) {
    int m = s->m, n = s->n, k = s->k, lda = s->ta ? m : k, ldb = s->tb ? k : n;
    float *a = malloc(sizeof(float) * (size_t)m * (size_t)k), *b = malloc(sizeof(float) * (size_t)k * (size_t)n),
          *c = malloc(sizeof(float) * (size_t)m * (size_t)n);
    if (!a || !b || !c) {
        printf("%-18s out of memory\n", s->name);
        free(a), free(b), free(c);
        return;
    }
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++) a[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < (size_t)k * (size_t)n; i++) b[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
    double flops = 2.0 * m * n * k, best, t_blas, t_dnnl = 0, t_own = 0;
    TIMED(cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, m, n, k,
                      1.0f, a, lda, b, ldb, 0.0f, c, n));
    t_blas = best;
    bool dnnl = em__cpu_sgemm_policy("dnnl");
    if (dnnl) {
        TIMED(em__cpu_sgemm_dnnl(s->ta, s->tb, m, n, k, a, lda, b, ldb, 0.0f, c, n));
        t_dnnl = best;
    }
    em__cpu_sgemm_policy("auto");
    bool auto_dnnl = em__cpu_sgemm_dnnl(s->ta, s->tb, m, n, k, a, lda, b, ldb, 0.0f, c, n);
    bool own = em__cpu_gemm_use("avx512");
    if (own) {
        TIMED(em__cpu_gemm_f32(m, n, k, a, s->ta ? 1 : lda, s->ta ? lda : 1, b, s->tb ? 1 : ldb, s->tb ? ldb : 1, c, n));
        t_own = best;
    }
    printf("%-18s %4d %4d %4d %9.1f %7.1f", s->name, m, n, k, 1e6 * t_blas, flops / t_blas / 1e9);
    if (dnnl) printf(" %9.1f %7.1f %6.2f", 1e6 * t_dnnl, flops / t_dnnl / 1e9, t_blas / t_dnnl);
    else printf(" %9s %7s %6s", "-", "-", "-");
    if (own) printf(" %9.1f %7.1f", 1e6 * t_own, flops / t_own / 1e9);
    else printf(" %9s %7s", "-", "-");
    printf("  %s\n", auto_dnnl ? "dnnl" : "openblas");
    free(a), free(b), free(c);
}

int main(int argc, char **argv) {
    int batches[16] = {64, 256}, nb = 2;
    bool gpt = false;
    if (argc > 1) {
        nb = 0;
        for (int i = 1; i < argc && nb < 16; i++) {
            if (strcmp(argv[i], "gpt") == 0) gpt = true;
            else if (atoi(argv[i]) > 0) batches[nb++] = atoi(argv[i]);
        }
    }
    openblas_set_num_threads(1);
    printf("one thread; us = best of repeats; ratio = OpenBLAS time / oneDNN time; auto = what Ember's "
           "matmul picks (EMBER_CPU_SGEMM=%s)\n", em__cpu_sgemm_policy_name());
    printf("%-18s %4s %4s %4s %9s %7s %9s %7s %6s %9s %7s  %s\n", "product", "m", "n", "k", "blas us", "GF/s",
           "dnnl us", "GF/s", "ratio", "own us", "GF/s", "auto");
    for (int i = 0; i < nb; i++) {
        int B = batches[i];
        char names[5][32];
        snprintf(names[0], 32, "B%d x@W1^T", B);
        snprintf(names[1], 32, "B%d h@W2^T", B);
        snprintf(names[2], 32, "B%d dW1=g^T@x", B);
        snprintf(names[3], 32, "B%d dW2=g^T@h", B);
        snprintf(names[4], 32, "B%d dh=g@W2", B);
        shape s[5] = {{names[0], false, true, B, 256, 784}, {names[1], false, true, B, 10, 256},
                      {names[2], true, false, 256, 784, B}, {names[3], true, false, 10, 256, B},
                      {names[4], false, false, B, 256, 10}};
        for (int j = 0; j < 5; j++) run(&s[j]);
    }
    if (gpt) { /* x@W^T forward, dx = g@W, dW = g^T@x; q/k/v fused (384), MLP 512, vocabulary 114 */
        static const shape g[] = {
            {"gpt fwd qkv", false, true, 2048, 384, 128},  {"gpt fwd proj", false, true, 2048, 128, 128},
            {"gpt fwd fc1", false, true, 2048, 512, 128},  {"gpt fwd fc2", false, true, 2048, 128, 512},
            {"gpt fwd head", false, true, 2048, 114, 128}, {"gpt dx qkv", false, false, 2048, 128, 384},
            {"gpt dx proj", false, false, 2048, 128, 128}, {"gpt dx fc1", false, false, 2048, 128, 512},
            {"gpt dx fc2", false, false, 2048, 512, 128},  {"gpt dx head", false, false, 2048, 128, 114},
            {"gpt dW qkv", true, false, 384, 128, 2048},   {"gpt dW proj", true, false, 128, 128, 2048},
            {"gpt dW fc1", true, false, 512, 128, 2048},   {"gpt dW fc2", true, false, 128, 512, 2048},
            {"gpt dW head", true, false, 114, 128, 2048}};
        for (size_t j = 0; j < sizeof g / sizeof g[0]; j++) run(&g[j]);
    }
    static const int squares[] = {128, 256, 512, 1024};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "square %d", squares[i]);
        shape s = {name, false, false, squares[i], squares[i], squares[i]};
        run(&s);
    }
    return 0;
}
#else
int main(void) {
    printf("bench_sgemm_shapes: skipped (a build without OpenBLAS: nothing to compare)\n");
    return 0;
}
#endif
