/* Datasets and data loaders (torch.utils.data in C).
 *
 *   em_dataset *train = em_dataset_fashion_mnist(NULL, true);   // x [60000, 1, 28, 28] in [0, 1]
 *   em_loader *loader = em_loader_new(train, (em_loader_opts){.batch_size = 64, .shuffle = true});
 *   for (em_batch b = em_loader_iter(loader); em_loader_next(loader, &b);) {   // for x, y in loader:
 *       em_scope s = em_scope_begin();
 *       ... use b.x [64, 1, 28, 28] float32 and b.y [64] int64 ...
 *       em_scope_end(s);
 *   }
 *   if (em_failed()) ...;           // em_loader_next returns false at the end of an epoch or on error
 *   em_loader_free(loader); em_dataset_free(train);
 *
 * Batch ownership: the loader owns b.x and b.y. They stay valid until the next
 * em_loader_next / em_loader_reset / em_loader_free on that loader, which releases them;
 * they are registered in no scope, so the loop above frees each batch with no call from
 * the user, wherever the scope begins. Do not em_release them; to keep a batch longer,
 * em_retain it (and em_release that reference later). A loader is used from one thread
 * (its prefetch thread is internal).  */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H

#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/io.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets: x [N, ...] float32 and y [N] int64 (or float targets, or none), on the CPU ---- */
typedef struct em_dataset em_dataset; /* a dataset in memory: x and, optionally, y */

/* From tensors (any device, any dtype): x becomes float32; y (may be NULL) becomes int64 [N]
 * class indices when it is an integer or bool tensor, and stays floating when it is floating:
 * regression targets of any shape [N, ...], kept float64 if given float64, float32 otherwise.
 * The IDX, .npy and CSV loaders keep their behaviour (int64 labels). */
EM_API em_dataset *em_dataset_new(em_tensor *x, em_tensor *y);
/* IDX images and labels (raw or .gz); pixels are multiplied by scale (1.0 / 255 for [0, 1]).
 * Images (an IDX file of count x rows x columns) come as [N, 1, rows, columns], one channel,
 * as torchvision's MNIST datasets give them to a Conv2d; other IDX files keep their shape. */
EM_API em_dataset *em_dataset_idx(const char *images, const char *labels, double scale);
/* .npy features and labels (labels_path may be NULL); features multiplied by scale. */
EM_API em_dataset *em_dataset_npy(const char *x_path, const char *y_path, double scale);
/* A numeric CSV (see em_load_csv); features multiplied by scale. The label column gives y,
 * unless opts.label_column is EM_CSV_NO_LABEL. */
EM_API em_dataset *em_dataset_csv(const char *path, em_csv_opts opts, double scale);

#define EM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist" /* Debian's dataset-fashion-mnist */
/* Fashion-MNIST's train (60000) or test (10000) split: x [N, 1, 28, 28], pixels / 255. dir NULL means
 * $EMBER_DATA_DIR if set (the files there or in its fashion-mnist/), else
 * EM_FASHION_MNIST_DIR (Debian's dataset-fashion-mnist). Files may be .gz or raw. */
EM_API em_dataset *em_dataset_fashion_mnist(const char *dir, bool train);

/* x = (x - mean) / std, in place (torchvision's Normalize with one channel). */
EM_API em_status em_dataset_normalize(em_dataset *ds, double mean, double std);
EM_API int64_t em_dataset_len(const em_dataset *ds); /* the number of samples N */
/* The whole x / y (new scoped references sharing the dataset's memory); y may be NULL. */
EM_API em_tensor *em_dataset_x(const em_dataset *ds);
EM_API em_tensor *em_dataset_y(const em_dataset *ds); /* (y: NULL without labels) */
/* Loaders keep their own references: a dataset may be freed before its loaders. */
EM_API void em_dataset_free(em_dataset *ds);

/* ---- loaders ---- */
#define EM_PREFETCH_NONE (-1) /* em_loader_opts.prefetch: no background thread */
/* How a loader batches a dataset (torch.utils.data.DataLoader's options); zeroed: defaults. */
typedef struct em_loader_opts {
    int64_t batch_size;  /* 0 means 1, as in PyTorch */
    bool shuffle;        /* a new order every epoch, reproducible from seed */
    uint64_t seed;       /* the shuffle's seed */
    bool drop_last;      /* skip the last batch when it is smaller than batch_size */
    int prefetch;        /* batches a background thread prepares ahead; 0 means 2;
                          * EM_PREFETCH_NONE: each batch is made inside em_loader_next */
    bool pin_memory;     /* batches in page-locked host memory (fast, non-blocking copies) */
    em_device device;    /* batches are moved here (non-blocking from pinned memory); the
                          * zeroed value, the CPU, leaves them on the host */
    /* ---- distributed sampling (PyTorch's DistributedSampler) ----
     * num_replicas > 1: this loader reads shard `rank` only: the epoch's order (shuffled
     * from seed + epoch, the same on every rank) padded by repeating its first indices up
     * to a multiple of num_replicas (or, with shard_drop_last, cut down to one), then every
     * num_replicas-th index starting at rank. Every rank gets ceil(N / R) samples
     * (floor with shard_drop_last) and the shards are disjoint apart from the padding.
     * 0 or 1: the whole dataset. */
    int num_replicas;
    int rank;             /* this rank's shard, 0 .. num_replicas - 1 */
    bool shard_drop_last; /* cut the shards down instead of padding them */
} em_loader_opts;

/* One batch from em_loader_next. */
typedef struct em_batch {
    em_tensor *x;        /* [size, ...] float32, owned by the loader (see above) */
    em_tensor *y;        /* [size] int64, or [size, ...] float targets (y's dtype), or NULL */
    int64_t index;       /* the batch's number within the epoch, from 0 */
    int64_t size;        /* samples in this batch (the last may be smaller) */
} em_batch;

typedef struct em_loader em_loader; /* an iterator over a dataset's batches */

/* Shuffling: Fisher-Yates over the sample indices, drawing from splitmix64 seeded with
 * seed + epoch (bounded draws by Lemire's unbiased method), so an epoch's order depends
 * only on (seed, epoch) and differs between epochs. Without shuffle the order is 0..N-1. */
EM_API em_loader *em_loader_new(const em_dataset *ds, em_loader_opts opts);
/* iter(loader): a new pass over the loader, as a Python for loop over a DataLoader begins
 * one. When the epoch in progress was left early (a loop that broke out), its remaining
 * batches are dropped and the next epoch starts; at an epoch's start it changes nothing.
 * After em_loader_seek or em_loader_set_epoch, the pass starts where they put the loader
 * (how a resumed run continues mid-epoch). Returns an empty batch for the loop's variable:
 *   for (em_batch b = em_loader_iter(l); em_loader_next(l, &b);) { ... }
 * NULL l: EM_ERR_ARGUMENT recorded (and em_loader_next then returns false). */
EM_API em_batch em_loader_iter(em_loader *l);
/* The next batch of the epoch: true and *b filled, or false at the end of the epoch (the
 * following call starts the next epoch) or on error (em_failed() tells which). On its own
 * it continues the epoch where the last call left it (a loop written as
 * `for (em_batch b; em_loader_next(l, &b);)` after a break goes on mid-epoch); begin a loop
 * with em_loader_iter for a new pass. */
EM_API bool em_loader_next(em_loader *l, em_batch *b);
/* Abandon the rest of this epoch and start the next (a no-op before the first batch of
 * an epoch, so "reset, then loop" and "loop until false" count epochs alike). Unlike
 * em_loader_iter it also drops a position set by em_loader_seek. */
EM_API em_status em_loader_reset(em_loader *l);
/* Continue from batch `batch` of epoch `epoch` (the order is that epoch's, as if the
 * earlier batches had been taken): how a resumed training run picks up where it stopped. */
EM_API em_status em_loader_seek(em_loader *l, int64_t epoch, int64_t batch);
/* sampler.set_epoch(epoch): the next batch starts epoch `epoch` (its own shuffle) from its
 * first batch. Every rank must set the same epoch so that the shards stay disjoint. */
EM_API em_status em_loader_set_epoch(em_loader *l, int64_t epoch);
/* Samples per epoch for this loader (its shard's size when sharded). */
EM_API int64_t em_loader_num_samples(const em_loader *l);
/* Batches per epoch. */
EM_API int64_t em_loader_len(const em_loader *l);
/* The current epoch, from 0. */
EM_API int64_t em_loader_epoch(const em_loader *l);
/* Stops the prefetch thread (also mid-epoch) and releases every batch. NULL is ignored. */
EM_API void em_loader_free(em_loader *l);

#ifdef __cplusplus
}
#endif
#endif
