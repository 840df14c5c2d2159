/* Ember's AMX bf16 GEMM (src/backends/cpu/cpu_amx.c) called directly, against a reference:
 * - small-integer inputs, whose products and sums float32 holds exactly, so the result must
 *   equal the exact sum rounded once to bf16 (round to nearest even, ties included), bit for
 *   bit: every layout (X and Y each row- or column-major), tails in rows, columns and k,
 *   leading dimensions past the matrix, bias, accumulation into z, k split into several
 *   pieces and B into several panels (A then packed once), 1 and 2 threads;
 * - random inputs of a wide range against a float64 reference (one rounding plus float32
 *   accumulation error);
 * - a float32 z (z_f32: a master weight's gradient): the exact sum, never rounded, the same
 *   layouts, bias, accumulation and splits, and a z of 8 MB and more (streaming stores);
 * - NaN and infinity propagate; z's padding (past Q in each row) is never written;
 * - what the kernel declines: other dtypes, EMBER_CPU_LOWP_GEMM=onednn/portable, and (unless
 *   asked for by name) fewer than 32 rows or columns where oneDNN runs bf16; K = 0;
 * - no memory for its packing buffers: a clear error, z untouched.
 * Skipped where the CPU or the OS gives no AMX. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/cpu/cpu_amx.h"
#include "test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}

static float from_bf16(uint16_t h) { return test_bf16_to_f32(h); }

/* round to nearest even, as the kernel's one rounding; (float) is exact for the integer cases
 * (|sums| < 2^24) */
static uint16_t to_bf16(double d) { return test_f32_to_bf16((float)d); }

/* -4..4 (ints), else +-[0, 1] times 2^-10..2^10 */
static float rand_val(bool ints) {
    if (ints) return (float)((int)(next_u32() % 9) - 4);
    return ldexpf((float)(next_u32() % 2001) / 1000.0f - 1.0f, (int)(next_u32() % 21) - 10);
}

typedef struct gcase {
    int64_t P, K, Q;
} gcase;

/* z's element i: bf16 bits widened, or the float32 itself (f32z) */
static float z_get(const void *z, bool f32z, int64_t i) {
    return f32z ? ((const float *)z)[i] : from_bf16(((const uint16_t *)z)[i]);
}
static void z_set(void *z, bool f32z, int64_t i, float v) {
    if (f32z) ((float *)z)[i] = v;
    else ((uint16_t *)z)[i] = to_bf16(v);
}
static bool z_is_sentinel(const void *z, bool f32z, int64_t i) {
    if (f32z) {
        uint32_t u;
        memcpy(&u, (const float *)z + i, 4);
        return u == 0x7FC00001u;
    }
    return ((const uint16_t *)z)[i] == 0x7FC1;
}

/* one product: X (P x K, xt: stored column-major), Y (K x Q, yt), leading dims padded by pad;
 * z (bf16, or float32 with f32z) has pad columns past Q per row, filled with a sentinel that
 * must survive. ints: inputs in -4..4 and an exact comparison (bf16 z: the sum rounded once;
 * float32 z: the sum itself), else normal values of a wide range and a tolerance.
 * Returns the number of wrong elements (-1 when refused). */
static int run_case_z(gcase c, bool xt, bool yt, int64_t pad, bool acc, bool bias, bool ints, bool f32z) {
    int64_t P = c.P, K = c.K, Q = c.Q;
    int64_t ldx = (xt ? P : K) + pad, ldy = (yt ? K : Q) + pad, ldz = Q + pad;
    uint16_t *x = calloc((size_t)((xt ? K : P) * ldx + 1), 2), *y = calloc((size_t)((yt ? Q : K) * ldy + 1), 2);
    void *z = NULL; /* 64-byte aligned, as tensors are: a big float32 z is then streamed */
    if (posix_memalign(&z, 64, (size_t)(P * ldz + 1) * (f32z ? 4 : 2))) z = NULL;
    uint16_t *b = malloc((size_t)(Q + 1) * 2);
    double *ref = calloc((size_t)(P * Q + 1), sizeof(double)), *mag = calloc((size_t)(P * Q + 1), sizeof(double));
    int bad = 0;
    if (!x || !y || !z || !b || !ref || !mag) {
        bad = -1;
        goto out;
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t k = 0; k < K; k++) {
            x[xt ? k * ldx + i : i * ldx + k] = to_bf16(rand_val(ints));
        }
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < Q; j++) {
            y[yt ? j * ldy + k : k * ldy + j] = to_bf16(rand_val(ints));
        }
    for (int64_t j = 0; j < Q; j++) b[j] = to_bf16(ints ? rand_val(true) : 0.5);
    for (int64_t i = 0; i < P * ldz; i++) { /* a NaN: ignored unless acc */
        if (f32z) {
            uint32_t u = 0x7FC00001u;
            memcpy((float *)z + i, &u, 4);
        } else {
            ((uint16_t *)z)[i] = 0x7FC1;
        }
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t j = 0; j < Q; j++) {
            if (acc) z_set(z, f32z, i * ldz + j, ints ? rand_val(true) : 1.0f);
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)from_bf16(x[xt ? k * ldx + i : i * ldx + k]) *
                           from_bf16(y[yt ? j * ldy + k : k * ldy + j]);
                s += p;
                m += fabs(p);
            }
            if (bias) s += from_bf16(b[j]);
            if (acc) s += z_get(z, f32z, i * ldz + j);
            ref[i * Q + j] = s;
            mag[i * Q + j] = m;
        }
    em_lowp_gemm g = {EM_BF16, P, Q, K, x, y, z, xt, yt, ldx, ldy, ldz, acc, bias ? b : NULL, f32z};
    em_status st = em__cpu_amx_gemm(&g);
    CHECK_OK(st);
    if (st != EM_OK) {
        bad = -1;
        goto out;
    }
    for (int64_t i = 0; i < P; i++) {
        for (int64_t j = 0; j < Q; j++) {
            float got = z_get(z, f32z, i * ldz + j);
            bool ok;
            if (ints) {
                ok = f32z ? got == (float)ref[i * Q + j] : to_bf16(got) == to_bf16(ref[i * Q + j]);
            } else {
                /* bf16 z: its one rounding; float32 z: the rounding of adding bias and old z
                 * (2 x 2^-24 of the result), which the products' magnitude does not cover */
                double r = ref[i * Q + j], tol = fabs(r) * (f32z ? 1.2e-7 : 1.0 / 256) + mag[i * Q + j] * 6e-8 * (double)K + 1e-30;
                ok = fabs((double)got - r) <= tol;
            }
            if (!ok && bad++ < 3)
                fprintf(stderr, "  [%lld x %lld x %lld] xt %d yt %d pad %lld acc %d bias %d f32z %d: (%lld, %lld) got %.9g, "
                        "expected %.9g\n", (long long)P, (long long)K, (long long)Q, xt, yt, (long long)pad, acc, bias,
                        f32z, (long long)i, (long long)j, (double)got, ref[i * Q + j]);
        }
        for (int64_t j = Q; j < ldz; j++)
            if (!z_is_sentinel(z, f32z, i * ldz + j) && bad++ < 3)
                fprintf(stderr, "  padding written at (%lld, %lld)\n", (long long)i, (long long)j);
    }
out:
    free(x);
    free(y);
    free(z);
    free(b);
    free(ref);
    free(mag);
    return bad;
}

static int run_case(gcase c, bool xt, bool yt, int64_t pad, bool acc, bool bias, bool ints) {
    return run_case_z(c, xt, yt, pad, acc, bias, ints, false);
}

/* shapes: tails everywhere; K of several pieces (KC 256: K 1000 splits into 4 even pieces);
 * K 4100 makes B panels 128 columns wide, so Q 300 needs three (A packed once, both layouts);
 * K 1000 makes them 512 wide, so Q 530 needs two (a row-major A's pieces packed ahead, the
 * last piece of the first panel packing the second's first) */
static const gcase cases[] = {{32, 32, 32},  {33, 31, 47},   {64, 256, 64}, {100, 1000, 70},
                              {257, 96, 129}, {40, 4100, 300}, {1, 5, 40},    {45, 7, 1},
                              {33, 1000, 530}};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static void all_layouts_z(bool ints, bool f32z) {
    setenv("EMBER_CPU_LOWP_GEMM", "amx", 1); /* the narrow cases too (else oneDNN's) */
    for (int c = 0; c < NCASES; c++)
        for (int l = 0; l < 4; l++) {
            bool xt = l & 1, yt = l & 2;
            int64_t pad = c % 2 ? 3 : 0;
            CHECK(run_case_z(cases[c], xt, yt, pad, false, false, ints, f32z) == 0);
            if (c % 3 == 0) CHECK(run_case_z(cases[c], xt, yt, pad, true, false, ints, f32z) == 0);
            if (c % 3 == 1) CHECK(run_case_z(cases[c], xt, yt, pad, false, true, ints, f32z) == 0);
            if (c % 3 == 2) CHECK(run_case_z(cases[c], xt, yt, pad, true, true, ints, f32z) == 0);
        }
    unsetenv("EMBER_CPU_LOWP_GEMM");
}

static void all_layouts(bool ints) { all_layouts_z(ints, false); }

static void test_exact_1(void) {
    em_set_num_threads(1);
    all_layouts(true);
}

static void test_exact_2(void) {
    em_set_num_threads(2);
    all_layouts(true);
    /* big enough to be split (60M multiply-adds and up): rows (P >= Q) and columns (Q > P)
     * over the two threads, with tails in each thread's block */
    CHECK(run_case((gcase){610, 400, 270}, false, true, 0, false, true, true) == 0);
    CHECK(run_case((gcase){270, 400, 610}, true, false, 0, true, false, true) == 0);
    em_set_num_threads(1);
}

static void test_wide_range(void) {
    em_set_num_threads(2);
    all_layouts(false);
    em_set_num_threads(1);
}

/* a float32 z: the exact sums (ints), a wide range within float32 accumulation, the splits
 * over 2 threads, and z of 8 MB (streaming stores: aligned rows, no accumulation) and more */
static void test_f32_out(void) {
    em_set_num_threads(1);
    all_layouts_z(true, true);
    em_set_num_threads(2);
    all_layouts_z(true, true);
    all_layouts_z(false, true);
    CHECK(run_case_z((gcase){610, 400, 270}, false, true, 0, false, true, true, true) == 0);
    CHECK(run_case_z((gcase){270, 400, 610}, true, false, 0, true, false, true, true) == 0);
    for (int t = 1; t <= 2; t++) {
        em_set_num_threads(t);
        CHECK(run_case_z((gcase){1024, 32, 2048}, true, false, 0, false, false, true, true) == 0);
        CHECK(run_case_z((gcase){2048, 40, 1056}, false, false, 0, false, true, true, true) == 0);
        CHECK(run_case_z((gcase){1024, 32, 2048}, true, false, 0, true, false, true, true) == 0); /* acc: not streamed */
    }
    em_set_num_threads(1);
}

/* NaN and infinity in the inputs reach exactly the outputs they touch */
static void test_special_values(void) {
    int64_t P = 40, K = 64, Q = 48;
    uint16_t *x = malloc((size_t)(P * K) * 2), *y = malloc((size_t)(K * Q) * 2), *z = malloc((size_t)(P * Q) * 2);
    if (!x || !y || !z) { free(x); free(y); free(z); CHECK(false); return; }
    for (int64_t i = 0; i < P * K; i++) x[i] = to_bf16(1.0);
    for (int64_t i = 0; i < K * Q; i++) y[i] = to_bf16(0.5);
    x[3 * K + 5] = 0x7FC0;      /* NaN in row 3 */
    y[7 * Q + 11] = 0x7F80;     /* +inf in column 11 */
    em_lowp_gemm g = {EM_BF16, P, Q, K, x, y, z, false, false, K, Q, Q, false, NULL, false};
    CHECK_OK(em__cpu_amx_gemm(&g));
    for (int64_t i = 0; i < P; i++)
        for (int64_t j = 0; j < Q; j++) {
            float v = from_bf16(z[i * Q + j]);
            if (i == 3) CHECK(isnan(v));
            else if (j == 11) CHECK(isinf(v) && v > 0);
            else CHECK(v == 32.0f);
        }
    free(x);
    free(y);
    free(z);
}

/* what it declines, leaving z as it was and no error recorded */
static void test_declines(void) {
    uint16_t x[64 * 64] = {0}, y[64 * 64] = {0}, z[64 * 64];
    for (int i = 0; i < 64 * 64; i++) z[i] = 0x1234;
    em_lowp_gemm g = {EM_F16, 64, 64, 64, x, y, z, false, false, 64, 64, 64, false, NULL, false};
    CHECK(em__cpu_amx_gemm(&g) == EM_ERR_NOT_SUPPORTED);
    CHECK(!em__cpu_amx_runs(EM_F16) && !em__cpu_amx_runs(EM_F32));
    g.dtype = EM_BF16;
    setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
    CHECK(!em__cpu_amx_runs(EM_BF16) && em__cpu_amx_gemm(&g) == EM_ERR_NOT_SUPPORTED && !em__cpu_amx_name());
    setenv("EMBER_CPU_LOWP_GEMM", "portable", 1);
    CHECK(!em__cpu_amx_runs(EM_BF16) && em__cpu_amx_gemm(&g) == EM_ERR_NOT_SUPPORTED);
    unsetenv("EMBER_CPU_LOWP_GEMM");
    CHECK(!em_failed());
    for (int i = 0; i < 64 * 64; i++) CHECK(z[i] == 0x1234);
    /* a 10-column head: oneDNN's where it runs bf16, this kernel's when asked for by name */
    g.Q = 10;
    em_status st = em__cpu_amx_gemm(&g);
    CHECK(st == EM_OK || (st == EM_ERR_NOT_SUPPORTED && z[0] == 0x1234));
    setenv("EMBER_CPU_LOWP_GEMM", "amx", 1);
    CHECK_OK(em__cpu_amx_gemm(&g));
    CHECK(z[0] == 0 && z[9] == 0 && z[10] == 0x1234); /* zeros in, zeros out; column 10 is past Q */
    unsetenv("EMBER_CPU_LOWP_GEMM");
    /* empty products */
    g.P = 0;
    CHECK_OK(em__cpu_amx_gemm(&g));
    g.P = 64;
    g.K = 0; /* the callers fill z themselves: declined, z untouched */
    CHECK(em__cpu_amx_gemm(&g) == EM_ERR_NOT_SUPPORTED && z[0] == 0 && !em_failed());
}

/* No memory for the packing buffers: in a child process under an address-space limit 32 MB
 * above what it uses, a product whose buffers need 66 MB (A packed once: 8192 rows x 4096;
 * more than the pool ever keeps, so none is reused) fails with EM_ERR_OUT_OF_MEMORY and a
 * message, and z keeps its sentinel. Not under sanitizers, whose shadow memory needs the
 * address space. */
static void test_out_of_memory(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    SKIP("an address-space limit under a sanitizer");
#else
    int64_t P = 8192, K = 4096, Q = 1024;
    uint16_t *x = calloc((size_t)(P * K), 2), *y = calloc((size_t)(K * Q), 2), *z = malloc((size_t)(P * Q) * 2);
    CHECK(x && y && z);
    if (!x || !y || !z) goto out;
    for (int64_t i = 0; i < P * Q; i++) z[i] = 0x1234;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        em_set_num_threads(1);
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(3);
        fclose(f);
        struct rlimit rl;
        if (getrlimit(RLIMIT_AS, &rl)) _exit(3);
        rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)32 << 20);
        if (setrlimit(RLIMIT_AS, &rl)) _exit(3);
        em_lowp_gemm g = {EM_BF16, P, Q, K, x, y, z, false, false, K, Q, Q, false, NULL, false};
        em_status st = em__cpu_amx_gemm(&g);
        bool untouched = true;
        for (int64_t i = 0; i < P * Q; i++) untouched &= z[i] == 0x1234;
        if (st != EM_ERR_OUT_OF_MEMORY || !untouched || !strstr(em_last_error(), "out of memory")) {
            fprintf(stderr, "  status %d, z untouched %d, message: %s\n", (int)st, untouched, em_last_error());
            _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
out:
    free(x);
    free(y);
    free(z);
#endif
}

int main(void) {
    unsetenv("EMBER_CPU_LOWP_GEMM");
    if (!em__cpu_amx_runs(EM_BF16)) {
        test_skip_case("test_cpu_amx", "no AMX-BF16 here (CPU or OS): bf16 matmul is the %s",
                       em_cpu_matmul_impl(EM_BF16));
        return test_summary();
    }
    printf("  bf16 matmul: %s\n", em_cpu_matmul_impl(EM_BF16));
    RUN(test_exact_1);
    RUN(test_exact_2);
    RUN(test_wide_range);
    RUN(test_f32_out);
    RUN(test_special_values);
    RUN(test_out_of_memory);
    RUN(test_declines);
    return test_summary();
}
