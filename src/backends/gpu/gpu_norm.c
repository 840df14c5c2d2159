/* GPU op layer: LayerNorm forward and backward and GELU's backward (norm.k), one launch each, written once for
 * every GPU backend (see gpu.h). Core hands over contiguous f32/f64 operands. */
#include "gpu.h"

#include <stdio.h>
#include "../../core/errors.h"
#include "gpu_internal.h"

/* element offsets of ts, the kernel name for x's dtype; false (error recorded) if unsupported */
static bool prepare(const em_gpu *g, const char *family, const em_tensor *x, em_tensor *const *ts, int n,
                    int64_t *offs, char *name, size_t cap) {
    em_gpu_info info = {0};
    g->info(EM__DEV(x), &info);
    if ((x->dtype != EM_F32 && x->dtype != EM_F64) || (x->dtype == EM_F64 && !info.has_f64)) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: %s is not supported on %s", family, em_dtype_name(x->dtype), EM__DEVSTR(x));
        return false;
    }
    for (int k = 0; k < n; k++)
        if (em__gpu_elem_offset(ts[k], &offs[k])) return false;
    snprintf(name, cap, "%s_%s", family, em__kernel_dtype_suffix(x->dtype));
    return true;
}

static em_karg real_arg(const em_tensor *x, double v) { return x->dtype == EM_F64 ? EM_KF64(v) : EM_KF32(v); }

static int64_t rows_of(const em_tensor *x, int64_t n) {
    int64_t numel = 1;
    for (int d = 0; d < x->ndim; d++) numel *= x->shape[d];
    return n > 0 ? numel / n : 0;
}

em_status em__gpu_layer_norm(em_tensor *out, em_tensor *mean, em_tensor *rstd, const em_tensor *x,
                             const em_tensor *w, const em_tensor *b, int64_t n, double eps) {
    const em_gpu *g = em__gpu_of(out);
    em_tensor *ts[6] = {out, mean, rstd, (em_tensor *)x, (em_tensor *)w, (em_tensor *)b};
    int64_t o[6];
    char name[40];
    if (!prepare(g, "layer_norm", x, ts, 6, o, name, sizeof name)) return em_last_status();
    int64_t rows = rows_of(x, n);
    if (rows == 0) return EM_OK;
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(mean->storage->block.handle),
                      EM_KBUF(rstd->storage->block.handle), EM_KBUF(x->storage->block.handle),
                      EM_KBUF(w->storage->block.handle), EM_KBUF(b->storage->block.handle),
                      EM_KI64(rows), EM_KI64(n), EM_KI64(o[0]), EM_KI64(o[1]), EM_KI64(o[2]),
                      EM_KI64(o[3]), EM_KI64(o[4]), EM_KI64(o[5]), real_arg(x, eps)};
    return em__gpu_launch_1d(g, EM__DEV(out), name, rows, 15, args, "layer_norm");
}

em_status em__gpu_layer_norm_backward(em_tensor *dx, em_tensor *gxhat, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *w, int64_t n, double eps) {
    const em_gpu *g = em__gpu_of(dx);
    em_tensor *ts[5] = {dx, gxhat, (em_tensor *)gy, (em_tensor *)x, (em_tensor *)w};
    int64_t o[5];
    char name[48];
    if (!prepare(g, "layer_norm_backward", x, ts, 5, o, name, sizeof name)) return em_last_status();
    int64_t rows = rows_of(x, n);
    if (rows == 0) return EM_OK;
    em_karg args[] = {EM_KBUF(dx->storage->block.handle), EM_KBUF(gxhat->storage->block.handle),
                      EM_KBUF(gy->storage->block.handle), EM_KBUF(x->storage->block.handle),
                      EM_KBUF(w->storage->block.handle), EM_KI64(rows), EM_KI64(n), EM_KI64(o[0]),
                      EM_KI64(o[1]), EM_KI64(o[2]), EM_KI64(o[3]), EM_KI64(o[4]), real_arg(x, eps)};
    return em__gpu_launch_1d(g, EM__DEV(dx), name, rows, 13, args, "layer_norm_backward");
}

em_status em__gpu_gelu_backward(em_tensor *dx, const em_tensor *gy, const em_tensor *x) {
    const em_gpu *g = em__gpu_of(dx);
    em_tensor *ts[3] = {dx, (em_tensor *)gy, (em_tensor *)x};
    int64_t o[3];
    char name[40];
    if (!prepare(g, "gelu_backward", x, ts, 3, o, name, sizeof name)) return em_last_status();
    int64_t n = rows_of(x, 1);
    if (n == 0) return EM_OK;
    em_karg args[] = {EM_KBUF(dx->storage->block.handle), EM_KBUF(gy->storage->block.handle),
                      EM_KBUF(x->storage->block.handle), EM_KI64(n), EM_KI64(o[0]), EM_KI64(o[1]), EM_KI64(o[2])};
    return em__gpu_launch_1d(g, EM__DEV(dx), name, n, 7, args, "gelu_backward");
}
