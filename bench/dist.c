/* Distributed benchmarks, run as MPI ranks by bench/run_dist.sh:
 *   bench_dist allreduce    all_reduce bus bandwidth 4 KB - 64 MB: Ember's em_dist_all_reduce
 *                           against Open MPI's MPI_Allreduce on the same buffer
 *   bench_dist loop BYTES ITERS  Ember's all_reduce alone, in a loop (to profile)
 *   bench_dist ddp HIDDEN... DDP step time of an MLP (784-HIDDEN...-10, Adam, batch 64 per
 *                           rank, random data) and the share of all-reduce time hidden behind
 *                           backward (1 - wait after backward / time in flight)
 * One line per measurement, "key value ..." for the script. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Each call timed on its own, the three kinds interleaved call by call (a barrier before
 * each, outside the timing), so that the machine's load hits all alike; the median and the
 * minimum over the trials (the minimum: the call when neither rank waited for a core).
 * Before each call every rank writes its buffer afresh (untimed), as DDP fills a bucket
 * with new gradients: each call then finds the buffer's lines in this core's cache, owned,
 * whatever the previous call did. Without that, a call's time depends on the kind that ran
 * before it (a peer that has just read a line makes this rank's next write to it wait):
 * at 64 KB Open MPI's own all-reduce measured 11.9-12.2 us (minimum) right after one
 * pattern and 16.5-17.7 us right after another (docs/BENCHMARKS.md, "Distributed"). */
static int trials_for(int64_t bytes) {
    int64_t t = (int64_t)(64.0 * 1024 * 1024 * 4 / (double)bytes);
    return t > 400 ? 400 : t < 32 ? 32 : (int)t; /* at least 32: a quiet moment even under load */
}

enum { K_MPI, K_EMBER, K_IALLREDUCE };
static double timed_call(int kind, em_tensor *t, int rank) {
    float *p = em_data_ptr(t);
    int n = (int)em_numel(t);
    if (em_fill_(t, 1.0) != EM_OK) { /* new data, as a bucket's gradients: see above */
        fprintf(stderr, "rank %d: %s\n", rank, em_last_error());
        exit(1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    if (kind == K_MPI) {
        MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (kind == K_EMBER) {
        if (em_dist_all_reduce(NULL, t, EM_REDUCE_SUM) != EM_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, em_last_error());
            exit(1);
        }
    } else { /* Open MPI's own non-blocking all-reduce, which Ember used before (libnbc) */
        MPI_Request q;
        MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    return now_s() - t0;
}

/* BENCH_DIST_BYTES="32768 65536": those sizes instead of 4 KB to 64 MB by 4x */
static void allreduce(int rank, int world) {
    int64_t sizes[32];
    int ns = 0;
    const char *e = getenv("BENCH_DIST_BYTES");
    for (char *end; e && *e && ns < 32; e = end) {
        long long v = strtoll(e, &end, 10);
        if (end == e || v < 4 || v % 4) {
            if (rank == 0) fprintf(stderr, "bench_dist: BENCH_DIST_BYTES: expected multiples of 4 separated by spaces\n");
            exit(2);
        }
        sizes[ns++] = v;
    }
    if (ns == 0)
        for (int64_t bytes = 4096; bytes <= 64 << 20; bytes *= 4) sizes[ns++] = bytes;
    for (int si = 0; si < ns; si++) {
        int64_t bytes = sizes[si], n = bytes / 4;
        em_tensor *t = em_ones(EM_SHAPE(n), EM_OPTS(0));
        int trials = trials_for(bytes);
        double *ember = malloc(sizeof(double) * (size_t)trials), *mpi = malloc(sizeof(double) * (size_t)trials),
               *nb = malloc(sizeof(double) * (size_t)trials);
        for (int r = -2; r < trials; r++) { /* two warm-up rounds */
            double dt[3];
            for (int k = 0; k < 3; k++) dt[k] = timed_call(k, t, rank);
            if (r >= 0) mpi[r] = dt[K_MPI], ember[r] = dt[K_EMBER], nb[r] = dt[K_IALLREDUCE];
        }
        qsort(ember, (size_t)trials, sizeof *ember, cmp_double);
        qsort(mpi, (size_t)trials, sizeof *mpi, cmp_double);
        qsort(nb, (size_t)trials, sizeof *nb, cmp_double);
        double factor = 2.0 * (world - 1) / world; /* nccl-tests' bus bandwidth */
        double em = ember[trials / 2], mm = mpi[trials / 2];
        if (rank == 0)
            printf("allreduce bytes %lld trials %d ember_us %.2f mpi_us %.2f ember_busbw_GBs %.3f mpi_busbw_GBs %.3f overhead_pct %.1f "
                   "iallreduce_us %.2f overhead_vs_iallreduce_pct %.1f ember_min_us %.2f mpi_min_us %.2f min_overhead_pct %.1f "
                   "iallreduce_min_us %.2f\n",
                   (long long)bytes, trials, em * 1e6, mm * 1e6, factor * (double)bytes / em / 1e9, factor * (double)bytes / mm / 1e9,
                   100.0 * (em / mm - 1), nb[trials / 2] * 1e6, 100.0 * (em / nb[trials / 2] - 1), ember[0] * 1e6, mpi[0] * 1e6,
                   100.0 * (ember[0] / mpi[0] - 1), nb[0] * 1e6);
        free(ember);
        free(mpi);
        free(nb);
        em_release(t);
    }
}

static void ddp(int rank, int world, int nh, const int *hidden) {
    em_manual_seed(0);
    em_module *m = em_nn_sequential_n(0, NULL);
    int in = 784;
    for (int i = 0; i < nh; i++) {
        em_sequential_append(m, em_nn_linear(in, hidden[i]));
        em_sequential_append(m, em_nn_relu());
        in = hidden[i];
    }
    em_sequential_append(m, em_nn_linear(in, 10));
    em_dist_ddp *d = world > 1 ? em_ddp(m, NULL, NULL) : NULL;
    if (world > 1 && !d) {
        fprintf(stderr, "rank %d: %s\n", rank, em_last_error());
        exit(1);
    }
    em_optimizer *opt = em_adam(m, 1e-3);
    em_manual_seed(1 + (uint64_t)rank);
    em_tensor *x = em_rand(EM_SHAPE(64, 784), EM_OPTS(0));
    em_tensor *y = em_randint(0, 10, EM_SHAPE(64), EM_OPTS(.dtype = EM_I64));
    enum { WARM = 20, STEPS = 200 };
    double wait = 0, total = 0;
    double *times = malloc(sizeof(double) * STEPS);
    for (int s = 0; s < WARM + STEPS; s++) {
        em_scope sc = em_scope_begin();
        double t0 = now_s();
        em_zero_grad(opt);
        em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
        if (em_backward(loss) != EM_OK || em_step(opt) != EM_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, em_last_error());
            exit(1);
        }
        double dt = now_s() - t0;
        if (s >= WARM) {
            times[s - WARM] = dt;
            if (d) {
                em_ddp_stats st = em_ddp_last_stats(d);
                wait += st.comm_wait_s;
                total += st.comm_total_s;
            }
        }
        em_scope_end(sc);
    }
    qsort(times, STEPS, sizeof *times, cmp_double);
    if (rank == 0) {
        printf("ddp world %d hidden", world);
        for (int i = 0; i < nh; i++) printf("%s%d", i ? "," : " ", hidden[i]);
        printf(" params %lld buckets %d step_ms %.3f hidden_pct %.1f comm_ms %.3f\n", (long long)em_module_num_parameters(m),
               d ? em_ddp_num_buckets(d) : 0, times[STEPS / 2] * 1e3, total > 0 ? 100.0 * (1 - wait / total) : 0.0,
               total / STEPS * 1e3);
    }
    free(times);
    em_optim_free(opt);
    em_ddp_free(d);
    em_module_free(m);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: mpirun -np N bench_dist allreduce | ddp HIDDEN...\n");
        return 2;
    }
    if (em_dist_init("mpi") != EM_OK) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    int rank = em_dist_rank(NULL), world = em_dist_world_size(NULL);
    em_set_num_threads(1); /* one core per rank: 2 ranks on this 2-core machine */
    if (!strcmp(argv[1], "allreduce")) {
        allreduce(rank, world);
    } else if (!strcmp(argv[1], "loop") && argc == 4) { /* for a profiler: Ember's calls alone */
        int64_t n = atoll(argv[2]) / 4;
        int iters = atoi(argv[3]);
        em_tensor *t = em_zeros(EM_SHAPE(n), EM_OPTS(0));
        double t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (em_dist_all_reduce(NULL, t, EM_REDUCE_SUM) != EM_OK) {
                fprintf(stderr, "rank %d: %s\n", rank, em_last_error());
                return 1;
            }
        if (rank == 0) printf("loop bytes %lld us_per_call %.3f\n", (long long)n * 4, (now_s() - t0) / iters * 1e6);
        em_release(t);
    } else {
        int hidden[8], nh = 0;
        for (int i = 2; i < argc && nh < 8; i++) hidden[nh++] = atoi(argv[i]);
        ddp(rank, world, nh, hidden);
    }
    em_dist_finalize();
    return 0;
}
