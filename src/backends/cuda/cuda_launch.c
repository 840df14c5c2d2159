/* The CUDA launcher under the shared GPU op layer (src/backends/gpu/gpu.h): typed kernel
 * arguments marshalled for cuLaunchKernel, device info, cuBLAS GEMM, users' kernels. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "../../util/errors.h"
#include "cuda_kernels.h"
#include "cuda_launch.h"

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

const em_gpu em__cuda_gpu = {
    .name = "cuda",
    .launch = cuda_launch,
    .info = cuda_info,
    .resident_blocks = em__cuda_resident_blocks,
    .gemm = em__cuda_gemm,
    .compile = em__cuda_uk_compile,
    .launch_compiled = em__cuda_uk_launch,
    .release = em__cuda_uk_release,
};

#endif
