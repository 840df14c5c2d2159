/* ember perplexity: the mean negative log-likelihood and the perplexity of a token sequence
 * under a model folder, by transformers' strided windows (em_model_perplexity,
 * include/ember/models.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>
#include "commands.h"
#include "mlp.h"
#include "options.h"
#include "text_io.h"

static const char *const tool = "ember perplexity";

enum { P_IDS, P_MAX_LENGTH, P_STRIDE, P_DEVICE, P_DTYPE, P_JSON };
enum { DT_AUTO = -1 };
static const opt_choice dtype_choices[] = {
    {"auto", DT_AUTO}, {"f32", EM_F32}, {"float32", EM_F32}, {"bf16", EM_BF16}, {"bfloat16", EM_BF16},
    {"f16", EM_F16}, {"float16", EM_F16}, {NULL, 0},
};
static const opt_spec perplexity_table[] = {
    [P_IDS] = OPTION_FLAG("--ids", "FILE holds token ids (whole numbers separated by white space or commas) "
                                   "instead of text"),
    [P_MAX_LENGTH] = OPTION_INT("--max-length", "N", 2, 1 << 30,
                                "tokens per window (default: the model's max_position_embeddings, n_positions "
                                "for GPT-2)"),
    [P_STRIDE] = OPTION_INT("--stride", "N", 1, 1 << 30, "tokens between the windows' starts (default: half of "
                                                          "--max-length)"),
    [P_DEVICE] = OPTION_DEVICE("--device", "auto (default), cpu, cuda:N, opencl:N"),
    [P_DTYPE] = {.name = "--dtype", .kind = OPT_CHOICE, .choices = dtype_choices, .flags = OPT_NOCASE,
                 .help = "the dtype to compute in (default auto: the config's dtype)"},
    [P_JSON] = OPTION_FLAG("--json", "one JSON object: the model, the windows, the tokens scored, nll and perplexity"),
};
OPT_TABLE_FITS(perplexity_table);

const opt_command perplexity_options = {
    .name = "ember perplexity",
    .usage = "ember perplexity MODEL_DIR FILE [options]\nember perplexity MODEL_DIR FILE --ids [options]",
    .about = "The mean negative log-likelihood (nats per token) and the perplexity of a text under a Hugging Face "
             "model folder (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel), computed as "
             "transformers' perplexity guide computes it: windows of --max-length tokens every --stride tokens, each "
             "scoring the tokens after the previous window's end with the ones before as context.",
    .positional = "MODEL_DIR FILE",
    .max_positional = 2,
    .positional_help = "the model folder (config.json, model.safetensors or its shards); then the text's file (- for "
                       "standard input)",
    .extra = "MODEL_DIR and one FILE",
    .options = perplexity_table,
    .count = OPT_COUNT(perplexity_table),
    .epilogue = "The text is encoded with the folder's tokenizer.json as transformers' tokenizer(text) encodes it: "
                "with the special tokens its template adds (a BOS), and special tokens written in the text read as "
                "such. Ids from elsewhere (another tokenizer, a data set's own ids) go through --ids.",
    .exit_status = "0 done; 1 the model or the file cannot be read, or the computation failed; 2 bad arguments",
};

/* Ids written as decimal numbers separated by white space or commas: 0 and the ids, or a
 * message and 1. */
static int parse_ids(const char *path, const char *s, int64_t **out, int64_t *n) {
    size_t cap = 1024;
    int64_t *v = malloc(cap * sizeof *v);
    *n = 0;
    for (const char *p = s; v;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        if (*p < '0' || *p > '9') {
            fprintf(stderr, "%s: %s: expected token ids (whole numbers separated by white space or commas), found "
                    "'%.20s' at byte %zu\n", tool, path, p, (size_t)(p - s));
            free(v);
            return 1;
        }
        errno = 0;
        char *end;
        unsigned long long id = strtoull(p, &end, 10);
        if (errno || id > INT64_MAX) {
            fprintf(stderr, "%s: %s: the id '%.*s' is too large\n", tool, path, (int)(end - p), p);
            free(v);
            return 1;
        }
        if ((size_t)*n == cap) {
            int64_t *nv = realloc(v, cap * 2 * sizeof *nv);
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[(*n)++] = (int64_t)id;
        p = end;
    }
    if (!v) {
        fprintf(stderr, "%s: out of memory reading %s\n", tool, path);
        return 1;
    }
    *out = v;
    return 0;
}

/* The ids of text under the folder's tokenizer, as tokenizer(text).input_ids: 0, or a message
 * and 1. */
static int encode_text(const char *dir, const char *path, const char *text, size_t len, int64_t **out, int64_t *n) {
    em_tokenizer *tok = em_tokenizer_load(dir);
    if (!tok) {
        fprintf(stderr, "%s: %s (the text needs the model's tokenizer; token ids go through --ids)\n", tool,
                em_last_error());
        return 1;
    }
    size_t count = 0;
    int64_t *ids = NULL;
    em_status st = em_tokenizer_encode_i64(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, NULL, 0, &count);
    if (st == EM_OK) {
        ids = malloc(sizeof *ids * (count ? count : 1));
        if (!ids) st = em_error(EM_ERR_OUT_OF_MEMORY, "out of memory for %zu token ids", count);
    }
    if (st == EM_OK) st = em_tokenizer_encode_i64(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, ids, count, &count);
    em_tokenizer_free(tok);
    if (st != EM_OK) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, em_last_error());
        free(ids);
        return 1;
    }
    *out = ids;
    *n = (int64_t)count;
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_perplexity(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&perplexity_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    if (opts.nargs != 2)
        return opt_usage_error(&perplexity_options, stderr, "expected MODEL_DIR and FILE, got %d argument%s",
                               opts.nargs, opts.nargs == 1 ? "" : "s");
    const char *dir = opts.args[0], *file = opts.args[1];
    em_device device;
    if (!mlp_parse_device(tool, "--device", v[P_DEVICE].given ? v[P_DEVICE].text : "auto", &device)) return 2;
    size_t len;
    char *text = tool_read_all(tool, file, &len);
    if (!text) return 1;
    int64_t *ids = NULL, n = 0;
    if (v[P_IDS].given) {
        int rc = parse_ids(file, text, &ids, &n);
        free(text);
        if (rc) return rc;
    } else {
        int rc = encode_text(dir, file, text, len, &ids, &n);
        free(text);
        if (rc) return rc;
    }
    if (n < 2) {
        fprintf(stderr, "%s: %s: %lld token id%s: a perplexity needs at least 2\n", tool, file, (long long)n,
                n == 1 ? "" : "s");
        free(ids);
        return 1;
    }
    int dt = v[P_DTYPE].given ? v[P_DTYPE].choice : DT_AUTO;
    double t0 = now();
    em_model *m = em_model_load(dir, &(em_model_opts){.device = device, .dtype = dt == DT_AUTO ? EM_F32 : (em_dtype)dt,
                                                      .dtype_auto = dt == DT_AUTO});
    if (!m) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        free(ids);
        return 1;
    }
    const em_model_config *cfg = em_model_config_of(m);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= cfg->vocab_size) {
            fprintf(stderr, "%s: %s: id %lld at position %lld is outside the model's vocabulary of %lld%s\n", tool,
                    file, (long long)ids[i], (long long)i, (long long)cfg->vocab_size,
                    v[P_IDS].given ? "" : " (the folder's tokenizer.json is not the model's)");
            em_model_free(m);
            free(ids);
            return 1;
        }
    double loaded = now();
    em_perplexity_opts po = {.max_length = v[P_MAX_LENGTH].i, .stride = v[P_STRIDE].i};
    int64_t max_length = po.max_length ? po.max_length : cfg->max_position_embeddings;
    int64_t stride = po.stride ? po.stride : (max_length + 1) / 2;
    em_perplexity r;
    em_status st = em_model_perplexity(m, ids, n, &po, &r);
    double done = now();
    if (st != EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
    } else if (v[P_JSON].given) {
        printf("{\"model\": ");
        tool_json_string(stdout, dir, strlen(dir));
        printf(", \"architecture\": ");
        tool_json_string(stdout, cfg->architecture, strlen(cfg->architecture));
        printf(", \"device\": \"%s\", \"dtype\": \"%s\", \"ids\": %lld, \"max_length\": %lld, \"stride\": %lld, "
               "\"windows\": %lld, \"tokens\": %lld, \"nll\": %.17g, \"perplexity\": %.17g, \"load_seconds\": %.3f, "
               "\"seconds\": %.3f}\n", em_device_str(em_model_device(m)).s, em_dtype_name(em_model_dtype(m)),
               (long long)n, (long long)max_length, (long long)stride, (long long)r.windows, (long long)r.tokens, r.nll,
               r.perplexity, loaded - t0, done - loaded);
    } else {
        printf("%s: %s (%s, %s on %s): %lld ids, windows of %lld every %lld: %lld window%s, %lld tokens scored "
               "in %.2f s\n", tool, dir, cfg->architecture, em_dtype_name(em_model_dtype(m)),
               em_device_str(em_model_device(m)).s, (long long)n, (long long)max_length, (long long)stride,
               (long long)r.windows, r.windows == 1 ? "" : "s", (long long)r.tokens, done - loaded);
        printf("mean negative log-likelihood: %.6f nats per token\nperplexity: %.4f\n", r.nll, r.perplexity);
    }
    em_model_free(m);
    free(ids);
    return st == EM_OK ? 0 : 1;
}
