/* The list of backend ops: one X(NAME, name, DTYPES) entry per op, read by host C (the
 * em_op enum and the supports tables in src/backends/backend.h, the CPU's op names) and by
 * the kernels (the EMK_U_* / EMK_B_* / EMK_R_* codes in layout.h), so it uses only the
 * preprocessor. A new op is one line here; the kernel codes follow the em_op order, which
 * is what lets the GPU layer pass `op - EM_OP_NEG` (unary) and `op - EM_OP_ADD` (binary).
 * Put a new op inside its list: backends bound their range checks by the first and last
 * entries, and the unary ops taking params (ADD_SCALAR..CLAMP) close the unary list
 * (backend.h asserts the bounds).
 *
 * DTYPES: the dtypes a backend computes the op in (core casts the others first, as
 * PyTorch promotes them):
 *   FLOAT    floating dtypes only (integers compute in the default float dtype)
 *   NUMERIC  every dtype but bool
 *   ANY      every dtype
 *   TRUEDIV  numeric on the CPU reference (its integer kernel divides), floating on GPUs:
 *            core divides integers as floats, so GPUs keep no integer division kernel */
#ifndef EMK_OP_LIST_H
#define EMK_OP_LIST_H

/* unary: out = f(in); the scalar ops take params[0] (clamp also params[1]) */
#define EMK_OPS_UNARY(X)                                                                  \
    X(NEG, neg, NUMERIC)                                                                  \
    X(ABS, abs, NUMERIC)                                                                  \
    X(EXP, exp, FLOAT)                                                                    \
    X(LOG, log, FLOAT)                                                                    \
    X(SQRT, sqrt, FLOAT)                                                                  \
    X(RSQRT, rsqrt, FLOAT)                                                                \
    X(TANH, tanh, FLOAT)                                                                  \
    X(SIGMOID, sigmoid, FLOAT)                                                            \
    X(RELU, relu, NUMERIC)                                                                \
    X(GELU, gelu, FLOAT)                                                                  \
    X(SIGN, sign, NUMERIC)                                                                \
    X(SQUARE, square, NUMERIC)                                                            \
    X(RECIPROCAL, reciprocal, FLOAT)                                                      \
    X(ADD_SCALAR, add_scalar, NUMERIC)   /* in + params[0] */                             \
    X(MUL_SCALAR, mul_scalar, NUMERIC)   /* in * params[0] */                             \
    X(DIV_SCALAR, div_scalar, FLOAT)     /* in / params[0] */                             \
    X(RSUB_SCALAR, rsub_scalar, NUMERIC) /* params[0] - in */                             \
    X(POW_SCALAR, pow_scalar, NUMERIC)   /* in ^ params[0] */                             \
    X(CLAMP, clamp, NUMERIC)             /* between params[0] and params[1] */
/* binary arithmetic: out = f(a, b) in the inputs' dtype */
#define EMK_OPS_BINARY(X)                                                                 \
    X(ADD, add, ANY)                                                                      \
    X(SUB, sub, NUMERIC)                                                                  \
    X(MUL, mul, ANY)                                                                      \
    X(DIV, div, TRUEDIV)                                                                  \
    X(POW, pow, NUMERIC)                                                                  \
    X(MAXIMUM, maximum, ANY)                                                              \
    X(MINIMUM, minimum, ANY)
/* comparisons: binary ops that write bool; they follow the arithmetic ones */
#define EMK_OPS_COMPARE(X)                                                                \
    X(EQ, eq, ANY)                                                                        \
    X(NE, ne, ANY)                                                                        \
    X(LT, lt, ANY)                                                                        \
    X(LE, le, ANY)                                                                        \
    X(GT, gt, ANY)                                                                        \
    X(GE, ge, ANY)                                                                        \
    X(LOGICAL_AND, logical_and, ANY)
/* reductions over marked dims */
#define EMK_OPS_REDUCE(X)                                                                 \
    X(SUM, sum, NUMERIC)                                                                  \
    X(MEAN, mean, FLOAT)                                                                  \
    X(MAX, max, ANY)                                                                      \
    X(MIN, min, ANY)                                                                      \
    X(ARGMAX, argmax, ANY)                                                                \
    X(ARGMIN, argmin, ANY)

/* every op, in em_op order */
#define EMK_OPS_ALL(X) EMK_OPS_UNARY(X) EMK_OPS_BINARY(X) EMK_OPS_COMPARE(X) EMK_OPS_REDUCE(X)

#endif
