/* Ember's bf16 GEMV (src/backends/cpu/cpu_gemv.c): decoding's products of a few rows with a
 * transposed weight, on each instruction set this CPU has (AVX512-BF16 and AVX2, the second
 * chosen by EMBER_CPU_LOWP_GEMM=gemv_avx2):
 * - small-integer inputs, whose products and sums float32 holds exactly: the result must be the
 *   exact sum rounded once to bf16 (or, z_f32, the sum itself), bit for bit, with 1..8 rows,
 *   K and the weight's rows across every tail (K not a multiple of 32 or 8, rows not of 4),
 *   leading dims past the matrix, bias, accumulation into z; z's padding never written;
 * - random inputs of a wide range against a float64 reference (one rounding plus float32
 *   accumulation error);
 * - through em_matmul and em_addmm (x @ w.T, nn.Linear's product, 2-d and 3-d x) on 1 and 2
 *   threads: the same bits on both, and the same values as the float32 path;
 * - what the kernel declines (other dtypes, more than EM_GEMV_MAX_ROWS rows, other layouts,
 *   EMBER_CPU_LOWP_GEMM naming another path): z untouched.
 * Skipped where the CPU has neither AVX2 + FMA nor AVX512-BF16 (x86-64 without AVX2, or
 * another architecture). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/cpu_gemv.h"
#include "test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t next_u32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}

/* -4..4 (ints), else +-[0, 1] times 2^-10..2^10 */
static float rand_val(bool ints) {
    if (ints) return (float)((int)(next_u32() % 9) - 4);
    return ldexpf((float)(next_u32() % 2001) / 1000.0f - 1.0f, (int)(next_u32() % 21) - 10);
}

#define SENTINEL_BF16 0x7FC1
#define SENTINEL_F32 0x7FC00001u

/* One product z = x w^T (+ bias) (+ z): x [P, K] (ldx = K + pad), w [Q, K] (ldw = K + pad),
 * z [P, Q] (ldz = Q + pad, the padding a sentinel that must survive). Returns the number of
 * wrong elements, or -1 when the kernel refused or memory ran out. */
static int run_case(int64_t P, int64_t K, int64_t Q, int64_t pad, bool bias, bool acc, bool f32z, bool ints) {
    int64_t ldx = K + pad, ldw = K + pad, ldz = Q + pad;
    uint16_t *x = calloc((size_t)(P * ldx), 2), *w = calloc((size_t)(Q * ldw), 2), *b = malloc((size_t)Q * 2);
    void *z = malloc((size_t)(P * ldz) * (f32z ? 4 : 2));
    double *ref = calloc((size_t)(P * Q), sizeof(double)), *mag = calloc((size_t)(P * Q), sizeof(double));
    int bad = 0;
    if (!x || !w || !b || !z || !ref || !mag) {
        bad = -1;
        goto out;
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t k = 0; k < K; k++) x[i * ldx + k] = test_f32_to_bf16(rand_val(ints));
    for (int64_t j = 0; j < Q; j++)
        for (int64_t k = 0; k < K; k++) w[j * ldw + k] = test_f32_to_bf16(rand_val(ints));
    for (int64_t j = 0; j < Q; j++) b[j] = test_f32_to_bf16(ints ? rand_val(true) : 0.5f);
    for (int64_t i = 0; i < P * ldz; i++) {
        if (f32z) {
            uint32_t u = SENTINEL_F32;
            memcpy((float *)z + i, &u, 4);
        } else {
            ((uint16_t *)z)[i] = SENTINEL_BF16;
        }
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t j = 0; j < Q; j++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)test_bf16_to_f32(x[i * ldx + k]) * test_bf16_to_f32(w[j * ldw + k]);
                s += p;
                m += fabs(p);
            }
            if (bias) s += test_bf16_to_f32(b[j]);
            if (acc) {
                float old = ints ? rand_val(true) : 1.0f;
                if (f32z) ((float *)z)[i * ldz + j] = old;
                else ((uint16_t *)z)[i * ldz + j] = test_f32_to_bf16(old);
                s += old;
            }
            ref[i * Q + j] = s;
            mag[i * Q + j] = m + fabs(s);
        }
    em_lowp_gemm g = {EM_BF16, P, Q, K, x, w, z, false, true, ldx, ldw, ldz, acc, bias ? b : NULL, f32z};
    if (em__cpu_gemv(&g) != EM_OK) {
        bad = -1;
        goto out;
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t j = 0; j < ldz; j++) {
            int64_t at = i * ldz + j;
            if (j >= Q) { /* padding: untouched */
                uint32_t u = 0;
                if (f32z) memcpy(&u, (float *)z + at, 4);
                bad += f32z ? u != SENTINEL_F32 : ((uint16_t *)z)[at] != SENTINEL_BF16;
                continue;
            }
            double got = f32z ? ((float *)z)[at] : test_bf16_to_f32(((uint16_t *)z)[at]);
            double want = ref[i * Q + j];
            bool ok;
            if (ints) ok = f32z ? got == want : ((uint16_t *)z)[at] == test_f32_to_bf16((float)want);
            else ok = fabs(got - want) <= (f32z ? 0 : 0x1p-8 * fabs(want)) + (double)(K + 2) * 0x1p-23 * mag[i * Q + j];
            if (!ok && bad < 3)
                fprintf(stderr, "  P %lld K %lld Q %lld [%lld, %lld]: got %.9g, want %.9g\n", (long long)P, (long long)K,
                        (long long)Q, (long long)i, (long long)j, got, want);
            bad += !ok;
        }
out:
    free(x);
    free(w);
    free(b);
    free(z);
    free(ref);
    free(mag);
    return bad;
}

static const int64_t KS[] = {1, 7, 8, 31, 32, 33, 100, 1000, 4103};
static const int64_t QS[] = {1, 2, 3, 4, 5, 7, 9, 37, 4099};

/* every row count, K and Q tail, with and without bias, acc, f32 z and padding */
static void exact_cases(const char *choice) {
    setenv("EMBER_CPU_LOWP_GEMM", choice, 1);
    for (int64_t P = 1; P <= EM_GEMV_MAX_ROWS; P++)
        for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++)
            for (size_t qi = 0; qi < sizeof QS / sizeof QS[0]; qi++) {
                int variant = (int)((P + (int64_t)ki + (int64_t)qi) % 8); /* spread the options over the shapes */
                if (QS[qi] * KS[ki] > 1000000 && P > 2) continue; /* the big ones at 1 and 2 rows */
                bool bias = variant & 1, acc = variant & 2, f32z = variant & 4;
                int bad = run_case(P, KS[ki], QS[qi], qi % 2 ? 3 : 0, bias, acc, f32z, true);
                if (bad != 0)
                    fprintf(stderr, "  %s: P %lld K %lld Q %lld bias %d acc %d f32z %d: %d wrong\n", choice,
                            (long long)P, (long long)KS[ki], (long long)QS[qi], bias, acc, f32z, bad);
                CHECK(bad == 0);
            }
    unsetenv("EMBER_CPU_LOWP_GEMM");
}

static void test_exact_best(void) { exact_cases("gemv"); }
static void test_exact_avx2(void) { exact_cases("gemv_avx2"); }

static void test_wide_range(void) {
    const char *choices[] = {"gemv", "gemv_avx2"};
    for (int c = 0; c < 2; c++) {
        setenv("EMBER_CPU_LOWP_GEMM", choices[c], 1);
        for (int64_t P = 1; P <= EM_GEMV_MAX_ROWS; P += 3) {
            CHECK(run_case(P, 4096, 67, 0, false, false, false, false) == 0);
            CHECK(run_case(P, 11008, 9, 5, true, false, true, false) == 0);
            CHECK(run_case(P, 333, 130, 1, true, true, false, false) == 0);
        }
    }
    unsetenv("EMBER_CPU_LOWP_GEMM");
}

/* what the kernel leaves to the GEMMs: z untouched */
static void test_declines(void) {
    uint16_t x[9 * 64], w[4 * 64], z[9 * 4];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    for (int i = 0; i < 36; i++) z[i] = 0x1234;
    em_lowp_gemm ok = {EM_BF16, 1, 4, 64, x, w, z, false, true, 64, 64, 4, false, NULL, false};
    CHECK(em__cpu_gemv_applies(&ok));
    em_lowp_gemm g = ok;
    g.dtype = EM_F16;
    CHECK(em__cpu_gemv(&g) == EM_ERR_NOT_SUPPORTED);
    g = ok;
    g.P = EM_GEMV_MAX_ROWS + 1;
    CHECK(em__cpu_gemv(&g) == EM_ERR_NOT_SUPPORTED);
    g = ok;
    g.yt = false; /* a row-major weight [K, Q]: not nn.Linear's layout */
    CHECK(em__cpu_gemv(&g) == EM_ERR_NOT_SUPPORTED);
    g = ok;
    g.xt = true;
    CHECK(em__cpu_gemv(&g) == EM_ERR_NOT_SUPPORTED);
    g = ok;
    g.K = 0;
    CHECK(em__cpu_gemv(&g) == EM_ERR_NOT_SUPPORTED);
    const char *others[] = {"onednn", "portable", "amx"};
    for (int i = 0; i < 3; i++) {
        setenv("EMBER_CPU_LOWP_GEMM", others[i], 1);
        CHECK(em__cpu_gemv_isa() == NULL);
        CHECK(em__cpu_gemv(&ok) == EM_ERR_NOT_SUPPORTED);
    }
    unsetenv("EMBER_CPU_LOWP_GEMM");
    bool untouched = true;
    for (int i = 0; i < 36; i++) untouched &= z[i] == 0x1234;
    CHECK(untouched);
    CHECK(!em_failed());
}

/* bf16 bits of t (contiguous) */
static uint16_t *bits_of(em_tensor *t) {
    size_t n = (size_t)em_numel(t);
    uint16_t *b = malloc(n * 2 + 2);
    if (b && em_copy_to_host(t, b, n * 2) != EM_OK) {
        free(b);
        b = NULL;
    }
    return b;
}

/* x @ w.T through the public ops: GEMV on 1 and 2 threads (the same bits), against the
 * float32 path (EMBER_CPU_LOWP_GEMM=portable: converted, multiplied, rounded once) */
static void test_through_ops(void) {
    struct { int64_t lead, rows, K, Q; bool bias; } cases[] = {
        {0, 1, 4096, 4096, false}, {0, 4, 2048, 513, true}, {2, 3, 130, 77, false}, {0, 8, 96, 4100, true},
    };
    em_manual_seed(7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        em_scope sc = em_scope_begin();
        int64_t K = cases[c].K, Q = cases[c].Q;
        em_tensor *x = cases[c].lead ? em_randn(EM_SHAPE(cases[c].lead, cases[c].rows, K), EM_OPTS(.dtype = EM_F32))
                                     : em_randn(EM_SHAPE(cases[c].rows, K), EM_OPTS(.dtype = EM_F32));
        x = em_to_dtype(x, EM_BF16);
        em_tensor *w = em_to_dtype(em_mul_scalar(em_randn(EM_SHAPE(Q, K), EM_OPTS(.dtype = EM_F32)), 0.05), EM_BF16);
        em_tensor *b = em_to_dtype(em_randn(EM_SHAPE(Q), EM_OPTS(.dtype = EM_F32)), EM_BF16);
        em_tensor *wt = em_transpose(w, 0, 1);
        em_tensor *y[3];
        const char *paths[3] = {"gemv", "gemv", "portable"};
        int threads[3] = {1, 2, 1};
        for (int p = 0; p < 3; p++) {
            setenv("EMBER_CPU_LOWP_GEMM", paths[p], 1);
            em_set_num_threads(threads[p]);
            y[p] = cases[c].bias && !cases[c].lead ? em_addmm(b, x, wt, 1, 1) : em_matmul(x, wt);
        }
        unsetenv("EMBER_CPU_LOWP_GEMM");
        em_set_num_threads(2);
        CHECK(y[0] && y[1] && y[2]);
        if (!y[0] || !y[1] || !y[2]) {
            em_scope_end(sc);
            continue;
        }
        CHECK(em_dtype_of(y[0]) == EM_BF16 && em_numel(y[0]) == em_numel(x) / K * Q);
        uint16_t *b1 = bits_of(y[0]), *b2 = bits_of(y[1]), *bp = bits_of(y[2]);
        CHECK(b1 && b2 && bp);
        if (b1 && b2 && bp) {
            int64_t n = em_numel(y[0]), same = 0, close = 0;
            for (int64_t i = 0; i < n; i++) {
                same += b1[i] == b2[i];
                float g = test_bf16_to_f32(b1[i]), want = test_bf16_to_f32(bp[i]);
                /* two roundings of float32 sums in different orders: at most a bf16 step or two */
                close += fabsf(g - want) <= 0x1p-7f * fabsf(want) + 0.01f * sqrtf((float)K / 4096.0f);
            }
            if (same != n || close != n)
                fprintf(stderr, "  case %zu: %lld of %lld equal across threads, %lld close to float32\n", c,
                        (long long)same, (long long)n, (long long)close);
            CHECK(same == n);
            CHECK(close == n);
        }
        free(b1);
        free(b2);
        free(bp);
        em_scope_end(sc);
    }
    CHECK(!em_failed());
}

int main(void) {
    unsetenv("EMBER_CPU_LOWP_GEMM");
    if (!em__cpu_gemv_isa()) {
        test_skip_case("test_cpu_gemv", "no AVX2 + FMA here: bf16 products of a few rows go to the %s",
                       em_cpu_matmul_impl(EM_BF16));
        return test_summary();
    }
    printf("  bf16 GEMV: %s\n", em__cpu_gemv_isa());
    RUN(test_exact_best);
    RUN(test_exact_avx2);
    RUN(test_wide_range);
    RUN(test_declines);
    RUN(test_through_ops);
    return test_summary();
}
