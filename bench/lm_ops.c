/* The language-model ops on the CPU, each fused kernel against the composition of public ops
 * that it replaces (transformers' own ops), at Llama-3.2-1B's sizes: hidden 2048, 32 query
 * heads and 8 key/value heads of 64 (and 16 / 4 heads of 128), intermediate 8192; T = 1
 * (decoding, a cache of 512 or 2048) and T = 512 (prefill); float32 and bfloat16; the threads
 * em_set_num_threads gives (1 and 2 by default). Wall time, best of the repeats, in us.
 * Usage: bench_lm_ops [threads...] */
#include <ember/ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef em_tensor *(*op_fn)(em_tensor *const *in, const void *arg);

/* best time of fn over reps runs (each in its own scope), and of its backward when g given */
static double best(op_fn fn, em_tensor *const *in, const void *arg, int reps, em_tensor *g, double *bwd) {
    double b = 1e30, bb = 1e30;
    for (int r = 0; r < reps; r++) {
        em_scope s = em_scope_begin();
        double t0 = now();
        em_tensor *y = fn(in, arg);
        double t1 = now();
        if (g && y) {
            em_backward_with(y, g, false);
            double t2 = now();
            bb = t2 - t1 < bb ? t2 - t1 : bb;
        }
        b = t1 - t0 < b ? t1 - t0 : b;
        em_scope_end(s);
    }
    if (em_failed()) {
        printf("  error: %s\n", em_last_error());
        em_clear_error();
    }
    if (bwd) *bwd = 1e6 * bb;
    return 1e6 * b;
}

/* ---- the ops, fused and as transformers composes them ---- */
static em_tensor *rms_fused(em_tensor *const *in, const void *arg) {
    (void)arg;
    return em_rms_norm(in[0], EM_SHAPE(em_size(in[0], -1)), in[1], 1e-5);
}
static em_tensor *rms_composed(em_tensor *const *in, const void *arg) { /* LlamaRMSNorm.forward */
    (void)arg;
    em_dtype dt = em_dtype_of(in[0]);
    em_tensor *x = dt == EM_F32 ? in[0] : em_to_dtype(in[0], EM_F32);
    em_tensor *var = em_mean(em_mul(x, x), EM_DIMS(-1), true);
    em_tensor *y = em_mul(x, em_pow_scalar(em_add_scalar(var, 1e-5), -0.5));
    return em_mul(in[1], dt == EM_F32 ? y : em_to_dtype(y, dt));
}
static em_tensor *swiglu_fused(em_tensor *const *in, const void *arg) { (void)arg; return em_swiglu(in[0], in[1]); }
static em_tensor *swiglu_composed(em_tensor *const *in, const void *arg) {
    (void)arg;
    return em_mul(em_mul(in[0], em_sigmoid(in[0])), in[1]);
}
static em_tensor *rope_fused(em_tensor *const *in, const void *arg) { (void)arg; return em_rope(in[0], in[1], in[2]); }
static em_tensor *rope_composed(em_tensor *const *in, const void *arg) { /* apply_rotary_pos_emb */
    (void)arg;
    int64_t h = em_size(in[0], -1) / 2;
    em_tensor *parts[2] = {em_neg(em_narrow(in[0], -1, h, h)), em_narrow(in[0], -1, 0, h)};
    return em_add(em_mul(in[0], in[1]), em_mul(em_cat(parts, 2, -1), in[2]));
}
static em_tensor *attn(em_tensor *const *in, const void *arg) { return em_attention(in[0], in[1], in[2], arg); }

static void row(const char *op, const char *shape, em_dtype dt, int threads, double fused, double composed,
                double fused_bwd, double composed_bwd) {
    printf("%-10s %-34s %-9s %d   %9.1f %9.1f  %5.2fx", op, shape, em_dtype_name(dt), threads, fused, composed,
           composed / fused);
    if (fused_bwd > 0) printf("   bwd %9.1f %9.1f  %5.2fx", fused_bwd, composed_bwd, composed_bwd / fused_bwd);
    printf("\n");
}

static void elementwise_ops(em_dtype dt, int threads) {
    em_opts o = EM_OPTS(.dtype = dt);
    static const int64_t Ts[2] = {1, 512};
    for (int ti = 0; ti < 2; ti++) {
        int64_t T = Ts[ti];
        int reps = T == 1 ? 2000 : 30;
        em_scope s = em_scope_begin();
        char shape[64];
        em_tensor *x = em_randn(EM_SHAPE(T, 2048), o), *w = em_randn(EM_SHAPE(2048), o);
        double f = best(rms_fused, (em_tensor *[]){x, w}, NULL, reps, NULL, NULL);
        double c = best(rms_composed, (em_tensor *[]){x, w}, NULL, reps, NULL, NULL);
        snprintf(shape, sizeof shape, "[%lld, 2048]", (long long)T);
        row("rms_norm", shape, dt, threads, f, c, 0, 0);
        em_tensor *g = em_randn(EM_SHAPE(T, 8192), o), *u = em_randn(EM_SHAPE(T, 8192), o);
        double fb = 0, cb = 0;
        f = best(swiglu_fused, (em_tensor *[]){g, u}, NULL, reps, NULL, NULL);
        c = best(swiglu_composed, (em_tensor *[]){g, u}, NULL, reps, NULL, NULL);
        if (dt == EM_F32) { /* training: the gradients of gate and up */
            em_tensor *gl = em_clone(g), *ul = em_clone(u), *gy = em_randn(EM_SHAPE(T, 8192), o);
            em_set_requires_grad(gl, true);
            em_set_requires_grad(ul, true);
            best(swiglu_fused, (em_tensor *[]){gl, ul}, NULL, reps, gy, &fb);
            best(swiglu_composed, (em_tensor *[]){gl, ul}, NULL, reps, gy, &cb);
        }
        snprintf(shape, sizeof shape, "[%lld, 8192]", (long long)T);
        row("swiglu", shape, dt, threads, f, c, fb, cb);
        /* q [1, 32, T, 64] as HF has it (a transposed [1, T, 32, 64] projection), tables [T, 64] */
        em_tensor *q = em_transpose(em_randn(EM_SHAPE(1, T, 32, 64), o), 1, 2);
        em_tensor *cs = em_randn(EM_SHAPE(T, 64), o), *sn = em_randn(EM_SHAPE(T, 64), o);
        f = best(rope_fused, (em_tensor *[]){q, cs, sn}, NULL, reps, NULL, NULL);
        c = best(rope_composed, (em_tensor *[]){q, cs, sn}, NULL, reps, NULL, NULL);
        snprintf(shape, sizeof shape, "q [1, 32, %lld, 64]", (long long)T);
        row("rope", shape, dt, threads, f, c, 0, 0);
        em_scope_end(s);
    }
}

static void attention_ops(em_dtype dt, int threads) {
    em_opts o = EM_OPTS(.dtype = dt);
    static const struct { int64_t Hq, Hkv, D, L, S; } cases[] = {
        {32, 8, 64, 1, 512}, {32, 8, 64, 1, 2048}, {16, 4, 128, 1, 2048}, {32, 8, 64, 512, 512}, {16, 4, 128, 512, 512},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t Hq = cases[ci].Hq, Hkv = cases[ci].Hkv, D = cases[ci].D, L = cases[ci].L, S = cases[ci].S;
        int reps = L == 1 ? 200 : 5;
        em_scope s = em_scope_begin();
        /* the cache: [1, Hkv, S, D]; the queries at its end */
        em_tensor *q = em_transpose(em_randn(EM_SHAPE(1, L, Hq, D), o), 1, 2);
        em_tensor *k = em_randn(EM_SHAPE(1, Hkv, S, D), o), *v = em_randn(EM_SHAPE(1, Hkv, S, D), o);
        em_attention_opts a = {.causal = true, .past = S - L};
        double f = best(attn, (em_tensor *[]){q, k, v}, &a, reps, NULL, NULL);
        setenv("EMBER_ATTENTION", "composed", 1);
        double c = best(attn, (em_tensor *[]){q, k, v}, &a, reps, NULL, NULL);
        unsetenv("EMBER_ATTENTION");
        double fb = 0, cb = 0;
        if (dt == EM_F32 && L > 1) { /* training: forward and backward */
            em_tensor *ql = em_clone(q), *kl = em_clone(k), *vl = em_clone(v), *gy = em_randn(EM_SHAPE(1, Hq, L, D), o);
            em_set_requires_grad(ql, true);
            em_set_requires_grad(kl, true);
            em_set_requires_grad(vl, true);
            best(attn, (em_tensor *[]){ql, kl, vl}, &a, reps, gy, &fb);
            setenv("EMBER_ATTENTION", "composed", 1);
            best(attn, (em_tensor *[]){ql, kl, vl}, &a, reps, gy, &cb);
            unsetenv("EMBER_ATTENTION");
        }
        char shape[64];
        snprintf(shape, sizeof shape, "%lld/%lld heads of %lld, L %lld, S %lld", (long long)Hq, (long long)Hkv,
                 (long long)D, (long long)L, (long long)S);
        row("attention", shape, dt, threads, f, c, fb, cb);
        em_scope_end(s);
    }
    /* a decoding step's cache append: em_copy_ into a narrow view of [1, 8, 2048, 64] */
    em_scope s = em_scope_begin();
    em_tensor *cache = em_zeros(EM_SHAPE(1, 8, 2048, 64), o), *kn = em_randn(EM_SHAPE(1, 8, 1, 64), o);
    double b = 1e30;
    for (int r = 0; r < 2000; r++) {
        double t0 = now();
        em_copy_(em_narrow(cache, 2, r % 2048, 1), kn);
        double t1 = now();
        b = t1 - t0 < b ? t1 - t0 : b;
    }
    printf("%-10s %-34s %-9s %d   %9.1f  (em_copy_ into em_narrow of the cache)\n", "kv append", "[1, 8, 1, 64]",
           em_dtype_name(dt), threads, 1e6 * b);
    em_scope_end(s);
}

int main(int argc, char **argv) {
    int threads[8] = {1, 2}, nt = 2;
    if (argc > 1) {
        nt = 0;
        for (int i = 1; i < argc && nt < 8; i++) threads[nt++] = atoi(argv[i]);
    }
    em_manual_seed(1);
    printf("%-10s %-34s %-9s %s   %9s %9s  %6s\n", "op", "shape", "dtype", "thr", "fused us", "composed", "gain");
    for (int t = 0; t < nt; t++) {
        em_set_num_threads(threads[t]);
        for (int d = 0; d < 2; d++) {
            em_dtype dt = d ? EM_BF16 : EM_F32;
            elementwise_ops(dt, threads[t]);
            attention_ops(dt, threads[t]);
        }
    }
    return 0;
}
