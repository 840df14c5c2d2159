/* SGD, Adam and AdamW with PyTorch 1.13's single-tensor update formulas. Each step runs
 * the backend's fused kernel (one pass per parameter) when the parameter, its gradient and
 * its state are contiguous on one device; otherwise, and as the reference the fused
 * kernels are tested against, the same formulas written with the public in-place ops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include <ember/parallel.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"
#include "optim_internal.h"

typedef enum opt_kind { OPT_SGD, OPT_ADAM, OPT_ADAMW } opt_kind;

/* Where each per-parameter state lives in opt_param.state: one slot per state name, so
 * that no two optimizers' states share a slot (checkpoints map names to slots below). */
enum { ST_EXP_AVG, ST_EXP_AVG_SQ, ST_MAX_EXP_AVG_SQ, ST_MOMENTUM, ST_COUNT };

typedef struct opt_param {
    em_tensor *p;                /* retained */
    em_tensor *state[ST_COUNT];  /* retained, created at the first step */
    int64_t step;                /* this parameter's number of updates (Adam's bias correction) */
} opt_param;

struct em_optimizer {
    opt_kind kind;
    em_sgd_opts sgd;
    em_adam_opts adam;
    double lr;
    opt_param *ps;
    int n;
    em_module *module;           /* weak: cleared when the module is freed */
    int64_t steps;
    bool has_schedule;
    em_lr_schedule schedule;
    double base_lr;
    int64_t schedule_t;
    bool unfused;                /* always take the op-by-op path (tests, benchmarks) */
    int64_t fused_updates;       /* parameter updates done by a fused kernel */
    em_tensor *amp;              /* borrowed during a scaler's step (grad_scaler.c), else NULL */
};

em_sgd_opts em_sgd_defaults(double lr) { return (em_sgd_opts){.lr = lr}; }

em_adam_opts em_adam_defaults(double lr) {
    return (em_adam_opts){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

em_adam_opts em_adamw_defaults(double lr) {
    em_adam_opts o = em_adam_defaults(lr);
    o.weight_decay = 0.01;
    return o;
}

static bool check(bool ok, const char *msg, double v) {
    if (!ok) em_error(EM_ERR_ARGUMENT, "%s: %g", msg, v);
    return ok;
}

/* Move every state tensor of opt to its parameter's device and dtype: the module's tensors
 * were moved (em_module_to), or are about to be stepped. */
static em_status sync_state(em_optimizer *opt) {
    for (int i = 0; i < opt->n; i++) {
        em_tensor *p = opt->ps[i].p;
        for (int k = 0; k < ST_COUNT; k++) {
            em_tensor *s = opt->ps[i].state[k];
            if (!s || (em_device_equal(em_device_of(s), em_device_of(p)) && em_dtype_of(s) == em_dtype_of(p)))
                continue;
            em_status st = em__tensor_move_(s, em_device_of(p), em_dtype_of(p));
            if (st != EM_OK) return st;
        }
    }
    return EM_OK;
}

/* The optimizer listens to its module (nn_internal.h): moves move its state, and the
 * module's free leaves it without one. */
static em_status module_moved(void *opt) { return sync_state(opt); }
static void module_freed(void *opt) { ((em_optimizer *)opt)->module = NULL; }
static const em_module_listener module_listener = {module_moved, module_freed};

static em_optimizer *optim_new(em_module *m, opt_kind kind) {
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "optimizer: module is NULL");
        return NULL;
    }
    int count = em_module_parameters(m, NULL, 0);
    em_named_tensor *list = calloc((size_t)count + 1, sizeof *list);
    em_optimizer *o = calloc(1, sizeof *o);
    opt_param *ps = calloc((size_t)count + 1, sizeof *ps);
    if (!list || !o || !ps) {
        free(list), free(o), free(ps);
        em_error(EM_ERR_OUT_OF_MEMORY, "optimizer: out of host memory");
        return NULL;
    }
    em_module_parameters(m, list, count);
    for (int i = 0; i < count; i++) {
        bool dup = false; /* a parameter shared by two layers is updated once */
        for (int j = 0; j < o->n && !dup; j++) dup = ps[j].p == list[i].tensor;
        if (!dup) ps[o->n++].p = em_retain(list[i].tensor);
    }
    free(list);
    o->ps = ps;
    o->kind = kind;
    o->module = m;
    if (em__module_listen(m, &module_listener, o) != EM_OK) {
        o->module = NULL;
        em_optim_free(o);
        return NULL;
    }
    return o;
}

em_optimizer *em_sgd_ex(em_module *m, em_sgd_opts s) {
    if (!check(s.lr >= 0, "Invalid learning rate", s.lr) ||
        !check(s.momentum >= 0, "Invalid momentum value", s.momentum) ||
        !check(s.weight_decay >= 0, "Invalid weight_decay value", s.weight_decay))
        return NULL;
    if (s.nesterov && (s.momentum <= 0 || s.dampening != 0)) {
        em_error(EM_ERR_ARGUMENT, "Nesterov momentum requires a momentum and zero dampening");
        return NULL;
    }
    em_optimizer *o = optim_new(m, OPT_SGD);
    if (o) {
        o->sgd = s;
        o->lr = s.lr;
    }
    return o;
}

em_optimizer *em_sgd(em_module *m, double lr) { return em_sgd_ex(m, em_sgd_defaults(lr)); }

static em_optimizer *adam_new(em_module *m, em_adam_opts a, opt_kind kind) {
    if (!check(a.lr >= 0, "Invalid learning rate", a.lr) ||
        !check(a.eps >= 0, "Invalid epsilon value", a.eps) ||
        !check(a.beta1 >= 0 && a.beta1 < 1, "Invalid beta parameter at index 0", a.beta1) ||
        !check(a.beta2 >= 0 && a.beta2 < 1, "Invalid beta parameter at index 1", a.beta2) ||
        !check(a.weight_decay >= 0, "Invalid weight_decay value", a.weight_decay))
        return NULL;
    em_optimizer *o = optim_new(m, kind);
    if (o) {
        o->adam = a;
        o->lr = a.lr;
    }
    return o;
}

em_optimizer *em_adam_ex(em_module *m, em_adam_opts a) { return adam_new(m, a, OPT_ADAM); }
em_optimizer *em_adam(em_module *m, double lr) { return adam_new(m, em_adam_defaults(lr), OPT_ADAM); }
em_optimizer *em_adamw_ex(em_module *m, em_adam_opts a) { return adam_new(m, a, OPT_ADAMW); }
em_optimizer *em_adamw(em_module *m, double lr) { return adam_new(m, em_adamw_defaults(lr), OPT_ADAMW); }

void em_optim_free(em_optimizer *opt) {
    if (!opt) return;
    if (opt->module) em__module_unlisten(opt->module, &module_listener, opt);
    for (int i = 0; i < opt->n; i++) {
        em_release(opt->ps[i].p);
        for (int k = 0; k < ST_COUNT; k++) em_release(opt->ps[i].state[k]);
    }
    free(opt->ps);
    free(opt);
}

#define OPT_CHECK(opt, fn)                                                                  \
    do {                                                                                    \
        if (!(opt)) return em_failed() ? em_last_status()                                   \
                                       : em_error(EM_ERR_ARGUMENT, "%s: optimizer is NULL", fn); \
    } while (0)

em_status em_zero_grad(em_optimizer *opt) {
    OPT_CHECK(opt, "em_zero_grad");
    for (int i = 0; i < opt->n; i++) em_set_grad(opt->ps[i].p, NULL);
    return EM_OK;
}

/* A zero state tensor like p, kept by the optimizer. */
static em_tensor *new_state(em_tensor *p) {
    em_tensor *z = em_zeros_like(p);
    return z ? em_retain(z) : NULL;
}

void em__optim_set_fused(em_optimizer *opt, bool fused) {
    if (opt) opt->unfused = !fused;
}

int64_t em__optim_fused_updates(const em_optimizer *opt) { return opt ? opt->fused_updates : 0; }

void em__optim_set_amp(em_optimizer *opt, em_tensor *state) {
    if (opt) opt->amp = state;
}

/* A scaler's step where a kernel cannot read its flag (op-by-op path, another device): read
 * it here (this waits for the device). */
static em_status amp_host_check(const em_optimizer *o, bool *skip, double *skipped) {
    float st[4] = {0};
    em_status r = em_copy_to_host(o->amp, st, sizeof st);
    *skip = st[2] != 0.0f;
    *skipped = st[3];
    return r;
}

static em_status sgd_fused(em_optimizer *o, opt_param *q, em_tensor *g, bool *done) {
    const em_sgd_opts *s = &o->sgd;
    bool mom = s->momentum != 0, first = mom && !q->state[ST_MOMENTUM];
    /* a new momentum buffer's layout is p's, so check before allocating it */
    if (o->unfused || !em__fused_sgd_applies(q->p, g, mom ? q->state[ST_MOMENTUM] : NULL)) return EM_OK;
    if (o->amp && !em__amp_state_fits(o->amp, q->p)) return EM_OK;
    if (first) {
        /* zeros under a scaler: a first step skipped on the device leaves a defined buffer */
        em_tensor *b = o->amp ? em_zeros_like(q->p) : em_empty_like(q->p);
        if (!b) return em_last_status();
        q->state[ST_MOMENTUM] = em_retain(b);
    }
    em_optim_args a = {.lr = o->lr, .weight_decay = s->weight_decay, .momentum = s->momentum,
                       .dampening = s->dampening, .nesterov = s->nesterov, .first_step = first,
                       .amp = o->amp};
    *done = true;
    em_status st = em__fused_sgd_step(&a, q->p, g, mom ? q->state[ST_MOMENTUM] : NULL);
    if (st != EM_OK && first) { /* leave no half-made buffer behind */
        em_release(q->state[ST_MOMENTUM]);
        q->state[ST_MOMENTUM] = NULL;
    }
    if (st == EM_OK) o->fused_updates++;
    return st;
}

static em_status adam_fused(em_optimizer *o, opt_param *q, em_tensor *g, bool *done) {
    const em_adam_opts *a = &o->adam;
    em_tensor *m = q->state[ST_EXP_AVG], *v = q->state[ST_EXP_AVG_SQ];
    em_tensor *vmax = a->amsgrad ? q->state[ST_MAX_EXP_AVG_SQ] : NULL;
    if (o->unfused || !em__fused_adam_applies(q->p, g, m, v, vmax)) return EM_OK;
    if (o->amp && !em__amp_state_fits(o->amp, q->p)) return EM_OK;
    q->step++;
    em_optim_args args = {.lr = o->lr, .weight_decay = a->weight_decay, .beta1 = a->beta1,
                          .beta2 = a->beta2, .eps = a->eps,
                          .bias_correction1 = 1.0 - pow(a->beta1, (double)q->step),
                          .bias_correction2 = 1.0 - pow(a->beta2, (double)q->step),
                          .decoupled = o->kind == OPT_ADAMW, .amsgrad = a->amsgrad,
                          .amp = o->amp, .step = q->step};
    *done = true;
    em_status st = em__fused_adam_step(&args, q->p, g, m, v, vmax);
    if (st != EM_OK) {
        q->step--;
        return st;
    }
    o->fused_updates++;
    return EM_OK;
}

static em_status sgd_update(em_optimizer *o, opt_param *q, em_tensor *g) {
    bool done = false;
    em_status fst = sgd_fused(o, q, g, &done);
    if (done || fst != EM_OK) return fst;
    if (o->amp) {
        bool skip;
        double skipped;
        em_status st = amp_host_check(o, &skip, &skipped);
        if (st != EM_OK || skip) return st;
    }
    const em_sgd_opts *s = &o->sgd;
    em_tensor *d = g;
    if (s->weight_decay != 0) d = em_add(d, em_mul_scalar(q->p, s->weight_decay));
    if (s->momentum != 0) {
        em_tensor *buf = q->state[ST_MOMENTUM];
        if (!buf) {
            em_tensor *c = em_clone(d);
            if (!c) return em_last_status();
            buf = q->state[ST_MOMENTUM] = em_retain(c);
        } else {
            em_status st = em_mul_scalar_(buf, s->momentum);
            if (st == EM_OK) st = em_add_(buf, d, 1.0 - s->dampening);
            if (st != EM_OK) return st;
        }
        d = s->nesterov ? em_add(d, em_mul_scalar(buf, s->momentum)) : buf;
    }
    if (!d) return em_last_status();
    return em_add_(q->p, d, -o->lr);
}

static em_status adam_update(em_optimizer *o, opt_param *q, em_tensor *g) {
    const em_adam_opts *a = &o->adam;
    static const int slots[] = {ST_EXP_AVG, ST_EXP_AVG_SQ, ST_MAX_EXP_AVG_SQ};
    for (int k = 0; k < (a->amsgrad ? 3 : 2); k++)
        if (!q->state[slots[k]] && !(q->state[slots[k]] = new_state(q->p))) return em_last_status();
    bool done = false;
    em_status fst = adam_fused(o, q, g, &done);
    if (done || fst != EM_OK) return fst;
    em_tensor *m = q->state[ST_EXP_AVG], *v = q->state[ST_EXP_AVG_SQ];
    q->step++;
    double skipped = 0; /* a scaler's skipped steps: as the fused kernels, count the steps taken */
    em_status st = EM_OK;
    if (o->amp) {
        bool skip;
        if ((st = amp_host_check(o, &skip, &skipped)) != EM_OK || skip) return st;
    }
    if (a->weight_decay != 0) {
        if (o->kind == OPT_ADAMW)
            st = em_mul_scalar_(q->p, 1.0 - o->lr * a->weight_decay);
        else
            g = em_add(g, em_mul_scalar(q->p, a->weight_decay));
    }
    if (st == EM_OK) st = em_mul_scalar_(m, a->beta1);
    if (st == EM_OK) st = em_add_(m, g, 1.0 - a->beta1);
    if (st == EM_OK) st = em_mul_scalar_(v, a->beta2);
    if (st == EM_OK) st = em_add_(v, em_mul(g, g), 1.0 - a->beta2);
    if (st != EM_OK) return st;
    double bc1 = 1.0 - pow(a->beta1, (double)q->step - skipped);
    double bc2 = 1.0 - pow(a->beta2, (double)q->step - skipped);
    em_tensor *second = v;
    if (a->amsgrad) {
        em_tensor *mx = q->state[ST_MAX_EXP_AVG_SQ];
        if ((st = em_copy_(mx, em_maximum(mx, v))) != EM_OK) return st;
        second = mx;
    }
    em_tensor *denom = em_add_scalar(em_div_scalar(em_sqrt(second), sqrt(bc2)), a->eps);
    em_tensor *upd = em_div(m, denom);
    if (!upd) return em_last_status();
    return em_add_(q->p, upd, -(o->lr / bc1));
}

/* Adam's moments of every parameter that has a gradient, made before any parameter
 * changes: running out of memory here leaves the optimizer as it was, not half-stepped
 * (the fault sweep, tests/test_fault_sweep.c). The fused update allocates nothing more. */
static em_status adam_prepare(em_optimizer *opt) {
    int nst = opt->adam.amsgrad ? 3 : 2;
    bool *made = NULL;   /* [i * ST_COUNT + k]: state k of parameter i made here */
    for (int i = 0; i < opt->n; i++) {
        opt_param *q = &opt->ps[i];
        for (int k = 0; k < nst && em__grad_borrowed(q->p); k++) {
            if (q->state[k]) continue;   /* a checkpoint may have brought some of them */
            if (!made && !(made = calloc((size_t)opt->n * ST_COUNT, sizeof *made)))
                return em_error(EM_ERR_OUT_OF_MEMORY, "em_step: out of host memory");
            if ((q->state[k] = new_state(q->p))) {
                made[i * ST_COUNT + k] = true;
                continue;
            }
            for (int j = 0; j < opt->n * ST_COUNT; j++) {   /* undo: drop every state made here */
                if (!made[j]) continue;
                em_release(opt->ps[j / ST_COUNT].state[j % ST_COUNT]);
                opt->ps[j / ST_COUNT].state[j % ST_COUNT] = NULL;
            }
            free(made);
            return em_last_status();
        }
    }
    free(made);
    return EM_OK;
}

em_status em_step(em_optimizer *opt) {
    OPT_CHECK(opt, "em_step");
    em_status st = sync_state(opt); /* parameters may have moved behind our back */
    if (st != EM_OK) return st;
    em_grad_mode mode = em_no_grad_begin();
    if (opt->kind != OPT_SGD) {
        em_scope s = em_scope_begin();
        st = adam_prepare(opt);
        em_scope_end(s);
    }
    for (int i = 0; i < opt->n && st == EM_OK; i++) {
        opt_param *q = &opt->ps[i];
        em_scope s = em_scope_begin();
        em_tensor *g = em__grad_borrowed(q->p);   /* not em_grad: registering it with the scope may fail */
        if (g) st = opt->kind == OPT_SGD ? sgd_update(opt, q, g) : adam_update(opt, q, g);
        em_scope_end(s);
    }
    em_no_grad_end(mode);
    if (st == EM_OK) opt->steps++;
    return st;
}

/* DataParallel's step (include/ember/parallel.h) is the optimizer's step, then nn's
 * em_dp_sync: it lives here, since optim builds on nn and nn calls nothing of optim's. */
em_status em_dp_step(em_dp *dp, em_optimizer *opt) {
    if (!dp || !opt)
        return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_dp_step: %s is NULL",
                                                         dp ? "the optimizer" : "the em_dp");
    em_status st = em_step(opt);
    return st != EM_OK ? st : em_dp_sync(dp);
}

double em_optim_lr(const em_optimizer *opt) { return opt ? opt->lr : NAN; }

em_status em_optim_set_lr(em_optimizer *opt, double lr) {
    OPT_CHECK(opt, "em_optim_set_lr");
    if (!(lr >= 0)) return em_error(EM_ERR_ARGUMENT, "Invalid learning rate: %g", lr);
    opt->lr = lr;
    return EM_OK;
}

int64_t em_optim_steps(const em_optimizer *opt) { return opt ? opt->steps : 0; }

em_tensor *em_optim_state(em_optimizer *opt, em_tensor *p, const char *name) {
    if (!opt || !p || !name) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_optim_state: NULL argument");
        return NULL;
    }
    int k = -1;
    if (opt->kind == OPT_SGD && !strcmp(name, "momentum_buffer")) k = ST_MOMENTUM;
    if (opt->kind != OPT_SGD && !strcmp(name, "exp_avg")) k = ST_EXP_AVG;
    if (opt->kind != OPT_SGD && !strcmp(name, "exp_avg_sq")) k = ST_EXP_AVG_SQ;
    if (opt->kind != OPT_SGD && !strcmp(name, "max_exp_avg_sq")) k = ST_MAX_EXP_AVG_SQ;
    if (k < 0) {
        em_error(EM_ERR_ARGUMENT, "em_optim_state: this optimizer has no state \"%s\"", name);
        return NULL;
    }
    for (int i = 0; i < opt->n; i++)
        if (opt->ps[i].p == p)
            return opt->ps[i].state[k] ? em__scope_return(em_scope_begin(), opt->ps[i].state[k]) : NULL;
    em_error(EM_ERR_ARGUMENT, "em_optim_state: the tensor is not a parameter of this optimizer");
    return NULL;
}

/* ---- learning-rate schedules ---- */

em_lr_schedule em_lr_step(int64_t step_size, double gamma) {
    return (em_lr_schedule){.kind = EM_LR_STEP, .step_size = step_size, .gamma = gamma};
}

em_lr_schedule em_lr_cosine(int64_t warmup, int64_t total, double min_lr) {
    return (em_lr_schedule){.kind = EM_LR_COSINE, .warmup = warmup, .total = total, .min_lr = min_lr};
}

double em_lr_at(em_lr_schedule s, double base, int64_t t) {
    switch (s.kind) {
    case EM_LR_STEP:
        return s.step_size > 0 ? base * pow(s.gamma, (double)(t / s.step_size)) : base;
    case EM_LR_COSINE: {
        if (t < s.warmup) return base * (double)(t + 1) / (double)s.warmup;
        if (t >= s.total || s.total <= s.warmup) return s.min_lr;
        double progress = (double)(t - s.warmup) / (double)(s.total - s.warmup);
        return s.min_lr + 0.5 * (base - s.min_lr) * (1.0 + cos(M_PI * progress));
    }
    default:
        return base;
    }
}

em_status em_optim_set_schedule(em_optimizer *opt, em_lr_schedule s) {
    OPT_CHECK(opt, "em_optim_set_schedule");
    if (s.kind != EM_LR_CONSTANT && s.kind != EM_LR_STEP && s.kind != EM_LR_COSINE)
        return em_error(EM_ERR_ARGUMENT, "em_optim_set_schedule: unknown schedule kind %d: expected EM_LR_CONSTANT, "
                        "EM_LR_STEP or EM_LR_COSINE", (int)s.kind);
    if ((s.kind == EM_LR_STEP && s.step_size <= 0) ||
        (s.kind == EM_LR_COSINE && (s.warmup < 0 || s.total < s.warmup)))
        return em_error(EM_ERR_ARGUMENT, "em_optim_set_schedule: need step_size > 0 (step) or "
                        "0 <= warmup <= total (cosine)");
    opt->has_schedule = true;
    opt->schedule = s;
    opt->base_lr = opt->lr;
    opt->schedule_t = 0;
    opt->lr = em_lr_at(s, opt->base_lr, 0);
    return EM_OK;
}

em_status em_optim_schedule_step(em_optimizer *opt) {
    OPT_CHECK(opt, "em_optim_schedule_step");
    if (!opt->has_schedule) return em_error(EM_ERR_ARGUMENT, "em_optim_schedule_step: no schedule attached");
    opt->schedule_t++;
    opt->lr = em_lr_at(opt->schedule, opt->base_lr, opt->schedule_t);
    return EM_OK;
}

/* ---- what checkpoints see (src/optim/checkpoint.c) ---- */

static const char *const sgd_state_names[] = {"momentum_buffer"};
static const int sgd_state_slots[] = {ST_MOMENTUM};
static const char *const adam_state_names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
static const int adam_state_slots[] = {ST_EXP_AVG, ST_EXP_AVG_SQ, ST_MAX_EXP_AVG_SQ};

const char *em__optim_kind_name(const em_optimizer *o) {
    return o->kind == OPT_SGD ? "sgd" : o->kind == OPT_ADAM ? "adam" : "adamw";
}

int em__optim_state_names(const em_optimizer *o, const char *const **names) {
    *names = o->kind == OPT_SGD ? sgd_state_names : adam_state_names;
    return o->kind == OPT_SGD ? 1 : o->adam.amsgrad ? 3 : 2;
}

int em__optim_nparams(const em_optimizer *o) { return o->n; }
em_tensor *em__optim_param(const em_optimizer *o, int i) { return o->ps[i].p; }
em_tensor **em__optim_state_slot(em_optimizer *o, int i, int k) {
    return &o->ps[i].state[o->kind == OPT_SGD ? sgd_state_slots[k] : adam_state_slots[k]];
}
int64_t *em__optim_param_step(em_optimizer *o, int i) { return &o->ps[i].step; }
int64_t *em__optim_step_count(em_optimizer *o) { return &o->steps; }
