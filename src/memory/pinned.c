/* Pinned host memory with its own cache (from the CPU backend's page-locked allocation unless
 * another backend provides it), as PyTorch's CachingHostAllocator: sizes round up
 * to a power of two (at least 512 B), blocks are never split, and a freed block is reused
 * for the next request of its size. A block that a non-blocking copy used is reused only
 * after that copy has finished (em__mem_pinned_record_use): an event recorded after the copy
 * when the backend has events, so reuse waits for that copy and not for the work queued
 * after it (the training step the loader's prefetch should overlap); otherwise the whole
 * device. A free block whose copy is done is preferred to one still in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "../util/errors.h"

typedef struct pin_block {
    void *ptr;
    size_t size, requested;
    const em_backend *provider;
    const em_backend *use_be;     /* the device a queued copy may still use it on */
    int use_index;
    void *use_event;              /* use_be's event after that copy, or NULL: wait for the device */
    struct pin_block *next;       /* free list of its size */
} pin_block;

#define PIN_BINS 64

static struct {
    pthread_mutex_t lock;
    pin_block *bins[PIN_BINS];    /* bins[k]: free blocks of 2^k bytes */
    const em_backend *provider;
    em_memory_stats stats;
} pin = {.lock = PTHREAD_MUTEX_INITIALIZER, .stats = {.cap = -1, .caching = true}};

void em__mem_pinned_set_provider(const em_backend *be) {
    pthread_mutex_lock(&pin.lock);
    pin.provider = be && be->host_alloc_pinned && be->host_free_pinned ? be : NULL;
    pthread_mutex_unlock(&pin.lock);
}

static int bin_of(size_t size) {
    int k = 0;
    while (((size_t)1 << k) < size) k++;
    return k;
}

/* Wait for the queued copy that last used b: its event, else its whole device. A failure
 * in that work is the device's to report (its next sync says which op), not this caller's. */
static void wait_device(pin_block *b) {
    em_error_state saved;
    em__error_save(&saved);
    if (b->use_event) {
        b->use_be->event_synchronize(b->use_event);
        b->use_be->event_destroy(b->use_event);
        b->use_event = NULL;
    } else if (b->use_be->synchronize) {
        b->use_be->synchronize(b->use_index);
    }
    em__error_restore(&saved);
    b->use_be = NULL;
}

/* Has b's queued copy finished? Only an event can tell without waiting. */
static bool use_done(pin_block *b) {
    if (!b->use_be) return true;
    if (!b->use_event) return false;
    em_error_state saved;
    em__error_save(&saved);
    bool done = false;
    /* an error in the queued work also ends the wait: the device reports it */
    if (b->use_be->event_query(b->use_event, &done) != EM_OK) done = true;
    em__error_restore(&saved);
    return done;
}

/* The same with the lock held (freeing the cache, a block moving to another device). */
static void wait_use(pin_block *b) {
    if (!b->use_be) return;
    wait_device(b);
    pin.stats.num_stream_waits++;
}

static void raw_release(pin_block *b) {
    wait_use(b);
    if (b->provider) b->provider->host_free_pinned(b->ptr);
    else free(b->ptr);
    pin.stats.num_raw_frees++;
    mem__stat_add(pin.stats.segment, EM_MEMORY_ALL, -1);
    mem__stat_add(pin.stats.reserved_bytes, EM_MEMORY_ALL, -(int64_t)b->size);
    free(b);
}

static void release_cached(void) {
    for (int k = 0; k < PIN_BINS; k++) {
        while (pin.bins[k]) {
            pin_block *b = pin.bins[k];
            pin.bins[k] = b->next;
            raw_release(b);
        }
    }
}

static pin_block *raw_take(size_t size) {
    void *p = NULL;
    const em_backend *prov = pin.provider;
    if (!prov && em__cpu_backend.host_alloc_pinned && em__cpu_backend.host_free_pinned) prov = &em__cpu_backend;
    if (em__mem_debug_should_fail()) return NULL;
    em_error_state saved;
    em__error_save(&saved);
    bool ok = prov ? prov->host_alloc_pinned(size, &p) == EM_OK : posix_memalign(&p, size >= 4096 ? 4096 : 64, size) == 0;
    em__error_restore(&saved);
    if (!ok) return NULL;
    pin_block *b = calloc(1, sizeof *b);
    if (!b) {
        if (prov) prov->host_free_pinned(p);
        else free(p);
        return NULL;
    }
    b->ptr = p;
    b->size = size;
    b->provider = prov;
    pin.stats.num_raw_allocs++;
    mem__stat_add(pin.stats.segment, EM_MEMORY_ALL, 1);
    mem__stat_add(pin.stats.reserved_bytes, EM_MEMORY_ALL, (int64_t)size);
    return b;
}

em_status em__mem_alloc_pinned(size_t bytes, em_block *out) {
    *out = (em_block){0};
    if (bytes > ((size_t)1 << 62))
        return em_error(EM_ERR_OUT_OF_MEMORY, "Pinned host memory: out of memory. Tried to allocate %zu bytes.", bytes);
    if (em__mem_debug_request_fails())
        return em_error(EM_ERR_OUT_OF_MEMORY, "Pinned host memory: out of memory. Tried to allocate "
                        "%zu bytes (a failure injected by a test).", bytes);
    size_t size = bytes < MEM_MIN_BLOCK ? MEM_MIN_BLOCK : bytes;
    int k = bin_of(size);
    size = (size_t)1 << k;
    pthread_mutex_lock(&pin.lock);
    /* a block whose copy has finished first; else the last freed one, waited for below */
    pin_block **at = &pin.bins[k];
    for (pin_block **p = at; *p; p = &(*p)->next)
        if (use_done(*p)) { at = p; break; }
    pin_block *b = *at;
    if (b) {
        *at = b->next;
    } else if (!(b = raw_take(size))) {
        release_cached();
        pin.stats.num_alloc_retries++;
        if (!(b = raw_take(size))) {
            char req[32], held[32];
            pin.stats.num_ooms++;
            em_memory_format_size((int64_t)bytes, req, sizeof req);
            em_memory_format_size(pin.stats.allocated_bytes[EM_MEMORY_ALL].current, held, sizeof held);
            pthread_mutex_unlock(&pin.lock);
            return em_error(EM_ERR_OUT_OF_MEMORY, "Pinned host memory: out of memory. Tried to allocate %s "
                            "(rounded up to %zu bytes). Ember holds %s of pinned memory in live blocks; "
                            "page-locked memory is limited by the system (ulimit -l).", req, size, held);
        }
    }
    b->next = NULL;
    b->requested = bytes;
    mem__stat_add(pin.stats.allocation, EM_MEMORY_ALL, 1);
    mem__stat_add(pin.stats.active, EM_MEMORY_ALL, 1);
    mem__stat_add(pin.stats.allocated_bytes, EM_MEMORY_ALL, (int64_t)size);
    mem__stat_add(pin.stats.active_bytes, EM_MEMORY_ALL, (int64_t)size);
    mem__stat_add(pin.stats.requested_bytes, EM_MEMORY_ALL, (int64_t)bytes);
    bool queued = b->use_be != NULL;
    if (queued && !use_done(b)) pin.stats.num_stream_waits++;
    pthread_mutex_unlock(&pin.lock);
    /* A non-blocking copy queued from this block (the loader's previous batch, say) may not
     * have run yet, and the caller is about to write into it: without this wait the copy
     * reads the new bytes (a device batch holding rows of the next one). The block is ours
     * alone now, so the wait runs outside the lock and other threads' frees (the loader's
     * consumer dropping its batch) do not stall behind the device. */
    if (queued) wait_device(b);
    *out = (em_block){.handle = b->ptr, .offset = 0, .size = size, .alloc_ctx = b};
    return EM_OK;
}

void em__mem_free_pinned(em_block *blk) {
    if (!blk || !blk->alloc_ctx) return;
    pin_block *b = blk->alloc_ctx;
    pthread_mutex_lock(&pin.lock);
    mem__stat_add(pin.stats.allocation, EM_MEMORY_ALL, -1);
    mem__stat_add(pin.stats.active, EM_MEMORY_ALL, -1);
    mem__stat_add(pin.stats.allocated_bytes, EM_MEMORY_ALL, -(int64_t)b->size);
    mem__stat_add(pin.stats.active_bytes, EM_MEMORY_ALL, -(int64_t)b->size);
    mem__stat_add(pin.stats.requested_bytes, EM_MEMORY_ALL, -(int64_t)b->requested);
    int k = bin_of(b->size);
    b->next = pin.bins[k];
    pin.bins[k] = b;
    pthread_mutex_unlock(&pin.lock);
    *blk = (em_block){0};
}

void em__mem_pinned_record_use(em_block *blk, const em_backend *be, int index) {
    if (!blk || !blk->alloc_ctx || !be) return;
    pin_block *b = blk->alloc_ctx;
    pthread_mutex_lock(&pin.lock);
    if (b->use_be && (b->use_be != be || b->use_index != index)) wait_use(b);  /* one pending device at a time */
    /* The new copy is queued after the one the old event marks, on the same queue: the
     * new event covers both. */
    if (b->use_event) b->use_be->event_destroy(b->use_event);
    b->use_event = NULL;
    b->use_be = be;
    b->use_index = index;
    if (be->event_record && be->event_query && be->event_synchronize && be->event_destroy) {
        em_error_state saved;
        em__error_save(&saved);
        if (be->event_record(index, &b->use_event) != EM_OK) b->use_event = NULL; /* then: the device */
        em__error_restore(&saved);
    }
    pthread_mutex_unlock(&pin.lock);
}

em_status em_memory_get_pinned_stats(em_memory_stats *out) {
    if (!out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_memory_get_pinned_stats: argument 'out' is NULL");
    pthread_mutex_lock(&pin.lock);
    *out = pin.stats;
    int64_t largest = 0, cached = 0;
    for (int k = 0; k < PIN_BINS; k++)
        for (pin_block *b = pin.bins[k]; b; b = b->next) {
            cached++;
            if ((int64_t)b->size > largest) largest = (int64_t)b->size;
        }
    out->largest_free_block = largest;
    out->cached_segments = cached;
    pthread_mutex_unlock(&pin.lock);
    return EM_OK;
}

void em_memory_empty_pinned_cache(void) {
    pthread_mutex_lock(&pin.lock);
    release_cached();
    pthread_mutex_unlock(&pin.lock);
}
