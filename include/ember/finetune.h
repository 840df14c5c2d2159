/* Fine-tuning a loaded language model with LoRA, as PEFT does it:
 *
 *   em_model *m = em_model_load("tiny-llama", NULL);
 *   em_model_lora_add(m, &(em_lora_config){.rank = 8, .alpha = 16, .targets = "q_proj,v_proj"});
 *   em_optimizer *opt = em_adamw(em_model_lora_module(m), 1e-4);
 *   em_tensor *loss = em_model_loss(m, ids, labels, NULL);     // forward, then the causal LM loss
 *   em_backward(loss); em_step(opt); em_zero_grad(opt);
 *   em_model_lora_save(m, "adapter", "tiny-llama");           // a folder peft's PeftModel loads
 *
 * Adapters: each targeted projection gets lora_A [r, in] (kaiming_uniform(a=sqrt(5)), PEFT's
 * init, from em_rand) and lora_B [out, r] (zeros), in float32 on the model's device, and
 * computes y = base(x) + (x A^T B^T) * (alpha / r), the adapters' product in float32 and added
 * in the model's dtype (PEFT's autocast_adapter_dtype). The base weights stay as they were
 * loaded (mapped, read-only, in their dtype) and never get a gradient: the adapters are the
 * only parameters autograd tracks, and em_model_lora_module holds them for the optimizers,
 * clipping and training checkpoints, named as PEFT names them less its "base_model.model."
 * ("model.layers.0.self_attn.q_proj.lora_A.weight"). Targets are module names matched as
 * PEFT matches target_modules: a projection whose path equals the name or ends with "." and
 * the name. The Llama family's: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
 * down_proj; GPT-2's: c_attn, c_proj (the attention's and the MLP's), c_fc.
 *
 * Adding or loading adapters changes the model: do it before threads share it. */
#ifndef EMBER_FINETUNE_H
#define EMBER_FINETUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/tensor.h>
#include <ember/nn.h>
#include <ember/models.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PEFT's LoraConfig(r, lora_alpha, target_modules); lora_dropout 0, bias "none". */
typedef struct em_lora_config {
    int64_t rank;         /* r: 0 means 8 (PEFT's default) */
    double alpha;         /* lora_alpha: 0 means 8 (PEFT's default); the scale is alpha / r */
    const char *targets;  /* comma-separated module names; NULL or "": PEFT's defaults for the
                             family (q_proj,v_proj; GPT-2: c_attn) */
} em_lora_config;

/* Adds adapters to every projection the targets name. Errors (the model unchanged): a target
 * that matches no module (named in the message with the family's projections), a rank outside
 * [1, min(in, out)] of a targeted projection, alpha not positive, adapters already there. */
EM_API em_status em_model_lora_add(em_model *m, const em_lora_config *c);
/* Whether the model has adapters. */
EM_API bool em_model_has_lora(const em_model *m);
/* The adapters as a module (owned by the model; NULL and an error without adapters): its
 * parameters are the adapters, for em_adamw, em_clip_grad_norm, em_checkpoint_save. */
EM_API em_module *em_model_lora_module(em_model *m);
/* The adapters' config as added or loaded (targets as a comma-separated list); an error
 * without adapters. */
EM_API em_status em_model_lora_config(const em_model *m, em_lora_config *out);

/* Writes dir (created if missing) as PEFT's save_pretrained: adapter_config.json (peft_type
 * LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules, base_model_name_or_path =
 * base_model, lora_dropout 0, bias "none", fan_in_fan_out true for GPT-2's Conv1D...) and
 * adapter_model.safetensors ("base_model.model.<path>.lora_A.weight", float32). */
EM_API em_status em_model_lora_save(em_model *m, const char *dir, const char *base_model);
/* Reads a folder written by em_model_lora_save or PEFT: adds the adapters its config names
 * (when the model has none) and loads their weights. Every adapter of the config must be in the
 * file with its shape and nothing else: an adapter made for another base model is an error
 * naming the tensor and both shapes (or the module the model lacks); the model is unchanged
 * on any error. */
EM_API em_status em_model_lora_load(em_model *m, const char *dir);
/* Writes out_dir as a full model folder transformers loads: model.safetensors with every
 * weight (W + (alpha / r) B A where an adapter is, in the model's dtype; a tied output
 * embedding once, as save_pretrained), and the files of src_dir besides its weights that
 * describe the model (config.json, generation_config.json, tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json) copied as they are. The model keeps its
 * adapters. */
EM_API em_status em_model_save_merged(em_model *m, const char *src_dir, const char *out_dir);

/* Full fine-tuning, as a transformers model trains when no adapter is added: makes every
 * weight of m a trainable parameter that requires a gradient (a weight that views the file's
 * read-only bytes is copied; one converted on load trains in place). em_model_module then
 * holds them for the optimizers, clipping and checkpoints, named as transformers names them
 * ("model.layers.0.self_attn.q_proj.weight"; a tied output embedding is the one parameter
 * "model.embed_tokens.weight" / "transformer.wte.weight"). The model must compute in float32
 * (loaded with dtype EM_F32): lower-precision compute comes from autocast, over float32
 * master weights. Refused, the model unchanged, when it has adapters (LoRA trains the
 * adapters alone) or another dtype; calling it twice is a no-op. em_model_save_merged writes
 * the trained weights as a full model folder. */
EM_API em_status em_model_unfreeze(em_model *m);
/* The weights as a module after em_model_unfreeze (owned by the model), else NULL and an error. */
EM_API em_module *em_model_module(em_model *m);

/* ---- sharded full fine-tuning (ZeRO, include/ember/zero.h) ----
 * The weights group into units, one gathered at a time at ZeRO's stage 3: unit 0 the
 * embeddings (GPT-2: the token and position embeddings), unit 1 + L decoder layer L, and the
 * final norm with the output projection as the last unit. A tied output projection IS the
 * token embedding (one parameter), so with tied embeddings the final norm joins unit 0
 * instead: the unit runs twice in a forward (the embedding lookup, then the norm, projection
 * and loss), each gathering the one weight, and its gradients from both uses add up before
 * ZeRO reduces them. em_model_num_units: 1 + layers + (1 when untied).
 *
 *   em_model_unfreeze(m);
 *   em_zero *z = em_zero_new(em_model_module(m), NULL, like,
 *                            &(em_zero_opts){.stage = 3, .unit_of = unit_of, .unit_ctx = m});
 *   em_model_set_unit_runner(m, run_unit, z);   // stage 3; run_unit calls em_zero_run_unit
 *   ... em_model_loss, em_backward, em_zero_clip_grad_norm, em_zero_step ...
 *   em_model_save_units(m, src_dir, out_dir, rank == 0);   // every rank; one unit at a time
 *   em_model_set_unit_runner(m, NULL, NULL); em_zero_free(z);
 */
EM_API int em_model_num_units(const em_model *m); /* 0 for NULL */
/* The unit of the weight called name (em_model_module's names), or -1 if the model has none
 * of that name. */
EM_API int em_model_unit_of(const em_model *m, const char *name);
/* Runs fn(fn_ctx, in, n), the part of the forward that uses unit's weights (and no other
 * unit's), and calls free_fn_ctx(fn_ctx) (when not NULL) once fn is no longer needed; the
 * result of fn, or NULL and an error. em_zero_run_unit, given the em_zero. */
typedef em_tensor *(*em_model_unit_runner)(void *runner_ctx, int unit, em_checkpoint_fn fn, void *fn_ctx,
                                           void (*free_fn_ctx)(void *), em_tensor *const *in, int n);
/* With run set, em_model_forward and em_model_loss run each unit's part through run (and
 * never with a cache); NULL: the plain forward again. Needs em_model_unfreeze first. */
EM_API em_status em_model_set_unit_runner(em_model *m, em_model_unit_runner run, void *runner_ctx);

/* A full fine-tuning's weights written as a sharded model folder, one file per unit
 * (model-0000K-of-0000U.safetensors, model.safetensors.index.json, in the model's dtype; a
 * tied output embedding once) plus src_dir's config and tokenizer files, as
 * em_model_save_merged's: with a unit runner set, each unit is fetched through it (ZeRO stage
 * 3 gathers one unit at a time, so the writer never holds more than one). Every rank of the
 * runner calls it (its collectives); only those with write true write. A model.safetensors
 * already in out_dir is removed (it would be read instead of the index). */
EM_API em_status em_model_save_units(em_model *m, const char *src_dir, const char *out_dir, bool write);

/* transformers' ForCausalLMLoss: the cross-entropy (in float32) of logits [B, T, V] at
 * position t against labels [B, T] (int64 or int32, any device) at t + 1, labels -100 ignored.
 * num_items > 0: the sum divided by num_items (its num_items_in_batch, for gradient
 * accumulation); 0: the mean over the counted tokens. A label outside [0, V) other than -100
 * is an error naming its position; no counted token gives 0 (not NaN). A new reference,
 * scoped; differentiable. */
EM_API em_tensor *em_causal_lm_loss(em_tensor *logits, em_tensor *labels, int64_t num_items);

/* What em_model_loss takes besides the ids and labels; zeroed: no mask, every layer kept. */
typedef struct em_model_loss_opts {
    em_tensor *attention_mask;  /* as em_forward_opts' (NULL: every token real) */
    bool checkpoint_layers;     /* recompute each decoder layer in backward (em_checkpoint) */
    int64_t num_items;          /* as em_causal_lm_loss's */
    /* The loss times scale (0: 1), applied inside the fused loss, so that its gradient needs
     * no second pass over the vocabulary. Multiplying the returned loss instead (DDP and ZeRO
     * scale each rank's loss by the N ranks) makes backward run the chunks again under bf16
     * when the factor is not a power of two, to round the scaled gradient once. */
    double scale;
} em_model_loss_opts;
/* The model's forward on input_ids [B, T] without a cache up to the final norm, then the
 * causal LM loss as em_causal_lm_loss computes it from the logits, but fused with the output
 * projection (em_linear_cross_entropy, chunk by chunk): the float32 logits [B * (T - 1), V]
 * never exist at once, tied or untied head, ignored labels (-100) counting for nothing. Under
 * autocast the projection runs in the autocast dtype, as the unfused linear would. Labels
 * must be [B, T] as the ids. opts NULL: zeroed. */
EM_API em_tensor *em_model_loss(em_model *m, em_tensor *input_ids, em_tensor *labels, const em_model_loss_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
