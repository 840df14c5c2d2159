/* Inside src/models: the loaded model, its weights by role, and the pieces the files of this
 * folder share. The layer is an upper one like nn (public API, core's internal_api.h); it
 * reads JSON and safetensors headers with src/data's parsers (json.h, parsers.h), which
 * scripts/check_layers.sh allows models alone among the upper layers. */
#ifndef EM_MODELS_INTERNAL_H
#define EM_MODELS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/ember.h>
#include <ember/models.h>
#include "../core/internal_api.h"

/* A decoder layer's weights, by role; a role the family or the config lacks stays NULL. */
enum {
    /* the Llama family */
    LW_INPUT_NORM, LW_POST_NORM,
    LW_Q, LW_Q_BIAS, LW_K, LW_K_BIAS, LW_V, LW_V_BIAS, LW_O, LW_O_BIAS,
    LW_GATE, LW_GATE_BIAS, LW_UP, LW_UP_BIAS, LW_DOWN, LW_DOWN_BIAS,
    LAYER_WEIGHTS
};
enum {
    /* GPT-2, in the same array (its Conv1D weights are [in, out]) */
    GW_LN1, GW_LN1_BIAS, GW_ATTN, GW_ATTN_BIAS, GW_ATTN_PROJ, GW_ATTN_PROJ_BIAS,
    GW_LN2, GW_LN2_BIAS, GW_FC, GW_FC_BIAS, GW_MLP_PROJ, GW_MLP_PROJ_BIAS
};
_Static_assert((int)GW_MLP_PROJ_BIAS < (int)LAYER_WEIGHTS, "GPT-2's roles fit in a layer's array");

/* The whole model's weights outside the layers. */
enum { MW_EMBED, MW_POSITIONS, MW_NORM, MW_NORM_BIAS, MW_LM_HEAD, MODEL_WEIGHTS };

/* One parameter: its transformers name, its expected shape, its role, and its tensor. */
typedef struct model_param {
    char name[96];
    int ndim;
    int64_t shape[2];
    int layer;          /* the decoder layer, or -1 for the model's own weights (MW_*) */
    int role;           /* LW_* / GW_* in a layer, MW_* outside */
    em_tensor *t;       /* the loaded tensor (owned by the model) */
    bool read_only;     /* t views the weight file's bytes (mapped or read-only pages), not a copy */
} model_param;

struct em_model {
    em_model_config cfg;
    em_device device;
    em_dtype dtype;
    char family_name[64];    /* the architecture, for messages */
    int nparams;
    model_param *params;     /* in transformers' order */
    em_tensor *w[MODEL_WEIGHTS];
    em_tensor *(*layers)[LAYER_WEIGHTS];   /* num_hidden_layers of them */
    size_t weight_bytes, mapped_bytes;
    /* LoRA (finetune.c): the adapters' module (NULL: none), and per layer and role the
     * adapters lora_A [r, in] and lora_B [out, r] (borrowed from the module; NULL: none). */
    em_module *lora;
    em_tensor *(*lora_ab)[LAYER_WEIGHTS][2];
    int64_t lora_rank;
    double lora_alpha, lora_scale;
    char lora_targets[256];            /* the config's targets, comma-separated */
    /* Full fine-tuning (finetune.c, em_model_unfreeze): every weight as a parameter, named as
     * transformers names it (NULL: the weights are frozen). */
    em_module *full;
    struct model_layer_ctx *layer_ctx; /* per layer, what em_checkpoint hands back */
    /* Sharded training (em_model_set_unit_runner): each unit's part of the forward (the
     * embeddings, each decoder layer, the final norm and the output projection) runs through
     * it; NULL: the plain forward. */
    em_model_unit_runner unit_runner;
    void *runner_ctx;
};

/* What a checkpointed decoder layer's function needs besides its inputs. */
typedef struct model_layer_ctx {
    em_model *m;
    int layer;
} model_layer_ctx;

struct em_kv_cache {
    const em_model *model;
    int64_t batch, capacity, length;
    int nlayers;
    em_tensor **k, **v;      /* per layer [batch, n_kv, capacity, head_dim] */
    em_tensor *mask;         /* bool [batch, capacity] */
    bool masked;             /* a mask with padding was given: attention reads the cache's mask */
    /* The static decode form (em__kv_cache_static_begin): a one-token step whose shapes,
     * addresses and kernel arguments do not depend on the position, so that a CUDA graph can
     * record it once and replay it for every token. The step writes its key and value at the
     * device position write_pos, attends over the whole cache with the cache's mask (0 past
     * the written positions), and takes its rotary rows from tables of every position. */
    em_tensor *write_pos;    /* int64 [1] on the device: where the next token goes; NULL: dynamic */
    em_tensor *slots;        /* int64 [capacity] on the device: 0 .. capacity - 1 */
    em_tensor *rope_cos, *rope_sin;   /* [capacity, head_dim] in the model's dtype (rotary families) */
    bool static_step;        /* set by the forward for the step it runs: static form this call */
};

/* Turns c to the static decode form (above) for its one-token steps without an attention
 * mask; the caller writes the position into c->write_pos (and sets c->length to it) before
 * each step. Tables and slots are made here once, on the model's device. */
em_status em__kv_cache_static_begin(em_kv_cache *c);

/* ---- config.c ---- */
/* The parameter list of cfg's model, in transformers' order, with names, shapes and roles
 * (no tensors yet). Malloc'ed into *out (n entries); EM_ERR_OUT_OF_MEMORY otherwise. */
em_status em__model_param_specs(const em_model_config *cfg, model_param **out, int *n);

/* ---- weights.c ---- */
/* Finds dir's weights (model.safetensors, or the shards of model.safetensors.index.json),
 * checks every tensor against params (by name, shape; nothing missing, nothing extra) and
 * fills each params[i].t on device in dtype: a read-only view of the mapped file on the CPU
 * when the dtype matches, else a converted copy. read_weights (the CPU only): each file read
 * into memory instead of mapped. *mapped: bytes that are file pages. On failure every tensor
 * made is released and every file unmapped. */
em_status em__model_load_weights(const char *dir, const em_model_config *cfg, model_param *params, int nparams,
                                 em_device device, em_dtype dtype, bool read_weights, size_t *mapped);

/* ---- forward.c ---- */
/* y = x W^T (+ b) for x [..., in] and W [out, in] (nn.Linear); b may be NULL. */
em_tensor *em__model_linear(em_tensor *x, em_tensor *w, em_tensor *b);
/* em_model_forward's checks and decoder stack without the output projection: the hidden
 * states after the final norm, [B, T (or logits_to_keep), hidden] in the model's dtype, for
 * a loss that applies the output embedding itself (em_model_loss's fused cross-entropy). */
em_tensor *em__model_hidden(em_model *m, em_tensor *input_ids, const em_forward_opts *opts);
/* The attention of one layer for q [B, Hq, T, D], k and v [B, Hkv, T, D] of this call's
 * tokens: with a cache, k and v are written at its length and the attention reads the cache
 * (causal from that offset, its key mask); in a static decode step (cache->static_step),
 * written at the device position write_pos and the whole cache read under its mask; without
 * a cache, causal over the call's tokens with key_mask (bool [B, T] or NULL). Result
 * [B, T, Hq * D]. */
em_tensor *em__model_attention(em_kv_cache *cache, int layer, em_tensor *q, em_tensor *k, em_tensor *v,
                               em_tensor *key_mask, double scale);
/* The rotary tables cos and sin for positions [T] or [B, T] (em_rope_tables), or in a static
 * decode step, rows of the cache's tables picked on the device. */
em_status em__model_rope_tables(em_model *m, em_kv_cache *cache, em_tensor *positions, em_tensor **cos,
                                em_tensor **sin);
/* The families' forwards (llama.c, gpt2.c): hidden states of the last `keep` positions of ids
 * [B, T] after the final norm, [B, keep, hidden]. positions [T] or [B, T] int64 on device. */
em_tensor *em__llama_hidden(em_model *m, em_tensor *ids, em_tensor *positions, em_tensor *key_mask,
                            em_kv_cache *cache, int64_t keep, bool checkpoint);
em_tensor *em__gpt2_hidden(em_model *m, em_tensor *ids, em_tensor *positions, em_tensor *key_mask,
                           em_kv_cache *cache, int64_t keep, bool checkpoint);
/* The family's final norm of x [B, T, hidden]. */
em_tensor *em__model_final_norm(em_model *m, em_tensor *x);
/* Sharded training (m->unit_runner set): the token embedding (GPT-2: plus the positions')
 * through the runner as unit 0, inputs ids (and positions). */
em_tensor *em__model_embed_unit(em_model *m, em_tensor *ids, em_tensor *positions);
/* The unit (em_model_unit_of's numbering) of the final norm and output projection. */
int em__model_final_unit(const em_model *m);
/* em__model_hidden before the final norm, for a caller that runs the norm itself (the
 * sharded loss runs the norm and the loss as one unit). Only with m->unit_runner. */
em_tensor *em__model_trunk(em_model *m, em_tensor *input_ids, const em_forward_opts *opts);

/* ---- finetune.c ---- */
/* y plus the adapter of (layer, role) applied to x, (x A^T B^T) * scale in float32 added in
 * y's dtype; y itself (not a new reference) when that projection has no adapter. */
em_tensor *em__model_lora(em_model *m, int layer, int role, em_tensor *x, em_tensor *y);
/* Rows per chunk of em_model_loss's fused cross-entropy for a vocabulary of vocab ids (also
 * what em_model_estimate_finetune counts). */
int64_t em__model_loss_chunk(int64_t vocab);
/* Frees the adapters (em_model_free). */
void em__model_lora_free(em_model *m);

/* Re-records the pending error as "<prefix>: <its message>", keeping its status. */
em_status em__model_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
