/* Recording the graph: grad mode, graph nodes and their lifetime, and the requires_grad /
 * .grad API. The backward pass is in engine.c; the gradient formulas in grad_ops.h and
 * formulas_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../util/errors.h"
#include "node.h"

/* ---- grad mode ---- */

static _Thread_local bool tl_grad_disabled; /* zero-initialised: grad mode on */

bool em_is_grad_enabled(void) { return !tl_grad_disabled; }

em_grad_mode em_set_grad_enabled(bool enabled) {
    em_grad_mode g = {.previous = !tl_grad_disabled};
    tl_grad_disabled = !enabled;
    return g;
}

em_grad_mode em_no_grad_begin(void) { return em_set_grad_enabled(false); }

void em_no_grad_end(em_grad_mode g) { tl_grad_disabled = !g.previous; }

/* ---- node lifetime ---- */

/* Releasing a node releases its inputs' nodes, which may release theirs: a long chain would
 * recurse as deep as the graph. Instead the first destroy on a thread drains a list. */
static _Thread_local ag_node *tl_free_list;
static _Thread_local bool tl_freeing;

static void node_release_saved(ag_node *n) {
    for (int i = 0; i < n->nsaved; i++) {
        em_release(n->saved[i].t);
        n->saved[i].t = NULL;
    }
}

static void node_free_contents(ag_node *n) {
    node_release_saved(n);
    if (n->custom && n->custom->destroy) n->custom->destroy(n->custom_ctx);
    em_release(n->grad);
    for (int i = 0; i < n->n; i++) {
        if (n->in[i].node) em__grad_node_release(&n->in[i].node->base);
        em_release(n->in[i].leaf);
    }
    free(n);
}

static void node_destroy(em_grad_node *base) {
    ag_node *n = (ag_node *)base;
    n->free_next = tl_free_list;
    tl_free_list = n;
    if (tl_freeing) return;
    tl_freeing = true;
    while (tl_free_list) {
        ag_node *x = tl_free_list;
        tl_free_list = x->free_next;
        node_free_contents(x);
    }
    tl_freeing = false;
}

/* ---- recording ---- */

bool em__grad_needed(int n, em_tensor *const *inputs) {
    if (tl_grad_disabled) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

/* Inputs that are never differentiated (conditions and indices). */
static bool input_differentiable(em_grad_op op, int i) {
    switch (op) {
    case EM_GRAD_WHERE: return i != 0;
    case EM_GRAD_INDEX_SELECT:
    case EM_GRAD_GATHER:
    case EM_GRAD_INDEX_ADD:
    case EM_GRAD_SCATTER_ADD: return i != 1;
    default: return true;
    }
}

/* A detached alias: same storage and layout, no history. */
static em_tensor *alias_of(em_tensor *t) {
    return em__tensor_alloc(t->storage, t->dtype, t->ndim, t->shape, t->strides, t->offset);
}

static bool save(ag_node *n, em_tensor *t) {
    if (!t) return true;
    em_tensor *a = alias_of(t);
    if (!a) return false;
    n->saved[n->nsaved].t = a;
    n->saved[n->nsaved].version = atomic_load(&t->storage->version);
    n->nsaved++;
    return true;
}

/* Which tensors the backward of op needs, in the order its formula reads them (the SAVES
 * column of grad_ops.h). */
typedef enum ag_saves {
    AG_SAVE_NONE, AG_SAVE_IN0, AG_SAVE_IN1, AG_SAVE_IN01, AG_SAVE_IN12, AG_SAVE_OUT, AG_SAVE_IN0_OUT
} ag_saves;
#define AG_SAVES_P_(NAME, node, saves, ...) [EM_GRAD_##NAME] = AG_SAVE_##saves,
#define AG_SAVES_S_(NAME, node, saves) [EM_GRAD_##NAME] = AG_SAVE_##saves,
static const unsigned char g_saves[EM_GRAD_OP_COUNT] = {
    EM_GRAD_POINTWISE(AG_SAVES_P_) EM_GRAD_SHAPE(AG_SAVES_S_)
};

static bool save_for_op(ag_node *n, em_grad_op op, em_tensor *out, em_tensor *const *in) {
    switch ((ag_saves)g_saves[op]) {
    case AG_SAVE_IN0: return save(n, in[0]);
    case AG_SAVE_IN1: return save(n, in[1]);
    case AG_SAVE_IN01: return save(n, in[0]) && save(n, in[1]);
    case AG_SAVE_IN12: return save(n, in[1]) && save(n, in[2]);
    case AG_SAVE_OUT: return save(n, out);
    case AG_SAVE_IN0_OUT: return save(n, in[0]) && save(n, out);
    default: return true;
    }
}

em_status em__grad_record(em_grad_op op, em_tensor *out, int n, em_tensor *const *inputs,
                          const em_grad_args *args) {
    if (!out || op < 0 || op >= EM_GRAD_OP_COUNT)
        return em_error(EM_ERR_INTERNAL, "em__grad_record: bad arguments (op %d)", (int)op);
    /* Integer and bool results carry no gradient (argmax, casts to int). */
    if (!em_dtype_is_floating(out->dtype)) return EM_OK;
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (inputs[i] == out) return EM_OK; /* an op that returned its input: nothing new */
        if (inputs[i] && inputs[i]->requires_grad && input_differentiable(op, i)) any = true;
    }
    if (!any) return EM_OK;

    ag_node *node = calloc(1, sizeof *node + (size_t)n * sizeof(ag_input));
    if (!node)
        return em_error(EM_ERR_OUT_OF_MEMORY, "autograd: out of host memory for a graph node");
    atomic_init(&node->base.refcount, 1);
    node->base.destroy = node_destroy;
    node->op = op;
    if (args) node->args = *args;
    node->n = n;
    node->out_ndim = out->ndim;
    memcpy(node->out_shape, out->shape, sizeof out->shape);
    node->out_dtype = out->dtype;
    for (int i = 0; i < n; i++) {
        em_tensor *t = inputs[i];
        ag_input *e = &node->in[i];
        if (!t) continue;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof t->shape);
        e->dtype = t->dtype;
        e->device = t->storage->device;
        if (!t->requires_grad || !input_differentiable(op, i)) continue;
        if (t->grad_fn)
            e->node = (ag_node *)em__grad_node_retain(t->grad_fn);
        else
            e->leaf = em_retain(t);
    }
    unsigned long seq = em__error_seq();
    if (!save_for_op(node, op, out, inputs)) {
        em__grad_node_release(&node->base);
        if (em__error_seq() != seq) return em_last_status(); /* the saved copy's allocation said why */
        return em_error(EM_ERR_OUT_OF_MEMORY, "autograd: out of host memory saving a tensor");
    }
    if (out->grad_fn) em__grad_node_release(out->grad_fn);
    out->grad_fn = &node->base;
    out->requires_grad = true;
    out->is_leaf = false;
    return EM_OK;
}

/* A custom node: no saved tensors of its own; its ctx holds what its backward needs. */
em_status em__grad_record_custom(const em_custom_grad *fn, void *ctx, em_tensor *out, int n,
                                 em_tensor *const *inputs) {
    if (!fn || !fn->backward || !out || n < 0 || (n > 0 && !inputs)) {
        if (fn && fn->destroy) fn->destroy(ctx);
        return em_error(EM_ERR_INTERNAL, "em__grad_record_custom: bad arguments");
    }
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (inputs[i] == out) {
            if (fn->destroy) fn->destroy(ctx);
            return em_error(EM_ERR_INTERNAL, "%s: the output must be a new tensor, not input %d",
                            fn->name, i);
        }
        if (inputs[i] && inputs[i]->requires_grad) any = true;
    }
    if (!any || tl_grad_disabled || !em_dtype_is_floating(out->dtype)) {
        if (fn->destroy) fn->destroy(ctx);
        return EM_OK;
    }
    ag_node *node = calloc(1, sizeof *node + (size_t)n * sizeof(ag_input));
    if (!node) {
        if (fn->destroy) fn->destroy(ctx);
        return em_error(EM_ERR_OUT_OF_MEMORY, "autograd: out of host memory for a graph node");
    }
    atomic_init(&node->base.refcount, 1);
    node->base.destroy = node_destroy;
    node->custom = fn;
    node->custom_ctx = ctx;
    node->n = n;
    node->out_ndim = out->ndim;
    memcpy(node->out_shape, out->shape, sizeof out->shape);
    node->out_dtype = out->dtype;
    for (int i = 0; i < n; i++) {
        em_tensor *t = inputs[i];
        ag_input *e = &node->in[i];
        if (!t) continue;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof t->shape);
        e->dtype = t->dtype;
        e->device = t->storage->device;
        if (!t->requires_grad) continue;
        if (t->grad_fn)
            e->node = (ag_node *)em__grad_node_retain(t->grad_fn);
        else
            e->leaf = em_retain(t);
    }
    if (out->grad_fn) em__grad_node_release(out->grad_fn);
    out->grad_fn = &node->base;
    out->requires_grad = true;
    out->is_leaf = false;
    return EM_OK;
}

/* ---- names and descriptions ---- */

const char *em__ag_op_name(em_grad_op op) {
#define AG_NAME_P_(NAME, node, saves, ...) [EM_GRAD_##NAME] = #node,
#define AG_NAME_S_(NAME, node, saves) [EM_GRAD_##NAME] = #node,
    static const char *const names[EM_GRAD_OP_COUNT] = {
        EM_GRAD_POINTWISE(AG_NAME_P_) EM_GRAD_SHAPE(AG_NAME_S_)
    };
    return (op >= 0 && op < EM_GRAD_OP_COUNT && names[op]) ? names[op] : "UnknownBackward";
}

void em__ag_describe(char *buf, size_t size, em_dtype dt, em_device d, int ndim, const int64_t *shape) {
    static const char *const kind[EM_DTYPE_COUNT] = {
        [EM_F32] = "Float", [EM_F64] = "Double", [EM_F16] = "Half", [EM_BF16] = "BFloat16",
        [EM_I64] = "Long", [EM_I32] = "Int", [EM_U8] = "Byte", [EM_BOOL] = "Bool",
    };
    char dims[256] = "";
    size_t len = 0;
    for (int i = 0; i < ndim && len < sizeof dims; i++)
        len += (size_t)snprintf(dims + len, sizeof dims - len, "%s%lld", i ? ", " : "",
                                (long long)shape[i]);
    const char *dev = d.type == EM_CPU ? "" : d.type == EM_CUDA ? "cuda." : d.type == EM_MPS ? "mps." : "opencl.";
    snprintf(buf, size, "[torch.%s%sTensor [%s]]", dev, kind[dt] ? kind[dt] : "", dims);
}

/* ---- requires_grad and .grad ---- */

#define CHECK_STATUS_ARG(t, fn)                                                           \
    do {                                                                                  \
        if (!(t)) {                                                                       \
            if (!em_failed()) return em_error(EM_ERR_ARGUMENT, "%s: tensor is NULL", fn); \
            return em_last_status();                                                      \
        }                                                                                 \
    } while (0)

em_status em_set_requires_grad(em_tensor *t, bool requires_grad) {
    CHECK_STATUS_ARG(t, "em_set_requires_grad");
    if (t->grad_fn)
        return em_error(EM_ERR_AUTOGRAD,
                        "you can only change requires_grad flags of leaf variables. If you want "
                        "to use a computed variable in a subgraph that doesn't require "
                        "differentiation use var_no_grad = em_detach(var).");
    if (requires_grad && !em_dtype_is_floating(t->dtype))
        return em_error(EM_ERR_DTYPE,
                        "only Tensors of floating point dtype can require gradients (got %s)",
                        em_dtype_name(t->dtype));
    t->requires_grad = requires_grad;
    t->is_leaf = true;
    return EM_OK;
}

bool em_requires_grad(const em_tensor *t) { return t && t->requires_grad; }

bool em_is_leaf(const em_tensor *t) { return t && !t->grad_fn; }

const char *em_grad_fn_name(const em_tensor *t) {
    if (!t || !t->grad_fn) return NULL;
    const ag_node *n = (const ag_node *)t->grad_fn;
    return n->custom ? n->custom->name : em__ag_op_name(n->op);
}

em_tensor *em_grad(em_tensor *t) {
    if (!t) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_grad: tensor is NULL");
        return NULL;
    }
    if (!t->grad) return NULL;
    return em__scoped(em_retain(t->grad));
}

em_status em_set_grad(em_tensor *t, em_tensor *g) {
    CHECK_STATUS_ARG(t, "em_set_grad");
    if (g) {
        if (g == t) return em_error(EM_ERR_ARGUMENT, "em_set_grad: a tensor cannot be its own grad");
        bool same_shape = g->ndim == t->ndim;
        for (int i = 0; same_shape && i < t->ndim; i++) same_shape = g->shape[i] == t->shape[i];
        char want[300], got[300];
        em__ag_describe(want, sizeof want, t->dtype, t->storage->device, t->ndim, t->shape);
        em__ag_describe(got, sizeof got, g->dtype, g->storage->device, g->ndim, g->shape);
        if (!same_shape || g->dtype != t->dtype ||
            !em_device_equal(g->storage->device, t->storage->device))
            return em_error(EM_ERR_ARGUMENT,
                            "em_set_grad: assigned grad %s does not match the tensor %s "
                            "(shape, dtype and device must be equal)", got, want);
        em_retain(g);
    }
    em_release(t->grad);
    t->grad = g;
    return EM_OK;
}

em_status em_zero_grad_tensor(em_tensor *t) {
    CHECK_STATUS_ARG(t, "em_zero_grad_tensor");
    if (!t->grad) return EM_OK;
    em_grad_mode m = em_no_grad_begin();
    em_status s = em_zero_(t->grad);
    em_no_grad_end(m);
    return s;
}
