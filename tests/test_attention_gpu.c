/* The GPUs' fused attention (src/kernels/attention.k, src/backends/gpu/gpu_attention.c) on the
 * OpenCL device (PoCL here, which runs the kernels for real): forward and backward against the
 * composed path on the same device (EMBER_ATTENTION=composed) and against the CPU's fused
 * attention, over a grid of shapes: grouped heads G = 1, 2, 4, L = S and S > L with a causal
 * offset, head dims 64 and 128, causal or not, with and without a key mask, a fully masked
 * sequence (zeros), f32 and bf16. The split decode (several work-groups over the keys of one
 * row, then a merge) is run directly through the backend with given part counts at S = 1, 7,
 * 128, 2048 and 4097, and through em_attention where core chooses it. Which path ran is
 * checked by the output's node. Also: heads wider than the kernels take are composed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"
#include "core/tensor_impl.h"
#include "backend_calls.h"

static em_device g_gpu;

static bool have_gpu(void) {
    if (em_device_count(EM_OPENCL) <= 0) return false;
    g_gpu = EM_DEVICE(EM_OPENCL, 0);
    return true;
}

static void use_composed(bool on) {
    if (on) setenv("EMBER_ATTENTION", "composed", 1);
    else unsetenv("EMBER_ATTENTION");
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

static bool close_to(const char *what, em_tensor *got, em_tensor *want, double atol, double rtol) {
    double *g = host(got), *w = host(want);
    bool ok = g && w && em_numel(got) == em_numel(want) && worst(what, g, w, em_numel(got), atol, rtol) <= 1;
    free(g), free(w);
    return ok;
}

typedef struct att_case {
    const char *name;
    int64_t B, Hq, Hkv, L, S, E, past;
    bool causal;
    int mask; /* 0 none; 1 padding (sequence 0 right-padded, 1 left-padded); 2 sequence 1 sees nothing */
} att_case;

static const att_case k_cases[] = {
    {"G=1 causal prefill E=64", 2, 4, 4, 19, 19, 64, 0, true, 0},
    {"G=2 not causal, padded, E=64", 2, 4, 2, 33, 33, 64, 0, false, 1},
    {"G=4 chunk after a cache E=128", 2, 8, 2, 5, 40, 128, 35, true, 0},
    {"G=4 S > L padded E=128", 1, 4, 1, 17, 50, 128, 33, true, 1},
    {"G=2 a sequence fully masked", 2, 2, 1, 7, 12, 64, 5, true, 2},
    {"G=1 not causal S > L E=128", 1, 2, 2, 3, 70, 128, 0, false, 0},
};

static em_tensor *mask_for(const att_case *c, em_device d) {
    if (!c->mask) return NULL;
    uint8_t *keep = malloc((size_t)(c->B * c->S));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->S; j++)
            keep[b * c->S + j] = c->mask == 2 ? b == 0 : (b % 2 ? j >= 3 : j < c->S - 2);
    em_tensor *m = em_to(em_from_data(keep, EM_BOOL, EM_SHAPE(c->B, c->S), EM_OPTS(.dtype = EM_BOOL)), d);
    free(keep);
    return m;
}

/* y and (with gy) the gradients of q, k, v on device d from fresh leaves of the given values */
static bool attend(const att_case *c, em_tensor *const src[3], em_tensor *gy, em_device d, bool composed,
                   em_tensor **y, em_tensor *grads[3], const char **node) {
    em_tensor *leaf[3];
    for (int i = 0; i < 3; i++) {
        leaf[i] = em_clone(em_to(src[i], d));
        if (!leaf[i] || (gy && em_set_requires_grad(leaf[i], true) != EM_OK)) return false;
    }
    use_composed(composed);
    em_attention_opts o = {.causal = c->causal, .past = c->past, .key_mask = gy ? NULL : mask_for(c, d)};
    *y = em_attention(leaf[0], leaf[1], leaf[2], &o);
    use_composed(false);
    if (!*y) return false;
    *node = em_grad_fn_name(*y);
    if (!gy) return true;
    if (em_backward_with(*y, em_to(gy, d), false) != EM_OK) return false;
    for (int i = 0; i < 3; i++) grads[i] = em_grad(leaf[i]);
    return grads[0] && grads[1] && grads[2];
}

static void check_case(const att_case *c, em_dtype dt, bool backward) {
    em_scope s = em_scope_begin();
    em_manual_seed(21);
    em_opts o = EM_OPTS(.dtype = dt);
    em_tensor *src[3] = {em_randn(EM_SHAPE(c->B, c->Hq, c->L, c->E), o), em_randn(EM_SHAPE(c->B, c->Hkv, c->S, c->E), o),
                         em_randn(EM_SHAPE(c->B, c->Hkv, c->S, c->E), o)};
    em_tensor *gy = backward ? em_randn(EM_SHAPE(c->B, c->Hq, c->L, c->E), o) : NULL;
    char what[160];
    snprintf(what, sizeof what, "%s %s%s", c->name, em_dtype_name(dt), backward ? " backward" : "");
    em_tensor *y = NULL, *g[3] = {NULL}, *yc = NULL, *gc[3] = {NULL}, *yr = NULL, *gr[3] = {NULL};
    const char *node = NULL, *cnode = NULL, *rnode = NULL;
    bool ok = attend(c, src, gy, g_gpu, false, &y, g, &node);
    if (!ok) fprintf(stderr, "  %s: %s\n", what, em_last_error());
    CHECK(ok);
    if (!ok) {
        em_clear_error();
        em_scope_end(s);
        return;
    }
    /* the GPU's kernels ran: their node when a gradient is wanted, else no node at all (the
     * composition would record none either without a gradient, so also check it differs below) */
    CHECK(!backward || (node && !strcmp(node, "ScaledDotProductAttentionBackward")));
    CHECK_OK(attend(c, src, gy, g_gpu, true, &yc, gc, &cnode) ? EM_OK : em_last_status());
    CHECK(!backward || (cnode && strcmp(cnode, "ScaledDotProductAttentionBackward") != 0));
    /* the CPU's fused attention in float32: the reference for both dtypes */
    em_tensor *src32[3] = {em_to_dtype(src[0], EM_F32), em_to_dtype(src[1], EM_F32), em_to_dtype(src[2], EM_F32)};
    CHECK_OK(attend(c, src32, gy ? em_to_dtype(gy, EM_F32) : NULL, EM_DEVICE_CPU, false, &yr, gr, &rnode) ? EM_OK
                                                                                                     : em_last_status());
    bool f32 = dt == EM_F32;
    /* f32: both accumulate in float32, in other orders; bf16: one rounding of the output
     * against the CPU's float32 (one bf16 unit), the composition rounds scores and
     * probabilities too */
    double tol_cpu = f32 ? 2e-5 : 1.0 / 128, tol_comp = f32 ? 2e-5 : 0.05;
    char w2[200];
    snprintf(w2, sizeof w2, "%s: out vs the CPU", what);
    CHECK(close_to(w2, y, yr, tol_cpu, tol_cpu));
    snprintf(w2, sizeof w2, "%s: out vs composed", what);
    CHECK(close_to(w2, y, yc, tol_comp, tol_comp));
    if (c->mask == 2) { /* sequence 1 sees no key: zeros */
        double *yh = host(em_select(y, 0, 1));
        int64_t n = c->Hq * c->L * c->E, zeros = 0;
        for (int64_t i = 0; yh && i < n; i++) zeros += yh[i] == 0;
        CHECK(yh && zeros == n);
        free(yh);
    }
    if (backward) {
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) {
            /* bf16 gradients: float32 accumulation, one rounding of each */
            double tc = f32 ? 1e-4 : 0.02, tp = f32 ? 1e-4 : 0.1;
            snprintf(w2, sizeof w2, "%s: %s vs the CPU", what, names[i]);
            CHECK(close_to(w2, g[i], gr[i], tc, tc));
            snprintf(w2, sizeof w2, "%s: %s vs composed", what, names[i]);
            CHECK(close_to(w2, g[i], gc[i], tp, tp));
        }
    }
    if (em_failed()) {
        fprintf(stderr, "  %s: %s\n", what, em_last_error());
        em_clear_error();
    }
    em_scope_end(s);
}

static void test_grid(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    static const em_dtype dts[2] = {EM_F32, EM_BF16};
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        for (int t = 0; t < 2; t++) {
            check_case(&k_cases[i], dts[t], false);
            if (!k_cases[i].mask) check_case(&k_cases[i], dts[t], true); /* the backward takes no key mask */
        }
}

/* ---- the split decode, run through the backend with a given number of key parts ---- */

/* out [B, Hq, L, E] and lse [B * Hq * L] from one SDPA call on q's device with `splits` parts */
static em_status sdpa_call(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *mask, int64_t past, int64_t splits,
                           em_tensor **out, em_tensor **lse) {
    int64_t B = em_size(q, 0), Hq = em_size(q, 1), L = em_size(q, 2), E = em_size(v, 3), rows = B * Hq * L;
    em_opts o = EM_OPTS(.device = em_device_of(q));
    *out = em_empty(EM_SHAPE(B, Hq, L, E), EM_OPTS(.dtype = em_dtype_of(q), .device = em_device_of(q)));
    *lse = em_empty(EM_SHAPE(rows), o);
    em_tensor *work = splits > 1 ? em_empty(EM_SHAPE(splits * rows * (E + 2)), o) : NULL;
    if (!*out || !*lse || (splits > 1 && !work)) return em_last_status();
    em_op_call c = {.op = EM_OP_SDPA, .dtype = em_dtype_of(q), .dst = {*out, *lse, work}, .src = {q, k, v, mask},
                    .f = {1.0 / sqrt((double)em_size(q, 3))}, .i = {true, past, splits}};
    return be_call(q->storage->backend, c);
}

static void test_split_decode(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    static const int64_t sizes[5] = {1, 7, 128, 2048, 4097};
    static const int64_t parts[3] = {1, 3, 16};
    for (int si = 0; si < 5; si++)
        for (int L = 1; L <= 3; L += 2)
            for (int padded = 0; padded < 2; padded++) {
                int64_t S = sizes[si], B = 2, Hq = 8, Hkv = 2, E = 64, past = S - L > 0 ? S - L : 0;
                if (L > S) continue;
                em_scope s = em_scope_begin();
                em_manual_seed(22);
                em_tensor *q = em_randn(EM_SHAPE(B, Hq, L, E), EM_OPTS()), *k = em_randn(EM_SHAPE(B, Hkv, S, E), EM_OPTS());
                em_tensor *v = em_randn(EM_SHAPE(B, Hkv, S, E), EM_OPTS()), *mask = NULL;
                if (padded) { /* sequence 1 left-padded by a third of the keys (at least one seen) */
                    uint8_t *keep = malloc((size_t)(B * S));
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t j = 0; j < S; j++) keep[b * S + j] = b == 0 || j >= S / 3;
                    mask = em_from_data(keep, EM_BOOL, EM_SHAPE(B, S), EM_OPTS(.dtype = EM_BOOL));
                    free(keep);
                }
                em_attention_opts o = {.causal = true, .past = past, .key_mask = mask};
                em_tensor *want = em_attention(q, k, v, &o); /* the CPU's fused attention */
                em_tensor *qg = em_to(q, g_gpu), *kg = em_to(k, g_gpu), *vg = em_to(v, g_gpu);
                em_tensor *mg = mask ? em_to(mask, g_gpu) : NULL, *lse1 = NULL;
                for (int pi = 0; pi < 3; pi++) {
                    em_tensor *out = NULL, *lse = NULL;
                    char what[128];
                    snprintf(what, sizeof what, "split decode S=%lld L=%d padded=%d parts=%lld", (long long)S, L,
                             padded, (long long)parts[pi]);
                    em_status st = sdpa_call(qg, kg, vg, mg, past, parts[pi], &out, &lse);
                    if (st != EM_OK) fprintf(stderr, "  %s: %s\n", what, em_last_error());
                    CHECK(st == EM_OK);
                    if (st != EM_OK) break;
                    CHECK(close_to(what, out, want, 2e-5, 2e-5));
                    if (pi == 0) lse1 = lse;
                    else CHECK(close_to(what, lse, lse1, 1e-5, 1e-5));
                }
                /* through em_attention: core splits the keys itself where they are many */
                em_attention_opts og = {.causal = true, .past = past, .key_mask = mg};
                em_tensor *y = em_attention(qg, kg, vg, &og);
                CHECK(y && close_to("em_attention decode", y, want, 2e-5, 2e-5));
                if (em_failed()) {
                    fprintf(stderr, "  S=%lld: %s\n", (long long)S, em_last_error());
                    em_clear_error();
                }
                em_scope_end(s);
            }
}

/* Heads wider than the kernels' EMK_ATT_DMAX (128) are composed, with the same answer. */
static void test_wide_heads_are_composed(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_manual_seed(23);
    em_opts o = EM_OPTS(.requires_grad = true);
    em_tensor *q = em_randn(EM_SHAPE(1, 2, 4, 160), o), *k = em_randn(EM_SHAPE(1, 1, 6, 160), o);
    em_tensor *v = em_randn(EM_SHAPE(1, 1, 6, 160), o);
    em_attention_opts ao = {.causal = true, .past = 2};
    em_tensor *want = em_attention(q, k, v, &ao);
    em_tensor *y = em_attention(em_to(q, g_gpu), em_to(k, g_gpu), em_to(v, g_gpu), &ao);
    CHECK(y && em_grad_fn_name(y) && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") != 0);
    CHECK(y && close_to("wide heads", y, want, 2e-5, 2e-5));
    /* and the functional form, whose fused path is asked first (em__sdpa_applies) */
    em_tensor *k2 = em_randn(EM_SHAPE(1, 2, 6, 160), o), *v2 = em_randn(EM_SHAPE(1, 2, 6, 160), o);
    em_tensor *ys = em_scaled_dot_product_attention(em_to(q, g_gpu), em_to(k2, g_gpu), em_to(v2, g_gpu), NULL, 0.0, false);
    em_tensor *ws = em_scaled_dot_product_attention(q, k2, v2, NULL, 0.0, false);
    CHECK(ys && close_to("wide heads, sdpa", ys, ws, 2e-5, 2e-5));
    CHECK(!em_failed());
    em_clear_error();
    em_scope_end(s);
}

int main(void) {
    RUN(test_grid);
    RUN(test_split_decode);
    RUN(test_wide_heads_are_composed);
    return test_summary();
}
