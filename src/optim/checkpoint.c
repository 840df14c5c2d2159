/* Training checkpoints: the model's state dict, the optimizer's state and the caller's
 * metadata in one safetensors file, written atomically (see include/ember/optim.h). */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/io.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"
#include "optim_internal.h"
#include <ember/parse.h>

#define META_MAX 64          /* ours (SCHED_META + 5, and per parameter its step and scalars) are counted separately */
#define SCHED_META 7         /* the scheduler's: kind, last_epoch, base_lr, last_lr, best, two counters */
#define NAME_MAX_LEN 512

/* A growable list of owned names and borrowed tensors. */
typedef struct list {
    char **names;
    em_tensor **ts;
    int n, cap;
} list;

static bool list_add(list *l, const char *name, em_tensor *t) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **nn = realloc(l->names, (size_t)cap * sizeof *nn);
        if (nn) l->names = nn;
        em_tensor **nt = realloc(l->ts, (size_t)cap * sizeof *nt);
        if (nt) l->ts = nt;
        if (!nn || !nt) return false;
        l->cap = cap;
    }
    size_t len = strlen(name) + 1;
    if (!(l->names[l->n] = malloc(len))) return false;
    memcpy(l->names[l->n], name, len);
    l->ts[l->n++] = t;
    return true;
}

static void list_free(list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->ts);
}

/* The module parameter name of the optimizer's i-th parameter, or NULL (not the module's). */
static const char *param_name(em_named_tensor *params, int np, em_tensor *p) {
    for (int j = 0; j < np; j++)
        if (params[j].tensor == p) return params[j].name;
    return NULL;
}

/* The file keys the optimizer's state by the module's parameter names, so every parameter the
 * optimizer steps must be one of the module's: the state of any other tensor would be lost on
 * saving, and a file saved with another model's optimizer would not load back. */
static em_status check_optimizer_belongs(const char *op, em_named_tensor *params, int np, em_optimizer *opt) {
    int nopt = em__optim_nparams(opt);
    for (int i = 0; i < nopt; i++) {
        em_tensor *p = em__optim_param(opt, i);
        if (param_name(params, np, p)) continue;
        em_shape s = em_shape_of(p);
        char shape[160];
        int n = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < s.ndim && n < (int)sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, d ? ", %lld" : "%lld", (long long)s.d[d]);
        if (n < (int)sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
        return em_error(EM_ERR_ARGUMENT,
                        "%s: the optimizer's parameter %d of %d (shape %s) is not a parameter of the module: "
                        "expected the optimizer made for this module", op, i, nopt, shape);
    }
    return EM_OK;
}

static em_named_tensor *module_params(em_module *m, int *np) {
    *np = em_module_parameters(m, NULL, 0);
    em_named_tensor *ps = calloc((size_t)*np + 1, sizeof *ps);
    if (ps) em_module_parameters(m, ps, *np);
    return ps;
}

em_status em_checkpoint_save(const char *path, em_module *m, em_optimizer *opt,
                             const char *const *keys, const char *const *values, int nmeta) {
    const char *op = "em_checkpoint_save";
    if (!path || !m)
        return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: path and module must not be NULL", op);
    if (nmeta < 0 || nmeta > META_MAX || (nmeta > 0 && (!keys || !values)))
        return em_error(EM_ERR_ARGUMENT, "%s: expected 0..%d metadata pairs, got %d%s", op, META_MAX, nmeta,
                        nmeta > 0 && (!keys || !values) ? " with a NULL array" : "");
    for (int i = 0; i < nmeta; i++)
        if (!keys[i] || !values[i] || !strcmp(keys[i], "format") || !strncmp(keys[i], "optimizer", 9))
            return em_error(EM_ERR_ARGUMENT, "%s: metadata key %d is NULL or reserved ('format', 'optimizer...')", op, i);

    list l = {0};
    int np = 0, nb = em_module_buffers(m, NULL, 0);
    em_named_tensor *params = module_params(m, &np);
    em_named_tensor *bufs = calloc((size_t)nb + 1, sizeof *bufs);
    int nopt = opt ? em__optim_nparams(opt) : 0;
    const em_optimizer_ops *ops = opt ? em__optim_ops(opt) : NULL;
    int ours = 5 + SCHED_META + nopt * (1 + (ops ? ops->nscalar : 0));
    int cap_meta = nmeta + ours;
    const char **mk = calloc((size_t)cap_meta, sizeof *mk), **mv = calloc((size_t)cap_meta, sizeof *mv);
    char *strings = calloc((size_t)ours, 2 * NAME_MAX_LEN);   /* our metadata's text */
    em_status st = EM_OK;
    bool ok = params && bufs && mk && mv && strings;
    if (ok) em_module_buffers(m, bufs, nb);
    if (ok && opt && (st = check_optimizer_belongs(op, params, np, opt)) != EM_OK) ok = false;
    for (int i = 0; ok && i < np; i++) ok = list_add(&l, params[i].name, params[i].tensor);
    for (int i = 0; ok && i < nb; i++) ok = list_add(&l, bufs[i].name, bufs[i].tensor);
    int k = 0;
    for (; ok && k < nmeta; k++) mk[k] = keys[k], mv[k] = values[k];
    char *text = strings;
#define PUT(key_fmt, key_arg, val_fmt, val_arg)                                   \
    do {                                                                          \
        snprintf(text, NAME_MAX_LEN, key_fmt, key_arg);                           \
        snprintf(text + NAME_MAX_LEN, NAME_MAX_LEN, val_fmt, val_arg);            \
        mk[k] = text, mv[k++] = text + NAME_MAX_LEN, text += 2 * NAME_MAX_LEN;    \
    } while (0)
    if (ok) PUT("%s", "format", "%s", EM__CHECKPOINT_FORMAT);
    if (ok && opt) {
        PUT("%s", "optimizer", "%s", ops->name);
        PUT("%s", "optimizer.steps", "%" PRId64, *em__optim_step_count(opt));
        PUT("%s", "optimizer.lr", "%.17g", em_optim_lr(opt));
        double initial_lr = *em__optim_initial_lr(opt);
        if (!isnan(initial_lr)) PUT("%s", "optimizer.initial_lr", "%.17g", initial_lr);
        em_lr_scheduler *sched = em__optim_scheduler(opt);
        em_lr_scheduler_state ss;
        if (sched && em_lr_scheduler_state_dict(sched, &ss) == EM_OK) {
            PUT("%s", "optimizer.scheduler", "%s", em__lr_kind_name(ss.kind));
            PUT("%s", "optimizer.scheduler.last_epoch", "%" PRId64, ss.last_epoch);
            PUT("%s", "optimizer.scheduler.base_lr", "%.17g", ss.base_lr);
            PUT("%s", "optimizer.scheduler.last_lr", "%.17g", ss.last_lr);
            PUT("%s", "optimizer.scheduler.best", "%.17g", ss.best);   /* "inf" / "-inf" before any metric */
            PUT("%s", "optimizer.scheduler.num_bad_epochs", "%" PRId64, ss.num_bad_epochs);
            PUT("%s", "optimizer.scheduler.cooldown_counter", "%" PRId64, ss.cooldown_counter);
        }
        for (int i = 0; ok && i < nopt; i++) {
            const char *pn = param_name(params, np, em__optim_param(opt, i));
            if (strlen(pn) > NAME_MAX_LEN - 48) {
                st = em_error(EM_ERR_ARGUMENT, "%s: parameter name too long: '%.40s...'", op, pn);
                ok = false;
                break;
            }
            PUT("optimizer.%s.step", pn, "%" PRId64, *em__optim_param_step(opt, i));
            for (int c = 0; c < ops->nscalar; c++) {
                char key[NAME_MAX_LEN];
                snprintf(key, sizeof key, "optimizer.%s.%s", pn, ops->scalar_names[c]);
                PUT("%s", key, "%.17g", *em__optim_scalar_slot(opt, i, c));
            }
            for (int s = 0; ok && s < ops->nstate; s++) {
                em_tensor *t = *em__optim_state_slot(opt, i, s);
                char name[NAME_MAX_LEN];
                snprintf(name, sizeof name, "optimizer.%s.%s", pn, ops->state_names[s]);
                if (t && em__optim_uses_state(opt, s)) ok = list_add(&l, name, t);
            }
        }
    }
#undef PUT
    if (!ok && st == EM_OK) st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (st == EM_OK)
        st = em_safetensors_save_meta(path, (const char *const *)l.names, l.ts, l.n, mk, mv, k);
    list_free(&l);
    free(params);
    free(bufs);
    free(mk);
    free(mv);
    free(strings);
    return st;
}

static bool same_shape(em_tensor *a, em_tensor *b) {
    em_shape x = em_shape_of(a), y = em_shape_of(b);
    if (x.ndim != y.ndim) return false;
    for (int d = 0; d < x.ndim; d++)
        if (x.d[d] != y.d[d]) return false;
    return true;
}

/* A count from the file's metadata (steps, a schedule's position): a whole number from 0 to
 * 2^53, refused past it, not saturated. Each is counted on after the load, and the updates
 * raise betas to it as a double: 2^53 leaves room for both, as em_optim_set_scalar's "step". */
static bool parse_i64(const char *s, int64_t *out) {
    return em_parse_i64(s, 0, INT64_C(1) << 53, out) == EM_NUM_OK;
}

/* What the file holds of the optimizer, read and checked before anything changes. */
typedef struct opt_read {
    em_tensor **fresh;         /* [i * nstate + k]: state k of parameter i on its device, or NULL */
    int64_t *steps;            /* [i] */
    double *scalars;           /* [i * nscalar + k] */
    int64_t total;
    double lr, initial_lr;     /* initial_lr NaN: not in the file */
    bool has_sched;
    em_lr_scheduler_state sched;
} opt_read;

/* A number from the file's metadata: finite (or +-inf where inf_ok), within [lo, hi]. */
static bool parse_f64(const char *s, double lo, double hi, bool inf_ok, double *out) {
    if (inf_ok && s && (!strcmp(s, "inf") || !strcmp(s, "-inf"))) {
        *out = s[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    return em_parse_f64(s, lo, hi, out) == EM_NUM_OK;
}

/* The attached scheduler's state: its kind must be the file's, and the file must hold one. */
static em_status read_scheduler(const em_safetensors *file, const char *path, em_optimizer *opt, opt_read *r) {
    const char *op = "em_checkpoint_load";
    em_lr_scheduler *sched = em__optim_scheduler(opt);
    const char *kind = em_safetensors_metadata(file, "optimizer.scheduler");
    if (!sched) return EM_OK;   /* a schedule saved but none attached: the caller may read the metadata */
    if (!kind)
        return em_error(EM_ERR_ARGUMENT, "%s: %s holds no scheduler state (saved without one), but the optimizer has "
                        "a scheduler: free it before loading, or make it after with its position (last_epoch)", op, path);
    r->has_sched = true;
    em_lr_scheduler_state *ss = &r->sched;
    if (!em__lr_kind_parse(kind, &ss->kind))
        return em_error(EM_ERR_FORMAT, "%s: %s: unknown scheduler kind '%s'", op, path, kind);
    if (!parse_i64(em_safetensors_metadata(file, "optimizer.scheduler.last_epoch"), &ss->last_epoch) ||
        !parse_f64(em_safetensors_metadata(file, "optimizer.scheduler.base_lr"), 0, DBL_MAX, false, &ss->base_lr) ||
        !parse_f64(em_safetensors_metadata(file, "optimizer.scheduler.last_lr"), 0, DBL_MAX, false, &ss->last_lr) ||
        !parse_f64(em_safetensors_metadata(file, "optimizer.scheduler.best"), -DBL_MAX, DBL_MAX, true, &ss->best) ||
        !parse_i64(em_safetensors_metadata(file, "optimizer.scheduler.num_bad_epochs"), &ss->num_bad_epochs) ||
        !parse_i64(em_safetensors_metadata(file, "optimizer.scheduler.cooldown_counter"), &ss->cooldown_counter))
        return em_error(EM_ERR_FORMAT, "%s: %s: bad or missing 'optimizer.scheduler.*' metadata", op, path);
    return em__lr_scheduler_check_state(sched, ss, op, path);
}

/* Reads the optimizer's part of the file into fresh tensors (on each parameter's device and
 * dtype), step counts, scalars and the scheduler's state, changing nothing in opt. */
static em_status read_optimizer(const em_safetensors *file, const char *path, em_module *m, em_optimizer *opt,
                                opt_read *r) {
    const char *op = "em_checkpoint_load";
    const em_optimizer_ops *ops = em__optim_ops(opt);
    const char *kind = em_safetensors_metadata(file, "optimizer");
    if (!kind)
        return em_error(EM_ERR_FORMAT, "%s: %s holds no optimizer state (saved without an optimizer?)", op, path);
    if (strcmp(kind, ops->name))
        return em_error(EM_ERR_ARGUMENT, "%s: %s holds %s state, but the optimizer is %s", op, path, kind, ops->name);
    const char *lr_text = em_safetensors_metadata(file, "optimizer.lr");
    if (!parse_i64(em_safetensors_metadata(file, "optimizer.steps"), &r->total) ||
        em_parse_f64(lr_text, 0, DBL_MAX, &r->lr) != EM_NUM_OK)
        return em_error(EM_ERR_FORMAT, "%s: %s: bad or missing 'optimizer.steps' / 'optimizer.lr' metadata", op, path);
    const char *initial = em_safetensors_metadata(file, "optimizer.initial_lr");
    r->initial_lr = NAN;
    if (initial && !parse_f64(initial, 0, DBL_MAX, false, &r->initial_lr))
        return em_error(EM_ERR_FORMAT, "%s: %s: bad metadata 'optimizer.initial_lr' ('%s')", op, path, initial);
    if (read_scheduler(file, path, opt, r) != EM_OK) return em_last_status();
    int np = 0;
    em_named_tensor *params = module_params(m, &np);
    if (!params) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (check_optimizer_belongs(op, params, np, opt) != EM_OK) {
        free(params);
        return em_last_status();
    }
    int ns = ops->nstate, nc = ops->nscalar, nopt = em__optim_nparams(opt);
    em_status st = EM_OK;
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < nopt && st == EM_OK; i++) {
        em_tensor *p = em__optim_param(opt, i);
        const char *pn = param_name(params, np, p);
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "optimizer.%s.step", pn);
        if (!parse_i64(em_safetensors_metadata(file, name), &r->steps[i])) {
            st = em_error(EM_ERR_FORMAT, "%s: %s: missing or bad metadata '%s'", op, path, name);
            break;
        }
        for (int c = 0; c < nc && st == EM_OK; c++) {
            snprintf(name, sizeof name, "optimizer.%s.%s", pn, ops->scalar_names[c]);
            if (!parse_f64(em_safetensors_metadata(file, name), -DBL_MAX, DBL_MAX, false, &r->scalars[i * nc + c]))
                st = em_error(EM_ERR_FORMAT, "%s: %s: missing or bad metadata '%s'", op, path, name);
        }
        for (int s = 0; s < ns && st == EM_OK; s++) {
            if (!em__optim_uses_state(opt, s)) continue;
            snprintf(name, sizeof name, "optimizer.%s.%s", pn, ops->state_names[s]);
            bool present = false;
            for (int k = 0; k < em_safetensors_count(file) && !present; k++)
                present = !strcmp(em_safetensors_name(file, k), name);
            if (!present) continue;   /* state not created yet when saved (no step taken) */
            em_scope sc = em_scope_begin();
            em_tensor *t = em_safetensors_get(file, name);
            if (t && !same_shape(t, p))
                st = em_error(EM_ERR_FORMAT, "%s: %s: '%s' has a shape unlike its parameter's", op, path, name);
            else if (t) {
                em_tensor *c = em_clone(em_to_dtype(em_to(t, em_device_of(p)), em_dtype_of(p)));
                if (c) r->fresh[i * ns + s] = em_retain(c);
                else st = em_last_status();
            } else
                st = em_last_status();
            em_scope_end(sc);
        }
    }
    em_no_grad_end(g);
    free(params);
    return st;
}

em_status em_checkpoint_load(const char *path, em_module *m, em_optimizer *opt, em_safetensors **meta) {
    if (meta) *meta = NULL;
    if (!path || !m)
        return em_failed() ? em_last_status()
                           : em_error(EM_ERR_ARGUMENT, "em_checkpoint_load: path and module must not be NULL");
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!file) return em_last_status();
    em_status st = em_checkpoint_load_safetensors(file, m, opt);
    if (st == EM_OK && meta) *meta = file;
    else em_safetensors_free(file);
    return st;
}

em_status em_checkpoint_load_safetensors(const em_safetensors *file, em_module *m, em_optimizer *opt) {
    const char *op = "em_checkpoint_load";
    if (!file || !m)
        return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: file and module must not be NULL", op);
    const char *path = em_safetensors_path(file);
    const char *format = em_safetensors_metadata(file, "format");
    em_status st = EM_OK;
    if (!format || strcmp(format, EM__CHECKPOINT_FORMAT))
        st = em_error(EM_ERR_FORMAT, "%s: %s is not an Ember checkpoint (metadata 'format' is %s%s%s, expected '%s')",
                      op, path, format ? "'" : "", format ? format : "missing", format ? "'" : "", EM__CHECKPOINT_FORMAT);
    const em_optimizer_ops *ops = opt ? em__optim_ops(opt) : NULL;
    int nopt = opt ? em__optim_nparams(opt) : 0, ns = ops ? ops->nstate : 0, nc = ops ? ops->nscalar : 0;
    opt_read r = {.fresh = calloc((size_t)(nopt * ns) + 1, sizeof *r.fresh),
                  .steps = calloc((size_t)nopt + 1, sizeof *r.steps),
                  .scalars = calloc((size_t)(nopt * nc) + 1, sizeof *r.scalars)};
    if (st == EM_OK && (!r.fresh || !r.steps || !r.scalars))
        st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (st == EM_OK && opt) st = read_optimizer(file, path, m, opt, &r);
    /* the model last: em__module_load_file checks everything before it copies */
    if (st == EM_OK) st = em__module_load_file(m, file, path);
    if (st == EM_OK && opt) {   /* nothing below can fail */
        for (int i = 0; i < nopt; i++) {
            for (int s = 0; s < ns; s++) {
                em_tensor **slot = em__optim_state_slot(opt, i, s);
                em_release(*slot);
                *slot = r.fresh[i * ns + s];
                r.fresh[i * ns + s] = NULL;
            }
            for (int c = 0; c < nc; c++) *em__optim_scalar_slot(opt, i, c) = r.scalars[i * nc + c];
            *em__optim_param_step(opt, i) = r.steps[i];
        }
        *em__optim_step_count(opt) = r.total;
        em_optim_set_lr(opt, r.lr);
        if (!isnan(r.initial_lr)) *em__optim_initial_lr(opt) = r.initial_lr;
        if (r.has_sched) em_lr_scheduler_load_state_dict(em__optim_scheduler(opt), &r.sched);   /* checked above */
    }
    for (int i = 0; r.fresh && i < nopt * ns; i++) em_release(r.fresh[i]);
    free(r.fresh);
    free(r.scalars);
    free(r.steps);
    return st;
}
