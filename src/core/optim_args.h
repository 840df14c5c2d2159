/* The scalars of a fused optimizer step, shared by core's dispatch (src/core/ops_optim.c),
 * the optimizers that fill them (src/optim/) and the backends' kernels. */
#ifndef EM_CORE_OPTIM_ARGS_H
#define EM_CORE_OPTIM_ARGS_H

#include <stdbool.h>

/* Scalars of one fused optimizer step (PyTorch 1.13's single-tensor formulas). The
 * derived constants (em__optim_consts in src/backends/backend.h) are computed on the host,
 * once, the way optimizer.c's op-by-op path computes its scalar arguments, so that every
 * backend rounds exactly like it. */
typedef struct em_optim_args {
    double lr, weight_decay;
    /* Adam / AdamW */
    double beta1, beta2, eps;
    double bias_correction1, bias_correction2; /* 1 - beta^step */
    bool decoupled;   /* AdamW: p *= 1 - lr * wd first; Adam: g += wd * p */
    bool amsgrad;     /* uses state max_exp_avg_sq */
    /* SGD */
    double momentum, dampening;
    bool nesterov;
    bool first_step;  /* the momentum buffer is new: buf = d (PyTorch's clone) */
} em_optim_args;

#endif
