/* `ember finetune` over the ranks of `ember launch`, mpirun or srun. Every rank loads the same
 * folder and data, draws the same adapters' init, split and epoch order from --seed, and takes
 * a contiguous part of every micro-batch's rows, so --batch-size stays the batch of all ranks
 * together and a run on N ranks computes what one process computes, summed in another order.
 * Without --zero the trained weights are wrapped in the library's DDP (src/dist/ddp.c): each
 * rank's loss is its rows' part of the batch's (the sum over its tokens divided by the
 * batch's count) times N, since DDP averages; its buckets' all-reduces run once per optimizer
 * step, the micro-batches before the step's last one accumulating locally (no_sync). After the
 * backward every rank holds the same gradients, so clipping, AdamW and the weights stay
 * identical without further messages; rank 0 alone prints and writes. */
#include <math.h>
#include <stdio.h>
#include "finetune_dist.h"
#include "train_dist.h"

static em_dist_ddp *ddp;
static bool own_group;   /* --zero on one process: the group of one this file started */

int finetune_dist_init(const char *tool, em_device *device, bool threads_given, bool zero) {
    if (train_dist_init(tool, device, threads_given) != 0) return 1;
    /* ZeRO works over a process group, of one when no launcher started several */
    if (zero && !em_dist_is_initialized()) {
        if (em_dist_init("auto") != EM_OK) {
            fprintf(stderr, "%s: --zero: cannot start the process group: %s\n", tool, em_last_error());
            return 1;
        }
        own_group = true;
    }
    return 0;
}

int finetune_dist_wrap(const char *tool, em_module *trained, int64_t batch) {
    if (!train_dist_active()) return 0;
    ddp = em_ddp(trained, NULL, NULL);
    if (!ddp) {
        fprintf(stderr, "%s: rank %d: DistributedDataParallel: %s\n", tool, train_dist_rank(), em_last_error());
        return 1;
    }
    if (train_dist_is_main())
        fprintf(stderr, "%s: DistributedDataParallel over %d ranks (%s), each rank its part of every batch of %lld; "
                "rank 0 prints and writes the output folder\n", tool, train_dist_world(), em_dist_backend(NULL),
                (long long)batch);
    return 0;
}

void finetune_dist_rows(int64_t rows, int64_t *first, int64_t *count) {
    int world = train_dist_world(), rank = train_dist_rank();
    *first = rows * rank / world;
    *count = rows * (rank + 1) / world - *first;
}

void finetune_dist_sync_next(bool sync) { em_ddp_set_no_sync(ddp, !sync); }

double finetune_dist_sum(double x) { return train_dist_sum(x); }

bool finetune_dist_any(bool mine) { return train_dist_agree_stop(mine); }

void finetune_dist_unwrap(void) {
    em_ddp_free(ddp);
    ddp = NULL;
}

void finetune_dist_finish(void) {
    finetune_dist_unwrap();
    train_dist_finish();
    if (own_group && em_dist_finalize() != EM_OK) em_clear_error();
    own_group = false;
}
