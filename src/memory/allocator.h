/* The per-device caching allocator (src/memory/). Core allocates every storage here. */
#ifndef EM_MEMORY_ALLOCATOR_H
#define EM_MEMORY_ALLOCATOR_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include "block.h"
#include "../backends/backend.h"

/* Allocate `bytes` on device d (resolved index). On failure: free cached blocks and retry
 * once, then record PyTorch's informative out-of-memory error and return EM_ERR_OUT_OF_MEMORY.
 * bytes == 0 gives a valid empty block. */
em_status em__mem_alloc(const em_backend *be, em_device d, size_t bytes, em_block *out);
/* Return a block to the cache (or to the device when caching is off). */
void em__mem_free(const em_backend *be, em_device d, em_block *b);

/* Streams (queues) are numbered 0..63 per device; 0 is the default one, the only one today.
 * A block remembers the queues that used it; reusing it for another queue first waits for
 * the device (be->synchronize). em__mem_alloc is em__mem_alloc_stream(..., 0, ...). */
em_status em__mem_alloc_stream(const em_backend *be, em_device d, size_t bytes, int stream,
                               em_block *out);
/* torch's record_stream: queue `stream` also uses this live block. */
void em__mem_record_stream(em_block *b, int stream);

/* Pinned host memory (CPU tensors with pin_memory = true), with its own cache. */
em_status em__mem_alloc_pinned(size_t bytes, em_block *out);
void em__mem_free_pinned(em_block *b);
/* Take pinned memory from be->host_alloc_pinned (e.g. the CUDA backend once it is up)
 * instead of plain aligned host memory. Blocks already handed out keep their provider. */
void em__mem_pinned_set_provider(const em_backend *be);
/* A non-blocking copy on device `index` of be reads or writes this pinned block: before
 * the block is reused, the allocator waits for that copy (an event recorded after it when
 * the backend has events, else the whole device). */
void em__mem_pinned_record_use(em_block *b, const em_backend *be, int index);

/* Graph capture (src/core/graph.c). From em__mem_capture_begin to em__mem_capture_end every
 * allocation on device d comes from a new private pool, PyTorch's graph pool: the graph's
 * work uses those addresses at every replay, so the pool's memory is handed to no one else
 * until em__mem_pool_release (the graph is gone); its segments then go back to the device as
 * their last blocks are freed. No cached segment is given back to the device during a capture
 * (freeing device memory waits for the device, which a capture forbids). Begin returns the
 * pool's id (> 0), or 0 with an error recorded (a capture already under way on d). */
uint64_t em__mem_capture_begin(const em_backend *be, em_device d);
void em__mem_capture_end(em_device d);
void em__mem_pool_release(em_device d, uint64_t pool_id);

/* Fault injection for tests: raw allocation number `nth` from now (1 = the next one), and
 * the `count - 1` after it, fail as if the device were full. nth <= 0 turns it off. */
void em__mem_debug_fail_raw(int64_t nth, int64_t count);
/* The same for one allocation: em__mem_debug_fail_raw(n, 1). */
void em__mem_debug_fail_after(int64_t n);
/* Fault injection at the request level (tests/test_fault_sweep.c): every device and pinned
 * allocation request is counted, and request `nth` from now (1 = the next one) fails with
 * EM_ERR_OUT_OF_MEMORY, as it would on a full device, before the cache is looked at.
 * nth <= 0 only counts. em__mem_debug_requests() returns the requests counted since the
 * last em__mem_debug_fail_request call. A testing hook, not a public API. */
void em__mem_debug_fail_request(int64_t nth);
int64_t em__mem_debug_requests(void);

#endif
