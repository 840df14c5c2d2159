/* ember finetune: LoRA fine-tuning of a Hugging Face model folder (include/ember/finetune.h)
 * on plain text or prompt/completion JSONL, with AdamW, a warm-up then cosine schedule,
 * clipping, gradient accumulation, bf16 autocast, activation checkpointing, a held-out eval
 * loss, and checkpoints that a signal writes and --resume continues bit for bit.
 *
 * Reproducibility: the adapters' initial values come from --seed (em_manual_seed); the order
 * of the examples in epoch e is a pure function of (seed, e), drawn by this file's own
 * generator, so a resumed run re-derives it from the checkpoint's (epoch, micro-batch)
 * instead of restoring a generator's state.
 *
 * Under `ember launch` or mpirun the ranks train one model: DistributedDataParallel
 * (finetune_dist.c), or with --full --zero S ZeRO's shards; either way each rank computes its
 * part of every batch. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <ember/ember.h>
#include "commands.h"
#include "stop_signals.h"
#include "mlp.h"       /* mlp_parse_device */
#include "options.h"
#include "text_io.h"   /* tool_read_all: --data, bounded for streams */
#include "finetune_dist.h" /* the ranks of `ember launch` / mpirun: DDP, or ZeRO with --zero */
#include "train_dist.h"

static const char *const tool = "ember finetune";

enum {
    F_DATA, F_OUT, F_RANK, F_ALPHA, F_TARGETS, F_EPOCHS, F_MAX_STEPS, F_SEQ, F_BATCH, F_LR, F_WD, F_WARMUP,
    F_MAX_GRAD_NORM, F_ACCUMULATE, F_AMP, F_CKPT_ACT, F_RESUME, F_SAVE_EVERY, F_EVAL_FRACTION, F_MERGE, F_DEVICE,
    F_DTYPE, F_SEED, F_FULL, F_ZERO, F_INTERRUPT_AFTER, F_THREADS
};
static const opt_choice amp_choices[] = {{"bf16", 1}, {"bfloat16", 1}, {NULL, 0}};
static const opt_choice dtype_choices[] = {{"f32", 0}, {"float32", 0}, {"bf16", 1}, {"bfloat16", 1},
                                           {"f16", 2}, {"float16", 2}, {NULL, 0}};
static const opt_spec finetune_table[] = {
    [F_DATA] = OPTION_STRING("--data", "FILE", "the training data (required): plain text, or JSONL (a .jsonl name) of "
                             "{\"prompt\": ..., \"completion\": ...} objects"),
    [F_OUT] = OPTION_STRING("--out", "DIR", "where the adapter folder goes (required): adapter_config.json, "
                            "adapter_model.safetensors (with --full: the trained model's folder), and "
                            "checkpoint.safetensors for --resume"),
    [F_RANK] = OPTION_INT("--lora-rank", "R", 1, 1 << 16, "the adapters' rank r (default 8)"),
    [F_ALPHA] = OPTION_DOUBLE("--lora-alpha", "A", 0, 1e9, "lora_alpha: the adapters' output is scaled by A / R "
                              "(default 16)"),
    [F_TARGETS] = OPTION_LIST("--lora-targets", "LIST", "the module names to adapt (default q_proj,v_proj; GPT-2: "
                              "c_attn); Llama family: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, GPT-2: "
                              "c_attn c_proj c_fc"),
    [F_EPOCHS] = OPTION_INT("--epochs", "E", 1, 1 << 20, "passes over the training examples (default 1)"),
    [F_MAX_STEPS] = OPTION_INT("--max-steps", "N", 1, INT64_MAX / 4, "stop after N optimizer steps instead (epochs "
                               "repeat as needed)"),
    [F_SEQ] = OPTION_INT("--seq", "S", 2, 1 << 20, "tokens per sequence (default 128, at most the model's context): "
                         "plain text is packed into sequences of S, JSONL examples are padded to S"),
    [F_BATCH] = OPTION_INT("--batch-size", "B", 1, 1 << 16, "sequences per micro-batch (default 4); under `ember launch` "
                         "the batch of all ranks together"),
    [F_LR] = OPTION_DOUBLE("--lr", "LR", 0, 10, "the peak learning rate (default 2e-4)"),
    [F_WD] = OPTION_DOUBLE("--weight-decay", "WD", 0, 10, "AdamW's decoupled weight decay on the adapters (default "
                           "0.01, PyTorch's)"),
    [F_WARMUP] = OPTION_INT("--warmup-steps", "N", 0, INT64_MAX / 4, "linear warm-up steps before the cosine decay "
                            "(default a tenth of the steps)"),
    [F_MAX_GRAD_NORM] = OPTION_DOUBLE("--max-grad-norm", "N", 0, 1e9, "clip the gradients' total norm to N (default "
                                      "1.0; 0: no clipping)"),
    [F_ACCUMULATE] = OPTION_INT("--accumulate", "N", 1, 1 << 16, "micro-batches per optimizer step (default 1)"),
    [F_AMP] = OPTION_CHOICE("--amp", amp_choices, "compute the forward under bf16 autocast (the adapters and "
                            "optimizer stay float32)"),
    [F_CKPT_ACT] = OPTION_FLAG("--checkpoint-activations", "recompute each decoder layer in backward instead of "
                               "keeping its activations"),
    [F_RESUME] = OPTION_FLAG("--resume", "continue from DIR/checkpoint.safetensors: adapters, optimizer, schedule "
                             "and data position"),
    [F_SAVE_EVERY] = OPTION_INT("--save-every", "N", 0, INT64_MAX / 4, "write the checkpoint every N steps (default "
                                "0: at the end and on a signal only)"),
    [F_EVAL_FRACTION] = OPTION_DOUBLE("--eval-fraction", "F", 0, 0.9, "hold out this fraction of the examples for an "
                                      "eval loss after each epoch and at the end (default 0: none)"),
    [F_MERGE] = OPTION_FLAG("--merge", "also write DIR/merged: the model with the adapters merged into its weights, "
                            "a full folder transformers loads"),
    [F_DEVICE] = OPTION_DEVICE("--device", "cpu (default), cuda:N, opencl:N, auto"),
    [F_DTYPE] = OPTION_CHOICE("--dtype", dtype_choices, "the frozen base weights' dtype (default f32; converted on "
                              "load when the folder's differ); the adapters are float32 whatever it is"),
    [F_SEED] = OPTION_INT("--seed", "S", 0, INT64_MAX, "the adapters' init, the split and the examples' order "
                          "(default 0)"),
    [F_FULL] = OPTION_FLAG("--full", "train every weight instead of adapters (full fine-tuning): float32 master "
                           "weights (bf16 compute with --amp bf16), no weight decay on biases and norm weights; DIR "
                           "gets the trained model as a full folder"),
    [F_ZERO] = OPTION_INT("--zero", "S", 1, 3, "with --full under `ember launch -n N` or mpirun: shard the "
                          "training state over the ranks with ZeRO stage S (1: the optimizer's states, 2: also the "
                          "gradients, 3: also the weights, one decoder layer gathered at a time); each rank trains on "
                          "its part of every batch, --batch-size is the batch of all ranks together"),
    [F_INTERRUPT_AFTER] = {.name = "--interrupt-after", .kind = OPT_INT, .metavar = "N", .imin = 1,
                           .imax = INT64_MAX / 4, .flags = OPT_HIDDEN,
                           .help = "for tests: raise SIGTERM at the end of step N"},
    [F_THREADS] = OPTION_INT("--threads", "N", 1, 4096, "CPU threads (default: every core)"),
};
OPT_TABLE_FITS(finetune_table);

const opt_command finetune_options = {
    .name = "ember finetune",
    .usage = "ember finetune MODEL_DIR --data FILE --out DIR [options]",
    .about = "Fine-tunes a language model from a Hugging Face model folder (Llama, Mistral, Qwen2, GPT-2) with LoRA "
             "adapters, as PEFT does: the base weights stay frozen, only the adapters train. The result is a PEFT "
             "adapter folder (peft's PeftModel.from_pretrained and `ember generate --adapter DIR` load it) and, with "
             "--merge, a full model folder. --full trains every weight instead and writes the trained model as a "
             "full folder.\n\n"
             "Data: plain text is tokenized whole and packed into sequences of --seq tokens (the remainder dropped); "
             "JSONL holds one {\"prompt\": ..., \"completion\": ...} object a line (other members are ignored), the "
             "prompt encoded with the "
             "tokenizer's special tokens (a BOS) and the completion after it with the end-of-sequence id; the loss "
             "counts the completion's tokens only. A completion is cut at --seq; a prompt that leaves no room for "
             "it is an error naming the line.\n\n"
             "Training: AdamW (PyTorch's defaults, --weight-decay), a linear warm-up then cosine decay to 0, "
             "gradient clipping, --accumulate micro-batches per step (the loss averaged over all their counted "
             "tokens, as transformers' Trainer), no dropout. A progress line a step on standard error: loss, "
             "learning rate, gradient norm, tokens/s and memory.\n\n"
             "Data-parallel (under `ember launch -n N`, mpirun -np N or srun, without --zero): "
             "DistributedDataParallel, as PyTorch's. Every rank loads the folder and the data, draws the same "
             "adapters, split and order from --seed, and computes a contiguous 1/N of every micro-batch's rows (a rank "
             "may get none); the gradients are averaged over the ranks once per optimizer step, after the step's last "
             "micro-batch, so the loss, the gradient norm and the clipping are the whole batch's and the result is "
             "one process's with the same options, to float32 rounding. Every rank holds the whole model and "
             "optimizer state, and DDP's buckets hold a second copy of the gradients (--full --zero S shards them); "
             "rank 0 alone prints and writes DIR (the adapters, merged/, the trained folder and "
             "checkpoint.safetensors). On --resume every rank reads DIR/checkpoint.safetensors, and any number of "
             "ranks continues it: its position counts the batches of all ranks.\n\n"
             "Sharded (--full --zero S under `ember launch -n N` or mpirun -np N): every rank loads the folder, keeps "
             "its 1/N of the sharded state (ZeRO's units: the embeddings, each decoder layer, the final norm and "
             "head) and computes its part of each batch; the gradient norm is the whole model's, the checkpoint is "
             "DIR/checkpoint.zero/ (a file per rank, resumable on any number of ranks), and rank 0 alone writes the "
             "trained folder (at stage 3 a file per unit, gathered one at a time). `ember mem --model MODEL_DIR --zero S "
             "--ranks N` estimates the memory per rank.",
    .positional = "MODEL_DIR",
    .positional_help = "a model folder as save_pretrained writes it, with its tokenizer.json",
    .extra = "MODEL_DIR and options",
    .options = finetune_table,
    .count = OPT_COUNT(finetune_table),
    .epilogue = "Signals: SIGINT, SIGTERM and SIGHUP stop after the current step, write DIR/checkpoint.safetensors "
                "and exit with 128 + the signal; --resume with the same options continues where it stopped and "
                "ends with the same adapters, bit for bit on the CPU, as a run that was never stopped (resumed on "
                "another number of ranks: the same to float32 rounding).",
    .exit_status = "0 done; 1 the model, the data or the training failed; 2 bad arguments; 128" OPT_NBSP "+" OPT_NBSP
                   "N stopped by signal N (checkpoint written)",
};

/* ---- the examples ---- */

typedef struct example {
    int64_t *ids, *labels;   /* seq each (pads: labels -100) */
    int64_t counted;         /* labels that count (not -100) after position 0 */
} example;

typedef struct dataset {
    example *ex;
    int64_t n, cap, seq;
} dataset;

static void dataset_free(dataset *d) {
    for (int64_t i = 0; i < d->n; i++) {
        free(d->ex[i].ids);
        free(d->ex[i].labels);
    }
    free(d->ex);
    *d = (dataset){0};
}

static example *dataset_add(dataset *d) {
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        example *ex = realloc(d->ex, (size_t)cap * sizeof *ex);
        if (!ex) return NULL;
        d->ex = ex;
        d->cap = cap;
    }
    example *e = &d->ex[d->n];
    e->ids = malloc((size_t)d->seq * sizeof *e->ids);
    e->labels = malloc((size_t)d->seq * sizeof *e->labels);
    if (!e->ids || !e->labels) {
        free(e->ids);
        free(e->labels);
        return NULL;
    }
    d->n++;
    return e;
}

/* A JSON string at *p (after its opening quote) decoded into a malloc'ed UTF-8 string, NUL-
 * terminated, its length in *len when len is not NULL (\u0000 decodes to a NUL byte inside it);
 * NULL on a bad string. */
static char *json_string_value(const char **p, size_t *len) {
    const char *s = *p;
    size_t cap = 64, n = 0;
    char *out = malloc(cap);
    while (out && *s && *s != '"') {
        if (n + 8 > cap) {
            char *o = realloc(out, cap *= 2);
            if (!o) break;
            out = o;
        }
        unsigned char c = (unsigned char)*s++;
        if (c < 0x20) break;
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        char e = *s++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            out[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') break;
        unsigned long cp = 0;
        for (int k = 0; k < 4; k++, s++) {
            int h = (*s >= '0' && *s <= '9') ? *s - '0' : (*s | 32) >= 'a' && (*s | 32) <= 'f' ? (*s | 32) - 'a' + 10 : -1;
            if (h < 0) goto bad;
            cp = cp * 16 + (unsigned long)h;
        }
        if (cp >= 0xD800 && cp < 0xDC00 && s[0] == '\\' && s[1] == 'u') {
            unsigned long lo = 0;
            for (int k = 2; k < 6; k++) {
                int h = (s[k] >= '0' && s[k] <= '9') ? s[k] - '0'
                      : (s[k] | 32) >= 'a' && (s[k] | 32) <= 'f' ? (s[k] | 32) - 'a' + 10 : -1;
                if (h < 0) goto bad;
                lo = lo * 16 + (unsigned long)h;
            }
            if (lo < 0xDC00 || lo > 0xDFFF) goto bad;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            s += 6;
        } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            goto bad;
        }
        if (cp < 0x80) out[n++] = (char)cp;
        else if (cp < 0x800) out[n++] = (char)(0xC0 | (cp >> 6)), out[n++] = (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            out[n++] = (char)(0xE0 | (cp >> 12)), out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)),
            out[n++] = (char)(0x80 | (cp & 0x3F));
        else
            out[n++] = (char)(0xF0 | (cp >> 18)), out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[n++] = (char)(0x80 | (cp & 0x3F));
    }
    if (out && *s == '"') {
        out[n] = '\0';
        *p = s + 1;
        if (len) *len = n;
        return out;
    }
bad:
    free(out);
    return NULL;
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return p;
}

static const char *const bad_string = "a string is not valid JSON (a bad escape, a lone surrogate, a control "
                                      "character, or no closing quote)";

/* Skips one JSON value at *pp: a string (checked as json_string_value checks it), a number by
 * JSON's grammar, true, false, null, or an array or object of them nested at most 256 deep.
 * False, with *why set, on anything else. */
static bool skip_value(const char **pp, int depth, const char **why) {
    const char *p = skip_ws(*pp);
    *why = "a member's value is not valid JSON";
    if (*p == '"') {
        p++;
        char *v = json_string_value(&p, NULL);
        if (!v) {
            *why = bad_string;
            return false;
        }
        free(v);
    } else if (*p == '[' || *p == '{') {
        char close = *p == '[' ? ']' : '}';
        if (depth >= 256) {
            *why = "a member's value nests arrays or objects more than 256 deep";
            return false;
        }
        p = skip_ws(p + 1);
        if (*p == close) {
            p++;
        } else {
            for (;;) {
                if (close == '}') {
                    if (*p++ != '"') return false;
                    char *key = json_string_value(&p, NULL);
                    if (!key) {
                        *why = bad_string;
                        return false;
                    }
                    free(key);
                    p = skip_ws(p);
                    if (*p++ != ':') return false;
                }
                if (!skip_value(&p, depth + 1, why)) return false;
                p = skip_ws(p);
                if (*p == ',') {
                    p = skip_ws(p + 1);
                    continue;
                }
                if (*p++ != close) return false;
                break;
            }
        }
    } else if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4)) {
        p += 4;
    } else if (!strncmp(p, "false", 5)) {
        p += 5;
    } else {   /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
        if (*p == '-') p++;
        if (*p == '0') p++;
        else if (*p >= '1' && *p <= '9')
            while (*p >= '0' && *p <= '9') p++;
        else return false;
        if (*p == '.') {
            if (!(*++p >= '0' && *p <= '9')) return false;
            while (*p >= '0' && *p <= '9') p++;
        }
        if (*p == 'e' || *p == 'E') {
            if (*++p == '+' || *p == '-') p++;
            if (!(*p >= '0' && *p <= '9')) return false;
            while (*p >= '0' && *p <= '9') p++;
        }
    }
    *pp = p;
    return true;
}

/* One JSONL line: an object whose "prompt" and "completion" are strings, each given once (other
 * members may hold any JSON value, as datasets' extra fields do); the strings' lengths in
 * lens[0] and lens[1]. Returns false with *why set otherwise. */
static bool parse_line(const char *line, char **prompt, char **completion, size_t lens[2], const char **why) {
    *prompt = *completion = NULL;
    const char *p = skip_ws(line);
    *why = "expected a JSON object {\"prompt\": ..., \"completion\": ...}";
    if (*p++ != '{') return false;
    p = skip_ws(p);
    if (*p == '}') p++;
    else
        for (;;) {
            if (*p++ != '"') return false;
            char *key = json_string_value(&p, NULL);
            if (!key) {
                *why = bad_string;
                return false;
            }
            p = skip_ws(p);
            if (*p++ != ':') {
                free(key);
                return false;
            }
            p = skip_ws(p);
            char **slot = !strcmp(key, "prompt") ? prompt : !strcmp(key, "completion") ? completion : NULL;
            if (slot && *slot) {
                *why = slot == prompt ? "\"prompt\" is given twice" : "\"completion\" is given twice";
                free(key);
                return false;
            }
            free(key);
            if (slot && *p != '"') {
                *why = "\"prompt\" and \"completion\" must be strings";
                return false;
            }
            if (slot) {
                p++;
                if (!(*slot = json_string_value(&p, &lens[slot == completion]))) {
                    *why = bad_string;
                    return false;
                }
            } else if (!skip_value(&p, 0, why)) {
                return false;
            }
            p = skip_ws(p);
            if (*p == ',') {
                p = skip_ws(p + 1);
                continue;
            }
            if (*p++ != '}') {
                *why = "expected ',' or '}' after a member of the object";
                return false;
            }
            break;
        }
    if (*skip_ws(p)) {
        *why = "text after the object's closing brace (one object a line)";
        return false;
    }
    if (!*prompt || !*completion) {
        *why = "the object needs string members \"prompt\" and \"completion\"";
        return false;
    }
    return true;
}

/* Encodes text (no special tokens added) into a malloc'ed array. */
static int64_t *encode(const em_tokenizer *tok, const char *text, size_t len, unsigned flags, int64_t *n) {
    size_t count = 0;
    if (em_tokenizer_encode_i64(tok, text, len, flags, NULL, 0, &count) != EM_OK && count == 0 && len) {
        return NULL;
    }
    em_clear_error();
    int64_t *ids = malloc((count ? count : 1) * sizeof *ids);
    if (ids && em_tokenizer_encode_i64(tok, text, len, flags, ids, count, &count) != EM_OK) {
        free(ids);
        return NULL;
    }
    *n = (int64_t)count;
    return ids;
}

static void finish_example(example *e, int64_t seq) {
    e->counted = 0;
    for (int64_t t = 1; t < seq; t++) e->counted += e->labels[t] != -100;
}

static bool load_jsonl(const char *path, char *text, size_t len, const em_tokenizer *tok, const em_model_config *cfg,
                       dataset *d) {
    int64_t eos = cfg->n_eos ? cfg->eos_token_ids[0] : -1;
    int64_t pad = cfg->pad_token_id >= 0 ? cfg->pad_token_id : eos >= 0 ? eos : 0;
    int64_t lineno = 0;
    char *end = text + len;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) text += 3;   /* a UTF-8 byte-order mark, as editors on Windows write */
    for (char *line = text, *next; line < end; line = next) {
        lineno++;
        char *nl = memchr(line, '\n', (size_t)(end - line));
        next = nl ? nl + 1 : end;
        if (nl) *nl = '\0';
        if (memchr(line, '\0', (size_t)((nl ? nl : end) - line))) {   /* the line would end there unseen */
            fprintf(stderr, "%s: %s:%lld: a NUL byte (JSON text holds none; in a string it is \\u0000)\n", tool,
                    path, (long long)lineno);
            return false;
        }
        if (!*skip_ws(line)) continue;
        char *prompt, *completion;
        size_t lens[2] = {0, 0};
        const char *why;
        if (!parse_line(line, &prompt, &completion, lens, &why)) {
            free(prompt);
            free(completion);
            fprintf(stderr, "%s: %s:%lld: %s\n", tool, path, (long long)lineno, why);
            return false;
        }
        int64_t np = 0, nc = 0;
        int64_t *p = encode(tok, prompt, lens[0], EM_TOKENIZE_ADD_SPECIAL, &np);
        int64_t *c = p ? encode(tok, completion, lens[1], 0, &nc) : NULL;
        free(prompt);
        free(completion);
        if (!p || !c) {
            free(p);
            free(c);
            fprintf(stderr, "%s: %s:%lld: %s\n", tool, path, (long long)lineno, em_last_error());
            return false;
        }
        if (np >= d->seq) {
            fprintf(stderr, "%s: %s:%lld: the prompt is %lld tokens, which leaves no room for the completion in "
                    "the context of --seq %lld tokens\n", tool, path, (long long)lineno, (long long)np,
                    (long long)d->seq);
            free(p);
            free(c);
            return false;
        }
        example *e = dataset_add(d);
        if (!e) {
            free(p);
            free(c);
            fprintf(stderr, "%s: out of memory\n", tool);
            return false;
        }
        int64_t t = 0;
        for (int64_t i = 0; i < np; i++, t++) e->ids[t] = p[i], e->labels[t] = -100;
        for (int64_t i = 0; i < nc && t < d->seq; i++, t++) e->ids[t] = e->labels[t] = c[i];
        if (eos >= 0 && t < d->seq) e->ids[t] = e->labels[t] = eos, t++;
        for (; t < d->seq; t++) e->ids[t] = pad, e->labels[t] = -100;   /* right padding: no one attends to it */
        finish_example(e, d->seq);
        free(p);
        free(c);
    }
    if (!d->n) fprintf(stderr, "%s: %s holds no example\n", tool, path);
    return d->n > 0;
}

static bool load_text(const char *path, const char *text, size_t len, const em_tokenizer *tok, dataset *d) {
    int64_t n = 0;
    int64_t *ids = encode(tok, text, len, 0, &n);   /* the whole file, as perplexity reads it: a NUL byte is text */
    if (!ids) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, em_last_error());
        return false;
    }
    if (n < d->seq) {
        fprintf(stderr, "%s: %s holds %lld tokens, fewer than one sequence of --seq %lld\n", tool, path, (long long)n,
                (long long)d->seq);
        free(ids);
        return false;
    }
    for (int64_t at = 0; at + d->seq <= n; at += d->seq) {
        example *e = dataset_add(d);
        if (!e) {
            free(ids);
            fprintf(stderr, "%s: out of memory\n", tool);
            return false;
        }
        memcpy(e->ids, ids + at, (size_t)d->seq * sizeof *ids);
        memcpy(e->labels, ids + at, (size_t)d->seq * sizeof *ids);
        finish_example(e, d->seq);
    }
    free(ids);
    return true;
}

/* ---- the order of the examples: splitmix64 from (seed, stream) ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* order[0..n) a permutation drawn from (seed, stream) by Fisher-Yates. */
static void shuffle(int64_t *order, int64_t n, uint64_t seed, uint64_t stream) {
    uint64_t s = seed * 0x100000001B3ull ^ (stream + 1) * 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix(&s) % (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* ---- batches ---- */

/* The examples idx[0..rows) as ids and labels [rows, seq] tensors on dev (scoped). */
static bool make_batch(const dataset *d, const int64_t *idx, int64_t rows, em_device dev, em_tensor **ids,
                       em_tensor **labels) {
    int64_t seq = d->seq;
    int64_t *a = malloc((size_t)(rows * seq) * sizeof *a), *b = malloc((size_t)(rows * seq) * sizeof *b);
    if (a && b)
        for (int64_t r = 0; r < rows; r++) {
            memcpy(a + r * seq, d->ex[idx[r]].ids, (size_t)seq * sizeof *a);
            memcpy(b + r * seq, d->ex[idx[r]].labels, (size_t)seq * sizeof *b);
        }
    *ids = a && b ? em_from_data(a, EM_I64, EM_SHAPE(rows, seq), EM_OPTS(.dtype = EM_I64, .device = dev)) : NULL;
    *labels = *ids ? em_from_data(b, EM_I64, EM_SHAPE(rows, seq), EM_OPTS(.dtype = EM_I64, .device = dev)) : NULL;
    free(a);
    free(b);
    return *labels != NULL;
}

/* getrusage's max RSS in MB (2^20 bytes: ru_maxrss is in KiB). */
static double peak_rss_mb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : NAN;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The eval loss: the mean over every counted token of the held-out examples; NAN on failure.
 * shard (DDP's ranks, whose weights are the same): each rank evaluates its rows of every
 * batch and the sums are added over the ranks; ZeRO's ranks run every batch together. */
static double eval_loss(em_model *m, const dataset *d, const int64_t *idx, int64_t n, int64_t batch, bool amp,
                        em_device dev, bool shard) {
    double total = 0, counted = 0;
    em_grad_mode g = em_no_grad_begin();
    for (int64_t at = 0; at < n; at += batch) {
        int64_t rows = n - at < batch ? n - at : batch, first = 0, items = 0;
        if (shard) finetune_dist_rows(rows, &first, &rows);
        for (int64_t r = first; r < first + rows; r++) items += d->ex[idx[at + r]].counted;
        if (!items) continue;
        em_scope s = em_scope_begin();
        em_tensor *ids, *labels, *loss = NULL;
        if (make_batch(d, idx + at + first, rows, dev, &ids, &labels)) {
            em_autocast region = amp ? em_autocast_begin(dev.type, EM_BF16) : (em_autocast){0};
            loss = em_model_loss(m, ids, labels, &(em_model_loss_opts){.num_items = 1});   /* the sum */
            if (amp) em_autocast_end(region);
        }
        double v = loss ? em_item(loss) : NAN;
        em_scope_end(s);
        if (isnan(v)) {
            total = NAN;
            break;
        }
        total += v;
        counted += (double)items;
    }
    em_no_grad_end(g);
    if (shard) {
        total = finetune_dist_sum(total);
        counted = finetune_dist_sum(counted);
    }
    return counted > 0 ? total / counted : NAN;
}

/* ---- the checkpoint ---- */

typedef struct position {
    int64_t step, epoch, micro;   /* steps done; the epoch and micro-batch to train next */
} position;

/* What trains, as a checkpoint records it: the adapters' config, or "full"; and its module. */
static void trained_kind(em_model *m, char *buf, size_t size) {
    em_lora_config c;
    if (!em_model_has_lora(m)) {
        snprintf(buf, size, "full");
        return;
    }
    em_model_lora_config(m, &c);
    snprintf(buf, size, "r=%lld alpha=%.17g targets=%s", (long long)c.rank, c.alpha, c.targets);
}
static em_module *trained_module(em_model *m) {
    return em_model_has_lora(m) ? em_model_lora_module(m) : em_model_module(m);
}

/* A checkpoint's metadata: the position, the seed and the run's sizes as text, under
 * checkpoint_keys; the last key, "finetune.lora", is what trains (trained_kind), filled by the caller. */
static const char *const checkpoint_keys[7] = {"finetune.step", "finetune.epoch", "finetune.micro", "finetune.seed",
                                               "finetune.examples", "finetune.total_steps", "finetune.lora"};

static void checkpoint_values(char v[6][64], const position *pos, int64_t seed, int64_t n_train, int64_t total) {
    const int64_t n[6] = {pos->step, pos->epoch, pos->micro, seed, n_train, total};
    for (int i = 0; i < 6; i++) snprintf(v[i], 64, "%lld", (long long)n[i]);
}

static bool save_checkpoint(const char *out, em_model *m, em_optimizer *opt, const position *pos, int64_t seed,
                            int64_t n_train, int64_t total) {
    char path[4096], v[6][64];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", out);
    checkpoint_values(v, pos, seed, n_train, total);
    char lora[400];
    trained_kind(m, lora, sizeof lora);
    const char *values[] = {v[0], v[1], v[2], v[3], v[4], v[5], lora};
    if (em_checkpoint_save(path, trained_module(m), opt, checkpoint_keys, values, 7) != EM_OK) {
        fprintf(stderr, "%s: saving %s: %s\n", tool, path, em_last_error());
        return false;
    }
    return true;
}

/* A count from the checkpoint's metadata: the whole string a number from 0 to 2^53 (the one
 * parser every option and checkpoint number goes through: no spaces, signs or empty values). */
static bool meta_i64(em_safetensors *f, const char *key, int64_t *out) {
    return em_parse_i64(em_safetensors_metadata(f, key), 0, INT64_C(1) << 53, out) == EM_NUM_OK;
}

/* The position this run is at after `step` steps: each step takes the next --accumulate
 * micro-batches of its epoch (fewer at the epoch's end), and an epoch's last step leaves micro
 * at micro_per_epoch, the epoch moving on when the next step starts. A checkpoint's position
 * must be this one: any other was forged, or written with other options over the same data. */
static position position_after(int64_t step, int64_t micro_per_epoch, int64_t accumulate) {
    if (step == 0) return (position){0};
    int64_t steps_per_epoch = (micro_per_epoch + accumulate - 1) / accumulate;
    int64_t epoch = (step - 1) / steps_per_epoch, k = step - epoch * steps_per_epoch;
    int64_t micro = k * accumulate < micro_per_epoch ? k * accumulate : micro_per_epoch;
    return (position){.step = step, .epoch = epoch, .micro = micro};
}

static bool position_is_reached(const char *path, const position *pos, int64_t total, int64_t micro_per_epoch,
                                int64_t accumulate) {
    position want = position_after(pos->step, micro_per_epoch, accumulate);
    if (pos->step <= total && pos->epoch == want.epoch && pos->micro == want.micro) return true;
    if (pos->step > total)
        fprintf(stderr, "%s: --resume: %s is at step %lld, past the run's %lld steps\n", tool, path,
                (long long)pos->step, (long long)total);
    else
        fprintf(stderr, "%s: --resume: %s puts step %lld at epoch %lld, micro-batch %lld, where this run (%lld "
                "micro-batches an epoch, --accumulate %lld) is at epoch %lld, micro-batch %lld: the checkpoint was "
                "written with other options, or changed\n", tool, path, (long long)pos->step, (long long)pos->epoch,
                (long long)pos->micro, (long long)micro_per_epoch, (long long)accumulate, (long long)want.epoch,
                (long long)want.micro);
    return false;
}

/* Each step of ember finetune updates every trained parameter once and skips none, so the
 * optimizer's counts in a checkpoint are its position's step; other counts would change
 * AdamW's bias corrections from what the run that wrote it computes. */
static bool optimizer_counts_match(const char *path, em_module *trained, em_optimizer *opt, int64_t step) {
    if (em_optim_steps(opt) != step) {
        fprintf(stderr, "%s: --resume: %s: optimizer.steps is %lld, where the position is step %lld\n", tool, path,
                (long long)em_optim_steps(opt), (long long)step);
        return false;
    }
    int n = em_module_parameters(trained, NULL, 0);
    em_named_tensor *ps = n > 0 ? malloc((size_t)n * sizeof *ps) : NULL;
    if (!ps) {
        fprintf(stderr, "%s: --resume: out of memory\n", tool);
        return false;
    }
    em_module_parameters(trained, ps, n);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        double taken = em_optim_scalar(opt, ps[i].tensor, "step");
        if (taken != (double)step) {
            fprintf(stderr, "%s: --resume: %s: the optimizer's step count of %s is %.17g, where the position is step "
                    "%lld\n", tool, path, ps[i].name, taken, (long long)step);
            ok = false;
        }
    }
    free(ps);
    return ok;
}

static bool load_checkpoint(const char *out, em_model *m, em_optimizer *opt, position *pos, int64_t seed,
                            int64_t n_train, int64_t total, int64_t micro_per_epoch, int64_t accumulate) {
    char path[4096], sharded[4096];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", out);
    snprintf(sharded, sizeof sharded, "%s/checkpoint.zero", out);
    struct stat st;
    if (stat(path, &st) != 0 && stat(sharded, &st) == 0) {
        fprintf(stderr, "%s: --resume: %s has the sharded checkpoint of a --zero run (%s/): resume it with --zero "
                "under `ember launch`\n", tool, out, sharded);
        return false;
    }
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!f) {
        fprintf(stderr, "%s: --resume: %s\n", tool, em_last_error());
        return false;
    }
    char lora[400];
    trained_kind(m, lora, sizeof lora);
    const char *saved = em_safetensors_metadata(f, "finetune.lora");
    int64_t s_seed = 0, s_n = 0, s_total = 0;
    bool ok = meta_i64(f, "finetune.step", &pos->step) && meta_i64(f, "finetune.epoch", &pos->epoch) &&
              meta_i64(f, "finetune.micro", &pos->micro) && meta_i64(f, "finetune.seed", &s_seed) &&
              meta_i64(f, "finetune.examples", &s_n) && meta_i64(f, "finetune.total_steps", &s_total) && saved;
    if (!ok) fprintf(stderr, "%s: --resume: %s is not a checkpoint of ember finetune\n", tool, path);
    else if (strcmp(saved, lora) || s_seed != seed || s_n != n_train || s_total != total) {
        fprintf(stderr, "%s: --resume: %s was written by another run (adapters %s, seed %lld, %lld training examples, "
                "%lld steps); this one has adapters %s, seed %lld, %lld examples, %lld steps: give the same options "
                "and data\n", tool, path, saved, (long long)s_seed, (long long)s_n, (long long)s_total, lora,
                (long long)seed, (long long)n_train, (long long)total);
        ok = false;
    } else if (!position_is_reached(path, pos, total, micro_per_epoch, accumulate)) {
        ok = false;
    } else if (em_checkpoint_load_safetensors(f, trained_module(m), opt) != EM_OK) {
        fprintf(stderr, "%s: --resume: %s\n", tool, em_last_error());
        ok = false;
    } else if (!optimizer_counts_match(path, trained_module(m), opt, pos->step)) {
        ok = false;
    }
    em_safetensors_free(f);
    return ok;
}

/* --zero: the checkpoint is ZeRO's sharded one, DIR/checkpoint.zero/rank-R.safetensors, with
 * the same metadata as checkpoint.safetensors (rank 0's file holds it). */
static void zero_checkpoint_dir(const char *out, char *dir, size_t size) {
    snprintf(dir, size, "%s/checkpoint.zero", out);
}

static bool save_zero_checkpoint(const char *out, em_zero *z, const position *pos, int64_t seed, int64_t n_train,
                                 int64_t total) {
    char dir[4096], v[6][64];
    zero_checkpoint_dir(out, dir, sizeof dir);
    checkpoint_values(v, pos, seed, n_train, total);
    const char *values[] = {v[0], v[1], v[2], v[3], v[4], v[5], "full"};
    if (em_zero_save(z, dir, checkpoint_keys, values, 7) != EM_OK) {
        fprintf(stderr, "%s: rank %d: saving %s: %s\n", tool, train_dist_rank(), dir, em_last_error());
        return false;
    }
    return true;
}

static bool load_zero_checkpoint(const char *out, em_zero *z, position *pos, int64_t seed, int64_t n_train,
                                 int64_t total, int64_t micro_per_epoch, int64_t accumulate) {
    char dir[4096], whole[4096];
    zero_checkpoint_dir(out, dir, sizeof dir);
    snprintf(whole, sizeof whole, "%s/checkpoint.safetensors", out);
    struct stat st;
    if (stat(dir, &st) != 0 && stat(whole, &st) == 0) {
        fprintf(stderr, "%s: --resume: %s has the checkpoint of a run without --zero (%s): resume it without --zero\n",
                tool, out, whole);
        return false;
    }
    em_safetensors *f = NULL;
    if (em_zero_load(z, dir, &f) != EM_OK) {
        fprintf(stderr, "%s: rank %d: --resume: %s\n", tool, train_dist_rank(), em_last_error());
        return false;
    }
    int64_t s_seed = 0, s_n = 0, s_total = 0;
    bool ok = meta_i64(f, "finetune.step", &pos->step) && meta_i64(f, "finetune.epoch", &pos->epoch) &&
              meta_i64(f, "finetune.micro", &pos->micro) && meta_i64(f, "finetune.seed", &s_seed) &&
              meta_i64(f, "finetune.examples", &s_n) && meta_i64(f, "finetune.total_steps", &s_total);
    if (!ok) {
        fprintf(stderr, "%s: --resume: %s is not a checkpoint of ember finetune\n", tool, dir);
    } else if (s_seed != seed || s_n != n_train || s_total != total) {
        fprintf(stderr, "%s: --resume: %s was written by another run (seed %lld, %lld training examples, %lld steps); "
                "this one has seed %lld, %lld examples, %lld steps: give the same options and data\n", tool, dir,
                (long long)s_seed, (long long)s_n, (long long)s_total, (long long)seed, (long long)n_train,
                (long long)total);
        ok = false;
    } else if (!position_is_reached(dir, pos, total, micro_per_epoch, accumulate)) {
        ok = false;
    }
    em_safetensors_free(f);
    return ok;
}

/* The checkpoint: ZeRO's shards, one file per rank; or the whole state, written by rank 0
 * alone (DDP keeps it the same on every rank), the others learning whether it was written. */
static bool save_state(const char *out, em_model *m, em_optimizer *opt, em_zero *z, const position *pos, int64_t seed,
                       int64_t n_train, int64_t total) {
    if (z) return save_zero_checkpoint(out, z, pos, seed, n_train, total);
    bool saved = !train_dist_is_main() || save_checkpoint(out, m, opt, pos, seed, n_train, total);
    return !finetune_dist_any(!saved);
}

/* --zero 3: the model's units run through ZeRO, which gathers each around its use. */
static em_tensor *zero_unit_runner(void *z, int unit, em_checkpoint_fn fn, void *ctx, void (*free_ctx)(void *),
                                   em_tensor *const *in, int n) {
    return em_zero_run_unit(z, unit, fn, ctx, free_ctx, in, n);
}

static int zero_unit_of(void *m, const char *name) { return em_model_unit_of(m, name); }

/* ---- the command ---- */

typedef struct run {
    const char *dir, *data, *out;
    int64_t rank, epochs, max_steps, seq, batch, warmup, accumulate, save_every, seed, interrupt_after;
    double alpha, lr, wd, max_grad_norm, eval_fraction;
    const char *targets;
    bool amp, ckpt, resume, merge, warmup_given, full, threads_given;
    int zero;              /* --zero's stage, 0 without */
    em_device dev;
    em_dtype dtype;
    double start_rss_mb;   /* the peak RSS before the model is loaded: the step's growth is over it */
} run;

static int parse(int argc, char **argv, run *r) {
    opt_result opts;
    int status = opt_parse(&finetune_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    *r = (run){.dir = opts.positional, .rank = 8, .alpha = 16, .epochs = 1, .seq = 128, .batch = 4, .lr = 2e-4,
               .wd = 0.01, .max_grad_norm = 1.0, .accumulate = 1, .dev = EM_DEVICE_CPU};
    if (!r->dir) return opt_usage_error(&finetune_options, stderr, "expected MODEL_DIR (a model folder)");
    if (!v[F_DATA].given) return opt_usage_error(&finetune_options, stderr, "expected --data FILE");
    if (!v[F_OUT].given) return opt_usage_error(&finetune_options, stderr, "expected --out DIR");
    if (v[F_EPOCHS].given && v[F_MAX_STEPS].given)
        return opt_usage_error(&finetune_options, stderr, "--epochs and --max-steps are two ways to say how long: give "
                               "one");
    if (v[F_ALPHA].given && !(v[F_ALPHA].d > 0))
        return opt_usage_error(&finetune_options, stderr, "--lora-alpha must be positive, got %s", v[F_ALPHA].text);
    if (v[F_LR].given && !(v[F_LR].d > 0))
        return opt_usage_error(&finetune_options, stderr, "--lr must be positive, got %s", v[F_LR].text);
    r->data = v[F_DATA].text;
    r->out = v[F_OUT].text;
    if (v[F_RANK].given) r->rank = v[F_RANK].i;
    if (v[F_ALPHA].given) r->alpha = v[F_ALPHA].d;
    r->targets = v[F_TARGETS].given ? v[F_TARGETS].text : NULL;
    if (v[F_EPOCHS].given) r->epochs = v[F_EPOCHS].i;
    if (v[F_MAX_STEPS].given) r->max_steps = v[F_MAX_STEPS].i;
    if (v[F_SEQ].given) r->seq = v[F_SEQ].i;
    if (v[F_BATCH].given) r->batch = v[F_BATCH].i;
    if (v[F_LR].given) r->lr = v[F_LR].d;
    if (v[F_WD].given) r->wd = v[F_WD].d;
    r->warmup_given = v[F_WARMUP].given;
    r->warmup = v[F_WARMUP].i;
    if (v[F_MAX_GRAD_NORM].given) r->max_grad_norm = v[F_MAX_GRAD_NORM].d;
    if (v[F_ACCUMULATE].given) r->accumulate = v[F_ACCUMULATE].i;
    r->amp = v[F_AMP].given;
    r->ckpt = v[F_CKPT_ACT].given;
    r->resume = v[F_RESUME].given;
    r->save_every = v[F_SAVE_EVERY].i;
    r->eval_fraction = v[F_EVAL_FRACTION].given ? v[F_EVAL_FRACTION].d : 0;
    r->merge = v[F_MERGE].given;
    r->seed = v[F_SEED].i;
    r->interrupt_after = v[F_INTERRUPT_AFTER].i;
    r->threads_given = v[F_THREADS].given;
    if (r->threads_given) em_set_num_threads((int)v[F_THREADS].i);
    if (v[F_DEVICE].given && !mlp_parse_device(tool, "--device", v[F_DEVICE].text, &r->dev)) return 2;
    const em_dtype dtypes[] = {EM_F32, EM_BF16, EM_F16};
    r->dtype = v[F_DTYPE].given ? dtypes[v[F_DTYPE].choice] : EM_F32;
    r->full = v[F_FULL].given;
    if (r->full) {
        const int lora_only[] = {F_RANK, F_ALPHA, F_TARGETS, F_MERGE};
        for (size_t i = 0; i < sizeof lora_only / sizeof *lora_only; i++)
            if (v[lora_only[i]].given)
                return opt_usage_error(&finetune_options, stderr, "%s is an adapters' option; --full trains every "
                                       "weight", finetune_table[lora_only[i]].name);
        if (r->dtype != EM_F32)
            return opt_usage_error(&finetune_options, stderr, "--full keeps float32 master weights: --dtype %s is not "
                                   "one (--amp bf16 computes in bf16)", v[F_DTYPE].text);
    }
    r->zero = v[F_ZERO].given ? (int)v[F_ZERO].i : 0;
    if (r->zero && !r->full)
        return opt_usage_error(&finetune_options, stderr, "--zero shards a full fine-tuning (--full): LoRA's adapters "
                               "are small enough to keep whole on every rank");
    return -1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Where the informational lines go: standard error, or nowhere on a rank other than 0. */
static FILE *info_out(void) { return train_dist_is_main() ? stderr : train_dist_progress_out(); }

/* A rank with no rows in a micro-batch still runs the forward and backward (DDP's and ZeRO's
 * collectives): one sequence whose labels all count for nothing. */
static bool make_empty_batch(const dataset *d, em_device dev, em_tensor **ids, em_tensor **labels) {
    *ids = em_from_data(d->ex[0].ids, EM_I64, EM_SHAPE(1, d->seq), EM_OPTS(.dtype = EM_I64, .device = dev));
    *labels = *ids ? em_full(EM_SHAPE(1, d->seq), -100, EM_OPTS(.dtype = EM_I64, .device = dev)) : NULL;
    return *labels != NULL;
}

/* The training loop over a prepared model and data; returns the exit status. With --zero,
 * *zp receives the sharded state (the caller unshards and frees it). */
static int train(run *r, em_model *m, dataset *d, int64_t n_train, const int64_t *eval_idx, int64_t n_eval,
                 em_zero **zp) {
    int64_t micro_per_epoch = (n_train + r->batch - 1) / r->batch;
    int64_t steps_per_epoch = (micro_per_epoch + r->accumulate - 1) / r->accumulate;
    int64_t total = r->max_steps ? r->max_steps : r->epochs * steps_per_epoch;
    int64_t warmup = r->warmup_given ? r->warmup : total / 10;
    if (warmup > total) warmup = total;
    em_lr_schedule sched = em_lr_cosine(warmup, total, 0);
    em_adam_opts ao = em_adam_defaults(r->lr);
    ao.weight_decay = r->wd;
    ao.decay_matrices_only = r->full;
    /* --full: no bf16 copies of the weights kept from one step to the next (2 bytes a
     * parameter, on top of the weights, gradients and states at the step's peak) */
    ao.no_lowp_copy = r->full;
    em_module *lora = trained_module(m);
    em_optimizer *opt = em_adamw_ex(lora, ao);
    em_zero *z = NULL;
    if (opt && r->zero) {
        /* the optimizer's kind and options, over this rank's shards */
        z = em_zero_new(lora, NULL, opt, &(em_zero_opts){.stage = r->zero, .unit_of = zero_unit_of, .unit_ctx = m});
        em_optim_free(opt);
        opt = z ? em_zero_optimizer(z) : NULL;
        if (z && r->zero == 3 && em_model_set_unit_runner(m, zero_unit_runner, z) != EM_OK) opt = NULL;
        *zp = z;
    }
    int64_t *order = malloc((size_t)n_train * sizeof *order);
    if (!opt || !order) {
        fprintf(stderr, "%s: %s\n", tool, opt ? "out of memory" : em_last_error());
        if (!z) em_optim_free(opt);
        free(order);
        return 1;
    }
    position pos = {0};
    bool resumed = !r->resume || (z ? load_zero_checkpoint(r->out, z, &pos, r->seed, n_train, total, micro_per_epoch,
                                                           r->accumulate)
                                    : load_checkpoint(r->out, m, opt, &pos, r->seed, n_train, total, micro_per_epoch,
                                                      r->accumulate));
    /* DDP's ranks each read the checkpoint: all go on, or none (ZeRO's load votes itself) */
    bool ready = z ? resumed : !finetune_dist_any(!resumed);
    if (resumed && !ready) fprintf(stderr, "%s: rank %d: --resume: another rank could not read the checkpoint\n", tool,
                                   train_dist_rank());
    if (ready && !z && finetune_dist_wrap(tool, lora, r->batch) != 0) ready = false;
    if (!ready) {
        if (!z) em_optim_free(opt);
        free(order);
        return 1;
    }
    if (z) {
        int64_t largest = 0, numel;
        for (int u = 0; u < em_zero_num_units(z); u++)
            if (em_zero_unit_info(z, u, &numel, NULL, NULL) == EM_OK && numel > largest) largest = numel;
        fprintf(info_out(), "%s: ZeRO stage %d over %d rank%s (%s): %d units (the largest %lld weights), each rank its "
                "part of every batch of %lld\n", tool, r->zero, train_dist_world(), train_dist_world() == 1 ? "" : "s",
                em_dist_backend(NULL), em_zero_num_units(z), (long long)largest, (long long)r->batch);
    }
    fprintf(info_out(), "%s: %lld training examples of %lld tokens, %lld held out; %lld steps (%lld micro-batches of %lld "
            "a step), warm-up %lld; %lld %s parameters%s\n", tool, (long long)n_train, (long long)d->seq,
            (long long)n_eval, (long long)total, (long long)r->accumulate, (long long)r->batch, (long long)warmup,
            (long long)em_module_num_parameters(lora), r->full ? "trained" : "adapter", pos.step ? " (resumed)" : "");
    int rc = 0;
    int64_t shuffled_epoch = -1;
    double t0 = now_seconds();
    int64_t tokens_done = 0;
    stop_signals_catch(true, 0);
    while (pos.step < total && rc == 0) {
        if (pos.micro >= micro_per_epoch) {
            if (n_eval) {
                double el = eval_loss(m, d, eval_idx, n_eval, r->batch, r->amp, r->dev, !z);
                fprintf(info_out(), "%s: epoch %lld eval loss %.4f (perplexity %.2f)\n", tool, (long long)pos.epoch + 1, el,
                        exp(el));
            }
            pos.epoch++;
            pos.micro = 0;
        }
        if (shuffled_epoch != pos.epoch) {
            shuffle(order, n_train, (uint64_t)r->seed, (uint64_t)pos.epoch);
            shuffled_epoch = pos.epoch;
        }
        int64_t first = pos.micro, last = pos.micro + r->accumulate;
        if (last > micro_per_epoch) last = micro_per_epoch;
        int64_t items = 0, tokens = 0;
        for (int64_t k = first; k < last; k++)
            for (int64_t i = k * r->batch; i < (k + 1) * r->batch && i < n_train; i++) {
                items += d->ex[order[i]].counted;
                tokens += d->seq;
            }
        double lr = em_lr_at(sched, r->lr, pos.step), loss_sum = 0, norm = 0;
        em_optim_set_lr(opt, lr);
        /* on N ranks each rank's loss is its rows' part of the batch's (the sum over its tokens
         * divided by the batch's count), times N because DDP and ZeRO average the ranks'
         * gradients; the N goes inside the fused loss (em_model_loss_opts.scale), where its
         * gradient needs no second pass over the vocabulary */
        double world = train_dist_world();
        for (int64_t k = first; k < last && rc == 0; k++) {
            int64_t at = k * r->batch, rows = n_train - at < r->batch ? n_train - at : r->batch, mine, count;
            finetune_dist_rows(rows, &mine, &count);
            finetune_dist_sync_next(k == last - 1);   /* DDP: one all-reduce a step */
            em_scope s = em_scope_begin();
            em_tensor *ids, *labels, *loss = NULL;
            if (count > 0 ? make_batch(d, order + at + mine, count, r->dev, &ids, &labels)
                          : make_empty_batch(d, r->dev, &ids, &labels)) {
                em_autocast region = r->amp ? em_autocast_begin(r->dev.type, EM_BF16) : (em_autocast){0};
                loss = em_model_loss(m, ids, labels, &(em_model_loss_opts){.checkpoint_layers = r->ckpt,
                                                                     .num_items = items ? items : 1,
                                                                     .scale = world});
                if (r->amp) em_autocast_end(region);
            }
            double value = loss ? em_item(loss) / world : NAN;
            if (!loss || em_backward(loss) != EM_OK) rc = 1;
            else loss_sum += value;
            em_scope_end(s);
        }
        loss_sum = finetune_dist_sum(loss_sum);   /* the batch's loss: the ranks' parts summed */
        if (rc == 0 && r->max_grad_norm > 0) {
            norm = z ? em_zero_clip_grad_norm(z, r->max_grad_norm) : em_clip_grad_norm(lora, r->max_grad_norm);
            if (isnan(norm) && em_failed()) rc = 1;
        }
        if (rc == 0 && z && (em_zero_step(z) != EM_OK || em_zero_clear_grads(z) != EM_OK)) rc = 1;
        if (rc == 0 && !z && (em_step(opt) != EM_OK || em_zero_grad(opt) != EM_OK)) rc = 1;
        if (rc) {
            if (train_dist_active())
                fprintf(stderr, "%s: rank %d: step %lld: %s\n", tool, train_dist_rank(), (long long)pos.step + 1,
                        em_last_error());
            else fprintf(stderr, "%s: step %lld: %s\n", tool, (long long)pos.step + 1, em_last_error());
            break;
        }
        pos.step++;
        pos.micro = last;
        tokens_done += tokens;
        double elapsed = now_seconds() - t0;
        /* the allocator's peak (tensors; the mapped weights are file pages, not allocations)
         * and the RSS's growth over the start, which holds both and what `ember mem` predicts */
        char device_mem[96] = "";
        if (r->dev.type != EM_CPU)
            snprintf(device_mem, sizeof device_mem, " peak_device %.1f MB", (double)em_memory_max_allocated(r->dev) / 1e6);
        else   /* in peak_rss's unit, 2^20 bytes; reserved: the caching allocator's segments */
            snprintf(device_mem, sizeof device_mem, " peak_alloc %.1f MB peak_reserved %.1f MB",
                     (double)em_memory_max_allocated(EM_DEVICE_CPU) / 1048576.0,
                     (double)em_memory_max_reserved(EM_DEVICE_CPU) / 1048576.0);
        double rss = peak_rss_mb();
        fprintf(info_out(), "step %lld/%lld epoch %lld loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f peak_rss %.1f MB "
                "rss_growth %.1f MB%s\n", (long long)pos.step, (long long)total, (long long)pos.epoch + 1, loss_sum, lr,
                norm, elapsed > 0 ? (double)tokens_done / elapsed : 0, rss, rss - r->start_rss_mb, device_mem);
        if (r->interrupt_after && pos.step == r->interrupt_after) stop_signals_request(SIGTERM);   /* as a signal would */
        bool stop = finetune_dist_any(stop_signals_pending() != 0);
        if (stop) stop_signals_request(SIGTERM);   /* another rank's signal (a no-op after our own) */
        if ((stop || (r->save_every && pos.step % r->save_every == 0)) &&
            !save_state(r->out, m, opt, z, &pos, r->seed, n_train, total))
            rc = 1;
        if (stop && rc == 0) {
            fprintf(info_out(), "%s: stopped by %s after step %lld; --resume continues from %s/%s\n",
                    tool, stop_signal_name(stop_signals_pending()),
                    (long long)pos.step, r->out, z ? "checkpoint.zero/" : "checkpoint.safetensors");
            rc = 128 + stop_signals_pending();
        }
    }
    stop_signals_catch(false, 0);
    if (rc == 0 && n_eval) {
        double el = eval_loss(m, d, eval_idx, n_eval, r->batch, r->amp, r->dev, !z);
        fprintf(info_out(), "%s: eval loss %.4f (perplexity %.2f)\n", tool, el, exp(el));
    }
    if (rc == 0 && !save_state(r->out, m, opt, z, &pos, r->seed, n_train, total)) rc = 1;
    finetune_dist_unwrap();
    if (z)   /* each rank's own peak in training: what ZeRO saves is per rank */
        fprintf(stderr, "%s: rank %d of %d: training's peak_alloc %.1f MB peak_reserved %.1f MB peak_rss %.1f MB\n", tool,
                train_dist_rank(), train_dist_world(), (double)em_memory_max_allocated(EM_DEVICE_CPU) / 1048576.0,
                (double)em_memory_max_reserved(EM_DEVICE_CPU) / 1048576.0, peak_rss_mb());
    if (!z) em_optim_free(opt);
    free(order);
    return rc;
}

int cmd_finetune(int argc, char **argv) {
    run r;
    int status = parse(argc, argv, &r);
    if (status >= 0) return status;
    stop_signals_take(tool);
    r.start_rss_mb = peak_rss_mb();
    /* the ranks of a launcher, if any (--zero on one process: a group of one) */
    if (finetune_dist_init(tool, &r.dev, r.threads_given, r.zero != 0) != 0) {
        finetune_dist_finish();
        return 1;
    }
    em_lm *lm = em_lm_load(r.dir, &(em_model_opts){.device = r.dev, .dtype = r.dtype});
    if (!lm) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        finetune_dist_finish();
        return 1;
    }
    em_model *m = em_lm_model(lm);
    const em_model_config *cfg = em_model_config_of(m);
    int rc = 1;
    dataset d = {.seq = r.seq};
    int64_t *order = NULL;
    size_t len = 0;
    char *text = NULL;
    if (r.seq > cfg->max_position_embeddings) {
        fprintf(stderr, "%s: --seq %lld exceeds the model's context of %lld positions\n", tool, (long long)r.seq,
                (long long)cfg->max_position_embeddings);
        goto done;
    }
    if (mkdir(r.out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", tool, r.out, strerror(errno));
        goto done;
    }
    if (!(text = tool_read_all(tool, r.data, &len))) goto done;
    bool jsonl = ends_with(r.data, ".jsonl");
    if (!(jsonl ? load_jsonl(r.data, text, len, em_lm_tokenizer(lm), cfg, &d)
                : load_text(r.data, text, len, em_lm_tokenizer(lm), &d)))
        goto done;
    /* the held-out split: a fixed draw from the seed, the last n_eval of it */
    order = malloc((size_t)d.n * sizeof *order);
    if (!order) goto done;
    shuffle(order, d.n, (uint64_t)r.seed, UINT64_MAX - 1);
    int64_t n_eval = (int64_t)ceil(r.eval_fraction * (double)d.n);
    if (r.eval_fraction > 0 && n_eval >= d.n) {
        fprintf(stderr, "%s: --eval-fraction %g of %lld examples leaves none to train on\n", tool, r.eval_fraction,
                (long long)d.n);
        goto done;
    }
    int64_t n_train = d.n - n_eval;
    /* the examples in the split's order: the first n_train train, the rest are held out */
    dataset train_set = d;
    example *ex = malloc((size_t)d.n * sizeof *ex);
    if (!ex) goto done;
    for (int64_t i = 0; i < d.n; i++) ex[i] = d.ex[order[i]];
    free(d.ex);
    d.ex = ex;
    train_set.ex = ex;
    int64_t *eval_idx = malloc((size_t)(n_eval ? n_eval : 1) * sizeof *eval_idx);
    if (!eval_idx) goto done;
    for (int64_t i = 0; i < n_eval; i++) eval_idx[i] = n_train + i;
    em_manual_seed((uint64_t)r.seed);
    if ((r.full ? em_model_unfreeze(m)
                : em_model_lora_add(m, &(em_lora_config){.rank = r.rank, .alpha = r.alpha, .targets = r.targets})) !=
        EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        free(eval_idx);
        goto done;
    }
    em_zero *z = NULL;
    rc = train(&r, m, &train_set, n_train, eval_idx, n_eval, &z);
    free(eval_idx);
    if (z && r.zero == 3 && rc == 0) {
        /* a unit at a time, gathered on every rank, written by rank 0: no rank holds more than
         * one unit's weights beyond its shards */
        if (em_model_save_units(m, r.dir, r.out, train_dist_is_main()) != EM_OK) {
            fprintf(stderr, "%s: rank %d: writing the model: %s\n", tool, train_dist_rank(), em_last_error());
            rc = 1;
        } else {
            fprintf(info_out(), "%s: model written to %s (a file per unit)\n", tool, r.out);
        }
    }
    /* the output folder: rank 0 writes it (at --zero 3, above, every rank takes part) */
    if (rc == 0 && r.full && r.zero < 3 && train_dist_is_main()) {
        /* the trained weights as a full folder beside the checkpoint */
        if (em_model_save_merged(m, r.dir, r.out) != EM_OK) {
            fprintf(stderr, "%s: %s\n", tool, em_last_error());
            rc = 1;
        } else {
            fprintf(stderr, "%s: model written to %s\n", tool, r.out);
        }
    }
    if (z && rc == 0 && train_dist_is_main())
        fprintf(stderr, "%s: rank 0 after writing the model: peak_alloc %.1f MB peak_rss %.1f MB\n", tool,
                (double)em_memory_max_allocated(EM_DEVICE_CPU) / 1048576.0, peak_rss_mb());
    em_model_set_unit_runner(m, NULL, NULL);
    em_zero_free(z);
    if (r.full || !train_dist_is_main()) goto done;
    if (rc == 0 && em_model_lora_save(m, r.out, r.dir) != EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        rc = 1;
    }
    if (rc == 0 && r.merge) {
        char merged[4096];
        snprintf(merged, sizeof merged, "%s/merged", r.out);
        if (em_model_save_merged(m, r.dir, merged) != EM_OK) {
            fprintf(stderr, "%s: %s\n", tool, em_last_error());
            rc = 1;
        }
    }
    if (rc == 0) fprintf(stderr, "%s: adapters written to %s%s\n", tool, r.out, r.merge ? " (merged model in merged/)" : "");
done:
    free(text);
    free(order);
    dataset_free(&d);
    em_lm_free(lm);
    finetune_dist_finish();
    return rc;
}
