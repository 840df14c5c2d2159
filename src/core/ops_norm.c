/* The fused LayerNorm (one kernel forward, one backward) that src/nn/norm.c uses when the
 * backend has it, with NativeLayerNormBackward0 as its node. Elsewhere (other dtypes, no
 * affine parameters, a backend without the kernels) LayerNorm is composed from ops. */
#include "ops_internal.h"
#include "internal_api.h"

static const em_tensor *contiguous_of(const em_tensor *t, em_tensor **tmp) {
    *tmp = NULL;
    if (em__is_contiguous_raw(t->ndim, t->shape, t->strides)) return t;
    *tmp = em__copy_raw(t, t->dtype);
    return *tmp;
}

bool em__layer_norm_applies(const em_tensor *x, const em_tensor *w, const em_tensor *b, int64_t n) {
    if (!x || !w || !b || n <= 0 || (x->dtype != EM_F32 && x->dtype != EM_F64)) return false;
    const em_backend *be = x->storage->backend;
    if (!em__op_supported(be, EM_OP_LAYER_NORM, x->dtype) || !em__op_supported(be, EM_OP_LAYER_NORM_BACKWARD, x->dtype))
        return false;
    const em_tensor *p[2] = {w, b};
    for (int k = 0; k < 2; k++)
        if (p[k]->dtype != x->dtype || !em__same_device(p[k], x) || em__numel_raw(p[k]->ndim, p[k]->shape) != n ||
            !em__is_contiguous_raw(p[k]->ndim, p[k]->shape, p[k]->strides))
            return false;
    return em__numel_raw(x->ndim, x->shape) % n == 0;
}

em_tensor *em__layer_norm(em_tensor *x, int64_t n, em_tensor *w, em_tensor *b, double eps) {
    const char *op = "LayerNorm";
    if (!em__layer_norm_applies(x, w, b, n)) {
        em_error(EM_ERR_INTERNAL, "%s: the fused kernel does not apply here", op);
        return NULL;
    }
    const em_backend *be = x->storage->backend;
    em_device dev = x->storage->device;
    int64_t rows = em__numel_raw(x->ndim, x->shape) / n;
    em_tensor *out = em__tensor_new_on(be, dev, x->ndim, x->shape, x->dtype);
    em_tensor *mean = out ? em__tensor_new_on(be, dev, 1, &rows, x->dtype) : NULL;
    em_tensor *rstd = mean ? em__tensor_new_on(be, dev, 1, &rows, x->dtype) : NULL;
    em_tensor *tmp = NULL;
    const em_tensor *xc = rstd ? contiguous_of(x, &tmp) : NULL;
    em_status st = xc ? EM_OK : em_last_status();
    if (st == EM_OK && rows > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_LAYER_NORM, .dtype = x->dtype, .dst = {out, mean, rstd},
                                      .src = {xc, w, b}, .i = {n}, .f = {eps}}, op);
    em_release(tmp);
    em_release(mean);
    em_release(rstd);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_tensor *in[3] = {x, w, b};
    em_grad_args args = em__no_args;
    args.s[0] = eps;
    args.i[0] = n;
    return em__finish(out, EM_GRAD_LAYER_NORM, 3, in, &args);
}

em_status em__layer_norm_backward(em_tensor *g, em_tensor *x, em_tensor *w, int64_t n, double eps, em_tensor **dx,
                                  em_tensor **gxhat) {
    *dx = *gxhat = NULL;
    if (!g || !x || !w) return em_failed() ? em_last_status() : em_error(EM_ERR_INTERNAL, "LayerNorm backward: NULL");
    const em_backend *be = x->storage->backend;
    em_device dev = x->storage->device;
    em_tensor *tg = NULL, *tx = NULL;
    const em_tensor *gc = contiguous_of(g, &tg), *xc = gc ? contiguous_of(x, &tx) : NULL;
    em_tensor *a = xc ? em__tensor_new_on(be, dev, x->ndim, x->shape, x->dtype) : NULL;
    em_tensor *c = a ? em__tensor_new_on(be, dev, x->ndim, x->shape, x->dtype) : NULL;
    em_status st = c ? EM_OK : em_last_status();
    if (st == EM_OK && g->dtype != x->dtype)
        st = em_error(EM_ERR_INTERNAL, "LayerNorm backward: gradient %s for a %s input", em_dtype_name(g->dtype),
                      em_dtype_name(x->dtype));
    if (st == EM_OK && em__numel_raw(x->ndim, x->shape) > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_LAYER_NORM_BACKWARD, .dtype = x->dtype, .dst = {a, c},
                                      .src = {gc, xc, w}, .i = {n}, .f = {eps}}, "LayerNorm backward");
    em_release(tg);
    em_release(tx);
    if (st != EM_OK) {
        em_release(a);
        em_release(c);
        return st;
    }
    *dx = em__scoped(a);
    *gxhat = em__scoped(c);
    return EM_OK;
}
