/* The scalars of a fused optimizer step: the `arg` of an optimizer step's op call
 * (op_call.h), read by the backends' kernels, checked by core's dispatch
 * (src/core/ops_optim.c), and filled by the optimizers (src/optim/, through internal_api.h). */
#ifndef EM_BACKENDS_OPTIM_ARGS_H
#define EM_BACKENDS_OPTIM_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include "../kernels/layout.h" /* EMK_OPTF_*: the flags of the fused steps of the op list */

/* Scalars of one fused optimizer step (PyTorch 1.13's single-tensor formulas). The
 * derived constants (em__optim_consts in op_call.h) are computed on the host,
 * once, the way optimizer.c's op-by-op path computes its scalar arguments, so that every
 * backend rounds exactly like it. */
/* The slots of the loss scaler's float32 state (backend.h's amp_unscale / amp_update). */
enum { EM_AMP_SCALE, EM_AMP_TRACKER, EM_AMP_FOUND_INF, EM_AMP_SKIPPED, EM_AMP_NSTATE };

typedef struct em_optim_args {
    double lr, weight_decay;
    /* Adam / AdamW */
    double beta1, beta2, eps;
    double bias_correction1, bias_correction2; /* 1 - beta^step */
    bool decoupled;   /* AdamW: p *= 1 - lr * wd first; Adam: g += wd * p */
    bool amsgrad;     /* uses state max_exp_avg_sq */
    bool maximize;    /* SGD and Adam: step along +g (the gradient negated first) */
    /* SGD */
    double momentum, dampening;
    bool nesterov;
    bool first_step;  /* the momentum buffer is new: buf = d (PyTorch's clone) */
    /* Loss scaling (src/optim/grad_scaler.c): the scaler's float32 state
     * {scale, growth tracker, found_inf, skipped steps} on p's device, or NULL. When set,
     * the kernel does nothing if found_inf != 0, and Adam's bias corrections use
     * step - skipped (the steps actually taken) instead of bias_correction1/2. */
    const struct em_tensor *amp;
    int64_t step;     /* Adam: this parameter's step count, this step included */
    /* Adam, on a backend whose supports accepts it: also write p's new value cast to lowp_out's
     * dtype (bf16 or f16; contiguous, p's shape and device), rounded as a cast rounds. NULL:
     * none (src/core/lowp_shadow.c). */
    struct em_tensor *lowp_out;
    /* Adam: make no low-precision copy for the next cast (em_adam_opts' no_lowp_copy);
     * core's, read before lowp_out is chosen */
    bool no_lowp_copy;
} em_optim_args;

/* One parameter of a multi-tensor Adam/AdamW step (op_list.h's ADAM_STEP_MULTI). */
typedef struct em_adam_multi_item {
    struct em_tensor *p, *m, *v;
    const struct em_tensor *g;
    struct em_tensor *low; /* p's new value cast to bf16/f16 (lowp_out's meaning), or NULL */
    em_optim_args args;
} em_adam_multi_item;

typedef struct em_adam_multi {
    int n;
    em_adam_multi_item *items;
    /* Adam's step count and learning rate on the device (PyTorch's capturable=True; set by
     * src/optim/sgd_adam.c on the GPUs, NULL elsewhere): before the updates the backend
     * advances sched, float64 [2] {steps taken, lr}, by one step and writes consts, float32 [3]
     * {-(lr / (1 - beta1^t)), sqrt(1 - beta2^t), 1 - lr * weight_decay}, each computed in
     * float64 and rounded once, as em__optim_consts computes them on the host; the updates read
     * those three instead of the items' host constants. A graph that records the call thus
     * replays the next step, not the recorded one. */
    struct em_tensor *sched, *consts;
    double beta1, beta2, weight_decay;
} em_adam_multi;

#endif
