/* Temporary: hands allocations straight to the backend. Replaced by the caching allocator. */
#include "allocator.h"
#include "../core/errors.h"
#include <stdlib.h>

em_status em__mem_alloc(const em_backend *be, em_device d, size_t bytes, em_block *out) {
    void *h = NULL;
    em_status s = be->raw_alloc(d.index, bytes ? bytes : 1, &h);
    if (s != EM_OK) return s;
    *out = (em_block){.handle = h, .offset = 0, .size = bytes, .alloc_ctx = NULL};
    return EM_OK;
}

void em__mem_free(const em_backend *be, em_device d, em_block *b) {
    if (b->handle) be->raw_free(d.index, b->handle);
    b->handle = NULL;
}

em_status em__mem_alloc_pinned(size_t bytes, em_block *out) {
    void *p = aligned_alloc(64, ((bytes ? bytes : 1) + 63) / 64 * 64);
    if (!p) return em_error(EM_ERR_OUT_OF_MEMORY, "pinned host allocation of %zu bytes failed", bytes);
    *out = (em_block){.handle = p, .offset = 0, .size = bytes, .alloc_ctx = NULL};
    return EM_OK;
}

void em__mem_free_pinned(em_block *b) {
    free(b->handle);
    b->handle = NULL;
}
