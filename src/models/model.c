/* em_model: load a model folder (config, then weights), its accessors, and the key-value
 * cache. The forward pass is forward.c with the families' llama.c and gpt2.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models_internal.h"
#include "../util/errors.h"

em_status em__model_error_prefix(const char *fmt, ...) {
    em_error_state saved;
    em__error_save(&saved);
    if (saved.status == EM_OK) return EM_OK;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    em_clear_error();
    return em_error(saved.status, "%s: %s", prefix, saved.message);
}

void em_model_free(em_model *m) {
    if (!m) return;
    em__model_lora_free(m);
    em_module_free(m->full);
    for (int i = 0; i < m->nparams; i++) em_release(m->params[i].t);
    free(m->params);
    free(m->layers);
    free(m->layer_ctx);
    free(m);
}

em_model *em_model_load(const char *dir, const em_model_opts *opts) {
    em_model_opts o = opts ? *opts : (em_model_opts){0};
    if (!dir) {
        em_error(EM_ERR_ARGUMENT, "em_model_load: dir is NULL");
        return NULL;
    }
    em_device_props props;
    em_device device = em_device_resolve(o.device);
    if (em_device_get_props(device, &props) != EM_OK) {
        em__model_error_prefix("em_model_load(%s)", dir);
        return NULL;
    }
    em_model *m = calloc(1, sizeof *m);
    if (!m) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory");
        return NULL;
    }
    m->device = device;
    if (em_model_config_load(dir, &m->cfg) != EM_OK) goto fail;
    m->dtype = o.dtype_auto ? m->cfg.dtype : o.dtype;
    if (m->dtype != EM_F32 && m->dtype != EM_BF16 && m->dtype != EM_F16) {
        em_error(EM_ERR_DTYPE, "em_model_load: models compute in float32, bfloat16 or float16, not %s",
                 em_dtype_name(m->dtype));
        goto fail;
    }
    snprintf(m->family_name, sizeof m->family_name, "%s", m->cfg.architecture);
    if (em__model_param_specs(&m->cfg, &m->params, &m->nparams) != EM_OK) goto fail;
    m->layers = calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
    m->layer_ctx = calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layer_ctx);
    if (!m->layers || !m->layer_ctx) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory");
        goto fail;
    }
    if (em__model_load_weights(dir, &m->cfg, m->params, m->nparams, m->device, m->dtype, o.read_weights,
                               &m->mapped_bytes) != EM_OK)
        goto fail;
    for (int i = 0; i < m->nparams; i++) {
        model_param *p = &m->params[i];
        if (p->layer < 0) m->w[p->role] = p->t;
        else m->layers[p->layer][p->role] = p->t;
        m->weight_bytes += em_nbytes(p->t);
    }
    if (m->cfg.tie_word_embeddings) m->w[MW_LM_HEAD] = m->w[MW_EMBED];
    for (int L = 0; L < (int)m->cfg.num_hidden_layers; L++) m->layer_ctx[L] = (model_layer_ctx){.m = m, .layer = L};
    return m;
fail:
    em_model_free(m);
    return NULL;
}

/* A NULL model or cache: an error naming the call, and ret. */
#define MODEL_CHECK(p, op, ret)                                                   \
    do {                                                                          \
        if (!(p)) {                                                               \
            em_error(EM_ERR_ARGUMENT, "%s: argument '%s' is NULL", op, #p);       \
            return ret;                                                           \
        }                                                                         \
    } while (0)

const em_model_config *em_model_config_of(const em_model *m) {
    MODEL_CHECK(m, "em_model_config_of", NULL);
    return &m->cfg;
}

em_device em_model_device(const em_model *m) {
    MODEL_CHECK(m, "em_model_device", EM_DEVICE_CPU);
    return m->device;
}

em_dtype em_model_dtype(const em_model *m) {
    MODEL_CHECK(m, "em_model_dtype", EM_F32);
    return m->dtype;
}

int em_model_num_parameters(const em_model *m) {
    MODEL_CHECK(m, "em_model_num_parameters", 0);
    return m->nparams;
}

em_tensor *em_model_parameter(const em_model *m, int i, const char **name) {
    MODEL_CHECK(m, "em_model_parameter", NULL);
    if (i < 0 || i >= m->nparams) {
        if (name) *name = NULL;
        return NULL;
    }
    if (name) *name = m->params[i].name;
    return em__scoped(em_retain(m->params[i].t));
}

em_tensor *em_model_parameter_by_name(const em_model *m, const char *name) {
    MODEL_CHECK(m, "em_model_parameter_by_name", NULL);
    EM_CHECK_ARG(name, "em_model_parameter_by_name", "name");
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return em__scoped(em_retain(m->params[i].t));
    em_error(EM_ERR_ARGUMENT, "em_model_parameter_by_name: %s has no parameter '%.200s'", m->family_name, name);
    return NULL;
}

size_t em_model_weight_bytes(const em_model *m) {
    MODEL_CHECK(m, "em_model_weight_bytes", 0);
    return m->weight_bytes;
}

size_t em_model_mapped_bytes(const em_model *m) {
    MODEL_CHECK(m, "em_model_mapped_bytes", 0);
    return m->mapped_bytes;
}

/* ---- the key-value cache ---- */

void em_kv_cache_free(em_kv_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->nlayers; i++) {
        if (c->k) em_release(c->k[i]);
        if (c->v) em_release(c->v[i]);
    }
    em_release(c->mask);
    em_release(c->write_pos);
    em_release(c->slots);
    em_release(c->rope_cos);
    em_release(c->rope_sin);
    free(c->k);
    free(c->v);
    free(c);
}

em_kv_cache *em_kv_cache_new(const em_model *m, int64_t batch, int64_t max_len) {
    MODEL_CHECK(m, "em_kv_cache_new", NULL);
    if (batch < 1 || max_len < 1) {
        em_error(EM_ERR_ARGUMENT, "em_kv_cache_new: batch (%lld) and max_len (%lld) must be at least 1",
                 (long long)batch, (long long)max_len);
        return NULL;
    }
    const em_model_config *cfg = &m->cfg;
    em_kv_cache *c = calloc(1, sizeof *c);
    int n = (int)cfg->num_hidden_layers;
    if (c) {
        c->k = calloc((size_t)n, sizeof *c->k);
        c->v = calloc((size_t)n, sizeof *c->v);
    }
    if (!c || !c->k || !c->v) {
        em_kv_cache_free(c);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_kv_cache_new: out of host memory");
        return NULL;
    }
    c->model = m;
    c->batch = batch;
    c->capacity = max_len;
    c->nlayers = n;
    em_opts o = EM_OPTS(.dtype = m->dtype, .device = m->device);
    em_shape s = EM_SHAPE(batch, cfg->num_key_value_heads, max_len, cfg->head_dim);
    em_scope scope = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *k = em_zeros(s, o), *v = em_zeros(s, o);
        c->k[i] = k ? em_keep(k) : NULL;
        c->v[i] = v ? em_keep(v) : NULL;
        if (!k || !v) break;
    }
    em_tensor *mask = em_zeros(EM_SHAPE(batch, max_len), EM_OPTS(.dtype = EM_BOOL, .device = m->device));
    c->mask = mask ? em_keep(mask) : NULL;
    em_scope_end(scope);
    if (!c->mask || !c->k[n - 1] || !c->v[n - 1]) {
        em_kv_cache_free(c);
        em__model_error_prefix("em_kv_cache_new(batch %lld, max_len %lld)", (long long)batch, (long long)max_len);
        return NULL;
    }
    return c;
}

em_status em__kv_cache_static_begin(em_kv_cache *c) {
    if (!c) return em_error(EM_ERR_ARGUMENT, "em__kv_cache_static_begin: argument 'c' is NULL");
    if (c->write_pos) return EM_OK;
    const em_model *m = c->model;
    em_opts io = EM_OPTS(.dtype = EM_I64, .device = m->device);
    em_scope scope = em_scope_begin();
    em_tensor *pos = em_zeros(EM_SHAPE(1), io), *slots = em_arange(0, (double)c->capacity, 1, io);
    em_tensor *cos = NULL, *sin = NULL;
    em_status st = pos && slots ? EM_OK : em_last_status();
    if (st == EM_OK && m->cfg.family != EM_MODEL_GPT2)   /* GPT-2's positions are learned: no tables */
        st = em_rope_tables(&m->cfg.rope, slots, m->dtype, m->device, &cos, &sin);
    if (st == EM_OK) {
        c->write_pos = em_keep(pos);
        c->slots = em_keep(slots);
        c->rope_cos = cos ? em_keep(cos) : NULL;
        c->rope_sin = sin ? em_keep(sin) : NULL;
    }
    em_scope_end(scope);
    if (st != EM_OK) return em__model_error_prefix("em_kv_cache (static decode, %lld positions)", (long long)c->capacity);
    return EM_OK;
}

int64_t em_kv_cache_length(const em_kv_cache *c) {
    MODEL_CHECK(c, "em_kv_cache_length", 0);
    return c->length;
}

int64_t em_kv_cache_capacity(const em_kv_cache *c) {
    MODEL_CHECK(c, "em_kv_cache_capacity", 0);
    return c->capacity;
}

int64_t em_kv_cache_batch(const em_kv_cache *c) {
    MODEL_CHECK(c, "em_kv_cache_batch", 0);
    return c->batch;
}

size_t em_kv_cache_nbytes(const em_kv_cache *c) {
    MODEL_CHECK(c, "em_kv_cache_nbytes", 0);
    size_t n = 0;
    for (int i = 0; i < c->nlayers; i++) n += em_nbytes(c->k[i]) + em_nbytes(c->v[i]);
    return n;
}

em_status em_kv_cache_reset(em_kv_cache *c) {
    if (!c) return em_error(EM_ERR_ARGUMENT, "em_kv_cache_reset: the cache is NULL");
    c->length = 0;
    c->masked = false;
    return em_zero_(c->mask);
}

em_tensor *em_kv_cache_layer(em_kv_cache *c, int layer, bool want_values) {
    MODEL_CHECK(c, "em_kv_cache_layer", NULL);
    if (layer < 0 || layer >= c->nlayers) {
        em_error(EM_ERR_ARGUMENT, "em_kv_cache_layer: layer %d is outside [0, %d)", layer, c->nlayers);
        return NULL;
    }
    return em__scoped(em_retain(want_values ? c->v[layer] : c->k[layer]));
}
