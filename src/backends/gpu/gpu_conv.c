/* GPU op layer, convolution and pooling: im2col, col2im and the pools (kernels in conv.k).
 * Tensors arrive contiguous (backend.h), so each kernel takes its buffers, their element
 * offsets and the window geometry by value. */
#include <stdio.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

_Static_assert(sizeof(em_window2d) == 16 * sizeof(int64_t), "em_window2d must match conv.k's emk_win2d");

static em_status check(const char *op, const em_tensor *t) {
    if (em_dtype_is_floating(t->dtype)) return EM_OK; /* f16/bf16: conv.k's 16-bit kernels */
    return em_error(EM_ERR_NOT_SUPPORTED, "%s is not supported for %s on %s", op, em_dtype_name(t->dtype),
                    EM__DEVSTR(t));
}

static void kname(char *buf, size_t n, const char *family, const em_tensor *t) {
    snprintf(buf, n, "%s_%s", family, em__kernel_dtype_suffix(t->dtype));
}

/* out and in, each with its offset, then the window and the element count */
static em_status move(const char *family, const char *op, em_tensor *out, const em_tensor *in,
                      const em_window2d *g, int64_t total) {
    if (check(op, in)) return em_last_status();
    int64_t oo, io;
    if (em__gpu_elem_offset(out, &oo) || em__gpu_elem_offset(in, &io)) return em_last_status();
    if (total == 0) return EM_OK;
    char name[32];
    kname(name, sizeof name, family, in);
    em_window2d w = *g;
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KI64(oo), EM_KBUF(in->storage->block.handle),
                      EM_KI64(io), EM_KSTRUCT(w), EM_KI64(total)};
    return em__gpu_launch_1d(em__gpu_of(out), EM__DEV(out), name, total, 6, args, op);
}

em_status em__gpu_im2col(em_tensor *cols, const em_tensor *in, const em_window2d *g) {
    return move("im2col", "conv2d", cols, in, g, g->n * g->c * g->kh * g->kw * g->oh * g->ow);
}

em_status em__gpu_col2im(em_tensor *in, const em_tensor *cols, const em_window2d *g) {
    return move("col2im", "conv2d backward", in, cols, g, g->n * g->c * g->h * g->w);
}

/* the pool kernels: forward (y, idx, x) or backward (gx, gy, idx), each buffer with its
 * element offset, then the window, the kind and the element count */
static em_status pool(bool fwd, em_pool_kind kind, em_tensor *a, const em_tensor *b, const em_tensor *indices,
                      const em_window2d *g, int64_t total) {
    const char *op = kind == EM_POOL_MAX ? "max_pool2d" : kind == EM_POOL_AVG ? "avg_pool2d" : "adaptive_avg_pool2d";
    if (check(op, a)) return em_last_status();
    if (kind == EM_POOL_MAX && !indices) return em_error(EM_ERR_INTERNAL, "%s: no indices tensor", op);
    const em_tensor *ix = indices ? indices : a; /* avg pools take no indices: any buffer will do */
    int64_t ao, bo, xo;
    if (em__gpu_elem_offset(a, &ao) || em__gpu_elem_offset(b, &bo) || em__gpu_elem_offset(ix, &xo))
        return em_last_status();
    if (total == 0) return EM_OK;
    char name[32];
    kname(name, sizeof name, fwd ? "pool2d" : "pool2d_bwd", a);
    em_window2d w = *g;
    const em_tensor *second = fwd ? ix : b, *third = fwd ? b : ix;
    int64_t so = fwd ? xo : bo, to = fwd ? bo : xo;
    em_karg args[] = {EM_KBUF(a->storage->block.handle), EM_KI64(ao), EM_KBUF(second->storage->block.handle),
                      EM_KI64(so), EM_KBUF(third->storage->block.handle), EM_KI64(to), EM_KSTRUCT(w),
                      EM_KI32(kind), EM_KI64(total)};
    return em__gpu_launch_1d(em__gpu_of(a), EM__DEV(a), name, total, 9, args, op);
}

em_status em__gpu_pool2d(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                         const em_window2d *g) {
    return pool(true, kind, out, in, indices, g, g->n * g->c * g->oh * g->ow);
}

em_status em__gpu_pool2d_backward(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                  const em_tensor *indices, const em_window2d *g) {
    return pool(false, kind, gin, gout, indices, g, g->n * g->c * g->h * g->w);
}
