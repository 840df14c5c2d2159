/* The OpenCL backend: every platform and device, memory, copies, synchronization, and the
 * backend table (its ops are the shared GPU op layer of src/backends/gpu/ over the
 * launcher in opencl_program.c).
 *
 * Devices: all devices of all platforms; GPUs come first in the index order, then
 * accelerators, then CPU devices such as PoCL (usable, never preferred by auto-selection).
 * Contexts: one per platform, holding all its devices, so a copy between two devices of
 * one platform is a direct clEnqueueCopyBuffer ordered by events; devices of different
 * platforms copy through host memory. Each device has one in-order queue: ops run in the
 * order they were queued and nothing waits until a read to the host or a synchronize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "opencl_internal.h"

#define CL_DEVICE_GLOBAL_FREE_MEMORY_AMD_ 0x4039

static ocl_device *g_devs;
static int g_ndev;
static em_status g_status = EM_ERR_UNAVAILABLE;
static char g_reason[256] = "OpenCL has not been initialized";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *em__ocl_err_name(cl_int err) {
    static _Thread_local char buf[64];
    const char *n = "unknown OpenCL error";
    switch (err) {
#define E(x) case x: n = #x; break;
        E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE)
        E(CL_COMPILER_NOT_AVAILABLE) E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES)
        E(CL_OUT_OF_HOST_MEMORY) E(CL_MEM_COPY_OVERLAP) E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_INVALID_VALUE) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT) E(CL_INVALID_COMMAND_QUEUE)
        E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_BINARY) E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE) E(CL_INVALID_KERNEL_NAME)
        E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX) E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE)
        E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_OPERATION) E(CL_INVALID_BUFFER_SIZE) E(CL_INVALID_GLOBAL_WORK_SIZE)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
#undef E
    case -1001: n = "CL_PLATFORM_NOT_FOUND_KHR"; break;
    default: break;
    }
    snprintf(buf, sizeof buf, "%s (%d)", n, (int)err);
    return buf;
}

static void get_str(cl_device_id dev, cl_device_info what, char *out, size_t n) {
    out[0] = 0;
    if (clGetDeviceInfo(dev, what, n, out, NULL) != CL_SUCCESS) snprintf(out, n, "?");
    out[n - 1] = 0;
}

static bool has_extension(cl_device_id dev, const char *ext) {
    size_t n = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, 0, NULL, &n) != CL_SUCCESS || !n) return false;
    char *s = malloc(n + 1);
    if (!s) return false;
    bool found = clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, n, s, NULL) == CL_SUCCESS &&
                 (s[n] = 0, strstr(s, ext) != NULL);
    free(s);
    return found;
}

static int type_rank(cl_device_id dev) {
    cl_device_type t = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof t, &t, NULL);
    return (t & CL_DEVICE_TYPE_GPU) ? 0 : (t & CL_DEVICE_TYPE_ACCELERATOR) ? 1 : 2;
}

static bool setup_device(ocl_device *d, cl_platform_id p, cl_device_id id, cl_context ctx,
                         int group) {
    memset(d, 0, sizeof *d);
    cl_int e;
    d->queue = clCreateCommandQueue(ctx, id, 0, &e);
    if (e != CL_SUCCESS) return false;
    d->platform = p;
    d->id = id;
    d->ctx = ctx;
    d->ctx_group = group;
    em_device_props *pr = &d->props;
    get_str(id, CL_DEVICE_NAME, pr->name, sizeof pr->name);
    get_str(id, CL_DEVICE_VENDOR, pr->vendor, sizeof pr->vendor);
    get_str(id, CL_DRIVER_VERSION, pr->driver, sizeof pr->driver);
    cl_ulong mem = 0, max_alloc = 0;
    cl_uint cu = 0;
    size_t wg = 0;
    cl_device_fp_config fp64 = 0;
    clGetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
    clGetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    clGetDeviceInfo(id, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    if (clGetDeviceInfo(id, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64, &fp64, NULL) != CL_SUCCESS)
        fp64 = 0;
    pr->total_memory = (int64_t)mem;
    pr->free_memory = -1;
    pr->compute_units = (int)cu;
    pr->compute_capability = 0;
    pr->is_gpu = type_rank(id) == 0;
    cl_device_type dtype = 0;
    clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof dtype, &dtype, NULL);
    /* EMBER_OPENCL_CPU_KERNELS=0 runs the GPU-style kernels on CPU devices too (tests) */
    const char *cpu_kernels = getenv("EMBER_OPENCL_CPU_KERNELS");
    d->is_cpu = (dtype & CL_DEVICE_TYPE_CPU) != 0 && !(cpu_kernels && strcmp(cpu_kernels, "0") == 0);
    d->has_f64 = fp64 != 0 || has_extension(id, "cl_khr_fp64");
    char pname[128] = "";
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    d->is_pocl = strstr(pname, "Portable Computing Language") != NULL;
    d->max_block = wg;
    d->max_alloc = (size_t)max_alloc;
    d->build_status = EM_OK;
    return true;
}

static void init_once(void) {
    cl_uint np = 0;
    cl_int e = clGetPlatformIDs(0, NULL, &np);
    if (e != CL_SUCCESS || np == 0) {
        snprintf(g_reason, sizeof g_reason,
                 "no OpenCL platform: the ICD loader found no driver (%s)", em__ocl_err_name(e));
        return;
    }
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats || clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) {
        free(plats);
        snprintf(g_reason, sizeof g_reason, "clGetPlatformIDs failed");
        return;
    }
    /* gather devices, a context per platform */
    int cap = 0, n = 0;
    ocl_device *devs = NULL;
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || !nd)
            continue;
        cl_device_id *ids = calloc(nd, sizeof *ids);
        if (!ids || clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, NULL) != CL_SUCCESS) {
            free(ids);
            continue;
        }
        cl_context_properties cp[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[p], 0};
        cl_context ctx = clCreateContext(cp, nd, ids, NULL, NULL, &e);
        if (e == CL_SUCCESS) {
            int first = n;
            for (cl_uint i = 0; i < nd; i++) {
                if (n == cap) {
                    cap = cap ? cap * 2 : 8;
                    ocl_device *grown = realloc(devs, (size_t)cap * sizeof *devs);
                    if (!grown) break;
                    devs = grown;
                }
                if (setup_device(&devs[n], plats[p], ids[i], ctx, (int)p)) n++;
            }
            if (n == first) clReleaseContext(ctx); /* none of its devices is usable */
        }
        free(ids);
    }
    free(plats);
    if (n == 0) {
        free(devs);
        snprintf(g_reason, sizeof g_reason, "no usable OpenCL device on %u platform(s)", np);
        return;
    }
    /* GPUs first, then accelerators, then CPUs; platform order kept within a kind */
    for (int i = 1; i < n; i++) {
        ocl_device t = devs[i];
        int r = type_rank(t.id), j = i - 1;
        while (j >= 0 && type_rank(devs[j].id) > r) {
            devs[j + 1] = devs[j];
            j--;
        }
        devs[j + 1] = t;
    }
    /* mutexes are initialized in their final place, after the sort */
    for (int i = 0; i < n; i++) pthread_mutex_init(&devs[i].lock, NULL);
    g_devs = devs;
    g_ndev = n;
    g_status = EM_OK;
    g_reason[0] = 0;
}

static em_status ocl_init(void) {
    pthread_once(&g_once, init_once);
    return g_status;
}
static const char *ocl_reason(void) {
    pthread_once(&g_once, init_once);
    return g_status == EM_OK ? NULL : g_reason;
}
static int ocl_count(void) {
    pthread_once(&g_once, init_once);
    return g_ndev;
}

ocl_device *em__ocl_device(int index) {
    pthread_once(&g_once, init_once);
    return index >= 0 && index < g_ndev ? &g_devs[index] : NULL;
}

static ocl_device *dev_or_error(int index, const char *what) {
    ocl_device *d = em__ocl_device(index);
    if (!d) em_error(EM_ERR_DEVICE, "%s: opencl:%d does not exist (%d OpenCL device%s)", what, index,
                     g_ndev, g_ndev == 1 ? "" : "s");
    return d;
}

void em__ocl_note_op(ocl_device *d, const char *op) {
    snprintf(d->recent_ops[d->recent_next++ % 4], sizeof d->recent_ops[0], "%s", op);
}

static em_status ocl_props(int index, em_device_props *out) {
    ocl_device *d = dev_or_error(index, "device properties");
    if (!d) return EM_ERR_DEVICE;
    *out = d->props;
    if (has_extension(d->id, "cl_amd_device_attribute_query")) {
        size_t kb[2] = {0, 0};
        if (clGetDeviceInfo(d->id, CL_DEVICE_GLOBAL_FREE_MEMORY_AMD_, sizeof kb, kb, NULL) ==
            CL_SUCCESS)
            out->free_memory = (int64_t)kb[0] * 1024;
    }
    return EM_OK;
}

/* ---- memory ---- */

static em_status ocl_alloc(int index, size_t bytes, void **handle) {
    ocl_device *d = dev_or_error(index, "alloc");
    if (!d) return EM_ERR_DEVICE;
    if (bytes > d->max_alloc)
        return em_error(EM_ERR_OUT_OF_MEMORY,
                        "opencl:%d (%s): one allocation of %zu bytes exceeds the device's limit "
                        "of %zu bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                        index, d->props.name, bytes, d->max_alloc);
    cl_int e;
    cl_mem m = clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &e);
    if (e != CL_SUCCESS) {
        em_status code = e == CL_INVALID_VALUE || e == CL_INVALID_CONTEXT ? EM_ERR_BACKEND
                                                                            : EM_ERR_OUT_OF_MEMORY;
        return em_error(code, "opencl:%d (%s): clCreateBuffer of %zu bytes failed: %s", index,
                        d->props.name, bytes, em__ocl_err_name(e));
    }
    *handle = m;
    return EM_OK;
}

static void ocl_free(int index, void *handle) {
    (void)index;
    /* safe with work still queued: OpenCL keeps the buffer until the kernels finish */
    if (handle) clReleaseMemObject((cl_mem)handle);
}

/* ---- copies ---- */

static em_status copy_error(int index, const char *what, cl_int e) {
    return em_error(EM_ERR_BACKEND, "opencl:%d: %s failed: %s", index, what, em__ocl_err_name(e));
}

static em_status ocl_h2d(int index, void *dst, size_t dst_off, const void *src, size_t bytes,
                         bool non_blocking) {
    ocl_device *d = dev_or_error(index, "copy to device");
    if (!d) return EM_ERR_DEVICE;
    if (!bytes) return EM_OK;
    cl_int e = clEnqueueWriteBuffer(d->queue, (cl_mem)dst, non_blocking ? CL_FALSE : CL_TRUE,
                                    dst_off, bytes, src, 0, NULL, NULL);
    return e == CL_SUCCESS ? EM_OK : copy_error(index, "copy host to device", e);
}

static em_status ocl_d2h(int index, void *dst, const void *src, size_t src_off, size_t bytes) {
    ocl_device *d = dev_or_error(index, "copy to host");
    if (!d) return EM_ERR_DEVICE;
    if (!bytes) return EM_OK;
    em__count_host_wait(); /* a blocking read */
    /* blocking, and the in-order queue runs everything queued before it first */
    cl_int e = clEnqueueReadBuffer(d->queue, (cl_mem)src, CL_TRUE, src_off, bytes, dst, 0, NULL,
                                   NULL);
    return e == CL_SUCCESS ? EM_OK : copy_error(index, "copy device to host", e);
}

static em_status ocl_d2d(int di, void *dst, size_t dst_off, int si, const void *src,
                         size_t src_off, size_t bytes) {
    ocl_device *dd = dev_or_error(di, "copy"), *sd = dd ? dev_or_error(si, "copy") : NULL;
    if (!dd || !sd) return EM_ERR_DEVICE;
    if (!bytes) return EM_OK;
    cl_int e;
    if (dd == sd) {
        e = clEnqueueCopyBuffer(dd->queue, (cl_mem)src, (cl_mem)dst, src_off, dst_off, bytes, 0,
                                NULL, NULL);
        return e == CL_SUCCESS ? EM_OK : copy_error(di, "copy on device", e);
    }
    if (dd->ctx_group == sd->ctx_group) {
        /* one context: the copy runs on dst's queue after everything queued on src's, and
         * src's queue waits for the copy before it may overwrite the source */
        cl_event ready = NULL, done = NULL;
        e = clEnqueueMarkerWithWaitList(sd->queue, 0, NULL, &ready);
        if (e == CL_SUCCESS)
            e = clEnqueueCopyBuffer(dd->queue, (cl_mem)src, (cl_mem)dst, src_off, dst_off, bytes,
                                    1, &ready, &done);
        if (e == CL_SUCCESS) e = clEnqueueBarrierWithWaitList(sd->queue, 1, &done, NULL);
        if (ready) clReleaseEvent(ready);
        if (done) clReleaseEvent(done);
        if (e == CL_SUCCESS) {
            clFlush(sd->queue);
            clFlush(dd->queue);
        }
        return e == CL_SUCCESS ? EM_OK : copy_error(di, "copy between devices", e);
    }
    /* different platforms: staged through host memory */
    void *tmp = malloc(bytes);
    if (!tmp)
        return em_error(EM_ERR_OUT_OF_MEMORY, "copy opencl:%d -> opencl:%d: no host memory for "
                        "%zu bytes of staging", si, di, bytes);
    e = clEnqueueReadBuffer(sd->queue, (cl_mem)src, CL_TRUE, src_off, bytes, tmp, 0, NULL, NULL);
    if (e == CL_SUCCESS)
        e = clEnqueueWriteBuffer(dd->queue, (cl_mem)dst, CL_TRUE, dst_off, bytes, tmp, 0, NULL,
                                 NULL);
    free(tmp);
    return e == CL_SUCCESS ? EM_OK : copy_error(di, "copy between platforms", e);
}

static em_status ocl_sync(int index) {
    ocl_device *d = dev_or_error(index, "synchronize");
    if (!d) return EM_ERR_DEVICE;
    em__count_host_wait();
    cl_int e = clFinish(d->queue);
    if (e == CL_SUCCESS) return EM_OK;
    pthread_mutex_lock(&d->lock);
    char recent[128] = "";
    for (unsigned i = 0; i < 4 && i < d->recent_next; i++) {
        const char *op = d->recent_ops[(d->recent_next - 1 - i) % 4];
        size_t len = strlen(recent);
        snprintf(recent + len, sizeof recent - len, "%s%s", i ? ", " : "", op);
    }
    pthread_mutex_unlock(&d->lock);
    return em_error(EM_ERR_BACKEND,
                    "opencl:%d (%s): queued work failed: %s; last ops queued (newest first): %s",
                    index, d->props.name, em__ocl_err_name(e), recent[0] ? recent : "none");
}

/* OpenCL runs every op through the shared GPU op layer over its launcher (opencl_program.c). */
static bool ocl_supports(const em_op_call *call) { return em__gpu_supports(&em__ocl_gpu, call); }
static em_status ocl_run(const em_op_call *call) { return em__gpu_run(&em__ocl_gpu, call); }

const em_backend em__opencl_backend = {
    .name = "opencl",
    .type = EM_OPENCL,
    .init = ocl_init,
    .unavailable_reason = ocl_reason,
    .device_count = ocl_count,
    .device_props = ocl_props,
    .raw_alloc = ocl_alloc,
    .raw_free = ocl_free,
    .copy_h2d = ocl_h2d,
    .copy_d2h = ocl_d2h,
    .copy_d2d = ocl_d2d,
    .synchronize = ocl_sync,
    .event_record = em__ocl_event_record,
    .event_query = em__ocl_event_query,
    .event_synchronize = em__ocl_event_synchronize,
    .event_destroy = em__ocl_event_destroy,
    .gpu = &em__ocl_gpu,
    .supports = ocl_supports,
    .run = ocl_run,
};
