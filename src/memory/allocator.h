/* The per-device caching allocator (src/memory/). Core allocates every storage here. */
#ifndef EM_MEMORY_ALLOCATOR_H
#define EM_MEMORY_ALLOCATOR_H

#include <stddef.h>
#include "../core/tensor_impl.h"
#include "../backends/backend.h"

/* Allocate `bytes` on device d (resolved index). On failure: free cached blocks and retry
 * once, then record PyTorch's informative out-of-memory error and return EM_ERR_OUT_OF_MEMORY.
 * bytes == 0 gives a valid empty block. */
em_status em__mem_alloc(const em_backend *be, em_device d, size_t bytes, em_block *out);
/* Return a block to the cache (or to the device when caching is off). */
void em__mem_free(const em_backend *be, em_device d, em_block *b);
/* Pinned host memory (CPU tensors with pin_memory = true). */
em_status em__mem_alloc_pinned(size_t bytes, em_block *out);
void em__mem_free_pinned(em_block *b);

#endif
