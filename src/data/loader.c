/* The data loader: batches of a dataset in a (shuffled) order, prepared ahead by one
 * background thread that gathers rows into fresh (optionally pinned) host tensors.
 *
 * Threads: the producer sleeps on a condition variable whenever the queue is full or the
 * epoch is done; the consumer (em_loader_next) sleeps until a batch is ready. Once the queue
 * is full the producer sleeps until it is half empty (`refill`): each wake-up is a futex
 * call, and on a VM an interrupt to the other core, which cost the training step ~25 us at
 * batch 64 when the consumer woke it for every batch. A new epoch
 * bumps `gen`, waits until the producer is between batches, and drops what was queued,
 * so the permutation is never rewritten while the producer reads it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "dataset.h"
#include "../core/internal_api.h"

typedef struct slot {
    em_tensor *x, *y;       /* unscoped references */
    int64_t index, size;
    em_status err;          /* a failure on the producer thread, re-raised by the consumer */
    char *msg;
} slot;

struct em_loader {
    em_tensor *x, *y;       /* the dataset's tensors (own references) */
    const char *xb;         /* host bytes of x, y */
    const char *yb;
    int64_t n, row_bytes, bs, nbatches;
    int64_t y_row_bytes;    /* bytes of one sample's target */
    em_shape y_sample;      /* y's shape without dim 0 */
    em_shape sample;        /* x's shape without dim 0 */
    em_loader_opts o;
    int64_t *perm;          /* the epoch's order of this loader's samples (n of them) */
    int64_t *full;          /* sharded: the whole dataset's order (ds_n), then sharded into perm */
    int64_t ds_n;           /* samples in the dataset */
    int64_t epoch, next_index;
    bool done;              /* the epoch's batches have all been returned */
    bool positioned;        /* em_loader_seek / _set_epoch placed it and no batch was taken since */
    em_tensor *held_x, *held_y;  /* the batch handed out last */

    bool threaded;
    int prefetch;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* every state change broadcasts */
    bool quit, busy;
    bool refill;            /* the producer may fill the queue (cleared when it is full) */
    uint64_t gen;
    int64_t prod_index;
    slot *ring;             /* `prefetch` slots, FIFO */
    int head, count;
};

/* ---- shuffling ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound) without modulo bias (Lemire, "Fast random integer generation in
 * an interval", 2019). */
static uint64_t bounded(uint64_t *s, uint64_t bound) {
    unsigned __int128 m = (unsigned __int128)splitmix64(s) * bound;
    uint64_t low = (uint64_t)m;
    if (low < bound) {
        uint64_t threshold = -bound % bound;
        while (low < threshold) {
            m = (unsigned __int128)splitmix64(s) * bound;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

static void make_order(em_loader *l) {
    int64_t *order = l->full ? l->full : l->perm;
    for (int64_t i = 0; i < l->ds_n; i++) order[i] = i;
    if (l->o.shuffle) {
        uint64_t s = l->o.seed + (uint64_t)l->epoch;
        for (int64_t i = l->ds_n - 1; i > 0; i--) {
            int64_t j = (int64_t)bounded(&s, (uint64_t)i + 1);
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    /* DistributedSampler: index j of the padded order is order[j % N] (padding repeats the
     * order from its start); this rank takes j = rank, rank + R, ... */
    if (l->full)
        for (int64_t i = 0; i < l->n; i++)
            l->perm[i] = order[((int64_t)l->o.rank + i * l->o.num_replicas) % l->ds_n];
}

/* ---- making one batch (either thread) ---- */

static em_tensor *empty_owned(em_shape shape, em_dtype dt, bool pinned) {
    em_tensor *t;
    EM__UNSCOPED(t, em_empty(shape, (em_opts){.dtype = dt, .pin_memory = pinned}));
    return t;
}

static slot make_batch(em_loader *l, int64_t index) {
    slot sl = {.index = index};
    int64_t start = index * l->bs;
    sl.size = l->n - start < l->bs ? l->n - start : l->bs;
    em_shape xs = {.ndim = l->sample.ndim + 1, .d = {sl.size}};
    for (int i = 0; i < l->sample.ndim; i++) xs.d[i + 1] = l->sample.d[i];
    sl.x = empty_owned(xs, EM_F32, l->o.pin_memory);
    if (sl.x && l->y) {
        em_shape ys = {.ndim = l->y_sample.ndim + 1, .d = {sl.size}};
        for (int i = 0; i < l->y_sample.ndim; i++) ys.d[i + 1] = l->y_sample.d[i];
        sl.y = empty_owned(ys, em_dtype_of(l->y), l->o.pin_memory);
    }
    char *xd = sl.x && sl.size ? em_data_ptr(sl.x) : NULL;
    char *yd = sl.y && sl.size && l->y_row_bytes ? em_data_ptr(sl.y) : NULL;
    if (!sl.x || (l->y && !sl.y) || (sl.size && (!xd || (l->y && l->y_row_bytes && !yd)))) {
        sl.err = em_last_status() ? em_last_status() : EM_ERR_INTERNAL;
        sl.msg = strdup(em_last_error());
        em_clear_error();
        em_release(sl.x);
        em_release(sl.y);
        sl.x = sl.y = NULL;
        return sl;
    }
    for (int64_t i = 0; i < sl.size; i++) {
        int64_t src = l->perm[start + i];
        memcpy(xd + i * l->row_bytes, l->xb + src * l->row_bytes, (size_t)l->row_bytes);
        if (yd) memcpy(yd + i * l->y_row_bytes, l->yb + src * l->y_row_bytes, (size_t)l->y_row_bytes);
    }
    return sl;
}

static void slot_clear(slot *sl) {
    em_release(sl->x);
    em_release(sl->y);
    free(sl->msg);
    memset(sl, 0, sizeof *sl);
}

/* ---- the producer thread ---- */

static void *producer(void *arg) {
    em_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && (l->prod_index >= l->nbatches || l->count == l->prefetch ||
                            (!l->refill && l->count > l->prefetch / 2)))
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->quit) break;
        int64_t index = l->prod_index++;
        uint64_t gen = l->gen;
        l->busy = true;
        pthread_mutex_unlock(&l->mu);
        slot sl = make_batch(l, index);
        pthread_mutex_lock(&l->mu);
        l->busy = false;
        if (gen != l->gen || l->quit) {
            slot_clear(&sl);
        } else {
            l->ring[(l->head + l->count) % l->prefetch] = sl;
            l->count++;
            if (l->count == l->prefetch) l->refill = false;
        }
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ---- epochs ---- */

static void release_held(em_loader *l) {
    em_release(l->held_x);
    em_release(l->held_y);
    l->held_x = l->held_y = NULL;
}

static void start_epoch_at(em_loader *l, int64_t epoch, int64_t first) {
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->gen++;
        l->prod_index = l->nbatches;  /* the producer stops taking work */
        while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
        while (l->count) {
            slot_clear(&l->ring[l->head]);
            l->head = (l->head + 1) % l->prefetch;
            l->count--;
        }
        l->refill = true;
    }
    l->epoch = epoch;
    make_order(l);
    l->next_index = first;
    l->done = false;
    if (l->threaded) {
        l->prod_index = first;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
}

static void start_epoch(em_loader *l, int64_t epoch) { start_epoch_at(l, epoch, 0); }

em_loader *em_loader_new(const em_dataset *ds, em_loader_opts o) {
    if (!ds) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_loader_new: argument 'ds' is NULL");
        return NULL;
    }
    if (o.batch_size < 0) {
        em_error(EM_ERR_ARGUMENT, "em_loader_new: batch_size must be positive, got %lld", (long long)o.batch_size);
        return NULL;
    }
    if (o.prefetch < EM_PREFETCH_NONE) {
        em_error(EM_ERR_ARGUMENT, "em_loader_new: prefetch must be >= 0 or EM_PREFETCH_NONE, got %d", o.prefetch);
        return NULL;
    }
    if (o.num_replicas < 0 || (o.num_replicas > 1 && (o.rank < 0 || o.rank >= o.num_replicas))) {
        em_error(EM_ERR_ARGUMENT, "em_loader_new: expected num_replicas >= 0 and 0 <= rank < num_replicas, got num_replicas %d, rank %d",
                 o.num_replicas, o.rank);
        return NULL;
    }
    if (o.device.type != EM_CPU && !em_device_available(o.device.type)) {
        const char *why = em_device_unavailable_reason(o.device.type);
        em_error(EM_ERR_UNAVAILABLE, "em_loader_new: device %s is not available%s%s", em_device_str(o.device).s,
                 why ? ": " : "", why ? why : "");
        return NULL;
    }
    em_loader *l = calloc(1, sizeof *l);
    if (!l) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_loader_new: out of host memory");
        return NULL;
    }
    l->o = o;
    l->bs = o.batch_size ? o.batch_size : 1;
    l->ds_n = l->n = ds->n;
    bool sharded = o.num_replicas > 1;
    if (sharded) {
        int64_t r = o.num_replicas;
        l->n = o.shard_drop_last ? ds->n / r : (ds->n + r - 1) / r;
        if (ds->n == 0) l->n = 0;
    }
    l->nbatches = o.drop_last ? l->n / l->bs : (l->n + l->bs - 1) / l->bs;
    l->x = em_retain(ds->x);
    l->y = ds->y ? em_retain(ds->y) : NULL;
    if (l->y) {
        em_shape ys = em_shape_of(l->y);
        l->y_sample.ndim = ys.ndim - 1;
        l->y_row_bytes = (int64_t)em_dtype_size(em_dtype_of(l->y));
        for (int i = 1; i < ys.ndim; i++) {
            l->y_sample.d[i - 1] = ys.d[i];
            l->y_row_bytes *= ys.d[i];
        }
    }
    em_shape xs = em_shape_of(ds->x);
    l->sample.ndim = xs.ndim - 1;
    l->row_bytes = 4;
    for (int i = 1; i < xs.ndim; i++) {
        l->sample.d[i - 1] = xs.d[i];
        l->row_bytes *= xs.d[i];
    }
    l->prefetch = o.prefetch == 0 ? 2 : o.prefetch;
    l->threaded = l->prefetch > 0;
    l->perm = malloc((size_t)(l->n ? l->n : 1) * sizeof *l->perm);
    if (sharded) l->full = malloc((size_t)(l->ds_n ? l->ds_n : 1) * sizeof *l->full);
    if (sharded && !l->full) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_loader_new: out of host memory");
        l->threaded = false;
        em_loader_free(l);
        return NULL;
    }
    l->xb = l->ds_n && l->row_bytes ? em_data_ptr(l->x) : NULL;
    l->yb = l->y && l->ds_n && l->y_row_bytes ? em_data_ptr(l->y) : NULL;
    if (!l->perm || (l->ds_n && l->row_bytes && !l->xb) || (l->y && l->ds_n && l->y_row_bytes && !l->yb)) {
        if (!l->perm) em_error(EM_ERR_OUT_OF_MEMORY, "em_loader_new: out of host memory");
        l->threaded = false;
        em_loader_free(l);
        return NULL;
    }
    if (l->threaded) {
        l->ring = calloc((size_t)l->prefetch, sizeof *l->ring);
        bool mu = l->ring && pthread_mutex_init(&l->mu, NULL) == 0;
        bool cv = mu && pthread_cond_init(&l->cv, NULL) == 0;
        l->prod_index = l->nbatches;  /* the producer waits until start_epoch below */
        l->refill = true;
        if (!cv || pthread_create(&l->thread, NULL, producer, l) != 0) {
            if (cv) pthread_cond_destroy(&l->cv);
            if (mu) pthread_mutex_destroy(&l->mu);
            l->threaded = false;
            em_error(EM_ERR_INTERNAL, "em_loader_new: cannot start the prefetch thread");
            em_loader_free(l);
            return NULL;
        }
    }
    start_epoch(l, 0);
    return l;
}

/* Move a host batch to the loader's device; the host references are consumed. */
static em_status to_device(em_loader *l, slot *sl) {
    if (l->o.device.type == EM_CPU) return EM_OK;
    em_tensor *dx, *dy = NULL;
    EM__UNSCOPED(dx, em_to_device_dtype(sl->x, l->o.device, EM_F32, l->o.pin_memory));
    if (dx && sl->y) EM__UNSCOPED(dy, em_to_device_dtype(sl->y, l->o.device, em_dtype_of(sl->y), l->o.pin_memory));
    /* pinned batches are copied non-blocking and dropped at once: the copy may still be
     * queued when the producer asks for a block of this size for a later batch, so the
     * pinned cache (told by em_to_device_dtype) waits for the device before handing it out */
    em_release(sl->x);
    em_release(sl->y);
    sl->x = dx;
    sl->y = dy;
    if (!dx || (l->y && !dy)) {
        em_release(dx);
        em_release(dy);
        sl->x = sl->y = NULL;
        return em_last_status() ? em_last_status() : EM_ERR_INTERNAL;
    }
    return EM_OK;
}

bool em_loader_next(em_loader *l, em_batch *b) {
    if (b) memset(b, 0, sizeof *b);
    if (!l || !b) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_loader_next: argument '%s' is NULL", l ? "b" : "l");
        return false;
    }
    release_held(l);
    if (l->done) start_epoch(l, l->epoch + 1);
    if (l->next_index >= l->nbatches) {
        l->done = true;
        return false;
    }
    slot sl;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        while (l->count == 0) pthread_cond_wait(&l->cv, &l->mu);
        sl = l->ring[l->head];
        memset(&l->ring[l->head], 0, sizeof(slot));
        l->head = (l->head + 1) % l->prefetch;
        l->count--;
        if (!l->refill && l->count <= l->prefetch / 2) { /* the only waiter this can release */
            l->refill = true;
            pthread_cond_broadcast(&l->cv);
        }
        pthread_mutex_unlock(&l->mu);
    } else {
        sl = make_batch(l, l->next_index);
    }
    l->next_index++;
    l->positioned = false;
    if (sl.err) {
        em_error(sl.err, "em_loader_next: batch %lld: %s", (long long)sl.index, sl.msg ? sl.msg : "failed");
        slot_clear(&sl);
        return false;
    }
    if (to_device(l, &sl) != EM_OK) {
        slot_clear(&sl);
        return false;
    }
    l->held_x = sl.x;
    l->held_y = sl.y;
    *b = (em_batch){.x = sl.x, .y = sl.y, .index = sl.index, .size = sl.size};
    return true;
}

em_batch em_loader_iter(em_loader *l) {
    if (!l) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_loader_iter: argument 'l' is NULL");
        return (em_batch){0};
    }
    /* iter(loader) in PyTorch is a new pass: a loop left early (a break) leaves its rest
     * unread. A position set by seek / set_epoch is where the caller wants to go on. */
    if (l->positioned) {
        l->positioned = false;
    } else {
        release_held(l);
        if (l->done || l->next_index > 0) start_epoch(l, l->epoch + 1);
    }
    return (em_batch){0};
}

em_status em_loader_reset(em_loader *l) {
    if (!l) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_loader_reset: argument 'l' is NULL");
    release_held(l);
    l->positioned = false;
    if (l->done || l->next_index > 0) start_epoch(l, l->epoch + 1);
    return EM_OK;
}

em_status em_loader_seek(em_loader *l, int64_t epoch, int64_t batch) {
    if (!l) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_loader_seek: argument 'l' is NULL");
    if (epoch < 0 || batch < 0 || batch > l->nbatches)
        return em_error(EM_ERR_ARGUMENT, "em_loader_seek: expected epoch >= 0 and 0 <= batch <= %lld, got epoch %lld, batch %lld",
                        (long long)l->nbatches, (long long)epoch, (long long)batch);
    release_held(l);
    start_epoch_at(l, epoch, batch);
    l->positioned = true;
    return EM_OK;
}

em_status em_loader_set_epoch(em_loader *l, int64_t epoch) {
    if (!l) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_loader_set_epoch: argument 'l' is NULL");
    if (epoch < 0) return em_error(EM_ERR_ARGUMENT, "em_loader_set_epoch: expected epoch >= 0, got %lld", (long long)epoch);
    release_held(l);
    start_epoch_at(l, epoch, 0);
    l->positioned = true;
    return EM_OK;
}

int64_t em_loader_num_samples(const em_loader *l) { return l ? l->n : 0; }

int64_t em_loader_len(const em_loader *l) { return l ? l->nbatches : 0; }
int64_t em_loader_epoch(const em_loader *l) { return l ? l->epoch : 0; }

void em_loader_free(em_loader *l) {
    if (!l) return;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->quit = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        while (l->count) {
            slot_clear(&l->ring[l->head]);
            l->head = (l->head + 1) % l->prefetch;
            l->count--;
        }
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    free(l->ring);
    release_held(l);
    em_release(l->x);
    em_release(l->y);
    free(l->perm);
    free(l->full);
    free(l);
}
