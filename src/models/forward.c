/* em_model_forward: the arguments (ids, attention mask, positions, cache) checked and brought
 * to the model's device, the family's decoder stack (llama.c, gpt2.c), then the output
 * projection; and the two pieces both families share, nn.Linear and the attention of one
 * layer with or without the cache. */
#include <stdio.h>
#include <string.h>

#include "models_internal.h"
#include "../util/errors.h"

em_tensor *em__model_linear(em_tensor *x, em_tensor *w, em_tensor *b) {
    if (!x || !w) return NULL;
    em_shape s = em_shape_of(x);
    int64_t in = s.d[s.ndim - 1];
    em_tensor *x2 = em_reshape(x, EM_SHAPE(-1, in)), *wt = em_transpose(w, 0, 1);
    em_tensor *y = b ? em_addmm(b, x2, wt, 1, 1) : em_matmul(x2, wt);
    s.d[s.ndim - 1] = em_size(w, 0);
    return y ? em_view(y, s) : NULL;
}

em_tensor *em__model_attention(em_kv_cache *cache, int layer, em_tensor *q, em_tensor *k, em_tensor *v,
                               em_tensor *key_mask, double scale) {
    if (!q || !k || !v) return NULL;
    int64_t B = em_size(q, 0), Hq = em_size(q, 1), T = em_size(q, 2), D = em_size(q, 3);
    em_attention_opts o = {.scale = scale, .causal = true, .key_mask = key_mask};
    /* Under autocast the rotary embedding promotes q and k to float32 while v stays in the
     * autocast dtype; the attention is on autocast's lower-precision list in PyTorch
     * (scaled_dot_product_attention), so all three go to that dtype, as there. */
    em_device_type dev = em_device_of(q).type;
    if (em_autocast_enabled(dev)) {
        em_dtype dt = em_autocast_dtype(dev);
        q = em_to_dtype(q, dt);
        k = em_to_dtype(k, dt);
        v = em_to_dtype(v, dt);
        if (!q || !k || !v) return NULL;
    }
    if (cache && cache->static_step) {
        /* the static decode step: the token's key and value go to the cache's slot write_pos
         * (one where over the whole cache, the position staying on the device), and the
         * query attends over every slot, those not yet written masked out by the cache's mask
         * (key_mask_for set the slot's bit); the query is the last position written, so no
         * causal limit is needed */
        em_tensor *kc = cache->k[layer], *vc = cache->v[layer];
        em_tensor *slot = em_view(em_eq(cache->slots, cache->write_pos), EM_SHAPE(1, 1, cache->capacity, 1));
        if (!slot || em_copy_(kc, em_where(slot, k, kc)) != EM_OK || em_copy_(vc, em_where(slot, v, vc)) != EM_OK)
            return NULL;
        k = kc;
        v = vc;
        o.causal = false;
    } else if (cache) {
        int64_t past = cache->length;
        em_tensor *kc = cache->k[layer], *vc = cache->v[layer];
        if (em_copy_(em_narrow(kc, 2, past, T), k) != EM_OK || em_copy_(em_narrow(vc, 2, past, T), v) != EM_OK)
            return NULL;
        k = em_narrow(kc, 2, 0, past + T);
        v = em_narrow(vc, 2, 0, past + T);
        o.past = past;
    }
    em_tensor *a = em_attention(q, k, v, &o);
    return a ? em_reshape(em_transpose(a, 1, 2), EM_SHAPE(B, T, Hq * D)) : NULL;
}

em_status em__model_rope_tables(em_model *m, em_kv_cache *cache, em_tensor *positions, em_tensor **cos,
                                em_tensor **sin) {
    if (!cache || !cache->static_step || !cache->rope_cos)
        return em_rope_tables(&m->cfg.rope, positions, m->dtype, m->device, cos, sin);
    /* the rows of the tables of every position: positions the caller marked in range
     * (em__index_mark_in_range) are picked on the device, not read back */
    em_shape s = em_shape_of(positions);
    s.d[s.ndim++] = m->cfg.head_dim;
    em_tensor *flat = em_reshape(positions, EM_SHAPE(-1));
    *cos = em_view(em_index_select(cache->rope_cos, 0, flat), s);
    *sin = *cos ? em_view(em_index_select(cache->rope_sin, 0, flat), s) : NULL;
    return *sin ? EM_OK : em_last_status();
}

/* ids [B, T] of an integer dtype: B and T, or an error. */
static em_status check_ids(const em_model *m, em_tensor *ids, int64_t *B, int64_t *T) {
    em_dtype dt = em_dtype_of(ids);
    if (em_ndim(ids) != 2 || (dt != EM_I64 && dt != EM_I32))
        return em_error(EM_ERR_ARGUMENT, "em_model_forward: input_ids must be int64 or int32 [batch, tokens], got %s "
                        "with %d dims", em_dtype_name(dt), em_ndim(ids));
    *B = em_size(ids, 0);
    *T = em_size(ids, 1);
    if (*B < 1 || *T < 1)
        return em_error(EM_ERR_ARGUMENT, "em_model_forward: input_ids [%lld, %lld] holds no token", (long long)*B,
                        (long long)*T);
    (void)m;
    return EM_OK;
}

/* The attention's key mask (bool [B, S], S the keys the layers see) from the caller's
 * attention_mask; with a cache, written into the cache's mask first. NULL without padding. */
static em_status key_mask_for(em_model *m, em_kv_cache *cache, em_tensor *mask, int64_t B, int64_t T,
                              em_tensor **out) {
    *out = NULL;
    int64_t past = cache ? cache->length : 0;
    em_tensor *bool_mask = NULL;
    if (cache) cache->static_step = cache->write_pos && T == 1 && !mask;
    if (cache && cache->static_step) {
        /* the static decode step: the slot write_pos marked written on the device, and the
         * layers see the whole cache's mask (the slots not yet written are 0) */
        em_tensor *slot = em_view(em_eq(cache->slots, cache->write_pos), EM_SHAPE(1, cache->capacity));
        if (!slot || em_copy_(cache->mask, em_where(slot, slot, cache->mask)) != EM_OK) return em_last_status();
        *out = cache->mask;
        return EM_OK;
    }
    if (mask) {
        em_dtype dt = em_dtype_of(mask);
        if (em_ndim(mask) != 2 || em_size(mask, 0) != B || (em_size(mask, 1) != T && em_size(mask, 1) != past + T) ||
            dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16)
            return em_error(EM_ERR_ARGUMENT, "em_model_forward: attention_mask must be bool or integer [%lld, %lld]%s, "
                            "got %s with %d dims", (long long)B, (long long)T,
                            past ? " or, for the whole cache, [B, length + T]" : "", em_dtype_name(dt), em_ndim(mask));
        bool_mask = em_to_dtype(em_to(mask, m->device), EM_BOOL);
        if (!bool_mask) return em_last_status();
    }
    if (!cache) {
        *out = bool_mask;
        return EM_OK;
    }
    if (bool_mask) {
        int64_t S = em_size(bool_mask, 1);
        if (em_copy_(em_narrow(cache->mask, 1, past + T - S, S), bool_mask) != EM_OK) return em_last_status();
        cache->masked = true;
    } else if (em_fill_(em_narrow(cache->mask, 1, past, T), 1) != EM_OK) {
        return em_last_status();
    }
    if (cache->masked && !(*out = em_narrow(cache->mask, 1, 0, past + T))) return em_last_status();
    return EM_OK;
}

/* HF's position_ids on the device as int64 [T] or [B, T]; by default past .. past + T - 1. */
static em_tensor *positions_for(em_model *m, em_tensor *given, int64_t B, int64_t T, int64_t past) {
    if (!given) return em_arange((double)past, (double)(past + T), 1, EM_OPTS(.dtype = EM_I64, .device = m->device));
    em_dtype dt = em_dtype_of(given);
    bool shape_ok = (em_ndim(given) == 1 && em_size(given, 0) == T) ||
                    (em_ndim(given) == 2 && em_size(given, 0) == B && em_size(given, 1) == T);
    if (!shape_ok || (dt != EM_I64 && dt != EM_I32)) {
        em_error(EM_ERR_ARGUMENT, "em_model_forward: position_ids must be int64 or int32 [%lld] or [%lld, %lld], got %s "
                 "with %d dims", (long long)T, (long long)B, (long long)T, em_dtype_name(dt), em_ndim(given));
        return NULL;
    }
    return em_to_dtype(em_to(given, m->device), EM_I64);
}

em_tensor *em__model_final_norm(em_model *m, em_tensor *x) {
    const em_model_config *c = &m->cfg;
    if (c->family == EM_MODEL_GPT2)
        return em_layer_norm(x, EM_SHAPE(c->hidden_size), m->w[MW_NORM], m->w[MW_NORM_BIAS], c->norm_eps);
    return em_rms_norm(x, EM_SHAPE(c->hidden_size), m->w[MW_NORM], c->norm_eps);
}

/* ---- sharded training: the units' parts of the forward (em_model_set_unit_runner) ---- */

static em_tensor *embed_unit(void *ctx, em_tensor *const *in, int n) {
    em_model *m = ctx;
    em_tensor *x = em_embedding(in[0], m->w[MW_EMBED], EM_NO_PADDING_IDX);
    return n > 1 ? em_add(x, em_embedding(in[1], m->w[MW_POSITIONS], EM_NO_PADDING_IDX)) : x;
}

em_tensor *em__model_embed_unit(em_model *m, em_tensor *ids, em_tensor *positions) {
    em_tensor *in[2] = {ids, positions};
    return m->unit_runner(m->runner_ctx, 0, embed_unit, m, NULL, in, positions ? 2 : 1);
}

int em__model_final_unit(const em_model *m) {
    /* tied: the final norm shares unit 0 with the embedding its projection uses */
    return m->cfg.tie_word_embeddings ? 0 : 1 + (int)m->cfg.num_hidden_layers;
}

static em_tensor *final_norm_unit(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    return em__model_final_norm(ctx, in[0]);
}

static em_tensor *final_logits_unit(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    em_model *m = ctx;
    return em__model_linear(em__model_final_norm(m, in[0]), m->w[MW_LM_HEAD], NULL);
}

/* The forward up to the final norm (hidden_only) or through the output projection; trunk:
 * before the final norm (sharded training only). */
static em_tensor *model_forward_ex(em_model *m, em_tensor *input_ids, const em_forward_opts *opts, bool hidden_only,
                                   bool trunk) {
    const char *op = "em_model_forward";
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: argument 'm' is NULL", op);
        return NULL;
    }
    EM_CHECK_ARG(input_ids, op, "input_ids");
    em_forward_opts o = opts ? *opts : (em_forward_opts){0};
    const em_model_config *cfg = &m->cfg;
    int64_t B = 0, T = 0;
    if (check_ids(m, input_ids, &B, &T) != EM_OK) return NULL;
    em_kv_cache *cache = o.cache;
    int64_t past = cache ? cache->length : 0;
    if (cache && cache->model != m) {
        em_error(EM_ERR_ARGUMENT, "%s: the cache was made for another model", op);
        return NULL;
    }
    if (cache && (cache->batch != B || past + T > cache->capacity)) {
        em_error(EM_ERR_ARGUMENT, "%s: %lld sequences of %lld more tokens do not fit the cache (batch %lld, %lld of "
                 "%lld positions used)", op, (long long)B, (long long)T, (long long)cache->batch, (long long)past,
                 (long long)cache->capacity);
        return NULL;
    }
    if (cfg->sliding_window && past + T > cfg->sliding_window) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: %lld positions exceed %s's sliding window of %lld, which Ember does not "
                 "apply: keep the context within it", op, (long long)(past + T), m->family_name,
                 (long long)cfg->sliding_window);
        return NULL;
    }
    if (cfg->family == EM_MODEL_GPT2 && !o.position_ids && past + T > cfg->max_position_embeddings) {
        em_error(EM_ERR_ARGUMENT, "%s: position %lld is past GPT-2's n_positions (%lld learned positions)", op,
                 (long long)(past + T - 1), (long long)cfg->max_position_embeddings);
        return NULL;
    }
    if (m->unit_runner && cache) {
        em_error(EM_ERR_ARGUMENT, "%s: the model is sharded for training (em_model_set_unit_runner), whose units may "
                 "be recomputed in backward: run it without a cache", op);
        return NULL;
    }
    if (o.checkpoint_layers && cache) {
        em_error(EM_ERR_ARGUMENT, "%s: checkpoint_layers recomputes layers in backward, which a cache (written in "
                 "place) cannot allow: use one or the other", op);
        return NULL;
    }
    if (o.logits_to_keep < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: logits_to_keep must not be negative, got %lld", op, (long long)o.logits_to_keep);
        return NULL;
    }
    int64_t keep = o.logits_to_keep && o.logits_to_keep < T ? o.logits_to_keep : T;
    em_scope scope = em_scope_begin();
    em_tensor *logits = NULL, *key_mask = NULL;
    em_tensor *ids = em_to(input_ids, m->device);
    em_tensor *positions = ids ? positions_for(m, o.position_ids, B, T, past) : NULL;
    if (positions && key_mask_for(m, cache, o.attention_mask, B, T, &key_mask) == EM_OK) {
        bool ckpt = o.checkpoint_layers;
        em_tensor *h = cfg->family == EM_MODEL_GPT2 ? em__gpt2_hidden(m, ids, positions, key_mask, cache, keep, ckpt)
                                                    : em__llama_hidden(m, ids, positions, key_mask, cache, keep, ckpt);
        if (m->unit_runner && h && !trunk)   /* the final norm and the projection as their unit */
            logits = m->unit_runner(m->runner_ctx, em__model_final_unit(m), hidden_only ? final_norm_unit
                                    : final_logits_unit, m, NULL, &h, 1);
        else
            logits = hidden_only ? h : em__model_linear(h, m->w[MW_LM_HEAD], NULL);
    }
    if (!logits) {
        em__model_error_prefix("%s (%s)", op, m->family_name);
        em_scope_end(scope);
        return NULL;
    }
    if (cache) cache->length += T;
    return em__scope_return(scope, logits);
}

em_tensor *em_model_forward(em_model *m, em_tensor *input_ids, const em_forward_opts *opts) {
    return model_forward_ex(m, input_ids, opts, false, false);
}

em_tensor *em__model_hidden(em_model *m, em_tensor *input_ids, const em_forward_opts *opts) {
    return model_forward_ex(m, input_ids, opts, true, false);
}

em_tensor *em__model_trunk(em_model *m, em_tensor *input_ids, const em_forward_opts *opts) {
    return model_forward_ex(m, input_ids, opts, true, true);
}
