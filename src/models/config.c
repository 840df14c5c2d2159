/* A model folder's config.json and generation_config.json, read as transformers' config
 * classes read them (LlamaConfig, MistralConfig, Qwen2Config, GPT2Config), and the parameter
 * list each family's model has for a config. The keys that give the model's shape are
 * required: transformers would fill a missing one from its class's defaults, which describe
 * some other model, and the weights would then fail to match with a less useful message. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models_internal.h"
#include "../data/json.h"
#include "../data/parsers.h"

/* A JSON file being read, for messages. */
typedef struct cfg_file {
    char path[4096];
    em__json root;
} cfg_file;

/* Sizes beyond this are no model Ember could hold, and keep products of two in int64. */
#define MAX_DIM ((int64_t)1 << 31)

static em_status read_json(const char *dir, const char *name, bool required, cfg_file *f, bool *found) {
    memset(f, 0, sizeof *f);
    *found = false;
    int len = snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
    if (len < 0 || (size_t)len >= sizeof f->path)
        return em_error(EM_ERR_ARGUMENT, "em_model_load: the folder's path is too long (%zu bytes)", strlen(dir));
    em__file_map map;
    if (!required) {   /* absent is fine; any other failure to read it is not */
        FILE *probe = fopen(f->path, "rb");
        if (!probe && errno == ENOENT) return EM_OK;
        if (probe) fclose(probe);
    }
    if (em__file_map_open(f->path, &map) != EM_OK) return em_last_status();
    em_status s = em__json_parse_file(f->path, (const char *)map.data, map.len, &f->root);
    em__file_map_close(&map);
    if (s != EM_OK) return s;
    if (f->root.type != EM__JSON_OBJECT) {
        em__json_free(&f->root);
        return em_error(EM_ERR_FORMAT, "%s: expected a JSON object", f->path);
    }
    *found = true;
    return EM_OK;
}

/* The value of key, or NULL when it is absent or null (transformers reads null as unset). */
static const em__json *get(const cfg_file *f, const char *key) {
    const em__json *v = em__json_get(&f->root, key);
    return v && v->type != EM__JSON_NULL ? v : NULL;
}

/* An integer in [lo, hi]: the first of keys present (aliases), else dflt, else (required)
 * an error. *out is left alone when nothing is present and there is no default. */
static em_status get_int(const cfg_file *f, const char *key, const char *alias, bool required, int64_t dflt,
                         int64_t lo, int64_t hi, int64_t *out) {
    const em__json *v = get(f, key);
    const char *used = key;
    if (!v && alias) v = get(f, alias), used = alias;
    if (!v) {
        if (required)
            return em_error(EM_ERR_FORMAT, "%s: the key '%s' is missing: the model's shape needs it", f->path, key);
        *out = dflt;
        return EM_OK;
    }
    if (v->type != EM__JSON_NUMBER || v->num != floor(v->num) || v->num < (double)lo || v->num > (double)hi)
        return em_error(EM_ERR_FORMAT, "%s: '%s' must be an integer from %lld to %lld", f->path, used, (long long)lo,
                        (long long)hi);
    *out = (int64_t)v->num;
    return EM_OK;
}

/* A number of obj (the file's root or a nested object) above 0, or at least 0 with
 * zero_ok; dflt when absent or null. */
static em_status get_double(const cfg_file *f, const em__json *obj, const char *key, double dflt, bool zero_ok,
                            double *out) {
    const em__json *v = em__json_get(obj, key);
    if (!v || v->type == EM__JSON_NULL) {
        *out = dflt;
        return EM_OK;
    }
    if (v->type != EM__JSON_NUMBER || !isfinite(v->num) || v->num < 0 || (!zero_ok && v->num == 0))
        return em_error(EM_ERR_FORMAT, "%s: '%s' must be a number %s 0", f->path, key, zero_ok ? "of at least" : "above");
    *out = v->num;
    return EM_OK;
}

static em_status get_bool(const cfg_file *f, const char *key, bool dflt, bool *out) {
    const em__json *v = get(f, key);
    if (!v) {
        *out = dflt;
        return EM_OK;
    }
    if (v->type != EM__JSON_BOOL) return em_error(EM_ERR_FORMAT, "%s: '%s' must be true or false", f->path, key);
    *out = v->b;
    return EM_OK;
}

/* The string at key, or dflt when absent; an error when present and not a string. */
static em_status get_string(const cfg_file *f, const char *key, const char *dflt, const char **out) {
    const em__json *v = get(f, key);
    if (!v) {
        *out = dflt;
        return EM_OK;
    }
    if (v->type != EM__JSON_STRING) return em_error(EM_ERR_FORMAT, "%s: '%s' must be a string", f->path, key);
    *out = v->str;
    return EM_OK;
}

/* bos_token_id, pad_token_id (an int) and eos_token_id (an int or a list) where f has them. */
static em_status read_special_ids(const cfg_file *f, em_model_config *c) {
    const struct { const char *key; int64_t *out; } one[] = {{"bos_token_id", &c->bos_token_id},
                                                            {"pad_token_id", &c->pad_token_id}};
    for (size_t i = 0; i < 2; i++)
        if (get(f, one[i].key) && get_int(f, one[i].key, NULL, false, -1, 0, INT64_MAX, one[i].out) != EM_OK)
            return em_last_status();
    const em__json *eos = get(f, "eos_token_id");
    if (!eos) return EM_OK;
    if (eos->type == EM__JSON_NUMBER) {
        int64_t id;
        if (get_int(f, "eos_token_id", NULL, true, 0, 0, INT64_MAX, &id) != EM_OK) return em_last_status();
        c->n_eos = 1;
        c->eos_token_ids[0] = id;
        return EM_OK;
    }
    if (eos->type != EM__JSON_ARRAY)
        return em_error(EM_ERR_FORMAT, "%s: 'eos_token_id' must be an integer or a list of integers", f->path);
    if (eos->count > EM_MODEL_MAX_EOS)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: 'eos_token_id' lists %d ids; Ember keeps at most %d", f->path,
                        eos->count, EM_MODEL_MAX_EOS);
    for (int i = 0; i < eos->count; i++) {
        const em__json *e = &eos->items[i];
        if (e->type != EM__JSON_NUMBER || !e->is_uint || e->u > (uint64_t)INT64_MAX)
            return em_error(EM_ERR_FORMAT, "%s: eos_token_id[%d] must be a non-negative integer", f->path, i);
        c->eos_token_ids[i] = (int64_t)e->u;
    }
    c->n_eos = eos->count;
    return EM_OK;
}

/* The rotary embedding: transformers 5 writes rope_parameters {rope_type, rope_theta, ...};
 * earlier versions rope_theta and rope_scaling {rope_type (or type), factor, ...}. */
static em_status read_rope(const cfg_file *f, em_model_config *c) {
    const em__json *params = get(f, "rope_parameters"), *scaling = get(f, "rope_scaling");
    if (params && params->type != EM__JSON_OBJECT)
        return em_error(EM_ERR_FORMAT, "%s: 'rope_parameters' must be an object", f->path);
    if (scaling && scaling->type != EM__JSON_OBJECT)
        return em_error(EM_ERR_FORMAT, "%s: 'rope_scaling' must be an object or null", f->path);
    const em__json *kind_src = params ? params : scaling;
    const char *where = params ? "rope_parameters" : "rope_scaling";
    em_rope_config *r = &c->rope;
    r->head_dim = c->head_dim;
    r->scaling = EM_ROPE_DEFAULT;
    double theta = 10000;
    if (get_double(f, &f->root, "rope_theta", 10000, false, &theta) != EM_OK) return em_last_status();
    if (params && get_double(f, params, "rope_theta", theta, false, &theta) != EM_OK) return em_last_status();
    r->theta = theta;
    if (!kind_src) return EM_OK;
    const em__json *kind = em__json_get(kind_src, "rope_type");
    if (!kind || kind->type == EM__JSON_NULL) kind = em__json_get(kind_src, "type");
    if (!kind || kind->type == EM__JSON_NULL) return EM_OK;
    if (kind->type != EM__JSON_STRING) return em_error(EM_ERR_FORMAT, "%s: %s's rope_type must be a string", f->path, where);
    if (!strcmp(kind->str, "default")) return EM_OK;
    if (!strcmp(kind->str, "linear")) r->scaling = EM_ROPE_LINEAR;
    else if (!strcmp(kind->str, "llama3")) r->scaling = EM_ROPE_LLAMA3;
    else
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: %s's rope_type '%.40s' is not one Ember computes (default, linear, "
                        "llama3)", f->path, where, kind->str);
    if (get_double(f, kind_src, "factor", NAN, false, &r->factor) != EM_OK) return em_last_status();
    if (isnan(r->factor)) return em_error(EM_ERR_FORMAT, "%s: %s of type %s needs 'factor'", f->path, where, kind->str);
    if (r->scaling == EM_ROPE_LLAMA3) {
        const char *keys[] = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
        double *outs[] = {&r->low_freq_factor, &r->high_freq_factor, &r->original_max_position_embeddings};
        for (int i = 0; i < 3; i++) {
            if (get_double(f, kind_src, keys[i], NAN, false, outs[i]) != EM_OK) return em_last_status();
            if (isnan(*outs[i])) return em_error(EM_ERR_FORMAT, "%s: %s of type llama3 needs '%s'", f->path, where, keys[i]);
        }
        if (!(r->high_freq_factor > r->low_freq_factor))
            return em_error(EM_ERR_FORMAT, "%s: %s's high_freq_factor (%g) must be above its low_freq_factor (%g)",
                            f->path, where, r->high_freq_factor, r->low_freq_factor);
    }
    return EM_OK;
}

/* The window Mistral's layers (or Qwen2's sliding layers) attend within; 0 for none. */
static em_status read_sliding_window(const cfg_file *f, em_model_config *c) {
    c->sliding_window = 0;
    if (!get(f, "sliding_window")) return EM_OK;
    int64_t w;
    if (get_int(f, "sliding_window", NULL, true, 0, 1, INT64_MAX, &w) != EM_OK) return em_last_status();
    if (!strcmp(c->model_type, "qwen2")) {
        /* Qwen2 slides only where use_sliding_window is set, on the layers layer_types marks
         * (or those from max_window_layers on, for configs that predate layer_types) */
        bool use = false;
        if (get_bool(f, "use_sliding_window", false, &use) != EM_OK) return em_last_status();
        if (!use) return EM_OK;
        const em__json *types = get(f, "layer_types");
        bool slides = false;
        if (types && types->type == EM__JSON_ARRAY) {
            for (int i = 0; i < types->count; i++)
                if (types->items[i].type == EM__JSON_STRING && !strcmp(types->items[i].str, "sliding_attention"))
                    slides = true;
        } else {
            int64_t from;
            if (get_int(f, "max_window_layers", NULL, false, 28, 0, INT64_MAX, &from) != EM_OK) return em_last_status();
            slides = from < c->num_hidden_layers;
        }
        if (!slides) return EM_OK;
    }
    c->sliding_window = w;
    return EM_OK;
}

static em_status read_llama(const cfg_file *f, em_model_config *c) {
    const char *mt = c->model_type;
    bool qwen2 = !strcmp(mt, "qwen2"), mistral = !strcmp(mt, "mistral");
    if (get_int(f, "vocab_size", NULL, true, 0, 1, MAX_DIM, &c->vocab_size) != EM_OK ||
        get_int(f, "hidden_size", NULL, true, 0, 1, MAX_DIM, &c->hidden_size) != EM_OK ||
        get_int(f, "intermediate_size", NULL, true, 0, 1, MAX_DIM, &c->intermediate_size) != EM_OK ||
        get_int(f, "num_hidden_layers", NULL, true, 0, 1, 100000, &c->num_hidden_layers) != EM_OK ||
        get_int(f, "num_attention_heads", NULL, true, 0, 1, 100000, &c->num_attention_heads) != EM_OK ||
        get_int(f, "num_key_value_heads", NULL, false, c->num_attention_heads, 1, 100000, &c->num_key_value_heads) != EM_OK ||
        get_int(f, "max_position_embeddings", NULL, false, mistral ? 4096 * 32 : qwen2 ? 32768 : 2048, 1, INT64_MAX,
                &c->max_position_embeddings) != EM_OK ||
        get_double(f, &f->root, "rms_norm_eps", 1e-6, true, &c->norm_eps) != EM_OK)
        return em_last_status();
    if (!get(f, "head_dim") && c->hidden_size % c->num_attention_heads)
        return em_error(EM_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld (give "
                        "head_dim)", f->path, (long long)c->hidden_size, (long long)c->num_attention_heads);
    if (get_int(f, "head_dim", NULL, false, c->hidden_size / c->num_attention_heads, 2, MAX_DIM, &c->head_dim) != EM_OK)
        return em_last_status();
    if (c->head_dim % 2)
        return em_error(EM_ERR_FORMAT, "%s: head_dim %lld must be even (the rotary embedding turns pairs)", f->path,
                        (long long)c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return em_error(EM_ERR_FORMAT, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                        f->path, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (c->num_attention_heads * c->head_dim > MAX_DIM)
        return em_error(EM_ERR_FORMAT, "%s: num_attention_heads x head_dim is too large", f->path);
    const char *act;
    if (get_string(f, "hidden_act", "silu", &act) != EM_OK) return em_last_status();
    if (strcmp(act, "silu"))
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: hidden_act '%.40s': Ember's Llama-family MLP is SwiGLU (silu)",
                        f->path, act);
    bool attention_bias = false;
    if (get_bool(f, "attention_bias", false, &attention_bias) != EM_OK ||
        get_bool(f, "mlp_bias", false, &c->mlp_bias) != EM_OK ||
        get_bool(f, "tie_word_embeddings", false, &c->tie_word_embeddings) != EM_OK)
        return em_last_status();
    /* Qwen2's q, k, v projections always have biases and its o_proj none; Mistral has none;
     * Llama's attention_bias covers all four */
    c->qkv_bias = qwen2 || (!mistral && attention_bias);
    c->o_bias = !qwen2 && !mistral && attention_bias;
    if (mistral || qwen2) c->mlp_bias = false;
    c->attention_scale = 1.0 / sqrt((double)c->head_dim);
    if (read_rope(f, c) != EM_OK || read_sliding_window(f, c) != EM_OK) return em_last_status();
    return EM_OK;
}

static em_status read_gpt2(const cfg_file *f, em_model_config *c) {
    if (get_int(f, "vocab_size", NULL, true, 0, 1, MAX_DIM, &c->vocab_size) != EM_OK ||
        get_int(f, "n_embd", "hidden_size", true, 0, 1, MAX_DIM, &c->hidden_size) != EM_OK ||
        get_int(f, "n_layer", "num_hidden_layers", true, 0, 1, 100000, &c->num_hidden_layers) != EM_OK ||
        get_int(f, "n_head", "num_attention_heads", true, 0, 1, 100000, &c->num_attention_heads) != EM_OK ||
        get_int(f, "n_positions", "max_position_embeddings", true, 0, 1, MAX_DIM, &c->max_position_embeddings) != EM_OK ||
        get_int(f, "n_inner", NULL, false, 4 * c->hidden_size, 1, MAX_DIM, &c->intermediate_size) != EM_OK ||
        get_double(f, &f->root, "layer_norm_epsilon", 1e-5, true, &c->norm_eps) != EM_OK)
        return em_last_status();
    if (c->hidden_size % c->num_attention_heads)
        return em_error(EM_ERR_FORMAT, "%s: n_embd %lld is not a multiple of n_head %lld", f->path,
                        (long long)c->hidden_size, (long long)c->num_attention_heads);
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = c->hidden_size / c->num_attention_heads;
    const char *act;
    bool scale = true, cross = false;
    if (get_string(f, "activation_function", "gelu_new", &act) != EM_OK ||
        get_bool(f, "scale_attn_weights", true, &scale) != EM_OK ||
        get_bool(f, "scale_attn_by_inverse_layer_idx", false, &c->scale_by_inverse_layer) != EM_OK ||
        get_bool(f, "add_cross_attention", false, &cross) != EM_OK ||
        get_bool(f, "tie_word_embeddings", true, &c->tie_word_embeddings) != EM_OK)
        return em_last_status();
    if (strcmp(act, "gelu_new"))
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: activation_function '%.40s': Ember's GPT-2 computes gelu_new",
                        f->path, act);
    if (cross)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: add_cross_attention: Ember's GPT-2 is the decoder alone", f->path);
    c->qkv_bias = c->o_bias = c->mlp_bias = true;
    c->attention_scale = scale ? 1.0 / sqrt((double)c->head_dim) : 1.0;
    return EM_OK;
}

static const struct {
    const char *arch, *model_type;
    em_model_family family;
} ARCHS[] = {
    {"LlamaForCausalLM", "llama", EM_MODEL_LLAMA},
    {"MistralForCausalLM", "mistral", EM_MODEL_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", EM_MODEL_LLAMA},
    {"GPT2LMHeadModel", "gpt2", EM_MODEL_GPT2},
};

static em_status read_config(const cfg_file *f, em_model_config *c) {
    const em__json *archs = get(f, "architectures");
    if (!archs) return em_error(EM_ERR_FORMAT, "%s: the key 'architectures' is missing: it names the model's class", f->path);
    if (archs->type != EM__JSON_ARRAY || archs->count < 1 || archs->items[0].type != EM__JSON_STRING)
        return em_error(EM_ERR_FORMAT, "%s: 'architectures' must be a list of class names", f->path);
    const char *arch = archs->items[0].str;
    int which = -1;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (!strcmp(arch, ARCHS[i].arch)) which = (int)i;
    if (which < 0)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: architecture '%.60s' is not one Ember runs (LlamaForCausalLM, "
                        "MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel)", f->path, arch);
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    const char *mt;
    if (get_string(f, "model_type", ARCHS[which].model_type, &mt) != EM_OK) return em_last_status();
    if (strcmp(mt, ARCHS[which].model_type))
        return em_error(EM_ERR_FORMAT, "%s: model_type '%.40s' does not go with architecture %s (expected '%s')",
                        f->path, mt, arch, ARCHS[which].model_type);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    c->family = ARCHS[which].family;
    if ((c->family == EM_MODEL_GPT2 ? read_gpt2(f, c) : read_llama(f, c)) != EM_OK) return em_last_status();
    const char *dt = NULL;
    if (get_string(f, "dtype", NULL, &dt) != EM_OK) return em_last_status();
    if (!dt && get_string(f, "torch_dtype", "float32", &dt) != EM_OK) return em_last_status();
    if (!strcmp(dt, "float32")) c->dtype = EM_F32;
    else if (!strcmp(dt, "bfloat16")) c->dtype = EM_BF16;
    else if (!strcmp(dt, "float16")) c->dtype = EM_F16;
    else
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: dtype '%.40s': Ember's models run in float32, bfloat16 or float16",
                        f->path, dt);
    return read_special_ids(f, c);
}

static bool count_parameters(const em_model_config *c, const char *op, int64_t *total);

em_status em_model_config_load(const char *dir, em_model_config *out) {
    if (!dir || !out) return em_error(EM_ERR_ARGUMENT, "em_model_config_load: NULL argument");
    memset(out, 0, sizeof *out);
    out->bos_token_id = out->pad_token_id = -1;
    cfg_file f;
    bool found;
    if (read_json(dir, "config.json", true, &f, &found) != EM_OK) return em_last_status();
    em_status s = read_config(&f, out);
    em__json_free(&f.root);
    if (s != EM_OK) return s;
    int64_t params;
    if (!count_parameters(out, f.path, &params)) return em_last_status();
    /* generation_config.json's ids win, as generate() reads them */
    if (read_json(dir, "generation_config.json", false, &f, &found) != EM_OK) return em_last_status();
    if (found) {
        s = read_special_ids(&f, out);
        em__json_free(&f.root);
    }
    return s;
}

/* ---- the parameters each family has ---- */

typedef struct spec_list {
    model_param *p;
    int n, cap;
} spec_list;

static void add(spec_list *l, int layer, int role, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void add(spec_list *l, int layer, int role, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (l->n >= l->cap) return;   /* counted exactly by the caller: never taken */
    model_param *p = &l->p[l->n++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->layer = layer;
    p->role = role;
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
}

static void llama_specs(const em_model_config *c, spec_list *l) {
    int64_t h = c->hidden_size, q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim,
            i = c->intermediate_size;
    add(l, -1, MW_EMBED, c->vocab_size, h, "model.embed_tokens.weight");
    for (int L = 0; L < (int)c->num_hidden_layers; L++) {
        const char *a = "model.layers.%d.self_attn.%s", *m = "model.layers.%d.mlp.%s";
        add(l, L, LW_INPUT_NORM, h, 0, "model.layers.%d.input_layernorm.weight", L);
        add(l, L, LW_Q, q, h, a, L, "q_proj.weight");
        if (c->qkv_bias) add(l, L, LW_Q_BIAS, q, 0, a, L, "q_proj.bias");
        add(l, L, LW_K, kv, h, a, L, "k_proj.weight");
        if (c->qkv_bias) add(l, L, LW_K_BIAS, kv, 0, a, L, "k_proj.bias");
        add(l, L, LW_V, kv, h, a, L, "v_proj.weight");
        if (c->qkv_bias) add(l, L, LW_V_BIAS, kv, 0, a, L, "v_proj.bias");
        add(l, L, LW_O, h, q, a, L, "o_proj.weight");
        if (c->o_bias) add(l, L, LW_O_BIAS, h, 0, a, L, "o_proj.bias");
        add(l, L, LW_GATE, i, h, m, L, "gate_proj.weight");
        if (c->mlp_bias) add(l, L, LW_GATE_BIAS, i, 0, m, L, "gate_proj.bias");
        add(l, L, LW_UP, i, h, m, L, "up_proj.weight");
        if (c->mlp_bias) add(l, L, LW_UP_BIAS, i, 0, m, L, "up_proj.bias");
        add(l, L, LW_DOWN, h, i, m, L, "down_proj.weight");
        if (c->mlp_bias) add(l, L, LW_DOWN_BIAS, h, 0, m, L, "down_proj.bias");
        add(l, L, LW_POST_NORM, h, 0, "model.layers.%d.post_attention_layernorm.weight", L);
    }
    add(l, -1, MW_NORM, h, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) add(l, -1, MW_LM_HEAD, c->vocab_size, h, "lm_head.weight");
}

static void gpt2_specs(const em_model_config *c, spec_list *l) {
    int64_t h = c->hidden_size, i = c->intermediate_size;
    add(l, -1, MW_EMBED, c->vocab_size, h, "transformer.wte.weight");
    add(l, -1, MW_POSITIONS, c->max_position_embeddings, h, "transformer.wpe.weight");
    for (int L = 0; L < (int)c->num_hidden_layers; L++) {
        const char *p = "transformer.h.%d.%s";
        add(l, L, GW_LN1, h, 0, p, L, "ln_1.weight");
        add(l, L, GW_LN1_BIAS, h, 0, p, L, "ln_1.bias");
        add(l, L, GW_ATTN, h, 3 * h, p, L, "attn.c_attn.weight");
        add(l, L, GW_ATTN_BIAS, 3 * h, 0, p, L, "attn.c_attn.bias");
        add(l, L, GW_ATTN_PROJ, h, h, p, L, "attn.c_proj.weight");
        add(l, L, GW_ATTN_PROJ_BIAS, h, 0, p, L, "attn.c_proj.bias");
        add(l, L, GW_LN2, h, 0, p, L, "ln_2.weight");
        add(l, L, GW_LN2_BIAS, h, 0, p, L, "ln_2.bias");
        add(l, L, GW_FC, h, i, p, L, "mlp.c_fc.weight");
        add(l, L, GW_FC_BIAS, i, 0, p, L, "mlp.c_fc.bias");
        add(l, L, GW_MLP_PROJ, i, h, p, L, "mlp.c_proj.weight");
        add(l, L, GW_MLP_PROJ_BIAS, h, 0, p, L, "mlp.c_proj.bias");
    }
    add(l, -1, MW_NORM, h, 0, "transformer.ln_f.weight");
    add(l, -1, MW_NORM_BIAS, h, 0, "transformer.ln_f.bias");
    if (!c->tie_word_embeddings) add(l, -1, MW_LM_HEAD, c->vocab_size, h, "lm_head.weight");
}

em_status em__model_param_specs(const em_model_config *c, model_param **out, int *n) {
    *out = NULL;
    *n = 0;
    if (c->num_hidden_layers > 100000) return em_error(EM_ERR_ARGUMENT, "em_model_load: too many layers");
    int cap = 6 + 16 * (int)c->num_hidden_layers;
    spec_list l = {calloc((size_t)cap, sizeof(model_param)), 0, cap};
    if (!l.p) return em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of memory for %d parameters", cap);
    if (c->family == EM_MODEL_GPT2) gpt2_specs(c, &l);
    else llama_specs(c, &l);
    *out = l.p;
    *n = l.n;
    return EM_OK;
}

/* The parameter count of c's shape in *total; false, with an error, when the count or its bytes
 * in float32 would not fit 64 bits (each dimension may reach 2^31, so two of them multiplied
 * and summed over the layers can pass 2^63). */
static bool count_parameters(const em_model_config *c, const char *op, int64_t *total) {
    model_param *p;
    int n;
    *total = 0;
    if (em__model_param_specs(c, &p, &n) != EM_OK) return false;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        int64_t numel;
        ok = !__builtin_mul_overflow(p[i].shape[0], p[i].ndim == 2 ? p[i].shape[1] : 1, &numel) &&
             !__builtin_add_overflow(*total, numel, total) && *total <= INT64_MAX / 4;
    }
    free(p);
    if (!ok) {
        *total = 0;
        em_error(EM_ERR_ARGUMENT, "%s: a model of this shape (hidden size %lld, %lld layers, intermediate size "
                 "%lld, vocabulary %lld) has more parameters than a 64-bit count of their bytes holds", op,
                 (long long)c->hidden_size, (long long)c->num_hidden_layers, (long long)c->intermediate_size,
                 (long long)c->vocab_size);
    }
    return ok;
}

int64_t em_model_config_num_parameters(const em_model_config *cfg) {
    if (!cfg) {
        em_error(EM_ERR_ARGUMENT, "em_model_config_num_parameters: cfg is NULL");
        return 0;
    }
    int64_t total;
    return count_parameters(cfg, "em_model_config_num_parameters", &total) ? total : 0;
}
