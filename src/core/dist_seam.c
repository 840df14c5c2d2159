/* What src/dist's NCCL path needs of CUDA (declared in internal_api.h): a tensor's device
 * address and stream, completion marks on a stream, and the NCCL library. Core reaches the
 * CUDA backend's internals here so that dist never does. */
#include <stdlib.h>
#include "internal_api.h"
#include "tensor_impl.h"
#ifdef EMBER_HAVE_CUDA_HEADERS
#include "../backends/cuda/cuda_internal.h"
#include "../backends/cuda/cuda_loader.h"

em_status em__cuda_enter(const em_tensor *t, em_cuda_buffer *out, void **prev) {
    if (t->storage->device.type != EM_CUDA)
        return em_error(EM_ERR_DEVICE, "NCCL: expected a CUDA tensor, got one on %s", em_device_str(t->storage->device).s);
    CUcontext p = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(t->storage->device.index, "nccl");
    if (!d) {
        em__cuda_ctx_restore(p);
        return em_last_status();
    }
    *out = (em_cuda_buffer){.ptr = (uint64_t)em__cuda_ptr(t), .stream = d->stream, .device = t->storage->device.index};
    *prev = p;
    return EM_OK;
}

void em__cuda_leave(void *prev) { em__cuda_ctx_restore((CUcontext)prev); }

typedef struct mark { CUevent ev; int device; } mark;

void *em__cuda_mark(int device) {
    const em_cu_api *cu = em__cuda_api();
    CUcontext p = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(device, "nccl");
    mark *m = d && cu ? calloc(1, sizeof *m) : NULL;
    if (m && (cu->cuEventCreate(&m->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
              cu->cuEventRecord(m->ev, d->stream) != CUDA_SUCCESS)) {
        if (m->ev) cu->cuEventDestroy(m->ev);
        free(m);
        m = NULL;
        em_error(EM_ERR_BACKEND, "NCCL: cannot record an event on cuda:%d's stream", device);
    } else if (!m && !em_failed()) {
        em_error(EM_ERR_OUT_OF_MEMORY, "NCCL: out of host memory");
    }
    if (m) m->device = device;
    em__cuda_ctx_restore(p);
    return m;
}

int em__cuda_mark_done(void *mk) {
    mark *m = mk;
    const em_cu_api *cu = em__cuda_api();
    CUresult r = cu->cuEventQuery(m->ev);
    if (r == CUDA_SUCCESS) return 1;
    if (r == CUDA_ERROR_NOT_READY) return 0;
    em_error(EM_ERR_BACKEND, "NCCL: work on cuda:%d failed (cuEventQuery returned %d)", m->device, (int)r);
    return -1;
}

void em__cuda_mark_free(void *mk) {
    mark *m = mk;
    if (!m) return;
    const em_cu_api *cu = em__cuda_api();
    if (cu) cu->cuEventDestroy(m->ev);
    free(m);
}

void *em__nccl_library(int *version, const char **reason) { return em__cuda_nccl(version, reason); }
#else
em_status em__cuda_enter(const em_tensor *t, em_cuda_buffer *out, void **prev) {
    (void)t, (void)out, (void)prev;
    return em_error(EM_ERR_NOT_SUPPORTED, "NCCL: this Ember was built without the CUDA headers");
}
void em__cuda_leave(void *prev) { (void)prev; }
void *em__cuda_mark(int device) {
    (void)device;
    em_error(EM_ERR_NOT_SUPPORTED, "NCCL: this Ember was built without the CUDA headers");
    return NULL;
}
int em__cuda_mark_done(void *mark) { return mark ? 1 : -1; }
void em__cuda_mark_free(void *mark) { (void)mark; }
void *em__nccl_library(int *version, const char **reason) {
    if (version) *version = 0;
    if (reason) *reason = "this Ember was built without the CUDA headers";
    return NULL;
}
#endif
