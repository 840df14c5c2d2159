/* all_reduce's own algorithms over MPI point-to-point (src/dist/allreduce.c): the direct
 * exchange and the segmented ring, forced in turn with EMBER_DIST_ALLREDUCE, on 2, 3 and 4
 * ranks (the parent sets the variable for each run): every dtype and op, sizes that do not divide by the rank count, 1 element; results
 * bit-identical on every rank, equal to MPI_Allreduce's for integer types, near the exact
 * value for floating ones; waits in different orders on different ranks; a rank that stalls
 * in the middle of the ring is named by the timeout. Started under mpirun as test_dist is. */
#include <math.h>
#include <time.h>
#include "test.h"
#include "dist_run.h"
#ifdef EMBER_HAVE_MPI
#include <mpi.h>
#endif

static int R, N;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef EMBER_HAVE_MPI
/* Rank r's value at element i: integers that differ across ranks, with negatives; floats of
 * mixed magnitudes, so that the order of a sum changes its last bits. */
static double value(int r, int64_t i, em_dtype dt) {
    uint64_t h = (uint64_t)(i + 1) * 2654435761u + (uint64_t)r * 40503u;
    h ^= h >> 13;
    switch (dt) {
    case EM_BOOL: return (double)((i + r) % 3 == 0);
    case EM_U8: return (double)(h % 256);
    case EM_I32: case EM_I64: return (double)((int64_t)(h % 2001) - 1000);
    default: return ((double)(h % 20001) - 10000.0) / 997.0 * (double)(1 << (h % 7));
    }
}

static em_tensor *rank_tensor(int r, int64_t n, em_dtype dt) {
    em_tensor *t = em_empty(EM_SHAPE(n), EM_OPTS(.dtype = EM_F64));
    double *p = em_data_ptr(t);
    for (int64_t i = 0; i < n; i++) p[i] = value(r, i, dt);
    return em_to_dtype(t, dt);
}

static MPI_Datatype mpi_dtype(em_dtype dt) {
    return dt == EM_F32 ? MPI_FLOAT : dt == EM_F64 ? MPI_DOUBLE : dt == EM_I64 ? MPI_INT64_T : dt == EM_I32 ? MPI_INT32_T : MPI_UINT8_T;
}

/* Is t's memory the same on every rank? */
static bool same_bits_everywhere(em_tensor *t) {
    em_scope s = em_scope_begin();
    size_t bytes = (size_t)em_numel(t) * em_dtype_size(em_dtype_of(t));
    em_tensor *mine = em_contiguous(t);
    em_tensor *all = em_empty(EM_SHAPE((int64_t)bytes * N), EM_OPTS(.dtype = EM_U8));
    bool same = MPI_Allgather(em_data_ptr(mine), (int)bytes, MPI_BYTE, em_data_ptr(all), (int)bytes, MPI_BYTE, MPI_COMM_WORLD) ==
                MPI_SUCCESS;
    for (int r = 0; same && r < N; r++) same = memcmp((char *)em_data_ptr(all) + (size_t)r * bytes, em_data_ptr(mine), bytes) == 0;
    em_scope_end(s);
    return same;
}

/* One all_reduce checked every way: against the exact value computed here from every
 * rank's inputs, MPI_Allreduce's result (integer types), and across ranks. */
static void check_one(int64_t n, em_dtype dt, em_reduce_op op, const char *algo) {
    em_scope s = em_scope_begin();
    em_tensor *t = rank_tensor(R, n, dt);
    em_status st = em_dist_all_reduce(NULL, t, op);
    CHECK_OK(st);
    if (st != EM_OK) {
        em_scope_end(s);
        return;
    }
    em_tensor *got = em_to_dtype(t, EM_F64);
    const double *g = em_data_ptr(got);
    bool floating = em_dtype_is_floating(dt);
    double tol = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-5 : dt == EM_F16 ? 2e-3 : dt == EM_BF16 ? 1e-2 : 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = value(0, i, dt), mag = fabs(want);
        for (int r = 1; r < N; r++) {
            double v = value(r, i, dt);
            mag += fabs(v);
            if (dt == EM_BOOL) want = op == EM_REDUCE_MIN ? (want != 0 && v != 0) : (want != 0 || v != 0);
            else if (op == EM_REDUCE_MAX) want = v > want ? v : want;
            else if (op == EM_REDUCE_MIN) want = v < want ? v : want;
            else want += v;
        }
        if (op == EM_REDUCE_AVG) want /= N, mag /= N;
        if (dt == EM_U8 && op == EM_REDUCE_SUM) want = fmod(want, 256); /* wraps, as MPI's */
        /* floating inputs were rounded to dt: the tolerance covers it, relative to the
         * sum of magnitudes */
        double err = fabs(g[i] - want);
        if (!(err <= tol * (mag + 1))) {
            if (bad++ < 3)
                fprintf(stderr, "rank %d: %s %s op %d n %lld: element %lld is %.17g, expected %.17g\n", R, algo,
                        em_dtype_name(dt), (int)op, (long long)n, (long long)i, g[i], want);
        }
    }
    CHECK(bad == 0);
    CHECK(same_bits_everywhere(t));
    /* Open MPI 4.1's AVX op component saturates uint8 sums of 64 elements and more (255)
     * where its scalar path wraps, as Ember and PyTorch do: that case is checked above only */
    if (!floating && dt != EM_BOOL && !(dt == EM_U8 && op == EM_REDUCE_SUM)) {
        em_tensor *ref = rank_tensor(R, n, dt);
        MPI_Op mop = op == EM_REDUCE_MAX ? MPI_MAX : op == EM_REDUCE_MIN ? MPI_MIN : MPI_SUM;
        CHECK(MPI_Allreduce(MPI_IN_PLACE, em_data_ptr(ref), (int)n, mpi_dtype(dt), mop, MPI_COMM_WORLD) == MPI_SUCCESS);
        bool same = memcmp(em_data_ptr(ref), em_data_ptr(t), (size_t)n * em_dtype_size(dt)) == 0;
        if (!same)
            fprintf(stderr, "rank %d: %s %s op %d n %lld: differs from MPI_Allreduce's result (first element %g, MPI's %g)\n",
                    R, algo, em_dtype_name(dt), (int)op, (long long)n, em_item(em_select(t, 0, 0)), em_item(em_select(ref, 0, 0)));
        CHECK(same);
    }
    em_scope_end(s);
}

static const char *algo_name(void) {
    const char *a = getenv("EMBER_DIST_ALLREDUCE");
    return a && *a ? a : "auto";
}

static void case_every_dtype_op_size(void) {
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I64, EM_I32, EM_U8, EM_BOOL, EM_F16, EM_BF16};
    /* 1 element (fewer than the ranks: empty ring chunks), sizes that do not divide by 2, 3
     * or 4, and (float32) a ring step split in several segments */
    const int64_t sizes[] = {1, 2, 5, 1001, 30011};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++)
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++)
            for (int op = EM_REDUCE_SUM; op <= EM_REDUCE_MIN; op++) {
                if (op == EM_REDUCE_AVG && !em_dtype_is_floating(dts[k])) continue;
                check_one(sizes[z], dts[k], (em_reduce_op)op, algo_name());
            }
    /* the ring's segments (256 KB, 4 in flight): 1.5 MB of float32 per rank */
    check_one(393241, EM_F32, EM_REDUCE_SUM, algo_name());
    check_one(393241, EM_F32, EM_REDUCE_MAX, algo_name());
}

/* NaN wins max and min from either side, on every rank alike. */
static void case_nan(void) {
    {
        em_scope s = em_scope_begin();
        em_tensor *t = em_full(EM_SHAPE(37), R, EM_OPTS(0));
        float *p = em_data_ptr(t);
        p[R] = NAN; /* element r is NaN on rank r only */
        em_tensor *mx = em_clone(t), *mn = em_clone(t);
        CHECK_OK(em_dist_all_reduce(NULL, mx, EM_REDUCE_MAX));
        CHECK_OK(em_dist_all_reduce(NULL, mn, EM_REDUCE_MIN));
        const float *x = em_data_ptr(mx), *m = em_data_ptr(mn);
        for (int i = 0; i < 37; i++) {
            CHECK(i < N ? isnan(x[i]) && isnan(m[i]) : x[i] == N - 1 && m[i] == 0);
        }
        em_scope_end(s);
    }
}

/* Ring all_reduces waited for in opposite orders on different ranks: each wait moves the
 * other along too, or the ranks would wait on each other until the timeout. */
static void case_wait_orders(void) {
    CHECK_OK(em_dist_set_timeout(NULL, 30));
    em_scope s = em_scope_begin();
    em_tensor *a = em_full(EM_SHAPE(200003), 1, EM_OPTS(0)), *b = em_full(EM_SHAPE(100001), 2, EM_OPTS(0));
    em_dist_work *wa = em_dist_all_reduce_async(NULL, a, EM_REDUCE_SUM);
    em_dist_work *wb = em_dist_all_reduce_async(NULL, b, EM_REDUCE_SUM);
    CHECK(wa && wb);
    double t0 = now_s();
    if (R % 2) {
        CHECK_OK(em_dist_wait(wb));
        CHECK_OK(em_dist_wait(wa));
    } else {
        CHECK_OK(em_dist_wait(wa));
        CHECK_OK(em_dist_wait(wb));
    }
    CHECK(now_s() - t0 < 10);
    em_dist_work_free(wa);
    em_dist_work_free(wb);
    CHECK(em_item(em_select(a, 0, 200002)) == N && em_item(em_select(b, 0, 0)) == 2.0 * N);
    em_scope_end(s);
    CHECK_OK(em_dist_set_timeout(NULL, 300));
}

/* A mismatched size is reported by both algorithms (after the headers), never reduced. */
static void case_mismatch_ring(void) {
    em_tensor *t = em_ones(EM_SHAPE(100000 + R), EM_OPTS(0));
    CHECK(em_dist_all_reduce(NULL, t, EM_REDUCE_SUM) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "differs across ranks") != NULL);
    /* rank 0 names the first differing header to arrive: rank 1's or rank 2's */
    if (R == 0)
        CHECK(strstr(em_last_error(), "rank 1 called all_reduce(sum) of 100001 float32") != NULL ||
              strstr(em_last_error(), "rank 2 called all_reduce(sum) of 100002 float32") != NULL);
    fprintf(stderr, "rank %d error: %s\n", R, em_last_error());
    em_clear_error();
    em_release(t);
}

/* The last rank enters the ring, then stops moving it: rank 0, its right neighbour, times
 * out naming it. */
static void case_stall_mid_ring(void) {
    CHECK_OK(em_dist_set_timeout(NULL, 1.5));
    em_tensor *t = em_ones(EM_SHAPE(1 << 20), EM_OPTS(0));
    if (R == N - 1) {
        em_dist_work *w = em_dist_all_reduce_async(NULL, t, EM_REDUCE_SUM); /* headers and step 1 posted */
        CHECK(w != NULL);
        sleep(5); /* stuck: never tests it again */
        CHECK(em_dist_wait(w) == EM_ERR_BACKEND); /* then its own deadline has passed too */
        em_clear_error();
        em_dist_work_free(w);
        em_release(t);
        return;
    }
    double t0 = now_s();
    CHECK(em_dist_all_reduce(NULL, t, EM_REDUCE_SUM) == EM_ERR_BACKEND);
    double took = now_s() - t0;
    CHECK(took >= 1.4 && took < 4.0);
    if (R == 0) {
        char want[64];
        snprintf(want, sizeof want, "rank %d did not answer at step", N - 1);
        CHECK(strstr(em_last_error(), "em_dist_all_reduce: timed out after 1.5 s on rank 0") != NULL);
        CHECK(strstr(em_last_error(), "every rank entered it") != NULL);
        CHECK(strstr(em_last_error(), want) != NULL);
    }
    fprintf(stderr, "rank %d error after %.2f s: %s\n", R, took, em_last_error());
    em_clear_error();
    em_release(t);
}
#endif

static int rank_main(const char *mode) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (em_dist_init("mpi") != EM_OK) {
        printf("rank ?: FAIL em_dist_init: %s\n", em_last_error());
        return 1;
    }
    R = em_dist_rank(NULL);
    N = em_dist_world_size(NULL);
    bool faulty = false;
#ifdef EMBER_HAVE_MPI
    if (!strcmp(mode, "algo")) {
        RUN(case_every_dtype_op_size);
        RUN(case_nan);
        RUN(case_wait_orders);
    } else if (!strcmp(mode, "mismatch_ring")) {
        RUN(case_mismatch_ring);
        faulty = true;
    } else if (!strcmp(mode, "stall")) {
        RUN(case_stall_mid_ring);
        faulty = true;
    }
#endif
    int rc = test_summary();
    printf("rank %d: %s %s\n", R, rc == 1 ? "FAIL" : "PASS", mode);
    fflush(stdout);
    fflush(stderr);
    em_dist_finalize();
    if (faulty) { /* a broken group: leave without MPI_Finalize (see test_dist.c) */
        if (R != 0) sleep(3);
        _exit(rc == 1 ? 1 : 0);
    }
    return rc == 1 ? 1 : 0;
}

static char out[1 << 20];

static void expect_all_pass(int n, const char *mode, const char *env) {
    int st = dist_run(n, mode, env, out, sizeof out);
    char want[64];
    int passed = 0;
    for (int r = 0; r < n; r++) {
        snprintf(want, sizeof want, "rank %d: PASS %s", r, mode);
        passed += dist_count(out, want) == 1;
    }
    if (st != 0 || passed != n) {
        char title[160];
        snprintf(title, sizeof title, "%d ranks, %s, %s: exit %d, %d of %d ranks passed", n, mode, env, st, passed, n);
        dist_print_failure(title, out);
    }
    CHECK(st == 0);
    CHECK(passed == n);
}

static void expect_rank0_pass(int n, const char *mode) {
    double t0 = now_s();
    int st = dist_run(n, mode, "EMBER_DIST_ALLREDUCE=ring", out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "rank 0: PASS %s", mode);
    bool ok = dist_count(out, want) == 1 && dist_count(out, "FAIL") == 0;
    if (!ok) {
        char title[96];
        snprintf(title, sizeof title, "%d ranks, %s: exit %d", n, mode, st);
        dist_print_failure(title, out);
    }
    CHECK(ok);
    CHECK(now_s() - t0 < 60);
}

static const char *const ALGOS[] = {"EMBER_DIST_ALLREDUCE=direct", "EMBER_DIST_ALLREDUCE=ring", "EMBER_DIST_ALLREDUCE="};
static void every_algo(int n) {
    for (int a = 0; a < 3; a++) expect_all_pass(n, "algo", ALGOS[a]);
}
static void test_two_ranks(void) { every_algo(2); }
static void test_three_ranks(void) { every_algo(3); }
static void test_four_ranks(void) { every_algo(4); }
static void test_mismatch_in_ring(void) { expect_rank0_pass(3, "mismatch_ring"); }
static void test_stall_two_ranks(void) { expect_rank0_pass(2, "stall"); }
static void test_stall_three_ranks(void) { expect_rank0_pass(3, "stall"); }

int main(void) {
    const char *mode = dist_mode();
    if (mode) return rank_main(mode);
    const char *why = dist_unavailable();
    if (why) {
        test_skip_case("test_dist_allreduce", "%s", why);
        return test_summary();
    }
    RUN(test_two_ranks);
    RUN(test_three_ranks);
    RUN(test_four_ranks);
    RUN(test_mismatch_in_ring);
    RUN(test_stall_two_ranks);
    RUN(test_stall_three_ranks);
    return test_summary();
}
