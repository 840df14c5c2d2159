/* all_reduce over MPI point-to-point (Isend/Irecv, tested without blocking): Open MPI's
 * non-blocking all-reduce (libnbc) is slower than its blocking one at most sizes, and a
 * blocking call cannot be given a timeout; driving the messages here keeps the deadline and
 * costs no more than the blocking call.
 *
 * Two algorithms, chosen by size and rank count as Open MPI's coll/tuned does:
 *   direct  (small buffers, few ranks): every rank sends its buffer to every other and
 *           reduces all of them in rank order (x0 op x1 op ... op x(n-1)): one message
 *           latency, and every rank computes the same bits in the same order.
 *   ring    (the rest): reduce-scatter then all-gather around the ring, 2(n-1) steps of
 *           1/n of the buffer each; each chunk is reduced once, by one rank, in one fixed
 *           order, then copied to every rank: bit-identical everywhere. A reduce step's
 *           chunk is split in segments, each reduced as soon as it lands (still in cache).
 * Nothing is reduced before every peer's header has been checked, so a mismatched call
 * (size, dtype, op, order) is reported, never mixed into the data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist_internal.h"
#include "../core/internal_api.h"

#ifdef EMBER_HAVE_MPI

enum {
    /* bytes sent by a rank (buffer x peers) up to which direct wins. Above it the ring's
     * second message costs less than what direct pays for writing the whole result over a
     * buffer every peer has just read (each line's write waits for the peers' copies to be
     * invalidated; the ring's reduction writes the half no peer read): at 64 KB on 2 ranks
     * direct took 17-18 us, the ring 13 (fresh data each call, docs/BENCHMARKS.md). */
    DIRECT_MAX_BYTES = 16 << 10,
    DIRECT_MAX_RANKS = 8,
    RING_MAX_RANKS = 512,        /* beyond this: MPI_Iallreduce */
    SEG_BYTES = 256 << 10,       /* a reduce step's message size */
    /* Open MPI's shared-memory transport (vader) sends messages up to 4 KB, its header
     * included, eagerly: one copy each side and no round trip; larger ones wait for the
     * receiver. The direct exchange splits buffers of up to 4 pieces into eager messages. */
    EAGER_BYTES = 4096 - 128,
};
/* A ring reduce step moves its chunk in segments of about SEG_BYTES, AR_WINDOW in flight
 * each way: the receive buffer (AR_WINDOW segments) stays in cache between the copy that
 * fills it and the reduction that reads it. */

static int64_t direct_pieces(int64_t bytes, int npeer) {
    int64_t k = (bytes + EAGER_BYTES - 1) / EAGER_BYTES;
    return k >= 1 && k <= 4 && 2 * npeer * k <= AR_MAX_REQ ? k : 1;
}

static size_t wire_size(em_dtype dt) {
    switch (dt) {
    case EM_F64: case EM_I64: return 8;
    case EM_F32: case EM_I32: return 4;
    default: return 1; /* uint8, bool: float16/bfloat16 reduce as float32 */
    }
}

int em__ar_choose(const em_dist_group *g, int64_t count, em_dtype wire) {
    if (g->size < 2) return AR_MPI;
    int force = g->ar_force; /* EMBER_DIST_ALLREDUCE, read at em_dist_init: benchmarks and tests */
    if (force == AR_MPI) return AR_MPI;
    if (force == AR_DIRECT && 2 * (g->size - 1) <= AR_MAX_REQ) return AR_DIRECT;
    if (g->size > RING_MAX_RANKS) return AR_MPI;
    if (force == AR_RING) return AR_RING;
    int64_t bytes = count * (int64_t)wire_size(wire);
    return g->size <= DIRECT_MAX_RANKS && bytes * (g->size - 1) <= DIRECT_MAX_BYTES ? AR_DIRECT : AR_RING;
}

/* ---- the local reduction: acc = op(acc, in), or op(in, acc) when in_first ----
 * One function per dtype and op, with restrict parameters and blocks of 16 of a fixed trip
 * count, which GCC vectorizes at -O2 (for SSE, AVX2 and AVX-512); integer sums wrap (unsigned), max and min keep a NaN
 * from either side. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) \
    && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* the build targets x86-64-v2 (SSE): wider versions picked at load time where the CPU has them.
 * Not in sanitized builds: the loader runs the clones' ifunc resolvers before the sanitizer's
 * runtime is up, and an instrumented resolver crashes the process (libember.so before main). */
#define REDUCE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REDUCE_CLONES
#endif
#define DEF_REDUCE(NAME, T, EXPR)                                                                      \
    REDUCE_CLONES static void NAME(T *restrict a, const T *restrict b, int64_t n, bool in_first) {                   \
        int64_t i = 0;                                                                                 \
        if (in_first) {                                                                                \
            for (; i + 16 <= n; i += 16)                                                               \
                for (int k = 0; k < 16; k++) { T l = b[i + k], r = a[i + k]; a[i + k] = (EXPR); }      \
            for (; i < n; i++) { T l = b[i], r = a[i]; a[i] = (EXPR); }                                \
        } else {                                                                                       \
            for (; i + 16 <= n; i += 16)                                                               \
                for (int k = 0; k < 16; k++) { T l = a[i + k], r = b[i + k]; a[i + k] = (EXPR); }      \
            for (; i < n; i++) { T l = a[i], r = b[i]; a[i] = (EXPR); }                                \
        }                                                                                              \
    }
#define DEF_FLOAT(SUF, T)                                        \
    DEF_REDUCE(sum_##SUF, T, l + r)                              \
    DEF_REDUCE(max_##SUF, T, (l != l || l > r) ? l : r)          \
    DEF_REDUCE(min_##SUF, T, (l != l || l < r) ? l : r)
#define DEF_INT(SUF, T, U)                                       \
    DEF_REDUCE(sum_##SUF, T, (T)((U)l + (U)r))                   \
    DEF_REDUCE(max_##SUF, T, l > r ? l : r)                      \
    DEF_REDUCE(min_##SUF, T, l < r ? l : r)
DEF_FLOAT(f32, float)
DEF_FLOAT(f64, double)
DEF_INT(i64, int64_t, uint64_t)
DEF_INT(i32, int32_t, uint32_t)
DEF_INT(u8, uint8_t, uint8_t)
DEF_REDUCE(or_b8, uint8_t, (uint8_t)((l != 0) | (r != 0)))
DEF_REDUCE(and_b8, uint8_t, (uint8_t)((l != 0) & (r != 0)))

#define BY_OP(SUF, T) \
    (op == EM_REDUCE_MAX ? max_##SUF : op == EM_REDUCE_MIN ? min_##SUF : sum_##SUF)((T *)acc, (const T *)in, n, in_first)

static void reduce(void *acc, const void *in, int64_t n, em_dtype dt, em_reduce_op op, bool in_first) {
    switch (dt) {
    case EM_F32: BY_OP(f32, float); break;
    case EM_F64: BY_OP(f64, double); break;
    case EM_I64: BY_OP(i64, int64_t); break;
    case EM_I32: BY_OP(i32, int32_t); break;
    case EM_BOOL: /* logical or for sum, avg and max; and for min (MPI_LOR, MPI_MAX on 0/1) */
        (op == EM_REDUCE_MIN ? and_b8 : or_b8)((uint8_t *)acc, (const uint8_t *)in, n, in_first);
        break;
    default: BY_OP(u8, uint8_t); break;
    }
}

/* Chunk c of the ring: the first count % n chunks have one element more. */
static int64_t chunk_off(const em_dist_work *w, int c) {
    int64_t n = w->g->size, base = w->count / n, rem = w->count % n;
    return c * base + (c < rem ? c : rem);
}
static int64_t chunk_len(const em_dist_work *w, int c) { return chunk_off(w, c + 1) - chunk_off(w, c); }
static int mod(int a, int n) { return ((a % n) + n) % n; }
/* Segments of a reduce step moving `bytes` (sender and receiver compute the same). */
static int64_t nsegs(int64_t bytes) { return bytes <= SEG_BYTES ? 1 : (bytes + SEG_BYTES - 1) / SEG_BYTES; }
/* Bytes of one receive slot: the largest segment (chunk 0 is the largest chunk), rounded
 * up to a cache line. */
static int64_t seg_slot(const em_dist_work *w) {
    int64_t bytes = chunk_len(w, 0) * (int64_t)wire_size(w->wire), k = nsegs(bytes);
    return ((bytes + k - 1) / k + (int64_t)wire_size(w->wire) + 63) / 64 * 64; /* slots stay aligned */
}
static void seg_range(int64_t len, int64_t nseg, int64_t k, int64_t *lo, int64_t *hi) {
    *lo = len * k / nseg;
    *hi = len * (k + 1) / nseg;
}

int em__ar_start(em_dist_work *w) {
    em_dist_group *g = w->g;
    int n = g->size;
    size_t es = wire_size(w->wire);
    w->ar_tag = (int)(g->seq % ((uint64_t)g->tag_ub + 1));
    w->ar_step = 0;
    w->ar_posted = false;
    if (w->ar_algo == AR_DIRECT) {
        w->ar_nsteps = 1;
        w->ar_pieces = direct_pieces(w->count * (int64_t)es, n - 1);
        w->ar_tmp_size = (size_t)w->count * es * (size_t)(n - 1) + 1;
    } else {
        w->ar_nsteps = 2 * (n - 1);
        w->ar_tmp_size = (size_t)seg_slot(w) * AR_WINDOW + 1;
    }
    /* the group's spare buffer when it is big enough: no fresh pages to fault in per call */
    if (g->ar_spare && g->ar_spare_size >= w->ar_tmp_size) {
        w->ar_tmp = g->ar_spare;
        w->ar_tmp_size = g->ar_spare_size;
        g->ar_spare = NULL;
    } else {
        w->ar_tmp = malloc(w->ar_tmp_size);
    }
    if (!w->ar_tmp) return MPI_ERR_NO_MEM;
    return MPI_SUCCESS;
}

static int fail_with(int rc, const char *what, int *mpi_rc, const char **call) {
    *mpi_rc = rc;
    *call = what;
    return -1;
}

/* Did request i bring the elements expected? (A mismatched peer's size is caught by the
 * headers; this guards the reduction when it slips through.) */
static bool right_count(em_dist_work *w, MPI_Status *st, int64_t want) {
    int got = 0;
    MPI_Get_count(st, em__dist_mpi_type(w->wire), &got);
    return got == want;
}

/* Post the current step's messages. */
static int post(em_dist_work *w) {
    em_dist_group *g = w->g;
    int n = g->size, r = g->rank, rc = MPI_SUCCESS;
    size_t es = wire_size(w->wire);
    MPI_Datatype ty = em__dist_mpi_type(w->wire);
    char *buf = em_data_ptr(w->rbuf), *tmp = w->ar_tmp;
    w->ar_nreq = 0;
    w->ar_nrecv = 0;
    if (w->ar_algo == AR_DIRECT) {
        /* receives first (slot i: peer i, this rank skipped; piece by piece), then sends */
        int64_t lo, hi, k = w->ar_pieces;
        for (int i = 0; i < n - 1 && rc == MPI_SUCCESS; i++)
            for (int64_t j = 0; j < k && rc == MPI_SUCCESS; j++) {
                int p = i < r ? i : i + 1;
                seg_range(w->count, k, j, &lo, &hi);
                w->ar_peer[w->ar_nreq] = p;
                rc = MPI_Irecv(tmp + ((size_t)i * (size_t)w->count + (size_t)lo) * es, (int)(hi - lo), ty, p, w->ar_tag, g->comm,
                               &w->ar_req[w->ar_nreq++]);
            }
        w->ar_nrecv = w->ar_nreq;
        for (int i = 0; i < n - 1 && rc == MPI_SUCCESS; i++)
            for (int64_t j = 0; j < k && rc == MPI_SUCCESS; j++) {
                int p = (r + 1 + i) % n; /* staggered: not every rank sends to rank 0 first */
                seg_range(w->count, k, j, &lo, &hi);
                w->ar_peer[w->ar_nreq] = p;
                rc = MPI_Isend(buf + (size_t)lo * es, (int)(hi - lo), ty, p, w->ar_tag, g->comm, &w->ar_req[w->ar_nreq++]);
            }
        return rc;
    }
    int right = (r + 1) % n, left = mod(r - 1, n), s = w->ar_step;
    bool scatter = s < n - 1;
    /* reduce-scatter step s: chunk r-s out, chunk r-s-1 in (into tmp, then reduced);
     * all-gather step s: chunk r+1-s out, chunk r-s in (straight into the buffer) */
    int out = scatter ? mod(r - s, n) : mod(r + 1 - (s - (n - 1)), n);
    int in = scatter ? mod(r - s - 1, n) : mod(r - (s - (n - 1)), n);
    w->ar_in_chunk = in;
    w->ar_out_chunk = out;
    if (scatter) {
        /* slots 0..W-1 receive, W..2W-1 send; window() posts into them */
        for (int i = 0; i < 2 * AR_WINDOW; i++) {
            w->ar_req[i] = MPI_REQUEST_NULL;
            w->ar_peer[i] = i < AR_WINDOW ? left : right;
        }
        w->ar_nrecv = AR_WINDOW;
        w->ar_nreq = 2 * AR_WINDOW;
        w->ar_rpost = w->ar_rdone = w->ar_spost = w->ar_sdone = 0;
        w->ar_rseg = nsegs(chunk_len(w, in) * (int64_t)es);
        w->ar_sseg = nsegs(chunk_len(w, out) * (int64_t)es);
        return MPI_SUCCESS;
    }
    w->ar_peer[0] = left;
    rc = MPI_Irecv(buf + (size_t)chunk_off(w, in) * es, (int)chunk_len(w, in), ty, left, w->ar_tag, g->comm, &w->ar_req[0]);
    w->ar_peer[1] = right;
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(buf + (size_t)chunk_off(w, out) * es, (int)chunk_len(w, out), ty, right, w->ar_tag, g->comm, &w->ar_req[1]);
    w->ar_nrecv = 1;
    w->ar_nreq = rc == MPI_SUCCESS ? 2 : 1;
    return rc;
}

/* A ring reduce step: keep AR_WINDOW segments in flight each way; reduce the received ones
 * in order (once the headers have matched). 1: the step is done, 0: not yet, -1: error. */
static int scatter_step(em_dist_work *w, bool headers_ok, int *mpi_rc, const char **call) {
    em_dist_group *g = w->g;
    size_t es = wire_size(w->wire);
    MPI_Datatype ty = em__dist_mpi_type(w->wire);
    char *buf = em_data_ptr(w->rbuf);
    int64_t in_len = chunk_len(w, w->ar_in_chunk), out_len = chunk_len(w, w->ar_out_chunk);
    int64_t slot = seg_slot(w);
    int64_t lo, hi;
    int rc, flag;
    for (;;) {
        bool moved = false;
        while (w->ar_spost < w->ar_sseg && w->ar_spost - w->ar_sdone < AR_WINDOW) {
            seg_range(out_len, w->ar_sseg, w->ar_spost, &lo, &hi);
            rc = MPI_Isend(buf + (size_t)(chunk_off(w, w->ar_out_chunk) + lo) * es, (int)(hi - lo), ty, (g->rank + 1) % g->size,
                           w->ar_tag, g->comm, &w->ar_req[AR_WINDOW + w->ar_spost % AR_WINDOW]);
            if (rc != MPI_SUCCESS) return fail_with(rc, "MPI_Isend (data)", mpi_rc, call);
            w->ar_spost++;
        }
        while (w->ar_rpost < w->ar_rseg && w->ar_rpost - w->ar_rdone < AR_WINDOW) {
            seg_range(in_len, w->ar_rseg, w->ar_rpost, &lo, &hi);
            rc = MPI_Irecv((char *)w->ar_tmp + (size_t)(w->ar_rpost % AR_WINDOW) * (size_t)slot, (int)(hi - lo), ty,
                           mod(g->rank - 1, g->size), w->ar_tag, g->comm, &w->ar_req[w->ar_rpost % AR_WINDOW]);
            if (rc != MPI_SUCCESS) return fail_with(rc, "MPI_Irecv (data)", mpi_rc, call);
            w->ar_rpost++;
        }
        while (w->ar_sdone < w->ar_spost) {
            if ((rc = MPI_Test(&w->ar_req[AR_WINDOW + w->ar_sdone % AR_WINDOW], &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return fail_with(rc, "MPI_Test (data)", mpi_rc, call);
            if (!flag) break;
            w->ar_sdone++;
            moved = true;
        }
        while (headers_ok && w->ar_rdone < w->ar_rpost) {
            int64_t k = w->ar_rdone;
            MPI_Status st;
            if ((rc = MPI_Test(&w->ar_req[k % AR_WINDOW], &flag, &st)) != MPI_SUCCESS)
                return fail_with(rc, "MPI_Test (data)", mpi_rc, call);
            if (!flag) break;
            seg_range(in_len, w->ar_rseg, k, &lo, &hi);
            if (!right_count(w, &st, hi - lo))
                return fail_with(MPI_ERR_TRUNCATE, "MPI_Test (data: a message of another size)", mpi_rc, call);
            /* the chunk's running reduction comes from the left: acc = left op mine */
            reduce(buf + (size_t)(chunk_off(w, w->ar_in_chunk) + lo) * es, (char *)w->ar_tmp + (size_t)(k % AR_WINDOW) * (size_t)slot,
                   hi - lo, w->wire, w->op, true);
            w->ar_rdone++;
            moved = true;
        }
        if (moved) w->ar_moves++;
        if (w->ar_rdone == w->ar_rseg && w->ar_sdone == w->ar_sseg) return 1;
        if (!moved) break;
    }
    return 0;
}

/* The direct algorithm's reduction, in rank order: x0 op x1 op ... op x(n-1). */
static void direct_reduce(em_dist_work *w) {
    int n = w->g->size, r = w->g->rank;
    size_t bytes = (size_t)w->count * wire_size(w->wire);
    char *buf = em_data_ptr(w->rbuf), *tmp = w->ar_tmp;
    /* ranks before this one accumulate in slot 0 (rank 0's), then this rank's buffer takes
     * it from the left, then the later ranks come in from the right */
    for (int p = 1; p < r; p++) reduce(tmp, tmp + (size_t)p * bytes, w->count, w->wire, w->op, false);
    if (r > 0) reduce(buf, tmp, w->count, w->wire, w->op, true);
    for (int p = r + 1; p < n; p++) reduce(buf, tmp + (size_t)(p - 1) * bytes, w->count, w->wire, w->op, false);
}

int em__ar_progress(em_dist_work *w, bool headers_ok, int *mpi_rc, const char **call) {
    int n = w->g->size;
    while (w->ar_step < w->ar_nsteps) {
        if (!w->ar_posted) {
            int rc = post(w);
            w->ar_posted = true; /* even on failure: what was posted is MPI's */
            w->ar_step_done = false;
            if (rc != MPI_SUCCESS) return fail_with(rc, "MPI_Isend/MPI_Irecv (data)", mpi_rc, call);
        }
        int flag = 0, rc;
        if (w->ar_algo == AR_RING && w->ar_step < n - 1) {
            int d = scatter_step(w, headers_ok, mpi_rc, call);
            if (d <= 0) return d;
        } else {
            if (!w->ar_step_done) {
                /* Testall completes all of them at once or none: the counts are read now */
                MPI_Status sts[AR_MAX_REQ];
                if ((rc = MPI_Testall(w->ar_nreq, w->ar_req, &flag, sts)) != MPI_SUCCESS)
                    return fail_with(rc, "MPI_Testall (data)", mpi_rc, call);
                if (!flag) return 0;
                w->ar_step_done = true;
                w->ar_count_ok = true;
                for (int i = 0; i < w->ar_nrecv; i++) {
                    int64_t lo = 0, hi = chunk_len(w, w->ar_in_chunk);
                    if (w->ar_algo == AR_DIRECT) seg_range(w->count, w->ar_pieces, i % w->ar_pieces, &lo, &hi);
                    if (!right_count(w, &sts[i], hi - lo)) w->ar_count_ok = false;
                }
            }
            if (!headers_ok) return 0; /* a differing header explains a wrong count best */
            if (!w->ar_count_ok)
                return fail_with(MPI_ERR_TRUNCATE, "MPI_Testall (data: a message of another size)", mpi_rc, call);
            if (w->ar_algo == AR_DIRECT) direct_reduce(w);
        }
        w->ar_step++;
        w->ar_moves++;
        w->ar_posted = false;
    }
    return 1;
}

void em__ar_release(em_dist_work *w) {
    em_dist_group *g = w->g;
    if (!w->ar_tmp) return;
    if (!g->ar_spare || g->ar_spare_size < w->ar_tmp_size) { /* keep the larger one */
        free(g->ar_spare);
        g->ar_spare = w->ar_tmp;
        g->ar_spare_size = w->ar_tmp_size;
    } else {
        free(w->ar_tmp);
    }
    w->ar_tmp = NULL;
}

/* The peers this rank still waits on (a receive not arrived, or a send not taken), as "2"
 * or "0, 2"; how many. */
int em__ar_waiting_for(const em_dist_work *w, char *buf, size_t size) {
    int n = 0;
    size_t used = 0;
    buf[0] = '\0';
    if (w->ar_algo == AR_MPI || !w->ar_posted || w->ar_step >= w->ar_nsteps) return 0;
    for (int pass = 0; pass < 2 && n == 0; pass++) /* receives first: a send waits on them too */
        for (int i = pass ? w->ar_nrecv : 0; i < (pass ? w->ar_nreq : w->ar_nrecv); i++) {
            if (w->ar_req[i] == MPI_REQUEST_NULL) continue;
            int p = w->ar_peer[i];
            bool dup = false;
            for (int j = 0; j < i; j++)
                if (w->ar_req[j] != MPI_REQUEST_NULL && w->ar_peer[j] == p && (j < w->ar_nrecv) == (i < w->ar_nrecv)) dup = true;
            if (dup) continue;
            if (used + 16 < size) used += (size_t)snprintf(buf + used, size - used, "%s%d", n ? ", " : "", p);
            n++;
        }
    return n;
}

#endif
