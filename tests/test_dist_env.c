/* The process group without a launcher: reading rank and size from mpirun's, Slurm's and
 * torchrun's variables, the errors for inconsistent ones and for torchrun's variables
 * without an MPI launcher, calls before em_dist_init, and a one-process group (MPI
 * singleton) whose collectives are the identity. */
#include <stdlib.h>
#include <unistd.h>
#include "test.h"
#include "dist_run.h"

static const char *const VARS[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
static void clear_env(void) {
    for (size_t i = 0; i < sizeof VARS / sizeof *VARS; i++) unsetenv(VARS[i]);
}

static void test_env_sources(void) {
    em_dist_env e;
    clear_env();
    CHECK_OK(em_dist_env_read(&e));
    CHECK(e.rank == 0 && e.size == 1 && !strcmp(e.source, "none"));
    setenv("RANK", "2", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "0", 1);
    CHECK_OK(em_dist_env_read(&e));
    CHECK(e.rank == 2 && e.size == 4 && e.local_rank == 0 && !strcmp(e.source, "torchrun"));
    setenv("SLURM_PROCID", "2", 1), setenv("SLURM_NTASKS", "4", 1), setenv("SLURM_LOCALID", "1", 1);
    CHECK_OK(em_dist_env_read(&e));
    CHECK(e.local_rank == 1 && !strcmp(e.source, "slurm"));
    /* mpirun's win; torchrun's, when set too (ember launch), must agree */
    setenv("OMPI_COMM_WORLD_RANK", "3", 1), setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    CHECK(em_dist_env_read(&e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "mpirun says rank 3 of 4, torchrun says rank 2 of 4");
    setenv("RANK", "3", 1);
    CHECK_OK(em_dist_env_read(&e));
    CHECK(e.rank == 3 && !strcmp(e.source, "mpirun") && e.local_rank == 0);
    clear_env();
    setenv("RANK", "4", 1), setenv("WORLD_SIZE", "4", 1);
    CHECK(em_dist_env_read(&e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 0 <= RANK < WORLD_SIZE");
    setenv("RANK", "x", 1);
    CHECK(em_dist_env_read(&e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "found RANK=x");
    clear_env();
    CHECK(em_dist_env_read(NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'out' is NULL");
}

static void test_before_init(void) {
    CHECK(!em_dist_is_initialized());
    em_tensor *t = em_ones(EM_SHAPE(2), EM_OPTS(0));
    CHECK(em_dist_all_reduce(NULL, t, EM_REDUCE_SUM) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_dist_all_reduce: the default process group is not initialized");
    CHECK(em_ddp(NULL, NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'model' is NULL");
    CHECK(em_dist_world_size(NULL) == 1);
    CHECK(em_dist_finalize() == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "not initialized");
    CHECK(em_dist_init("gloo") == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected backend \"mpi\", \"nccl\" or \"auto\", got \"gloo\"");
    em_release(t);
}

static void test_torchrun_without_mpi_launcher(void) {
#ifndef EMBER_HAVE_MPI
    CHECK(em_dist_init("mpi") == EM_ERR_UNAVAILABLE);
    CHECK_ERROR(EM_ERR_UNAVAILABLE, "built without MPI");
    SKIP("built without MPI: only its error is checked");
#else
    setenv("RANK", "0", 1), setenv("WORLD_SIZE", "2", 1);
    CHECK(em_dist_init("mpi") == EM_ERR_UNAVAILABLE);
    CHECK_ERROR(EM_ERR_UNAVAILABLE, "not by an MPI launcher");
    clear_env();
    setenv("EMBER_DIST_TIMEOUT", "-3", 1);
    CHECK(em_dist_init("mpi") == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "EMBER_DIST_TIMEOUT must be seconds > 0, got '-3'");
    unsetenv("EMBER_DIST_TIMEOUT");
    CHECK(!em_dist_is_initialized());
#endif
}

/* One process, no launcher: an MPI singleton; every collective leaves the data as it is. */
static void test_singleton(void) {
#ifndef EMBER_HAVE_MPI
    SKIP("built without MPI");
#else
    clear_env();
    setenv("EMBER_DIST_ALLREDUCE", "fastest", 1); /* a forced all_reduce algorithm must be one of three */
    CHECK(em_dist_init(NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "EMBER_DIST_ALLREDUCE must be \"direct\", \"ring\" or \"mpi\", got 'fastest'");
    CHECK(!em_dist_is_initialized());
    unsetenv("EMBER_DIST_ALLREDUCE");
    setenv("EMBER_DIST_TIMEOUT", "7.5", 1);
    CHECK_OK(em_dist_init(NULL));
    unsetenv("EMBER_DIST_TIMEOUT");
    CHECK(em_dist_is_initialized() && em_dist_world_size(NULL) == 1 && em_dist_rank(NULL) == 0);
    /* "auto": NCCL for CUDA tensors where CUDA and NCCL are there (a GPU machine), else MPI */
    const char *backend = em_dist_backend(NULL);
    CHECK(em_dist_timeout(NULL) == 7.5 && backend &&
          (!strcmp(backend, "mpi") || (!strcmp(backend, "nccl") && em_device_available(EM_CUDA))));
    CHECK(em_dist_init("mpi") == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already initialized");
    CHECK(em_dist_set_timeout(NULL, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "seconds > 0");
    em_scope s = em_scope_begin();
    em_tensor *t = em_arange(0, 5, 1, EM_OPTS(0));
    CHECK_OK(em_dist_all_reduce(NULL, t, EM_REDUCE_AVG));
    CHECK(em_item(em_select(t, 0, 4)) == 4);
    em_tensor *out = em_zeros(EM_SHAPE(5), EM_OPTS(0));
    CHECK_OK(em_dist_all_gather(NULL, out, t));
    CHECK(em_item(em_sum(out, EM_ALL_DIMS, false)) == 10);
    CHECK_OK(em_dist_barrier(NULL));
    /* DDP over one process: gradients unchanged */
    em_module *m = em_nn_linear(3, 2);
    em_dist_ddp *d = em_ddp(m, NULL, NULL);
    CHECK(d && em_ddp_module(d) == m);
    CHECK_OK(em_backward(em_sum(em_ddp_forward(d, em_ones(EM_SHAPE(4, 3), EM_OPTS(0))), EM_ALL_DIMS, false)));
    em_named_tensor p[2];
    em_module_parameters(m, p, 2);
    CHECK(em_item(em_sum(em_grad(p[1].tensor), EM_ALL_DIMS, false)) == 8); /* bias: 4 rows x 2 outputs */
    em_ddp_free(d);
    em_module_free(m);
    em_scope_end(s);
    CHECK_OK(em_dist_finalize());
    CHECK(!em_dist_is_initialized());
#endif
}

int main(int argc, char **argv) {
    (void)argc;
    /* under ASan, MPI's own allocations are suppressed (tests/lsan.supp): LSan reads its
     * options at start-up, so set them and start again */
    const char *data = getenv("EMBER_TEST_DATA");
    const char *lsan = getenv("LSAN_OPTIONS");
    if (data && (!lsan || !strstr(lsan, "lsan.supp"))) {
        char opt[4200], asan[4200];
        snprintf(opt, sizeof opt, "suppressions=%s/../lsan.supp:print_suppressions=0", data);
        setenv("LSAN_OPTIONS", opt, 1);
        const char *a = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "%s%sfast_unwind_on_malloc=0", a ? a : "", a ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        execv("/proc/self/exe", argv);
    }
    RUN(test_env_sources);
    RUN(test_before_init);
    RUN(test_torchrun_without_mpi_launcher);
    RUN(test_singleton);
    return test_summary();
}
