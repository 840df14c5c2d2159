/* Mixed-precision benchmark, Ember's side; bench/run_amp.sh runs it with the PyTorch
 * peer (bench/amp_torch.py) and prints the comparison. Three modes, each printing key=value lines:
 *
 *   bench_amp_matmul peaks
 *     the CPU's features, what runs bf16 matmul (em_cpu_matmul_impl), the one-thread FP32 peak
 *     from the widest FMA unit (16-wide AVX-512 chains, else 8-wide AVX2; as bench_fma_peak)
 *     and the bf16 peaks measured by microkernels: AMX (TDPBF16PS into four tiles, operands
 *     in tiles: the tile unit's rate) and AVX512-BF16 (VDPBF16PS chains), where the CPU has them.
 *   bench_amp_matmul matmul THREADS SIZE...
 *     square matmul GFLOP/s in float32 and bf16 (em_matmul; best of several runs).
 *   bench_amp_matmul mlp THREADS DTYPE BATCH STEPS D0,D1,...,Dn
 *     a training step of Linear(D0,D1), ReLU, ..., Linear(Dn-1,Dn), cross-entropy, Adam
 *     (lr 1e-3) on one fixed random batch: DTYPE f32, or bf16 as autocast does it by hand:
 *     float32 master weights cast to bf16 in the forward (the casts are recorded, so the
 *     float32 weights get float32 gradients), bf16 linear layers, the loss in float32.
 *     Prints the median step time in ms after two warm-up steps, and the median and least
 *     CPU time of a step (all threads; the steadier number while other programs load the
 *     machine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BENCH_X86 1
#else
#define BENCH_X86 0
#endif

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time of the whole process (all threads): on a shared machine, what one step cost
 * without the time other programs held the cores */
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

/* ---- peaks ---- */
#if BENCH_X86
#define CHAINS 12
#define ITERS 1000000L

__attribute__((target("avx512f"))) static float fma512(float seed) {
    __m512 acc[CHAINS], m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    }
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma256(float seed) {
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

/* VDPBF16PS: 16 lanes x 2 products, each a multiply-add: 64 flops per instruction */
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16(float seed) {
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a80); /* 1, ~1e-3 */
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    }
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

/* AMX: tiles 0-3 accumulate C (16x16 f32), 4-5 hold A (16 rows x 32 bf16), 6-7 B (16 rows of
 * 16 bf16 pairs); each TDPBF16PS is 16*16*32 multiply-adds = 16384 flops */
typedef struct __attribute__((packed)) tilecfg {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} tilecfg;
#define AMX_ITERS 200000L

__attribute__((target("amx-tile,amx-bf16"))) static float amx_run(void) {
    static unsigned short A[16 * 32], Bm[16 * 32];
    static float C[16 * 16];
    for (int i = 0; i < 16 * 32; i++) { A[i] = 0x3f80; Bm[i] = 0x3a80; }
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, A, 64);
    _tile_loadd(5, A, 64);
    _tile_loadd(6, Bm, 64);
    _tile_loadd(7, Bm, 64);
    for (long i = 0; i < AMX_ITERS; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, C, 64);
    _tile_release();
    return C[0];
}

/* Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM) */
static bool amx_permitted(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#endif

typedef float (*chain_fn)(float);

static double best_gflops(chain_fn fn, double flops, float *sink) {
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        *sink += fn((float)rep);
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

static int peaks(void) {
    const char *f = em_cpu_features();
    printf("cpu_features=%s\n", f);
    printf("bf16_matmul=%s\n", em_cpu_matmul_impl(EM_BF16));
    printf("f16_matmul=%s\n", em_cpu_matmul_impl(EM_F16));
    float sink = 0;
#if BENCH_X86
    __builtin_cpu_init();
    int lanes = em_cpu_fma_lanes();
    if (lanes == 16)
        printf("fp32_peak_gflops=%.1f\nfp32_peak_isa=avx512 (16-wide FMA)\n",
               best_gflops(fma512, (double)ITERS * CHAINS * 16 * 2, &sink));
    else if (lanes == 8)
        printf("fp32_peak_gflops=%.1f\nfp32_peak_isa=avx2 (8-wide FMA)\n",
               best_gflops(fma256, (double)ITERS * CHAINS * 8 * 2, &sink));
    if (strstr(f, "avx512_bf16"))
        printf("avx512bf16_peak_gflops=%.1f\n", best_gflops(dpbf16, (double)ITERS * CHAINS * 64, &sink));
    if (strstr(f, "amx_bf16")) {
        if (amx_permitted()) {
            double best = 0;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = now();
                sink += amx_run();
                double g = (double)AMX_ITERS * 4 * 16384 / (now() - t0) / 1e9;
                if (g > best) best = g;
            }
            printf("amx_bf16_peak_gflops=%.1f\n", best);
        } else {
            printf("amx_bf16_peak_gflops=- (Linux refused the AMX tile state)\n");
        }
    }
#endif
    printf("sink=%g\n", (double)sink);
    return 0;
}

/* ---- matmul ---- */
static int matmul(int threads, int argc, char **argv) {
    em_set_num_threads(threads);
    em_manual_seed(1);
    for (int i = 0; i < argc; i++) {
        int64_t n = atoll(argv[i]);
        if (n <= 0) {
            fprintf(stderr, "bench_amp_matmul: size '%s' is not a positive integer\n", argv[i]);
            return 2;
        }
        em_dtype dts[2] = {EM_F32, EM_BF16};
        for (int d = 0; d < 2; d++) {
            em_scope s = em_scope_begin();
            em_tensor *a = em_to_dtype(em_randn(EM_SHAPE(n, n), EM_OPTS(0)), dts[d]);
            em_tensor *b = em_to_dtype(em_randn(EM_SHAPE(n, n), EM_OPTS(0)), dts[d]);
            double flops = 2.0 * (double)n * (double)n * (double)n, best = 0;
            int reps = n >= 4096 ? 3 : n >= 2048 ? 5 : 10;
            for (int r = 0; r < reps + 1; r++) {
                em_scope s2 = em_scope_begin();
                double t0 = now();
                em_tensor *c = em_matmul(a, b);
                double t = now() - t0;
                if (!c) {
                    fprintf(stderr, "bench_amp_matmul: %s\n", em_last_error());
                    em_scope_end(s2);
                    em_scope_end(s);
                    return 1;
                }
                if (r > 0 && flops / t / 1e9 > best) best = flops / t / 1e9; /* run 0 creates oneDNN's kernel */
                em_scope_end(s2);
            }
            printf("matmul dtype=%s n=%lld threads=%d gflops=%.1f\n", em_dtype_name(dts[d]), (long long)n, threads, best);
            em_scope_end(s);
        }
    }
    return 0;
}

/* ---- MLP training step ---- */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int mlp(int threads, const char *dtype, int64_t batch, int steps, const char *dims_arg) {
    int64_t dims[16];
    int nd = 0;
    for (const char *p = dims_arg; *p && nd < 16;) {
        char *end;
        dims[nd++] = strtoll(p, &end, 10);
        if (end == p || dims[nd - 1] <= 0) {
            fprintf(stderr, "bench_amp_matmul: dims '%s': expected positive integers separated by commas\n", dims_arg);
            return 2;
        }
        p = *end == ',' ? end + 1 : end;
    }
    bool bf16 = strcmp(dtype, "bf16") == 0;
    if (nd < 2 || (!bf16 && strcmp(dtype, "f32") != 0) || batch <= 0 || steps <= 0) {
        fprintf(stderr, "bench_amp_matmul: mlp expects THREADS f32|bf16 BATCH STEPS D0,D1,...\n");
        return 2;
    }
    em_set_num_threads(threads);
    em_manual_seed(0);
    em_module *seq = em_nn_sequential_n(0, NULL);
    for (int i = 0; i + 1 < nd; i++) em_sequential_append(seq, em_nn_linear(dims[i], dims[i + 1]));
    em_optimizer *opt = em_adam(seq, 1e-3);
    em_named_tensor p[32];
    int np = em_module_parameters(seq, p, 32);
    em_tensor *x = em_randn(EM_SHAPE(batch, dims[0]), EM_OPTS(0));
    em_tensor *y = em_randint(0, dims[nd - 1], EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64));
    if (!opt || !x || !y || np != 2 * (nd - 1)) {
        fprintf(stderr, "bench_amp_matmul: %s\n", em_last_error());
        return 1;
    }
    double *ms = malloc(sizeof(double) * (size_t)steps), *cpu = malloc(sizeof(double) * (size_t)steps);
    double loss = 0;
    for (int s = 0; s < steps + 2; s++) {
        double t0 = now(), c0 = cpu_now();
        em_scope sc = em_scope_begin();
        em_zero_grad(opt);
        em_tensor *h = bf16 ? em_to_dtype(x, EM_BF16) : x;
        for (int l = 0; l + 1 < nd; l++) {
            em_tensor *w = p[2 * l].tensor, *b = p[2 * l + 1].tensor;
            if (bf16) { w = em_to_dtype(w, EM_BF16); b = em_to_dtype(b, EM_BF16); }
            h = em_addmm(b, h, em_transpose(w, 0, 1), 1.0, 1.0); /* what Linear runs */
            if (l + 2 < nd) h = em_relu(h);
        }
        em_tensor *lt = em_cross_entropy(bf16 ? em_to_dtype(h, EM_F32) : h, y, 0.0);
        em_status st = em_backward(lt);
        if (st == EM_OK) st = em_step(opt);
        if (st == EM_OK && s == steps + 1) loss = em_item(lt);
        em_scope_end(sc);
        if (st != EM_OK) {
            fprintf(stderr, "bench_amp_matmul: step %d: %s\n", s, em_last_error());
            return 1;
        }
        if (s >= 2) {
            ms[s - 2] = (now() - t0) * 1e3;
            cpu[s - 2] = (cpu_now() - c0) * 1e3;
        }
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    qsort(cpu, (size_t)steps, sizeof *cpu, cmp_double);
    char dd[128] = "";
    for (int i = 0; i < nd; i++) snprintf(dd + strlen(dd), sizeof dd - strlen(dd), "%s%lld", i ? "-" : "", (long long)dims[i]);
    printf("mlp dims=%s batch=%lld dtype=%s threads=%d step_ms=%.2f loss=%.4f cpu_ms=%.2f min_cpu_ms=%.2f\n", dd,
           (long long)batch, dtype, threads, ms[steps / 2], loss, cpu[steps / 2], cpu[0]);
    free(ms);
    free(cpu);
    em_optim_free(opt);
    em_module_free(seq);
    em_release(x);
    em_release(y);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "peaks") == 0) return peaks();
    if (argc >= 4 && strcmp(argv[1], "matmul") == 0) return matmul(atoi(argv[2]), argc - 3, argv + 3);
    if (argc == 7 && strcmp(argv[1], "mlp") == 0)
        return mlp(atoi(argv[2]), argv[3], atoll(argv[4]), atoi(argv[5]), argv[6]);
    fprintf(stderr, "usage: bench_amp_matmul peaks | matmul THREADS SIZE... | mlp THREADS f32|bf16 BATCH STEPS D0,D1,...\n");
    return 2;
}
