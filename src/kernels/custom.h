/* The small table a GPU backend fills to run users' kernels (include/ember/kernel.h).
 * OpenCL's is em__ocl_kernel_backend (src/backends/opencl/opencl_custom.c). The CUDA
 * backend defines `const em_kernel_backend em__cuda_kernel_backend` in the same file as
 * em_cuda_backend (so it is linked whenever that backend is); custom.c finds it through a
 * weak reference and needs no edit. */
#ifndef EM_KERNELS_CUSTOM_H
#define EM_KERNELS_CUSTOM_H

#include "gpu.h"

typedef struct em_kernel_backend {
    em_device_type type;
    /* Compile kernel `name` of the program text (prelude + user source, see
     * em__kernel_program) for device index dev: an opaque handle, or NULL with an error. */
    void *(*compile)(int dev, const char *source, const char *name);
    /* Queue it: grid[i] blocks of block[i] threads. Tensor arguments arrive as EM_KARG_PTR. */
    em_status (*launch)(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                        const em_karg *args, const char *name);
    void (*release)(void *handle);
} em_kernel_backend;

#ifdef EMBER_HAVE_OPENCL
extern const em_kernel_backend em__ocl_kernel_backend;
#endif
extern const em_kernel_backend em__cuda_kernel_backend __attribute__((weak));

#endif
