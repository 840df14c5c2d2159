/* What src/dist's NCCL path needs of CUDA (declared in internal_api.h): a tensor's device
 * address and stream, completion marks on a stream, and the NCCL library. All of it comes
 * through the backend interface (backend.h's native handles and events), so that neither
 * dist nor core sees the CUDA backend's insides. */
#include "internal_api.h"
#include "core_internal.h"
#include "../util/errors.h"

/* The CUDA backend, if it gives what NCCL needs; else NULL with an error recorded. */
static const em_backend *cuda_native(void) {
    const em_backend *b = em__backend_for(EM_CUDA);
    if (!b || !b->native_enter || !b->native_leave || !b->native_address || !b->event_record ||
        !b->event_query || !b->event_destroy) {
        const char *why = b && b->unavailable_reason ? b->unavailable_reason() : "no CUDA backend in this build";
        em_error(EM_ERR_NOT_SUPPORTED, "NCCL: the CUDA backend gives no native device handles (%s)", why);
        return NULL;
    }
    return b;
}

em_status em__cuda_enter(const em_tensor *t, em_cuda_buffer *out, void **prev) {
    const em_storage *s = t->storage;
    if (s->device.type != EM_CUDA)
        return em_error(EM_ERR_DEVICE, "NCCL: expected a CUDA tensor, got one on %s", em_device_str(s->device).s);
    const em_backend *b = cuda_native();
    if (!b) return em_last_status();
    void *queue = NULL;
    if (b->native_enter(s->device.index, &queue, prev) != EM_OK) return em_last_status();
    size_t offset = s->block.offset + (size_t)t->offset * em_dtype_size(t->dtype);
    *out = (em_cuda_buffer){.ptr = (uint64_t)b->native_address(s->device.index, s->block.handle, offset),
                            .stream = queue,
                            .device = s->device.index};
    return EM_OK;
}

void em__cuda_leave(void *prev) {
    const em_backend *b = em__backend_for(EM_CUDA);
    if (b && b->native_leave) b->native_leave(prev);
}

/* A mark is the backend's event: recorded after the work queued so far on the device. */
void *em__cuda_mark(int device) {
    const em_backend *b = cuda_native();
    void *event = NULL;
    if (b && b->event_record(device, &event) != EM_OK) event = NULL;
    return event;
}

int em__cuda_mark_done(void *mark) {
    const em_backend *b = em__backend_for(EM_CUDA);
    bool done = false;
    if (!mark || !b || !b->event_query) {
        if (!em_failed()) em_error(EM_ERR_INTERNAL, "NCCL: no event to wait for");
        return -1;
    }
    if (b->event_query(mark, &done) != EM_OK) return -1; /* the failed work is named in the error */
    return done ? 1 : 0;
}

void em__cuda_mark_free(void *mark) {
    const em_backend *b = em__backend_for(EM_CUDA);
    if (mark && b && b->event_destroy) b->event_destroy(mark);
}

void *em__nccl_library(int *version, const char **reason) {
    const em_backend *b = em__backend_for(EM_CUDA);
    if (b && b->native_library) return b->native_library("nccl", version, reason);
    if (version) *version = 0;
    if (reason) *reason = b && b->unavailable_reason ? b->unavailable_reason() : "no CUDA backend in this build";
    return NULL;
}
