/* Activation checkpointing (torch.utils.checkpoint): a function's forward runs in no-grad
 * mode keeping only its inputs; backward runs it again with grad enabled, the random
 * generator set back to where the forward found it (so dropout draws the same masks) and the
 * forward's autocast state entered again (so the recomputed ops run in the same dtypes), then
 * backpropagates the incoming gradient through that recomputed graph. The node is a custom
 * autograd node (em__grad_record_custom); the recomputation's backward is a nested one, so
 * the parameters' .grad fill exactly as without checkpointing. */
#include <stdlib.h>
#include <ember/amp.h>
#include <ember/autograd.h>
#include <ember/nn.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "nn_internal.h"

typedef struct ckpt_ctx {
    em_checkpoint_fn fn;
    void *fn_ctx;
    void (*free_fn_ctx)(void *); /* for the contexts this file makes (Sequential segments) */
    int n;                       /* the function's inputs; the node has one more (the anchor) */
    em_tensor **inputs;          /* detached aliases of the inputs, owned; NULL once released */
    bool *needs;                 /* which inputs required grad (their aliases do not) */
    uint64_t seed, offset;       /* the generator as the forward found it */
    bool ac_on[EM_DEVICE_TYPE_COUNT];        /* autocast as the forward found it, per device type */
    em_dtype ac_dtype[EM_DEVICE_TYPE_COUNT];
    bool released;
} ckpt_ctx;

/* Enter the forward's autocast state for the recomputation: its regions where it had them,
 * autocast switched off where it had none (backward may run inside a region of the caller's,
 * as PyTorch's checkpoint also sets exactly the forward's state). Returns how many regions
 * were opened into open (ended innermost first), -1 when one could not be. */
static int enter_forward_autocast(const ckpt_ctx *k, em_autocast *open) {
    int n = 0;
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        bool now = em_autocast_enabled((em_device_type)t);
        if (!k->ac_on[t] && !now) continue;
        if (now && k->ac_on[t] && em_autocast_dtype((em_device_type)t) == k->ac_dtype[t]) continue;
        em_autocast r = em_autocast_begin_ex((em_device_type)t, k->ac_dtype[t], k->ac_on[t]);
        if (r.depth == 0) {   /* begin failed (its error is recorded): undo the others */
            while (n > 0) em_autocast_end(open[--n]);
            return -1;
        }
        open[n++] = r;
    }
    return n;
}

static void ckpt_release(void *c) {
    ckpt_ctx *k = c;
    if (k->inputs)
        for (int i = 0; i < k->n; i++) em_release(k->inputs[i]);
    free(k->inputs);
    free(k->needs);
    k->inputs = NULL;
    k->needs = NULL;
    k->released = true;
}

static void ckpt_destroy(void *c) {
    ckpt_ctx *k = c;
    if (!k) return;
    ckpt_release(k);
    if (k->free_fn_ctx) k->free_fn_ctx(k->fn_ctx);
    free(k);
}

/* Re-run the function on fresh leaves with grad enabled and the forward's RNG state, then
 * backward through it with g; the leaves' .grad are the inputs' gradients. */
static em_status ckpt_backward(void *c, em_tensor *g, int n, em_tensor **grads) {
    ckpt_ctx *k = c;
    if (k->released)
        return em_error(EM_ERR_AUTOGRAD, "CheckpointFunctionBackward: trying to backward through a "
                        "checkpointed function a second time; its saved inputs were freed by the first "
                        "backward (use em_backward_with(..., retain_graph=true))");
    em_tensor *leaves[k->n > 0 ? k->n : 1];
    for (int i = 0; i < k->n; i++) {
        leaves[i] = em_detach(k->inputs[i]);
        if (!leaves[i]) return em_last_status();
        if (k->needs[i] && em_set_requires_grad(leaves[i], true) != EM_OK)
            return em_last_status();
    }
    uint64_t seed, offset;
    em__rng_get_state(&seed, &offset);
    em__rng_set_state(k->seed, k->offset);   /* replay: the same dropout masks */
    em_grad_mode mode = em_set_grad_enabled(true);
    em_autocast open[EM_DEVICE_TYPE_COUNT];
    int nopen = enter_forward_autocast(k, open);
    unsigned long seq = em__error_seq();
    /* the recomputed forward in a scope of its own: what the function made and its graph does
     * not save (a norm's output once projected, a sum once added) goes at its end instead of
     * staying through this backward, as in the first forward, whose caller's scope ended */
    em_scope fwd = em_scope_begin();
    em_tensor *y = nopen < 0 ? NULL : k->fn(k->fn_ctx, leaves, k->n);
    if (y) em_keep(y);
    em_scope_end(fwd);
    while (nopen > 0) em_autocast_end(open[--nopen]);
    em_set_grad_enabled(mode.previous);
    em__rng_set_state(seed, offset);         /* the caller's stream continues as before */
    if (!y)
        return em__error_seq() != seq ? em_last_status()
                                      : em_error(EM_ERR_ARGUMENT, "em_checkpoint: the function returned NULL when recomputed");
    if (em_requires_grad(y)) {
        em_status st = em_backward_with(y, g, false);
        if (st != EM_OK) {
            em_release(y);
            return st;
        }
    }
    em_release(y);
    for (int i = 0; i < n; i++) {
        em_tensor *gi = i < k->n ? em_grad(leaves[i]) : NULL;
        /* an input that needs no gradient gets none (the engine asks only for the others: a
         * zero tensor of the data batch's size would raise the peak for nothing); one the
         * output does not depend on (and the anchor) gets zeros */
        if (!gi && i < k->n && !k->needs[i]) {
            grads[i] = NULL;
            continue;
        }
        grads[i] = gi ? gi : i < k->n ? em_zeros_like(leaves[i]) : em_zeros(EM_SHAPE(1), EM_OPTS(.dtype = EM_F32));
        if (!grads[i]) return em_last_status();
    }
    return EM_OK;
}

static const em_custom_grad CKPT_GRAD = {
    .name = "CheckpointFunctionBackward",
    .backward = ckpt_backward,
    .release = ckpt_release,
    .destroy = ckpt_destroy,
};

static em_tensor *checkpoint_impl(em_checkpoint_fn fn, void *fn_ctx, void (*free_fn_ctx)(void *),
                                  em_tensor *const *inputs, int n) {
    if (!fn || n < 0 || (n > 0 && !inputs)) {
        if (free_fn_ctx) free_fn_ctx(fn_ctx);
        em_error(EM_ERR_ARGUMENT, "em_checkpoint: expected a function and n >= 0 inputs, got fn=%s, n=%d, inputs=%s",
                 fn ? "set" : "NULL", n, inputs ? "set" : "NULL");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!inputs[i]) {
            if (free_fn_ctx) free_fn_ctx(fn_ctx);
            if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_checkpoint: input %d is NULL", i);
            return NULL;
        }
    if (!em_is_grad_enabled()) {   /* nothing to save: just run it */
        em_tensor *y = fn(fn_ctx, (em_tensor **)inputs, n);
        if (free_fn_ctx) free_fn_ctx(fn_ctx);
        return y;
    }
    ckpt_ctx *k = calloc(1, sizeof *k);
    em_tensor **saved = calloc((size_t)(n > 0 ? n : 1), sizeof *saved);
    bool *needs = calloc((size_t)(n > 0 ? n : 1), sizeof *needs);
    if (!k || !saved || !needs) {
        free(k);
        free(saved);
        free(needs);
        if (free_fn_ctx) free_fn_ctx(fn_ctx);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_checkpoint: out of host memory");
        return NULL;
    }
    *k = (ckpt_ctx){.fn = fn, .fn_ctx = fn_ctx, .free_fn_ctx = free_fn_ctx, .n = n, .inputs = saved, .needs = needs};
    /* An anchor leaf that requires grad: the node is recorded even when no input requires
     * grad (the first segment's input is data), so the parameters inside get gradients. */
    em_scope s = em_scope_begin();
    em_tensor *node_in[n + 1];
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        node_in[i] = inputs[i];
        needs[i] = em_requires_grad(inputs[i]);
        em_tensor *d = em_detach(inputs[i]);
        ok = d != NULL;
        if (ok) saved[i] = em_retain(d);
    }
    em_tensor *anchor = ok ? em_zeros(EM_SHAPE(1), EM_OPTS(.dtype = EM_F32)) : NULL;
    ok = anchor && em_set_requires_grad(anchor, true) == EM_OK;
    node_in[n] = anchor;
    em_tensor *y = NULL;
    if (ok) {
        em__rng_get_state(&k->seed, &k->offset);
        for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
            k->ac_on[t] = em_autocast_enabled((em_device_type)t);
            k->ac_dtype[t] = em_autocast_dtype((em_device_type)t);
        }
        em_grad_mode mode = em_no_grad_begin();
        unsigned long seq = em__error_seq();
        y = fn(fn_ctx, saved, n);
        em_no_grad_end(mode);
        if (!y && em__error_seq() == seq) em_error(EM_ERR_ARGUMENT, "em_checkpoint: the function returned NULL");
        for (int i = 0; y && i < n; i++)   /* the node's output must be a tensor of its own */
            if (y == saved[i] || y == inputs[i]) y = em_detach(y);
    }
    if (y) em_retain(y);
    if (!y) {
        em_scope_end(s);
        ckpt_destroy(k);
        return NULL;
    }
    em_status st = em__grad_record_custom(&CKPT_GRAD, k, y, n + 1, node_in); /* owns k now */
    em_scope_end(s);
    if (st != EM_OK) {
        em_release(y);
        return NULL;
    }
    return em__scoped(y);
}

em_tensor *em_checkpoint(em_checkpoint_fn fn, void *ctx, em_tensor *const *inputs, int n) {
    return checkpoint_impl(fn, ctx, NULL, inputs, n);
}

em_tensor *em__checkpoint_owned(em_checkpoint_fn fn, void *ctx, void (*free_ctx)(void *), em_tensor *const *inputs,
                                int n) {
    return checkpoint_impl(fn, ctx, free_ctx, inputs, n);
}

/* ---- Sequential: segments of children, as torch.utils.checkpoint.checkpoint_sequential ---- */

typedef struct seq_range {
    em_module *seq;
    int start, end; /* children [start, end] */
} seq_range;

static em_tensor *run_range(void *c, em_tensor *const *in, int n) {
    (void)n;
    seq_range *r = c;
    em_tensor *x = in[0];
    for (int i = r->start; i <= r->end && x; i++) x = em_forward(em_module_child(r->seq, i), x);
    return x;
}

em_tensor *em_checkpoint_sequential(em_module *model, int segments, em_tensor *x) {
    if (!model || !x) {
        if (!em_failed())
            em_error(EM_ERR_ARGUMENT, "em_checkpoint_sequential: %s is NULL", model ? "the input" : "the model");
        return NULL;
    }
    if (em_module_kind_of(model) != EM_MODULE_SEQUENTIAL) {
        em_error(EM_ERR_ARGUMENT, "em_checkpoint_sequential: expected a Sequential module, got %s",
                 em_module_name(model));
        return NULL;
    }
    int layers = 0;
    while (em_module_child(model, layers)) layers++;
    if (segments <= 0 || segments > layers) {
        em_error(EM_ERR_ARGUMENT, "em_checkpoint_sequential: segments must be between 1 and the number of "
                 "layers (%d), got %d", layers, segments);
        return NULL;
    }
    /* segments - 1 checkpointed chunks of layers / segments children; the last chunk (with
     * the rest) runs normally, since backward needs its activations at once anyway */
    int size = layers / segments, start = 0;
    em_scope s = em_scope_begin();
    em_tensor *y = x;
    for (int k = 0; k < segments - 1 && y; k++, start += size) {
        seq_range *r = malloc(sizeof *r);
        if (!r) {
            em_error(EM_ERR_OUT_OF_MEMORY, "em_checkpoint_sequential: out of host memory");
            y = NULL;
            break;
        }
        *r = (seq_range){model, start, start + size - 1};
        y = checkpoint_impl(run_range, r, free, &y, 1);
    }
    if (y) {
        seq_range last = {model, start, layers - 1};
        y = run_range(&last, &y, 1);
    }
    return em__scope_return(s, y);
}
