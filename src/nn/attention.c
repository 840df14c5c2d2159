/* scaled_dot_product_attention and MultiheadAttention, written with public ops (matmul,
 * softmax, where), so they run on every backend with the composition's gradient:
 *   softmax(q k^T / sqrt(E) + mask) v
 * and, where the backend has it (the CPU), without a mask tensor or dropout, as one fused
 * node (src/core/ops_attention.c).
 * A causal mask keeps position i from seeing j > i (the scores there become -inf before the
 * softmax, so the future gets exactly zero weight). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

static void shape_text(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* Does mask broadcast to scores (numpy rules, the mask no wider)? */
static bool broadcasts_to(em_shape mask, em_shape scores) {
    if (mask.ndim > scores.ndim) return false;
    for (int i = 1; i <= mask.ndim; i++) {
        int64_t m = mask.d[mask.ndim - i], s = scores.d[scores.ndim - i];
        if (m != 1 && m != s) return false;
    }
    return true;
}

/* [L, S] bool: true where query i may attend key j (j <= i) */
static em_tensor *causal_keep(int64_t L, int64_t S, em_device dev) {
    em_opts o = EM_OPTS(.dtype = EM_I64, .device = dev);
    return em_le(em_unsqueeze(em_arange(0, (double)S, 1, o), 0), em_unsqueeze(em_arange(0, (double)L, 1, o), 1));
}

/* x with each element kept with probability 1 - p, scaled by 1 / (1 - p) */
static em_tensor *dropout(em_tensor *x, double p) {
    if (p <= 0.0) return x;
    if (p >= 1.0) return em_mul_scalar(x, 0.0);
    em_opts o = {.dtype = em_dtype_of(x), .device = em_device_of(x)};
    em_tensor *keep = em_lt(em_rand(em_shape_of(x), o), em_scalar(1.0 - p, o));
    return em_mul(x, em_mul_scalar(em_to_dtype(keep, o.dtype), 1.0 / (1.0 - p)));
}

static em_tensor *sdpa(const char *fn, em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *attn_mask, double dropout_p,
                       bool is_causal, em_tensor **weights_out) {
    if (!q || !k || !v) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, !q ? "query" : !k ? "key" : "value");
        return NULL;
    }
    em_shape qs = em_shape_of(q), ks = em_shape_of(k), vs = em_shape_of(v);
    char a[160], b[160], c[160];
    bool ok = qs.ndim >= 2 && ks.ndim == qs.ndim && vs.ndim == qs.ndim && ks.d[ks.ndim - 1] == qs.d[qs.ndim - 1] &&
              vs.d[vs.ndim - 2] == ks.d[ks.ndim - 2];
    for (int i = 0; ok && i < qs.ndim - 2; i++) ok = qs.d[i] == ks.d[i] && qs.d[i] == vs.d[i];
    if (!ok) {
        shape_text(a, sizeof a, qs);
        shape_text(b, sizeof b, ks);
        shape_text(c, sizeof c, vs);
        em_error(EM_ERR_SHAPE, "%s: expected query [..., L, E], key [..., S, E] and value [..., S, Ev] with the same "
                 "leading dims, got query %s, key %s, value %s", fn, a, b, c);
        return NULL;
    }
    if (!em_dtype_is_floating(em_dtype_of(q))) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating query, got %s", fn, em_dtype_name(em_dtype_of(q)));
        return NULL;
    }
    if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "%s: dropout_p must be in [0, 1], got %g", fn, dropout_p);
        return NULL;
    }
    int64_t L = qs.d[qs.ndim - 2], S = ks.d[ks.ndim - 2], E = qs.d[qs.ndim - 1];
    em_shape ss = qs;
    ss.d[ss.ndim - 1] = S;
    if (attn_mask) {
        em_shape ms = em_shape_of(attn_mask);
        if (is_causal) {
            em_error(EM_ERR_ARGUMENT, "%s: give either attn_mask or is_causal, not both", fn);
            return NULL;
        }
        if (!broadcasts_to(ms, ss)) {
            shape_text(a, sizeof a, ms);
            shape_text(b, sizeof b, ss);
            em_error(EM_ERR_SHAPE, "%s: attn_mask of shape %s does not broadcast to the attention scores' shape %s "
                     "([..., L, S] for L = %lld queries and S = %lld keys)", fn, a, b, (long long)L, (long long)S);
            return NULL;
        }
        em_dtype mt = em_dtype_of(attn_mask);
        if (mt != EM_BOOL && !em_dtype_is_floating(mt)) {
            em_error(EM_ERR_DTYPE, "%s: attn_mask must be bool (true: attend) or floating (added to the scores), got %s",
                     fn, em_dtype_name(mt));
            return NULL;
        }
    }
    /* no mask tensor, no dropout, no weights asked for: one fused node where the backend has
     * it (src/core/ops_attention.c), the composition below elsewhere */
    if (!attn_mask && dropout_p == 0.0 && !weights_out && em__sdpa_applies(q, k, v))
        return em__sdpa(q, k, v, 1.0 / sqrt((double)E), is_causal);
    em_scope s = em_scope_begin();
    em_tensor *scores = em_matmul(em_mul_scalar(q, 1.0 / sqrt((double)(E > 0 ? E : 1))), em_transpose(k, -2, -1));
    em_tensor *keep = is_causal ? causal_keep(L, S, em_device_of(q))
                      : attn_mask && em_dtype_of(attn_mask) == EM_BOOL ? attn_mask : NULL;
    em_tensor *add = attn_mask;
    if (keep) { /* a bool mask becomes 0 / -inf of the mask's own (small) shape, then one add:
                 * the add's backward passes the gradient through untouched */
        em_opts o = EM_OPTS(.dtype = em_dtype_of(q), .device = em_device_of(q));
        add = em_where(keep, em_scalar(0, o), em_scalar(-INFINITY, o));
    }
    if (add) scores = em_add(scores, add);
    em_tensor *w = em_softmax(scores, -1);
    if (weights_out) *weights_out = em_keep(w);
    em_tensor *y = em_matmul(dropout(w, dropout_p), v);
    return em__scope_return(s, y);
}

em_tensor *em_scaled_dot_product_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *attn_mask,
                                           double dropout_p, bool is_causal) {
    return sdpa("scaled_dot_product_attention", q, k, v, attn_mask, dropout_p, is_causal, NULL);
}

/* ---- MultiheadAttention ---- */

static const em_module_ops mha_ops; /* defined below; forward checks it is given one */

typedef struct mha_ctx { int64_t embed_dim, num_heads; double dropout; bool bias, batch_first; } mha_ctx;

/* x @ w^T + b for a [N, L, E] x, the rows w[r0 : r0 + n] */
static em_tensor *project(em_tensor *x, em_tensor *w, em_tensor *b, int64_t r0, int64_t n) {
    if (!x) return NULL;
    /* as rows: backward's weight gradient is one GEMM, not one product per batch index summed */
    em_shape s = em_shape_of(x);
    s.d[s.ndim - 1] = n;
    em_tensor *x2 = em_reshape(x, EM_SHAPE(-1, em_size(x, -1))), *wt = em_transpose(em_narrow(w, 0, r0, n), 0, 1);
    em_tensor *y = b ? em_addmm(em_narrow(b, 0, r0, n), x2, wt, 1.0, 1.0) : em_matmul(x2, wt);
    return em_reshape(y, s);
}

/* [N, L, E] -> [N, H, L, E / H] */
static em_tensor *split_heads(em_tensor *x, int64_t h) {
    em_shape s = em_shape_of(x);
    return em_transpose(em_reshape(x, EM_SHAPE(s.d[0], s.d[1], h, s.d[2] / h)), 1, 2);
}

em_tensor *em_multihead_attention_forward(em_module *m, em_tensor *query, em_tensor *key, em_tensor *value,
                                          em_tensor *attn_mask, bool is_causal, em_tensor **attn_weights) {
    const char *fn = "MultiheadAttention";
    if (attn_weights) *attn_weights = NULL;
    if (!m || !query || !key || !value) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, !m ? "module" : !query ? "query" : !key ? "key" : "value");
        return NULL;
    }
    if (m->ops != &mha_ops) {
        em_error(EM_ERR_ARGUMENT, "%s: expected a MultiheadAttention module, got %s", fn, m->ops->name);
        return NULL;
    }
    const mha_ctx *c = m->ctx;
    int64_t E = c->embed_dim, H = c->num_heads;
    em_tensor *in[3] = {query, key, value};
    static const char *const names[3] = {"query", "key", "value"};
    char a[160], b[160];
    for (int i = 0; i < 3; i++) {
        em_shape s = em_shape_of(in[i]);
        if (s.ndim != 3 || s.d[2] != E) {
            shape_text(a, sizeof a, s);
            em_error(EM_ERR_SHAPE, "%s: expected a 3-D %s %s with embed_dim %lld last, got %s", fn, names[i],
                     c->batch_first ? "[N, L, E]" : "[L, N, E]", (long long)E, a);
            return NULL;
        }
    }
    em_shape qs = em_shape_of(query), ks = em_shape_of(key), vs = em_shape_of(value);
    if (qs.d[c->batch_first ? 0 : 1] != ks.d[c->batch_first ? 0 : 1] || ks.d[0] != vs.d[0] || ks.d[1] != vs.d[1]) {
        shape_text(a, sizeof a, qs);
        shape_text(b, sizeof b, ks);
        em_error(EM_ERR_SHAPE, "%s: query %s, key %s and value must share the batch size, key and value their shape",
                 fn, a, b);
        return NULL;
    }
    int64_t N = qs.d[c->batch_first ? 0 : 1], L = qs.d[c->batch_first ? 1 : 0], S = ks.d[c->batch_first ? 1 : 0];
    em_tensor *mask = NULL;
    em_scope s = em_scope_begin();
    if (attn_mask) {
        /* PyTorch's MHA mask: [L, S] or [N * H, L, S]; bool true means "may not attend" */
        em_shape ms = em_shape_of(attn_mask);
        bool ok = (ms.ndim == 2 && ms.d[0] == L && ms.d[1] == S) ||
                  (ms.ndim == 3 && ms.d[0] == N * H && ms.d[1] == L && ms.d[2] == S);
        if (!ok) {
            shape_text(a, sizeof a, ms);
            em_error(EM_ERR_SHAPE, "%s: attn_mask should be [L, S] = [%lld, %lld] or [N * num_heads, L, S] = "
                     "[%lld, %lld, %lld], got %s", fn, (long long)L, (long long)S, (long long)(N * H), (long long)L,
                     (long long)S, a);
            em_scope_end(s);
            return NULL;
        }
        mask = ms.ndim == 3 ? em_reshape(attn_mask, EM_SHAPE(N, H, L, S)) : attn_mask;
        if (em_dtype_of(attn_mask) == EM_BOOL) mask = em_eq(mask, em_scalar(0, EM_OPTS(.dtype = EM_BOOL, .device = em_device_of(mask))));
    }
    if (!c->batch_first) {
        query = em_transpose(query, 0, 1);
        key = em_transpose(key, 0, 1);
        value = em_transpose(value, 0, 1);
    }
    em_tensor *w = m->params[0].t, *bias = c->bias ? m->params[1].t : NULL;
    em_tensor *q, *k, *v;
    /* self-attention on strided rows: one projection, then split. Contiguous rows take three
     * projections instead: q, k, v come out contiguous (split_heads is then a view), and
     * backward adds three [rows, E] input gradients instead of zero-filling, copying and
     * adding three [rows, 3E] ones (the narrows' gradients) */
    if (query == key && key == value && !em_is_contiguous(query)) {
        em_tensor *qkv = project(query, w, bias, 0, 3 * E);
        q = em_narrow(qkv, 2, 0, E);
        k = em_narrow(qkv, 2, E, E);
        v = em_narrow(qkv, 2, 2 * E, E);
    } else {
        q = project(query, w, bias, 0, E);
        k = project(key, w, bias, E, E);
        v = project(value, w, bias, 2 * E, E);
    }
    em_tensor *weights = NULL;
    em_tensor *o = sdpa(fn, split_heads(q, H), split_heads(k, H), split_heads(v, H), mask,
                        m->training ? c->dropout : 0.0, is_causal, attn_weights ? &weights : NULL);
    o = em_reshape(em_transpose(o, 1, 2), EM_SHAPE(N, L, E));
    o = em_forward(m->kids[0].m, o);
    if (!c->batch_first) o = em_transpose(o, 0, 1);
    if (attn_weights && o && weights) { /* averaged over heads, as PyTorch's default */
        *attn_weights = em_keep(em_mean(weights, EM_DIMS(1), false));
    }
    em_release(weights);
    if (!o && attn_weights && *attn_weights) {
        em_release(*attn_weights);
        *attn_weights = NULL;
    }
    em_tensor *r = em__scope_return(s, o);
    if (attn_weights && *attn_weights) *attn_weights = em__scoped(*attn_weights);
    return r;
}

static em_tensor *mha_forward(em_module *m, em_tensor *x) {
    return em_multihead_attention_forward(m, x, x, x, NULL, false, NULL);
}

static void mha_describe(const em_module *m, char *buf, size_t size) {
    const mha_ctx *c = m->ctx;
    snprintf(buf, size, "embed_dim=%lld, num_heads=%lld, dropout=%g, batch_first=%s", (long long)c->embed_dim,
             (long long)c->num_heads, c->dropout, c->batch_first ? "True" : "False");
}

static const em_module_ops mha_ops = {.name = "MultiheadAttention", .forward = mha_forward,
                                      .describe = mha_describe, .free_ctx = free};

em_module *em_nn_multihead_attention_ex(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                     bool batch_first) {
    const char *fn = "MultiheadAttention";
    if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads != 0) {
        em_error(EM_ERR_ARGUMENT, "%s: embed_dim (%lld) must be divisible by num_heads (%lld), both > 0",
                                   fn, (long long)embed_dim, (long long)num_heads);
        return NULL;
    }
    if (!(dropout >= 0.0 && dropout <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "%s: dropout must be in [0, 1], got %g", fn, dropout);
        return NULL;
    }
    mha_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        return NULL;
    }
    *c = (mha_ctx){embed_dim, num_heads, dropout, bias, batch_first};
    em_module *m = em_module_new(&mha_ops, c);
    if (!m) return NULL;
    em_grad_mode g = em_no_grad_begin();
    em_scope s = em_scope_begin();
    /* xavier_uniform on in_proj_weight [3E, E]; zero biases; out_proj as a Linear */
    double bound = sqrt(6.0 / (double)(embed_dim + 3 * embed_dim));
    em_tensor *w = em_add_scalar(em_mul_scalar(em_rand(EM_SHAPE(3 * embed_dim, embed_dim), (em_opts){0}), 2 * bound),
                                 -bound);
    em_status st = em_module_add_parameter(m, "in_proj_weight", w);
    if (st == EM_OK && bias) st = em_module_add_parameter(m, "in_proj_bias", em_zeros(EM_SHAPE(3 * embed_dim), (em_opts){0}));
    em_module *out = st == EM_OK ? em_nn_linear_ex(embed_dim, embed_dim, bias) : NULL;
    if (out && bias) st = em_zero_(out->params[1].t);
    if (st == EM_OK) st = out ? em_module_add_child(m, "out_proj", out) : em_last_status();
    em_scope_end(s);
    em_no_grad_end(g);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_nn_multihead_attention(int64_t embed_dim, int64_t num_heads) {
    return em_nn_multihead_attention_ex(embed_dim, num_heads, 0.0, true, false);
}
