/* ReLU's backward in one backend pass (internal_api.h's em__relu_backward; the CNN's speed,
 * issue 16). No gradient of its own: autograd's formulas run without recording. */
#include "ops_internal.h"
#include "internal_api.h"

em_tensor *em__relu_backward(em_tensor *g, em_tensor *y) {
    if (!g || !y || g->dtype != y->dtype || (y->dtype != EM_F32 && y->dtype != EM_F64 && y->dtype != EM_BF16 && y->dtype != EM_F16) || !em__same_shape(g, y) ||
        !em__same_device(g, y) || !em__op_supported(y->storage->backend, EM_OP_RELU_BACKWARD, y->dtype))
        return NULL;
    const em_backend *be = y->storage->backend;
    em_tensor *tg = NULL, *ty = NULL; /* contiguous copies of views */
    const em_tensor *gc = g, *yc = y;
    if (!em__is_contiguous_raw(g->ndim, g->shape, g->strides)) gc = tg = em__copy_raw(g, g->dtype);
    if (gc && !em__is_contiguous_raw(y->ndim, y->shape, y->strides)) yc = ty = em__copy_raw(y, y->dtype);
    em_tensor *out = gc && yc ? em__tensor_new_on(be, y->storage->device, y->ndim, y->shape, y->dtype) : NULL;
    em_status st = out ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(y->ndim, y->shape) > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_RELU_BACKWARD, .dtype = y->dtype, .dst = {out}, .src = {gc, yc}},
                        "ReLU backward");
    em_release(tg);
    em_release(ty);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return em__scoped(out);
}
