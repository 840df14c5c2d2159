/* SGD, Adam and AdamW with PyTorch's single-tensor update formulas, as em_optimizer_ops
 * tables run by optimizer.c. Each step runs the backend's fused kernel (one pass per
 * parameter, the SGD_STEP / ADAM_STEP ops, which also read a loss scaler's flag on the
 * device) when the parameter, its gradient and its state are contiguous on one device;
 * otherwise, and as the reference the fused kernels are tested against, the same formulas
 * written with the public in-place ops. */
#include <math.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "optim_internal.h"

em_sgd_opts em_sgd_defaults(double lr) { return (em_sgd_opts){.lr = lr}; }

em_adam_opts em_adam_defaults(double lr) {
    return (em_adam_opts){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

em_adam_opts em_adamw_defaults(double lr) {
    em_adam_opts o = em_adam_defaults(lr);
    o.weight_decay = 0.01;
    return o;
}

/* PyTorch's refusal of a bad option: "Invalid momentum value: -1". */
static bool bad(bool ok, const char *msg, double v) {
    if (!ok) em_error(EM_ERR_ARGUMENT, "%s: %g", msg, v);
    return !ok;
}

/* A loss scaler's flag, read on the host where no kernel reads it (this waits for the device). */
static em_status amp_host_check(em_tensor *amp, bool *skip, double *skipped) {
    float st[4] = {0};
    em_status r = em_copy_to_host(amp, st, sizeof st);
    *skip = st[2] != 0.0f;
    *skipped = st[3];
    return r;
}

/* ---- SGD ---- */

enum { SGD_MOMENTUM_BUFFER };
static const char *const sgd_state_names[] = {"momentum_buffer"};

static em_status sgd_check(const void *hyper) {
    const em_sgd_opts *s = hyper;
    if (bad(s->momentum >= 0, "Invalid momentum value", s->momentum) ||
        bad(s->weight_decay >= 0, "Invalid weight_decay value", s->weight_decay))
        return EM_ERR_ARGUMENT;
    if (s->nesterov && (s->momentum <= 0 || s->dampening != 0))
        return em_error(EM_ERR_ARGUMENT, "Nesterov momentum requires a momentum and zero dampening");
    return EM_OK;
}

static bool sgd_uses_state(const void *hyper, int k) {
    (void)k;
    return ((const em_sgd_opts *)hyper)->momentum != 0;
}

static double *sgd_momentum(void *hyper) { return &((em_sgd_opts *)hyper)->momentum; }

static em_status sgd_fused(const em_optim_update *u, bool *done) {
    const em_sgd_opts *s = u->hyper;
    em_optimizer *o = u->optimizer;
    em_tensor *amp = em__optim_amp(o), *buf = s->momentum != 0 ? u->state[SGD_MOMENTUM_BUFFER] : NULL;
    if (!em__optim_fused_allowed(o) || !em__fused_sgd_applies(u->param, u->grad, buf)) return EM_OK;
    if (amp && !em__amp_state_fits(amp, u->param)) return EM_OK;
    /* under a scaler a first step skipped on the device leaves the (zero) buffer as it was */
    em_optim_args a = {.lr = u->lr, .weight_decay = s->weight_decay, .momentum = s->momentum,
                       .dampening = s->dampening, .nesterov = s->nesterov, .first_step = buf && u->fresh,
                       .maximize = s->maximize, .amp = amp};
    *done = true;
    em_status st = em__fused_sgd_step(&a, u->param, u->grad, buf);
    if (st == EM_OK) em__optim_count_fused(o);
    return st;
}

static em_status sgd_step(const em_optim_update *u) {
    bool done = false;
    em_status fst = sgd_fused(u, &done);
    if (done || fst != EM_OK) return fst;
    em_tensor *amp = em__optim_amp(u->optimizer);
    if (amp) {
        bool skip;
        double skipped;
        em_status st = amp_host_check(amp, &skip, &skipped);
        if (st != EM_OK || skip) return st;
    }
    const em_sgd_opts *s = u->hyper;
    em_tensor *d = s->maximize ? em_neg(u->grad) : u->grad;
    if (s->weight_decay != 0) d = em_add(d, em_mul_scalar(u->param, s->weight_decay));
    if (s->momentum != 0) {
        em_tensor *buf = u->state[SGD_MOMENTUM_BUFFER];
        em_status st = u->fresh ? em_copy_(buf, d) : em_mul_scalar_(buf, s->momentum);  /* PyTorch's clone */
        if (st == EM_OK && !u->fresh) st = em_add_(buf, d, 1.0 - s->dampening);
        if (st != EM_OK) return st;
        d = s->nesterov ? em_add(d, em_mul_scalar(buf, s->momentum)) : buf;
    }
    if (!d) return em_last_status();
    return em_add_(u->param, d, -u->lr);
}

const em_optimizer_ops em__sgd_ops = {
    .name = "sgd", .nstate = 1, .state_names = sgd_state_names, .hyper_size = sizeof(em_sgd_opts),
    .check = sgd_check, .uses_state = sgd_uses_state, .step = sgd_step, .momentum = sgd_momentum,
};

em_optimizer *em_sgd_ex(em_module *m, em_sgd_opts s) { return em_optimizer_new(m, &em__sgd_ops, &s, s.lr); }
em_optimizer *em_sgd(em_module *m, double lr) { return em_sgd_ex(m, em_sgd_defaults(lr)); }

/* ---- Adam and AdamW ---- */

enum { ADAM_EXP_AVG, ADAM_EXP_AVG_SQ, ADAM_MAX_EXP_AVG_SQ };
static const char *const adam_state_names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

static em_status adam_check(const void *hyper) {
    const em_adam_opts *a = hyper;
    if (bad(a->eps >= 0, "Invalid epsilon value", a->eps) ||
        bad(a->beta1 >= 0 && a->beta1 < 1, "Invalid beta parameter at index 0", a->beta1) ||
        bad(a->beta2 >= 0 && a->beta2 < 1, "Invalid beta parameter at index 1", a->beta2) ||
        bad(a->weight_decay >= 0, "Invalid weight_decay value", a->weight_decay))
        return EM_ERR_ARGUMENT;
    return EM_OK;
}

static bool adam_uses_state(const void *hyper, int k) {
    return k != ADAM_MAX_EXP_AVG_SQ || ((const em_adam_opts *)hyper)->amsgrad;
}

static double *adam_momentum(void *hyper) { return &((em_adam_opts *)hyper)->beta1; }

/* The weight decay this parameter gets (none on a bias or norm weight with decay_matrices_only). */
static double adam_decay(const em_adam_opts *a, const em_tensor *p) {
    return a->decay_matrices_only && em_ndim(p) < 2 ? 0.0 : a->weight_decay;
}

/* Inside a graph capture, an Adam update that would bake host scalars into the recording. */
static em_status refuse_in_capture(const char *why) {
    return em_error(EM_ERR_NOT_SUPPORTED, "Adam's step inside a graph capture must read its step count and learning "
                    "rate on the device, or every replay repeats the recorded step; here it cannot: %s", why);
}

static const char *const per_tensor_why =
    "the per-tensor update takes them from the host (the multi-tensor one reads them on the device: float32 "
    "parameters, no amsgrad, no loss scaler)";

static em_status adam_fused(const em_optim_update *u, bool decoupled, bool *done) {
    const em_adam_opts *a = u->hyper;
    em_optimizer *o = u->optimizer;
    em_tensor *amp = em__optim_amp(o);
    em_tensor *m = u->state[ADAM_EXP_AVG], *v = u->state[ADAM_EXP_AVG_SQ];
    em_tensor *vmax = a->amsgrad ? u->state[ADAM_MAX_EXP_AVG_SQ] : NULL;
    if (!em__optim_fused_allowed(o) || !em__fused_adam_applies(u->param, u->grad, m, v, vmax)) return EM_OK;
    if (amp && !em__amp_state_fits(amp, u->param)) return EM_OK;
    em_optim_args args = {.lr = u->lr, .weight_decay = adam_decay(a, u->param), .beta1 = a->beta1,
                          .beta2 = a->beta2, .eps = a->eps,
                          .bias_correction1 = 1.0 - pow(a->beta1, (double)u->step),
                          .bias_correction2 = 1.0 - pow(a->beta2, (double)u->step),
                          .decoupled = decoupled, .amsgrad = a->amsgrad, .maximize = a->maximize,
                          .amp = amp, .step = u->step, .no_lowp_copy = a->no_lowp_copy};
    *done = true;
    em__optim_batch *b = em__optim_batch_of(o);
    em_adam_multi_item item = {.p = u->param, .g = u->grad, .m = m, .v = v, .args = args};
    /* run with the others at the end of em_step (which made room for every parameter) */
    if (b->open && b->n < b->cap && em__fused_adam_multi_applies(&item)) {
        b->items[b->n] = item;
        b->param[b->n++] = em__optim_current_param(o);
        em__optim_count_fused(o);
        return EM_OK;
    }
    if (em__graph_capturing(em_device_of(u->param))) return refuse_in_capture(per_tensor_why);
    em_status st = em__fused_adam_step(&args, u->param, u->grad, m, v, vmax);
    if (st == EM_OK) em__optim_count_fused(o);
    return st;
}

static bool schedule_on(const em__optim_device_schedule *ds, em_device d) {
    return ds->mode < 0 ? d.type == EM_CUDA : ds->mode > 0 && d.type != EM_CPU;
}

/* The host's step count and rate written to the device schedule (a copy from the host). */
static em_status write_schedule(em__optim_device_schedule *ds, int64_t steps, double lr) {
    double v[2] = {(double)steps, lr};
    em_scope s = em_scope_begin();
    em_tensor *host = em_from_data(v, EM_F64, EM_SHAPE(2), EM_OPTS(.dtype = EM_F64));
    em_status st = host ? em_copy_(ds->state, host) : em_last_status();
    em_scope_end(s);
    if (st == EM_OK) ds->steps = steps, ds->lr = lr;
    return st;
}

/* Attach opt's device schedule to the multi-tensor call of one device's updates when it
 * applies there: every item at the same step t, the schedule on d (made here at the first
 * step) holding t - 1 and the rate. Inside a capture an update that cannot read it is an
 * error, since the recording would repeat host scalars. */
static em_status attach_schedule(em_optimizer *o, em_adam_multi *mt, em_device d) {
    em__optim_device_schedule *ds = em__optim_device_schedule_of(o);
    bool capturing = em__graph_capturing(d);
    int64_t t = mt->items[0].args.step;
    double lr = em_optim_lr(o);
    const char *why = NULL;
    if (!schedule_on(ds, d)) why = "the step count on the device is off for this device";
    for (int i = 1; i < mt->n && !why; i++)
        if (mt->items[i].args.step != t) why = "its parameters have taken different numbers of steps";
    if (!why && ds->state && !em_device_equal(em_device_of(ds->state), d))
        why = "its step count on the device is kept on another device";
    if (!why && capturing && !ds->state)
        why = "its step count on the device is made at the first step: step once outside the capture first";
    if (!why && capturing && ds->steps != t - 1) why = "its step count was changed on the host (a checkpoint loaded?)";
    if (!why && capturing && ds->lr != lr) why = "its learning rate changed inside the capture";
    if (why) return capturing ? refuse_in_capture(why) : EM_OK;
    if (!ds->state) {
        em_scope s = em_scope_begin();
        em_tensor *state = em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = d));
        em_tensor *consts = em_zeros(EM_SHAPE(EMK_MT_S_COUNT), EM_OPTS(.device = d));
        if (state && consts) ds->state = em_retain(state), ds->consts = em_retain(consts);
        em_scope_end(s);
        if (!ds->state) return em_last_status();
        ds->steps = -1;   /* written below */
    }
    if ((ds->steps != t - 1 || ds->lr != lr) && write_schedule(ds, t - 1, lr) != EM_OK) return em_last_status();
    const em_adam_opts *a = em_optim_hyper(o);
    mt->sched = ds->state;
    mt->consts = ds->consts;
    mt->beta1 = a->beta1;
    mt->beta2 = a->beta2;
    mt->weight_decay = a->weight_decay;
    return EM_OK;
}

em_status em__optim_device_lr(em_optimizer *o) {
    em__optim_device_schedule *ds = em__optim_device_schedule_of(o);
    double lr = em_optim_lr(o);
    if (!ds->state || ds->lr == lr || em__graph_capturing(em_device_of(ds->state))) return EM_OK;
    em_scope s = em_scope_begin();
    em_status st = em_fill_(em_narrow(ds->state, 0, 1, 1), lr);
    em_scope_end(s);
    if (st == EM_OK) ds->lr = lr;
    return st;
}

em_status em__optim_flush_batch(em_optimizer *o) {
    em__optim_batch *b = em__optim_batch_of(o);
    bool *ran = b->taken;
    em_adam_multi_item *group = b->group;
    em_status st = EM_OK;
    for (int i = 0; i < b->n; i++) ran[i] = false;
    /* one call per device, the parameters in their order */
    for (int i = 0; i < b->n && st == EM_OK; i++) {
        if (ran[i]) continue;
        em_device d = em_device_of(b->items[i].p);
        int n = 0;
        for (int j = i; j < b->n; j++) {
            em_device dj = em_device_of(b->items[j].p);
            if (!ran[j] && dj.type == d.type && dj.index == d.index) {
                group[n++] = b->items[j];
                ran[j] = true;
            }
        }
        em_adam_multi mt = {.n = n, .items = group};
        if ((st = attach_schedule(o, &mt, d)) != EM_OK) break;
        st = em__fused_adam_multi_step(&mt);
        if (st == EM_OK) b->calls++;
        if (st == EM_OK && mt.sched) {
            em__optim_device_schedule *ds = em__optim_device_schedule_of(o);
            ds->steps++;
            ds->used = true;
        }
        if (st == EM_ERR_NOT_SUPPORTED && !em_failed() && em__graph_capturing(d)) st = refuse_in_capture(per_tensor_why);
        else if (st == EM_ERR_NOT_SUPPORTED && !em_failed()) { /* declined: each on its own */
            if (mt.sched) em__optim_device_schedule_of(o)->mode = 0;   /* no float64 there: host scalars */
            st = EM_OK;
            for (int j = 0; j < n && st == EM_OK; j++) {
                em_adam_multi_item *it = &group[j];
                st = em__fused_adam_step(&it->args, it->p, it->g, it->m, it->v, NULL);
            }
        }
    }
    return st;
}

static em_status adam_update(const em_optim_update *u, bool decoupled) {
    const em_adam_opts *a = u->hyper;
    bool done = false;
    em_status st = adam_fused(u, decoupled, &done);
    if (done || st != EM_OK) return st;
    if (em__graph_capturing(em_device_of(u->param)))
        return refuse_in_capture("the op-by-op update takes them from the host (the fused multi-tensor one reads them "
                                 "on the device: contiguous float32 parameters and states on a GPU)");
    em_tensor *m = u->state[ADAM_EXP_AVG], *v = u->state[ADAM_EXP_AVG_SQ], *p = u->param;
    em_tensor *g = a->maximize ? em_neg(u->grad) : u->grad;
    double skipped = 0; /* a scaler's skipped steps: as the fused kernels, count the steps taken */
    em_tensor *amp = em__optim_amp(u->optimizer);
    if (amp) {
        bool skip;
        if ((st = amp_host_check(amp, &skip, &skipped)) != EM_OK || skip) return st;
    }
    double wd = adam_decay(a, p);
    if (wd != 0) {
        if (decoupled)
            st = em_mul_scalar_(p, 1.0 - u->lr * wd);
        else
            g = em_add(g, em_mul_scalar(p, wd));
    }
    if (st == EM_OK) st = em_mul_scalar_(m, a->beta1);
    if (st == EM_OK) st = em_add_(m, g, 1.0 - a->beta1);
    if (st == EM_OK) st = em_mul_scalar_(v, a->beta2);
    if (st == EM_OK) st = em_add_(v, em_mul(g, g), 1.0 - a->beta2);
    if (st != EM_OK) return st;
    double bc1 = 1.0 - pow(a->beta1, (double)u->step - skipped);
    double bc2 = 1.0 - pow(a->beta2, (double)u->step - skipped);
    em_tensor *second = v;
    if (a->amsgrad) {
        em_tensor *mx = u->state[ADAM_MAX_EXP_AVG_SQ];
        if ((st = em_copy_(mx, em_maximum(mx, v))) != EM_OK) return st;
        second = mx;
    }
    em_tensor *denom = em_add_scalar(em_div_scalar(em_sqrt(second), sqrt(bc2)), a->eps);
    em_tensor *upd = em_div(m, denom);
    if (!upd) return em_last_status();
    return em_add_(p, upd, -(u->lr / bc1));
}

static em_status adam_step(const em_optim_update *u) { return adam_update(u, false); }
static em_status adamw_step(const em_optim_update *u) { return adam_update(u, true); }

const em_optimizer_ops em__adam_ops = {
    .name = "adam", .nstate = 3, .state_names = adam_state_names, .hyper_size = sizeof(em_adam_opts),
    .check = adam_check, .uses_state = adam_uses_state, .step = adam_step, .momentum = adam_momentum,
};
const em_optimizer_ops em__adamw_ops = {
    .name = "adamw", .nstate = 3, .state_names = adam_state_names, .hyper_size = sizeof(em_adam_opts),
    .check = adam_check, .uses_state = adam_uses_state, .step = adamw_step, .momentum = adam_momentum,
};

em_optimizer *em_adam_ex(em_module *m, em_adam_opts a) { return em_optimizer_new(m, &em__adam_ops, &a, a.lr); }
em_optimizer *em_adam(em_module *m, double lr) { return em_adam_ex(m, em_adam_defaults(lr)); }
em_optimizer *em_adamw_ex(em_module *m, em_adam_opts a) { return em_optimizer_new(m, &em__adamw_ops, &a, a.lr); }
em_optimizer *em_adamw(em_module *m, double lr) { return em_adamw_ex(m, em_adamw_defaults(lr)); }

bool em__optim_reads_scaler(const em_optimizer_ops *ops) {
    return ops == &em__sgd_ops || ops == &em__adam_ops || ops == &em__adamw_ops;
}
