/* Tensor math. All ops broadcast, accept any strides, check that every tensor is on
 * one device, promote dtypes as PyTorch does, and return a new tensor (or NULL and an
 * error). Ops ending in an underscore work in place and return a status. */
#ifndef EMBER_OPS_H
#define EMBER_OPS_H

#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise, binary (broadcasting) ---- */
em_tensor *em_add(em_tensor *a, em_tensor *b);
em_tensor *em_sub(em_tensor *a, em_tensor *b);
em_tensor *em_mul(em_tensor *a, em_tensor *b);
em_tensor *em_div(em_tensor *a, em_tensor *b);      /* true division: integers give float */
em_tensor *em_pow(em_tensor *a, em_tensor *b);
em_tensor *em_maximum(em_tensor *a, em_tensor *b);
em_tensor *em_minimum(em_tensor *a, em_tensor *b);
/* comparisons give EM_BOOL */
em_tensor *em_eq(em_tensor *a, em_tensor *b);
em_tensor *em_ne(em_tensor *a, em_tensor *b);
em_tensor *em_lt(em_tensor *a, em_tensor *b);
em_tensor *em_le(em_tensor *a, em_tensor *b);
em_tensor *em_gt(em_tensor *a, em_tensor *b);
em_tensor *em_ge(em_tensor *a, em_tensor *b);

/* ---- with a scalar (a scalar does not widen the tensor's dtype, except int -> float) ---- */
em_tensor *em_add_scalar(em_tensor *a, double s);
em_tensor *em_sub_scalar(em_tensor *a, double s);
em_tensor *em_mul_scalar(em_tensor *a, double s);
em_tensor *em_div_scalar(em_tensor *a, double s);
em_tensor *em_pow_scalar(em_tensor *a, double exponent);
em_tensor *em_clamp(em_tensor *a, double lo, double hi); /* use -INFINITY / INFINITY for one side */

/* ---- unary ---- */
em_tensor *em_neg(em_tensor *a);
em_tensor *em_abs(em_tensor *a);
em_tensor *em_exp(em_tensor *a);
em_tensor *em_log(em_tensor *a);
em_tensor *em_sqrt(em_tensor *a);
em_tensor *em_tanh(em_tensor *a);
em_tensor *em_sigmoid(em_tensor *a);
em_tensor *em_relu(em_tensor *a);
em_tensor *em_gelu(em_tensor *a);                   /* exact (erf) form, PyTorch's default */

/* cond ? a : b, broadcasting all three; cond must be EM_BOOL. */
em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b);

/* ---- reductions; EM_ALL_DIMS reduces everything ---- */
em_tensor *em_sum(em_tensor *a, em_dims dims, bool keepdim);   /* integers and bool sum to int64 */
em_tensor *em_mean(em_tensor *a, em_dims dims, bool keepdim);  /* floating dtypes only */
em_tensor *em_max(em_tensor *a, em_dims dims, bool keepdim);
em_tensor *em_min(em_tensor *a, em_dims dims, bool keepdim);
em_tensor *em_argmax(em_tensor *a, int dim, bool keepdim);     /* int64; first index of the max */
em_tensor *em_argmin(em_tensor *a, int dim, bool keepdim);

/* ---- linear algebra ---- */
/* torch.matmul: 1-d and 2-d operands, batched with broadcasting over leading dims. */
em_tensor *em_matmul(em_tensor *a, em_tensor *b);
/* torch.addmm: beta * input + alpha * (mat1 @ mat2). mat1 [M, K] and mat2 [K, N] are
 * matrices; input broadcasts to [M, N] (a bias [N] or [1, N], a column [M, 1], a full
 * [M, N]). beta = 0 ignores input (its nan/inf do not propagate). With beta = alpha = 1 on
 * the CPU it runs as one GEMM accumulating into the broadcast input (what nn.Linear uses). */
em_tensor *em_addmm(em_tensor *input, em_tensor *mat1, em_tensor *mat2, double beta, double alpha);

/* ---- softmax ---- */
em_tensor *em_softmax(em_tensor *a, int dim);
em_tensor *em_log_softmax(em_tensor *a, int dim);

/* ---- indexing and joining ---- */
em_tensor *em_index_select(em_tensor *a, int dim, em_tensor *index); /* index: 1-d int64/int32 */
em_tensor *em_gather(em_tensor *a, int dim, em_tensor *index);       /* index: int64, same ndim */
em_tensor *em_cat(em_tensor *const *tensors, int n, int dim);
em_tensor *em_stack(em_tensor *const *tensors, int n, int dim);
em_tensor *em_one_hot(em_tensor *index, int64_t num_classes);        /* int64 result, shape [..., C] */

/* ---- norms, embedding, attention: scatter_add / index_add (out of place) ---- */
/* torch.index_add(a, dim, index, source, alpha=alpha): a copy of a with
 * out[..., index[i], ...] += alpha * source[..., i, ...]; index 1-d int64/int32, repeats
 * accumulate; source has a's shape except numel(index) at dim, and a's dtype. */
em_tensor *em_index_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src, double alpha);
/* torch.scatter_add(a, dim, index, src): a copy of a with out[i][index[i][j]] += src[i][j]
 * (dim 1 shown); index int64 with a's ndim, no larger than src, nor than a except at dim. */
em_tensor *em_scatter_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src);

/* ---- in place ---- */
em_status em_copy_(em_tensor *dst, em_tensor *src);   /* broadcasting, casting, cross-device */
em_status em_fill_(em_tensor *t, double value);
em_status em_zero_(em_tensor *t);
em_status em_add_(em_tensor *t, em_tensor *other, double alpha); /* t += alpha * other */
em_status em_mul_scalar_(em_tensor *t, double s);

#ifdef __cplusplus
}
#endif
#endif
