/* bf16 products of a few rows with a transposed weight (decoding's), see cpu_gemv.h.
 *
 * One float32 accumulator per pair of weight row and X row sums over K, 32 products at a time
 * in K's order; it is reduced across its lanes at the end, where the bias and the old z are
 * added before the one rounding. X stays in L1. The AVX512-BF16 kernel reads one weight row
 * at a time, start to end: a single sequential stream is what a core's prefetchers keep
 * ahead of, while blocks of rows read side by side (a stream per row, each in its own page
 * when a row is a page long, as Llama's 2048-wide rows are) leave them short of requests in
 * flight; one software prefetch per 4 KiB page read, 128 KiB ahead (see PREFETCH_AHEAD), keeps
 * the TLB misses of a mapped file's small pages off the stream's path. Its chain of one
 * VDPBF16PS per 64 weight bytes is still faster than memory. The AVX2
 * kernel's FMA adds only 16 weight bytes per step, so one chain would be bound by its latency:
 * it takes blocks of 4 weight rows (X up to 4 rows, else 2: at most 16 accumulators, and its
 * 16 registers spill some at 8 rows). The threads take blocks of weight rows, so each reads
 * its own part of the weight once. */
#include "cpu_gemv.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* EMBER_CPU_LOWP_GEMM: 0 another path; 1 unset, empty or "gemv" (the best kernel here);
 * 2 "gemv_avx2" (the AVX2 kernel, to test it on a CPU that has a better one) */
static int chosen(void) {
    const char *e = getenv("EMBER_CPU_LOWP_GEMM");
    return !e || !*e || strcmp(e, "gemv") == 0 ? 1 : strcmp(e, "gemv_avx2") == 0 ? 2 : 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <pthread.h>
#include "cpu_threads.h"

#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
/* Weight bytes below which a thread's share is not worth waking it for (a wake costs a few
 * microseconds; this much weight streams in about ten). */
#define MIN_BYTES_PER_THREAD (256 << 10)

enum { ISA_NONE, ISA_AVX2, ISA_AVX512_BF16 };
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_isa;

static void detect(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bf16"))
        g_isa = ISA_AVX512_BF16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        g_isa = ISA_AVX2;
}

/* the kernel to run now (EMBER_CPU_LOWP_GEMM read on every call) */
static int isa(void) {
    pthread_once(&g_once, detect);
    int c = chosen();
    return c == 0 ? ISA_NONE : c == 2 && g_isa != ISA_NONE ? ISA_AVX2 : g_isa;
}

/* em_f32_to_bf16's rounding (to nearest even, NaN kept quiet), inlined: the store runs once
 * per weight row, and a call per row showed up in decoding's profile */
static inline uint16_t round_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float widen_bf16(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* The block's sums into z: bias and old z added in float32, then one rounding (or float32). */
static inline __attribute__((always_inline)) void store_block(const em_lowp_gemm *g, int64_t q, int R, int P,
                                                              const float *sum) {
    const uint16_t *bias = g->bias;
    for (int p = 0; p < P; p++)
        for (int r = 0; r < R; r++) {
            float s = sum[r * P + p];
            if (bias) s += widen_bf16(bias[q + r]);
            int64_t at = p * g->ldz + q + r;
            if (g->z_f32) {
                float *z = (float *)g->z + at;
                *z = g->acc ? *z + s : s;
            } else {
                uint16_t *z = (uint16_t *)g->z + at;
                if (g->acc) s += widen_bf16(*z);
                *z = round_bf16(s);
            }
        }
}

/* ---- AVX512-BF16: VDPBF16PS multiplies 32 bf16 pairs and adds them into 16 float32 lanes ---- */

/* The weight is read one 4 KiB page at a time: a core's prefetchers stop at each page's end,
 * and where the weight is a file's mapping in the page cache (4 KiB pages, the default) each
 * new page also misses the TLB, whose walk, its page-table line often in memory itself, holds
 * up the loads behind it. A software prefetch of one line PREFETCH_AHEAD bytes ahead, once
 * per page read, has the walk done and a line of the page on its way well before the
 * stream gets there; in 2 MiB pages, where nothing is to be gained, it costs little. */
#define PAGE_ELEMS 2048                  /* bf16 elements in 4 KiB */
#define PREFETCH_AHEAD ((int64_t)128 << 10) /* 32 pages */

/* Weight row q times the P rows of X; P is a constant once inlined, so acc stays in registers */
TARGET_BF16 static inline __attribute__((always_inline)) void row_bf16(const em_lowp_gemm *g, int64_t q, const int P) {
    const uint16_t *w = (const uint16_t *)g->y + q * g->ldy, *x = g->x;
    int64_t K = g->K, ldx = g->ldx, k = 0;
    /* one line PREFETCH_AHEAD bytes further along the weight per page of it read, where the
     * weight still goes on that far */
    int64_t ahead_end = (g->Q - 1 - q) * g->ldy + K - PREFETCH_AHEAD / 2;
    __m512 acc[EM_GEMV_MAX_ROWS];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) acc[p] = _mm512_setzero_ps();
    while (k + 32 <= K) {
        if (k < ahead_end) _mm_prefetch((const char *)(w + k) + PREFETCH_AHEAD, _MM_HINT_T0);
        int64_t page_end = k + PAGE_ELEMS < K ? k + PAGE_ELEMS : K;
        for (; k + 32 <= page_end; k += 32) {
            __m512i wv = _mm512_loadu_si512(w + k);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++)
                acc[p] = _mm512_dpbf16_ps(acc[p], (__m512bh)wv, (__m512bh)_mm512_loadu_si512(x + p * ldx + k));
        }
    }
    if (k < K) { /* the tail, zero-filled by masked loads */
        __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
        __m512i wv = _mm512_maskz_loadu_epi16(m, w + k);
        for (int p = 0; p < P; p++)
            acc[p] = _mm512_dpbf16_ps(acc[p], (__m512bh)wv, (__m512bh)_mm512_maskz_loadu_epi16(m, x + p * ldx + k));
    }
    float sum[EM_GEMV_MAX_ROWS];
    for (int p = 0; p < P; p++) sum[p] = _mm512_reduce_add_ps(acc[p]);
    store_block(g, q, 1, P, sum);
}

#define ROWS_FOR_P(P)                                                                                           \
    for (int64_t q = q0; q < q1; q++) row_bf16(g, q, (P))

TARGET_BF16 static void range_bf16(const em_lowp_gemm *g, int64_t q0, int64_t q1) {
    switch (g->P) {
    case 1: ROWS_FOR_P(1); break;
    case 2: ROWS_FOR_P(2); break;
    case 3: ROWS_FOR_P(3); break;
    case 4: ROWS_FOR_P(4); break;
    case 5: ROWS_FOR_P(5); break;
    case 6: ROWS_FOR_P(6); break;
    case 7: ROWS_FOR_P(7); break;
    case 8: ROWS_FOR_P(8); break;
    default: break;
    }
}

/* ---- AVX2 + FMA: bf16 widened to float32 (a 16-bit shift), 8 lanes ---- */

/* weight rows [q0, q1): blocks of 4 (P <= 4) or 2 (P <= 8: at most 16 accumulators), the
 * rest one at a time */
#define RANGE_FOR_P(block, P)                                                                                   \
    do {                                                                                                        \
        int64_t q = q0;                                                                                         \
        if ((P) <= 4)                                                                                           \
            for (; q + 4 <= q1; q += 4) block(g, q, 4, (P));                                     \
        for (; q + 2 <= q1; q += 2) block(g, q, 2, (P));                                                        \
        for (; q < q1; q++) block(g, q, 1, (P));                                                                \
    } while (0)

#define RANGE_SWITCH(block)                                                                                     \
    switch (g->P) {                                                                                             \
    case 1: RANGE_FOR_P(block, 1); break;                                                                       \
    case 2: RANGE_FOR_P(block, 2); break;                                                                       \
    case 3: RANGE_FOR_P(block, 3); break;                                                                       \
    case 4: RANGE_FOR_P(block, 4); break;                                                                       \
    case 5: RANGE_FOR_P(block, 5); break;                                                                       \
    case 6: RANGE_FOR_P(block, 6); break;                                                                       \
    case 7: RANGE_FOR_P(block, 7); break;                                                                       \
    case 8: RANGE_FOR_P(block, 8); break;                                                                       \
    default: break;                                                                                             \
    }

TARGET_AVX2 static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

TARGET_AVX2 static inline __attribute__((always_inline)) void block_avx2(const em_lowp_gemm *g, int64_t q, const int R,
                                                                         const int P) {
    const uint16_t *w = (const uint16_t *)g->y + q * g->ldy, *x = g->x;
    int64_t K = g->K, ldw = g->ldy, ldx = g->ldx, k = 0;
    __m256 acc[4][EM_GEMV_MAX_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) acc[r][p] = _mm256_setzero_ps();
    /* the next block's rows, a line of each per line read here: with rows of a few KiB (a 1B
     * Llama's 2048 bf16) each row is a page or two, too short for the hardware prefetcher to
     * get ahead before the block moves on to fresh pages */
    int64_t next = q + 2 * R <= g->Q ? R : 0;
    for (; k + 8 <= K; k += 8) {
        if (next && (k & 31) == 0)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + (next + r) * ldw + k), _MM_HINT_T0);
        __m256 xv[EM_GEMV_MAX_ROWS];
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) xv[p] = widen8(x + p * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = widen8(w + r * ldw + k);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) acc[r][p] = _mm256_fmadd_ps(wv, xv[p], acc[r][p]);
        }
    }
    float sum[4 * EM_GEMV_MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r][p]), _mm256_extractf128_ps(acc[r][p], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            float t = _mm_cvtss_f32(s);
            for (int64_t j = k; j < K; j++) t += widen_bf16(w[r * ldw + j]) * widen_bf16(x[p * ldx + j]);
            sum[r * P + p] = t;
        }
    store_block(g, q, R, P, sum);
}

TARGET_AVX2 static void range_avx2(const em_lowp_gemm *g, int64_t q0, int64_t q1) { RANGE_SWITCH(block_avx2) }

/* ---- dispatch ---- */

typedef struct gemv_job { const em_lowp_gemm *g; int isa; } gemv_job;

/* blocks of 4 weight rows [begin, end) */
static void gemv_chunk(void *arg, int64_t begin, int64_t end) {
    const gemv_job *j = arg;
    int64_t q0 = 4 * begin, q1 = 4 * end < j->g->Q ? 4 * end : j->g->Q;
    if (j->isa == ISA_AVX512_BF16) range_bf16(j->g, q0, q1);
    else range_avx2(j->g, q0, q1);
}

bool em__cpu_gemv_applies(const em_lowp_gemm *g) {
    return g->dtype == EM_BF16 && g->P >= 1 && g->P <= EM_GEMV_MAX_ROWS && g->K >= 1 && !g->xt && g->yt &&
           isa() != ISA_NONE;
}

em_status em__cpu_gemv(const em_lowp_gemm *g) {
    if (!em__cpu_gemv_applies(g)) return EM_ERR_NOT_SUPPORTED;
    gemv_job j = {g, isa()}; /* read once: every thread runs the same kernel */
    int64_t blocks = (g->Q + 3) / 4, block_bytes = 4 * g->K * 2;
    em__cpu_parallel_for(blocks, MIN_BYTES_PER_THREAD / block_bytes + 1, gemv_chunk, &j);
    return EM_OK;
}

const char *em__cpu_gemv_isa(void) {
    int i = isa();
    return i == ISA_AVX512_BF16 ? "avx512_bf16" : i == ISA_AVX2 ? "avx2" : NULL;
}

#else /* not x86-64 with GCC or Clang: the GEMMs take every product */

bool em__cpu_gemv_applies(const em_lowp_gemm *g) {
    (void)g;
    (void)chosen;
    return false;
}
em_status em__cpu_gemv(const em_lowp_gemm *g) {
    (void)g;
    return EM_ERR_NOT_SUPPORTED;
}
const char *em__cpu_gemv_isa(void) { return NULL; }

#endif
