/* The CPU's FP32 peak on one thread, measured: independent chains of 8-wide fused
 * multiply-adds (AVX2 + FMA when the CPU has them, else 4-wide SSE multiply + add), long
 * enough to hide their latency. Prints "fma_peak_gflops <value>". Used by bench/run_train.sh
 * to say what fraction of the peak a training loop reaches. */
#include <stdio.h>
#include <time.h>
#include <immintrin.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CHAINS 12
#define ITERS 2000000L

/* 12 chains x 8 lanes x 2 flops per iteration */
__attribute__((target("avx2,fma"))) static float run_fma(float seed) {
    __m256 acc[CHAINS], m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12   /* keep every chain in a register */
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    }
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

/* 12 chains x 4 lanes x 2 flops (a multiply and an add) per iteration */
static float run_sse(float seed) {
    __m128 acc[CHAINS], m = _mm_set1_ps(0.999999f), a = _mm_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], m), a);
    }
    __m128 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm_add_ps(s, acc[c]);
    return _mm_cvtss_f32(s);
}

int main(void) {
    __builtin_cpu_init();
    int fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    double best = 0, flops = (double)ITERS * CHAINS * (fma ? 8 : 4) * 2;
    float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        sink += fma ? run_fma((float)rep) : run_sse((float)rep);
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    printf("fma_peak_gflops %.1f\n", best);
    printf("isa %s\n", fma ? "avx2+fma (8 lanes)" : "sse (4 lanes, mul+add)");
    fprintf(stderr, "(checksum %g)\n", (double)sink);
    return 0;
}
