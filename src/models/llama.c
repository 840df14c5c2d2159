/* The Llama family's decoder (transformers' LlamaModel, MistralModel, Qwen2Model): token
 * embedding, then per layer x + attn(rms_norm(x)) and x + mlp(rms_norm(x)), the attention with
 * rotary q and k and grouped key-value heads, the MLP down(silu(gate(x)) * up(x)); then the
 * final RMSNorm. Each step is the fused op that rounds where transformers' code rounds. */
#include "models_internal.h"

/* [B, T, n * D] as HF's view(B, T, n, D).transpose(1, 2): [B, n, T, D]. */
static em_tensor *heads(em_tensor *y, int64_t B, int64_t T, int64_t n, int64_t D) {
    return y ? em_transpose(em_view(y, EM_SHAPE(B, T, n, D)), 1, 2) : NULL;
}

/* A projection of h by the layer's weight of role (and its bias), with its adapter if any. */
static em_tensor *proj(em_model *m, int L, int role, em_tensor *h) {
    em_tensor **w = m->layers[L];
    return em__model_lora(m, L, role, h, em__model_linear(h, w[role], w[role + 1]));
}

/* One decoder layer on x [B, T, H]: the new hidden states (scoped). */
static em_tensor *layer_forward(em_model *m, int L, em_tensor *x, em_tensor *cos, em_tensor *sin,
                                em_tensor *key_mask, em_kv_cache *cache) {
    const em_model_config *c = &m->cfg;
    em_tensor **w = m->layers[L];
    int64_t B = em_size(x, 0), T = em_size(x, 1), D = c->head_dim;
    em_shape norm_shape = EM_SHAPE(c->hidden_size);
    em_tensor *h = em_rms_norm(x, norm_shape, w[LW_INPUT_NORM], c->norm_eps);
    em_tensor *q = heads(proj(m, L, LW_Q, h), B, T, c->num_attention_heads, D);
    em_tensor *k = heads(proj(m, L, LW_K, h), B, T, c->num_key_value_heads, D);
    em_tensor *v = heads(proj(m, L, LW_V, h), B, T, c->num_key_value_heads, D);
    if (!q || !k || !v) return NULL;
    em_tensor *a = em__model_attention(cache, L, em_rope(q, cos, sin), em_rope(k, cos, sin), v, key_mask,
                                       c->attention_scale);
    x = em_add(x, proj(m, L, LW_O, a));
    h = em_rms_norm(x, norm_shape, w[LW_POST_NORM], c->norm_eps);
    em_tensor *mlp = em_swiglu(proj(m, L, LW_GATE, h), proj(m, L, LW_UP, h));
    return em_add(x, proj(m, L, LW_DOWN, mlp));
}

/* A checkpointed layer: inputs x, cos, sin and, when there is one, the key mask. */
static em_tensor *checkpointed_layer(void *ctx, em_tensor *const *in, int n) {
    model_layer_ctx *lc = ctx;
    return layer_forward(lc->m, lc->layer, in[0], in[1], in[2], n > 3 ? in[3] : NULL, NULL);
}

em_tensor *em__llama_hidden(em_model *m, em_tensor *ids, em_tensor *positions, em_tensor *key_mask,
                            em_kv_cache *cache, int64_t keep, bool checkpoint) {
    const em_model_config *c = &m->cfg;
    em_tensor *cos, *sin;
    if (em__model_rope_tables(m, cache, positions, &cos, &sin) != EM_OK) return NULL;
    em_tensor *x = m->unit_runner ? em__model_embed_unit(m, ids, NULL)
                                  : em_embedding(ids, m->w[MW_EMBED], EM_NO_PADDING_IDX);
    if (!x) return NULL;
    x = em_keep(x);   /* owned across the layers, whose temporaries each layer's scope frees */
    for (int L = 0; L < (int)c->num_hidden_layers && x; L++) {
        em_scope s = em_scope_begin();
        em_tensor *inputs[4] = {x, cos, sin, key_mask};
        int n = key_mask ? 4 : 3;
        em_tensor *next = m->unit_runner ? m->unit_runner(m->runner_ctx, 1 + L, checkpointed_layer, &m->layer_ctx[L],
                                                          NULL, inputs, n)
                          : checkpoint ? em_checkpoint(checkpointed_layer, &m->layer_ctx[L], inputs, n)
                                       : layer_forward(m, L, x, cos, sin, key_mask, cache);
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
