/* The two places where nn reaches inside a tensor: handing a result to the caller's scope,
 * and moving a parameter in place so that its handle stays valid (unlike PyTorch, where
 * .to() on a parameter's data strands optimizer state). */
#include <string.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/errors.h"
#include "../core/tensor_impl.h"
#include "nn_internal.h"

em_tensor *em__scope_return(em_scope s, em_tensor *t) {
    if (t) em_retain(t);
    em_scope_end(s);
    return em__scoped(t);
}

em_status em__tensor_move_(em_tensor *t, em_device d, em_dtype dt) {
    if (!t) return em_error(EM_ERR_ARGUMENT, "move: tensor is NULL");
    if (t->grad) {
        em_status st = em__tensor_move_(t->grad, d, dt);
        if (st != EM_OK) return st;
    }
    em_grad_mode mode = em_no_grad_begin();
    em_scope s = em_scope_begin();
    em_status st = EM_OK;
    em_tensor *n = em_to_device_dtype(t, d, dt, false);
    if (!n) {
        st = em_last_status();
    } else if (n != t) {
        /* n is a fresh contiguous copy: t takes its storage and layout, n takes t's old
         * storage to the scope's end, which frees it. */
        em_storage *old = t->storage;
        t->storage = n->storage;
        n->storage = old;
        em_dtype old_dt = t->dtype;
        t->dtype = n->dtype;
        n->dtype = old_dt;
        int64_t strides[EM_MAX_DIMS];
        memcpy(strides, t->strides, sizeof strides);
        memcpy(t->strides, n->strides, sizeof strides);
        memcpy(n->strides, strides, sizeof strides);
        int64_t off = t->offset;
        t->offset = n->offset;
        n->offset = off;
    }
    em_scope_end(s);
    em_no_grad_end(mode);
    return st;
}
