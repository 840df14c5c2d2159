/* Memory history (include/ember/memory.h, torch.cuda.memory._record_memory_history): while
 * enabled, every allocation and free of the caching allocator, on every device, is kept in a
 * ring of the last max_entries events (the time, the device and stream, the block's address
 * and sizes, the thread's tag, and the device's allocated and reserved bytes after it), and
 * em_memory_dump_history writes them as JSON for `ember memory-timeline`. The recording is
 * called under the device's lock; its own lock is taken inside that one, never around it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"
#include "../util/errors.h"
#include "../util/strbuf.h"

#define TAG_MAX 48

typedef struct mem_event {
    int64_t t_ns;              /* since the recording began */
    int64_t size, requested;   /* the block's size (rounded) and what was asked for */
    int64_t allocated, reserved; /* the device's bytes after the event */
    uint64_t address;          /* the block's start: segment handle + offset */
    em_device dev;
    int stream;
    bool alloc;                /* false: a free */
    char tag[TAG_MAX];
} mem_event;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_on;
static mem_event *g_ring;
static size_t g_cap, g_next, g_count;  /* ring of g_cap; the oldest is g_next - g_count */
static int64_t g_dropped;              /* events pushed out of the ring */
static struct timespec g_t0;
static _Thread_local char t_tag[TAG_MAX];

static int64_t since_start(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)(now.tv_sec - g_t0.tv_sec) * 1000000000 + (now.tv_nsec - g_t0.tv_nsec);
}

em_status em_memory_record_history(bool enabled, int64_t max_entries) {
    if (enabled && max_entries <= 0)
        return em_error(EM_ERR_ARGUMENT, "em_memory_record_history: max_entries must be > 0, got %lld",
                        (long long)max_entries);
    if (enabled && (uint64_t)max_entries > SIZE_MAX / sizeof(mem_event))
        return em_error(EM_ERR_ARGUMENT, "em_memory_record_history: max_entries %lld is too many",
                        (long long)max_entries);
    mem_event *ring = NULL;
    if (enabled && !(ring = malloc((size_t)max_entries * sizeof *ring)))
        return em_error(EM_ERR_OUT_OF_MEMORY, "em_memory_record_history: no host memory for %lld events (%zu bytes each)",
                        (long long)max_entries, sizeof *ring);
    pthread_mutex_lock(&g_lock);
    mem_event *old = g_ring;
    if (enabled) {   /* a new recording: what was recorded before is dropped */
        g_ring = ring;
        g_cap = (size_t)max_entries;
        g_next = g_count = 0;
        g_dropped = 0;
        clock_gettime(CLOCK_MONOTONIC, &g_t0);
        free(old);
    }
    /* disabled: the events stay, for em_memory_dump_history */
    atomic_store(&g_on, enabled);
    pthread_mutex_unlock(&g_lock);
    return EM_OK;
}

void em_memory_set_tag(const char *tag) {
    snprintf(t_tag, sizeof t_tag, "%s", tag ? tag : "");
}

size_t em_memory_get_tag(char *buf, size_t size) {
    if (buf && size) snprintf(buf, size, "%s", t_tag);
    return strlen(t_tag);
}

void em__mem_history_record(const mem_state *st, bool alloc, const mem_block *b, int stream) {
    if (!atomic_load_explicit(&g_on, memory_order_relaxed)) return;
    pthread_mutex_lock(&g_lock);
    if (g_ring && atomic_load(&g_on)) {
        mem_event *e = &g_ring[g_next];
        *e = (mem_event){.t_ns = since_start(), .size = (int64_t)b->size, .requested = (int64_t)b->requested,
                         .allocated = st->stats.allocated_bytes[EM_MEMORY_ALL].current,
                         .reserved = st->stats.reserved_bytes[EM_MEMORY_ALL].current,
                         .address = (uint64_t)(uintptr_t)b->seg->handle + b->seg->base + b->offset, .dev = st->dev,
                         .stream = stream, .alloc = alloc};
        memcpy(e->tag, t_tag, sizeof e->tag);
        g_next = (g_next + 1) % g_cap;
        if (g_count < g_cap) g_count++;
        else g_dropped++;
    }
    pthread_mutex_unlock(&g_lock);
}

em_status em_memory_dump_history(const char *path) {
    if (!path) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_memory_dump_history: path is NULL");
    FILE *f = fopen(path, "w");
    if (!f) return em_error(EM_ERR_IO, "em_memory_dump_history: cannot write %s: %s", path, strerror(errno));
    pthread_mutex_lock(&g_lock);
    fprintf(f, "{\"format\": \"ember-memory-history\", \"version\": 1, \"recording\": %s, \"dropped\": %lld,\n",
            atomic_load(&g_on) ? "true" : "false", (long long)g_dropped);
    fprintf(f, " \"columns\": [\"time_ns\", \"action\", \"device\", \"stream\", \"address\", \"size\", "
               "\"requested\", \"tag\", \"allocated\", \"reserved\"],\n \"events\": [");
    for (size_t i = 0; i < g_count; i++) {
        const mem_event *e = &g_ring[(g_next + g_cap - g_count + i) % g_cap];
        fprintf(f, "%s\n  [%lld, \"%s\", \"%s\", %d, %llu, %lld, %lld, ", i ? "," : "", (long long)e->t_ns,
                e->alloc ? "alloc" : "free", em_device_str(e->dev).s, e->stream, (unsigned long long)e->address,
                (long long)e->size, (long long)e->requested);
        em__json_fputs(f, e->tag);
        fprintf(f, ", %lld, %lld]", (long long)e->allocated, (long long)e->reserved);
    }
    fprintf(f, "%s]}\n", g_count ? "\n " : "");
    pthread_mutex_unlock(&g_lock);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return em_error(EM_ERR_IO, "em_memory_dump_history: writing %s failed", path);
    return EM_OK;
}

int64_t em_memory_history_length(void) {
    pthread_mutex_lock(&g_lock);
    int64_t n = (int64_t)g_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}
