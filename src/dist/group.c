/* The world process group: em_dist_init / em_dist_finalize over Open MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dist_internal.h"
#include "../core/internal_api.h"

static em_dist_group *g_world;

double em__dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void em__dist_break(em_dist_group *g, const char *msg) {
    if (g->broken) return;
    g->broken = true;
    g->broken_msg = strdup(msg ? msg : "an earlier collective failed");
}

em_dist_group *em__dist_resolve(em_dist_group *g, const char *op) {
    if (!g) g = g_world;
    if (!g) {
        em_error(EM_ERR_ARGUMENT, "%s: the default process group is not initialized: call em_dist_init first", op);
        return NULL;
    }
    if (g->broken) {
        em_error(EM_ERR_BACKEND, "%s: the process group on rank %d is broken by an earlier failure (%s); exit and restart the job",
                 op, g->rank, g->broken_msg);
        return NULL;
    }
    return g;
}

bool em_dist_is_initialized(void) { return g_world != NULL; }
em_dist_group *em_dist_world(void) { return g_world; }
int em_dist_local_rank(void) { return g_world ? g_world->local_rank : 0; }

int em_dist_rank(const em_dist_group *g) {
    if (!g) g = g_world;
    if (!g) {
        em_error(EM_ERR_ARGUMENT, "em_dist_rank: the default process group is not initialized: call em_dist_init first");
        return 0;
    }
    return g->rank;
}

int em_dist_world_size(const em_dist_group *g) {
    if (!g) g = g_world;
    return g ? g->size : 1;
}

const char *em_dist_backend(const em_dist_group *g) {
    if (!g) g = g_world;
    return g ? g->backend : NULL;
}

em_status em_dist_set_timeout(em_dist_group *g, double seconds) {
    if (!g) g = g_world;
    if (!g) return em_error(EM_ERR_ARGUMENT, "em_dist_set_timeout: the default process group is not initialized");
    if (!(seconds > 0) || seconds > 1e9)
        return em_error(EM_ERR_ARGUMENT, "em_dist_set_timeout: expected seconds > 0, got %g", seconds);
    g->timeout_s = seconds;
    return EM_OK;
}

double em_dist_timeout(const em_dist_group *g) {
    if (!g) g = g_world;
    return g ? g->timeout_s : 0;
}

static em_status env_timeout(double *out) {
    *out = 300;
    const char *v = getenv("EMBER_DIST_TIMEOUT");
    if (!v || !*v) return EM_OK;
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x > 0) || x > 1e9)
        return em_error(EM_ERR_ARGUMENT, "em_dist_init: EMBER_DIST_TIMEOUT must be seconds > 0, got '%s'", v);
    *out = x;
    return EM_OK;
}

void em__dist_bury(em_dist_group *g) {
    while (g->graveyard) {
        em_dist_work *w = g->graveyard;
        g->graveyard = w->next_dead;
        em__dist_work_free_now(w);
    }
}

#ifdef EMBER_HAVE_MPI
static bool g_we_initialized_mpi;

static em_status mpi_fail(const char *what, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return em_error(EM_ERR_BACKEND, "em_dist_init: %s failed: %s", what, s);
}

em_status em_dist_init(const char *backend) {
    if (g_world) return em_error(EM_ERR_ARGUMENT, "em_dist_init: the default process group is already initialized");
    const char *b = backend ? backend : "auto";
    const char *env_b = getenv("EMBER_DIST_BACKEND");
    if ((!backend || !strcmp(backend, "auto")) && env_b && *env_b) b = env_b;
    if (strcmp(b, "auto") && strcmp(b, "mpi") && strcmp(b, "nccl"))
        return em_error(EM_ERR_ARGUMENT, "em_dist_init: expected backend \"mpi\", \"nccl\" or \"auto\", got \"%s\"", b);
    /* "nccl": CUDA tensors through NCCL (others through MPI); "auto": the same where CUDA
     * and NCCL are there, else MPI for everything */
    bool use_nccl = false;
    if (strcmp(b, "mpi")) {
        bool cuda = em_device_available(EM_CUDA);
        const char *why = NULL;
        if (!strcmp(b, "nccl") && !cuda)
            return em_error(EM_ERR_UNAVAILABLE, "em_dist_init: backend \"nccl\" needs CUDA, which is not available: %s",
                            em_device_unavailable_reason(EM_CUDA));
        use_nccl = cuda && em__dist_nccl(NULL, &why) != NULL;
        if (!strcmp(b, "nccl") && !use_nccl)
            return em_error(EM_ERR_UNAVAILABLE, "em_dist_init: backend \"nccl\": %s", why ? why : "NCCL cannot be loaded");
    }
    em_dist_env env;
    em_status st = em_dist_env_read(&env);
    if (st != EM_OK) return st;
    if (!strcmp(env.source, "torchrun") && env.size > 1)
        return em_error(EM_ERR_UNAVAILABLE,
                        "em_dist_init: started with torchrun's variables (RANK=%d, WORLD_SIZE=%d) but not by an MPI "
                        "launcher: Ember's ranks talk through Open MPI, so start them with `ember launch -n %d -- PROGRAM`, "
                        "`mpirun -np %d PROGRAM` or srun",
                        env.rank, env.size, env.size, env.size);
    double timeout;
    if ((st = env_timeout(&timeout)) != EM_OK) return st;
    /* EMBER_DIST_ALLREDUCE: one all_reduce algorithm for every call (benchmarks, tests) */
    const char *algo = getenv("EMBER_DIST_ALLREDUCE");
    int ar_force = -1;
    if (algo && *algo) {
        ar_force = !strcmp(algo, "mpi") ? AR_MPI : !strcmp(algo, "direct") ? AR_DIRECT : !strcmp(algo, "ring") ? AR_RING : -1;
        if (ar_force < 0)
            return em_error(EM_ERR_ARGUMENT, "em_dist_init: EMBER_DIST_ALLREDUCE must be \"direct\", \"ring\" or \"mpi\", got '%s'",
                            algo);
    }
    int inited = 0, rc;
    MPI_Initialized(&inited);
    /* Open MPI's non-blocking all-reduce (libnbc) takes its binomial algorithm for 2 ranks,
     * a reduce to one rank then a broadcast: nearly twice the blocking call's time for large
     * buffers. Recursive doubling is one exchange for 2 ranks and
     * gives both the same bits (a + b == b + a). A user's own setting wins. */
    if (!inited && env.size == 2) setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "recursive_doubling", 0);
    if (!inited) {
        int provided;
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return em_error(EM_ERR_BACKEND, "em_dist_init: MPI_Init_thread failed (code %d)", rc);
        g_we_initialized_mpi = true;
        /* a failed non-blocking collective can be reported on MPI_COMM_WORLD's handler
         * (libnbc), whose default aborts the job: Ember reports it instead */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    em_dist_group *g = calloc(1, sizeof *g);
    if (!g) return em_error(EM_ERR_OUT_OF_MEMORY, "em_dist_init: out of host memory");
    g->timeout_s = timeout;
    g->backend = use_nccl ? "nccl" : "mpi";
    g->use_nccl = use_nccl;
    g->local_rank = env.local_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &g->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g->size);
    if (strcmp(env.source, "none") && (env.rank != g->rank || env.size != g->size)) {
        st = em_error(EM_ERR_ARGUMENT, "em_dist_init: %s's variables say rank %d of %d but MPI says rank %d of %d",
                      env.source, env.rank, env.size, g->rank, g->size);
        free(g);
        return st;
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &g->comm)) != MPI_SUCCESS) {
        free(g);
        return mpi_fail("MPI_Comm_dup", rc);
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &g->hcomm)) != MPI_SUCCESS) {
        MPI_Comm_free(&g->comm);
        free(g);
        return mpi_fail("MPI_Comm_dup", rc);
    }
    /* errors come back as codes (Ember reports them), never MPI's abort */
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g->hcomm, MPI_ERRORS_RETURN);
    /* all_reduce's messages are tagged by sequence number, modulo the largest tag */
    int *ub = NULL, has = 0;
    MPI_Comm_get_attr(g->comm, MPI_TAG_UB, &ub, &has);
    g->tag_ub = has && ub && *ub > 0 ? *ub : 32767;
    g->ar_force = ar_force;
    g_world = g;
    return EM_OK;
}

em_status em_dist_finalize(void) {
    if (!g_world) return em_error(EM_ERR_ARGUMENT, "em_dist_finalize: the default process group is not initialized");
    em_dist_group *g = g_world;
    g_world = NULL;
    bool broken = g->broken;
    if (broken) em__dist_nccl_abort(g);
    else em__dist_nccl_destroy(g);
    em__dist_bury(g);
    free(g->ar_spare);
    free(g->broken_msg);
    if (!broken) {
        MPI_Comm_free(&g->comm);
        MPI_Comm_free(&g->hcomm);
    }
    free(g);
    /* a broken group has collectives MPI cannot cancel: MPI_Finalize would wait for the
     * peers forever, so the process exits without it (mpirun then stops the others) */
    if (broken) return EM_OK;
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_we_initialized_mpi && !fin) MPI_Finalize();
    g_we_initialized_mpi = false;
    return EM_OK;
}
#else
em_status em_dist_init(const char *backend) {
    (void)backend;
    return em_error(EM_ERR_UNAVAILABLE,
                    "em_dist_init: this Ember was built without MPI (install Debian's libopenmpi-dev and rebuild: "
                    "CMake then defines EMBER_HAVE_MPI)");
}
em_status em_dist_finalize(void) {
    return em_error(EM_ERR_ARGUMENT, "em_dist_finalize: the default process group is not initialized");
}
#endif
