/* Reductions (sum, mean, max, min over a list of dims; argmax / argmin over one) and
 * softmax. A 0-d input is handled as a 1-element vector. */
#include "ops_internal.h"
#include <math.h>
#include <stdio.h>

/* Which dims of a are reduced. EM_ALL_DIMS means all; negative dims wrap; repeats are errors. */
static em_status parse_dims(const char *op, const em_tensor *a, em_dims dims, bool *reduce) {
    int nd = a->ndim;
    for (int i = 0; i < EM_MAX_DIMS; i++) reduce[i] = false;
    if (dims.n < 0 || dims.n > EM_MAX_DIMS)
        return em_error(EM_ERR_ARGUMENT, "%s: a list of 0 to %d dims was expected, got %d", op, EM_MAX_DIMS, dims.n);
    if (dims.n == 0) {
        for (int i = 0; i < nd; i++) reduce[i] = true;
        return EM_OK;
    }
    bool seen[EM_MAX_DIMS] = {false};
    for (int i = 0; i < dims.n; i++) {
        int d = dims.d[i];
        if (em__wrap_dim(&d, nd, op)) return em_last_status();
        if (seen[d]) return em_error(EM_ERR_ARGUMENT, "%s: dim %d appears multiple times in the list of dims", op, d);
        seen[d] = true;
        if (nd > 0) reduce[d] = true;
    }
    return EM_OK;
}

/* Runs one reduction: `in` is a's elements as the backend sees them (a 0-d a becomes [1]),
 * out gets the keepdim shape, then loses the reduced dims unless keepdim. */
static em_tensor *reduce_run(const char *torch_name, em_op kop, em_tensor *a, em_dtype dt, const bool *reduce_a,
                             bool keepdim, const char *op) {
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    em_dtype compute = kop == EM_OP_ARGMAX || kop == EM_OP_ARGMIN ? a->dtype : dt;
    if (em__check_support(op, be, kop, compute, dev)) return NULL;
    /* The backend's view of the input: a itself, or a 0-d a as shape [1]. */
    em_tensor in_view;
    bool reduce[EM_MAX_DIMS];
    const em_tensor *in = a;
    if (a->ndim == 0) {
        int64_t one = 1, st1 = 1;
        em__stack_view(&in_view, a, 1, &one, &st1, a->offset);
        in = &in_view;
        reduce[0] = true;
    } else {
        memcpy(reduce, reduce_a, sizeof reduce);
    }
    int64_t shape[EM_MAX_DIMS];
    for (int i = 0; i < in->ndim; i++) shape[i] = reduce[i] ? 1 : in->shape[i];
    em_dtype out_dt = kop == EM_OP_ARGMAX || kop == EM_OP_ARGMIN ? EM_I64 : dt;
    em_tensor *out = em__tensor_new_on(be, dev, in->ndim, shape, out_dt);
    if (!out) return NULL;
    em_status st = EM_OK;
    int64_t out_n = em__numel_raw(in->ndim, shape);
    if (em__numel_raw(in->ndim, in->shape) == 0) {
        if (out_n > 0) { /* an empty reduced dim: sum is 0, mean NaN, max/min/argmax undefined */
            if (kop == EM_OP_SUM || kop == EM_OP_MEAN) {
                st = em__run_fill(out, kop == EM_OP_SUM ? 0.0 : NAN, op);
            } else {
                int zero_dim = 0;
                for (int i = 0; i < in->ndim; i++)
                    if (reduce[i] && in->shape[i] == 0) zero_dim = i;
                st = em_error(EM_ERR_ARGUMENT, "%s: %s(): Expected reduction dim %d to have non-zero size.", op,
                              torch_name, zero_dim);
            }
        }
    } else {
        em_tensor *tmp = NULL;
        const em_tensor *src = in;
        if (in->dtype != dt && kop != EM_OP_ARGMAX && kop != EM_OP_ARGMIN) {
            src = tmp = em__copy_raw(in, dt);
            if (!tmp) st = em_last_status();
        }
        if (st == EM_OK)
            st = em__op_run(&(em_op_call){.op = kop, .dtype = compute, .dst = {out}, .src = {src},
                                          .i = {em__reduce_bits(in->ndim, reduce)}}, op);
        em_release(tmp);
    }
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    if (a->ndim == 0 || !keepdim) { /* drop the reduced dims: out is fresh and contiguous */
        int n = 0;
        for (int i = 0; i < in->ndim; i++)
            if (!reduce[i]) out->shape[n++] = in->shape[i];
        out->ndim = a->ndim == 0 ? 0 : n;
        em__contiguous_strides(out->ndim, out->shape, out->strides);
    }
    return out;
}

static em_tensor *reduction(const char *op, const char *torch_name, em_op kop, em_grad_op gop, em_tensor *a,
                            em_dims dims, bool keepdim) {
    EM_CHECK_ARG(a, op, "a");
    em_dtype dt = a->dtype;
    if (kop == EM_OP_SUM && !em_dtype_is_floating(dt)) dt = EM_I64;
    if (kop == EM_OP_MEAN && !em_dtype_is_floating(dt)) {
        em_error(EM_ERR_DTYPE, "%s: mean(): could not infer output dtype. Input dtype must be either a floating point "
                               "or complex dtype. Got: %s", op, em__dtype_torch_name(dt));
        return NULL;
    }
    em_grad_args args = em__no_args;
    if (parse_dims(op, a, dims, args.reduce)) return NULL;
    if ((kop == EM_OP_MAX || kop == EM_OP_MIN) && dims.n == 0 && em__numel_raw(a->ndim, a->shape) == 0) {
        em_error(EM_ERR_ARGUMENT, "%s: %s(): Expected reduction dim to be specified for input.numel() == 0. Specify "
                                  "the reduction dim with the 'dim' argument.", op, torch_name);
        return NULL;
    }
    args.keepdim = keepdim;
    em_tensor *out = reduce_run(torch_name, kop, a, dt, args.reduce, keepdim, op);
    return em__finish(out, gop, 1, &a, &args);
}

em_tensor *em_sum(em_tensor *a, em_dims dims, bool keepdim) {
    EM_AUTOCAST1(EM_AC_SUM, em_sum(a, dims, keepdim), a);
    return reduction("em_sum", "sum", EM_OP_SUM, EM_GRAD_SUM, a, dims, keepdim);
}
em_tensor *em_mean(em_tensor *a, em_dims dims, bool keepdim) {
    EM_AUTOCAST1(EM_AC_MEAN, em_mean(a, dims, keepdim), a);
    return reduction("em_mean", "mean", EM_OP_MEAN, EM_GRAD_MEAN, a, dims, keepdim);
}
em_tensor *em_max(em_tensor *a, em_dims dims, bool keepdim) {
    return reduction("em_max", "max", EM_OP_MAX, EM_GRAD_MAX, a, dims, keepdim);
}
em_tensor *em_min(em_tensor *a, em_dims dims, bool keepdim) {
    return reduction("em_min", "min", EM_OP_MIN, EM_GRAD_MIN, a, dims, keepdim);
}

static em_tensor *arg_reduction(const char *op, const char *torch_name, em_op kop, em_tensor *a, int dim, bool keepdim) {
    EM_CHECK_ARG(a, op, "a");
    if (em__wrap_dim(&dim, a->ndim, op)) return NULL;
    bool reduce[EM_MAX_DIMS] = {false};
    if (a->ndim > 0) reduce[dim] = true;
    return em__scoped(reduce_run(torch_name, kop, a, a->dtype, reduce, keepdim, op));
}

em_tensor *em_argmax(em_tensor *a, int dim, bool keepdim) {
    return arg_reduction("em_argmax", "argmax", EM_OP_ARGMAX, a, dim, keepdim);
}
em_tensor *em_argmin(em_tensor *a, int dim, bool keepdim) {
    return arg_reduction("em_argmin", "argmin", EM_OP_ARGMIN, a, dim, keepdim);
}

static em_tensor *softmax_impl(const char *op, em_tensor *a, int dim, bool log) {
    EM_CHECK_ARG(a, op, "a");
    if (em__wrap_dim(&dim, a->ndim, op)) return NULL;
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    em_dtype dt = em_dtype_is_floating(a->dtype) ? a->dtype : EM_F32;
    em_tensor *out = em__tensor_new_on(be, dev, a->ndim, a->shape, dt);
    if (!out) return NULL;
    em_tensor *tmp = NULL, in_view, out_view;
    const em_tensor *src = a;
    em_status st = EM_OK;
    if (a->dtype != dt) {
        src = tmp = em__copy_raw(a, dt);
        if (!tmp) st = em_last_status();
    }
    if (st == EM_OK && em__numel_raw(a->ndim, a->shape) > 0) {
        em_tensor *dst = out;
        if (a->ndim == 0) { /* softmax of a 0-d tensor: a 1-element vector */
            int64_t one = 1, st1 = 1;
            em__stack_view(&in_view, src, 1, &one, &st1, src->offset);
            em__stack_view(&out_view, out, 1, &one, &st1, 0);
            src = &in_view;
            dst = &out_view;
        }
        st = em__op_run(&(em_op_call){.op = EM_OP_SOFTMAX, .dtype = dt, .dst = {dst}, .src = {src}, .i = {dim, log}}, op);
    }
    em_release(tmp);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_grad_args args = em__no_args;
    args.dim = dim;
    return em__finish(out, log ? EM_GRAD_LOG_SOFTMAX : EM_GRAD_SOFTMAX, 1, &a, &args);
}

em_tensor *em_softmax(em_tensor *a, int dim) {
    EM_AUTOCAST1(EM_AC_SOFTMAX, em_softmax(a, dim), a);
    return softmax_impl("em_softmax", a, dim, false);
}
em_tensor *em_log_softmax(em_tensor *a, int dim) {
    EM_AUTOCAST1(EM_AC_LOG_SOFTMAX, em_log_softmax(a, dim), a);
    return softmax_impl("em_log_softmax", a, dim, true);
}
