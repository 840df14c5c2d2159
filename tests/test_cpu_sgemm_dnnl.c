/* f32 matmul through oneDNN (src/backends/cpu/cpu_sgemm_dnnl.c): the wrapper against a
 * double-precision reference in every transpose, with leading dimensions past the matrix, C's
 * old contents ignored for beta = 0 (NaN) and added for beta = 1, its padding left alone; the
 * per-shape policy; em_matmul / em_addmm giving the same products whichever GEMM runs them;
 * and Linear's bias in the GEMM's epilogue.
 * Skipped in builds without oneDNN. */
#include <dlfcn.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/cpu_sgemm_dnnl.h"
#include "test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

typedef struct gcase { int64_t m, n, k; } gcase;
static const gcase cases[] = {
    {1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 10, 256}, {64, 256, 10},
    {64, 256, 784}, {256, 784, 64}, {10, 256, 64}, {97, 131, 301},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* One case: how many elements are wrong (-1: no memory); *ran says whether oneDNN took it
 * (when not, C must be as it was). */
static int sgemm_case(gcase g, bool at, bool bt, int64_t pad, float beta, bool *ran) {
    int64_t m = g.m, n = g.n, k = g.k;
    int64_t lda = (at ? m : k) + pad, ldb = (bt ? k : n) + pad, ldc = n + pad;
    int64_t rsa = at ? 1 : lda, csa = at ? lda : 1, rsb = bt ? 1 : ldb, csb = bt ? ldb : 1;
    float *a = malloc(sizeof(float) * (size_t)((at ? k : m) * lda));
    float *b = malloc(sizeof(float) * (size_t)((bt ? n : k) * ldb));
    float *c = malloc(sizeof(float) * (size_t)(m * ldc)), *old = malloc(sizeof(float) * (size_t)(m * ldc));
    if (!a || !b || !c || !old) {
        free(a), free(b), free(c), free(old);
        return -1;
    }
    for (int64_t i = 0; i < (at ? k : m) * lda; i++) a[i] = (float)rnd();
    for (int64_t i = 0; i < (bt ? n : k) * ldb; i++) b[i] = (float)rnd();
    for (int64_t i = 0; i < m * ldc; i++) c[i] = beta == 0 ? NAN : (float)rnd(); /* beta = 0: never read */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = n; j < ldc; j++) c[i * ldc + j] = 7; /* padding: never written */
    memcpy(old, c, sizeof(float) * (size_t)(m * ldc));
    *ran = em__cpu_sgemm_dnnl(at, bt, m, n, k, a, lda, b, ldb, beta, c, ldc);
    int bad = 0;
    if (!*ran) { /* declined: C untouched, bit for bit (NaN included) */
        bad = memcmp(c, old, sizeof(float) * (size_t)(m * ldc)) != 0;
        free(a), free(b), free(c), free(old);
        return bad;
    }
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double ref = beta == 0 ? 0 : (double)old[i * ldc + j], mag = fabs(ref);
            for (int64_t p = 0; p < k; p++) {
                double x = (double)a[i * rsa + p * csa] * (double)b[p * rsb + j * csb];
                ref += x;
                mag += fabs(x);
            }
            double got = (double)c[i * ldc + j];
            if (!(fabs(got - ref) <= (double)(k + 3) * FLT_EPSILON * mag + 1e-300) && bad++ < 3)
                fprintf(stderr, "  m=%lld n=%lld k=%lld at=%d bt=%d pad=%lld beta=%g: c[%lld][%lld] = %.9g, expected %.9g\n",
                        (long long)m, (long long)n, (long long)k, at, bt, (long long)pad, beta, (long long)i,
                        (long long)j, got, ref);
        }
        for (int64_t j = n; j < ldc; j++) bad += c[i * ldc + j] != 7;
    }
    free(a), free(b), free(c), free(old);
    return bad;
}

static const char *g_start; /* the policy the process started with (EMBER_CPU_SGEMM or auto) */

static void test_sgemm_against_reference(void) {
    if (!em__cpu_sgemm_policy("dnnl")) SKIP("a build without oneDNN");
    for (int c = 0; c < NCASES; c++)
        for (int lay = 0; lay < 4; lay++)
            for (int beta = 0; beta < 2; beta++) {
                bool ran = false;
                CHECK(sgemm_case(cases[c], lay & 1, lay & 2, (c + lay) % 2 ? 3 : 0, (float)beta, &ran) == 0);
                CHECK(ran); /* "dnnl" takes every product */
            }
    CHECK(em__cpu_sgemm_policy(g_start));
}

/* "openblas" and the small products of "auto" leave C alone and say so; auto takes the MLP's
 * large products on AVX-512; unknown names change nothing. */
static void test_sgemm_policy(void) {
    if (!em__cpu_sgemm_policy("dnnl")) SKIP("a build without oneDNN");
    CHECK(strcmp(em__cpu_sgemm_policy_name(), "dnnl") == 0);
    CHECK(!em__cpu_sgemm_policy("mkl"));
    CHECK(!em__cpu_sgemm_policy(NULL));
    CHECK(strcmp(em__cpu_sgemm_policy_name(), "dnnl") == 0);
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {9, 9, 9, 9};
    CHECK(em__cpu_sgemm_policy("openblas"));
    CHECK(!em__cpu_sgemm_dnnl(false, false, 2, 2, 2, a, 2, b, 2, 0.0f, c, 2));
    CHECK(c[0] == 9 && c[3] == 9);
    CHECK(em__cpu_sgemm_policy("auto"));
    CHECK(strcmp(em__cpu_sgemm_policy_name(), "auto") == 0);
    CHECK(!em__cpu_sgemm_dnnl(false, false, 2, 2, 2, a, 2, b, 2, 0.0f, c, 2)); /* too small */
    CHECK(c[0] == 9 && c[3] == 9);
    bool ran = false;
    CHECK(sgemm_case((gcase){64, 10, 256}, false, true, 0, 0.0f, &ran) == 0);
    CHECK(!ran); /* 164k multiply-adds: OpenBLAS's */
    CHECK(sgemm_case((gcase){256, 256, 10}, false, false, 0, 0.0f, &ran) == 0);
    CHECK(!ran); /* k = 10: OpenBLAS's */
    CHECK(sgemm_case((gcase){64, 256, 784}, false, true, 0, 0.0f, &ran) == 0);
    __builtin_cpu_init();
    CHECK(ran == (bool)__builtin_cpu_supports("avx512f"));
    CHECK(em__cpu_sgemm_policy(g_start));
}

/* em_matmul on transposed views and em_addmm (beta = 1 in the GEMM) agree whichever GEMM runs. */
static em_tensor *products(const char *policy, em_tensor *x, em_tensor *w, em_tensor *bias, em_tensor *g) {
    CHECK(em__cpu_sgemm_policy(policy));
    em_tensor *y = em_addmm(bias, x, em_transpose(w, 0, 1), 1.0, 1.0);      /* [64, 256] */
    em_tensor *dw = em_matmul(em_transpose(g, 0, 1), x);                    /* [256, 784] */
    return em_cat((em_tensor *[]){em_flatten(y, 0, -1), em_flatten(dw, 0, -1)}, 2, 0);
}

static void test_matmul_through_dnnl(void) {
    if (!em__cpu_sgemm_policy("dnnl")) SKIP("a build without oneDNN");
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_tensor *x = em_randn(EM_SHAPE(64, 784), EM_OPTS(0)), *w = em_randn(EM_SHAPE(256, 784), EM_OPTS(0));
    em_tensor *bias = em_randn(EM_SHAPE(256), EM_OPTS(0)), *g = em_randn(EM_SHAPE(64, 256), EM_OPTS(0));
    em_tensor *p1 = products("dnnl", x, w, bias, g), *p2 = products("openblas", x, w, bias, g);
    CHECK(p1 && p2 && em_numel(p1) == 64 * 256 + 256 * 784);
    /* sums of 64-784 terms of size ~1: both within a few ulps of ~30 of the exact value */
    double diff = em_item(em_max(em_abs(em_sub(p1, p2)), EM_ALL_DIMS, false));
    CHECK(diff < 1e-3);
    CHECK(!isnan(diff));
    em_scope_end(s);
    CHECK(em__cpu_sgemm_policy(g_start));
}

/* Linear's forward with the bias in oneDNN's epilogue (em__cpu_addmm_bias, which em_addmm
 * tries first): against OpenBLAS's product plus the bias, on 1 and 2 threads (row blocks of
 * two sizes), with the weight transposed or not and the input transposed; and declined (so
 * the caller's path runs) below its floor of rows, with a strided bias, under "openblas". */
em_status em__cpu_addmm_bias(em_tensor *out, const em_tensor *bias, const em_tensor *a, const em_tensor *b);

static void test_addmm_bias_epilogue(void) {
    if (!em__cpu_sgemm_policy("dnnl")) SKIP("a build without oneDNN");
    CHECK(em__cpu_sgemm_policy("auto"));
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f");
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *x = em_randn(EM_SHAPE(300, 200), EM_OPTS(0)), *w = em_randn(EM_SHAPE(130, 200), EM_OPTS(0));
    em_tensor *bias = em_randn(EM_SHAPE(130), EM_OPTS(0)), *out = em_empty(EM_SHAPE(300, 130), EM_OPTS(0));
    em_tensor *xt = em_transpose(em_contiguous(em_transpose(x, 0, 1)), 0, 1); /* x's values, column-major */
    em_tensor *operands[3][2] = {{x, em_transpose(w, 0, 1)}, {x, em_contiguous(em_transpose(w, 0, 1))},
                                 {xt, em_transpose(w, 0, 1)}};
    CHECK(em__cpu_sgemm_policy("openblas"));
    em_tensor *want = em_add(em_matmul(x, em_transpose(w, 0, 1)), bias);
    CHECK(em__cpu_sgemm_policy("auto"));
    for (int threads = 1; threads <= 2; threads++) {
        em_set_num_threads(threads);
        for (int c = 0; c < 3; c++) {
            em_status st = em__cpu_addmm_bias(out, bias, operands[c][0], operands[c][1]);
            CHECK(st == (avx512 ? EM_OK : EM_ERR_NOT_SUPPORTED));
            if (st == EM_OK) CHECK(em_item(em_max(em_abs(em_sub(out, want)), EM_ALL_DIMS, false)) < 1e-3);
            em_tensor *viaop = em_addmm(bias, operands[c][0], operands[c][1], 1.0, 1.0); /* whichever path */
            CHECK(viaop && em_item(em_max(em_abs(em_sub(viaop, want)), EM_ALL_DIMS, false)) < 1e-3);
        }
    }
    em_set_num_threads(1);
    em_tensor *few = em_empty(EM_SHAPE(64, 130), EM_OPTS(0));
    CHECK(em__cpu_addmm_bias(few, bias, em_narrow(x, 0, 0, 64), em_transpose(w, 0, 1)) == EM_ERR_NOT_SUPPORTED);
    em_tensor *strided = em_select(em_reshape(em_randn(EM_SHAPE(130 * 2), EM_OPTS(0)), EM_SHAPE(130, 2)), 1, 0);
    CHECK(em__cpu_addmm_bias(out, strided, x, em_transpose(w, 0, 1)) == EM_ERR_NOT_SUPPORTED);
    CHECK(em__cpu_sgemm_policy("openblas"));
    CHECK(em__cpu_addmm_bias(out, bias, x, em_transpose(w, 0, 1)) == EM_ERR_NOT_SUPPORTED);
    CHECK(!em_failed()); /* declining records nothing */
    /* bf16 where oneDNN runs it (AMX, AVX512-BF16) and, by default, on Ember's AMX kernel where
     * the CPU has AMX: float32 accumulation, one rounding */
    em_tensor *xb = em_to_dtype(x, EM_BF16), *wb = em_to_dtype(w, EM_BF16), *bb = em_to_dtype(bias, EM_BF16);
    em_tensor *wantb = em_add(em_matmul(em_to_dtype(xb, EM_F32), em_transpose(em_to_dtype(wb, EM_F32), 0, 1)),
                              em_to_dtype(bb, EM_F32));
    for (int mode = 0; mode < 2; mode++) {
        if (mode) setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
        const char *impl = em_cpu_matmul_impl(EM_BF16);
        bool bf16 = strncmp(impl, "oneDNN", 6) == 0 || strstr(impl, "AMX kernel");
        em_tensor *ob = em_empty(EM_SHAPE(300, 130), EM_OPTS(.dtype = EM_BF16));
        CHECK(em__cpu_addmm_bias(ob, bb, xb, em_transpose(wb, 0, 1)) == (bf16 ? EM_OK : EM_ERR_NOT_SUPPORTED));
        if (bf16) /* |values| up to ~50: bf16's half-ulp there is 0.125 */
            CHECK(em_item(em_max(em_abs(em_sub(em_to_dtype(ob, EM_F32), wantb)), EM_ALL_DIMS, false)) <= 0.25);
        unsetenv("EMBER_CPU_LOWP_GEMM");
    }
    em_scope_end(s);
    CHECK(em__cpu_sgemm_policy(g_start));
}

/* Around each oneDNN call the thread's OpenMP thread count is 1 (no OpenMP team next to
 * Ember's pool), and afterwards the caller's own setting is back. */
static void test_omp_setting_kept(void) {
    if (!em__cpu_sgemm_policy("dnnl")) SKIP("a build without oneDNN");
    void *set = dlsym(RTLD_DEFAULT, "omp_set_num_threads"), *get = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    if (!set || !get) {
        CHECK(em__cpu_sgemm_policy(g_start));
        SKIP("oneDNN without OpenMP: no OpenMP thread count to keep");
    }
    void (*omp_set)(int);
    int (*omp_get)(void);
    memcpy(&omp_set, &set, sizeof set);
    memcpy(&omp_get, &get, sizeof get);
    int before = omp_get();
    omp_set(3);
    bool ran = false;
    CHECK(sgemm_case((gcase){64, 256, 784}, false, true, 0, 0.0f, &ran) == 0);
    CHECK(ran);
    CHECK(omp_get() == 3);
    omp_set(before);
    CHECK(em__cpu_sgemm_policy(g_start));
}

int main(void) {
    g_start = em__cpu_sgemm_policy_name();
    printf("f32 GEMM policy at start: %s\n", g_start);
    RUN(test_sgemm_against_reference);
    RUN(test_sgemm_policy);
    RUN(test_matmul_through_dnnl);
    RUN(test_addmm_bias_epilogue);
    RUN(test_omp_setting_kept);
    return test_summary();
}
