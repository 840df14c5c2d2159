/* Modules: named parameters, buffers and children, train/eval, in-place moves, repr. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/memory.h>
#include <ember/nn.h>
#include "../core/internal_api.h"
#include "module_impl.h"
#include "../util/strbuf.h"

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Grow *items (of elem bytes each) to hold one more than *len. */
static bool grow(void **items, int *cap, int len, size_t elem) {
    if (len < *cap) return true;
    int ncap = *cap ? *cap * 2 : 4;
    void *p = realloc(*items, (size_t)ncap * elem);
    if (!p) return false;
    *items = p;
    *cap = ncap;
    return true;
}

em_module *em_module_new(const em_module_ops *ops, void *ctx) {
    if (!ops || !ops->name || !ops->forward) {
        em_error(EM_ERR_ARGUMENT, "em_module_new: ops must give a name and a forward");
        if (ops && ops->free_ctx && ctx) ops->free_ctx(ctx);
        return NULL;
    }
    em_module *m = calloc(1, sizeof *m);
    if (!m) {
        if (ops->free_ctx && ctx) ops->free_ctx(ctx);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_module_new: out of host memory");
        return NULL;
    }
    m->ops = ops;
    m->ctx = ctx;
    m->training = true;
    return m;
}

void *em_module_ctx(const em_module *m) { return m ? m->ctx : NULL; }

static void free_listing(nn_listing *l) {
    for (int i = 0; i < l->n; i++) free((char *)l->items[i].name);
    free(l->items);
    *l = (nn_listing){0};
}

/* The tree under m's ancestors changed: their listings must be rebuilt. */
static void invalidate(em_module *m) {
    for (; m; m = m->parent)
        for (int k = 0; k < 2; k++) free_listing(&m->lists[k]);
}

static bool name_taken(const em_module *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return true;
    for (int i = 0; i < m->nbufs; i++)
        if (!strcmp(m->bufs[i].name, name)) return true;
    for (int i = 0; i < m->nkids; i++)
        if (!strcmp(m->kids[i].name, name)) return true;
    return false;
}

static em_status check_new_name(const em_module *m, const char *name, const char *fn) {
    if (!m || !name) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: module or name is NULL", fn);
    if (!*name || strchr(name, '.'))
        return em_error(EM_ERR_ARGUMENT, "%s: name \"%s\" must be non-empty and contain no '.'", fn, name);
    if (name_taken(m, name))
        return em_error(EM_ERR_ARGUMENT, "%s: attribute \"%s\" already exists in %s", fn, name,
                        m->ops->name);
    return EM_OK;
}

static em_status add_slot(nn_slot **slots, int *n, int *cap, const char *name, em_tensor *t) {
    char *nm = dup_str(name);
    if (!nm || !grow((void **)slots, cap, *n, sizeof **slots)) {
        free(nm);
        return em_error(EM_ERR_OUT_OF_MEMORY, "module: out of host memory");
    }
    (*slots)[(*n)++] = (nn_slot){nm, em_retain(t)};
    return EM_OK;
}

em_status em_module_add_parameter(em_module *m, const char *name, em_tensor *t) {
    em_status st = check_new_name(m, name, "em_module_add_parameter");
    if (st != EM_OK) return st;
    if (!t) return em_failed() ? em_last_status()
                               : em_error(EM_ERR_ARGUMENT, "em_module_add_parameter: tensor is NULL");
    if (!em_is_leaf(t))
        return em_error(EM_ERR_ARGUMENT, "em_module_add_parameter: \"%s\" is not a leaf tensor "
                        "(it came out of an op that records gradients; detach it first)", name);
    if ((st = em_set_requires_grad(t, true)) != EM_OK) return st;
    invalidate(m);
    return add_slot(&m->params, &m->nparams, &m->cparams, name, t);
}

em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t) {
    em_status st = check_new_name(m, name, "em_module_add_buffer");
    if (st != EM_OK) return st;
    if (!t) return em_failed() ? em_last_status()
                               : em_error(EM_ERR_ARGUMENT, "em_module_add_buffer: tensor is NULL");
    invalidate(m);
    return add_slot(&m->bufs, &m->nbufs, &m->cbufs, name, t);
}

em_status em_module_add_child(em_module *m, const char *name, em_module *child) {
    em_status st = check_new_name(m, name, "em_module_add_child");
    if (st == EM_OK && !child)
        st = em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_module_add_child: child is NULL");
    if (st == EM_OK && child->parent)
        st = em_error(EM_ERR_ARGUMENT, "em_module_add_child: the module already has a parent");
    if (st == EM_OK && child == m) st = em_error(EM_ERR_ARGUMENT, "em_module_add_child: a module cannot contain itself");
    char *nm = st == EM_OK ? dup_str(name) : NULL;
    if (st == EM_OK && (!nm || !grow((void **)&m->kids, &m->ckids, m->nkids, sizeof *m->kids)))
        st = em_error(EM_ERR_OUT_OF_MEMORY, "module: out of host memory");
    if (st != EM_OK) {
        free(nm);
        if (child && child != m && !child->parent) em_module_free(child);
        return st;
    }
    invalidate(m);
    child->parent = m;
    child->training = m->training;
    m->kids[m->nkids++] = (nn_child){nm, child};
    return EM_OK;
}

em_module *em_module_child(em_module *m, int i) {
    return m && i >= 0 && i < m->nkids ? m->kids[i].m : NULL;
}

/* The module the first `len` bytes of path name, below m (m itself for an empty path). */
static em_module *walk(em_module *m, const char *path, size_t len, const char *fn, const char *full) {
    const char *p = path, *end = path + len;
    while (p < end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = (size_t)((dot ? dot : end) - p);
        em_module *next = NULL;
        for (int i = 0; i < m->nkids && !next; i++)
            if (strlen(m->kids[i].name) == n && !memcmp(m->kids[i].name, p, n)) next = m->kids[i].m;
        if (!next) {
            bool is_tensor = false;
            for (int i = 0; i < m->nparams && !is_tensor; i++)
                is_tensor = strlen(m->params[i].name) == n && !memcmp(m->params[i].name, p, n);
            for (int i = 0; i < m->nbufs && !is_tensor; i++)
                is_tensor = strlen(m->bufs[i].name) == n && !memcmp(m->bufs[i].name, p, n);
            if (is_tensor)
                em_error(EM_ERR_ARGUMENT, "%s: \"%s\": `%.*s` is a tensor of %s, not a module", fn, full, (int)n, p,
                         m->ops->name);
            else
                em_error(EM_ERR_ARGUMENT, "%s: \"%s\": %s has no attribute `%.*s`", fn, full, m->ops->name, (int)n, p);
            return NULL;
        }
        m = next;
        p = dot ? dot + 1 : end;
        if (dot && p == end) { /* "conv1." */
            em_error(EM_ERR_ARGUMENT, "%s: \"%s\" ends with '.'", fn, full);
            return NULL;
        }
    }
    return m;
}

em_module *em_module_get(em_module *m, const char *path) {
    if (!m || !path) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_module_get: %s is NULL", m ? "the path" : "the module");
        return NULL;
    }
    return walk(m, path, strlen(path), "em_module_get", path);
}

em_tensor *em_module_get_parameter(em_module *m, const char *path) {
    const char *fn = "em_module_get_parameter";
    if (!m || !path) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, m ? "the path" : "the module");
        return NULL;
    }
    const char *last = strrchr(path, '.');
    const char *name = last ? last + 1 : path;
    em_module *owner = walk(m, path, last ? (size_t)(last - path) : 0, fn, path);
    if (!owner) return NULL;
    for (int i = 0; i < owner->nparams; i++)
        if (!strcmp(owner->params[i].name, name)) return owner->params[i].t;
    em_error(EM_ERR_ARGUMENT, "%s: \"%s\": %s has no parameter `%s`", fn, path, owner->ops->name, name);
    return NULL;
}

const char *em_module_child_name(const em_module *m, int i) {
    return m && i >= 0 && i < m->nkids ? m->kids[i].name : NULL;
}

void em_module_free(em_module *m) {
    if (!m) return;
    if (m->parent) { /* detach from the parent that owns it */
        em_module *p = m->parent;
        invalidate(p);
        for (int i = 0; i < p->nkids; i++)
            if (p->kids[i].m == m) {
                free(p->kids[i].name);
                memmove(&p->kids[i], &p->kids[i + 1], (size_t)(p->nkids - i - 1) * sizeof *p->kids);
                p->nkids--;
                break;
            }
        m->parent = NULL;
    }
    for (int i = 0; i < m->nlisteners; i++) m->listeners[i].l->freed(m->listeners[i].ctx);
    free(m->listeners);
    while (m->nkids) em_module_free(m->kids[m->nkids - 1].m); /* each removes itself */
    free(m->kids);
    for (int i = 0; i < m->nparams; i++) {
        free(m->params[i].name);
        em_release(m->params[i].t);
    }
    for (int i = 0; i < m->nbufs; i++) {
        free(m->bufs[i].name);
        em_release(m->bufs[i].t);
    }
    free(m->params);
    free(m->bufs);
    for (int k = 0; k < 2; k++) free_listing(&m->lists[k]);
    if (m->ops->free_ctx && m->ctx) m->ops->free_ctx(m->ctx);
    free(m);
}

/* A layer's failure names the layer, as PyTorch's Conv2d does in its messages: the error
 * its forward just recorded, prefixed with its one-line repr ("Linear(in_features=9216,
 * out_features=128, bias=True): em_addmm: mat1 and mat2 shapes cannot be multiplied ...").
 * Containers are not named: the layer inside that failed already is. */
static void name_failure(const em_module *m) {
    em_error_state st;
    em__error_save(&st);
    char repr[256];
    em_module_format(m, repr, sizeof repr);
    em_error(st.status, "%s: %s", repr, st.message);
}

em_tensor *em_forward(em_module *m, em_tensor *x) {
    if (!m || !x) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_forward: %s is NULL", m ? "input" : "module");
        return NULL;
    }
    /* The forward's temporaries are freed here; the graph keeps what backward needs. */
    em_scope s = em_scope_begin();
    unsigned long seq = em__error_seq();
    /* a layer's allocations carry its name in the memory history, unless the caller tagged them */
    bool tag = m->nkids == 0 && m->ops->name && em_memory_get_tag(NULL, 0) == 0;
    if (tag) em_memory_set_tag(m->ops->name);
    em_tensor *y = m->ops->forward(m, x);
    if (tag) em_memory_set_tag(NULL);
    if (!y && m->nkids == 0 && em__error_seq() != seq) name_failure(m);
    return em__scope_return(s, y);
}

static void set_training(em_module *m, bool on) {
    m->training = on;
    for (int i = 0; i < m->nkids; i++) set_training(m->kids[i].m, on);
}
void em_module_train(em_module *m) { if (m) set_training(m, true); }
void em_module_eval(em_module *m) { if (m) set_training(m, false); }
bool em_module_is_training(const em_module *m) { return m && m->training; }

/* ---- flattened, dotted names ---- */

static bool flat_add(nn_listing *l, const char *prefix, const char *name, em_tensor *t) {
    size_t n = strlen(prefix) + strlen(name) + 1;
    char *full = malloc(n);
    if (!full || !grow((void **)&l->items, &l->cap, l->n, sizeof *l->items)) {
        free(full);
        return false;
    }
    snprintf(full, n, "%s%s", prefix, name);
    l->items[l->n++] = (em_named_tensor){full, t};
    return true;
}

static bool flatten(nn_listing *l, const em_module *m, const char *prefix, bool buffers) {
    const nn_slot *slots = buffers ? m->bufs : m->params;
    int n = buffers ? m->nbufs : m->nparams;
    for (int i = 0; i < n; i++)
        if (!flat_add(l, prefix, slots[i].name, slots[i].t)) return false;
    for (int i = 0; i < m->nkids; i++) {
        size_t len = strlen(prefix) + strlen(m->kids[i].name) + 2;
        char *p = malloc(len);
        if (!p) return false;
        snprintf(p, len, "%s%s.", prefix, m->kids[i].name);
        bool ok = flatten(l, m->kids[i].m, p, buffers);
        free(p);
        if (!ok) return false;
    }
    return true;
}

static int list_named(em_module *m, em_named_tensor *out, int cap, bool buffers) {
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "module is NULL");
        return 0;
    }
    nn_listing *l = &m->lists[buffers];
    if (!l->valid) {
        free_listing(l);
        if (!flatten(l, m, "", buffers)) {
            free_listing(l);
            em_error(EM_ERR_OUT_OF_MEMORY, "module: out of host memory listing tensors");
            return 0;
        }
        l->valid = true;
    }
    for (int i = 0; i < l->n && i < cap && out; i++) out[i] = l->items[i];
    return l->n;
}

int em_module_parameters(em_module *m, em_named_tensor *out, int cap) {
    return list_named(m, out, cap, false);
}
int em_module_buffers(em_module *m, em_named_tensor *out, int cap) {
    return list_named(m, out, cap, true);
}

int64_t em_module_num_parameters(em_module *m) {
    if (!m) return 0;
    int64_t total = 0;
    for (int i = 0; i < m->nparams; i++) total += em_numel(m->params[i].t);
    for (int i = 0; i < m->nkids; i++) total += em_module_num_parameters(m->kids[i].m);
    return total;
}

/* ---- moving ---- */

static em_status move_tree(em_module *m, em_device d, bool dev, em_dtype dt, bool cast) {
    for (int k = 0; k < 2; k++) {
        nn_slot *slots = k ? m->bufs : m->params;
        int n = k ? m->nbufs : m->nparams;
        for (int i = 0; i < n; i++) {
            em_tensor *t = slots[i].t;
            em_dtype target = em_dtype_of(t);
            /* like Module.to(dtype): only floating tensors change dtype */
            if (cast && em_dtype_is_floating(target)) target = dt;
            em_status st = em__tensor_move_(t, dev ? d : em_device_of(t), target);
            if (st != EM_OK) return st;
        }
    }
    for (int i = 0; i < m->nkids; i++) {
        em_status st = move_tree(m->kids[i].m, d, dev, dt, cast);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static em_status tell_moved(const em_module *m) {
    for (int i = 0; i < m->nlisteners; i++) {
        em_status st = m->listeners[i].l->moved(m->listeners[i].ctx);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static em_status tell_moved_tree(const em_module *m) {
    em_status st = tell_moved(m);
    for (int i = 0; i < m->nkids && st == EM_OK; i++) st = tell_moved_tree(m->kids[i].m);
    return st;
}

static em_status module_move(em_module *m, em_device d, bool dev, em_dtype dt, bool cast) {
    if (!m) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_module_to: module is NULL");
    em_status st = move_tree(m, d, dev, dt, cast);
    if (st != EM_OK) return st;
    /* listeners on m's subtree and on its ancestors may hold state of the moved tensors */
    for (em_module *a = m->parent; a && st == EM_OK; a = a->parent) st = tell_moved(a);
    return st != EM_OK ? st : tell_moved_tree(m);
}

em_status em_module_to(em_module *m, em_device d) {
    return module_move(m, d, true, EM_F32, false);
}

em_status em_module_to_dtype(em_module *m, em_dtype dt) {
    if (m && !em_dtype_is_floating(dt))
        return em_error(EM_ERR_DTYPE, "em_module_to_dtype: nn.Module.to only accepts floating "
                        "point dtypes, but got %s", em_dtype_name(dt));
    return module_move(m, EM_DEVICE_CPU, false, dt, true);
}

/* ---- listeners (nn_internal.h) ---- */

em_status em__module_listen(em_module *m, const em_module_listener *l, void *ctx) {
    if (!grow((void **)&m->listeners, &m->clisteners, m->nlisteners, sizeof *m->listeners))
        return em_error(EM_ERR_OUT_OF_MEMORY, "module: out of host memory");
    m->listeners[m->nlisteners++] = (nn_listener){l, ctx};
    return EM_OK;
}

void em__module_unlisten(em_module *m, const em_module_listener *l, void *ctx) {
    for (int i = 0; m && i < m->nlisteners; i++)
        if (m->listeners[i].l == l && m->listeners[i].ctx == ctx) {
            memmove(&m->listeners[i], &m->listeners[i + 1], (size_t)(m->nlisteners - i - 1) * sizeof *m->listeners);
            m->nlisteners--;
            return;
        }
}

/* ---- repr ---- */

static void format_rec(em_strbuf *b, const em_module *m, int indent) {
    char desc[256] = "";
    if (m->ops->describe) m->ops->describe(m, desc, sizeof desc);
    em__sb_printf(b, "%s(%s", m->ops->name, desc);
    if (m->nkids) {
        em__sb_printf(b, "\n");
        for (int i = 0; i < m->nkids; i++) {
            em__sb_printf(b, "%*s(%s): ", indent + 2, "", m->kids[i].name);
            format_rec(b, m->kids[i].m, indent + 2);
            em__sb_printf(b, "\n");
        }
        em__sb_printf(b, "%*s", indent, "");
    }
    em__sb_printf(b, ")");
}

int em_module_format(const em_module *m, char *buf, size_t size) {
    if (buf && size) buf[0] = '\0';
    if (!m) return 0;
    em_strbuf b = em__sb_fixed(buf, size);
    format_rec(&b, m, 0);
    return (int)b.len;
}

void em_module_print(const em_module *m) {
    int n = em_module_format(m, NULL, 0);
    char *s = malloc((size_t)n + 1);
    if (!s) return;
    em_module_format(m, s, (size_t)n + 1);
    printf("%s\n", s);
    free(s);
}
