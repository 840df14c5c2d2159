/* The seam between core ops and autograd. Every differentiable op in src/core calls
 *     if (em__grad_needed(n, inputs)) em__grad_record(EM_GRAD_X, out, n, inputs, &args);
 * after computing `out`. Autograd (src/autograd/) builds the graph node; core knows
 * nothing else about gradients. */
#ifndef EM_AUTOGRAD_RECORD_H
#define EM_AUTOGRAD_RECORD_H

#include <stdbool.h>
#include "../core/tensor_impl.h"
#include "grad_ops.h"

/* The node types, from the lists in grad_ops.h (the pointwise ones first). */
#define EM_GRAD_ENUM_P_(NAME, node, saves, ...) EM_GRAD_##NAME,
#define EM_GRAD_ENUM_S_(NAME, node, saves) EM_GRAD_##NAME,
typedef enum em_grad_op {
    EM_GRAD_POINTWISE(EM_GRAD_ENUM_P_)
    EM_GRAD_SHAPE(EM_GRAD_ENUM_S_)
    EM_GRAD_OP_COUNT
} em_grad_op;

typedef struct em_grad_args {
    double s[2];
    int dim;
    int64_t i[3];
    bool reduce[EM_MAX_DIMS];
    bool keepdim;
    int perm[EM_MAX_DIMS];
    /* convolution and pooling: kh, kw, sh, sw, ph, pw, dh, dw, groups, count_include_pad,
     * divisor_override (EM_GRAD_WIN_* in src/core/ops_conv.c) */
    int64_t win[11];
} em_grad_args;

/* Is grad mode on and does any input require grad? Cheap; call before building args. */
bool em__grad_needed(int n, em_tensor *const *inputs);
/* Attach a node for `op` to out (sets out->requires_grad, out->grad_fn). On failure records
 * an error and returns its status (the caller then releases out and returns NULL). */
em_status em__grad_record(em_grad_op op, em_tensor *out, int n, em_tensor *const *inputs,
                          const em_grad_args *args);

#endif
