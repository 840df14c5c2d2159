/* Seed 002's DistributedDataParallel, in C: a real DDP program.
 *
 *   # torchrun --nproc_per_node=4 train.py
 *   def setup_ddp(rank, world_size):
 *       dist.init_process_group("nccl", rank=rank, world_size=world_size)
 *       torch.cuda.set_device(rank)
 *   model = DDP(model)
 *
 * Started alone (as CI runs the examples), it starts itself as 2 ranks with
 * `mpirun -np 2` (what `torchrun --nproc_per_node=2` or `ember launch -n 2` does), each
 * with its own device: cuda:LOCAL_RANK where there is a GPU per rank, else opencl:LOCAL_RANK over two
 * PoCL devices (POCL_DEVICES="pthread pthread"), else the CPU. Every rank trains the same
 * model on its own shard of the data; after each step the ranks check that their weights
 * agree bit for bit, and rank 0 prints. Without mpirun it trains as one rank. */
#include <unistd.h>
#include <ember/ember.h>
#include "seed_common.h"

/* torchrun's job: start the ranks. Returns the exit status of the job, or -1 to go on
 * here as the single rank. */
static int spawn_ranks(char **argv) {
    em_dist_env env;
    SEED_CHECK(em_dist_env_read(&env) == EM_OK);
    if (strcmp(env.source, "none")) return -1;       /* we are a rank already */
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("mpirun is not installed: training as one rank\n");
        return -1;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "POCL_DEVICES='pthread pthread' mpirun --oversubscribe --allow-run-as-root "
             "--mca btl self,vader,tcp -np 2 '%s'", self);
    printf("$ %s   # torchrun --nproc_per_node=2 %s\n", cmd, argv[0]);
    fflush(stdout);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/* torch.cuda.set_device(local_rank): this rank's device. NCCL wants a GPU per rank, so CUDA
 * only when there are enough GPUs for every rank (this one-host job's world); every rank
 * decides alike, so all use CUDA or none does. */
static em_device rank_device(int local_rank, int world) {
    if (em_device_available(EM_CUDA) && em_device_count(EM_CUDA) >= world)
        return (em_device){EM_CUDA, local_rank};
    if (em_device_available(EM_CUDA) && local_rank == 0)
        printf("%d CUDA device(s) for %d ranks: NCCL needs one per rank, so the ranks use another device\n",
               em_device_count(EM_CUDA), world);
    if (em_device_available(EM_OPENCL)) return (em_device){EM_OPENCL, local_rank % em_device_count(EM_OPENCL)};
    return EM_DEVICE_CPU;
}

int main(int argc, char **argv) {
    (void)argc;
    int job = spawn_ranks(argv);
    if (job >= 0) return job;

    /* dist.init_process_group(backend) with rank and world size from the launcher */
    SEED_CHECK(em_dist_init("auto") == EM_OK);
    int rank = em_dist_rank(NULL), world = em_dist_world_size(NULL);
    em_device dev = rank_device(em_dist_local_rank(), world);
    printf("rank %d of %d on %s (backend %s)\n", rank, world, em_device_str(dev).s, em_dist_backend(NULL));

    /* model = DDP(model): every rank builds it with its own seed; DDP broadcasts rank 0's */
    em_manual_seed(10 + (uint64_t)rank);
    em_module *model = em_nn_sequential(em_nn_linear(10, 32), em_nn_relu(), em_nn_linear(32, 2));
    SEED_CHECK(model && em_module_to(model, dev) == EM_OK);
    em_dist_ddp *ddp = em_ddp(model, NULL, NULL);
    SEED_CHECK(ddp);
    em_optimizer *opt = em_sgd(model, 0.1);
    SEED_CHECK(opt);

    /* the data: 256 samples (y = whether the features sum above 0), sharded over the ranks */
    em_manual_seed(1234);
    em_scope data = em_scope_begin();   /* the dataset keeps what it needs */
    em_tensor *x = em_randn(EM_SHAPE(256, 10), EM_OPTS(0));
    em_tensor *y = em_to_dtype(em_gt(em_sum(x, EM_DIMS(1), false), em_scalar(0, EM_OPTS(0))), EM_I64);
    em_dataset *ds = em_dataset_new(x, y);
    em_scope_end(data);
    SEED_CHECK(ds);
    em_loader *loader = em_loader_new(ds, (em_loader_opts){.batch_size = 16, .shuffle = true, .seed = 7,
                                                           .device = dev, .num_replicas = world, .rank = rank});
    SEED_CHECK(loader);

    double first = 0, last = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        SEED_CHECK(em_loader_set_epoch(loader, epoch) == EM_OK);   /* sampler.set_epoch(epoch) */
        double sum = 0;
        int64_t steps = 0;
        for (em_batch b = em_loader_iter(loader); em_loader_next(loader, &b);) {
            em_scope s = em_scope_begin();
            em_tensor *loss = em_cross_entropy(em_ddp_forward(ddp, b.x), b.y, 0.0);
            SEED_CHECK(em_zero_grad(opt) == EM_OK && em_backward(loss) == EM_OK && em_step(opt) == EM_OK);
            /* the ranks' weights agree bit for bit: each rank's sum of the first weight, gathered */
            em_tensor *w = em_sum(em_cpu(module_param(em_module_child(model, 0), "weight")), EM_ALL_DIMS, true);
            em_tensor *all = em_zeros(EM_SHAPE(world), EM_OPTS(0));
            SEED_CHECK(em_dist_all_gather(NULL, all, em_reshape(w, EM_SHAPE(1))) == EM_OK);
            const float *a = em_data_ptr(all);
            for (int r = 1; r < world; r++) SEED_CHECK(memcmp(&a[r], &a[0], sizeof *a) == 0);
            sum += em_item(loss);
            steps++;
            em_scope_end(s);
        }
        SEED_CHECK(!em_failed());
        /* the epoch's loss averaged over the ranks */
        em_tensor *mean = em_scalar(sum / (double)steps, EM_OPTS(.dtype = EM_F64));
        SEED_CHECK(em_dist_all_reduce(NULL, mean, EM_REDUCE_AVG) == EM_OK);
        if (epoch == 0) first = em_item(mean);
        last = em_item(mean);
        if (rank == 0) printf("epoch %d: loss %.4f (%lld steps per rank)\n", epoch + 1, last, (long long)steps);
        em_release(mean);
    }
    if (rank == 0) printf("weights identical on all %d ranks after every step; loss %.4f -> %.4f\n", world, first, last);
    SEED_CHECK(last < first);
    em_loader_free(loader);
    em_dataset_free(ds);
    em_optim_free(opt);
    em_ddp_free(ddp);
    em_module_free(model);
    SEED_CHECK(em_dist_finalize() == EM_OK);
    return 0;
}
