/* ZeRO stage 3 (include/ember/zero.h): the parameters, gradients and AdamW states of a model
 * sharded over the ranks, as PyTorch's FullyShardedDataParallel:
 *
 *   model = FSDP(model)                      # each block gathered for its forward and backward
 *   opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
 *
 * Started alone (as CI runs the examples), it starts itself as 2 ranks with `mpirun -np 2`
 * (what `ember launch -n 2` does). Each rank trains on its half of every batch, prints what
 * it holds next to what one process would, saves a sharded checkpoint and loads it back.
 * Without mpirun it trains as one rank. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ember/ember.h>
#include "seed_common.h"

/* Start the ranks: the job's exit status, or -1 to go on here as the single rank. */
static int spawn_ranks(void) {
    em_dist_env env;
    SEED_CHECK(em_dist_env_read(&env) == EM_OK);
    if (strcmp(env.source, "none")) return -1;   /* a rank already */
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("mpirun is not installed: training as one rank\n");
        return -1;
    }
    char self[4096], cmd[8192];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    snprintf(cmd, sizeof cmd, "mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 2 '%s'", self);
    printf("$ %s\n", cmd);
    fflush(stdout);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(void) {
    int job = spawn_ranks();
    if (job >= 0) return job;
    SEED_CHECK(em_dist_init("auto") == EM_OK);
    int rank = em_dist_rank(NULL), world = em_dist_world_size(NULL);

    /* four blocks: each Linear is a unit that ZeRO gathers only while it runs */
    em_manual_seed(10);
    em_module *model = em_nn_sequential(em_nn_linear(16, 256), em_nn_relu(), em_nn_linear(256, 256), em_nn_relu(),
                                        em_nn_linear(256, 256), em_nn_relu(), em_nn_linear(256, 4));
    SEED_CHECK(model);
    double params = (double)em_module_num_parameters(model);
    em_optimizer *like = em_adamw(model, 1e-3);   /* the optimizer's kind and options */
    em_zero *z = em_zero_new(model, NULL, like, &(em_zero_opts){.stage = 3});
    SEED_CHECK(z);
    em_optim_free(like);
    em_zero_memory plain, sharded;
    SEED_CHECK(em_zero_estimate(params, 0, world, false, &plain) == EM_OK);
    SEED_CHECK(em_zero_estimate(params, 3, world, false, &sharded) == EM_OK);
    if (rank == 0)
        printf("%.0f parameters in %d units over %d rank(s): %.2f MB per rank for weights, gradients and AdamW "
               "states (unsharded %.2f MB)\n", params, em_zero_num_units(z), world, sharded.total / 1e6,
               plain.total / 1e6);

    /* the data: y = the quadrant of the first two features; each rank takes its rows */
    em_manual_seed(1234);
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_randn(EM_SHAPE(32, 16), EM_OPTS(0));
        em_tensor *q = em_add(em_to_dtype(em_gt(em_select(x, 1, 0), em_scalar(0, EM_OPTS(0))), EM_I64),
                              em_mul_scalar(em_to_dtype(em_gt(em_select(x, 1, 1), em_scalar(0, EM_OPTS(0))), EM_I64), 2));
        int64_t part = 32 / world;
        em_tensor *loss = em_cross_entropy(em_zero_forward(z, em_narrow(x, 0, rank * part, part)),
                                           em_narrow(q, 0, rank * part, part), 0.0);
        SEED_CHECK(em_zero_clear_grads(z) == EM_OK && em_backward(loss) == EM_OK && em_zero_step(z) == EM_OK);
        em_tensor *mean = em_detach(loss);
        SEED_CHECK(em_dist_all_reduce(NULL, mean, EM_REDUCE_AVG) == EM_OK);
        if (step < 10) first += em_item(mean) / 10;
        if (step >= 50) last += em_item(mean) / 10;
        em_scope_end(s);
    }
    if (rank == 0) printf("loss: first 10 steps %.4f, last 10 steps %.4f\n", first, last);
    SEED_CHECK(last < first);

    /* a sharded checkpoint: one file per rank; em_zero_load re-shards for any number of ranks */
    em_tensor *pid = em_scalar((double)getpid(), EM_OPTS(.dtype = EM_F64));   /* rank 0's names the folder */
    SEED_CHECK(em_dist_broadcast(NULL, pid, 0) == EM_OK);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/ember-zero-example-%.0f", em_item(pid));
    em_release(pid);
    SEED_CHECK(em_zero_save(z, dir, NULL, NULL, 0) == EM_OK);
    em_scope s = em_scope_begin();
    em_tensor *before = em_zero_full_parameters(z);
    SEED_CHECK(em_zero_load(z, dir, NULL) == EM_OK);
    em_tensor *after = em_zero_full_parameters(z);
    SEED_CHECK(em_item(em_max(em_abs(em_sub(before, after)), EM_ALL_DIMS, false)) == 0);
    em_scope_end(s);
    if (rank == 0) printf("saved %s/rank-*.safetensors and loaded them back: the same weights\n", dir);
    SEED_CHECK(em_dist_barrier(NULL) == EM_OK);
    char path[128];
    snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, rank);
    unlink(path);
    SEED_CHECK(em_dist_barrier(NULL) == EM_OK);
    if (rank == 0) rmdir(dir);

    em_zero_free(z);
    em_module_free(model);
    SEED_CHECK(em_dist_finalize() == EM_OK);
    return 0;
}
