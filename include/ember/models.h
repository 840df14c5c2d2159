/* Language models from Hugging Face model folders: load the weights of a folder as
 * `save_pretrained` writes it, run the forward pass with a key-value cache, measure perplexity.
 *
 *   em_model *m = em_model_load("Llama-3.2-1B", &(em_model_opts){.dtype = EM_BF16});
 *   em_kv_cache *cache = em_kv_cache_new(m, 1, 512);
 *   em_tensor *logits = em_model_forward(m, ids, &(em_forward_opts){.cache = cache});   // prefill
 *   ...                                                                                 // then one id per step
 *   em_kv_cache_free(cache);
 *   em_model_free(m);
 *
 * Families (config.json's "architectures"):
 *   - the Llama family: LlamaForCausalLM, MistralForCausalLM (within its sliding window: a
 *     longer context is an error, not a silent full attention) and Qwen2ForCausalLM: RMSNorm,
 *     rotary position embeddings (rope_theta; rope_scaling / rope_parameters of type default,
 *     linear or llama3), a SwiGLU MLP, grouped- and multi-query attention (num_key_value_heads),
 *     attention biases (Qwen2's on q, k and v; Llama's attention_bias on all four), mlp_bias,
 *     tied or separate output embeddings;
 *   - GPT2LMHeadModel: learned positions, LayerNorm, gelu_new (the tanh approximation, composed
 *     as transformers' NewGELUActivation), Conv1D weights [in, out], tied output embeddings.
 * The parameters keep transformers' names ("model.layers.0.self_attn.q_proj.weight",
 * "transformer.h.0.attn.c_attn.weight"), so a model.safetensors maps one to one: every tensor
 * of the file must be a parameter of the model with the shape the config gives it, and every
 * parameter must be in the files. Accepted besides: a tied model's "lm_head.weight" (unused,
 * as transformers ties it), the non-persistent buffers older checkpoints saved
 * ("...rotary_emb.inv_freq", GPT-2's "...attn.bias" and "...attn.masked_bias"), and GPT-2
 * names without the "transformer." prefix (the original checkpoints').
 *
 * The forward computes what transformers computes, with its rounding points where Ember's
 * ops have them (float32 within 1e-4 relative of transformers' logits; bfloat16 within its
 * rounding: tests/test_models.c against scripts/golden_models.py), on every device.
 *
 * Weights on the CPU in the dtype of the file are the file's own pages: the file is mapped
 * read-only and each weight is a read-only tensor over its bytes (em_is_read_only), so a 7B
 * model loads in seconds and costs only the pages it touches. The files must therefore not
 * be truncated or rewritten while the model is loaded: the loader checks each file's length
 * against its header, but a file shortened afterwards makes the next read of a missing page
 * fault (SIGBUS), as with any mapping. A weight whose dtype differs is converted on load; on
 * other devices each weight is copied in pieces of at most 64 MiB, so host memory never holds
 * a second copy of the model. em_model_opts.read_weights reads each file into anonymous memory
 * instead (llama.cpp's --no-mmap): loading reads the whole model and the process holds its
 * own copy (the page cache may hold the files too), but that memory is advised into 2 MiB
 * pages, which a decoder, reading every weight once per token, streams faster than the page
 * cache's 4 KiB pages (docs/BENCHMARKS.md); em_model_mapped_bytes is then 0.
 *
 * A model is read-only once loaded: several threads may run forwards at once, each with its
 * own cache. Adding or loading LoRA adapters (include/ember/finetune.h) changes it: do that
 * before threads share it. Errors follow Ember's model (NULL or a status, em_last_error() says what and
 * where: the file, the tensor, the config key). */
#ifndef EMBER_MODELS_H
#define EMBER_MODELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/dtype.h>
#include <ember/device.h>
#include <ember/tensor.h>
#include <ember/nn.h>       /* em_rope_config */
#include <ember/estimate.h> /* em_estimate_opts, em_estimate */

#ifdef __cplusplus
extern "C" {
#endif

/* How a model computes: the Llama family (Llama, Mistral, Qwen2) or GPT-2. */
typedef enum em_model_family { EM_MODEL_LLAMA, EM_MODEL_GPT2 } em_model_family;

#define EM_MODEL_MAX_EOS 8 /* the most end-of-sequence ids a config may list */

/* A model folder's config.json (and generation_config.json), as the model reads it. */
typedef struct em_model_config {
    char architecture[64];        /* architectures[0]: "LlamaForCausalLM", "GPT2LMHeadModel" */
    char model_type[32];          /* "llama", "mistral", "qwen2", "gpt2" */
    em_model_family family;       /* how it computes: the Llama family or GPT-2 */
    int64_t vocab_size;           /* rows of the input embedding: ids are in [0, vocab_size) */
    int64_t hidden_size;          /* GPT-2: n_embd */
    int64_t intermediate_size;    /* GPT-2: n_inner, 4 x n_embd when null */
    int64_t num_hidden_layers;    /* GPT-2: n_layer */
    int64_t num_attention_heads;  /* GPT-2: n_head */
    int64_t num_key_value_heads;  /* num_attention_heads when absent (GPT-2: always) */
    int64_t head_dim;             /* hidden_size / num_attention_heads unless given */
    int64_t max_position_embeddings; /* GPT-2: n_positions, the most positions it has */
    double norm_eps;              /* rms_norm_eps, or GPT-2's layer_norm_epsilon */
    em_rope_config rope;          /* the Llama family's rotary embedding */
    bool tie_word_embeddings;     /* the output projection is the input embedding */
    bool qkv_bias;                /* q, k, v projections have biases (Qwen2; Llama's attention_bias) */
    bool o_bias;                  /* o_proj has a bias (Llama's attention_bias) */
    bool mlp_bias;                /* gate, up and down projections have biases (Llama's mlp_bias) */
    int64_t sliding_window;       /* attention window (Mistral, Qwen2's sliding layers); 0: none */
    double attention_scale;       /* the scores' scale: head_dim^-0.5 (GPT-2: per its config) */
    bool scale_by_inverse_layer;  /* GPT-2's scale_attn_by_inverse_layer_idx: layer i scales by 1/(i+1) too */
    em_dtype dtype;               /* config.json's dtype / torch_dtype (float32 when absent) */
    int64_t bos_token_id;         /* -1: none (generation_config.json wins over config.json) */
    int64_t pad_token_id;         /* -1: none */
    int n_eos;                    /* how many end-of-sequence ids (an int or a list in the configs) */
    int64_t eos_token_ids[EM_MODEL_MAX_EOS]; /* the end-of-sequence ids, n_eos of them */
} em_model_config;

/* Reads dir/config.json and, when present, dir/generation_config.json. An architecture Ember
 * does not run, a missing or impossible value is an error naming the file and the key. */
EM_API em_status em_model_config_load(const char *dir, em_model_config *out);
/* The number of parameters the config's model has (a tied output embedding counted once); 0,
 * with an error, when the count or its float32 bytes would not fit 64 bits (em_model_config_load
 * refuses such a config). */
EM_API int64_t em_model_config_num_parameters(const em_model_config *cfg);

/* How to load: zeroed means the CPU and float32 (PyTorch's defaults). */
typedef struct em_model_opts {
    em_device device;   /* where the weights and the computation live */
    em_dtype dtype;     /* the dtype to compute in: float32 (zeroed), bfloat16 or float16 */
    bool dtype_auto;    /* true: the config's dtype instead (from_pretrained(dtype="auto")) */
    bool read_weights;  /* the CPU: read the files into the process's memory (advised into 2 MiB
                         * pages) instead of mapping them; see "Weights on the CPU" above */
} em_model_opts;

typedef struct em_model em_model; /* a loaded model (opaque; read-only once loaded) */

/* Loads a model folder: config.json, generation_config.json (optional), and model.safetensors
 * or the shards model.safetensors.index.json names. opts NULL: zeroed. NULL and an error
 * (naming the file, the tensor or the key) when anything is missing, extra or of the wrong
 * shape; nothing stays allocated or mapped then. */
EM_API em_model *em_model_load(const char *dir, const em_model_opts *opts);
/* Frees the model; tensors handed out by em_model_parameter stay valid. NULL is ignored. */
EM_API void em_model_free(em_model *m);
/* The model's config (owned by the model). */
EM_API const em_model_config *em_model_config_of(const em_model *m);
EM_API em_device em_model_device(const em_model *m); /* where it lives */
EM_API em_dtype em_model_dtype(const em_model *m);   /* the dtype it computes in */
/* The number of parameter tensors (a tied output embedding is one). */
EM_API int em_model_num_parameters(const em_model *m);
/* The i-th parameter in transformers' order: its tensor (a new reference, scoped; NULL past
 * the end) and in *name (may be NULL) its name. */
EM_API em_tensor *em_model_parameter(const em_model *m, int i, const char **name);
/* The same by name (transformers' spelling); NULL and EM_ERR_ARGUMENT when there is none. */
EM_API em_tensor *em_model_parameter_by_name(const em_model *m, const char *name);
/* Bytes of the weights. */
EM_API size_t em_model_weight_bytes(const em_model *m);
/* How many of em_model_weight_bytes are mapped file pages rather than copies. */
EM_API size_t em_model_mapped_bytes(const em_model *m);

/* ---- the key-value cache ----
 * One key and one value tensor per layer, [batch, num_key_value_heads, max_len, head_dim], on
 * the model's device in its dtype, allocated once (zeroed), and the cache's key mask [batch,
 * max_len]: a forward with the cache writes its tokens' keys and values at positions
 * length .. length + T - 1 and attends to everything before them, then the length grows by T.
 * A cache is used by one thread at a time. */
typedef struct em_kv_cache em_kv_cache;
/* A cache for batch sequences of at most max_len positions. */
EM_API em_kv_cache *em_kv_cache_new(const em_model *m, int64_t batch, int64_t max_len);
EM_API void em_kv_cache_free(em_kv_cache *c);              /* NULL is ignored */
EM_API int64_t em_kv_cache_length(const em_kv_cache *c);   /* positions filled */
EM_API int64_t em_kv_cache_capacity(const em_kv_cache *c); /* max_len */
EM_API int64_t em_kv_cache_batch(const em_kv_cache *c);    /* batch */
EM_API size_t em_kv_cache_nbytes(const em_kv_cache *c);    /* the keys' and values' bytes */
/* Empty again (length 0), keeping the memory. */
EM_API em_status em_kv_cache_reset(em_kv_cache *c);
/* Layer's keys (values: want_values) [batch, num_key_value_heads, max_len, head_dim]: the
 * cache's own tensor (a new reference, scoped); positions from em_kv_cache_length on are zeros
 * or what a reset left there. */
EM_API em_tensor *em_kv_cache_layer(em_kv_cache *c, int layer, bool want_values);

/* ---- the forward pass ---- */
/* What em_model_forward takes besides the ids: zeroed means no mask, default positions, no
 * cache, every position's logits. */
typedef struct em_forward_opts {
    /* HF's attention_mask: nonzero where a token is real, 0 for padding (bool or integer),
     * [B, T] for this call's tokens or, with a cache, [B, length + T] for every position the
     * cache holds and this call's (then it replaces the cache's mask). NULL: all real. */
    em_tensor *attention_mask;
    /* HF's position_ids: int64/int32 [B, T] or [T]. NULL: length .. length + T - 1 (what
     * transformers takes without them, padding or not). */
    em_tensor *position_ids;
    em_kv_cache *cache;      /* NULL: no cache (positions start at 0) */
    int64_t logits_to_keep;  /* 0: the logits of every position; n: of the last n only */
    /* Recompute each decoder layer in backward instead of keeping its activations
     * (em_checkpoint per layer; for training, include/ember/finetune.h). Not with a cache. */
    bool checkpoint_layers;
} em_forward_opts;
/* The logits [B, T (or logits_to_keep), vocab_size] in the model's dtype (a new reference,
 * scoped) for token ids [B, T] (int64 or int32, any device), as transformers'
 * Model(input_ids, attention_mask, position_ids, past_key_values).logits. opts NULL: zeroed. */
EM_API em_tensor *em_model_forward(em_model *m, em_tensor *input_ids, const em_forward_opts *opts);

/* ---- perplexity (Hugging Face's strided-window method, its perplexity guide) ----
 * Windows of max_length ids starting every stride ids; each scores only the ids after the
 * previous window's end (the earlier ones are context), its mean negative log-likelihood
 * (cross-entropy of the logits in float32) weighted by its scored ids less one, as the guide
 * sums it; the last window ends at the sequence's end. */
typedef struct em_perplexity_opts {
    int64_t max_length; /* window length; 0: max_position_embeddings */
    int64_t stride;     /* 0: max_length / 2 (rounded up) */
} em_perplexity_opts;
/* What em_model_perplexity computed. */
typedef struct em_perplexity {
    double nll;          /* the mean negative log-likelihood, in nats */
    double perplexity;   /* exp(nll) */
    int64_t tokens;      /* the guide's token count (the weights' sum) */
    int64_t windows;     /* forward passes run */
} em_perplexity;
/* The perplexity of ids[0..n) (n >= 2) under m into *out. opts NULL: zeroed. */
EM_API em_status em_model_perplexity(em_model *m, const int64_t *ids, int64_t n, const em_perplexity_opts *opts,
                                     em_perplexity *out);

/* ---- memory estimates for a config's exact shape (`ember mem --model DIR`) ----
 * em_estimate_memory (include/ember/estimate.h) with the model's parameter count, hidden size
 * and layers, the key-value cache's true width (num_key_value_heads x head_dim), the largest
 * tensor, and LoRA's adapters on PEFT's default targets (q_proj and v_proj; GPT-2's c_attn)
 * counted exactly as rank x (in + out) each. o gives the rest (mode, dtype, optimizer, batch,
 * seq, rank); its params, hidden, layers, lora_targets and lora_params are ignored. */
EM_API em_status em_model_estimate(const em_model_config *cfg, const em_estimate_opts *o, em_estimate *out);

/* ---- the peak of one fine-tuning step (`ember mem --model DIR --batch B --seq S`) ---- */
/* What em_model_estimate_finetune takes besides the config. */
typedef struct em_finetune_estimate_opts {
    int64_t batch, seq;         /* the micro-batch: batch sequences of seq tokens (both > 0) */
    int64_t lora_rank;          /* 0: 8 */
    const char *lora_targets;   /* comma-separated module names; NULL or "": the family's default
                                   (q_proj,v_proj; GPT-2: c_attn) */
    bool checkpoint;            /* em_model_loss_opts.checkpoint_layers */
    em_dtype dtype;             /* the base weights' dtype (zeroed: float32) */
    em_dtype autocast_dtype;    /* EM_BF16 / EM_F16: the step under autocast; zeroed: none */
    bool full;                  /* full fine-tuning (`ember finetune --full`): every weight trains,
                                   float32; the LoRA fields are ignored */
} em_finetune_estimate_opts;
/* The peak of one step of `ember finetune` (em_model_loss, backward, AdamW on the adapters)
 * on the CPU, counted from the shape, as lines of an em_estimate:
 *   weights: the base weights in their dtype (mapped from the file when it matches; under
 *     autocast with float32 weights, plus the cast cache's copies) and the adapters (float32);
 *   gradients: the adapters' (float32; the base weights get none);
 *   optimizer states: AdamW's two per adapter parameter (float32);
 *   activations: what autograd keeps between the forward and the backward, per decoder block
 *     the tensors its backward reads (the norms' inputs, the projections' inputs, the
 *     adapters' float32 inputs, q, k, v, the attention's output, the MLP's three [T, I]
 *     tensors, the attention's per-row log-sum-exp: no [heads, T, T] tensor); with
 *     checkpoint, each block's input plus one block recomputed;
 *   workspace: the larger of the backward's temporaries in one block (the MLP's or the
 *     attention's gradients) and the fused loss's (em_model_loss's chunk of float32 logits
 *     and its log-softmax, in whose buffer the gradient is made, and the [B * T, hidden] rows).
 * With full: every weight trains in float32 with AdamW, and the lines are those of the larger
 * of two moments: the forward's loss (weights, the casts autocast saved, AdamW's states, the
 * activations, the loss with the output head's gradient) and the backward's end (weights,
 * gradients and states, and one block's backward); the total line says which.
 * Not counted: the process itself, the tokenizer and the data, the allocator's rounding and
 * caching (the RSS holds reserved segments, a few percent over the allocated peak). The
 * counts follow the code as written (the CPU backend; the fused attention, which
 * takes no padding mask with a gradient); tests/test_finetune_estimate.c and bench/finetune_mem.sh compare
 * them with measured peaks. EM_ERR_ARGUMENT for a bad shape, rank or target; EM_ERR_DTYPE for
 * full fine-tuning of weights that are not float32. */
EM_API em_status em_model_estimate_finetune(const em_model_config *cfg, const em_finetune_estimate_opts *o,
                                            em_estimate *out);

#ifdef __cplusplus
}
#endif
#endif
