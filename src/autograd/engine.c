/* The backward pass: walk the graph from the output in topological order (iteratively, so
 * depth is unlimited), sum the gradients arriving at each node, run its formula, and
 * accumulate into the .grad of leaf tensors. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <ember/amp.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../util/errors.h"
#include "../core/internal_api.h"
#include "node.h"

static atomic_uint g_epoch; /* tells one traversal's marks from the previous one's */

/* ---- gradient-ready hooks: a fixed table; backward copies it under the lock, so a hook
 * may be added or removed from another thread while a backward runs ---- */
#define AG_MAX_HOOKS 64
typedef struct ag_hook { em_grad_hook_fn fn; void *ctx; } ag_hook;
static ag_hook g_hooks[AG_MAX_HOOKS];
static atomic_int g_nhooks;   /* live hooks: backward skips the lock when there are none */
static pthread_mutex_t g_hooks_mu = PTHREAD_MUTEX_INITIALIZER;

int em_autograd_add_grad_hook(em_grad_hook_fn fn, void *ctx) {
    if (!fn) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_autograd_add_grad_hook: argument 'fn' is NULL");
        return -1;
    }
    pthread_mutex_lock(&g_hooks_mu);
    int id = -1;
    for (int i = 0; i < AG_MAX_HOOKS && id < 0; i++)
        if (!g_hooks[i].fn) id = i;
    if (id >= 0) {
        g_hooks[id] = (ag_hook){fn, ctx};
        atomic_fetch_add(&g_nhooks, 1);
    }
    pthread_mutex_unlock(&g_hooks_mu);
    if (id < 0) em_error(EM_ERR_NOT_SUPPORTED, "em_autograd_add_grad_hook: %d hooks are registered already", AG_MAX_HOOKS);
    return id;
}

void em_autograd_remove_grad_hook(int id) {
    if (id < 0 || id >= AG_MAX_HOOKS) return;
    pthread_mutex_lock(&g_hooks_mu);
    if (g_hooks[id].fn) atomic_fetch_sub(&g_nhooks, 1);
    g_hooks[id] = (ag_hook){0};
    pthread_mutex_unlock(&g_hooks_mu);
}

static em_status run_hooks(em_tensor *leaf) {
    if (atomic_load(&g_nhooks) == 0) return EM_OK;
    ag_hook hooks[AG_MAX_HOOKS];
    pthread_mutex_lock(&g_hooks_mu);
    memcpy(hooks, g_hooks, sizeof hooks);
    pthread_mutex_unlock(&g_hooks_mu);
    for (int i = 0; i < AG_MAX_HOOKS; i++) {
        if (!hooks[i].fn) continue;
        unsigned long seq = em__error_seq();
        em_status st = hooks[i].fn(hooks[i].ctx, leaf);
        if (st != EM_OK) return em__error_seq() != seq ? em_last_status() : em_error(st, "backward: a gradient hook failed");
    }
    return EM_OK;
}

typedef struct node_vec {
    ag_node **v;
    size_t n, cap;
} node_vec;

static bool vec_push(node_vec *s, ag_node *x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        ag_node **v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return true;
}

static const char *const SECOND_TIME =
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call em_backward(). Specify retain_graph=true (em_backward_with) if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.";

/* Is every saved tensor of n still there and unmodified? */
static em_status check_saved(const ag_node *n) {
    if (n->released && n->nsaved > 0) return em_error(EM_ERR_AUTOGRAD, "%s", SECOND_TIME);
    for (int i = 0; i < n->nsaved; i++) {
        const em_tensor *t = n->saved[i].t;
        unsigned now = atomic_load(&t->storage->version);
        if (now != n->saved[i].version) {
            char desc[320];
            em__ag_describe(desc, sizeof desc, t->dtype, t->storage->device, t->ndim, t->shape);
            return em_error(EM_ERR_AUTOGRAD,
                            "one of the variables needed for gradient computation has been "
                            "modified by an inplace operation: %s is at version %u; expected "
                            "version %u instead. Hint: the tensor was saved by %s; modify a "
                            "clone instead, or modify it after backward.",
                            desc, now, n->saved[i].version, em__ag_op_name(n->op));
        }
    }
    return EM_OK;
}

/* Collect every node reachable from root, counting how many gradients each will receive. */
static em_status collect(ag_node *root, node_vec *all) {
    unsigned epoch = atomic_fetch_add(&g_epoch, 1) + 1;
    node_vec stack = {0};
    em_status st = EM_OK;
    root->mark = epoch;
    root->deps = 0;
    root->grad = NULL;
    root->grad_fresh = false;
    if (!vec_push(all, root) || !vec_push(&stack, root)) goto oom;
    while (stack.n) {
        ag_node *x = stack.v[--stack.n];
        if ((st = check_saved(x)) != EM_OK) break;
        for (int i = 0; i < x->n; i++) {
            ag_node *c = x->in[i].node;
            if (!c) continue;
            if (c->mark != epoch) {
                c->mark = epoch;
                c->deps = 0;
                c->grad = NULL;
                c->grad_fresh = false;
                if (!vec_push(all, c) || !vec_push(&stack, c)) goto oom;
            }
            c->deps++;
        }
    }
    free(stack.v);
    return st;
oom:
    free(stack.v);
    return em_error(EM_ERR_OUT_OF_MEMORY, "backward: out of host memory for the graph walk");
}

static bool same_shape(const em_tensor *a, int ndim, const int64_t *shape) {
    if (a->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (a->shape[i] != shape[i]) return false;
    return true;
}

/* leaf.grad += g. A .grad nobody else holds is updated in place; otherwise (a reference
 * the user took with em_grad) it is replaced, so the user's tensor does not change. */
/* leaf.grad += g. `fresh`: g was made by this backward (by this node's formula, or passed
 * through from an incoming gradient a formula or a sum made: never the caller's gradient),
 * so the engine and a formula's scope may be its only holders: then the first gradient takes
 * g itself instead of a copy, as PyTorch's AccumulateGrad steals a gradient nobody else
 * references (a float32 master weight's gradient passes through its cast's node). */
static em_status accumulate_leaf(em_tensor *leaf, em_tensor *g, bool fresh) {
    if (!same_shape(g, leaf->ndim, leaf->shape) || g->dtype != leaf->dtype)
        return em_error(EM_ERR_INTERNAL, "backward: gradient of the wrong shape or dtype for a leaf");
    em_tensor *old = leaf->grad;
    if (!old && fresh && atomic_load(&g->refcount) == 2 && atomic_load(&g->storage->refcount) == 1 &&
        g->offset == 0 && !g->grad_fn && em_is_contiguous(g)) {
        leaf->grad = em_retain(g);   /* the scope and the engine drop theirs right after */
        return EM_OK;
    }
    if (!old) {
        em_tensor *c = em_clone(g);
        if (!c) return em_last_status();
        leaf->grad = em_retain(c);
        return EM_OK;
    }
    if (atomic_load(&old->refcount) == 1 && atomic_load(&old->storage->refcount) == 1)
        return em_add_(old, g, 1.0);
    em_tensor *sum = em_add(old, g);
    if (!sum) return em_last_status();
    leaf->grad = em_retain(sum);
    em_release(old);
    return EM_OK;
}

/* node.grad += g. A sum only the engine holds (the tensor and its storage: no view, saved
 * tensor or user reference sees it) takes g in place, so no third buffer is allocated while
 * the two are summed (the residual stream's gradient arrives twice per block). fresh: as
 * for accumulate_leaf; a sum is always fresh. */
static em_status accumulate_node(ag_node *n, em_tensor *g, bool fresh) {
    if (!n->grad) {
        n->grad = em_retain(g);
        n->grad_fresh = fresh;
        return EM_OK;
    }
    n->grad_fresh = true;
    em_tensor *old = n->grad;
    if (atomic_load(&old->refcount) == 1 && atomic_load(&old->storage->refcount) == 1 && !old->grad_fn &&
        !old->requires_grad && !g->grad_fn && !g->requires_grad && old->dtype == g->dtype &&
        same_shape(g, old->ndim, old->shape) && em_is_contiguous(old))
        return em_add_(old, g, 1.0);
    em_tensor *sum = em_add(n->grad, g);
    if (!sum) return em_last_status();
    em_release(n->grad);
    n->grad = em_retain(sum);
    return EM_OK;
}

/* An index_select (an embedding's lookup) of a leaf whose .grad exists already (a tied
 * head's gradient came first) and nobody but the leaf holds: the rows' gradient goes into
 * that .grad in place (em__index_add_summed_: the values the formula's dense gradient and
 * the sum would give), so no second [vocab, hidden] buffer is made at the end of backward,
 * when every other gradient exists too. Returns the leaf when it did, else NULL (the formula
 * runs); *st: how the add went. */
static em_tensor *index_select_into_grad(ag_node *x, em_status *st) {
    if (x->op != EM_GRAD_INDEX_SELECT || x->custom || !x->grad || x->n < 1 || x->nsaved < 1 || !x->saved[0].t)
        return NULL;
    em_tensor *leaf = x->in[0].leaf, *old = leaf ? leaf->grad : NULL, *g = x->grad;
    if (!old || leaf->ndim == 0 || atomic_load(&old->refcount) != 1 || atomic_load(&old->storage->refcount) != 1 ||
        old->grad_fn || old->requires_grad || !em_is_contiguous(old) || old->dtype != leaf->dtype ||
        g->dtype != old->dtype || !same_shape(old, leaf->ndim, leaf->shape) ||
        !em_device_equal(em_device_of(g), em_device_of(old)))
        return NULL;
    int dim = x->args.dim < 0 ? x->args.dim + leaf->ndim : x->args.dim;
    *st = em__index_add_summed_(old, dim, x->saved[0].t, g);
    return leaf;
}

/* Run the formulas of every node in topological order, starting with root's gradient g. */
static em_status run(ag_node *root, em_tensor *g, bool retain_graph, node_vec *all) {
    node_vec ready = {0};
    em_tensor *outs_small[8];
    em_status st = EM_OK;
    root->grad = em_retain(g);
    if (!vec_push(&ready, root))
        return em_error(EM_ERR_OUT_OF_MEMORY, "backward: out of host memory");
    while (ready.n && st == EM_OK) {
        ag_node *x = ready.v[--ready.n];
        em_tensor **outs = x->n <= 8 ? outs_small : calloc((size_t)x->n, sizeof *outs);
        if (!outs) {
            st = em_error(EM_ERR_OUT_OF_MEMORY, "backward: out of host memory");
            break;
        }
        memset(outs, 0, (size_t)x->n * sizeof *outs);
        em_scope s = em_scope_begin();
        em_tensor *added_into = index_select_into_grad(x, &st);
        if (added_into && st == EM_OK) st = run_hooks(added_into);
        else if (!added_into && x->grad) st = em__ag_node_backward(x, x->grad, outs);
        const em_tensor *incoming = x->grad;   /* only compared with, never used after release */
        bool incoming_fresh = x->grad_fresh;
        em_release(x->grad);
        x->grad = NULL;
        if (!retain_graph) {
            for (int i = 0; i < x->nsaved; i++) {
                em_release(x->saved[i].t);
                x->saved[i].t = NULL;
            }
            x->released = true;
            if (x->custom && x->custom->release) x->custom->release(x->custom_ctx);
        }
        for (int i = 0; i < x->n; i++) {
            ag_input *in = &x->in[i];
            if (st == EM_OK && outs[i]) {
                bool fresh = outs[i] != incoming || incoming_fresh;
                if (in->leaf) {
                    st = accumulate_leaf(in->leaf, outs[i], fresh);
                    if (st == EM_OK) st = run_hooks(in->leaf);
                }
                else if (in->node)
                    st = accumulate_node(in->node, outs[i], fresh);
            }
            em_release(outs[i]);
            if (in->node && --in->node->deps == 0 && st == EM_OK && !vec_push(&ready, in->node))
                st = em_error(EM_ERR_OUT_OF_MEMORY, "backward: out of host memory");
        }
        em_scope_end(s);
        if (outs != outs_small) free(outs);
    }
    free(ready.v);
    return st;
}

/* Backwards running on this thread: a custom node's backward (activation checkpointing)
 * may run one through its own graph, which must not tell the hooks "finished". */
static _Thread_local int tl_backward_depth;

static em_status backward_impl(em_tensor *t, em_tensor *grad, bool retain_graph) {
    if (!t->grad_fn) {
        em_status st = accumulate_leaf(t, grad, false);
        if (st == EM_OK) st = run_hooks(t);
        return st == EM_OK && tl_backward_depth == 0 ? run_hooks(NULL) : st;
    }
    ag_node *root = (ag_node *)t->grad_fn;
    node_vec all = {0};
    em_status st = collect(root, &all);
    tl_backward_depth++;
    if (st == EM_OK) st = run(root, grad, retain_graph, &all);
    tl_backward_depth--;
    if (st == EM_OK && tl_backward_depth == 0) st = run_hooks(NULL);
    for (size_t i = 0; i < all.n; i++) { /* after an error, drop half-summed gradients */
        em_release(all.v[i]->grad);
        all.v[i]->grad = NULL;
    }
    free(all.v);
    return st;
}

static em_status not_requiring_grad(void) {
    return em_error(EM_ERR_AUTOGRAD,
                    "element 0 of tensors does not require grad and does not have a grad_fn");
}

static em_status implicit_scalar(const em_tensor *t) {
    char desc[320];
    em__ag_describe(desc, sizeof desc, t->dtype, t->storage->device, t->ndim, t->shape);
    return em_error(EM_ERR_AUTOGRAD,
                    "grad can be implicitly created only for scalar outputs (got %s with %lld "
                    "elements; pass a gradient with em_backward_with)",
                    desc, (long long)em_numel(t));
}

/* Backward's formulas compute in the dtypes of the tensors the forward saved: an autocast
 * region the caller has open around backward must not recast them (PyTorch: "backward ops
 * run in the same type that autocast used for corresponding forward ops"). Switches autocast
 * off for every device type where it is on; returns the regions to end, innermost first. */
static int autocast_off(em_autocast *open) {
    int n = 0;
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        if (!em_autocast_enabled((em_device_type)t)) continue;
        em_autocast r = em_autocast_begin_ex((em_device_type)t, em_autocast_dtype((em_device_type)t), false);
        if (r.depth > 0) open[n++] = r;
    }
    return n;
}

em_status em_backward_with(em_tensor *t, em_tensor *grad, bool retain_graph) {
    if (!t) {
        if (!em_failed()) return em_error(EM_ERR_ARGUMENT, "em_backward: tensor is NULL");
        return em_last_status();
    }
    if (!t->requires_grad) return not_requiring_grad();
    if (!grad && em_numel(t) != 1) return implicit_scalar(t);
    if (grad) {
        if (!same_shape(grad, t->ndim, t->shape)) {
            char a[320], b[320];
            em__ag_describe(a, sizeof a, grad->dtype, grad->storage->device, grad->ndim, grad->shape);
            em__ag_describe(b, sizeof b, t->dtype, t->storage->device, t->ndim, t->shape);
            return em_error(EM_ERR_SHAPE, "Mismatch in shape: grad_output[0] is %s and output[0] is %s",
                            a, b);
        }
        if (!em_device_equal(grad->storage->device, t->storage->device))
            return em_error(EM_ERR_DEVICE,
                            "invalid gradient at index 0 - expected device %s but got %s",
                            em_device_str(t->storage->device).s,
                            em_device_str(grad->storage->device).s);
        if (!em_dtype_is_floating(grad->dtype))
            return em_error(EM_ERR_DTYPE, "invalid gradient at index 0 - expected a floating "
                            "dtype but got %s", em_dtype_name(grad->dtype));
    }
    em_grad_mode mode = em_no_grad_begin();
    em_autocast off[EM_DEVICE_TYPE_COUNT];
    int noff = autocast_off(off);
    em_scope s = em_scope_begin();
    em_tensor *g = grad ? em_to_dtype(grad, t->dtype) : em_ones_like(t);
    em_status st = g ? backward_impl(t, g, retain_graph) : em_last_status();
    em_scope_end(s);
    while (noff > 0) em_autocast_end(off[--noff]);
    em_no_grad_end(mode);
    return st;
}

em_status em_backward(em_tensor *loss) {
    if (loss && loss->requires_grad && em_numel(loss) != 1) return implicit_scalar(loss);
    return em_backward_with(loss, NULL, false);
}
