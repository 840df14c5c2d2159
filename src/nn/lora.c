/* LoRA: low-rank adapters on frozen layers (PEFT's LoraLayer), merging them back, and the
 * adapters alone in safetensors files with PEFT's names.
 *
 * A wrapped layer stays the same em_module (handles held by the caller and its place in
 * the tree do not change): its ops and ctx are swapped for a lora_layer that keeps the
 * originals, and two bias-free Linear children, lora_A and lora_B, hold the adapters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/io.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

typedef struct lora_layer {
    em_module_ops ops;              /* m->ops points here: the wrapper's ops */
    const em_module_ops *orig_ops;  /* the layer's own ops and ctx, restored by merge */
    void *orig_ctx;
    em_module *a, *b;               /* the children lora_A [r, in] and lora_B [out, r] */
    int64_t rank;
    double alpha, scale;            /* scale = alpha / rank */
} lora_layer;

static void lora_free_ctx(void *ctx) {
    lora_layer *l = ctx;
    if (l->orig_ops->free_ctx && l->orig_ctx) l->orig_ops->free_ctx(l->orig_ctx);
    free(l);
}

/* The base layer's forward sees its own ctx (one thread uses a module at a time). */
static em_tensor *lora_forward(em_module *m, em_tensor *x) {
    lora_layer *l = m->ctx;
    /* a scope of its own: the base output y is freed on return, not when the enclosing
     * Sequential's forward ends (one output-sized tensor less at the peak) */
    em_scope s = em_scope_begin();
    m->ctx = l->orig_ctx;
    em_tensor *y = l->orig_ops->forward(m, x);
    m->ctx = l;
    if (!y) return em__scope_return(s, NULL);
    /* scale the rank-sized x A^T, not the output-sized product (addmm with alpha != 1
     * holds two output-sized temporaries; alpha 1 adds in place) */
    em_tensor *h = em_mul_scalar(em_matmul(x, em_transpose(l->a->params[0].t, 0, 1)), l->scale);
    em_tensor *bt = em_transpose(l->b->params[0].t, 0, 1);
    em_tensor *out = em_ndim(x) == 2 && em_ndim(y) == 2 ? em_addmm(y, h, bt, 1.0, 1.0) : em_add(y, em_matmul(h, bt));
    return em__scope_return(s, out);
}

static void lora_describe(const em_module *m, char *buf, size_t size) {
    const lora_layer *l = m->ctx;
    char base[256] = "";
    if (l->orig_ops->describe) {
        em_module *mm = (em_module *)m; /* describe reads the original ctx */
        mm->ctx = l->orig_ctx;
        l->orig_ops->describe(mm, base, sizeof base);
        mm->ctx = (void *)l;
    }
    snprintf(buf, size, "%s%sr=%lld, lora_alpha=%g", base, *base ? ", " : "", (long long)l->rank, l->alpha);
}

static bool is_lora(const em_module *m) { return m->ops->forward == lora_forward; }

/* ---- walking the tree with dotted paths ---- */

typedef struct found {
    em_module **mods;
    char **paths;  /* "0", "encoder.fc1"; "" for the root */
    int n, cap;
} found;

static void found_free(found *f) {
    for (int i = 0; i < f->n; i++) free(f->paths[i]);
    free(f->mods);
    free(f->paths);
    *f = (found){0};
}

static bool found_add(found *f, em_module *m, const char *path) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 8;
        em_module **mods = realloc(f->mods, (size_t)cap * sizeof *mods);
        if (mods) f->mods = mods;
        char **paths = mods ? realloc(f->paths, (size_t)cap * sizeof *paths) : NULL;
        if (!paths) return false;
        f->paths = paths;
        f->cap = cap;
    }
    size_t len = strlen(path) + 1;
    char *p = malloc(len);
    if (!p) return false;
    memcpy(p, path, len);
    f->mods[f->n] = m;
    f->paths[f->n++] = p;
    return true;
}

/* Modules under m (m included) for which want() holds; wrapped layers' adapters are not
 * searched. false only when out of host memory. */
static bool find(em_module *m, const char *path, bool (*want)(const em_module *, unsigned), unsigned kinds,
                 found *f) {
    if (want(m, kinds) && !found_add(f, m, path)) return false;
    if (is_lora(m)) return true;
    for (int i = 0; i < m->nkids; i++) {
        size_t len = strlen(path) + strlen(m->kids[i].name) + 2;
        char *sub = malloc(len);
        if (!sub) return false;
        snprintf(sub, len, "%s%s%s", path, *path ? "." : "", m->kids[i].name);
        bool ok = find(m->kids[i].m, sub, want, kinds, f);
        free(sub);
        if (!ok) return false;
    }
    return true;
}

static bool want_target(const em_module *m, unsigned kinds) {
    em_module_kind k = em_module_kind_of(m);
    return k < 32 && (kinds & EM_LORA_TARGET(k));
}
static bool want_lora(const em_module *m, unsigned kinds) { (void)kinds; return is_lora(m); }

static em_status find_or_fail(em_module *m, bool (*want)(const em_module *, unsigned), unsigned kinds, found *f) {
    if (find(m, "", want, kinds, f)) return EM_OK;
    found_free(f);
    return em_error(EM_ERR_OUT_OF_MEMORY, "LoRA: out of host memory");
}

/* ---- wrap ---- */

static void set_trainable(em_module *m, bool on) {
    for (int i = 0; i < m->nparams; i++) em_set_requires_grad(m->params[i].t, on);
    for (int i = 0; i < m->nkids; i++) set_trainable(m->kids[i].m, on);
}

em_status em_lora_wrap(em_module *model, int64_t rank, double alpha, unsigned target_kinds) {
    if (!model) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_lora_wrap: model is NULL");
    if (target_kinds == 0 || (target_kinds & ~EM_LORA_LINEAR))
        return em_error(EM_ERR_ARGUMENT, "em_lora_wrap: target kinds must be EM_LORA_LINEAR (only Linear layers "
                        "can take adapters today), got 0x%x", target_kinds);
    if (rank <= 0) return em_error(EM_ERR_ARGUMENT, "em_lora_wrap: rank must be >= 1, got %lld", (long long)rank);
    if (!(alpha > 0.0 && alpha < 1e300))
        return em_error(EM_ERR_ARGUMENT, "em_lora_wrap: alpha must be a positive number, got %g", alpha);
    found w = {0}, t = {0};
    em_status st = find_or_fail(model, want_lora, 0, &w);
    if (st != EM_OK) return st;
    int wrapped = w.n;
    found_free(&w);
    if (wrapped) return em_error(EM_ERR_ARGUMENT, "em_lora_wrap: the model already has LoRA adapters (merge them first)");
    if ((st = find_or_fail(model, want_target, target_kinds, &t)) != EM_OK) return st;
    if (t.n == 0) {
        found_free(&t);
        return em_error(EM_ERR_ARGUMENT, "em_lora_wrap: the model has no layer of the targeted kinds (Linear)");
    }
    /* check every layer and build every adapter before changing the model */
    lora_layer **ls = calloc((size_t)t.n, sizeof *ls);
    if (!ls) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_lora_wrap: out of host memory");
    for (int i = 0; i < t.n && st == EM_OK; i++) {
        em_module *m = t.mods[i];
        int64_t in = 0, out = 0;
        if ((st = em_module_linear_shape(m, &in, &out)) != EM_OK) break;
        int64_t lim = in < out ? in : out;
        if (rank > lim) {
            st = em_error(EM_ERR_ARGUMENT, "em_lora_wrap: rank %lld is larger than min(in_features, out_features) = %lld "
                          "of Linear(in_features=%lld, out_features=%lld) at \"%s\"", (long long)rank, (long long)lim,
                          (long long)in, (long long)out, t.paths[i]);
            break;
        }
        lora_layer *l = ls[i] = calloc(1, sizeof *l);
        if (!l) {
            st = em_error(EM_ERR_OUT_OF_MEMORY, "em_lora_wrap: out of host memory");
            break;
        }
        em_tensor *w = m->params[0].t;
        l->a = em_nn_linear_ex(in, rank, false); /* kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(in)), as PEFT */
        l->b = em_nn_linear_ex(rank, out, false);
        if (!l->a || !l->b) {
            st = em_last_status();
            break;
        }
        em_grad_mode g = em_no_grad_begin();
        st = em_zero_(l->b->params[0].t);
        /* the adapters live where the layer's weight lives, in its dtype */
        if (st == EM_OK) st = em_module_to(l->a, em_device_of(w));
        if (st == EM_OK) st = em_module_to(l->b, em_device_of(w));
        if (st == EM_OK) st = em_module_to_dtype(l->a, em_dtype_of(w));
        if (st == EM_OK) st = em_module_to_dtype(l->b, em_dtype_of(w));
        em_no_grad_end(g);
        l->rank = rank;
        l->alpha = alpha;
        l->scale = alpha / (double)rank;
    }
    if (st != EM_OK) {
        for (int i = 0; ls && i < t.n; i++)
            if (ls[i]) {
                em_module_free(ls[i]->a);
                em_module_free(ls[i]->b);
                free(ls[i]);
            }
        free(ls);
        found_free(&t);
        return st;
    }
    set_trainable(model, false);
    for (int i = 0; i < t.n; i++) {
        em_module *m = t.mods[i];
        lora_layer *l = ls[i];
        em_module *a = l->a, *b = l->b;
        l->ops = (em_module_ops){.name = "lora.Linear", .forward = lora_forward, .describe = lora_describe,
                                 .free_ctx = lora_free_ctx};
        l->orig_ops = m->ops;
        l->orig_ctx = m->ctx;
        m->ops = &l->ops;
        m->ctx = l;
        /* add_child frees the child on failure; the layer then runs with the adapters it has */
        em_status sa = em_module_add_child(m, "lora_A", a);
        em_status sb = sa == EM_OK ? em_module_add_child(m, "lora_B", b) : (em_module_free(b), sa);
        if (sa != EM_OK || sb != EM_OK) {
            /* out of host memory: undo this layer */
            if (sa == EM_OK) em_module_free(a);
            m->ops = l->orig_ops;
            m->ctx = l->orig_ctx;
            free(l);
            for (int j = i + 1; j < t.n; j++) {
                em_module_free(ls[j]->a);
                em_module_free(ls[j]->b);
                free(ls[j]);
            }
            st = sa != EM_OK ? sa : sb;
            break;
        }
    }
    free(ls);
    found_free(&t);
    return st;
}

int64_t em_module_num_trainable_parameters(em_module *m) {
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_module_num_trainable_parameters: module is NULL");
        return 0;
    }
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        if (em_requires_grad(m->params[i].t)) n += em_numel(m->params[i].t);
    for (int i = 0; i < m->nkids; i++) n += em_module_num_trainable_parameters(m->kids[i].m);
    return n;
}

/* ---- merge ---- */

static em_status find_wrapped(em_module *model, const char *fn, found *f) {
    if (!model) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: model is NULL", fn);
    em_status st = find_or_fail(model, want_lora, 0, f);
    if (st == EM_OK && f->n == 0) {
        found_free(f);
        st = em_error(EM_ERR_ARGUMENT, "%s: the model has no LoRA adapters (em_lora_wrap adds them)", fn);
    }
    return st;
}

em_status em_lora_merge(em_module *model) {
    found f = {0};
    em_status st = find_wrapped(model, "em_lora_merge", &f);
    if (st != EM_OK) return st;
    /* compute every delta first so that a failure changes nothing */
    em_scope s = em_scope_begin();
    em_grad_mode g = em_no_grad_begin();
    em_tensor **delta = calloc((size_t)f.n, sizeof *delta);
    if (!delta) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_lora_merge: out of host memory");
    for (int i = 0; i < f.n && st == EM_OK; i++) {
        lora_layer *l = f.mods[i]->ctx;
        delta[i] = em_matmul(l->b->params[0].t, l->a->params[0].t); /* B A: [out, in] */
        if (!delta[i]) st = em_last_status();
    }
    for (int i = 0; i < f.n && st == EM_OK; i++) {
        em_module *m = f.mods[i];
        lora_layer *l = m->ctx;
        st = em_add_(m->params[0].t, delta[i], l->scale);
        if (st != EM_OK) break;
        em_module_free(l->a); /* detaches itself from m */
        em_module_free(l->b);
        m->ops = l->orig_ops;
        m->ctx = l->orig_ctx;
        free(l);
    }
    em_no_grad_end(g);
    em_scope_end(s);
    free(delta);
    found_free(&f);
    return st;
}

/* ---- saving and loading the adapters ---- */

/* PEFT's key: "base_model.model." + path + ".lora_A.weight" (the adapter name dropped). */
static char *peft_name(const char *path, const char *which) {
    size_t len = strlen(path) + strlen(which) + 40;
    char *s = malloc(len);
    if (s) snprintf(s, len, "base_model.model.%s%s%s.weight", path, *path ? "." : "", which);
    return s;
}

typedef struct adapters { char **names; em_tensor **ts; int n; } adapters;

static void adapters_free(adapters *a) {
    for (int i = 0; i < a->n; i++) free(a->names[i]);
    free(a->names);
    free(a->ts);
}

static em_status list_adapters(em_module *model, const char *fn, adapters *out) {
    found f = {0};
    em_status st = find_wrapped(model, fn, &f);
    if (st != EM_OK) return st;
    *out = (adapters){calloc((size_t)f.n * 2, sizeof(char *)), calloc((size_t)f.n * 2, sizeof(em_tensor *)), 0};
    if (!out->names || !out->ts) st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (int i = 0; i < f.n && st == EM_OK; i++) {
        lora_layer *l = f.mods[i]->ctx;
        for (int k = 0; k < 2 && st == EM_OK; k++) {
            char *nm = peft_name(f.paths[i], k ? "lora_B" : "lora_A");
            if (!nm) {
                st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
                break;
            }
            out->names[out->n] = nm;
            out->ts[out->n++] = (k ? l->b : l->a)->params[0].t;
        }
    }
    found_free(&f);
    if (st != EM_OK) adapters_free(out);
    return st;
}

em_status em_lora_save(em_module *model, const char *path) {
    if (!path) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_lora_save: path is NULL");
    adapters a;
    em_status st = list_adapters(model, "em_lora_save", &a);
    if (st != EM_OK) return st;
    st = em_safetensors_save(path, (const char *const *)a.names, a.ts, a.n);
    adapters_free(&a);
    return st;
}

static void shape_str(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

em_status em_lora_load(em_module *model, const char *path) {
    if (!path) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_lora_load: path is NULL");
    adapters a;
    em_status st = list_adapters(model, "em_lora_load", &a);
    if (st != EM_OK) return st;
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!file) {
        adapters_free(&a);
        return em_last_status();
    }
    em_scope s = em_scope_begin();
    em_tensor **src = calloc((size_t)a.n, sizeof *src);
    if (!src) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_lora_load: out of host memory");
    int count = em_safetensors_count(file);
    /* check everything before changing anything */
    for (int i = 0; i < a.n && st == EM_OK; i++) {
        bool present = false;
        for (int k = 0; k < count && !present; k++) present = !strcmp(em_safetensors_name(file, k), a.names[i]);
        if (!present) {
            st = em_error(EM_ERR_FORMAT, "em_lora_load: %s has no tensor \"%s\" (is it an adapter file for this "
                          "model, wrapped with the same target layers?)", path, a.names[i]);
            break;
        }
        src[i] = em_safetensors_get(file, a.names[i]);
        if (!src[i]) {
            st = em_last_status();
            break;
        }
        em_shape fs = em_shape_of(src[i]), ms = em_shape_of(a.ts[i]);
        bool same = fs.ndim == ms.ndim;
        for (int d = 0; same && d < fs.ndim; d++) same = fs.d[d] == ms.d[d];
        if (!same) {
            char sf[128], sm[128];
            shape_str(sf, sizeof sf, fs);
            shape_str(sm, sizeof sm, ms);
            st = em_error(EM_ERR_SHAPE, "em_lora_load: \"%s\" in %s has shape %s, the model's adapter has %s "
                          "(a different rank or layer size?)", a.names[i], path, sf, sm);
        }
    }
    for (int k = 0; k < count && st == EM_OK; k++) {
        const char *name = em_safetensors_name(file, k);
        bool known = false;
        for (int i = 0; i < a.n && !known; i++) known = !strcmp(name, a.names[i]);
        if (!known)
            st = em_error(EM_ERR_FORMAT, "em_lora_load: %s holds \"%s\", which is no adapter of this model", path, name);
    }
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < a.n && st == EM_OK; i++) st = em_copy_(a.ts[i], src[i]);
    em_no_grad_end(g);
    free(src);
    em_scope_end(s);
    em_safetensors_free(file);
    adapters_free(&a);
    return st;
}
