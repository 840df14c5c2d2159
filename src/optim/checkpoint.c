/* Training checkpoints: the model's state dict, the optimizer's state and the caller's
 * metadata in one safetensors file, written atomically (see include/ember/optim.h). */
#include <float.h>
#include <inttypes.h>
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

#define META_MAX 64          /* ours (4 + one step per parameter) are counted separately */
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
    int cap_meta = nmeta + 4 + nopt;
    const char **mk = calloc((size_t)cap_meta, sizeof *mk), **mv = calloc((size_t)cap_meta, sizeof *mv);
    char *strings = calloc((size_t)(4 + nopt), 2 * NAME_MAX_LEN);   /* our metadata's text */
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
        PUT("%s", "optimizer", "%s", em__optim_kind_name(opt));
        PUT("%s", "optimizer.steps", "%" PRId64, *em__optim_step_count(opt));
        PUT("%s", "optimizer.lr", "%.17g", em_optim_lr(opt));
        const char *const *snames;
        int ns = em__optim_state_names(opt, &snames);
        for (int i = 0; ok && i < nopt; i++) {
            const char *pn = param_name(params, np, em__optim_param(opt, i));
            if (strlen(pn) > NAME_MAX_LEN - 40) {
                st = em_error(EM_ERR_ARGUMENT, "%s: parameter name too long: '%.40s...'", op, pn);
                ok = false;
                break;
            }
            PUT("optimizer.%s.step", pn, "%" PRId64, *em__optim_param_step(opt, i));
            for (int s = 0; ok && s < ns; s++) {
                em_tensor *t = *em__optim_state_slot(opt, i, s);
                char name[NAME_MAX_LEN];
                snprintf(name, sizeof name, "optimizer.%s.%s", pn, snames[s]);
                if (t) ok = list_add(&l, name, t);
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

/* A count from the file's metadata: a whole non-negative integer that fits (an
 * overflowing one is refused, not saturated). */
static bool parse_i64(const char *s, int64_t *out) {
    return em_parse_i64(s, 0, INT64_MAX, out) == EM_NUM_OK;
}

/* Reads the optimizer's part of the file into fresh tensors (on each parameter's device and
 * dtype) and step counts, changing nothing in opt. fresh has nopt * ST slots. */
static em_status read_optimizer(const em_safetensors *file, const char *path, em_module *m, em_optimizer *opt,
                                em_tensor **fresh, int64_t *steps, int64_t *total, double *lr) {
    const char *op = "em_checkpoint_load";
    const char *kind = em_safetensors_metadata(file, "optimizer");
    if (!kind)
        return em_error(EM_ERR_FORMAT, "%s: %s holds no optimizer state (saved without an optimizer?)", op, path);
    if (strcmp(kind, em__optim_kind_name(opt)))
        return em_error(EM_ERR_ARGUMENT, "%s: %s holds %s state, but the optimizer is %s", op, path, kind,
                        em__optim_kind_name(opt));
    const char *lr_text = em_safetensors_metadata(file, "optimizer.lr");
    if (!parse_i64(em_safetensors_metadata(file, "optimizer.steps"), total) ||
        em_parse_f64(lr_text, 0, DBL_MAX, lr) != EM_NUM_OK)
        return em_error(EM_ERR_FORMAT, "%s: %s: bad or missing 'optimizer.steps' / 'optimizer.lr' metadata", op, path);
    int np = 0;
    em_named_tensor *params = module_params(m, &np);
    if (!params) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (check_optimizer_belongs(op, params, np, opt) != EM_OK) {
        free(params);
        return em_last_status();
    }
    const char *const *snames;
    int ns = em__optim_state_names(opt, &snames), nopt = em__optim_nparams(opt);
    em_status st = EM_OK;
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < nopt && st == EM_OK; i++) {
        em_tensor *p = em__optim_param(opt, i);
        const char *pn = param_name(params, np, p);
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "optimizer.%s.step", pn);
        if (!parse_i64(em_safetensors_metadata(file, name), &steps[i])) {
            st = em_error(EM_ERR_FORMAT, "%s: %s: missing or bad metadata '%s'", op, path, name);
            break;
        }
        for (int s = 0; s < ns && st == EM_OK; s++) {
            snprintf(name, sizeof name, "optimizer.%s.%s", pn, snames[s]);
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
                if (c) fresh[i * ns + s] = em_retain(c);
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
    int nopt = opt ? em__optim_nparams(opt) : 0, ns = 0;
    if (opt) {
        const char *const *snames;
        ns = em__optim_state_names(opt, &snames);
    }
    em_tensor **fresh = calloc((size_t)(nopt * ns) + 1, sizeof *fresh);
    int64_t *steps = calloc((size_t)nopt + 1, sizeof *steps), total = 0;
    double lr = 0;
    if (st == EM_OK && (!fresh || !steps)) st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (st == EM_OK && opt) st = read_optimizer(file, path, m, opt, fresh, steps, &total, &lr);
    /* the model last: em__module_load_file checks everything before it copies */
    if (st == EM_OK) st = em__module_load_file(m, file, path);
    if (st == EM_OK && opt) {   /* nothing below can fail */
        for (int i = 0; i < nopt; i++) {
            for (int s = 0; s < ns; s++) {
                em_tensor **slot = em__optim_state_slot(opt, i, s);
                em_release(*slot);
                *slot = fresh[i * ns + s];
                fresh[i * ns + s] = NULL;
            }
            *em__optim_param_step(opt, i) = steps[i];
        }
        *em__optim_step_count(opt) = total;
        em_optim_set_lr(opt, lr);
    }
    for (int i = 0; fresh && i < nopt * ns; i++) em_release(fresh[i]);
    free(fresh);
    free(steps);
    return st;
}
