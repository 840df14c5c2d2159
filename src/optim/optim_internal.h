/* The optimizer's insides that checkpoints and schedules read and restore, what the
 * built-in optimizers' steps need beyond the public em_optim_update, and switches for tests
 * and benchmarks (not public). */
#ifndef EM_OPTIM_INTERNAL_H
#define EM_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/optim.h>
#include "../core/internal_api.h" /* em_adam_multi_item: the collected updates */

#define EM__OPTIM_MAX_STATE 8   /* em_optimizer_ops.nstate's bound (optim.h) */
#define EM__OPTIM_MAX_SCALAR 8  /* em_optimizer_ops.nscalar's bound */
#define EM__OPTIM_NAME_MAX 32   /* a state's or scalar's name, in characters (checkpoint keys) */

/* ---- the built-in optimizers' tables (sgd_adam.c, adaptive.c) ---- */
extern const em_optimizer_ops em__sgd_ops, em__adam_ops, em__adamw_ops;
extern const em_optimizer_ops em__adadelta_ops, em__adagrad_ops, em__rmsprop_ops;
extern const em_optimizer_ops em__adamax_ops, em__nadam_ops, em__radam_ops;
/* Whether the optimizer's step reads a loss scaler's found-inf flag itself (the fused SGD and
 * Adam kernels do, on the device; their op-by-op path reads it on the host). For the others
 * em_step reads it once on the host and skips the whole step, as GradScaler.step does. */
bool em__optim_reads_scaler(const em_optimizer_ops *ops);

/* ---- for the built-in steps ---- */
/* fused = false makes every em_step take the op-by-op path (the reference the backends'
 * fused kernels are checked against); true (the default) uses them where they apply. */
void em__optim_set_fused(em_optimizer *opt, bool fused);
bool em__optim_fused_allowed(const em_optimizer *opt);
/* Counts one parameter update done by a fused kernel; the count proves which path ran. */
void em__optim_count_fused(em_optimizer *opt);
int64_t em__optim_fused_updates(const em_optimizer *opt);
/* Adam and AdamW's multi-tensor step (sgd_adam.c): while em_step runs, the updates the GPUs'
 * multi-tensor kernel takes (em__fused_adam_multi_applies) are collected instead of launched,
 * then em__optim_flush_batch runs them together, one call per device (each item falls back
 * to its own fused step where the backend declines). batch_param[j] is item j's parameter's
 * index in the optimizer (em_step undoes those steps' counts on a failure). */
typedef struct em__optim_batch {
    bool open;                /* em_step is collecting */
    bool per_tensor;          /* never collect (tests: the per-tensor fused path as reference) */
    int n, cap;               /* arrays for cap updates, made before em_step changes anything */
    em_adam_multi_item *items, *group;
    int *param;
    bool *taken;
    int64_t calls;            /* multi-tensor calls made (tests: which path ran) */
} em__optim_batch;
em__optim_batch *em__optim_batch_of(em_optimizer *opt);
int em__optim_current_param(const em_optimizer *opt); /* em_step's parameter index */
em_status em__optim_flush_batch(em_optimizer *opt);
/* Loss scaling (grad_scaler.c): while state is set, em_step's kernels read the scaler's
 * found-inf flag and skipped count from it (NULL: no scaler). Borrowed. */
void em__optim_set_amp(em_optimizer *opt, em_tensor *state);
em_tensor *em__optim_amp(const em_optimizer *opt);

/* ---- Adam/AdamW's step count and learning rate on the device (sgd_adam.c) ----
 * PyTorch's capturable=True: on a GPU the multi-tensor step reads its bias corrections and
 * learning rate from device memory that the device itself advances at each step
 * (em_adam_multi's sched), so a graph that recorded em_step replays the next step rather than
 * the recorded one. The host's counts stay the truth: before a step the device's are
 * rewritten when they differ (a checkpoint was loaded, the learning rate was set), which a
 * capture refuses (so does any Adam update that would take host scalars inside a capture:
 * the per-tensor and op-by-op paths); em_optim_set_lr queues the new rate at once, so that
 * a replay sees it. */
typedef struct em__optim_device_schedule {
    int mode;              /* -1 (default): CUDA devices; 0: never; 1: every device but the CPU (tests) */
    em_tensor *state;      /* float64 [2] {steps taken, lr} on the device, retained; NULL until used */
    em_tensor *consts;     /* float32 [3]: what the device computes from state (em_adam_multi) */
    int64_t steps;         /* the count state holds once the queued work has run */
    double lr;             /* the rate state holds */
    bool used;             /* the last em_step's multi-tensor updates read it */
} em__optim_device_schedule;
em__optim_device_schedule *em__optim_device_schedule_of(em_optimizer *opt);
/* em_optim_set_lr: queue the new rate into the device schedule (no wait; nothing inside a
 * capture, whose step then refuses the stale rate). */
em_status em__optim_device_lr(em_optimizer *opt);

/* ---- for checkpoints (checkpoint.c) ---- */
const em_optimizer_ops *em__optim_ops(const em_optimizer *o);
/* Whether state k is kept with the optimizer's options (saved and loaded only then). */
bool em__optim_uses_state(const em_optimizer *o, int k);
int em__optim_nparams(const em_optimizer *o);
em_tensor *em__optim_param(const em_optimizer *o, int i);
/* A retained reference or NULL (state not created yet). */
em_tensor **em__optim_state_slot(em_optimizer *o, int i, int k);
double *em__optim_scalar_slot(em_optimizer *o, int i, int k);
int64_t *em__optim_param_step(em_optimizer *o, int i);
int64_t *em__optim_step_count(em_optimizer *o);

/* ---- for schedules (lr_scheduler.c) ---- */
/* PyTorch's group["initial_lr"]: NaN until a scheduler or a checkpoint sets it. */
double *em__optim_initial_lr(em_optimizer *o);
/* Where the options keep OneCycleLR's momentum (em_optimizer_ops.momentum), or NULL. */
double *em__optim_momentum(em_optimizer *o);
em_lr_scheduler *em__optim_scheduler(const em_optimizer *o);
/* One scheduler per optimizer: attaching a second is an error, unless the first is
 * em_optim_set_schedule's (owned), which is freed. The optimizer's free frees an owned one
 * and tells a user's one (em__lr_scheduler_forget_optimizer). */
em_status em__optim_attach_scheduler(em_optimizer *o, em_lr_scheduler *s, bool owned);
void em__optim_detach_scheduler(em_optimizer *o, const em_lr_scheduler *s);
void em__lr_scheduler_forget_optimizer(em_lr_scheduler *s);
/* A schedule kind's name in checkpoints (PyTorch's class name: "StepLR"), and back. */
const char *em__lr_kind_name(em_lr_kind k);
bool em__lr_kind_parse(const char *name, em_lr_kind *out);
/* Whether st can be loaded into s (em_lr_scheduler_load_state_dict's checks, recording the
 * error with op and where (the file) in it), changing nothing. */
em_status em__lr_scheduler_check_state(const em_lr_scheduler *s, const em_lr_scheduler_state *st, const char *op,
                                       const char *where);

#endif
