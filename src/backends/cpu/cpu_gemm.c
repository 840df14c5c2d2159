/* Ember's built-in GEMM, used for f32/f64 matmul when the build has no OpenBLAS (CMake
 * option EMBER_BLAS=OFF, or OpenBLAS not found). The classic blocked scheme (Goto; BLIS's
 * loop order): a KC x NC panel of B and an MC x KC block of A are packed into micro-panels
 * (zero-padded to whole tiles) so that an MR x NR register tile of C accumulates over KC
 * with one broadcast of A and NR/VL vector loads of B per step. The micro-kernel is written
 * once with GCC/Clang vector types and compiled for SSE (the build's baseline), AVX2+FMA and
 * AVX-512; the best one this CPU runs is picked at first use. One call runs on one thread:
 * cpu_matmul.c splits big problems over Ember's thread pool. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_gemm.h"
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif

#define KC 256   /* depth of a packed block: an A micro-panel (MR x KC) stays in L1 */
#define MC 120   /* rows of A packed at once (rounded down to whole MR tiles): in L2 */
#define NC 3072  /* columns of B packed at once: in L3 */
#define SMALL_MACS 4096 /* below this many multiply-adds, packing costs more than it saves */

typedef void (*kern_f32)(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int mr, int nr,
                         bool accumulate);
typedef void (*kern_f64)(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc, int mr, int nr,
                         bool accumulate);

typedef struct isa_impl {
    const char *name;
    int mr_f32, nr_f32, mr_f64, nr_f64; /* register tile per dtype */
    kern_f32 f32;
    kern_f64 f64;
} isa_impl;

#if defined(__GNUC__) || defined(__clang__)
/* The micro-kernel: C[0:mr, 0:nr] (+)= Ap (MR x kc, column by column) * Bp (kc x NR, row by
 * row). Full tiles load/store C directly; edge tiles go through a local tile. Loads use
 * memcpy: packed panels are aligned, C is not. */
#define EM_GEMM_KERNEL(T, SUF, ISA, ATTR, VBYTES, MR, NV)                                              \
    typedef T v_##SUF##_##ISA __attribute__((vector_size(VBYTES)));                                    \
    ATTR static void kern_##SUF##_##ISA(int64_t kc, const T *ap, const T *bp, T *c, int64_t ldc, int mr, \
                                         int nr, bool accumulate) {                                     \
        typedef v_##SUF##_##ISA V;                                                                      \
        enum { VL = VBYTES / (int)sizeof(T), NR = NV * VL };                                            \
        V acc[MR][NV];                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[i][j] = (V){0};                    \
        for (int64_t p = 0; p < kc; p++) {                                                              \
            V bv[NV];                                                                                   \
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)                                        \
                memcpy(&bv[j], bp + p * NR + j * VL, sizeof(V));                                        \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                     \
                V av = (V){0} + ap[p * MR + i];                                                         \
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[i][j] += av * bv[j];           \
            }                                                                                           \
        }                                                                                               \
        if (mr == MR && nr == NR) {                                                                     \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                                       \
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {                                  \
                    T *cp = c + i * ldc + j * VL;                                                       \
                    if (accumulate) {                                                                   \
                        V old;                                                                          \
                        memcpy(&old, cp, sizeof(V));                                                    \
                        acc[i][j] += old;                                                               \
                    }                                                                                   \
                    memcpy(cp, &acc[i][j], sizeof(V));                                                  \
                }                                                                                       \
            return;                                                                                     \
        }                                                                                               \
        T tile[MR * NR];                                                                                \
        for (int i = 0; i < MR; i++)                                                                    \
            for (int j = 0; j < NV; j++) memcpy(tile + i * NR + j * VL, &acc[i][j], sizeof(V));         \
        for (int i = 0; i < mr; i++)                                                                    \
            for (int j = 0; j < nr; j++)                                                                \
                c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i * NR + j] : tile[i * NR + j];     \
    }

/* generic: 16-byte vectors, any target GCC or Clang compiles for */
EM_GEMM_KERNEL(float, f32, generic, , 16, 6, 2)
EM_GEMM_KERNEL(double, f64, generic, , 16, 6, 2)
static const isa_impl g_generic = {"generic", 6, 8, 6, 4, kern_f32_generic, kern_f64_generic};

#if defined(__x86_64__) || defined(__i386__)
#define EM_GEMM_X86 1
/* AVX2 + FMA: 16 ymm registers, a 6 x 2-vector tile (12 accumulators) */
EM_GEMM_KERNEL(float, f32, avx2, __attribute__((target("avx2,fma"))), 32, 6, 2)
EM_GEMM_KERNEL(double, f64, avx2, __attribute__((target("avx2,fma"))), 32, 6, 2)
static const isa_impl g_avx2 = {"avx2", 6, 16, 6, 8, kern_f32_avx2, kern_f64_avx2};
/* AVX-512: 32 zmm registers, a 12 x 2-vector tile (24 accumulators) */
EM_GEMM_KERNEL(float, f32, avx512, __attribute__((target("avx512f,fma"))), 64, 12, 2)
EM_GEMM_KERNEL(double, f64, avx512, __attribute__((target("avx512f,fma"))), 64, 12, 2)
static const isa_impl g_avx512 = {"avx512", 12, 32, 12, 16, kern_f32_avx512, kern_f64_avx512};
#endif
#else
/* not GCC or Clang: no vector types; every size takes the unpacked loop */
static const isa_impl g_generic = {"generic", 0, 0, 0, 0, NULL, NULL};
#endif

static const isa_impl *isa_by_name(const char *name) {
    if (!strcmp(name, "generic")) return &g_generic;
#ifdef EM_GEMM_X86
    if (!strcmp(name, "avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &g_avx2;
    if (!strcmp(name, "avx512") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        return &g_avx512;
#endif
    return NULL;
}

static _Atomic(const isa_impl *) g_isa;
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;

static void isa_pick(void) {
    const isa_impl *best = &g_generic;
#ifdef EM_GEMM_X86
    __builtin_cpu_init();
    if (isa_by_name("avx2")) best = &g_avx2;
    if (isa_by_name("avx512")) best = &g_avx512;
#endif
    /* EMBER_CPU_GEMM asks for a lower set (to compare them); one this CPU lacks is ignored */
    const char *env = getenv("EMBER_CPU_GEMM");
    const isa_impl *want = env && *env ? isa_by_name(env) : NULL;
    atomic_store(&g_isa, want ? want : best);
}

static const isa_impl *isa_now(void) {
    pthread_once(&g_isa_once, isa_pick);
    return atomic_load(&g_isa);
}

const char *em__cpu_gemm_isa(void) { return isa_now()->name; }

bool em__cpu_gemm_use(const char *isa) {
    isa_now();
    const isa_impl *want = isa ? isa_by_name(isa) : NULL;
    if (!want) return false;
    atomic_store(&g_isa, want);
    return true;
}

#ifdef EMBER_HAVE_BLAS
static char g_name[128];
static pthread_once_t g_name_once = PTHREAD_ONCE_INIT;
/* openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64" */
static void blas_name(void) {
    const char *cfg = openblas_get_config(), *core = openblas_get_corename();
    int words = 0;
    size_t len = 0;
    while (cfg && cfg[len] && !(cfg[len] == ' ' && ++words == 2)) len++;
    snprintf(g_name, sizeof g_name, "%.*s (core %s)", (int)len, cfg ? cfg : "OpenBLAS", core ? core : "unknown");
}
const char *em__cpu_gemm_name(void) {
    pthread_once(&g_name_once, blas_name);
    return g_name;
}
#else
const char *em__cpu_gemm_name(void) {
    const char *isa = em__cpu_gemm_isa();
    return !strcmp(isa, "avx512") ? "built-in (avx512)" : !strcmp(isa, "avx2") ? "built-in (avx2)" : "built-in (generic)";
}
#endif

/* Packing, the unpacked loop and the blocked driver, once per dtype. A's micro-panels hold
 * MR rows column by column (ap[p * MR + i]), B's hold NR columns row by row; rows or columns
 * past the matrix are zeros. */
#define EM_GEMM_DRIVER(T, SUF)                                                                          \
    static void pack_a_##SUF(int64_t mc, int64_t kc, const T *a, int64_t rsa, int64_t csa, int MR, T *ap) { \
        for (int64_t ir = 0; ir < mc; ir += MR, ap += MR * kc) {                                        \
            int64_t rows = mc - ir < MR ? mc - ir : MR;                                                 \
            const T *ar = a + ir * rsa;                                                                 \
            for (int64_t p = 0; p < kc; p++) {                                                          \
                T *dst = ap + p * MR;                                                                   \
                int64_t i = 0;                                                                          \
                for (; i < rows; i++) dst[i] = ar[i * rsa + p * csa];                                   \
                for (; i < MR; i++) dst[i] = 0;                                                         \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    static void pack_b_##SUF(int64_t kc, int64_t nc, const T *b, int64_t rsb, int64_t csb, int NR, T *bp) { \
        for (int64_t jr = 0; jr < nc; jr += NR, bp += NR * kc) {                                        \
            int64_t cols = nc - jr < NR ? nc - jr : NR;                                                 \
            const T *bc = b + jr * csb;                                                                 \
            for (int64_t p = 0; p < kc; p++) {                                                          \
                T *dst = bp + p * NR;                                                                   \
                int64_t j = 0;                                                                          \
                if (csb == 1) {                                                                         \
                    memcpy(dst, bc + p * rsb, sizeof(T) * (size_t)cols);                                \
                    j = cols;                                                                           \
                }                                                                                       \
                for (; j < cols; j++) dst[j] = bc[p * rsb + j * csb];                                   \
                for (; j < NR; j++) dst[j] = 0;                                                         \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    static void naive_##SUF(int64_t m, int64_t n, int64_t k, const T *a, int64_t rsa, int64_t csa, const T *b, \
                            int64_t rsb, int64_t csb, T *c, int64_t ldc) {                              \
        for (int64_t i = 0; i < m; i++) {                                                               \
            T *cr = c + i * ldc;                                                                        \
            for (int64_t j = 0; j < n; j++) cr[j] = 0;                                                  \
            for (int64_t p = 0; p < k; p++) {                                                           \
                T av = a[i * rsa + p * csa];                                                            \
                const T *br = b + p * rsb;                                                              \
                for (int64_t j = 0; j < n; j++) cr[j] += av * br[j * csb];                              \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    static void *scratch_##SUF(int64_t elems) {                                                         \
        size_t bytes = ((size_t)elems * sizeof(T) + 63) & ~(size_t)63;                                  \
        return aligned_alloc(64, bytes);                                                                \
    }                                                                                                   \
    static void blocked_##SUF(const isa_impl *isa, int64_t m, int64_t n, int64_t k, const T *a, int64_t rsa,   \
                              int64_t csa, const T *b, int64_t rsb, int64_t csb, T *c, int64_t ldc) {   \
        const int MR = isa->mr_##SUF, NR = isa->nr_##SUF;                                               \
        const int64_t mcb = MC / MR * MR, ncb = NC / NR * NR;                                           \
        int64_t kcmax = k < KC ? k : KC, mcmax = m < mcb ? m : mcb, ncmax = n < ncb ? n : ncb;          \
        T *ap = scratch_##SUF(((mcmax + MR - 1) / MR * MR) * kcmax);                                    \
        T *bp = scratch_##SUF(((ncmax + NR - 1) / NR * NR) * kcmax);                                    \
        if (!ap || !bp) { /* no memory for packing: still the right answer, unpacked */                 \
            free(ap);                                                                                   \
            free(bp);                                                                                   \
            naive_##SUF(m, n, k, a, rsa, csa, b, rsb, csb, c, ldc);                                     \
            return;                                                                                     \
        }                                                                                               \
        for (int64_t jc = 0; jc < n; jc += ncb) {                                                       \
            int64_t nc = n - jc < ncb ? n - jc : ncb;                                                   \
            for (int64_t pc = 0; pc < k; pc += KC) {                                                    \
                int64_t kc = k - pc < KC ? k - pc : KC;                                                 \
                pack_b_##SUF(kc, nc, b + pc * rsb + jc * csb, rsb, csb, NR, bp);                        \
                for (int64_t ic = 0; ic < m; ic += mcb) {                                               \
                    int64_t mc = m - ic < mcb ? m - ic : mcb;                                           \
                    pack_a_##SUF(mc, kc, a + ic * rsa + pc * csa, rsa, csa, MR, ap);                    \
                    for (int64_t jr = 0; jr < nc; jr += NR)                                             \
                        for (int64_t ir = 0; ir < mc; ir += MR)                                         \
                            isa->SUF(kc, ap + ir * kc, bp + jr * kc, c + (ic + ir) * ldc + jc + jr, ldc, \
                                     (int)(mc - ir < MR ? mc - ir : MR), (int)(nc - jr < NR ? nc - jr : NR), \
                                     pc > 0);                                                           \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        free(ap);                                                                                       \
        free(bp);                                                                                       \
    }                                                                                                   \
    void em__cpu_gemm_##SUF(int64_t m, int64_t n, int64_t k, const T *a, int64_t rsa, int64_t csa, const T *b, \
                            int64_t rsb, int64_t csb, T *c, int64_t ldc) {                              \
        if (m <= 0 || n <= 0) return;                                                                   \
        const isa_impl *isa = isa_now();                                                                \
        if (k <= 0 || !isa->SUF || (double)m * (double)n * (double)k < SMALL_MACS)                     \
            naive_##SUF(m, n, k, a, rsa, csa, b, rsb, csb, c, ldc);                                     \
        else                                                                                            \
            blocked_##SUF(isa, m, n, k, a, rsa, csa, b, rsb, csb, c, ldc);                              \
    }

EM_GEMM_DRIVER(float, f32)
EM_GEMM_DRIVER(double, f64)
