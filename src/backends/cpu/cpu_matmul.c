/* Batched matmul. f32/f64 go to OpenBLAS (sgemm/dgemm; in a build without it, cpu_gemm.c's
 * GEMM) on the operands' own memory when each matrix is row- or column-major (strides say
 * which), else through a contiguous copy; a weight broadcast over the batch folds the batch
 * into M (one big GEMM); large GEMMs are split across Ember's sleeping thread pool while
 * OpenBLAS itself runs single-threaded (its own idle threads spin); large f32 products go to
 * oneDNN's sgemm instead where it is faster (cpu_sgemm_dnnl.c). bf16 products of a few rows
 * with a transposed weight (decoding's) go to Ember's GEMV (cpu_gemv.c); bf16 goes to Ember's AMX
 * kernel where the CPU has AMX (cpu_amx.c), f16/bf16 otherwise to oneDNN (cpu_dnnl.c: AMX /
 * AVX512-BF16, float32 accumulation), with the same layouts and batch folding, or, where
 * neither has a fast kernel, are converted to f32 and run as f32 (the portable path);
 * integers use int64 wrapping sums. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "cpu_amx.h"
#include "cpu_dnnl.h"
#include "cpu_gemm.h"
#include "cpu_gemv.h"
#include "cpu_internal.h"
#include "cpu_sgemm_dnnl.h"
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif

#define GEMM_GRAIN_MACS 2000000 /* multiply-adds per thread chunk */

static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
#ifdef EMBER_HAVE_BLAS
#include <dlfcn.h>
static void blas_single_thread(void) {
    openblas_set_num_threads(1);
    /* OpenBLAS's pthreads build starts its workers when it loads, and an idle worker spins on
     * sched_yield for 2^28 cycles before it sleeps: a second core busy for the first ~0.1 s of
     * every program (seen as twice the CPU time of a one-thread bench_amp_matmul run). Ember
     * never gives them work, so they stop here, as OpenBLAS's own fork handler stops them;
     * OpenBLAS starts them again itself if a caller later asks it for threads. OpenMP builds
     * have no such function: nothing to do. */
    void (*shutdown)(void);
    *(void **)&shutdown = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
    if (shutdown) shutdown();
}
#else
static void blas_single_thread(void) { (void)em__cpu_gemm_isa(); } /* picks the instruction set once */
#endif

void em__cpu_blas_init(void) { pthread_once(&g_blas_once, blas_single_thread); }

/* A contiguous temporary over malloc'd memory (never registered anywhere). */
typedef em_cpu_tmp tmp_tensor;
static em_status tmp_make(tmp_tensor *x, em_dtype dt, int nd, const int64_t *shape) {
    return em__cpu_tmp_make(x, dt, nd, shape, "matmul");
}
static void tmp_free(tmp_tensor *x) { em__cpu_tmp_free(x); }

/* How a matrix (rows x cols, element strides sr, sc) sits in memory for BLAS:
 * 0 row-major, 1 column-major (a transposed row-major), -1 neither; *ld its leading dim. */
static int mat_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, int64_t *ld) {
    if ((cols == 1 || sc == 1) && (rows == 1 || sr >= (cols > 1 ? cols : 1))) {
        *ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
        return *ld <= INT_MAX ? 0 : -1;
    }
    if ((rows == 1 || sr == 1) && (cols == 1 || sc >= (rows > 1 ? rows : 1))) {
        *ld = cols == 1 ? (rows > 1 ? rows : 1) : sc;
        return *ld <= INT_MAX ? 1 : -1;
    }
    return -1;
}

/* One GEMM problem: Z (P x Q, row-major, ldz) = X (P x K) * Y (K x Q). */
typedef struct gemm {
    bool dbl;
    int64_t P, Q, K;
    const char *x, *y;
    char *z;
    bool xt, yt;          /* stored column-major */
    int64_t ldx, ldy, ldz;
    bool split_rows;      /* parallel chunks over P (else over Q) */
    bool acc;             /* Z += X * Y (BLAS beta = 1) */
} gemm;

static void gemm_run(const gemm *g, int64_t p0, int64_t p1, int64_t q0, int64_t q1) {
    size_t es = g->dbl ? 8 : 4;
    const char *x = g->x + (size_t)(p0 * (g->xt ? 1 : g->ldx)) * es;
    const char *y = g->y + (size_t)(q0 * (g->yt ? g->ldy : 1)) * es;
    char *z = g->z + (size_t)(p0 * g->ldz + q0) * es;
#ifndef EMBER_HAVE_BLAS /* the built-in GEMM (cpu_gemm.c), given element strides */
    int64_t rsx = g->xt ? 1 : g->ldx, csx = g->xt ? g->ldx : 1, rsy = g->yt ? 1 : g->ldy, csy = g->yt ? g->ldy : 1;
    int64_t P = p1 - p0, Q = q1 - q0; /* no beta here: em__cpu_matmul_acc adds a product instead */
    if (g->dbl)
        em__cpu_gemm_f64(P, Q, g->K, (const double *)x, rsx, csx, (const double *)y, rsy, csy, (double *)z, g->ldz);
    else
        em__cpu_gemm_f32(P, Q, g->K, (const float *)x, rsx, csx, (const float *)y, rsy, csy, (float *)z, g->ldz);
#else
    /* oneDNN where it beats OpenBLAS (cpu_sgemm_dnnl.c decides per shape) */
    if (!g->dbl && em__cpu_sgemm_dnnl(g->xt, g->yt, p1 - p0, q1 - q0, g->K, (const float *)x, g->ldx, (const float *)y,
                                      g->ldy, g->acc ? 1.0f : 0.0f, (float *)z, g->ldz))
        return;
    CBLAS_TRANSPOSE tx = g->xt ? CblasTrans : CblasNoTrans, ty = g->yt ? CblasTrans : CblasNoTrans;
    if (g->dbl)
        cblas_dgemm(CblasRowMajor, tx, ty, (int)(p1 - p0), (int)(q1 - q0), (int)g->K, 1.0, (const double *)x,
                    (int)g->ldx, (const double *)y, (int)g->ldy, g->acc ? 1.0 : 0.0, (double *)z, (int)g->ldz);
    else
        cblas_sgemm(CblasRowMajor, tx, ty, (int)(p1 - p0), (int)(q1 - q0), (int)g->K, 1.0f, (const float *)x,
                    (int)g->ldx, (const float *)y, (int)g->ldy, g->acc ? 1.0f : 0.0f, (float *)z, (int)g->ldz);
#endif
}

static void gemm_chunk(void *arg, int64_t begin, int64_t end) {
    const gemm *g = arg;
    if (g->split_rows) gemm_run(g, begin, end, 0, g->Q);
    else gemm_run(g, 0, g->P, begin, end);
}

static void gemm_parallel(gemm *g) {
    int64_t macs = g->P * g->Q * g->K;
    g->split_rows = g->P >= g->Q;
    int64_t len = g->split_rows ? g->P : g->Q, per = macs / (len > 0 ? len : 1);
    int64_t grain = GEMM_GRAIN_MACS / (per > 0 ? per : 1) + 1;
    if (grain < 16) grain = 16; /* keep BLAS blocks efficient */
    /* one chunk per thread: every chunk repacks the other operand, so more chunks than
     * threads cost packing without balancing anything (GEMM chunks take equal time) */
    int threads = em__cpu_num_threads();
    int64_t even = threads > 1 ? (len + threads - 1) / threads : len;
    if (grain < even) grain = even;
    em__cpu_parallel_for(len, grain, gemm_chunk, g);
}

/* ---- batches ---- */
typedef struct bmm {
    int nb;                                   /* batch dims */
    int64_t bshape[EM_MAX_DIMS], nbatch;
    const em_tensor *a, *b;
    em_tensor *out;
    int64_t M, N, K;
} bmm;

static int64_t batch_offset(const bmm *m, const em_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = m->nb - 1; d >= 0; d--) {
        off += (i % m->bshape[d]) * t->strides[d];
        i /= m->bshape[d];
    }
    return off;
}

/* Do t's batch dims continue its row dim contiguously (rows of all batches evenly spaced)? */
static bool batch_folds_into_rows(const bmm *m, const em_tensor *t, int64_t rows, int64_t ld) {
    int64_t expect = rows * ld;
    for (int d = m->nb - 1; d >= 0; d--) {
        if (m->bshape[d] == 1) continue;
        if (t->strides[d] != expect) return false;
        expect *= m->bshape[d];
    }
    return true;
}

static bool batch_broadcast(const bmm *m, const em_tensor *t) {
    for (int d = 0; d < m->nb; d++)
        if (m->bshape[d] != 1 && t->strides[d] != 0) return false;
    return true;
}

typedef struct batch_job { const bmm *m; int la, lb, lo; int64_t lda, ldb, ldo; bool dbl; atomic_int lowp_status; } batch_job;

static gemm batch_gemm(const batch_job *j, int64_t i) {
    const bmm *m = j->m;
    size_t es = em_dtype_size(m->out->dtype);
    const char *pa = (const char *)m->a->storage->block.handle + m->a->storage->block.offset + batch_offset(m, m->a, i) * es;
    const char *pb = (const char *)m->b->storage->block.handle + m->b->storage->block.offset + batch_offset(m, m->b, i) * es;
    char *po = (char *)m->out->storage->block.handle + m->out->storage->block.offset + batch_offset(m, m->out, i) * es;
    gemm g = {j->dbl, m->M, m->N, m->K, pa, pb, po, j->la == 1, j->lb == 1, j->lda, j->ldb, j->ldo, true, false};
    if (j->lo == 1) { /* column-major out: Out^T = B^T A^T */
        g = (gemm){j->dbl, m->N, m->M, m->K, pb, pa, po, j->lb != 1, j->la != 1, j->ldb, j->lda, j->ldo, true, false};
    }
    return g;
}

static void batch_chunk(void *arg, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
        gemm g = batch_gemm(arg, i);
        gemm_run(&g, 0, g.P, 0, g.Q);
    }
}

/* The batch as one oneDNN primitive: batch_gemm's problem for batch 0, and each operand's
 * stride over every batch dim (0 where it is broadcast). */
static em_status dnnl_batch(const batch_job *j) {
    const bmm *m = j->m;
    gemm g = batch_gemm(j, 0);
    bool swap = j->lo == 1; /* batch_gemm computes Out^T = B^T A^T: x is b */
    const em_tensor *tx = swap ? m->b : m->a, *ty = swap ? m->a : m->b;
    em_dnnl_batch b = {.nb = m->nb};
    for (int d = 0; d < m->nb; d++) {
        b.bshape[d] = m->bshape[d];
        b.bsx[d] = tx->shape[d] == 1 ? 0 : tx->strides[d];
        b.bsy[d] = ty->shape[d] == 1 ? 0 : ty->strides[d];
        b.bsz[d] = m->out->strides[d];
    }
    em_lowp_gemm l = {EM_F32, g.P, g.Q, g.K, g.x, g.y, g.z, g.xt, g.yt, g.ldx, g.ldy, g.ldz, false, NULL, false};
    return em__cpu_dnnl_sgemm_batch(&l, &b);
}

/* f32 / f64 with a, b, out each row- or column-major per matrix. */
static void blas_matmul(const bmm *m, bool dbl, int la, int64_t lda, int lb, int64_t ldb, int lo, int64_t ldo) {
    batch_job j = {m, la, lb, lo, lda, ldb, ldo, dbl, 0};
    if (m->nbatch == 1) {
        gemm g = batch_gemm(&j, 0);
        gemm_parallel(&g);
        return;
    }
    /* weight shared by every batch, inputs and outputs stacked: one GEMM of nbatch*M rows */
    if (la == 0 && lo == 0 && batch_broadcast(m, m->b) && batch_folds_into_rows(m, m->a, m->M, lda) &&
        batch_folds_into_rows(m, m->out, m->M, ldo) && m->nbatch * m->M <= INT_MAX) {
        gemm g = batch_gemm(&j, 0);
        g.P = m->nbatch * m->M;
        gemm_parallel(&g);
        return;
    }
    int64_t per = m->M * m->N * m->K;
    /* many small f32 matrices (the attention's): one oneDNN batched primitive instead of a
     * BLAS call per matrix (EMBER_CPU_BATCHED_GEMM=blas keeps the per-matrix calls) */
    if (!dbl && per < 4 * GEMM_GRAIN_MACS && m->nb <= EM_DNNL_MAX_BATCH && dnnl_batch(&j) == EM_OK) return;
    if (per >= 4 * GEMM_GRAIN_MACS) { /* big matrices: parallel inside each */
        for (int64_t i = 0; i < m->nbatch; i++) {
            gemm g = batch_gemm(&j, i);
            gemm_parallel(&g);
        }
    } else {
        em__cpu_parallel_for(m->nbatch, GEMM_GRAIN_MACS / (per + 1) + 1, batch_chunk, &j);
    }
}

/* ---- bf16/f16 on Ember's AMX kernel or oneDNN: the layouts and batch folding of blas_matmul ---- */

/* A fast bf16/f16 kernel here for some shapes: Ember's GEMV (bf16, a few rows), Ember's AMX
 * kernel (bf16), oneDNN's. A shape none of them takes comes back EM_ERR_NOT_SUPPORTED from
 * lowp_gemm, and the caller converts to float32. */
static bool lowp_runs(em_dtype dt) {
    return (dt == EM_BF16 && em__cpu_gemv_isa()) || em__cpu_amx_runs(dt) || em__cpu_dnnl_runs(dt);
}

/* ---- bf16/f16 where no such kernel runs (AVX2, plain AVX-512): float32 GEMMs over panels ----
 * Z = X Y in panels of Y's columns: each task converts its panel of Y (rows of a Linear's
 * weight) into a float32 buffer of at most PANEL_BYTES, which stays in cache, multiplies it
 * with a float32 copy of X made once, and writes its columns of Z, rounded once (under acc
 * the sum with Z's old value, as oneDNN's sum post-op). Converting the whole weight instead
 * wrote twice its bytes as float32 into fresh pages on every call: a 1B Llama's prefill on an
 * AVX2 EPYC spent two thirds of its time in that cast and its page faults. */
#define PANEL_BYTES (4 << 20)
typedef struct panel_job {
    const em_lowp_gemm *g;
    float *xf;          /* X in float32, X's own orientation, leading dimension ldxf */
    int64_t ldxf, width; /* panel width (columns of Y) */
    atomic_int oom;
} panel_job;

static void panel_x_rows(void *arg, int64_t begin, int64_t end) {
    panel_job *j = arg;
    const em_lowp_gemm *g = j->g;
    size_t es = em_dtype_size(g->dtype);
    int64_t len = g->xt ? g->P : g->K; /* X stored as rows of len elements (of its transpose when xt) */
    for (int64_t r = begin; r < end; r++)
        em__cpu_cast_block((char *)(j->xf + r * j->ldxf), 4, EM_F32, (const char *)g->x + (size_t)(r * g->ldx) * es,
                           (int64_t)es, g->dtype, len);
}

static void panel_chunk(void *arg, int64_t begin, int64_t end) {
    panel_job *j = arg;
    const em_lowp_gemm *g = j->g;
    size_t es = em_dtype_size(g->dtype);
    int64_t P = g->P, K = g->K, w = j->width, q_end = end * w < g->Q ? end * w : g->Q;
    float *yb = malloc(sizeof(float) * (size_t)(K * w)), *zb = g->z_f32 ? NULL : malloc(sizeof(float) * (size_t)(P * w));
    float *old = g->acc && !g->z_f32 ? malloc(sizeof(float) * (size_t)w) : NULL;
    if (!yb || (!g->z_f32 && !zb) || (g->acc && !g->z_f32 && !old)) {
        atomic_store(&j->oom, 1);
        free(yb), free(zb), free(old);
        return;
    }
    for (int64_t q0 = begin * w; q0 < q_end; q0 += w) {
        int64_t n = q_end - q0 < w ? q_end - q0 : w;
        if (g->yt) /* Y's columns are rows of the stored transpose: [n, K] */
            for (int64_t q = 0; q < n; q++)
                em__cpu_cast_block((char *)(yb + q * K), 4, EM_F32, (const char *)g->y + (size_t)((q0 + q) * g->ldy) * es,
                                   (int64_t)es, g->dtype, K);
        else /* a block of Y's rows: [K, n] */
            for (int64_t k = 0; k < K; k++)
                em__cpu_cast_block((char *)(yb + k * n), 4, EM_F32, (const char *)g->y + (size_t)(k * g->ldy + q0) * es,
                                   (int64_t)es, g->dtype, n);
        gemm f = {.P = P, .Q = n, .K = K, .x = (const char *)j->xf, .y = (const char *)yb, .xt = g->xt, .yt = g->yt,
                  .ldx = j->ldxf, .ldy = g->yt ? K : n};
        if (g->z_f32) {
            f.z = (char *)g->z + (size_t)q0 * 4;
            f.ldz = g->ldz;
            f.acc = g->acc;
        } else {
            f.z = (char *)zb;
            f.ldz = n;
        }
        gemm_run(&f, 0, P, 0, n);
        for (int64_t p = 0; !g->z_f32 && p < P; p++) {
            char *zr = (char *)g->z + (size_t)(p * g->ldz + q0) * es;
            float *row = zb + p * n;
            if (g->acc) {
                em__cpu_cast_block((char *)old, 4, EM_F32, zr, (int64_t)es, g->dtype, n);
                for (int64_t q = 0; q < n; q++) row[q] += old[q];
            }
            em__cpu_cast_block(zr, (int64_t)es, g->dtype, (const char *)row, 4, EM_F32, n);
        }
    }
    free(yb), free(zb), free(old);
}

static em_status panel_gemm(const em_lowp_gemm *g) {
    if (g->bias || (g->dtype != EM_BF16 && g->dtype != EM_F16)) return EM_ERR_NOT_SUPPORTED;
    em__cpu_blas_init();
    int64_t rows = g->xt ? g->K : g->P, len = g->xt ? g->P : g->K;
    int64_t width = PANEL_BYTES / 4 / (g->K > 0 ? g->K : 1);
    width = width < 16 ? 16 : width > 1024 ? 1024 : width & ~(int64_t)15;
    if (width > g->Q) width = g->Q;
    panel_job j = {g, malloc(sizeof(float) * (size_t)(rows * len + 1)), len, width, 0};
    if (!j.xf)
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: matmul: failed to allocate %lld bytes of float32 scratch",
                        (long long)(sizeof(float) * (size_t)(rows * len)));
    em__cpu_parallel_for(rows, 1 + (1 << 16) / (len + 1), panel_x_rows, &j);
    int64_t panels = (g->Q + width - 1) / width, threads = em__cpu_num_threads();
    int64_t grain = GEMM_GRAIN_MACS / (g->P * width * g->K + 1) + 1; /* small products on one thread */
    if (grain < panels / threads) grain = panels / threads;            /* else a run of panels a thread */
    em__cpu_parallel_for(panels, grain, panel_chunk, &j);
    free(j.xf);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: matmul: failed to allocate a float32 panel of %lld bytes",
                        (long long)(sizeof(float) * (size_t)(g->K * width)));
    return EM_OK;
}

/* Decoding's few-row products go to the GEMV, which streams the weight once (the GEMMs pack
 * it first); the rest to the AMX kernel, else oneDNN, else float32 GEMMs over panels. */
static em_status lowp_gemm(const em_lowp_gemm *g) {
    em_status st = em__cpu_gemv(g);
    if (st == EM_ERR_NOT_SUPPORTED) st = em__cpu_amx_gemm(g);
    if (st == EM_ERR_NOT_SUPPORTED) st = em__cpu_dnnl_gemm(g);
    return st == EM_ERR_NOT_SUPPORTED ? panel_gemm(g) : st;
}

static em_lowp_gemm lowp_of(const gemm *g, em_dtype dt, bool acc) {
    return (em_lowp_gemm){dt, g->P, g->Q, g->K, g->x, g->y, g->z, g->xt, g->yt, g->ldx, g->ldy, g->ldz, acc, NULL, false};
}

/* batches 1 + [begin, end): the first ran on the calling thread */
static void lowp_batch_chunk_from1(void *arg, int64_t begin, int64_t end) {
    batch_job *j = arg;
    for (int64_t i = begin + 1; i < end + 1; i++) {
        gemm g = batch_gemm(j, i);
        em_lowp_gemm l = lowp_of(&g, j->m->out->dtype, false);
        em_error_state saved; /* a worker's own error state stays clean: the caller reports */
        em__error_save(&saved);
        em_status st = lowp_gemm(&l);
        em__error_restore(&saved);
        if (st != EM_OK) atomic_store(&j->lowp_status, (int)st);
    }
}

/* EM_ERR_NOT_SUPPORTED (nothing recorded, out untouched or to be overwritten): use f32. */
static em_status lowp_matmul(const bmm *m, int la, int64_t lda, int lb, int64_t ldb, int lo, int64_t ldo) {
    em_dtype dt = m->out->dtype;
    batch_job j = {m, la, lb, lo, lda, ldb, ldo, false, 0};
    gemm g = batch_gemm(&j, 0);
    if (m->nbatch > 1 && la == 0 && lo == 0 && batch_broadcast(m, m->b) && batch_folds_into_rows(m, m->a, m->M, lda) &&
        batch_folds_into_rows(m, m->out, m->M, ldo))
        g.P = m->nbatch * m->M; /* a shared weight: one GEMM of nbatch*M rows */
    else if (m->nbatch > 1) {
        /* the first matrix on the calling thread: a refusal (no kernel) comes before any work
         * on other threads, and f32 then overwrites every output */
        em_lowp_gemm l = lowp_of(&g, dt, false);
        em_status st = lowp_gemm(&l);
        if (st != EM_OK) return st;
        int64_t per = m->M * m->N * m->K;
        if (per >= 4 * GEMM_GRAIN_MACS) {
            for (int64_t i = 1; i < m->nbatch && st == EM_OK; i++) {
                g = batch_gemm(&j, i);
                l = lowp_of(&g, dt, false);
                st = lowp_gemm(&l);
            }
            return st;
        }
        /* small matrices: one per thread at a time (each runs single-threaded in oneDNN) */
        em__cpu_parallel_for(m->nbatch - 1, GEMM_GRAIN_MACS / (per + 1) + 1, lowp_batch_chunk_from1, &j);
        st = (em_status)atomic_load(&j.lowp_status);
        return st == EM_OK ? EM_OK
               : st == EM_ERR_NOT_SUPPORTED ? em_error(EM_ERR_BACKEND, "cpu: %s matmul: oneDNN refused a batch matrix it "
                                                       "ran before", em_dtype_name(dt))
                                            : em_error(st, "cpu: %s matmul: oneDNN failed on a batch matrix",
                                                       em_dtype_name(dt));
    }
    em_lowp_gemm l = lowp_of(&g, dt, false);
    return lowp_gemm(&l);
}

/* ---- integers: int64 wrapping sums, i-k-j order over converted rows ---- */
typedef struct int_job { const bmm *m; atomic_bool oom; } int_job;

static void int_chunk(void *arg, int64_t begin, int64_t end) {
    int_job *job = arg;
    const bmm *m = job->m;
    int64_t M = m->M, N = m->N, K = m->K, nd = m->out->ndim;
    uint64_t *bm = malloc(sizeof(uint64_t) * (size_t)(K * N + K + N + 1));
    if (!bm) {
        atomic_store(&job->oom, true);
        return;
    }
    uint64_t *arow = bm + K * N, *acc = arow + K;
    const em_tensor *a = m->a, *b = m->b;
    em_tensor *out = m->out;
    size_t ea = em_dtype_size(a->dtype), eo = em_dtype_size(out->dtype);
    for (int64_t i = begin; i < end; i++) {
        const char *pa = (const char *)a->storage->block.handle + a->storage->block.offset + batch_offset(m, a, i) * (int64_t)ea;
        const char *pb = (const char *)b->storage->block.handle + b->storage->block.offset + batch_offset(m, b, i) * (int64_t)ea;
        char *po = (char *)out->storage->block.handle + out->storage->block.offset + batch_offset(m, out, i) * (int64_t)eo;
        for (int64_t k = 0; k < K; k++)
            em__cpu_cast_block((char *)(bm + k * N), 8, EM_I64, pb + k * b->strides[nd - 2] * (int64_t)ea,
                               b->strides[nd - 1] * (int64_t)ea, b->dtype, N);
        for (int64_t r = 0; r < M; r++) {
            em__cpu_cast_block((char *)arow, 8, EM_I64, pa + r * a->strides[nd - 2] * (int64_t)ea,
                               a->strides[nd - 1] * (int64_t)ea, a->dtype, K);
            for (int64_t c = 0; c < N; c++) acc[c] = 0;
            for (int64_t k = 0; k < K; k++) {
                uint64_t av = arow[k];
                const uint64_t *brow = bm + k * N;
                for (int64_t c = 0; c < N; c++) acc[c] += av * brow[c];
            }
            em__cpu_cast_block(po + r * out->strides[nd - 2] * (int64_t)eo, out->strides[nd - 1] * (int64_t)eo,
                               out->dtype, (const char *)acc, 8, EM_I64, N);
        }
    }
    free(bm);
}

/* Contiguous f32 copies of a, b (any dtype) and a f32 out, then cast back. */
static em_status via_f32(const bmm *m, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    tmp_tensor ta, tb, to;
    int nd = out->ndim;
    int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) { sa[d] = d < nd - 2 ? m->bshape[d] : a->shape[d]; sb[d] = d < nd - 2 ? m->bshape[d] : b->shape[d]; }
    em_status st = tmp_make(&ta, EM_F32, nd, sa);
    if (st) return st;
    if ((st = tmp_make(&tb, EM_F32, nd, sb))) { tmp_free(&ta); return st; }
    if ((st = tmp_make(&to, EM_F32, nd, out->shape))) { tmp_free(&ta); tmp_free(&tb); return st; }
    em__cpu_copy(&ta.t, a);
    em__cpu_copy(&tb.t, b);
    st = em__cpu_matmul(&to.t, &ta.t, &tb.t);
    if (st == EM_OK) em__cpu_copy(out, &to.t);
    tmp_free(&ta);
    tmp_free(&tb);
    tmp_free(&to);
    return st;
}

em_status em__cpu_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    int nd = out->ndim;
    if (nd < 2 || a->ndim != nd || b->ndim != nd || a->dtype != b->dtype || a->dtype != out->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: matmul expects three tensors of one dtype and rank >= 2");
    bmm m = {.nb = nd - 2, .nbatch = 1, .a = a, .b = b, .out = out,
             .M = out->shape[nd - 2], .N = out->shape[nd - 1], .K = a->shape[nd - 1]};
    for (int d = 0; d < nd - 2; d++) { m.bshape[d] = out->shape[d]; m.nbatch *= out->shape[d]; }
    if (m.nbatch == 0 || m.M == 0 || m.N == 0) return EM_OK;
    if (m.K == 0) return em__cpu_fill(out, 0);
    em_dtype dt = out->dtype;
    bool lowp = dt == EM_F16 || dt == EM_BF16;
    if (lowp && !lowp_runs(dt)) return via_f32(&m, out, a, b);
    if (!lowp && dt != EM_F32 && dt != EM_F64) {
        if (m.K * m.N + m.K + m.N + 1 > (int64_t)(SIZE_MAX / 8 / 2))
            return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: matmul: integer matrices too large");
        int_job j = {&m, false};
        em__cpu_parallel_for(m.nbatch, GEMM_GRAIN_MACS / (m.M * m.N * m.K + 1) + 1, int_chunk, &j);
        if (atomic_load(&j.oom)) return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: matmul: no memory for integer scratch");
        return EM_OK;
    }
    em__cpu_blas_init();
    if (m.M > INT_MAX || m.N > INT_MAX || m.K > INT_MAX)
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: matmul dims above %d are not supported by BLAS", INT_MAX);
    int64_t lda = 0, ldb = 0, ldo = 0;
    int la = mat_layout(m.M, m.K, a->strides[nd - 2], a->strides[nd - 1], &lda);
    int lb = mat_layout(m.K, m.N, b->strides[nd - 2], b->strides[nd - 1], &ldb);
    int lo = mat_layout(m.M, m.N, out->strides[nd - 2], out->strides[nd - 1], &ldo);
    if (lowp && la >= 0 && lb >= 0 && lo >= 0) {
        em_status st = lowp_matmul(&m, la, lda, lb, ldb, lo, ldo);
        return st == EM_ERR_NOT_SUPPORTED ? via_f32(&m, out, a, b) : st;
    }
    if (la >= 0 && lb >= 0 && lo >= 0) {
        blas_matmul(&m, dt == EM_F64, la, lda, lb, ldb, lo, ldo);
        return EM_OK;
    }
    /* some operand has an odd layout: contiguous copies of just those, then again */
    tmp_tensor ta, tb, to;
    const em_tensor *ua = a, *ub = b;
    em_tensor *uo = out;
    em_status st = EM_OK;
    bool ca = la < 0, cb = lb < 0, co = lo < 0;
    if (ca && (st = tmp_make(&ta, dt, nd, a->shape)) == EM_OK) { em__cpu_copy(&ta.t, a); ua = &ta.t; }
    if (st == EM_OK && cb && (st = tmp_make(&tb, dt, nd, b->shape)) == EM_OK) { em__cpu_copy(&tb.t, b); ub = &tb.t; }
    if (st == EM_OK && co && (st = tmp_make(&to, dt, nd, out->shape)) == EM_OK) uo = &to.t;
    if (st == EM_OK) st = em__cpu_matmul(uo, ua, ub);
    if (st == EM_OK && co) em__cpu_copy(out, uo);
    if (ca && ua != a) tmp_free(&ta);
    if (cb && ub != b) tmp_free(&tb);
    if (co && uo != out) tmp_free(&to);
    return st;
}

/* out += a @ b for bf16/f16: oneDNN's sum post-op (the bias in out is read in float32 and
 * the sum rounded once), or the f32 matmul_acc on converted copies. */
static em_status lowp_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    em_dtype dt = out->dtype;
    int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
    if (M == 0 || N == 0 || K == 0) return EM_OK;
    em_status st = EM_ERR_NOT_SUPPORTED;
    if (lowp_runs(dt) && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX) {
        tmp_tensor ta, tb;
        const em_tensor *ua = a, *ub = b;
        int64_t lda = 0, ldb = 0;
        int la = mat_layout(M, K, a->strides[0], a->strides[1], &lda);
        int lb = mat_layout(K, N, b->strides[0], b->strides[1], &ldb);
        st = EM_OK;
        if (la < 0 && (st = tmp_make(&ta, dt, 2, a->shape)) == EM_OK) {
            em__cpu_copy(&ta.t, a);
            ua = &ta.t;
            la = mat_layout(M, K, ua->strides[0], ua->strides[1], &lda);
        }
        if (st == EM_OK && lb < 0 && (st = tmp_make(&tb, dt, 2, b->shape)) == EM_OK) {
            em__cpu_copy(&tb.t, b);
            ub = &tb.t;
            lb = mat_layout(K, N, ub->strides[0], ub->strides[1], &ldb);
        }
        if (st == EM_OK) {
            size_t es = em_dtype_size(dt);
            em_lowp_gemm g = {dt, M, N, K,
                              (const char *)ua->storage->block.handle + ua->storage->block.offset + ua->offset * (int64_t)es,
                              (const char *)ub->storage->block.handle + ub->storage->block.offset + ub->offset * (int64_t)es,
                              (char *)out->storage->block.handle + out->storage->block.offset + out->offset * (int64_t)es,
                              la == 1, lb == 1, lda, ldb, N, true, NULL, false};
            st = lowp_gemm(&g);
        }
        if (ua != a) tmp_free(&ta);
        if (ub != b) tmp_free(&tb);
    }
    if (st != EM_ERR_NOT_SUPPORTED) return st;
    /* the portable path: f32 copies (F16C for f16), the f32 GEMM adding into the bias */
    tmp_tensor ta, tb, to;
    if ((st = tmp_make(&ta, EM_F32, 2, a->shape))) return st;
    if ((st = tmp_make(&tb, EM_F32, 2, b->shape))) { tmp_free(&ta); return st; }
    if ((st = tmp_make(&to, EM_F32, 2, out->shape))) { tmp_free(&ta); tmp_free(&tb); return st; }
    em__cpu_copy(&ta.t, a);
    em__cpu_copy(&tb.t, b);
    em__cpu_copy(&to.t, out);
    st = em__cpu_matmul_acc(&to.t, &ta.t, &tb.t);
    if (st == EM_OK) em__cpu_copy(out, &to.t);
    tmp_free(&ta);
    tmp_free(&tb);
    tmp_free(&to);
    return st;
}

/* out (float32) = a @ b for 2-d bf16/f16 a, b, the float32 accumulators stored as they are:
 * Ember's AMX kernel or oneDNN, else the float32 GEMM on converted copies straight into out
 * (where matmul would convert, multiply, round, and autograd widen the rounded result). */
em_status em__cpu_matmul_widen(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    em_dtype dt = a->dtype;
    if ((dt != EM_BF16 && dt != EM_F16) || b->dtype != dt || out->dtype != EM_F32 || out->ndim != 2 || a->ndim != 2 ||
        b->ndim != 2 || a->shape[1] != b->shape[0] || out->shape[0] != a->shape[0] || out->shape[1] != b->shape[1] ||
        !em__cpu_is_contiguous(out))
        return em_error(EM_ERR_INTERNAL, "cpu: matmul_widen expects 2-d bf16/f16 a, b and a contiguous float32 out");
    int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1], lda = 0, ldb = 0;
    if (M == 0 || N == 0) return EM_OK;
    if (K == 0) return em__cpu_fill(out, 0);
    int la = mat_layout(M, K, a->strides[0], a->strides[1], &lda), lb = mat_layout(K, N, b->strides[0], b->strides[1], &ldb);
    if (lowp_runs(dt) && la >= 0 && lb >= 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX) {
        em_lowp_gemm g = {dt, M, N, K, em__host_ptr(a), em__host_ptr(b), em__host_ptr(out), la == 1, lb == 1,
                          lda, ldb, N, false, NULL, true};
        em_status st = lowp_gemm(&g);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    tmp_tensor ta, tb;
    em_status st = tmp_make(&ta, EM_F32, 2, a->shape);
    if (st) return st;
    if ((st = tmp_make(&tb, EM_F32, 2, b->shape))) {
        tmp_free(&ta);
        return st;
    }
    em__cpu_copy(&ta.t, a);
    em__cpu_copy(&tb.t, b);
    st = em__cpu_matmul(out, &ta.t, &tb.t);
    tmp_free(&ta);
    tmp_free(&tb);
    return st;
}

/* out = a @ b + bias with the bias in the GEMM's epilogue: Ember's GEMV (bf16, a few rows),
 * Ember's AMX kernel (bf16, any size), else oneDNN's (big enough products: cpu_dnnl.h) */
em_status em__cpu_addmm_bias(em_tensor *out, const em_tensor *bias, const em_tensor *a, const em_tensor *b) {
    em_dtype dt = out->dtype;
    if ((dt != EM_F32 && dt != EM_BF16 && dt != EM_F16) || a->dtype != dt || b->dtype != dt || bias->dtype != dt ||
        out->ndim != 2 || a->ndim != 2 || b->ndim != 2 || bias->ndim != 1 || !em__cpu_is_contiguous(out) ||
        !em__cpu_is_contiguous(bias))
        return EM_ERR_NOT_SUPPORTED;
    int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1], lda = 0, ldb = 0;
    int la = mat_layout(M, K, a->strides[0], a->strides[1], &lda), lb = mat_layout(K, N, b->strides[0], b->strides[1], &ldb);
    if (la < 0 || lb < 0 || bias->shape[0] != N || K == 0) return EM_ERR_NOT_SUPPORTED;
    em_lowp_gemm g = {dt, M, N, K, em__host_ptr(a), em__host_ptr(b), em__host_ptr(out), la == 1, lb == 1,
                      lda, ldb, N, false, em__host_ptr(bias), false};
    em_status st = em__cpu_gemv(&g); /* a few rows of bf16 */
    if (st == EM_ERR_NOT_SUPPORTED) st = em__cpu_amx_gemm(&g); /* any size: no per-call cost to amortize */
    return st == EM_ERR_NOT_SUPPORTED ? em__cpu_dnnl_gemm_bias(&g) : st;
}

/* out += a @ b (2-d f32/f64, out contiguous): BLAS with beta = 1 on an out core pre-filled
 * with the bias, which saves the pass that zeroes C and the pass that adds the bias. */
em_status em__cpu_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    em_dtype dt = out->dtype;
    if ((dt == EM_F16 || dt == EM_BF16) && out->ndim == 2 && a->ndim == 2 && b->ndim == 2 && a->dtype == dt &&
        b->dtype == dt && em__cpu_is_contiguous(out))
        return lowp_matmul_acc(out, a, b);
    if (out->ndim != 2 || a->ndim != 2 || b->ndim != 2 || a->dtype != dt || b->dtype != dt ||
        (dt != EM_F32 && dt != EM_F64) || !em__cpu_is_contiguous(out))
        return em_error(EM_ERR_INTERNAL, "cpu: matmul_acc expects 2-d f32/f64 tensors of one dtype, out contiguous");
    int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
    if (M == 0 || N == 0 || K == 0) return EM_OK;
#ifndef EMBER_HAVE_BLAS /* the built-in GEMM has no beta: the product, then added */
    tmp_tensor tp;
    em_status sp = tmp_make(&tp, dt, 2, out->shape);
    if (sp == EM_OK) sp = em__cpu_matmul(&tp.t, a, b);
    if (sp == EM_OK) {
        char *o = (char *)out->storage->block.handle + out->storage->block.offset;
        for (int64_t i = 0; i < M * N; i++) {
            if (dt == EM_F64) ((double *)o)[out->offset + i] += ((const double *)tp.s.block.handle)[i];
            else ((float *)o)[out->offset + i] += ((const float *)tp.s.block.handle)[i];
        }
    }
    tmp_free(&tp);
    return sp;
#endif
    em__cpu_blas_init();
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: matmul dims above %d are not supported by BLAS", INT_MAX);
    tmp_tensor ta, tb;
    const em_tensor *ua = a, *ub = b;
    int64_t lda = 0, ldb = 0, ldo = 0;
    int la = mat_layout(M, K, a->strides[0], a->strides[1], &lda);
    int lb = mat_layout(K, N, b->strides[0], b->strides[1], &ldb);
    em_status st = EM_OK;
    if (la < 0) {
        if ((st = tmp_make(&ta, dt, 2, a->shape))) return st;
        em__cpu_copy(&ta.t, a);
        ua = &ta.t;
        la = mat_layout(M, K, ua->strides[0], ua->strides[1], &lda);
    }
    if (lb < 0) {
        if ((st = tmp_make(&tb, dt, 2, b->shape))) {
            if (ua != a) tmp_free(&ta);
            return st;
        }
        em__cpu_copy(&tb.t, b);
        ub = &tb.t;
        lb = mat_layout(K, N, ub->strides[0], ub->strides[1], &ldb);
    }
    int lo = mat_layout(M, N, out->strides[0], out->strides[1], &ldo);
    const char *pa = (const char *)ua->storage->block.handle + ua->storage->block.offset + ua->offset * (int64_t)em_dtype_size(dt);
    const char *pb = (const char *)ub->storage->block.handle + ub->storage->block.offset + ub->offset * (int64_t)em_dtype_size(dt);
    char *po = (char *)out->storage->block.handle + out->storage->block.offset + out->offset * (int64_t)em_dtype_size(dt);
    gemm g = {dt == EM_F64, M, N, K, pa, pb, po, la == 1, lb == 1, lda, ldb, ldo, true, true};
    (void)lo; /* contiguous: row-major */
    gemm_parallel(&g);
    if (ua != a) tmp_free(&ta);
    if (ub != b) tmp_free(&tb);
    return EM_OK;
}
