/* Graphs (include/ember/graph.h): the backend records a device's queued work (backend.h's
 * graph entries) while the caching allocator serves the capture from a private pool
 * (allocator.h's em__mem_capture_begin), and the step level decides when to capture, replay
 * or run eagerly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/graph.h>
#include "core_internal.h"
#include "internal_api.h"
#include "tensor_impl.h"
#include "../memory/allocator.h"
#include "../util/errors.h"

struct em_graph {
    em_device dev;             /* resolved */
    const em_backend *be;
    void *exec;                /* the backend's replayable graph, NULL when none */
    uint64_t pool;             /* the allocator's private pool of the recording, 0 when none */
    bool capturing;
};

/* The device this thread is recording on (capture is the thread's mode on the device's
 * stream), for work that must not bake a host value into the recording. */
static _Thread_local bool tl_capturing;
static _Thread_local em_device tl_capture_dev;

bool em__graph_capturing(em_device d) {
    return tl_capturing && em_device_equal(em_device_resolve(d), tl_capture_dev);
}

/* What to undo on the host when the capture fails (em__graph_on_abort): its work never ran. */
#define MAX_UNDO 16
static _Thread_local struct { void (*undo)(void *); void *ctx; } tl_undo[MAX_UNDO];
static _Thread_local int tl_nundo;
static _Thread_local bool tl_work_failed;   /* the step level's fn failed inside the capture */

em_status em__graph_on_abort(void (*undo)(void *ctx), void *ctx) {
    if (!tl_capturing) return EM_OK;
    for (int i = 0; i < tl_nundo; i++)
        if (tl_undo[i].undo == undo && tl_undo[i].ctx == ctx) return EM_OK;
    if (tl_nundo == MAX_UNDO)
        return em_error(EM_ERR_NOT_SUPPORTED, "graph capture: more than %d host states to restore if it fails", MAX_UNDO);
    tl_undo[tl_nundo].undo = undo;
    tl_undo[tl_nundo++].ctx = ctx;
    return EM_OK;
}

bool em_graph_available(em_device d, const char **reason) {
    const char *why = NULL;
    em_error_state saved;
    em__error_save(&saved);
    d = em_device_resolve(d);
    const em_backend *be = em__backend_checked(d, "em_graph_available");
    em__error_restore(&saved);
    if (!be) why = "the device is not available";
    else if (!be->graph_available || !be->graph_begin) why = "the backend records no graphs (CUDA only)";
    else be->graph_available(d.index, &why);
    if (reason) *reason = why;
    return why == NULL;
}

em_graph *em_graph_new(em_device d) {
    d = em_device_resolve(d);
    const em_backend *be = em__backend_checked(d, "em_graph_new");
    if (!be) return NULL;
    em_graph *g = calloc(1, sizeof *g);
    if (!g) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_graph_new: out of host memory");
        return NULL;
    }
    g->dev = d;
    g->be = be;
    return g;
}

/* Drop the recording and give its pool back (its live blocks go back as they are freed). */
static void drop(em_graph *g) {
    if (g->exec) g->be->graph_destroy(g->dev.index, g->exec);
    g->exec = NULL;
    if (g->pool) em__mem_pool_release(g->dev, g->pool);
    g->pool = 0;
}

em_status em_graph_capture_begin(em_graph *g) {
    if (!g) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_capture_begin: graph is NULL");
    if (g->capturing)
        return em_error(EM_ERR_ARGUMENT, "em_graph_capture_begin: this graph is already capturing");
    const char *why = NULL;
    if (!em_graph_available(g->dev, &why))
        return em_error(EM_ERR_NOT_SUPPORTED, "em_graph_capture_begin: %s cannot record graphs: %s",
                        em_device_str(g->dev).s, why);
    drop(g);
    uint64_t pool = em__mem_capture_begin(g->be, g->dev);
    if (!pool) return em_last_status();
    em_status s = g->be->graph_begin(g->dev.index);
    if (s != EM_OK) {
        em__mem_capture_end(g->dev);
        em__mem_pool_release(g->dev, pool);
        return s;
    }
    g->pool = pool;
    g->capturing = true;
    tl_capturing = true;
    tl_capture_dev = g->dev;
    tl_nundo = 0;
    return EM_OK;
}

em_status em_graph_capture_end(em_graph *g) {
    if (!g) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_capture_end: graph is NULL");
    if (!g->capturing) return em_error(EM_ERR_ARGUMENT, "em_graph_capture_end: this graph is not capturing");
    void *exec = NULL;
    em_status s = g->be->graph_end(g->dev.index, &exec);
    em__mem_capture_end(g->dev);
    g->capturing = false;
    tl_capturing = false;
    int nundo = tl_nundo;
    tl_nundo = 0;
    bool undo = s != EM_OK || tl_work_failed;   /* the recording will not be replayed */
    tl_work_failed = false;
    for (int i = nundo - 1; undo && i >= 0; i--) tl_undo[i].undo(tl_undo[i].ctx);
    if (s != EM_OK) {
        drop(g);
        return s;
    }
    g->exec = exec;
    return EM_OK;
}

em_status em_graph_replay(em_graph *g) {
    if (!g) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_replay: graph is NULL");
    if (!g->exec)
        return em_error(EM_ERR_ARGUMENT, "em_graph_replay: the graph holds no recording (%s)",
                        g->capturing ? "its capture has not ended" : "capture it first");
    return g->be->graph_launch(g->dev.index, g->exec);
}

bool em_graph_captured(const em_graph *g) { return g && g->exec; }

void em_graph_free(em_graph *g) {
    if (!g) return;
    if (g->capturing) {   /* end the device's capture: it must not outlive its graph */
        em_error_state saved;
        em__error_save(&saved);
        em_graph_capture_end(g);
        em__error_restore(&saved);
    }
    drop(g);
    free(g);
}

/* ---------------------------------------------------------------- the step level */

struct em_graph_step {
    em_device dev;
    int warmup;
    bool enabled;              /* the device records graphs and EMBER_CUDA_GRAPHS is not 0 */
    bool have_key;
    uint64_t key;              /* of the current run of calls */
    int warm;                  /* eager calls made with this key */
    bool refused;              /* the capture failed for this key: eager from now on */
    em_graph *graph;
    em_graph_step_stats stats;
};

em_graph_step *em_graph_step_new(em_device d, int warmup) {
    if (warmup < 0) {
        em_error(EM_ERR_ARGUMENT, "em_graph_step_new: warmup must be >= 0, got %d", warmup);
        return NULL;
    }
    d = em_device_resolve(d);
    if (!em__backend_checked(d, "em_graph_step_new")) return NULL;
    em_graph_step *s = calloc(1, sizeof *s);
    if (!s) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_graph_step_new: out of host memory");
        return NULL;
    }
    s->dev = d;
    s->warmup = warmup;
    s->enabled = em_graph_available(d, NULL);
    return s;
}

/* FNV-1a over the words that fix a recording: the device, the caller's key, and each input's
 * dtype, shape, strides and address. */
static uint64_t mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

static em_status step_key(const em_graph_step *s, em_tensor *const *in, int n, uint64_t key, uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = mix(h, key);
    h = mix(h, ((uint64_t)s->dev.type << 32) | (uint32_t)s->dev.index);
    for (int i = 0; i < n; i++) {
        const em_tensor *t = in[i];
        if (!t) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_step_run: input %d is NULL", i);
        if (!em_device_equal(t->storage->device, s->dev))
            return em_error(EM_ERR_DEVICE, "em_graph_step_run: input %d is on %s, the step on %s", i,
                            em_device_str(t->storage->device).s, em_device_str(s->dev).s);
        h = mix(h, (uint64_t)t->dtype);
        h = mix(h, (uint64_t)t->ndim);
        for (int k = 0; k < t->ndim; k++) {
            h = mix(h, (uint64_t)t->shape[k]);
            h = mix(h, (uint64_t)t->strides[k]);
        }
        h = mix(h, (uint64_t)(uintptr_t)t->storage->block.handle);
        h = mix(h, (uint64_t)t->storage->block.offset + (uint64_t)t->offset);
    }
    *out = h;
    return EM_OK;
}

em_status em_graph_step_run(em_graph_step *s, em_tensor *const *inputs, int n, uint64_t key, em_graph_fn fn,
                            void *ctx) {
    if (!s || !fn || (n > 0 && !inputs) || n < 0)
        return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_step_run: %s",
                                        !s ? "step is NULL" : !fn ? "fn is NULL" : "bad inputs (NULL or n < 0)");
    if (!s->enabled) {
        s->stats.eager_runs++;
        return fn(ctx);
    }
    uint64_t k = 0;
    if (step_key(s, inputs, n, key, &k) != EM_OK) return em_last_status();
    if (!s->have_key || k != s->key) {   /* new shapes, devices or addresses: start again */
        em_graph_free(s->graph);
        s->graph = NULL;
        s->stats.captured = false;
        s->have_key = true;
        s->key = k;
        s->warm = 0;
        s->refused = false;
    }
    if (s->graph) {
        em_status r = em_graph_replay(s->graph);
        if (r == EM_OK) s->stats.replays++;
        return r;
    }
    if (s->refused || s->warm < s->warmup) {
        s->warm++;
        s->stats.eager_runs++;
        return fn(ctx);
    }
    em_graph *g = em_graph_new(s->dev);
    if (!g) return em_last_status();
    em_status r = em_graph_capture_begin(g);
    if (r == EM_OK) {
        em_status ran = fn(ctx);
        tl_work_failed = ran != EM_OK;
        em_status ended = em_graph_capture_end(g);  /* always: the device leaves capture */
        r = ended != EM_OK ? ended : ran;
    }
    if (r != EM_OK) {   /* graph dropped; this key runs eagerly from now on */
        snprintf(s->stats.last_failure, sizeof s->stats.last_failure, "%s", em_last_error());
        em_graph_free(g);
        em_clear_error();
        s->refused = true;
        s->stats.failed_captures++;
        s->stats.eager_runs++;
        return fn(ctx);
    }
    s->graph = g;
    s->stats.captures++;
    s->stats.captured = true;
    r = em_graph_replay(g);   /* the capture recorded the step; this runs it */
    if (r == EM_OK) s->stats.replays++;
    return r;
}

em_status em_graph_step_get_stats(const em_graph_step *s, em_graph_step_stats *out) {
    if (!s || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_graph_step_get_stats: NULL argument");
    *out = s->stats;
    return EM_OK;
}

void em_graph_step_free(em_graph_step *s) {
    if (!s) return;
    em_graph_free(s->graph);
    free(s);
}
