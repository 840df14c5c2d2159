/* Fused ops over inputs of one shape: one backend pass where the backend has the kernel
 * (op_list.h's EMK_OPS_FUSED), the composition of public ops elsewhere. em__fused_map is the
 * one path they share; autograd's one-pass backward helpers (ReLU's, GELU's, softmax's) are
 * its simplest users, and a public fused op adds its checks, its composed path and its
 * gradient node (em__fused_op). */
#include "ops_internal.h"
#include "internal_api.h"

/* em__fused_map's result before it is handed out (not scoped); *st says why there is none:
 * EM_ERR_NOT_SUPPORTED (nothing recorded) where it does not apply, else the recorded error. */
static em_tensor *fused_run(em_op kop, int n, em_tensor *const *in, const int64_t *i, const double *f,
                            em_status *st) {
    const em_tensor *x = in[0];
    const em_backend *be = x->storage->backend;
    *st = EM_ERR_NOT_SUPPORTED;
    if (!em__op_supported(be, kop, x->dtype)) return NULL;
    for (int k = 1; k < n; k++)
        if (in[k]->dtype != x->dtype || !em__same_shape(in[k], x) || !em__same_device(in[k], x)) return NULL;
    em_op_call c = {.op = kop, .dtype = x->dtype};
    for (int k = 0; k < EM_OP_MAX_PARAMS; k++) {
        c.i[k] = i ? i[k] : 0;
        c.f[k] = f ? f[k] : 0;
    }
    em_tensor *tmp[EM_OP_MAX_SRC] = {NULL}; /* contiguous copies of views */
    *st = EM_OK;
    for (int k = 0; k < n && *st == EM_OK; k++) {
        c.src[k] = in[k];
        if (!em__is_contiguous_raw(in[k]->ndim, in[k]->shape, in[k]->strides) &&
            !(c.src[k] = tmp[k] = em__copy_raw(in[k], in[k]->dtype)))
            *st = em_last_status();
    }
    em_tensor *out = *st == EM_OK ? em__tensor_new_on(be, x->storage->device, x->ndim, x->shape, x->dtype) : NULL;
    if (*st == EM_OK && !out) *st = em_last_status();
    c.dst[0] = out;
    if (*st == EM_OK && em__numel_raw(x->ndim, x->shape) > 0) *st = em__op_try(&c);
    for (int k = 0; k < n; k++) em_release(tmp[k]);
    if (*st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em__fused_map(em_op kop, int n, em_tensor *const *in, const int64_t *i, const double *f) {
    em_status st;
    return em__scoped(fused_run(kop, n, in, i, f, &st));
}

em_tensor *em__fused_op(const char *op, em_op kop, em_grad_op gop, int n, em_tensor *const *in,
                        em_tensor *(*compose)(em_tensor *const *in)) {
    static const char *const names[] = {"a", "b", "c", "d", "e", "f"};
    for (int k = 0; k < n; k++) EM_CHECK_ARG(in[k], op, names[k]);
    if (em__check_same_device(op, n, (const em_tensor *const *)in)) return NULL;
    char s0[128], s1[128];
    for (int k = 1; k < n; k++) {
        if (!em__same_shape(in[k], in[0])) {
            em_error(EM_ERR_SHAPE, "%s: expected inputs of one shape, got %s and %s", op,
                     em__shape_str(s0, sizeof s0, in[0]->ndim, in[0]->shape),
                     em__shape_str(s1, sizeof s1, in[k]->ndim, in[k]->shape));
            return NULL;
        }
        if (in[k]->dtype != in[0]->dtype) {
            em_error(EM_ERR_DTYPE, "%s: expected inputs of one dtype, got %s and %s", op,
                     em_dtype_name(in[0]->dtype), em_dtype_name(in[k]->dtype));
            return NULL;
        }
    }
    if (!em_dtype_is_floating(in[0]->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating dtype, got %s", op, em_dtype_name(in[0]->dtype));
        return NULL;
    }
    em_status st;
    em_tensor *out = fused_run(kop, n, in, NULL, NULL, &st);
    if (!out) return st == EM_ERR_NOT_SUPPORTED ? compose(in) : NULL; /* composed ops record their own gradient */
    return em__finish(out, gop, n, in, &em__no_args);
}

/* ---- autograd's one-pass backward helpers (internal_api.h): NULL without an error where
 * they do not apply, and the caller composes. No gradient of their own. ---- */

em_tensor *em__relu_backward(em_tensor *g, em_tensor *y) {
    if (!g || !y) return NULL;
    return em__fused_map(EM_OP_RELU_BACKWARD, 2, (em_tensor *[]){g, y}, NULL, NULL);
}

em_tensor *em__gelu_backward(em_tensor *g, em_tensor *x) {
    if (!g || !x) return NULL;
    return em__fused_map(EM_OP_GELU_BACKWARD, 2, (em_tensor *[]){g, x}, NULL, NULL);
}

em_tensor *em__softmax_backward(em_tensor *g, em_tensor *y, int dim, bool log) {
    if (!g || !y || y->ndim == 0 || dim != y->ndim - 1) return NULL;
    int64_t i[EM_OP_MAX_PARAMS] = {y->shape[y->ndim - 1], log};
    return em__fused_map(EM_OP_SOFTMAX_BACKWARD, 2, (em_tensor *[]){g, y}, i, NULL);
}
