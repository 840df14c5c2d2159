/* CUDA tensors through NCCL (libnccl.so.2, loaded with dlopen like the other CUDA libraries).
 * The communicator is made at a group's first CUDA collective: rank 0 asks NCCL for a unique
 * id and broadcasts it over MPI (em_dist_broadcast, so with its timeout and header check),
 * then every rank calls ncclCommInitRank for its device. Each collective is enqueued on the
 * tensor's device stream between ncclGroupStart and ncclGroupEnd (one call per group, as
 * PyTorch issues them), followed by an event: the collective's progress loop (collectives.c)
 * polls that event and ncclCommGetAsyncError, so NCCL work ends within the timeout too; a
 * timeout aborts the communicator (ncclCommAbort) rather than waiting forever. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "dist_internal.h"
#include "../core/internal_api.h"

static const em_nccl_api *g_fake;
static em_nccl_api g_api;
static bool g_tried, g_ok;
static int g_version;
static char g_reason[512];

void em__dist_nccl_use_fake(const em_nccl_api *api) {
    g_fake = api;
    g_tried = false;
    g_ok = false;
}

const em_nccl_api *em__dist_nccl(int *version, const char **reason) {
    if (g_fake) {
        if (version) g_fake->ncclGetVersion(version);
        return g_fake;
    }
    if (!g_tried) {
        g_tried = true;
        const char *why = NULL;
        void *h = em__nccl_library(&g_version, &why);
        if (!h) {
            snprintf(g_reason, sizeof g_reason, "%s", why ? why : "libnccl.so.2 not found");
        } else {
            g_ok = true;
#define SYM(name)                                                                                  \
    do {                                                                                           \
        *(void **)&g_api.name = dlsym(h, #name);                                                   \
        if (!g_api.name && g_ok) {                                                                 \
            snprintf(g_reason, sizeof g_reason, "libnccl.so.2 lacks %s (NCCL %d)", #name, g_version); \
            g_ok = false;                                                                          \
        }                                                                                          \
    } while (0)
            SYM(ncclGetVersion); SYM(ncclGetUniqueId); SYM(ncclCommInitRank); SYM(ncclCommDestroy);
            SYM(ncclCommAbort); SYM(ncclCommGetAsyncError); SYM(ncclGetErrorString); SYM(ncclAllReduce);
            SYM(ncclBroadcast); SYM(ncclAllGather); SYM(ncclReduceScatter); SYM(ncclGroupStart); SYM(ncclGroupEnd);
#undef SYM
        }
    }
    if (version) *version = g_version;
    if (!g_ok && reason) *reason = g_reason;
    return g_ok ? &g_api : NULL;
}

static int nccl_dtype(em_dtype dt) {
    switch (dt) {
    case EM_F32: return NCCL_FLOAT32;
    case EM_F64: return NCCL_FLOAT64;
    case EM_F16: return NCCL_FLOAT16;
    case EM_BF16: return NCCL_BFLOAT16;
    case EM_I64: return NCCL_INT64;
    case EM_I32: return NCCL_INT32;
    default: return NCCL_UINT8; /* uint8, bool */
    }
}

static em_status nccl_fail(const em_nccl_api *api, const char *call, int rc, int rank) {
    return em_error(EM_ERR_BACKEND, "NCCL: %s failed on rank %d: %s (%d)", call, rank,
                    api->ncclGetErrorString ? api->ncclGetErrorString(rc) : "?", rc);
}

/* The group's communicator, made for the device of t. */
static em_status ensure_comm(em_dist_group *g, const em_nccl_api *api, int device) {
    if (!api) return em_error(EM_ERR_UNAVAILABLE, "NCCL is not loaded");
    if (g->nccl_comm) {
        if (device != g->nccl_device)
            return em_error(EM_ERR_DEVICE, "NCCL: this rank's communicator is for cuda:%d, got a tensor on cuda:%d "
                            "(one device per rank, as torch.cuda.set_device)", g->nccl_device, device);
        return EM_OK;
    }
    em_nccl_unique_id id;
    memset(&id, 0, sizeof id);
    int rc;
    if (g->rank == 0 && (rc = api->ncclGetUniqueId(&id)) != 0) return nccl_fail(api, "ncclGetUniqueId", rc, g->rank);
    em_scope s = em_scope_begin();
    em_tensor *t = em_from_data(&id, EM_U8, EM_SHAPE((int64_t)sizeof id), EM_OPTS(.dtype = EM_U8));
    em_status st = t ? em_dist_broadcast(g, t, 0) : em_last_status();
    if (st == EM_OK) st = em_copy_to_host(t, &id, sizeof id);
    em_scope_end(s);
    if (st != EM_OK) return st;
    void *comm = NULL;
    if ((rc = api->ncclCommInitRank(&comm, g->size, id, g->rank)) != 0) return nccl_fail(api, "ncclCommInitRank", rc, g->rank);
    g->nccl_comm = comm;
    g->nccl_device = device;
    return EM_OK;
}

em_status em__dist_nccl_ensure(em_dist_group *g, int device) {
    const char *why = NULL;
    const em_nccl_api *api = em__dist_nccl(NULL, &why);
    if (!api) return em_error(EM_ERR_UNAVAILABLE, "NCCL: %s", why);
    return ensure_comm(g, api, device);
}

em_status em__dist_nccl_start(em_dist_work *w) {
    em_dist_group *g = w->g;
    int version = 0;
    const char *why = NULL;
    const em_nccl_api *api = em__dist_nccl(&version, &why);
    if (!api) return em_error(EM_ERR_UNAVAILABLE, "NCCL: %s", why);
    em_cuda_buffer rb, sb = {0};
    void *prev = NULL;
    if (em__cuda_enter(w->rbuf, &rb, &prev) != EM_OK) return em_last_status();
    em_status st = EM_OK;
    if (w->sbuf) {
        void *p2;
        if ((st = em__cuda_enter(w->sbuf, &sb, &p2)) == EM_OK) em__cuda_leave(p2);
    }
    if (st == EM_OK) st = ensure_comm(g, api, rb.device);
    if (st != EM_OK) {
        em__cuda_leave(prev);
        return st;
    }
    int dt = nccl_dtype(w->dtype), rc;
    int op = w->op == EM_REDUCE_MAX ? NCCL_MAX : w->op == EM_REDUCE_MIN ? NCCL_MIN : NCCL_SUM;
    if (w->op == EM_REDUCE_AVG && version >= 21000) { /* ncclAvg: NCCL 2.10 */
        op = NCCL_AVG;
        w->avg_done = true;
    }
    size_t n = (size_t)w->count;
    const char *call = "ncclGroupStart";
    rc = api->ncclGroupStart();
    if (rc == 0) {
        switch (w->kind) {
        case C_ALL_REDUCE:
            call = "ncclAllReduce";
            rc = api->ncclAllReduce((void *)(uintptr_t)rb.ptr, (void *)(uintptr_t)rb.ptr, n, dt, op, g->nccl_comm, rb.stream);
            break;
        case C_BROADCAST:
            call = "ncclBroadcast";
            rc = api->ncclBroadcast((void *)(uintptr_t)rb.ptr, (void *)(uintptr_t)rb.ptr, n, dt, w->root, g->nccl_comm, rb.stream);
            break;
        case C_ALL_GATHER:
            call = "ncclAllGather";
            rc = api->ncclAllGather((void *)(uintptr_t)sb.ptr, (void *)(uintptr_t)rb.ptr, n, dt, g->nccl_comm, rb.stream);
            break;
        case C_REDUCE_SCATTER:
            call = "ncclReduceScatter";
            rc = api->ncclReduceScatter((void *)(uintptr_t)sb.ptr, (void *)(uintptr_t)rb.ptr, n, dt, op, g->nccl_comm, rb.stream);
            break;
        default: break;
        }
        int end = api->ncclGroupEnd();
        if (rc == 0 && end != 0) call = "ncclGroupEnd", rc = end;
    }
    if (rc != 0) st = nccl_fail(api, call, rc, g->rank);
    if (st == EM_OK && !(w->mark = em__cuda_mark(rb.device))) st = em_last_status();
    em__cuda_leave(prev);
    return st;
}

int em__dist_nccl_done(em_dist_work *w) {
    const em_nccl_api *api = em__dist_nccl(NULL, NULL);
    int async = 0;
    if (api && w->g->nccl_comm && api->ncclCommGetAsyncError(w->g->nccl_comm, &async) == 0 && async != 0) {
        nccl_fail(api, "a collective (ncclCommGetAsyncError)", async, w->g->rank);
        return -1;
    }
    return em__cuda_mark_done(w->mark);
}

void em__dist_nccl_abort(em_dist_group *g) {
    const em_nccl_api *api = em__dist_nccl(NULL, NULL);
    if (api && g->nccl_comm) api->ncclCommAbort(g->nccl_comm);
    g->nccl_comm = NULL;
}

void em__dist_nccl_destroy(em_dist_group *g) {
    const em_nccl_api *api = em__dist_nccl(NULL, NULL);
    if (api && g->nccl_comm) api->ncclCommDestroy(g->nccl_comm);
    g->nccl_comm = NULL;
}
