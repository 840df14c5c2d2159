/* In-place ops. Each refuses writes that PyTorch refuses (a leaf that requires grad while
 * grad mode is on; a tensor whose elements alias through stride 0; memory imported
 * read-only), and bumps the storage's
 * version so that autograd can detect tensors modified after being saved. */
#include "ops_internal.h"
#include <stdio.h>

static em_status check_writable(const char *op, em_tensor *t) {
    if (t->storage->read_only)
        return em_error(EM_ERR_ARGUMENT, "%s: the tensor is read-only (imported through DLPack with the read-only "
                                         "flag); write to a copy (em_clone) instead", op);
    if (t->requires_grad && t->is_leaf && em__grad_needed(1, &t))
        return em_error(EM_ERR_AUTOGRAD, "%s: a leaf Variable that requires grad is being used in an in-place operation.",
                        op);
    for (int i = 0; i < t->ndim; i++)
        if (t->strides[i] == 0 && t->shape[i] > 1)
            return em_error(EM_ERR_ARGUMENT, "%s: unsupported operation: more than one element of the written-to tensor "
                                             "refers to a single memory location. Please clone() the tensor before "
                                             "performing the operation.", op);
    return EM_OK;
}

void em__bump_version(em_tensor *t) { atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed); }

static bool same_view(const em_tensor *a, const em_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->dtype != b->dtype || !em__same_shape(a, b)) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->strides[i] != b->strides[i] && a->shape[i] != 1) return false;
    return true;
}

/* src must broadcast to dst's shape exactly. */
static em_status check_broadcasts_to(const char *op, const em_tensor *src, const em_tensor *dst) {
    bool ok = src->ndim <= dst->ndim;
    for (int i = 0; ok && i < src->ndim; i++) {
        int64_t s = src->shape[i], d = dst->shape[dst->ndim - src->ndim + i];
        ok = s == d || s == 1;
    }
    if (ok) return EM_OK;
    char s1[128], s2[128];
    return em_error(EM_ERR_SHAPE, "%s: a tensor of shape %s cannot be broadcast to the destination's shape %s", op,
                    em__shape_str(s1, sizeof s1, src->ndim, src->shape), em__shape_str(s2, sizeof s2, dst->ndim, dst->shape));
}

/* src on dst's device, not partially overlapping dst: src itself (new reference) or a copy. */
static em_tensor *source_for(em_tensor *dst, em_tensor *src, em_dtype dt) {
    if (!em__same_device(src, dst)) return em__to_raw(src, dst->storage->device, dt, false);
    if (src->storage == dst->storage && !same_view(src, dst)) return em__copy_raw(src, src->dtype);
    return em_retain(src);
}

em_status em_copy_(em_tensor *dst, em_tensor *src) {
    const char *op = "em_copy_";
    EM_CHECK_ARG_STATUS(dst, op, "dst");
    EM_CHECK_ARG_STATUS(src, op, "src");
    if (check_writable(op, dst) || check_broadcasts_to(op, src, dst)) return em_last_status();
    em_status direct;
    if (em__copy_host_device(dst, src, &direct)) { /* no staging tensor between host and device */
        if (direct == EM_OK) em__bump_version(dst);
        return direct;
    }
    em_tensor *s = source_for(dst, src, src->dtype);
    if (!s) return em_last_status();
    em_tensor view, *tmp;
    const em_tensor *p = em__prepare(s, s->dtype, dst->ndim, dst->shape, &view, &tmp);
    em_status st = p ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(dst->ndim, dst->shape) > 0 && p != dst) st = em__run_copy(dst, p, op);
    em_release(tmp);
    em_release(s);
    if (st == EM_OK) em__bump_version(dst);
    return st;
}

em_status em_fill_(em_tensor *t, double value) {
    EM_CHECK_ARG_STATUS(t, "em_fill_", "t");
    if (check_writable("em_fill_", t)) return em_last_status();
    em_status st = em__numel_raw(t->ndim, t->shape) > 0 ? em__run_fill(t, value, "em_fill_") : EM_OK;
    if (st == EM_OK) em__bump_version(t);
    return st;
}

em_status em_zero_(em_tensor *t) {
    EM_CHECK_ARG_STATUS(t, "em_zero_", "t");
    return em_fill_(t, 0.0);
}

static em_status cast_error(const char *op, em_dtype from, em_dtype to) {
    return em_error(EM_ERR_DTYPE, "%s: result type %s can't be cast to the desired output type %s", op,
                    em__dtype_torch_name(from), em__dtype_torch_name(to));
}

/* t = t + alpha * other (EM_OP_ADD) or t = t * other (EM_OP_MUL, alpha 1), other broadcast to
 * t, computed in the promoted dtype and cast back into t. */
static em_status binary_inplace(const char *op, em_op kop, em_tensor *t, em_tensor *other, double alpha) {
    EM_CHECK_ARG_STATUS(t, op, "t");
    EM_CHECK_ARG_STATUS(other, op, "other");
    em_tensor *in[2] = {t, other};
    if (em__check_same_device(op, 2, (const em_tensor *const *)in)) return em_last_status();
    if (check_writable(op, t) || check_broadcasts_to(op, other, t)) return em_last_status();
    em_dtype compute = t->dtype == other->dtype ? t->dtype : em__result_type(2, in);
    if (!em_dtype_is_floating(compute) && alpha != (double)(int64_t)alpha)
        return em_error(EM_ERR_ARGUMENT, "%s: For integral input tensors, argument alpha must not be a floating point "
                                         "number.", op);
    if (compute == EM_BOOL && alpha != 1 && alpha != 0) compute = EM_I64;
    if (!em__can_cast(compute, t->dtype)) return cast_error(op, compute, t->dtype);
    const em_backend *be = t->storage->backend;
    em_device dev = t->storage->device;
    if (em__check_support(op, be, kop, compute, dev)) return em_last_status();
    if (em__numel_raw(t->ndim, t->shape) == 0) return EM_OK;
    em_tensor *src = source_for(t, other, other->dtype), *scaled = NULL, *tcast = NULL, *res = NULL;
    em_tensor vo, *to = NULL;
    em_status st = src ? EM_OK : em_last_status();
    const em_tensor *po = NULL;
    if (st == EM_OK && alpha != 1) { /* alpha * other at other's size, in the compute dtype */
        const em_tensor *pc = em__prepare(src, compute, src->ndim, src->shape, &vo, &to);
        scaled = pc ? em__tensor_new_on(be, dev, src->ndim, src->shape, compute) : NULL;
        st = scaled ? em__op_run(&(em_op_call){.op = EM_OP_MUL_SCALAR, .dtype = compute, .dst = {scaled},
                                               .src = {pc}, .f = {alpha}}, op)
                    : em_last_status();
        em_release(to);
        to = NULL;
    }
    if (st == EM_OK) {
        po = em__prepare(scaled ? scaled : src, compute, t->ndim, t->shape, &vo, &to);
        if (!po) st = em_last_status();
    }
    if (st == EM_OK && compute == t->dtype) {
        /* out is exactly a: allowed by the contract */
        st = em__op_run(&(em_op_call){.op = kop, .dtype = compute, .dst = {t}, .src = {t, po}}, op);
    } else if (st == EM_OK) { /* compute in the wider dtype, then cast back into t */
        tcast = em__copy_raw(t, compute);
        res = tcast ? em__tensor_new_on(be, dev, t->ndim, t->shape, compute) : NULL;
        st = res ? em__op_run(&(em_op_call){.op = kop, .dtype = compute, .dst = {res}, .src = {tcast, po}}, op)
                 : em_last_status();
        if (st == EM_OK) st = em__run_copy(t, res, op);
    }
    em_release(to);
    em_release(scaled);
    em_release(src);
    em_release(tcast);
    em_release(res);
    if (st == EM_OK) em__bump_version(t);
    return st;
}

em_status em_add_(em_tensor *t, em_tensor *other, double alpha) {
    return binary_inplace("em_add_", EM_OP_ADD, t, other, alpha);
}

em_status em_mul_(em_tensor *t, em_tensor *other) { return binary_inplace("em_mul_", EM_OP_MUL, t, other, 1.0); }

em_status em_exp_(em_tensor *t) {
    const char *op = "em_exp_";
    EM_CHECK_ARG_STATUS(t, op, "t");
    if (check_writable(op, t)) return em_last_status();
    /* exp of an integer or bool tensor is a float, which the tensor cannot hold */
    if (!em_dtype_is_floating(t->dtype)) return cast_error(op, EM_F32, t->dtype);
    if (em__check_support(op, t->storage->backend, EM_OP_EXP, t->dtype, t->storage->device)) return em_last_status();
    em_status st = em__numel_raw(t->ndim, t->shape) > 0
                       ? em__op_run(&(em_op_call){.op = EM_OP_EXP, .dtype = t->dtype, .dst = {t}, .src = {t}}, op)
                       : EM_OK;
    if (st == EM_OK) em__bump_version(t);
    return st;
}

em_status em_mul_scalar_(em_tensor *t, double s) {
    const char *op = "em_mul_scalar_";
    EM_CHECK_ARG_STATUS(t, op, "t");
    if (check_writable(op, t)) return em_last_status();
    em_dtype compute = em__scalar_result_type(t->dtype, s);
    if (!em__can_cast(compute, t->dtype)) return cast_error(op, compute, t->dtype);
    const em_backend *be = t->storage->backend;
    em_device dev = t->storage->device;
    if (em__check_support(op, be, EM_OP_MUL_SCALAR, compute, dev)) return em_last_status();
    em_status st = em__numel_raw(t->ndim, t->shape) > 0
                       ? em__op_run(&(em_op_call){.op = EM_OP_MUL_SCALAR, .dtype = compute, .dst = {t}, .src = {t},
                                                  .f = {s}}, op)
                       : EM_OK;
    if (st == EM_OK) em__bump_version(t);
    return st;
}
