/* The CPU thread pool: coverage of ranges, nesting, many small jobs, changing thread counts,
 * concurrent callers, and identical kernel results for 1 and 2 threads. */
#include <pthread.h>
#include <stdatomic.h>
#include "test_cpu_util.h"
#include "backends/cpu/cpu_threads.h"
#include "backend_calls.h"

typedef struct cover_ctx { atomic_int *hits; int64_t n; atomic_int calls; } cover_ctx;

static void cover(void *arg, int64_t begin, int64_t end) {
    cover_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* Every index is visited exactly once, for many sizes, grains and thread counts. */
static void test_parallel_for_covers_once(void) {
    const int64_t sizes[] = {0, 1, 7, 1000, 65536, 65537, 300001};
    const int64_t grains[] = {1, 100, 32768};
    bool ok = true;
    for (int t = 1; t <= 4; t++) {
        em_set_num_threads(t);
        for (int si = 0; si < 7; si++)
            for (int gi = 0; gi < 3; gi++) {
                int64_t n = sizes[si];
                atomic_int *hits = calloc((size_t)n + 1, sizeof *hits);
                cover_ctx c = {hits, n, 0};
                em__cpu_parallel_for(n, grains[gi], cover, &c);
                for (int64_t i = 0; i < n; i++) ok &= atomic_load(&hits[i]) == 1;
                if (n < 2 * grains[gi] || t == 1) ok &= atomic_load(&c.calls) == (n > 0);
                free(hits);
            }
    }
    em_set_num_threads(2);
    CHECK(ok);
}

/* Work spread over threads: with 2 threads and a large n, more than one chunk runs. */
static void test_parallel_for_splits(void) {
    em_set_num_threads(2);
    int64_t n = 1 << 20;
    atomic_int *hits = calloc((size_t)n, sizeof *hits);
    cover_ctx c = {hits, n, 0};
    em__cpu_parallel_for(n, 1024, cover, &c);
    CHECK(atomic_load(&c.calls) > 1);
    free(hits);
}

static void nested(void *arg, int64_t begin, int64_t end) {
    cover_ctx *outer = arg;
    for (int64_t i = begin; i < end; i++) {
        atomic_int h[64] = {0};
        cover_ctx c = {h, 64, 0};
        em__cpu_parallel_for(64, 1, cover, &c); /* runs inline inside a job */
        int sum = 0;
        for (int k = 0; k < 64; k++) sum += atomic_load(&h[k]);
        atomic_fetch_add(&outer->hits[i], sum == 64 ? 1 : 100);
    }
}

static void test_nested_calls_run_inline(void) {
    em_set_num_threads(2);
    atomic_int hits[512] = {0};
    cover_ctx c = {hits, 512, 0};
    em__cpu_parallel_for(512, 16, nested, &c);
    bool ok = true;
    for (int i = 0; i < 512; i++) ok &= atomic_load(&hits[i]) == 1;
    CHECK(ok);
}

static void add_range(void *arg, int64_t begin, int64_t end) {
    atomic_llong *sum = arg;
    long long s = 0;
    for (int64_t i = begin; i < end; i++) s += i;
    atomic_fetch_add(sum, s);
}

/* Stress: thousands of small and medium jobs back to back must neither lose work nor hang. */
static void test_many_small_jobs(void) {
    em_set_num_threads(2);
    bool ok = true;
    for (int rep = 0; rep < 20000; rep++) {
        int64_t n = rep % 3 == 0 ? 70000 : rep % 7 + 1;
        atomic_llong sum = 0;
        em__cpu_parallel_for(n, 32768, add_range, &sum);
        ok &= atomic_load(&sum) == (long long)(n * (n - 1) / 2);
    }
    CHECK(ok);
}

static void *caller_thread(void *arg) {
    bool *ok = arg;
    for (int rep = 0; rep < 300; rep++) {
        int64_t n = 100000 + rep;
        atomic_llong sum = 0;
        em__cpu_parallel_for(n, 1000, add_range, &sum);
        if (atomic_load(&sum) != (long long)(n * (n - 1) / 2)) *ok = false;
    }
    return NULL;
}

/* Several application threads submitting at once: one gets the pool, others run inline. */
static void test_concurrent_callers(void) {
    em_set_num_threads(2);
    pthread_t th[3];
    bool ok[3] = {true, true, true};
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, caller_thread, &ok[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(ok[0] && ok[1] && ok[2]);
}

/* Kernels give bit-identical results with 1 and 2 threads. */
static void test_kernels_same_for_1_and_2_threads(void) {
    int64_t shape[2] = {700, 1001}, oshape[2] = {700, 1};
    ttensor *a = tt_make(EM_F32, 2, shape, L_CONTIG), *b = tt_make(EM_F32, 2, shape, L_TRANSPOSED);
    tt_fill_random(a, -3, 3);
    tt_fill_random(b, -3, 3);
    ttensor *r[2][4];
    for (int t = 0; t < 2; t++) {
        em_set_num_threads(t + 1);
        r[t][0] = tt_make(EM_F32, 2, shape, L_CONTIG);
        r[t][1] = tt_make(EM_F32, 2, shape, L_CONTIG);
        r[t][2] = tt_make(EM_F32, 2, oshape, L_CONTIG);
        r[t][3] = tt_make(EM_F16, 2, shape, L_SLICED);
        bool red[2] = {false, true};
        CHECK_OK(be_binary(&em__cpu_backend, EM_OP_MUL, &r[t][0]->t, &a->t, &b->t));
        CHECK_OK(be_unary(&em__cpu_backend, EM_OP_GELU, &r[t][1]->t, &a->t, NULL));
        CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_SUM, &r[t][2]->t, &b->t, red));
        CHECK_OK(be_copy(&em__cpu_backend, &r[t][3]->t, &b->t));
    }
    for (int k = 0; k < 4; k++)
        CHECK(memcmp(r[0][k]->st.block.handle, r[1][k]->st.block.handle, r[0][k]->bytes) == 0);
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 4; k++) tt_free(r[t][k]);
    tt_free(a);
    tt_free(b);
    em_set_num_threads(2);
}

int main(void) {
    RUN(test_parallel_for_covers_once);
    RUN(test_parallel_for_splits);
    RUN(test_nested_calls_run_inline);
    RUN(test_many_small_jobs);
    RUN(test_concurrent_callers);
    RUN(test_kernels_same_for_1_and_2_threads);
    return test_summary();
}
