/* Checks of a user's input done by device work (internal_api.h's em__device_check_queue):
 * PyTorch's device-side assert without its abort. A check that would otherwise read its
 * input to the host (a class-index loss's targets) computes on the device what it found
 * (a count of bad elements and two numbers for the message) and queues it here; the device's
 * flag, int64 [4] {count, number, number, context}, keeps the first nonzero count, all on the
 * device, so the check neither waits for the device nor stops a graph from recording it. The
 * host reads the flag where it waits for the device anyway (em_item, em_copy_to_host,
 * em_device_synchronize) and turns a set flag into the error that call returns, written by
 * the check's own describe function from the context it queued. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <ember/ops.h>
#include "core_internal.h"
#include "internal_api.h"
#include "tensor_impl.h"

#define MAX_FLAGS 32      /* devices with checks queued */
#define MAX_CONTEXTS 32   /* distinct contexts per device; later ones share the last slot */
#define CONTEXT_BYTES 256

typedef struct check_context {
    em_device_check_describe describe;
    size_t size;
    unsigned char bytes[CONTEXT_BYTES];
} check_context;

typedef struct device_flag {
    em_device dev;
    em_tensor *flag;          /* int64 [4] on dev, retained for the process's life */
    int ncontexts;
    check_context contexts[MAX_CONTEXTS];
} device_flag;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static device_flag g_flags[MAX_FLAGS];
static int g_nflags;
static atomic_int g_armed;    /* g_nflags, read without the lock by the waits' fast path */

static device_flag *flag_of(em_device d) {
    for (int i = 0; i < g_nflags; i++)
        if (em_device_equal(g_flags[i].dev, d)) return &g_flags[i];
    return NULL;
}

/* The context's slot (an equal one, or a new one). */
static int64_t context_id(device_flag *f, em_device_check_describe describe, const void *ctx, size_t size) {
    for (int i = 0; i < f->ncontexts; i++) {
        check_context *c = &f->contexts[i];
        if (c->describe == describe && c->size == size && !memcmp(c->bytes, ctx, size)) return i;
    }
    int i = f->ncontexts < MAX_CONTEXTS ? f->ncontexts++ : MAX_CONTEXTS - 1;
    check_context *c = &f->contexts[i];
    c->describe = describe;
    c->size = size;
    memcpy(c->bytes, ctx, size);
    return i;
}

em_status em__device_check_queue(em_tensor *found, em_device_check_describe describe, const void *ctx,
                                 size_t ctx_size) {
    if (!found || !describe || ctx_size > CONTEXT_BYTES || (ctx_size && !ctx) || em_dtype_of(found) != EM_I64 ||
        em_ndim(found) != 1 || em_size(found, 0) != 3)
        return em__error_unless_pending(EM_ERR_INTERNAL, "device check: expected int64 [3] and a describe function");
    em_device d = em_device_of(found);
    pthread_mutex_lock(&g_lock);
    device_flag *f = flag_of(d);
    em_status st = EM_OK;
    if (!f && em__graph_capturing(d)) {
        /* made inside a recording, its zeroing would be replayed with each step and wipe a
         * flag set by an earlier one */
        st = em_error(EM_ERR_NOT_SUPPORTED, "a device-side check's flag on %s is made at its first use, which a "
                      "graph capture cannot record: run the step once outside the capture first",
                      em_device_str(d).s);
    } else if (!f && g_nflags == MAX_FLAGS) {
        st = em_error(EM_ERR_INTERNAL, "device checks: more than %d devices", MAX_FLAGS);
    } else if (!f) {
        em_tensor *flag = em_zeros(EM_SHAPE(4), EM_OPTS(.dtype = EM_I64, .device = d));
        if (!flag) {
            st = em_last_status();
        } else {
            em_keep(flag);   /* out of the caller's scope: the flag lives as long as the process */
            f = &g_flags[g_nflags];
            *f = (device_flag){.dev = d, .flag = flag};
            atomic_store(&g_armed, ++g_nflags);
        }
    }
    int64_t id = f ? context_id(f, describe, ctx, ctx_size) : 0;
    em_tensor *flag = f ? f->flag : NULL;
    pthread_mutex_unlock(&g_lock);
    if (st != EM_OK) return st;
    /* flag = flag where its count is set, else {found, id}: arithmetic on the device */
    em_scope s = em_scope_begin();
    em_tensor *count = em_narrow(found, 0, 0, 1);
    em_tensor *parts[2] = {found, em_add_scalar(em_mul_scalar(count, 0), (double)id)};
    em_tensor *fresh = em_cat(parts, 2, 0);
    em_tensor *held = em_clamp(em_narrow(flag, 0, 0, 1), 0, 1);   /* 1 when a count is set */
    em_tensor *next = fresh && held ? em_add(em_mul(flag, held), em_mul(fresh, em_add_scalar(em_neg(held), 1)))
                                    : NULL;
    st = next ? em_copy_(flag, next) : em_last_status();
    em_scope_end(s);
    return st;
}

em_status em__device_checks_read(em_device d) {
    if (atomic_load_explicit(&g_armed, memory_order_relaxed) == 0) return EM_OK;
    d = em_device_resolve(d);
    pthread_mutex_lock(&g_lock);
    device_flag *f = flag_of(d);
    em_tensor *flag = f ? f->flag : NULL;
    pthread_mutex_unlock(&g_lock);
    if (!flag || em__graph_capturing(d)) return EM_OK;
    int64_t v[4] = {0};
    em_status st = em__to_host(flag, EM_I64, v);
    if (st != EM_OK || v[0] == 0) return st;
    char msg[1024] = "a device-side check failed";
    pthread_mutex_lock(&g_lock);
    if (v[3] >= 0 && v[3] < f->ncontexts) {
        check_context c = f->contexts[v[3]];
        pthread_mutex_unlock(&g_lock);
        c.describe(&v[1], c.bytes, msg, sizeof msg);
    } else {
        pthread_mutex_unlock(&g_lock);
    }
    st = em_zero_(flag);   /* reported once */
    if (st != EM_OK) return st;
    return em_error(EM_ERR_ARGUMENT, "%s (found by device work queued before this wait)", msg);
}

void em__device_checks_reset(void) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nflags; i++) em_release(g_flags[i].flag);
    g_nflags = 0;
    atomic_store(&g_armed, 0);
    pthread_mutex_unlock(&g_lock);
}
