/* Every gradient node type, listed once: record.h makes the em_grad_op enum from these
 * lists, record.c PyTorch's node names and what each node saves, formulas.c the pointwise
 * formulas. A new gradient is one entry here (its formula inline when pointwise).
 *
 * X(NAME, PyTorchNode, SAVES, formula...):
 *   SAVES   what backward reads as saved tensors a, b (in this order): NONE, IN0 (input 0),
 *           IN1 (input 1), IN01 (inputs 0 and 1), OUT (the output), IN0_OUT
 *   formula (pointwise only) fills out[i] for the inputs that need a gradient, from g (the
 *           output's gradient), a, b, s0 = args.s[0], s1 = args.s[1], need0, need1, n (the
 *           node); it runs in no-grad mode inside a scope, with the public ops API
 *           (formulas.c, which follows PyTorch's derivatives.yaml: ties of maximum/minimum
 *           split the gradient, abs'(0) = 0, clamp passes at the bounds). */
#ifndef EM_AUTOGRAD_GRAD_OPS_H
#define EM_AUTOGRAD_GRAD_OPS_H

/* Pointwise gradients. Binary ones take the ORIGINAL operands {a, b} (not broadcast views;
 * the engine reduces each gradient back to its operand's shape); the scalar ones {a} with
 * args.s[0] = the scalar (clamp: s[0] = lo, s[1] = hi); unary ones {a}; where
 * {cond, a, b}, cond not differentiable. */
#define EM_GRAD_POINTWISE(X)                                                              \
    X(ADD, AddBackward0, NONE, out[0] = g; out[1] = g;)                                   \
    X(SUB, SubBackward0, NONE, out[0] = g; if (need1) out[1] = em_neg(g);)                \
    X(MUL, MulBackward0, IN01, if (need0) out[0] = em_mul(g, b);                          \
                               if (need1) out[1] = em_mul(g, a);)                         \
    X(DIV, DivBackward0, IN01, if (need0) out[0] = em_div(g, b);                          \
      if (need1) out[1] = em_neg(em_div(em_mul(g, a), em_mul(b, b)));)                    \
    X(POW, PowBackward1, IN01, ag_pow_grad(g, a, b, need0, need1, out);)                  \
    X(MAXIMUM, MaximumBackward0, IN01, ag_max_min_grad(g, a, b, true, need0, need1, out);) \
    X(MINIMUM, MinimumBackward0, IN01, ag_max_min_grad(g, a, b, false, need0, need1, out);) \
    X(ADD_SCALAR, AddBackward1, NONE, out[0] = g;)                                        \
    X(MUL_SCALAR, MulBackward1, NONE, out[0] = em_mul_scalar(g, s0);)                     \
    X(DIV_SCALAR, DivBackward1, NONE, out[0] = em_div_scalar(g, s0);)                     \
    X(RSUB_SCALAR, RsubBackward1, NONE, out[0] = em_neg(g);)                              \
    X(POW_SCALAR, PowBackward0, IN0,                                                      \
      out[0] = s0 == 0.0 ? em_mul_scalar(g, 0.0)                                          \
                         : em_mul(em_mul_scalar(g, s0), em_pow_scalar(a, s0 - 1.0));)     \
    X(CLAMP, ClampBackward1, IN0,                                                         \
      out[0] = ag_keep_where(em_ge(a, em__ag_scalar_like(a, s0)),                             \
                             ag_keep_where(em_le(a, em__ag_scalar_like(a, s1)), g));)         \
    X(NEG, NegBackward0, NONE, out[0] = em_neg(g);)                                       \
    X(ABS, AbsBackward0, IN0,                                                             \
      out[0] = em_where(em_gt(a, em__ag_scalar_like(a, 0.0)), g,                              \
                        ag_keep_where(em_lt(a, em__ag_scalar_like(a, 0.0)), em_neg(g)));)     \
    X(EXP, ExpBackward0, OUT, out[0] = em_mul(g, a);)                                     \
    X(LOG, LogBackward0, IN0, out[0] = em_div(g, a);)                                     \
    X(SQRT, SqrtBackward0, OUT, out[0] = em_div(g, em_mul_scalar(a, 2.0));)               \
    X(TANH, TanhBackward0, OUT, out[0] = em_mul(g, em_add_scalar(em_neg(em_mul(a, a)), 1.0));) \
    X(SIGMOID, SigmoidBackward0, OUT,                                                     \
      out[0] = em_mul(g, em_mul(a, em_add_scalar(em_neg(a), 1.0)));)                      \
    X(RELU, ReluBackward0, OUT, out[0] = ag_relu_backward(g, a);)                        \
    X(GELU, GeluBackward0, IN0, out[0] = ag_gelu_backward(g, a);)                         \
    X(SWIGLU, SwigluBackward0, IN01, ag_swiglu_backward(g, a, b, need0, need1, out);)    \
    X(WHERE, WhereBackward0, IN0, /* a is the saved condition */                          \
      if (need1) out[1] = ag_keep_where(a, g);                                            \
      if (n->n > 2 && ag_input_needs(&n->in[2])) out[2] = ag_zero_where(a, g);)

/* The other gradients; their formulas are in formulas_shape.c. */
#define EM_GRAD_SHAPE(X)                                                                  \
    /* reductions, inputs {a}; args.reduce[d] marks reduced dims of a, args.keepdim */    \
    X(SUM, SumBackward1, NONE)                                                            \
    X(MEAN, MeanBackward1, NONE)                                                          \
    X(MAX, AmaxBackward0, IN0_OUT)                                                        \
    X(MIN, AminBackward0, IN0_OUT)                                                        \
    /* inputs {a, b}: out = a @ b with torch.matmul's 1-d/batched rules */                \
    X(MATMUL, MmBackward0, IN01)                                                          \
    /* inputs {input, mat1, mat2}: out = input + mat1 @ mat2, 2-d mats, input broadcast */ \
    X(ADDMM, AddmmBackward0, IN12)                                                        \
    /* inputs {a}, args.dim */                                                            \
    X(SOFTMAX, SoftmaxBackward0, OUT)                                                     \
    X(LOG_SOFTMAX, LogSoftmaxBackward0, OUT)                                              \
    /* inputs {a, index}, args.dim; index is not differentiable */                        \
    X(INDEX_SELECT, IndexSelectBackward0, IN1)                                            \
    X(GATHER, GatherBackward0, IN1)                                                       \
    /* inputs {t0 .. tn-1}, args.dim: out = cat(inputs, dim) (stack: unsqueeze + cat) */  \
    X(CAT, CatBackward0, NONE)                                                            \
    /* views and copies, inputs {a} */                                                    \
    /* view / reshape / flatten / squeeze / unsqueeze: a's shape restores it */           \
    X(VIEW, ViewBackward0, NONE)                                                          \
    /* args.perm (transpose records the permutation it makes) */                         \
    X(PERMUTE, PermuteBackward0, NONE)                                                    \
    /* narrow / slice / select: args.dim, args.i[0] = start, args.i[1] = step,            \
       args.i[2] = 1 when select removed the dim */                                       \
    X(SLICE, SliceBackward0, NONE)                                                        \
    /* the gradient summed back to a's shape */                                           \
    X(EXPAND, ExpandBackward0, NONE)                                                      \
    /* contiguous / clone / to(device, dtype): gradient moved back to a's device, dtype */ \
    X(COPY, ToCopyBackward0, NONE)                                                        \
    /* convolution and pooling (formulas_conv.c); args.win holds the window (record.h) */ \
    /* inputs {input, weight} or {input, weight, bias} */                                 \
    X(CONV2D, ConvolutionBackward0, IN01)                                                 \
    /* inputs {input, indices}; the int64 indices are not differentiable */               \
    X(MAX_POOL2D, MaxPool2DWithIndicesBackward0, IN1)                                     \
    /* inputs {input} */                                                                  \
    X(AVG_POOL2D, AvgPool2DBackward0, NONE)                                               \
    X(ADAPTIVE_AVG_POOL2D, AdaptiveAvgPool2DBackward0, NONE) \
    /* norms, embedding, attention: inputs {a, index, src}, args.dim; index not           \
       differentiable */                                                                  \
    X(INDEX_ADD, IndexAddBackward0, IN1)                                                  \
    X(SCATTER_ADD, ScatterAddBackward0, IN1)                                              \
    /* fused LayerNorm: inputs {x, w, b}, args.s[0] = eps, args.i[0] = n (elements per row) */ \
    X(LAYER_NORM, NativeLayerNormBackward0, IN01)                                         \
    /* the language models' ops (ops_fused.c). RMSNorm: inputs {x, w or NULL}, args.s[0] = \
       eps, args.i[0] = n (elements per row) */                                           \
    X(RMS_NORM, FusedRmsNormBackward0, IN01)                                              \
    /* rotary embedding: inputs {x, cos, sin} ([T, D] or [B, T, D] tables); x only is     \
       differentiated (tables that need a gradient take the composition) */              \
    X(ROPE, RopeBackward0, IN12)

#endif
