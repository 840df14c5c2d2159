/* The built-in GEMM (src/backends/cpu/cpu_gemm.c) called directly, for every instruction set
 * this CPU runs, against a double-precision reference: odd sizes on both sides of the
 * register tile and of the KC/MC/NC blocks, A and B row- or column-major, leading dimensions
 * larger than the matrix, C's padding left alone and C's old contents (NaN) ignored. The
 * error bound is the classic one for a dot product of length k: (k + 2) eps sum|a b|. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include "backends/cpu/cpu_gemm.h"
#include "test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

typedef struct gcase { int64_t m, n, k; } gcase;
static const gcase cases[] = {
    {1, 1, 1}, {2, 3, 4}, {13, 1, 7}, {1, 40, 9}, {17, 33, 29}, {64, 64, 64},
    {121, 47, 257},  /* past MC (120) and KC (256) */
    {5, 3080, 19},   /* past NC (3072) */
    {25, 70, 600},   /* three KC blocks, accumulating */
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* One case in one dtype and layout: returns how many elements were wrong. */
#define GEMM_CASE(T, SUF, EPS)                                                                          \
    static int case_##SUF(gcase g, bool at, bool bt, int64_t pad) {                                      \
        int64_t m = g.m, n = g.n, k = g.k;                                                              \
        /* A: m x k, row-major with ld k + pad, or column-major with ld m + pad; B likewise */          \
        int64_t lda = (at ? m : k) + pad, ldb = (bt ? k : n) + pad, ldc = n + pad;                      \
        int64_t rsa = at ? 1 : lda, csa = at ? lda : 1, rsb = bt ? 1 : ldb, csb = bt ? ldb : 1;          \
        T *a = malloc(sizeof(T) * (size_t)((at ? k : m) * lda));                                        \
        T *b = malloc(sizeof(T) * (size_t)((bt ? n : k) * ldb));                                        \
        T *c = malloc(sizeof(T) * (size_t)(m * ldc));                                                   \
        if (!a || !b || !c) {                                                                           \
            free(a), free(b), free(c);                                                                  \
            return -1;                                                                                  \
        }                                                                                               \
        for (int64_t i = 0; i < (at ? k : m) * lda; i++) a[i] = (T)rnd();                              \
        for (int64_t i = 0; i < (bt ? n : k) * ldb; i++) b[i] = (T)rnd();                              \
        for (int64_t i = 0; i < m * ldc; i++) c[i] = (T)NAN; /* beta = 0: never read */                \
        for (int64_t i = 0; i < m; i++)                                                                 \
            for (int64_t j = n; j < ldc; j++) c[i * ldc + j] = (T)7; /* padding: never written */      \
        em__cpu_gemm_##SUF(m, n, k, a, rsa, csa, b, rsb, csb, c, ldc);                                  \
        int bad = 0;                                                                                    \
        for (int64_t i = 0; i < m; i++) {                                                               \
            for (int64_t j = 0; j < n; j++) {                                                           \
                double ref = 0, mag = 0;                                                                \
                for (int64_t p = 0; p < k; p++) {                                                       \
                    double x = (double)a[i * rsa + p * csa] * (double)b[p * rsb + j * csb];             \
                    ref += x;                                                                           \
                    mag += fabs(x);                                                                     \
                }                                                                                       \
                double got = (double)c[i * ldc + j];                                                    \
                if (!(fabs(got - ref) <= (double)(k + 2) * (EPS) * mag + 1e-300)) {                    \
                    if (bad++ < 3)                                                                      \
                        fprintf(stderr, "  %s %s m=%lld n=%lld k=%lld at=%d bt=%d pad=%lld: c[%lld][%lld] = %.9g, " \
                                "expected %.9g\n", #SUF, em__cpu_gemm_isa(), (long long)m, (long long)n,   \
                                (long long)k, at, bt, (long long)pad, (long long)i, (long long)j, got, ref); \
                }                                                                                       \
            }                                                                                           \
            for (int64_t j = n; j < ldc; j++) bad += c[i * ldc + j] != (T)7;                             \
        }                                                                                               \
        free(a);                                                                                        \
        free(b);                                                                                        \
        free(c);                                                                                        \
        return bad;                                                                                     \
    }
GEMM_CASE(float, f32, FLT_EPSILON)
GEMM_CASE(double, f64, DBL_EPSILON)

static const char *const isas[] = {"generic", "avx2", "avx512"};

/* Every case, layout and padding, in both dtypes, with every instruction set this CPU has. */
static void test_gemm_against_reference(void) {
    const char *start = em__cpu_gemm_isa();
    int tried = 0;
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_gemm_use(isas[s])) {
            printf("     (no %s on this CPU or build: not tried)\n", isas[s]);
            continue;
        }
        CHECK(strcmp(em__cpu_gemm_isa(), isas[s]) == 0);
        tried++;
        for (int c = 0; c < NCASES; c++)
            for (int lay = 0; lay < 4; lay++) {
                int64_t pad = (c + lay) % 2 ? 3 : 0;
                CHECK(case_f32(cases[c], lay & 1, lay & 2, pad) == 0);
                CHECK(case_f64(cases[c], lay & 1, lay & 2, pad) == 0);
            }
    }
    CHECK(tried >= 1); /* generic always exists */
    CHECK(em__cpu_gemm_use(start));
}

/* k = 0 gives zeros; m or n = 0 touches nothing; an unknown set is refused and changes nothing. */
static void test_gemm_edges(void) {
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {NAN, NAN, NAN, NAN};
    em__cpu_gemm_f32(2, 2, 0, a, 2, 1, b, 2, 1, c, 2);
    for (int i = 0; i < 4; i++) CHECK(c[i] == 0);
    c[0] = 9;
    em__cpu_gemm_f32(0, 2, 2, a, 2, 1, b, 2, 1, c, 2);
    em__cpu_gemm_f32(2, 0, 2, a, 2, 1, b, 2, 1, c, 2);
    CHECK(c[0] == 9);
    em__cpu_gemm_f32(2, 2, 2, a, 2, 1, b, 2, 1, c, 2); /* [[1,2],[3,4]] @ [[5,6],[7,8]] */
    CHECK(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50);
    const char *now = em__cpu_gemm_isa();
    CHECK(!em__cpu_gemm_use("sse9"));
    CHECK(!em__cpu_gemm_use(NULL));
    CHECK(strcmp(em__cpu_gemm_isa(), now) == 0);
    const char *name = em__cpu_gemm_name();
    CHECK(name && (strstr(name, "built-in (") == name || strstr(name, "OpenBLAS") == name));
    /* `ember devices` shows it as the CPU's "gemm:" (the CPU's driver field) */
    em_device_props props;
    CHECK_OK(em_device_get_props(EM_DEVICE_CPU, &props));
    CHECK(strcmp(props.driver, name) == 0);
#ifdef EMBER_HAVE_BLAS
    CHECK(strstr(name, "OpenBLAS") == name);
#else
    CHECK(strstr(name, "built-in (") == name);
#endif
}

/* NaN and infinity in the inputs reach exactly the outputs they should. */
static void test_gemm_nonfinite(void) {
    enum { M = 20, N = 40, K = 30 };
    static float a[M * K], b[K * N], c[M * N];
    for (int i = 0; i < M * K; i++) a[i] = 1;
    for (int i = 0; i < K * N; i++) b[i] = 1;
    a[3 * K + 5] = NAN;        /* row 3 of C becomes NaN */
    b[7 * N + 11] = INFINITY;  /* column 11 of C becomes +inf (except row 3) */
    em__cpu_gemm_f32(M, N, K, a, K, 1, b, N, 1, c, N);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float v = c[i * N + j];
            bool ok = i == 3 ? isnan(v) : j == 11 ? isinf(v) && v > 0 : v == K;
            bad += !ok;
        }
    CHECK(bad == 0);
}

int main(void) {
    printf("built-in GEMM: %s, matmul uses %s\n", em__cpu_gemm_isa(), em__cpu_gemm_name());
    RUN(test_gemm_against_reference);
    RUN(test_gemm_edges);
    RUN(test_gemm_nonfinite);
    return test_summary();
}
