/* The CPU's FP32 peak on one thread, measured with the widest FMA unit the CPU has (found at
 * run time): independent chains of 16-wide AVX-512 fused multiply-adds, else 8-wide AVX2 +
 * FMA, else 4-wide SSE multiply + add; enough chains to hide their latency on every port.
 * On AVX-512 machines it also runs the 8-wide chains: two 512-bit FMA ports give twice the
 * 256-bit FLOP rate, one (ports 0 and 1 fused) about the same; that ratio is reported as the
 * number of 512-bit FMA ports. Prints "fma_peak_gflops <value>" and "isa <description>".
 * Used by bench/run_train.sh to say what fraction of the true peak a training loop reaches
 * (measuring 8-wide chains on an AVX-512 machine understated the peak by half). */
#include <stdio.h>
#include <time.h>
#include <immintrin.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CHAINS 12 /* 2 ports x 4-6 cycles of latency, within 16 (AVX2) or 32 registers */
#define ITERS 2000000L

/* 12 chains x 16 lanes x 2 flops per iteration */
__attribute__((target("avx512f"))) static float run_avx512(float seed) {
    __m512 acc[CHAINS], m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12   /* keep every chain in a register */
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    }
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

/* 12 chains x 8 lanes x 2 flops per iteration */
__attribute__((target("avx2,fma"))) static float run_avx2(float seed) {
    __m256 acc[CHAINS], m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12
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

typedef float (*chain_fn)(float);

/* best of 5 runs, in GFLOP/s */
static double measure(chain_fn fn, int lanes, float *sink) {
    double best = 0, flops = (double)ITERS * CHAINS * lanes * 2;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        *sink += fn((float)rep);
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(void) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    float sink = 0;
    if (avx512) {
        double g256 = measure(run_avx2, 8, &sink), g512 = measure(run_avx512, 16, &sink);
        int ports = g512 / g256 >= 1.5 ? 2 : 1;
        printf("fma_peak_gflops %.1f\n", g512);
        printf("isa avx512f (16 lanes, %d FMA-512 port%s; 8-lane avx2 chains: %.1f GFLOP/s)\n", ports,
               ports == 1 ? "" : "s", g256);
    } else if (avx2) {
        printf("fma_peak_gflops %.1f\n", measure(run_avx2, 8, &sink));
        printf("isa avx2+fma (8 lanes)\n");
    } else {
        printf("fma_peak_gflops %.1f\n", measure(run_sse, 4, &sink));
        printf("isa sse (4 lanes, mul+add)\n");
    }
    fprintf(stderr, "(checksum %g)\n", (double)sink);
    return 0;
}
