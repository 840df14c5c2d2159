/* Learning-rate schedules (torch.optim.lr_scheduler): the schedules' closed forms, and the
 * scheduler object that runs one from a position, on its own or attached to an optimizer
 * (one per optimizer; the links are weak both ways, each free tells the other). Every
 * schedule but ReduceLROnPlateau is computed from (base rate, position) alone, PyTorch's
 * _get_closed_form_lr, so that a scheduler made at a position or restored from a checkpoint
 * gives exactly the rates of one stepped there; ReduceLROnPlateau's state (best metric,
 * counters, the rate) is saved whole. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../core/internal_api.h"
#include "optim_internal.h"

struct em_lr_scheduler {
    em_lr_schedule s;
    em_optimizer *opt;        /* attached, or NULL (standalone, or its optimizer was freed) */
    bool standalone;          /* made by em_lr_scheduler_standalone */
    double base_lr;           /* the rate the schedule scales (PyTorch's base_lrs[0]) */
    int64_t last_epoch;       /* the position */
    double last_lr;           /* the rate at the position (what it set last) */
    double last_momentum;     /* OneCycleLR with cycle_momentum: the momentum at the position, else NaN */
    double best;              /* ReduceLROnPlateau */
    int64_t num_bad_epochs, cooldown_counter;
};

static const char *const kind_names[] = {
    [EM_LR_CONSTANT] = "ConstantSchedule", [EM_LR_STEP] = "StepLR", [EM_LR_COSINE] = "WarmupCosine",
    [EM_LR_MULTISTEP] = "MultiStepLR", [EM_LR_EXPONENTIAL] = "ExponentialLR",
    [EM_LR_COSINE_ANNEALING] = "CosineAnnealingLR", [EM_LR_COSINE_WARM_RESTARTS] = "CosineAnnealingWarmRestarts",
    [EM_LR_ONE_CYCLE] = "OneCycleLR", [EM_LR_LINEAR] = "LinearLR", [EM_LR_PLATEAU] = "ReduceLROnPlateau",
};
#define N_KINDS ((int)(sizeof kind_names / sizeof *kind_names))

const char *em__lr_kind_name(em_lr_kind k) {
    return (unsigned)k < (unsigned)N_KINDS ? kind_names[k] : "?";
}

bool em__lr_kind_parse(const char *name, em_lr_kind *out) {
    for (int k = 0; name && k < N_KINDS; k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (em_lr_kind)k;
            return true;
        }
    return false;
}

/* ---- schedules ---- */

em_lr_schedule em_lr_step(int64_t step_size, double gamma) {
    return (em_lr_schedule){.kind = EM_LR_STEP, .step_size = step_size, .gamma = gamma};
}

em_lr_schedule em_lr_cosine(int64_t warmup, int64_t total, double min_lr) {
    return (em_lr_schedule){.kind = EM_LR_COSINE, .warmup = warmup, .total = total, .min_lr = min_lr};
}

em_lr_schedule em_lr_multistep(const int64_t *milestones, int n, double gamma) {
    em_lr_schedule s = {.kind = EM_LR_MULTISTEP, .gamma = gamma, .nmilestones = n};
    /* more than fit, or none given for n > 0: kept as n, for the scheduler to refuse */
    for (int i = 0; milestones && i < n && i < EM_LR_MAX_MILESTONES; i++) s.milestones[i] = milestones[i];
    if (!milestones && n > 0) s.nmilestones = -1;
    return s;
}

em_lr_schedule em_lr_exponential(double gamma) { return (em_lr_schedule){.kind = EM_LR_EXPONENTIAL, .gamma = gamma}; }

em_lr_schedule em_lr_cosine_annealing(int64_t t_max, double eta_min) {
    return (em_lr_schedule){.kind = EM_LR_COSINE_ANNEALING, .t_max = t_max, .eta_min = eta_min};
}

em_lr_schedule em_lr_cosine_warm_restarts(int64_t t_0, int64_t t_mult, double eta_min) {
    return (em_lr_schedule){.kind = EM_LR_COSINE_WARM_RESTARTS, .t_max = t_0, .t_mult = t_mult, .eta_min = eta_min};
}

em_lr_schedule em_lr_linear(double start_factor, double end_factor, int64_t total_iters) {
    return (em_lr_schedule){.kind = EM_LR_LINEAR, .start_factor = start_factor, .end_factor = end_factor,
                            .total_iters = total_iters};
}

em_lr_schedule em_lr_one_cycle(double max_lr, int64_t total_steps) {
    return (em_lr_schedule){.kind = EM_LR_ONE_CYCLE, .max_lr = max_lr, .total_steps = total_steps,
                            .pct_start = 0.3, .div_factor = 25.0, .final_div_factor = 1e4,
                            .cycle_momentum = true, .base_momentum = 0.85, .max_momentum = 0.95};
}

em_lr_schedule em_lr_plateau(void) {
    return (em_lr_schedule){.kind = EM_LR_PLATEAU, .factor = 0.1, .patience = 10, .threshold = 1e-4, .eps = 1e-8};
}

/* OneCycleLR's phases: end step (a float, as PyTorch's), and the rates and momenta each
 * goes between. Returns how many. */
typedef struct cycle_phase { double end, lr0, lr1, m0, m1; } cycle_phase;
static int one_cycle_phases(const em_lr_schedule *s, cycle_phase ph[3]) {
    double initial = s->max_lr / s->div_factor, min_lr = initial / s->final_div_factor;
    double total = (double)s->total_steps, lo = s->base_momentum, hi = s->max_momentum;
    if (s->three_phase) {
        ph[0] = (cycle_phase){s->pct_start * total - 1, initial, s->max_lr, hi, lo};
        ph[1] = (cycle_phase){2 * s->pct_start * total - 2, s->max_lr, initial, lo, hi};
        ph[2] = (cycle_phase){total - 1, initial, min_lr, hi, hi};
        return 3;
    }
    ph[0] = (cycle_phase){s->pct_start * total - 1, initial, s->max_lr, hi, lo};
    ph[1] = (cycle_phase){total - 1, s->max_lr, min_lr, lo, hi};
    return 2;
}

static double anneal(const em_lr_schedule *s, double start, double end, double pct) {
    if (s->anneal_linear) return (end - start) * pct + start;
    return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
}

/* Why s cannot be run (PyTorch's words where it has them), or NULL. */
static const char *schedule_problem(const em_lr_schedule *s, char *why, size_t cap) {
    switch (s->kind) {
    case EM_LR_CONSTANT: return NULL;
    case EM_LR_STEP:
        if (s->step_size <= 0) snprintf(why, cap, "StepLR needs step_size > 0, got %lld", (long long)s->step_size);
        else if (!isfinite(s->gamma)) snprintf(why, cap, "StepLR needs a finite gamma, got %g", s->gamma);
        else return NULL;
        return why;
    case EM_LR_COSINE:
        if (s->warmup < 0 || s->total < s->warmup || !isfinite(s->min_lr))
            snprintf(why, cap, "the warm-up cosine needs 0 <= warmup <= total and a finite min_lr, got warmup %lld, "
                     "total %lld, min_lr %g", (long long)s->warmup, (long long)s->total, s->min_lr);
        else return NULL;
        return why;
    case EM_LR_MULTISTEP:
        if (s->nmilestones < 0 || s->nmilestones > EM_LR_MAX_MILESTONES)
            snprintf(why, cap, "MultiStepLR takes 0 to %d milestones (a non-NULL array), got %d", EM_LR_MAX_MILESTONES,
                     s->nmilestones);
        else if (!isfinite(s->gamma)) snprintf(why, cap, "MultiStepLR needs a finite gamma, got %g", s->gamma);
        else return NULL;
        return why;
    case EM_LR_EXPONENTIAL:
        if (!isfinite(s->gamma)) snprintf(why, cap, "ExponentialLR needs a finite gamma, got %g", s->gamma);
        else return NULL;
        return why;
    case EM_LR_COSINE_ANNEALING:
        if (s->t_max <= 0) snprintf(why, cap, "CosineAnnealingLR needs T_max > 0, got %lld", (long long)s->t_max);
        else if (!isfinite(s->eta_min)) snprintf(why, cap, "CosineAnnealingLR needs a finite eta_min, got %g", s->eta_min);
        else return NULL;
        return why;
    case EM_LR_COSINE_WARM_RESTARTS:
        if (s->t_max <= 0) snprintf(why, cap, "Expected positive integer T_0, but got %lld", (long long)s->t_max);
        else if (s->t_mult < 1) snprintf(why, cap, "Expected integer T_mult >= 1, but got %lld", (long long)s->t_mult);
        else if (!isfinite(s->eta_min)) snprintf(why, cap, "Expected a finite eta_min, but got %g", s->eta_min);
        else return NULL;
        return why;
    case EM_LR_LINEAR:
        if (!(s->start_factor > 0 && s->start_factor <= 1))
            snprintf(why, cap, "Starting multiplicative factor expected to be greater than 0 and less or equal to 1 "
                     "(got %g).", s->start_factor);
        else if (!(s->end_factor >= 0 && s->end_factor <= 1))
            snprintf(why, cap, "Ending multiplicative factor expected to be between 0 and 1 (got %g).", s->end_factor);
        else if (s->total_iters <= 0)
            snprintf(why, cap, "LinearLR needs total_iters > 0, got %lld", (long long)s->total_iters);
        else return NULL;
        return why;
    case EM_LR_ONE_CYCLE: {
        if (s->total_steps <= 0) {
            snprintf(why, cap, "Expected positive integer total_steps, but got %lld", (long long)s->total_steps);
            return why;
        }
        if (!(s->pct_start >= 0 && s->pct_start <= 1)) {
            snprintf(why, cap, "Expected float between 0 and 1 pct_start, but got %g", s->pct_start);
            return why;
        }
        if (!(isfinite(s->max_lr) && s->max_lr >= 0 && s->div_factor > 0 && isfinite(s->div_factor) &&
              s->final_div_factor > 0 && isfinite(s->final_div_factor))) {
            snprintf(why, cap, "OneCycleLR needs max_lr >= 0, div_factor > 0 and final_div_factor > 0 (finite), got "
                     "%g, %g and %g", s->max_lr, s->div_factor, s->final_div_factor);
            return why;
        }
        if (s->cycle_momentum && !(isfinite(s->base_momentum) && isfinite(s->max_momentum))) {
            snprintf(why, cap, "OneCycleLR needs finite base_momentum and max_momentum, got %g and %g",
                     s->base_momentum, s->max_momentum);
            return why;
        }
        cycle_phase ph[3];
        int n = one_cycle_phases(s, ph);
        double start = 0;
        for (int i = 0; i < n; i++) {   /* PyTorch divides by each phase's length */
            if (!(ph[i].end > start)) {
                snprintf(why, cap, "OneCycleLR: pct_start %g of %lld total steps leaves phase %d without steps "
                         "(it would divide by zero)", s->pct_start, (long long)s->total_steps, i + 1);
                return why;
            }
            start = ph[i].end;
        }
        return NULL;
    }
    case EM_LR_PLATEAU:
        if (!(s->factor < 1.0)) snprintf(why, cap, "Factor should be < 1.0. (got %g)", s->factor);
        else if (!(s->factor >= 0)) snprintf(why, cap, "ReduceLROnPlateau needs factor >= 0, got %g", s->factor);
        else if (s->patience < 0 || s->cooldown < 0)
            snprintf(why, cap, "ReduceLROnPlateau needs patience >= 0 and cooldown >= 0, got %lld and %lld",
                     (long long)s->patience, (long long)s->cooldown);
        else if (!(s->min_lr >= 0 && isfinite(s->min_lr)) || !(s->eps >= 0) || !isfinite(s->threshold))
            snprintf(why, cap, "ReduceLROnPlateau needs min_lr >= 0, eps >= 0 and a finite threshold, got %g, %g and %g",
                     s->min_lr, s->eps, s->threshold);
        else return NULL;
        return why;
    }
    snprintf(why, cap, "unknown schedule kind %d: expected an em_lr_kind (EM_LR_CONSTANT to EM_LR_PLATEAU)",
             (int)s->kind);
    return why;
}

/* CosineAnnealingWarmRestarts' place in its period at step t: T_cur of T_i, in integers. */
static void warm_restart_at(const em_lr_schedule *s, int64_t t, int64_t *t_cur, int64_t *t_i) {
    if (s->t_mult == 1) {
        *t_cur = t % s->t_max;
        *t_i = s->t_max;
        return;
    }
    int64_t cur = t, len = s->t_max;
    while (cur >= len) {
        cur -= len;
        len = len > INT64_MAX / s->t_mult ? INT64_MAX : len * s->t_mult;
    }
    *t_cur = cur;
    *t_i = len;
}

/* The rate at position t (and OneCycleLR's momentum, else NaN), for a schedule that passed
 * schedule_problem and t within it. Each formula is PyTorch's closed form, term for term. */
static double closed_form(const em_lr_schedule *s, double base, int64_t t, double *momentum) {
    *momentum = NAN;
    switch (s->kind) {
    case EM_LR_STEP: return base * pow(s->gamma, (double)(t / s->step_size));
    case EM_LR_COSINE: {
        if (t < s->warmup) return base * (double)(t + 1) / (double)s->warmup;
        if (t >= s->total || s->total <= s->warmup) return s->min_lr;
        double progress = (double)(t - s->warmup) / (double)(s->total - s->warmup);
        return s->min_lr + 0.5 * (base - s->min_lr) * (1.0 + cos(M_PI * progress));
    }
    case EM_LR_MULTISTEP: {
        int passed = 0;
        for (int i = 0; i < s->nmilestones; i++) passed += s->milestones[i] <= t;
        return base * pow(s->gamma, (double)passed);
    }
    case EM_LR_EXPONENTIAL: return base * pow(s->gamma, (double)t);
    case EM_LR_COSINE_ANNEALING:
        return s->eta_min + (base - s->eta_min) * (1 + cos(M_PI * (double)t / (double)s->t_max)) / 2;
    case EM_LR_COSINE_WARM_RESTARTS: {
        int64_t cur, len;
        warm_restart_at(s, t, &cur, &len);
        return s->eta_min + (base - s->eta_min) * (1 + cos(M_PI * (double)cur / (double)len)) / 2;
    }
    case EM_LR_LINEAR: {
        int64_t done = t < s->total_iters ? t : s->total_iters;
        return base * (s->start_factor + (s->end_factor - s->start_factor) * (double)done / (double)s->total_iters);
    }
    case EM_LR_ONE_CYCLE: {
        cycle_phase ph[3];
        int n = one_cycle_phases(s, ph);
        double start = 0;
        for (int i = 0; i < n; i++) {
            if ((double)t <= ph[i].end || i == n - 1) {
                double pct = ((double)t - start) / (ph[i].end - start);
                if (s->cycle_momentum) *momentum = anneal(s, ph[i].m0, ph[i].m1, pct);
                return anneal(s, ph[i].lr0, ph[i].lr1, pct);
            }
            start = ph[i].end;
        }
        return NAN;
    }
    case EM_LR_PLATEAU: return NAN;
    case EM_LR_CONSTANT:
    default: return base;
    }
}

double em_lr_at(em_lr_schedule s, double base_lr, int64_t t) {
    char why[256];
    if (schedule_problem(&s, why, sizeof why) || s.kind == EM_LR_PLATEAU || t < 0 ||
        (s.kind == EM_LR_ONE_CYCLE && t > s.total_steps))
        return NAN;
    double m;
    return closed_form(&s, base_lr, t, &m);
}

/* ---- schedulers ---- */

/* The rate (and momentum) at the scheduler's position onto its optimizer. */
static void apply(em_lr_scheduler *sch) {
    if (!sch->opt) return;
    em_optim_set_lr(sch->opt, sch->last_lr);
    double *m = em__optim_momentum(sch->opt);
    if (m && !isnan(sch->last_momentum)) *m = sch->last_momentum;
}

/* Position t's rate and momentum into the scheduler (a closed-form schedule). */
static void move_to(em_lr_scheduler *sch, int64_t t) {
    sch->last_epoch = t;
    sch->last_lr = closed_form(&sch->s, sch->base_lr, t, &sch->last_momentum);
}

static em_status check_new(const char *op, const em_lr_schedule *s, int64_t last_epoch) {
    char why[320];
    if (schedule_problem(s, why, sizeof why)) return em_error(EM_ERR_ARGUMENT, "%s: %s", op, why);
    if (last_epoch < -1 || last_epoch > INT64_C(1) << 53)   /* counted on by every step */
        return em_error(EM_ERR_ARGUMENT, "%s: last_epoch must be -1 (a new schedule) or the last position done "
                        "(0 to 2^53), got %lld", op, (long long)last_epoch);
    if (s->kind == EM_LR_PLATEAU && last_epoch != -1)
        return em_error(EM_ERR_ARGUMENT, "%s: ReduceLROnPlateau has no position to start from (its rate depends on "
                        "the metrics seen): make it with last_epoch -1 and restore it with em_checkpoint_load or "
                        "em_lr_scheduler_load_state_dict", op);
    if (s->kind == EM_LR_ONE_CYCLE && last_epoch + 1 > s->total_steps)
        return em_error(EM_ERR_ARGUMENT, "%s: Tried to step %lld times. The specified number of total steps is %lld",
                        op, (long long)(last_epoch + 1), (long long)s->total_steps);
    return EM_OK;
}

static em_lr_scheduler *scheduler_alloc(const char *op, const em_lr_schedule *s) {
    em_lr_scheduler *sch = calloc(1, sizeof *sch);
    if (!sch) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    sch->s = *s;
    sch->last_momentum = NAN;
    sch->best = s->mode_max ? -INFINITY : INFINITY;
    return sch;
}

/* base: the rate the schedule scales; NaN: opt's initial_lr (set to its lr when unset). */
static em_lr_scheduler *attach_new(const char *op, em_optimizer *opt, em_lr_schedule s, int64_t last_epoch,
                                   double base, bool owned) {
    if (!opt) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: optimizer is NULL", op);
        return NULL;
    }
    if (check_new(op, &s, last_epoch) != EM_OK) return NULL;
    if (s.kind == EM_LR_ONE_CYCLE && s.cycle_momentum && !em__optim_momentum(opt)) {
        em_error(EM_ERR_ARGUMENT, "%s: optimizer must support momentum or beta1 with `cycle_momentum` option enabled "
                 "(%s has neither; set cycle_momentum = false)", op, em_optim_name(opt));
        return NULL;
    }
    em_lr_scheduler *sch = scheduler_alloc(op, &s);
    if (!sch) return NULL;
    double *initial = em__optim_initial_lr(opt);
    if (isnan(base)) base = isnan(*initial) ? em_optim_lr(opt) : *initial;
    if (s.kind == EM_LR_ONE_CYCLE) base = s.max_lr / s.div_factor;   /* OneCycleLR sets initial_lr itself */
    sch->opt = opt;
    sch->base_lr = base;
    if (em__optim_attach_scheduler(opt, sch, owned) != EM_OK) {
        free(sch);
        return NULL;
    }
    if (!owned && (isnan(*initial) || s.kind == EM_LR_ONE_CYCLE)) *initial = base;
    if (s.kind == EM_LR_PLATEAU) {   /* PyTorch: last_epoch 0, the optimizer's rate as it is */
        sch->last_epoch = 0;
        sch->last_lr = em_optim_lr(opt);
        return sch;
    }
    move_to(sch, last_epoch + 1);
    apply(sch);
    return sch;
}

em_lr_scheduler *em_lr_scheduler_new(em_optimizer *opt, em_lr_schedule s, int64_t last_epoch) {
    return attach_new("em_lr_scheduler_new", opt, s, last_epoch, NAN, false);
}

em_lr_scheduler *em_lr_scheduler_standalone(em_lr_schedule s, double base_lr, int64_t last_epoch) {
    const char *op = "em_lr_scheduler_standalone";
    if (!(base_lr >= 0) || !isfinite(base_lr)) {
        em_error(EM_ERR_ARGUMENT, "%s: Invalid learning rate: %g (expected a finite base_lr >= 0)", op, base_lr);
        return NULL;
    }
    if (check_new(op, &s, last_epoch) != EM_OK) return NULL;
    em_lr_scheduler *sch = scheduler_alloc(op, &s);
    if (!sch) return NULL;
    sch->standalone = true;
    sch->base_lr = s.kind == EM_LR_ONE_CYCLE ? s.max_lr / s.div_factor : base_lr;
    if (s.kind == EM_LR_PLATEAU) {
        sch->last_lr = base_lr;
        return sch;
    }
    move_to(sch, last_epoch + 1);
    return sch;
}

void em_lr_scheduler_free(em_lr_scheduler *s) {
    if (!s) return;
    if (s->opt) em__optim_detach_scheduler(s->opt, s);
    free(s);
}

void em__lr_scheduler_forget_optimizer(em_lr_scheduler *s) { s->opt = NULL; }

static em_status usable(const char *op, const em_lr_scheduler *s) {
    if (!s) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: scheduler is NULL", op);
    if (!s->standalone && !s->opt)
        return em_error(EM_ERR_ARGUMENT, "%s: the scheduler's optimizer was freed (em_optim_free): free the "
                        "scheduler too", op);
    return EM_OK;
}

em_status em_lr_scheduler_step(em_lr_scheduler *s) {
    const char *op = "em_lr_scheduler_step";
    em_status st = usable(op, s);
    if (st != EM_OK) return st;
    if (s->s.kind == EM_LR_PLATEAU)
        return em_error(EM_ERR_ARGUMENT, "%s: ReduceLROnPlateau steps with a metric: em_lr_scheduler_step_metric", op);
    if (s->s.kind == EM_LR_ONE_CYCLE && s->last_epoch + 1 > s->s.total_steps)
        return em_error(EM_ERR_ARGUMENT, "%s: Tried to step %lld times. The specified number of total steps is %lld",
                        op, (long long)(s->last_epoch + 1), (long long)s->s.total_steps);
    move_to(s, s->last_epoch + 1);
    apply(s);
    return EM_OK;
}

static bool plateau_better(const em_lr_schedule *s, double a, double best) {
    if (!s->mode_max) return s->threshold_abs ? a < best - s->threshold : a < best * (1.0 - s->threshold);
    return s->threshold_abs ? a > best + s->threshold : a > best * (s->threshold + 1.0);
}

em_status em_lr_scheduler_step_metric(em_lr_scheduler *s, double metric) {
    const char *op = "em_lr_scheduler_step_metric";
    em_status st = usable(op, s);
    if (st != EM_OK) return st;
    if (s->s.kind != EM_LR_PLATEAU)
        return em_error(EM_ERR_ARGUMENT, "%s: only ReduceLROnPlateau steps with a metric (this is %s: "
                        "em_lr_scheduler_step)", op, em__lr_kind_name(s->s.kind));
    s->last_epoch++;
    if (plateau_better(&s->s, metric, s->best)) {
        s->best = metric;
        s->num_bad_epochs = 0;
    } else {
        s->num_bad_epochs++;
    }
    if (s->cooldown_counter > 0) {   /* bad epochs in cooldown are ignored */
        s->cooldown_counter--;
        s->num_bad_epochs = 0;
    }
    double lr = s->opt ? em_optim_lr(s->opt) : s->last_lr;
    if (s->num_bad_epochs > s->s.patience) {
        double reduced = fmax(lr * s->s.factor, s->s.min_lr);
        if (lr - reduced > s->s.eps) lr = reduced;
        s->cooldown_counter = s->s.cooldown;
        s->num_bad_epochs = 0;
    }
    s->last_lr = lr;
    apply(s);
    return EM_OK;
}

double em_lr_scheduler_get_last_lr(const em_lr_scheduler *s) { return s ? s->last_lr : NAN; }
int64_t em_lr_scheduler_last_epoch(const em_lr_scheduler *s) { return s ? s->last_epoch : -1; }
double em_lr_scheduler_get_last_momentum(const em_lr_scheduler *s) { return s ? s->last_momentum : NAN; }

em_status em_lr_scheduler_state_dict(const em_lr_scheduler *s, em_lr_scheduler_state *out) {
    if (!s || !out)
        return em_failed() ? em_last_status()
                           : em_error(EM_ERR_ARGUMENT, "em_lr_scheduler_state_dict: %s is NULL", s ? "out" : "scheduler");
    *out = (em_lr_scheduler_state){.kind = s->s.kind, .last_epoch = s->last_epoch, .base_lr = s->base_lr,
                                   .last_lr = s->last_lr, .best = s->best, .num_bad_epochs = s->num_bad_epochs,
                                   .cooldown_counter = s->cooldown_counter};
    return EM_OK;
}

em_status em__lr_scheduler_check_state(const em_lr_scheduler *s, const em_lr_scheduler_state *st, const char *op,
                                       const char *where) {
    if (st->kind != s->s.kind)
        return em_error(EM_ERR_ARGUMENT, "%s: %s holds the state of a %s scheduler, but the scheduler is %s", op,
                        where, em__lr_kind_name(st->kind), em__lr_kind_name(s->s.kind));
    if (st->last_epoch < 0 || (s->s.kind == EM_LR_ONE_CYCLE && st->last_epoch > s->s.total_steps))
        return em_error(EM_ERR_ARGUMENT, "%s: %s: position %lld is outside the schedule (expected 0 to %lld)", op,
                        where, (long long)st->last_epoch,
                        (long long)(s->s.kind == EM_LR_ONE_CYCLE ? s->s.total_steps : INT64_MAX));
    if (!(st->base_lr >= 0) || !isfinite(st->base_lr) || !(st->last_lr >= 0) || !isfinite(st->last_lr))
        return em_error(EM_ERR_ARGUMENT, "%s: %s: rates must be finite and >= 0, got base_lr %g and last_lr %g", op,
                        where, st->base_lr, st->last_lr);
    if (st->num_bad_epochs < 0 || st->cooldown_counter < 0 || isnan(st->best))
        return em_error(EM_ERR_ARGUMENT, "%s: %s: ReduceLROnPlateau's counters must be >= 0 and best a number, got "
                        "%lld, %lld and %g", op, where, (long long)st->num_bad_epochs, (long long)st->cooldown_counter,
                        st->best);
    return EM_OK;
}

em_status em_lr_scheduler_load_state_dict(em_lr_scheduler *s, const em_lr_scheduler_state *st) {
    const char *op = "em_lr_scheduler_load_state_dict";
    if (!s || !st) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", op,
                                                                     s ? "the state" : "scheduler");
    em_status r = usable(op, s);
    if (r == EM_OK) r = em__lr_scheduler_check_state(s, st, op, "the state");
    if (r != EM_OK) return r;
    s->base_lr = st->base_lr;
    s->best = st->best;
    s->num_bad_epochs = st->num_bad_epochs;
    s->cooldown_counter = st->cooldown_counter;
    if (s->s.kind != EM_LR_PLATEAU) move_to(s, st->last_epoch);   /* its momentum */
    s->last_epoch = st->last_epoch;
    s->last_lr = st->last_lr;
    if (s->opt && s->s.kind != EM_LR_ONE_CYCLE) *em__optim_initial_lr(s->opt) = s->base_lr;
    apply(s);
    return EM_OK;
}

/* ---- the first interface: a scheduler the optimizer owns ---- */

em_status em_optim_set_schedule(em_optimizer *opt, em_lr_schedule s) {
    const char *op = "em_optim_set_schedule";
    if (!opt) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: optimizer is NULL", op);
    if (s.kind == EM_LR_PLATEAU)
        return em_error(EM_ERR_ARGUMENT, "%s: ReduceLROnPlateau steps with a metric: use em_lr_scheduler_new", op);
    return attach_new(op, opt, s, -1, em_optim_lr(opt), true) ? EM_OK : em_last_status();
}

em_status em_optim_schedule_step(em_optimizer *opt) {
    if (!opt) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_optim_schedule_step: optimizer is NULL");
    em_lr_scheduler *s = em__optim_scheduler(opt);
    if (!s) return em_error(EM_ERR_ARGUMENT, "em_optim_schedule_step: no schedule attached");
    return em_lr_scheduler_step(s);
}
