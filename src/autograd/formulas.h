/* Helpers shared by the gradient formulas (private to src/autograd/). Every formula runs in
 * no-grad mode inside a scope the engine opened, so temporaries need no release: the scope
 * frees them. A NULL anywhere propagates (ops given NULL return NULL). */
#ifndef EM_AUTOGRAD_FORMULAS_H
#define EM_AUTOGRAD_FORMULAS_H

#include <ember/ops.h>
#include "node.h"

/* The i-th saved tensor of n. */
static inline em_tensor *ag_saved_t(const ag_node *n, int i) { return n->saved[i].t; }

/* A 0-d tensor with value v, in like's dtype and device (broadcasts in where/compare). */
em_tensor *em__ag_scalar_like(const em_tensor *like, double v);
/* Sum g over the dims that were broadcast to reach g's shape from (ndim, shape), and give it
 * that shape. */
em_tensor *em__ag_reduce_to(em_tensor *g, int ndim, const int64_t *shape);
/* g reduced to input in's shape and cast to its dtype (a float32 g stays float32 where
 * em__ag_grad_widens(in)). */
em_tensor *em__ag_finish(em_tensor *g, const ag_input *in);
/* May input in's gradient be float32 though in is bf16/f16? Yes where in is a float32
 * tensor's cast on the same device (em_to_dtype: autocast's and a bf16 step's cast of a
 * master weight), seen through reshapes and permutes (Linear's transposed weight): the cast's
 * backward widens the gradient to float32 anyway, so a product can store its float32
 * accumulators and skip the rounding and that pass. Nothing else sees the dtype: hooks and
 * .grad exist on leaves only. */
bool em__ag_grad_widens(const ag_input *in);
/* Insert size-1 dims where a reduction without keepdim removed them. */
em_tensor *em__ag_restore_dims(em_tensor *g, const em_grad_args *args, int ndim);
/* The reduced dims of an input of ndim dims as an em_dims (n = 0 when none). */
em_dims em__ag_reduced_dims(const em_grad_args *args, int ndim);

/* Formulas for reductions, matmul, softmax, indexing, joining and views (formulas_shape.c).
 * Each fills out[i] (scope-owned, not yet cast) for the inputs that need a gradient. */
void em__ag_backward_shape(ag_node *n, em_tensor *g, em_tensor **out);
/* Formulas for convolution and pooling (formulas_conv.c). */
void em__ag_backward_conv(ag_node *n, em_tensor *g, em_tensor **out);

#endif
