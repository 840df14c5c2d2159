/* The language models' ops (em_rms_norm, em_swiglu, em_rope, em_rope_tables, em_attention) on
 * every device: each kernel against a reference computed here on the host with the roundings
 * PyTorch's composition makes (float32, float64, and bfloat16/float16 within their rounding),
 * the gradients against central differences in float64 and the fused float32 backward against
 * the composition, grouped-query attention against repeat_kv and the composed scaled dot
 * product (decoding with a cache, prefill, key padding, a causal offset), a cache whose unused
 * rows hold NaN, and bad arguments. PyTorch's and transformers' own numbers are replayed by
 * test_lm_golden.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"

static em_device g_devs[4];
static int g_ndev;

static void fill_devices(void) {
    g_devs[g_ndev++] = EM_DEVICE_CPU;
    if (em_device_count(EM_OPENCL) > 0) g_devs[g_ndev++] = EM_DEVICE(EM_OPENCL, 0);
    if (em_device_count(EM_CUDA) > 0) g_devs[g_ndev++] = EM_DEVICE(EM_CUDA, 0);
}

/* t's values as doubles (caller frees) */
static double *host(em_tensor *t) {
    int64_t n = t ? em_numel(t) : 0;
    double *x = calloc((size_t)(n + 1), sizeof *x);
    if (t && x && em_copy_to_host(em_to_dtype(em_cpu(t), EM_F64), x, (size_t)n * sizeof *x) != EM_OK) {
        free(x);
        return NULL;
    }
    return x;
}

/* v rounded to dt as the device stores it */
static double rnd(em_dtype dt, double v) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_BF16: return test_bf16_to_f32(test_f32_to_bf16((float)v));
    case EM_F16: return em_f16_to_f32(em_f32_to_f16((float)v));
    default: return v;
    }
}

/* max over i of |got - want| / (atol + rtol |want|), printing the worst */
static double worst(const char *what, const double *got, const double *want, int64_t n, double atol, double rtol) {
    double w = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (atol + rtol * fabs(want[i]));
        if (!(e <= w)) w = e, at = i;
    }
    if (!(w <= 1)) fprintf(stderr, "  %s: element %lld is %.9g, expected %.9g\n", what, (long long)at, got[at], want[at]);
    return w;
}

static em_tensor *randn(em_shape s, em_dtype dt, em_device d) {
    return em_to(em_randn(s, EM_OPTS(.dtype = dt)), d);
}

static const em_dtype k_dtypes[] = {EM_F32, EM_BF16, EM_F16, EM_F64};

/* ---- RMSNorm: y = round(round(x * r) * w) against the host ---- */
static void test_rms_norm(void) {
    for (int di = 0; di < g_ndev; di++)
        for (int ti = 0; ti < 4; ti++) {
            em_device d = g_devs[di];
            em_dtype dt = k_dtypes[ti];
            em_scope s = em_scope_begin();
            em_manual_seed(11);
            int64_t rows = 6, n = 67;
            em_tensor *x = randn(EM_SHAPE(2, 3, n), dt, d), *w = randn(EM_SHAPE(n), dt, d);
            for (int hw = 0; hw < 2; hw++) {
                em_tensor *y = em_rms_norm(x, EM_SHAPE(n), hw ? w : NULL, 1e-6);
                if (!y && em_last_status() == EM_ERR_NOT_SUPPORTED && dt == EM_F64) { /* a device without f64 */
                    em_clear_error();
                    continue;
                }
                CHECK(y && em_dtype_of(y) == dt);
                double *xh = host(x), *wh = host(w), *yh = host(y), *ref = malloc(sizeof(double) * (size_t)(rows * n));
                for (int64_t r = 0; r < rows; r++) {
                    double ss = 0;
                    for (int64_t k = 0; k < n; k++) ss += xh[r * n + k] * xh[r * n + k];
                    double inv = dt == EM_F64 ? 1 / sqrt(ss / n + 1e-6) : (float)(1 / sqrt(ss / n + 1e-6));
                    for (int64_t k = 0; k < n; k++) {
                        double t = dt == EM_F64 ? xh[r * n + k] * inv : (float)(xh[r * n + k] * inv);
                        if (dt != EM_F32 && dt != EM_F64) t = rnd(dt, t);
                        ref[r * n + k] = rnd(dt, hw ? t * wh[k] : t);
                    }
                }
                /* bf16/f16: the float32 statistics may differ by an ulp of float, which can move
                 * a rounding by one unit of the dtype */
                double atol = dt == EM_F64 ? 1e-14 : dt == EM_F32 ? 1e-6 : 0;
                double rtol = dt == EM_F64 ? 1e-13 : dt == EM_F32 ? 1e-6 : dt == EM_BF16 ? 1.0 / 128 : 1.0 / 1024;
                char what[96];
                snprintf(what, sizeof what, "rms_norm %s %s w=%d", em_device_str(d).s, em_dtype_name(dt), hw);
                CHECK(worst(what, yh, ref, rows * n, atol + 1e-30, rtol) <= 1);
                free(xh), free(wh), free(yh), free(ref);
            }
            em_scope_end(s);
        }
}

/* ---- SwiGLU: round(round(silu(g)) * u) ---- */
static void test_swiglu(void) {
    for (int di = 0; di < g_ndev; di++)
        for (int ti = 0; ti < 4; ti++) {
            em_device d = g_devs[di];
            em_dtype dt = k_dtypes[ti];
            em_scope s = em_scope_begin();
            em_manual_seed(12);
            int64_t n = 3 * 1037;
            em_tensor *a = em_mul_scalar(randn(EM_SHAPE(3, 1037), dt, d), 3.0), *b = randn(EM_SHAPE(3, 1037), dt, d);
            em_tensor *y = em_swiglu(a, b);
            if (!y && dt == EM_F64 && em_last_status() == EM_ERR_NOT_SUPPORTED) {
                em_clear_error();
                em_scope_end(s);
                continue;
            }
            double *ah = host(a), *bh = host(b), *yh = host(y), *ref = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) ref[i] = rnd(dt, rnd(dt, ah[i] / (1 + exp(-ah[i]))) * bh[i]);
            double rtol = dt == EM_F64 ? 1e-13 : dt == EM_F32 ? 4e-7 : dt == EM_BF16 ? 1.0 / 128 : 1.0 / 1024;
            char what[96];
            snprintf(what, sizeof what, "swiglu %s %s", em_device_str(d).s, em_dtype_name(dt));
            CHECK(worst(what, yh, ref, n, 1e-30, rtol) <= 1);
            free(ah), free(bh), free(yh), free(ref);
            em_scope_end(s);
        }
}

/* ---- rotary embedding: strided x, [T, D] and [B, T, D] tables ---- */
static void rope_ref(em_dtype dt, const double *x, const double *c, const double *sn, double *y, int64_t B, int64_t H,
                     int64_t T, int64_t D, bool per_batch, bool backward) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t t = 0; t < T; t++) {
                const double *xr = x + ((b * H + hh) * T + t) * D, *cr = c + ((per_batch ? b * T : 0) + t) * D,
                             *sr = sn + ((per_batch ? b * T : 0) + t) * D;
                double *yr = y + ((b * H + hh) * T + t) * D;
                for (int64_t k = 0; k < h; k++) {
                    double p1 = rnd(dt, xr[k] * cr[k]), p2 = rnd(dt, xr[k + h] * cr[k + h]);
                    double q1 = backward ? rnd(dt, xr[k + h] * sr[k + h]) : -rnd(dt, xr[k + h] * sr[k]);
                    double q2 = backward ? -rnd(dt, xr[k] * sr[k]) : rnd(dt, xr[k] * sr[k + h]);
                    yr[k] = rnd(dt, p1 + q1);
                    yr[k + h] = rnd(dt, p2 + q2);
                }
            }
}

static void test_rope(void) {
    for (int di = 0; di < g_ndev; di++)
        for (int ti = 0; ti < 4; ti++)
            for (int pb = 0; pb < 2; pb++) {
                em_device d = g_devs[di];
                em_dtype dt = k_dtypes[ti];
                em_scope s = em_scope_begin();
                em_manual_seed(13);
                int64_t B = 2, H = 3, T = 5, D = 8;
                /* x as HF has it: [B, T, H, D] projections seen as [B, H, T, D] */
                em_tensor *x = em_transpose(randn(EM_SHAPE(B, T, H, D), dt, d), 1, 2);
                em_shape ts = pb ? EM_SHAPE(B, T, D) : EM_SHAPE(T, D);
                em_tensor *c = randn(ts, dt, d), *sn = randn(ts, dt, d);
                em_tensor *y = em_rope(x, c, sn);
                if (!y && dt == EM_F64 && em_last_status() == EM_ERR_NOT_SUPPORTED) {
                    em_clear_error();
                    em_scope_end(s);
                    continue;
                }
                CHECK(y && em_is_contiguous(y));
                int64_t n = B * H * T * D;
                double *xh = host(em_contiguous(x)), *ch = host(c), *sh = host(sn), *yh = host(y);
                double *ref = malloc(sizeof(double) * (size_t)n);
                rope_ref(dt, xh, ch, sh, ref, B, H, T, D, pb, false);
                char what[96];
                snprintf(what, sizeof what, "rope %s %s per_batch=%d", em_device_str(d).s, em_dtype_name(dt), pb);
                CHECK(worst(what, yh, ref, n, 1e-30, dt == EM_F64 ? 1e-15 : 1e-7) <= 1);
                free(xh), free(ch), free(sh), free(yh), free(ref);
                em_scope_end(s);
            }
}

/* ---- gradients: float64 central differences of sum(f(inputs) * w) ---- */
typedef em_tensor *(*fn3)(em_tensor *const *in);

static double loss_of(fn3 f, em_tensor *const *in, em_tensor *w) {
    return em_item(em_sum(em_mul(f(in), w), EM_ALL_DIMS, false));
}

/* checks the gradient of each input in `which` (bits) against central differences */
static void grad_check(const char *name, fn3 f, em_tensor **in, int n, unsigned which, double tol) {
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++)
        if (which >> i & 1) em_set_requires_grad(in[i], true);
    em_tensor *y = f(in);
    CHECK(y != NULL);
    if (!y) {
        fprintf(stderr, "  %s: %s\n", name, em_last_error());
        em_clear_error();
        em_scope_end(s);
        return;
    }
    em_tensor *w = em_randn(em_shape_of(y), EM_OPTS(.dtype = EM_F64));
    CHECK_OK(em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)));
    em_grad_mode gm = em_no_grad_begin();
    for (int i = 0; i < n; i++) {
        if (!(which >> i & 1)) continue;
        double *p = em_data_ptr(in[i]);
        const double *gr = em_grad(in[i]) ? em_data_ptr(em_grad(in[i])) : NULL;
        CHECK(gr != NULL);
        if (!gr) continue;
        double bad = 0;
        for (int64_t k = 0; k < em_numel(in[i]); k++) {
            double keep = p[k], hstep = 1e-6;
            p[k] = keep + hstep;
            double lp = loss_of(f, in, w);
            p[k] = keep - hstep;
            double lm = loss_of(f, in, w);
            p[k] = keep;
            double fd = (lp - lm) / (2 * hstep), e = fabs(fd - gr[k]) / (1e-7 + 1e-6 * fabs(fd));
            if (e > bad) bad = e;
            if (e > tol) fprintf(stderr, "  %s: input %d element %lld: gradient %.10g, differences %.10g\n", name, i,
                                 (long long)k, gr[k], fd);
        }
        CHECK(bad <= tol);
    }
    em_no_grad_end(gm);
    em_scope_end(s);
}

static em_tensor *f_rms(em_tensor *const *in) { return em_rms_norm(in[0], EM_SHAPE(7), in[1], 1e-5); }
static em_tensor *f_rms_now(em_tensor *const *in) { return em_rms_norm(in[0], EM_SHAPE(3, 7), NULL, 1e-5); }
static em_tensor *f_swiglu(em_tensor *const *in) { return em_swiglu(in[0], in[1]); }
static em_tensor *f_rope(em_tensor *const *in) { return em_rope(in[0], in[1], in[2]); }
static em_tensor *f_attn(em_tensor *const *in) {
    em_attention_opts o = {.causal = true, .past = 2, .key_mask = in[3]};
    return em_attention(in[0], in[1], in[2], &o);
}

static void test_gradients(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(14);
    em_opts o = EM_OPTS(.dtype = EM_F64);
    em_tensor *x = em_randn(EM_SHAPE(2, 3, 7), o), *w = em_randn(EM_SHAPE(7), o);
    grad_check("rms_norm", f_rms, (em_tensor *[]){x, w}, 2, 3, 1);
    grad_check("rms_norm (no weight, 2 dims)", f_rms_now, (em_tensor *[]){em_randn(EM_SHAPE(2, 3, 7), o)}, 1, 1, 1);
    grad_check("swiglu", f_swiglu, (em_tensor *[]){em_mul_scalar(em_randn(EM_SHAPE(4, 5), o), 3), em_randn(EM_SHAPE(4, 5), o)},
               2, 3, 1);
    em_tensor *xr = em_transpose(em_randn(EM_SHAPE(2, 4, 3, 6), o), 1, 2);
    grad_check("rope", f_rope, (em_tensor *[]){em_contiguous(xr), em_randn(EM_SHAPE(2, 4, 6), o), em_randn(EM_SHAPE(2, 4, 6), o)},
               3, 1, 1);
    /* the tables too (the composition differentiates them) */
    grad_check("rope (tables)", f_rope,
               (em_tensor *[]){em_randn(EM_SHAPE(1, 2, 4, 6), o), em_randn(EM_SHAPE(4, 6), o), em_randn(EM_SHAPE(4, 6), o)},
               3, 7, 1);
    /* attention: GQA 4 query heads on 2 key heads, 3 queries after 2 cached positions, a
     * padded key */
    uint8_t keep[2 * 5] = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
    em_tensor *mask = em_from_data(keep, EM_BOOL, EM_SHAPE(2, 5), EM_OPTS(.dtype = EM_BOOL));
    grad_check("attention", f_attn,
               (em_tensor *[]){em_randn(EM_SHAPE(2, 4, 3, 4), o), em_randn(EM_SHAPE(2, 2, 5, 4), o),
                               em_randn(EM_SHAPE(2, 2, 5, 3), o), mask},
               4, 7, 1);
    em_scope_end(s);
}

/* The fused float32 backward (CPU) against the composition's, and bf16 gradients against
 * float32 ones. */
static void grads_of(fn3 f, em_tensor **in, int n, unsigned which, em_tensor *w, double **out) {
    em_scope s = em_scope_begin();
    em_tensor *leaf[4] = {NULL};
    for (int i = 0; i < n; i++) {
        leaf[i] = in[i] ? em_clone(in[i]) : NULL;
        if (which >> i & 1) em_set_requires_grad(leaf[i], true);
    }
    em_tensor *y = f(leaf);
    CHECK_OK(em_backward(em_sum(em_mul(em_to_dtype(y, EM_F32), w), EM_ALL_DIMS, false)));
    for (int i = 0; i < n; i++) out[i] = which >> i & 1 ? host(em_grad(leaf[i])) : NULL;
    em_scope_end(s);
}

static em_tensor *f_rms64(em_tensor *const *in) { return em_rms_norm(in[0], EM_SHAPE(64), in[1], 1e-5); }
static em_tensor *f_attn_nomask(em_tensor *const *in) {
    em_attention_opts o = {.causal = true, .past = 3};
    return em_attention(in[0], in[1], in[2], &o);
}

static void compare_grads(const char *name, fn3 f, em_tensor **in, int n, unsigned which, em_shape yshape,
                          bool composed_ref, em_dtype low) {
    em_tensor *w = em_randn(yshape, EM_OPTS());
    double *a[4] = {NULL}, *b[4] = {NULL};
    grads_of(f, in, n, which, w, a);
    if (composed_ref) {
        setenv("EMBER_ATTENTION", "composed", 1);
        grads_of(f, in, n, which, w, b);
        unsetenv("EMBER_ATTENTION");
    } else {
        em_tensor *lo[4];
        for (int i = 0; i < n; i++) lo[i] = in[i] && em_dtype_is_floating(em_dtype_of(in[i])) ? em_to_dtype(in[i], low) : in[i];
        grads_of(f, lo, n, which, w, b);
    }
    for (int i = 0; i < n; i++) {
        if (!(which >> i & 1)) continue;
        char what[96];
        snprintf(what, sizeof what, "%s: input %d", name, i);
        CHECK(a[i] && b[i] && worst(what, b[i], a[i], em_numel(in[i]), composed_ref ? 1e-5 : 0.05,
                                    composed_ref ? 1e-4 : 0.05) <= 1);
        free(a[i]), free(b[i]);
    }
}

static void test_fused_backward(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(15);
    /* attention: fused (the CPU) against the composition; GQA, a causal offset */
    em_tensor *q = em_randn(EM_SHAPE(2, 6, 20, 8), EM_OPTS()), *k = em_randn(EM_SHAPE(2, 2, 23, 8), EM_OPTS());
    em_tensor *v = em_randn(EM_SHAPE(2, 2, 23, 5), EM_OPTS());
    compare_grads("attention backward", f_attn_nomask, (em_tensor *[]){q, k, v}, 3, 7, EM_SHAPE(2, 6, 20, 5), true, EM_F32);
    /* bf16 RMSNorm / SwiGLU / rope gradients near float32's */
    em_tensor *x = em_randn(EM_SHAPE(4, 64), EM_OPTS()), *w = em_randn(EM_SHAPE(64), EM_OPTS());
    compare_grads("rms_norm bf16", f_rms64, (em_tensor *[]){x, w}, 2, 3, EM_SHAPE(4, 64), false, EM_BF16);
    compare_grads("swiglu bf16", f_swiglu, (em_tensor *[]){x, em_randn(EM_SHAPE(4, 64), EM_OPTS())}, 2, 3,
                  EM_SHAPE(4, 64), false, EM_BF16);
    em_scope_end(s);
}

/* ---- attention against repeat_kv and the composed scaled dot product ----
 * reference: k and v repeated per query head (index_select), a bool mask [B, 1, L, S] made
 * here, em_scaled_dot_product_attention in float32 on the CPU */
static em_tensor *attention_ref(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, int64_t past, const uint8_t *keep) {
    em_shape qs = em_shape_of(q), ks = em_shape_of(k);
    int64_t B = qs.d[0], Hq = qs.d[1], L = qs.d[2], Hkv = ks.d[1], S = ks.d[2], G = Hq / Hkv;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)Hq);
    for (int64_t h = 0; h < Hq; h++) idx[h] = h / G;
    em_tensor *index = em_from_data(idx, EM_I64, EM_SHAPE(Hq), EM_OPTS(.dtype = EM_I64));
    free(idx);
    em_tensor *q32 = em_to_dtype(em_cpu(q), EM_F32), *k32 = em_index_select(em_to_dtype(em_cpu(k), EM_F32), 1, index);
    em_tensor *v32 = em_index_select(em_to_dtype(em_cpu(v), EM_F32), 1, index);
    uint8_t *m = malloc((size_t)(B * L * S));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < S; j++)
                m[(b * L + i) * S + j] = (!causal || j <= past + i) && (!keep || keep[b * S + j]);
    em_tensor *mask = em_from_data(m, EM_BOOL, EM_SHAPE(B, 1, L, S), EM_OPTS(.dtype = EM_BOOL));
    free(m);
    setenv("EMBER_ATTENTION", "composed", 1);
    em_tensor *y = em_scaled_dot_product_attention(q32, k32, v32, mask, 0.0, false);
    unsetenv("EMBER_ATTENTION");
    return y;
}

typedef struct attn_case {
    const char *name;
    int64_t B, Hq, Hkv, L, S, E, Ev, past;
    bool causal, pad;
} attn_case;

static void check_attention(em_device d, em_dtype dt, const attn_case *c, bool composed) {
    em_scope s = em_scope_begin();
    em_manual_seed(16);
    em_tensor *q = randn(EM_SHAPE(c->B, c->Hq, c->L, c->E), dt, d);
    em_tensor *k = randn(EM_SHAPE(c->B, c->Hkv, c->S, c->E), dt, d);
    em_tensor *v = randn(EM_SHAPE(c->B, c->Hkv, c->S, c->Ev), dt, d);
    /* padding: sequence 1 left-padded by 3 keys, sequence 0 right-padded by 2 past the last query */
    uint8_t *keep = NULL;
    em_tensor *mask = NULL;
    if (c->pad) {
        keep = malloc((size_t)(c->B * c->S));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < c->S; j++) keep[b * c->S + j] = b % 2 ? j >= 3 : j < c->S - 2;
        mask = em_to(em_from_data(keep, EM_BOOL, EM_SHAPE(c->B, c->S), EM_OPTS(.dtype = EM_BOOL)), d);
    }
    if (composed) setenv("EMBER_ATTENTION", "composed", 1);
    em_attention_opts o = {.causal = c->causal, .past = c->past, .key_mask = mask};
    em_tensor *y = em_attention(q, k, v, &o);
    unsetenv("EMBER_ATTENTION");
    CHECK(y != NULL);
    if (!y) fprintf(stderr, "  %s: %s\n", c->name, em_last_error()), em_clear_error();
    em_tensor *ref = attention_ref(q, k, v, c->causal, c->past, keep);
    int64_t n = c->B * c->Hq * c->L * c->Ev;
    double *yh = host(y), *rh = host(ref);
    /* rows that see no key: zeros here, NaN in the reference (softmax of nothing) */
    for (int64_t i = 0; yh && rh && i < n; i++)
        if (isnan(rh[i])) {
            CHECK(yh[i] == 0);
            rh[i] = 0;
        }
    char what[160];
    snprintf(what, sizeof what, "attention %s %s %s%s", c->name, em_device_str(d).s, em_dtype_name(dt),
             composed ? " composed" : "");
    /* 16-bit: inputs exact in float32, one rounding of the output (float32 accumulation) on
     * the CPU; composed elsewhere rounds the scores and probabilities too */
    bool fused = !composed; /* the CPU's kernels and the GPUs' (attention.k) */
    double tol = dt == EM_F32 ? 2e-5 : dt == EM_BF16 ? (fused ? 1.0 / 128 : 0.05) : (fused ? 1.0 / 1024 : 0.01);
    CHECK(yh && rh && worst(what, yh, rh, n, tol, tol) <= 1);
    free(yh), free(rh), free(keep);
    em_scope_end(s);
}

static const attn_case k_cases[] = {
    {"decode GQA", 2, 8, 2, 1, 37, 16, 16, 36, true, false},
    {"decode MQA long cache (split keys)", 1, 4, 1, 1, 1100, 32, 32, 1099, true, false},
    {"decode padded", 2, 4, 2, 1, 12, 8, 8, 11, true, true},
    {"prefill GQA causal", 1, 8, 2, 40, 40, 16, 12, 0, true, false},
    {"prefill padded", 2, 4, 1, 9, 9, 8, 8, 0, true, true},
    {"chunk after a cache", 2, 6, 3, 5, 17, 8, 8, 12, true, true},
    {"not causal", 2, 4, 2, 3, 7, 8, 6, 0, false, false},
};

static void test_attention(void) {
    for (size_t ci = 0; ci < sizeof k_cases / sizeof k_cases[0]; ci++)
        for (int di = 0; di < g_ndev; di++)
            for (int ti = 0; ti < 3; ti++) {
                check_attention(g_devs[di], k_dtypes[ti], &k_cases[ci], false);
                if (g_devs[di].type == EM_CPU && ti == 0) check_attention(g_devs[di], k_dtypes[ti], &k_cases[ci], true);
            }
    /* one thread and two: the key split and the row split change with the threads */
    int keep = em_get_num_threads();
    em_set_num_threads(1);
    check_attention(EM_DEVICE_CPU, EM_F32, &k_cases[1], false);
    check_attention(EM_DEVICE_CPU, EM_F32, &k_cases[3], false);
    em_set_num_threads(keep);
}

/* A preallocated cache: new rows go in with em_copy_ into a narrow view; the rows after the
 * last query's position hold NaN and are never read. */
static void test_kv_cache(void) {
    for (int di = 0; di < g_ndev; di++)
        for (int ti = 0; ti < 2; ti++) {
            em_device d = g_devs[di];
            em_dtype dt = k_dtypes[ti];
            em_scope s = em_scope_begin();
            em_manual_seed(17);
            int64_t B = 2, Hq = 4, Hkv = 2, E = 8, max = 32, prompt = 6;
            em_opts o = EM_OPTS(.dtype = dt, .device = d);
            em_tensor *kc = em_full(EM_SHAPE(B, Hkv, max, E), NAN, o), *vc = em_full(EM_SHAPE(B, Hkv, max, E), NAN, o);
            em_tensor *kall = randn(EM_SHAPE(B, Hkv, prompt + 3, E), dt, d), *vall = randn(EM_SHAPE(B, Hkv, prompt + 3, E), dt, d);
            em_tensor *qall = randn(EM_SHAPE(B, Hq, prompt + 3, E), dt, d);
            /* prefill, then three decoding steps; each step's output against attention over the
             * keys so far without a cache */
            int64_t past = 0;
            for (int step = 0; step < 4; step++) {
                int64_t L = step == 0 ? prompt : 1;
                CHECK_OK(em_copy_(em_narrow(kc, 2, past, L), em_narrow(kall, 2, past, L)));
                CHECK_OK(em_copy_(em_narrow(vc, 2, past, L), em_narrow(vall, 2, past, L)));
                em_tensor *q = em_narrow(qall, 2, past, L);
                em_attention_opts oc = {.causal = true, .past = past};
                em_tensor *y = em_attention(q, kc, vc, &oc);
                em_tensor *want = em_attention(q, em_narrow(kall, 2, 0, past + L), em_narrow(vall, 2, 0, past + L), &oc);
                double *yh = host(y), *wh = host(want);
                char what[96];
                snprintf(what, sizeof what, "kv cache %s %s step %d", em_device_str(d).s, em_dtype_name(dt), step);
                CHECK(yh && wh && worst(what, yh, wh, B * Hq * L * E, 1e-6, 1e-6) <= 1);
                free(yh), free(wh);
                past += L;
            }
            em_scope_end(s);
        }
}

/* ---- the rotary tables: transformers' formulas, written here in double ---- */
static void test_rope_tables(void) {
    em_scope s = em_scope_begin();
    em_rope_config cfg[3] = {{.head_dim = 64, .theta = 10000, .scaling = EM_ROPE_DEFAULT},
                             {.head_dim = 64, .theta = 10000, .scaling = EM_ROPE_LINEAR, .factor = 4},
                             {.head_dim = 64, .theta = 500000, .scaling = EM_ROPE_LLAMA3, .factor = 8,
                              .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position_embeddings = 8192}};
    for (int c = 0; c < 3; c++) {
        float inv[32];
        CHECK_OK(em_rope_inv_freq(&cfg[c], inv));
        for (int k = 0; k < 32; k++) {
            double f = 1.0 / pow(cfg[c].theta, 2.0 * k / 64);
            if (c == 1) f /= 4;
            if (c == 2) {
                double wave = 2 * M_PI / f, lo = 8192.0 / 1, hi = 8192.0 / 4;
                if (wave > lo) f /= 8;
                else if (wave >= hi) {
                    double sm = (8192 / wave - 1) / (4 - 1);
                    f = (1 - sm) * f / 8 + sm * f;
                }
            }
            CHECK_NEAR(inv[k], f, 4e-7 * f);
        }
        int64_t pos[2][3] = {{0, 1, 2}, {5, 6, 2047}};
        em_tensor *p = em_from_data(pos, EM_I64, EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_I64));
        em_tensor *cs = NULL, *sn = NULL;
        CHECK_OK(em_rope_tables(&cfg[c], p, EM_F32, EM_DEVICE_CPU, &cs, &sn));
        CHECK(cs && sn && em_ndim(cs) == 3 && em_size(cs, 2) == 64);
        double *ch = host(cs), *sh = host(sn);
        for (int b = 0; b < 2 && ch; b++)
            for (int t = 0; t < 3; t++)
                for (int k = 0; k < 32; k++) {
                    float f = inv[k] * (float)pos[b][t];
                    int64_t at = (b * 3 + t) * 64 + k;
                    CHECK(ch[at] == (float)cos((double)f) && ch[at + 32] == ch[at]);
                    CHECK(sh[at] == (float)sin((double)f) && sh[at + 32] == sh[at]);
                }
        free(ch), free(sh);
        /* bf16 tables are the float32 ones rounded */
        em_tensor *cb = NULL, *sb = NULL;
        CHECK_OK(em_rope_tables(&cfg[c], em_narrow(p, 0, 1, 1), EM_BF16, EM_DEVICE_CPU, &cb, &sb));
        CHECK(cb && em_dtype_of(cb) == EM_BF16);
    }
    em_scope_end(s);
}

/* Which path ran, by the output's node: the kernels on every device (attention's on the CPU),
 * so that the comparisons above cannot pass on the composition alone. */
static void test_paths(void) {
    for (int di = 0; di < g_ndev; di++) {
        em_device d = g_devs[di];
        em_scope s = em_scope_begin();
        em_opts o = EM_OPTS(.device = d, .requires_grad = true);
        em_tensor *x = em_ones(EM_SHAPE(2, 3, 4, 8), o), *w = em_ones(EM_SHAPE(8), o);
        em_tensor *t = em_ones(EM_SHAPE(4, 8), EM_OPTS(.device = d));
        CHECK(!strcmp(em_grad_fn_name(em_rms_norm(x, EM_SHAPE(8), w, 1e-6)), "FusedRmsNormBackward0"));
        CHECK(!strcmp(em_grad_fn_name(em_swiglu(x, x)), "SwigluBackward0"));
        CHECK(!strcmp(em_grad_fn_name(em_rope(x, t, t)), "RopeBackward0"));
        em_tensor *k = em_ones(EM_SHAPE(2, 1, 4, 8), o);
        const char *an = em_grad_fn_name(em_attention(x, k, k, &(em_attention_opts){.causal = true}));
        CHECK(an && !strcmp(an, "ScaledDotProductAttentionBackward"));
        em_scope_end(s);
    }
}

/* ---- bad arguments: a clear error, nothing else ---- */
static void test_bad_arguments(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_SHAPE(2, 4), EM_OPTS());
    CHECK(!em_rms_norm(x, EM_SHAPE(3), NULL, 1e-5));
    CHECK_ERROR(EM_ERR_SHAPE, "normalized_shape");
    CHECK(!em_rms_norm(x, EM_SHAPE(4), em_zeros(EM_SHAPE(3), EM_OPTS()), 1e-5));
    CHECK_ERROR(EM_ERR_SHAPE, "weight");
    CHECK(!em_rms_norm(x, EM_SHAPE(4), NULL, -1));
    CHECK_ERROR(EM_ERR_ARGUMENT, "eps");
    CHECK(!em_rms_norm(em_zeros(EM_SHAPE(2, 4), EM_OPTS(.dtype = EM_I64)), EM_SHAPE(4), NULL, 1e-5));
    CHECK_ERROR(EM_ERR_DTYPE, "floating");
    CHECK(!em_swiglu(x, em_zeros(EM_SHAPE(4, 2), EM_OPTS())));
    CHECK_ERROR(EM_ERR_SHAPE, "one shape");
    em_tensor *x4 = em_zeros(EM_SHAPE(1, 2, 3, 5), EM_OPTS());
    CHECK(!em_rope(x4, em_zeros(EM_SHAPE(3, 5), EM_OPTS()), em_zeros(EM_SHAPE(3, 5), EM_OPTS())));
    CHECK_ERROR(EM_ERR_SHAPE, "D even");
    em_tensor *x6 = em_zeros(EM_SHAPE(1, 2, 3, 6), EM_OPTS());
    CHECK(!em_rope(x6, em_zeros(EM_SHAPE(4, 6), EM_OPTS()), em_zeros(EM_SHAPE(4, 6), EM_OPTS())));
    CHECK_ERROR(EM_ERR_SHAPE, "cos");
    em_tensor *q = em_zeros(EM_SHAPE(1, 3, 1, 4), EM_OPTS()), *k = em_zeros(EM_SHAPE(1, 2, 5, 4), EM_OPTS());
    CHECK(!em_attention(q, k, k, NULL));
    CHECK_ERROR(EM_ERR_SHAPE, "multiple");
    em_tensor *q4 = em_zeros(EM_SHAPE(1, 4, 1, 4), EM_OPTS());
    CHECK(!em_attention(q4, k, em_zeros(EM_SHAPE(1, 2, 5, 4), EM_OPTS(.dtype = EM_F64)), NULL));
    CHECK_ERROR(EM_ERR_DTYPE, "one floating dtype");
    em_attention_opts o = {.key_mask = em_ones(EM_SHAPE(1, 4), EM_OPTS(.dtype = EM_BOOL))};
    CHECK(!em_attention(q4, k, k, &o));
    CHECK_ERROR(EM_ERR_SHAPE, "key_mask");
    o = (em_attention_opts){.causal = true, .past = -1};
    CHECK(!em_attention(q4, k, k, &o));
    CHECK_ERROR(EM_ERR_ARGUMENT, "past");
    CHECK(!em_attention(NULL, k, k, NULL));
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    em_rope_config bad = {.head_dim = 7, .theta = 10000};
    float inv[4];
    CHECK(em_rope_inv_freq(&bad, inv) == EM_ERR_ARGUMENT);
    em_clear_error();
    bad = (em_rope_config){.head_dim = 8, .theta = 10000, .scaling = EM_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 4,
                           .high_freq_factor = 1, .original_max_position_embeddings = 8192};
    CHECK(em_rope_inv_freq(&bad, inv) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "low_freq_factor") != NULL);
    em_clear_error();
    em_tensor *cs = NULL, *sn = NULL;
    CHECK(em_rope_tables(&(em_rope_config){.head_dim = 8, .theta = 10}, em_zeros(EM_SHAPE(2), EM_OPTS()), EM_F32,
                         EM_DEVICE_CPU, &cs, &sn) == EM_ERR_SHAPE);
    CHECK(!cs && !sn);
    em_clear_error();
    em_scope_end(s);
}

int main(void) {
    fill_devices();
    RUN(test_rms_norm);
    RUN(test_swiglu);
    RUN(test_rope);
    RUN(test_gradients);
    RUN(test_fused_backward);
    RUN(test_attention);
    RUN(test_kv_cache);
    RUN(test_rope_tables);
    RUN(test_paths);
    RUN(test_bad_arguments);
    return test_summary();
}
