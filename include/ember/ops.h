/* Tensor math. All ops broadcast, accept any strides, check that every tensor is on
 * one device, promote dtypes as PyTorch does, and return a new tensor (or NULL and an
 * error). Ops ending in an underscore work in place and return a status. */
#ifndef EMBER_OPS_H
#define EMBER_OPS_H

#include <ember/export.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise, binary (broadcasting) ---- */
EM_API em_tensor *em_add(em_tensor *a, em_tensor *b);      /* a + b */
EM_API em_tensor *em_sub(em_tensor *a, em_tensor *b);      /* a - b */
EM_API em_tensor *em_mul(em_tensor *a, em_tensor *b);      /* a * b */
EM_API em_tensor *em_div(em_tensor *a, em_tensor *b);      /* true division: integers give float */
EM_API em_tensor *em_pow(em_tensor *a, em_tensor *b);      /* a ** b */
EM_API em_tensor *em_maximum(em_tensor *a, em_tensor *b);  /* elementwise max (NaN wins) */
EM_API em_tensor *em_minimum(em_tensor *a, em_tensor *b);  /* elementwise min (NaN wins) */
/* comparisons give EM_BOOL */
EM_API em_tensor *em_eq(em_tensor *a, em_tensor *b);
EM_API em_tensor *em_ne(em_tensor *a, em_tensor *b); /* a != b */
EM_API em_tensor *em_lt(em_tensor *a, em_tensor *b); /* a < b */
EM_API em_tensor *em_le(em_tensor *a, em_tensor *b); /* a <= b */
EM_API em_tensor *em_gt(em_tensor *a, em_tensor *b); /* a > b */
EM_API em_tensor *em_ge(em_tensor *a, em_tensor *b); /* a >= b */

/* ---- with a scalar (a scalar does not widen the tensor's dtype, except int -> float) ---- */
EM_API em_tensor *em_add_scalar(em_tensor *a, double s);  /* a + s */
EM_API em_tensor *em_sub_scalar(em_tensor *a, double s);  /* a - s */
EM_API em_tensor *em_mul_scalar(em_tensor *a, double s);  /* a * s */
EM_API em_tensor *em_div_scalar(em_tensor *a, double s);  /* a / s (true division) */
EM_API em_tensor *em_pow_scalar(em_tensor *a, double exponent); /* a ** exponent */
EM_API em_tensor *em_clamp(em_tensor *a, double lo, double hi); /* use -INFINITY / INFINITY for one side */

/* ---- unary ---- */
EM_API em_tensor *em_neg(em_tensor *a);     /* -a */
EM_API em_tensor *em_abs(em_tensor *a);     /* |a| */
EM_API em_tensor *em_exp(em_tensor *a);     /* e ** a (integers give float) */
EM_API em_tensor *em_log(em_tensor *a);     /* natural logarithm (integers give float) */
EM_API em_tensor *em_sqrt(em_tensor *a);    /* square root (integers give float) */
EM_API em_tensor *em_tanh(em_tensor *a);    /* hyperbolic tangent */
EM_API em_tensor *em_sigmoid(em_tensor *a); /* 1 / (1 + e ** -a) */
EM_API em_tensor *em_relu(em_tensor *a);    /* max(a, 0) */
EM_API em_tensor *em_gelu(em_tensor *a);                   /* exact (erf) form, PyTorch's default */
/* SwiGLU, silu(gate) * up for gate and up of one shape and floating dtype (Llama's MLP
 * activation, HF's act_fn(gate_proj(x)) * up_proj(x)): one pass where the backend has the
 * kernel, silu(gate) rounded to the dtype before the product as PyTorch's two ops round it. */
EM_API em_tensor *em_swiglu(em_tensor *gate, em_tensor *up);

/* cond ? a : b, broadcasting all three; cond must be EM_BOOL. */
EM_API em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b);

/* ---- reductions; EM_ALL_DIMS reduces everything ---- */
EM_API em_tensor *em_sum(em_tensor *a, em_dims dims, bool keepdim);   /* integers and bool sum to int64 */
EM_API em_tensor *em_mean(em_tensor *a, em_dims dims, bool keepdim);  /* floating dtypes only */
EM_API em_tensor *em_max(em_tensor *a, em_dims dims, bool keepdim);   /* the largest element */
EM_API em_tensor *em_min(em_tensor *a, em_dims dims, bool keepdim);   /* the smallest element */
EM_API em_tensor *em_argmax(em_tensor *a, int dim, bool keepdim);     /* int64; first index of the max */
EM_API em_tensor *em_argmin(em_tensor *a, int dim, bool keepdim);     /* int64; first index of the min */

/* ---- linear algebra ---- */
/* torch.matmul: 1-d and 2-d operands, batched with broadcasting over leading dims. */
EM_API em_tensor *em_matmul(em_tensor *a, em_tensor *b);
/* torch.addmm: beta * input + alpha * (mat1 @ mat2). mat1 [M, K] and mat2 [K, N] are
 * matrices; input broadcasts to [M, N] (a bias [N] or [1, N], a column [M, 1], a full
 * [M, N]). beta = 0 ignores input (its nan/inf do not propagate). With beta = alpha = 1 on
 * the CPU it runs as one GEMM accumulating into the broadcast input (what nn.Linear uses). */
EM_API em_tensor *em_addmm(em_tensor *input, em_tensor *mat1, em_tensor *mat2, double beta, double alpha);

/* ---- softmax ---- */
EM_API em_tensor *em_softmax(em_tensor *a, int dim);     /* exp(a) / sum(exp(a)) along dim, computed stably */
EM_API em_tensor *em_log_softmax(em_tensor *a, int dim); /* log(softmax(a)), computed stably */

/* ---- indexing and joining ---- */
EM_API em_tensor *em_index_select(em_tensor *a, int dim, em_tensor *index); /* index: 1-d int64/int32 */
EM_API em_tensor *em_gather(em_tensor *a, int dim, em_tensor *index);       /* index: int64, same ndim */
EM_API em_tensor *em_cat(em_tensor *const *tensors, int n, int dim);   /* n tensors joined along dim */
EM_API em_tensor *em_stack(em_tensor *const *tensors, int n, int dim); /* n same-shaped tensors along a new dim */
EM_API em_tensor *em_one_hot(em_tensor *index, int64_t num_classes);        /* int64 result, shape [..., C] */

/* ---- convolution and pooling ----
 * torch.nn.functional's conv2d and pools on NCHW input [N, C, H, W] (or unbatched [C, H, W]),
 * float32/float64, or bfloat16/float16 (sums in float32 on every backend). Sizes are (h, w) pairs: EM_HW(3, 3), or EM_HW1(3) for both. */
typedef struct em_hw {
    int64_t h; /* height */
    int64_t w; /* width */
} em_hw;
#define EM_HW(h, w) ((em_hw){(h), (w)}) /* (h, w) */
#define EM_HW1(x) ((em_hw){(x), (x)})   /* (x, x) */
/* F.conv2d: weight [out_channels, in_channels / groups, kH, kW], bias [out_channels] or NULL;
 * output size (H + 2 pad - dilation (k - 1) - 1) / stride + 1 (floor). PyTorch's defaults:
 * stride EM_HW1(1), padding EM_HW1(0), dilation EM_HW1(1), groups 1. */
EM_API em_tensor *em_conv2d(em_tensor *input, em_tensor *weight, em_tensor *bias, em_hw stride,
                     em_hw padding, em_hw dilation, int64_t groups);
/* F.max_pool2d: stride EM_HW1(0) means kernel_size (PyTorch's stride=None); padding at most
 * half the (dilated) kernel; ceil_mode rounds the output size up (the last window must still
 * start inside the input or left padding). _with_indices also gives int64 indices (flat h * W
 * + w in each input plane, as return_indices=True); *indices is scoped like the output. */
EM_API em_tensor *em_max_pool2d(em_tensor *input, em_hw kernel_size, em_hw stride, em_hw padding,
                         em_hw dilation, bool ceil_mode);
/* F.max_pool2d(..., return_indices=True): see above. */
EM_API em_tensor *em_max_pool2d_with_indices(em_tensor *input, em_hw kernel_size, em_hw stride,
                                      em_hw padding, em_hw dilation, bool ceil_mode,
                                      em_tensor **indices);
/* F.avg_pool2d (PyTorch's defaults: ceil_mode false, count_include_pad true,
 * divisor_override 0 = none). */
EM_API em_tensor *em_avg_pool2d(em_tensor *input, em_hw kernel_size, em_hw stride, em_hw padding,
                         bool ceil_mode, bool count_include_pad, int64_t divisor_override);
/* F.adaptive_avg_pool2d: window i covers [floor(i H / oh), ceil((i + 1) H / oh)). */
EM_API em_tensor *em_adaptive_avg_pool2d(em_tensor *input, em_hw output_size);
/* ---- norms, embedding, attention: scatter_add / index_add (out of place) ---- */
/* torch.index_add(a, dim, index, source, alpha=alpha): a copy of a with
 * out[..., index[i], ...] += alpha * source[..., i, ...]; index 1-d int64/int32, repeats
 * accumulate; source has a's shape except numel(index) at dim, and a's dtype. */
EM_API em_tensor *em_index_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src, double alpha);
/* torch.scatter_add(a, dim, index, src): a copy of a with out[i][index[i][j]] += src[i][j]
 * (dim 1 shown); index int64 with a's ndim, no larger than src, nor than a except at dim. */
EM_API em_tensor *em_scatter_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src);

/* ---- in place ---- */
EM_API em_status em_copy_(em_tensor *dst, em_tensor *src);   /* broadcasting, casting, cross-device */
EM_API em_status em_fill_(em_tensor *t, double value);       /* every element = value */
EM_API em_status em_zero_(em_tensor *t);                     /* every element = 0 */
EM_API em_status em_add_(em_tensor *t, em_tensor *other, double alpha); /* t += alpha * other */
EM_API em_status em_mul_scalar_(em_tensor *t, double s);     /* t *= s */
EM_API em_status em_mul_(em_tensor *t, em_tensor *other);    /* t *= other (broadcast to t) */
EM_API em_status em_exp_(em_tensor *t);                      /* t = e ** t (floating t only) */

#ifdef __cplusplus
}
#endif
#endif
