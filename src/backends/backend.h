/* The one backend interface. Each backend (cpu/, opencl/, cuda/) fills one em_backend
 * table: its devices, raw memory, copies, synchronization and events, and two op entries,
 * `supports` and `run`, which take an op call (src/backends/op_call.h; the ops are listed
 * once in src/kernels/op_list.h). Core dispatches every op to the table of its tensors'
 * device. GPU backends give a launcher (src/backends/gpu/gpu.h) and run their ops through
 * the shared GPU op layer. Adding a backend touches one folder and the registry in
 * src/core/device.c; adding an op touches no table. */
#ifndef EM_BACKENDS_BACKEND_H
#define EM_BACKENDS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <ember/device.h>
#include <ember/telemetry.h>
#include "op_call.h"

typedef struct em_backend {
    const char *name;          /* "cpu", "opencl", "cuda" */
    em_device_type type;

    /* ---- devices ---- */
    /* Load libraries / enumerate once; later calls are cheap. Returns EM_ERR_UNAVAILABLE
     * (without recording an error) when the backend cannot run here; reason says why. */
    em_status (*init)(void);
    const char *(*unavailable_reason)(void);
    int (*device_count)(void);
    em_status (*device_props)(int index, em_device_props *out);
    /* Optional: every GPU the driver reports (em_device_telemetry_list's contract: fields it
     * cannot tell at -1, out[i].device.index -1 for a GPU Ember does not see). NULL: none. */
    int (*telemetry)(em_device_telemetry *out, int max, em_driver_info *info, const char **reason);
    /* Optional: one line naming the run-time libraries this backend chose and why
     * (em_device_type_libraries). NULL: nothing to say. */
    void (*libraries)(char *buf, size_t size);

    /* ---- raw memory (the caching allocator sits on top) ---- */
    em_status (*raw_alloc)(int index, size_t bytes, void **handle);
    void (*raw_free)(int index, void *handle);
    /* Optional: raw_alloc's block made from the memory of the n blocks old[0..n) (raw_alloc
     * handles), which are given up whatever the outcome: their pages move under the new block
     * where the device can (no new memory to fault in and clear), the rest is freed. What the
     * new block holds is unspecified, as raw_alloc's is. NULL: the allocator frees them. */
    em_status (*raw_recycle)(int index, size_t bytes, void *const *old, int n, void **handle);
    /* Optional: virtual memory, for the allocator's expandable segments (NULL: none).
     * vm_granularity: the size every mapping is a multiple of (0: none on this device).
     * vm_reserve: `size` bytes of address space with no memory behind it; *base is a handle
     * like raw_alloc's (blocks address it with byte offsets). vm_map backs [offset, offset +
     * size) with new device memory, readable and writable by the device; vm_unmap gives that
     * memory back (exactly a range vm_map mapped, after the work queued on it), vm_release the
     * address space (everything unmapped). */
    size_t (*vm_granularity)(int index);
    em_status (*vm_reserve)(int index, size_t size, void **base);
    em_status (*vm_map)(int index, void *base, size_t offset, size_t size);
    void (*vm_unmap)(int index, void *base, size_t offset, size_t size);
    void (*vm_release)(int index, void *base, size_t size);
    /* Optional: page-locked host memory for fast copies (NULL: plain malloc). */
    em_status (*host_alloc_pinned)(size_t bytes, void **ptr);
    void (*host_free_pinned)(void *ptr);

    /* ---- copies between host memory and a block (handle + byte offset) ---- */
    em_status (*copy_h2d)(int index, void *dst_handle, size_t dst_offset, const void *src,
                          size_t bytes, bool non_blocking);
    em_status (*copy_d2h)(int index, void *dst, const void *src_handle, size_t src_offset,
                          size_t bytes);
    /* Optional: same-backend copy, possibly across two devices (NULL: staged via host). */
    em_status (*copy_d2d)(int dst_index, void *dst_handle, size_t dst_offset, int src_index,
                          const void *src_handle, size_t src_offset, size_t bytes);
    em_status (*synchronize)(int index);

    /* ---- events (optional: NULL, and a waiter synchronizes the whole device) ----
     * event_record: a new event on device index's queue, after the work queued so far;
     * event_query: *done = whether that work has finished (an error in it is returned);
     * event_synchronize: wait for that work only; event_destroy: free the event (done
     * or not). An event may be waited on or destroyed from any thread. */
    em_status (*event_record)(int index, void **event);
    em_status (*event_query)(void *event, bool *done);
    em_status (*event_synchronize)(void *event);
    void (*event_destroy)(void *event);

    /* ---- native handles, for a library outside Ember that works on this backend's memory
     * and queues (NCCL, for src/dist through src/core/dist_seam.c). Optional: NULL where the
     * backend has none ----
     * native_enter: make device index current on the calling thread for the library's calls
     * (CUDA: its context) and give the queue its ops are queued on (CUDA: the CUstream);
     * *restore, for native_leave, is what was current before. Changes nothing on failure.
     * native_address: the library's address of byte `offset` of a raw allocation `handle`
     * (CUDA: the CUdeviceptr handle + offset).
     * native_library: a run-time library the backend finds the way it finds its own (CUDA:
     * "nccl", libnccl.so.2): its handle for dlsym, and its version; NULL with *reason (kept by
     * the backend) where it cannot. */
    em_status (*native_enter)(int index, void **queue, void **restore);
    void (*native_leave)(void *restore);
    uintptr_t (*native_address)(int index, void *handle, size_t offset);
    void *(*native_library)(const char *name, int *version, const char **reason);

    /* ---- graphs (optional: NULL where the backend has none; src/core/graph.c) ----
     * graph_available: whether this device's driver can record graphs (*reason when not).
     * graph_begin: from now on the work queued on device index's queue is recorded, not run.
     * graph_end: stop recording and give the recorded work as one replayable graph; when
     * something that cannot be recorded happened in between (a host wait, a copy to or from
     * host memory, a driver call that waits), the recording is dropped and the error names
     * what it was; either way the device is out of capture afterwards. graph_launch queues the
     * whole graph once; graph_destroy frees it. */
    bool (*graph_available)(int index, const char **reason);
    em_status (*graph_begin)(int index);
    em_status (*graph_end)(int index, void **graph);
    em_status (*graph_launch)(int index, void *graph);
    void (*graph_destroy)(int index, void *graph);

    /* ---- ops ---- */
    /* GPU backends: the launcher under the shared GPU op layer (src/backends/gpu/gpu.h),
     * which runs their ops; users' kernels use it too. NULL: none. */
    const struct em_gpu *gpu;
    /* Can this backend run the call? Decided from the op, the call's dtype, its params and
     * arg; its tensors may be NULL (core asks before it allocates the outputs). Records
     * nothing. Core reports "not supported", or composes the op, where it answers false. */
    bool (*supports)(const em_op_call *call);
    /* Run the call (the contract is op_call.h's); one switch over call->op. */
    em_status (*run)(const em_op_call *call);
} em_backend;

/* Host waits (src/core/device.c): every backend's synchronize, event_synchronize and copy to
 * the host counts one, so tests can prove that a loop never waits for its device (the
 * gradient scaler's step). A statistic only: nothing depends on it. */
void em__count_host_wait(void);
long em__host_wait_count(void);

/* The registry (src/core/device.c): the backend for a type, or NULL if not built in. */
const em_backend *em__backend_for(em_device_type t);
/* The backend for a device after checking it is available and the index exists;
 * records a clear error otherwise. */
const em_backend *em__backend_checked(em_device d, const char *op);

extern const em_backend em__cpu_backend;
extern const em_backend em__cuda_backend;   /* always built: it dlopens CUDA at run time */
#ifdef EMBER_HAVE_OPENCL
extern const em_backend em__opencl_backend;
#endif

#endif
