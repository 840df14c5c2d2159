/* ZeRO (the Zero Redundancy Optimizer of Rajbhandari et al.): data-parallel training whose
 * optimizer states, gradients and parameters are sharded across the ranks of a group, as
 * PyTorch's ZeroRedundancyOptimizer (stage 1) and FullyShardedDataParallel (stages 2, 3).
 *
 *   em_dist_init("auto");
 *   em_optimizer *like = em_adamw(model, 1e-3);      // the kind and options; never stepped
 *   em_zero *z = em_zero_new(model, NULL, like, &(em_zero_opts){.stage = 3});
 *   em_optim_free(like);
 *   for each batch (this rank's part of it):
 *       em_zero_clear_grads(z);
 *       em_backward(em_cross_entropy(em_zero_forward(z, x), y, 0.0));
 *       em_zero_step(z);                              // averaged over the ranks, as DDP
 *   em_zero_free(z);
 *
 * ---- The flat space ----
 * The model's parameters are cut into units: each child of a Sequential model that has
 * parameters is one (a block), any other model is one unit. A unit's parameters, in
 * em_module_parameters' order, are laid end to end in a flat space of `numel` elements,
 * padded to N * shard elements (shard = ceil(numel / N)); rank r owns the contiguous
 * elements [r * shard, (r + 1) * shard) of every unit. Every rank must build the same model;
 * em_zero_new checks the units' sizes across the ranks and broadcasts rank 0's values.
 *
 * ---- Stages (what each rank keeps between steps) ----
 * 1: every parameter and gradient; the optimizer's states of its shard only. em_zero_step
 *    all-reduces (averages) the gradients, steps its shard and all-gathers the updated
 *    parameters into each unit's flat buffer, which the parameters are views of.
 * 2: also only its shard of the gradients: when the last gradient of a unit is ready during
 *    backward (an autograd gradient hook), the unit's gradients are reduce-scattered into
 *    the ranks' gradient shards and freed.
 * 3: also only its shard of the parameters: each unit's parameters are all-gathered before
 *    its forward and freed after it, and gathered again in its backward. Ember's stage 3
 *    recomputes each unit's forward in its backward (em_checkpoint around every unit):
 *    autograd's saved tensors would otherwise hold the gathered parameters from the forward
 *    to the backward. Between uses a parameter of the model is a one-element NaN expanded to
 *    its shape: read it through em_zero_full_parameters, not directly.
 *
 * ---- Precision ----
 * The model's parameters may be float32 (the optimizer steps them, or their shard, directly)
 * or bfloat16/float16 (mixed precision: the optimizer steps a float32 master copy of this
 * rank's shard and the compute copies are cast from it). Under autocast with float32
 * parameters, autocast makes the low-precision compute copies as it does without ZeRO.
 * Memory per rank for P parameters on N ranks with Adam (em_zero_estimate), plus
 * activations: float32: stage 1 8P + 8P/N, stage 2 4P + 12P/N, stage 3 16P/N bytes;
 * 16-bit parameters with float32 masters: 4P + 12P/N, 2P + 14P/N, 16P/N (the paper's).
 *
 * Weight decay: Adam's and AdamW's decay_matrices_only decides by a parameter's shape, which
 * the flat shards have lost, so ZeRO applies that decay itself, to the elements of the shard
 * that belong to a matrix (AdamW: multiplied by 1 - lr * wd before the step; Adam: wd * p
 * added to their gradient), and steps the optimizer without decay.
 *
 * Every rank calls every function here in the same order (they run collectives), with the
 * same model and the same graph (the same units used in every backward). Parameters shared
 * between units are refused; parameters that do not require grad are left alone (full on
 * every rank). One em_zero per model, used from one thread. */
#ifndef EMBER_ZERO_H
#define EMBER_ZERO_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/nn.h>
#include <ember/optim.h>
#include <ember/dist.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_zero em_zero; /* a model trained with sharded state (em_zero_new) */

/* em_zero_new's settings. */
typedef struct em_zero_opts {
    int stage; /* 1, 2 or 3 (what is sharded: see above) */
    /* The units of a model that is not a Sequential of blocks (a loaded language model:
     * em_model_unit_of): unit_of(unit_ctx, name) is the unit, 0 to U - 1, of the trainable
     * parameter called name (em_module_parameters' name); every unit must get one, and a
     * unit's parameters are laid out in em_module_parameters' order. At stage 3 the caller's
     * forward runs each unit through em_zero_run_unit. NULL: the units as above. */
    int (*unit_of)(void *unit_ctx, const char *name);
    void *unit_ctx; /* unit_of's first argument */
} em_zero_opts;

/* Shards model (not owned; it must stay alive and is changed in place: its parameters
 * become views of the flat buffers, at stage 3 placeholders) over g (NULL: the world), with
 * an optimizer of like's kind, options and learning rate over this rank's shards (like is
 * only read: free it after). Every parameter that requires grad must share one device and
 * one dtype (float32, bfloat16 or float16). NULL and an error on failure; a failure after
 * the checks (a collective or an allocation) may leave the model partly sharded (stage 3:
 * some parameters placeholders): free it. */
EM_API em_zero *em_zero_new(em_module *model, em_dist_group *g, em_optimizer *like, const em_zero_opts *opts);
/* The model's forward: em_forward at stages 1 and 2; at stage 3 each unit gathered for its
 * forward and freed after (a Sequential's children in order). */
EM_API em_tensor *em_zero_forward(em_zero *z, em_tensor *x);
/* Runs fn(ctx, in, n), a piece of the caller's forward that uses unit's parameters and no
 * other unit's (units from em_zero_opts.unit_of): at stages 1-2 it just calls it; at stage 3
 * it all-gathers the unit around the call and frees it after, through em_checkpoint, so that
 * the backward gathers it again and recomputes fn (which must compute the same function of
 * its inputs each time). free_ctx (may be NULL) frees ctx once fn is no longer needed: after
 * the call, or with the graph at stage 3. A unit may run more than once in a forward (a tied
 * embedding and output projection). NULL and an error (ctx freed) on failure. */
EM_API em_tensor *em_zero_run_unit(em_zero *z, int unit, em_checkpoint_fn fn, void *ctx, void (*free_ctx)(void *),
                                   em_tensor *const *in, int n);
/* torch.nn.utils.clip_grad_norm_ over the ranks: the total 2-norm of the averaged gradient,
 * every shard's squares summed over the ranks, so that every rank gets the number
 * em_clip_grad_norm gives on one process; when max_norm > 0 and the norm exceeds it, this
 * rank's gradient shards are scaled by max_norm / (norm + 1e-6) for the next em_zero_step.
 * Call it after the backward(s) and before em_zero_step; stage 1 averages the gradients here
 * (em_zero_step then does not again). NAN and an error on failure. */
EM_API double em_zero_clip_grad_norm(em_zero *z, double max_norm);
/* Drops the gradients (stage 1: every parameter's .grad; stages 2-3: this rank's shards):
 * the next backward starts from zero. */
EM_API em_status em_zero_clear_grads(em_zero *z);
/* One optimizer step: stage 1 averages the gradients over the ranks first; every stage
 * steps this rank's shards and brings the compute copies up to date (stages 1-2: all-gather
 * into the flat buffers; stage 3: this rank's compute shard). A unit whose parameters got no
 * gradient steps with zeros. */
EM_API em_status em_zero_step(em_zero *z);
/* The optimizer over this rank's shards (borrowed): its learning rate, states and
 * schedulers; its parameters are the float32 masters, one per unit ("unit0", "unit1", ...). */
EM_API em_optimizer *em_zero_optimizer(em_zero *z);
EM_API int em_zero_stage(const em_zero *z);     /* 1, 2 or 3 (0 for NULL) */
EM_API int em_zero_num_units(const em_zero *z); /* units of the flat space (0 for NULL) */
/* Unit u's flat size, its shard size (numel padded to N shards, divided by N) and its
 * module (borrowed). */
EM_API em_status em_zero_unit_info(const em_zero *z, int u, int64_t *numel, int64_t *shard, em_module **block);
/* Every trainable parameter's current value, unit by unit in flat order, as one float32
 * CPU tensor of sum(numel) elements, on every rank (a collective at stage 3). */
EM_API em_tensor *em_zero_full_parameters(em_zero *z);

/* ---- sharded checkpoints ----
 * em_zero_save writes the folder `dir` (made if missing) with one file per rank,
 * rank-R.safetensors: em_checkpoint_save of this rank's float32 master shards and
 * optimizer states, with in its metadata the layout (N, this rank, the stage, each unit's
 * numel, shard and parameter list) and the nmeta (key, value) pairs of the caller's.
 * em_zero_load restores them on any number of ranks: each rank reads the files whose
 * shards overlap its own and copies the overlap (re-sharding), after checking that the
 * units and their parameters match. meta, if not NULL, receives rank 0's file of the
 * folder (its em_safetensors_metadata holds the caller's pairs; em_safetensors_free it). */
EM_API em_status em_zero_save(em_zero *z, const char *dir, const char *const *keys, const char *const *values, int nmeta);
EM_API em_status em_zero_load(em_zero *z, const char *dir, em_safetensors **meta); /* see above */

/* Stage 3: gives every parameter of the model full storage of its own with its current
 * value (a collective; 4P bytes for float32), so that the model can be used without z (to
 * evaluate it or save it with em_module_save). Call it last: z must not train after it, and
 * its optimizer (em_zero_optimizer) is freed first to make room (em_zero_step, em_zero_save
 * and em_zero_load then fail). Stages 1-2: nothing to do (the parameters are views of flat
 * buffers they keep alive). */
EM_API em_status em_zero_unshard(em_zero *z);
/* em_zero_unshard on rank root alone (root -1: every rank, em_zero_unshard): the units are
 * gathered one at a time on every rank, but only root keeps them, so the other ranks never
 * hold more than one unit's full parameters (a model written by one rank). Ranks other than
 * root keep placeholders. */
EM_API em_status em_zero_unshard_to(em_zero *z, int root);
/* Frees z, its shards and its optimizer (no collective). At stage 3 the model's parameters
 * stay placeholders unless em_zero_unshard ran. NULL is ignored. */
EM_API void em_zero_free(em_zero *z);

/* ---- memory per rank (the paper's formulas) ----
 * Bytes per rank for training P parameters with Adam (two float32 states per parameter)
 * on N ranks at stage 0 (plain data parallel) to 3, not counting activations. mixed: 16-bit
 * parameters and gradients with float32 master weights; otherwise everything float32. */
typedef struct em_zero_memory {
    double parameters;     /* the compute parameters (full, or the shard at stage 3) */
    double gradients;      /* the gradients (full at stages 0-1, a shard after) */
    double master_weights; /* float32 masters of the shard (mixed precision only) */
    double optimizer;      /* Adam's two states of the shard (of everything at stage 0) */
    double total;          /* their sum */
} em_zero_memory;
/* Fills *out for params parameters at stage (0 to 3) on ranks ranks, mixed as above. */
EM_API em_status em_zero_estimate(double params, int stage, int ranks, bool mixed, em_zero_memory *out);

#ifdef __cplusplus
}
#endif
#endif
