/* The fused scaled-dot-product attention (src/core/ops_attention.c, the CPU's kernels in
 * src/backends/cpu/cpu_attention.c) against the composed one (matmul, softmax, matmul:
 * EMBER_ATTENTION=composed) on the same inputs: outputs and the gradients of q, k and v, for
 * 2-, 3- and 4-d operands, L != S both ways, causal or not, several row blocks, batch 1,
 * strided views (MultiheadAttention's split heads); which path ran is checked by the node's
 * name, so a test cannot pass on the composition twice. Also: NaN rows, a saved operand
 * modified in place, a second backward, where the fused path must not apply, out of memory
 * forward and backward, and em_sdpa_fused; em_attention's grouped heads in bf16 and f16
 * against float32 and the 16-bit composition. (The
 * golden values against PyTorch, test_transformer_golden, run through the fused path too.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"

#define TOL 2e-5

static void use(bool fused) {
    if (fused) unsetenv("EMBER_ATTENTION");
    else setenv("EMBER_ATTENTION", "composed", 1);
}

/* out and the three gradients of sum(out * w) with the chosen path; fresh leaves from the
 * same values each time. name: the output's node. */
static bool run(bool fused, em_tensor *const src[3], em_tensor *w, bool causal, int view_heads, em_tensor **out,
                em_tensor *grads[3], char *name, size_t name_size) {
    use(fused);
    em_tensor *leaf[3], *in[3];
    for (int i = 0; i < 3; i++) {
        leaf[i] = em_clone(src[i]);
        if (!leaf[i] || em_set_requires_grad(leaf[i], true) != EM_OK) return false;
        in[i] = leaf[i];
        if (view_heads) { /* [N, L, E] -> [N, H, L, E / H], strided like MultiheadAttention's */
            em_shape s = em_shape_of(leaf[i]);
            in[i] = em_transpose(em_reshape(leaf[i], EM_SHAPE(s.d[0], s.d[1], view_heads, s.d[2] / view_heads)), 1, 2);
        }
    }
    em_tensor *y = em_scaled_dot_product_attention(in[0], in[1], in[2], NULL, 0.0, causal);
    if (!y) return false;
    snprintf(name, name_size, "%s", em_grad_fn_name(y) ? em_grad_fn_name(y) : "(none)");
    if (em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)) != EM_OK) return false;
    *out = y;
    for (int i = 0; i < 3; i++) grads[i] = em_grad(leaf[i]);
    use(true);
    return grads[0] && grads[1] && grads[2];
}

static double maxdiff(em_tensor *a, em_tensor *b) {
    return em_item(em_max(em_abs(em_sub(em_contiguous(a), em_contiguous(b))), EM_ALL_DIMS, false));
}

/* q [..., L, E], k [..., S, E], v [..., S, Ev] (leading dims lead) */
static void compare(const char *what, em_shape qs, em_shape ks, em_shape vs, bool causal, int view_heads) {
    em_scope sc = em_scope_begin();
    em_tensor *src[3] = {em_randn(qs, (em_opts){0}), em_randn(ks, (em_opts){0}), em_randn(vs, (em_opts){0})};
    em_tensor *y[2], *g[2][3];
    char name[2][64];
    em_tensor *w = NULL;
    bool ok = true;
    for (int f = 1; f >= 0 && ok; f--) {
        if (!w) { /* the output's shape from a first run without grad */
            em_tensor *probe[3];
            for (int i = 0; i < 3; i++) {
                probe[i] = src[i];
                if (view_heads) {
                    em_shape s = em_shape_of(src[i]);
                    probe[i] = em_transpose(em_reshape(src[i], EM_SHAPE(s.d[0], s.d[1], view_heads, s.d[2] / view_heads)), 1, 2);
                }
            }
            em_tensor *p = em_scaled_dot_product_attention(probe[0], probe[1], probe[2], NULL, 0.0, causal);
            ok = p != NULL;
            if (ok) w = em_randn(em_shape_of(p), (em_opts){0});
        }
        ok = ok && run(f, src, w, causal, view_heads, &y[f], g[f], name[f], sizeof name[f]);
    }
    CHECK(ok);
    if (!ok) {
        fprintf(stderr, "  %s: %s\n", what, em_last_error());
        em_clear_error();
        em_scope_end(sc);
        return;
    }
    CHECK(strcmp(name[1], "ScaledDotProductAttentionBackward") == 0); /* the fused node ran */
    CHECK(strcmp(name[0], "ScaledDotProductAttentionBackward") != 0); /* and the composition */
    double d[4] = {maxdiff(y[1], y[0]), maxdiff(g[1][0], g[0][0]), maxdiff(g[1][1], g[0][1]), maxdiff(g[1][2], g[0][2])};
    printf("  %-44s out %.1e  dq %.1e  dk %.1e  dv %.1e\n", what, d[0], d[1], d[2], d[3]);
    for (int i = 0; i < 4; i++) CHECK(d[i] < TOL);
    em_scope_end(sc);
}

static void test_matches_composition(void) {
    compare("4-d, L 5 < S 7", EM_SHAPE(2, 3, 5, 8), EM_SHAPE(2, 3, 7, 8), EM_SHAPE(2, 3, 7, 6), false, 0);
    compare("4-d, L 5 < S 7, causal", EM_SHAPE(2, 3, 5, 8), EM_SHAPE(2, 3, 7, 8), EM_SHAPE(2, 3, 7, 6), true, 0);
    compare("4-d, L 9 > S 4, causal", EM_SHAPE(1, 2, 9, 4), EM_SHAPE(1, 2, 4, 4), EM_SHAPE(1, 2, 4, 3), true, 0);
    compare("3-d, 3 row blocks, causal", EM_SHAPE(2, 40, 16), EM_SHAPE(2, 40, 16), EM_SHAPE(2, 40, 16), true, 0);
    compare("3-d, 3 row blocks", EM_SHAPE(2, 37, 5), EM_SHAPE(2, 50, 5), EM_SHAPE(2, 50, 9), false, 0);
    compare("2-d, one row", EM_SHAPE(1, 4), EM_SHAPE(6, 4), EM_SHAPE(6, 2), false, 0);
    compare("2-d, causal", EM_SHAPE(9, 4), EM_SHAPE(9, 4), EM_SHAPE(9, 4), true, 0);
    compare("split heads (strided), causal", EM_SHAPE(3, 33, 24), EM_SHAPE(3, 33, 24), EM_SHAPE(3, 33, 24), true, 4);
    compare("split heads (strided), batch 1", EM_SHAPE(1, 17, 16), EM_SHAPE(1, 17, 16), EM_SHAPE(1, 17, 16), false, 2);
}

/* em_attention with grouped heads in bf16 and f16: the fused forward and backward (float32
 * products, one rounding of each result) against the same values in float32 through the
 * fused kernels, within the 16-bit rounding of the results, and against the 16-bit
 * composition (which also rounds the scores and probabilities), looser. */
typedef struct gqa_case {
    const char *name;
    int64_t B, Hq, Hkv, L, S, E, Ev, past;
    bool causal;
} gqa_case;

/* out and the gradients of sum(out * w) through em_attention, fused or composed */
static bool attend(bool fused, em_tensor *const src[3], em_tensor *w, const gqa_case *c, em_tensor **out,
                   em_tensor *grads[3], char *name, size_t name_size) {
    use(fused);
    em_tensor *leaf[3];
    for (int i = 0; i < 3; i++) {
        leaf[i] = em_clone(src[i]);
        if (!leaf[i] || em_set_requires_grad(leaf[i], true) != EM_OK) return false;
    }
    em_attention_opts o = {.causal = c->causal, .past = c->past};
    em_tensor *y = em_attention(leaf[0], leaf[1], leaf[2], &o);
    use(true);
    if (!y) return false;
    snprintf(name, name_size, "%s", em_grad_fn_name(y) ? em_grad_fn_name(y) : "(none)");
    if (em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)) != EM_OK) return false;
    *out = y;
    for (int i = 0; i < 3; i++) grads[i] = em_grad(leaf[i]);
    return grads[0] && grads[1] && grads[2];
}

/* max |a - b| over max |b|, or over 1 where b is smaller throughout (a gradient that cancels
 * to float32's noise: one key, so P = 1 and dS = 0), both as float32 */
static double reldiff(em_tensor *a, em_tensor *b) {
    em_tensor *bf = em_to_dtype(b, EM_F32);
    double top = em_item(em_max(em_abs(bf), EM_ALL_DIMS, false));
    return maxdiff(em_to_dtype(a, EM_F32), bf) / (top > 1 ? top : 1.0);
}

static void check_lowp(const gqa_case *c, em_dtype dt) {
    em_scope sc = em_scope_begin();
    em_opts o = EM_OPTS(.dtype = dt);
    /* 16-bit values: the float32 run reads exactly the same numbers */
    em_tensor *src[3] = {em_randn(EM_SHAPE(c->B, c->Hq, c->L, c->E), o), em_randn(EM_SHAPE(c->B, c->Hkv, c->S, c->E), o),
                         em_randn(EM_SHAPE(c->B, c->Hkv, c->S, c->Ev), o)};
    em_tensor *w = em_randn(EM_SHAPE(c->B, c->Hq, c->L, c->Ev), o);
    em_tensor *src32[3] = {em_to_dtype(src[0], EM_F32), em_to_dtype(src[1], EM_F32), em_to_dtype(src[2], EM_F32)};
    em_tensor *y = NULL, *g[3], *yc = NULL, *gc[3], *yf = NULL, *gf[3];
    char name[3][64];
    bool ok = attend(true, src, w, c, &y, g, name[0], sizeof name[0]) &&
              attend(false, src, w, c, &yc, gc, name[1], sizeof name[1]) &&
              attend(true, src32, em_to_dtype(w, EM_F32), c, &yf, gf, name[2], sizeof name[2]);
    CHECK(ok);
    if (!ok) {
        fprintf(stderr, "  %s %s: %s\n", c->name, em_dtype_name(dt), em_last_error());
        em_clear_error();
        em_scope_end(sc);
        return;
    }
    CHECK(strcmp(name[0], "ScaledDotProductAttentionBackward") == 0); /* the 16-bit fused node ran */
    CHECK(strcmp(name[1], "ScaledDotProductAttentionBackward") != 0); /* the composition */
    CHECK(strcmp(name[2], "ScaledDotProductAttentionBackward") == 0);
    CHECK(em_dtype_of(y) == dt && em_dtype_of(g[0]) == dt && em_dtype_of(g[1]) == dt && em_dtype_of(g[2]) == dt);
    /* against float32: one rounding of each result (bf16 keeps 8 bits, f16 11), and dS reads
     * the rounded output; against the composition: its rounded scores and probabilities */
    double unit = dt == EM_BF16 ? 1.0 / 256 : 1.0 / 2048;
    double d32[4] = {reldiff(y, yf), reldiff(g[0], gf[0]), reldiff(g[1], gf[1]), reldiff(g[2], gf[2])};
    double dco[4] = {reldiff(y, yc), reldiff(g[0], gc[0]), reldiff(g[1], gc[1]), reldiff(g[2], gc[2])};
    printf("  %-30s %s vs float32: out %.1e dq %.1e dk %.1e dv %.1e; vs composed: out %.1e dq %.1e dk %.1e "
           "dv %.1e\n", c->name, em_dtype_name(dt), d32[0], d32[1], d32[2], d32[3], dco[0], dco[1], dco[2], dco[3]);
    for (int i = 0; i < 4; i++) {
        CHECK(d32[i] <= 2 * unit);
        CHECK(dco[i] <= 16 * unit);
    }
    em_scope_end(sc);
}

static void test_lowp_matches_float32(void) {
    static const gqa_case cases[] = {
        {"G=4 causal, 3 row blocks", 1, 8, 2, 40, 40, 16, 16, 0, true},
        {"G=2 causal after 13 keys", 2, 4, 2, 21, 34, 8, 12, 13, true},
        {"G=1 not causal, L < S", 1, 2, 2, 5, 19, 16, 8, 0, false},
        {"G=8 causal, one row", 1, 8, 1, 1, 1, 32, 32, 0, true},
        {"G=2 causal, keys past the end", 1, 4, 2, 9, 20, 8, 8, 3, true},
    };
    em_manual_seed(11);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_lowp(&cases[i], EM_BF16);
        check_lowp(&cases[i], EM_F16);
    }
}

/* A NaN in a query poisons its row only, like the composition; an infinite score too. */
static void test_nan_rows(void) {
    em_scope s = em_scope_begin();
    em_tensor *q = em_randn(EM_SHAPE(4, 3), (em_opts){0}), *k = em_randn(EM_SHAPE(5, 3), (em_opts){0});
    em_tensor *v = em_randn(EM_SHAPE(5, 2), (em_opts){0});
    CHECK_OK(em_fill_(em_select(em_select(q, 0, 1), 0, 2), NAN));
    em_tensor *y = em_scaled_dot_product_attention(q, k, v, NULL, 0.0, false);
    CHECK(y != NULL);
    if (y) {
        for (int r = 0; r < 4; r++) {
            double v0 = em_item(em_select(em_select(y, 0, r), 0, 0));
            CHECK(r == 1 ? isnan(v0) : isfinite(v0));
        }
    }
    em_scope_end(s);
}

/* PyTorch's rules for saved tensors: modified in place after the forward, or a second
 * backward without retain_graph: an error, not a silently wrong gradient. */
static void test_saved_tensor_rules(void) {
    em_scope s = em_scope_begin();
    em_tensor *q = em_randn(EM_SHAPE(2, 6, 4), (em_opts){0}), *k = em_randn(EM_SHAPE(2, 6, 4), (em_opts){0});
    em_tensor *v = em_randn(EM_SHAPE(2, 6, 4), (em_opts){0});
    CHECK_OK(em_set_requires_grad(q, true));
    em_tensor *y = em_scaled_dot_product_attention(q, k, v, NULL, 0.0, true);
    CHECK(y && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") == 0);
    CHECK_OK(em_mul_scalar_(k, 2.0));
    CHECK(em_backward(em_sum(y, EM_ALL_DIMS, false)) == EM_ERR_AUTOGRAD);
    CHECK(strstr(em_last_error(), "modified by an inplace operation") != NULL);
    em_clear_error();

    y = em_scaled_dot_product_attention(q, k, v, NULL, 0.0, true);
    em_tensor *l = em_sum(y, EM_ALL_DIMS, false);
    CHECK_OK(em_backward(l));
    CHECK(em_backward(l) == EM_ERR_AUTOGRAD);
    CHECK(strstr(em_last_error(), "second time") != NULL);
    em_clear_error();
    em_scope_end(s);
}

/* Where the fused kernel does not apply, the composition runs (and is right). */
static void test_composed_where_fused_does_not_apply(void) {
    em_scope s = em_scope_begin();
    em_tensor *q = em_randn(EM_SHAPE(2, 5, 4), EM_OPTS(.dtype = EM_F64)), *k = em_randn(EM_SHAPE(2, 5, 4), EM_OPTS(.dtype = EM_F64));
    CHECK_OK(em_set_requires_grad(q, true));
    em_tensor *y = em_scaled_dot_product_attention(q, k, k, NULL, 0.0, true); /* float64 */
    CHECK(y && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") != 0);
    em_tensor *qf = em_randn(EM_SHAPE(2, 5, 4), (em_opts){0});
    CHECK_OK(em_set_requires_grad(qf, true));
    em_tensor *mask = em_ones(EM_SHAPE(5, 5), EM_OPTS(.dtype = EM_BOOL));
    y = em_scaled_dot_product_attention(qf, qf, qf, mask, 0.0, false); /* a mask tensor */
    CHECK(y && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") != 0);
    y = em_scaled_dot_product_attention(qf, qf, qf, NULL, 0.5, false); /* dropout */
    CHECK(y && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") != 0);
    em_autocast r = em_autocast_begin(EM_CPU, EM_BF16); /* an autocast region decides the dtypes */
    y = em_scaled_dot_product_attention(qf, qf, qf, NULL, 0.0, true);
    CHECK(y && strcmp(em_grad_fn_name(y), "ScaledDotProductAttentionBackward") != 0);
    em_autocast_end(r);
    em_scope_end(s);
}

/* Without autograd (inference) the fused kernel runs and keeps nothing. */
static void test_no_grad(void) {
    em_scope s = em_scope_begin();
    em_tensor *q = em_randn(EM_SHAPE(2, 2, 8, 4), (em_opts){0});
    em_tensor *a = em_scaled_dot_product_attention(q, q, q, NULL, 0.0, true);
    use(false);
    em_tensor *b = em_scaled_dot_product_attention(q, q, q, NULL, 0.0, true);
    use(true);
    CHECK(a && b && em_grad_fn_name(a) == NULL);
    if (a && b) CHECK(maxdiff(a, b) < TOL);
    em_scope_end(s);
}

/* Out of memory in the fused forward and backward (the allocator's cap): a clear error,
 * nothing half-made or leaked (the sanitizer build checks the leaks), and the next call
 * works once the cap is gone; em_sdpa_fused for every device type and a bad one. */
static void test_out_of_memory_and_queries(void) {
    CHECK(em_sdpa_fused(EM_CPU));
    /* the GPUs' kernels (attention.k), wherever their backend is there */
    if (em_device_count(EM_OPENCL) > 0) CHECK(em_sdpa_fused(EM_OPENCL));
    if (em_device_count(EM_CUDA) > 0) CHECK(em_sdpa_fused(EM_CUDA));
    CHECK(!em_sdpa_fused((em_device_type)99));
    use(false);
    CHECK(!em_sdpa_fused(EM_CPU));
    use(true);
    em_scope s = em_scope_begin();
    /* 10 MiB: a segment of exactly its size, so the output needs a segment of its own (a
     * smaller q's segment would have room for it, and small blocks nest in large ones) */
    em_tensor *q = em_randn(EM_SHAPE(8, 4, 1280, 64), (em_opts){0});
    CHECK_OK(em_set_requires_grad(q, true));
    em_memory_empty_cache(EM_DEVICE_CPU);
    int64_t used = em_memory_reserved(EM_DEVICE_CPU);
    CHECK_OK(em_memory_set_cap(EM_DEVICE_CPU, used + 4096)); /* no room for the output */
    em_tensor *y = em_scaled_dot_product_attention(q, q, q, NULL, 0.0, true);
    CHECK(y == NULL && em_last_status() == EM_ERR_OUT_OF_MEMORY);
    em_clear_error();
    CHECK_OK(em_memory_set_cap(EM_DEVICE_CPU, -1));
    y = em_scaled_dot_product_attention(q, q, q, NULL, 0.0, true);
    CHECK(y != NULL);
    em_tensor *l = y ? em_sum(y, EM_ALL_DIMS, false) : NULL;
    used = em_memory_reserved(EM_DEVICE_CPU);
    CHECK_OK(em_memory_set_cap(EM_DEVICE_CPU, used + 4096)); /* no room for the gradients */
    em_memory_empty_cache(EM_DEVICE_CPU);
    CHECK(l && em_backward(l) == EM_ERR_OUT_OF_MEMORY);
    em_clear_error();
    CHECK_OK(em_memory_set_cap(EM_DEVICE_CPU, -1));
    em_scope_end(s);
}

int main(void) {
    em_manual_seed(7);
    RUN(test_matches_composition);
    RUN(test_lowp_matches_float32);
    RUN(test_nan_rows);
    RUN(test_saved_tensor_rules);
    RUN(test_composed_where_fused_does_not_apply);
    RUN(test_no_grad);
    RUN(test_out_of_memory_and_queries);
    return test_summary();
}
