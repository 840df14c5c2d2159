/* Helpers shared by the op files (ops_*.c): dtype promotion, broadcasting, and preparing
 * inputs for the backend contract (compute dtype, out's shape) without needless copies. */
#ifndef EM_CORE_OPS_INTERNAL_H
#define EM_CORE_OPS_INTERNAL_H

#include "core_internal.h"
#include "../util/errors.h"
#include "autocast.h"
#include <ember/ops.h>

static const em_grad_args em__no_args;

/* PyTorch's result_type: dimensioned tensors decide; 0-d tensors widen them only when they
 * are of a higher category (bool < integer < floating). */
em_dtype em__result_type(int n, em_tensor *const *ts);
/* The dtype of `t op scalar` where the scalar is integral or not: a scalar never widens a
 * tensor's dtype within its category (int32 tensor + 2 is int32, f16 * 2.5 is f16), but an
 * integer or bool tensor with a fractional scalar gives float32, and bool with an integer
 * scalar gives int64. */
em_dtype em__scalar_result_type(em_dtype t, double s);
/* PyTorch's canCast: no float -> integer, no non-bool -> bool. */
bool em__can_cast(em_dtype from, em_dtype to);

/* Broadcast the shapes of n tensors (numpy rules) into ndim/shape, or an EM_ERR_SHAPE error
 * "op: shapes [2, 3] and [4] cannot be broadcast: dim -1 is 3 vs 4". */
em_status em__broadcast(const char *op, int n, em_tensor *const *ts, int *ndim, int64_t *shape);

/* t as the backend wants it: dtype dt and shape (ndim, shape). Returns t itself, `view` (a
 * stack struct, filled here, with stride-0 broadcast dims) or a view of a new cast copy
 * stored in *tmp, which the caller releases. NULL on failure (error recorded). */
const em_tensor *em__prepare(const em_tensor *t, em_dtype dt, int ndim, const int64_t *shape,
                             em_tensor *view, em_tensor **tmp);

/* ---- fused ops over inputs of one shape (ops_fused.c) ---- */
/* Fused op kop over n inputs of one shape, dtype and device (views copied contiguous first),
 * giving one new output like in[0] (scoped); i and f (EM_OP_MAX_PARAMS each, or NULL) are
 * the call's params. NULL with nothing recorded where the inputs differ or the backend
 * declines; an error is recorded only when the kernel fails. */
em_tensor *em__fused_map(em_op kop, int n, em_tensor *const *in, const int64_t *i, const double *f);
/* A public fused op: NULL arguments, devices, shapes and dtypes (floating, one of each)
 * checked with clear messages, then kop with gradient node gop where the backend has it,
 * else compose(in), whose public ops record their own gradient. */
em_tensor *em__fused_op(const char *op, em_op kop, em_grad_op gop, int n, em_tensor *const *in,
                        em_tensor *(*compose)(em_tensor *const *in));

/* After an in-place write to t: autograd's version counter moves on (ops_inplace.c). */
void em__bump_version(em_tensor *t);

/* NULL argument check for entry points that return a status. */
#define EM_CHECK_ARG_STATUS(t, op, name)                                                       \
    do {                                                                                       \
        if (!(t)) {                                                                            \
            if (!em_failed()) return em_error(EM_ERR_ARGUMENT, "%s: argument '%s' is NULL", (op), (name)); \
            return em_last_status();                                                           \
        }                                                                                      \
    } while (0)

static inline bool em__same_device(const em_tensor *a, const em_tensor *b) {
    return a->storage->device.type == b->storage->device.type &&
           a->storage->device.index == b->storage->device.index;
}

static inline bool em__same_shape(const em_tensor *a, const em_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

#endif
