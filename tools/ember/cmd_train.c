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
#include "stop_signals.h"
#include "train_amp.h"
#include "train_ckpt.h"   /* --checkpoint-activations */
#include "train_log.h"
#include "plot.h"         /* --plot */
#include "train_parallel.h"
#include "train_dist.h"   /* DDP under mpirun / ember launch */
#include "train_graph.h"  /* the step as a CUDA graph */
#include "options.h"
#include <ember/parse.h>

static const char *const tool = "ember train";

/* Seconds from a stop signal to the exit, checkpoint saved or not: under the 30 s that
 * Slurm (KillWait) and Kubernetes (terminationGracePeriodSeconds) wait before SIGKILL. */
#define GRACE_SECONDS 20

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

/* Upper limits: far beyond any real run, low enough that no counter derived from them
 * overflows (epoch + 1, steps, threads as an int). */
#define MAX_EPOCHS 1000000000
#define MAX_BATCH ((int64_t)1 << 30)
#define MAX_THREADS 4096
#define MAX_COUNT ((int64_t)1 << 50)

enum { T_MODEL, T_DEVICE, T_DEVICES, T_EPOCHS, T_BATCH_SIZE, T_OPTIMIZER, T_LR, T_MOMENTUM, T_WEIGHT_DECAY, T_SEED,
       T_THREADS, T_DATA, T_CHECKPOINT, T_RESUME, T_MAX_STEPS, T_TRAIN_SAMPLES, T_TEST_SAMPLES, T_AMP, T_LOSS_SCALE,
       T_CKPT_ACT, T_ACCUMULATE, T_LOGDIR, T_LOG_EVERY, T_PLOT, T_STRICT_LOGS };
enum { MODEL_MLP, MODEL_CNN, MODEL_GPT };
static const opt_choice model_choices[] = {{"mlp", MODEL_MLP}, {"cnn", MODEL_CNN}, {"gpt", MODEL_GPT}, {NULL, 0}};
static const char *const model_names[] = {[MODEL_MLP] = "mlp", [MODEL_CNN] = "cnn", [MODEL_GPT] = "gpt"};
static const opt_choice optimizer_choices[] = {{"adam", 0}, {"adamw", 1}, {"sgd", 2}, {NULL, 0}};
static const char *const optimizer_names[] = {"adam", "adamw", "sgd"};
static const opt_spec train_table[] = {
    [T_MODEL] = OPTION_CHOICE("--model", model_choices,
                              "mlp (default: the seed's), cnn (LeNet-5 style, tools/ember/model_cnn.c) or gpt (a "
                              "character-level transformer on --text, tools/ember/model_gpt.c; `ember train --model "
                              "gpt --help` lists its options)"),
    [T_DEVICE] = OPTION_DEVICE("--device", "auto (default: CUDA, then an OpenCL GPU, then the CPU), cpu, cuda:N, opencl:N"),
    [T_DEVICES] = OPTION_LIST("--devices", "A,B",
                              "DataParallel over these devices (opencl:0,opencl:1 or cpu,opencl:0): each batch split "
                              "across them, one model replica on each"),
    [T_EPOCHS] = OPTION_INT("--epochs", "N", 0, MAX_EPOCHS, "epochs to train (default 5)"),
    [T_BATCH_SIZE] = OPTION_INT("--batch-size", "N", 1, MAX_BATCH, "samples per step (default 64)"),
    [T_OPTIMIZER] = OPTION_CHOICE("--optimizer", optimizer_choices, "the optimizer (default adam)"),
    [T_LR] = OPTION_DOUBLE("--lr", "X", 0, 1e6, "learning rate (default 0.001 for adam/adamw, 0.01 for sgd)"),
    [T_MOMENTUM] = OPTION_DOUBLE("--momentum", "X", 0, 1, "SGD momentum (default 0.9)"),
    [T_WEIGHT_DECAY] = OPTION_DOUBLE("--weight-decay", "X", 0, 1e6,
                                     "weight decay (default 0; adamw's decoupled default is 0.01)"),
    [T_SEED] = OPTION_INT("--seed", "N", 0, INT64_MAX, "initial weights and batch order (default 0)"),
    [T_THREADS] = OPTION_INT("--threads", "N", 1, MAX_THREADS, "CPU threads (default: every core)"),
    [T_DATA] = OPTION_STRING("--data", "DIR",
                             "directory of the IDX files (default: the Debian package's, or EMBER_DATA_DIR)"),
    [T_CHECKPOINT] = OPTION_STRING("--checkpoint", "PATH",
                                   "safetensors checkpoint written after every epoch and on Ctrl-C, SIGTERM or "
                                   "SIGHUP (default ember-MODEL.safetensors; 'none' to write nothing); its folder is "
                                   "checked before training starts"),
    [T_RESUME] = OPTION_FLAG("--resume",
                             "continue from --checkpoint with its model, seed, batch size, optimizer state and "
                             "learning rate; --lr given with --resume replaces the checkpoint's learning rate (and "
                             "says so); --model, --seed, --batch-size or --train-samples unlike the checkpoint's are "
                             "an error"),
    [T_MAX_STEPS] = OPTION_INT("--max-steps", "N", 1, MAX_COUNT,
                               "stop after N batches in total, saving a checkpoint as Ctrl-C does (with --accumulate "
                               "N, at the end of that group of N batches, as on a signal: a checkpoint keeps no "
                               "partial gradients)"),
    [T_TRAIN_SAMPLES] = OPTION_INT("--train-samples", "N", 1, MAX_COUNT,
                                   "train on the first N samples only (default: all 60000)"),
    [T_TEST_SAMPLES] = OPTION_INT("--test-samples", "N", 1, MAX_COUNT,
                                  "test on the first N samples only (default: all 10000)"),
    [T_AMP] = {.name = "--amp", .kind = OPT_CHOICE, .choices = train_amp_choices, .flags = OPT_NOCASE,
               .help = "mixed precision: autocast regions (Linear and Conv2d in the low dtype, the loss in float32), "
                       "float32 weights and optimizer; f16 adds loss scaling, whose state the checkpoint keeps for "
                       "--resume"},
    [T_LOSS_SCALE] = {.name = "--loss-scale", .kind = OPT_DOUBLE, .metavar = "X", .dmin = 0, .dmax = FLT_MAX,
                      .flags = OPT_ABOVE_MIN,
                      .help = "--amp f16's initial loss scale (default 65536, as PyTorch's GradScaler)"},
    [T_CKPT_ACT] = OPTION_FLAG("--checkpoint-activations",
                               "recompute activations in backward instead of keeping them (em_checkpoint_sequential "
                               "over about sqrt(layers) segments)"),
    [T_ACCUMULATE] = OPTION_INT("--accumulate", "N", 1, MAX_COUNT,
                                "gradient accumulation: backward of loss / N per batch, one optimizer step per N "
                                "batches (the gradient of one batch of N * --batch-size)"),
    /* TensorBoard (train_log.c) */
    [T_LOGDIR] = OPTION_STRING("--logdir", "DIR",
                               "TensorBoard event file in DIR (made if missing): the loss every --log-every steps; "
                               "per epoch losses, accuracy, learning rate, samples/s, device memory and parameter "
                               "histograms; DIR is checked before training starts"),
    [T_LOG_EVERY] = OPTION_INT("--log-every", "N", 1, MAX_COUNT, "steps between logged losses (default 10)"),
    /* plots (plot_train.c) */
    [T_PLOT] = OPTION_STRING("--plot", "FILE",
                             "loss and test accuracy curves drawn into FILE, a .png or .svg picture, rewritten after "
                             "every epoch (the loss every --log-every steps too); its folder is checked before "
                             "training starts"),
    [T_STRICT_LOGS] = OPTION_FLAG("--strict-logs",
                                  "a --logdir or --plot write that fails (a full disk) stops training, after the "
                                  "checkpoint is saved, with status 1; without it that is a warning, once, and "
                                  "training goes on without that output"),
};
OPT_TABLE_FITS(train_table);

const opt_command train_options = {
    .name = "ember train",
    .usage = "ember train [options]",
    .about = "Train the seed's MLP (784-256-10, ReLU) on Fashion-MNIST and report, after each epoch, the train loss, "
             "test accuracy, samples/s and the device's memory.",
    .options = train_table,
    .count = OPT_COUNT(train_table),
    .epilogue =
        "--amp, --devices and --accumulate combine in any way (the replicas run in the autocast region; the f16 "
        "scaler scales each batch's loss, unscales once per step and skips it for every replica on inf/NaN); "
        "--checkpoint-activations goes with --amp (the recomputation runs in the forward's autocast region), not "
        "with --devices yet.\n"
        "\n"
        "The device is --device, else EMBER_DEVICE (an invalid one is an error), else auto. A progress bar with rate "
        "and ETA is drawn on a terminal; otherwise a plain line is printed every quarter epoch.\n"
        "\n"
        "Signals: SIGINT (Ctrl-C), SIGTERM (what Slurm and Kubernetes send before SIGKILL) and SIGHUP stop after the "
        "current step, save the checkpoint and exit with 128 + the signal (130, 143, 129). If the checkpoint is not "
        "saved within " STRINGIFY(GRACE_SECONDS) " s of the signal, or a second signal comes, the process exits at "
        "once with the same status, without it.\n"
        "\n"
        "Distributed: started by mpirun -np N, srun or `ember launch -n N`, each rank trains with "
        "DistributedDataParallel on its own shard of every epoch (--batch-size per rank) and its own device "
        "(cuda:LOCAL_RANK); rank 0 alone prints and writes the checkpoint, which any number of ranks can --resume.",
    .exit_status = "0 done, 1 failed, 2 bad arguments, 128" OPT_NBSP "+" OPT_NBSP "N stopped by signal N",
};

typedef struct train_opts {
    em_device device;
    int64_t epochs, batch_size, seed, threads, max_steps, train_samples, test_samples;
    const char *optimizer, *data_dir, *checkpoint, *model;
    double lr, momentum, weight_decay;
    bool lr_set, wd_set, seed_set, batch_set, model_set, resume;
    int64_t train_len;       /* the training split's samples (--train-samples, or all): the batch order's */
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
    train_graph graph;       /* the step replayed from a CUDA graph (train_graph.c) */
} train_opts;

/* Where a run stands: what a checkpoint records beyond the weights. */
typedef struct position {
    int64_t epoch, batch;    /* the next batch to train on */
    double loss_sum;         /* this epoch's summed batch losses so far */
    int64_t steps;           /* optimizer steps in total */
} position;

static int parse(int argc, char **argv, train_opts *o) {
    *o = (train_opts){.epochs = 5, .batch_size = 64, .optimizer = "adam",
                      .momentum = 0.9, .checkpoint = NULL, .model = "mlp", .log.every = 10};
    opt_result opts;
    int status = opt_parse(&train_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    bool device_set = v[T_DEVICE].given, checkpoint_given = v[T_CHECKPOINT].given;
    if ((o->model_set = v[T_MODEL].given)) o->model = model_names[v[T_MODEL].choice];
    if (v[T_OPTIMIZER].given) o->optimizer = optimizer_names[v[T_OPTIMIZER].choice];
    if (v[T_EPOCHS].given) o->epochs = v[T_EPOCHS].i;
    if ((o->batch_set = v[T_BATCH_SIZE].given)) o->batch_size = v[T_BATCH_SIZE].i;
    if ((o->seed_set = v[T_SEED].given)) o->seed = v[T_SEED].i;
    o->threads = v[T_THREADS].i;
    o->max_steps = v[T_MAX_STEPS].i;
    o->train_samples = v[T_TRAIN_SAMPLES].i;
    o->test_samples = v[T_TEST_SAMPLES].i;
    if ((o->lr_set = v[T_LR].given)) o->lr = v[T_LR].d;
    if (v[T_MOMENTUM].given) o->momentum = v[T_MOMENTUM].d;
    if ((o->wd_set = v[T_WEIGHT_DECAY].given)) o->weight_decay = v[T_WEIGHT_DECAY].d;
    o->data_dir = v[T_DATA].text;
    if ((o->amp_set = v[T_AMP].given)) o->amp_dtype = (em_dtype)v[T_AMP].choice;
    o->loss_scale = v[T_LOSS_SCALE].d;
    if (v[T_LOSS_SCALE].given && !train_amp_check_scale(tool, "--loss-scale", v[T_LOSS_SCALE].text, o->loss_scale))
        return 2;
    o->accumulate = v[T_ACCUMULATE].i;
    o->ckpt_act = v[T_CKPT_ACT].given;
    o->resume = v[T_RESUME].given;
    o->log.dir = v[T_LOGDIR].text;
    o->log.strict = v[T_STRICT_LOGS].given;
    if (v[T_LOG_EVERY].given) o->log.every = v[T_LOG_EVERY].i;
    if (checkpoint_given) o->checkpoint = strcmp(v[T_CHECKPOINT].text, "none") ? v[T_CHECKPOINT].text : NULL;
    /* what the values name: devices that exist, a folder for the picture */
    if (device_set && !mlp_parse_device(tool, "--device", v[T_DEVICE].text, &o->device)) return 2;
    if (v[T_DEVICES].given && !train_parse_devices(tool, v[T_DEVICES].text, o->devices, &o->ndevices)) return 2;
    if (v[T_PLOT].given) {
        if (!plot_check_output(stderr, tool, "--plot", v[T_PLOT].text)) return 2;
        o->log.plot = v[T_PLOT].text;
    }
    if (o->log.dir && !mlp_check_folder(tool, "--logdir", o->log.dir)) return 2;
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
    if (!mlp_check_memory_env(tool, o->ndevices ? o->devices : &o->device, o->ndevices ? o->ndevices : 1)) return 2;
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
    char v[9][40];
    snprintf(v[0], sizeof v[0], "%" PRId64, pos->epoch);
    snprintf(v[1], sizeof v[1], "%" PRId64, pos->batch);
    snprintf(v[2], sizeof v[2], "%.17g", pos->loss_sum);
    snprintf(v[3], sizeof v[3], "%" PRId64, o->seed);
    snprintf(v[4], sizeof v[4], "%" PRId64, o->batch_size);
    snprintf(v[5], sizeof v[5], "%s", o->model);
    snprintf(v[6], sizeof v[6], "%d", train_dist_world());
    snprintf(v[7], sizeof v[7], "%" PRId64, pos->steps);   /* batches: with --accumulate, not the optimizer's */
    snprintf(v[8], sizeof v[8], "%" PRId64, o->train_len);
    const char *keys[9 + TRAIN_AMP_META] = {"train.epoch", "train.batch", "train.loss_sum", "train.seed",
                                            "train.batch_size", "model", "train.world_size", "train.steps",
                                            "train.samples"};
    const char *vals[9 + TRAIN_AMP_META] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
    train_amp_meta am;   /* the loss scaler's state (train_amp.c) */
    if (train_amp_meta_of(&o->amp, &am) != EM_OK) return em_last_status();
    for (int i = 0; i < am.n; i++) keys[9 + i] = am.keys[i], vals[9 + i] = am.vals[i];
    return em_checkpoint_save(o->checkpoint, m, opt, keys, vals, 9 + am.n);
}

/* A train.* number from the checkpoint, in [min, max]; says which and why when not. */
static bool meta_i64(const em_safetensors *f, const char *path, const char *key, int64_t min, int64_t max, int64_t *out) {
    const char *s = em_safetensors_metadata(f, key);
    em_num_result r = em_parse_i64(s, min, max, out);
    if (r == EM_NUM_OK) return true;
    if (!s) fprintf(stderr, "%s: cannot resume: %s lacks the metadata '%s' ember train writes\n", tool, path, key);
    else fprintf(stderr, "%s: cannot resume: %s: metadata '%s' = '%.60s' (%s): expected an integer from %lld to %lld\n",
                 tool, path, key, s, em_num_why(r), (long long)min, (long long)max);
    return false;
}

/* --resume, first: reads the checkpoint, once (what resume() loads is this read), and takes
 * its model: a checkpoint's "model" decides what is built (given as --model and unlike, an
 * error). 0, or the exit status with the message printed. */
static int resume_open(train_opts *o, em_safetensors **file) {
    *file = em_safetensors_load(o->checkpoint, EM_DEVICE_CPU);
    const char *kind = *file ? model_of_file(*file) : NULL;
    int rc = 0;
    if (!kind) {
        fprintf(stderr, "%s: cannot resume: %s\n", tool, em_last_error());
        rc = 1;
    } else if (!strcmp(kind, "gpt")) {
        fprintf(stderr, "%s: --resume: %s is a GPT's checkpoint (ember train --model gpt), which --resume cannot "
                "continue: it continues the runs of --model mlp and cnn\n", tool, o->checkpoint);
        rc = 2;
    } else if (o->model_set && strcmp(kind, o->model)) {
        fprintf(stderr, "%s: --resume: --model %s is unlike the checkpoint's model, %s (%s); a resumed run continues "
                "the model it started with (leave --model out)\n", tool, o->model, kind, o->checkpoint);
        rc = 2;
    } else {
        o->model = kind;   /* a static string of model_of_file's */
    }
    if (rc) {
        em_safetensors_free(*file);
        *file = NULL;
    }
    return rc;
}

/* Loads model, optimizer and position from the checkpoint's read (resume_open); the
 * checkpoint's seed and batch size win (given and unlike, an error: the batch order depends
 * on them), and its training split must be as large (--train-samples). */
static int resume(train_opts *o, const em_safetensors *meta, em_module *m, em_optimizer *opt, position *pos) {
    if (em_checkpoint_load_safetensors(meta, m, opt) != EM_OK) {
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
    int64_t samples = o->train_len;   /* train.samples: absent before it was written */
    if (ok && em_safetensors_metadata(meta, "train.samples"))
        ok = meta_i64(meta, o->checkpoint, "train.samples", 1, MAX_COUNT, &samples);
    if (ok) ok = train_amp_resume(tool, &o->amp, meta, o->checkpoint);   /* the loss scaler's state */
    if (!ok) return 1;
    if (samples != o->train_len) {   /* the shuffled order of another count: not the run that was stopped */
        fprintf(stderr, "%s: --resume: this run trains on %lld samples, the checkpoint's run on %lld; a resumed run "
                "keeps the batch order it started with (give --train-samples %lld)\n", tool,
                (long long)o->train_len, (long long)samples, (long long)samples);
        return 2;
    }
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
static bool train_epoch(train_opts *o, em_module *m, em_dp *dp, em_optimizer *opt, em_loader *l,
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
        /* a CUDA graph where the step allows it (train_graph.c); else --amp, --devices and
         * --accumulate in any combination (train_amp.c) */
        em_tensor *loss = o->graph.on ? train_graph_batch(&o->graph, b.x, b.y)
                                      : train_amp_batch(&o->amp, o->device, m, dp, opt, b.x, b.y, o->accumulate, &micro);
        ok = loss && em_add_(loss_sum, em_detach(loss), 1.0) == EM_OK;
        ok = ok && train_log_step(&o->log, tool, pos->steps + 1, loss);
        em_scope_end(step);
        if (!ok) break;
        pos->batch = b.index + 1;
        pos->steps++;
        *samples += b.size;
        /* --accumulate: only between groups (a checkpoint keeps no partial gradients), so a
         * resumed run goes on as an uninterrupted one */
        if ((stop_signals_pending() || (o->max_steps && pos->steps >= o->max_steps) || train_log_stop(&o->log)) && micro == 0)
            *stop = true;
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
    em_safetensors *resume_file = NULL;   /* --resume: the checkpoint, read once */
    if (o->resume && (rc = resume_open(o, &resume_file)) != 0) {
        train_dist_finish();
        return rc;
    }
    rc = 1;
    em_dataset *train = mlp_dataset(o->data_dir, true, o->train_samples, "--train-samples");
    em_dataset *test = train ? mlp_dataset(o->data_dir, false, o->test_samples, "--test-samples") : NULL;
    if (!test) {
        fail("cannot load Fashion-MNIST");
        em_dataset_free(train);
        em_safetensors_free(resume_file);
        train_dist_finish();
        return 1;
    }
    o->train_len = em_dataset_len(train);
    em_memory_empty_cache(EM_DEVICE_CPU);   /* the files' unused parts: not what training holds */
    if (!train_log_open(&o->log, tool, train_dist_is_main())) {   /* --strict-logs: nothing trained yet */
        em_dataset_free(train);
        em_dataset_free(test);
        em_safetensors_free(resume_file);
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
    if (o->resume && (rc = resume(o, resume_file, model, opt, &pos)) != 0) goto done;
    em_safetensors_free(resume_file);   /* loaded: its tensors are the model's and optimizer's now */
    resume_file = NULL;
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
    /* The step as a CUDA graph, where a recording replays it safely. Eager, and why: --amp
     * (autocast's casts and the f16 scaler's skip decision, read on the host each step),
     * --accumulate (the host decides which batch steps), --devices and DDP (the replicas'
     * scatter and the ranks' collectives), --checkpoint-activations (its recomputation saves
     * and restores the RNG state on the host). */
    const char *why_eager = o->amp.on             ? "--amp: autocast and the loss scaler decide on the host each step"
                            : o->accumulate > 1   ? "--accumulate: the host decides which batch steps"
                            : o->ndevices         ? "--devices: DataParallel's replicas"
                            : train_dist_active() ? "a distributed job: the ranks' collectives"
                            : ckpt                ? "--checkpoint-activations: the recomputation's RNG state is the host's"
                                                  : NULL;
    if (o->device.type == EM_CUDA) train_graph_start(&o->graph, o->device, fwd, opt, why_eager);
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
        train_log_text(&o->log, tool, config);
    }
    fflush(stdout);
    stop_signals_catch(true, GRACE_SECONDS);
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
        if (o->amp.on) {
            char amp[160];
            train_amp_epoch_line(&o->amp, amp, sizeof amp);
            printf("  %s\n", amp);
        }
        if (o->device.type == EM_CUDA) {
            char graph[512];
            train_graph_summary(&o->graph, graph, sizeof graph);
            printf("  %s\n", graph);
        }
        fflush(stdout);
        pos = (position){.epoch = pos.epoch + 1, .steps = pos.steps};
        if (em_loader_seek(loader, pos.epoch, 0) != EM_OK || save(o, model, opt, &pos) != EM_OK) {
            fail("cannot save the checkpoint");
            goto done;
        }
        /* the checkpoint first: a log or picture that cannot be written loses no epoch */
        train_log_epoch_end(&o->log, tool, &le);
        bool log_stop = train_log_stop(&o->log);
        if (train_dist_active()) log_stop = train_dist_agree_stop(log_stop);   /* rank 0 logs: all stop */
        if (log_stop) stop = true;
        if (stop || stop_signals_pending()) break;   /* a signal during the evaluation or the save */
    }
    int sig = stop_signals_pending();   /* read once: one signal names the stop and the status */
    if (sig) stop = true;
    if (stop && pos.epoch < o->epochs) {
        if (save(o, model, opt, &pos) != EM_OK) {
            fail("cannot save the checkpoint");
            goto done;
        }
        printf("%s at epoch %" PRId64 ", batch %" PRId64 " (%" PRId64 " steps%s%s)%s%s%s\n",
               sig                                           ? "interrupted"
               : o->max_steps && pos.steps >= o->max_steps ? "stopped (--max-steps)"
                                                             : "stopped (--strict-logs: a --logdir or --plot write failed)",
               pos.epoch + 1, pos.batch, pos.steps,
               sig ? ", " : "", sig ? stop_signal_name(sig) : "",
               o->checkpoint ? ": checkpoint saved to " : "", o->checkpoint ? o->checkpoint : "",
               o->checkpoint ? "; continue with --resume" : "");
        rc = sig ? 128 + sig : 0;
    } else if (sig) {   /* the signal came with the last epoch's save */
        if (o->checkpoint) printf("interrupted (%s) after the last epoch: checkpoint saved to %s\n",
                                  stop_signal_name(sig), o->checkpoint);
        rc = 128 + sig;
    } else {
        if (o->checkpoint) printf("checkpoint: %s\n", o->checkpoint);
        rc = 0;
    }
done:
    stop_signals_catch(false, 0);
    train_log_close(&o->log, tool);
    if (rc == 0 && train_log_stop(&o->log)) {
        fprintf(stderr, "%s: exit status 1: a --logdir or --plot write failed and --strict-logs was given (the "
                "checkpoint holds everything trained)\n", tool);
        rc = 1;
    }
    train_graph_free(&o->graph);
    em_loader_free(loader);
    em_dp_free(dp);
    train_amp_free(&o->amp);
    em_optim_free(opt);
    em_module_free(ckpt);
    em_module_free(model);
    em_dataset_free(train);
    em_dataset_free(test);
    em_safetensors_free(resume_file);
    em_memory_empty_cache(o->device);   /* hand the cached blocks back: nothing outlives the run */
    for (int i = 1; i < o->ndevices; i++) em_memory_empty_cache(o->devices[i]);
    em_memory_empty_cache(EM_DEVICE_CPU);
    em_memory_empty_pinned_cache();
    train_dist_finish();
    return rc;
}

int cmd_train(int argc, char **argv) {
    /* --model gpt: its own options and loop (model_gpt.c) */
    for (int i = 1; i < argc; i++)
        if ((!strcmp(argv[i], "--model") && i + 1 < argc && !strcmp(argv[i + 1], "gpt")) || !strcmp(argv[i], "--model=gpt"))
            return gpt_train_main(argc, argv);
    train_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    stop_signals_take(tool);   /* before run starts any thread */
    return run(&o);
}
