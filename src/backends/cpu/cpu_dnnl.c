/* bf16/f16 GEMM through oneDNN's matmul primitive (float32 accumulation), see cpu_dnnl.h;
 * also products with a bias row in the epilogue (Linear's forward, float32 too) and batches
 * of float32 products (attention's).
 *
 * Which kernel: oneDNN picks the best ISA it is allowed (dnnl_get_effective_cpu_isa: AMX
 * tiles, avx512_core_amx, where the CPU has them and Linux grants the tile state, which
 * oneDNN requests itself; else AVX512-BF16). Ember uses it for a dtype only when a probe
 * primitive gets a real kernel: bf16 needs AVX512-BF16 or AMX (oneDNN would emulate bf16 on
 * plain AVX-512, slower than converting to float32), f16 any non-reference kernel (oneDNN
 * 2.6 has none on the CPU; later versions use AVX512-FP16/AMX-FP16). Otherwise cpu_matmul.c
 * converts to float32 (F16C for f16) and runs the float32 GEMM.
 *
 * Threads: Ember's pool, not oneDNN's OpenMP. Each primitive is created and run with one
 * OpenMP thread on the calling thread; a big GEMM is split into one block of rows (or
 * columns) per Ember thread, so `--threads`/em_set_num_threads rules as for float32 and no
 * OpenMP team spins beside Ember's workers. Primitive creation is expensive (JIT, tens of
 * ms): primitives are cached per shape, layout and dtype (a bounded cache, least recently
 * used evicted). Scratchpads are the caller's (user mode), so one primitive may run on
 * several threads at once. */
#include "cpu_dnnl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/device.h>
#include "../../util/errors.h"
#include "cpu_amx.h"
#include "cpu_gemm.h"
#include "cpu_sgemm_dnnl.h"

#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <dnnl.h>
#include "cpu_threads.h"

#define CACHE_SIZE 64           /* primitives kept (a training run uses a dozen shapes) */
#define CHUNK_ALIGN 32          /* rows/columns per thread chunk: a multiple of AMX tiles */
#define SERIAL_MACS 4000000     /* below this a GEMM runs on the calling thread only */

typedef struct key {            /* all int64_t: compared with memcmp, no padding */
    int64_t dtype, P, Q, K, xt, yt, ldx, ldy, ldz, acc;
    /* batched float32 (em__cpu_dnnl_sgemm_batch): batch dims and each operand's element
     * strides over them (0: broadcast); nb = 0 for one matrix */
    int64_t nb, bshape[EM_DNNL_MAX_BATCH], bsx[EM_DNNL_MAX_BATCH], bsy[EM_DNNL_MAX_BATCH], bsz[EM_DNNL_MAX_BATCH];
    int64_t bias;               /* a [Q] bias added to every row (one matrix only) */
    int64_t zf32;               /* Z float32 for bf16/f16 X, Y (em_lowp_gemm.z_f32) */
} key;

typedef struct entry {
    key k;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    size_t scratch;
    int refs;                   /* runs using it now: never evicted while > 0 */
    uint64_t used;              /* last use, for LRU */
    bool live;
} entry;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static void (*g_omp_set_threads)(int);
static int (*g_omp_get_threads)(void);
static bool g_ok[EM_DTYPE_COUNT];              /* oneDNN runs this dtype fast here */
static bool g_amx;                              /* its bf16 kernels use AMX tiles here */
static char g_desc[EM_DTYPE_COUNT][160];       /* what em_cpu_matmul_impl says */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static entry g_cache[CACHE_SIZE];
static uint64_t g_clock;
static dnnl_stream_t g_streams[256];          /* idle streams, one taken per run */
static int g_nstreams;

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch ((int)isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "unknown";
    }
}

/* One OpenMP thread for oneDNN on the calling thread; returns what to restore afterwards, so a
 * program's own OpenMP regions on this thread keep their thread count. */
static int one_omp_thread(void) {
    int prev = g_omp_get_threads ? g_omp_get_threads() : 0;
    if (g_omp_set_threads && prev != 1) g_omp_set_threads(1);
    return prev;
}
static void restore_omp_threads(int prev) {
    if (g_omp_set_threads && prev > 1) g_omp_set_threads(prev);
}

/* A primitive for k (caller holds g_lock or is the only user). */
static dnnl_status_t create(const key *k, dnnl_primitive_desc_t *pd, dnnl_primitive_t *prim, size_t *scratch) {
    dnnl_data_type_t dt = k->dtype == EM_BF16 ? dnnl_bf16 : k->dtype == EM_F16 ? dnnl_f16 : dnnl_f32;
    int nb = (int)k->nb, nd = nb + 2;
    dnnl_dims_t dx, dy, dz, sx, sy, sz;
    for (int i = 0; i < nb; i++) { /* a broadcast operand has its batch dim 1 (oneDNN broadcasts it) */
        dx[i] = k->bsx[i] || k->bshape[i] == 1 ? k->bshape[i] : 1;
        dy[i] = k->bsy[i] || k->bshape[i] == 1 ? k->bshape[i] : 1;
        dz[i] = k->bshape[i];
        sx[i] = k->bsx[i] ? k->bsx[i] : 1;
        sy[i] = k->bsy[i] ? k->bsy[i] : 1;
        sz[i] = k->bsz[i] ? k->bsz[i] : 1;
    }
    dx[nb] = k->P, dx[nb + 1] = k->K, dy[nb] = k->K, dy[nb + 1] = k->Q, dz[nb] = k->P, dz[nb + 1] = k->Q;
    sx[nb] = k->xt ? 1 : k->ldx, sx[nb + 1] = k->xt ? k->ldx : 1;
    sy[nb] = k->yt ? 1 : k->ldy, sy[nb + 1] = k->yt ? k->ldy : 1;
    sz[nb] = k->ldz, sz[nb + 1] = 1;
    dnnl_memory_desc_t mx, my, mz, mb;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    *pd = NULL;
    *prim = NULL;
    int omp = one_omp_thread(); /* oneDNN sizes its blocking by the creating thread's OpenMP threads */
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&mx, nd, dx, dt, sx);
    if (!s) s = dnnl_memory_desc_init_by_strides(&my, nd, dy, dt, sy);
    if (!s) s = dnnl_memory_desc_init_by_strides(&mz, nd, dz, k->zf32 ? dnnl_f32 : dt, sz);
    if (!s && k->bias) s = dnnl_memory_desc_init_by_strides(&mb, 2, (dnnl_dims_t){1, k->Q}, dt, (dnnl_dims_t){k->Q, 1});
    if (!s) s = dnnl_matmul_desc_init(&md, &mx, &my, k->bias ? &mb : NULL, &mz);
    if (!s) s = dnnl_primitive_attr_create(&attr);
    if (!s) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (!s && k->acc) { /* Z += X Y: the sum post-op reads Z (the bias) before rounding once */
        s = dnnl_post_ops_create(&ops);
        if (!s) s = dnnl_post_ops_append_sum(ops, 1.0f);
        if (!s) s = dnnl_primitive_attr_set_post_ops(attr, ops);
    }
    if (!s) s = dnnl_primitive_desc_create(pd, &md, attr, g_engine, NULL);
    if (!s) s = dnnl_primitive_create(prim, *pd);
    if (!s) *scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(*pd, dnnl_query_scratchpad_md, 0));
    restore_omp_threads(omp);
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s) {
        if (*prim) dnnl_primitive_destroy(*prim);
        if (*pd) dnnl_primitive_desc_destroy(*pd);
        *pd = NULL;
        *prim = NULL;
    }
    return s;
}

static const char *impl_of(dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return "unknown";
    return impl;
}

/* Does oneDNN have a fast kernel for dt here? A 64-cube probe says which one it picks. */
static void probe(em_dtype dt, dnnl_cpu_isa_t isa) {
    const dnnl_version_t *v = dnnl_version();
    char *d = g_desc[dt];
    size_t n = sizeof g_desc[dt];
    if (dt == EM_BF16 && (isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(d, n, "float32 GEMM after conversion (oneDNN %d.%d.%d: CPU ISA %s has neither AVX512-BF16 nor AMX)",
                 v->major, v->minor, v->patch, isa_name(isa));
        return;
    }
    key k = {dt, 64, 64, 64, 0, 0, 64, 64, 64, 0, 0, {0}, {0}, {0}, {0}, 0, 0};
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    size_t scratch;
    dnnl_status_t s = create(&k, &pd, &prim, &scratch);
    if (s) {
        snprintf(d, n, "float32 GEMM after conversion (oneDNN %d.%d.%d has no %s matmul on %s)", v->major, v->minor,
                 v->patch, em_dtype_name(dt), isa_name(isa));
        return;
    }
    const char *impl = impl_of(pd);
    if (strncmp(impl, "ref", 3) == 0) {
        snprintf(d, n, "float32 GEMM after conversion (oneDNN %d.%d.%d has only its reference %s matmul on %s)",
                 v->major, v->minor, v->patch, em_dtype_name(dt), isa_name(isa));
    } else {
        snprintf(d, n, "oneDNN %d.%d.%d %s (ISA %s), float32 accumulation", v->major, v->minor, v->patch, impl,
                 isa_name(isa));
        g_ok[dt] = true;
    }
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
}

static void init(void) {
    /* libdnnl brings libgomp; found at run time so that Ember does not link OpenMP itself */
    *(void **)&g_omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    *(void **)&g_omp_get_threads = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) {
        g_engine = NULL;
        snprintf(g_desc[EM_BF16], sizeof g_desc[EM_BF16], "float32 GEMM after conversion (oneDNN: no CPU engine)");
        snprintf(g_desc[EM_F16], sizeof g_desc[EM_F16], "%s", g_desc[EM_BF16]);
        return;
    }
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    g_amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    probe(EM_BF16, isa);
    probe(EM_F16, isa);
}

static bool allowed(void) {
    const char *e = getenv("EMBER_CPU_LOWP_GEMM");
    return !(e && strcmp(e, "portable") == 0);
}

bool em__cpu_dnnl_runs(em_dtype dt) {
    if ((dt != EM_BF16 && dt != EM_F16) || !allowed()) return false;
    pthread_once(&g_once, init);
    return g_engine && g_ok[dt];
}

static dnnl_stream_t stream_take(void) {
    dnnl_stream_t s = NULL;
    pthread_mutex_lock(&g_lock);
    if (g_nstreams > 0) s = g_streams[--g_nstreams];
    pthread_mutex_unlock(&g_lock);
    if (!s && dnnl_stream_create(&s, g_engine, dnnl_stream_default_flags) != dnnl_success) s = NULL;
    return s;
}

static void stream_give(dnnl_stream_t s) {
    pthread_mutex_lock(&g_lock);
    if (g_nstreams < (int)(sizeof g_streams / sizeof g_streams[0])) {
        g_streams[g_nstreams++] = s;
        s = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (s) dnnl_stream_destroy(s);
}

/* The cached entry for k, created if missing, with a reference held; NULL with *st set. */
static entry *acquire(const key *k, dnnl_status_t *st) {
    pthread_mutex_lock(&g_lock);
    entry *hit = NULL, *victim = NULL;
    for (int i = 0; i < CACHE_SIZE; i++) {
        entry *e = &g_cache[i];
        if (e->live && memcmp(&e->k, k, sizeof *k) == 0) { hit = e; break; }
        if (!e->live) { if (!victim || victim->live) victim = e; }
        else if (e->refs == 0 && (!victim || (victim->live && e->used < victim->used))) victim = e;
    }
    if (!hit) {
        dnnl_primitive_desc_t pd;
        dnnl_primitive_t prim;
        size_t scratch = 0;
        *st = create(k, &pd, &prim, &scratch);
        if (*st == dnnl_success && !victim) { /* every entry busy: run uncached */
            *st = dnnl_out_of_memory;
            dnnl_primitive_destroy(prim);
            dnnl_primitive_desc_destroy(pd);
        }
        if (*st != dnnl_success) {
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        if (victim->live) {
            dnnl_primitive_destroy(victim->prim);
            dnnl_primitive_desc_destroy(victim->pd);
        }
        *victim = (entry){*k, pd, prim, scratch, 0, 0, true};
        hit = victim;
    }
    hit->refs++;
    hit->used = ++g_clock;
    pthread_mutex_unlock(&g_lock);
    return hit;
}

static void release(entry *e) {
    pthread_mutex_lock(&g_lock);
    e->refs--;
    pthread_mutex_unlock(&g_lock);
}

static dnnl_status_t execute(entry *e, const void *x, const void *y, void *z, const void *bias) {
    dnnl_status_t s = dnnl_success;
    dnnl_memory_t mx = NULL, my = NULL, mz = NULL, ms = NULL, mb = NULL;
    void *scratch = e->scratch ? malloc(e->scratch) : NULL;
    if (e->scratch && !scratch) return dnnl_out_of_memory;
    int omp = one_omp_thread();
    dnnl_stream_t str = stream_take();
    if (!str) s = dnnl_out_of_memory;
    if (!s) s = dnnl_memory_create(&mx, dnnl_primitive_desc_query_md(e->pd, dnnl_query_src_md, 0), g_engine, (void *)x);
    if (!s) s = dnnl_memory_create(&my, dnnl_primitive_desc_query_md(e->pd, dnnl_query_weights_md, 0), g_engine, (void *)y);
    if (!s) s = dnnl_memory_create(&mz, dnnl_primitive_desc_query_md(e->pd, dnnl_query_dst_md, 0), g_engine, z);
    if (!s && e->scratch)
        s = dnnl_memory_create(&ms, dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0), g_engine, scratch);
    if (!s && bias)
        s = dnnl_memory_create(&mb, dnnl_primitive_desc_query_md(e->pd, dnnl_query_weights_md, 1), g_engine, (void *)bias);
    if (!s) {
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, my}, {DNNL_ARG_DST, mz}};
        int n = 3;
        if (ms) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
        if (mb) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mb};
        s = dnnl_primitive_execute(e->prim, str, n, args);
        if (!s) s = dnnl_stream_wait(str);
    }
    if (mb) dnnl_memory_destroy(mb);
    if (mx) dnnl_memory_destroy(mx);
    if (my) dnnl_memory_destroy(my);
    if (mz) dnnl_memory_destroy(mz);
    if (ms) dnnl_memory_destroy(ms);
    if (str) stream_give(str);
    restore_omp_threads(omp);
    free(scratch);
    return s;
}

/* One GEMM as a grid of blocks: threads take row blocks (split_rows) or column blocks; with
 * row blocks, products wider than 2 * PANEL also go in column panels of PANEL (with column
 * blocks, those of at least 2 * PANEL rows: a thread's block is then cut in panels). oneDNN 2.6's
 * AMX kernel repacks the weight (y) as it goes, and measured faster on panels of 256-512
 * columns than on the whole width (1 thread, 2048 and 4096 square).
 *
 * Without AMX, a bf16/f16 product against a Linear's weight (y = W^T, W [Q, K] row-major: the
 * forward, prefill, the fused loss's logits) on several threads goes in whole-width row blocks
 * instead (dense_rows). A column block or panel is a strided view of z, which oneDNN 2.6's
 * brgemm kernel (avx512_core_bf16) declines; its gemm:jit kernel then runs it, slower, and
 * allocates its packing buffers in every call. On 2 threads (EPYC Zen 4, AVX512-BF16;
 * bench_lowp_shapes) the row blocks ran the fused loss's 256 x 2048 @ 128256 at 393-410
 * against 339-350 GFLOP/s, 512 x 2048 @ 2048 at 429-432 against 400, and the other products of
 * a 1B's and a 7B's Linears at 512 rows 0-6% faster; through em_matmul, where the gemm:jit
 * kernel's buffers come fresh, 512 x 2048 @ 8192 ran at 404 against 318. The other layouts
 * (G W, X^T G) measured mixed and keep their blocks. */
#define PANEL 512
typedef struct job {
    const em_lowp_gemm *g;
    bool split_rows;
    int64_t rper, nr, qper, nc;  /* block height and count, block width and count */
    entry *e[2][2];              /* primitives: [last row block?][last column block?] */
    atomic_int status;
} job;

static void run_block(job *j, int64_t r, int64_t c) {
    const em_lowp_gemm *g = j->g;
    int64_t r0 = r * j->rper, c0 = c * j->qper;
    size_t es = g->dtype == EM_F32 ? 4 : 2, zes = g->z_f32 ? 4 : es;
    const char *x = (const char *)g->x + (size_t)(r0 * (g->xt ? 1 : g->ldx)) * es;
    const char *y = (const char *)g->y + (size_t)(c0 * (g->yt ? g->ldy : 1)) * es;
    char *z = (char *)g->z + (size_t)(r0 * g->ldz + c0) * zes;
    dnnl_status_t s = execute(j->e[r == j->nr - 1][c == j->nc - 1], x, y, z, g->bias ? (const char *)g->bias + (size_t)c0 * es : NULL);
    if (s) atomic_store(&j->status, (int)s);
}

static void chunk(void *arg, int64_t begin, int64_t end) {
    job *j = arg;
    for (int64_t b = begin; b < end; b++) {
        if (j->split_rows)
            for (int64_t c = 0; c < j->nc; c++) run_block(j, b, c);
        else
            for (int64_t r = 0; r < j->nr; r++) run_block(j, r, b);
    }
}

static em_status run_gemm(const em_lowp_gemm *g);

em_status em__cpu_dnnl_gemm(const em_lowp_gemm *g) {
    if (!em__cpu_dnnl_runs(g->dtype) || g->bias) return EM_ERR_NOT_SUPPORTED;
    return run_gemm(g);
}

em_status em__cpu_dnnl_gemm_bias(const em_lowp_gemm *g) {
    if (!g->bias || g->acc || g->z_f32 || g->P < EM_SGEMM_BIAS_MIN_ROWS || g->P * g->Q * g->K < EM_SGEMM_BIAS_MIN_MACS)
        return EM_ERR_NOT_SUPPORTED;
    if (g->dtype == EM_F32) {
        if (strcmp(em__cpu_sgemm_policy_name(), "openblas") == 0) return EM_ERR_NOT_SUPPORTED;
        pthread_once(&g_once, init);
        __builtin_cpu_init();
        if (!g_engine || !__builtin_cpu_supports("avx512f")) return EM_ERR_NOT_SUPPORTED;
    } else if (!em__cpu_dnnl_runs(g->dtype)) {
        return EM_ERR_NOT_SUPPORTED;
    }
    em_status st = run_gemm(g);
    if (st != EM_OK && st != EM_ERR_NOT_SUPPORTED) em_clear_error(); /* the caller's path computes it */
    return st == EM_OK ? EM_OK : EM_ERR_NOT_SUPPORTED;
}

static em_status run_gemm(const em_lowp_gemm *g) {
    if (g->P == 0 || g->Q == 0) return EM_OK;
    int threads = em__cpu_num_threads();
    bool big = g->P * g->Q * g->K >= SERIAL_MACS;
    bool dense_rows = big && threads > 1 && !g_amx && g->dtype != EM_F32 && g->yt && g->P >= 2 * CHUNK_ALIGN * threads;
    job j = {.g = g, .split_rows = g->P >= g->Q || dense_rows};
    int64_t len = j.split_rows ? g->P : g->Q;
    int64_t blocks = big ? threads : 1;
    int64_t per = (len + blocks - 1) / blocks;
    if (blocks > 1) per = (per + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
    if (per > len) per = len;
    if (j.split_rows) {
        j.rper = per;
        j.qper = big && g->Q > 2 * PANEL && !dense_rows ? PANEL : g->Q; /* 1024 wide: measured no better in panels */
    } else {
        j.rper = g->P;
        /* a thread's columns in panels too when the rows are many: the 4096-wide MLP's
         * forward (X W^T) and input-gradient (G W) GEMMs at batch 1024, 1 thread, took
         * 52-56 -> 40-45 and 57-59 -> 47-48 ms; at batch 256 panels measured no better */
        j.qper = big && per > 2 * PANEL && g->P >= 2 * PANEL ? PANEL : per;
    }
    j.nr = (g->P + j.rper - 1) / j.rper;
    j.nc = (g->Q + j.qper - 1) / j.qper;
    int64_t rlast = g->P - (j.nr - 1) * j.rper, clast = g->Q - (j.nc - 1) * j.qper;
    /* every primitive before any block runs: a refusal leaves z untouched for the fallback */
    dnnl_status_t s = dnnl_success;
    bool ok = true;
    for (int rt = 0; rt < 2; rt++)
        for (int ct = 0; ct < 2; ct++) {
            j.e[rt][ct] = NULL;
            if ((rt == 0 && j.nr == 1) || (ct == 0 && j.nc == 1) || !ok) continue; /* never used */
            key k = {g->dtype, rt ? rlast : j.rper, ct ? clast : j.qper, g->K, g->xt, g->yt,
                     g->ldx, g->ldy, g->ldz, g->acc, 0, {0}, {0}, {0}, {0}, g->bias != NULL, g->z_f32};
            if (!(j.e[rt][ct] = acquire(&k, &s))) ok = false;
        }
    if (!ok) {
        for (int i = 0; i < 4; i++)
            if (j.e[i / 2][i % 2]) release(j.e[i / 2][i % 2]);
        /* a shape or layout oneDNN refuses: the float32 path computes it */
        return s == dnnl_out_of_memory ? em_error(EM_ERR_OUT_OF_MEMORY, "cpu: %s matmul: oneDNN ran out of memory",
                                                  em_dtype_name(g->dtype))
                                       : EM_ERR_NOT_SUPPORTED;
    }
    atomic_init(&j.status, 0);
    int64_t nblocks = j.split_rows ? j.nr : j.nc;
    if (nblocks == 1) chunk(&j, 0, 1);
    else em__cpu_parallel_for(nblocks, 1, chunk, &j);
    for (int i = 0; i < 4; i++)
        if (j.e[i / 2][i % 2]) release(j.e[i / 2][i % 2]);
    int rs = atomic_load(&j.status);
    if (rs)
        return em_error(rs == dnnl_out_of_memory ? EM_ERR_OUT_OF_MEMORY : EM_ERR_BACKEND,
                        "cpu: %s matmul (%lldx%lld @ %lldx%lld): oneDNN failed with status %d", em_dtype_name(g->dtype),
                        (long long)g->P, (long long)g->K, (long long)g->K, (long long)g->Q, rs);
    return EM_OK;
}

/* ---- batched float32 ---- */
typedef struct bjob {
    const em_lowp_gemm *g;
    const em_dnnl_batch *b;
    int64_t per, n;              /* outer batch entries per chunk, chunks */
    entry *e[2];                 /* primitives: [last chunk?] */
    atomic_int status;
} bjob;

static void bchunk(void *arg, int64_t begin, int64_t end) {
    bjob *j = arg;
    for (int64_t c = begin; c < end; c++) {
        int64_t i0 = c * j->per;
        const float *x = (const float *)j->g->x + i0 * j->b->bsx[0];
        const float *y = (const float *)j->g->y + i0 * j->b->bsy[0];
        float *z = (float *)j->g->z + i0 * j->b->bsz[0];
        dnnl_status_t s = execute(j->e[c == j->n - 1], x, y, z, NULL);
        if (s) atomic_store(&j->status, (int)s);
    }
}

/* EMBER_CPU_BATCHED_GEMM: "blas" never, "dnnl" always, else (auto) where measured faster
 * (bench_attn_bmm, 128 matrices of the GPT's attention, 1 thread): products at least as wide
 * as deep (64x64 from depth 32); the 64x32 ones from depth 64 measured slower, so those stay
 * on BLAS. Batches under BATCH_MIN_MACS multiply-adds in all stay on BLAS too. */
#define BATCH_MIN_MACS 1000000
static bool batch_allowed(const em_lowp_gemm *g, int64_t total_macs) {
    const char *e = getenv("EMBER_CPU_BATCHED_GEMM");
    if (e && strcmp(e, "blas") == 0) return false;
    if (e && strcmp(e, "dnnl") == 0) return true;
    /* and big enough to pay for creating a primitive (JIT) for a shape met once */
    return g->Q >= g->K && total_macs >= BATCH_MIN_MACS;
}

em_status em__cpu_dnnl_sgemm_batch(const em_lowp_gemm *g, const em_dnnl_batch *b) {
    if (g->dtype != EM_F32 || g->acc || b->nb < 1 || b->nb > EM_DNNL_MAX_BATCH) return EM_ERR_NOT_SUPPORTED;
    int64_t total = g->P * g->Q * g->K;
    for (int i = 0; i < b->nb; i++) {
        if (b->bshape[i] < 1 || (b->bshape[i] > 1 && b->bsz[i] == 0)) return EM_ERR_NOT_SUPPORTED;
        total *= b->bshape[i];
    }
    if (total == 0 || !batch_allowed(g, total)) return EM_ERR_NOT_SUPPORTED;
    const char *env = getenv("EMBER_CPU_BATCHED_GEMM");
    bool forced = env && strcmp(env, "dnnl") == 0;
    pthread_once(&g_once, init);
    if (!g_engine) return EM_ERR_NOT_SUPPORTED;
    /* one chunk of the outer batch dim per thread, none under 2M multiply-adds */
    int64_t chunks = total / 2000000 + 1, outer = b->bshape[0];
    int threads = em__cpu_num_threads();
    if (chunks > threads) chunks = threads;
    if (chunks > outer) chunks = outer;
    bjob j = {.g = g, .b = b, .per = (outer + chunks - 1) / chunks};
    j.n = (outer + j.per - 1) / j.per;
    int64_t last = outer - (j.n - 1) * j.per;
    dnnl_status_t s = dnnl_success;
    for (int t = 0; t < 2; t++) {
        key k = {EM_F32, g->P, g->Q, g->K, g->xt, g->yt, g->ldx, g->ldy, g->ldz, 0, b->nb, {0}, {0}, {0}, {0}, 0, 0};
        for (int i = 0; i < b->nb; i++) {
            k.bshape[i] = b->bshape[i];
            k.bsx[i] = b->bsx[i], k.bsy[i] = b->bsy[i], k.bsz[i] = b->bsz[i];
        }
        k.bshape[0] = t ? last : j.per;
        if (k.bshape[0] == 1) k.bsx[0] = k.bsy[0] = k.bsz[0] = 0; /* one entry: its stride does not matter */
        if (!(j.e[t] = acquire(&k, &s))) {
            if (t) release(j.e[0]);
            return EM_ERR_NOT_SUPPORTED; /* refused (or out of memory): BLAS computes it */
        }
        /* oneDNN's reference kernel (a layout its JIT kernels refuse) is far slower than BLAS */
        if (!forced && strncmp(impl_of(j.e[t]->pd), "ref", 3) == 0) {
            release(j.e[t]);
            if (t) release(j.e[0]);
            return EM_ERR_NOT_SUPPORTED;
        }
    }
    atomic_init(&j.status, 0);
    if (j.n == 1) bchunk(&j, 0, 1);
    else em__cpu_parallel_for(j.n, 1, bchunk, &j);
    release(j.e[0]);
    release(j.e[1]);
    return atomic_load(&j.status) ? EM_ERR_NOT_SUPPORTED : EM_OK;
}

const char *em_cpu_matmul_impl(em_dtype dt) {
    if (dt == EM_F32 || dt == EM_F64) return em__cpu_gemm_name();
    if (dt != EM_BF16 && dt != EM_F16) return NULL;
    if (dt == EM_BF16 && em__cpu_amx_name()) return em__cpu_amx_name();
    pthread_once(&g_once, init);
    if (!allowed()) return "float32 GEMM after conversion (EMBER_CPU_LOWP_GEMM=portable)";
    return g_desc[dt];
}

#else /* without oneDNN: always the float32 path */

em_status em__cpu_dnnl_gemm_bias(const em_lowp_gemm *g) {
    (void)g;
    return EM_ERR_NOT_SUPPORTED;
}

em_status em__cpu_dnnl_sgemm_batch(const em_lowp_gemm *g, const em_dnnl_batch *b) {
    (void)g, (void)b;
    return EM_ERR_NOT_SUPPORTED;
}

em_status em__cpu_dnnl_gemm(const em_lowp_gemm *g) {
    (void)g;
    return EM_ERR_NOT_SUPPORTED;
}

bool em__cpu_dnnl_runs(em_dtype dt) {
    (void)dt;
    return false;
}

const char *em_cpu_matmul_impl(em_dtype dt) {
    if (dt == EM_F32 || dt == EM_F64) return em__cpu_gemm_name();
    if (dt != EM_BF16 && dt != EM_F16) return NULL;
    if (dt == EM_BF16 && em__cpu_amx_name()) return em__cpu_amx_name();
    return "float32 GEMM after conversion (built without oneDNN)";
}

#endif
