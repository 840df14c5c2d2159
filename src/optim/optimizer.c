/* The optimizer machinery every optimizer runs on, the built-in ones (sgd_adam.c,
 * adaptive.c) and the user's (em_optimizer_new): the parameters and their states, made
 * before any update and moved with the module, em_zero_grad, em_step, and what checkpoints
 * and schedules read and restore. An optimizer's own part is an em_optimizer_ops table
 * (include/ember/optim.h): its state names and its one-parameter update. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include <ember/parallel.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"
#include "optim_internal.h"

typedef struct opt_param {
    em_tensor *p;                         /* retained */
    em_tensor *state[EM__OPTIM_MAX_STATE]; /* retained, made before the first update that uses them */
    double scalar[EM__OPTIM_MAX_SCALAR];  /* the ops' per-parameter numbers */
    int64_t step;                         /* this parameter's number of updates */
    bool stepped;                         /* updated by the last em_step */
    bool in_graph;                        /* updated by the em_step a graph recorded */
} opt_param;

struct em_optimizer {
    const em_optimizer_ops *ops;
    void *hyper;                 /* owned copy of the options (hyper_size bytes), or NULL */
    double lr;
    double initial_lr;           /* PyTorch's group["initial_lr"]: the schedules' base; NaN until set */
    opt_param *ps;
    int n;
    em_module *module;           /* weak: cleared when the module is freed */
    int64_t steps;
    em_lr_scheduler *sched;      /* the attached scheduler (weak unless sched_owned), or NULL */
    bool sched_owned;            /* made by em_optim_set_schedule: freed with the optimizer */
    bool unfused;                /* always take the op-by-op path (tests, benchmarks) */
    int64_t fused_updates;       /* parameter updates done by a fused kernel */
    em_tensor *amp;              /* borrowed during a scaler's step (grad_scaler.c), else NULL */
    em__optim_batch batch;       /* Adam/AdamW's multi-tensor updates during em_step */
    int current;                 /* the parameter em_step is updating */
    em__optim_device_schedule dsched; /* Adam/AdamW's step count on the device (sgd_adam.c) */
    /* graphs: whether a captured em_step is held (em_optim_step_replayed counts its replays),
     * whether it read the device schedule, and the counts to restore if its capture fails */
    bool graph_recorded, graph_dsched;
    int64_t *undo_steps, undo_total, undo_dsched_steps;
};

/* Move every state tensor of opt to its parameter's device and dtype: the module's tensors
 * were moved (em_module_to), or are about to be stepped. */
static em_status sync_state(em_optimizer *opt) {
    for (int i = 0; i < opt->n; i++) {
        em_tensor *p = opt->ps[i].p;
        for (int k = 0; k < opt->ops->nstate; k++) {
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

/* The table's own promises, checked once: a caller's mistake here would otherwise surface
 * as a crash in the middle of a step. */
static em_status check_ops(const em_optimizer_ops *ops, const void *hyper) {
    const char *op = "em_optimizer_new";
    if (!ops) return em_error(EM_ERR_ARGUMENT, "%s: ops is NULL", op);
    if (!ops->name || !ops->name[0] || !ops->step)
        return em_error(EM_ERR_ARGUMENT, "%s: the ops table needs a name and a step function (got %s%s%s)", op,
                        ops->name && ops->name[0] ? "name '" : "no name", ops->name && ops->name[0] ? ops->name : "",
                        ops->step ? "'" : ops->name && ops->name[0] ? "', no step" : ", no step");
    if (ops->nstate < 0 || ops->nstate > EM__OPTIM_MAX_STATE || ops->nscalar < 0 || ops->nscalar > EM__OPTIM_MAX_SCALAR)
        return em_error(EM_ERR_ARGUMENT, "%s: '%s' declares %d states and %d scalars: expected 0 to %d of each", op,
                        ops->name, ops->nstate, ops->nscalar, EM__OPTIM_MAX_STATE);
    /* names become checkpoint keys "optimizer.<param>.<name>": short, and distinct */
    for (int k = 0; k < ops->nstate + ops->nscalar; k++) {
        bool state = k < ops->nstate;
        const char *const *names = state ? ops->state_names : ops->scalar_names;
        const char *name = names ? names[state ? k : k - ops->nstate] : NULL;
        bool dup = false;
        for (int j = 0; j < k && name && !dup; j++) {
            const char *other = j < ops->nstate ? ops->state_names[j] : ops->scalar_names[j - ops->nstate];
            dup = !strcmp(other, name);
        }
        if (!name || !name[0] || strlen(name) > EM__OPTIM_NAME_MAX || !strcmp(name, "step") || dup)
            return em_error(EM_ERR_ARGUMENT, "%s: '%s': %s %d's name is %s%s%s: expected 1 to %d characters, not "
                            "\"step\" (kept for every optimizer) and unlike the others", op, ops->name,
                            state ? "state" : "scalar", state ? k : k - ops->nstate, name ? "\"" : "",
                            name ? name : "NULL", name ? "\"" : "", EM__OPTIM_NAME_MAX);
    }
    if (ops->hyper_size > 0 && !hyper)
        return em_error(EM_ERR_ARGUMENT, "%s: '%s' takes %zu bytes of options, but hyper is NULL", op, ops->name,
                        ops->hyper_size);
    return ops->check ? ops->check(hyper) : EM_OK;
}

em_optimizer *em_optimizer_new(em_module *m, const em_optimizer_ops *ops, const void *hyper, double lr) {
    if (!(lr >= 0)) {   /* the options first, as PyTorch checks them before the parameters */
        em_error(EM_ERR_ARGUMENT, "Invalid learning rate: %g", lr);
        return NULL;
    }
    if (check_ops(ops, hyper) != EM_OK) return NULL;
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: module is NULL", ops->name);
        return NULL;
    }
    int count = em_module_parameters(m, NULL, 0);
    em_named_tensor *list = calloc((size_t)count + 1, sizeof *list);
    em_optimizer *o = calloc(1, sizeof *o);
    opt_param *ps = calloc((size_t)count + 1, sizeof *ps);
    void *h = ops->hyper_size ? malloc(ops->hyper_size) : NULL;
    if (!list || !o || !ps || (ops->hyper_size && !h)) {
        free(list), free(o), free(ps), free(h);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", ops->name);
        return NULL;
    }
    if (h) memcpy(h, hyper, ops->hyper_size);
    o->dsched.mode = -1;
    em_module_parameters(m, list, count);
    for (int i = 0; i < count; i++) {
        bool dup = false; /* a parameter shared by two layers is updated once */
        for (int j = 0; j < o->n && !dup; j++) dup = ps[j].p == list[i].tensor;
        if (dup) continue;
        opt_param *q = &ps[o->n++];
        q->p = em_retain(list[i].tensor);
        for (int k = 0; k < ops->nscalar; k++) q->scalar[k] = ops->scalar_init ? ops->scalar_init[k] : 0;
    }
    free(list);
    o->ops = ops;
    o->hyper = h;
    o->lr = lr;
    o->initial_lr = NAN;
    o->ps = ps;
    o->module = m;
    if (em__module_listen(m, &module_listener, o) != EM_OK) {
        o->module = NULL;
        em_optim_free(o);
        return NULL;
    }
    return o;
}

void em_optim_free(em_optimizer *opt) {
    if (!opt) return;
    if (opt->module) em__module_unlisten(opt->module, &module_listener, opt);
    if (opt->sched) {
        em_lr_scheduler *s = opt->sched;
        opt->sched = NULL;
        if (opt->sched_owned) em_lr_scheduler_free(s);
        else em__lr_scheduler_forget_optimizer(s);
    }
    for (int i = 0; i < opt->n; i++) {
        em_release(opt->ps[i].p);
        for (int k = 0; k < EM__OPTIM_MAX_STATE; k++) em_release(opt->ps[i].state[k]);
    }
    free(opt->ps);
    free(opt->batch.items);
    free(opt->batch.group);
    free(opt->batch.param);
    free(opt->batch.taken);
    em_release(opt->dsched.state);
    em_release(opt->dsched.consts);
    free(opt->undo_steps);
    free(opt->hyper);
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

static bool uses_state(const em_optimizer *o, int k) {
    return !o->ops->uses_state || o->ops->uses_state(o->hyper, k);
}

static em_optim_update update_of(em_optimizer *o, opt_param *q, em_tensor *g) {
    return (em_optim_update){.optimizer = o, .param = q->p, .grad = g, .state = q->state,
                             .scalars = q->scalar, .step = q->step, .lr = o->lr, .hyper = o->hyper};
}

/* The states of every parameter that has a gradient, made before any parameter changes:
 * running out of memory here leaves the optimizer as it was, not half-stepped (the fault
 * sweep, tests/test_fault_sweep.c). fresh[i] says that parameter i's were made here. */
static em_status prepare(em_optimizer *opt, bool *fresh, unsigned long seq) {
    bool *made = NULL;   /* [i * EM__OPTIM_MAX_STATE + k]: state k of parameter i made here */
    em_status st = EM_OK;
    for (int i = 0; i < opt->n && st == EM_OK; i++) {
        opt_param *q = &opt->ps[i];
        if (!em__grad_borrowed(q->p)) continue;
        for (int k = 0; k < opt->ops->nstate && st == EM_OK; k++) {
            if (q->state[k] || !uses_state(opt, k)) continue;   /* a checkpoint may have brought some */
            if (!made && !(made = calloc((size_t)opt->n * EM__OPTIM_MAX_STATE, sizeof *made))) {
                st = em_error(EM_ERR_OUT_OF_MEMORY, "em_step: out of host memory");
                break;
            }
            em_tensor *z = em_zeros_like(q->p);
            if (!z) {
                st = em_last_status();
                break;
            }
            q->state[k] = em_retain(z);
            made[i * EM__OPTIM_MAX_STATE + k] = true;
            fresh[i] = true;
        }
        if (st == EM_OK && fresh[i] && opt->ops->init_state) {
            em_optim_update u = update_of(opt, q, NULL);
            st = opt->ops->init_state(&u);
            if (st == EM_OK && em__error_seq() != seq) st = em_last_status();   /* a lost failure */
        }
    }
    if (st != EM_OK && made) {   /* undo: drop every state made here */
        for (int j = 0; j < opt->n * EM__OPTIM_MAX_STATE; j++) {
            if (!made[j]) continue;
            em_release(opt->ps[j / EM__OPTIM_MAX_STATE].state[j % EM__OPTIM_MAX_STATE]);
            opt->ps[j / EM__OPTIM_MAX_STATE].state[j % EM__OPTIM_MAX_STATE] = NULL;
        }
    }
    free(made);
    return st;
}

/* A loss scaler's step (grad_scaler.c) with an optimizer whose step cannot read the scaler's
 * flag on the device: read it here (this waits for the device) and skip the whole step on an
 * inf or NaN, as PyTorch's GradScaler.step skips optimizer.step(). */
static em_status scaler_says_skip(const em_optimizer *o, bool *skip) {
    float st[4] = {0};
    em_status r = em_copy_to_host(o->amp, st, sizeof st);
    *skip = st[2] != 0.0f;
    return r;
}

/* A failed capture of em_step: its work never ran, so its counts go back (em__graph_on_abort). */
static void undo_captured_step(void *ctx) {
    em_optimizer *opt = ctx;
    for (int i = 0; i < opt->n; i++) opt->ps[i].step = opt->undo_steps[i];
    opt->steps = opt->undo_total;
    opt->dsched.steps = opt->undo_dsched_steps;
    opt->graph_recorded = false;
}

/* Whether a graph is recording on a device of opt's parameters. */
static bool step_captured(const em_optimizer *opt) {
    for (int i = 0; i < opt->n; i++)
        if (em__graph_capturing(em_device_of(opt->ps[i].p))) return true;
    return false;
}

em_status em_step(em_optimizer *opt) {
    OPT_CHECK(opt, "em_step");
    em_status st = sync_state(opt); /* parameters may have moved behind our back */
    if (st != EM_OK) return st;
    bool capturing = step_captured(opt);
    if (capturing) {   /* the counts to restore if the recording is dropped */
        if (!opt->undo_steps && !(opt->undo_steps = calloc((size_t)opt->n + 1, sizeof *opt->undo_steps)))
            return em_error(EM_ERR_OUT_OF_MEMORY, "em_step: out of host memory");
        for (int i = 0; i < opt->n; i++) opt->undo_steps[i] = opt->ps[i].step;
        opt->undo_total = opt->steps;
        opt->undo_dsched_steps = opt->dsched.steps;
        if ((st = em__graph_on_abort(undo_captured_step, opt)) != EM_OK) return st;
    }
    for (int i = 0; i < opt->n; i++) opt->ps[i].stepped = false;
    opt->dsched.used = false;
    if (opt->amp && !em__optim_reads_scaler(opt->ops)) {
        bool skip = false;
        if ((st = scaler_says_skip(opt, &skip)) != EM_OK) return st;
        if (skip) {
            opt->steps++;
            return EM_OK;
        }
    }
    /* Adam/AdamW collect their updates (sgd_adam.c): room for all of them now, so that no
     * allocation can fail once states or parameters have changed */
    if ((opt->ops == &em__adam_ops || opt->ops == &em__adamw_ops) && opt->batch.cap < opt->n) {
        size_t n = (size_t)opt->n;
        em_adam_multi_item *items = realloc(opt->batch.items, sizeof *items * n);
        if (items) opt->batch.items = items;
        em_adam_multi_item *group = items ? realloc(opt->batch.group, sizeof *group * n) : NULL;
        if (group) opt->batch.group = group;
        int *param = group ? realloc(opt->batch.param, sizeof *param * n) : NULL;
        if (param) opt->batch.param = param;
        bool *taken = param ? realloc(opt->batch.taken, sizeof *taken * n) : NULL;
        if (taken) opt->batch.taken = taken;
        if (!taken) return em_error(EM_ERR_OUT_OF_MEMORY, "em_step: out of host memory");
        opt->batch.cap = opt->n;
    }
    unsigned long seq = em__error_seq();   /* errors raised from here on are the step's */
    bool *fresh = calloc((size_t)opt->n + 1, sizeof *fresh);
    if (!fresh) return em_error(EM_ERR_OUT_OF_MEMORY, "em_step: out of host memory");
    em_grad_mode mode = em_no_grad_begin();
    em_scope s = em_scope_begin();
    st = prepare(opt, fresh, seq);
    em_scope_end(s);
    opt->batch.n = 0;
    opt->batch.open = !opt->batch.per_tensor;
    for (int i = 0; i < opt->n && st == EM_OK; i++) {
        opt_param *q = &opt->ps[i];
        em_tensor *g = em__grad_borrowed(q->p);   /* not em_grad: registering it with the scope may fail */
        if (!g) continue;
        em_scope ps = em_scope_begin();
        opt->current = i;
        q->step++;
        em_optim_update u = update_of(opt, q, g);
        u.fresh = fresh[i];
        st = opt->ops->step(&u);
        if (st == EM_OK && em__error_seq() != seq) st = em_last_status();   /* a step that lost a failure */
        if (st != EM_OK) q->step--;
        q->stepped = st == EM_OK;
        em_scope_end(ps);
    }
    opt->batch.open = false;
    if (st == EM_OK && opt->batch.n > 0) {
        st = em__optim_flush_batch(opt);
        if (st == EM_OK && em__error_seq() != seq) st = em_last_status();
    }
    if (st != EM_OK) /* the collected updates did not all run: their steps do not count */
        for (int j = 0; j < opt->batch.n; j++) {
            opt->ps[opt->batch.param[j]].step--;
            opt->ps[opt->batch.param[j]].stepped = false;
        }
    opt->batch.n = 0;
    em_no_grad_end(mode);
    free(fresh);
    if (st == EM_OK) opt->steps++;
    if (st == EM_OK && capturing) {   /* what each replay of the recording will do */
        for (int i = 0; i < opt->n; i++) opt->ps[i].in_graph = opt->ps[i].stepped;
        opt->graph_recorded = true;
        opt->graph_dsched = opt->dsched.used;
    }
    return st;
}

em_status em_optim_step_replayed(em_optimizer *opt) {
    OPT_CHECK(opt, "em_optim_step_replayed");
    if (!opt->graph_recorded)
        return em_error(EM_ERR_ARGUMENT, "em_optim_step_replayed: no em_step of this optimizer was recorded by a graph "
                        "capture that succeeded, so no replay stepped it");
    for (int i = 0; i < opt->n; i++)
        if (opt->ps[i].in_graph) opt->ps[i].step++;
    opt->steps++;
    if (opt->graph_dsched) opt->dsched.steps++;   /* the replay advanced the device's count */
    return EM_OK;
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
    return em__optim_device_lr(opt);
}

int64_t em_optim_steps(const em_optimizer *opt) { return opt ? opt->steps : 0; }

const char *em_optim_name(const em_optimizer *opt) { return opt ? opt->ops->name : NULL; }

void *em_optim_hyper(em_optimizer *opt) {
    if (!opt) {
        em_error(EM_ERR_ARGUMENT, "em_optim_hyper: optimizer is NULL");
        return NULL;
    }
    return opt->hyper;
}

static opt_param *param_of(const em_optimizer *opt, const em_tensor *p) {
    for (int i = 0; i < opt->n; i++)
        if (opt->ps[i].p == p) return &opt->ps[i];
    return NULL;
}

/* "a, b and c": the names of an optimizer's states or scalars, for messages. */
static void list_names(char *out, size_t cap, const char *const *names, int n, const char *first) {
    size_t len = 0;
    out[0] = '\0';
    int total = n + (first != NULL);
    for (int k = 0; k < total && len < cap; k++) {
        const char *name = first ? (k == 0 ? first : names[k - 1]) : names[k];
        const char *sep = k == 0 ? "" : k == total - 1 ? " and " : ", ";
        int w = snprintf(out + len, cap - len, "%s%s", sep, name);
        if (w < 0) break;
        len += (size_t)w;
    }
    if (total == 0) snprintf(out, cap, "none");
}

em_tensor *em_optim_state(em_optimizer *opt, em_tensor *p, const char *name) {
    if (!opt || !p || !name) {
        if (!em_failed())
            em_error(EM_ERR_ARGUMENT, "em_optim_state: argument '%s' is NULL", !opt ? "opt" : !p ? "p" : "name");
        return NULL;
    }
    int k = -1;
    for (int j = 0; j < opt->ops->nstate && k < 0; j++)
        if (!strcmp(opt->ops->state_names[j], name)) k = j;
    if (k < 0) {
        char names[256];
        list_names(names, sizeof names, opt->ops->state_names, opt->ops->nstate, NULL);
        em_error(EM_ERR_ARGUMENT, "em_optim_state: %s keeps no state \"%s\" (its states: %s)", opt->ops->name, name,
                 names);
        return NULL;
    }
    opt_param *q = param_of(opt, p);
    if (!q) {
        em_error(EM_ERR_ARGUMENT, "em_optim_state: the tensor is not a parameter of this optimizer");
        return NULL;
    }
    return q->state[k] ? em__scope_return(em_scope_begin(), q->state[k]) : NULL;
}

double em_optim_scalar(const em_optimizer *opt, em_tensor *p, const char *name) {
    if (!opt || !p || !name) {
        em_error(EM_ERR_ARGUMENT, "em_optim_scalar: argument '%s' is NULL", !opt ? "opt" : !p ? "p" : "name");
        return NAN;
    }
    opt_param *q = param_of(opt, p);
    if (!q) {
        em_error(EM_ERR_ARGUMENT, "em_optim_scalar: the tensor is not a parameter of this optimizer");
        return NAN;
    }
    if (!strcmp(name, "step")) return (double)q->step;
    for (int k = 0; k < opt->ops->nscalar; k++)
        if (!strcmp(opt->ops->scalar_names[k], name)) return q->scalar[k];
    char names[256];
    list_names(names, sizeof names, opt->ops->scalar_names, opt->ops->nscalar, "step");
    em_error(EM_ERR_ARGUMENT, "em_optim_scalar: %s keeps no scalar \"%s\" (its scalars: %s)", opt->ops->name, name,
             names);
    return NAN;
}

const em_optimizer_ops *em_optim_ops(const em_optimizer *opt) {
    if (!opt) em_error(EM_ERR_ARGUMENT, "em_optim_ops: optimizer is NULL");
    return opt ? opt->ops : NULL;
}

em_status em_optim_set_state(em_optimizer *opt, em_tensor *p, const char *name, em_tensor *value) {
    if (!opt || !p || !name || !value)
        return em__error_unless_pending(EM_ERR_ARGUMENT, "em_optim_set_state: argument '%s' is NULL",
                                        !opt ? "opt" : !p ? "p" : !name ? "name" : "value");
    int k = -1;
    for (int j = 0; j < opt->ops->nstate && k < 0; j++)
        if (!strcmp(opt->ops->state_names[j], name)) k = j;
    if (k < 0) {
        char names[256];
        list_names(names, sizeof names, opt->ops->state_names, opt->ops->nstate, NULL);
        return em_error(EM_ERR_ARGUMENT, "em_optim_set_state: %s keeps no state \"%s\" (its states: %s)", opt->ops->name,
                        name, names);
    }
    opt_param *q = param_of(opt, p);
    if (!q) return em_error(EM_ERR_ARGUMENT, "em_optim_set_state: the tensor is not a parameter of this optimizer");
    if (em_numel(value) != em_numel(p))
        return em_error(EM_ERR_ARGUMENT, "em_optim_set_state: state \"%s\" needs %lld elements (the parameter's), got %lld",
                        name, (long long)em_numel(p), (long long)em_numel(value));
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    em_status st = EM_OK;
    if (!q->state[k]) {
        em_tensor *z = em_empty_like(p);
        if (!z) st = em_last_status();
        else q->state[k] = em_retain(z);
    }
    if (st == EM_OK) st = em_copy_(q->state[k], em_reshape(value, em_shape_of(p)));
    em_no_grad_end(mode);
    em_scope_end(s);
    return st;
}

em_status em_optim_set_scalar(em_optimizer *opt, em_tensor *p, const char *name, double value) {
    if (!opt || !p || !name)
        return em__error_unless_pending(EM_ERR_ARGUMENT, "em_optim_set_scalar: argument '%s' is NULL",
                                        !opt ? "opt" : !p ? "p" : "name");
    opt_param *q = param_of(opt, p);
    if (!q) return em_error(EM_ERR_ARGUMENT, "em_optim_set_scalar: the tensor is not a parameter of this optimizer");
    if (!strcmp(name, "step")) {
        if (!(value >= 0 && value <= 9e15 && value == floor(value)))
            return em_error(EM_ERR_ARGUMENT, "em_optim_set_scalar: \"step\" must be a whole number >= 0, got %g", value);
        q->step = (int64_t)value;
        return EM_OK;
    }
    for (int k = 0; k < opt->ops->nscalar; k++)
        if (!strcmp(opt->ops->scalar_names[k], name)) {
            q->scalar[k] = value;
            return EM_OK;
        }
    char names[256];
    list_names(names, sizeof names, opt->ops->scalar_names, opt->ops->nscalar, "step");
    return em_error(EM_ERR_ARGUMENT, "em_optim_set_scalar: %s keeps no scalar \"%s\" (its scalars: %s)", opt->ops->name,
                    name, names);
}

em_status em_optim_set_steps(em_optimizer *opt, int64_t steps) {
    OPT_CHECK(opt, "em_optim_set_steps");
    if (steps < 0 || steps > INT64_C(1) << 53)   /* counted on by every step: room left, as for a "step" scalar */
        return em_error(EM_ERR_ARGUMENT, "em_optim_set_steps: expected 0 <= steps <= 2^53, got %lld", (long long)steps);
    opt->steps = steps;
    return EM_OK;
}

/* ---- for the built-in steps (optim_internal.h) ---- */

void em__optim_set_fused(em_optimizer *opt, bool fused) {
    if (opt) opt->unfused = !fused;
}
bool em__optim_fused_allowed(const em_optimizer *opt) { return !opt->unfused; }
void em__optim_count_fused(em_optimizer *opt) { opt->fused_updates++; }
em__optim_batch *em__optim_batch_of(em_optimizer *opt) { return &opt->batch; }
int em__optim_current_param(const em_optimizer *opt) { return opt->current; }
int64_t em__optim_fused_updates(const em_optimizer *opt) { return opt ? opt->fused_updates : 0; }
void em__optim_set_amp(em_optimizer *opt, em_tensor *state) {
    if (opt) opt->amp = state;
}
em_tensor *em__optim_amp(const em_optimizer *opt) { return opt->amp; }
em__optim_device_schedule *em__optim_device_schedule_of(em_optimizer *opt) { return &opt->dsched; }

/* ---- what checkpoints and schedules see (checkpoint.c, lr_scheduler.c) ---- */

const em_optimizer_ops *em__optim_ops(const em_optimizer *o) { return o->ops; }
bool em__optim_uses_state(const em_optimizer *o, int k) { return uses_state(o, k); }
int em__optim_nparams(const em_optimizer *o) { return o->n; }
em_tensor *em__optim_param(const em_optimizer *o, int i) { return o->ps[i].p; }
em_tensor **em__optim_state_slot(em_optimizer *o, int i, int k) { return &o->ps[i].state[k]; }
double *em__optim_scalar_slot(em_optimizer *o, int i, int k) { return &o->ps[i].scalar[k]; }
int64_t *em__optim_param_step(em_optimizer *o, int i) { return &o->ps[i].step; }
int64_t *em__optim_step_count(em_optimizer *o) { return &o->steps; }
double *em__optim_initial_lr(em_optimizer *o) { return &o->initial_lr; }
double *em__optim_momentum(em_optimizer *o) { return o->ops->momentum ? o->ops->momentum(o->hyper) : NULL; }
em_lr_scheduler *em__optim_scheduler(const em_optimizer *o) { return o->sched; }

em_status em__optim_attach_scheduler(em_optimizer *o, em_lr_scheduler *s, bool owned) {
    if (o->sched && !o->sched_owned)
        return em_error(EM_ERR_ARGUMENT, "em_lr_scheduler_new: the optimizer has a scheduler already (one per "
                        "optimizer: free it first with em_lr_scheduler_free)");
    if (o->sched) {   /* em_optim_set_schedule's: replaced */
        em_lr_scheduler *old = o->sched;
        o->sched = NULL;
        em_lr_scheduler_free(old);
    }
    o->sched = s;
    o->sched_owned = owned;
    return EM_OK;
}

void em__optim_detach_scheduler(em_optimizer *o, const em_lr_scheduler *s) {
    if (o->sched == s) o->sched = NULL, o->sched_owned = false;
}
