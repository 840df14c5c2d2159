/* The CUDA launcher for the shared GPU op layer, and the backend's op entry points. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "../../core/errors.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"

#define MAX_KARGS 32

/* em_karg values -> cuLaunchKernel's array of pointers to each argument. Buffers become
 * CUdeviceptr values; scalars and structs are pointed to where they are (the driver copies
 * them at launch). */
static em_status cuda_launch(int dev, const char *kernel, const size_t grid[3], const size_t block[3],
                             int nargs, const em_karg *args, const char *op) {
    if (nargs > MAX_KARGS)
        return em_error(EM_ERR_INTERNAL, "cuda: %s has %d arguments, at most %d", kernel, nargs, MAX_KARGS);
    CUdeviceptr bufs[MAX_KARGS];
    void *params[MAX_KARGS];
    size_t sizes[MAX_KARGS];
    for (int i = 0; i < nargs; i++) {
        const em_karg *a = &args[i];
        switch (a->kind) {
        case EM_KARG_BUF:
            bufs[i] = (CUdeviceptr)(uintptr_t)a->v.buf;
            params[i] = &bufs[i];
            sizes[i] = sizeof(CUdeviceptr);
            break;
        case EM_KARG_I32: params[i] = (void *)&a->v.i32; sizes[i] = 4; break;
        case EM_KARG_I64: params[i] = (void *)&a->v.i64; sizes[i] = 8; break;
        case EM_KARG_F32: params[i] = (void *)&a->v.f32; sizes[i] = 4; break;
        case EM_KARG_F64: params[i] = (void *)&a->v.f64; sizes[i] = 8; break;
        case EM_KARG_BYTES: params[i] = (void *)a->v.bytes.p; sizes[i] = a->v.bytes.size; break;
        case EM_KARG_PTR:
            bufs[i] = (CUdeviceptr)(uintptr_t)a->v.ptr.handle + a->v.ptr.offset;
            params[i] = &bufs[i];
            sizes[i] = sizeof(CUdeviceptr);
            break;
        default: return em_error(EM_ERR_INTERNAL, "cuda: %s: bad argument kind %d", kernel, (int)a->kind);
        }
    }
    return em__cuda_launch(dev, kernel, grid, block, params, sizes, nargs, op);
}

static void cuda_info(int dev, em_gpu_info *out) {
    em_cuda_device *d = em__cuda_device(dev);
    out->compute_units = d ? d->sm_count : 1;
    out->has_f64 = true;   /* every CUDA device computes in double */
    out->max_block = 1024;
}

const em_gpu em__cuda_gpu = {.name = "cuda", .launch = cuda_launch, .info = cuda_info,
                             .gemm = em__cuda_gemm};

#define G (&em__cuda_gpu)
em_status em__cuda_op_fill(em_tensor *o, double v) { return em__gpu_fill(G, o, v); }
em_status em__cuda_op_affine(em_tensor *o, double start, double step) {
    return em__gpu_fill_affine(G, o, start, step);
}
em_status em__cuda_op_copy(em_tensor *o, const em_tensor *i) { return em__gpu_copy(G, o, i); }
em_status em__cuda_op_unary(em_op op, em_tensor *o, const em_tensor *i, const double *p) {
    return em__gpu_unary(G, op, o, i, p);
}
em_status em__cuda_op_binary(em_op op, em_tensor *o, const em_tensor *a, const em_tensor *b) {
    return em__gpu_binary(G, op, o, a, b);
}
em_status em__cuda_op_where(em_tensor *o, const em_tensor *c, const em_tensor *a, const em_tensor *b) {
    return em__gpu_where(G, o, c, a, b);
}
em_status em__cuda_op_reduce(em_op op, em_tensor *o, const em_tensor *i, const bool *r) {
    return em__gpu_reduce(G, op, o, i, r);
}
em_status em__cuda_op_matmul(em_tensor *o, const em_tensor *a, const em_tensor *b) {
    return em__gpu_matmul(G, o, a, b);
}
em_status em__cuda_op_softmax(em_tensor *o, const em_tensor *i, int dim, bool log) {
    return em__gpu_softmax(G, o, i, dim, log);
}
em_status em__cuda_op_index_select(em_tensor *o, const em_tensor *i, int dim, const em_tensor *x) {
    return em__gpu_index_select(G, o, i, dim, x);
}
em_status em__cuda_op_index_add(em_tensor *o, int dim, const em_tensor *x, const em_tensor *s) {
    return em__gpu_index_add(G, o, dim, x, s);
}
em_status em__cuda_op_gather(em_tensor *o, const em_tensor *i, int dim, const em_tensor *x) {
    return em__gpu_gather(G, o, i, dim, x);
}
em_status em__cuda_op_scatter_add(em_tensor *o, int dim, const em_tensor *x, const em_tensor *s) {
    return em__gpu_scatter_add(G, o, dim, x, s);
}
em_status em__cuda_op_rng(em_tensor *o, em_rng_kind k, uint64_t seed, uint64_t offset, double p0,
                          double p1) {
    return em__gpu_rng(G, o, k, seed, offset, p0, p1);
}
em_status em__cuda_op_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *b) {
    return em__gpu_fused_sgd(G, a, p, g, b);
}
em_status em__cuda_op_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                                 em_tensor *v, em_tensor *vmax) {
    return em__gpu_fused_adam(G, a, p, g, m, v, vmax);
}
#undef G

#endif
