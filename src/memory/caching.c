/* The caching allocator: PyTorch's CUDACachingAllocator policy over any backend's raw_alloc.
 *
 * Sizes are rounded up to 512 B. Requests <= 1 MiB come from the small pool (2 MiB
 * segments), larger ones from the large pool (20 MiB segments below 10 MiB, else the
 * request rounded up to 2 MiB). A request takes the smallest free block that fits (best
 * fit, ties to the oldest segment and lowest offset), splitting off the rest when the rest
 * is worth keeping; a freed block merges with free neighbours. Blocks are (segment,
 * offset) pairs, so the same code serves host pointers, CUdeviceptr and cl_mem. Ember's
 * default policy makes two changes (internal.h's mem_policy): fully free segments go back
 * before the cache grows, and a small segment may be nested in a free large block.
 * One state per device, each with its own mutex. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "../util/errors.h"

static _Atomic(mem_state *) states[EM_DEVICE_TYPE_COUNT][MEM_MAX_DEVICES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------- device states */

mem_state *em__mem_state_peek(em_device d) {
    if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT || d.index < 0 || d.index >= MEM_MAX_DEVICES)
        return NULL;
    return atomic_load_explicit(&states[d.type][d.index], memory_order_acquire);
}

static bool env_no_cache(void) {
    const char *e = getenv("EMBER_NO_CACHE");
    return e && *e && strcmp(e, "0") != 0;
}

mem_state *em__mem_state(em_device d) {
    if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT || d.index < 0 || d.index >= MEM_MAX_DEVICES) {
        em_error(EM_ERR_DEVICE, "memory: no allocator for device type %d index %d (expected a "
                 "known type and an index 0..%d)", (int)d.type, d.index, MEM_MAX_DEVICES - 1);
        return NULL;
    }
    mem_state *st = em__mem_state_peek(d);
    if (st) return st;
    pthread_mutex_lock(&registry_lock);
    st = atomic_load_explicit(&states[d.type][d.index], memory_order_relaxed);
    if (!st && (st = calloc(1, sizeof *st)) != NULL) {
        pthread_mutex_init(&st->lock, NULL);
        st->dev = d;
        st->caching = !env_no_cache();
        st->cap = -1;
        st->rng = 0x9e3779b9u ^ (uint32_t)(d.type * 131 + d.index);
        em__mem_config_from_env(st);
        st->stats.cap = st->cap;
        st->stats.caching = st->caching;
        atomic_store_explicit(&states[d.type][d.index], st, memory_order_release);
    }
    pthread_mutex_unlock(&registry_lock);
    if (!st) em_error(EM_ERR_OUT_OF_MEMORY, "memory: out of host memory for the allocator's state");
    return st;
}

/* ---------------------------------------------------------------- block records */

static mem_block *block_new(mem_state *st) {
    mem_block *b = st->spare;
    if (b) st->spare = b->link;
    else if (!(b = malloc(sizeof *b))) return NULL;
    memset(b, 0, sizeof *b);
    return b;
}

static void block_recycle(mem_state *st, mem_block *b) {
    b->link = st->spare;
    st->spare = b;
}

/* ---------------------------------------------------------------- free trees (treaps) */

static bool block_less(const mem_block *a, const mem_block *b) {
    if (a->size != b->size) return a->size < b->size;
    if (a->seg->id != b->seg->id) return a->seg->id < b->seg->id;
    return a->offset < b->offset;
}

static mem_block *treap_join(mem_block *a, mem_block *b) {  /* every key of a < every key of b */
    if (!a) return b;
    if (!b) return a;
    if (a->prio > b->prio) {
        a->right = treap_join(a->right, b);
        return a;
    }
    b->left = treap_join(a, b->left);
    return b;
}

static void treap_split(mem_block *t, const mem_block *key, mem_block **lo, mem_block **hi) {
    if (!t) {
        *lo = *hi = NULL;
    } else if (block_less(t, key)) {
        treap_split(t->right, key, &t->right, hi);
        *lo = t;
    } else {
        treap_split(t->left, key, lo, &t->left);
        *hi = t;
    }
}

static void tree_insert(mem_state *st, int pool, mem_block *x) {
    st->rng ^= st->rng << 13;
    st->rng ^= st->rng >> 17;
    st->rng ^= st->rng << 5;
    x->prio = st->rng;
    mem_block **p = &x->seg->owner->free_tree[pool];
    while (*p && (*p)->prio > x->prio) p = block_less(x, *p) ? &(*p)->left : &(*p)->right;
    treap_split(*p, x, &x->left, &x->right);
    *p = x;
}

static void tree_remove(mem_state *st, int pool, mem_block *x) {
    (void)st;
    mem_block **p = &x->seg->owner->free_tree[pool];
    while (*p != x) p = block_less(x, *p) ? &(*p)->left : &(*p)->right;
    *p = treap_join(x->left, x->right);
    x->left = x->right = NULL;
}

/* The smallest free block of at least size bytes (ties: oldest segment, lowest offset). */
static mem_block *tree_best_fit(mem_block *t, size_t size) {
    mem_block *best = NULL;
    while (t) {
        if (t->size >= size) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

static void collect_whole(mem_block *t, mem_block **list, int64_t *count) {
    for (; t; t = t->right) {
        collect_whole(t->left, list, count);
        if (!t->prev && !t->next) {
            if (list) {
                t->link = *list;
                *list = t;
            }
            (*count)++;
        }
    }
}

void em__mem_refresh_derived(mem_state *st) {
    int64_t largest = 0, whole = 0;
    for (mem_pool *P = &st->shared; P; P = P == &st->shared ? st->privates : P->next)
        for (int pool = EM_MEMORY_SMALL_POOL; pool <= EM_MEMORY_LARGE_POOL; pool++) {
            mem_block *t = P->free_tree[pool];
            while (t && t->right) t = t->right;
            if (t && (int64_t)t->size > largest) largest = (int64_t)t->size;
            collect_whole(P->free_tree[pool], NULL, &whole);
        }
    memcpy(st->stats.active, st->stats.allocation, sizeof st->stats.active);
    memcpy(st->stats.active_bytes, st->stats.allocated_bytes, sizeof st->stats.active_bytes);
    st->stats.largest_free_block = largest;
    st->stats.cached_segments = whole;
    st->stats.cap = st->cap;
    st->stats.caching = st->caching;
}

/* ---------------------------------------------------------------- segments */

/* Free blocks inside a segment that also holds live blocks: "non-releasable" memory. */
typedef struct split_part { int64_t bytes, count; } split_part;

static split_part seg_split(const mem_segment *s) {
    return s->nblocks > 1 ? (split_part){(int64_t)s->free_bytes, s->nfree} : (split_part){0, 0};
}

static void split_update(mem_state *st, const mem_segment *s, split_part before) {
    split_part after = seg_split(s);
    mem__stat_add(st->stats.inactive_split_bytes, s->pool, after.bytes - before.bytes);
    mem__stat_add(st->stats.inactive_split, s->pool, after.count - before.count);
}

/* Forget a retired private pool once its last segment is gone. */
static void pool_forget_if_empty(mem_state *st, mem_pool *P) {
    if (P == &st->shared || !P->retired || P->segments > 0) return;
    for (mem_pool **q = &st->privates; *q; q = &(*q)->next)
        if (*q == P) {
            *q = P->next;
            break;
        }
    free(P);
}

/* Unmap the chunks of expandable segment seg from byte `from` (a multiple of the
 * granularity) to its end. */
static void unmap_tail(mem_state *st, mem_segment *seg, size_t from) {
    for (size_t off = from; off < seg->size; off += st->granularity)
        st->be->vm_unmap(st->dev.index, seg->handle, off, st->granularity);
}

/* Raw blocks given up for the backend's raw_recycle to build the next segment from. */
typedef struct donations {
    void **handles;
    int n, cap;
} donations;

static void donations_free(mem_state *st, donations *d) {
    for (int i = 0; i < d->n; i++) st->be->raw_free(st->dev.index, d->handles[i]);
    free(d->handles);
    *d = (donations){0};
}

/* Give segment b back: to the backend, or into `to` (when not NULL and it has room). */
static void release_segment(mem_state *st, mem_block *b, donations *to) {
    mem_segment *seg = b->seg;
    seg->owner->segments--;
    if (seg->expandable) {
        unmap_tail(st, seg, 0);
        st->be->vm_release(st->dev.index, seg->handle, seg->va_size);
        st->grow[seg->pool] = NULL;
    } else if (to && to->n < to->cap) {
        to->handles[to->n++] = seg->handle;
    } else {
        st->be->raw_free(st->dev.index, seg->handle);
    }
    st->stats.num_raw_frees++;
    mem__stat_add(st->stats.segment, seg->pool, -1);
    mem__stat_add(st->stats.reserved_bytes, seg->pool, -(int64_t)seg->size);
    block_recycle(st, b);
    mem_pool *owner = seg->owner;
    free(seg);
    pool_forget_if_empty(st, owner);
}

static split_part seg_split(const mem_segment *s);
static void split_update(mem_state *st, const mem_segment *s, split_part before);

/* Unmap the free end of pool's expandable segment, whole chunks only (lock held; not during a
 * capture); returns bytes. A free block inside the range stays mapped: it is reused in place. */
static size_t trim_expandable(mem_state *st, int pool) {
    mem_segment *seg = st->grow[pool];
    mem_block *t = seg ? seg->tail : NULL;
    if (!t || t->allocated || !t->prev) return 0;   /* wholly free segments are released whole */
    size_t from = (t->offset + st->granularity - 1) / st->granularity * st->granularity;
    if (from >= seg->size) return 0;
    size_t bytes = seg->size - from;
    split_part before = seg_split(seg);
    tree_remove(st, pool, t);
    unmap_tail(st, seg, from);
    seg->size = from;
    seg->free_bytes -= bytes;
    t->size -= bytes;
    if (t->size == 0) {   /* the block was whole chunks: it goes */
        t->prev->next = NULL;
        seg->tail = t->prev;
        seg->nblocks--;
        seg->nfree--;
        block_recycle(st, t);
    } else {
        tree_insert(st, pool, t);
    }
    split_update(st, seg, before);
    st->stats.num_raw_frees++;
    mem__stat_add(st->stats.reserved_bytes, pool, -(int64_t)bytes);
    return bytes;
}

/* Before segments in `list` go back: work still queued on them must finish first. */
static void wait_for_queued(mem_state *st, const mem_block *list) {
    bool queued = false;
    for (const mem_block *b = list; b; b = b->link) queued |= b->streams != 0;
    if (queued && st->be->synchronize) {
        em_error_state saved;
        em__error_save(&saved);
        st->be->synchronize(st->dev.index);
        em__error_restore(&saved);
    }
}

/* Give back the fully free segments of pools first..last (lock held): the shared pool's and
 * those of private pools whose graph is gone, the largest first, until reserved memory is at
 * most `keep` bytes (-1: all of them); returns bytes. Nothing during a graph capture: freeing
 * device memory waits for the device, which a capture forbids. */
static size_t release_whole(mem_state *st, int first, int last, int64_t keep) {
    mem_block *list = NULL;
    int64_t n = 0;
    size_t bytes = 0;
    if (st->capture) return 0;
    for (mem_pool *P = &st->shared; P; P = P == &st->shared ? st->privates : P->next)
        if (P == &st->shared || P->retired)
            for (int pool = first; pool <= last; pool++) collect_whole(P->free_tree[pool], &list, &n);
    wait_for_queued(st, list);
    /* collect_whole visits each pool's tree in increasing size and pushes onto the list, and
     * the large pool comes last: the list starts with the largest large segment */
    const int64_t *reserved = &st->stats.reserved_bytes[EM_MEMORY_ALL].current;
    while (list && *reserved > keep) {
        mem_block *b = list;
        list = b->link;
        tree_remove(st, b->seg->pool, b);
        bytes += b->seg->size;
        release_segment(st, b, NULL);
    }
    for (int pool = first; pool <= last && *reserved > keep; pool++) bytes += trim_expandable(st, pool);
    return bytes;
}

/* The fully free segments of the shared pool whose pages a new segment of `size` bytes is to
 * be made of (lock held; the backend has raw_recycle): the smallest that covers what is still
 * needed, else the largest, and again, so that little is left over. They go into `to`. */
static void pick_donors(mem_state *st, size_t size, donations *to) {
    mem_block *list = NULL;
    int64_t n = 0;
    for (int pool = EM_MEMORY_SMALL_POOL; pool <= EM_MEMORY_LARGE_POOL; pool++)
        collect_whole(st->shared.free_tree[pool], &list, &n);
    mem_block **cand = n ? malloc((size_t)n * sizeof *cand) : NULL;
    if (!cand || !(to->handles = malloc((size_t)n * sizeof *to->handles))) {
        free(cand);
        return;
    }
    to->cap = (int)n;
    int m = 0;
    for (mem_block *b = list; b; b = b->link) cand[m++] = b;
    wait_for_queued(st, list);
    size_t need = size;
    while (need > 0 && m > 0) {
        int cover = -1, largest = 0;
        for (int i = 0; i < m; i++) {
            size_t s = cand[i]->seg->size;
            if (s >= need && (cover < 0 || s < cand[cover]->seg->size)) cover = i;
            if (s > cand[largest]->seg->size) largest = i;
        }
        mem_block *b = cand[cover >= 0 ? cover : largest];
        cand[cover >= 0 ? cover : largest] = cand[--m];
        need = b->seg->size >= need ? 0 : need - b->seg->size;
        tree_remove(st, b->seg->pool, b);
        release_segment(st, b, to);
    }
    free(cand);
}

size_t em__mem_release_cached(mem_state *st) {
    return release_whole(st, EM_MEMORY_SMALL_POOL, EM_MEMORY_LARGE_POOL, -1);
}

static size_t round_size(size_t bytes) {
    return bytes < MEM_MIN_BLOCK ? MEM_MIN_BLOCK : (bytes + MEM_MIN_BLOCK - 1) / MEM_MIN_BLOCK * MEM_MIN_BLOCK;
}

static size_t segment_size(const mem_state *st, size_t size, int pool) {
    if (!st->caching) return size;
    if (pool == EM_MEMORY_SMALL_POOL) return MEM_SMALL_BUFFER;
    if (size < MEM_MIN_LARGE_ALLOC && st->policy != MEM_POLICY_PEAK) return MEM_LARGE_BUFFER;
    return (size + MEM_ROUND_LARGE - 1) / MEM_ROUND_LARGE * MEM_ROUND_LARGE;
}

/* One raw allocation of a whole segment, returned as one free block (not in a tree); made
 * from the raw blocks in `given` when there are any (they are used up either way). */
static em_status raw_segment(mem_state *st, size_t size, int pool, mem_block **out, bool *capped, donations *given) {
    if (st->cap >= 0 && st->stats.reserved_bytes[EM_MEMORY_ALL].current + (int64_t)size > st->cap) {
        *capped = true;
        return EM_ERR_OUT_OF_MEMORY;
    }
    void *h = NULL;
    em_status s;
    if (em__mem_debug_should_fail()) {
        s = EM_ERR_OUT_OF_MEMORY;
    } else if (given->n) {
        s = st->be->raw_recycle(st->dev.index, size, given->handles, given->n, &h);
        given->n = 0;
    } else {
        s = st->be->raw_alloc(st->dev.index, size, &h);
    }
    if (s != EM_OK) return s;
    mem_segment *seg = malloc(sizeof *seg);
    mem_block *b = block_new(st);
    if (!seg || !b) {
        st->be->raw_free(st->dev.index, h);
        free(seg);
        if (b) block_recycle(st, b);
        return EM_ERR_OUT_OF_MEMORY;
    }
    mem_pool *owner = st->capture ? st->capture : &st->shared;
    *seg = (mem_segment){.handle = h, .size = size, .id = st->next_segment_id++, .pool = pool,
                         .nblocks = 1, .nfree = 1, .free_bytes = size, .st = st, .owner = owner};
    owner->segments++;
    b->seg = seg;
    b->size = size;
    seg->tail = b;
    st->stats.num_raw_allocs++;
    mem__stat_add(st->stats.segment, pool, 1);
    mem__stat_add(st->stats.reserved_bytes, pool, (int64_t)size);
    *out = b;
    return EM_OK;
}

/* Expandable segments: is the backend able, and what is its granularity? (lock held) */
static bool expandable_on(mem_state *st) {
    if (!st->expandable || !st->caching || st->capture) return false;
    if (!st->vm_checked) {
        st->vm_checked = true;
        const em_backend *be = st->be;
        if (be->vm_granularity && be->vm_reserve && be->vm_map && be->vm_unmap && be->vm_release)
            st->granularity = be->vm_granularity(st->dev.index);
    }
    return st->granularity > 0;
}

/* Grow pool's expandable segment (reserving its range the first time: as much address space
 * as the device has memory) by whole chunks at its end, so that its last block, free, holds
 * `size`. That block (out of the trees) in *out. EM_ERR_NOT_SUPPORTED when the range is full
 * or cannot be reserved (the caller takes an ordinary segment then); EM_ERR_OUT_OF_MEMORY when
 * the device or the cap refuses the memory. */
static em_status grow_expandable(mem_state *st, size_t size, int pool, mem_block **out, bool *capped) {
    const em_backend *be = st->be;
    size_t g = st->granularity;
    mem_segment *seg = st->grow[pool];
    if (!seg) {
        em_device_props p;
        em_error_state saved;
        em__error_save(&saved);
        bool props = be->device_props && be->device_props(st->dev.index, &p) == EM_OK && p.total_memory > 0;
        void *base = NULL;
        size_t va = props ? ((size_t)p.total_memory + g - 1) / g * g : 0;
        bool ok = props && be->vm_reserve(st->dev.index, va, &base) == EM_OK;
        em__error_restore(&saved);
        if (!ok) return EM_ERR_NOT_SUPPORTED;
        if (!(seg = malloc(sizeof *seg))) {
            be->vm_release(st->dev.index, base, va);
            return EM_ERR_OUT_OF_MEMORY;
        }
        *seg = (mem_segment){.handle = base, .id = st->next_segment_id++, .pool = pool, .st = st,
                             .owner = &st->shared, .expandable = true, .va_size = va};
        st->shared.segments++;
        mem__stat_add(st->stats.segment, pool, 1);
        st->grow[pool] = seg;
    }
    mem_block *last = seg->tail;
    size_t have = last && !last->allocated ? last->size : 0;
    size_t need = have < size ? (size - have + g - 1) / g * g : 0;
    if (need > seg->va_size - seg->size) return EM_ERR_NOT_SUPPORTED;
    if (st->cap >= 0 && st->stats.reserved_bytes[EM_MEMORY_ALL].current + (int64_t)need > st->cap) {
        *capped = true;
        return EM_ERR_OUT_OF_MEMORY;
    }
    mem_block *b = have ? last : block_new(st);
    if (!b) return EM_ERR_OUT_OF_MEMORY;
    for (size_t off = 0; off < need; off += g) {
        em_status s = em__mem_debug_should_fail() ? EM_ERR_OUT_OF_MEMORY
                                                  : be->vm_map(st->dev.index, seg->handle, seg->size + off, g);
        if (s != EM_OK) {
            for (size_t k = 0; k < off; k += g) be->vm_unmap(st->dev.index, seg->handle, seg->size + k, g);
            if (!have) block_recycle(st, b);
            return s;
        }
    }
    split_part before = seg_split(seg);
    if (have) {
        tree_remove(st, pool, b);
        b->size += need;
    } else {
        b->seg = seg;
        b->offset = seg->size;
        b->size = need;
        b->prev = last;
        if (last) last->next = b;
        seg->tail = b;
        seg->nblocks++;
        seg->nfree++;
    }
    seg->size += need;
    seg->free_bytes += need;
    split_update(st, seg, before);
    st->stats.num_raw_allocs++;
    mem__stat_add(st->stats.reserved_bytes, pool, (int64_t)need);
    *out = b;
    return EM_OK;
}

/* A new segment for a block of `size`: the pool's segment size, else (under pressure) just
 * the request; then the same after freeing the cache (one retry, as PyTorch). A failure
 * that the retry recovers leaves no error pending.
 *
 * Unlike PyTorch, Ember's policy first gives back the pool's fully free segments: best fit
 * found no block for this request, so each of them is too small for it, and keeping them is
 * how reserved memory drifts far above allocated memory when shapes vary (a new sequence
 * length each step). Fixed shapes never get here after the first step, so they pay nothing.
 * EMBER_MEMORY_POLICY=pytorch keeps them, exactly as PyTorch does.
 *
 * The peak policy (EMBER_MEMORY_POLICY=peak) gives back fully free segments of both pools,
 * the largest first, only until the new segment fits within the most bytes ever allocated at
 * once. A
 * training step allocates its activations in the forward and its gradients in the backward,
 * in other sizes: split blocks of one serve the other badly, and reserved memory settled well
 * above the allocated peak. With segments of the request's size and this bound, the
 * process holds what its tensors needed at their peak. A backend with raw_recycle (the CPU)
 * builds the new segment from the pages of those given back, so the change of sizes costs no
 * fresh memory to fault in and clear. */
static em_status new_segment_from(mem_state *st, size_t size, int pool, mem_block **out, bool *capped,
                                  donations *given) {
    size_t sizes[2] = {segment_size(st, size, pool), size};
    int n = sizes[0] > size ? 2 : 1;
    em_error_state saved;
    em__error_save(&saved);
    if (expandable_on(st)) {
        em_status s = EM_ERR_OUT_OF_MEMORY;
        for (int attempt = 0; attempt < 2; attempt++) {
            if (attempt == 1) {   /* free the cache and retry once, as below */
                em__mem_release_cached(st);
                st->stats.num_alloc_retries++;
            }
            unsigned long seq = em__error_seq();
            s = grow_expandable(st, size, pool, out, capped);
            if (s == EM_OK) {
                em__error_restore(&saved);
                return s;
            }
            if (s == EM_ERR_NOT_SUPPORTED) break;   /* an ordinary segment, below */
            if (s != EM_ERR_OUT_OF_MEMORY) {
                if (em__error_seq() == seq) em_error(s, "%s mapping of %zu bytes failed", st->be->name, size);
                return s;
            }
            em__error_restore(&saved);
        }
        em__error_restore(&saved);
        if (s == EM_ERR_OUT_OF_MEMORY) return s;   /* the device refused: so would cuMemAlloc */
    }
    if (st->caching && st->policy == MEM_POLICY_EMBER) release_whole(st, pool, pool, -1);
    if (st->caching && st->policy == MEM_POLICY_PEAK && !st->capture) {
        /* free segments that did not fit this request lend it their pages, whatever the
         * bound: moving pages costs little, and fresh ones would each be faulted in and
         * cleared */
        if (st->be->raw_recycle) pick_donors(st, sizes[0], given);
        int64_t after = st->stats.allocated_bytes[EM_MEMORY_ALL].current + (int64_t)sizes[0];
        int64_t bound = st->high_water > after ? st->high_water : after;
        release_whole(st, EM_MEMORY_SMALL_POOL, EM_MEMORY_LARGE_POOL, bound - (int64_t)sizes[0]);
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (attempt == 1) {
            em__mem_release_cached(st);
            st->stats.num_alloc_retries++;
        }
        for (int k = 0; k < n; k++) {
            unsigned long seq = em__error_seq();
            em_status s = raw_segment(st, sizes[k], pool, out, capped, given);
            if (s == EM_OK || s != EM_ERR_OUT_OF_MEMORY) {
                if (s == EM_OK) em__error_restore(&saved);
                else if (em__error_seq() == seq) em_error(s, "%s raw allocation of %zu bytes failed", st->be->name, sizes[k]);
                return s;
            }
            em__error_restore(&saved);  /* forget the backend's message: we may still recover */
        }
    }
    return EM_ERR_OUT_OF_MEMORY;
}

static em_status new_segment(mem_state *st, size_t size, int pool, mem_block **out, bool *capped) {
    donations given = {0};
    em_status s = new_segment_from(st, size, pool, out, capped, &given);
    donations_free(st, &given);   /* what no segment was made from */
    return s;
}

const char *em__mem_type_title(em_device_type t) {
    switch (t) {
    case EM_CPU: return "CPU";
    case EM_CUDA: return "CUDA";
    case EM_MPS: return "MPS";
    case EM_OPENCL: return "OpenCL";
    default: return "Device";
    }
}

void em__mem_device_name(em_device d, char *buf, size_t size) {
    snprintf(buf, size, "%s", em_device_str(d).s);
}

static em_status record_oom(mem_state *st, size_t bytes, size_t size, bool capped) {
    char req[32], total[32], freeb[32], alloc[32], unalloc[32], largest[32], cap[160], dev[32];
    em_device_props p;
    em_error_state saved;
    em__error_save(&saved);
    bool props = st->be->device_props && st->be->device_props(st->dev.index, &p) == EM_OK;
    em__error_restore(&saved);
    em__mem_refresh_derived(st);
    int64_t reserved = st->stats.reserved_bytes[EM_MEMORY_ALL].current;
    int64_t allocated = st->stats.allocated_bytes[EM_MEMORY_ALL].current;
    int64_t free_cached = reserved - allocated, big = st->stats.largest_free_block;
    em_memory_format_size((int64_t)bytes, req, sizeof req);
    em_memory_format_size(allocated, alloc, sizeof alloc);
    em_memory_format_size(free_cached, unalloc, sizeof unalloc);
    em_memory_format_size(big, largest, sizeof largest);
    em__mem_device_name(st->dev, dev, sizeof dev);
    if (props && p.total_memory > 0) em_memory_format_size(p.total_memory, total, sizeof total);
    else snprintf(total, sizeof total, "unknown");
    if (props && p.free_memory >= 0) em_memory_format_size(p.free_memory, freeb, sizeof freeb);
    else snprintf(freeb, sizeof freeb, "unknown");
    if (st->cap >= 0) {
        char c[32];
        em_memory_format_size(st->cap, c, sizeof c);
        snprintf(cap, sizeof cap, "%s (%s)%s", c, st->cap_source ? st->cap_source : "set",
                 capped ? "; this request would take reserved memory past it" : "");
    } else {
        snprintf(cap, sizeof cap, "none");
    }
    int frag = free_cached > 0 ? (int)(100.0 * (1.0 - (double)big / (double)free_cached) + 0.5) : 0;
    bool fragmented = free_cached >= (int64_t)size && big < (int64_t)size;
    /* expandable segments grow one range in place instead of leaving such gaps between segments */
    bool hint = fragmented && st->dev.type == EM_CUDA && !st->expandable && st->be->vm_reserve;
    const char *why = !fragmented ? ""
                      : hint ? ": enough is free in total, but not in one piece; "
                               "EMBER_CUDA_ALLOC_CONF=expandable_segments:True avoids this fragmentation"
                             : ": enough is free in total, but not in one piece";
    return em_error(EM_ERR_OUT_OF_MEMORY,
                    "%s out of memory. Tried to allocate %s. Device %s has %s total, %s free. "
                    "Ember holds %s allocated and %s reserved but unallocated, of which the largest "
                    "free block is %s (fragmentation %d%%%s). Cap: %s. Free tensors you no longer "
                    "need, lower the batch size, or raise the cap.",
                    em__mem_type_title(st->dev.type), req, dev, total, freeb, alloc, unalloc, largest,
                    frag, why, cap);
}

/* Block b (in no tree) keeps its first `size` bytes; the rest becomes free block r (a fresh
 * record) after it in the segment, in the pool's tree (lock held). */
static void split_off_rest(mem_state *st, int pool, mem_block *b, size_t size, mem_block *r) {
    mem_segment *seg = b->seg;
    r->seg = seg;
    r->offset = b->offset + size;
    r->size = b->size - size;
    r->prev = b;
    r->next = b->next;
    r->streams = b->streams;
    if (b->next) b->next->prev = r;
    else seg->tail = r;
    b->next = r;
    b->size = size;
    seg->nblocks++;
    seg->nfree++;
    tree_insert(st, pool, r);
}

/* ---------------------------------------------------------------- nested segments */

/* Under Ember's policy a small request that no small block fits takes its new segment out of
 * the large pool's free memory when there is a free block of at least MEM_SMALL_BUFFER (the
 * smallest such), before any memory of its own: that block, allocated in its large segment,
 * becomes a nested small segment, and returns to the large pool when its last small block is
 * freed. PyTorch's pools never share memory: a training step's activations that fall in the
 * small pool (a [512, 1024] bf16 tensor is exactly 1 MiB) leave its segments free, but
 * unusable, when the gradients peak in the large pool, and the reverse. In the statistics a
 * nested segment's bytes move from the large pool's reserved memory to the small pool's (the
 * total does not change), and it is no segment: those count what was taken from the device. */
static void return_nested(mem_state *st, mem_block *b);

/* The nested segment's only block, free and in no tree; NULL when the large pool has no such
 * block or no record can be made (the caller then takes a segment of its own). */
static mem_block *carve_small(mem_state *st, mem_pool *from) {
    mem_block *p = tree_best_fit(from->free_tree[EM_MEMORY_LARGE_POOL], MEM_SMALL_BUFFER);
    if (!p) return NULL;
    size_t rest = p->size - MEM_SMALL_BUFFER;
    bool split = rest > MEM_SMALL_SIZE;   /* the large pool's rule: a smaller rest stays with it */
    mem_segment *seg = malloc(sizeof *seg);
    mem_block *b = block_new(st), *r = split ? block_new(st) : NULL;
    if (!seg || !b || (split && !r)) {
        free(seg);
        if (b) block_recycle(st, b);
        if (r) block_recycle(st, r);
        return NULL;
    }
    mem_segment *ps = p->seg;
    tree_remove(st, EM_MEMORY_LARGE_POOL, p);
    split_part before = seg_split(ps);
    if (split) split_off_rest(st, EM_MEMORY_LARGE_POOL, p, MEM_SMALL_BUFFER, r);
    p->allocated = true;   /* held by the nested segment: no tensor's, so in no allocated count */
    ps->nfree--;
    ps->free_bytes -= p->size;
    split_update(st, ps, before);
    *seg = (mem_segment){.handle = ps->handle, .base = ps->base + p->offset, .size = p->size,
                         .id = st->next_segment_id++, .pool = EM_MEMORY_SMALL_POOL, .nblocks = 1, .nfree = 1,
                         .free_bytes = p->size, .st = st, .owner = ps->owner, .parent = p};
    b->seg = seg;
    b->size = p->size;
    b->streams = p->streams;
    seg->tail = b;
    mem__stat_up(&st->stats.reserved_bytes[EM_MEMORY_SMALL_POOL], (int64_t)seg->size);
    mem__stat_down(&st->stats.reserved_bytes[EM_MEMORY_LARGE_POOL], (int64_t)seg->size);
    return b;
}

/* ---------------------------------------------------------------- alloc / free */

em_status em__mem_alloc_stream(const em_backend *be, em_device d, size_t bytes, int stream,
                               em_block *out) {
    *out = (em_block){0};
    if (!be) return em_error(EM_ERR_INTERNAL, "memory: allocation without a backend");
    if (stream < 0 || stream > 63)
        return em_error(EM_ERR_ARGUMENT, "memory: stream %d out of range (expected 0..63)", stream);
    if (bytes > (SIZE_MAX >> 2)) {
        char dev[32];
        em__mem_device_name(d, dev, sizeof dev);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s out of memory. Tried to allocate %zu bytes on %s, "
                        "more than any device can hold.", em__mem_type_title(d.type), bytes, dev);
    }
    if (em__mem_debug_request_fails()) {
        char dev[32];
        em__mem_device_name(d, dev, sizeof dev);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s out of memory. Tried to allocate %zu bytes on %s "
                        "(a failure injected by a test).", em__mem_type_title(d.type), bytes, dev);
    }
    mem_state *st = em__mem_state(d);
    if (!st) return em_last_status();
    pthread_mutex_lock(&st->lock);
    if (!st->be) {
        st->be = be;
        em__mem_cap_resolve(st);
    }
    if (st->config_error[0]) {
        pthread_mutex_unlock(&st->lock);
        return em_error(EM_ERR_ARGUMENT, "%s", st->config_error);
    }
    size_t size = round_size(bytes);
    int pool = size <= MEM_SMALL_SIZE ? EM_MEMORY_SMALL_POOL : EM_MEMORY_LARGE_POOL;
    uint64_t bit = (uint64_t)1 << stream;
    mem_pool *from = st->capture ? st->capture : &st->shared;
    mem_block *b = tree_best_fit(from->free_tree[pool], size);
    /* the peak policy reuses a large block only at the request's size (segment_size's
     * rounding): a bigger one split would leave a rest that the next step's sizes fit badly */
    if (b && pool == EM_MEMORY_LARGE_POOL && st->policy == MEM_POLICY_PEAK && st->caching &&
        b->size - size >= MEM_ROUND_LARGE)
        b = NULL;
    bool carved = false;
    if (!b && pool == EM_MEMORY_SMALL_POOL && st->caching && st->policy == MEM_POLICY_EMBER)
        carved = (b = carve_small(st, from)) != NULL;
    if (b) {
        if (!carved) tree_remove(st, pool, b);
        if (b->streams & ~bit) {   /* another queue may still use it: wait for the device */
            em_status s = be->synchronize ? be->synchronize(d.index) : EM_OK;
            st->stats.num_stream_waits++;
            if (s != EM_OK) {
                if (carved) return_nested(st, b);
                else tree_insert(st, pool, b);
                pthread_mutex_unlock(&st->lock);
                return s;
            }
        }
    } else {
        bool capped = false;
        em_status s = new_segment(st, size, pool, &b, &capped);
        if (s != EM_OK) {
            if (s == EM_ERR_OUT_OF_MEMORY) {
                st->stats.num_ooms++;
                record_oom(st, bytes, size, capped);
            }
            pthread_mutex_unlock(&st->lock);
            return s;
        }
    }
    mem_segment *seg = b->seg;
    split_part before = seg_split(seg);
    size_t rest = b->size - size;
    /* an expandable segment splits off any rest, as the small pool does (PyTorch's rule): the
     * rest is where the range grows from, and no other segment would use it; under the peak
     * policy the rest is the rounding to 2 MiB, which the block should not count as its own */
    bool whole_rest = pool == EM_MEMORY_SMALL_POOL || seg->expandable || st->policy == MEM_POLICY_PEAK;
    bool split = st->caching && (whole_rest ? rest >= MEM_MIN_BLOCK : rest > MEM_SMALL_SIZE);
    mem_block *r = split ? block_new(st) : NULL;   /* no record: keep the block whole */
    if (r) split_off_rest(st, pool, b, size, r);
    b->allocated = true;
    b->requested = bytes;
    b->streams = bit;
    seg->nfree--;
    seg->free_bytes -= b->size;
    /* active == allocated while frees are never deferred: copied at snapshot time */
    em_memory_stats *S = &st->stats;
    mem__stat_up(&S->allocation[0], 1);
    mem__stat_up(&S->allocation[pool], 1);
    mem__stat_up(&S->allocated_bytes[0], (int64_t)b->size);
    mem__stat_up(&S->allocated_bytes[pool], (int64_t)b->size);
    mem__stat_up(&S->requested_bytes[0], (int64_t)bytes);
    mem__stat_up(&S->requested_bytes[pool], (int64_t)bytes);
    if (S->allocated_bytes[0].current > st->high_water) st->high_water = S->allocated_bytes[0].current;
    split_update(st, seg, before);
    em__mem_history_record(st, true, b, stream);
    *out = (em_block){.handle = seg->handle, .offset = seg->base + b->offset, .size = b->size, .alloc_ctx = b};
    pthread_mutex_unlock(&st->lock);
    return EM_OK;
}

em_status em__mem_alloc(const em_backend *be, em_device d, size_t bytes, em_block *out) {
    return em__mem_alloc_stream(be, d, bytes, 0, out);
}

void em__mem_record_stream(em_block *blk, int stream) {
    if (!blk || !blk->alloc_ctx || stream < 0 || stream > 63) return;
    mem_block *b = blk->alloc_ctx;
    mem_state *st = b->seg->st;
    pthread_mutex_lock(&st->lock);
    b->streams |= (uint64_t)1 << stream;
    pthread_mutex_unlock(&st->lock);
}

/* Merge free neighbour n into b (b precedes n; neither is in a tree); n's record is recycled. */
static void absorb_next(mem_state *st, mem_block *b, mem_block *n) {
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    else b->seg->tail = b;
    b->streams |= n->streams;
    b->seg->nblocks--;
    b->seg->nfree--;
    block_recycle(st, n);
}

/* Block b (not in a tree) is no longer in use (lock held): merge it with its free neighbours,
 * then give its segment back (without caching, or when its graph is gone; never during a
 * capture: freeing device memory waits for the device), hand a nested segment back to the
 * large pool, or keep the block in its pool's tree. */
static void release_block(mem_state *st, mem_block *b) {
    mem_segment *seg = b->seg;
    int pool = seg->pool;
    split_part before = seg_split(seg);
    b->allocated = false;
    b->requested = 0;
    seg->nfree++;
    seg->free_bytes += b->size;
    if (b->prev && !b->prev->allocated) {
        mem_block *p = b->prev;
        tree_remove(st, pool, p);   /* its key (size) changes */
        absorb_next(st, p, b);
        b = p;
    }
    if (b->next && !b->next->allocated) {
        mem_block *n = b->next;
        tree_remove(st, pool, n);
        absorb_next(st, b, n);
    }
    split_update(st, seg, before);
    if (seg->parent && seg->nblocks == 1) return_nested(st, b);
    else if ((!st->caching || seg->owner->retired) && seg->nblocks == 1 && !st->capture) release_segment(st, b, NULL);
    else tree_insert(st, pool, b);
}

/* Nested segment b->seg, whole and free (b is its only block, in no tree), goes back into
 * the large pool as the block it was carved from (lock held). Work still queued on its
 * blocks is queued on that block. */
static void return_nested(mem_state *st, mem_block *b) {
    mem_segment *seg = b->seg;
    mem_block *p = seg->parent;
    p->streams |= b->streams;
    mem__stat_down(&st->stats.reserved_bytes[EM_MEMORY_SMALL_POOL], (int64_t)seg->size);
    mem__stat_up(&st->stats.reserved_bytes[EM_MEMORY_LARGE_POOL], (int64_t)seg->size);
    block_recycle(st, b);
    free(seg);
    release_block(st, p);   /* p's segment is a large one: this goes no deeper */
}

void em__mem_free(const em_backend *be, em_device d, em_block *blk) {
    (void)be;
    (void)d;
    if (!blk || !blk->alloc_ctx) return;
    mem_block *b = blk->alloc_ctx;
    mem_segment *seg = b->seg;
    mem_state *st = seg->st;
    int pool = seg->pool;
    pthread_mutex_lock(&st->lock);
    em_memory_stats *S = &st->stats;
    mem__stat_down(&S->allocation[0], 1);
    mem__stat_down(&S->allocation[pool], 1);
    mem__stat_down(&S->allocated_bytes[0], (int64_t)b->size);
    mem__stat_down(&S->allocated_bytes[pool], (int64_t)b->size);
    mem__stat_down(&S->requested_bytes[0], (int64_t)b->requested);
    mem__stat_down(&S->requested_bytes[pool], (int64_t)b->requested);
    em__mem_history_record(st, false, b, b->streams ? __builtin_ctzll(b->streams) : 0);
    release_block(st, b);
    pthread_mutex_unlock(&st->lock);
    *blk = (em_block){0};
}

/* ---------------------------------------------------------------- graph pools */

uint64_t em__mem_capture_begin(const em_backend *be, em_device d) {
    mem_state *st = em__mem_state(d);
    if (!st) return 0;
    mem_pool *P = calloc(1, sizeof *P);
    if (!P) {
        em_error(EM_ERR_OUT_OF_MEMORY, "memory: out of host memory for a graph's memory pool");
        return 0;
    }
    pthread_mutex_lock(&st->lock);
    if (st->capture) {
        pthread_mutex_unlock(&st->lock);
        free(P);
        char dev[32];
        em__mem_device_name(d, dev, sizeof dev);
        em_error(EM_ERR_ARGUMENT, "graph capture on %s: a capture is already under way on this device "
                 "(end it first)", dev);
        return 0;
    }
    if (!st->be) {
        st->be = be;
        em__mem_cap_resolve(st);
    }
    P->id = ++st->next_pool_id;
    P->next = st->privates;
    st->privates = P;
    st->capture = P;
    uint64_t id = P->id;
    pthread_mutex_unlock(&st->lock);
    return id;
}

void em__mem_capture_end(em_device d) {
    mem_state *st = em__mem_state_peek(d);
    if (!st) return;
    pthread_mutex_lock(&st->lock);
    st->capture = NULL;
    pthread_mutex_unlock(&st->lock);
}

void em__mem_pool_release(em_device d, uint64_t id) {
    mem_state *st = em__mem_state_peek(d);
    if (!st || !id) return;
    pthread_mutex_lock(&st->lock);
    for (mem_pool *P = st->privates; P; P = P->next) {
        if (P->id != id) continue;
        if (st->capture == P) st->capture = NULL;
        P->retired = true;
        /* the pool's whole segments go now, the rest when their last block is freed; release
         * frees the pool itself with its last segment */
        int64_t owned = P->segments, n = 0;
        mem_block *list = NULL;
        for (int pool = EM_MEMORY_SMALL_POOL; pool <= EM_MEMORY_LARGE_POOL; pool++)
            collect_whole(P->free_tree[pool], &list, &n);
        while (list) {
            mem_block *b = list;
            list = b->link;
            tree_remove(st, b->seg->pool, b);
            release_segment(st, b, NULL);
        }
        if (owned == 0) pool_forget_if_empty(st, P);
        break;
    }
    pthread_mutex_unlock(&st->lock);
}
