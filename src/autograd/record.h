/* The seam between core ops and autograd. Every differentiable op in src/core calls
 *     if (em__grad_needed(n, inputs)) em__grad_record(EM_GRAD_X, out, n, inputs, &args);
 * after computing `out`. Autograd (src/autograd/) builds the graph node; core knows
 * nothing else about gradients. */
#ifndef EM_AUTOGRAD_RECORD_H
#define EM_AUTOGRAD_RECORD_H

#include <stdbool.h>
#include "../core/tensor_impl.h"

typedef enum em_grad_op {
    /* binary, inputs {a, b}: the ORIGINAL operands (not broadcast views); backward
     * reduces gradients over broadcast dims back to each operand's shape) */
    EM_GRAD_ADD, EM_GRAD_SUB, EM_GRAD_MUL, EM_GRAD_DIV, EM_GRAD_POW, EM_GRAD_MAXIMUM,
    EM_GRAD_MINIMUM,
    /* with a scalar, inputs {a}, args.s[0] = scalar (clamp: s[0] = lo, s[1] = hi) */
    EM_GRAD_ADD_SCALAR, EM_GRAD_MUL_SCALAR, EM_GRAD_DIV_SCALAR, EM_GRAD_RSUB_SCALAR,
    EM_GRAD_POW_SCALAR, EM_GRAD_CLAMP,
    /* unary, inputs {a} */
    EM_GRAD_NEG, EM_GRAD_ABS, EM_GRAD_EXP, EM_GRAD_LOG, EM_GRAD_SQRT, EM_GRAD_TANH,
    EM_GRAD_SIGMOID, EM_GRAD_RELU, EM_GRAD_GELU,
    /* inputs {cond, a, b}; cond is not differentiable */
    EM_GRAD_WHERE,
    /* reductions, inputs {a}; args.reduce[d] marks reduced dims of a, args.keepdim */
    EM_GRAD_SUM, EM_GRAD_MEAN, EM_GRAD_MAX, EM_GRAD_MIN,
    /* inputs {a, b}: out = a @ b with torch.matmul's 1-d/batched rules */
    EM_GRAD_MATMUL,
    /* inputs {a}, args.dim */
    EM_GRAD_SOFTMAX, EM_GRAD_LOG_SOFTMAX,
    /* inputs {a, index}, args.dim; index is not differentiable */
    EM_GRAD_INDEX_SELECT, EM_GRAD_GATHER,
    /* inputs {t0 .. tn-1}, args.dim: out = cat(inputs, dim) (stack records unsqueeze + cat) */
    EM_GRAD_CAT,
    /* views and copies, inputs {a} */
    EM_GRAD_VIEW,       /* view / reshape / flatten / squeeze / unsqueeze: a's shape restores it */
    EM_GRAD_PERMUTE,    /* args.perm (transpose records the permutation it makes) */
    EM_GRAD_SLICE,      /* narrow / slice / select: args.dim, args.i[0] = start, args.i[1] = step,
                           args.i[2] = 1 when select removed the dim */
    EM_GRAD_EXPAND,     /* gradient summed back to a's shape */
    EM_GRAD_COPY,       /* contiguous / clone / to(device, dtype): gradient moved back to a's
                           device and dtype */
    EM_GRAD_OP_COUNT
} em_grad_op;

typedef struct em_grad_args {
    double s[2];
    int dim;
    int64_t i[3];
    bool reduce[EM_MAX_DIMS];
    bool keepdim;
    int perm[EM_MAX_DIMS];
} em_grad_args;

/* Is grad mode on and does any input require grad? Cheap; call before building args. */
bool em__grad_needed(int n, em_tensor *const *inputs);
/* Attach a node for `op` to out (sets out->requires_grad, out->grad_fn). On failure records
 * an error and returns its status (the caller then releases out and returns NULL). */
em_status em__grad_record(em_grad_op op, em_tensor *out, int n, em_tensor *const *inputs,
                          const em_grad_args *args);

#endif
