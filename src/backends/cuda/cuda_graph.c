/* CUDA graphs: a device's stream captured into a graph, instantiated once, replayed with one
 * launch (the backend table's graph entries, backend.h; core's src/core/graph.c drives them).
 *
 * The symbols are optional in the loader: a driver without them means no graphs, not an
 * error. Capture runs in CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: an unsafe call on the capturing
 * thread invalidates the capture, and other threads' driver calls are left alone. The backend
 * refuses its own calls that cannot be recorded before they reach the driver (host waits,
 * copies from or to host memory: em__cuda_refuse_in_capture) so that the error names what
 * happened; anything the driver itself refuses invalidates the capture and surfaces at its
 * end. The caching allocator's new segments during a capture are allocated in relaxed mode
 * (cuda_backend.c's raw_alloc), as PyTorch's allocator does: cuMemAlloc is not recorded,
 * and the graph pool keeps the memory for as long as the graph lives. */
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

static bool graphs_in_driver(const em_cu_api *cu) {
    return cu && cu->cuStreamBeginCapture && cu->cuStreamEndCapture && cu->cuGraphInstantiateWithFlags &&
           cu->cuGraphLaunch && cu->cuGraphExecDestroy && cu->cuGraphDestroy &&
           cu->cuThreadExchangeStreamCaptureMode;
}

static bool graphs_off_by_env(void) {
    const char *e = getenv("EMBER_CUDA_GRAPHS");
    return e && !strcmp(e, "0");
}

bool em__cuda_graph_available(int index, const char **reason) {
    static const char *const off = "off (EMBER_CUDA_GRAPHS=0)";
    static const char *const old = "the CUDA driver lacks the graph functions (cuStreamBeginCapture_v2, "
                                   "cuGraphInstantiateWithFlags, ...: CUDA 11.4 or newer has them)";
    static const char *const none = "CUDA is not available";
    const char *why = NULL;
    if (graphs_off_by_env()) why = off;
    else if (em__cuda_count() <= index || index < 0) why = none;
    else if (!graphs_in_driver(em__cuda_api())) why = old;
    if (reason) *reason = why;
    return why == NULL;
}

em_status em__cuda_refuse_in_capture(em_cuda_device *d, const char *what) {
    if (!__atomic_load_n(&d->capturing, __ATOMIC_ACQUIRE)) return EM_OK;
    if (!d->capture_broken[0]) snprintf(d->capture_broken, sizeof d->capture_broken, "%s", what);
    return em_error(EM_ERR_NOT_SUPPORTED,
                    "cuda:%d: %s during a graph capture: the captured work has not run yet, so it cannot "
                    "be waited for or read (copy inputs into the graph's tensors before replaying it, and "
                    "read its results after)", d->index, what);
}

static em_status begin_in(int index) {
    const char *why = NULL;
    if (!em__cuda_graph_available(index, &why))
        return em_error(EM_ERR_NOT_SUPPORTED, "cuda:%d: graph capture: %s", index, why);
    em_cuda_device *d = em__cuda_activate(index, "graph capture");
    if (!d) return em_last_status();
    if (d->capturing)
        return em_error(EM_ERR_ARGUMENT, "cuda:%d: graph capture: a capture is already under way on this "
                        "device", index);
    const em_cu_api *cu = em__cuda_api();
    CUresult r = cu->cuStreamBeginCapture(d->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != CUDA_SUCCESS) {
        char what[80];
        snprintf(what, sizeof what, "cuda:%d: beginning a graph capture", index);
        return em__cu_fail(r, what);
    }
    d->capture_broken[0] = '\0';
    __atomic_store_n(&d->capturing, true, __ATOMIC_RELEASE);
    return EM_OK;
}

em_status em__cuda_graph_begin(int index) { EM_CUDA_CTX_SCOPED(begin_in(index)); }

static em_status end_in(int index, void **out) {
    *out = NULL;
    em_cuda_device *d = em__cuda_activate(index, "graph capture");
    if (!d) return em_last_status();
    if (!d->capturing)
        return em_error(EM_ERR_ARGUMENT, "cuda:%d: ending a graph capture: none is under way", index);
    const em_cu_api *cu = em__cuda_api();
    CUgraph graph = NULL;
    CUresult r = cu->cuStreamEndCapture(d->stream, &graph);
    __atomic_store_n(&d->capturing, false, __ATOMIC_RELEASE);
    char what[256];
    if (d->capture_broken[0]) {
        if (graph) cu->cuGraphDestroy(graph);
        snprintf(what, sizeof what, "%s", d->capture_broken);
        d->capture_broken[0] = '\0';
        return em_error(EM_ERR_NOT_SUPPORTED, "cuda:%d: graph capture failed: %s during the capture; the "
                        "recording was dropped", index, what);
    }
    if (r != CUDA_SUCCESS || !graph) {
        if (graph) cu->cuGraphDestroy(graph);
        snprintf(what, sizeof what, "cuda:%d: graph capture failed (a driver call during the capture "
                 "waited for the device or could not be recorded; the recording was dropped)", index);
        return em__cu_fail(r != CUDA_SUCCESS ? r : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, what);
    }
    CUgraphExec exec = NULL;
    r = cu->cuGraphInstantiateWithFlags(&exec, graph, 0);
    cu->cuGraphDestroy(graph); /* the executable graph is independent of it */
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuda:%d: instantiating a captured graph", index);
        return em__cu_fail(r, what);
    }
    *out = exec;
    return EM_OK;
}

em_status em__cuda_graph_end(int index, void **graph) { EM_CUDA_CTX_SCOPED(end_in(index, graph)); }

static em_status launch_in(int index, void *graph) {
    em_cuda_device *d = em__cuda_activate(index, "graph replay");
    if (!d) return em_last_status();
    if (d->capturing) return em__cuda_refuse_in_capture(d, "replaying a graph");
    CUresult r = em__cuda_api()->cuGraphLaunch((CUgraphExec)graph, d->stream);
    if (r != CUDA_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "cuda:%d: replaying a graph", index);
        return em__cu_fail(r, what);
    }
    return em__cuda_after_launch(d, "graph replay", NULL);
}

em_status em__cuda_graph_launch(int index, void *graph) { EM_CUDA_CTX_SCOPED(launch_in(index, graph)); }

void em__cuda_graph_destroy(int index, void *graph) {
    if (!graph) return;
    CUcontext prev = em__cuda_ctx_save();
    if (em__cuda_activate(index, "graph free")) em__cuda_api()->cuGraphExecDestroy((CUgraphExec)graph);
    em__cuda_ctx_restore(prev);
}

#endif
