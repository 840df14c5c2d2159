/* GPT-2's decoder (transformers' GPT2Model): token plus learned position embeddings, then per
 * layer x + attn(ln_1(x)) and x + mlp(ln_2(x)) with Conv1D projections (weights [in, out]: an
 * addmm of the bias, as transformers' Conv1D), gelu_new between the MLP's two; then ln_f. */
#include <math.h>
#include "models_internal.h"

/* transformers' Conv1D: addmm(bias, x.view(-1, in), weight), weight [in, out]. */
static em_tensor *conv1d(em_tensor *x, em_tensor *w, em_tensor *b) {
    if (!x) return NULL;
    em_shape s = em_shape_of(x);
    em_tensor *y = em_addmm(b, em_reshape(x, EM_SHAPE(-1, s.d[s.ndim - 1])), w, 1, 1);
    s.d[s.ndim - 1] = em_size(w, 1);
    return y ? em_view(y, s) : NULL;
}

/* gelu_new, transformers' NewGELUActivation, op by op as its Python expression runs (so a
 * bfloat16 model rounds where transformers' does):
 * 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0)))). */
static em_tensor *gelu_new(em_tensor *x) {
    em_tensor *inner = em_add(x, em_mul_scalar(em_pow_scalar(x, 3.0), 0.044715));
    em_tensor *t = em_tanh(em_mul_scalar(inner, sqrt(2.0 / M_PI)));
    return em_mul(em_mul_scalar(x, 0.5), em_add_scalar(t, 1.0));
}

/* A third of c_attn's output as heads: [B, T, 3H] -> [B, n, T, D]. */
static em_tensor *heads(em_tensor *qkv, int part, int64_t n, int64_t D) {
    if (!qkv) return NULL;
    int64_t B = em_size(qkv, 0), T = em_size(qkv, 1);
    em_tensor *third = em_reshape(em_narrow(qkv, 2, part * n * D, n * D), EM_SHAPE(B, T, n, D));
    return third ? em_transpose(third, 1, 2) : NULL;
}

/* A Conv1D projection of h by the layer's weight of role (and its bias), with its adapter if any. */
static em_tensor *proj(em_model *m, int L, int role, em_tensor *h) {
    em_tensor **w = m->layers[L];
    return em__model_lora(m, L, role, h, conv1d(h, w[role], w[role + 1]));
}

static em_tensor *layer_forward(em_model *m, int L, em_tensor *x, em_tensor *key_mask, em_kv_cache *cache) {
    const em_model_config *c = &m->cfg;
    em_tensor **w = m->layers[L];
    em_shape norm_shape = EM_SHAPE(c->hidden_size);
    int64_t n = c->num_attention_heads, D = c->head_dim;
    double scale = c->attention_scale / (c->scale_by_inverse_layer ? (double)(L + 1) : 1.0);
    em_tensor *qkv = proj(m, L, GW_ATTN, em_layer_norm(x, norm_shape, w[GW_LN1], w[GW_LN1_BIAS], c->norm_eps));
    em_tensor *a = em__model_attention(cache, L, heads(qkv, 0, n, D), heads(qkv, 1, n, D), heads(qkv, 2, n, D),
                                       key_mask, scale);
    x = em_add(proj(m, L, GW_ATTN_PROJ, a), x);
    em_tensor *h = em_layer_norm(x, norm_shape, w[GW_LN2], w[GW_LN2_BIAS], c->norm_eps);
    em_tensor *f = proj(m, L, GW_MLP_PROJ, gelu_new(proj(m, L, GW_FC, h)));
    return em_add(x, f);
}

/* A checkpointed layer: inputs x and, when there is one, the key mask. */
static em_tensor *checkpointed_layer(void *ctx, em_tensor *const *in, int n) {
    model_layer_ctx *lc = ctx;
    return layer_forward(lc->m, lc->layer, in[0], n > 1 ? in[1] : NULL, NULL);
}

em_tensor *em__gpt2_hidden(em_model *m, em_tensor *ids, em_tensor *positions, em_tensor *key_mask,
                           em_kv_cache *cache, int64_t keep, bool checkpoint) {
    const em_model_config *c = &m->cfg;
    em_tensor *x = m->unit_runner ? em__model_embed_unit(m, ids, positions)
                                  : em_add(em_embedding(ids, m->w[MW_EMBED], EM_NO_PADDING_IDX),
                                           em_embedding(positions, m->w[MW_POSITIONS], EM_NO_PADDING_IDX));
    if (!x) return NULL;
    x = em_keep(x);   /* owned across the layers, whose temporaries each layer's scope frees */
    for (int L = 0; L < (int)c->num_hidden_layers && x; L++) {
        em_scope s = em_scope_begin();
        em_tensor *inputs[2] = {x, key_mask};
        int n = key_mask ? 2 : 1;
        em_tensor *next = m->unit_runner ? m->unit_runner(m->runner_ctx, 1 + L, checkpointed_layer, &m->layer_ctx[L],
                                                          NULL, inputs, n)
                          : checkpoint ? em_checkpoint(checkpointed_layer, &m->layer_ctx[L], inputs, n)
                                       : layer_forward(m, L, x, key_mask, cache);
        if (next) next = em_keep(next);
        em_scope_end(s);
        em_release(x);
        x = next;
    }
    if (!x) return NULL;
    int64_t T = em_size(x, 1);
    em_tensor *last = em_narrow(x, 1, T - keep, keep);
    /* sharded: the caller runs the norm with the output projection, as one unit */
    em_tensor *out = m->unit_runner ? last : em__model_final_norm(m, last);
    em_release(x);
    return out;
}
