/* A block of device memory as the caching allocator (src/memory/) hands it out. Core keeps
 * one in every storage (src/core/tensor_impl.h); backends address memory by its handle and
 * byte offset. */
#ifndef EM_MEMORY_BLOCK_H
#define EM_MEMORY_BLOCK_H

#include <stddef.h>

/* `handle` is the backend's base object (a host pointer on CPU, a CUdeviceptr on CUDA, a
 * cl_mem on OpenCL) and `offset` the byte offset of this block inside it. */
typedef struct em_block {
    void *handle;
    size_t offset;
    size_t size;        /* bytes usable (>= requested) */
    void *alloc_ctx;    /* the allocator's own record of the block */
} em_block;

#endif
