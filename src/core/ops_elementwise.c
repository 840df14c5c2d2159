/* Elementwise ops: binary with broadcasting, with a scalar, unary, and where. Each checks
 * devices, promotes dtypes, prepares inputs (cast / stride-0 expand only when needed) and
 * hands the backend tensors of out's shape in the compute dtype. */
#include "ops_internal.h"
#include <math.h>

typedef enum { ARITH, COMPARE, TRUE_DIV } binary_kind;

static em_tensor *binary(const char *op, em_op kop, int gop, binary_kind kind, em_tensor *a, em_tensor *b) {
    EM_CHECK_ARG(a, op, "a");
    EM_CHECK_ARG(b, op, "b");
    em_tensor *in[2] = {a, b};
    if (!em__same_device(a, b) && em__check_same_device(op, 2, (const em_tensor *const *)in)) return NULL;
    em_dtype compute = a->dtype == b->dtype ? a->dtype : em__result_type(2, in);
    if (kind == TRUE_DIV && !em_dtype_is_floating(compute)) compute = EM_F32;
    if (kop == EM_OP_SUB && compute == EM_BOOL) {
        em_error(EM_ERR_DTYPE, "%s: Subtraction, the `-` operator, with two bool tensors is not supported. "
                               "Use the `^` or `logical_xor()` operator instead.", op);
        return NULL;
    }
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    if (em__same_shape(a, b)) {
        ndim = a->ndim;
        memcpy(shape, a->shape, sizeof(int64_t) * (size_t)ndim);
    } else if (em__broadcast(op, 2, in, &ndim, shape)) {
        return NULL;
    }
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    if (em__check_support(op, be, kop, compute, dev)) return NULL;
    em_tensor *out = em__tensor_new_on(be, dev, ndim, shape, kind == COMPARE ? EM_BOOL : compute);
    if (!out) return NULL;
    em_tensor va, vb, *ta = NULL, *tb = NULL;
    const em_tensor *pa = em__prepare(a, compute, ndim, shape, &va, &ta);
    const em_tensor *pb = pa ? em__prepare(b, compute, ndim, shape, &vb, &tb) : NULL;
    em_status st = pa && pb ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(ndim, shape) > 0)
        st = em__op_run(&(em_op_call){.op = kop, .dtype = compute, .dst = {out}, .src = {pa, pb}}, op);
    em_release(ta);
    em_release(tb);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    if (gop < 0) return em__scoped(out);
    return em__finish(out, (em_grad_op)gop, 2, in, &em__no_args);
}

em_tensor *em_add(em_tensor *a, em_tensor *b) { return binary("em_add", EM_OP_ADD, EM_GRAD_ADD, ARITH, a, b); }
em_tensor *em_sub(em_tensor *a, em_tensor *b) { return binary("em_sub", EM_OP_SUB, EM_GRAD_SUB, ARITH, a, b); }
em_tensor *em_mul(em_tensor *a, em_tensor *b) { return binary("em_mul", EM_OP_MUL, EM_GRAD_MUL, ARITH, a, b); }
em_tensor *em_div(em_tensor *a, em_tensor *b) { return binary("em_div", EM_OP_DIV, EM_GRAD_DIV, TRUE_DIV, a, b); }
em_tensor *em_pow(em_tensor *a, em_tensor *b) {
    EM_AUTOCAST2(EM_AC_POW, em_pow(a, b), a, b);
    return binary("em_pow", EM_OP_POW, EM_GRAD_POW, ARITH, a, b); }
em_tensor *em_maximum(em_tensor *a, em_tensor *b) {
    return binary("em_maximum", EM_OP_MAXIMUM, EM_GRAD_MAXIMUM, ARITH, a, b);
}
em_tensor *em_minimum(em_tensor *a, em_tensor *b) {
    return binary("em_minimum", EM_OP_MINIMUM, EM_GRAD_MINIMUM, ARITH, a, b);
}
em_tensor *em_eq(em_tensor *a, em_tensor *b) { return binary("em_eq", EM_OP_EQ, -1, COMPARE, a, b); }
em_tensor *em_ne(em_tensor *a, em_tensor *b) { return binary("em_ne", EM_OP_NE, -1, COMPARE, a, b); }
em_tensor *em_lt(em_tensor *a, em_tensor *b) { return binary("em_lt", EM_OP_LT, -1, COMPARE, a, b); }
em_tensor *em_le(em_tensor *a, em_tensor *b) { return binary("em_le", EM_OP_LE, -1, COMPARE, a, b); }
em_tensor *em_gt(em_tensor *a, em_tensor *b) { return binary("em_gt", EM_OP_GT, -1, COMPARE, a, b); }
em_tensor *em_ge(em_tensor *a, em_tensor *b) { return binary("em_ge", EM_OP_GE, -1, COMPARE, a, b); }

/* out = f(a) in dtype `compute` (a is cast when it differs); params go to the backend. */
static em_tensor *unary(const char *op, em_op kop, int gop, em_tensor *a, em_dtype compute, const double *params,
                        const em_grad_args *args) {
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    if (em__check_support(op, be, kop, compute, dev)) return NULL;
    em_tensor *out = em__tensor_new_on(be, dev, a->ndim, a->shape, compute);
    if (!out) return NULL;
    em_tensor *tmp = NULL;
    em_status st = EM_OK;
    const em_tensor *pa = a;
    if (a->dtype != compute) {
        pa = tmp = em__copy_raw(a, compute);
        if (!tmp) st = em_last_status();
    }
    if (st == EM_OK && em__numel_raw(a->ndim, a->shape) > 0)
        st = em__op_run(&(em_op_call){.op = kop, .dtype = compute, .dst = {out}, .src = {pa}, .f = EM_UNARY_PARAMS(kop, params)}, op);
    em_release(tmp);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    if (gop < 0) return em__scoped(out);
    return em__finish(out, (em_grad_op)gop, 1, &a, args);
}

static em_tensor *with_scalar(const char *op, em_op kop, em_grad_op gop, em_tensor *a, double s, em_dtype compute) {
    double params[2] = {s, 0};
    em_grad_args args = em__no_args;
    args.s[0] = s;
    return unary(op, kop, gop, a, compute, params, &args);
}

static bool reject_bool_sub(const char *op, em_dtype dt) {
    if (dt != EM_BOOL) return false;
    em_error(EM_ERR_DTYPE, "%s: Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.", op);
    return true;
}

em_tensor *em_add_scalar(em_tensor *a, double s) {
    EM_CHECK_ARG(a, "em_add_scalar", "a");
    return with_scalar("em_add_scalar", EM_OP_ADD_SCALAR, EM_GRAD_ADD_SCALAR, a, s, em__scalar_result_type(a->dtype, s));
}

em_tensor *em_sub_scalar(em_tensor *a, double s) {
    EM_CHECK_ARG(a, "em_sub_scalar", "a");
    em_dtype dt = em__scalar_result_type(a->dtype, s);
    if (reject_bool_sub("em_sub_scalar", a->dtype)) return NULL;
    return with_scalar("em_sub_scalar", EM_OP_ADD_SCALAR, EM_GRAD_ADD_SCALAR, a, -s, dt);
}

em_tensor *em_mul_scalar(em_tensor *a, double s) {
    EM_CHECK_ARG(a, "em_mul_scalar", "a");
    return with_scalar("em_mul_scalar", EM_OP_MUL_SCALAR, EM_GRAD_MUL_SCALAR, a, s, em__scalar_result_type(a->dtype, s));
}

em_tensor *em_div_scalar(em_tensor *a, double s) {
    EM_CHECK_ARG(a, "em_div_scalar", "a");
    em_dtype dt = em_dtype_is_floating(a->dtype) ? a->dtype : EM_F32;
    return with_scalar("em_div_scalar", EM_OP_DIV_SCALAR, EM_GRAD_DIV_SCALAR, a, s, dt);
}

em_tensor *em_pow_scalar(em_tensor *a, double exponent) {
    EM_CHECK_ARG(a, "em_pow_scalar", "a");
    EM_AUTOCAST1(EM_AC_POW, em_pow_scalar(a, exponent), a);
    em_dtype dt = em__scalar_result_type(a->dtype, exponent);
    if (!em_dtype_is_floating(dt) && exponent < 0) {
        em_error(EM_ERR_ARGUMENT, "em_pow_scalar: Integers to negative integer powers are not allowed.");
        return NULL;
    }
    return with_scalar("em_pow_scalar", EM_OP_POW_SCALAR, EM_GRAD_POW_SCALAR, a, exponent, dt);
}

em_tensor *em_clamp(em_tensor *a, double lo, double hi) {
    EM_CHECK_ARG(a, "em_clamp", "a");
    if (isnan(lo) && isnan(hi)) {
        em_error(EM_ERR_ARGUMENT, "em_clamp: At least one of 'min' or 'max' must not be None (both are NaN)");
        return NULL;
    }
    /* An infinite bound means "no bound": it must not turn an integer tensor into floats. */
    em_dtype dt = a->dtype;
    if (isfinite(lo)) dt = em__scalar_result_type(dt, lo);
    if (isfinite(hi)) dt = em__scalar_result_type(dt, hi);
    double params[2] = {lo, hi};
    em_grad_args args = em__no_args;
    args.s[0] = lo;
    args.s[1] = hi;
    return unary("em_clamp", EM_OP_CLAMP, EM_GRAD_CLAMP, a, dt, params, &args);
}

/* Float math: integer and bool inputs compute in the default float dtype. */
static em_dtype floating(em_dtype dt) { return em_dtype_is_floating(dt) ? dt : EM_F32; }

#define FLOAT_UNARY(name, kop, gop, acop)                                                \
    em_tensor *name(em_tensor *a) {                                                      \
        EM_CHECK_ARG(a, #name, "a");                                                     \
        EM_AUTOCAST1(acop, name(a), a);                                                  \
        return unary(#name, kop, gop, a, floating(a->dtype), NULL, &em__no_args);        \
    }
FLOAT_UNARY(em_exp, EM_OP_EXP, EM_GRAD_EXP, EM_AC_EXP)
FLOAT_UNARY(em_log, EM_OP_LOG, EM_GRAD_LOG, EM_AC_LOG)
FLOAT_UNARY(em_sqrt, EM_OP_SQRT, EM_GRAD_SQRT, EM_AC_NONE)
FLOAT_UNARY(em_tanh, EM_OP_TANH, EM_GRAD_TANH, EM_AC_NONE)
FLOAT_UNARY(em_sigmoid, EM_OP_SIGMOID, EM_GRAD_SIGMOID, EM_AC_NONE)
FLOAT_UNARY(em_gelu, EM_OP_GELU, EM_GRAD_GELU, EM_AC_NONE)

em_tensor *em_neg(em_tensor *a) {
    EM_CHECK_ARG(a, "em_neg", "a");
    if (a->dtype == EM_BOOL) {
        em_error(EM_ERR_DTYPE, "em_neg: Negation, the `-` operator, on a bool tensor is not supported. If you are "
                               "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
        return NULL;
    }
    return unary("em_neg", EM_OP_NEG, EM_GRAD_NEG, a, a->dtype, NULL, &em__no_args);
}

em_tensor *em_abs(em_tensor *a) {
    EM_CHECK_ARG(a, "em_abs", "a");
    return unary("em_abs", EM_OP_ABS, EM_GRAD_ABS, a, a->dtype, NULL, &em__no_args);
}

em_tensor *em_relu(em_tensor *a) {
    EM_CHECK_ARG(a, "em_relu", "a");
    return unary("em_relu", EM_OP_RELU, EM_GRAD_RELU, a, a->dtype, NULL, &em__no_args);
}

em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b) {
    EM_CHECK_ARG(cond, "em_where", "cond");
    EM_CHECK_ARG(a, "em_where", "a");
    EM_CHECK_ARG(b, "em_where", "b");
    em_tensor *in[3] = {cond, a, b};
    if (em__check_same_device("em_where", 3, (const em_tensor *const *)in)) return NULL;
    if (cond->dtype != EM_BOOL) {
        em_error(EM_ERR_DTYPE, "em_where: where expected condition to be a boolean tensor, but got a tensor with dtype %s",
                 em__dtype_torch_name(cond->dtype));
        return NULL;
    }
    em_dtype dt = em__result_type(2, in + 1);
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    if (em__broadcast("em_where", 3, in, &ndim, shape)) return NULL;
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    em_tensor *out = em__tensor_new_on(be, dev, ndim, shape, dt);
    if (!out) return NULL;
    em_tensor vc, va, vb, *tc = NULL, *ta = NULL, *tb = NULL;
    const em_tensor *pc = em__prepare(cond, EM_BOOL, ndim, shape, &vc, &tc);
    const em_tensor *pa = pc ? em__prepare(a, dt, ndim, shape, &va, &ta) : NULL;
    const em_tensor *pb = pa ? em__prepare(b, dt, ndim, shape, &vb, &tb) : NULL;
    em_status st = pb ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(ndim, shape) > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_WHERE, .dtype = dt, .dst = {out}, .src = {pc, pa, pb}}, "em_where");
    em_release(tc);
    em_release(ta);
    em_release(tb);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return em__finish(out, EM_GRAD_WHERE, 3, in, &em__no_args);
}
