/* A small thread pool: one job at a time, split into chunks that the caller and the workers
 * take from an atomic counter. A slow-to-wake worker never delays the job: the caller simply
 * takes its chunks. Waiters first poll for a short while (SPIN_NS), then block on condition
 * variables: a decoder posts a hundred short jobs per token with little work between them,
 * and a worker woken from a condition variable (in a VM, a halted vCPU woken by an
 * interrupt) arrives tens of microseconds late to each, when the whole job may take a few
 * hundred; likewise the caller, had it slept, for the end of the job. The spin is bounded so
 * that an idle pool soon leaves the cores to other programs. */
#include "cpu_threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <ember/device.h>

#define MAX_WORKERS 63
#define CHUNKS_PER_THREAD 4
/* How long a waiter polls before it sleeps: longer than the gaps between a decoder's products
 * (the norms, the rotary embedding and the attention of one token), far shorter than any wait
 * where sleeping matters. */
#define SPIN_NS 200000

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers: a job was posted (or shutdown) */
    pthread_cond_t done;      /* caller: the job's last chunk finished */
    pthread_mutex_t job_mu;   /* held by the one caller whose job runs */
    pthread_t threads[MAX_WORKERS];
    int nworkers;             /* started */
    atomic_ulong generation;  /* bumped per job (under mu; polled without it) */
    bool shutdown;
    /* the current job (written under mu) */
    bool open;                /* workers may still join */
    int allowed;              /* workers with id < allowed take part */
    atomic_int active;        /* workers inside the job (changed under mu; polled without it) */
    em_cpu_range_fn fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    atomic_llong finished;    /* chunks done (added under mu; polled without it) */
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
static inline void cpu_relax(void) { _mm_pause(); }
#else
static void follow_flush_denormal(void) {}
static inline void cpu_relax(void) {}
#endif

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Polls done() for up to SPIN_NS; whether it came true. */
static bool spin_until(bool (*done)(const void *), const void *arg) {
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (done(arg)) return true;
        cpu_relax();
        if (i % 64 == 0) { /* the clock read costs more than a poll */
            int64_t t = now_ns();
            if (!deadline) deadline = t + SPIN_NS;
            else if (t > deadline) return false;
        }
    }
}

static bool job_posted(const void *seen) {
    return atomic_load_explicit(&g_pool.generation, memory_order_acquire) != *(const unsigned long *)seen;
}

static bool job_finished(const void *arg) {
    (void)arg;
    return atomic_load_explicit(&g_pool.finished, memory_order_acquire) == g_pool.nchunks &&
           atomic_load_explicit(&g_pool.active, memory_order_acquire) == 0;
}
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
            pthread_mutex_unlock(&g_pool.mu);
            bool posted = spin_until(job_posted, &seen);
            pthread_mutex_lock(&g_pool.mu);
            if (!posted && !g_pool.shutdown && g_pool.generation == seen) pthread_cond_wait(&g_pool.wake, &g_pool.mu);
        }
        if (g_pool.shutdown) break;
        seen = g_pool.generation;
        atomic_fetch_add(&g_pool.active, 1);
        em_cpu_range_fn fn = g_pool.fn;
        void *ctx = g_pool.ctx;
        int64_t n = g_pool.n, chunk = g_pool.chunk, nchunks = g_pool.nchunks;
        pthread_mutex_unlock(&g_pool.mu);
        follow_flush_denormal();
        int64_t ran = run_chunks(fn, ctx, n, chunk, nchunks);
        pthread_mutex_lock(&g_pool.mu);
        atomic_fetch_add(&g_pool.finished, ran);
        if (atomic_fetch_sub(&g_pool.active, 1) == 1 && g_pool.finished == g_pool.nchunks)
            pthread_cond_signal(&g_pool.done);
    }
    pthread_mutex_unlock(&g_pool.mu);
    return NULL;
}

static void pool_shutdown(void) {
    pthread_mutex_lock(&g_pool.job_mu);
    pthread_mutex_lock(&g_pool.mu);
    g_pool.shutdown = true;
    atomic_fetch_add(&g_pool.generation, 1); /* ends the workers' polling too */
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
    atomic_store(&g_pool.finished, 0);
    g_pool.allowed = workers;
    atomic_store(&g_pool.next, 0);
    g_pool.open = true;
    atomic_fetch_add_explicit(&g_pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.mu);

    t_in_job = true;
    int64_t ran = run_chunks(fn, ctx, n, chunk, nchunks);
    t_in_job = false;

    pthread_mutex_lock(&g_pool.mu);
    atomic_fetch_add(&g_pool.finished, ran);
    if (!job_finished(NULL)) {
        pthread_mutex_unlock(&g_pool.mu);
        spin_until(job_finished, NULL);
        pthread_mutex_lock(&g_pool.mu);
    }
    while (!job_finished(NULL)) pthread_cond_wait(&g_pool.done, &g_pool.mu);
    g_pool.open = false;
    pthread_mutex_unlock(&g_pool.mu);
    pthread_mutex_unlock(&g_pool.job_mu);
}
