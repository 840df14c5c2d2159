/* The CUDA backend: devices, lazy contexts, memory, copies, synchronization, and the
 * table core dispatches to. Its ops are the shared GPU op layer (src/backends/gpu/) over the
 * launcher in cuda_launch.c.
 *
 * A context is created only for a device that is used (its primary context, retained on
 * first use), never implicitly on cuda:0; each used device has one non-blocking stream on
 * which every op and copy of that device is queued. */
#include "cuda_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "cuda_smi.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "cuda_launch.h"
#include "../../memory/allocator.h"
#include <ember/memory.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool tried, ok;
    char reason[2048];
    int count;
    int driver_version;            /* 12040 for CUDA 12.4 */
    bool launch_blocking;          /* EMBER_CUDA_LAUNCH_BLOCKING=1 */
    em_cuda_device devs[EM_CUDA_MAX_DEVICES];
} g;
/* The driver table, readable without the lock once set (error names use it). */
static const em_cu_api *_Atomic g_cu;

const em_cu_api *em__cuda_api(void) { return g_cu; }

static void init_locked(void) {
    const char *reason = NULL;
    const em_cu_api *cu = em__cuda_driver(&reason);
    if (!cu) { snprintf(g.reason, sizeof g.reason, "%s", reason); return; }
    g_cu = cu; /* from here error names come from the driver */
    CUresult r = cu->cuInit(0);
    if (r != CUDA_SUCCESS) {
        em__cuda_init_reason((int)r, em__cu_name(r), em__cu_desc(r), g.reason, sizeof g.reason);
        return;
    }
    int count = 0;
    if (cu->cuDriverGetVersion(&g.driver_version) != CUDA_SUCCESS) g.driver_version = 0;
    r = cu->cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count <= 0) {
        snprintf(g.reason, sizeof g.reason, "no device: cuDeviceGetCount returned %s, %d devices",
                 em__cu_name(r), count);
        return;
    }
    if (count > EM_CUDA_MAX_DEVICES) count = EM_CUDA_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        em_cuda_device *d = &g.devs[i];
        memset(d, 0, sizeof *d);
        d->index = i;
        if ((r = cu->cuDeviceGet(&d->dev, i)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceGetName(d->name, (int)sizeof d->name, d->dev)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceTotalMem(&d->total_mem, d->dev)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceGetAttribute(&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceGetAttribute(&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceGetAttribute(&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev)) != CUDA_SUCCESS) {
            snprintf(g.reason, sizeof g.reason, "driver failed: querying cuda:%d gave %s (%s)", i,
                     em__cu_name(r), em__cu_desc(r));
            return;
        }
        if (cu->cuDeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, d->dev) != CUDA_SUCCESS)
            d->pci_bus_id[0] = '\0';
    }
    const char *lb = getenv("EMBER_CUDA_LAUNCH_BLOCKING");
    g.launch_blocking = lb && *lb && strcmp(lb, "0") != 0;
    g.count = count;
    g.ok = true;
}

static em_status cuda_init(void) {
    pthread_mutex_lock(&g_lock);
    if (!g.tried) {
        g.tried = true;
        init_locked();
    }
    bool ok = g.ok;
    pthread_mutex_unlock(&g_lock);
    return ok ? EM_OK : EM_ERR_UNAVAILABLE;
}

static const char *cuda_reason(void) { return cuda_init() == EM_OK ? NULL : g.reason; }
static int cuda_count(void) { return cuda_init() == EM_OK ? g.count : 0; }
int em__cuda_count(void) { return cuda_count(); }

em_cuda_device *em__cuda_device(int index) {
    if (cuda_init() != EM_OK) {
        em_error(EM_ERR_UNAVAILABLE, "cuda is not available: %s", g.reason);
        return NULL;
    }
    if (index < 0 || index >= g.count) {
        em_error(EM_ERR_DEVICE, "cuda:%d does not exist (this machine has %d CUDA device%s)", index,
                 g.count, g.count == 1 ? "" : "s");
        return NULL;
    }
    return &g.devs[index];
}

/* First use of a device: retain its primary context, make the stream and the event. */
static em_status activate_locked(em_cuda_device *d, int index) {
    const em_cu_api *cu = g_cu;
    char what[96];
    CUresult r = cu->cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuda:%d: creating its context", index);
        return em__cu_fail(r, what);
    }
    if ((r = cu->cuCtxSetCurrent(d->ctx)) != CUDA_SUCCESS ||
        (r = cu->cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        cu->cuDevicePrimaryCtxRelease(d->dev);
        snprintf(what, sizeof what, "cuda:%d: creating its stream", index);
        return em__cu_fail(r, what);
    }
    if ((r = cu->cuEventCreate(&d->done, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        cu->cuStreamDestroy(d->stream);
        cu->cuDevicePrimaryCtxRelease(d->dev);
        snprintf(what, sizeof what, "cuda:%d: creating an event", index);
        return em__cu_fail(r, what);
    }
    __atomic_store_n(&d->active, true, __ATOMIC_RELEASE);
    return EM_OK;
}

em_cuda_device *em__cuda_activate(int index, const char *op) {
    em_cuda_device *d = em__cuda_device(index);
    if (!d) return NULL;
    if (!__atomic_load_n(&d->active, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&g_lock);
        bool fresh = !d->active;
        em_status s = fresh ? activate_locked(d, index) : EM_OK;
        pthread_mutex_unlock(&g_lock);
        if (s != EM_OK) return NULL;
        /* CUDA is in use: pinned tensors from now on are page-locked by the driver
         * (cuMemHostAlloc), so their non-blocking copies are truly asynchronous instead
         * of staged. Outside g_lock: the pinned cache calls into this backend under its own. */
        if (fresh) em__mem_pinned_set_provider(&em__cuda_backend);
    }
    CUresult r = g_cu->cuCtxSetCurrent(d->ctx); /* per thread, and cheap */
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuda:%d: %s: making its context current", index, op);
        em__cu_fail(r, what);
        return NULL;
    }
    return d;
}

CUcontext em__cuda_ctx_save(void) {
    const em_cu_api *cu = g_cu;
    if (!cu) {
        cuda_init(); /* the driver is loaded by the call this guards anyway */
        if (!(cu = g_cu)) return NULL;
    }
    CUcontext c = NULL;
    return cu->cuCtxGetCurrent(&c) == CUDA_SUCCESS ? c : NULL;
}

void em__cuda_ctx_restore(CUcontext prev) {
    const em_cu_api *cu = g_cu;
    CUcontext cur = NULL;
    if (cu && cu->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != prev) cu->cuCtxSetCurrent(prev);
}

static int index_of(const em_cuda_device *d) { return (int)(d - g.devs); }

/* Record the failure r of d's queued work, naming the op queued last. */
static em_status queued_fail(em_cuda_device *d, const char *why, CUresult r) {
    pthread_mutex_lock(&g_lock);
    char op[sizeof d->last_op], kernel[sizeof d->last_kernel];
    snprintf(op, sizeof op, "%s", d->last_op);
    snprintf(kernel, sizeof kernel, "%s", d->last_kernel);
    pthread_mutex_unlock(&g_lock);
    char what[512];
    if (op[0])
        snprintf(what, sizeof what,
                 "cuda:%d: %s: queued work failed; the last op queued on this device was '%s'%s%s%s",
                 index_of(d), why, op, kernel[0] ? " (kernel " : "", kernel, kernel[0] ? ")" : "");
    else
        snprintf(what, sizeof what, "cuda:%d: %s: queued work failed", index_of(d), why);
    return em__cu_fail(r, what);
}

em_status em__cuda_sync_device(em_cuda_device *d, const char *why) {
    if (__atomic_load_n(&d->capturing, __ATOMIC_ACQUIRE)) {
        char what[128];
        snprintf(what, sizeof what, "a host wait (%s)", why);
        return em__cuda_refuse_in_capture(d, what);
    }
    CUresult r = g_cu->cuStreamSynchronize(d->stream);
    return r == CUDA_SUCCESS ? EM_OK : queued_fail(d, why, r);
}

em_status em__cuda_after_launch(em_cuda_device *d, const char *op, const char *kernel) {
    pthread_mutex_lock(&g_lock);
    snprintf(d->last_op, sizeof d->last_op, "%s", op);
    snprintf(d->last_kernel, sizeof d->last_kernel, "%s", kernel ? kernel : "");
    pthread_mutex_unlock(&g_lock);
    return g.launch_blocking ? em__cuda_sync_device(d, op) : EM_OK;
}

/* ---- properties ---- */

/* NVML's view of the device with this PCI bus id (free memory before any context). */
static em_nvml_device nvml_for(const em_cuda_device *d, const em_nvml_api **api_out) {
    const em_nvml_api *nv = em__cuda_nvml(NULL);
    em_nvml_device h = NULL;
    if (!nv || !d->pci_bus_id[0] || nv->nvmlDeviceGetHandleByPciBusId_v2(d->pci_bus_id, &h) != EM_NVML_SUCCESS)
        return NULL;
    *api_out = nv;
    return h;
}

static em_status props_in(int index, em_device_props *out) {
    em_cuda_device *d = em__cuda_device(index);
    if (!d) return em_last_status();
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->vendor, sizeof out->vendor, "NVIDIA");
    out->total_memory = (int64_t)d->total_mem;
    out->free_memory = -1;
    out->compute_units = d->sm_count;
    out->compute_capability = d->cc_major * 10 + d->cc_minor;
    out->is_gpu = true;
    const em_nvml_api *nv = NULL;
    em_nvml_device h = nvml_for(d, &nv);
    char drv[80] = "";
    if (nv) nv->nvmlSystemGetDriverVersion(drv, sizeof drv);
    snprintf(out->driver, sizeof out->driver, "CUDA %d.%d%s%s", g.driver_version / 1000,
             (g.driver_version % 1000) / 10, drv[0] ? ", driver " : "", drv);
    if (__atomic_load_n(&d->active, __ATOMIC_ACQUIRE)) {
        /* cuMemGetInfo needs a context: only ask once this device has one */
        size_t free_b = 0, total_b = 0;
        if (g_cu->cuCtxSetCurrent(d->ctx) == CUDA_SUCCESS &&
            g_cu->cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS)
            out->free_memory = (int64_t)free_b;
    } else if (h) {
        em_nvml_memory m;
        if (nv->nvmlDeviceGetMemoryInfo(h, &m) == EM_NVML_SUCCESS) out->free_memory = (int64_t)m.free;
    }
    return EM_OK;
}

/* ---- memory ---- */

static em_status cuda_props(int index, em_device_props *out) { EM_CUDA_CTX_SCOPED(props_in(index, out)); }

static em_status raw_alloc_in(int index, size_t bytes, void **handle) {
    em_cuda_device *d = em__cuda_activate(index, "alloc");
    if (!d) return em_last_status();
    CUdeviceptr p = 0;
    /* During a graph capture the caching allocator takes a segment for the graph's pool:
     * cuMemAlloc is not recorded (the memory stays the pool's for the graph's life), so it is
     * made in relaxed mode, where the driver allows it, as PyTorch's allocator does. */
    bool relax = __atomic_load_n(&d->capturing, __ATOMIC_ACQUIRE);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (relax) g_cu->cuThreadExchangeStreamCaptureMode(&mode);
    /* A zero-byte request still gets a distinct, freeable handle. */
    CUresult r = g_cu->cuMemAlloc(&p, bytes ? bytes : 1);
    if (relax) g_cu->cuThreadExchangeStreamCaptureMode(&mode);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "cuda:%d: cuMemAlloc of %zu bytes", index, bytes);
        return em__cu_fail(r, what);
    }
    *handle = (void *)(uintptr_t)p;
    return EM_OK;
}

static em_status cuda_raw_alloc(int index, size_t bytes, void **handle) {
    EM_CUDA_CTX_SCOPED(raw_alloc_in(index, bytes, handle));
}

static void cuda_raw_free(int index, void *handle) {
    if (!handle) return;
    CUcontext prev = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(index, "free");
    /* cuMemFree waits for the device's queued work, so a block in use is never pulled. */
    CUresult r = d ? g_cu->cuMemFree((CUdeviceptr)(uintptr_t)handle) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuda:%d: cuMemFree", index);
        em__cu_fail(r, what);
    }
    em__cuda_ctx_restore(prev);
}

/* Pinned memory belongs to a context: use the first active device's, else the current
 * CUDA device's (as PyTorch does), and allocate it portable so every device can use it. */
static em_cuda_device *pinned_owner(void) {
    if (cuda_init() != EM_OK) {
        em_error(EM_ERR_UNAVAILABLE, "pinned memory needs CUDA, which is not available: %s", g.reason);
        return NULL;
    }
    for (int i = 0; i < g.count; i++)
        if (__atomic_load_n(&g.devs[i].active, __ATOMIC_ACQUIRE)) return em__cuda_activate(i, "pin");
    int current = em_device_current(EM_CUDA).index;
    return em__cuda_activate(current >= 0 && current < g.count ? current : 0, "pin");
}

static em_status host_alloc_pinned_in(size_t bytes, void **ptr) {
    if (!pinned_owner()) return em_last_status();
    CUresult r = g_cu->cuMemHostAlloc(ptr, bytes ? bytes : 1, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "cuda: cuMemHostAlloc of %zu pinned bytes", bytes);
        return em__cu_fail(r, what);
    }
    return EM_OK;
}

static em_status cuda_host_alloc_pinned(size_t bytes, void **ptr) {
    EM_CUDA_CTX_SCOPED(host_alloc_pinned_in(bytes, ptr));
}

static void cuda_host_free_pinned(void *ptr) {
    if (!ptr) return;
    CUcontext prev = em__cuda_ctx_save();
    if (pinned_owner()) {
        CUresult r = g_cu->cuMemFreeHost(ptr);
        if (r != CUDA_SUCCESS) em__cu_fail(r, "cuda: cuMemFreeHost");
    }
    em__cuda_ctx_restore(prev);
}

/* ---- copies: all on the device's stream, so they are ordered after its queued ops ---- */

static CUdeviceptr at(const void *handle, size_t offset) {
    return (CUdeviceptr)(uintptr_t)handle + offset;
}

static em_status copy_fail(CUresult r, int index, const char *what) {
    char buf[96];
    snprintf(buf, sizeof buf, "cuda:%d: %s", index, what);
    return em__cu_fail(r, buf);
}

static em_status copy_h2d_in(int index, void *dst_handle, size_t dst_offset, const void *src,
                             size_t bytes, bool non_blocking) {
    if (bytes == 0) return EM_OK;
    em_cuda_device *d = em__cuda_activate(index, "copy to device");
    if (!d) return em_last_status();
    if (d->capturing) return em__cuda_refuse_in_capture(d, "a copy from host memory");
    /* From pageable memory the driver stages the data before returning, so the caller
     * may reuse src at once either way; from pinned memory the copy is truly async. */
    CUresult r = g_cu->cuMemcpyHtoDAsync(at(dst_handle, dst_offset), src, bytes, d->stream);
    if (r != CUDA_SUCCESS) return copy_fail(r, index, "copy from host");
    em__cuda_after_launch(d, "copy to device", NULL);
    return non_blocking ? EM_OK : em__cuda_sync_device(d, "copy to device");
}

static em_status cuda_copy_h2d(int index, void *dst_handle, size_t dst_offset, const void *src,
                               size_t bytes, bool non_blocking) {
    EM_CUDA_CTX_SCOPED(copy_h2d_in(index, dst_handle, dst_offset, src, bytes, non_blocking));
}

static em_status copy_d2h_in(int index, void *dst, const void *src_handle, size_t src_offset,
                             size_t bytes) {
    if (bytes == 0) return EM_OK;
    em__count_host_wait(); /* waits for the stream */
    em_cuda_device *d = em__cuda_activate(index, "copy to host");
    if (!d) return em_last_status();
    if (d->capturing) return em__cuda_refuse_in_capture(d, "a copy to host memory");
    CUresult r = g_cu->cuMemcpyDtoHAsync(dst, at(src_handle, src_offset), bytes, d->stream);
    if (r != CUDA_SUCCESS) return copy_fail(r, index, "copy to host");
    /* waits for the ops that produced the data; their errors surface here */
    return em__cuda_sync_device(d, "copy to host");
}

static em_status cuda_copy_d2h(int index, void *dst, const void *src_handle, size_t src_offset,
                               size_t bytes) {
    EM_CUDA_CTX_SCOPED(copy_d2h_in(index, dst, src_handle, src_offset, bytes));
}

/* Let dst's context read src's memory directly when the hardware allows (tried once). */
static void try_peer(em_cuda_device *dst, em_cuda_device *src, int src_index) {
    uint64_t bit = 1ull << src_index;
    if (__atomic_fetch_or(&dst->peer_tried, bit, __ATOMIC_ACQ_REL) & bit) return;
    int can = 0;
    if (g_cu->cuDeviceCanAccessPeer(&can, dst->dev, src->dev) == CUDA_SUCCESS && can)
        g_cu->cuCtxEnablePeerAccess(src->ctx, 0); /* failure only means a staged copy */
}

static em_status copy_d2d_in(int dst_index, void *dst_handle, size_t dst_offset, int src_index,
                             const void *src_handle, size_t src_offset, size_t bytes) {
    if (bytes == 0) return EM_OK;
    if (dst_index == src_index) {
        em_cuda_device *d = em__cuda_activate(dst_index, "copy");
        if (!d) return em_last_status();
        CUresult r = g_cu->cuMemcpyDtoDAsync(at(dst_handle, dst_offset), at(src_handle, src_offset),
                                             bytes, d->stream);
        if (r != CUDA_SUCCESS) return copy_fail(r, dst_index, "device copy");
        return em__cuda_after_launch(d, "copy", NULL);
    }
    em_cuda_device *s = em__cuda_activate(src_index, "copy across devices");
    em_cuda_device *d = s ? em__cuda_activate(dst_index, "copy across devices") : NULL;
    if (!d) return em_last_status();
    try_peer(d, s, src_index);
    /* dst's stream waits for the work that produces src; afterwards src's stream waits
     * for the copy, so src's memory is not rewritten or reused while it is read. */
    CUresult r;
    if ((r = g_cu->cuEventRecord(s->done, s->stream)) != CUDA_SUCCESS ||
        (r = g_cu->cuStreamWaitEvent(d->stream, s->done, 0)) != CUDA_SUCCESS ||
        (r = g_cu->cuMemcpyPeerAsync(at(dst_handle, dst_offset), d->ctx, at(src_handle, src_offset),
                                     s->ctx, bytes, d->stream)) != CUDA_SUCCESS ||
        (r = g_cu->cuEventRecord(d->done, d->stream)) != CUDA_SUCCESS ||
        (r = g_cu->cuStreamWaitEvent(s->stream, d->done, 0)) != CUDA_SUCCESS)
        return copy_fail(r, dst_index, "copy across devices");
    em__cuda_after_launch(s, "copy across devices", NULL);
    return em__cuda_after_launch(d, "copy across devices", NULL);
}

static em_status cuda_copy_d2d(int dst_index, void *dst_handle, size_t dst_offset, int src_index,
                               const void *src_handle, size_t src_offset, size_t bytes) {
    EM_CUDA_CTX_SCOPED(copy_d2d_in(dst_index, dst_handle, dst_offset, src_index, src_handle,
                                   src_offset, bytes));
}

static em_status synchronize_in(int index) {
    em__count_host_wait();
    em_cuda_device *d = em__cuda_device(index);
    if (!d) return em_last_status();
    /* A device never used has no context and nothing queued: creating one to wait on
     * nothing would cost memory on a GPU the program does not use. */
    if (!__atomic_load_n(&d->active, __ATOMIC_ACQUIRE)) return EM_OK;
    if (!em__cuda_activate(index, "synchronize")) return em_last_status();
    return em__cuda_sync_device(d, "synchronize");
}

static em_status cuda_synchronize(int index) { EM_CUDA_CTX_SCOPED(synchronize_in(index)); }

/* ---- events: one copy's completion, for the pinned cache (backend.h) ---- */

typedef struct cuda_event {
    CUevent ev;
    int index;
} cuda_event;

static em_status event_record_in(int index, void **out) {
    *out = NULL;
    em_cuda_device *d = em__cuda_activate(index, "event");
    if (!d) return em_last_status();
    cuda_event *e = malloc(sizeof *e);
    if (!e) return em_error(EM_ERR_OUT_OF_MEMORY, "cuda:%d: no host memory for an event", index);
    e->index = index;
    CUresult r = g_cu->cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS && (r = g_cu->cuEventRecord(e->ev, d->stream)) != CUDA_SUCCESS)
        g_cu->cuEventDestroy(e->ev);
    if (r != CUDA_SUCCESS) {
        free(e);
        return copy_fail(r, index, "recording an event");
    }
    *out = e;
    return EM_OK;
}
static em_status cuda_event_record(int index, void **out) { EM_CUDA_CTX_SCOPED(event_record_in(index, out)); }

static em_status event_query_in(cuda_event *e, bool *done) {
    *done = false;
    em_cuda_device *d = em__cuda_activate(e->index, "event");
    if (!d) return em_last_status();
    if (d->capturing) return em__cuda_refuse_in_capture(d, "asking whether queued work is done");
    CUresult r = g_cu->cuEventQuery(e->ev);
    if (r == CUDA_ERROR_NOT_READY) return EM_OK;
    *done = true;
    return r == CUDA_SUCCESS ? EM_OK : queued_fail(d, "event", r);
}
static em_status cuda_event_query(void *e, bool *done) { EM_CUDA_CTX_SCOPED(event_query_in(e, done)); }

static em_status event_sync_in(cuda_event *e) {
    em_cuda_device *d = em__cuda_activate(e->index, "event");
    if (!d) return em_last_status();
    if (d->capturing) return em__cuda_refuse_in_capture(d, "a host wait (event)");
    CUresult r = g_cu->cuEventSynchronize(e->ev);
    return r == CUDA_SUCCESS ? EM_OK : queued_fail(d, "waiting for an event", r);
}
static em_status cuda_event_synchronize(void *e) { EM_CUDA_CTX_SCOPED(event_sync_in(e)); }

static void cuda_event_destroy(void *event) {
    cuda_event *e = event;
    if (!e) return;
    CUcontext prev = em__cuda_ctx_save();
    if (em__cuda_activate(e->index, "event")) g_cu->cuEventDestroy(e->ev);
    em__cuda_ctx_restore(prev);
    free(e);
}

/* ---- native handles, for NCCL (backend.h) ---- */

static em_status cuda_native_enter(int index, void **queue, void **restore) {
    CUcontext prev = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(index, "a library's call");
    if (!d) {
        em__cuda_ctx_restore(prev);
        return em_last_status();
    }
    *queue = d->stream;
    *restore = prev;
    return EM_OK;
}

static void cuda_native_leave(void *restore) { em__cuda_ctx_restore((CUcontext)restore); }

/* A raw allocation's handle is its CUdeviceptr. */
static uintptr_t cuda_native_address(int index, void *handle, size_t offset) {
    (void)index;
    return (uintptr_t)handle + offset;
}

static void *cuda_native_library(const char *name, int *version, const char **reason) {
    if (name && !strcmp(name, "nccl")) return em__cuda_nccl(version, reason);
    if (version) *version = 0;
    if (reason) *reason = "the CUDA backend loads no such library (it knows \"nccl\")";
    return NULL;
}

void em__cuda_backend_reset(void) {
    /* What the allocators hold came from this driver: give it back while it is loaded
     * (outside g_lock: freeing calls back into the backend). */
    em_error_state saved;
    em__error_save(&saved);
    for (int i = 0; i < g.count; i++) {
        em_cuda_device *d = &g.devs[i];
        if (!d->active) continue;
        em__cuda_gemm_release(d);
        em__cuda_cudnn_release(d);
        em_memory_empty_cache(EM_DEVICE(EM_CUDA, i));
    }
    em__mem_pinned_set_provider(NULL);
    em_memory_empty_pinned_cache();
    em__error_restore(&saved);
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g.count; i++) {
        em_cuda_device *d = &g.devs[i];
        if (!d->active) continue;
        if (g_cu->cuCtxSetCurrent(d->ctx) == CUDA_SUCCESS) {
            em__cuda_release_device_resources(d);
            g_cu->cuEventDestroy(d->done);
            g_cu->cuStreamDestroy(d->stream);
        }
        g_cu->cuDevicePrimaryCtxRelease(d->dev);
    }
    memset(&g, 0, sizeof g);
    g_cu = NULL;
    pthread_mutex_unlock(&g_lock);
    em__cuda_loader_reset();
}

/* CUDA's own ops: cuBLAS's GEMM with a float32 C (OpenCL's GEMM has no f16/bf16) and cuDNN's
 * convolution when it is found at run time (else EM_ERR_NOT_SUPPORTED, and core runs im2col +
 * matmul); every other op through the shared GPU op layer. */
static bool cuda_supports(const em_op_call *call) {
    switch (call->op) {
    case EM_OP_MATMUL_WIDEN: return call->dtype == EM_BF16 || call->dtype == EM_F16;
    case EM_OP_CONV2D: case EM_OP_CONV2D_BACKWARD_INPUT: case EM_OP_CONV2D_BACKWARD_WEIGHT:
        return em__op_dtype_ok(call->op, call->dtype);
    default: return em__gpu_supports(&em__cuda_gpu, call);
    }
}

static em_status cuda_run(const em_op_call *c) {
    const em_window2d *win = c->arg;
    switch (c->op) {
    case EM_OP_MATMUL_WIDEN: return em__gpu_matmul_widen(c->dst[0], c->src[0], c->src[1]);
    case EM_OP_CONV2D: return em__cuda_conv2d(c->dst[0], c->src[0], c->src[1], c->src[2], win, c->i[0]);
    case EM_OP_CONV2D_BACKWARD_INPUT:
        return em__cuda_conv2d_backward_input(c->dst[0], c->src[0], c->src[1], win, c->i[0]);
    case EM_OP_CONV2D_BACKWARD_WEIGHT:
        return em__cuda_conv2d_backward_weight(c->dst[0], c->src[0], c->src[1], win, c->i[0]);
    default: return em__gpu_run(&em__cuda_gpu, c);
    }
}

const em_backend em__cuda_backend = {
    .name = "cuda",
    .type = EM_CUDA,
    .init = cuda_init,
    .unavailable_reason = cuda_reason,
    .device_count = cuda_count,
    .device_props = cuda_props,
    .telemetry = em__cuda_telemetry,
    .libraries = em__cuda_libraries_line,
    .raw_alloc = cuda_raw_alloc,
    .raw_free = cuda_raw_free,
    .vm_granularity = em__cuda_vm_granularity,
    .vm_reserve = em__cuda_vm_reserve,
    .vm_map = em__cuda_vm_map,
    .vm_unmap = em__cuda_vm_unmap,
    .vm_release = em__cuda_vm_release,
    .host_alloc_pinned = cuda_host_alloc_pinned,
    .host_free_pinned = cuda_host_free_pinned,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2d = cuda_copy_d2d,
    .synchronize = cuda_synchronize,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .event_destroy = cuda_event_destroy,
    .native_enter = cuda_native_enter,
    .native_leave = cuda_native_leave,
    .native_address = cuda_native_address,
    .native_library = cuda_native_library,
    .graph_available = em__cuda_graph_available,
    .graph_begin = em__cuda_graph_begin,
    .graph_end = em__cuda_graph_end,
    .graph_launch = em__cuda_graph_launch,
    .graph_destroy = em__cuda_graph_destroy,
    .gpu = &em__cuda_gpu,
    .supports = cuda_supports,
    .run = cuda_run,
};

#else /* built without the CUDA headers */

static em_status cuda_init(void) { return EM_ERR_UNAVAILABLE; }
static const char *cuda_reason(void) {
    return "unavailable: built without CUDA headers (install the CUDA toolkit and rebuild)";
}
static int cuda_count(void) { return 0; }

const em_backend em__cuda_backend = {
    .name = "cuda",
    .type = EM_CUDA,
    .init = cuda_init,
    .unavailable_reason = cuda_reason,
    .device_count = cuda_count,
    .telemetry = em__cuda_telemetry,
};

#endif
