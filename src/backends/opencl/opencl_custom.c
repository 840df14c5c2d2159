/* Users' kernels on OpenCL: the compile / launch_compiled / release entries of the OpenCL
 * launcher (src/backends/gpu/gpu.h). Each compiled kernel is its own program, built
 * through the disk cache. A tensor argument that starts inside its buffer becomes a
 * sub-buffer (the allocator's 512-byte block alignment meets CL_DEVICE_MEM_BASE_ADDR_ALIGN
 * on common devices); a view at an unaligned offset is refused with advice, since OpenCL
 * C 1.2 cannot offset a buffer argument otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "../../kernels/kernel_text.h"
#include "opencl_internal.h"

typedef struct ocl_user_kernel {
    int dev;
    cl_program program;
    cl_kernel kernel;
    pthread_mutex_t lock; /* set-args + enqueue must not interleave between threads */
} ocl_user_kernel;

void *em__ocl_uk_compile(int dev, const char *source, const char *name) {
    ocl_device *d = em__ocl_device(dev);
    if (!d) {
        em_error(EM_ERR_DEVICE, "em_kernel_compile: opencl:%d does not exist", dev);
        return NULL;
    }
    char *text = em__kernel_program(EM_DIALECT_OPENCL, d->has_f64, source);
    if (!text) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_kernel_compile: no host memory");
        return NULL;
    }
    char what[128];
    snprintf(what, sizeof what, "kernel '%s' for opencl:%d", name, dev);
    pthread_mutex_lock(&d->lock); /* one build at a time per device */
    cl_program p = em__ocl_build(d, text, what, true, NULL);
    pthread_mutex_unlock(&d->lock);
    free(text);
    if (!p) return NULL;
    cl_int e;
    cl_kernel k = clCreateKernel(p, name, &e);
    if (e != CL_SUCCESS) {
        char names[256] = "";
        clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, sizeof names - 1, names, NULL);
        em_error(EM_ERR_ARGUMENT, "em_kernel_compile: the source has no kernel named '%s' "
                 "(kernels found: %s)", name, names[0] ? names : "none");
        clReleaseProgram(p);
        return NULL;
    }
    ocl_user_kernel *uk = calloc(1, sizeof *uk);
    if (!uk) {
        clReleaseKernel(k);
        clReleaseProgram(p);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_kernel_compile: no host memory");
        return NULL;
    }
    uk->dev = dev;
    uk->program = p;
    uk->kernel = k;
    pthread_mutex_init(&uk->lock, NULL);
    return uk;
}

em_status em__ocl_uk_launch(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                            const em_karg *args, const char *name) {
    ocl_user_kernel *uk = handle;
    ocl_device *d = em__ocl_device(uk->dev);
    size_t threads = block[0] * block[1] * block[2];
    if (threads > d->max_block)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): %zu threads per block, opencl:%d "
                        "(%s) allows at most %zu", name, threads, uk->dev, d->props.name,
                        d->max_block);
    cl_uint nparams = 0;
    clGetKernelInfo(uk->kernel, CL_KERNEL_NUM_ARGS, sizeof nparams, &nparams, NULL);
    if ((cl_uint)nargs != nparams)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): the kernel has %u parameters, the "
                        "launch passed %d arguments", name, nparams, nargs);
    cl_uint align_bits = 0;
    clGetDeviceInfo(d->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    size_t align = align_bits / 8 ? align_bits / 8 : 1;
    cl_mem subs[64];
    int nsubs = 0;
    em_karg conv[64];
    em_status s = EM_OK;
    for (int i = 0; i < nargs && s == EM_OK; i++) {
        conv[i] = args[i];
        if (args[i].kind != EM_KARG_PTR) continue;
        cl_mem m = (cl_mem)args[i].v.ptr.handle;
        size_t off = args[i].v.ptr.offset;
        if (off) {
            if (off % align) {
                s = em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): argument %d starts %zu bytes "
                             "into its buffer, not a multiple of opencl:%d's %zu-byte base "
                             "alignment; pass em_clone(t)", name, i, off, uk->dev, align);
                break;
            }
            size_t total = 0;
            clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof total, &total, NULL);
            cl_buffer_region r = {off, total - off};
            cl_int e;
            m = clCreateSubBuffer(m, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
            if (e != CL_SUCCESS) {
                s = em_error(EM_ERR_BACKEND, "em_kernel_launch(%s): argument %d: clCreateSubBuffer "
                             "failed: %s", name, i, em__ocl_err_name(e));
                break;
            }
            subs[nsubs++] = m;
        }
        conv[i] = EM_KBUF(m);
    }
    if (s == EM_OK) {
        pthread_mutex_lock(&uk->lock);
        char what[96];
        snprintf(what, sizeof what, "em_kernel_launch(%s)", name);
        s = em__ocl_set_args(uk->kernel, nargs, conv, what);
        if (s == EM_OK) {
            size_t global[3] = {grid[0] * block[0], grid[1] * block[1], grid[2] * block[2]};
            cl_uint dims = (grid[2] > 1 || block[2] > 1) ? 3 : (grid[1] > 1 || block[1] > 1) ? 2 : 1;
            cl_int e = clEnqueueNDRangeKernel(d->queue, uk->kernel, dims, NULL, global, block, 0,
                                              NULL, NULL);
            if (e != CL_SUCCESS)
                s = em_error(e == CL_INVALID_KERNEL_ARGS ? EM_ERR_ARGUMENT : EM_ERR_BACKEND,
                             "em_kernel_launch(%s) on opencl:%d failed: %s%s", name, uk->dev,
                             em__ocl_err_name(e),
                             e == CL_INVALID_KERNEL_ARGS ? " (fewer arguments than the kernel "
                                                           "has parameters)" : "");
        }
        pthread_mutex_unlock(&uk->lock);
        if (s == EM_OK) {
            pthread_mutex_lock(&d->lock);
            em__ocl_note_op(d, name);
            pthread_mutex_unlock(&d->lock);
        }
    }
    /* released here, kept alive by the queued kernel until it finishes */
    for (int i = 0; i < nsubs; i++) clReleaseMemObject(subs[i]);
    return s;
}

void em__ocl_uk_release(void *handle) {
    ocl_user_kernel *uk = handle;
    if (!uk) return;
    clReleaseKernel(uk->kernel);
    clReleaseProgram(uk->program);
    pthread_mutex_destroy(&uk->lock);
    free(uk);
}
