/* ember train: the seed's training loop, in C. Linear(784, 256), ReLU, Linear(256, 10) on
 * Fashion-MNIST: the model and the batches on one device, cross-entropy, backward, an
 * optimizer step; after each epoch the test accuracy, the throughput, the device's memory
 * and a checkpoint. Ctrl-C, SIGTERM, SIGHUP (or --max-steps) save where it stopped; --resume
 * goes on from there with the same batch order, so a resumed run ends where an uninterrupted
 * one does. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "commands.h"
#include "mlp.h"
#include "model_cnn.h"
#include "model_gpt.h"
#include "progress.h"
#include "train_amp.h"
#include "train_ckpt.h"   /* --checkpoint-activations */
#include "train_log.h"
#include "plot.h"         /* --plot */
#include "train_parallel.h"
#include "train_dist.h"   /* DDP under mpirun / ember launch */
#include <ember/parse.h>

static const char *const tool = "ember train";

/* Seconds from a stop signal to the exit, checkpoint saved or not: under the 30 s that
 * Slurm (KillWait) and Kubernetes (terminationGracePeriodSeconds) wait before SIGKILL. */
#define GRACE_SECONDS 20

static void usage(FILE *f) {
    fprintf(f,
            "usage: ember train [options]\n"
            "Train the seed's MLP (784-256-10, ReLU) on Fashion-MNIST and report, after each epoch,\n"
            "the train loss, test accuracy, samples/s and the device's memory.\n\n"
            "  --model NAME         mlp (default: the seed's), cnn (LeNet-5 style, tools/ember/model_cnn.c)\n"
            "                       or gpt (a character-level transformer on --text, tools/ember/model_gpt.c;\n"
            "                       `ember train --model gpt --help` lists its options)\n"
            "  --device D           auto (default: CUDA, then an OpenCL GPU, then the CPU), cpu, cuda:N, opencl:N\n"
            "  --devices A,B        DataParallel over these devices (opencl:0,opencl:1 or cpu,opencl:0): each\n"
            "                       batch split across them, one model replica on each\n"
            "  --epochs N           epochs to train (default 5)\n"
            "  --batch-size N       samples per step (default 64)\n"
            "  --optimizer NAME     adam (default), adamw or sgd\n"
            "  --lr X               learning rate (default 0.001 for adam/adamw, 0.01 for sgd)\n"
            "  --momentum X         SGD momentum (default 0.9)\n"
            "  --weight-decay X     weight decay (default 0; adamw's decoupled default is 0.01)\n"
            "  --seed N             initial weights and batch order (default 0)\n"
            "  --threads N          CPU threads (default: every core)\n"
            "  --data DIR           directory of the IDX files (default: the Debian package's,\n"
            "                       or EMBER_DATA_DIR)\n"
            "  --checkpoint PATH    safetensors checkpoint written after every epoch and on Ctrl-C,\n"
            "                       SIGTERM or SIGHUP (default ember-MODEL.safetensors; 'none' to write\n"
            "                       nothing); its folder is checked before training starts\n"
            "  --resume             continue from --checkpoint with its seed, batch size, optimizer\n"
            "                       state and learning rate; --lr given with --resume replaces the\n"
            "                       checkpoint's learning rate (and says so); --seed or --batch-size\n"
            "                       unlike the checkpoint's are an error\n"
            "  --max-steps N        stop after N batches in total, saving a checkpoint as Ctrl-C does\n"
            "                       (with --accumulate N, at the end of that group of N batches, as\n"
            "                       on a signal: a checkpoint keeps no partial gradients)\n"
            "  --train-samples N    train on the first N samples only (default: all 60000)\n"
            "  --test-samples N     test on the first N samples only (default: all 10000)\n"
            "  --amp bf16|f16       mixed precision: autocast regions (Linear and Conv2d in the low dtype,\n"
            "                       the loss in float32), float32 weights and optimizer; f16 adds loss\n"
            "                       scaling, whose state the checkpoint keeps for --resume\n"
            "  --loss-scale X       --amp f16's initial loss scale (default 65536, as PyTorch's GradScaler)\n"
            "  --checkpoint-activations  recompute activations in backward instead of keeping them\n"
            "                       (em_checkpoint_sequential over about sqrt(layers) segments)\n"
            "  --accumulate N       gradient accumulation: backward of loss / N per batch, one optimizer\n"
            "                       step per N batches (the gradient of one batch of N * --batch-size)\n"
            "                       --amp, --devices and --accumulate combine in any way (the replicas\n"
            "                       run in the autocast region; the f16 scaler scales each batch's loss,\n"
            "                       unscales once per step and skips it for every replica on inf/NaN);\n"
            "                       --checkpoint-activations goes with --amp (the recomputation runs in\n"
            "                       the forward's autocast region), not with --devices yet\n"
            /* TensorBoard (issue 17, train_log.c) */
            "  --logdir DIR         TensorBoard event file in DIR (made if missing): the loss every\n"
            "                       --log-every steps; per epoch losses, accuracy, learning rate,\n"
            "                       samples/s, device memory and parameter histograms\n"
            "  --log-every N        steps between logged losses (default 10)\n"
            /* plots (issue 17, plot_train.c) */
            "  --plot FILE          loss and test accuracy curves drawn into FILE, a .png or .svg\n"
            "                       picture, rewritten after every epoch (the loss every --log-every\n"
            "                       steps too); its folder is checked before training starts\n"
            "  --help               this text\n\n"
            "The device is --device, else EMBER_DEVICE (an invalid one is an error), else auto.\n"
            "A progress bar with rate and ETA is drawn on a terminal; otherwise a plain line is printed\n"
            "every quarter epoch.\n\n"
            "Signals: SIGINT (Ctrl-C), SIGTERM (what Slurm and Kubernetes send before SIGKILL) and\n"
            "SIGHUP stop after the current step, save the checkpoint and exit with 128 + the signal\n"
            "(130, 143, 129). If the checkpoint is not saved within %d s of the signal, or a second\n"
            "signal comes, the process exits at once with the same status, without it.\n\n"
            "Distributed: started by mpirun -np N, srun or `ember launch -n N`, each rank trains with\n"
            "DistributedDataParallel on its own shard of every epoch (--batch-size per rank) and its own\n"
            "device (cuda:LOCAL_RANK); rank 0 alone prints and writes the checkpoint, which any number\n"
            "of ranks can --resume.\n\n"
            "Exit status: 0 done, 1 failed, 2 bad arguments, 128 + N stopped by signal N.\n", GRACE_SECONDS);
}

typedef struct train_opts {
    em_device device;
    int64_t epochs, batch_size, seed, threads, max_steps, train_samples, test_samples;
    const char *optimizer, *data_dir, *checkpoint, *model;
    double lr, momentum, weight_decay;
    bool lr_set, wd_set, seed_set, batch_set, resume;
    /* --devices (DataParallel, train_parallel.c) */
    em_device devices[TRAIN_MAX_DEVICES];
    int ndevices;
    bool amp_set;            /* --amp: mixed precision (train_amp.c) */
    bool ckpt_act;           /* --checkpoint-activations (train_ckpt.c) */
    int64_t accumulate;      /* --accumulate N (train_amp.c); 0 or 1: off */
    em_dtype amp_dtype;
    double loss_scale;       /* --loss-scale: the f16 scaler's initial scale (0: 65536) */
    train_amp amp;
    train_log log;           /* --logdir, --log-every: TensorBoard (train_log.c) */
} train_opts;

/* Where a run stands: what a checkpoint records beyond the weights. */
typedef struct position {
    int64_t epoch, batch;    /* the next batch to train on */
    double loss_sum;         /* this epoch's summed batch losses so far */
    int64_t steps;           /* optimizer steps in total */
} position;

/* The signal that asked to stop (0: none). */
static volatile sig_atomic_t interrupted;
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

/* The grace period ran out (a save stuck on a dead disk): leave now, as the signal asked. */
static void on_grace_over(int sig) {
    (void)sig;
    static const char msg[] = "ember train: the checkpoint was not saved in time after the signal; exiting without it\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(128 + interrupted);
}

static void on_stop_signal(int sig) {
    if (interrupted) _exit(128 + interrupted);   /* a second signal: at once */
    interrupted = sig;
    signal(SIGALRM, on_grace_over);
    alarm(GRACE_SECONDS);
}

static void catch_stop_signals(bool on) {
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) {
        struct sigaction sa = {.sa_handler = on ? on_stop_signal : SIG_DFL};
        sigemptyset(&sa.sa_mask);
        for (size_t k = 0; k < sizeof stop_signals / sizeof stop_signals[0]; k++) sigaddset(&sa.sa_mask, stop_signals[k]);
        sigaction(stop_signals[i], &sa, NULL);
    }
    if (!on) alarm(0);
}

/* Upper limits: far beyond any real run, low enough that no counter derived from them
 * overflows (epoch + 1, steps, threads as an int). */
#define MAX_EPOCHS 1000000000
#define MAX_BATCH ((int64_t)1 << 30)
#define MAX_THREADS 4096
#define MAX_COUNT ((int64_t)1 << 50)

static int parse(int argc, char **argv, train_opts *o) {
    bool device_set = false;
    mlp_seen seen = {0};
    *o = (train_opts){.epochs = 5, .batch_size = 64, .optimizer = "adam",
                      .momentum = 0.9, .checkpoint = NULL, .model = "mlp", .log.every = 10};
    bool checkpoint_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--checkpoint-activations")) {
            if (!mlp_once(tool, &seen, a)) return 2;
            o->ckpt_act = true;
            continue;
        }
        if (!strcmp(a, "--resume")) {
            if (!mlp_once(tool, &seen, a)) return 2;
            o->resume = true;
            continue;
        }
        static const char *const valued[] = {"--device", "--epochs", "--batch-size", "--optimizer", "--lr",
                                             "--momentum", "--weight-decay", "--seed", "--threads", "--data",
                                             "--checkpoint", "--max-steps", "--train-samples", "--test-samples",
                                             "--devices", "--amp", "--model",
                                             "--accumulate", "--logdir", "--log-every", "--plot", "--loss-scale"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) {
            fprintf(stderr, "%s: %s '%s'\n", tool, a[0] == '-' ? "unknown option" : "unexpected argument", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", tool, a);
            return 2;
        }
        if (!mlp_once(tool, &seen, a)) return 2;
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "--device")) ok = mlp_parse_device(tool, a, v, &o->device), device_set = true;
        else if (!strcmp(a, "--devices")) ok = train_parse_devices(tool, v, o->devices, &o->ndevices);
        else if (!strcmp(a, "--epochs")) ok = mlp_parse_int(tool, a, v, 0, MAX_EPOCHS, &o->epochs);
        else if (!strcmp(a, "--batch-size")) ok = mlp_parse_int(tool, a, v, 1, MAX_BATCH, &o->batch_size), o->batch_set = true;
        else if (!strcmp(a, "--seed")) ok = mlp_parse_int(tool, a, v, 0, INT64_MAX, &o->seed), o->seed_set = true;
        else if (!strcmp(a, "--threads")) ok = mlp_parse_int(tool, a, v, 1, MAX_THREADS, &o->threads);
        else if (!strcmp(a, "--max-steps")) ok = mlp_parse_int(tool, a, v, 1, MAX_COUNT, &o->max_steps);
        else if (!strcmp(a, "--train-samples")) ok = mlp_parse_int(tool, a, v, 1, MAX_COUNT, &o->train_samples);
        else if (!strcmp(a, "--test-samples")) ok = mlp_parse_int(tool, a, v, 1, MAX_COUNT, &o->test_samples);
        else if (!strcmp(a, "--lr")) ok = mlp_parse_double(tool, a, v, 0, 1e6, &o->lr), o->lr_set = true;
        else if (!strcmp(a, "--momentum")) ok = mlp_parse_double(tool, a, v, 0, 1, &o->momentum);
        else if (!strcmp(a, "--weight-decay")) ok = mlp_parse_double(tool, a, v, 0, 1e6, &o->weight_decay), o->wd_set = true;
        else if (!strcmp(a, "--data")) o->data_dir = v;
        else if (!strcmp(a, "--amp")) ok = train_amp_parse(tool, a, v, &o->amp_dtype), o->amp_set = true;
        else if (!strcmp(a, "--loss-scale")) ok = train_amp_parse_scale(tool, a, v, &o->loss_scale);
        else if (!strcmp(a, "--accumulate")) ok = mlp_parse_int(tool, a, v, 1, MAX_COUNT, &o->accumulate);
        else if (!strcmp(a, "--model")) ok = model_parse(tool, a, v), o->model = v;
        else if (!strcmp(a, "--logdir")) o->log.dir = v;
        else if (!strcmp(a, "--log-every")) ok = mlp_parse_int(tool, a, v, 1, MAX_COUNT, &o->log.every);
        else if (!strcmp(a, "--plot")) ok = plot_check_output(stderr, tool, a, v), o->log.plot = v;
        else if (!strcmp(a, "--checkpoint")) o->checkpoint = strcmp(v, "none") ? v : NULL, checkpoint_given = true;
        else if (!strcmp(a, "--optimizer")) {
            o->optimizer = v;
            if (strcmp(v, "adam") && strcmp(v, "adamw") && strcmp(v, "sgd")) {
                fprintf(stderr, "%s: --optimizer expects adam, adamw or sgd, got '%s'\n", tool, v);
                ok = false;
            }
        }
        if (!ok) return 2;
    }
    if (o->ndevices && device_set) {
        fprintf(stderr, "%s: --device and --devices cannot go together (the model lives on the first of --devices)\n", tool);
        return 2;
    }
    if (o->ckpt_act && o->ndevices) {   /* DataParallel replicates the model, not the checkpoint wrapper */
        fprintf(stderr, "%s: --checkpoint-activations cannot go together with --devices yet\n", tool);
        return 2;
    }
    if (o->loss_scale > 0 && !(o->amp_set && o->amp_dtype == EM_F16)) {
        fprintf(stderr, "%s: --loss-scale sets the loss scaler of --amp f16, got %s\n", tool,
                o->amp_set ? "--amp bf16 (bfloat16 needs no loss scaling)" : "no --amp");
        return 2;
    }
    if (o->ndevices) o->device = o->devices[0], device_set = true;
    if (!checkpoint_given) o->checkpoint = model_default_checkpoint(o->model);
    if (o->resume && !o->checkpoint) {
        fprintf(stderr, "%s: --resume needs a --checkpoint file (not 'none')\n", tool);
        return 2;
    }
    /* where the checkpoint goes is checked now, not after an epoch of training */
    if (o->checkpoint && !mlp_check_output(tool, "--checkpoint", o->checkpoint)) return 2;
    if (o->resume && access(o->checkpoint, R_OK) != 0) {
        fprintf(stderr, "%s: --resume: cannot read the checkpoint '%s': %s\n", tool, o->checkpoint, strerror(errno));
        return 2;
    }
    /* auto-selection starts every backend: only when no device was named (a CPU run under
     * valgrind then never loads OpenCL or CUDA) */
    if (!device_set && !mlp_default_device(tool, &o->device)) return 2;
    if (!o->lr_set) o->lr = strcmp(o->optimizer, "sgd") ? 1e-3 : 1e-2;
    return -1;  /* go on */
}

static em_optimizer *make_optimizer(const train_opts *o, em_module *m) {
    if (!strcmp(o->optimizer, "sgd")) {
        em_sgd_opts s = em_sgd_defaults(o->lr);
        s.momentum = o->momentum;
        s.weight_decay = o->weight_decay;
        return em_sgd_ex(m, s);
    }
    bool w = !strcmp(o->optimizer, "adamw");
    em_adam_opts a = w ? em_adamw_defaults(o->lr) : em_adam_defaults(o->lr);
    if (o->wd_set) a.weight_decay = o->weight_decay;
    return w ? em_adamw_ex(m, a) : em_adam_ex(m, a);
}

static em_status save(const train_opts *o, em_module *m, em_optimizer *opt, const position *pos) {
    if (!o->checkpoint || !train_dist_is_main()) return EM_OK;
    char v[8][40];
    snprintf(v[0], sizeof v[0], "%" PRId64, pos->epoch);
    snprintf(v[1], sizeof v[1], "%" PRId64, pos->batch);
    snprintf(v[2], sizeof v[2], "%.17g", pos->loss_sum);
    snprintf(v[3], sizeof v[3], "%" PRId64, o->seed);
    snprintf(v[4], sizeof v[4], "%" PRId64, o->batch_size);
    snprintf(v[5], sizeof v[5], "%s", o->model);
    snprintf(v[6], sizeof v[6], "%d", train_dist_world());
    snprintf(v[7], sizeof v[7], "%" PRId64, pos->steps);   /* batches: with --accumulate, not the optimizer's */
    const char *keys[8 + TRAIN_AMP_META] = {"train.epoch", "train.batch", "train.loss_sum", "train.seed",
                                            "train.batch_size", "model", "train.world_size", "train.steps"};
    const char *vals[8 + TRAIN_AMP_META] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
    train_amp_meta am;   /* the loss scaler's state (train_amp.c) */
    if (train_amp_meta_of(&o->amp, &am) != EM_OK) return em_last_status();
    for (int i = 0; i < am.n; i++) keys[8 + i] = am.keys[i], vals[8 + i] = am.vals[i];
    return em_checkpoint_save(o->checkpoint, m, opt, keys, vals, 8 + am.n);
}

/* A train.* number from the checkpoint, in [min, max]; says which and why when not. */
static bool meta_i64(em_safetensors *f, const char *path, const char *key, int64_t min, int64_t max, int64_t *out) {
    const char *s = em_safetensors_metadata(f, key);
    em_num_result r = em_parse_i64(s, min, max, out);
    if (r == EM_NUM_OK) return true;
    if (!s) fprintf(stderr, "%s: cannot resume: %s lacks the metadata '%s' ember train writes\n", tool, path, key);
    else fprintf(stderr, "%s: cannot resume: %s: metadata '%s' = '%.60s' (%s): expected an integer from %lld to %lld\n",
                 tool, path, key, s, em_num_why(r), (long long)min, (long long)max);
    return false;
}

/* Loads model, optimizer and position; the checkpoint's seed and batch size win (given
 * and unlike, an error: the batch order depends on them). */
static int resume(train_opts *o, em_module *m, em_optimizer *opt, position *pos) {
    em_safetensors *meta = NULL;
    if (em_checkpoint_load(o->checkpoint, m, opt, &meta) != EM_OK) {
        fprintf(stderr, "%s: cannot resume: %s\n", tool, em_last_error());
        return 1;
    }
    int64_t seed, batch_size;
    const char *loss = em_safetensors_metadata(meta, "train.loss_sum");
    em_num_result lr = em_parse_f64(loss, 0, DBL_MAX, &pos->loss_sum);
    bool ok = meta_i64(meta, o->checkpoint, "train.epoch", 0, MAX_EPOCHS, &pos->epoch) &&
              meta_i64(meta, o->checkpoint, "train.batch", 0, MAX_COUNT, &pos->batch) &&
              meta_i64(meta, o->checkpoint, "train.seed", 0, INT64_MAX, &seed) &&
              meta_i64(meta, o->checkpoint, "train.batch_size", 1, MAX_BATCH, &batch_size);
    if (ok && lr != EM_NUM_OK) {
        fprintf(stderr, "%s: cannot resume: %s: metadata 'train.loss_sum' = '%.60s' (%s): expected a number >= 0\n", tool,
                o->checkpoint, loss ? loss : "", loss ? em_num_why(lr) : "missing");
        ok = false;
    }
    int64_t world = 1; /* written by DDP runs; absent: one process */
    if (ok && em_safetensors_metadata(meta, "train.world_size"))
        ok = meta_i64(meta, o->checkpoint, "train.world_size", 1, 1 << 24, &world);
    pos->steps = -1;   /* train.steps: absent before it was written; then the optimizer's count */
    if (ok && em_safetensors_metadata(meta, "train.steps"))
        ok = meta_i64(meta, o->checkpoint, "train.steps", 0, INT64_MAX, &pos->steps);
    if (ok) ok = train_amp_resume(tool, &o->amp, meta, o->checkpoint);   /* the loss scaler's state */
    em_safetensors_free(meta);
    if (!ok) return 1;
    train_dist_convert_position(world, &pos->batch, &pos->loss_sum);
    if ((o->seed_set && seed != o->seed) || (o->batch_set && batch_size != o->batch_size)) {
        fprintf(stderr, "%s: --resume: %s %lld is unlike the checkpoint's %lld; a resumed run keeps the batch "
                "order it started with (leave the option out)\n", tool,
                o->seed_set && seed != o->seed ? "--seed" : "--batch-size",
                (long long)(o->seed_set && seed != o->seed ? o->seed : o->batch_size),
                (long long)(o->seed_set && seed != o->seed ? seed : batch_size));
        return 2;
    }
    o->seed = seed;
    o->batch_size = batch_size;
    if (o->lr_set && em_optim_lr(opt) != o->lr) {
        printf("--lr %g replaces the checkpoint's learning rate %g\n", o->lr, em_optim_lr(opt));
        em_optim_set_lr(opt, o->lr);
    }
    if (pos->steps < 0) pos->steps = em_optim_steps(opt);
    return 0;
}

static void fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", tool, what, em_failed() ? em_last_error() : "unknown error");
}

/* One epoch from pos->batch on; false on error. Sets *stop when interrupted or at max_steps. */
static bool train_epoch(const train_opts *o, em_module *m, em_dp *dp, em_optimizer *opt, em_loader *l,
                        position *pos, bool *stop, double *seconds, int64_t *samples) {
    em_scope s = em_scope_begin();
    em_tensor *loss_sum = em_scalar(pos->loss_sum, EM_OPTS(.device = o->device, .dtype = EM_F64));
    char label[32];
    snprintf(label, sizeof label, "epoch %" PRId64 "/%" PRId64, pos->epoch + 1, o->epochs);
    progress bar;
    progress_begin(&bar, train_dist_progress_out(), label, em_loader_len(l), pos->batch);
    *samples = 0;
    em_batch b;
    bool ok = loss_sum != NULL;
    int64_t micro = 0;   /* --accumulate: batches since the last step */
    while (ok && !*stop && em_loader_next(l, &b)) {
        em_scope step = em_scope_begin();
        /* --amp, --devices and --accumulate in any combination (train_amp.c) */
        em_tensor *loss = train_amp_batch(&o->amp, o->device, m, dp, opt, b.x, b.y, o->accumulate, &micro);
        ok = loss && em_add_(loss_sum, em_detach(loss), 1.0) == EM_OK;
        ok = ok && train_log_step(&o->log, tool, pos->steps + 1, loss);
        em_scope_end(step);
        if (!ok) break;
        pos->batch = b.index + 1;
        pos->steps++;
        *samples += b.size;
        /* --accumulate: only between groups (a checkpoint keeps no partial gradients), so a
         * resumed run goes on as an uninterrupted one */
        if ((interrupted || (o->max_steps && pos->steps >= o->max_steps)) && micro == 0) *stop = true;
        if (train_dist_active()) *stop = train_dist_agree_stop(*stop);   /* every rank stops at one step */
        if (progress_due(&bar, pos->batch)) {
            double mean = em_item(loss_sum) / (double)pos->batch;
            progress_draw(&bar, pos->batch, *samples, mean);
        }
    }
    if (ok && em_failed()) ok = false;   /* the loader stopped on an error */
    if (ok && train_amp_flush(&o->amp, dp, opt, &micro) != EM_OK) ok = false;   /* a short last group */
    if (ok) pos->loss_sum = em_item(loss_sum);
    ok = ok && !em_failed();
    *seconds = mlp_now() - bar.t0;
    progress_end(&bar);
    em_scope_end(s);
    return ok;
}

static int run(train_opts *o) {
    if (o->threads) em_set_num_threads((int)o->threads);
    if (train_dist_init(tool, &o->device, o->threads != 0) != 0) {
        train_dist_finish();
        return 1;
    }
    if (o->ndevices && train_dist_world() > 1) {   /* each rank owns one device under DDP */
        fprintf(stderr, "%s: --devices (DataParallel) cannot run under a distributed job (world size %d): "
                        "give each rank one device\n", tool, train_dist_world());
        train_dist_finish();
        return 2;
    }
    int rc = 1;
    em_dataset *train = mlp_dataset(o->data_dir, true, o->train_samples, "--train-samples");
    em_dataset *test = train ? mlp_dataset(o->data_dir, false, o->test_samples, "--test-samples") : NULL;
    if (!test) {
        fail("cannot load Fashion-MNIST");
        em_dataset_free(train);
        return 1;
    }
    em_memory_empty_cache(EM_DEVICE_CPU);   /* the files' unused parts: not what training holds */
    if (!train_log_open(&o->log, tool, train_dist_is_main())) {
        em_dataset_free(train);
        em_dataset_free(test);
        train_dist_finish();
        return 1;
    }
    em_manual_seed((uint64_t)o->seed);
    em_module *model = model_new(o->model);
    if (model && em_module_to(model, o->device) != EM_OK) em_clear_error(), em_module_free(model), model = NULL;
    em_optimizer *opt = model ? make_optimizer(o, model) : NULL;
    em_loader *loader = NULL;
    em_dp *dp = NULL;
    em_module *fwd = model, *ckpt = NULL;   /* the training forward's module (train_ckpt.c) */
    position pos = {0};
    if (!opt || !train_amp_start(&o->amp, o->amp_set, o->amp_dtype, o->loss_scale)) {
        fail("cannot build the model");
        goto done;
    }
    if (o->resume && (rc = resume(o, model, opt, &pos)) != 0) goto done;
    rc = 1;
    /* after the resume: the replicas start from the restored weights */
    if (o->ndevices && !(dp = em_data_parallel(model, o->devices, o->ndevices))) {
        fail("cannot make the DataParallel replicas");
        goto done;
    }
    if (train_dist_wrap(tool, model) != 0) goto done;
    int segments = 0;
    if (o->ckpt_act && !(fwd = ckpt = train_ckpt_wrap(tool, model, &segments))) goto done;
    em_loader_opts lo = {.batch_size = o->batch_size, .shuffle = true, .seed = (uint64_t)o->seed,
                         .device = o->device, .pin_memory = o->device.type != EM_CPU,
                         /* 8 ahead: the producer is woken every 4 steps */
                         .prefetch = 8};
    train_dist_loader_opts(&lo);
    loader = em_loader_new(train, lo);
    if (!loader || em_loader_seek(loader, pos.epoch, pos.batch) != EM_OK) {
        fail("cannot make the data loader");
        goto done;
    }
    char devices_label[TRAIN_MAX_DEVICES * 16 + 32];
    train_devices_str(o->ndevices ? o->devices : &o->device, o->ndevices ? o->ndevices : 1, devices_label,
                      sizeof devices_label);
    if (o->ndevices) strcat(devices_label, " (DataParallel)");
    printf("training %s on %s: %" PRId64 " parameters, %" PRId64 " train / %" PRId64 " test samples, "
           "batch %" PRId64 ", %s lr %g, %d CPU thread%s%s\n",
           model_summary(o->model), devices_label, em_module_num_parameters(model),
           em_dataset_len(train), em_dataset_len(test), o->batch_size, o->optimizer, em_optim_lr(opt),
           em_get_num_threads(), em_get_num_threads() == 1 ? "" : "s", o->resume ? " (resumed)" : "");
    if (ckpt) printf("activation checkpointing: %d segments\n", segments);
    if (o->amp.on && o->amp.scaler)
        printf("mixed precision: autocast %s, float32 weights and optimizer, loss scaling (scale %g)\n",
               em_dtype_name(o->amp.dtype), em_grad_scaler_get_scale(o->amp.scaler));
    else if (o->amp.on)
        printf("mixed precision: autocast %s, float32 weights and optimizer\n", em_dtype_name(o->amp.dtype));
    if (o->resume)
        printf("resumed from %s at epoch %" PRId64 ", batch %" PRId64 " (%" PRId64 " steps done)\n", o->checkpoint,
               pos.epoch + 1, pos.batch, pos.steps);
    if (o->log.w || o->log.pt) {
        char config[512];
        snprintf(config, sizeof config, "%s on %s, batch %" PRId64 ", %s lr %g%s", model_summary(o->model),
                 devices_label, o->batch_size, o->optimizer, em_optim_lr(opt), o->resume ? " (resumed)" : "");
        if (!train_log_text(&o->log, tool, config)) goto done;
    }
    fflush(stdout);
    catch_stop_signals(true);
    bool stop = false;
    while (pos.epoch < o->epochs) {
        em_memory_reset_peak_stats(o->device);
        double seconds;
        int64_t samples;
        if (!train_epoch(o, fwd, dp, opt, loader, &pos, &stop, &seconds, &samples)) {
            fail("training failed");
            goto done;
        }
        if (stop && pos.batch < em_loader_len(loader)) break;   /* mid-epoch: save below */
        char mem[160];
        mlp_memory_line(o->device, mem, sizeof mem);
        mlp_eval ev = {0};
        double train_loss = train_dist_mean(pos.loss_sum / (double)(pos.batch > 0 ? pos.batch : 1));
        samples *= train_dist_world();   /* every rank's samples: the job's throughput */
        em_status est = EM_OK;
        if (train_dist_is_main()) {
            em_autocast ac = train_amp_begin(&o->amp, o->device);   /* evaluate in the precision trained in */
            est = mlp_evaluate(model, test, o->device, 1000, &ev);
            if (em_autocast_end(ac) != EM_OK) est = em_last_status();
        }
        if (est != EM_OK) {
            fail("evaluation failed");
            goto done;
        }
        printf("epoch %" PRId64 "/%" PRId64 ": train loss %.4f, test accuracy %.2f%%, test loss %.4f, "
               "%.0f samples/s (%.2f s), memory %s\n",
               pos.epoch + 1, o->epochs, train_loss,
               100.0 * ev.accuracy, ev.loss, seconds > 0 ? (double)samples / seconds : 0, seconds, mem);
        train_log_epoch le = {.epoch = pos.epoch + 1, .step = pos.steps, .train_loss = train_loss,
                              .test_accuracy = ev.accuracy, .test_loss = ev.loss, .lr = em_optim_lr(opt),
                              .samples_per_s = seconds > 0 ? (double)samples / seconds : 0,
                              .device = o->device, .model = model};
        if (!train_log_epoch_end(&o->log, tool, &le)) goto done;
        if (o->amp.on) {
            char amp[160];
            train_amp_epoch_line(&o->amp, amp, sizeof amp);
            printf("  %s\n", amp);
        }
        fflush(stdout);
        pos = (position){.epoch = pos.epoch + 1, .steps = pos.steps};
        if (em_loader_seek(loader, pos.epoch, 0) != EM_OK || save(o, model, opt, &pos) != EM_OK) {
            fail("cannot save the checkpoint");
            goto done;
        }
        if (stop || interrupted) break;   /* a signal during the evaluation or the save */
    }
    if (interrupted) stop = true;
    if (stop && pos.epoch < o->epochs) {
        if (save(o, model, opt, &pos) != EM_OK) {
            fail("cannot save the checkpoint");
            goto done;
        }
        printf("%s at epoch %" PRId64 ", batch %" PRId64 " (%" PRId64 " steps%s%s)%s%s%s\n",
               interrupted ? "interrupted" : "stopped (--max-steps)", pos.epoch + 1, pos.batch, pos.steps,
               interrupted ? ", " : "", interrupted ? signal_name(interrupted) : "",
               o->checkpoint ? ": checkpoint saved to " : "", o->checkpoint ? o->checkpoint : "",
               o->checkpoint ? "; continue with --resume" : "");
        rc = interrupted ? 128 + interrupted : 0;
    } else if (interrupted) {   /* the signal came with the last epoch's save */
        if (o->checkpoint) printf("interrupted (%s) after the last epoch: checkpoint saved to %s\n",
                                  signal_name(interrupted), o->checkpoint);
        rc = 128 + interrupted;
    } else {
        if (o->checkpoint) printf("checkpoint: %s\n", o->checkpoint);
        rc = 0;
    }
done:
    catch_stop_signals(false);
    if (!train_log_close(&o->log, tool) && rc == 0) rc = 1;
    em_loader_free(loader);
    em_dp_free(dp);
    train_amp_free(&o->amp);
    em_optim_free(opt);
    em_module_free(ckpt);
    em_module_free(model);
    em_dataset_free(train);
    em_dataset_free(test);
    em_memory_empty_cache(o->device);   /* hand the cached blocks back: nothing outlives the run */
    for (int i = 1; i < o->ndevices; i++) em_memory_empty_cache(o->devices[i]);
    em_memory_empty_cache(EM_DEVICE_CPU);
    em_memory_empty_pinned_cache();
    train_dist_finish();
    return rc;
}

int cmd_train(int argc, char **argv) {
    /* --model gpt: its own options and loop (model_gpt.c) */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--model") && !strcmp(argv[i + 1], "gpt")) return gpt_train_main(argc, argv);
    train_opts o;
    int rc = parse(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}
