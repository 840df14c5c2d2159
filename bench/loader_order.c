/* Prints the sample order of Ember's shuffling data loader, so bench/train_mlp_torch.py can
 * check that its reimplementation feeds PyTorch exactly the batches `ember train` trains on.
 * Usage: bench_loader_order N SEED EPOCH  -> N indices, one a line (epoch EPOCH's order). */
#include <stdio.h>
#include <stdlib.h>
#include <ember/ember.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N SEED EPOCH\n", argv[0]);
        return 2;
    }
    int64_t n = strtoll(argv[1], NULL, 10), epoch = strtoll(argv[3], NULL, 10);
    uint64_t seed = strtoull(argv[2], NULL, 10);
    /* y[i] = i, so each batch's labels are the sample indices it holds */
    em_tensor *x = em_reshape(em_arange(0, (double)n, 1, EM_OPTS(.dtype = EM_F32)), EM_SHAPE(n, 1));
    em_tensor *y = em_arange(0, (double)n, 1, EM_OPTS(.dtype = EM_I64));
    em_dataset *ds = em_dataset_new(x, y);
    em_loader *l = ds ? em_loader_new(ds, (em_loader_opts){.batch_size = n, .shuffle = true, .seed = seed}) : NULL;
    em_batch b;
    if (!l || em_loader_seek(l, epoch, 0) != EM_OK || !em_loader_next(l, &b)) {
        fprintf(stderr, "%s: %s\n", argv[0], em_last_error());
        return 1;
    }
    const int64_t *idx = em_data_ptr(b.y);
    for (int64_t i = 0; i < b.size; i++) printf("%lld\n", (long long)idx[i]);
    em_loader_free(l);
    em_dataset_free(ds);
    return 0;
}
