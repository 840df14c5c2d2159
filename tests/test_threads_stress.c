/* Threads: several threads at once create, compute on and free tensors on the CPU and on
 * OpenCL (PoCL), read tensors shared between them (read-only, as the headers' contract
 * allows), run autograd on graphs of their own, and raise and clear errors on one thread
 * while the others go on. Each thread checks its own results against a serial computation
 * and that no other thread's error ever shows up in its own error state. Built with
 * EMBER_SANITIZE=thread (scripts/tsan.sh) this is the ThreadSanitizer check; in the
 * normal suite it checks the results. EMBER_STRESS_ROUNDS sets the rounds per thread. */
#include <string.h>
#include "test.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>

enum { THREADS = 4, N = 48 };

static em_tensor *shared_a, *shared_b;        /* CPU, read by every thread */
static em_tensor *shared_ocl;                 /* on OpenCL, when there is one */
static double want_sum;                       /* sum(a @ b), computed before the threads */
static int rounds = 20;
static bool have_ocl;
static bool race;                             /* EMBER_STRESS_RACE=1: break the contract */
static em_device ocl;

typedef struct job {
    int id;
    int bad;             /* checks that failed on this thread */
    int errors_raised;
} job;

#define T_CHECK(j, cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "  thread %d: %s:%d: %s failed (%s)\n", (j)->id, __FILE__,   \
                    __LINE__, #cond, em_last_error());                                   \
            (j)->bad++;                                                                  \
        }                                                                                \
    } while (0)

static double sum_of(em_tensor *t) {
    return t ? em_item(em_sum(t, EM_ALL_DIMS, false)) : NAN;
}

/* EMBER_STRESS_RACE=1: one thread writes a shared tensor in place and another then reads
 * it, which the contract forbids; ThreadSanitizer must report it (scripts/tsan.sh checks
 * this, so a TSan build that sees nothing cannot pass for clean). The reader waits for the
 * write on a relaxed atomic flag, which orders nothing for TSan: the two accesses are
 * unordered on every run, whatever the timing (a burst of writes among the stress
 * threads was not: on a slow host the allocator's lock ordered them and TSan stayed
 * silent). */
static atomic_int race_written;

static void *race_writer(void *arg) {
    (void)arg;
    em_mul_scalar_(shared_a, 1.0);
    atomic_store_explicit(&race_written, 1, memory_order_relaxed);
    return NULL;
}

static void *race_reader(void *arg) {
    double *out = arg;
    while (!atomic_load_explicit(&race_written, memory_order_relaxed)) sched_yield();
    *out = sum_of(shared_a);
    return NULL;
}

static void run_race(void) {
    pthread_t w, r;
    double got = 0;
    CHECK(pthread_create(&r, NULL, race_reader, &got) == 0);
    CHECK(pthread_create(&w, NULL, race_writer, NULL) == 0);
    pthread_join(w, NULL);
    pthread_join(r, NULL);
    printf("race run: read %g after the unordered write\n", got);
}

static void *worker(void *arg) {
    job *j = arg;
    for (int r = 0; r < rounds; r++) {
        em_scope s = em_scope_begin();
        /* shared read-only tensors, a result of one's own */
        double got = sum_of(em_matmul(shared_a, shared_b));
        T_CHECK(j, fabs(got - want_sum) <= 1e-3 * fabs(want_sum) + 1e-3);

        /* fresh tensors: create, compute, free */
        em_tensor *x = em_full(EM_SHAPE(N, N), (double)(j->id + 1), EM_OPTS(0));
        em_tensor *y = em_relu(em_add(em_mul_scalar(x, 2.0), shared_a));
        T_CHECK(j, y != NULL && em_numel(y) == N * N);
        /* big enough for the CPU backend's worker pool, which the threads then share */
        em_tensor *big = em_full(EM_SHAPE(1024, 512), 1.0, EM_OPTS(0));
        double bs = sum_of(em_mul_scalar(em_add_scalar(big, (double)j->id), 2.0));
        T_CHECK(j, fabs(bs - 1024.0 * 512.0 * 2.0 * (j->id + 1)) <= 1e-6 * bs);

        /* the global generator and the allocator's statistics, from every thread */
        em_tensor *rnd = em_randn(EM_SHAPE(64), EM_OPTS(0));
        T_CHECK(j, rnd != NULL && em_memory_allocated(EM_DEVICE_CPU) > 0);

        /* autograd on a graph of this thread's own, through a shared input */
        em_tensor *w = em_full(EM_SHAPE(N, 1), 0.5, EM_OPTS(.requires_grad = true));
        em_tensor *loss = em_sum(em_matmul(shared_a, w), EM_ALL_DIMS, false);
        T_CHECK(j, loss && em_backward(loss) == EM_OK);
        em_tensor *g = em_grad(w);
        /* d/dw sum(A w) = column sums of A, i.e. the sums of A's rows transposed */
        T_CHECK(j, g && fabs(sum_of(g) - sum_of(shared_a)) <= 1e-3 * fabs(sum_of(shared_a)) + 1e-3);

        /* an error on thread 0 only: the others must never see it */
        if (j->id == 0) {
            em_tensor *bad = em_matmul(x, em_ones(EM_SHAPE(N + 1, 2), EM_OPTS(0)));
            T_CHECK(j, bad == NULL && em_failed());
            em_clear_error();
            j->errors_raised++;
        } else {
            T_CHECK(j, !em_failed());
        }

        /* OpenCL: moving, computing and reading back, and a shared device tensor */
        if (have_ocl) {
            em_tensor *xd = em_to(x, ocl);
            em_tensor *zd = em_add(em_mul_scalar(xd, 3.0), shared_ocl);
            double z = sum_of(em_cpu(zd));
            double want = (double)N * N * 3.0 * (j->id + 1) + sum_of(shared_a);
            T_CHECK(j, fabs(z - want) <= 1e-3 * fabs(want));
        }
        em_scope_end(s);
        if (j->id != 0) T_CHECK(j, !em_failed());
        em_clear_error();
    }
    return NULL;
}

static void test_stress(void) {
    const char *e = getenv("EMBER_STRESS_ROUNDS");
    if (e && atoi(e) > 0) rounds = atoi(e);
    race = getenv("EMBER_STRESS_RACE") && !strcmp(getenv("EMBER_STRESS_RACE"), "1");
    em_manual_seed(5);
    shared_a = em_randn(EM_SHAPE(N, N), EM_OPTS(0));
    shared_b = em_randn(EM_SHAPE(N, N), EM_OPTS(0));
    CHECK(shared_a && shared_b);
    em_scope s = em_scope_begin();
    want_sum = sum_of(em_matmul(shared_a, shared_b));
    em_scope_end(s);
    have_ocl = em_device_available(EM_OPENCL) && em_device_parse("opencl:0", &ocl) == EM_OK;
    if (have_ocl) {
        shared_ocl = em_to(shared_a, ocl);
        CHECK(shared_ocl != NULL);
        CHECK_OK(em_device_synchronize(ocl));
    } else {
        test_skip_case("stress on opencl:0", "%s", em_device_unavailable_reason(EM_OPENCL));
    }
    if (race) {
        run_race();
        em_release(shared_ocl);
        em_release(shared_a);
        em_release(shared_b);
        return;
    }
    pthread_t th[THREADS];
    job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (job){.id = i};
        CHECK(pthread_create(&th[i], NULL, worker, &jobs[i]) == 0);
    }
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    CHECK(bad == 0);
    CHECK(jobs[0].errors_raised == rounds);
    CHECK(!em_failed());
    printf("%d threads x %d rounds (%s)\n", THREADS, rounds, have_ocl ? "CPU and OpenCL" : "CPU only");
    em_release(shared_ocl);
    em_release(shared_a);
    em_release(shared_b);
}

int main(void) {
    RUN(test_stress);
    return test_summary();
}
