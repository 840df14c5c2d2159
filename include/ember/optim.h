/* Optimizers, gradient clipping and learning-rate schedules, as torch.optim.
 *
 *   em_optimizer *opt = em_adam(model, 1e-3);
 *   em_zero_grad(opt); em_backward(loss); em_step(opt);
 *
 * An optimizer holds references to its module's parameters and keeps its state (momentum,
 * Adam's moments) keyed by parameter. em_module_to moves that state together with the
 * parameters, so moving a model after creating its optimizer is safe.
 * The updates follow PyTorch 1.13's single-tensor formulas exactly. Each parameter is
 * updated by one fused backend kernel when it, its gradient and its state are contiguous on
 * one device (the usual case), and otherwise by the public in-place ops (about ten kernels
 * per parameter for Adam); in f32/f64 the two give the same results.
 * em_step makes any missing state of every parameter before it updates one, so running out
 * of memory there leaves the model and optimizer as they were (SGD's first momentum buffer
 * and the unfused path excepted). An optimizer is used from one thread at a time (ember.h). */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_optimizer em_optimizer; /* an optimizer over a module's parameters */

/* torch.optim.SGD's options; em_sgd_defaults(lr) gives PyTorch's defaults (all zero). */
typedef struct em_sgd_opts {
    double lr, momentum, dampening, weight_decay; /* as torch.optim.SGD's arguments */
    bool nesterov;                                /* Nesterov momentum */
} em_sgd_opts;
/* torch.optim.Adam / AdamW options. Adam's weight_decay adds wd * p to the gradient;
 * AdamW's multiplies p by (1 - lr * wd) first (decoupled). */
typedef struct em_adam_opts {
    double lr, beta1, beta2, eps, weight_decay; /* as torch.optim.Adam's (betas = (beta1, beta2)) */
    bool amsgrad;                               /* keep the maximum of exp_avg_sq */
} em_adam_opts;

EM_API em_sgd_opts em_sgd_defaults(double lr);     /* lr, everything else 0 */
EM_API em_adam_opts em_adam_defaults(double lr);   /* betas (0.9, 0.999), eps 1e-8, weight_decay 0 */
EM_API em_adam_opts em_adamw_defaults(double lr);  /* the same with weight_decay 0.01 */

/* Optimizers over every parameter of m (shared parameters counted once). */
EM_API em_optimizer *em_sgd(em_module *m, double lr);
EM_API em_optimizer *em_sgd_ex(em_module *m, em_sgd_opts o);     /* SGD with every option */
EM_API em_optimizer *em_adam(em_module *m, double lr);           /* Adam with PyTorch's defaults */
EM_API em_optimizer *em_adam_ex(em_module *m, em_adam_opts o);   /* Adam with every option */
EM_API em_optimizer *em_adamw(em_module *m, double lr);          /* AdamW with PyTorch's defaults */
EM_API em_optimizer *em_adamw_ex(em_module *m, em_adam_opts o);  /* AdamW with every option */
EM_API void em_optim_free(em_optimizer *opt);                     /* its states too; NULL is ignored */

/* Set every parameter's .grad to none (PyTorch 2's default, set_to_none=True): the next
 * backward allocates fresh gradients. Gradients accumulate over backwards until this. */
EM_API em_status em_zero_grad(em_optimizer *opt);
/* One update of every parameter that has a .grad (runs in no-grad mode). */
EM_API em_status em_step(em_optimizer *opt);

EM_API double em_optim_lr(const em_optimizer *opt);              /* the learning rate now */
EM_API em_status em_optim_set_lr(em_optimizer *opt, double lr);  /* change it (for every parameter) */
/* Number of em_step calls so far. */
EM_API int64_t em_optim_steps(const em_optimizer *opt);
/* A state tensor of parameter p by PyTorch's name ("exp_avg", "exp_avg_sq",
 * "max_exp_avg_sq", "momentum_buffer"): a new reference, or NULL if there is none (yet). */
EM_API em_tensor *em_optim_state(em_optimizer *opt, em_tensor *p, const char *name);

/* torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm): scales all gradients by
 * min(1, max_norm / (norm + 1e-6)) and returns the total 2-norm before clipping
 * (NaN and an error on failure). */
EM_API double em_clip_grad_norm(em_module *m, double max_norm);

/* ---- learning-rate schedules ---- */
/* The schedule's shape: constant, StepLR, or a warmup then cosine annealing. */
typedef enum em_lr_kind { EM_LR_CONSTANT = 0, EM_LR_STEP, EM_LR_COSINE } em_lr_kind;
/* A learning-rate schedule; zeroed: constant. */
typedef struct em_lr_schedule {
    em_lr_kind kind;    /* which fields below apply */
    int64_t step_size;  /* EM_LR_STEP */
    double gamma;       /* EM_LR_STEP */
    int64_t warmup;     /* EM_LR_COSINE */
    int64_t total;      /* EM_LR_COSINE */
    double min_lr;      /* EM_LR_COSINE */
} em_lr_schedule;
/* StepLR: lr = base * gamma^(t / step_size) (integer division). */
EM_API em_lr_schedule em_lr_step(int64_t step_size, double gamma);
/* Linear warmup to base over `warmup` steps (lr = base * (t + 1) / warmup), then cosine
 * annealing to min_lr at t = total (CosineAnnealingLR when warmup = 0); min_lr after. */
EM_API em_lr_schedule em_lr_cosine(int64_t warmup, int64_t total, double min_lr);
/* The learning rate of schedule s at scheduler step t from base_lr. */
EM_API double em_lr_at(em_lr_schedule s, double base_lr, int64_t t);
/* Attach s to opt: the current lr becomes the base, t = 0, and the lr is set to em_lr_at(s, base, 0). */
EM_API em_status em_optim_set_schedule(em_optimizer *opt, em_lr_schedule s);
/* scheduler.step(): t += 1 and the lr becomes em_lr_at(s, base, t). */
EM_API em_status em_optim_schedule_step(em_optimizer *opt);

typedef struct em_safetensors em_safetensors;   /* include/ember/io.h */

/* ---- training checkpoints ----
 * One safetensors file with the module's state dict under its own keys (so Python's
 * safetensors and em_module_load read the model from it), the optimizer's state under
 * "optimizer.<param name>.<state>" (PyTorch's state names: exp_avg, exp_avg_sq,
 * momentum_buffer), and in "__metadata__" the optimizer's kind, step counts and learning rate
 * plus nmeta (key, value) pairs of the caller's (epoch, batch, seed...). Written atomically:
 * a temporary file, then a rename, so a crash while saving leaves the old file intact.
 * opt may be NULL (model only). */
EM_API em_status em_checkpoint_save(const char *path, em_module *m, em_optimizer *opt,
                             const char *const *keys, const char *const *values, int nmeta);
/* Restores the module and, when opt is not NULL, the optimizer (state moved to each
 * parameter's device and dtype) from a file written by em_checkpoint_save. Everything is
 * checked before anything changes: a missing key, a shape or optimizer-kind mismatch is an
 * error that leaves the module and optimizer as they were. If meta is not NULL it receives
 * the file, for em_safetensors_metadata; release it with em_safetensors_free. */
EM_API em_status em_checkpoint_load(const char *path, em_module *m, em_optimizer *opt, em_safetensors **meta);
/* The same from a file already loaded with em_safetensors_load, which stays the caller's
 * (its metadata, em_safetensors_metadata, can be read before and after): one read of the
 * file serves the checks of its metadata and the load, so a save replacing the file in
 * between cannot mix two versions, and a pipe can be loaded. */
EM_API em_status em_checkpoint_load_safetensors(const em_safetensors *file, em_module *m, em_optimizer *opt);

#ifdef __cplusplus
}
#endif
#endif
