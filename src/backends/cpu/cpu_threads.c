/* A small sleeping thread pool: one job at a time, split into chunks that the caller and
 * the workers take from an atomic counter. A slow-to-wake worker never delays the job:
 * the caller simply takes its chunks. Waiters block on condition variables. */
#include "cpu_threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <ember/device.h>

#define MAX_WORKERS 63
#define CHUNKS_PER_THREAD 4

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers: a job was posted (or shutdown) */
    pthread_cond_t done;      /* caller: the job's last chunk finished */
    pthread_mutex_t job_mu;   /* held by the one caller whose job runs */
    pthread_t threads[MAX_WORKERS];
    int nworkers;             /* started */
    unsigned long generation; /* bumped per job */
    bool shutdown;
    /* the current job (written under mu) */
    bool open;                /* workers may still join */
    int allowed;              /* workers with id < allowed take part */
    int active;               /* workers inside the job */
    em_cpu_range_fn fn;
    void *ctx;
    int64_t n, chunk, nchunks, finished;
    atomic_llong next;        /* next chunk to take */
} pool;

static pool g_pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .job_mu = PTHREAD_MUTEX_INITIALIZER,
};
static _Thread_local bool t_in_job;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* em_set_flush_denormal sets the caller's MXCSR; a worker matches it before each job. */
static void follow_flush_denormal(void) {
    unsigned csr = _mm_getcsr(), want = em_get_flush_denormal() ? (csr | 0x8040u) : (csr & ~0x8040u);
    if (want != csr) _mm_setcsr(want);
}
#else
static void follow_flush_denormal(void) {}
#endif
static pthread_once_t g_atexit_once = PTHREAD_ONCE_INIT;

/* Take and run chunks until none is left; returns how many this thread ran. */
static int64_t run_chunks(em_cpu_range_fn fn, void *ctx, int64_t n, int64_t chunk, int64_t nchunks) {
    int64_t ran = 0;
    for (;;) {
        int64_t c = atomic_fetch_add(&g_pool.next, 1);
        if (c >= nchunks) break;
        int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
        fn(ctx, begin, end);
        ran++;
    }
    return ran;
}

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg;
    unsigned long seen = 0;
    t_in_job = true; /* parallel_for called from inside fn runs inline */
    pthread_mutex_lock(&g_pool.mu);
    for (;;) {
        while (!g_pool.shutdown && (g_pool.generation == seen || !g_pool.open || id >= g_pool.allowed)) {
            seen = g_pool.generation;
            pthread_cond_wait(&g_pool.wake, &g_pool.mu);
        }
        if (g_pool.shutdown) break;
        seen = g_pool.generation;
        g_pool.active++;
        em_cpu_range_fn fn = g_pool.fn;
        void *ctx = g_pool.ctx;
        int64_t n = g_pool.n, chunk = g_pool.chunk, nchunks = g_pool.nchunks;
        pthread_mutex_unlock(&g_pool.mu);
        follow_flush_denormal();
        int64_t ran = run_chunks(fn, ctx, n, chunk, nchunks);
        pthread_mutex_lock(&g_pool.mu);
        g_pool.active--;
        g_pool.finished += ran;
        if (g_pool.finished == g_pool.nchunks && g_pool.active == 0) pthread_cond_signal(&g_pool.done);
    }
    pthread_mutex_unlock(&g_pool.mu);
    return NULL;
}

static void pool_shutdown(void) {
    pthread_mutex_lock(&g_pool.job_mu);
    pthread_mutex_lock(&g_pool.mu);
    g_pool.shutdown = true;
    pthread_cond_broadcast(&g_pool.wake);
    int n = g_pool.nworkers;
    pthread_mutex_unlock(&g_pool.mu);
    for (int i = 0; i < n; i++) pthread_join(g_pool.threads[i], NULL);
    pthread_mutex_lock(&g_pool.mu);
    g_pool.nworkers = 0;
    pthread_mutex_unlock(&g_pool.mu);
    pthread_mutex_unlock(&g_pool.job_mu);
}

static void register_atexit(void) { atexit(pool_shutdown); }

int em__cpu_num_threads(void) {
    int t = em_get_num_threads();
    if (t < 1) t = 1;
    if (t > MAX_WORKERS + 1) t = MAX_WORKERS + 1;
    return t;
}

/* Start workers up to `want` (called with job_mu held); returns how many exist. */
static int ensure_workers(int want) {
    pthread_once(&g_atexit_once, register_atexit);
    pthread_mutex_lock(&g_pool.mu);
    while (!g_pool.shutdown && g_pool.nworkers < want) {
        int id = g_pool.nworkers;
        if (pthread_create(&g_pool.threads[id], NULL, worker_main, (void *)(intptr_t)id) != 0) break;
        g_pool.nworkers++;
    }
    int have = g_pool.shutdown ? 0 : g_pool.nworkers;
    pthread_mutex_unlock(&g_pool.mu);
    return have;
}

void em__cpu_parallel_for(int64_t n, int64_t grain, em_cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int threads = n >= 2 * grain && !t_in_job ? em__cpu_num_threads() : 1;
    if (threads <= 1 || pthread_mutex_trylock(&g_pool.job_mu) != 0) {
        fn(ctx, 0, n);
        return;
    }
    int workers = ensure_workers(threads - 1);
    if (workers > threads - 1) workers = threads - 1;
    if (workers == 0) {
        pthread_mutex_unlock(&g_pool.job_mu);
        fn(ctx, 0, n);
        return;
    }
    int64_t nchunks = n / grain;
    if (nchunks > (int64_t)(workers + 1) * CHUNKS_PER_THREAD) nchunks = (int64_t)(workers + 1) * CHUNKS_PER_THREAD;
    int64_t chunk = (n + nchunks - 1) / nchunks;
    nchunks = (n + chunk - 1) / chunk;

    pthread_mutex_lock(&g_pool.mu);
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.n = n;
    g_pool.chunk = chunk;
    g_pool.nchunks = nchunks;
    g_pool.finished = 0;
    g_pool.allowed = workers;
    atomic_store(&g_pool.next, 0);
    g_pool.open = true;
    g_pool.generation++;
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.mu);

    t_in_job = true;
    int64_t ran = run_chunks(fn, ctx, n, chunk, nchunks);
    t_in_job = false;

    pthread_mutex_lock(&g_pool.mu);
    g_pool.finished += ran;
    while (g_pool.finished < g_pool.nchunks || g_pool.active > 0) pthread_cond_wait(&g_pool.done, &g_pool.mu);
    g_pool.open = false;
    pthread_mutex_unlock(&g_pool.mu);
    pthread_mutex_unlock(&g_pool.job_mu);
}
