/* Users' kernels on CUDA (include/ember/kernel.h): the compile / launch_compiled / release
 * entries of the CUDA launcher (cuda_launch.c). The user's source, after Ember's prelude,
 * is compiled by NVRTC like the library's kernels (disk cache, CUBIN for the device's
 * architecture), loaded as a module of its own, and launched on the device's stream.
 * Unlike OpenCL, CUDA does not check argument sizes at launch: where the driver can list a
 * kernel's parameters (cuFuncGetParamInfo, 12.4+), a launch whose argument count or sizes
 * differ is refused. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "cuda_launch.h"
#include "../../kernels/kernel_text.h"
#include "cuda_kernels.h"

#define MAX_PARAMS 64

typedef struct cuda_user_kernel {
    int dev;
    CUmodule module;
    CUfunction func;
    int nparams;                 /* -1: the driver cannot tell */
    size_t sizes[MAX_PARAMS];
} cuda_user_kernel;

/* The kernel's parameter sizes, or -1 when the driver has no cuFuncGetParamInfo. */
static int param_sizes(CUfunction f, size_t *sizes) {
    const em_cu_api *cu = em__cuda_api();
    if (!cu->cuFuncGetParamInfo) return -1;
    int n = 0;
    for (; n < MAX_PARAMS; n++) {
        size_t off = 0;
        CUresult r = cu->cuFuncGetParamInfo(f, (size_t)n, &off, &sizes[n]);
        if (r == CUDA_ERROR_INVALID_VALUE) break;
        if (r != CUDA_SUCCESS) return -1;
    }
    return n;
}

static void *uk_compile_in(int dev, const char *source, const char *name) {
    em_cuda_device *d = em__cuda_activate(dev, "em_kernel_compile");
    if (!d) return NULL;
    char *text = em__kernel_program(EM_DIALECT_CUDA, true, source);
    cuda_user_kernel *uk = calloc(1, sizeof *uk);
    if (!text || !uk) {
        free(text);
        free(uk);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_kernel_compile: no host memory");
        return NULL;
    }
    char what[96];
    snprintf(what, sizeof what, "kernel '%s'", name);
    em_status s = em__cuda_load_module(d, what, text, &uk->module);
    free(text);
    if (s != EM_OK) {
        free(uk);
        return NULL;
    }
    CUresult r = em__cuda_api()->cuModuleGetFunction(&uk->func, uk->module, name);
    if (r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_NOT_FOUND)
            em_error(EM_ERR_ARGUMENT, "em_kernel_compile: the source has no kernel named '%s' "
                     "(declare it as KERNEL %s(...))", name, name);
        else
            em__cu_fail(r, "em_kernel_compile: cuModuleGetFunction");
        em__cuda_api()->cuModuleUnload(uk->module);
        free(uk);
        return NULL;
    }
    uk->dev = dev;
    uk->nparams = param_sizes(uk->func, uk->sizes);
    return uk;
}

static size_t arg_size(const em_karg *a) {
    switch (a->kind) {
    case EM_KARG_I32: case EM_KARG_F32: return 4;
    case EM_KARG_BYTES: return a->v.bytes.size;
    default: return 8; /* buffers, pointers, i64, f64 */
    }
}

void *em__cuda_uk_compile(int dev, const char *source, const char *name) {
    CUcontext prev = em__cuda_ctx_save();
    void *uk = uk_compile_in(dev, source, name);
    em__cuda_ctx_restore(prev);
    return uk;
}

static em_status uk_launch_in(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                              const em_karg *args, const char *name) {
    cuda_user_kernel *uk = handle;
    em_cuda_device *d = em__cuda_activate(uk->dev, name);
    if (!d) return em_last_status();
    if (block[0] > 1024 || block[1] > 1024 || block[2] > 64 || block[0] * block[1] * block[2] > 1024)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): block %zux%zux%zu; CUDA allows at "
                        "most 1024 threads per block (x, y <= 1024, z <= 64)", name, block[0],
                        block[1], block[2]);
    if (grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): grid %zux%zux%zu; CUDA allows x up "
                        "to 2^31-1 and y, z up to 65535", name, grid[0], grid[1], grid[2]);
    if (nargs > MAX_PARAMS)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): %d arguments, at most %d", name,
                        nargs, MAX_PARAMS);
    if (uk->nparams >= 0 && uk->nparams != nargs)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): the kernel has %d parameters, the "
                        "launch passed %d arguments", name, uk->nparams, nargs);
    CUdeviceptr ptrs[MAX_PARAMS];
    void *params[MAX_PARAMS];
    for (int i = 0; i < nargs; i++) {
        const em_karg *a = &args[i];
        if (uk->nparams >= 0 && arg_size(a) != uk->sizes[i])
            return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): argument %d is %zu bytes but the "
                            "kernel's parameter %d is %zu bytes (i32/f32 are 4, i64/f64 and "
                            "tensors 8)", name, i, arg_size(a), i, uk->sizes[i]);
        switch (a->kind) {
        case EM_KARG_PTR:
            ptrs[i] = (CUdeviceptr)(uintptr_t)a->v.ptr.handle + a->v.ptr.offset;
            params[i] = &ptrs[i];
            break;
        case EM_KARG_BUF:
            ptrs[i] = (CUdeviceptr)(uintptr_t)a->v.buf;
            params[i] = &ptrs[i];
            break;
        case EM_KARG_I32: params[i] = (void *)&a->v.i32; break;
        case EM_KARG_I64: params[i] = (void *)&a->v.i64; break;
        case EM_KARG_F32: params[i] = (void *)&a->v.f32; break;
        case EM_KARG_F64: params[i] = (void *)&a->v.f64; break;
        case EM_KARG_BYTES: params[i] = (void *)a->v.bytes.p; break;
        default:
            return em_error(EM_ERR_INTERNAL, "em_kernel_launch(%s): argument kind %d", name, (int)a->kind);
        }
    }
    CUresult r = em__cuda_api()->cuLaunchKernel(uk->func, (unsigned)grid[0], (unsigned)grid[1],
                                                (unsigned)grid[2], (unsigned)block[0],
                                                (unsigned)block[1], (unsigned)block[2], 0,
                                                d->stream, params, NULL);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "em_kernel_launch(%s) on cuda:%d", name, uk->dev);
        return em__cu_fail(r, what);
    }
    return em__cuda_after_launch(d, name, name);
}

em_status em__cuda_uk_launch(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                             const em_karg *args, const char *name) {
    EM_CUDA_CTX_SCOPED(uk_launch_in(handle, grid, block, nargs, args, name));
}

void em__cuda_uk_release(void *handle) {
    cuda_user_kernel *uk = handle;
    if (!uk) return;
    CUcontext prev = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(uk->dev, "em_kernel_free");
    if (d) {
        /* queued launches of this kernel must finish before its code goes away; an error
         * they hit stays pending for the next synchronization that reports errors */
        em__cuda_api()->cuStreamSynchronize(d->stream);
        em__cuda_api()->cuModuleUnload(uk->module);
    }
    em__cuda_ctx_restore(prev);
    free(uk);
}

#endif
