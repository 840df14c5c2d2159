/* Users' GPU kernels (include/ember/kernel.h): checks, argument conversion, and dispatch to
 * the launcher (gpu.h) of the device type's backend, found through the registry. */
#include <ember/kernel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "gpu.h"
#include "../../kernels/kernel_text.h"

struct em_kernel {
    em_device device;
    const em_gpu *gpu;
    void *handle;
    char name[64];
};

/* The launcher that compiles users' kernels for type t, or NULL. */
static const em_gpu *kernel_launcher_for(em_device_type t) {
    const em_backend *be = em__backend_for(t);
    return be && be->gpu && be->gpu->compile ? be->gpu : NULL;
}

em_kernel *em_kernel_compile(const char *source, const char *name, em_device device) {
    if (!source || !name) {
        if (!em_failed())
            em_error(EM_ERR_ARGUMENT, "em_kernel_compile: argument '%s' is NULL",
                     source ? "name" : "source");
        return NULL;
    }
    if (!*name || strlen(name) >= sizeof ((em_kernel *)0)->name) {
        em_error(EM_ERR_ARGUMENT, "em_kernel_compile: kernel name '%s' must have 1 to 63 characters",
                 name);
        return NULL;
    }
    device = em_device_resolve(device);
    const em_gpu *gpu = kernel_launcher_for(device.type);
    if (!gpu) {
        em_error(EM_ERR_NOT_SUPPORTED,
                 "em_kernel_compile: custom kernels run on GPU-type devices (opencl:N, cuda:N); "
                 "%s has no kernel compiler", em_device_str(device).s);
        return NULL;
    }
    if (!em__backend_checked(device, "em_kernel_compile")) return NULL;
    em_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_kernel_compile: no host memory");
        return NULL;
    }
    k->device = device;
    k->gpu = gpu;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->handle = gpu->compile(device.index, source, name);
    if (!k->handle) {
        free(k);
        return NULL;
    }
    return k;
}

static em_status arg_error(const em_kernel *k, int i, const char *what) {
    return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): argument %d: %s", k->name, i, what);
}

em_status em_kernel_launch(em_kernel *k, em_dim3 grid, em_dim3 block, int nargs,
                           const em_kernel_arg *args) {
    if (!k) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_kernel_launch: argument 'k' is NULL");
        return em_failed() ? em_last_status() : EM_ERR_ARGUMENT;
    }
    if (nargs < 0 || (nargs > 0 && !args))
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): %d arguments but no argument array",
                        k->name, nargs);
    if (nargs > 64)
        return em_error(EM_ERR_ARGUMENT, "em_kernel_launch(%s): %d arguments, at most 64", k->name,
                        nargs);
    size_t g[3] = {grid.x ? grid.x : 1, grid.y ? grid.y : 1, grid.z ? grid.z : 1};
    size_t b[3] = {block.x ? block.x : 1, block.y ? block.y : 1, block.z ? block.z : 1};
    em_karg ka[64];
    for (int i = 0; i < nargs; i++) {
        const em_kernel_arg *a = &args[i];
        switch (a->kind) {
        case EM_ARG_TENSOR: {
            em_tensor *t = a->v.tensor;
            if (!t) return em_failed() ? em_last_status() : arg_error(k, i, "tensor is NULL");
            if (!em_device_equal(t->storage->device, k->device)) {
                char msg[160];
                snprintf(msg, sizeof msg, "tensor is on %s but the kernel was compiled for %s",
                         em_device_str(t->storage->device).s, em_device_str(k->device).s);
                return em_error(EM_ERR_DEVICE, "em_kernel_launch(%s): argument %d: %s", k->name, i,
                                msg);
            }
            if (!em_is_contiguous(t))
                return arg_error(k, i, "tensor is not contiguous (a kernel indexes it linearly); "
                                       "pass em_contiguous(t)");
            size_t off = t->storage->block.offset + (size_t)t->offset * em_dtype_size(t->dtype);
            ka[i] = (em_karg){.kind = EM_KARG_PTR, .v.ptr = {t->storage->block.handle, off}};
            break;
        }
        case EM_ARG_I32: ka[i] = EM_KI32(a->v.i32); break;
        case EM_ARG_I64: ka[i] = EM_KI64(a->v.i64); break;
        case EM_ARG_F32: ka[i] = EM_KF32(a->v.f32); break;
        case EM_ARG_F64: ka[i] = EM_KF64(a->v.f64); break;
        default: return arg_error(k, i, "unknown argument kind");
        }
    }
    return k->gpu->launch_compiled(k->handle, g, b, nargs, ka, k->name);
}

em_device em_kernel_device(const em_kernel *k) { return k ? k->device : EM_DEVICE_CPU; }

void em_kernel_free(em_kernel *k) {
    if (!k) return;
    k->gpu->release(k->handle);
    free(k);
}
