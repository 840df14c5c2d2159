/* Neural-network modules and losses, as torch.nn.
 *
 *   em_module *model = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
 *   em_module_to(model, dev);              // parameters move in place: handles stay valid
 *   em_tensor *loss = em_cross_entropy(em_forward(model, x), y, 0.0);
 *
 * A module owns its parameters, buffers and children; em_module_free frees the whole tree.
 * Names: a layer's constructor is em_nn_ and torch.nn's class in snake case (nn.Linear:
 * em_nn_linear, nn.Conv2d: em_nn_conv2d, nn.ReLU: em_nn_relu); em_<op> is the op itself, as in
 * torch.nn.functional (em_relu(x), em_conv2d(x, w, ...)). The names from before this rule are
 * kept at the end of this header as deprecated aliases, for one release.
 * A module is used from one thread at a time (the thread contract is in ember.h). */
#ifndef EMBER_NN_H
#define EMBER_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/ops.h> /* em_hw */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_module em_module; /* a module: layer or container, with its parameters */

/* What a kind of module does. Parameters, buffers, children, train/eval and moving are
 * generic; a custom module supplies forward (and optionally describe/free_ctx) and
 * registers its tensors with em_module_add_parameter / _buffer / _child. */
typedef struct em_module_ops {
    const char *name;                                   /* "Linear", as PyTorch prints it */
    em_tensor *(*forward)(em_module *m, em_tensor *x);  /* returns a new reference or NULL */
    /* Optional: the text inside the parentheses of the module's repr ("in_features=4, ..."). */
    void (*describe)(const em_module *m, char *buf, size_t size);
    void (*free_ctx)(void *ctx);                        /* optional: frees ctx */
} em_module_ops;

/* ---- building modules ---- */
/* A new module of the given kind; ctx is private data the module's functions read. */
EM_API em_module *em_module_new(const em_module_ops *ops, void *ctx);
EM_API void *em_module_ctx(const em_module *m); /* the ctx given to em_module_new */
/* Register a parameter (retained; marked requires_grad) / a buffer (retained) by name. */
EM_API em_status em_module_add_parameter(em_module *m, const char *name, em_tensor *t);
EM_API em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t); /* (a buffer) */
/* Add a child module; m takes ownership of it (also on failure). */
EM_API em_status em_module_add_child(em_module *m, const char *name, em_module *child);
/* Free m, its children, parameters and buffers. NULL is ignored. */
EM_API void em_module_free(em_module *m);

/* ---- layers ---- */
/* y = x W^T + b with PyTorch's default init: W, b ~ U(-1/sqrt(in), 1/sqrt(in)) from em_rand. */
EM_API em_module *em_nn_linear(int64_t in_features, int64_t out_features);
EM_API em_module *em_nn_linear_ex(int64_t in_features, int64_t out_features, bool bias); /* bias=false: no b */
EM_API em_module *em_nn_relu(void);    /* nn.ReLU */
EM_API em_module *em_nn_gelu(void);    /* nn.GELU (exact) */
EM_API em_module *em_nn_sigmoid(void); /* nn.Sigmoid */
EM_API em_module *em_nn_tanh(void);    /* nn.Tanh */
/* Zeroes elements with probability p (a Bernoulli mask from em_rand) and scales the rest by
 * 1/(1-p) while training; the identity in eval mode. */
EM_API em_module *em_nn_dropout(double p);
/* nn.Flatten(): flattens dims 1..-1. */
EM_API em_module *em_nn_flatten(void);
/* Sequential container; takes ownership of the modules. If any is NULL (a failed
 * constructor), frees the others and returns NULL. Children are named "0", "1", ... */
EM_API em_module *em_nn_sequential_n(int n, em_module *const *modules);
/* em_nn_sequential(em_nn_linear(4, 8), em_nn_relu()): em_nn_sequential_n over a literal list. */
#define em_nn_sequential(...)                                                              \
    em_nn_sequential_n((int)(sizeof((em_module *[]){__VA_ARGS__}) / sizeof(em_module *)), \
                    (em_module *[]){__VA_ARGS__})
/* Append a module to a Sequential (takes ownership). */
EM_API em_status em_sequential_append(em_module *seq, em_module *m);

/* ---- convolution and pooling layers (torch.nn's, NCHW) ----
 * Conv2d: weight [out, in / groups, kH, kW] and bias [out], both U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)) with fan_in = in / groups * kH * kW (PyTorch's kaiming_uniform(a=sqrt(5))).
 * em_nn_conv2d uses PyTorch's defaults: stride 1, padding 0, dilation 1, groups 1, bias.
 * Pools: stride EM_HW1(0) means kernel_size (PyTorch's stride=None). A shape error in
 * forward names the layer ("Conv2d(1, 6, kernel_size=(5, 5), stride=(1, 1)): conv2d: ..."),
 * as every layer's does (em_forward). */
EM_API em_module *em_nn_conv2d(int64_t in_channels, int64_t out_channels, em_hw kernel_size);
/* nn.Conv2d with every argument. */
EM_API em_module *em_nn_conv2d_ex(int64_t in_channels, int64_t out_channels, em_hw kernel_size, em_hw stride,
                               em_hw padding, em_hw dilation, int64_t groups, bool bias);
/* nn.MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode). */
EM_API em_module *em_nn_max_pool2d(em_hw kernel_size, em_hw stride, em_hw padding, em_hw dilation, bool ceil_mode);
/* nn.AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override). */
EM_API em_module *em_nn_avg_pool2d(em_hw kernel_size, em_hw stride, em_hw padding, bool ceil_mode,
                                bool count_include_pad, int64_t divisor_override);
EM_API em_module *em_nn_adaptive_avg_pool2d(em_hw output_size); /* nn.AdaptiveAvgPool2d */
/* A Conv2d's channels and kernel size; EM_ERR_ARGUMENT if m is not a Conv2d. */
EM_API em_status em_module_conv2d_shape(const em_module *m, int64_t *in_channels, int64_t *out_channels,
                                 em_hw *kernel_size);

/* ---- using modules ---- */
/* m(x): a new reference (scoped like any op result). The forward runs in a scope of its own:
 * its temporaries are freed when it returns (the graph keeps what backward needs). When a
 * layer (a module without children) fails, its error is prefixed with the layer's repr, as
 * PyTorch's Conv2d names itself: "Linear(in_features=9216, out_features=128, bias=True):
 * em_addmm: mat1 and mat2 shapes cannot be multiplied (1792x28 and 9216x128)". */
EM_API em_tensor *em_forward(em_module *m, em_tensor *x);
EM_API void em_module_train(em_module *m);  /* training mode, recursively */
EM_API void em_module_eval(em_module *m);   /* evaluation mode, recursively */
EM_API bool em_module_is_training(const em_module *m); /* m.training */

/* A parameter or buffer with its dotted name ("0.weight"). Both pointers are borrowed:
 * valid until the module is freed or a parameter, buffer or child is added to its tree. */
typedef struct em_named_tensor {
    const char *name;   /* "0.weight" */
    em_tensor *tensor;  /* the parameter or buffer */
} em_named_tensor;
/* Fills up to cap entries (in registration order, children depth-first, like PyTorch's
 * named_parameters) and returns how many there are in all. */
EM_API int em_module_parameters(em_module *m, em_named_tensor *out, int cap);
EM_API int em_module_buffers(em_module *m, em_named_tensor *out, int cap); /* (named_buffers) */
/* Total number of parameter elements (sum of numel). */
EM_API int64_t em_module_num_parameters(em_module *m);
/* Child i of m (borrowed), or NULL. */
EM_API em_module *em_module_child(em_module *m, int i);
/* The name child i was added under ("conv1", "0" in a Sequential; borrowed), or NULL. */
EM_API const char *em_module_child_name(const em_module *m, int i);
/* model.get_submodule(path): the module at a dotted path of child names ("conv1",
 * "encoder.layers.0.fc"), the prefixes of the names in state dicts and in
 * em_module_parameters; "" is m itself. Borrowed: valid while m is. Unknown names are
 * EM_ERR_ARGUMENT naming the path and the module that lacks it, as PyTorch's
 * ("Net has no attribute `conv3`"). */
EM_API em_module *em_module_get(em_module *m, const char *path);
/* model.get_parameter(path): the parameter at a dotted name as state dicts use it
 * ("conv1.weight"); borrowed, or NULL and EM_ERR_ARGUMENT. */
EM_API em_tensor *em_module_get_parameter(em_module *m, const char *path);

/* What a module is, for code that inspects a model (memory estimates, exporters) without
 * comparing names: the built-in layers by kind, anything made with em_module_new as
 * EM_MODULE_CUSTOM (also when its ops name says "Linear"). */
typedef enum em_module_kind {
    EM_MODULE_CUSTOM, EM_MODULE_SEQUENTIAL, EM_MODULE_LINEAR, EM_MODULE_RELU, EM_MODULE_GELU,
    EM_MODULE_SIGMOID, EM_MODULE_TANH, EM_MODULE_DROPOUT, EM_MODULE_FLATTEN,
    /* convolution and pooling */
    EM_MODULE_CONV2D, EM_MODULE_MAX_POOL2D, EM_MODULE_AVG_POOL2D, EM_MODULE_ADAPTIVE_AVG_POOL2D
} em_module_kind;
/* m's kind; EM_MODULE_CUSTOM (and EM_ERR_ARGUMENT recorded) for NULL. */
EM_API em_module_kind em_module_kind_of(const em_module *m);
/* The name PyTorch prints for m ("Linear", a custom module's ops name); NULL for NULL. */
EM_API const char *em_module_name(const em_module *m);
/* A Linear's in_features and out_features; EM_ERR_ARGUMENT if m is not a Linear. */
EM_API em_status em_module_linear_shape(const em_module *m, int64_t *in_features, int64_t *out_features);

/* Move every parameter, buffer and gradient in place (the em_tensor handles stay valid)
 * and the state of every optimizer created on this module (or on a module containing it). */
EM_API em_status em_module_to(em_module *m, em_device d);
EM_API em_status em_module_to_dtype(em_module *m, em_dtype dt); /* the same for a dtype (floating tensors) */

/* PyTorch's repr ("Sequential(\n  (0): Linear(in_features=784, ...)\n)") into buf;
 * returns the full length, as snprintf. em_module_print writes it to stdout. */
EM_API int em_module_format(const em_module *m, char *buf, size_t size);
EM_API void em_module_print(const em_module *m); /* (to stdout) */

/* ---- state dicts (safetensors files, keys as PyTorch's state_dict) ---- */
EM_API em_status em_module_save(em_module *m, const char *path); /* every parameter and buffer by name */
/* Load in place (parameters keep their device and dtype). Every key must match, with the
 * same shape, as load_state_dict(strict=True). */
EM_API em_status em_module_load(em_module *m, const char *path);
typedef struct em_safetensors em_safetensors;   /* a loaded safetensors file: include/ember/io.h */
/* The same from a file already loaded with em_safetensors_load (any device): the caller
 * reads the file once and may look at its metadata first. A training checkpoint's
 * "optimizer." tensors are ignored, as em_module_load does. */
EM_API em_status em_module_load_safetensors(em_module *m, const em_safetensors *file);

/* ---- norms, embedding, attention (torch.nn.functional and torch.nn) ----
 * Errors name the op and the shapes ("layer_norm: normalized_shape [8] must match ..."); a layer's
 * forward error is prefixed with the layer, as every layer's is (see em_forward).
 * Functional forms: */
/* F.layer_norm: normalizes over the last normalized_shape.ndim dims (biased variance);
 * weight and bias (NULL for none) have normalized_shape. */
EM_API em_tensor *em_layer_norm(em_tensor *x, em_shape normalized_shape, em_tensor *weight, em_tensor *bias, double eps);
/* F.batch_norm: x [N, C, ...]; per-channel tensors [C] (any may be NULL). training: batch
 * statistics, and running_mean/var (when given) updated in place as
 * (1 - momentum) * running + momentum * batch (variance unbiased); else the running ones. */
EM_API em_tensor *em_batch_norm(em_tensor *x, em_tensor *running_mean, em_tensor *running_var, em_tensor *weight,
                         em_tensor *bias, bool training, double momentum, double eps);
/* F.embedding: weight[input] of shape input.shape + [embedding_dim]; input int64/int32 in
 * [0, num_embeddings). padding_idx (negative counts from the end; EM_NO_PADDING_IDX for none):
 * that row gets no gradient. */
#define EM_NO_PADDING_IDX INT64_MIN /* em_embedding's "no padding_idx" */
/* F.embedding(input, weight, padding_idx): see above. */
EM_API em_tensor *em_embedding(em_tensor *input, em_tensor *weight, int64_t padding_idx);
/* F.scaled_dot_product_attention: softmax(q k^T / sqrt(E) + mask) v for q [..., L, E],
 * k [..., S, E], v [..., S, Ev]. attn_mask (NULL: none) broadcasts to [..., L, S]: bool
 * (true: may attend) or floating (added). is_causal: query i sees keys j <= i only. */
EM_API em_tensor *em_scaled_dot_product_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *attn_mask,
                                           double dropout_p, bool is_causal);
/* Whether em_scaled_dot_product_attention runs as one fused kernel on devices of type t when
 * q, k, v are float32 with no attn_mask, no dropout and no autocast region: softmax(q k^T) is
 * then never stored, backward recomputes it from each row's log-sum-exp (PyTorch's flash
 * attention). True on the CPU, OpenCL and CUDA (Ember's attention kernels; on the GPUs for
 * head dims up to 128, wider heads are composed) unless the environment sets
 * EMBER_ATTENTION=composed; false where the backend composes matmul, softmax and matmul. */
EM_API bool em_sdpa_fused(em_device_type t);
/* ---- the language models' ops (Llama, Mistral, Qwen2 as transformers computes them) ---- */
/* F.rms_norm and HF's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) over the last
 * normalized_shape.ndim dims, computed in float32 for f16/bf16 x and rounded to x's dtype,
 * then times weight ([normalized_shape], NULL for none; rounded again). eps >= 0 (PyTorch's
 * default, None, is the dtype's machine epsilon). One kernel forward and one backward where
 * the backend has them; under a CUDA/OpenCL autocast region it runs in float32 (PyTorch's
 * CUDA list). */
EM_API em_tensor *em_rms_norm(em_tensor *x, em_shape normalized_shape, em_tensor *weight, double eps);
/* Rotary position embedding, HF's apply_rotary_pos_emb with rotate_half (the layout of Llama,
 * Mistral and Qwen2 in transformers): x * cos + rotate_half(x) * sin for x [B, H, T, D] (D
 * even, any strides) and cos, sin of one shape [T, D], [B, T, D] or [B, 1, T, D] (B may be 1),
 * rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]). Both products are rounded to the dtype
 * before the sum, as PyTorch's ops round them. The result is a new contiguous [B, H, T, D]. */
EM_API em_tensor *em_rope(em_tensor *x, em_tensor *cos, em_tensor *sin);
/* config.json's rope_scaling "rope_type" (HF's ROPE_INIT_FUNCTIONS): none, "linear", "llama3" */
typedef enum em_rope_scaling { EM_ROPE_DEFAULT, EM_ROPE_LINEAR, EM_ROPE_LLAMA3 } em_rope_scaling;
/* The rotary embedding's parameters from config.json (em_rope_inv_freq, em_rope_tables). */
typedef struct em_rope_config {
    int64_t head_dim;       /* D: hidden_size / num_attention_heads unless config.json says */
    double theta;           /* rope_theta (10000 in Llama 2, 500000 in Llama 3) */
    em_rope_scaling scaling; /* rope_scaling's "rope_type" */
    double factor;          /* linear and llama3: rope_scaling["factor"] */
    double low_freq_factor, high_freq_factor;  /* llama3 */
    double original_max_position_embeddings;   /* llama3 */
} em_rope_config;
/* The D / 2 inverse frequencies into inv_freq, in transformers' float32 arithmetic (its
 * _compute_default_rope_parameters, _linear_ and _llama3_ ones). */
EM_API em_status em_rope_inv_freq(const em_rope_config *cfg, float *inv_freq);
/* HF's LlamaRotaryEmbedding(x, position_ids): cos and sin [T, D] for positions [T], or
 * [B, T, D] for [B, T] (int64 or int32, any device), computed in float32 as transformers does
 * and then cast to dtype, on device. *cos and *sin are scoped results. */
EM_API em_status em_rope_tables(const em_rope_config *cfg, em_tensor *positions, em_dtype dtype, em_device device,
                                em_tensor **cos, em_tensor **sin);
/* Attention of a decoder with a key-value cache (transformers' sdpa_attention_forward):
 * softmax(scale q k^T + mask) v for q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] of
 * one floating dtype, Hq a multiple of Hkv: query head h attends with key/value head
 * h / (Hq / Hkv) (grouped-query and multi-query attention, without repeat_kv's copies). With
 * causal, query i is at position past + i and sees keys j <= past + i (k and v may be a
 * whole preallocated cache: keys past the last query's position are never read). key_mask
 * (bool [B, S], NULL for none) hides key j of sequence b where false (padding, left or right).
 * A query row that sees no key gives zeros (PyTorch's sdpa since 2.5). The result is
 * [B, Hq, L, Ev]. On the CPU one fused kernel (float32 accumulation for bf16/f16) whose
 * backward recomputes the probabilities; elsewhere, and for gradients through key_mask, the
 * composition of matmul, softmax and matmul (with k viewed per group, not repeated). A new
 * token's keys and values go into a preallocated cache [B, Hkv, max, E] with
 * em_copy_(em_narrow(cache, 2, past, L), k). On autocast's lower-precision lists. */
typedef struct em_attention_opts {
    double scale;          /* 0: 1 / sqrt(E) */
    bool causal;           /* query i at position past + i sees keys j <= past + i */
    int64_t past;          /* with causal: the position of query 0 (the cache's fill) */
    em_tensor *key_mask;   /* bool [B, S] or NULL */
} em_attention_opts;
/* The attention described above; opts NULL: the defaults (scale 1 / sqrt(E), not causal, no mask). */
EM_API em_tensor *em_attention(em_tensor *q, em_tensor *k, em_tensor *v, const em_attention_opts *opts);
/* Modules, PyTorch's parameter and buffer names and defaults: */
/* nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True): weight (ones), bias (zeros). */
EM_API em_module *em_nn_layer_norm(em_shape normalized_shape, double eps, bool elementwise_affine);
/* nn.BatchNorm1d / 2d(num_features): eps 1e-5, momentum 0.1 (NAN: None, a cumulative
 * average), affine, track_running_stats; parameters weight, bias; buffers running_mean,
 * running_var, num_batches_tracked (int64). Batch statistics while training, running ones
 * in eval mode. BatchNorm1d takes [N, C] or [N, C, L]; BatchNorm2d [N, C, H, W]. */
EM_API em_module *em_nn_batch_norm1d(int64_t num_features); /* nn.BatchNorm1d with the defaults */
EM_API em_module *em_nn_batch_norm2d(int64_t num_features); /* nn.BatchNorm2d with the defaults */
/* BatchNorm1d (spatial_dims 1) or 2d (2) with every argument. */
EM_API em_module *em_nn_batch_norm_ex(int spatial_dims, int64_t num_features, double eps, double momentum, bool affine,
                            bool track_running_stats);
/* nn.Embedding(num_embeddings, embedding_dim, padding_idx): weight ~ N(0, 1), the padding row zero. */
EM_API em_module *em_nn_embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx);
/* nn.MultiheadAttention(embed_dim, num_heads, dropout=0, bias=True, batch_first=False):
 * in_proj_weight [3E, E] (xavier uniform), in_proj_bias [3E] (zeros), out_proj (a Linear,
 * bias zeros). em_forward(m, x) is self-attention without a mask. */
EM_API em_module *em_nn_multihead_attention(int64_t embed_dim, int64_t num_heads);
/* nn.MultiheadAttention with every argument. */
EM_API em_module *em_nn_multihead_attention_ex(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                     bool batch_first);
/* mha(query, key, value, attn_mask): attn_mask (NULL: none) is [L, S] or [N * num_heads,
 * L, S], bool true meaning "may NOT attend" (PyTorch's MHA convention) or floating (added);
 * is_causal hides the future instead. attn_weights (NULL: not wanted) receives the
 * attention weights averaged over heads [N, L, S]. */
EM_API em_tensor *em_multihead_attention_forward(em_module *m, em_tensor *query, em_tensor *key, em_tensor *value,
                                          em_tensor *attn_mask, bool is_causal, em_tensor **attn_weights);

/* ---- LoRA (low-rank adapters, as PEFT's LoraConfig(r, lora_alpha, target_modules)) ----
 * em_lora_wrap freezes every parameter of model (requires_grad false) and gives each layer of
 * a targeted kind two adapters, lora_A.weight [r, in] (kaiming_uniform(a=sqrt(5)), PEFT's
 * init) and lora_B.weight [out, r] (zeros): y = base(x) + (alpha / r) * x A^T B^T. Their
 * state_dict names are "<path>.lora_A.weight" / "<path>.lora_B.weight". The layer then
 * prints as "lora.Linear" and em_module_kind_of says EM_MODULE_CUSTOM. Only Linear can be
 * targeted today. Create optimizers after wrapping (they take the trainable parameters). */
#define EM_LORA_TARGET(kind) (1u << (unsigned)(kind)) /* target_kinds bit of an em_module_kind */
#define EM_LORA_LINEAR EM_LORA_TARGET(EM_MODULE_LINEAR) /* the usual target_kinds */
/* rank in [1, min(in, out)] of every targeted layer; errors (nothing changed): no targeted
 * layer, a bad rank or alpha, a kind that cannot be targeted, a model already wrapped. */
EM_API em_status em_lora_wrap(em_module *model, int64_t rank, double alpha, unsigned target_kinds);
/* W += (alpha / r) B A in every wrapped layer, then removes the adapters: the layers are
 * plain again (their parameters stay frozen). EM_ERR_ARGUMENT if model has no adapters. */
EM_API em_status em_lora_merge(em_module *model);
/* The adapters alone, as PEFT's adapter_model.safetensors: "base_model.model.<path>.lora_A.weight"
 * and "...lora_B.weight" for each wrapped layer. */
EM_API em_status em_lora_save(em_module *model, const char *path);
/* Loads a file written by em_lora_save (or PEFT) into the adapters of a model wrapped the
 * same way: every adapter must be in the file with its shape, and nothing else. */
EM_API em_status em_lora_load(em_module *model, const char *path);
/* Elements of the parameters that require grad (with LoRA: the adapters'). */
EM_API int64_t em_module_num_trainable_parameters(em_module *m);

/* ---- activation checkpointing (torch.utils.checkpoint) ----
 * Trade compute for memory: the forward of a checkpointed function runs without autograd
 * and keeps only its inputs; backward runs it again with grad enabled and the random
 * generator set back to the state the forward saw (dropout draws the same masks) and the
 * forward's autocast regions entered again (the same dtypes, wherever backward is called),
 * then backpropagates through that recomputed graph. Gradients equal those without
 * checkpointing; the activations inside are alive only while their segment's backward runs.
 * The function and ctx must stay valid until the backward; the inputs must not be modified
 * in place in between. In no-grad mode the function simply runs. */
/* fn(ctx, inputs, n): returns its result as an op does (in the caller's scope), or NULL. */
typedef em_tensor *(*em_checkpoint_fn)(void *ctx, em_tensor *const *inputs, int n);
/* checkpoint(fn, *inputs): fn's output, recorded as one node (CheckpointFunctionBackward). */
EM_API em_tensor *em_checkpoint(em_checkpoint_fn fn, void *ctx, em_tensor *const *inputs, int n);
/* checkpoint_sequential(model, segments, x): model a Sequential of L children, 1 <=
 * segments <= L; the first segments - 1 chunks of L / segments children are checkpointed,
 * the last chunk (with the remainder) runs normally, as PyTorch does. */
EM_API em_tensor *em_checkpoint_sequential(em_module *model, int segments, em_tensor *x);

/* ---- losses (torch.nn.functional's, with their options) ---- */
/* A loss's reduction='mean' | 'sum' | 'none' (the losses' and em_linear_cross_entropy's). */
typedef enum em_reduction {
    EM_REDUCTION_MEAN, /* the mean (over the targets not ignored, weighted: PyTorch's) (the zero value) */
    EM_REDUCTION_SUM,  /* the sum */
    EM_REDUCTION_NONE  /* one loss per element or row (0 for an ignored one) */
} em_reduction;
/* A loss's options; zeroed (or a NULL pointer) means PyTorch's defaults. Every loss reads
 * reduction; cross_entropy and nll_loss also weight and ignore_index; cross_entropy also
 * label_smoothing. A field a loss does not take must stay zero (else EM_ERR_ARGUMENT). */
typedef struct em_loss_opts {
    em_reduction reduction;   /* EM_REDUCTION_MEAN (the zero value), _SUM, or _NONE: per element */
    em_tensor *weight;        /* a weight per class [C] (floating, any device, no gradient), or NULL */
    /* The class index whose targets count for nothing (no loss, no gradient, not in the mean's
     * denominator), e.g. &(int64_t){pad_id}; NULL: PyTorch's default, -100. */
    const int64_t *ignore_index;
    double label_smoothing;   /* in [0, 1]: the target becomes (1 - s) * one_hot + s / C */
} em_loss_opts;
/* F.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing) with
 * PyTorch's semantics and gradients: input [N, C] (or [C], or [N, C, d...]); target class
 * indices [N] (or [], or [N, d...]; any integer dtype), or floating class probabilities of
 * input's shape. With class indices, 'mean' divides the sum by the total weight of the
 * targets not ignored (the count without weights; NaN when that is 0); with probabilities by
 * N (times d...), and ignore_index must stay negative. Label smoothing with weights:
 * (1 - s) * nll + s / C * sum_c -w_c log p_c, as PyTorch. A target outside [0, C) that is
 * not ignore_index is an error naming its position ("target[3]"). */
EM_API em_tensor *em_cross_entropy_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts);
/* em_cross_entropy_ex with reduction 'mean', no weight, ignore_index -100. */
EM_API em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *target, double label_smoothing);
/* F.nll_loss(input, target, weight, ignore_index, reduction): input log-probabilities [N, C]
 * (or [C], or [N, C, d...]), target class indices: -w[t] * input[n, t], reduced as
 * cross_entropy's (label_smoothing must stay 0). */
EM_API em_tensor *em_nll_loss_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts);
EM_API em_tensor *em_nll_loss(em_tensor *log_probs, em_tensor *target); /* em_nll_loss_ex, defaults */
/* F.mse_loss(input, target, reduction): (input - target)^2 (broadcast), reduced. */
EM_API em_tensor *em_mse_loss_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts);
EM_API em_tensor *em_mse_loss(em_tensor *input, em_tensor *target); /* mean((input - target)^2) */

/* ---- fused linear cross-entropy (llm.c's fused classifier, Liger's FusedLinearCrossEntropy) ---- */
/* em_linear_cross_entropy's options; zeroed (or a NULL pointer) means the defaults. */
typedef struct em_linear_ce_opts {
    /* Rows of h per chunk: the float32 logits of one chunk, [chunk_size, V], are the largest
     * temporaries. 0: the default, Liger's choice, the power of two nearest above
     * N / ceil(V / H), and at least 256 (thinner GEMMs run slower). Larger than N means one
     * chunk. */
    int64_t chunk_size;
    em_reduction reduction; /* EM_REDUCTION_MEAN (the zero value), _SUM or _NONE */
    /* The class index whose targets count for nothing (no loss, no gradient, not in the mean's
     * denominator), e.g. &(int64_t){pad_id}; NULL: PyTorch's default, -100. */
    const int64_t *ignore_index;
    double label_smoothing; /* in [0, 1]: the target becomes (1 - s) * one_hot + s / V */
    /* With EM_REDUCTION_SUM and > 0: the loss is the sum divided by divisor, as transformers
     * divides a step's summed token losses by num_items_in_batch. Dividing inside lets the
     * gradients the forward computes carry the 1 / divisor, so that backward needs no second
     * pass over the chunks (a division after the call would give the same loss but, in
     * bf16/f16, gradients that must be rounded again: backward reruns the chunks). 0: none. */
    double divisor;
} em_linear_ce_opts;
/* F.cross_entropy(F.linear(h, weight, bias).float(), target, ignore_index=...,
 * reduction=..., label_smoothing=...) computed chunk by chunk, so that the [N, V] logits
 * never exist at once. h [N, H], weight [V, H], bias [V] or NULL: one floating dtype;
 * target integer class indices [N] in [0, V) or ignore_index (one on a wrong class is an
 * error naming its row). Each chunk's logits are F.linear's in h's dtype (bf16/f16: float32
 * sums rounded once, as PyTorch's bf16 linear), then widened to float32 for the softmax: the
 * loss is float32 for 16-bit inputs (the input's dtype otherwise). 'mean' over no target
 * (all ignored) is NaN, as PyTorch's. When grad mode is on and h, weight or bias requires
 * grad, the gradients are computed during the forward's chunk loop (the gradient of the
 * logits rounded to h's dtype before the GEMMs, as the .float() cast's backward rounds it;
 * weight's and bias's summed over chunks in float32, rounded once) and kept for backward,
 * which scales them by the loss's gradient; with 'none' the backward runs the chunks again
 * with the per-row gradient instead. Result scoped like any op's. */
EM_API em_tensor *em_linear_cross_entropy(em_tensor *h, em_tensor *weight, em_tensor *bias, em_tensor *target,
                                          const em_linear_ce_opts *opts);

/* ---- the names from before the em_nn_ rule: deprecated, removed in the next release ---- */
/* Deprecated name of em_nn_linear (same arguments). */
EM_API EM_DEPRECATED("use em_nn_linear") em_module *em_linear(int64_t in_features, int64_t out_features);
/* Deprecated name of em_nn_linear_ex (same arguments). */
EM_API EM_DEPRECATED("use em_nn_linear_ex") em_module *em_linear_ex(int64_t in_features, int64_t out_features, bool bias);
/* Deprecated name of em_nn_relu (same arguments). */
EM_API EM_DEPRECATED("use em_nn_relu") em_module *em_relu_module(void);
/* Deprecated name of em_nn_gelu (same arguments). */
EM_API EM_DEPRECATED("use em_nn_gelu") em_module *em_gelu_module(void);
/* Deprecated name of em_nn_sigmoid (same arguments). */
EM_API EM_DEPRECATED("use em_nn_sigmoid") em_module *em_sigmoid_module(void);
/* Deprecated name of em_nn_tanh (same arguments). */
EM_API EM_DEPRECATED("use em_nn_tanh") em_module *em_tanh_module(void);
/* Deprecated name of em_nn_dropout (same arguments). */
EM_API EM_DEPRECATED("use em_nn_dropout") em_module *em_dropout(double p);
/* Deprecated name of em_nn_flatten (same arguments). */
EM_API EM_DEPRECATED("use em_nn_flatten") em_module *em_flatten_module(void);
/* Deprecated name of em_nn_sequential_n (same arguments). */
EM_API EM_DEPRECATED("use em_nn_sequential_n") em_module *em_sequential_n(int n, em_module *const *modules);
/* deprecated: use em_nn_sequential (this one warns through em_sequential_n) */
#define em_sequential(...)                                                              \
    em_sequential_n((int)(sizeof((em_module *[]){__VA_ARGS__}) / sizeof(em_module *)), \
                    (em_module *[]){__VA_ARGS__})
/* Deprecated name of em_nn_conv2d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_conv2d") em_module *em_conv2d_module(int64_t in_channels, int64_t out_channels,
                                                                     em_hw kernel_size);
/* Deprecated name of em_nn_conv2d_ex (same arguments). */
EM_API EM_DEPRECATED("use em_nn_conv2d_ex") em_module *em_conv2d_module_ex(int64_t in_channels, int64_t out_channels,
                                                                           em_hw kernel_size, em_hw stride,
                                                                           em_hw padding, em_hw dilation,
                                                                           int64_t groups, bool bias);
/* Deprecated name of em_nn_max_pool2d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_max_pool2d") em_module *em_max_pool2d_module(em_hw kernel_size, em_hw stride,
                                                                             em_hw padding, em_hw dilation,
                                                                             bool ceil_mode);
/* Deprecated name of em_nn_avg_pool2d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_avg_pool2d") em_module *em_avg_pool2d_module(em_hw kernel_size, em_hw stride,
                                                                             em_hw padding, bool ceil_mode,
                                                                             bool count_include_pad,
                                                                             int64_t divisor_override);
/* Deprecated name of em_nn_adaptive_avg_pool2d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_adaptive_avg_pool2d") em_module *em_adaptive_avg_pool2d_module(em_hw output_size);
/* Deprecated name of em_nn_layer_norm (same arguments). */
EM_API EM_DEPRECATED("use em_nn_layer_norm") em_module *em_layer_norm_module(em_shape normalized_shape, double eps,
                                                                             bool elementwise_affine);
/* Deprecated name of em_nn_batch_norm1d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_batch_norm1d") em_module *em_batch_norm1d(int64_t num_features);
/* Deprecated name of em_nn_batch_norm2d (same arguments). */
EM_API EM_DEPRECATED("use em_nn_batch_norm2d") em_module *em_batch_norm2d(int64_t num_features);
/* Deprecated name of em_nn_batch_norm_ex (same arguments). */
EM_API EM_DEPRECATED("use em_nn_batch_norm_ex") em_module *em_batch_norm_ex(int spatial_dims, int64_t num_features,
                                                                            double eps, double momentum, bool affine,
                                                                            bool track_running_stats);
/* Deprecated name of em_nn_embedding (same arguments). */
EM_API EM_DEPRECATED("use em_nn_embedding") em_module *em_embedding_module(int64_t num_embeddings,
                                                                           int64_t embedding_dim,
                                                                           int64_t padding_idx);
/* Deprecated name of em_nn_multihead_attention (same arguments). */
EM_API EM_DEPRECATED("use em_nn_multihead_attention") em_module *em_multihead_attention(int64_t embed_dim,
                                                                                        int64_t num_heads);
/* Deprecated name of em_nn_multihead_attention_ex (same arguments). */
EM_API EM_DEPRECATED("use em_nn_multihead_attention_ex") em_module *em_multihead_attention_ex(
    int64_t embed_dim, int64_t num_heads, double dropout, bool bias, bool batch_first);

#ifdef __cplusplus
}
#endif
#endif
