/* The list of backend ops: one X(NAME, name, DTYPES, GPU) entry per op. Every op a backend
 * runs is here, from `neg` to the fused Adam step, and nothing about an op is written down
 * anywhere else: the entry makes the em_op enum and the dtypes every backend's `supports`
 * reads (src/backends/op_call.h), the CPU's op names and its dispatch of fused ops, the GPU
 * op layer's launch of fused kernels, and the kernels' op codes EMK_U_* / EMK_B_* / EMK_R_*
 * (layout.h). Host C, OpenCL C and CUDA C all read this file, so it uses only the
 * preprocessor.
 *
 * DTYPES: the dtypes a backend computes the op in (the call's `dtype`; core casts the
 * others first, as PyTorch promotes them):
 *   FLOAT    floating dtypes only (integers compute in the default float dtype)
 *   F32_F64  float32 and float64 only (kernels without 16-bit variants)
 *   NUMERIC  every dtype but bool
 *   ANY      every dtype
 *   TRUEDIV  numeric on the CPU reference (its integer kernel divides), floating on GPUs:
 *            core divides integers as floats, so GPUs keep no integer division kernel
 *
 * GPU: how the GPU op layer (src/backends/gpu/) runs the op on OpenCL and CUDA:
 *   GPU_OWN            host code of its own in the GPU op layer (op families, library calls)
 *   GPU_NONE           not on GPUs (their `supports` says no; core composes the op instead)
 *   GPU_ELEMS(nd, ns)  a fused op: kernel name_<dtype> (e.g. gelu_backward_f32, in any .k
 *   GPU_ROWS(nd, ns)   file) taking its nd outputs' and ns inputs' buffers, then one
 *                      emk_call (layout.h); one work item per element of dst[0] (ELEMS)
 *                      or per row of i[0] elements of dst[0] (ROWS)
 *
 * The comment after each op gives its call's layout (em_op_call, src/backends/op_call.h):
 * the tensors in dst[] (written) and src[] (read), the integer params i[], the float params
 * f[], and `arg`. Unless an op says otherwise, its inputs have out's shape (broadcast dims
 * with stride 0) and the call's dtype, and any strides.
 *
 * The lists keep their order: the unary list first (the ops taking f[] last), then the
 * binary ops (comparisons last), then the reductions; src/backends/op_call.h asserts the
 * bounds that backends' range checks and the kernel op codes (`op - EM_OP_NEG`) rely on.
 * A new op goes inside its list. */
#ifndef EMK_OP_LIST_H
#define EMK_OP_LIST_H

/* unary: dst {out}, src {in}: out = f(in); the scalar ops take f[0] (clamp also f[1]) */
#define EMK_OPS_UNARY(X)                                                                  \
    X(NEG, neg, NUMERIC, GPU_OWN)                                                         \
    X(ABS, abs, NUMERIC, GPU_OWN)                                                         \
    X(EXP, exp, FLOAT, GPU_OWN)                                                           \
    X(LOG, log, FLOAT, GPU_OWN)                                                           \
    X(SQRT, sqrt, FLOAT, GPU_OWN)                                                         \
    X(RSQRT, rsqrt, FLOAT, GPU_OWN)                                                       \
    X(TANH, tanh, FLOAT, GPU_OWN)                                                         \
    X(SIGMOID, sigmoid, FLOAT, GPU_OWN)                                                   \
    X(RELU, relu, NUMERIC, GPU_OWN)                                                       \
    X(GELU, gelu, FLOAT, GPU_OWN)                                                         \
    X(SIGN, sign, NUMERIC, GPU_OWN)                                                       \
    X(SQUARE, square, NUMERIC, GPU_OWN)                                                   \
    X(RECIPROCAL, reciprocal, FLOAT, GPU_OWN)                                             \
    X(ADD_SCALAR, add_scalar, NUMERIC, GPU_OWN)   /* in + f[0] */                         \
    X(MUL_SCALAR, mul_scalar, NUMERIC, GPU_OWN)   /* in * f[0] */                         \
    X(DIV_SCALAR, div_scalar, FLOAT, GPU_OWN)     /* in / f[0] */                         \
    X(RSUB_SCALAR, rsub_scalar, NUMERIC, GPU_OWN) /* f[0] - in */                         \
    X(POW_SCALAR, pow_scalar, NUMERIC, GPU_OWN)   /* in ^ f[0] */                         \
    X(CLAMP, clamp, NUMERIC, GPU_OWN)             /* between f[0] and f[1] */
/* binary arithmetic: dst {out}, src {a, b}: out = f(a, b) in the inputs' dtype */
#define EMK_OPS_BINARY(X)                                                                 \
    X(ADD, add, ANY, GPU_OWN)                                                             \
    X(SUB, sub, NUMERIC, GPU_OWN)                                                         \
    X(MUL, mul, ANY, GPU_OWN)                                                             \
    X(DIV, div, TRUEDIV, GPU_OWN)                                                         \
    X(POW, pow, NUMERIC, GPU_OWN)                                                         \
    X(MAXIMUM, maximum, ANY, GPU_OWN)                                                     \
    X(MINIMUM, minimum, ANY, GPU_OWN)
/* comparisons: binary ops that write bool (out's dtype is EM_BOOL, the call's dtype the
 * inputs'); they follow the arithmetic ones */
#define EMK_OPS_COMPARE(X)                                                                \
    X(EQ, eq, ANY, GPU_OWN)                                                               \
    X(NE, ne, ANY, GPU_OWN)                                                               \
    X(LT, lt, ANY, GPU_OWN)                                                               \
    X(LE, le, ANY, GPU_OWN)                                                               \
    X(GT, gt, ANY, GPU_OWN)                                                               \
    X(GE, ge, ANY, GPU_OWN)                                                               \
    X(LOGICAL_AND, logical_and, ANY, GPU_OWN)
/* reductions: dst {out}, src {in}; i[0] the reduced dims as bits (bit d: dim d). out has
 * in's ndim with size 1 on reduced dims. SUM/MEAN/MAX/MIN: out's dtype is in's;
 * ARGMAX/ARGMIN: exactly one reduced dim, out EM_I64. */
#define EMK_OPS_REDUCE(X)                                                                 \
    X(SUM, sum, NUMERIC, GPU_OWN)                                                         \
    X(MEAN, mean, FLOAT, GPU_OWN)                                                         \
    X(MAX, max, ANY, GPU_OWN)                                                             \
    X(MIN, min, ANY, GPU_OWN)                                                             \
    X(ARGMAX, argmax, ANY, GPU_OWN)                                                       \
    X(ARGMIN, argmin, ANY, GPU_OWN)

/* Tensor ops with a case of their own in each backend's switch. Every backend runs the
 * ones marked "required"; an optional one a backend lacks is declined by its `supports`,
 * and core composes it from required ops (or, where none composes it, reports "not
 * supported"). */
#define EMK_OPS_TENSOR(X)                                                                 \
    /* required. dst {out}; f {value} */                                                  \
    X(FILL, fill, ANY, GPU_OWN)                                                           \
    /* required. dst {out}; f {start, step}: out[i] = start + i * step over out's         \
     * elements in row-major order (arange, linspace) */                                  \
    X(FILL_AFFINE, fill_affine, ANY, GPU_OWN)                                             \
    /* required. dst {out}, src {in}: out = in, any two dtypes (a cast) */                \
    X(COPY, copy, ANY, GPU_OWN)                                                           \
    /* required. dst {out}, src {cond (EM_BOOL), a, b}: a, b have out's dtype */          \
    X(WHERE, where, ANY, GPU_OWN)                                                         \
    /* required. dst {out [..., M, N]}, src {a [..., M, K], b [..., K, N]}: batched       \
     * matmul; the batch dims of all three are equal (batch strides may be 0); one dtype */ \
    X(MATMUL, matmul, ANY, GPU_OWN)                                                       \
    /* optional (core: matmul, then add). dst {out}, src {a, b}: out += a @ b for 2-d     \
     * floating a [M, K], b [K, N] and a contiguous out [M, N] of their dtype; f16/bf16   \
     * accumulate in float32 and round once (addmm: core fills out with the bias first) */ \
    X(MATMUL_ACC, matmul_acc, FLOAT, GPU_OWN)                                             \
    /* optional (core: fill out with the bias, then matmul_acc). dst {out}, src {bias [N] \
     * contiguous, a, b}: out = a @ b + bias, the bias added in the GEMM's epilogue; as   \
     * matmul_acc otherwise. May answer EM_ERR_NOT_SUPPORTED, nothing written or recorded */ \
    X(ADDMM_BIAS, addmm_bias, FLOAT, GPU_NONE)                                            \
    /* optional (core: matmul in the low dtype, autograd casts). dst {out: float32, 2-d,  \
     * contiguous}, src {a, b: 2-d bf16/f16}: a @ b accumulated in float32, not rounded   \
     * to the inputs' dtype (a float32 master weight's gradient). May answer              \
     * EM_ERR_NOT_SUPPORTED, nothing recorded */                                          \
    X(MATMUL_WIDEN, matmul_widen, FLOAT, GPU_NONE)                                        \
    /* required. dst {out}, src {in}; i {dim, log}: softmax (log: log-softmax) of in      \
     * along dim; out has in's shape and dtype */                                         \
    X(SOFTMAX, softmax, FLOAT, GPU_OWN)                                                   \
    /* required. dst {out}, src {in, index}; i {dim}: out = in.index_select(dim, index);  \
     * index 1-d EM_I64, values checked in range; out is in's shape with shape[dim] =     \
     * numel(index) */                                                                    \
    X(INDEX_SELECT, index_select, ANY, GPU_OWN)                                           \
    /* required. dst {out}, src {index, src}; i {dim}: out.index_add_(dim, index, src):   \
     * out[..., index[i], ...] += src[..., i, ...] */                                     \
    X(INDEX_ADD, index_add, ANY, GPU_OWN)                                                 \
    /* required. dst {out}, src {in, index}; i {dim}: out = in.gather(dim, index); index  \
     * EM_I64 with out's shape, values checked in range */                                \
    X(GATHER, gather, ANY, GPU_OWN)                                                       \
    /* required. dst {out}, src {index, src}; i {dim}: out.scatter_add_(dim, index, src); \
     * index and src have the same shape */                                               \
    X(SCATTER_ADD, scatter_add, ANY, GPU_OWN)                                             \
    /* required. dst {out}; i {kind (em_rng_kind), seed, offset}; f {p0, p1}: counter-    \
     * based Philox 4x32-10: element i (row-major) of out uses counter offset + i and key \
     * seed, so every backend draws the same numbers (src/kernels/philox.h) */            \
    X(RNG, rng, ANY, GPU_OWN)                                                             \
    /* optional (nn composes log_softmax, gather, sum, exp and scatter_add): the fused    \
     * linear cross-entropy's rows (src/nn/linear_ce.c). dst {loss [c], dz [c, V] or      \
     * NULL}, src {z [c, V], target (EM_I64 [c], each in [0, V)), valid [c], rowscale      \
     * [c] or NULL (NULL exactly when dz is)}; f {s}: with logp = log_softmax(z) per row   \
     * and q = (1 - s) one_hot(target) + s / V, loss = valid (-(1 - s) logp[target] - s /  \
     * V sum(logp)) and dz = rowscale (exp(logp) - q), summed in the composition's order;  \
     * every tensor contiguous, all but target of the call's dtype */                     \
    X(CE_ROWS, ce_rows, FLOAT, GPU_OWN)                                                   \
    /* ---- attention ----                                                                \
     * optional (core composes matmul, softmax and matmul). dst {out [B, Hq, L, Ev],      \
     * lse [B, Hq, L] float32 contiguous, or NULL, work (a float32 contiguous workspace   \
     * of i[2] * B * Hq * L * (Ev + 2) elements) or NULL}, src {q [B, Hq, L, E], k [B, Hkv, S, \
     * E], v [B, Hkv, S, Ev], key_mask (EM_BOOL [B, S] contiguous) or NULL}; f {scale};   \
     * i {causal, past, splits}: out = softmax(scale q k^T) v per (batch, query head), query \
     * head h reading key/value head h / (Hq / Hkv); query i (at position past + i) sees  \
     * keys j <= past + i when causal, and only keys whose key_mask is true; lse receives \
     * each row's log-sum-exp of its visible scaled scores. A row that sees no key gives  \
     * zeros (lse -inf). q, k, v and out of the call's dtype (16-bit ones accumulate in   \
     * float32), any strides with the last one 1, every size > 0. With work, a backend   \
     * may split the keys into up to `splits` parts whose partial softmax sums it merges  \
     * (the GPUs' split decode: core gives work for a few query rows against many keys) */ \
    X(SDPA, sdpa, FLOAT, GPU_OWN)                                                         \
    /* dst {dq, dk, dv}, src {g, q, k, v, out, lse}; f {scale}; i {causal, past}: the     \
     * backward of SDPA (no key mask) from the output's gradient g (out's shape); dq, dk, \
     * dv of q's, k's and v's shapes (dk, dv summed over the query heads sharing a key    \
     * head), any strides with the last one 1 */                                          \
    X(SDPA_BACKWARD, sdpa_backward, FLOAT, GPU_OWN)                                       \
    /* ---- convolution and pooling (src/core/ops_conv.c): contiguous NCHW tensors with   \
     * the shapes of the window `arg` (an em_window2d); f32, f64, f16 or bf16, one dtype  \
     * (f16/bf16 summed in float32) ----                                                  \
     * required. dst {cols [n, c * kh * kw, oh * ow]}, src {in [n, c, h, w]} (zero        \
     * padding) */                                                                        \
    X(IM2COL, im2col, FLOAT, GPU_OWN)                                                     \
    /* required. dst {in [n, c, h, w]}, src {cols}: the sum of cols' entries at each      \
     * input position (written, not accumulated) */                                       \
    X(COL2IM, col2im, FLOAT, GPU_OWN)                                                     \
    /* required. dst {out [n, c, oh, ow], indices (EM_POOL_MAX only, else NULL): int64    \
     * h * w + w in the plane}, src {in}; i {kind (em_pool_kind)} */                      \
    X(POOL2D, pool2d, FLOAT, GPU_OWN)                                                     \
    /* required. dst {gin [n, c, h, w]}, src {gout, indices (max only)}; i {kind} */      \
    X(POOL2D_BACKWARD, pool2d_backward, FLOAT, GPU_OWN)                                   \
    /* optional (core: im2col + matmul): a convolution library's f32/f16/bf16 conv with   \
     * groups. dst {out}, src {in, w, bias or NULL}; i {groups}. The four conv ops may    \
     * answer EM_ERR_NOT_SUPPORTED with no error recorded: the library cannot run this    \
     * one, and core takes the portable path */                                           \
    X(CONV2D, conv2d, FLOAT, GPU_NONE)                                                    \
    /* dst {gin}, src {gout, w}; i {groups} */                                            \
    X(CONV2D_BACKWARD_INPUT, conv2d_backward_input, FLOAT, GPU_NONE)                      \
    /* dst {gw}, src {gout, in}; i {groups} */                                            \
    X(CONV2D_BACKWARD_WEIGHT, conv2d_backward_weight, FLOAT, GPU_NONE)                    \
    /* dst {gw, gbias [O]}, src {gout, in}; i {groups}: the weight's gradient and the     \
     * bias's (gout summed over N, H and W) from one read of gout (core sums it otherwise) */ \
    X(CONV2D_BACKWARD_WEIGHT_BIAS, conv2d_backward_weight_bias, FLOAT, GPU_NONE)          \
    /* ---- optimizer steps (optional: optim falls back to ops): one pass over the        \
     * elements; every tensor contiguous, on one device, with p's dtype (floating) and    \
     * shape; `arg` the step's em_optim_args (src/backends/optim_args.h) ----             \
     * dst {p, buf (momentum) or NULL}, src {g} */                                        \
    X(SGD_STEP, sgd_step, FLOAT, GPU_OWN)                                                 \
    /* dst {p, m (exp_avg), v (exp_avg_sq), vmax (max_exp_avg_sq, amsgrad) or NULL},      \
     * src {g}. A backend whose `supports` accepts the call with arg's lowp_out set also  \
     * writes p's new value cast to lowp_out's dtype (the mixed-precision weight copy) */ \
    X(ADAM_STEP, adam_step, FLOAT, GPU_OWN)                                               \
    /* optional (optim steps each parameter with ADAM_STEP otherwise): Adam/AdamW over    \
     * many parameters at once. dst {the first parameter}; arg an em_adam_multi           \
     * (optim_args.h): float32 parameters on one device, each with its gradient, exp_avg  \
     * and exp_avg_sq (contiguous, its shape), its em_optim_args (no amsgrad, no scaler)  \
     * and optionally a bf16 or f16 copy of its new value written in the same pass */     \
    X(ADAM_STEP_MULTI, adam_step_multi, FLOAT, GPU_OWN)                                   \
    /* ---- loss scaling (GradScaler); state: a contiguous float32 [4] {scale, growth     \
     * tracker, found_inf, skipped steps} (EM_AMP_*) on the device. Neither waits for the \
     * device ----                                                                        \
     * optional (core unscales with ops). dst {g (contiguous, floating), state}: g *= 1 / \
     * scale; found_inf = 1 if an element of g was inf or NaN */                          \
    X(AMP_UNSCALE, amp_unscale, FLOAT, GPU_OWN)                                           \
    /* required of backends that train with a scaler. dst {state}; f {growth, backoff};   \
     * i {interval}: on found_inf, scale *= backoff, tracker = 0, skipped += 1; else      \
     * tracker += 1 and, at interval, scale *= growth (when finite) and tracker = 0;      \
     * found_inf = 0 for the next iteration */                                            \
    X(AMP_UPDATE, amp_update, FLOAT, GPU_OWN)

/* Fused ops, run from their call as it is: the CPU's `em_status em__cpu_NAME(const
 * em_op_call *)` (any file of src/backends/cpu/; this list declares and dispatches it), and
 * on GPUs the generic launch of the GPU column. Optional: core composes each one where a
 * backend declines it (`supports` false). Inputs and outputs are contiguous. */
#define EMK_OPS_FUSED(X)                                                                  \
    /* LayerNorm over rows of i[0] = n elements: dst {out [rows, n], mean [rows],         \
     * rstd [rows]}, src {x [rows, n], w [n], b [n]}; f {eps}: each row's mean and        \
     * 1 / sqrt(var + eps) (var biased) go to mean and rstd */                            \
    X(LAYER_NORM, layer_norm, F32_F64, GPU_ROWS(3, 3))                                    \
    /* its backward: dst {dx, gxhat = g * xhat}, src {g, x, w}; i {n}; f {eps} */         \
    X(LAYER_NORM_BACKWARD, layer_norm_backward, F32_F64, GPU_ROWS(2, 3))                  \
    /* GELU's (exact, erf) backward: dst {dx}, src {g, x}: dx = g * (Phi(x) + x phi(x)) */ \
    X(GELU_BACKWARD, gelu_backward, F32_F64, GPU_ELEMS(1, 2))                             \
    /* ReLU's backward: dst {dx}, src {g, y}: dx = g where y > 0, else 0 (y: ReLU's       \
     * output; NaN gives 0) */                                                            \
    X(RELU_BACKWARD, relu_backward, FLOAT, GPU_NONE)                                      \
    /* softmax's backward over rows of i[0] = n elements along the last dim: dst {dx},    \
     * src {g, y (the forward's output)}; i {n, log}: softmax: dx = y (g - sum(g y));     \
     * log: dx = g - exp(y) sum(g) */                                                     \
    X(SOFTMAX_BACKWARD, softmax_backward, F32_F64, GPU_NONE)                              \
    /* ---- the language models' ops (src/core/ops_fused.c); f16/bf16 load and compute in \
     * float32 and round where PyTorch rounds ----                                        \
     * RMSNorm over rows of i[0] = n elements: dst {out [rows, n]}, src {x [rows, n],     \
     * w [n] or NULL}; i {n, has_w}; f {eps}: out = x * rsqrt(mean(x^2) + eps) rounded to \
     * x's dtype, then times w and rounded again (F.rms_norm's and HF LlamaRMSNorm's      \
     * order) */                                                                          \
    X(RMS_NORM, rms_norm, FLOAT, GPU_ROWS(1, 2))                                          \
    /* its backward: dst {dx, gxhat or NULL}, src {g, x, w or NULL}; i {n, has_w,         \
     * want_gxhat}; f {eps}: with r = rsqrt(mean(x^2) + eps), xhat = x r, gw = g w (g     \
     * without w): dx = r (gw - xhat mean(gw xhat)) and gxhat = g xhat (summed over rows: \
     * w's gradient), gxhat in the compute dtype (float32 for f16/bf16 x, else x's) */    \
    X(RMS_NORM_BACKWARD, rms_norm_backward, FLOAT, GPU_ROWS(2, 3))                        \
    /* SwiGLU: dst {out}, src {gate, up}: out = silu(gate) * up, silu(gate) rounded to    \
     * the dtype before the product (HF's LlamaMLP computes the two as separate ops) */   \
    X(SWIGLU, swiglu, FLOAT, GPU_ELEMS(1, 2))                                             \
    /* its backward: dst {dgate, dup}, src {g, gate, up}: with s = sigmoid(gate),         \
     * dup = g gate s and dgate = g up s (1 + gate (1 - s)) */                            \
    X(SWIGLU_BACKWARD, swiglu_backward, FLOAT, GPU_ELEMS(2, 3))                           \
    /* rotary position embedding, HF's rotate_half layout, over rows of i[0] = D (even)   \
     * elements: dst {out [B, H, T, D] contiguous}, src {x, cos, sin}; i {D, H, T, sb,    \
     * sh, st, per_batch, backward}. x is [B, H, T, D] with the last stride 1 and the     \
     * others sb, sh, st (elements; the one exception to "inputs are contiguous"); cos   \
     * and sin are contiguous [T, D] (per_batch 0) or [B, T, D] (1). With h = D / 2 and   \
     * j < h: forward out[j] = x[j] cos[j] - x[j+h] sin[j], out[j+h] = x[j+h] cos[j+h]    \
     * + x[j] sin[j+h], each product rounded to the dtype before the sum (HF's ops);      \
     * backward (the transpose, a rotation by -theta): out[j] = x[j] cos[j] +             \
     * x[j+h] sin[j+h], out[j+h] = x[j+h] cos[j+h] - x[j] sin[j] */                       \
    X(ROPE, rope, FLOAT, GPU_ROWS(1, 3))                                                  \
    /* ---- optimizer steps (src/optim/adaptive.c, dispatched by src/core/ops_optim.c):   \
     * one pass over p's elements. i[0]: the flags EMK_OPTF_* (layout.h); f: the scalars, \
     * each rounded to the dtype first, as the op-by-op path's scalar arguments are.      \
     * First g = -g with MAXIMIZE, then with WD (not DECOUPLED) g += p * wd, or with WD   \
     * and DECOUPLED p *= f's decay; each lerp is per LERP_BIG with the constant c; each  \
     * decaying state below the dtype's smallest normal is stored as 0 (cpu_optim.c) ----  \
     * Adadelta: dst {p, square_avg, acc_delta}, src {g}; f {rho, 1 - rho, eps, wd, -lr}  \
     * (PyTorch's _single_tensor_adadelta) */                                            \
    X(ADADELTA_STEP, adadelta_step, FLOAT, GPU_ELEMS(3, 1))                               \
    /* Adagrad: dst {p, sum}, src {g}; f {eps, wd, -lr / (1 + (step - 1) lr_decay)} */    \
    X(ADAGRAD_STEP, adagrad_step, FLOAT, GPU_ELEMS(2, 1))                                 \
    /* RMSprop: dst {p, square_avg, momentum_buffer (MOMENTUM) or NULL, grad_avg          \
     * (CENTERED) or NULL}, src {g}; f {alpha, 1 - alpha, c (grad_avg's lerp), eps, wd,    \
     * momentum, -lr} */                                                                  \
    X(RMSPROP_STEP, rmsprop_step, FLOAT, GPU_ELEMS(4, 1))                                 \
    /* Adamax: dst {p, exp_avg, exp_inf}, src {g}; f {c, beta2, eps, wd, -lr / (1 -       \
     * beta1^step)} */                                                                    \
    X(ADAMAX_STEP, adamax_step, FLOAT, GPU_ELEMS(3, 1))                                   \
    /* NAdam: dst {p, exp_avg, exp_avg_sq}, src {g}; f {c, beta2, 1 - beta2,              \
     * bias_correction2, eps, wd or (DECOUPLED) 1 - lr wd, grad's factor, exp_avg's       \
     * factor} */                                                                         \
    X(NADAM_STEP, nadam_step, FLOAT, GPU_ELEMS(3, 1))                                     \
    /* RAdam: dst {p, exp_avg, exp_avg_sq}, src {g}; f {c, beta2, 1 - beta2, eps, wd or   \
     * (DECOUPLED) 1 - lr wd, scale}: p += scale * (RECTIFIED ? exp_avg / (sqrt(exp_avg_sq) \
     * + eps) : exp_avg) */                                                               \
    X(RADAM_STEP, radam_step, FLOAT, GPU_ELEMS(3, 1))

/* every op, in em_op order */
#define EMK_OPS_ALL(X)                                                                    \
    EMK_OPS_UNARY(X) EMK_OPS_BINARY(X) EMK_OPS_COMPARE(X) EMK_OPS_REDUCE(X) EMK_OPS_TENSOR(X) \
    EMK_OPS_FUSED(X)

#endif
