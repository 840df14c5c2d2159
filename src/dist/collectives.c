/* Collectives over Open MPI's non-blocking calls, with a header exchange that catches
 * mismatched calls and a test loop that ends every collective within the group's timeout.
 *
 * Each collective: (1) check the tensors; (2) find host buffers MPI can use: a contiguous
 * CPU tensor's own memory, otherwise a staging copy (pinned host memory for a device
 * tensor; float32 for a float16/bfloat16 reduction, which MPI cannot add); (3) start the
 * data collective on the group's data communicator (all_reduce: Ember's own algorithms over
 * point-to-point messages, allreduce.c) and, on a second communicator, send
 * this rank's header to every peer and post a receive for theirs (point to point, so that
 * on a timeout the ranks whose header never came are known: they did not answer);
 * (4) progress both until done, a header that differs, an MPI error, or the deadline. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dist_internal.h"
#include "../core/internal_api.h"
#include <ember/ops.h>

static const char *kind_name(int k) {
    switch (k) {
    case C_ALL_REDUCE: return "all_reduce";
    case C_BROADCAST: return "broadcast";
    case C_ALL_GATHER: return "all_gather";
    case C_REDUCE_SCATTER: return "reduce_scatter";
    case C_BARRIER: return "barrier";
    default: return "an unknown collective";
    }
}
static const char *op_name(int op) {
    static const char *const names[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op < 4 ? names[op] : "?";
}

/* "all_reduce(avg) of 1000 float32 elements" from a header. */
static void describe(char *buf, size_t n, const int64_t *h) {
    int k = (int)h[HDR_KIND];
    const char *dt = h[HDR_DTYPE] >= 0 && h[HDR_DTYPE] < EM_DTYPE_COUNT ? em_dtype_name((em_dtype)h[HDR_DTYPE]) : "?";
    if (k == C_BARRIER)
        snprintf(buf, n, "barrier");
    else if (k == C_ALL_REDUCE || k == C_REDUCE_SCATTER)
        snprintf(buf, n, "%s(%s) of %lld %s elements", kind_name(k), op_name((int)h[HDR_OP]), (long long)h[HDR_COUNT], dt);
    else if (k == C_BROADCAST)
        snprintf(buf, n, "broadcast(root %lld) of %lld %s elements", (long long)h[HDR_ROOT], (long long)h[HDR_COUNT], dt);
    else
        snprintf(buf, n, "%s of %lld %s elements", kind_name(k), (long long)h[HDR_COUNT], dt);
}

static const char *api_name(int k) {
    switch (k) {
    case C_ALL_REDUCE: return "em_dist_all_reduce";
    case C_BROADCAST: return "em_dist_broadcast";
    case C_ALL_GATHER: return "em_dist_all_gather";
    case C_REDUCE_SCATTER: return "em_dist_reduce_scatter";
    default: return "em_dist_barrier";
    }
}

void em__dist_work_free_now(em_dist_work *w) {
    em_release(w->dst);
    em_release(w->src);
    em_release(w->rbuf);
    em_release(w->sbuf);
    free(w->msg); /* the header arrays live in w's own block */
    free(w->ar_tmp);
    em__cuda_mark_free(w->mark);
    free(w);
}

#ifdef EMBER_HAVE_MPI

MPI_Datatype em__dist_mpi_type(em_dtype dt) {
    switch (dt) {
    case EM_F32: return MPI_FLOAT;
    case EM_F64: return MPI_DOUBLE;
    case EM_I64: return MPI_INT64_T;
    case EM_I32: return MPI_INT32_T;
    case EM_U8: case EM_BOOL: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* float16, bfloat16: moved, never reduced */
    }
}

static MPI_Op mpi_op(em_reduce_op op, em_dtype dt) {
    if (dt == EM_BOOL && (op == EM_REDUCE_SUM || op == EM_REDUCE_AVG)) return MPI_LOR;
    return op == EM_REDUCE_MAX ? MPI_MAX : op == EM_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

/* The group's point-to-point works in flight: a wait moves every one of them along, so
 * that ranks waiting on their works in different orders still finish (MPI's own
 * non-blocking collectives progress inside any MPI call). */
static void active_remove(em_dist_work *w) {
    for (em_dist_work **p = &w->g->active; *p; p = &(*p)->next_active)
        if (*p == w) {
            *p = w->next_active;
            w->next_active = NULL;
            return;
        }
}

/* Fail w: the message is kept on w (every wait raises it again) and breaks the group. */
static em_status work_fail(em_dist_work *w, em_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static em_status work_fail(em_dist_work *w, em_status code, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    w->finished = true;
    w->status = code;
    free(w->msg);
    w->msg = strdup(buf);
    w->mpi_pending = true;
    active_remove(w);
    em__dist_break(w->g, buf);
    return em_error(code, "%s", buf);
}

static em_status check_header(em_dist_work *w, int i);

/* A data collective that failed in MPI (a truncation when sizes differ, say) is most often
 * a mismatched call: give the peers' headers a moment to arrive and report the mismatch,
 * which says more than MPI's error code. */
static bool mismatch_explains(em_dist_work *w) {
    double until = em__dist_now() + 2.0;
    if (until > w->deadline) until = w->deadline;
    while (w->peers_left > 0 && em__dist_now() < until) {
        int outcount = 0;
        if (MPI_Testsome(w->npeer, w->hreq, &outcount, w->hidx, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return false;
        for (int j = 0; outcount != MPI_UNDEFINED && j < outcount; j++) {
            w->hseen[w->hidx[j]] = true;
            w->peers_left--;
            if (check_header(w, w->hidx[j]) != EM_OK) return true;
        }
    }
    return false;
}

static em_status mpi_error(em_dist_work *w, const char *call, int rc) {
    if (!w->finished && w->peers_left > 0 && strcmp(call, "MPI_Testsome (headers)") && mismatch_explains(w)) return w->status;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    char what[160];
    describe(what, sizeof what, w->hdr);
    return work_fail(w, EM_ERR_BACKEND, "%s: %s failed on rank %d (collective #%lld, %s): %s", api_name(w->kind), call,
                     w->g->rank, (long long)w->hdr[HDR_SEQ], what, s);
}

/* The peer that sent header slot i (slots skip this rank). */
static int peer_of(const em_dist_work *w, int i) { return i < w->g->rank ? i : i + 1; }

static em_status check_header(em_dist_work *w, int i) {
    const int64_t *h = w->hin + (size_t)i * HDR_WORDS;
    bool same = true;
    for (int k = 0; k < HDR_WORDS; k++)
        if (h[k] != w->hdr[k] && !(k == HDR_ROOT && w->kind != C_BROADCAST) && !(k == HDR_OP && w->kind != C_ALL_REDUCE && w->kind != C_REDUCE_SCATTER))
            same = false;
    if (same) return EM_OK;
    char mine[160], theirs[160];
    describe(mine, sizeof mine, w->hdr);
    describe(theirs, sizeof theirs, h);
    return work_fail(w, EM_ERR_ARGUMENT,
                     "%s: collective #%lld differs across ranks: rank %d (this rank) called %s, rank %d called %s; "
                     "every rank must call the same collectives in the same order with the same dtype and size",
                     api_name(w->kind), (long long)w->hdr[HDR_SEQ], w->g->rank, mine, peer_of(w, i), theirs);
}

static em_status timeout_fail(em_dist_work *w) {
    if (w->nccl) em__dist_nccl_abort(w->g); /* NCCL's kernels would wait for the peer forever */
    char what[160], missing[512] = "";
    describe(what, sizeof what, w->hdr);
    size_t used = 0;
    int nmissing = 0;
    for (int i = 0; i < w->npeer && used + 16 < sizeof missing; i++)
        if (!w->hseen[i]) {
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", nmissing ? ", " : "", peer_of(w, i));
            nmissing++;
        }
    if (nmissing)
        return work_fail(w, EM_ERR_BACKEND,
                         "%s: timed out after %g s on rank %d (collective #%lld, %s): rank%s %s did not answer (%s not "
                         "entered this collective: stopped, stuck or calling something else)",
                         api_name(w->kind), w->g->timeout_s, w->g->rank, (long long)w->hdr[HDR_SEQ], what,
                         nmissing > 1 ? "s" : "", missing, nmissing > 1 ? "they have" : "it has");
    char peers[256];
    int nwait = w->ar_algo != AR_MPI ? em__ar_waiting_for(w, peers, sizeof peers) : 0;
    if (nwait)
        return work_fail(w, EM_ERR_BACKEND,
                         "%s: timed out after %g s on rank %d (collective #%lld, %s): every rank entered it, but "
                         "rank%s %s did not answer at step %d of %d (stopped or stuck during it, or waiting in turn "
                         "for a rank that is)",
                         api_name(w->kind), w->g->timeout_s, w->g->rank, (long long)w->hdr[HDR_SEQ], what,
                         nwait > 1 ? "s" : "", peers, w->ar_step + 1, w->ar_nsteps);
    return work_fail(w, EM_ERR_BACKEND,
                     "%s: timed out after %g s on rank %d (collective #%lld, %s): every rank entered it but it did "
                     "not complete (a rank died during it, or the network stalled)",
                     api_name(w->kind), w->g->timeout_s, w->g->rank, (long long)w->hdr[HDR_SEQ], what);
}

/* Data has arrived in rbuf: averages, and copies staged results back. */
static em_status work_complete(em_dist_work *w) {
    em_status st = EM_OK;
    if (w->op == EM_REDUCE_AVG && !w->avg_done && (w->kind == C_ALL_REDUCE || w->kind == C_REDUCE_SCATTER))
        st = em_mul_scalar_(w->rbuf, 1.0 / w->g->size);
    if (st == EM_OK && w->copy_back) st = em_copy_(w->dst, w->rbuf);
    w->finished = true;
    w->status = st;
    active_remove(w);
    em__ar_release(w);
    if (st != EM_OK) {
        free(w->msg);
        w->msg = strdup(em_last_error());
    }
    return st;
}

em_status em__dist_progress(em_dist_work *w, bool block) {
    if (w->finished) {
        if (w->status != EM_OK) return em_error(w->status, "%s", w->msg ? w->msg : "collective failed");
        return EM_OK;
    }
    unsigned spins = 0;
    uint64_t moves = w->ar_moves;
    double idle_since = em__dist_now();
    for (;;) {
        int flag = 0, rc;
        if (w->peers_left > 0 || w->npeer > 0) {
            int outcount = 0;
            /* a differing header is reported before anything else */
            rc = MPI_Testsome(2 * w->npeer, w->hreq, &outcount, w->hidx, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_error(w, "MPI_Testsome (headers)", rc);
            for (int j = 0; outcount != MPI_UNDEFINED && j < outcount; j++)
                if (w->hidx[j] < w->npeer) {
                    w->hseen[w->hidx[j]] = true;
                    w->peers_left--;
                    w->ar_moves++;
                    if (check_header(w, w->hidx[j]) != EM_OK) return w->status;
                }
        }
        if (!w->data_done && w->nccl) {
            int d = em__dist_nccl_done(w);
            if (d < 0) return work_fail(w, EM_ERR_BACKEND, "%s: %s", api_name(w->kind), em_last_error());
            if (d) w->data_done = true;
        } else if (!w->data_done && w->ar_algo != AR_MPI) {
            const char *call = NULL;
            int d = em__ar_progress(w, w->peers_left == 0, &rc, &call);
            if (d < 0) return mpi_error(w, call, rc);
            if (d) w->data_done = true;
        } else if (!w->data_done) {
            rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_error(w, "MPI_Test", rc);
            if (flag) w->data_done = true;
        }
        if (w->data_done) {
            int all = 1;
            rc = MPI_Testall(2 * w->npeer, w->hreq, &all, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_error(w, "MPI_Testall (headers)", rc);
            if (all) {
                for (int i = 0; i < w->npeer; i++)
                    if (!w->hseen[i]) {
                        w->hseen[i] = true;
                        if (check_header(w, i) != EM_OK) return w->status;
                    }
                return work_complete(w);
            }
        }
        if (!block) return EM_OK;
        /* the other point-to-point works in flight: a peer may be waiting on one of them
         * before it serves this one (their failures stay on them) */
        for (em_dist_work *o = w->g->active, *next; o; o = next) {
            next = o->next_active;
            if (o != w) {
                em_error_state saved;
                em__error_save(&saved);
                em__dist_progress(o, false);
                em__error_restore(&saved);
            }
        }
        if (w->finished) return w->status == EM_OK ? EM_OK : em_error(w->status, "%s", w->msg ? w->msg : "collective failed");
        if (w->g->broken) /* another collective failed: the peers are gone or will not come */
            return work_fail(w, EM_ERR_BACKEND, "%s: abandoned on rank %d: %s", api_name(w->kind), w->g->rank,
                             w->g->broken_msg);
        /* MPI moves messages along only inside MPI calls, so the loop polls, as MPI's
         * blocking calls do, while the collective moves (a message or a step completed in
         * the last 200 us: a transfer). When nothing has moved for 200 us a peer is late
         * (still computing): the loop then sleeps between polls (20 us asked, about 70 with
         * the kernel's timer slack) and leaves the core to the ranks that are computing;
         * on a machine with fewer cores than runnable processes, polling there made DDP
         * steps several times slower (docs/BENCHMARKS.md, "Distributed"). */
        if ((++spins & 7) == 0) {
            double t = em__dist_now();
            if (t > w->deadline) return timeout_fail(w);
            if (w->ar_moves != moves) {
                moves = w->ar_moves;
                idle_since = t;
            } else if (t > idle_since + 200e-6) {
                struct timespec ts = {0, 20000};
                nanosleep(&ts, NULL);
            }
        }
    }
}

/* A host buffer MPI can use for t: t itself (contiguous, on the CPU, a dtype MPI reduces
 * or moves as is) or a new staging tensor of dtype `wire` (filled from t when fill). */
static em_tensor *host_buffer(em_tensor *t, em_dtype wire, bool fill, bool *staged) {
    em_device d = em_device_of(t);
    if (d.type == EM_CPU && em_is_contiguous(t) && em_dtype_of(t) == wire) {
        *staged = false;
        return em_retain(t);
    }
    *staged = true;
    em_tensor *s = em_empty(em_shape_of(t), (em_opts){.dtype = wire, .pin_memory = d.type != EM_CPU});
    if (s && em_device_of(s).type != EM_CPU) s = NULL;
    if (!s) return NULL;
    em_retain(s);
    if (fill && em_copy_(s, t) != EM_OK) {
        em_release(s);
        return NULL;
    }
    return s;
}

/* A contiguous tensor on t's device NCCL can use: t itself or a copy. */
static em_tensor *device_buffer(em_tensor *t, bool *staged) {
    *staged = !em_is_contiguous(t);
    em_tensor *b = *staged ? em_contiguous(t) : t;
    return b ? em_retain(b) : NULL;
}

static bool reduces(coll_kind kind) { return kind == C_ALL_REDUCE || kind == C_REDUCE_SCATTER; }
static bool takes_input(coll_kind kind) { return kind == C_ALL_GATHER || kind == C_REDUCE_SCATTER; }

/* The call's arguments, checked before anything is allocated: false with an error set. On
 * success *count is the elements per rank that the header carries. */
static bool check_call(const em_dist_group *g, coll_kind kind, em_tensor *dst, em_tensor *src, em_reduce_op op,
                       int root, em_dtype dt, int64_t *count) {
    const char *api = api_name(kind);
    if (kind != C_BARRIER && (!dst || (takes_input(kind) && !src))) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: a tensor argument is NULL", api);
        return false;
    }
    if ((unsigned)op > EM_REDUCE_MIN) {
        em_error(EM_ERR_ARGUMENT, "%s: expected a reduce op (EM_REDUCE_SUM, _AVG, _MAX, _MIN), got %d", api, (int)op);
        return false;
    }
    *count = 0;
    if (kind == C_ALL_REDUCE || kind == C_BROADCAST) *count = em_numel(dst);
    if (takes_input(kind)) {
        if (em_dtype_of(src) != dt) {
            em_error(EM_ERR_DTYPE, "%s: input and output dtypes differ: %s and %s", api, em_dtype_name(em_dtype_of(src)),
                     em_dtype_name(dt));
            return false;
        }
        int64_t small = kind == C_ALL_GATHER ? em_numel(src) : em_numel(dst);
        int64_t big = kind == C_ALL_GATHER ? em_numel(dst) : em_numel(src);
        if (big != small * g->size) {
            em_error(EM_ERR_SHAPE, "%s: the %s must have world size (%d) times the %s's elements: expected %lld, found %lld", api,
                     kind == C_ALL_GATHER ? "output" : "input", g->size, kind == C_ALL_GATHER ? "input" : "output",
                     (long long)(small * g->size), (long long)big);
            return false;
        }
        *count = small;
    }
    if (kind == C_BROADCAST && (root < 0 || root >= g->size)) {
        em_error(EM_ERR_ARGUMENT, "%s: root must be in [0, %d), got %d", api, g->size, root);
        return false;
    }
    if (reduces(kind) && op == EM_REDUCE_AVG && !em_dtype_is_floating(dt)) {
        em_error(EM_ERR_DTYPE, "%s: EM_REDUCE_AVG needs a floating dtype, got %s", api, em_dtype_name(dt));
        return false;
    }
    if (*count > (int64_t)2147483647) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: %lld elements is more than MPI's count allows (2^31 - 1)", api, (long long)*count);
        return false;
    }
    return true;
}

/* A new work for one collective, its header filled in. The work and its header arrays are
 * one allocation: five mallocs and frees per collective were a tenth of a 4-byte
 * all_reduce's time. In order of alignment after the record: the requests, the received
 * headers (int64), Testsome's indices (int), the seen flags. NULL with an error when host
 * memory runs out. */
static em_dist_work *work_new(em_dist_group *g, coll_kind kind, em_reduce_op op, int root, em_dtype dt, int64_t count,
                              bool use_nccl) {
    int npeer = g->size - 1;
    size_t req_bytes = sizeof(MPI_Request) * (size_t)(2 * npeer + 1);
    size_t hin_bytes = sizeof(int64_t) * (size_t)(npeer * HDR_WORDS + 1);
    size_t idx_bytes = sizeof(int) * (size_t)(2 * npeer + 1);
    em_dist_work *w = calloc(1, sizeof *w + req_bytes + hin_bytes + idx_bytes + (size_t)npeer + 1);
    if (!w) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", api_name(kind));
        return NULL;
    }
    char *tail = (char *)(w + 1);
    w->hreq = (MPI_Request *)(void *)tail;
    w->hin = (int64_t *)(void *)(tail + req_bytes);
    w->hidx = (int *)(void *)(tail + req_bytes + hin_bytes);
    w->hseen = (bool *)(tail + req_bytes + hin_bytes + idx_bytes);
    w->nccl = use_nccl;
    w->g = g;
    w->kind = kind;
    w->op = op;
    w->root = root;
    w->dtype = dt;
    w->count = count;
    w->npeer = npeer;
    w->peers_left = w->npeer;
    w->req = MPI_REQUEST_NULL;
    int64_t h[HDR_WORDS] = {[HDR_SEQ] = (int64_t)g->seq, [HDR_KIND] = kind, [HDR_DTYPE] = dt, [HDR_COUNT] = count,
                            [HDR_ROOT] = kind == C_BROADCAST ? root : 0, [HDR_OP] = reduces(kind) ? op : 0};
    memcpy(w->hdr, h, sizeof h);
    return w;
}

/* The buffers the data moves through: the user's tensors, retained, and what the transport
 * reads and writes. For NCCL a contiguous tensor on the same device; for MPI a host buffer
 * of dtype `wire` (host_buffer). false, with the error set, when one could not be made. */
static bool stage_buffers(em_dist_work *w, em_tensor *dst, em_tensor *src, em_dtype wire) {
    coll_kind kind = w->kind;
    bool staged = false;
    if (dst) w->dst = em_retain(dst);
    if (src) w->src = em_retain(src);
    em_scope s = em_scope_begin();
    if (w->nccl) {
        w->rbuf = device_buffer(dst, &staged);
        w->copy_back = staged;
        if (src && w->rbuf) {
            bool unused;
            w->sbuf = device_buffer(src, &unused);
        }
    } else if (kind == C_ALL_REDUCE || kind == C_BROADCAST) {
        w->rbuf = host_buffer(dst, wire, true, &staged);
        w->copy_back = staged;
    } else if (kind != C_BARRIER) {
        bool unused;
        w->sbuf = host_buffer(src, wire, true, &unused);
        if (w->sbuf) w->rbuf = host_buffer(dst, wire, false, &staged);
        w->copy_back = staged;
    }
    em_scope_end(s);
    return kind == C_BARRIER || (w->rbuf && (!takes_input(kind) || w->sbuf));
}

/* A work that failed after MPI was handed its buffers: MPI may still write them, so the
 * group keeps it until finalize. NULL, for the caller to return. */
static em_dist_work *to_graveyard(em_dist_work *w) {
    w->next_dead = w->g->graveyard;
    w->g->graveyard = w;
    return NULL;
}

/* This rank's header to every peer, and a receive for each of theirs: MPI's error code. */
static int post_headers(em_dist_work *w) {
    int rc = MPI_SUCCESS;
    for (int i = 0; i < w->npeer && rc == MPI_SUCCESS; i++)
        rc = MPI_Irecv(w->hin + (size_t)i * HDR_WORDS, HDR_WORDS, MPI_INT64_T, peer_of(w, i), 0, w->g->hcomm, &w->hreq[i]);
    for (int i = 0; i < w->npeer && rc == MPI_SUCCESS; i++)
        rc = MPI_Isend(w->hdr, HDR_WORDS, MPI_INT64_T, peer_of(w, i), 0, w->g->hcomm, &w->hreq[w->npeer + i]);
    return rc;
}

/* The data through NCCL on the tensors' stream: w, or NULL with the failure recorded. */
static em_dist_work *post_nccl(em_dist_work *w) {
    if (em__dist_nccl_start(w) == EM_OK) return w;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    em_clear_error();
    work_fail(w, EM_ERR_BACKEND, "%s: %s", api_name(w->kind), msg);
    return to_graveyard(w);
}

/* all_reduce over Ember's own point-to-point algorithms (allreduce.c): its receive buffer,
 * its place among the group's works in flight, and its first messages, posted now so that
 * the data flows while the caller computes. w, or NULL with the failure recorded. */
static em_dist_work *post_own_all_reduce(em_dist_work *w) {
    if (em__ar_start(w) != MPI_SUCCESS) {
        work_fail(w, EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for a receive buffer of %lld elements", api_name(w->kind),
                  (long long)w->count);
        return to_graveyard(w);
    }
    w->next_active = w->g->active;
    w->g->active = w;
    int rc = MPI_SUCCESS;
    const char *call = "all_reduce";
    if (em__ar_progress(w, false, &rc, &call) < 0) {
        mpi_error(w, call, rc);
        return to_graveyard(w);
    }
    return w;
}

/* The data through MPI, in the host buffers of dtype `wire`: all_reduce by the algorithm
 * em__ar_choose picks, the others by MPI's non-blocking collectives. w, or NULL with the
 * failure recorded. */
static em_dist_work *post_mpi(em_dist_work *w, em_dtype wire) {
    em_dist_group *g = w->g;
    void *rb = w->rbuf ? em_data_ptr(w->rbuf) : NULL;
    void *sb = w->sbuf ? em_data_ptr(w->sbuf) : NULL;
    int n = (int)w->count;
    MPI_Datatype ty = em__dist_mpi_type(wire);
    int rc = MPI_SUCCESS;
    switch (w->kind) {
    case C_ALL_REDUCE:
        w->wire = wire;
        w->ar_algo = em__ar_choose(g, w->count, wire);
        if (w->ar_algo != AR_MPI) return post_own_all_reduce(w);
        rc = MPI_Iallreduce(MPI_IN_PLACE, rb, n, ty, mpi_op(w->op, w->dtype), g->comm, &w->req);
        break;
    case C_BROADCAST: rc = MPI_Ibcast(rb, n, ty, w->root, g->comm, &w->req); break;
    case C_ALL_GATHER: rc = MPI_Iallgather(sb, n, ty, rb, n, ty, g->comm, &w->req); break;
    case C_REDUCE_SCATTER: rc = MPI_Ireduce_scatter_block(sb, rb, n, ty, mpi_op(w->op, w->dtype), g->comm, &w->req); break;
    case C_BARRIER: rc = MPI_Ibarrier(g->comm, &w->req); break;
    }
    if (rc != MPI_SUCCESS) {
        mpi_error(w, kind_name(w->kind), rc);
        return to_graveyard(w);
    }
    return w;
}

/* Start a collective. dst receives (in place for all_reduce and broadcast), src is the
 * input of all_gather and reduce_scatter. */
static em_dist_work *start(em_dist_group *gin, coll_kind kind, em_tensor *dst, em_tensor *src, em_reduce_op op, int root) {
    em_dist_group *g = em__dist_resolve(gin, api_name(kind));
    if (!g) return NULL;
    em_dtype dt = dst ? em_dtype_of(dst) : EM_F32;
    int64_t count = 0;
    if (!check_call(g, kind, dst, src, op, root, dt, &count)) return NULL;
    /* CUDA tensors through NCCL when the group has it; its communicator is made now, at
     * the first such collective (every rank reaches it at the same call) */
    bool use_nccl = g->use_nccl && kind != C_BARRIER && em_device_of(dst).type == EM_CUDA &&
                    (!src || em_device_of(src).type == EM_CUDA);
    if (use_nccl && em__dist_nccl_ensure(g, em_device_of(dst).index) != EM_OK) return NULL;
    em_dist_work *w = work_new(g, kind, op, root, dt, count, use_nccl);
    if (!w) return NULL;
    /* MPI cannot add float16 or bfloat16: over MPI those reductions travel as float32 */
    em_dtype wire = (dt == EM_F16 || dt == EM_BF16) && reduces(kind) ? EM_F32 : dt;
    if (!stage_buffers(w, dst, src, wire)) {
        em__dist_work_free_now(w);
        return NULL;
    }
    /* headers first, then the data */
    int rc = post_headers(w);
    g->seq++;
    w->start = em__dist_now();
    w->deadline = w->start + g->timeout_s;
    if (rc != MPI_SUCCESS) {
        mpi_error(w, "MPI_Isend/MPI_Irecv (headers)", rc);
        return to_graveyard(w);
    }
    return w->nccl ? post_nccl(w) : post_mpi(w, wire);
}

em_status em_dist_wait(em_dist_work *w) {
    if (!w) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_dist_wait: argument 'w' is NULL");
    return em__dist_progress(w, true);
}

em_status em_dist_test(em_dist_work *w, bool *done) {
    if (done) *done = false;
    if (!w || !done) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_dist_test: argument '%s' is NULL", w ? "done" : "w");
    em_status st = em__dist_progress(w, false);
    *done = w->finished;
    return st;
}

void em_dist_work_free(em_dist_work *w) {
    if (!w) return;
    if (!w->finished) {
        /* MPI owns the buffers until the collective ends: wait, keeping a pending error */
        em_error_state saved;
        em__error_save(&saved);
        em_clear_error();
        em__dist_progress(w, true);
        em__error_restore(&saved);
    }
    if (w->mpi_pending) {
        to_graveyard(w);
        return;
    }
    em__dist_work_free_now(w);
}

#else /* no MPI in this build */

static em_dist_work *start(em_dist_group *g, coll_kind kind, em_tensor *dst, em_tensor *src, em_reduce_op op, int root) {
    (void)g, (void)dst, (void)src, (void)op, (void)root;
    em_error(EM_ERR_UNAVAILABLE, "%s: this Ember was built without MPI", api_name(kind));
    return NULL;
}
em_status em__dist_progress(em_dist_work *w, bool block) {
    (void)w, (void)block;
    return em_error(EM_ERR_UNAVAILABLE, "em_dist: this Ember was built without MPI");
}
em_status em_dist_wait(em_dist_work *w) { return em__dist_progress(w, true); }
em_status em_dist_test(em_dist_work *w, bool *done) {
    if (done) *done = true;
    return em__dist_progress(w, false);
}
void em_dist_work_free(em_dist_work *w) { (void)w; }
#endif

/* ---- the API: async starts, and blocking calls that wait ---- */
em_dist_work *em_dist_all_reduce_async(em_dist_group *g, em_tensor *t, em_reduce_op op) {
    return start(g, C_ALL_REDUCE, t, NULL, op, 0);
}
em_dist_work *em_dist_broadcast_async(em_dist_group *g, em_tensor *t, int root) {
    return start(g, C_BROADCAST, t, NULL, EM_REDUCE_SUM, root);
}
em_dist_work *em_dist_all_gather_async(em_dist_group *g, em_tensor *out, em_tensor *in) {
    return start(g, C_ALL_GATHER, out, in, EM_REDUCE_SUM, 0);
}
em_dist_work *em_dist_reduce_scatter_async(em_dist_group *g, em_tensor *out, em_tensor *in, em_reduce_op op) {
    return start(g, C_REDUCE_SCATTER, out, in, op, 0);
}
em_dist_work *em_dist_barrier_async(em_dist_group *g) { return start(g, C_BARRIER, NULL, NULL, EM_REDUCE_SUM, 0); }

static em_status finish(em_dist_work *w) {
    if (!w) return em_failed() ? em_last_status() : em_error(EM_ERR_INTERNAL, "em_dist: a collective failed to start");
    em_status st = em_dist_wait(w);
    em_dist_work_free(w);
    return st;
}
em_status em_dist_all_reduce(em_dist_group *g, em_tensor *t, em_reduce_op op) {
    return finish(em_dist_all_reduce_async(g, t, op));
}
em_status em_dist_broadcast(em_dist_group *g, em_tensor *t, int root) { return finish(em_dist_broadcast_async(g, t, root)); }
em_status em_dist_all_gather(em_dist_group *g, em_tensor *out, em_tensor *in) {
    return finish(em_dist_all_gather_async(g, out, in));
}
em_status em_dist_reduce_scatter(em_dist_group *g, em_tensor *out, em_tensor *in, em_reduce_op op) {
    return finish(em_dist_reduce_scatter_async(g, out, in, op));
}
em_status em_dist_barrier(em_dist_group *g) { return finish(em_dist_barrier_async(g)); }
