/* The NCCL path of src/dist against a fake NCCL, over the fake CUDA driver (device memory
 * is host memory): a one-rank group with backend "nccl"; every collective's arguments
 * (buffers, counts, NCCL's dtype and op codes, root, communicator, the device's stream)
 * and the call sequence (unique id on rank 0, one ncclCommInitRank, each collective
 * between ncclGroupStart and ncclGroupEnd) are checked; the fake also does the one-rank
 * arithmetic so that results can be read back. */
#include <unistd.h>
#include "test.h"
#ifdef EMBER_HAVE_CUDA_HEADERS
#include "cuda_fake_driver.h"
#include "dist/dist_internal.h"

static struct {
    char log[4096];   /* the calls, in order */
    int inits, destroys, aborts, group_depth, bad_group;
    int nranks, rank;
    const void *send;
    void *recv;
    size_t count;
    int dtype, op, root;
    void *comm, *stream;
    int version;
} N;
static char comm_tag;

static void logc(const char *s) { strncat(N.log, s, sizeof N.log - strlen(N.log) - 1); }
static int n_version(int *v) { *v = N.version; return 0; }
static int n_unique(em_nccl_unique_id *id) { logc("id "); memset(id, 7, sizeof *id); return 0; }
static int n_init(void **comm, int nranks, em_nccl_unique_id id, int rank) {
    logc("init ");
    N.inits++;
    N.nranks = nranks;
    N.rank = rank;
    if (id.internal[0] != 7 || id.internal[127] != 7) return 4; /* ncclInvalidArgument: the id was not passed on */
    *comm = &comm_tag;
    return 0;
}
static int n_destroy(void *c) { logc("destroy "); N.destroys += c == &comm_tag; return 0; }
static int n_abort(void *c) { logc("abort "); N.aborts += c == &comm_tag; return 0; }
static int n_async(void *c, int *e) { *e = 0; return c == &comm_tag ? 0 : 4; }
static const char *n_str(int r) { return r == 4 ? "invalid argument" : "error"; }
static int n_gstart(void) { logc("("); N.group_depth++; return 0; }
static int n_gend(void) { logc(") "); if (N.group_depth-- != 1) N.bad_group++; return 0; }
static void note(const char *name, const void *s, void *r, size_t n, int dt, int op, int root, void *comm, void *stream) {
    logc(name);
    if (N.group_depth != 1) N.bad_group++;
    N.send = s, N.recv = r, N.count = n, N.dtype = dt, N.op = op, N.root = root, N.comm = comm, N.stream = stream;
}
static size_t esize(int dt) { return dt == NCCL_FLOAT64 || dt == NCCL_INT64 ? 8 : dt == NCCL_FLOAT16 || dt == NCCL_BFLOAT16 ? 2 : dt == NCCL_UINT8 ? 1 : 4; }
/* one rank: every collective copies its input to its output */
static int n_allreduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st) {
    note("allreduce", s, r, n, dt, op, -1, c, st);
    if (s != r) memcpy(r, s, n * esize(dt));
    return 0;
}
static int n_bcast(const void *s, void *r, size_t n, int dt, int root, void *c, void *st) {
    note("broadcast", s, r, n, dt, -1, root, c, st);
    return 0;
}
static int n_allgather(const void *s, void *r, size_t n, int dt, void *c, void *st) {
    note("allgather", s, r, n, dt, -1, -1, c, st);
    memcpy(r, s, n * esize(dt));
    return 0;
}
static int n_redscat(const void *s, void *r, size_t n, int dt, int op, void *c, void *st) {
    note("reducescatter", s, r, n, dt, op, -1, c, st);
    memcpy(r, s, n * esize(dt));
    return 0;
}
static const em_nccl_api FAKE = {
    .ncclGetVersion = n_version, .ncclGetUniqueId = n_unique, .ncclCommInitRank = n_init,
    .ncclCommDestroy = n_destroy, .ncclCommAbort = n_abort, .ncclCommGetAsyncError = n_async,
    .ncclGetErrorString = n_str, .ncclAllReduce = n_allreduce, .ncclBroadcast = n_bcast,
    .ncclAllGather = n_allgather, .ncclReduceScatter = n_redscat, .ncclGroupStart = n_gstart,
    .ncclGroupEnd = n_gend};

static em_cu_api g_cu;
static const em_device CUDA0 = {EM_CUDA, 0};

static em_tensor *on_cuda(const float *v, int64_t n) {
    return em_to(em_from_data(v, EM_F32, EM_SHAPE(n), EM_OPTS(0)), CUDA0);
}

static void test_nccl_marshalling(void) {
    if (!em_device_available(EM_CUDA)) SKIP("the fake CUDA driver did not load: %s", em_device_unavailable_reason(EM_CUDA));
    CHECK_OK(em_dist_init("nccl"));
    CHECK(!strcmp(em_dist_backend(NULL), "nccl"));
    em_scope s = em_scope_begin();
    float v[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *t = on_cuda(v, 6);
    CHECK(t != NULL);
    CHECK_OK(em_dist_all_reduce(NULL, t, EM_REDUCE_MAX));
    /* the unique id, broadcast over MPI, then one communicator for cuda:0 */
    CHECK(!strncmp(N.log, "id init (allreduce) ", 20));
    CHECK(N.inits == 1 && N.nranks == 1 && N.rank == 0);
    CHECK(N.count == 6 && N.dtype == NCCL_FLOAT32 && N.op == NCCL_MAX && N.comm == &comm_tag);
    CHECK(N.stream == (void *)&stream_tag[0]);  /* cuda:0's stream in the fake driver */
    CHECK(N.send == N.recv && N.recv != NULL); /* in place, on the tensor's device memory */
    float back[6];
    CHECK_OK(em_copy_to_host(t, back, sizeof back));
    CHECK(!memcmp(back, v, sizeof v));
    /* avg: ncclAvg from NCCL 2.10 on; before, a sum divided by the world size */
    CHECK_OK(em_dist_all_reduce(NULL, t, EM_REDUCE_AVG));
    CHECK(N.op == NCCL_AVG);
    N.version = 20903;
    em_status st = em_dist_all_reduce(NULL, t, EM_REDUCE_AVG);
    CHECK(N.op == NCCL_SUM);
    /* the division is a kernel, which the fake driver cannot run */
    CHECK(st == EM_OK || strstr(em_last_error(), "NVRTC") != NULL);
    em_clear_error();
    N.version = 22703;
    CHECK_OK(em_dist_all_reduce(NULL, t, EM_REDUCE_MIN));
    CHECK(N.op == NCCL_MIN);
    /* dtypes */
    /* dtypes (converted on the CPU: the fake driver runs no kernels) */
    em_tensor *c = em_from_data(v, EM_F32, EM_SHAPE(6), EM_OPTS(0));
    em_tensor *h = em_to(em_to_dtype(c, EM_F16), CUDA0), *bf = em_to(em_to_dtype(c, EM_BF16), CUDA0);
    em_tensor *d = em_to(em_to_dtype(c, EM_F64), CUDA0), *i64 = em_to(em_to_dtype(c, EM_I64), CUDA0);
    CHECK_OK(em_dist_all_reduce(NULL, h, EM_REDUCE_SUM));
    CHECK(N.dtype == NCCL_FLOAT16 && N.op == NCCL_SUM);
    CHECK_OK(em_dist_all_reduce(NULL, bf, EM_REDUCE_SUM));
    CHECK(N.dtype == NCCL_BFLOAT16);
    CHECK_OK(em_dist_all_reduce(NULL, d, EM_REDUCE_SUM));
    CHECK(N.dtype == NCCL_FLOAT64);
    CHECK_OK(em_dist_broadcast(NULL, i64, 0));
    CHECK(N.dtype == NCCL_INT64 && N.root == 0 && N.count == 6);
    /* all_gather: the send count; reduce_scatter: the receive count */
    em_tensor *out = em_to(em_zeros(EM_SHAPE(6), EM_OPTS(0)), CUDA0);
    CHECK_OK(em_dist_all_gather(NULL, out, t));
    CHECK(N.count == 6 && N.send != N.recv);
    CHECK_OK(em_dist_reduce_scatter(NULL, out, t, EM_REDUCE_SUM));
    CHECK(N.count == 6 && N.op == NCCL_SUM);
    CHECK_OK(em_copy_to_host(out, back, sizeof back));
    CHECK(back[5] == 6);
    /* CPU tensors of an NCCL group go through MPI */
    size_t before = strlen(N.log);
    CHECK_OK(em_dist_all_reduce(NULL, em_ones(EM_SHAPE(3), EM_OPTS(0)), EM_REDUCE_SUM));
    CHECK(strlen(N.log) == before);
    CHECK(N.bad_group == 0);
    CHECK(N.inits == 1);
    em_scope_end(s);
    CHECK_OK(em_dist_finalize());
    CHECK(N.destroys == 1 && N.aborts == 0);
    printf("NCCL calls: %s\n", N.log);
}

/* The real libnccl.so.2, when installed: every function Ember calls resolves; when not:
 * backend "nccl" is an error that says why (before MPI starts: MPI can start once). */
static void test_nccl_real_library(void) {
    if (!em_device_available(EM_CUDA)) SKIP("the fake CUDA driver did not load");
    em__dist_nccl_use_fake(NULL);
    int version = 0;
    const char *why = NULL;
    const em_nccl_api *api = em__dist_nccl(&version, &why);
    if (api) {
        CHECK(version >= 20000);
        void *const *fn = (void *const *)api;
        for (size_t i = 0; i < sizeof *api / sizeof(void *); i++) CHECK(fn[i] != NULL);
        printf("libnccl.so.2 found: NCCL %d, all %zu functions resolved\n", version, sizeof *api / sizeof(void *));
    } else {
        CHECK(why && strstr(why, "nccl"));
        CHECK(em_dist_init("nccl") == EM_ERR_UNAVAILABLE);
        CHECK_ERROR(EM_ERR_UNAVAILABLE, "backend \"nccl\": ");
        CHECK(!em_dist_is_initialized());
    }
    em__dist_nccl_use_fake(&FAKE);
}

int main(int argc, char **argv) {
    (void)argc;
    const char *data = getenv("EMBER_TEST_DATA");
    const char *lsan = getenv("LSAN_OPTIONS");
    if (data && (!lsan || !strstr(lsan, "lsan.supp"))) { /* see test_dist_env.c */
        char opt[4200], asan[4200];
        snprintf(opt, sizeof opt, "suppressions=%s/../lsan.supp:print_suppressions=0", data);
        setenv("LSAN_OPTIONS", opt, 1);
        const char *a = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "%s%sfast_unwind_on_malloc=0", a ? a : "", a ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        execv("/proc/self/exe", argv);
    }
#ifndef EMBER_HAVE_MPI
    test_skip_case("test_dist_nccl", "built without MPI (the unique id travels over MPI)");
    return test_summary();
#endif
    memset(&F, 0, sizeof F);
    F.free_mem = (size_t)12 << 30;
    g_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc_reason = "no NVRTC (fake)", .cublas_reason = "no cuBLAS (fake)",
                              .nvml_reason = "no NVML (fake)"};
    em__cuda_loader_use_fakes(&libs);
    N.version = 22703;
    em__dist_nccl_use_fake(&FAKE);
    RUN(test_nccl_real_library);   /* first: it may fail before MPI starts, which can start once */
    RUN(test_nccl_marshalling);
    em__cuda_backend_reset();
    return test_summary();
}
#else
int main(void) {
    test_skip_case("test_dist_nccl", "built without the CUDA headers: no fake driver");
    return test_summary();
}
#endif
