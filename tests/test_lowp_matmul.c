/* bf16/f16 matmul, addmm and Linear forward + backward against a float64 reference computed
 * from the same low-precision inputs: on the CPU through Ember's AMX kernel and through oneDNN
 * (when this CPU and build have them: reported as skips otherwise) and through the portable float32 path
 * (EMBER_CPU_LOWP_GEMM=portable), on 1 and 2 threads, and on OpenCL (PoCL) when present.
 * Odd shapes, batch 1, transposed, sliced (non-contiguous) and batched operands. The tolerance
 * is one rounding of the result to the low dtype plus float32 accumulation error; a sum of
 * 4096 ones must come out exact, which float32 accumulation gives and bf16/f16 accumulation
 * cannot (it stalls at 256 / 2048). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include "backends/cpu/cpu_amx.h"
#include "test.h"

static em_device g_dev;
static char g_ctx[128]; /* device, path, threads: printed with a failure */

/* t as a contiguous float64 host array (caller frees). */
static double *host(em_tensor *t) {
    em_scope s = em_scope_begin();
    em_tensor *c = em_contiguous(em_to_dtype(em_to(t, EM_DEVICE_CPU), EM_F64));
    int64_t n = c ? em_numel(c) : 0;
    double *h = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (c && h) CHECK_OK(em_copy_to_host(c, h, sizeof(double) * (size_t)n));
    em_scope_end(s);
    return h;
}

static em_tensor *rnd(em_dtype dt, int64_t r, int64_t c) {
    return em_to(em_to_dtype(em_randn(EM_SHAPE(r, c), EM_OPTS(0)), dt), g_dev);
}

/* one unit in the last place, relative (bf16 keeps 7 mantissa bits, f16 10): a result rounded
 * once is within half of it; addmm composed of matmul and add (no matmul_acc) rounds twice */
static double ulp_rel(em_dtype dt) { return dt == EM_BF16 ? 1.0 / 128 : 1.0 / 1024; }

/* Compares got [M, N] (low dtype) with ref; each element within one rounding plus float32
 * accumulation (K terms of magnitude `scale`). Returns the number of bad elements. */
static int compare(em_tensor *got, const double *ref, int64_t M, int64_t N, int64_t K, double scale, em_dtype dt,
                   const char *what) {
    CHECK(got != NULL);
    if (!got) return 1;
    CHECK(em_dtype_of(got) == dt);
    double *g = host(got);
    int bad = 0;
    for (int64_t i = 0; i < M * N; i++) {
        double tol = fabs(ref[i]) * ulp_rel(dt) + 1e-6 * (double)K * scale + 1e-30;
        if (!(fabs(g[i] - ref[i]) <= tol)) {
            if (bad < 3)
                fprintf(stderr, "  %s %s [%lld x %lld, K %lld] elem %lld: got %.8g, expected %.8g\n", g_ctx, what,
                        (long long)M, (long long)N, (long long)K, (long long)i, g[i], ref[i]);
            bad++;
        }
    }
    free(g);
    CHECK(bad == 0);
    return bad;
}

/* ref = a @ b from host copies (a [M, K], b [K, N], any layouts: em_contiguous inside host) */
static double *ref_mm(em_tensor *a, em_tensor *b, int64_t M, int64_t K, int64_t N, double *scale) {
    double *ha = host(a), *hb = host(b), *r = calloc((size_t)(M * N + 1), sizeof(double));
    double amax = 0, bmax = 0;
    for (int64_t i = 0; i < M * K; i++) amax = fmax(amax, fabs(ha[i]));
    for (int64_t i = 0; i < K * N; i++) bmax = fmax(bmax, fabs(hb[i]));
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++) r[i * N + j] += ha[i * K + k] * hb[k * N + j];
    *scale = amax * bmax;
    free(ha);
    free(hb);
    return r;
}

typedef struct shape3 { int64_t M, K, N; } shape3;
static const shape3 shapes[] = {{1, 1, 1}, {1, 784, 512}, {7, 13, 5}, {65, 300, 129}, {130, 300, 260}, {3, 1, 70},
                                 {1100, 8, 1030},  /* 1030 > 1024: column panels, each with a row tail */
                                 /* wider than tall, >= 1024 rows: each thread's columns in panels
                                  * (1 thread: 512, 512, 76; 2 threads: 5 panels shared) */
                                 {1024, 8, 1100}, {1030, 8, 2300},
                                 /* fewer rows than columns against W^T on 2 threads without AMX:
                                  * whole-width row blocks, the second shorter (128 + 72 rows) */
                                 {200, 40, 2100}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static void check_matmul_dtype(em_dtype dt) {
    for (int s = 0; s < NSHAPES; s++) {
        int64_t M = shapes[s].M, K = shapes[s].K, N = shapes[s].N;
        for (int layout = 0; layout < 4; layout++) {
            em_scope sc = em_scope_begin();
            em_tensor *a, *b;
            const char *what;
            if (layout == 0) { a = rnd(dt, M, K); b = rnd(dt, K, N); what = "matmul"; }
            else if (layout == 1) { a = em_transpose(rnd(dt, K, M), 0, 1); b = rnd(dt, K, N); what = "matmul a^T"; }
            else if (layout == 2) { a = rnd(dt, M, K); b = em_transpose(rnd(dt, N, K), 0, 1); what = "matmul b^T"; }
            else { /* every other column of a and row of b: neither row- nor column-major */
                a = em_slice(rnd(dt, M, 2 * K), 1, 0, 2 * K, 2);
                b = em_slice(rnd(dt, 2 * K, N), 0, 0, 2 * K, 2);
                what = "matmul sliced";
            }
            double scale;
            double *r = ref_mm(a, b, M, K, N, &scale);
            compare(em_matmul(a, b), r, M, N, K, scale, dt, what);
            free(r);
            em_scope_end(sc);
        }
    }
}

/* [B, M, K] @ [K, N] (the weight shared: folded into one GEMM) and @ [B, K, N] */
static void check_batched(em_dtype dt) {
    int64_t B = 3, M = 33, K = 70, N = 17;
    em_scope sc = em_scope_begin();
    em_tensor *a = em_to(em_to_dtype(em_randn(EM_SHAPE(B, M, K), EM_OPTS(0)), dt), g_dev);
    em_tensor *w = rnd(dt, K, N);
    em_tensor *bb = em_to(em_to_dtype(em_randn(EM_SHAPE(B, K, N), EM_OPTS(0)), dt), g_dev);
    em_tensor *o1 = em_matmul(a, w), *o2 = em_matmul(a, bb);
    CHECK(o1 && o2);
    for (int64_t i = 0; o1 && o2 && i < B; i++) {
        double scale;
        em_tensor *ai = em_select(a, 0, i);
        double *r = ref_mm(ai, w, M, K, N, &scale);
        compare(em_select(o1, 0, i), r, M, N, K, scale, dt, "batched, shared weight");
        free(r);
        r = ref_mm(ai, em_select(bb, 0, i), M, K, N, &scale);
        compare(em_select(o2, 0, i), r, M, N, K, scale, dt, "batched");
        free(r);
    }
    em_scope_end(sc);
}

/* float32 accumulation: 4096 ones sum to 4096 exactly (bf16 sums stall at 256, f16 at 2048) */
static void check_accumulation(em_dtype dt) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_ones(EM_SHAPE(2, 4096), EM_OPTS(.device = g_dev, .dtype = dt));
    em_tensor *b = em_ones(EM_SHAPE(4096, 3), EM_OPTS(.device = g_dev, .dtype = dt));
    em_tensor *o = em_matmul(a, b);
    CHECK(o != NULL);
    if (o) {
        double *h = host(o);
        for (int i = 0; i < 6; i++) CHECK_NEAR(h[i], 4096.0, 0.0);
        free(h);
    }
    em_tensor *bias = em_ones(EM_SHAPE(3), EM_OPTS(.device = g_dev, .dtype = dt));
    em_tensor *o2 = em_addmm(bias, a, b, 1.0, 1.0);
    CHECK(o2 != NULL);
    if (o2) {
        double *h = host(o2);
        for (int i = 0; i < 6; i++) CHECK_NEAR(h[i], 4096.0, 0.0); /* 4097 rounds to 4096 once */
        free(h);
    }
    em_scope_end(sc);
}

/* addmm as Linear calls it: bias [N] + x @ w^T, w stored [N, K] */
static void check_addmm(em_dtype dt) {
    for (int s = 0; s < NSHAPES; s++) {
        int64_t M = shapes[s].M, K = shapes[s].K, N = shapes[s].N;
        em_scope sc = em_scope_begin();
        em_tensor *x = rnd(dt, M, K), *w = rnd(dt, N, K);
        em_tensor *bias = em_to(em_to_dtype(em_randn(EM_SHAPE(N), EM_OPTS(0)), dt), g_dev);
        double scale;
        double *r = ref_mm(x, em_transpose(w, 0, 1), M, K, N, &scale);
        double *hb = host(bias);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) r[i * N + j] += hb[j];
        compare(em_addmm(bias, x, em_transpose(w, 0, 1), 1.0, 1.0), r, M, N, K, scale, dt, "addmm");
        free(hb);
        free(r);
        em_scope_end(sc);
    }
}

/* Linear in dt: y = x W^T + b; with loss = sum(y * G): dx = G W, dW = G^T x, db = sum_rows G */
static void check_linear(em_dtype dt) {
    static const shape3 ls[] = {{1, 784, 512}, {64, 100, 10}, {96, 256, 200}, {5, 3, 7}};
    for (int s = 0; s < (int)(sizeof ls / sizeof ls[0]); s++) {
        int64_t M = ls[s].M, K = ls[s].K, N = ls[s].N;
        em_scope sc = em_scope_begin();
        em_module *lin = em_nn_linear(K, N);
        CHECK(lin != NULL);
        if (!lin) { em_scope_end(sc); continue; }
        CHECK_OK(em_module_to_dtype(lin, dt));
        CHECK_OK(em_module_to(lin, g_dev));
        em_named_tensor p[2];
        CHECK(em_module_parameters(lin, p, 2) == 2);
        em_tensor *W = p[0].tensor, *bias = p[1].tensor;
        em_tensor *x = rnd(dt, M, K), *G = rnd(dt, M, N);
        CHECK_OK(em_set_requires_grad(x, true));
        em_tensor *y = em_forward(lin, x);
        CHECK_OK(em_backward(em_sum(em_mul(y, G), EM_ALL_DIMS, false)));
        double scale;
        double *r = ref_mm(x, em_transpose(W, 0, 1), M, K, N, &scale);
        double *hb = host(bias);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) r[i * N + j] += hb[j];
        compare(y, r, M, N, K, scale, dt, "linear forward");
        free(r);
        r = ref_mm(G, W, M, N, K, &scale);
        compare(em_grad(x), r, M, K, N, scale, dt, "linear grad x");
        free(r);
        r = ref_mm(em_transpose(G, 0, 1), x, N, M, K, &scale);
        compare(em_grad(W), r, N, K, M, scale, dt, "linear grad W");
        free(r);
        double *hg = host(G), *db = calloc((size_t)N, sizeof(double)), gmax = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) { db[j] += hg[i * N + j]; gmax = fmax(gmax, fabs(hg[i * N + j])); }
        compare(em_reshape(em_grad(bias), EM_SHAPE(1, N)), db, 1, N, M, gmax, dt, "linear grad bias");
        free(db);
        free(hg);
        free(hb);
        em_module_free(lin);
        em_scope_end(sc);
    }
}

/* A float32 master weight cast to dt for the product (a bf16 step, an autocast region): its
 * gradient is float32, and where the device multiplies straight into float32 (the CPU's
 * matmul_widen, every path) it carries float32 accumulation error only: under 1% of the
 * elements may be off by more than 2^-12 relative, where a gradient rounded to bf16 (2^-9 at
 * most) would put most of them there (f16: 2^-14 against 2^-11). Elsewhere (OpenCL) it is
 * rounded to dt first: one rounding's tolerance. The second shape's weight gradient is 8 MB of
 * float32, which the AMX kernel writes with streaming stores. */
static void check_master_grad(em_dtype dt) {
    static const shape3 ms[] = {{64, 100, 70}, {32, 1024, 2048}};
    bool widened = g_dev.type == EM_CPU;
    double fine = dt == EM_BF16 ? 1.0 / 4096 : 1.0 / 16384;
    for (int s = 0; s < (int)(sizeof ms / sizeof ms[0]); s++) {
        int64_t M = ms[s].M, K = ms[s].K, N = ms[s].N;
        em_scope sc = em_scope_begin();
        em_tensor *W = em_to(em_randn(EM_SHAPE(N, K), EM_OPTS(0)), g_dev), *b = em_to(em_randn(EM_SHAPE(N), EM_OPTS(0)), g_dev);
        CHECK_OK(em_set_requires_grad(W, true));
        CHECK_OK(em_set_requires_grad(b, true));
        em_tensor *x = rnd(dt, M, K), *G = rnd(dt, M, N);
        em_tensor *y = em_addmm(em_to_dtype(b, dt), x, em_transpose(em_to_dtype(W, dt), 0, 1), 1.0, 1.0);
        CHECK(y && em_dtype_of(y) == dt);
        CHECK_OK(em_backward(em_sum(em_mul(y, G), EM_ALL_DIMS, false)));
        em_tensor *gw = em_grad(W);
        CHECK(gw && em_dtype_of(gw) == EM_F32 && em_dtype_of(em_grad(b)) == EM_F32);
        double scale;
        double *r = ref_mm(em_transpose(G, 0, 1), x, N, M, K, &scale), *h = gw ? host(gw) : NULL;
        int64_t off = 0, bad = 0;
        for (int64_t i = 0; h && i < N * K; i++) {
            double e = fabs(h[i] - r[i]);
            if (e > fabs(r[i]) * fine + 1e-7 * scale) off++;
            if (!(e <= fabs(r[i]) * ulp_rel(dt) + 1e-6 * (double)M * scale) && bad++ < 3)
                fprintf(stderr, "  %s master grad [%lld x %lld] elem %lld: got %.8g, expected %.8g\n", g_ctx,
                        (long long)N, (long long)K, (long long)i, h[i], r[i]);
        }
        CHECK(h && bad == 0);
        if (widened && off * 100 >= N * K)
            fprintf(stderr, "  %s master grad [%lld x %lld]: %lld of %lld elements off by more than float32 accumulation "
                    "(rounded to %s?)\n", g_ctx, (long long)N, (long long)K, (long long)off, (long long)(N * K), em_dtype_name(dt));
        CHECK(!widened || off * 100 < N * K);
        free(r);
        free(h);
        em_scope_end(sc);
    }
}

static void run_all(void) {
    em_manual_seed(14);
    em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int i = 0; i < 2; i++) {
        check_accumulation(dts[i]);
        check_matmul_dtype(dts[i]);
        check_batched(dts[i]);
        check_addmm(dts[i]);
        check_linear(dts[i]);
        check_master_grad(dts[i]);
    }
}

static void cpu_path(const char *path, int threads) {
    g_dev = EM_DEVICE_CPU;
    em_set_num_threads(threads);
    snprintf(g_ctx, sizeof g_ctx, "cpu %s, %d thread(s)", path, threads);
    run_all();
}

static void test_cpu_portable_1(void) { cpu_path("portable", 1); }
static void test_cpu_portable_2(void) { cpu_path("portable", 2); }
static void test_cpu_amx_1(void) { cpu_path("AMX", 1); }
static void test_cpu_amx_2(void) { cpu_path("AMX", 2); }
static void test_cpu_onednn_1(void) { cpu_path("oneDNN", 1); }
static void test_cpu_onednn_2(void) { cpu_path("oneDNN", 2); }

/* What em_cpu_matmul_impl says follows the CPU and the switch. */
static void test_impl_report(void) {
    CHECK(em_cpu_matmul_impl(EM_I64) == NULL);
    CHECK(em_cpu_matmul_impl(EM_F32) && em_cpu_matmul_impl(EM_F32)[0]);
    setenv("EMBER_CPU_LOWP_GEMM", "portable", 1);
    CHECK(strstr(em_cpu_matmul_impl(EM_BF16), "float32 GEMM after conversion") != NULL);
    unsetenv("EMBER_CPU_LOWP_GEMM");
    const char *impl = em_cpu_matmul_impl(EM_BF16);
    printf("  bf16: %s\n  f16:  %s\n", impl, em_cpu_matmul_impl(EM_F16));
    const char *f = em_cpu_features();
    /* Ember's AMX kernel by default where the CPU and OS give AMX; oneDNN when asked for */
    bool amx = em__cpu_amx_runs(EM_BF16);
    if (amx) {
        CHECK(strstr(impl, "AMX kernel") != NULL);
        CHECK(strstr(f, "amx_bf16") != NULL);
    }
    setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
    const char *d = em_cpu_matmul_impl(EM_BF16);
    if (!amx) CHECK(strcmp(d, impl) == 0); /* the default without AMX */
#ifdef EMBER_HAVE_DNNL
    bool bf16_hw = strstr(f, "avx512_bf16") || strstr(f, "amx_bf16");
    if (bf16_hw) CHECK(strncmp(d, "oneDNN", 6) == 0);              /* the CPU has a bf16 unit */
    if (strstr(f, "amx_bf16")) CHECK(strstr(d, "amx") != NULL);     /* and oneDNN uses AMX */
    if (!bf16_hw) CHECK(strstr(d, "float32 GEMM after conversion") != NULL);
#else
    CHECK(strstr(d, "built without oneDNN") != NULL);
#endif
    unsetenv("EMBER_CPU_LOWP_GEMM");
}

/* The CPU's f32 <-> bf16 casts (vectorized where the CPU has AVX-512) against the scalar rule:
 * every bf16 pattern to f32, and f32 patterns of every kind (ties, subnormals, infinities,
 * NaNs with payloads) to bf16, with odd lengths for the vector tails. */
static uint16_t ref_bf16(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void test_bf16_casts(void) {
    em_scope sc = em_scope_begin();
    uint16_t *h = malloc(65536 * sizeof *h);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    em_tensor *t = em_from_data(h, EM_BF16, EM_SHAPE(65536), EM_OPTS(.dtype = EM_BF16));
    em_tensor *f = em_contiguous(em_to_dtype(t, EM_F32));
    uint32_t *fu = malloc(65536 * sizeof *fu);
    CHECK_OK(em_copy_to_host(f, fu, 65536 * 4));
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) bad += fu[i] != i << 16;
    CHECK(bad == 0);
    int64_t n = 100003;
    uint32_t *u = malloc((size_t)n * sizeof *u), x = 12345;
    for (int64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        switch (i % 5) {
        case 0: u[i] = x; break;                                  /* anything, NaNs included */
        case 1: u[i] = (x & 0xffff0000u) | 0x8000u; break;        /* exact ties */
        case 2: u[i] = x & 0x807fffffu; break;                    /* subnormals */
        case 3: u[i] = 0x7f800000u | (x & 0x807fffffu); break;    /* inf, NaN payloads */
        default: u[i] = (x & 0xffff0000u) | 0x7fffu; break;       /* just below a tie */
        }
    }
    em_tensor *g = em_from_data(u, EM_F32, EM_SHAPE(n), EM_OPTS(0));
    em_tensor *b = em_contiguous(em_to_dtype(g, EM_BF16));
    uint16_t *bh = malloc((size_t)n * sizeof *bh);
    CHECK_OK(em_copy_to_host(b, bh, (size_t)n * 2));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (bh[i] != ref_bf16(u[i])) {
            if (bad < 3) fprintf(stderr, "  f32 %08x -> bf16 %04x, expected %04x\n", u[i], bh[i], ref_bf16(u[i]));
            bad++;
        }
    }
    CHECK(bad == 0);
    free(h);
    free(fu);
    free(u);
    free(bh);
    em_scope_end(sc);
}

/* oneDNN runs with one OpenMP thread, and the calling thread's own OpenMP setting survives a
 * bf16 matmul (a program's parallel regions keep their thread count) */
static void test_openmp_setting_kept(void) {
    int (*get)(void) = NULL;
    void (*set)(int) = NULL;
    *(void **)&get = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    *(void **)&set = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (!get || !set) SKIP("no OpenMP runtime loaded (built without oneDNN)");
    int before = get();
    set(3);
    em_scope sc = em_scope_begin();
    em_tensor *a = em_to_dtype(em_ones(EM_SHAPE(300, 300), EM_OPTS(0)), EM_BF16);
    em_tensor *c = em_matmul(a, a);
    CHECK(c != NULL);
    CHECK(get() == 3);
    em_scope_end(sc);
    set(before);
}

/* Several program threads multiplying bf16 at once (oneDNN: the shared primitive cache and
 * stream pool, shapes that evict each other; the AMX kernel: its shared buffer pool, each
 * thread's tile configuration, and, in the last job, products split over the pool's two
 * threads while the other callers run): each result equals the same product computed alone. */
typedef struct mt_job { em_tensor *a, *b, *want; int bad; } mt_job;

static void *mt_run(void *arg) {
    mt_job *j = arg;
    for (int it = 0; it < 20; it++) {
        em_scope sc = em_scope_begin();
        em_tensor *c = em_matmul(j->a, j->b);
        em_tensor *d = c ? em_ne(c, j->want) : NULL;
        if (!d || em_item(em_sum(d, EM_ALL_DIMS, false)) != 0) j->bad++;
        em_scope_end(sc);
    }
    em_clear_error();
    return NULL;
}

static void test_threads_share_the_cache(void) {
    g_dev = EM_DEVICE_CPU;
    enum { NT = 4 };
    mt_job jobs[NT];
    pthread_t th[NT];
    em_scope sc = em_scope_begin();
    em_set_num_threads(2);
    for (int i = 0; i < NT; i++) {
        int64_t M = 40 + 37 * i, K = 64 + 11 * i, N = 96 - 9 * i;
        if (i == NT - 1) M = 700, K = 300, N = 330; /* 69M multiply-adds: split */
        jobs[i] = (mt_job){rnd(EM_BF16, M, K), em_transpose(rnd(EM_BF16, N, K), 0, 1), NULL, 0};
        jobs[i].want = em_matmul(jobs[i].a, jobs[i].b);
        CHECK(jobs[i].want != NULL);
    }
    for (int i = 0; i < NT; i++) CHECK(pthread_create(&th[i], NULL, mt_run, &jobs[i]) == 0);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) CHECK(jobs[i].bad == 0);
    em_scope_end(sc);
    em_set_num_threads(1);
}

static void test_amx_concurrent_callers(void) { test_threads_share_the_cache(); }

static void test_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL: %s", em_device_unavailable_reason(EM_OPENCL));
    g_dev = EM_DEVICE(EM_OPENCL, 0);
    snprintf(g_ctx, sizeof g_ctx, "opencl:0");
    run_all();
}

int main(void) {
    unsetenv("EMBER_CPU_LOWP_GEMM");
    RUN(test_impl_report);
    RUN(test_bf16_casts);
    RUN(test_openmp_setting_kept);
    if (em__cpu_amx_runs(EM_BF16)) { /* bf16 on Ember's AMX kernel, f16 as by default */
        setenv("EMBER_CPU_LOWP_GEMM", "amx", 1);
        RUN(test_cpu_amx_1);
        RUN(test_cpu_amx_2);
        RUN(test_amx_concurrent_callers);
    } else {
        test_skip_case("test_cpu_amx", "no AMX here: bf16 matmul is the %s", em_cpu_matmul_impl(EM_BF16));
    }
    setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
    bool onednn = strncmp(em_cpu_matmul_impl(EM_BF16), "oneDNN", 6) == 0;
    if (onednn) {
        RUN(test_cpu_onednn_1);
        RUN(test_cpu_onednn_2);
        RUN(test_threads_share_the_cache);
    } else {
        test_skip_case("test_cpu_onednn", "bf16 matmul here is the %s", em_cpu_matmul_impl(EM_BF16));
    }
    if (strncmp(em_cpu_matmul_impl(EM_F16), "oneDNN", 6) != 0)
        test_skip_case("test_cpu_onednn_f16", "f16 matmul here is the %s (the f16 cases above ran it)",
                       em_cpu_matmul_impl(EM_F16));
    setenv("EMBER_CPU_LOWP_GEMM", "portable", 1);
    RUN(test_cpu_portable_1);
    RUN(test_cpu_portable_2);
    unsetenv("EMBER_CPU_LOWP_GEMM");
    RUN(test_opencl);
    return test_summary();
}
