/* The loader's distributed sampler (PyTorch's DistributedSampler): shards, padding,
 * shard_drop_last, per-epoch reshuffles (em_loader_set_epoch). One process plays every rank. */
#include "test.h"

static em_dataset *indexed(int n) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_reshape(em_arange(0, n, 1, EM_OPTS(0)), EM_SHAPE(n, 1));
    em_tensor *y = em_arange(0, n, 1, EM_OPTS(.dtype = EM_I64));
    em_dataset *ds = em_dataset_new(x, y);
    em_scope_end(s);
    return ds;
}

/* The sample indices rank `rank` reads in the loader's current epoch (into out; returns count). */
static int shard(em_loader *l, int64_t *out, int cap) {
    int n = 0;
    for (em_batch b; em_loader_next(l, &b);) {
        const int64_t *y = em_data_ptr(b.y);
        for (int64_t i = 0; i < b.size && n < cap; i++) out[n++] = y[i];
    }
    return n;
}

static void test_pytorch_layout(void) {
    /* 10 samples, 3 ranks, no shuffle: the padded order is 0..9, 0, 1 and rank r reads
     * every third index from r, as torch.utils.data.DistributedSampler(shuffle=False) */
    em_dataset *ds = indexed(10);
    const int64_t want[3][4] = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
    for (int r = 0; r < 3; r++) {
        em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 3, .num_replicas = 3, .rank = r});
        CHECK(l && em_loader_num_samples(l) == 4 && em_loader_len(l) == 2);
        int64_t got[8];
        CHECK(shard(l, got, 8) == 4);
        CHECK(memcmp(got, want[r], sizeof want[r]) == 0);
        em_loader_free(l);
    }
    /* shard_drop_last: 3 each, the last sample left out */
    const int64_t want_drop[3][3] = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
    for (int r = 0; r < 3; r++) {
        em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 2, .num_replicas = 3, .rank = r, .shard_drop_last = true});
        CHECK(l && em_loader_num_samples(l) == 3);
        int64_t got[8];
        CHECK(shard(l, got, 8) == 3);
        CHECK(memcmp(got, want_drop[r], sizeof want_drop[r]) == 0);
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

static void test_shuffled_shards_disjoint_every_epoch(void) {
    em_dataset *ds = indexed(101);
    enum { R = 4 };
    em_loader *l[R];
    for (int r = 0; r < R; r++)
        l[r] = em_loader_new(ds, (em_loader_opts){.batch_size = 8, .shuffle = true, .seed = 9, .num_replicas = R, .rank = r,
                                                  .prefetch = r % 2 ? EM_PREFETCH_NONE : 0});
    int64_t first_epoch[26] = {0};
    for (int epoch = 0; epoch < 3; epoch++) {
        int seen[101] = {0}, total = 0;
        for (int r = 0; r < R; r++) {
            CHECK_OK(em_loader_set_epoch(l[r], epoch));
            int64_t got[32];
            int n = shard(l[r], got, 32);
            CHECK(n == 26);  /* ceil(101 / 4) */
            for (int i = 0; i < n; i++) seen[got[i]]++;
            total += n;
            if (r == 0 && epoch == 0) memcpy(first_epoch, got, sizeof first_epoch);
            if (r == 0 && epoch == 2) CHECK(memcmp(first_epoch, got, sizeof first_epoch) != 0); /* reshuffled */
        }
        /* every sample read; 104 - 101 = 3 padded repeats */
        int missing = 0, repeats = 0;
        for (int i = 0; i < 101; i++) {
            if (!seen[i]) missing++;
            if (seen[i] > 1) repeats += seen[i] - 1;
        }
        CHECK(total == 104 && missing == 0 && repeats == 3);
    }
    /* set_epoch(0) again gives epoch 0's shard again */
    int64_t again[32];
    CHECK_OK(em_loader_set_epoch(l[0], 0));
    CHECK(shard(l[0], again, 32) == 26);
    CHECK(memcmp(again, first_epoch, sizeof first_epoch) == 0);
    for (int r = 0; r < R; r++) em_loader_free(l[r]);
    em_dataset_free(ds);
}

static void test_sampler_errors(void) {
    em_dataset *ds = indexed(5);
    CHECK(em_loader_new(ds, (em_loader_opts){.num_replicas = 2, .rank = 2}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "0 <= rank < num_replicas, got num_replicas 2, rank 2");
    CHECK(em_loader_new(ds, (em_loader_opts){.num_replicas = -1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "num_replicas >= 0");
    em_loader *l = em_loader_new(ds, (em_loader_opts){.num_replicas = 1, .rank = 0});
    CHECK(l && em_loader_num_samples(l) == 5); /* one replica: everything */
    CHECK(em_loader_set_epoch(l, -1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "epoch >= 0");
    CHECK(em_loader_set_epoch(NULL, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'l' is NULL");
    em_loader_free(l);
    /* more ranks than samples with shard_drop_last: empty shards, no batches */
    l = em_loader_new(ds, (em_loader_opts){.num_replicas = 8, .rank = 7, .shard_drop_last = true});
    CHECK(l && em_loader_num_samples(l) == 0 && em_loader_len(l) == 0);
    em_batch b;
    CHECK(!em_loader_next(l, &b) && !em_failed());
    em_loader_free(l);
    em_dataset_free(ds);
}

int main(void) {
    RUN(test_pytorch_layout);
    RUN(test_shuffled_shards_disjoint_every_epoch);
    RUN(test_sampler_errors);
    return test_summary();
}
