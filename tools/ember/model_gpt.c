/* ember train --model gpt: a small decoder-only transformer trained on the characters of a
 * text (by default the fortune-cookie files of Debian's fortunes package). Token and position
 * embeddings, pre-norm blocks (LayerNorm, causal MultiheadAttention, LayerNorm, a GELU MLP, each
 * with a residual), a final LayerNorm and a linear head over the vocabulary; AdamW. An epoch is
 * a fixed number of steps on random windows of the first 90% of the text; after each one the
 * validation loss on fixed windows of the last 10% and a sample of generated text. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <ember/estimate.h>
#include "mlp.h"
#include "model_gpt.h"
#include "mem_measured.h"
#include "progress.h"
#include "plot.h"   /* --plot */
#include "train_log.h"   /* --plot's failures */
#include "options.h"

/* CPU time of every thread of the process (benchmarks on a shared machine compare it: unlike
 * wall time it does not count waiting for a core) */
static double process_cpu_seconds(void) {
    struct timespec ts;
    return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : 0.0;
}

static const char *const tool = "ember train";
#define DEFAULT_TEXT "/usr/share/games/fortunes"

typedef struct gpt_cfg {
    int64_t vocab, context, layers, d_model, heads;
    bool ckpt; /* --checkpoint-activations: each block's forward under em_checkpoint */
} gpt_cfg;

typedef struct gpt_opts {
    em_device device;
    gpt_cfg cfg;
    int64_t epochs, steps, batch, seed, threads, max_steps, sample_chars;
    double lr, weight_decay;
    const char *text, *checkpoint;
    const char *plot;        /* --plot FILE: the loss curves (plot_train.c) */
    bool strict_logs;        /* --strict-logs: a failed --plot write stops training after saving */
} gpt_opts;

/* ---- the text ---- */

typedef struct corpus {
    unsigned char *data;
    int64_t n;
    unsigned char chars[256]; /* token -> byte */
    int token_of[256];        /* byte -> token, -1 when not in the vocabulary */
    int64_t vocab;
    int64_t *tokens;
} corpus;

static bool append_file(corpus *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot read --text %s: %s\n", tool, path, strerror(errno));
        return false;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (!strcmp(line, "%\n")) continue; /* fortune's separator lines */
        size_t len = strlen(line);
        unsigned char *grown = realloc(c->data, (size_t)c->n + len + 1);
        if (!grown) {
            fclose(f);
            fprintf(stderr, "%s: out of memory reading %s\n", tool, path);
            return false;
        }
        c->data = grown;
        memcpy(c->data + c->n, line, len);
        c->n += (int64_t)len;
    }
    fclose(f);
    return true;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A file, or every plain file of a folder (sorted, without fortune's .dat/.u8 indexes). */
static bool corpus_load(corpus *c, const char *path) {
    memset(c, 0, sizeof *c);
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: --text %s: %s%s\n", tool, path, strerror(errno),
                strcmp(path, DEFAULT_TEXT) ? "" : " (install Debian's fortunes package, or give --text FILE)");
        return false;
    }
    if (!S_ISDIR(st.st_mode)) return append_file(c, path);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "%s: cannot list --text %s: %s\n", tool, path, strerror(errno));
        return false;
    }
    char *names[512];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 512;) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && !strcmp(e->d_name + len - 4, ".dat")) ||
            (len > 3 && !strcmp(e->d_name + len - 3, ".u8")))
            continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && (names[n] = strdup(full))) n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    bool ok = true;
    for (int i = 0; i < n; i++) {
        ok = ok && append_file(c, names[i]);
        free(names[i]);
    }
    return ok;
}

/* The vocabulary: the bytes that occur, in byte order. */
static bool corpus_tokenize(corpus *c, int64_t context) {
    if (c->n < 2 * (context + 1) * 10) {
        fprintf(stderr, "%s: --text has %" PRId64 " characters: too short for --context %" PRId64
                " (at least %" PRId64 ")\n", tool, c->n, context, 2 * (context + 1) * 10);
        return false;
    }
    bool seen[256] = {0};
    for (int64_t i = 0; i < c->n; i++) seen[c->data[i]] = true;
    c->vocab = 0;
    for (int b = 0; b < 256; b++) {
        c->token_of[b] = seen[b] ? (int)c->vocab : -1;
        if (seen[b]) c->chars[c->vocab++] = (unsigned char)b;
    }
    c->tokens = malloc((size_t)c->n * sizeof *c->tokens);
    if (!c->tokens) return false;
    for (int64_t i = 0; i < c->n; i++) c->tokens[i] = c->token_of[c->data[i]];
    return true;
}

static void corpus_free(corpus *c) {
    free(c->data);
    free(c->tokens);
}

/* splitmix64: the batch offsets and the sampling, reproducible from --seed */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* B windows of context + 1 tokens starting in [lo, hi - context - 1]: inputs x and targets y */
static void make_batch(const corpus *c, const gpt_opts *o, int64_t lo, int64_t hi, uint64_t *rng, em_tensor **x,
                       em_tensor **y) {
    int64_t B = o->batch, T = o->cfg.context, span = hi - lo - T - 1;
    int64_t *buf = malloc((size_t)(B * (T + 1)) * sizeof *buf);
    if (!buf) {
        *x = *y = NULL;
        return;
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t at = lo + (int64_t)(next_u64(rng) % (uint64_t)span);
        memcpy(buf + b * (T + 1), c->tokens + at, (size_t)(T + 1) * sizeof *buf);
    }
    em_tensor *all = em_to(em_from_data(buf, EM_I64, EM_SHAPE(B, T + 1), EM_OPTS(.dtype = EM_I64)), o->device);
    free(buf);
    *x = em_contiguous(em_narrow(all, 1, 0, T));
    *y = em_contiguous(em_narrow(all, 1, 1, T));
}

/* ---- the model ---- */

static em_tensor *block_forward(em_module *m, em_tensor *x) {
    em_tensor *h = em_forward(em_module_child(m, 0), x);
    x = em_add(x, em_multihead_attention_forward(em_module_child(m, 1), h, h, h, NULL, true, NULL));
    return em_add(x, em_forward(em_module_child(m, 3), em_forward(em_module_child(m, 2), x)));
}
static const em_module_ops block_ops = {.name = "Block", .forward = block_forward};

/* em_checkpoint's function: one block (ctx) on its input */
static em_tensor *block_ckpt_fn(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    return em_forward(ctx, in[0]);
}

/* idx [B, T] int64 -> logits [B, T, vocab] */
static em_tensor *gpt_forward(em_module *m, em_tensor *idx) {
    int64_t T = em_size(idx, -1);
    const bool *ckpt = em_module_ctx(m);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_OPTS(.dtype = EM_I64, .device = em_device_of(idx)));
    em_tensor *h = em_add(em_forward(em_module_child(m, 0), idx), em_forward(em_module_child(m, 1), pos));
    em_module *blocks = em_module_child(m, 2);
    if (ckpt && *ckpt) /* autograd keeps each block's input only; backward recomputes the block */
        for (int i = 0; h && em_module_child(blocks, i); i++) h = em_checkpoint(block_ckpt_fn, em_module_child(blocks, i), &h, 1);
    else
        h = em_forward(blocks, h);
    h = em_forward(em_module_child(m, 3), h);
    return em_forward(em_module_child(m, 4), h);
}
static const em_module_ops gpt_ops = {.name = "GPT", .forward = gpt_forward, .free_ctx = free};

static em_module *block_new(int64_t d, int64_t heads) {
    em_module *b = em_module_new(&block_ops, NULL);
    if (!b) return NULL;
    /* each add takes ownership, also when it fails */
    bool ok = !em_module_add_child(b, "ln1", em_nn_layer_norm(EM_SHAPE(d), 1e-5, true));
    ok = !em_module_add_child(b, "attn", em_nn_multihead_attention_ex(d, heads, 0.0, true, true)) && ok;
    ok = !em_module_add_child(b, "ln2", em_nn_layer_norm(EM_SHAPE(d), 1e-5, true)) && ok;
    ok = !em_module_add_child(b, "mlp", em_nn_sequential(em_nn_linear(d, 4 * d), em_nn_gelu(), em_nn_linear(4 * d, d))) && ok;
    if (!ok) {
        em_module_free(b);
        return NULL;
    }
    return b;
}

static em_module *gpt_new(const gpt_cfg *c) {
    bool *ckpt = malloc(sizeof *ckpt);
    if (!ckpt) return NULL;
    *ckpt = c->ckpt;
    em_module *m = em_module_new(&gpt_ops, ckpt); /* frees ckpt when it fails */
    if (!m) return NULL;
    em_module *blocks = em_nn_sequential_n(0, NULL);
    bool ok = blocks != NULL;
    for (int64_t i = 0; ok && i < c->layers; i++) ok = em_sequential_append(blocks, block_new(c->d_model, c->heads)) == EM_OK;
    if (!ok) em_module_free(blocks), blocks = NULL;
    /* each add takes ownership, also when it fails */
    ok = !em_module_add_child(m, "tok_emb", em_nn_embedding(c->vocab, c->d_model, EM_NO_PADDING_IDX)) && ok;
    ok = !em_module_add_child(m, "pos_emb", em_nn_embedding(c->context, c->d_model, EM_NO_PADDING_IDX)) && ok;
    ok = !em_module_add_child(m, "blocks", blocks) && ok;
    ok = !em_module_add_child(m, "ln_f", em_nn_layer_norm(EM_SHAPE(c->d_model), 1e-5, true)) && ok;
    ok = !em_module_add_child(m, "head", em_nn_linear(c->d_model, c->vocab)) && ok;
    if (ok) { /* embeddings start small (N(0, 0.02), as GPT-2), not N(0, 1) */
        em_named_tensor p[2];
        em_module_parameters(m, p, 2);
        em_grad_mode g = em_no_grad_begin();
        ok = em_mul_scalar_(p[0].tensor, 0.02) == EM_OK && em_mul_scalar_(p[1].tensor, 0.02) == EM_OK;
        em_no_grad_end(g);
    }
    if (!ok) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* mean cross-entropy of the next character */
static em_tensor *gpt_loss(em_module *m, em_tensor *x, em_tensor *y, int64_t vocab) {
    em_tensor *logits = em_forward(m, x);
    return em_cross_entropy(em_reshape(logits, EM_SHAPE(-1, vocab)), em_reshape(y, EM_SHAPE(-1)), 0.0);
}

/* n characters continuing prompt (a byte of the vocabulary), sampled at temperature 0.8 */
static bool gpt_sample(em_module *m, const corpus *c, const gpt_cfg *cfg, em_device dev, int64_t n, uint64_t seed,
                       char *out) {
    uint64_t rng = seed;
    int64_t *ctx = malloc((size_t)(n + 1) * sizeof *ctx);
    float *probs = malloc((size_t)cfg->vocab * sizeof *probs);
    bool ok = ctx && probs;
    int64_t len = 1;
    if (ok) ctx[0] = c->token_of['\n'] >= 0 ? c->token_of['\n'] : 0;
    em_grad_mode g = em_no_grad_begin();
    for (int64_t i = 0; ok && i < n; i++) {
        em_scope s = em_scope_begin();
        int64_t start = len > cfg->context ? len - cfg->context : 0;
        em_tensor *x = em_to(em_from_data(ctx + start, EM_I64, EM_SHAPE(1, len - start), EM_OPTS(.dtype = EM_I64)), dev);
        em_tensor *logits = em_select(em_select(em_forward(m, x), 0, 0), 0, len - start - 1);
        em_tensor *p = em_softmax(em_div_scalar(logits, 0.8), 0);
        ok = em_copy_to_host(em_cpu(p), probs, (size_t)cfg->vocab * sizeof *probs) == EM_OK;
        em_scope_end(s);
        double u = (double)(next_u64(&rng) >> 11) / 9007199254740992.0, acc = 0;
        int64_t pick = cfg->vocab - 1;
        for (int64_t k = 0; ok && k < cfg->vocab; k++)
            if ((acc += probs[k]) > u) {
                pick = k;
                break;
            }
        ctx[len++] = pick;
        out[i] = (char)c->chars[pick];
    }
    em_no_grad_end(g);
    out[ok ? n : 0] = '\0';
    free(ctx);
    free(probs);
    return ok;
}

/* mean loss over 8 fixed batches of 32 windows of the validation part (the same whatever
 * --batch-size, so that ember eval reproduces it) */
static double gpt_val_loss(em_module *m, const corpus *c, const gpt_opts *opts) {
    gpt_opts vo = *opts, *o = &vo;
    vo.batch = 32;
    uint64_t rng = 12345;
    double sum = 0;
    int k = 0;
    em_grad_mode g = em_no_grad_begin();
    for (; k < 8; k++) {
        em_scope s = em_scope_begin();
        em_tensor *x, *y;
        make_batch(c, o, c->n - c->n / 10, c->n, &rng, &x, &y);
        em_tensor *loss = gpt_loss(m, x, y, o->cfg.vocab);
        double v = loss ? em_item(loss) : NAN;
        em_scope_end(s);
        if (isnan(v)) break;
        sum += v;
    }
    em_no_grad_end(g);
    return k == 8 ? sum / 8 : NAN;
}

/* ---- ember train --model gpt ---- */

/* --plot: the loss of one step in this many (reading it waits for the device) */
#define GPT_PLOT_EVERY 10

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

/* The shapes ember train --model gpt takes (and ember mem --model gpt estimates) */
#define GPT_MAX_BATCH (1 << 20)
#define GPT_MAX_CONTEXT (1 << 16)
#define GPT_MAX_LAYERS 256
#define GPT_MAX_D_MODEL (1 << 16)

enum { G_MODEL, G_TEXT, G_DEVICE, G_EPOCHS, G_STEPS, G_BATCH, G_CONTEXT, G_LAYERS, G_D_MODEL, G_HEADS, G_LR,
       G_WEIGHT_DECAY, G_SEED, G_THREADS, G_MAX_STEPS, G_SAMPLE_CHARS, G_CHECKPOINT, G_CKPT_ACT, G_PLOT,
       G_STRICT_LOGS };
static const opt_choice gpt_model_choice[] = {{"gpt", 0}, {NULL, 0}};
static const opt_spec gpt_table[] = {
    [G_MODEL] = OPTION_CHOICE("--model", gpt_model_choice,
                              "gpt: this transformer (ember train --help has the options of mlp and cnn)"),
    [G_TEXT] = OPTION_STRING("--text", "PATH",
                             "a text file, or a folder of them (default " DEFAULT_TEXT ", Debian's fortunes "
                             "package: fortune's '%' lines are dropped)"),
    [G_DEVICE] = OPTION_DEVICE("--device", "auto (default), cpu, cuda:N, opencl:N"),
    [G_EPOCHS] = OPTION_INT("--epochs", "N", 0, 1000000, "epochs (default 5)"),
    [G_STEPS] = OPTION_INT("--steps-per-epoch", "N", 1, (int64_t)1 << 40, "optimizer steps per epoch (default 200)"),
    [G_BATCH] = OPTION_INT("--batch-size", "N", 1, GPT_MAX_BATCH, "windows per step (default 32)"),
    [G_CONTEXT] = OPTION_INT("--context", "N", 1, GPT_MAX_CONTEXT, "characters per window (default 64)"),
    [G_LAYERS] = OPTION_INT("--layers", "N", 1, GPT_MAX_LAYERS, "transformer blocks (default 2)"),
    [G_D_MODEL] = OPTION_INT("--d-model", "N", 1, GPT_MAX_D_MODEL, "width (default 128)"),
    [G_HEADS] = OPTION_INT("--heads", "N", 1, 1 << 16, "attention heads, dividing --d-model (default 4)"),
    [G_LR] = OPTION_DOUBLE("--lr", "X", 0, 1e6, "AdamW learning rate (default 0.003)"),
    [G_WEIGHT_DECAY] = OPTION_DOUBLE("--weight-decay", "X", 0, 1e6, "AdamW weight decay (default 0.01)"),
    [G_SEED] = OPTION_INT("--seed", "N", 0, INT64_MAX, "weights, batches and samples (default 0)"),
    [G_THREADS] = OPTION_INT("--threads", "N", 1, 4096, "CPU threads (default: every core)"),
    [G_MAX_STEPS] = OPTION_INT("--max-steps", "N", 1, (int64_t)1 << 50, "stop after N steps in all"),
    [G_SAMPLE_CHARS] = OPTION_INT("--sample-chars", "N", 0, 1 << 20,
                                  "characters of sample text after each epoch (default 200; 0: none)"),
    [G_CHECKPOINT] = OPTION_STRING("--checkpoint", "PATH",
                                   "safetensors written after every epoch (default ember-gpt.safetensors; 'none': "
                                   "nothing); `ember eval PATH` evaluates it"),
    [G_CKPT_ACT] = OPTION_FLAG("--checkpoint-activations",
                               "keep only each block's input for backward and recompute the block there "
                               "(em_checkpoint per block): less memory, one more forward"),
    [G_PLOT] = OPTION_STRING("--plot", "FILE",
                             "train and validation loss curves drawn into FILE, a .png or .svg picture, rewritten "
                             "after every epoch (the loss every " STRINGIFY(GPT_PLOT_EVERY) " steps too)"),
    [G_STRICT_LOGS] = OPTION_FLAG("--strict-logs",
                                  "a --plot write that fails (a full disk) stops training, after the checkpoint is "
                                  "saved, with status 1; without it that is a warning, once, and training goes on "
                                  "without the picture"),
};
OPT_TABLE_FITS(gpt_table);

const opt_command gpt_train_options = {
    .name = "ember train",
    .invocation = "ember train --model gpt",
    .usage = "ember train --model gpt [options]",
    .about = "Train a small decoder-only transformer on the characters of a text and print, after each epoch, the "
             "train and validation loss, throughput and a sample of generated text.",
    .options = gpt_table,
    .count = OPT_COUNT(gpt_table),
    .exit_status = "0 done; 1 failed (the text cannot be read, a device error, the checkpoint cannot be written); "
                   "2 bad arguments",
};

static int parse(int argc, char **argv, gpt_opts *o) {
    *o = (gpt_opts){.cfg = {.context = 64, .layers = 2, .d_model = 128, .heads = 4}, .epochs = 5, .steps = 200,
                    .batch = 32, .lr = 3e-3, .weight_decay = 0.01, .sample_chars = 200, .text = DEFAULT_TEXT,
                    .checkpoint = "ember-gpt.safetensors"};
    opt_result opts;
    int status = opt_parse(&gpt_train_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    if (v[G_TEXT].given) o->text = v[G_TEXT].text;
    if (v[G_EPOCHS].given) o->epochs = v[G_EPOCHS].i;
    if (v[G_STEPS].given) o->steps = v[G_STEPS].i;
    if (v[G_BATCH].given) o->batch = v[G_BATCH].i;
    if (v[G_CONTEXT].given) o->cfg.context = v[G_CONTEXT].i;
    if (v[G_LAYERS].given) o->cfg.layers = v[G_LAYERS].i;
    if (v[G_D_MODEL].given) o->cfg.d_model = v[G_D_MODEL].i;
    if (v[G_HEADS].given) o->cfg.heads = v[G_HEADS].i;
    if (v[G_LR].given) o->lr = v[G_LR].d;
    if (v[G_WEIGHT_DECAY].given) o->weight_decay = v[G_WEIGHT_DECAY].d;
    o->seed = v[G_SEED].i;
    o->threads = v[G_THREADS].i;
    o->max_steps = v[G_MAX_STEPS].i;
    if (v[G_SAMPLE_CHARS].given) o->sample_chars = v[G_SAMPLE_CHARS].i;
    if (v[G_CHECKPOINT].given) o->checkpoint = strcmp(v[G_CHECKPOINT].text, "none") ? v[G_CHECKPOINT].text : NULL;
    o->cfg.ckpt = v[G_CKPT_ACT].given;
    o->strict_logs = v[G_STRICT_LOGS].given;
    if (v[G_PLOT].given) {
        if (!plot_check_output(stderr, tool, "--plot", v[G_PLOT].text)) return 2;
        o->plot = v[G_PLOT].text;
    }
    if (v[G_DEVICE].given && !mlp_parse_device(tool, "--device", v[G_DEVICE].text, &o->device)) return 2;
    if (o->cfg.d_model % o->cfg.heads != 0) {
        fprintf(stderr, "%s: --d-model %" PRId64 " must be divisible by --heads %" PRId64 "\n", tool, o->cfg.d_model,
                o->cfg.heads);
        return 2;
    }
    if (o->checkpoint && !mlp_check_output(tool, "--checkpoint", o->checkpoint)) return 2;
    if (!v[G_DEVICE].given && !mlp_default_device(tool, &o->device)) return 2;
    if (!mlp_check_memory_env(tool, &o->device, 1)) return 2;
    return -1;
}

static em_status save(const gpt_opts *o, em_module *m, em_optimizer *opt, const corpus *c) {
    if (!o->checkpoint) return EM_OK;
    char v[6][40], vocab[513];
    const gpt_cfg *g = &o->cfg;
    snprintf(v[0], 40, "%" PRId64, g->context);
    snprintf(v[1], 40, "%" PRId64, g->layers);
    snprintf(v[2], 40, "%" PRId64, g->d_model);
    snprintf(v[3], 40, "%" PRId64, g->heads);
    snprintf(v[4], 40, "%" PRId64, g->vocab);
    snprintf(v[5], 40, "%" PRId64, em_optim_steps(opt));
    for (int64_t i = 0; i < c->vocab; i++) snprintf(vocab + 2 * i, 3, "%02x", c->chars[i]);
    vocab[2 * c->vocab] = '\0';
    const char *keys[] = {"ember.model", "gpt.context", "gpt.layers", "gpt.d_model", "gpt.heads", "gpt.vocab_size",
                          "train.steps", "gpt.vocab"};
    const char *vals[] = {"gpt", v[0], v[1], v[2], v[3], v[4], v[5], vocab};
    return em_checkpoint_save(o->checkpoint, m, opt, keys, vals, 8);
}

static void fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", tool, what, em_failed() ? em_last_error() : "unknown error");
}

static int run(gpt_opts *o) {
    if (o->threads) em_set_num_threads((int)o->threads);
    corpus c;
    if (!corpus_load(&c, o->text) || !corpus_tokenize(&c, o->cfg.context)) {
        corpus_free(&c);
        return 1;
    }
    o->cfg.vocab = c.vocab;
    em_manual_seed((uint64_t)o->seed);
    em_module *model = gpt_new(&o->cfg);
    if (model && em_module_to(model, o->device) != EM_OK) em_module_free(model), model = NULL;
    em_adam_opts ao = em_adamw_defaults(o->lr);
    ao.weight_decay = o->weight_decay;
    em_optimizer *opt = model ? em_adamw_ex(model, ao) : NULL;
    /* --plot through train_log: a picture that cannot be written is a warning (train_log.h) */
    train_log plot = {.plot = o->plot, .every = GPT_PLOT_EVERY, .strict = o->strict_logs, .loss_only = true};
    int rc = 1;
    if (!opt) {
        fail("cannot build the model");
        goto done;
    }
    printf("training GPT (%" PRId64 " layers, d_model %" PRId64 ", %" PRId64 " heads, context %" PRId64
           ", vocab %" PRId64 ") on %s: %" PRId64 " parameters, text %s (%" PRId64 " characters), batch %" PRId64
           ", adamw lr %g, %d CPU thread%s\n",
           o->cfg.layers, o->cfg.d_model, o->cfg.heads, o->cfg.context, o->cfg.vocab, em_device_str(o->device).s,
           em_module_num_parameters(model), o->text, c.n, o->batch, o->lr, em_get_num_threads(),
           em_get_num_threads() == 1 ? "" : "s");
    if (!train_log_open(&plot, tool, true)) goto done;   /* --strict-logs: nothing trained yet */
    if (o->plot) {
        char about[240];
        snprintf(about, sizeof about, "GPT, %" PRId64 " layer%s, d_model %" PRId64 ", context %" PRId64 " on %s, "
                 "batch %" PRId64 ", adamw lr %g", o->cfg.layers, o->cfg.layers == 1 ? "" : "s", o->cfg.d_model, o->cfg.context,
                 em_device_str(o->device).s, o->batch, o->lr);
        train_log_text(&plot, tool, about);
    }
    if (o->cfg.ckpt)
        printf("activation checkpointing: each of the %" PRId64 " blocks keeps only its input for backward, "
               "which recomputes the block\n", o->cfg.layers);
    fflush(stdout);
    uint64_t rng = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 1;
    int64_t steps = 0, train_end = c.n - c.n / 10;
    bool stop = false;
    for (int64_t epoch = 0; epoch < o->epochs && !stop; epoch++) {
        em_memory_reset_peak_stats(o->device);
        char label[32];
        snprintf(label, sizeof label, "epoch %" PRId64 "/%" PRId64, epoch + 1, o->epochs);
        progress bar;
        progress_begin(&bar, stderr, label, o->steps, 0);
        em_scope es = em_scope_begin();
        em_tensor *loss_sum = em_zeros(EM_SHAPE0, EM_OPTS(.dtype = EM_F64, .device = o->device));
        bool ok = loss_sum != NULL;
        int64_t done = 0;
        double cpu0 = process_cpu_seconds();
        for (; ok && done < o->steps; done++) {
            em_scope s = em_scope_begin();
            em_tensor *x, *y;
            make_batch(&c, o, 0, train_end, &rng, &x, &y);
            em_tensor *loss = gpt_loss(model, x, y, o->cfg.vocab);
            ok = loss && em_zero_grad(opt) == EM_OK && em_backward(loss) == EM_OK &&
                 !isnan(em_clip_grad_norm(model, 1.0)) && em_step(opt) == EM_OK &&
                 em_add_(loss_sum, em_detach(loss), 1.0) == EM_OK;
            ok = ok && train_log_step(&plot, tool, steps + 1, loss);
            em_scope_end(s);
            steps++;
            if (ok && progress_due(&bar, done + 1))
                progress_draw(&bar, done + 1, (done + 1) * o->batch, em_item(loss_sum) / (double)(done + 1));
            if ((o->max_steps && steps >= o->max_steps) || train_log_stop(&plot)) {
                stop = true;
                done++;
                break;
            }
        }
        double cpu_ms = 1000.0 * (process_cpu_seconds() - cpu0) / (double)(done ? done : 1);
        double seconds = mlp_now() - bar.t0, train_loss = ok ? em_item(loss_sum) / (double)(done ? done : 1) : NAN;
        progress_end(&bar);
        em_scope_end(es);
        if (!ok || em_failed()) {
            fail("training failed");
            goto done;
        }
        double val = gpt_val_loss(model, &c, o);
        char mem[160];
        mlp_memory_line(o->device, mem, sizeof mem);
        printf("epoch %" PRId64 "/%" PRId64 ": train loss %.4f, val loss %.4f, %.0f tokens/s, %.1f ms/step "
               "(%" PRId64 " steps, %.2f s), memory %s, process CPU time %.1f ms per step\n",
               epoch + 1, o->epochs, train_loss, val, (double)(done * o->batch * o->cfg.context) / seconds,
               1000.0 * seconds / (double)(done ? done : 1), done, seconds, mem, cpu_ms);
        if (o->sample_chars > 0) {
            char *text = malloc((size_t)o->sample_chars + 1);
            if (!text || !gpt_sample(model, &c, &o->cfg, o->device, o->sample_chars, (uint64_t)o->seed + (uint64_t)epoch, text)) {
                free(text);
                fail("sampling failed");
                goto done;
            }
            printf("sample:\n%s\n--\n", text);
            free(text);
        }
        fflush(stdout);
        if (save(o, model, opt, &c) != EM_OK) {
            fail("cannot save the checkpoint");
            goto done;
        }
        /* the checkpoint first: a picture that cannot be written loses no epoch */
        train_log_epoch_end(&plot, tool, &(train_log_epoch){.epoch = epoch + 1, .step = steps, .train_loss = train_loss,
                                                            .test_loss = val, .test_accuracy = NAN});
        if (train_log_stop(&plot)) stop = true;
    }
    if (o->checkpoint) printf("checkpoint: %s\n", o->checkpoint);
    rc = 0;
done:
    train_log_close(&plot, tool);
    if (rc == 0 && train_log_stop(&plot)) {
        fprintf(stderr, "%s: exit status 1: a --plot write failed and --strict-logs was given (the checkpoint holds "
                "everything trained)\n", tool);
        rc = 1;
    }
    em_optim_free(opt);
    em_module_free(model);
    corpus_free(&c);
    em_memory_empty_cache(o->device);
    em_memory_empty_cache(EM_DEVICE_CPU);
    return rc;
}

int gpt_train_main(int argc, char **argv) {
    gpt_opts o;
    int rc = parse(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}

/* ---- ember eval of a GPT checkpoint ---- */

static bool meta_int(const em_safetensors *f, const char *key, int64_t *out) {
    const char *s = em_safetensors_metadata(f, key);
    char *end;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || *end || v <= 0) {
        fprintf(stderr, "ember eval: the GPT checkpoint's metadata '%s' is %s%s%s: expected a positive integer\n", key,
                s ? "'" : "missing", s ? s : "", s ? "'" : "");
        return false;
    }
    *out = v;
    return true;
}

int gpt_eval_main(const em_safetensors *f, const char *text, em_device device, int64_t threads) {
    gpt_opts o = {.batch = 32, .text = text ? text : DEFAULT_TEXT, .sample_chars = 200, .threads = threads,
                  .device = device};
    const char *path = em_safetensors_path(f);
    if (o.threads) em_set_num_threads((int)o.threads);
    char hex[520] = "";
    const char *hm = em_safetensors_metadata(f, "gpt.vocab");
    if (hm && strlen(hm) < sizeof hex) snprintf(hex, sizeof hex, "%s", hm);
    bool ok = meta_int(f, "gpt.context", &o.cfg.context) && meta_int(f, "gpt.layers", &o.cfg.layers) &&
              meta_int(f, "gpt.d_model", &o.cfg.d_model) && meta_int(f, "gpt.heads", &o.cfg.heads) &&
              meta_int(f, "gpt.vocab_size", &o.cfg.vocab);
    corpus c;
    memset(&c, 0, sizeof c);
    if (ok && (o.cfg.vocab > 256 || (int64_t)strlen(hex) != 2 * o.cfg.vocab)) {
        fprintf(stderr, "ember eval: %s: the metadata 'gpt.vocab' should hold %" PRId64 " hex byte pairs\n", path,
                o.cfg.vocab);
        ok = false;
    }
    int rc = 1;
    em_module *m = NULL;
    if (ok && corpus_load(&c, o.text) && corpus_tokenize(&c, o.cfg.context)) {
        /* the checkpoint's vocabulary: characters it never saw are an error */
        int token_of[256];
        for (int b = 0; b < 256; b++) token_of[b] = -1;
        for (int64_t i = 0; i < o.cfg.vocab; i++) {
            unsigned int b;
            sscanf(hex + 2 * i, "%2x", &b);
            token_of[b & 255] = (int)i;
            c.chars[i] = (unsigned char)b;
        }
        bool fits = true;
        for (int64_t i = 0; i < c.n && fits; i++) {
            fits = token_of[c.data[i]] >= 0;
            if (!fits) fprintf(stderr, "ember eval: --text %s has the byte 0x%02x, which %s's vocabulary lacks\n",
                               o.text, c.data[i], path);
            c.tokens[i] = token_of[c.data[i]];
        }
        memcpy(c.token_of, token_of, sizeof token_of);
        c.vocab = o.cfg.vocab;
        em_manual_seed(0);
        m = fits ? gpt_new(&o.cfg) : NULL;
        if (fits && (!m || em_checkpoint_load_safetensors(f, m, NULL) != EM_OK || em_module_to(m, o.device) != EM_OK)) {
            fprintf(stderr, "ember eval: cannot load %s: %s\n", path, em_last_error());
        } else if (fits) {
            em_module_eval(m);
            double t0 = mlp_now(), val = gpt_val_loss(m, &c, &o);
            char *text = malloc((size_t)o.sample_chars + 1);
            if (!isnan(val) && text && gpt_sample(m, &c, &o.cfg, o.device, o.sample_chars, 0, text)) {
                printf("%s (GPT, %" PRId64 " parameters) on %s: val loss %.4f on the last 10%% of %s (%.2f s)\n"
                       "sample:\n%s\n--\n", path, em_module_num_parameters(m), em_device_str(o.device).s, val, o.text,
                       mlp_now() - t0, text);
                rc = 0;
            } else {
                fprintf(stderr, "ember eval: evaluation failed: %s\n", em_failed() ? em_last_error() : "out of memory");
            }
            free(text);
        }
    }
    em_module_free(m);
    corpus_free(&c);
    em_clear_error();
    em_memory_empty_cache(o.device);
    em_memory_empty_cache(EM_DEVICE_CPU);
    return rc;
}

/* ---- ember mem --model gpt ---- */

/* Parameters of the GPT above, counted from its shape. */
static double gpt_params(const gpt_cfg *c) {
    double d = (double)c->d_model, V = (double)c->vocab, T = (double)c->context;
    double block = 4 * d                     /* two LayerNorms */
                   + 3 * d * d + 3 * d       /* in_proj */
                   + d * d + d               /* out_proj */
                   + d * 4 * d + 4 * d + 4 * d * d + d; /* MLP */
    return V * d + T * d + (double)c->layers * block + 2 * d + d * V + V;
}

/* The step's peak, counted from the ops the model runs (what each autograd node saves and
 * the allocator's bytes at each node, measured op by op; docs/BENCHMARKS.md has the table).
 * Per token, float32 (d = d_model, H heads, T context, V vocab, L blocks, r LoRA rank):
 *   the step's int64 tokens and targets: 4 (16 B);
 *   a block keeps 16d + HT: LayerNorm 1's input (the block's input, kept by the previous
 *   block as its output) and output, k and v (d each; q is freed: only the scaled queries
 *   are saved), the scaled queries, the softmax [H, T] per query, the merged heads (out_proj's
 *   input), the residual sum (LayerNorm 2's input), LayerNorm 2's output, the MLP's hidden
 *   activation before and after GELU (4d each) and the block's output (LayerNorms save no
 *   statistics: backward recomputes them); plus the embeddings' sum d (block 1's input) and
 *   the head's d + 2V: the final LayerNorm's output, the logits (held by the step) and the
 *   log-softmax (cross-entropy gathers each target's log-probability: no one-hot).
 *   --checkpoint-activations (em_checkpoint per block): a block keeps only its input.
 *   LoRA: nothing is recorded in block 1 before its first adapter (out_proj): its input, LN1's
 *   output, k, v, the scaled queries and the softmax (5d + HT) are not kept (also when block 1
 *   is recomputed), it has no attention backward; each adapter
 *   keeps its scaled x A^T (r; x A^T itself is freed).
 * The largest of these moments is the peak:
 *   forward's end: every kept tensor (cross-entropy's gather makes nothing of size V), the
 *   previous step's gradients still alive (zero_grad comes after the forward);
 *   the last block's attention forward at its last product: the token embedding and the
 *   embeddings' sum (2d, alive until the model's forward returns), what the earlier blocks
 *   keep (with checkpointing their outputs), the block's LN1 output, q, k, v, the scaled
 *   queries and attention's output (6d), the scores, the masked scores and the softmax (3HT),
 *   all held by their scopes until attention returns, and the causal mask [T, T] as bool and
 *   as 0 / -inf floats (5T^2 bytes, once per step); the previous step's gradients alive (the
 *   peak at a long context, and with LoRA in a 1-block model);
 *   the last block's MLP backward (Linear 2's): the head's V + 2d (the log-softmax, the final
 *   LayerNorm's input and output) and its adapter's r freed, the block recomputed first
 *   with checkpointing (its 16d + HT again), the incoming gradient d and Linear 2's input
 *   gradient 4d (LoRA: the adapter path's 4d too, summed after, and Linear 2's adapter's r
 *   freed); gradients exist for the head, the final LayerNorm and Linear 2 only;
 *   the last block's attention backward (the fused softmax backward): the MLP side's 10d
 *   (GELU's input and output, LN2's input and output), the merged heads and v (2d) and the
 *   block's adapters freed, the gradients of the block's input and of LN1's output (2d) and
 *   the softmax's incoming and outgoing gradients (2HT); with checkpointing the block's
 *   incoming gradient d, which the checkpoint node holds; gradients exist for the head and
 *   the last block but its LN1;
 *   the same two moments of each earlier block: the later blocks' activations freed (with
 *   checkpointing only their outputs d), their gradients made (at a small batch with
 *   checkpointing, block 1's MLP backward is the peak).
 * Not counted: the position embedding [T, d] and the causal masks at the other moments; with
 * LoRA in a 1-block model, the recomputed block's attention forward during backward. */
typedef struct gpt_peak {
    double kept;              /* activation bytes per sequence kept for backward */
    double total;             /* bytes at the peak: weights, states, gradients alive, activations */
    char moment[64];          /* which moment */
} gpt_peak;

static gpt_peak gpt_estimate_peak(const gpt_cfg *c, int64_t batch, int rank, double params, double adapters) {
    double d = (double)c->d_model, T = (double)c->context, H = (double)c->heads, V = (double)c->vocab;
    double L = (double)c->layers, N = (double)batch * T, r = rank;
    /* what attention keeps per token: the softmax [H, T], or with the fused kernel each row's
     * log-sum-exp [H] (the output and q it keeps take the merged heads' and the scaled
     * queries' places) */
    bool fused = em_sdpa_fused(EM_CPU);
    double att = fused ? H : H * T;
    double tok = 4, block = 16 * d + att, head = d + 2 * V;
    double kept = c->ckpt ? d + L * d + head : d + L * block + head;
    if (rank && !c->ckpt) kept -= 5 * d + att;
    if (rank) kept += r * (c->ckpt ? 1 : 3 * L + 1);
    double held = c->ckpt ? kept + block + 3 * r : kept;
    if (rank && c->ckpt && c->layers == 1) held -= 5 * d + att;   /* block 1, recomputed */
    /* parameter-sized bytes: weights and AdamW's two states (adapters' only with LoRA), then
     * the gradients alive at each moment */
    double p_head = d * V + V + 2 * d, p_lin2 = 4 * d * d + d, p_block = 12 * d * d + 13 * d;
    double fixed = rank ? 4 * params + 12 * adapters : 12 * params;
    double g_fwd = rank ? 4 * adapters : 4 * params;
    double g_mlp = rank ? 4 * adapters : 4 * (p_head + p_lin2);
    double g_attn = rank ? 4 * adapters : 4 * (p_head + p_block - 2 * d);
    double fwd = fixed + g_fwd + N * 4 * (tok + kept);
    double before = c->ckpt ? (L - 1) * d : (L - 1) * (block + 3 * r) - (rank && L > 1 ? 5 * d + att : 0);
    /* fused: LN1's output, q, k, v and the output being written, the row statistics; no
     * scores, no mask */
    double fwd_attn = fused ? fixed + g_fwd + N * 4 * (tok + 7 * d + before + H)
                            : fixed + g_fwd + N * 4 * (tok + 8 * d + before + 3 * H * T) + 5 * T * T;
    double mlp = fixed + g_mlp + N * 4 * (tok + held - (V + 2 * d + r) + d + 4 * d + (rank ? 4 * d - r : 0));
    /* fused: the output and v stay with the node until it runs; alive are the residual's
     * gradient, the incoming one and those of q, k and v (5d) */
    double attn = fixed + g_attn + N * 4 * (tok + held - (V + 2 * d + r) - (fused ? 10 : 12) * d - 3 * r +
                                            (fused ? 5 * d : 2 * d + 2 * H * T) + (c->ckpt ? d : 0));
    gpt_peak p = {.kept = kept * T * 4, .total = fwd};
    snprintf(p.moment, sizeof p.moment, "the forward's end");
    if (fwd_attn > p.total) {
        p.total = fwd_attn;
        snprintf(p.moment, sizeof p.moment, "the last block's attention forward");
    }
    /* k blocks from the last: their activations are freed (with checkpointing only their
     * outputs), their gradients made. LoRA's gradients are counted whole at every moment, so
     * there the last block is the largest; LoRA records no attention in block 1 */
    for (int64_t k = 0; k < (rank ? 1 : c->layers); k++) {
        double freed = N * 4 * (double)k * (c->ckpt ? d : block), grads = 4 * (double)k * p_block;
        if (mlp - freed + grads > p.total) {
            p.total = mlp - freed + grads;
            snprintf(p.moment, sizeof p.moment, "block %lld's MLP backward", (long long)(c->layers - k));
        }
        if (attn - freed + grads > p.total && !(rank && c->layers == 1)) {
            p.total = attn - freed + grads;
            snprintf(p.moment, sizeof p.moment, "block %lld's attention backward", (long long)(c->layers - k));
        }
    }
    return p;
}

/* The CPU allocator's peak (em_memory_max_allocated, reset first) over two AdamW steps of
 * the GPT of c (the second step has the optimizer's states) on random tokens, above what
 * was allocated before the model was built; LoRA of rank r (0: none) on every Linear. NAN on
 * failure; -1 (said on stderr) when the model built has not formula_params parameters. */
static double gpt_measure(const gpt_cfg *c, int64_t batch, int lora_rank, double formula_params) {
    em_memory_empty_cache(EM_DEVICE_CPU);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    em_manual_seed(0);
    em_module *m = gpt_new(c);
    if (m && (double)em_module_num_parameters(m) != formula_params) {   /* the formula must describe the model */
        fprintf(stderr, "ember mem: internal: the GPT has %lld parameters, the formula says %.0f\n",
                (long long)em_module_num_parameters(m), formula_params);
        em_module_free(m);
        return -1;
    }
    if (m && lora_rank > 0 && em_lora_wrap(m, lora_rank, 2.0 * lora_rank, EM_LORA_LINEAR) != EM_OK)
        em_module_free(m), m = NULL;
    em_optimizer *opt = m ? em_adamw(m, 1e-3) : NULL;
    double peak = NAN;
    if (opt) {
        /* the steps' peak: building the model (its init's temporaries) is not part of it */
        em_memory_reset_peak_stats(EM_DEVICE_CPU);
        for (int step = 0; step < 2; step++) {
            em_scope s = em_scope_begin();
            em_tensor *x = em_randint(0, c->vocab, EM_SHAPE(batch, c->context), EM_OPTS(.dtype = EM_I64));
            em_tensor *y = em_randint(0, c->vocab, EM_SHAPE(batch, c->context), EM_OPTS(.dtype = EM_I64));
            em_tensor *loss = gpt_loss(m, x, y, c->vocab);
            em_zero_grad(opt);
            em_backward(loss);
            em_step(opt);
            em_scope_end(s);
        }
        if (!em_failed()) peak = (double)(em_memory_max_allocated(EM_DEVICE_CPU) - base);
    }
    em_optim_free(opt);
    em_module_free(m);
    em_memory_empty_cache(EM_DEVICE_CPU);
    em_clear_error();
    return peak;
}

/* LoRA adapts the Linear layers: out_proj (d -> d) and the MLP's two (d -> 4d -> d) in each
 * block, and the head (d -> V): rank x (in + out) parameters each. */
static double gpt_lora_params(const gpt_cfg *c, int rank) {
    double d = (double)c->d_model, V = (double)c->vocab;
    return rank * ((double)c->layers * (2 * d + 5 * d + 5 * d) + d + V);
}

/* The floating-point operations of one AdamW step (forward and backward, the backward at
 * twice the forward's): the products with the weights, 2 per parameter and token, and
 * attention's two [T, T] products per block. */
static double gpt_step_flops(const gpt_cfg *c, int64_t batch, double params) {
    double tokens = (double)batch * (double)c->context;
    double attention = 4.0 * (double)c->layers * (double)batch * (double)c->context * (double)c->context *
                       (double)c->d_model;
    return 3 * (2 * params * tokens + attention);
}

/* One of ember mem's options for the GPT, within what ember train --model gpt takes. */
static bool gpt_mem_in_range(const char *opt, const char *train_opt, int64_t v, int64_t max) {
    if (v <= max) return true;
    fprintf(stderr, "ember mem: %s %lld: expected 1 to %lld with --model gpt, the range of ember train --model gpt's "
            "%s%s%s%s\n", opt, (long long)v, (long long)max, train_opt, strcmp(opt, train_opt) ? " (which " : "",
            strcmp(opt, train_opt) ? opt : "", strcmp(opt, train_opt) ? " gives)" : "");
    return false;
}

int gpt_mem_main(const gpt_mem_args *args) {
    if (!gpt_mem_in_range("--layers", "--layers", args->layers, GPT_MAX_LAYERS) ||
        !gpt_mem_in_range("--hidden", "--d-model", args->hidden, GPT_MAX_D_MODEL) ||
        !gpt_mem_in_range("--seq", "--context", args->seq, GPT_MAX_CONTEXT) ||
        !gpt_mem_in_range("--batch", "--batch-size", args->batch, GPT_MAX_BATCH))
        return 2;
    gpt_cfg c = {.vocab = 128, .context = args->seq ? args->seq : 64, .layers = args->layers ? args->layers : 2,
                 .d_model = args->hidden ? args->hidden : 128, .heads = 4, .ckpt = args->ckpt};
    if (c.d_model % c.heads) c.heads = 1;
    int64_t batch = args->batch ? args->batch : 32;
    int rank = args->lora_rank;
    if (rank > c.d_model) {
        fprintf(stderr, "ember mem: --lora-rank %d is larger than the GPT's d_model (%lld): the rank must be at most "
                "that\n", rank, (long long)c.d_model);
        return 2;
    }
    double adapters = rank ? gpt_lora_params(&c, rank) : 0;
    em_estimate_opts o = {.params = gpt_params(&c), .dtype = EM_F32, .mode = rank ? EM_ESTIMATE_LORA : EM_ESTIMATE_FULL,
                          .optimizer = EM_ESTIMATE_ADAMW, .hidden = c.d_model, .layers = c.layers, .lora_rank = rank,
                          .lora_params = adapters,
                          /* the workspace line: the largest trainable tensor (AdamW's fused step needs none) */
                          .largest_param = rank ? rank * 5.0 * (double)c.d_model : 4.0 * (double)(c.d_model * c.d_model)};
    em_estimate e;
    if (em_estimate_memory(&o, &e) != EM_OK) {
        fprintf(stderr, "ember mem: %s\n", em_last_error());
        return 2;
    }
    /* the activation line: the peak less weights, gradients and states (at a backward moment
     * the earlier layers' gradients do not exist yet, which the line absorbs) */
    gpt_peak pk = gpt_estimate_peak(&c, batch, rank, o.params, adapters);
    double others = e.bytes[EM_ESTIMATE_WEIGHTS] + e.bytes[EM_ESTIMATE_GRADIENTS] + e.bytes[EM_ESTIMATE_OPTIMIZER_STATES];
    e.bytes[EM_ESTIMATE_ACTIVATIONS] = pk.total - others;
    e.bytes[EM_ESTIMATE_TOTAL] = pk.total;
    snprintf(e.why[EM_ESTIMATE_ACTIVATIONS], sizeof e.why[0], "at the peak, %s: batch %lld x %.0f B kept for "
             "backward per sequence (%s; attention %s) + that moment's transients", pk.moment, (long long)batch,
             pk.kept, c.ckpt ? "each block's input only" : "every op's saved tensors",
             em_sdpa_fused(EM_CPU) ? "fused: no [T, T] scores kept" : "composed: the softmax [heads, T, T] kept");
    snprintf(e.why[EM_ESTIMATE_TOTAL], sizeof e.why[0], "the largest of the moments: the forward's end, the last "
             "block's attention forward, each block's MLP and attention backward (tools/ember/model_gpt.c)");
    double total = e.bytes[EM_ESTIMATE_TOTAL], peak = NAN;
    char why_not[320] = "";
    bool measure = mem_measure_fits(total, 2 * gpt_step_flops(&c, batch, o.params), why_not, sizeof why_not);
    if (args->json) {
        if (measure && (peak = gpt_measure(&c, batch, rank, o.params)) == -1) return 1;   /* the formula is wrong */
        printf("{\"model\": \"gpt\", \"params\": %.0f, \"trainable_params\": %.0f, \"layers\": %lld, \"d_model\": %lld, "
               "\"heads\": %lld, \"context\": %lld, \"vocab\": %lld, \"batch\": %lld, \"checkpoint_activations\": %s, "
               "\"lora_rank\": %d", o.params, e.trainable_params, (long long)c.layers, (long long)c.d_model,
               (long long)c.heads, (long long)c.context, (long long)c.vocab, (long long)batch,
               c.ckpt ? "true" : "false", rank);
        for (int l = 0; l < EM_ESTIMATE_LINES; l++) {
            char key[32];
            snprintf(key, sizeof key, "%s", em_estimate_line_name((em_estimate_line)l));
            for (char *k = key; *k; k++) if (*k == ' ') *k = '_';
            printf(", \"%s_bytes\": %.0f", key, e.bytes[l]);
        }
        printf(", \"kept_activation_bytes\": %.0f", pk.kept * (double)batch);
        if (!isnan(peak)) printf(", \"measured_peak_bytes\": %.0f", peak);   /* absent: not measured */
        printf("}\n");
        return 0;
    }
    printf("ember mem --model gpt: %lld layers, d_model %lld, %lld heads, context %lld, vocab %lld (bytes): %.0f "
           "parameters, float32, AdamW, batch %lld", (long long)c.layers, (long long)c.d_model, (long long)c.heads,
           (long long)c.context, (long long)c.vocab, o.params, (long long)batch);
    if (rank) printf(", LoRA rank %d on every Linear (%.0f trainable parameters)", rank, e.trainable_params);
    if (c.ckpt) printf(", activation checkpointing: %lld segments of one block, each keeping its input",
                       (long long)c.layers);
    printf("\n");
    for (int l = 0; l < EM_ESTIMATE_LINES; l++)
        printf("  %-17s %9.2f MB  %s\n", em_estimate_line_name((em_estimate_line)l), e.bytes[l] / 1e6, e.why[l]);
    fflush(stdout);   /* the estimate now; the measurement, when there is one, after it */
    if (measure && (peak = gpt_measure(&c, batch, rank, o.params)) == -1) return 1;   /* the formula is wrong */
    mem_print_measured(total, peak, "two AdamW steps of this model", measure ? NULL : why_not);
    return 0;
}
