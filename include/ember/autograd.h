/* Reverse-mode automatic differentiation, as torch.autograd.
 *
 *   em_tensor *w = em_randn(EM_SHAPE(3, 4), EM_OPTS(.requires_grad = true));
 *   em_tensor *loss = em_sum(em_mul(w, w), EM_ALL_DIMS, false);
 *   em_backward(loss);                  // w's .grad is now 2 * w
 *   em_tensor *g = em_grad(w);
 *
 * Every differentiable op on a tensor that requires grad records a graph node. A node
 * references the tensors it saved and its inputs' nodes (never its own output), so the graph
 * lives exactly as long as some tensor that came out of it. Backward releases the saved
 * tensors unless retain_graph is set. Gradients accumulate into the .grad of leaf tensors.
 * Graphs on different threads are independent; two threads must not run backward through
 * the same graph at once. Gradients of gradients (create_graph) are not supported. */
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H

#include <stdbool.h>
#include <ember/export.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- requires_grad and .grad ---- */
/* Mark a leaf tensor (one not produced by a differentiable op) as requiring grad.
 * Floating dtypes only; on a non-leaf tensor this is an error, as in PyTorch. */
EM_API em_status em_set_requires_grad(em_tensor *t, bool requires_grad);
EM_API bool em_requires_grad(const em_tensor *t); /* t.requires_grad */
/* True when t was not produced by a differentiable op (it has no grad_fn). */
EM_API bool em_is_leaf(const em_tensor *t);
/* The accumulated gradient of t (a new reference), or NULL (without an error) if none. */
EM_API em_tensor *em_grad(em_tensor *t);
/* Replace t's .grad with g (retained; NULL clears it, as `t.grad = None`). g must have t's
 * shape, dtype and device. */
EM_API em_status em_set_grad(em_tensor *t, em_tensor *g);
/* Fill t's .grad with zeros in place (nothing happens if t has no .grad). */
EM_API em_status em_zero_grad_tensor(em_tensor *t);
/* The name of the node that produced t ("MulBackward0", as PyTorch prints), or NULL for leaves. */
EM_API const char *em_grad_fn_name(const em_tensor *t);

/* ---- backward ---- */
/* loss.backward(): loss must have exactly one element. The graph's saved tensors are
 * released afterwards (a second backward through it is an error). */
EM_API em_status em_backward(em_tensor *loss);
/* t.backward(grad, retain_graph): grad has t's shape (NULL means ones, for one-element t). */
EM_API em_status em_backward_with(em_tensor *t, em_tensor *grad, bool retain_graph);

/* ---- gradient-ready hooks (what DistributedDataParallel starts its all-reduces from) ----
 * fn(ctx, leaf) runs on the thread running backward right after a leaf's .grad was
 * updated, and fn(ctx, NULL) once when a backward has finished without error. Every hook
 * sees every backward: it ignores leaves it does not know. An error it returns ends the
 * backward with that error. Returns an id for em_autograd_remove_grad_hook, or -1 with an
 * error (at most 64 hooks at once). */
typedef em_status (*em_grad_hook_fn)(void *ctx, em_tensor *leaf);
EM_API int em_autograd_add_grad_hook(em_grad_hook_fn fn, void *ctx); /* registers fn (see above) */
EM_API void em_autograd_remove_grad_hook(int id); /* unregisters; an unknown id is ignored */

/* ---- grad mode (per thread) ---- */
/* A guard: no-grad mode until the matching end, which restores the previous mode.
 *   em_grad_mode g = em_no_grad_begin(); ... em_no_grad_end(g); */
typedef struct em_grad_mode { bool previous; /* the mode to restore */ } em_grad_mode;
EM_API em_grad_mode em_no_grad_begin(void);     /* enter no-grad mode (torch.no_grad) */
EM_API void em_no_grad_end(em_grad_mode g);     /* restore the mode em_no_grad_begin saw */
/* torch.set_grad_enabled / torch.is_grad_enabled. set returns the previous mode. */
EM_API em_grad_mode em_set_grad_enabled(bool enabled);
EM_API bool em_is_grad_enabled(void);           /* whether ops record autograd graphs on this thread */

#ifdef __cplusplus
}
#endif
#endif
