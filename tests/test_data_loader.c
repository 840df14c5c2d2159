/* Datasets and the loader: batch shapes, drop_last, every sample exactly once per epoch,
 * reproducible shuffles that differ between epochs, identical batches with and without
 * the prefetch thread, reset and freeing mid-epoch, batch ownership with and without
 * scopes, pinned batches whose device copies are still queued when their blocks are
 * reused, and datasets from IDX, .npy and CSV files. */
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "test_data_util.h"

#define N 103
#define ROW 6  /* samples are [2, 3] */

/* x[i] = i * 10 + k (k = 0..5), y[i] = i: a batch's rows tell which sample they are. */
static em_dataset *make_dataset(void) {
    float x[N * ROW];
    int64_t y[N];
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < ROW; k++) x[i * ROW + k] = (float)(i * 10 + k);
        y[i] = i;
    }
    em_scope s = em_scope_begin();
    em_tensor *tx = em_from_data(x, EM_F32, EM_SHAPE(N, 2, 3), EM_OPTS(0));
    em_tensor *ty = em_from_data(y, EM_I64, EM_SHAPE(N), EM_OPTS(.dtype = EM_I64));
    em_dataset *ds = em_dataset_new(tx, ty);
    em_scope_end(s);
    return ds;
}

/* Runs one epoch; order[] gets the sample of each position; checks every batch's shape
 * and that x matches y. Returns the number of samples seen (or -1 on a bad batch). */
static int epoch(em_loader *l, int64_t bs, int64_t *order, int64_t *nbatches) {
    int seen = 0;
    *nbatches = 0;
    em_batch b;
    while (em_loader_next(l, &b)) {
        em_scope s = em_scope_begin();  /* a scope inside the loop must not touch the batch */
        if (!b.x || !b.y || em_ndim(b.x) != 3 || em_size(b.x, 1) != 2 || em_size(b.x, 2) != 3 ||
            em_size(b.x, 0) != b.size || em_size(b.y, 0) != b.size || b.index != *nbatches ||
            em_dtype_of(b.x) != EM_F32 || em_dtype_of(b.y) != EM_I64 || b.size > bs) {
            em_scope_end(s);
            return -1;
        }
        float x[64 * ROW];
        int64_t y[64];
        if (em_copy_to_host(b.x, x, sizeof x) != EM_OK || em_copy_to_host(b.y, y, sizeof y) != EM_OK) {
            em_scope_end(s);
            return -1;
        }
        for (int64_t i = 0; i < b.size; i++) {
            for (int k = 0; k < ROW; k++)
                if (x[i * ROW + k] != (float)(y[i] * 10 + k)) {
                    em_scope_end(s);
                    return -1;
                }
            if (seen < N) order[seen] = y[i];
            seen++;
        }
        (*nbatches)++;
        em_scope_end(s);
    }
    return seen;
}

static bool is_permutation(const int64_t *order, int n) {
    int count[N] = {0};
    for (int i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= N) return false;
        count[order[i]]++;
    }
    for (int i = 0; i < N; i++)
        if (count[i] != 1) return false;
    return true;
}

static void test_batches_and_drop_last(void) {
    em_dataset *ds = make_dataset();
    CHECK(ds && em_dataset_len(ds) == N);
    int64_t order[N], nb;
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 10});
    CHECK(l && em_loader_len(l) == 11);
    CHECK(epoch(l, 10, order, &nb) == N && nb == 11);
    for (int i = 0; i < N; i++) CHECK(order[i] == i);  /* no shuffle: dataset order */
    em_loader_free(l);
    l = em_loader_new(ds, (em_loader_opts){.batch_size = 10, .drop_last = true, .shuffle = true});
    CHECK(l && em_loader_len(l) == 10);
    CHECK(epoch(l, 10, order, &nb) == 100 && nb == 10);
    em_loader_free(l);
    /* batch_size 0 means 1; a batch larger than the dataset gives one batch */
    l = em_loader_new(ds, (em_loader_opts){0});
    CHECK(l && em_loader_len(l) == N);
    em_loader_free(l);
    l = em_loader_new(ds, (em_loader_opts){.batch_size = 64, .drop_last = false});
    CHECK(epoch(l, 64, order, &nb) == N && nb == 2);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* Every order equally likely: over 1200 epochs of 4 samples all 24 orders appear and each
 * sample stays in place about a quarter of the time (an off-by-one in Fisher-Yates gives
 * only the 6 cyclic orders, with no sample ever in place). */
static void test_shuffle_uniform(void) {
    float x[4] = {0, 1, 2, 3};
    int64_t y[4] = {0, 1, 2, 3};
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_new(em_from_data(x, EM_F32, EM_SHAPE(4, 1), EM_OPTS(0)),
                                    em_from_data(y, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64)));
    em_scope_end(s);
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 4, .shuffle = true, .seed = 11,
                                                      .prefetch = EM_PREFETCH_NONE});
    CHECK(ds && l);
    int seen[256] = {0}, in_place = 0, epochs = 1200;
    em_batch b;
    for (int e = 0; l && e < epochs; e++) {
        int batches = 0;
        while (em_loader_next(l, &b)) {
            int64_t o[4] = {-1, -1, -1, -1};
            CHECK(b.size == 4 && em_copy_to_host(b.y, o, sizeof o) == EM_OK);
            int code = 0;
            for (int i = 0; i < 4; i++) {
                code = code * 4 + (int)(o[i] & 3);
                in_place += o[i] == i;
            }
            seen[code]++;
            batches++;
        }
        CHECK(batches == 1);
    }
    int distinct = 0;
    for (int c = 0; c < 256; c++) distinct += seen[c] > 0;
    double frac = in_place / (4.0 * epochs);
    if (distinct != 24 || frac < 0.2 || frac > 0.3)
        fprintf(stderr, "  %d distinct orders (expected 24), samples in place %.3f of the time (expected 0.25)\n",
                distinct, frac);
    CHECK(distinct == 24);
    CHECK(frac > 0.2 && frac < 0.3);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* A user's mistakes with datasets: a status and a message naming what was expected. */
static void test_dataset_user_errors(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_SHAPE(2, 1), (em_opts){0});
    CHECK(em_dataset_new(NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_dataset_new: argument 'x' is NULL");
    CHECK(em_dataset_new(em_scalar(1.0, (em_opts){0}), NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "features must have a sample dimension, got a 0-d tensor");
    CHECK(em_dataset_new(x, em_zeros(EM_SHAPE(2, 1), EM_OPTS(.dtype = EM_I64))) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "labels must be 1-d [N], got 2 dimensions");
    CHECK(em_dataset_idx("images", NULL, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_dataset_idx: argument 'labels' is NULL");
    CHECK(em_dataset_npy(NULL, NULL, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_dataset_npy: the features path is NULL");
    /* IDX label files: int32 labels are widened; 2-d or float labels are refused */
    char *dir = test_tmpdir(), xp[600], yp[600];
    CHECK(dir != NULL);
    if (dir) {
        snprintf(xp, sizeof xp, "%s/x.idx", dir);
        snprintf(yp, sizeof yp, "%s/y.idx", dir);
        const unsigned char images[] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 1, 5, 6};
        const unsigned char i32[] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 0, 7, 0xFF, 0xFF, 0xFF, 0xFF};
        const unsigned char two_d[] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 1, 1, 2};
        const unsigned char f32[] = {0, 0, 0x0D, 1, 0, 0, 0, 2, 0x3F, 0x80, 0, 0, 0, 0, 0, 0};
        CHECK(test_write_file(xp, images, sizeof images) == 0 && test_write_file(yp, i32, sizeof i32) == 0);
        em_dataset *ds = em_dataset_idx(xp, yp, 1.0);
        CHECK(ds != NULL);
        int64_t got[2] = {0, 0};
        CHECK(ds && em_copy_to_host(em_dataset_y(ds), got, sizeof got) == EM_OK && got[0] == 7 && got[1] == -1);
        em_dataset_free(ds);
        CHECK(test_write_file(yp, two_d, sizeof two_d) == 0);
        CHECK(em_dataset_idx(xp, yp, 1.0) == NULL);
        CHECK_ERROR(EM_ERR_SHAPE, "y.idx: labels must be 1-d, the file holds 2 dimensions");
        CHECK(test_write_file(yp, f32, sizeof f32) == 0);
        CHECK(em_dataset_idx(xp, yp, 1.0) == NULL);
        CHECK_ERROR(EM_ERR_DTYPE, "y.idx: labels must be integers, the file holds float32");
        remove(xp);
        remove(yp);
        remove(dir);
    }
    em_scope_end(s);
}

static void test_shuffle_reproducible(void) {
    em_dataset *ds = make_dataset();
    int64_t a0[N], a1[N], b0[N], b1[N], c0[N], nb;
    em_loader *a = em_loader_new(ds, (em_loader_opts){.batch_size = 16, .shuffle = true, .seed = 7});
    em_loader *b = em_loader_new(ds, (em_loader_opts){.batch_size = 5, .shuffle = true, .seed = 7,
                                                      .prefetch = EM_PREFETCH_NONE});
    em_loader *c = em_loader_new(ds, (em_loader_opts){.batch_size = 16, .shuffle = true, .seed = 8});
    CHECK(epoch(a, 16, a0, &nb) == N && epoch(b, 5, b0, &nb) == N && epoch(c, 16, c0, &nb) == N);
    CHECK(em_loader_epoch(a) == 0);
    /* the next call after the end starts epoch 1 */
    CHECK(epoch(a, 16, a1, &nb) == N && em_loader_epoch(a) == 1);
    CHECK_OK(em_loader_reset(b));  /* explicit reset after an epoch: also epoch 1 */
    CHECK(epoch(b, 5, b1, &nb) == N && em_loader_epoch(b) == 1);
    CHECK(is_permutation(a0, N) && is_permutation(a1, N) && is_permutation(c0, N));
    CHECK(memcmp(a0, b0, sizeof a0) == 0);  /* the order depends on (seed, epoch) only */
    CHECK(memcmp(a1, b1, sizeof a1) == 0);
    CHECK(memcmp(a0, a1, sizeof a0) != 0);  /* differs between epochs */
    CHECK(memcmp(a0, c0, sizeof a0) != 0);  /* and between seeds */
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += a0[i] == i;
    CHECK(fixed < 10);  /* a real shuffle: few fixed points (about 1 expected) */
    em_loader_free(a);
    em_loader_free(b);
    em_loader_free(c);
    em_dataset_free(ds);
}

/* Same options with the thread (prefetch 1, 2, 7) and without: the same batches. */
static void test_prefetch_identical(void) {
    em_dataset *ds = make_dataset();
    const int prefetch[4] = {EM_PREFETCH_NONE, 0, 1, 7};
    int64_t orders[4][3][N];
    for (int p = 0; p < 4; p++) {
        em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 9, .shuffle = true, .seed = 3,
                                                          .prefetch = prefetch[p], .pin_memory = p == 2});
        for (int e = 0; e < 3; e++) {
            int64_t nb;
            CHECK(epoch(l, 9, orders[p][e], &nb) == N && nb == 12);
        }
        em_loader_free(l);
    }
    for (int p = 1; p < 4; p++) CHECK(memcmp(orders[0], orders[p], sizeof orders[0]) == 0);
    em_dataset_free(ds);
}

static void test_reset_and_free_mid_epoch(void) {
    em_dataset *ds = make_dataset();
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 4, .shuffle = true, .seed = 1, .prefetch = 3});
    em_dataset_free(ds);  /* the loader keeps its own references */
    CHECK_OK(em_loader_reset(l));  /* before the first batch: still epoch 0 */
    CHECK(em_loader_epoch(l) == 0);
    em_batch b;
    CHECK(em_loader_next(l, &b) && b.index == 0);
    CHECK(em_loader_next(l, &b) && b.index == 1);
    CHECK_OK(em_loader_reset(l));
    CHECK(em_loader_epoch(l) == 1);
    CHECK(em_loader_next(l, &b) && b.index == 0);
    /* many quick resets while the producer works: no hang, no stale batch */
    for (int i = 0; i < 200; i++) {
        if (i % 3) CHECK(em_loader_next(l, &b) && b.index == 0);
        CHECK_OK(em_loader_reset(l));
    }
    CHECK(em_loader_next(l, &b) && b.size == 4);
    em_loader_free(l);  /* mid-epoch, with batches queued: the thread stops, nothing leaks */
    /* freed right after creation, while the first batches are being made */
    for (int i = 0; i < 20; i++) {
        em_dataset *d2 = make_dataset();
        em_loader *l2 = em_loader_new(d2, (em_loader_opts){.batch_size = 1, .prefetch = 5});
        em_dataset_free(d2);
        em_loader_free(l2);
    }
}

/* The loader owns b.x and b.y until the next call: a retained batch stays valid, and
 * batches taken inside or outside a scope never leak (checked under ASan). */
static void test_batch_ownership(void) {
    em_dataset *ds = make_dataset();
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 8});
    em_batch b;
    em_scope outer = em_scope_begin();
    CHECK(em_loader_next(l, &b));
    em_tensor *kept = em_retain(b.x);
    em_scope_end(outer);  /* the batch was not in the scope */
    CHECK(em_loader_next(l, &b) && b.index == 1);
    float first[8 * ROW];
    CHECK_OK(em_copy_to_host(kept, first, sizeof first));
    CHECK(first[0] == 0 && first[5] == 5 && first[7 * ROW] == 70);
    em_release(kept);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* seek: continue at a batch of an epoch, as if the earlier batches had been taken */
static void test_seek(void) {
    em_scope s = em_scope_begin();
    em_dataset *ds = make_dataset();
    em_loader *a = em_loader_new(ds, (em_loader_opts){.batch_size = 10, .shuffle = true, .seed = 5});
    em_loader *b = em_loader_new(ds, (em_loader_opts){.batch_size = 10, .shuffle = true, .seed = 5});
    em_batch ba, bb;
    while (em_loader_next(a, &ba)) {}                           /* all of epoch 0 */
    for (int i = 0; i < 3; i++) CHECK(em_loader_next(a, &ba));  /* epoch 1, batches 0..2 */
    CHECK(em_loader_seek(b, 1, 2) == EM_OK);
    CHECK(em_loader_next(b, &bb) && bb.index == 2 && ba.index == 2);
    CHECK(em_loader_epoch(a) == 1 && em_loader_epoch(b) == 1 && bb.size == ba.size);
    CHECK(em_item(em_sum(em_ne(ba.y, bb.y), EM_ALL_DIMS, false)) == 0);
    CHECK(em_loader_seek(b, 0, em_loader_len(b)) == EM_OK);    /* the end: the next call starts epoch 1 */
    CHECK(!em_loader_next(b, &bb) && !em_failed());
    CHECK(em_loader_seek(b, 0, em_loader_len(b) + 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_loader_seek: expected epoch >= 0");
    CHECK(em_loader_seek(b, -1, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "got epoch -1");
    CHECK(em_loader_seek(NULL, 0, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 'l' is NULL");
    em_loader_free(a);
    em_loader_free(b);
    em_dataset_free(ds);
    em_scope_end(s);
}

/* for x, y in loader: ...; break, then another for loop: PyTorch's second loop is a new
 * pass over every sample. em_loader_iter begins one; seek's position is kept for a resume. */
static void test_iter_new_pass(void) {
    em_scope s = em_scope_begin();
    em_dataset *ds = make_dataset();
    for (int prefetch = EM_PREFETCH_NONE; prefetch <= 2; prefetch += 3) {
        em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 10, .shuffle = true, .seed = 9,
                                                          .prefetch = prefetch});
        int taken = 0;
        for (em_batch b = em_loader_iter(l); em_loader_next(l, &b);)
            if (++taken == 3) break;                                 /* leave epoch 0 early */
        CHECK(taken == 3 && em_loader_epoch(l) == 0);
        bool seen[N] = {false};
        int64_t samples = 0, batches = 0;
        for (em_batch b = em_loader_iter(l); em_loader_next(l, &b);) {
            int64_t y[10];
            CHECK(b.index == batches++);
            CHECK_OK(em_copy_to_host(b.y, y, (size_t)b.size * sizeof *y));
            for (int64_t i = 0; i < b.size; i++) seen[y[i]] = true;
            samples += b.size;
        }
        CHECK(samples == N && batches == em_loader_len(l) && em_loader_epoch(l) == 1);
        int distinct = 0;
        for (int i = 0; i < N; i++) distinct += seen[i];
        CHECK(distinct == N);
        /* at an epoch's end a new loop starts the next epoch, skipping none */
        samples = 0;
        for (em_batch b = em_loader_iter(l); em_loader_next(l, &b);) samples += b.size;
        CHECK(samples == N && em_loader_epoch(l) == 2);
        /* em_loader_next alone continues mid-epoch (the explicit way on) */
        em_batch b;
        CHECK(em_loader_next(l, &b) && em_loader_next(l, &b) && b.index == 1);
        CHECK(em_loader_next(l, &b) && b.index == 2 && em_loader_epoch(l) == 3);
        /* a resume: seek, then a loop from iter starts at the seek's batch */
        CHECK_OK(em_loader_seek(l, 7, 4));
        batches = 0;
        int64_t first = -1;
        for (em_batch c = em_loader_iter(l); em_loader_next(l, &c);) {
            if (first < 0) first = c.index;
            batches++;
        }
        CHECK(first == 4 && batches == em_loader_len(l) - 4 && em_loader_epoch(l) == 7);
        em_loader_free(l);
    }
    em_batch none = em_loader_iter(NULL);
    CHECK(none.x == NULL && none.size == 0);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_loader_iter: argument 'l' is NULL");
    em_dataset_free(ds);
    em_scope_end(s);
}

static void test_device_and_pinned(void) {
    em_dataset *ds = make_dataset();
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 32, .pin_memory = true, .device = EM_DEVICE_CPU});
    int64_t order[N], nb;
    CHECK(epoch(l, 32, order, &nb) == N);
    em_loader_free(l);
    CHECK(em_loader_new(ds, (em_loader_opts){.batch_size = -1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "batch_size must be positive");
    CHECK(em_loader_new(NULL, (em_loader_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 'ds' is NULL");
    if (!em_device_available(EM_CUDA)) {
        CHECK(em_loader_new(ds, (em_loader_opts){.device = EM_DEVICE(EM_CUDA, 0)}) == NULL);
        CHECK_ERROR(EM_ERR_UNAVAILABLE, "is not available");
    }
    em_dataset_free(ds);
}

/* Runs `epochs` epochs of a pinned loader onto dev and returns how many batches held other
 * rows than their labels name (-1 on an error); *waits: how often the pinned cache waited
 * for the device before reusing a block. Device work queued after each batch keeps the
 * queue busy, so the next batch's copy waits behind it.
 * sync_each: each batch is checked against x_dev[b.y] and read back at once (as
 * loss.item() does; index_select reads b.y back too), so the queue drains every batch.
 * Otherwise each batch is compared on the device with the same batch from a CPU loader
 * (uploaded beforehand), nothing waits, and the count is read at the end. */
static int pinned_bad_batches(em_device dev, int prefetch, int epochs, bool sync_each, int64_t *waits) {
    enum { ROWS = 256, D = 16, BS = 16, W = 160, NB = ROWS / BS, MAX_EPOCHS = 16 };
    if (epochs > MAX_EPOCHS) return -1;
    em_scope sc = em_scope_begin();
    em_manual_seed(9);
    em_tensor *x = em_randn(EM_SHAPE(ROWS, D), EM_OPTS(0));
    em_tensor *x_dev = em_to(x, dev), *w = em_randn(EM_SHAPE(W, W), EM_OPTS(.device = dev));
    em_dataset *ds = em_dataset_new(x, em_arange(0, ROWS, 1, EM_OPTS(.dtype = EM_I64)));
    em_loader_opts o = {.batch_size = BS, .shuffle = true, .seed = 9, .prefetch = EM_PREFETCH_NONE};
    em_tensor *want[MAX_EPOCHS][NB] = {{0}};
    em_loader *ref = em_loader_new(ds, o);  /* the same order, on the CPU */
    for (int e = 0; e < epochs && ref; e++)
        for (em_batch b; em_loader_next(ref, &b);) want[e][b.index] = em_to(b.x, dev);
    em_loader_free(ref);
    o.pin_memory = true;
    o.device = dev;
    o.prefetch = prefetch;
    em_loader *l = em_loader_new(ds, o);
    em_memory_stats before = {0}, after = {0};
    em_memory_get_pinned_stats(&before);
    int batches = 0, bad = 0;
    em_tensor *bad_dev = em_zeros(EM_SHAPE0, EM_OPTS(.device = dev));
    for (int e = 0; e < epochs && l; e++) {
        for (em_batch b; em_loader_next(l, &b);) {
            em_scope s = em_scope_begin();
            if (sync_each) {
                em_tensor *d = em_sub(b.x, em_index_select(x_dev, 0, b.y));
                bad += em_item(em_max(em_abs(d), EM_ALL_DIMS, false)) != 0;
            } else {
                em_tensor *d = em_max(em_abs(em_sub(b.x, want[e][b.index])), EM_ALL_DIMS, false);
                em_add_(bad_dev, em_clamp(em_mul_scalar(d, 1e30), 0, 1), 1.0);  /* + 1 when d != 0 */
            }
            em_matmul(em_matmul(w, w), w);  /* queued ahead of the next batch's copy */
            batches++;
            em_scope_end(s);
        }
    }
    if (!sync_each) bad = (int)em_item(bad_dev);
    em_memory_get_pinned_stats(&after);
    *waits = after.num_stream_waits - before.num_stream_waits;
    bool ok = l && !em_failed() && batches == epochs * NB;
    em_loader_free(l);
    em_dataset_free(ds);
    em_scope_end(sc);
    return ok ? bad : -1;
}

/* With pin_memory and a device, the loader queues a non-blocking copy from each pinned
 * batch and then drops the batch. The pinned cache hands that block to the next batch
 * made (on the prefetch thread, or in em_loader_next without it), which writes new rows
 * into it: unless the cache first waits for the device, the queued copy may read them
 * and the device batch mixes samples. */
static void pinned_copies_on(em_device dev);
static void test_pinned_copies_not_overwritten(void) {
    /* on each GPU backend here: OpenCL (PoCL in CI), CUDA on a machine with a GPU */
    static const em_device_type types[] = {EM_OPENCL, EM_CUDA};
    int ran = 0;
    for (int t = 0; t < 2; t++) {
        if (!em_device_available(types[t])) {
            printf("  not on %s: %s\n", em_device_type_name(types[t]), em_device_unavailable_reason(types[t]));
            continue;
        }
        pinned_copies_on(EM_DEVICE(types[t], 0));
        ran++;
    }
    if (!ran) SKIP("no OpenCL or CUDA device: %s", em_device_unavailable_reason(EM_OPENCL));
}

static void pinned_copies_on(em_device dev) {
    struct { int prefetch, epochs; bool sync_each; const char *what; } runs[] = {
        /* nothing waits: each copy is still queued when its block is reused (deterministic) */
        {EM_PREFETCH_NONE, 3, false, "no prefetch, no sync"},
        {0, 3, false, "prefetch thread, no sync"},
        /* the seed's loop: the queue drains every batch, but the prefetch thread may take
         * the block just released while its copy still waits behind earlier work */
        {0, 12, true, "prefetch thread, a sync per batch"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int64_t waits = 0;
        int bad = pinned_bad_batches(dev, runs[i].prefetch, runs[i].epochs, runs[i].sync_each, &waits);
        if (bad) printf("  %s: %d bad batches\n", runs[i].what, bad);
        CHECK(bad == 0);
        /* without syncs the cache did reuse blocks that queued copies had still to read
         * (on PoCL, which runs the queued matmuls slowly; a fast GPU may be done first);
         * with one per batch most copies have finished when their block is taken again,
         * which the copy's event tells the cache: it waits only for those that have not */
        if (!runs[i].sync_each && dev.type == EM_OPENCL) {
            /* the race this guards against needs a copy still queued when its block is
             * reused; when the host is slow (a sanitizer build, a loaded machine) PoCL may
             * finish every copy first, and then this part did not run: a skip, not a pass */
            if (waits == 0)
                test_skip_case("pinned reuse behind queued copies", "%s: every copy had finished "
                               "before its block was reused (slow host)", runs[i].what);
        }
    }
    em_clear_error();
}

static void test_datasets_from_files(void) {
    /* IDX: pixels scaled */
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_idx(test_data_path("tiny-images-idx3-ubyte.gz"),
                                    test_data_path("tiny-labels-idx1-ubyte"), 1.0 / 255);
    CHECK(ds && em_dataset_len(ds) == 4);
    /* images come as torchvision's: [N, C, H, W] with one channel */
    CHECK(ds && em_ndim(em_dataset_x(ds)) == 4 && em_size(em_dataset_x(ds), 1) == 1 &&
          em_size(em_dataset_x(ds), 0) == 4);
    if (ds) {
        float x[24];
        int64_t y[4];
        CHECK_OK(em_copy_to_host(em_dataset_x(ds), x, sizeof x));
        CHECK_OK(em_copy_to_host(em_dataset_y(ds), y, sizeof y));
        CHECK(x[7] == (float)((10 + 3 * 0 + 1) * (1.0 / 255)) && y[0] == 3 && y[2] == 4);
        CHECK_OK(em_dataset_normalize(ds, 0.5, 0.25));
        CHECK_OK(em_copy_to_host(em_dataset_x(ds), x, sizeof x));
        CHECK_NEAR(x[7], (11 / 255.0 - 0.5) / 0.25, 1e-6);
        /* a std or mean that would turn every pixel into NaN or infinity is refused, the data untouched */
        const double bad[][2] = {{0.5, NAN}, {0.5, 0}, {0.5, INFINITY}, {NAN, 0.25}, {-INFINITY, 0.25}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            CHECK(em_dataset_normalize(ds, bad[i][0], bad[i][1]) == EM_ERR_ARGUMENT);
            CHECK_ERROR(EM_ERR_ARGUMENT, "expected a finite mean and a finite, non-zero std");
        }
        CHECK_OK(em_copy_to_host(em_dataset_x(ds), x, sizeof x));
        CHECK_NEAR(x[7], (11 / 255.0 - 0.5) / 0.25, 1e-6);
    }
    em_dataset_free(ds);
    /* mismatched counts: 4 images, 3 labels */
    char *tmp = test_tmpdir();
    char yp[600], xp[600], cp[600];
    snprintf(yp, sizeof yp, "%s/y.npy", tmp);
    snprintf(xp, sizeof xp, "%s/x.npy", tmp);
    snprintf(cp, sizeof cp, "%s/d.csv", tmp);
    const int32_t y3[3] = {1, 2, 3};
    CHECK_OK(em_save_npy(yp, em_from_data(y3, EM_I32, EM_SHAPE(3), EM_OPTS(.dtype = EM_I32))));
    CHECK(em_dataset_idx(test_data_path("tiny-images-idx3-ubyte.gz"), yp, 1) == NULL);
    CHECK_ERROR(EM_ERR_FORMAT, "y.npy: not an IDX file");
    /* .npy pair */
    const double x3[6] = {1, 2, 3, 4, 5, 6};
    CHECK_OK(em_save_npy(xp, em_from_data(x3, EM_F64, EM_SHAPE(3, 2), EM_OPTS(.dtype = EM_F64))));
    ds = em_dataset_npy(xp, yp, 2.0);
    CHECK(ds && em_dataset_len(ds) == 3);
    if (ds) {
        float x[6];
        int64_t y[3];
        CHECK_OK(em_copy_to_host(em_dataset_x(ds), x, sizeof x));
        CHECK_OK(em_copy_to_host(em_dataset_y(ds), y, sizeof y));
        CHECK(x[0] == 2 && x[5] == 12 && y[2] == 3);
    }
    em_dataset_free(ds);
    CHECK(em_dataset_npy(yp, xp, 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "labels must be integers");
    /* CSV, label last; and without labels */
    const char *text = "1,2,0\n3,4,1\n5,6,1\n";
    CHECK(test_write_file(cp, text, strlen(text)) == 0);
    ds = em_dataset_csv(cp, EM_CSV_OPTS(.label_column = -1), 0.5);
    CHECK(ds && em_dataset_len(ds) == 3);
    em_loader *l = ds ? em_loader_new(ds, (em_loader_opts){.batch_size = 2}) : NULL;
    em_batch b;
    CHECK(l && em_loader_next(l, &b) && b.y && em_size(b.x, 1) == 2);
    if (b.x) {
        float x[4];
        CHECK_OK(em_copy_to_host(b.x, x, sizeof x));
        CHECK(x[0] == 0.5f && x[3] == 2);
    }
    em_loader_free(l);
    em_dataset_free(ds);
    ds = em_dataset_csv(cp, EM_CSV_OPTS(.label_column = EM_CSV_NO_LABEL), 1);
    CHECK(ds && em_dataset_y(ds) == NULL);
    l = ds ? em_loader_new(ds, (em_loader_opts){.batch_size = 2}) : NULL;
    CHECK(l && em_loader_next(l, &b) && b.y == NULL && em_size(b.x, 1) == 3);
    em_loader_free(l);
    em_dataset_free(ds);
    /* em_dataset_new: shapes must agree; integer labels must be 1-d, float targets are kept */
    const float zeros[8] = {0};
    const int64_t l3[3] = {0, 1, 2};
    em_tensor *x4 = em_from_data(zeros, EM_F32, EM_SHAPE(4, 2), EM_OPTS(0));
    CHECK(em_dataset_new(x4, em_from_data(l3, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64))) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "4 samples but 3 labels");
    em_dataset *fds = em_dataset_new(x4, em_from_data(zeros, EM_F32, EM_SHAPE(4), EM_OPTS(0)));
    CHECK(fds && em_dtype_of(em_dataset_y(fds)) == EM_F32);
    em_dataset_free(fds);
    CHECK(em_dataset_new(x4, em_from_data(l3, EM_I64, EM_SHAPE(3, 1), EM_OPTS(.dtype = EM_I64))) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "labels must be 1-d");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    em_scope_end(s);
}

int main(void) {
    RUN(test_batches_and_drop_last);
    RUN(test_shuffle_reproducible);
    RUN(test_shuffle_uniform);
    RUN(test_dataset_user_errors);
    RUN(test_prefetch_identical);
    RUN(test_reset_and_free_mid_epoch);
    RUN(test_batch_ownership);
    RUN(test_device_and_pinned);
    RUN(test_seek);
    RUN(test_iter_new_pass);
    RUN(test_pinned_copies_not_overwritten);
    RUN(test_datasets_from_files);
    return test_summary();
}
