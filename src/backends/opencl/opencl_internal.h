/* Private to the OpenCL backend. */
#ifndef EM_BACKENDS_OPENCL_INTERNAL_H
#define EM_BACKENDS_OPENCL_INTERNAL_H

#include <CL/cl.h>
#include <pthread.h>
#include <stdbool.h>
#include "../backend.h"
#include "../../core/tensor_impl.h" /* the tensors of an op call */
#include "../gpu/gpu.h"

/* A program and the kernels created from it, per device (library or user program). */
typedef struct ocl_kernel_slot {
    char *name;
    cl_kernel kernel;
} ocl_kernel_slot;

typedef struct ocl_device {
    cl_platform_id platform;
    cl_device_id id;
    cl_context ctx;            /* one per platform, shared by its devices (direct d2d copies) */
    int ctx_group;             /* devices with equal ctx_group share ctx */
    cl_command_queue queue;    /* in-order: ops run in the order they were queued */
    em_device_props props;
    bool has_f64;
    bool is_pocl;              /* PoCL: see the cache policy in opencl_program.c */
    bool is_cpu;               /* CL_DEVICE_TYPE_CPU */
    size_t max_block;
    size_t max_alloc;
    /* guards the lazy build and each set-args + enqueue pair (cl_kernel is not thread-safe) */
    pthread_mutex_t lock;
    cl_program program;        /* Ember's kernels, built on first use */
    em_status build_status;    /* EM_OK, or the sticky failure of the first build */
    char *build_error;
    ocl_kernel_slot *slots;    /* open addressing by name */
    size_t nslots;
    char recent_ops[4][24];    /* the last ops queued, to name them if a finish fails */
    unsigned recent_next;
} ocl_device;

/* The device table (opencl_backend.c); NULL when the index is out of range or the backend
 * is unavailable. */
ocl_device *em__ocl_device(int index);
/* "CL_OUT_OF_RESOURCES (-5)" */
const char *em__ocl_err_name(cl_int err);
/* Remember that op was queued on d (caller holds d->lock or it is a plain copy). */
void em__ocl_note_op(ocl_device *d, const char *op);

/* Programs (opencl_program.c). */
/* Build `source` for d, from the on-disk cache when possible (and write the binary there
 * when `write`); on failure records EM_ERR_BACKEND with the build log naming `what` and
 * returns NULL, with the OpenCL error in *cl_err when cl_err is not NULL. */
cl_program em__ocl_build(ocl_device *d, const char *source, const char *what, bool write,
                         cl_int *cl_err);
/* The launcher for the shared GPU op layer (opencl_program.c). */
extern const em_gpu em__ocl_gpu;
/* Users' kernels (opencl_custom.c), the launcher's compile / launch_compiled / release. */
void *em__ocl_uk_compile(int dev, const char *source, const char *name);
em_status em__ocl_uk_launch(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                            const em_karg *args, const char *name);
void em__ocl_uk_release(void *handle);
/* Set kernel arguments from typed values (caller holds d->lock). */
em_status em__ocl_set_args(cl_kernel k, int nargs, const em_karg *args, const char *what);
/* Optional CLBlast GEMM (opencl_gemm.c): EM_ERR_NOT_SUPPORTED when CLBlast is missing. */
em_status em__ocl_clblast_gemm(int dev, const em_gemm_args *g);
/* Events (opencl_events.c): backend.h's event slots, markers on the device's queue. */
em_status em__ocl_event_record(int index, void **event);
em_status em__ocl_event_query(void *event, bool *done);
em_status em__ocl_event_synchronize(void *event);
void em__ocl_event_destroy(void *event);
/* Is CLBlast in use for matmul (loaded and not disabled by EMBER_OPENCL_GEMM=ember)? */
bool em__ocl_clblast_enabled(void);

#endif
