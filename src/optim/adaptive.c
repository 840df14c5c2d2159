/* Adadelta, Adagrad, RMSprop, Adamax, NAdam and RAdam: PyTorch's single-tensor formulas
 * (torch/optim/<name>.py, _single_tensor_<name>), with its defaults, its checks and its state
 * names, as em_optimizer_ops tables. Each update runs the backend's fused step (one op of the
 * op list per optimizer, src/core/ops_optim.c) where it applies, and otherwise the same
 * statements with public ops: the reference the fused kernels are checked against
 * (tests/test_optim_fused.c), one rounding per op, in the order the kernels round. */
#include <math.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "optim_internal.h"

/* PyTorch's refusal of a bad option: "Invalid rho value: 2". */
static bool bad(bool ok, const char *msg, double v) {
    if (!ok) em_error(EM_ERR_ARGUMENT, "%s: %g", msg, v);
    return !ok;
}

/* The gradient the formulas use: negated for maximize, plus weight_decay * p (L2). */
static em_tensor *decayed_grad(const em_optim_update *u, bool maximize, double weight_decay) {
    em_tensor *g = maximize ? em_neg(u->grad) : u->grad;
    return weight_decay != 0 ? em_add(g, em_mul_scalar(u->param, weight_decay)) : g;
}

/* x.lerp_(end, w) as PyTorch computes it: x + w (end - x) for |w| < 0.5, else
 * end - (end - x)(1 - w). The fused kernels take the branch from EMK_OPTF_LERP_BIG. */
static em_status lerp_(em_tensor *x, em_tensor *end, double w) {
    em_tensor *d = em_sub(end, x);
    if (fabs(w) < 0.5) return em_add_(x, d, w);
    return em_copy_(x, em_sub(end, em_mul_scalar(d, 1.0 - w)));
}
static double lerp_const(double w, int64_t *flags) {
    if (fabs(w) < 0.5) return w;
    *flags |= EMK_OPTF_LERP_BIG;
    return 1.0 - w;
}

/* x = x * beta + (g * g) * (1 - beta): PyTorch's mul_(beta).addcmul_(g, g, value=1 - beta). */
static em_status ema_sq_(em_tensor *x, em_tensor *g, double beta) {
    em_status st = em_mul_scalar_(x, beta);
    return st == EM_OK ? em_add_(x, em_mul(g, g), 1.0 - beta) : st;
}

/* The fused step when it applies (done), else nothing: the caller takes the ops. */
static em_status try_fused(const em_optim_update *u, em_fused_optim kind, int nstates, int64_t flags,
                           const double f[EM_FUSED_OPTIM_PARAMS], bool *done) {
    em_optimizer *o = u->optimizer;
    *done = false;
    if (!em__optim_fused_allowed(o) || !em__fused_optim_applies(kind, u->param, u->grad, u->state, nstates))
        return EM_OK;
    *done = true;
    em_status st = em__fused_optim_step(kind, u->param, u->grad, u->state, nstates, flags, f);
    if (st == EM_OK) em__optim_count_fused(o);
    return st;
}

static int64_t base_flags(bool maximize, double weight_decay) {
    return (maximize ? EMK_OPTF_MAXIMIZE : 0) | (weight_decay != 0 ? EMK_OPTF_WD : 0);
}

/* ---- Adadelta ---- */

em_adadelta_opts em_adadelta_defaults(double lr) { return (em_adadelta_opts){.lr = lr, .rho = 0.9, .eps = 1e-6}; }

enum { ADADELTA_SQUARE_AVG, ADADELTA_ACC_DELTA };
static const char *const adadelta_state_names[] = {"square_avg", "acc_delta"};

static em_status adadelta_check(const void *hyper) {
    const em_adadelta_opts *o = hyper;
    if (bad(o->rho >= 0 && o->rho <= 1, "Invalid rho value", o->rho) || bad(o->eps >= 0, "Invalid epsilon value", o->eps) ||
        bad(o->weight_decay >= 0, "Invalid weight_decay value", o->weight_decay))
        return EM_ERR_ARGUMENT;
    return EM_OK;
}

static em_status adadelta_step(const em_optim_update *u) {
    const em_adadelta_opts *o = u->hyper;
    double f[EM_FUSED_OPTIM_PARAMS] = {o->rho, 1.0 - o->rho, o->eps, o->weight_decay, -u->lr};
    bool done;
    em_status st = try_fused(u, EM_FUSED_ADADELTA, 2, base_flags(o->maximize, o->weight_decay), f, &done);
    if (done || st != EM_OK) return st;
    em_tensor *sq = u->state[ADADELTA_SQUARE_AVG], *acc = u->state[ADADELTA_ACC_DELTA];
    em_tensor *g = decayed_grad(u, o->maximize, o->weight_decay);
    if (!g || (st = ema_sq_(sq, g, o->rho)) != EM_OK) return em_last_status();
    em_tensor *std = em_sqrt(em_add_scalar(sq, o->eps));
    em_tensor *delta = em_mul(em_div(em_sqrt(em_add_scalar(acc, o->eps)), std), g);
    if (!delta || (st = ema_sq_(acc, delta, o->rho)) != EM_OK) return em_last_status();
    return em_add_(u->param, delta, -u->lr);
}

const em_optimizer_ops em__adadelta_ops = {
    .name = "adadelta", .nstate = 2, .state_names = adadelta_state_names, .hyper_size = sizeof(em_adadelta_opts),
    .check = adadelta_check, .step = adadelta_step,
};

em_optimizer *em_adadelta_ex(em_module *m, em_adadelta_opts o) { return em_optimizer_new(m, &em__adadelta_ops, &o, o.lr); }
em_optimizer *em_adadelta(em_module *m, double lr) { return em_adadelta_ex(m, em_adadelta_defaults(lr)); }

/* ---- Adagrad ---- */

em_adagrad_opts em_adagrad_defaults(double lr) { return (em_adagrad_opts){.lr = lr, .eps = 1e-10}; }

static const char *const adagrad_state_names[] = {"sum"};

static em_status adagrad_check(const void *hyper) {
    const em_adagrad_opts *o = hyper;
    if (bad(o->lr_decay >= 0, "Invalid lr_decay value", o->lr_decay) ||
        bad(o->weight_decay >= 0, "Invalid weight_decay value", o->weight_decay) ||
        bad(o->initial_accumulator_value >= 0, "Invalid initial_accumulator_value value", o->initial_accumulator_value) ||
        bad(o->eps >= 0, "Invalid epsilon value", o->eps))
        return EM_ERR_ARGUMENT;
    return EM_OK;
}

static em_status adagrad_init(const em_optim_update *u) {
    const em_adagrad_opts *o = u->hyper;
    return o->initial_accumulator_value != 0 ? em_fill_(u->state[0], o->initial_accumulator_value) : EM_OK;
}

static em_status adagrad_step(const em_optim_update *u) {
    const em_adagrad_opts *o = u->hyper;
    double clr = u->lr / (1 + (double)(u->step - 1) * o->lr_decay);
    double f[EM_FUSED_OPTIM_PARAMS] = {o->eps, o->weight_decay, -clr};
    bool done;
    em_status st = try_fused(u, EM_FUSED_ADAGRAD, 1, base_flags(o->maximize, o->weight_decay), f, &done);
    if (done || st != EM_OK) return st;
    em_tensor *sum = u->state[0], *g = decayed_grad(u, o->maximize, o->weight_decay);
    if (!g || (st = em_add_(sum, em_mul(g, g), 1.0)) != EM_OK) return em_last_status();
    em_tensor *std = em_add_scalar(em_sqrt(sum), o->eps);
    return em_add_(u->param, em_div(g, std), -clr);
}

const em_optimizer_ops em__adagrad_ops = {
    .name = "adagrad", .nstate = 1, .state_names = adagrad_state_names, .hyper_size = sizeof(em_adagrad_opts),
    .check = adagrad_check, .init_state = adagrad_init, .step = adagrad_step,
};

em_optimizer *em_adagrad_ex(em_module *m, em_adagrad_opts o) { return em_optimizer_new(m, &em__adagrad_ops, &o, o.lr); }
em_optimizer *em_adagrad(em_module *m, double lr) { return em_adagrad_ex(m, em_adagrad_defaults(lr)); }

/* ---- RMSprop ---- */

em_rmsprop_opts em_rmsprop_defaults(double lr) { return (em_rmsprop_opts){.lr = lr, .alpha = 0.99, .eps = 1e-8}; }

enum { RMSPROP_SQUARE_AVG, RMSPROP_MOMENTUM_BUFFER, RMSPROP_GRAD_AVG };
static const char *const rmsprop_state_names[] = {"square_avg", "momentum_buffer", "grad_avg"};

static em_status rmsprop_check(const void *hyper) {
    const em_rmsprop_opts *o = hyper;
    if (bad(o->eps >= 0, "Invalid epsilon value", o->eps) || bad(o->momentum >= 0, "Invalid momentum value", o->momentum) ||
        bad(o->weight_decay >= 0, "Invalid weight_decay value", o->weight_decay) ||
        bad(o->alpha >= 0, "Invalid alpha value", o->alpha))
        return EM_ERR_ARGUMENT;
    return EM_OK;
}

static bool rmsprop_uses_state(const void *hyper, int k) {
    const em_rmsprop_opts *o = hyper;
    return k == RMSPROP_SQUARE_AVG || (k == RMSPROP_MOMENTUM_BUFFER && o->momentum > 0) ||
           (k == RMSPROP_GRAD_AVG && o->centered);
}

static double *rmsprop_momentum(void *hyper) { return &((em_rmsprop_opts *)hyper)->momentum; }

static em_status rmsprop_step(const em_optim_update *u) {
    const em_rmsprop_opts *o = u->hyper;
    int64_t flags = base_flags(o->maximize, o->weight_decay) | (o->centered ? EMK_OPTF_CENTERED : 0) |
                    (o->momentum > 0 ? EMK_OPTF_MOMENTUM : 0);
    double lc = lerp_const(1.0 - o->alpha, &flags);
    double f[EM_FUSED_OPTIM_PARAMS] = {o->alpha, 1.0 - o->alpha, lc, o->eps, o->weight_decay, o->momentum, -u->lr};
    em_tensor *states[3] = {u->state[0], o->momentum > 0 ? u->state[1] : NULL, o->centered ? u->state[2] : NULL};
    em_optim_update fu = *u;
    fu.state = states;
    bool done;
    em_status st = try_fused(&fu, EM_FUSED_RMSPROP, 3, flags, f, &done);
    if (done || st != EM_OK) return st;
    em_tensor *sq = u->state[RMSPROP_SQUARE_AVG], *g = decayed_grad(u, o->maximize, o->weight_decay);
    if (!g || (st = ema_sq_(sq, g, o->alpha)) != EM_OK) return em_last_status();
    em_tensor *avg;
    if (o->centered) {
        em_tensor *ga = u->state[RMSPROP_GRAD_AVG];
        if ((st = lerp_(ga, g, 1.0 - o->alpha)) != EM_OK) return st;
        avg = em_sqrt(em_sub(sq, em_mul(ga, ga)));
    } else {
        avg = em_sqrt(sq);
    }
    avg = em_add_scalar(avg, o->eps);
    em_tensor *upd = em_div(g, avg);
    if (!upd) return em_last_status();
    if (o->momentum > 0) {
        em_tensor *buf = u->state[RMSPROP_MOMENTUM_BUFFER];
        if ((st = em_mul_scalar_(buf, o->momentum)) != EM_OK || (st = em_add_(buf, upd, 1.0)) != EM_OK) return st;
        upd = buf;
    }
    return em_add_(u->param, upd, -u->lr);
}

const em_optimizer_ops em__rmsprop_ops = {
    .name = "rmsprop", .nstate = 3, .state_names = rmsprop_state_names, .hyper_size = sizeof(em_rmsprop_opts),
    .check = rmsprop_check, .uses_state = rmsprop_uses_state, .step = rmsprop_step, .momentum = rmsprop_momentum,
};

em_optimizer *em_rmsprop_ex(em_module *m, em_rmsprop_opts o) { return em_optimizer_new(m, &em__rmsprop_ops, &o, o.lr); }
em_optimizer *em_rmsprop(em_module *m, double lr) { return em_rmsprop_ex(m, em_rmsprop_defaults(lr)); }

/* ---- the Adam family: Adamax, NAdam, RAdam (betas, so OneCycleLR cycles beta1) ---- */

static em_status betas_check(double eps, double beta1, double beta2, double weight_decay) {
    if (bad(eps >= 0, "Invalid epsilon value", eps) ||
        bad(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0", beta1) ||
        bad(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1", beta2) ||
        bad(weight_decay >= 0, "Invalid weight_decay value", weight_decay))
        return EM_ERR_ARGUMENT;
    return EM_OK;
}

static const char *const exp_avg_names[] = {"exp_avg", "exp_avg_sq"};

/* ---- Adamax ---- */

em_adamax_opts em_adamax_defaults(double lr) {
    return (em_adamax_opts){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

enum { ADAMAX_EXP_AVG, ADAMAX_EXP_INF };
static const char *const adamax_state_names[] = {"exp_avg", "exp_inf"};

static em_status adamax_check(const void *hyper) {
    const em_adamax_opts *o = hyper;
    return betas_check(o->eps, o->beta1, o->beta2, o->weight_decay);
}

static double *adamax_momentum(void *hyper) { return &((em_adamax_opts *)hyper)->beta1; }

static em_status adamax_step(const em_optim_update *u) {
    const em_adamax_opts *o = u->hyper;
    double clr = u->lr / (1 - pow(o->beta1, (double)u->step));
    int64_t flags = base_flags(o->maximize, o->weight_decay);
    double lc = lerp_const(1.0 - o->beta1, &flags);
    double f[EM_FUSED_OPTIM_PARAMS] = {lc, o->beta2, o->eps, o->weight_decay, -clr};
    bool done;
    em_status st = try_fused(u, EM_FUSED_ADAMAX, 2, flags, f, &done);
    if (done || st != EM_OK) return st;
    em_tensor *m = u->state[ADAMAX_EXP_AVG], *inf = u->state[ADAMAX_EXP_INF];
    em_tensor *g = decayed_grad(u, o->maximize, o->weight_decay);
    if (!g || (st = lerp_(m, g, 1.0 - o->beta1)) != EM_OK) return em_last_status();
    if ((st = em_mul_scalar_(inf, o->beta2)) != EM_OK ||
        (st = em_copy_(inf, em_maximum(inf, em_add_scalar(em_abs(g), o->eps)))) != EM_OK)
        return st;
    return em_add_(u->param, em_div(m, inf), -clr);
}

const em_optimizer_ops em__adamax_ops = {
    .name = "adamax", .nstate = 2, .state_names = adamax_state_names, .hyper_size = sizeof(em_adamax_opts),
    .check = adamax_check, .step = adamax_step, .momentum = adamax_momentum,
};

em_optimizer *em_adamax_ex(em_module *m, em_adamax_opts o) { return em_optimizer_new(m, &em__adamax_ops, &o, o.lr); }
em_optimizer *em_adamax(em_module *m, double lr) { return em_adamax_ex(m, em_adamax_defaults(lr)); }

/* ---- NAdam ---- */

em_nadam_opts em_nadam_defaults(double lr) {
    return (em_nadam_opts){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .momentum_decay = 4e-3};
}

static const char *const nadam_scalar_names[] = {"mu_product"};
static const double nadam_scalar_init[] = {1.0};

static em_status nadam_check(const void *hyper) {
    const em_nadam_opts *o = hyper;
    if (betas_check(o->eps, o->beta1, o->beta2, o->weight_decay) != EM_OK) return EM_ERR_ARGUMENT;
    if (bad(o->momentum_decay >= 0, "Invalid momentum_decay value", o->momentum_decay)) return EM_ERR_ARGUMENT;
    return EM_OK;
}

static double *nadam_momentum(void *hyper) { return &((em_nadam_opts *)hyper)->beta1; }

/* The decoupled decay's factor, or L2's weight_decay, in the one slot the kernels read. */
static double decay_const(double lr, double weight_decay, bool decoupled, int64_t *flags) {
    if (weight_decay == 0) return 0;
    if (!decoupled) return weight_decay;
    *flags |= EMK_OPTF_DECOUPLED;
    return 1.0 - lr * weight_decay;
}

static em_status decay_(const em_optim_update *u, bool decoupled, double weight_decay, em_tensor **g) {
    if (weight_decay == 0) return EM_OK;
    if (decoupled) return em_mul_scalar_(u->param, 1.0 - u->lr * weight_decay);
    *g = em_add(*g, em_mul_scalar(u->param, weight_decay));
    return *g ? EM_OK : em_last_status();
}

static em_status nadam_step(const em_optim_update *u) {
    const em_nadam_opts *o = u->hyper;
    double step = (double)u->step, bc2 = 1 - pow(o->beta2, step);
    double mu = o->beta1 * (1.0 - 0.5 * pow(0.96, step * o->momentum_decay));
    double mu_next = o->beta1 * (1.0 - 0.5 * pow(0.96, (step + 1) * o->momentum_decay));
    double mu_product = u->scalars[0] * mu, mu_product_next = mu_product * mu_next;
    double c_grad = -u->lr * (1.0 - mu) / (1.0 - mu_product);
    double c_avg = (-u->lr * mu_next) / (1.0 - mu_product_next);
    int64_t flags = o->maximize ? EMK_OPTF_MAXIMIZE : 0;
    double wdx = decay_const(u->lr, o->weight_decay, o->decoupled_weight_decay, &flags);
    if (o->weight_decay != 0) flags |= EMK_OPTF_WD;
    double lc = lerp_const(1.0 - o->beta1, &flags);
    double f[EM_FUSED_OPTIM_PARAMS] = {lc, o->beta2, 1.0 - o->beta2, bc2, o->eps, wdx, c_grad, c_avg};
    bool done;
    em_status st = try_fused(u, EM_FUSED_NADAM, 2, flags, f, &done);
    if (!done && st == EM_OK) {
        em_tensor *m = u->state[0], *v = u->state[1], *g = o->maximize ? em_neg(u->grad) : u->grad;
        if (!g || (st = decay_(u, o->decoupled_weight_decay, o->weight_decay, &g)) != EM_OK) return em_last_status();
        if ((st = lerp_(m, g, 1.0 - o->beta1)) != EM_OK || (st = ema_sq_(v, g, o->beta2)) != EM_OK) return st;
        em_tensor *denom = em_add_scalar(em_sqrt(em_div_scalar(v, bc2)), o->eps);
        if ((st = em_add_(u->param, em_div(g, denom), c_grad)) != EM_OK) return st;
        st = em_add_(u->param, em_div(m, denom), c_avg);
    }
    if (st == EM_OK) u->scalars[0] = mu_product;
    return st;
}

const em_optimizer_ops em__nadam_ops = {
    .name = "nadam", .nstate = 2, .state_names = exp_avg_names, .nscalar = 1, .scalar_names = nadam_scalar_names,
    .scalar_init = nadam_scalar_init, .hyper_size = sizeof(em_nadam_opts), .check = nadam_check, .step = nadam_step,
    .momentum = nadam_momentum,
};

em_optimizer *em_nadam_ex(em_module *m, em_nadam_opts o) { return em_optimizer_new(m, &em__nadam_ops, &o, o.lr); }
em_optimizer *em_nadam(em_module *m, double lr) { return em_nadam_ex(m, em_nadam_defaults(lr)); }

/* ---- RAdam ---- */

em_radam_opts em_radam_defaults(double lr) {
    return (em_radam_opts){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

static em_status radam_check(const void *hyper) {
    const em_radam_opts *o = hyper;
    return betas_check(o->eps, o->beta1, o->beta2, o->weight_decay);
}

static double *radam_momentum(void *hyper) { return &((em_radam_opts *)hyper)->beta1; }

static em_status radam_step(const em_optim_update *u) {
    const em_radam_opts *o = u->hyper;
    double step = (double)u->step, bc1 = 1 - pow(o->beta1, step), bc2 = 1 - pow(o->beta2, step);
    double rho_inf = 2 / (1 - o->beta2) - 1;
    double rho_t = rho_inf - 2 * step * pow(o->beta2, step) / bc2;
    bool rectified = rho_t > 5.0;
    /* the update's scalar factor: PyTorch's lr / bc1 * sqrt(bc2) * rect, or lr / bc1 */
    double scale = -(u->lr / bc1);
    if (rectified) {
        double rect = sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t));
        scale = -(u->lr / bc1 * sqrt(bc2) * rect);
    }
    int64_t flags = (o->maximize ? EMK_OPTF_MAXIMIZE : 0) | (rectified ? EMK_OPTF_RECTIFIED : 0);
    double wdx = decay_const(u->lr, o->weight_decay, o->decoupled_weight_decay, &flags);
    if (o->weight_decay != 0) flags |= EMK_OPTF_WD;
    double lc = lerp_const(1.0 - o->beta1, &flags);
    double f[EM_FUSED_OPTIM_PARAMS] = {lc, o->beta2, 1.0 - o->beta2, o->eps, wdx, scale};
    bool done;
    em_status st = try_fused(u, EM_FUSED_RADAM, 2, flags, f, &done);
    if (done || st != EM_OK) return st;
    em_tensor *m = u->state[0], *v = u->state[1], *g = o->maximize ? em_neg(u->grad) : u->grad;
    if (!g || (st = decay_(u, o->decoupled_weight_decay, o->weight_decay, &g)) != EM_OK) return em_last_status();
    if ((st = lerp_(m, g, 1.0 - o->beta1)) != EM_OK || (st = ema_sq_(v, g, o->beta2)) != EM_OK) return st;
    em_tensor *upd = rectified ? em_div(m, em_add_scalar(em_sqrt(v), o->eps)) : m;
    return em_add_(u->param, upd, scale);
}

const em_optimizer_ops em__radam_ops = {
    .name = "radam", .nstate = 2, .state_names = exp_avg_names, .hyper_size = sizeof(em_radam_opts),
    .check = radam_check, .step = radam_step, .momentum = radam_momentum,
};

em_optimizer *em_radam_ex(em_module *m, em_radam_opts o) { return em_optimizer_new(m, &em__radam_ops, &o, o.lr); }
em_optimizer *em_radam(em_module *m, double lr) { return em_radam_ex(m, em_radam_defaults(lr)); }
