/* A fake backend for allocator tests: raw_alloc mallocs within a configurable capacity and
 * can be told to fail its Nth call; it counts live bytes and handles so tests see leaks. */
#ifndef EMBER_TEST_MEMORY_FAKE_H
#define EMBER_TEST_MEMORY_FAKE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/backend.h"
#include "util/errors.h"
#include "memory/allocator.h"
#include "memory/internal.h"
#include <ember/memory.h>

#define FAKE_DEVICES 64

typedef struct fake_dev {
    size_t capacity;      /* bytes it can hand out (0: 1 GiB) */
    size_t used;
    int64_t live;         /* handles not yet freed */
    int64_t calls;        /* raw_alloc calls so far */
    int64_t fail_call;    /* make this call (1-based) fail; 0: never */
    int64_t syncs;
} fake_dev;

static fake_dev fake[FAKE_DEVICES];
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

static em_status fake_raw_alloc(int index, size_t bytes, void **handle) {
    fake_dev *f = &fake[index];
    pthread_mutex_lock(&fake_lock);
    size_t cap = f->capacity ? f->capacity : ((size_t)1 << 30);
    f->calls++;
    bool fail = (f->fail_call && f->calls == f->fail_call) || f->used + bytes > cap;
    char *p = fail ? NULL : malloc(bytes + 16);
    if (p) {
        memcpy(p, &bytes, sizeof bytes);
        f->used += bytes;
        f->live++;
    }
    pthread_mutex_unlock(&fake_lock);
    if (!p) return em_error(EM_ERR_OUT_OF_MEMORY, "fake: raw allocation of %zu bytes failed", bytes);
    *handle = p + 16;
    return EM_OK;
}

static void fake_raw_free(int index, void *handle) {
    char *p = (char *)handle - 16;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    pthread_mutex_lock(&fake_lock);
    fake[index].used -= bytes;
    fake[index].live--;
    pthread_mutex_unlock(&fake_lock);
    free(p);
}

static em_status fake_props(int index, em_device_props *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "fake device %d", index);
    pthread_mutex_lock(&fake_lock);
    out->total_memory = (int64_t)(fake[index].capacity ? fake[index].capacity : ((size_t)1 << 30));
    out->free_memory = out->total_memory - (int64_t)fake[index].used;
    pthread_mutex_unlock(&fake_lock);
    return EM_OK;
}

static em_status fake_sync(int index) {
    pthread_mutex_lock(&fake_lock);
    fake[index].syncs++;
    pthread_mutex_unlock(&fake_lock);
    return EM_OK;
}

static const em_backend fake_be = {
    .name = "fake", .type = EM_OPENCL, .raw_alloc = fake_raw_alloc, .raw_free = fake_raw_free,
    .device_props = fake_props, .synchronize = fake_sync,
};

/* A fresh fake device for each test: its own allocator state and counters. */
static int fake_next_index = 0;
static em_device fake_device(size_t capacity) {
    int i = fake_next_index++;
    if (i >= FAKE_DEVICES) abort();   /* more tests than devices: raise FAKE_DEVICES */
    fake[i] = (fake_dev){.capacity = capacity};
    return EM_DEVICE(EM_OPENCL, i);
}

static em_memory_stats fake_stats(em_device d) {
    em_memory_stats s;
    memset(&s, 0, sizeof s);
    em_memory_get_stats(d, &s);
    return s;
}

#endif
