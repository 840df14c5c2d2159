/* The optimizer's insides that checkpoints read and restore, and switches for tests and
 * benchmarks (not public). */
#ifndef EM_OPTIM_INTERNAL_H
#define EM_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/optim.h>

/* "sgd", "adam" or "adamw". */
const char *em__optim_kind_name(const em_optimizer *o);
/* The names of the per-parameter state tensors this optimizer keeps (PyTorch's keys);
 * slot k of em__optim_state_slot holds the k-th. Returns how many. */
int em__optim_state_names(const em_optimizer *o, const char *const **names);
int em__optim_nparams(const em_optimizer *o);
em_tensor *em__optim_param(const em_optimizer *o, int i);
/* A retained reference or NULL (state not created yet). */
em_tensor **em__optim_state_slot(em_optimizer *o, int i, int k);
int64_t *em__optim_param_step(em_optimizer *o, int i);
int64_t *em__optim_step_count(em_optimizer *o);

/* fused = false makes every em_step take the op-by-op path (the reference the backends'
 * fused kernels are checked against); true (the default) uses them where they apply. */
void em__optim_set_fused(em_optimizer *opt, bool fused);
/* How many parameter updates a fused kernel has done (proves which path ran). */
int64_t em__optim_fused_updates(const em_optimizer *opt);

/* Loss scaling (grad_scaler.c): while state is set, em_step's kernels read the scaler's
 * found-inf flag and skipped count from it (NULL: no scaler). Borrowed. */
void em__optim_set_amp(em_optimizer *opt, em_tensor *state);

#endif
