/* Decoding's products against this machine's memory bandwidth. A decoder reads every weight
 * once per token, so its bf16 matrix-vector products (1 to a few rows times an nn.Linear weight
 * [out, in], seen transposed) can go no faster than memory streams the weight. This measures:
 *
 *   read_gbs     a pure read (sums with AVX-512 or AVX2 loads, else scalar) over 512 MiB,
 *                the better of two access patterns: each thread's part read as one sequential
 *                stream (what the GEMV does) and as four streams side by side (its quarters);
 *   triad_gbs    a = b + c over three 128 MiB float arrays (12 bytes per element, the
 *                write-allocate not counted, as STREAM counts it);
 *                both timed in 32 MiB slices split over Ember's thread pool, the best slice;
 *   gemv_gbs     em_matmul(x, em_transpose(w, 0, 1)) with x [rows, in] and w [out, in] in bf16,
 *                weight bytes / time, at Llama-2-7B's shapes: 4096->4096 (q, k, v, o),
 *                4096->11008 (gate, up), 11008->4096 (down), 4096->32000 (the output head);
 *                or with EMBER_BENCH_SHAPES=1b a Llama-3.2-1B's (rows of 4 KiB, one page each);
 *                Ember's GEMV, and oneDNN's GEMM on the same product (EMBER_CPU_LOWP_GEMM=onednn,
 *                where oneDNN has a bf16 kernel) in the same rounds;
 *   gemm_gflops  the same product with 128..512 rows (prefill);
 *   gemm_peak_gflops  the machine's bf16 GEMM peak as Ember reaches it: em_matmul in bf16 at
 *                sizes past any cache effect (2048^3 and 4096^3 with a row-major B, and the
 *                prefill's own 512 x 2048 @ (8192 x 2048)^T), the best of three runs of each
 *                and the best of the three sizes; prefill is rated against it.
 *
 * Every weight is one of several copies that together span at least 512 MiB, used in turn, so
 * no product finds its weight in the 32 MiB L3 that a smaller loop would leave it in. Each
 * figure is the median over the rounds of each round's best time (the best of several runs
 * is the least disturbed by other work on a shared machine); in each round the 1- and
 * 2-thread runs alternate, and the bandwidth loops run in the same rounds as the products.
 * Usage: bench_gemv [rounds] [--bandwidth-only] (default 5 rounds); EMBER_BENCH_GEMM=0 skips the
 * prefill GEMMs; --bandwidth-only measures the machine alone: the two loops and the GEMM peak
 * (bench/run_lm.sh's references). */
#define _DEFAULT_SOURCE /* madvise */
#include <ember/ember.h>
#include <immintrin.h>
#include <sys/mman.h>
#include "backends/cpu/cpu_threads.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the machine's bandwidth: plain loops ---- */
static float *g_a, *g_b, *g_c;
#define READ_BYTES ((size_t)512 << 20)
#define TRIAD_FLOATS ((size_t)32 << 20)

/* The loops' buffers in 2 MiB pages where the kernel grants them (as Ember's own large
 * allocations and `--no-mmap` weights are): in 4 KiB pages every page the stream enters
 * misses the TLB, which would measure the page walks rather than what memory delivers. */
static float *huge_alloc(size_t bytes) {
    float *p = aligned_alloc((size_t)2 << 20, bytes);
    if (p) (void)madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

/* One sequential stream, four accumulators (a chain of adds is not the bound). */
__attribute__((target("avx512f"))) static float read1_avx512(const float *p, size_t n) {
    size_t m = n / 64 * 64;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < m; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
/* Four streams at once (the quarters of [p, p + n)): more pages in flight at a time. */
__attribute__((target("avx512f"))) static float read_avx512(const float *p, size_t n) {
    size_t q = n / 4 / 16 * 16;
    const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < q; i += 16) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p0 + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p1 + i));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p2 + i));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p3 + i));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
__attribute__((target("avx2"))) static float read_avx2(const float *p, size_t n) {
    size_t q = n / 4 / 8 * 8;
    const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < q; i += 8) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p0 + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p1 + i));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p2 + i));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p3 + i));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
static float read_scalar(const float *p, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

/* One slice of a pass, split over Ember's thread pool: the same threads, wake-up and split as
 * the products below, so that both are timed alike. */
typedef struct bw_slice {
    int kind; /* 0 read as one stream per thread, 1 triad, 2 read as four streams per thread */
    float *a;
    const float *b, *c;
    float sink[64];
} bw_slice;

static void bw_chunk(void *arg, int64_t begin, int64_t end) {
    bw_slice *j = arg;
    size_t n = (size_t)(end - begin);
    if (j->kind != 1) {
        const float *p = j->b + begin;
        float s = !__builtin_cpu_supports("avx512f") ? (__builtin_cpu_supports("avx2") ? read_avx2(p, n) : read_scalar(p, n))
                  : j->kind == 0                     ? read1_avx512(p, n)
                                                     : read_avx512(p, n);
        j->sink[(begin / 4096) % 64] += s;
    } else {
        float *restrict a = j->a + begin;
        const float *restrict b = j->b + begin, *restrict c = j->c + begin;
        for (size_t i = 0; i < n; i++) a[i] = b[i] + c[i];
    }
}

#define SLICE_FLOATS ((size_t)8 << 20) /* 32 MiB: as big as the 4096 x 4096 bf16 weight */

/* GB/s of the best slice over 3 passes through the buffers (512 MiB read, 3 x 128 MiB for the
 * triad: far past the L3), on em_get_num_threads() threads; the read's passes alternate its
 * two patterns (kind 0: 4 passes). A slice takes about as long as one product below, and both
 * take their best time, so a shared machine disturbs both alike. */
static double bandwidth(int kind) {
    static bw_slice j;
    size_t n = kind == 0 ? READ_BYTES / 4 : TRIAD_FLOATS;
    double best = 0;
    for (int pass = 0; pass < (kind == 0 ? 4 : 3); pass++)
        for (size_t off = 0; off + SLICE_FLOATS <= n; off += SLICE_FLOATS) {
            j.kind = kind == 0 && pass % 2 ? 2 : kind;
            double t0 = now();
            j.a = g_a + off;
            j.b = (kind == 0 ? g_a : g_b) + off;
            j.c = g_c + off;
            em__cpu_parallel_for((int64_t)SLICE_FLOATS, 1 << 16, bw_chunk, &j);
            double g = (double)SLICE_FLOATS * (kind == 1 ? 12.0 : 4.0) / (now() - t0) / 1e9;
            if (g > best) best = g;
        }
    return best;
}

/* ---- the products ---- */
typedef struct shape { const char *name; int64_t in, out; } shape;
static const shape SHAPES_7B[] = {
    {"qkvo 4096->4096", 4096, 4096},
    {"gate/up 4096->11008", 4096, 11008},
    {"down 11008->4096", 11008, 4096},
    {"head 4096->32000", 4096, 32000},
};
/* a Llama-3.2-1B-shaped model's (bench/run_lm.sh's 1B): rows of 4 KiB, one page each */
static const shape SHAPES_1B[] = {
    {"qo 2048->2048", 2048, 2048},
    {"kv 2048->512", 2048, 512},
    {"gate/up 2048->8192", 2048, 8192},
    {"down 8192->2048", 8192, 2048},
    {"head 2048->128256", 2048, 128256},
};
#define NSHAPES_MAX 5
static const shape *SHAPES = SHAPES_7B;
static int NSHAPES = (int)(sizeof SHAPES_7B / sizeof SHAPES_7B[0]);
#define MAX_COPIES 16
static const int GEMV_ROWS[] = {1, 4};
static const int GEMM_ROWS[] = {128, 512};

typedef struct weights { em_tensor *wt[MAX_COPIES]; int copies, next; } weights;

static void weights_make(weights *w, const shape *s) {
    size_t bytes = (size_t)(s->in * s->out) * 2;
    w->copies = (int)(((size_t)512 << 20) / bytes) + 1;
    if (w->copies > MAX_COPIES) w->copies = MAX_COPIES;
    w->next = 0;
    em_tensor *f = em_mul_scalar(em_randn(EM_SHAPE(s->out, s->in), EM_OPTS(.dtype = EM_F32)), 0.02);
    for (int i = 0; i < w->copies; i++) {
        em_tensor *b = em_to_dtype(f, EM_BF16);
        w->wt[i] = em_keep(em_transpose(b, 0, 1)); /* [in, out], column-major: nn.Linear's view */
    }
}

/* seconds of one product, the weight copies taken in turn */
static double product_time(weights *w, em_tensor *x, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        em_tensor *wt = w->wt[w->next];
        w->next = (w->next + 1) % w->copies;
        em_scope sc = em_scope_begin();
        double t0 = now();
        em_tensor *y = em_matmul(x, wt);
        double dt = now() - t0;
        if (!y) {
            fprintf(stderr, "bench_gemv: %s\n", em_last_error());
            exit(1);
        }
        em_scope_end(sc);
        if (dt < best) best = dt;
    }
    return best;
}

/* The bf16 GEMM peak (see the header): GFLOP/s of the best of three runs at each size, the
 * best size. */
typedef struct peak_case { em_tensor *a, *b; double flops; } peak_case;
#define PEAK_CASES 3

static void peak_make(peak_case *pc) {
    static const int64_t square[2] = {2048, 4096};
    for (int i = 0; i < 2; i++) {
        int64_t n = square[i];
        pc[i].a = em_keep(em_to_dtype(em_randn(EM_SHAPE(n, n), EM_OPTS(.dtype = EM_F32)), EM_BF16));
        pc[i].b = em_keep(em_to_dtype(em_randn(EM_SHAPE(n, n), EM_OPTS(.dtype = EM_F32)), EM_BF16));
        pc[i].flops = 2.0 * (double)n * (double)n * (double)n;
    }
    pc[2].a = em_keep(em_to_dtype(em_randn(EM_SHAPE(512, 2048), EM_OPTS(.dtype = EM_F32)), EM_BF16));
    pc[2].b = em_keep(em_transpose(em_to_dtype(em_randn(EM_SHAPE(8192, 2048), EM_OPTS(.dtype = EM_F32)), EM_BF16), 0, 1));
    pc[2].flops = 2.0 * 512 * 2048 * 8192;
}

static double gemm_peak(const peak_case *pc) {
    double best = 0;
    for (int i = 0; i < PEAK_CASES; i++)
        for (int r = 0; r < 3; r++) {
            em_scope sc = em_scope_begin();
            double t0 = now();
            em_tensor *y = em_matmul(pc[i].a, pc[i].b);
            double dt = now() - t0;
            if (!y) {
                fprintf(stderr, "bench_gemv: %s\n", em_last_error());
                exit(1);
            }
            em_scope_end(sc);
            if (pc[i].flops / dt / 1e9 > best) best = pc[i].flops / dt / 1e9;
        }
    return best;
}

#define MAX_ROUNDS 15

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    bool only_bw = argc > 2 && strcmp(argv[2], "--bandwidth-only") == 0;
    if (rounds < 1 || rounds > MAX_ROUNDS || (argc > 2 && !only_bw) || argc > 3) {
        fprintf(stderr, "usage: bench_gemv [rounds 1..%d] [--bandwidth-only]\n", MAX_ROUNDS);
        return 2;
    }
    const char *g = getenv("EMBER_BENCH_GEMM"), *model = getenv("EMBER_BENCH_SHAPES");
    bool gemm = !g || strcmp(g, "0") != 0;
    if (model && strcmp(model, "1b") == 0) {
        SHAPES = SHAPES_1B;
        NSHAPES = (int)(sizeof SHAPES_1B / sizeof SHAPES_1B[0]);
    } else if (model && *model && strcmp(model, "7b") != 0) {
        fprintf(stderr, "bench_gemv: EMBER_BENCH_SHAPES is \"7b\" (the default) or \"1b\", not \"%s\"\n", model);
        return 2;
    }
    em_manual_seed(1);
    if (!only_bw) printf("# bf16 matmul impl: %s\n", em_cpu_matmul_impl(EM_BF16));
    float *a = huge_alloc(READ_BYTES), *b = huge_alloc(TRIAD_FLOATS * 4), *c = huge_alloc(TRIAD_FLOATS * 4);
    if (!a || !b || !c) {
        fprintf(stderr, "bench_gemv: no memory for the bandwidth buffers\n");
        return 1;
    }
    for (size_t i = 0; i < READ_BYTES / 4; i++) a[i] = (float)(i & 1023);
    for (size_t i = 0; i < TRIAD_FLOATS; i++) { b[i] = 1; c[i] = 2; }
    g_a = a, g_b = b, g_c = c;

    static double read_gbs[2][MAX_ROUNDS], triad_gbs[2][MAX_ROUNDS], peak_gflops[2][MAX_ROUNDS];
    static double gemv[NSHAPES_MAX][2][2][MAX_ROUNDS], gemv_dnnl[NSHAPES_MAX][2][2][MAX_ROUNDS],
        gemm_t[NSHAPES_MAX][2][2][MAX_ROUNDS];
    setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
    /* oneDNN's column only where it has a bf16 kernel of its own: its float32 fallback converts
     * the whole weight per call, a hundred times slower than memory, and would take most of
     * the run */
    const char *impl = em_cpu_matmul_impl(EM_BF16);
    bool dnnl = strstr(impl, "oneDNN") != NULL && strstr(impl, "after conversion") == NULL;
    unsetenv("EMBER_CPU_LOWP_GEMM");
    weights w[NSHAPES_MAX];
    em_tensor *xv[NSHAPES_MAX][2], *xm[NSHAPES_MAX][2];
    int nshapes = only_bw ? 0 : NSHAPES;
    em_scope setup = em_scope_begin(); /* what the rounds use is kept */
    peak_case peak[PEAK_CASES];
    peak_make(peak);
    for (int s = 0; s < nshapes; s++) {
        weights_make(&w[s], &SHAPES[s]);
        for (int r = 0; r < 2; r++) {
            xv[s][r] = em_keep(em_to_dtype(em_randn(EM_SHAPE(GEMV_ROWS[r], SHAPES[s].in), EM_OPTS(.dtype = EM_F32)), EM_BF16));
            xm[s][r] = em_keep(em_to_dtype(em_randn(EM_SHAPE(GEMM_ROWS[r], SHAPES[s].in), EM_OPTS(.dtype = EM_F32)), EM_BF16));
        }
    }
    em_scope_end(setup);
    if (em_failed()) {
        fprintf(stderr, "bench_gemv: %s\n", em_last_error());
        return 1;
    }
    for (int round = 0; round < rounds; round++) {
        for (int t = 0; t < 2; t++) {
            int threads = (round + t) % 2 + 1; /* alternate which thread count goes first */
            em_set_num_threads(threads);
            read_gbs[threads - 1][round] = bandwidth(0);
            triad_gbs[threads - 1][round] = bandwidth(1);
            peak_gflops[threads - 1][round] = gemm_peak(peak);
            for (int s = 0; s < nshapes; s++) {
                for (int r = 0; r < 2; r++) {
                    product_time(&w[s], xv[s][r], 2); /* warm: a new shape may set up a kernel */
                    gemv[s][r][threads - 1][round] = product_time(&w[s], xv[s][r], 2 * w[s].copies);
                    if (dnnl) {
                        setenv("EMBER_CPU_LOWP_GEMM", "onednn", 1);
                        product_time(&w[s], xv[s][r], 2);
                        gemv_dnnl[s][r][threads - 1][round] = product_time(&w[s], xv[s][r], 2 * w[s].copies);
                        unsetenv("EMBER_CPU_LOWP_GEMM");
                    }
                    if (gemm) gemm_t[s][r][threads - 1][round] = product_time(&w[s], xm[s][r], 3);
                }
            }
        }
        if (!only_bw) fprintf(stderr, "round %d done\n", round + 1);
    }
    printf("# medians of %d alternated rounds\n", rounds);
    printf("%-22s %5s %12s %12s\n", "measure", "rows", "1 thread", "2 threads");
    printf("%-22s %5s %12.2f %12.2f\n", "read_gbs", "-", median(read_gbs[0], rounds), median(read_gbs[1], rounds));
    printf("%-22s %5s %12.2f %12.2f\n", "triad_gbs", "-", median(triad_gbs[0], rounds), median(triad_gbs[1], rounds));
    printf("%-22s %5s %12.1f %12.1f\n", "gemm_peak_gflops", "-", median(peak_gflops[0], rounds),
           median(peak_gflops[1], rounds));
    for (int s = 0; s < nshapes; s++)
        for (int r = 0; r < 2; r++) {
            double bytes = (double)(SHAPES[s].in * SHAPES[s].out) * 2;
            double t1 = median(gemv[s][r][0], rounds), t2 = median(gemv[s][r][1], rounds);
            printf("gemv_gbs %-13s %5d %12.2f %12.2f\n", SHAPES[s].name, GEMV_ROWS[r], bytes / t1 / 1e9, bytes / t2 / 1e9);
            if (dnnl) {
                t1 = median(gemv_dnnl[s][r][0], rounds), t2 = median(gemv_dnnl[s][r][1], rounds);
                printf("onednn_gbs %-11s %5d %12.2f %12.2f\n", SHAPES[s].name, GEMV_ROWS[r], bytes / t1 / 1e9,
                       bytes / t2 / 1e9);
            }
        }
    if (gemm)
        for (int s = 0; s < nshapes; s++)
            for (int r = 0; r < 2; r++) {
                double flops = 2.0 * (double)(SHAPES[s].in * SHAPES[s].out) * GEMM_ROWS[r];
                double t1 = median(gemm_t[s][r][0], rounds), t2 = median(gemm_t[s][r][1], rounds);
                printf("gemm_gflops %-10s %5d %12.1f %12.1f\n", SHAPES[s].name, GEMM_ROWS[r], flops / t1 / 1e9,
                       flops / t2 / 1e9);
            }
    free(a);
    free(b);
    free(c);
    return 0;
}
