/* GPU op layer, elementwise part: fill, affine fill, copy/cast, unary, binary, where, rng.
 * Written once for every GPU backend (see gpu.h); kernels are in elementwise.k and rng.k. */
#include "gpu.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

/* ---- shared helpers (gpu_internal.h) ---- */

em_status em__gpu_launch_1d(const em_gpu *g, int dev, const char *kernel, int64_t n, int nargs,
                            const em_karg *args, const char *op) {
    em_gpu_info info = {0}; /* fields a launcher does not know stay zero */
    g->info(dev, &info);
    /* the blocks that are resident at once: more would only queue behind them, since the
     * kernels loop over the elements (the occupancy the kernel's registers allow, else 8) */
    int per_cu = g->resident_blocks ? g->resident_blocks(dev, kernel, EMK_BLOCK) : 0;
    if (per_cu <= 0) per_cu = 8;
    int64_t blocks = (n + EMK_BLOCK - 1) / EMK_BLOCK, cap = (int64_t)info.compute_units * per_cu;
    if (cap < per_cu) cap = per_cu;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    size_t grid[3] = {(size_t)blocks, 1, 1}, block[3] = {EMK_BLOCK, 1, 1};
    return g->launch(dev, kernel, grid, block, nargs, args, op);
}

em_karg em__gpu_acc_arg(const em_gpu *g, int dev, double v) {
    em_gpu_info info = {0}; /* fields a launcher does not know stay zero */
    g->info(dev, &info);
    return info.has_f64 ? EM_KF64(v) : EM_KF32(v);
}

int64_t em__gpu_to_i64(double v) {
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* ---- fill ---- */

static uint64_t value_bits(em_dtype dt, double v) {
    uint64_t bits = 0;
    switch (dt) {
    case EM_F32: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4); bits = u; break; }
    case EM_F64: memcpy(&bits, &v, 8); break;
    case EM_F16: bits = em_f32_to_f16((float)v); break;
    case EM_BF16: bits = em_f32_to_bf16((float)v); break;
    case EM_I64: bits = (uint64_t)em__gpu_to_i64(v); break;
    case EM_I32: bits = (uint32_t)(int32_t)em__gpu_to_i64(v); break;
    case EM_U8: bits = (uint8_t)em__gpu_to_i64(v); break;
    case EM_BOOL: bits = v != 0; break;
    default: break;
    }
    return bits;
}

/* The collapsed shape of t[0] and each tensor's strides over it, for the elementwise ops
 * (every tensor has t[0]'s shape): the kernels' layout arguments. */
static em_status elementwise_layout(int n, const em_tensor *const t[], emk_shape *sh,
                                    emk_strides st[]) {
    int64_t offs[4];
    const int64_t *sp[4];
    for (int k = 0; k < n; k++) {
        em_status s = em__gpu_elem_offset(t[k], &offs[k]);
        if (s != EM_OK) return s;
        sp[k] = t[k]->strides;
    }
    em__gpu_collapse(t[0]->ndim, t[0]->shape, n, sp, offs, sh, st);
    return EM_OK;
}

em_status em__gpu_fill(em_tensor *out, double value) {
    const em_gpu *g = em__gpu_of(out);
    emk_shape sh;
    emk_strides so;
    if (elementwise_layout(1, (const em_tensor *[]){out}, &sh, &so)) return em_last_status();
    if (sh.numel == 0) return EM_OK;
    char name[32];
    snprintf(name, sizeof name, "fill_%zu", em_dtype_size(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(so),
                      EM_KI64(value_bits(out->dtype, value))};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 4, args, "fill");
}

em_status em__gpu_fill_affine(em_tensor *out, double start, double step) {
    const em_gpu *g = em__gpu_of(out);
    emk_shape sh;
    emk_strides so;
    if (elementwise_layout(1, (const em_tensor *[]){out}, &sh, &so)) return em_last_status();
    if (sh.numel == 0) return EM_OK;
    /* integers with integral start and step: exact 64-bit arithmetic in the kernel */
    bool use_int = !em_dtype_is_floating(out->dtype) && start == trunc(start) &&
                   step == trunc(step) && fabs(start) < 0x1p62 && fabs(step) < 0x1p62;
    char name[32];
    snprintf(name, sizeof name, "affine_%s", em__kernel_dtype_suffix(out->dtype));
    int dev = EM__DEV(out);
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(so),
                      em__gpu_acc_arg(g, dev, start), em__gpu_acc_arg(g, dev, step),
                      EM_KI64(use_int ? (int64_t)start : 0), EM_KI64(use_int ? (int64_t)step : 0),
                      EM_KI32(use_int)};
    return em__gpu_launch_1d(g, dev, name, sh.numel, 8, args, "fill_affine");
}

/* ---- copy / cast ---- */

em_status em__gpu_copy(em_tensor *out, const em_tensor *in) {
    const em_gpu *g = em__gpu_of(out);
    if (EM__DEV(out) != EM__DEV(in))
        return em_error(EM_ERR_INTERNAL, "copy: %s and %s are different devices (core stages these)",
                        EM__DEVSTR(out), EM__DEVSTR(in));
    /* Same dtype, both dense, one shape (core copies a partly overlapping source first): the
     * driver's device copy, as PyTorch's copy_ does; on an H200 it moved 4.25 TB/s against
     * 2.77 for the strided copy kernel (1 GiB, docs/BENCHMARKS.md). */
    const em_backend *be = out->storage->backend;
    if (out->dtype == in->dtype && be->copy_d2d && out->ndim == in->ndim &&
        !memcmp(out->shape, in->shape, sizeof(int64_t) * (size_t)out->ndim) && em__tensor_dense(out) && em__tensor_dense(in)) {
        size_t elem = em_dtype_size(out->dtype), n = 1;
        for (int d = 0; d < out->ndim; d++) n *= (size_t)out->shape[d];
        if (n == 0) return EM_OK;
        return be->copy_d2d(EM__DEV(out), out->storage->block.handle,
                            out->storage->block.offset + (size_t)out->offset * elem, EM__DEV(in),
                            in->storage->block.handle, in->storage->block.offset + (size_t)in->offset * elem,
                            n * elem);
    }
    emk_shape sh;
    emk_strides st[2];
    if (elementwise_layout(2, (const em_tensor *[]){out, in}, &sh, st))
        return em_last_status();
    if (sh.numel == 0) return EM_OK;
    char name[32];
    if (out->dtype == in->dtype)
        snprintf(name, sizeof name, "copy_%zu", em_dtype_size(out->dtype));
    else
        snprintf(name, sizeof name, "copy_%s_%s", em__kernel_dtype_suffix(in->dtype),
                 em__kernel_dtype_suffix(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(in->storage->block.handle),
                      EM_KSTRUCT(sh), EM_KSTRUCT(st[0]), EM_KSTRUCT(st[1])};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 5, args, "copy");
}

/* ---- unary ---- */

em_status em__gpu_unary(em_op op, em_tensor *out, const em_tensor *in, const double *params) {
    const em_gpu *g = em__gpu_of(out);
    if (op < EM_OP_NEG || op > EM_OP_CLAMP || !em__gpu_dtype_ok(op, in->dtype))
        return em_error(EM_ERR_NOT_SUPPORTED, "unary op %d is not supported for %s on %s", (int)op,
                        em_dtype_name(in->dtype), EM__DEVSTR(out));
    emk_shape sh;
    emk_strides st[2];
    if (elementwise_layout(2, (const em_tensor *[]){out, in}, &sh, st))
        return em_last_status();
    if (sh.numel == 0) return EM_OK;
    double p0 = params ? params[0] : 0, p1 = op == EM_OP_CLAMP && params ? params[1] : 0;
    em_karg a0, a1;
    if (in->dtype == EM_F64) {
        a0 = EM_KF64(p0);
        a1 = EM_KF64(p1);
    } else if (em_dtype_is_floating(in->dtype)) {
        a0 = EM_KF32(p0);
        a1 = EM_KF32(p1);
    } else {
        /* an infinite clamp bound on integers saturates to the i64 range */
        a0 = EM_KI64(em__gpu_to_i64(p0));
        a1 = EM_KI64(em__gpu_to_i64(p1));
    }
    char name[32];
    snprintf(name, sizeof name, "unary_%s", em__kernel_dtype_suffix(in->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(in->storage->block.handle),
                      EM_KSTRUCT(sh), EM_KSTRUCT(st[0]), EM_KSTRUCT(st[1]),
                      EM_KI32(op - EM_OP_NEG), a0, a1};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 8, args, "unary");
}

/* ---- binary, where ---- */

em_status em__gpu_binary(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    const em_gpu *g = em__gpu_of(out);
    if (op < EM_OP_ADD || op > EM_OP_LOGICAL_AND || !em__gpu_dtype_ok(op, a->dtype))
        return em_error(EM_ERR_NOT_SUPPORTED, "binary op %d is not supported for %s on %s",
                        (int)op, em_dtype_name(a->dtype), EM__DEVSTR(out));
    bool cmp = op >= EM_OP_EQ;
    if (cmp && out->dtype != EM_BOOL)
        return em_error(EM_ERR_INTERNAL, "comparison must write bool, got %s",
                        em_dtype_name(out->dtype));
    emk_shape sh;
    emk_strides st[3];
    if (elementwise_layout(3, (const em_tensor *[]){out, a, b}, &sh, st))
        return em_last_status();
    if (sh.numel == 0) return EM_OK;
    char name[32];
    snprintf(name, sizeof name, "%s_%s", cmp ? "compare" : "binary",
             em__kernel_dtype_suffix(a->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(a->storage->block.handle),
                      EM_KBUF(b->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(st[0]),
                      EM_KSTRUCT(st[1]), EM_KSTRUCT(st[2]), EM_KI32(op - EM_OP_ADD)};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 8, args, "binary");
}

em_status em__gpu_where(em_tensor *out, const em_tensor *cond, const em_tensor *a,
                        const em_tensor *b) {
    const em_gpu *g = em__gpu_of(out);
    emk_shape sh;
    emk_strides st[4];
    if (elementwise_layout(4, (const em_tensor *[]){out, cond, a, b}, &sh, st))
        return em_last_status();
    if (sh.numel == 0) return EM_OK;
    char name[32];
    snprintf(name, sizeof name, "where_%zu", em_dtype_size(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(cond->storage->block.handle),
                      EM_KBUF(a->storage->block.handle), EM_KBUF(b->storage->block.handle),
                      EM_KSTRUCT(sh), EM_KSTRUCT(st[0]), EM_KSTRUCT(st[1]), EM_KSTRUCT(st[2]),
                      EM_KSTRUCT(st[3])};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 9, args, "where");
}

/* ---- rng ---- */

em_status em__gpu_rng(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset,
                      double p0, double p1) {
    const em_gpu *g = em__gpu_of(out);
    emk_shape sh;
    emk_strides so;
    if (elementwise_layout(1, (const em_tensor *[]){out}, &sh, &so)) return em_last_status();
    if (sh.numel == 0) return EM_OK;
    char name[32];
    snprintf(name, sizeof name, "rng_%s", em__kernel_dtype_suffix(out->dtype));
    int dev = EM__DEV(out);
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(so),
                      EM_KI64(seed), EM_KI64(offset), EM_KI32(kind),
                      em__gpu_acc_arg(g, dev, p0), em__gpu_acc_arg(g, dev, p1),
                      EM_KI64(em__gpu_to_i64(p0)), EM_KI64(em__gpu_to_i64(p1))};
    return em__gpu_launch_1d(g, dev, name, sh.numel, 10, args, "rng");
}
