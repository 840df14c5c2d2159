/* Optimizers, gradient clipping and learning-rate schedules, as torch.optim.
 *
 *   em_optimizer *opt = em_adam(model, 1e-3);
 *   em_lr_scheduler *sched = em_lr_scheduler_new(opt, em_lr_step(1, 0.7), -1);  (optional)
 *   for each batch: em_zero_grad(opt); em_backward(loss); em_step(opt);
 *   for each epoch: em_lr_scheduler_step(sched);
 *
 * An optimizer holds references to its module's parameters and keeps its state (momentum,
 * Adam's moments) keyed by parameter. em_module_to moves that state together with the
 * parameters, so moving a model after creating its optimizer is safe.
 * The updates follow PyTorch's single-tensor formulas (torch.optim's foreach=False), with
 * PyTorch's defaults, option names and state names. Each parameter is updated by one fused
 * backend kernel where the backend has one (SGD, Adam, AdamW, Adadelta, Adagrad, RMSprop,
 * Adamax, NAdam, RAdam) and the parameter, its gradient and its state are contiguous on one
 * device (the usual case), and otherwise by the public in-place ops (about ten kernels per
 * parameter for Adam); in f32/f64 the two give the same results.
 * em_step makes any missing state of every parameter before it updates one, so running out
 * of memory there leaves the model and optimizer as they were (the unfused path excepted).
 * Every optimizer, the built-in ones included, is an em_optimizer_ops table (below): one
 * written outside Ember gets zero_grad, schedules, checkpoints and device moves as they do.
 * An optimizer is used from one thread at a time (ember.h). */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
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
    bool maximize;                                /* ascend: step along +grad */
} em_sgd_opts;
/* torch.optim.Adam / AdamW options. Adam's weight_decay adds wd * p to the gradient;
 * AdamW's multiplies p by (1 - lr * wd) first (decoupled). */
typedef struct em_adam_opts {
    double lr, beta1, beta2, eps, weight_decay; /* as torch.optim.Adam's (betas = (beta1, beta2)) */
    bool amsgrad;                               /* keep the maximum of exp_avg_sq */
    bool maximize;                              /* ascend: step along +grad */
    /* weight_decay only on parameters of 2 or more dimensions: none on biases and norm
     * weights, the two param_groups transformers' Trainer and nanoGPT give AdamW */
    bool decay_matrices_only;
    /* keep no bf16/f16 copy of the new weights for the next forward's casts. By default the
     * fused step writes one for each float32 weight that a cast asked for, in its own pass,
     * and the next cast takes it instead of casting: 2 bytes a weight held from the step to
     * the next one, when the gradients and both states exist too. Set: that memory is not
     * used, and the next forward casts the weights itself. */
    bool no_lowp_copy;
} em_adam_opts;
/* torch.optim.Adadelta: square_avg and acc_delta, averaged with rho. */
typedef struct em_adadelta_opts {
    double lr, rho, eps, weight_decay; /* as torch.optim.Adadelta's */
    bool maximize;                     /* ascend: step along +grad */
} em_adadelta_opts;
/* torch.optim.Adagrad: the sum of squared gradients; the step's lr is
 * lr / (1 + (step - 1) * lr_decay). */
typedef struct em_adagrad_opts {
    double lr, lr_decay, weight_decay, initial_accumulator_value, eps; /* as torch.optim.Adagrad's */
    bool maximize;                                                     /* ascend: step along +grad */
} em_adagrad_opts;
/* torch.optim.RMSprop: square_avg averaged with alpha; centered also keeps grad_avg and
 * divides by the variance's root, momentum > 0 a momentum_buffer. */
typedef struct em_rmsprop_opts {
    double lr, alpha, eps, weight_decay, momentum; /* as torch.optim.RMSprop's */
    bool centered, maximize;                       /* centered: subtract grad_avg^2; maximize: ascend */
} em_rmsprop_opts;
/* torch.optim.Adamax: exp_avg and exp_inf (the infinity norm's running maximum). */
typedef struct em_adamax_opts {
    double lr, beta1, beta2, eps, weight_decay; /* as torch.optim.Adamax's (betas = (beta1, beta2)) */
    bool maximize;                              /* ascend: step along +grad */
} em_adamax_opts;
/* torch.optim.NAdam: Adam with Nesterov momentum and momentum decay (per-parameter scalar
 * state mu_product). */
typedef struct em_nadam_opts {
    double lr, beta1, beta2, eps, weight_decay, momentum_decay; /* as torch.optim.NAdam's */
    bool decoupled_weight_decay;  /* AdamW-style decay: p *= 1 - lr * wd */
    bool maximize;                /* ascend: step along +grad */
} em_nadam_opts;
/* torch.optim.RAdam: Adam whose adaptive term is rectified once the variance is tractable
 * (rho_t > 5), plain momentum before. */
typedef struct em_radam_opts {
    double lr, beta1, beta2, eps, weight_decay; /* as torch.optim.RAdam's */
    bool decoupled_weight_decay;                /* AdamW-style decay: p *= 1 - lr * wd */
    bool maximize;                              /* ascend: step along +grad */
} em_radam_opts;

/* PyTorch's defaults, with the learning rate given (its default in brackets). */
EM_API em_sgd_opts em_sgd_defaults(double lr);           /* everything else 0 */
EM_API em_adam_opts em_adam_defaults(double lr);         /* [1e-3] betas (0.9, 0.999), eps 1e-8, weight_decay 0 */
EM_API em_adam_opts em_adamw_defaults(double lr);        /* [1e-3] the same with weight_decay 0.01 */
EM_API em_adadelta_opts em_adadelta_defaults(double lr); /* [1.0] rho 0.9, eps 1e-6 */
EM_API em_adagrad_opts em_adagrad_defaults(double lr);   /* [1e-2] lr_decay 0, accumulator 0, eps 1e-10 */
EM_API em_rmsprop_opts em_rmsprop_defaults(double lr);   /* [1e-2] alpha 0.99, eps 1e-8, momentum 0 */
EM_API em_adamax_opts em_adamax_defaults(double lr);     /* [2e-3] betas (0.9, 0.999), eps 1e-8 */
EM_API em_nadam_opts em_nadam_defaults(double lr);       /* [2e-3] betas (0.9, 0.999), eps 1e-8, momentum_decay 4e-3 */
EM_API em_radam_opts em_radam_defaults(double lr);       /* [1e-3] betas (0.9, 0.999), eps 1e-8 */

/* Optimizers over every parameter of m (shared parameters counted once): `name(m, lr)` with
 * PyTorch's other defaults, `name_ex(m, opts)` with every option. A value PyTorch refuses
 * is refused with PyTorch's message ("Invalid learning rate: -1"). */
EM_API em_optimizer *em_sgd(em_module *m, double lr);
EM_API em_optimizer *em_sgd_ex(em_module *m, em_sgd_opts o);     /* SGD with every option */
EM_API em_optimizer *em_adam(em_module *m, double lr);           /* Adam with PyTorch's defaults */
EM_API em_optimizer *em_adam_ex(em_module *m, em_adam_opts o);   /* Adam with every option */
EM_API em_optimizer *em_adamw(em_module *m, double lr);          /* AdamW with PyTorch's defaults */
EM_API em_optimizer *em_adamw_ex(em_module *m, em_adam_opts o);  /* AdamW with every option */
EM_API em_optimizer *em_adadelta(em_module *m, double lr);                 /* Adadelta */
EM_API em_optimizer *em_adadelta_ex(em_module *m, em_adadelta_opts o);     /* Adadelta with every option */
EM_API em_optimizer *em_adagrad(em_module *m, double lr);                  /* Adagrad */
EM_API em_optimizer *em_adagrad_ex(em_module *m, em_adagrad_opts o);       /* Adagrad with every option */
EM_API em_optimizer *em_rmsprop(em_module *m, double lr);                  /* RMSprop */
EM_API em_optimizer *em_rmsprop_ex(em_module *m, em_rmsprop_opts o);       /* RMSprop with every option */
EM_API em_optimizer *em_adamax(em_module *m, double lr);                   /* Adamax */
EM_API em_optimizer *em_adamax_ex(em_module *m, em_adamax_opts o);         /* Adamax with every option */
EM_API em_optimizer *em_nadam(em_module *m, double lr);                    /* NAdam */
EM_API em_optimizer *em_nadam_ex(em_module *m, em_nadam_opts o);           /* NAdam with every option */
EM_API em_optimizer *em_radam(em_module *m, double lr);                    /* RAdam */
EM_API em_optimizer *em_radam_ex(em_module *m, em_radam_opts o);           /* RAdam with every option */
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
/* A graph (graph.h) that recorded em_step(opt) was replayed once more: the host's step counts
 * advance as that em_step's did (the replay advanced the device's; a checkpoint saved after
 * replays then holds the right counts). Call it after each replay that em_step did not run
 * for, i.e. not for the call that captured. EM_ERR_ARGUMENT if no capture of em_step(opt)
 * succeeded. On a GPU, Adam/AdamW's multi-tensor step reads its step count and learning rate
 * from device memory, so its replays take the next step's values (PyTorch's capturable=True);
 * set the learning rate with em_optim_set_lr between replays, not inside a capture. SGD's
 * learning rate is a kernel argument: a replay repeats the recorded one. */
EM_API em_status em_optim_step_replayed(em_optimizer *opt);
/* A state tensor of parameter p by PyTorch's name ("exp_avg", "exp_avg_sq",
 * "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta", "sum", "grad_avg",
 * "exp_inf"): a new reference, or NULL if there is none (yet). */
EM_API em_tensor *em_optim_state(em_optimizer *opt, em_tensor *p, const char *name);
/* A per-parameter number by PyTorch's name: "step" (every optimizer: p's updates so far)
 * or one the optimizer keeps ("mu_product" of NAdam). NaN, with an error, if there is none. */
EM_API double em_optim_scalar(const em_optimizer *opt, em_tensor *p, const char *name);
/* The optimizer's kind: "sgd", "adam", "adamw", "adadelta", "adagrad", "rmsprop",
 * "adamax", "nadam", "radam", or a user optimizer's em_optimizer_ops name. */
typedef struct em_optimizer_ops em_optimizer_ops; /* an optimizer's definition (below) */
/* The optimizer's kind, as above. */
EM_API const char *em_optim_name(const em_optimizer *opt);
/* The optimizer's table: to make another optimizer of the same kind and options with
 * em_optimizer_new(m2, em_optim_ops(opt), em_optim_hyper(opt), em_optim_lr(opt)) (ZeRO's
 * optimizer over its shards, include/ember/zero.h). NULL and an error for NULL. */
EM_API const em_optimizer_ops *em_optim_ops(const em_optimizer *opt);
/* Restoring state saved in another layout than em_checkpoint_save's (ZeRO's shards loaded on
 * another number of ranks): value (p's numel, any shape, dtype and device) is copied into
 * p's state `name`, which is made first if missing; a scalar by name, "step" included (a
 * whole number >= 0); the number of em_step calls. */
EM_API em_status em_optim_set_state(em_optimizer *opt, em_tensor *p, const char *name, em_tensor *value);
EM_API em_status em_optim_set_scalar(em_optimizer *opt, em_tensor *p, const char *name, double value); /* see above */
EM_API em_status em_optim_set_steps(em_optimizer *opt, int64_t steps); /* see above */

/* ---- writing an optimizer ----
 * An optimizer is a table of what it keeps per parameter and a function that updates one
 * parameter. Given one, em_optimizer_new makes an em_optimizer like em_adam's: em_zero_grad,
 * em_step, schedules, em_optim_state, em_checkpoint_save/load (its states under their
 * names, its scalars in the metadata) and em_module_to (its states move with the
 * parameters) work on it unchanged. Adadelta, written with public ops:
 *
 *   typedef struct { double rho, eps; } adadelta_hyper;
 *   static em_status adadelta_step(const em_optim_update *u) {
 *       const adadelta_hyper *h = u->hyper;
 *       em_tensor *sq = u->state[0], *acc = u->state[1], *g = u->grad;
 *       em_mul_scalar_(sq, h->rho);
 *       em_add_(sq, em_mul(g, g), 1 - h->rho);
 *       em_tensor *delta = em_mul(em_div(em_sqrt(em_add_scalar(acc, h->eps)),
 *                                        em_sqrt(em_add_scalar(sq, h->eps))), g);
 *       em_mul_scalar_(acc, h->rho);
 *       em_add_(acc, em_mul(delta, delta), 1 - h->rho);
 *       return em_add_(u->param, delta, -u->lr);
 *   }
 *   static const char *const names[] = {"square_avg", "acc_delta"};
 *   static const em_optimizer_ops adadelta_ops = {.name = "my_adadelta", .nstate = 2,
 *       .state_names = names, .hyper_size = sizeof(adadelta_hyper), .step = adadelta_step};
 *   em_optimizer *opt = em_optimizer_new(model, &adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0);
 *
 * (tests/test_optim_custom.c holds this optimizer checked against em_adadelta.) */

/* What the step function sees of one parameter's update. */
typedef struct em_optim_update {
    em_optimizer *optimizer;   /* the optimizer stepping (borrowed) */
    em_tensor *param;          /* the parameter: update it in place (em_add_, em_copy_...) */
    em_tensor *grad;           /* its gradient; NULL when init_state is called */
    em_tensor *const *state;   /* its state tensors in state_names' order (NULL where uses_state said no) */
    double *scalars;           /* its scalar states in scalar_names' order: read and write them */
    int64_t step;              /* its number of updates, this one included (PyTorch's state["step"]);
                                  0 when init_state is called */
    double lr;                 /* the learning rate of this step (schedules change it) */
    bool fresh;                /* its states were made for this update, its first with them (PyTorch's
                                  lazy state; SGD's momentum_buffer starts as the gradient) */
    void *hyper;               /* the optimizer's copy of the options given to em_optimizer_new */
} em_optim_update;

/* An optimizer's definition. The table must outlive every optimizer made from it. */
struct em_optimizer_ops {
    const char *name;                 /* its kind: checkpoints record it, and load only into this kind */
    int nstate;                       /* state tensors per parameter (0 to 8), each of the parameter's shape, */
    const char *const *state_names;   /* dtype and device, made as zeros before its first update */
    int nscalar;                      /* numbers kept per parameter (0 to 8), saved in checkpoints' */
    const char *const *scalar_names;  /* metadata; "step" is kept for every optimizer and is not one of them */
    const double *scalar_init;        /* their starting values (NULL: zeros) */
    size_t hyper_size;                /* bytes of the options struct em_optimizer_new copies (0: none) */
    /* Optional: refuse bad options with an error (em_error(EM_ERR_ARGUMENT, ...)), before
     * anything is made. */
    em_status (*check)(const void *hyper);
    /* Optional: whether state k is kept with these options (amsgrad's max_exp_avg_sq); NULL: all. */
    bool (*uses_state)(const void *hyper, int k);
    /* Optional: give a parameter's new zero states their starting values (Adagrad's
     * initial_accumulator_value). */
    em_status (*init_state)(const em_optim_update *u);
    /* One update of one parameter. It runs in no-grad mode, inside a scope that frees its
     * temporaries, and returns EM_OK or the failing call's status. */
    em_status (*step)(const em_optim_update *u);
    /* Optional: where the options keep the momentum OneCycleLR cycles (SGD's momentum,
     * Adam's beta1), or NULL: then OneCycleLR with cycle_momentum is refused. */
    double *(*momentum)(void *hyper);
};

/* An optimizer over every parameter of m (shared parameters counted once) from ops, with a
 * copy of the hyper_size bytes at hyper as its options and lr as its learning rate. The ops
 * table is checked (a name, a step, state and scalar names for their counts) and so are the
 * options (ops->check). */
EM_API em_optimizer *em_optimizer_new(em_module *m, const em_optimizer_ops *ops, const void *hyper, double lr);
/* The optimizer's options (the copy em_optimizer_new made; for the built-in optimizers the
 * em_*_opts struct they were made with): read or change them between steps, as PyTorch's
 * param_groups[0][key]. The learning rate is em_optim_lr's, not the struct's. */
EM_API void *em_optim_hyper(em_optimizer *opt);

/* torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm): scales all gradients by
 * min(1, max_norm / (norm + 1e-6)) and returns the total 2-norm before clipping
 * (NaN and an error on failure). */
EM_API double em_clip_grad_norm(em_module *m, double max_norm);

/* ---- learning-rate schedules (torch.optim.lr_scheduler) ----
 * A schedule (em_lr_schedule, made by em_lr_step, em_lr_cosine_annealing...) says how the
 * learning rate moves; a scheduler (em_lr_scheduler) runs one from a position, attached to an
 * optimizer (each step sets the optimizer's learning rate) or on its own. Every schedule but
 * ReduceLROnPlateau computes its rate from the base rate and the position in closed form
 * (PyTorch's _get_closed_form_lr), so a scheduler made at a position (last_epoch) or loaded
 * from a checkpoint gives the same rates as one stepped there; em_optim_set_lr lasts until
 * the scheduler's next step. */
typedef enum em_lr_kind {
    EM_LR_CONSTANT = 0,          /* the base rate */
    EM_LR_STEP,                  /* StepLR */
    EM_LR_COSINE,                /* Ember's linear warm-up then cosine annealing to min_lr (em_lr_cosine) */
    EM_LR_MULTISTEP,             /* MultiStepLR */
    EM_LR_EXPONENTIAL,           /* ExponentialLR */
    EM_LR_COSINE_ANNEALING,      /* CosineAnnealingLR */
    EM_LR_COSINE_WARM_RESTARTS,  /* CosineAnnealingWarmRestarts */
    EM_LR_ONE_CYCLE,             /* OneCycleLR */
    EM_LR_LINEAR,                /* LinearLR (linear warm-up) */
    EM_LR_PLATEAU                /* ReduceLROnPlateau */
} em_lr_kind;
#define EM_LR_MAX_MILESTONES 32  /* MultiStepLR's milestones an em_lr_schedule holds */
/* A learning-rate schedule; zeroed: constant. Made by the functions below, which set
 * PyTorch's defaults; the fields of each kind carry PyTorch's names. */
typedef struct em_lr_schedule {
    em_lr_kind kind;    /* which fields below apply */
    int64_t step_size;  /* EM_LR_STEP: decay every step_size steps */
    double gamma;       /* EM_LR_STEP, EM_LR_MULTISTEP, EM_LR_EXPONENTIAL: the decay factor */
    int64_t warmup;     /* EM_LR_COSINE */
    int64_t total;      /* EM_LR_COSINE */
    double min_lr;      /* EM_LR_COSINE, EM_LR_PLATEAU: the lowest rate */
    int nmilestones;    /* EM_LR_MULTISTEP: how many of milestones[] are used */
    int64_t milestones[EM_LR_MAX_MILESTONES]; /* EM_LR_MULTISTEP, each decays once (repeats count) */
    int64_t t_max;      /* EM_LR_COSINE_ANNEALING: T_max; EM_LR_COSINE_WARM_RESTARTS: T_0 */
    int64_t t_mult;     /* EM_LR_COSINE_WARM_RESTARTS: T_mult (each period that many times the last) */
    double eta_min;     /* EM_LR_COSINE_ANNEALING, EM_LR_COSINE_WARM_RESTARTS */
    double start_factor, end_factor; /* EM_LR_LINEAR: the base's multiple at 0 and at total_iters */
    int64_t total_iters;             /* EM_LR_LINEAR */
    double max_lr;                   /* EM_LR_ONE_CYCLE: the peak (the start is max_lr / div_factor) */
    int64_t total_steps;             /* EM_LR_ONE_CYCLE: the cycle's steps */
    double pct_start;                /* EM_LR_ONE_CYCLE: the rising part, default 0.3 */
    double div_factor;               /* EM_LR_ONE_CYCLE: default 25 */
    double final_div_factor;         /* EM_LR_ONE_CYCLE: the end is start / final_div_factor, default 1e4 */
    bool anneal_linear;              /* EM_LR_ONE_CYCLE: anneal_strategy 'linear' (default 'cos') */
    bool three_phase;                /* EM_LR_ONE_CYCLE */
    bool cycle_momentum;             /* EM_LR_ONE_CYCLE: cycle the optimizer's momentum too (default) */
    double base_momentum, max_momentum; /* EM_LR_ONE_CYCLE: defaults 0.85, 0.95 */
    bool mode_max;      /* EM_LR_PLATEAU: mode 'max' (a metric that should grow; default 'min') */
    double factor;      /* EM_LR_PLATEAU: lr *= factor on a plateau, default 0.1 */
    int64_t patience;   /* EM_LR_PLATEAU: bad steps tolerated, default 10 */
    double threshold;   /* EM_LR_PLATEAU: default 1e-4 */
    bool threshold_abs; /* EM_LR_PLATEAU: threshold_mode 'abs' (default 'rel') */
    int64_t cooldown;   /* EM_LR_PLATEAU: steps ignored after a reduction, default 0 */
    double eps;         /* EM_LR_PLATEAU: a smaller change is not made, default 1e-8 */
} em_lr_schedule;
/* StepLR(step_size, gamma): lr = base * gamma^(t / step_size) (integer division). */
EM_API em_lr_schedule em_lr_step(int64_t step_size, double gamma);
/* Linear warmup to base over `warmup` steps (lr = base * (t + 1) / warmup), then cosine
 * annealing to min_lr at t = total (CosineAnnealingLR when warmup = 0); min_lr after. */
EM_API em_lr_schedule em_lr_cosine(int64_t warmup, int64_t total, double min_lr);
/* MultiStepLR(milestones, gamma): lr = base * gamma^(milestones <= t); n <= EM_LR_MAX_MILESTONES. */
EM_API em_lr_schedule em_lr_multistep(const int64_t *milestones, int n, double gamma);
/* ExponentialLR(gamma): lr = base * gamma^t. */
EM_API em_lr_schedule em_lr_exponential(double gamma);
/* CosineAnnealingLR(T_max, eta_min): eta_min + (base - eta_min) (1 + cos(pi t / T_max)) / 2
 * (periodic past T_max, as PyTorch's). */
EM_API em_lr_schedule em_lr_cosine_annealing(int64_t t_max, double eta_min);
/* CosineAnnealingWarmRestarts(T_0, T_mult, eta_min): the cosine over periods T_0, T_0 T_mult, ... */
EM_API em_lr_schedule em_lr_cosine_warm_restarts(int64_t t_0, int64_t t_mult, double eta_min);
/* LinearLR(start_factor, end_factor, total_iters): base * (start + (end - start) min(t, total) / total). */
EM_API em_lr_schedule em_lr_linear(double start_factor, double end_factor, int64_t total_iters);
/* OneCycleLR(max_lr, total_steps) with PyTorch's other defaults (change the fields after). */
EM_API em_lr_schedule em_lr_one_cycle(double max_lr, int64_t total_steps);
/* ReduceLROnPlateau with PyTorch's defaults (change the fields after); stepped with a metric. */
EM_API em_lr_schedule em_lr_plateau(void);
/* The learning rate of schedule s at scheduler step t from base_lr (NaN for EM_LR_PLATEAU,
 * whose rate depends on the metrics seen, and for a schedule a scheduler would refuse). */
EM_API double em_lr_at(em_lr_schedule s, double base_lr, int64_t t);

typedef struct em_lr_scheduler em_lr_scheduler; /* a schedule at a position */
/* A scheduler driving opt's learning rate, as torch.optim.lr_scheduler's classes: its
 * position becomes last_epoch + 1 (-1, the default, starts at 0) and opt's learning rate
 * that of the position (OneCycleLR with cycle_momentum also sets the momentum). The base rate
 * is opt's initial_lr: the learning rate opt had when its first scheduler was made (or
 * restored by em_checkpoint_load). An optimizer has at most one scheduler: a second is
 * refused. em_checkpoint_save saves its state with the optimizer's; em_checkpoint_load
 * restores it. The scheduler is the caller's: free it with em_lr_scheduler_free (before or
 * after the optimizer). */
EM_API em_lr_scheduler *em_lr_scheduler_new(em_optimizer *opt, em_lr_schedule s, int64_t last_epoch);
/* A scheduler on its own, from base_lr (for a loop that applies the rate itself). */
EM_API em_lr_scheduler *em_lr_scheduler_standalone(em_lr_schedule s, double base_lr, int64_t last_epoch);
/* scheduler.step(): the next position and its learning rate. EM_LR_PLATEAU needs
 * em_lr_scheduler_step_metric; OneCycleLR past total_steps is an error (PyTorch's). */
EM_API em_status em_lr_scheduler_step(em_lr_scheduler *s);
/* ReduceLROnPlateau's scheduler.step(metric) (only for EM_LR_PLATEAU). */
EM_API em_status em_lr_scheduler_step_metric(em_lr_scheduler *s, double metric);
EM_API double em_lr_scheduler_get_last_lr(const em_lr_scheduler *s);     /* get_last_lr()[0]; NaN for NULL */
EM_API int64_t em_lr_scheduler_last_epoch(const em_lr_scheduler *s);     /* its position; -1 for NULL */
/* The momentum OneCycleLR's cycle_momentum set last (NaN for other schedules). */
EM_API double em_lr_scheduler_get_last_momentum(const em_lr_scheduler *s);
EM_API void em_lr_scheduler_free(em_lr_scheduler *s);   /* detaches it from its optimizer; NULL is ignored */

/* What a checkpoint keeps of a scheduler, as its state_dict: enough, with its schedule, to
 * continue exactly. */
typedef struct em_lr_scheduler_state {
    em_lr_kind kind;          /* the schedule's kind (loaded only into a scheduler of that kind) */
    int64_t last_epoch;       /* the position */
    double base_lr;           /* the rate the schedule scales (initial_lr) */
    double last_lr;           /* the rate at the position */
    double best;              /* EM_LR_PLATEAU: the best metric so far (+-inf before any) */
    int64_t num_bad_epochs;   /* EM_LR_PLATEAU */
    int64_t cooldown_counter; /* EM_LR_PLATEAU */
} em_lr_scheduler_state;
/* scheduler.state_dict(): s's state into *out (restore it with em_lr_scheduler_load_state_dict). */
EM_API em_status em_lr_scheduler_state_dict(const em_lr_scheduler *s, em_lr_scheduler_state *out);
/* Restores st (checked first: the kind, a position >= 0, finite rates, counters >= 0; a
 * refused state changes nothing); an attached scheduler sets its optimizer's rate (and
 * momentum) to the position's. */
EM_API em_status em_lr_scheduler_load_state_dict(em_lr_scheduler *s, const em_lr_scheduler_state *st);

/* The first scheduler interface, kept for one release: an optimizer-owned scheduler. */
/* Attach s to opt: the current lr becomes the base, t = 0, and the lr is set to em_lr_at(s, base, 0). */
EM_API EM_DEPRECATED("use em_lr_scheduler_new(opt, s, -1)") em_status em_optim_set_schedule(em_optimizer *opt, em_lr_schedule s);
/* scheduler.step() of opt's scheduler (em_optim_set_schedule's or em_lr_scheduler_new's). */
EM_API EM_DEPRECATED("use em_lr_scheduler_step") em_status em_optim_schedule_step(em_optimizer *opt);

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
