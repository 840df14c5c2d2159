/* Private to src/memory/: the caching allocator's records, shared by its files. */
#ifndef EM_MEMORY_INTERNAL_H
#define EM_MEMORY_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <ember/memory.h>
#include "allocator.h"

/* PyTorch's CUDACachingAllocator constants. */
#define MEM_MIN_BLOCK ((size_t)512)                 /* every size is rounded up to this */
#define MEM_SMALL_SIZE ((size_t)1 << 20)            /* <= 1 MiB: small pool */
#define MEM_SMALL_BUFFER ((size_t)2 << 20)          /* small pool segments */
#define MEM_LARGE_BUFFER ((size_t)20 << 20)         /* segments for 1..10 MiB requests */
#define MEM_MIN_LARGE_ALLOC ((size_t)10 << 20)      /* from here segments are the request... */
#define MEM_ROUND_LARGE ((size_t)2 << 20)           /* ...rounded up to 2 MiB */
#define MEM_MAX_DEVICES 64                          /* indices per device type */

struct mem_state;
struct mem_pool;

/* A piece of memory taken from the device in one raw_alloc. */
typedef struct mem_segment {
    void *handle;
    size_t size;
    uint64_t id;               /* creation order: ties in best fit go to older segments */
    int pool;                  /* EM_MEMORY_SMALL_POOL or EM_MEMORY_LARGE_POOL */
    int nblocks, nfree;        /* blocks in the segment, and how many are free */
    size_t free_bytes;
    struct mem_state *st;
    struct mem_pool *owner;    /* the pool whose trees hold its free blocks */
    struct mem_block *tail;    /* its last block by address */
    /* An expandable segment (EMBER_CUDA_ALLOC_CONF=expandable_segments:True): `handle` is an
     * address range of va_size bytes reserved once, of which the first `size` are mapped in
     * chunks of the device's granularity; it grows at its end instead of a new segment. */
    bool expandable;
    size_t va_size;
    /* A nested segment (small pool, Ember's policy): a free block of the large pool taken
     * whole as a small segment, `parent`, allocated in its own segment while this one lives.
     * Its memory is the parent segment's, from byte `base` of `handle`; it goes back into the
     * large pool the moment its last block is freed, so that the two pools share memory
     * without a system call. 0 and NULL for a segment of its own. */
    size_t base;
    struct mem_block *parent;
} mem_segment;

/* A block: (segment, offset, size). Free blocks live in their pool's tree, ordered by
 * (size, segment id, offset); prev/next are the address-order neighbours in the segment. */
typedef struct mem_block {
    mem_segment *seg;
    size_t offset, size;
    size_t requested;          /* bytes asked for (allocated blocks) */
    struct mem_block *prev, *next;
    struct mem_block *left, *right; /* treap children (free blocks) */
    struct mem_block *link;    /* scratch list (empty_cache) and the spare-record list */
    uint32_t prio;
    bool allocated;
    uint64_t streams;          /* bit s: queue s may still use this memory */
} mem_block;

/* Free trees over a set of segments. Every device has its shared pool; a graph capture gets
 * a private one (PyTorch's graph pools): the captured work reads and writes addresses fixed
 * at capture, so while the graph lives its memory is handed to nobody else, and its blocks
 * freed during capture are reused only by the same capture (in stream order, which replay
 * keeps). */
typedef struct mem_pool {
    mem_block *free_tree[EM_MEMORY_POOLS]; /* [SMALL], [LARGE]; [ALL] unused */
    uint64_t id;               /* 0: the shared pool; > 0: a graph's private pool */
    int64_t segments;          /* segments it owns */
    bool retired;              /* its graph is gone: segments go back to the device as they empty */
    struct mem_pool *next;     /* the device's private pools */
} mem_pool;

/* When the cache gives segments back (caching.c, new_segment):
 *   PYTORCH  only when the device refuses memory (PyTorch's CUDACachingAllocator);
 *   EMBER    also the pool's fully free segments before it takes a new one, and a small
 *            segment is carved from a free large block when there is one (nested segments);
 *   PEAK     segments of the request's own size, a free block reused only at that size, and
 *            before growing, fully free segments given back until reserved memory stays
 *            within the most ever allocated at once (asked for by EMBER_MEMORY_POLICY=peak). */
typedef enum { MEM_POLICY_PYTORCH, MEM_POLICY_EMBER, MEM_POLICY_PEAK } mem_policy;

typedef struct mem_state {
    pthread_mutex_t lock;
    em_device dev;
    const em_backend *be;      /* set by the first allocation */
    bool caching;
    int64_t cap;               /* bytes, -1: none (resolved from cap_fraction once be is known) */
    double cap_fraction;       /* > 0: cap not yet resolved against the device's total */
    const char *cap_source;    /* "EMBER_MEMORY_CAP" or "em_memory_set_cap" */
    char config_error[256];    /* a bad EMBER_MEMORY_CAP / EMBER_MEMORY_POLICY for this device ("" if none) */
    mem_policy policy;         /* EMBER_MEMORY_POLICY, else the device's default (caching.c) */
    int64_t high_water;        /* the most bytes ever allocated at once (the peak policy's bound;
                                * unlike the peak statistic, never reset) */
    mem_pool shared;           /* every allocation outside a graph capture */
    mem_pool *capture;         /* during a graph capture on this device: its private pool */
    mem_pool *privates;        /* private pools still holding segments */
    uint64_t next_pool_id;
    bool expandable;           /* expandable segments asked for (EMBER_CUDA_ALLOC_CONF) */
    bool vm_checked;           /* granularity asked of the backend */
    size_t granularity;        /* the backend's mapping granularity; 0: no expandable segments */
    mem_segment *grow[EM_MEMORY_POOLS]; /* each pool's expandable segment, NULL until needed */
    mem_block *spare;          /* recycled block records */
    uint32_t rng;
    uint64_t next_segment_id;
    em_memory_stats stats;
} mem_state;

/* The state of a device, created on first use (NULL only for an impossible device, with an
 * error recorded). Never freed: states live as long as the process. */
mem_state *em__mem_state(em_device d);
/* The state if it exists, else NULL (no error). */
mem_state *em__mem_state_peek(em_device d);

/* Add delta to one statistic for `pool` (0: none) and for EM_MEMORY_ALL. Inline: the
 * cached alloc+free path updates a dozen statistics. */
static inline void mem__stat_up(em_memory_stat *x, int64_t d) {
    x->current += d;
    x->allocated += d;
    if (x->current > x->peak) x->peak = x->current;
}
static inline void mem__stat_down(em_memory_stat *x, int64_t d) {
    x->current -= d;
    x->freed += d;
}
static inline void mem__stat_add(em_memory_stat *s, int pool, int64_t delta) {
    if (delta > 0) {
        mem__stat_up(&s[EM_MEMORY_ALL], delta);
        if (pool) mem__stat_up(&s[pool], delta);
    } else if (delta < 0) {
        mem__stat_down(&s[EM_MEMORY_ALL], -delta);
        if (pool) mem__stat_down(&s[pool], -delta);
    }
}
/* Largest free block and fully free segments, from the trees (lock held). */
void em__mem_refresh_derived(mem_state *st);
/* Free every fully free segment of st (lock held); returns bytes released. */
size_t em__mem_release_cached(mem_state *st);
/* Display name for messages: "CPU", "CUDA", "OpenCL", "MPS". */
const char *em__mem_type_title(em_device_type t);
/* "opencl:0", "cpu": em_device_str into a buffer */
void em__mem_device_name(em_device d, char *buf, size_t size);
/* Parse this device's entry of EMBER_MEMORY_CAP into st (cap, cap_fraction, config_error),
 * and EMBER_MEMORY_POLICY. */
void em__mem_config_from_env(mem_state *st);
/* Resolve a fractional cap once the backend is known (lock held). */
void em__mem_cap_resolve(mem_state *st);
/* Memory history (history.c): note an allocation (alloc true) or a free of block b, with
 * st's statistics after it, when a recording is on (lock held). */
void em__mem_history_record(const mem_state *st, bool alloc, const mem_block *b, int stream);
/* Fault injection: true when this raw allocation should fail. */
bool em__mem_debug_should_fail(void);
/* Request-level fault injection: counts this request; true when it should fail. */
bool em__mem_debug_request_fails(void);

#endif
