/* Graphs: a step's device work recorded once and replayed with one launch, as
 * torch.cuda.graphs does (CUDA graphs; other backends have none).
 *
 * Two levels. The explicit one: em_graph_capture_begin, the ops to record, then
 * em_graph_capture_end; em_graph_replay queues the recorded work again. The step level:
 * em_graph_step_run(step, inputs, n, key, fn, ctx) runs fn(ctx) eagerly for `warmup` calls,
 * captures it on the next one, and from then on replays the graph while the key matches
 * (the caller's key, the device, and each input tensor's dtype, shape and address); when the
 * key changes, the graph is dropped and the count starts again.
 *
 * What a graph fixes at capture: the addresses of every tensor its work reads or writes, the
 * shapes, and every scalar handed to a kernel. So
 * - the work's inputs are tensors that outlive the graph: copy new data into them (em_copy_)
 *   before each replay;
 * - its outputs are the tensors created during the capture: keep them (in ctx, for a step) and
 *   read them after a replay. Memory allocated during a capture comes from the graph's private
 *   pool, which the allocator hands to no one else while the graph lives;
 * - host-side values (a learning rate, an optimizer's step count turned into a kernel
 *   argument) are those of the capture: only work whose scalars do not change between steps
 *   can be replayed. On CUDA, Adam/AdamW keep their step count and learning rate in device
 *   memory (a replay takes the next step; call em_optim_step_replayed after each replay that
 *   did not capture), and em_cross_entropy checks class indices on the device.
 * Inside a capture, what cannot be recorded is refused with EM_ERR_NOT_SUPPORTED: a wait for
 * the device, a copy from or to host memory, reading a value to the host. The capture's end
 * then fails (naming it) and drops the recording. em_graph_step_run falls back to running fn
 * eagerly for that key: fn may thus run twice for one call when a capture fails, so its host
 * side should not count calls.
 *
 * EMBER_CUDA_GRAPHS=0 turns graphs off: em_graph_available says so, a step always runs
 * eagerly, and capture_begin fails with EM_ERR_NOT_SUPPORTED (read by em_graph_available,
 * hence when a step is made and at each capture_begin). */
#ifndef EMBER_GRAPH_H
#define EMBER_GRAPH_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/device.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether device d can record graphs; *reason (static text) says why not. */
EM_API bool em_graph_available(em_device d, const char **reason);

/* A recording of the work queued on one device, replayed as one launch (a CUDA graph). */
typedef struct em_graph em_graph;
/* A graph for device d, nothing recorded yet (NULL with an error for a bad device). */
EM_API em_graph *em_graph_new(em_device d);
/* Record the work queued on the device from now on (a graph that holds a recording drops it
 * first). EM_ERR_NOT_SUPPORTED where the device has no graphs. */
EM_API em_status em_graph_capture_begin(em_graph *g);
/* End the recording. On failure the recording is dropped (the graph is empty, as new) and
 * the error says what could not be recorded; the device is out of capture either way. */
EM_API em_status em_graph_capture_end(em_graph *g);
/* Queue the recorded work once more (asynchronous, like any op). */
EM_API em_status em_graph_replay(em_graph *g);
/* Whether g holds a recording. */
EM_API bool em_graph_captured(const em_graph *g);
/* Free the graph; its private memory goes back as its tensors are released. NULL is fine. */
EM_API void em_graph_free(em_graph *g);

/* ---- the step level ---- */
/* The work of one step, given the caller's context: what em_graph_step_run runs or replays. */
typedef em_status (*em_graph_fn)(void *ctx);
/* A step that runs eagerly, then is captured once and replayed while its key holds. */
typedef struct em_graph_step em_graph_step;
/* What a step has done so far (em_graph_step_get_stats). */
typedef struct em_graph_step_stats {
    int64_t eager_runs;       /* calls that ran fn eagerly (warm-up, fallback, graphs off) */
    int64_t captures;         /* graphs captured */
    int64_t replays;          /* calls answered by a replay (the capturing call included) */
    int64_t failed_captures;  /* captures that failed: that key then runs eagerly */
    bool captured;            /* a graph is held now */
    char last_failure[256];   /* why the last capture failed ("" if none) */
} em_graph_step_stats;

/* A step on device d that captures after `warmup` eager calls (>= 0; PyTorch warms up on a
 * side stream for 3 iterations: 1 or more lets lazily created things, such as compiled
 * kernels and library handles, exist before the capture). */
EM_API em_graph_step *em_graph_step_new(em_device d, int warmup);
/* One step: fn(ctx), eagerly or as a replay (see above). inputs (n of them, may be NULL when
 * n is 0) are the tensors fn reads that change between calls by content only; key is the
 * caller's (0 if none; e.g. a hash of what else the step depends on). */
EM_API em_status em_graph_step_run(em_graph_step *s, em_tensor *const *inputs, int n, uint64_t key,
                                   em_graph_fn fn, void *ctx);
/* Fills *out with the step's counts and its last capture failure. */
EM_API em_status em_graph_step_get_stats(const em_graph_step *s, em_graph_step_stats *out);
/* Free the step and its graph. NULL is fine. */
EM_API void em_graph_step_free(em_graph_step *s);

#ifdef __cplusplus
}
#endif
#endif
