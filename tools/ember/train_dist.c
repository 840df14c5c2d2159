/* `ember train` with DistributedDataParallel: every rank trains the same model on its own
 * shard of each epoch (the loader's distributed sampler), DDP averages the gradients, and
 * rank 0 alone prints and writes checkpoints. The checkpoint holds nothing per rank (DDP
 * keeps the weights and the optimizer state identical on every rank), so any number of
 * ranks can resume it; its train.world_size converts a mid-epoch position. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "train_dist.h"

static struct {
    bool active;
    int rank, world;
    em_dist_ddp *ddp;
    FILE *devnull;
} D = {.world = 1};

/* The launcher's world size (mpirun, srun or torchrun's names), 1 if none. */
static int launched_world(void) {
    em_dist_env e;
    if (em_dist_env_read(&e) != EM_OK) {
        em_clear_error();
        return 2; /* inconsistent variables: let em_dist_init say what is wrong */
    }
    return e.size;
}

static int local_world(void) {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

int train_dist_init(const char *tool, em_device *device, bool threads_given) {
    if (launched_world() <= 1) return 0;
    if (em_dist_init("auto") != EM_OK) {
        fprintf(stderr, "%s: cannot join the distributed job: %s\n", tool, em_last_error());
        return 1;
    }
    D.active = true;
    D.rank = em_dist_rank(NULL);
    D.world = em_dist_world_size(NULL);
    int local = em_dist_local_rank();
    /* each rank its own device, as torch.cuda.set_device(local_rank) */
    if (device->type != EM_CPU) {
        int n = em_device_count(device->type);
        if (n > 0) device->index = device->type == EM_CUDA ? local : local % n;
        if (device->type == EM_CUDA && local >= n) {
            fprintf(stderr, "%s: rank %d: local rank %d has no CUDA device (%d found)\n", tool, D.rank, local, n);
            return 1;
        }
    }
    /* ranks on one host share its cores */
    if (!threads_given) {
        int cores = em_get_num_threads(), per = cores / local_world();
        em_set_num_threads(per > 0 ? per : 1);
    }
    if (D.rank != 0) {
        D.devnull = fopen("/dev/null", "w");
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) return 1;
    }
    return 0;
}

bool train_dist_active(void) { return D.active; }
bool train_dist_is_main(void) { return D.rank == 0; }
int train_dist_rank(void) { return D.rank; }
int train_dist_world(void) { return D.world; }

int train_dist_wrap(const char *tool, em_module *model) {
    if (!D.active) return 0;
    D.ddp = em_ddp(model, NULL, NULL);
    if (!D.ddp) {
        fprintf(stderr, "%s: rank %d: DistributedDataParallel: %s\n", tool, D.rank, em_last_error());
        return 1;
    }
    printf("DistributedDataParallel over %d ranks (%s), each with its shard of every epoch; rank 0 prints and "
           "writes the checkpoints\n", D.world, em_dist_backend(NULL));
    return 0;
}

void train_dist_loader_opts(em_loader_opts *o) {
    if (!D.active) return;
    o->num_replicas = D.world;
    o->rank = D.rank;
}

bool train_dist_agree_stop(bool stop) {
    if (!D.active) return stop;
    em_scope s = em_scope_begin();
    em_tensor *f = em_full(EM_SHAPE(1), stop ? 1 : 0, EM_OPTS(.dtype = EM_I32));
    bool any = stop;
    if (f && em_dist_all_reduce(NULL, f, EM_REDUCE_MAX) == EM_OK) any = em_item(f) != 0;
    em_scope_end(s);
    return any;
}

/* x reduced over the ranks by op; failed: what the caller gave (a local value or NAN) */
static double reduce_scalar(double x, em_reduce_op op, double failed) {
    if (!D.active) return x;
    em_scope s = em_scope_begin();
    em_tensor *t = em_scalar(x, EM_OPTS(.dtype = EM_F64));
    double r = failed;
    if (t && em_dist_all_reduce(NULL, t, op) == EM_OK) r = em_item(t);
    em_scope_end(s);
    return r;
}

double train_dist_mean(double x) { return reduce_scalar(x, EM_REDUCE_AVG, x); }

double train_dist_sum(double x) { return reduce_scalar(x, EM_REDUCE_SUM, NAN); }

FILE *train_dist_progress_out(void) { return D.devnull ? D.devnull : stderr; }

void train_dist_convert_position(int64_t from_world, int64_t *batch, double *loss_sum) {
    if (from_world == D.world || *batch == 0) return;
    int64_t b = *batch * from_world / D.world;
    printf("the checkpoint was written by %lld rank%s, this run has %d: batch %lld of the epoch becomes batch %lld "
           "(the same samples done, counted over all ranks)\n",
           (long long)from_world, from_world == 1 ? "" : "s", D.world, (long long)*batch, (long long)b);
    *loss_sum = *loss_sum * (double)b / (double)*batch;
    *batch = b;
}

void train_dist_finish(void) {
    if (!D.active) return;
    em_ddp_free(D.ddp);
    D.ddp = NULL;
    if (em_dist_finalize() != EM_OK) em_clear_error();
    if (D.devnull) fclose(D.devnull);
    D.devnull = NULL;
    D.active = false;
}
