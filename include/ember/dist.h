/* Distributed training over processes and hosts (torch.distributed in C): process groups,
 * collectives on tensors of any device, DistributedDataParallel.
 *
 *   if (em_dist_init("auto") != EM_OK) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
 *   em_dist_ddp *ddp = em_ddp(model, NULL, NULL);          // params broadcast from rank 0
 *   ... em_backward(loss);                            // gradients averaged over the ranks
 *   em_ddp_free(ddp); em_dist_finalize();
 *
 * ---- The environment contract (what a launcher sets; `ember launch` satisfies it) ----
 * Ember's processes talk through Open MPI, so they must be one MPI job: started by
 * `mpirun -np N` (also across hosts, --host A,B), by `ember launch` (which goes through
 * mpirun), or by Slurm's `srun` (Open MPI's PMIx support). Open MPI cannot join
 * independently started processes into one job without a server (MPI singletons fail in
 * MPI_Comm_connect), so a program started with torchrun's variables alone, by a launcher
 * that is not an MPI launcher, gets a clear error instead of a hang.
 * em_dist_init reads, first found wins:
 *   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK   (mpirun)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID                                 (srun)
 *   RANK, WORLD_SIZE, LOCAL_RANK (MASTER_ADDR, MASTER_PORT are not needed)  (torchrun's names)
 * When a launcher sets both mpirun's and torchrun's variables (as `ember launch` does), they
 * must agree, or em_dist_init fails naming both. WORLD_SIZE=1 without any MPI launcher
 * runs as a one-process group (MPI singleton).
 * EMBER_DIST_TIMEOUT (seconds, default 300) sets every collective's timeout;
 * EMBER_DIST_BACKEND overrides "auto". all_reduce runs over MPI point-to-point messages:
 * small buffers (up to 64 KB sent per rank, up to 8 ranks) by a direct exchange, each rank
 * reducing every rank's buffer in rank order; the rest by a ring (reduce-scatter then
 * all-gather); the results are bit-identical on every rank. EMBER_DIST_ALLREDUCE ("direct",
 * "ring" or "mpi": Open MPI's MPI_Iallreduce) forces one algorithm (another value: em_dist_init
 * fails). With 2 ranks Ember sets
 * OMPI_MCA_coll_libnbc_iallreduce_algorithm=recursive_doubling for the MPI collectives
 * unless it is set already (libnbc's default for 2 ranks is a reduce then a broadcast).
 * NCCL: its communicator is made at the first collective on a CUDA tensor (rank 0's
 * unique id broadcast over MPI); each rank uses one CUDA device.
 *
 * Collectives are entered by every rank of the group in the same order with the same
 * sizes and dtypes; each sends a small header (sequence number, operation, dtype, count)
 * alongside its data, so a rank that calls another collective or another size gets an
 * error naming both calls, never silently mixed data. Every collective ends within the
 * timeout: the error names the operation, this rank and the ranks that did not answer. After
 * such an error the group is broken (MPI cannot cancel a started collective): later calls
 * fail at once, and the program should exit. A group is used from one thread at a time. */
#ifndef EMBER_DIST_H
#define EMBER_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_dist_group em_dist_group;   /* NULL means the world group */
typedef struct em_dist_work em_dist_work;     /* an asynchronous collective */

/* How all_reduce / reduce_scatter combine the ranks' values (torch.distributed.ReduceOp). */
typedef enum em_reduce_op {
    EM_REDUCE_SUM, /* the sum */
    EM_REDUCE_AVG, /* the sum divided by the world size */
    EM_REDUCE_MAX, /* the largest */
    EM_REDUCE_MIN  /* the smallest */
} em_reduce_op;

/* ---- the process group ---- */
/* backend: "mpi" (every device; CPU buffers directly, other devices through pinned host
 * staging), "nccl" (CUDA tensors through NCCL, loaded with dlopen; others through MPI) or
 * "auto" (NCCL for CUDA tensors where NCCL loads, MPI otherwise); NULL means "auto".
 * Without MPI in the build: EM_ERR_UNAVAILABLE. A second call is an error. */
EM_API em_status em_dist_init(const char *backend);
EM_API bool em_dist_is_initialized(void); /* em_dist_init succeeded and no finalize since */
/* Waits for nothing: every collective must have been waited on. Frees the world group. */
EM_API em_status em_dist_finalize(void);
EM_API em_dist_group *em_dist_world(void); /* the world group (NULL before em_dist_init) */
EM_API int em_dist_rank(const em_dist_group *g);        /* 0 (and an error) when not initialized */
EM_API int em_dist_world_size(const em_dist_group *g);  /* 1 when not initialized */
EM_API int em_dist_local_rank(void);                    /* this process's index on its host */
/* The backend chosen ("mpi" or "nccl"). */
EM_API const char *em_dist_backend(const em_dist_group *g);
/* Timeout of every later collective of g (seconds > 0). */
EM_API em_status em_dist_set_timeout(em_dist_group *g, double seconds);
EM_API double em_dist_timeout(const em_dist_group *g); /* g's timeout in seconds */

/* Rank, size and local rank as em_dist_init would read them from the environment (also
 * without MPI in the build); which variables: "mpirun", "slurm", "torchrun" or "none". */
typedef struct em_dist_env {
    int rank;           /* this process's rank */
    int size;           /* the world size */
    int local_rank;     /* its index on its host */
    const char *source; /* "mpirun", "slurm", "torchrun" or "none" */
} em_dist_env;
EM_API em_status em_dist_env_read(em_dist_env *out); /* fills *out (see above) */

/* ---- collectives (in place; contiguous or not; any device; every rank the same dtype and
 * numel). Blocking versions wait; _async versions return a work handle. ---- */
EM_API em_status em_dist_all_reduce(em_dist_group *g, em_tensor *t, em_reduce_op op); /* t = op over every rank's t */
EM_API em_status em_dist_broadcast(em_dist_group *g, em_tensor *t, int root);           /* t = root's t */
/* out's numel = world size * in's numel; rank r's `in` lands in out's r-th part. */
EM_API em_status em_dist_all_gather(em_dist_group *g, em_tensor *out, em_tensor *in);
/* in's numel = world size * out's numel; out = the reduction of every rank's r-th part. */
EM_API em_status em_dist_reduce_scatter(em_dist_group *g, em_tensor *out, em_tensor *in, em_reduce_op op);
EM_API em_status em_dist_barrier(em_dist_group *g); /* returns when every rank has called it */

/* The same collectives started without waiting: a handle for em_dist_wait / em_dist_test
 * (NULL and an error when the start fails). The tensors must stay alive and untouched until
 * the handle has finished. */
EM_API em_dist_work *em_dist_all_reduce_async(em_dist_group *g, em_tensor *t, em_reduce_op op); /* all_reduce, started */
EM_API em_dist_work *em_dist_broadcast_async(em_dist_group *g, em_tensor *t, int root); /* broadcast, started */
EM_API em_dist_work *em_dist_all_gather_async(em_dist_group *g, em_tensor *out, em_tensor *in); /* all_gather, started */
EM_API em_dist_work *em_dist_reduce_scatter_async(em_dist_group *g, em_tensor *out, em_tensor *in, em_reduce_op op); /* reduce_scatter, started */
EM_API em_dist_work *em_dist_barrier_async(em_dist_group *g); /* barrier, started */
/* Wait until done (the result is then in the tensors) or the timeout. */
EM_API em_status em_dist_wait(em_dist_work *w);
/* Has it finished? *done true when it has (successfully or not: the status says). */
EM_API em_status em_dist_test(em_dist_work *w, bool *done);
/* Frees a handle; a handle not yet waited on is waited on first. NULL is ignored. */
EM_API void em_dist_work_free(em_dist_work *w);

/* ---- DistributedDataParallel ---- */
typedef struct em_dist_ddp em_dist_ddp; /* em_ddp() makes one */
/* em_ddp's settings (torch.nn.parallel.DistributedDataParallel's arguments). */
typedef struct em_ddp_opts {
    double first_bucket_mb;   /* 0 means 1 MiB, as PyTorch */
    double bucket_mb;         /* 0 means 25 MiB */
    bool find_unused_parameters; /* parameters without a gradient count as zeros instead of an error */
    /* PyTorch's gradient_as_bucket_view: each .grad becomes its slice of a bucket once copied
     * there, so the gradients are held once, not twice (the buckets' copy and the .grad
     * tensors): P bytes of a parameter's dtype less at the end of every backward. The .grad
     * tensors are then views that the next backward through the model rewrites. */
    bool gradient_as_bucket_view;
} em_ddp_opts;
/* Wraps model (not owned): broadcasts its parameters and buffers from rank 0 after checking
 * that every rank has the same names and shapes, and from then on every backward through
 * it all-reduces the gradients in buckets (reverse parameter order), each started from an
 * autograd hook as soon as its last gradient is ready, and averages them: after
 * em_backward returns, every rank holds the same averaged .grad. A parameter used more than
 * once in the graph (tied weights) is averaged whole, its uses' gradients summed first.
 * g NULL: the world. */
EM_API em_dist_ddp *em_ddp(em_module *model, em_dist_group *g, const em_ddp_opts *opts);
EM_API em_module *em_ddp_module(em_dist_ddp *d); /* the wrapped model (borrowed) */
/* The forward of the wrapped model. */
EM_API em_tensor *em_ddp_forward(em_dist_ddp *d, em_tensor *x);
/* no_sync: while on, backward only accumulates local gradients (gradient accumulation);
 * the first backward after it is turned off reduces the sum. */
EM_API void em_ddp_set_no_sync(em_dist_ddp *d, bool on);
/* Buckets: how many, and each one's number of parameters and bytes (for tests). */
EM_API int em_ddp_num_buckets(const em_dist_ddp *d);
EM_API em_status em_ddp_bucket_info(const em_dist_ddp *d, int i, int *nparams, int64_t *bytes); /* bucket i */
/* Time of the last backward: seconds spent waiting for all-reduces after the backward's
 * computation ended, and seconds all-reduces were in flight: the hidden share is
 * 1 - wait / total. */
typedef struct em_ddp_stats {
    double comm_wait_s;    /* waiting for all-reduces after the computation ended */
    double comm_total_s;   /* all-reduces in flight */
    int64_t reduced_bytes; /* gradient bytes all-reduced */
} em_ddp_stats;
EM_API em_ddp_stats em_ddp_last_stats(const em_dist_ddp *d); /* the last backward's */
EM_API void em_ddp_free(em_dist_ddp *d); /* unhooks and frees (not the model); NULL is ignored */

#ifdef __cplusplus
}
#endif
#endif
