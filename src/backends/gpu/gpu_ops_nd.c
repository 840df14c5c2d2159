/* GPU op layer, ops with structure: reduce, matmul, softmax, index_select, index_add,
 * gather, scatter_add. Kernels in reduce.k, matmul.k, softmax.k, index.k. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

static int64_t block_cap(const em_gpu *g, int dev) {
    em_gpu_info info = {0}; /* fields a launcher does not know stay zero */
    g->info(dev, &info);
    int64_t cap = (int64_t)info.compute_units * 16;
    return cap < 16 ? 16 : cap;
}

/* ---- reduce ---- */

em_status em__gpu_reduce(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce) {
    const em_gpu *g = em__gpu_of(out);
    if (op < EM_OP_SUM || op > EM_OP_ARGMIN || !em__gpu_dtype_ok(op, in->dtype))
        return em_error(EM_ERR_NOT_SUPPORTED, "reduction %d is not supported for %s on %s",
                        (int)op, em_dtype_name(in->dtype), EM__DEVSTR(out));
    bool arg = op == EM_OP_ARGMAX || op == EM_OP_ARGMIN;
    int64_t offs[2];
    if (em__gpu_elem_offset(out, &offs[0]) || em__gpu_elem_offset(in, &offs[1]))
        return em_last_status();
    /* kept dims index outputs; reduced dims index the elements of one output */
    int64_t oshape[EMK_MAX_DIMS], os_out[EMK_MAX_DIMS], os_in[EMK_MAX_DIMS];
    int64_t rshape[EMK_MAX_DIMS], rs_in[EMK_MAX_DIMS];
    int no = 0, nr = 0;
    for (int d = 0; d < in->ndim; d++) {
        if (reduce[d]) {
            rshape[nr] = in->shape[d];
            rs_in[nr++] = in->strides[d];
        } else {
            oshape[no] = in->shape[d];
            os_out[no] = out->strides[d];
            os_in[no++] = in->strides[d];
        }
    }
    emk_shape osh, rsh;
    emk_strides ost[2], rst;
    const int64_t *osp[2] = {os_out, os_in}, *rsp[1] = {rs_in};
    int64_t zero = 0;
    em__gpu_collapse(no, oshape, 2, osp, offs, &osh, ost);
    em__gpu_collapse(nr, rshape, 1, rsp, &zero, &rsh, &rst);
    if (osh.numel == 0) return EM_OK;
    if (rsh.numel == 0) {
        if (op == EM_OP_SUM) return em__gpu_fill(out, 0.0);
        if (op == EM_OP_MEAN) return em__gpu_fill(out, NAN);
        return em_error(EM_ERR_SHAPE, "%s of an empty dimension has no identity",
                        op == EM_OP_MAX ? "max" : op == EM_OP_MIN ? "min" : "argmax/argmin");
    }
    int dev = EM__DEV(out);
    em_gpu_info info = {0}; /* fields a launcher does not know stay zero */
    g->info(dev, &info);
    /* one block per output for long reductions or few outputs; one thread otherwise. CPU
     * devices: a thread per output whenever there are outputs enough for every core */
    bool wg = info.is_cpu ? osh.numel < 2 * (int64_t)info.compute_units
                          : rsh.numel >= 256 ||
                                (osh.numel < (int64_t)info.compute_units * EMK_BLOCK && rsh.numel >= 16);
    char name[40];
    snprintf(name, sizeof name, "%sreduce_%s_%s", arg ? "arg" : "", wg ? "wg" : "wi",
             em__kernel_dtype_suffix(in->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(in->storage->block.handle),
                      EM_KSTRUCT(osh), EM_KSTRUCT(ost[0]), EM_KSTRUCT(ost[1]), EM_KSTRUCT(rsh),
                      EM_KSTRUCT(rst), EM_KI32(op - EM_OP_SUM)};
    if (!wg) return em__gpu_launch_1d(g, dev, name, osh.numel, 8, args, "reduce");
    int64_t blocks = osh.numel < block_cap(g, dev) ? osh.numel : block_cap(g, dev);
    size_t grid[3] = {(size_t)blocks, 1, 1}, block[3] = {EMK_BLOCK, 1, 1};
    return g->launch(dev, name, grid, block, 8, args, "reduce");
}

/* ---- matmul ---- */

/* CPU devices: the vector-type kernel (matmul.k) on f32 or f64 operands whose b and out rows
 * are contiguous; other dtypes and layouts go through contiguous f32/f64 temporaries (a
 * copy is cheap next to the matmul, which runs far faster than the tiled kernel on PoCL). f16/bf16
 * thus accumulate in f32 and are rounded once, also on devices without cl_khr_fp16. */
static em_status matmul_cpu_vec(const em_gpu *g, em_tensor *out, const em_tensor *a,
                                const em_tensor *b, bool has_f64, bool acc) {
    em_dtype cdt = out->dtype == EM_F64 && has_f64 ? EM_F64 : EM_F32;
    int nd = out->ndim;
    int64_t N = out->shape[nd - 1];
    em_device dev = out->storage->device;
    em_tensor *ta = NULL, *tb = NULL, *to = NULL;
    em_status st = EM_OK;
    if (a->dtype != cdt) {
        ta = em__tensor_new(em_shape_of(a), cdt, dev);
        st = ta ? em__gpu_copy(ta, a) : em_last_status();
    }
    if (st == EM_OK && (b->dtype != cdt || (N > 1 && b->strides[nd - 1] != 1))) {
        tb = em__tensor_new(em_shape_of(b), cdt, dev);
        st = tb ? em__gpu_copy(tb, b) : em_last_status();
    }
    if (st == EM_OK && (out->dtype != cdt || (N > 1 && out->strides[nd - 1] != 1))) {
        to = em__tensor_new(em_shape_of(out), cdt, dev);
        st = !to ? em_last_status() : acc ? em__gpu_copy(to, out) : EM_OK; /* the bias to add to */
    }
    const em_tensor *A = ta ? ta : a, *B = tb ? tb : b;
    em_tensor *O = to ? to : out;
    int64_t offs[3];
    if (st == EM_OK && (em__gpu_elem_offset(O, &offs[0]) || em__gpu_elem_offset(A, &offs[1]) ||
                        em__gpu_elem_offset(B, &offs[2])))
        st = em_last_status();
    if (st == EM_OK) {
        int64_t M = O->shape[nd - 2], K = A->shape[nd - 1];
        emk_shape bsh;
        emk_strides bst[3];
        const int64_t *sp[3] = {O->strides, A->strides, B->strides};
        em__gpu_collapse(nd - 2, O->shape, 3, sp, offs, &bsh, bst);
        int64_t w = cdt == EM_F64 ? 8 : 16, nb = bsh.numel < 65535 ? bsh.numel : 65535;
        char name[32];
        snprintf(name, sizeof name, "matmul_vec_%s", em__kernel_dtype_suffix(cdt));
        em_karg args[] = {EM_KBUF(O->storage->block.handle), EM_KBUF(A->storage->block.handle),
                          EM_KBUF(B->storage->block.handle), EM_KI64(M), EM_KI64(N), EM_KI64(K),
                          EM_KSTRUCT(bsh), EM_KSTRUCT(bst[0]), EM_KSTRUCT(bst[1]),
                          EM_KSTRUCT(bst[2]), EM_KI64(O->strides[nd - 2]),
                          EM_KI64(A->strides[nd - 2]), EM_KI64(A->strides[nd - 1]),
                          EM_KI64(B->strides[nd - 2]), EM_KI32(acc)};
        size_t grid[3] = {(size_t)(((M + 3) / 4 + 3) / 4), (size_t)(((N + w - 1) / w + 3) / 4),
                          (size_t)nb};
        size_t block[3] = {4, 4, 1};
        st = g->launch(EM__DEV(out), name, grid, block, 15, args, "matmul");
    }
    if (st == EM_OK && to) st = em__gpu_copy(out, to);
    em_release(ta);
    em_release(tb);
    em_release(to);
    return st;
}

static em_status matmul_impl(const em_gpu *g, em_tensor *out, const em_tensor *a, const em_tensor *b,
                             bool acc, bool widen);

em_status em__gpu_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return matmul_impl(em__gpu_of(out), out, a, b, false, false);
}

em_status em__gpu_matmul_widen(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    if ((a->dtype != EM_BF16 && a->dtype != EM_F16) || b->dtype != a->dtype || out->dtype != EM_F32)
        return em_error(EM_ERR_INTERNAL, "matmul_widen: expects bf16/f16 operands and a float32 result, got %s, %s, %s",
                        em_dtype_name(a->dtype), em_dtype_name(b->dtype), em_dtype_name(out->dtype));
    return matmul_impl(em__gpu_of(out), out, a, b, false, true);
}

em_status em__gpu_matmul_with(const em_gpu *g, em_tensor *out, const em_tensor *a,
                              const em_tensor *b) {
    return matmul_impl(g, out, a, b, false, false);
}

/* out += a @ b (addmm with out pre-filled with the bias): the vendor GEMM with beta = 1 or
 * Ember's kernels with accum, so f16/bf16 add the bias in f32 and round once. */
em_status em__gpu_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return matmul_impl(em__gpu_of(out), out, a, b, true, false);
}

/* widen: out float32 from f16/bf16 a, b (matmul_widen), on the vendor GEMM only: anything
 * else is EM_ERR_NOT_SUPPORTED (core then multiplies in the low dtype and casts) */
static em_status matmul_impl(const em_gpu *g, em_tensor *out, const em_tensor *a, const em_tensor *b,
                             bool acc, bool widen) {
    if (out->dtype == EM_BOOL)
        return em_error(EM_ERR_NOT_SUPPORTED, "matmul is not supported for bool on %s",
                        EM__DEVSTR(out));
    int nd = out->ndim;
    if (nd < 2 || a->ndim != nd || b->ndim != nd)
        return em_error(EM_ERR_INTERNAL, "matmul: backend expects equal ranks >= 2, got %d, %d, %d",
                        out->ndim, a->ndim, b->ndim);
    int64_t offs[3];
    if (em__gpu_elem_offset(out, &offs[0]) || em__gpu_elem_offset(a, &offs[1]) ||
        em__gpu_elem_offset(b, &offs[2]))
        return em_last_status();
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[nd - 1];
    if (M == 0 || N == 0) return EM_OK;
    if (K == 0) return acc ? EM_OK : em__gpu_fill(out, 0.0);
    if (widen && !g->gemm) return EM_ERR_NOT_SUPPORTED;
    emk_shape bsh;
    emk_strides bst[3];
    const int64_t *sp[3] = {out->strides, a->strides, b->strides};
    em__gpu_collapse(nd - 2, out->shape, 3, sp, offs, &bsh, bst);
    if (bsh.numel == 0) return EM_OK;
    int64_t som = out->strides[nd - 2], son = out->strides[nd - 1];
    int64_t sam = a->strides[nd - 2], sak = a->strides[nd - 1];
    int64_t sbk = b->strides[nd - 2], sbn = b->strides[nd - 1];
    int dev = EM__DEV(out);

    /* a vendor GEMM when every 2-d slice has a unit stride and batches have one stride */
    if (g->gemm && bsh.ndim == 1 && (son == 1 || N == 1) && (sak == 1 || sam == 1) &&
        (sbn == 1 || sbk == 1)) {
        em_gemm_args ga = {
            .dtype = a->dtype, .m = M, .n = N, .k = K, .batch = bsh.numel,
            .a = a->storage->block.handle, .b = b->storage->block.handle,
            .c = out->storage->block.handle,
            .a_off = bst[1].offset, .b_off = bst[2].offset, .c_off = bst[0].offset,
            .trans_a = sak != 1, .trans_b = sbn != 1, .accumulate = acc,
            .stride_a = bst[1].s[0], .stride_b = bst[2].s[0], .stride_c = bst[0].s[0], .c_f32 = widen,
        };
        ga.lda = ga.trans_a ? sak : sam;
        ga.ldb = ga.trans_b ? sbn : sbk;
        ga.ldc = N == 1 ? (som > 1 ? som : 1) : som;
        /* a leading dimension is only meaningful when the slice has more than one row */
        if (!ga.trans_a && M == 1) ga.lda = K;
        if (ga.trans_a && K == 1) ga.lda = M;
        if (!ga.trans_b && K == 1) ga.ldb = N;
        if (ga.trans_b && N == 1) ga.ldb = K;
        if (M == 1) ga.ldc = N;
        bool ld_ok = (ga.trans_a ? ga.lda >= M : ga.lda >= K) &&
                     (ga.trans_b ? ga.ldb >= K : ga.ldb >= N) && ga.ldc >= N;
        if (ld_ok) {
            em_status s = g->gemm(dev, &ga);
            if (s != EM_ERR_NOT_SUPPORTED) return s;
        }
    }
    if (widen) return EM_ERR_NOT_SUPPORTED; /* Ember's kernels store in the operands' dtype */

    em_gpu_info info = {0}; /* fields a launcher does not know stay zero */
    g->info(dev, &info);
    if (info.is_cpu && em_dtype_is_floating(out->dtype))
        return matmul_cpu_vec(g, out, a, b, info.has_f64, acc);

    char name[32];
    snprintf(name, sizeof name, "matmul_%s", em__kernel_dtype_suffix(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(a->storage->block.handle),
                      EM_KBUF(b->storage->block.handle), EM_KI64(M), EM_KI64(N), EM_KI64(K),
                      EM_KSTRUCT(bsh), EM_KSTRUCT(bst[0]), EM_KSTRUCT(bst[1]), EM_KSTRUCT(bst[2]),
                      EM_KI64(som), EM_KI64(son), EM_KI64(sam), EM_KI64(sak), EM_KI64(sbk),
                      EM_KI64(sbn), EM_KI32(acc)};
    /* y and z stay within CUDA's 65535 blocks: the kernel loops over further tiles of M
     * and further batches */
    int64_t t = EMK_MM_TILE / EMK_MM_WPT, nb = bsh.numel < 65535 ? bsh.numel : 65535;
    int64_t mt = (M + EMK_MM_TILE - 1) / EMK_MM_TILE;
    size_t grid[3] = {(size_t)((N + EMK_MM_TILE - 1) / EMK_MM_TILE),
                      (size_t)(mt < 65535 ? mt : 65535), (size_t)nb};
    size_t block[3] = {(size_t)t, (size_t)t, 1};
    return g->launch(dev, name, grid, block, 17, args, "matmul");
}

/* ---- softmax ---- */

em_status em__gpu_softmax(em_tensor *out, const em_tensor *in, int dim, bool log) {
    const em_gpu *g = em__gpu_of(out);
    if (!em_dtype_is_floating(in->dtype))
        return em_error(EM_ERR_NOT_SUPPORTED, "softmax is not supported for %s on %s",
                        em_dtype_name(in->dtype), EM__DEVSTR(out));
    int64_t offs[2];
    if (em__gpu_elem_offset(out, &offs[0]) || em__gpu_elem_offset(in, &offs[1]))
        return em_last_status();
    int64_t shape[EMK_MAX_DIMS];
    memcpy(shape, in->shape, sizeof(int64_t) * (size_t)in->ndim);
    int64_t L = in->ndim ? in->shape[dim] : 1;
    if (in->ndim) shape[dim] = 1;
    emk_shape rsh;
    emk_strides st[2];
    const int64_t *sp[2] = {out->strides, in->strides};
    em__gpu_collapse(in->ndim, shape, 2, sp, offs, &rsh, st);
    if (rsh.numel == 0 || L == 0) return EM_OK;
    int64_t sol = in->ndim ? out->strides[dim] : 0, sil = in->ndim ? in->strides[dim] : 0;
    int dev = EM__DEV(out);
    em_gpu_info info = {0};
    g->info(dev, &info);
    bool wi = info.is_cpu ? rsh.numel >= 2 * (int64_t)info.compute_units
                          : L <= 64 && rsh.numel >= 64;
    char name[32];
    snprintf(name, sizeof name, "softmax_%s%s", wi ? "wi_" : "", em__kernel_dtype_suffix(in->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(in->storage->block.handle),
                      EM_KSTRUCT(rsh), EM_KSTRUCT(st[0]), EM_KSTRUCT(st[1]), EM_KI64(L),
                      EM_KI64(sol), EM_KI64(sil), EM_KI32(log)};
    if (wi) return em__gpu_launch_1d(g, dev, name, rsh.numel, 9, args, "softmax");
    int64_t blocks = rsh.numel < block_cap(g, dev) ? rsh.numel : block_cap(g, dev);
    size_t grid[3] = {(size_t)blocks, 1, 1}, block[3] = {EMK_BLOCK, 1, 1};
    return g->launch(dev, name, grid, block, 9, args, "softmax");
}

/* The fused linear cross-entropy's rows (op_list.h's CE_ROWS): one block per row. */
em_status em__gpu_ce_rows(em_tensor *loss, em_tensor *dz, const em_tensor *z, const em_tensor *target,
                          const em_tensor *valid, const em_tensor *rowscale, double smoothing) {
    const em_gpu *g = em__gpu_of(z);
    int dev = EM__DEV(z);
    int64_t rows = z->shape[0], V = z->shape[1], off[6] = {0};
    const em_tensor *ts[6] = {loss, dz, z, target, valid, rowscale};
    for (int i = 0; i < 6; i++)
        if (ts[i] && em__gpu_elem_offset(ts[i], &off[i])) return em_last_status();
    if (rows == 0 || V == 0) return EM_OK;
    void *zb = z->storage->block.handle;
    em_karg args[] = {EM_KBUF(loss->storage->block.handle), EM_KBUF(dz ? dz->storage->block.handle : zb),
                      EM_KBUF(zb), EM_KBUF(target->storage->block.handle), EM_KBUF(valid->storage->block.handle),
                      EM_KBUF(rowscale ? rowscale->storage->block.handle : zb), EM_KI64(rows), EM_KI64(V),
                      EM_KI64(off[0]), EM_KI64(off[1]), EM_KI64(off[2]), EM_KI64(off[3]), EM_KI64(off[4]),
                      EM_KI64(off[5]), EM_KI32(1 | (dz && rowscale ? 2 : 0)), EM_KF32(smoothing)};
    int64_t blocks = rows < block_cap(g, dev) ? rows : block_cap(g, dev);
    size_t grid[3] = {(size_t)blocks, 1, 1}, block[3] = {EMK_BLOCK, 1, 1};
    return g->launch(dev, "ce_rows_f32", grid, block, (int)(sizeof args / sizeof args[0]), args, "linear_cross_entropy");
}

/* ---- indexing ---- */

/* index_select and gather take the same arguments; only the kernel differs. */
static em_status gpu_index_kernel(const em_gpu *g, const char *kernel, em_tensor *out,
                                  const em_tensor *in, int dim, const em_tensor *index) {
    int64_t oo, io, xo;
    if (em__gpu_elem_offset(out, &oo) || em__gpu_elem_offset(in, &io) ||
        em__gpu_elem_offset(index, &xo))
        return em_last_status();
    emk_shape sh, ish, xsh;
    emk_strides so, si, sx;
    em__gpu_layout(out, oo, &sh, &so);
    em__gpu_layout(in, io, &ish, &si);
    em__gpu_layout(index, xo, &xsh, &sx);
    if (sh.numel == 0) return EM_OK;
    char name[32];
    snprintf(name, sizeof name, "%s_%zu", kernel, em_dtype_size(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(in->storage->block.handle),
                      EM_KBUF(index->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(so),
                      EM_KSTRUCT(si), EM_KSTRUCT(sx), EM_KI32(dim)};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 8, args, kernel);
}

em_status em__gpu_index_select(em_tensor *out, const em_tensor *in, int dim,
                               const em_tensor *index) {
    return gpu_index_kernel(em__gpu_of(out), "index_select", out, in, dim, index);
}

em_status em__gpu_gather(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index) {
    return gpu_index_kernel(em__gpu_of(out), "gather", out, in, dim, index);
}

/* index_add and scatter_add: one thread per position of `space` with `dim` squeezed to 1,
 * each looping over dim in order (no atomics, deterministic) */
static em_status accumulate(const em_gpu *g, const char *family, em_tensor *out, int dim,
                            const em_tensor *index, const em_tensor *src, const em_tensor *space,
                            int64_t L) {
    if (out->dtype == EM_BOOL)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s is not supported for bool on %s", family,
                        EM__DEVSTR(out));
    int64_t oo, so_, xo;
    if (em__gpu_elem_offset(out, &oo) || em__gpu_elem_offset(src, &so_) ||
        em__gpu_elem_offset(index, &xo))
        return em_last_status();
    emk_shape sh, tmp;
    emk_strides so, ss, sx;
    em__gpu_layout(space, 0, &sh, &sx);
    em__gpu_layout(out, oo, &tmp, &so);
    em__gpu_layout(src, so_, &tmp, &ss);
    em__gpu_layout(index, xo, &tmp, &sx);
    if (sh.numel == 0 || L == 0) return EM_OK;
    sh.numel /= sh.size[dim];
    sh.size[dim] = 1;
    char name[40];
    snprintf(name, sizeof name, "%s_%s", family, em__kernel_dtype_suffix(out->dtype));
    em_karg args[] = {EM_KBUF(out->storage->block.handle), EM_KBUF(src->storage->block.handle),
                      EM_KBUF(index->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(so),
                      EM_KSTRUCT(ss), EM_KSTRUCT(sx), EM_KI32(dim), EM_KI64(L)};
    return em__gpu_launch_1d(g, EM__DEV(out), name, sh.numel, 9, args, family);
}

em_status em__gpu_index_add(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src) {
    return accumulate(em__gpu_of(out), "index_add", out, dim, index, src, src, em_numel(index));
}

em_status em__gpu_scatter_add(em_tensor *out, int dim, const em_tensor *index,
                              const em_tensor *src) {
    return accumulate(em__gpu_of(out), "scatter_add", out, dim, index, src, index,
                      index->ndim ? index->shape[dim] : 1);
}
