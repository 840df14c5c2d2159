/* ember generate: text from a Hugging Face model folder (include/ember/generate.h), streamed
 * as it comes, then what it cost: prompt and generation tokens/s, the weights', the KV cache's
 * and the process's peak memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <ember/ember.h>
#include "commands.h"
#include "mlp.h"       /* mlp_parse_device */
#include "options.h"
#include "text_io.h"

static const char *const tool = "ember generate";

enum {
    G_PROMPT, G_MAX_NEW, G_TEMPERATURE, G_TOP_K, G_TOP_P, G_REPETITION, G_SEED, G_STOP, G_DEVICE, G_DTYPE, G_ADAPTER,
    G_THREADS, G_NO_MMAP, G_JSON
};
static const opt_choice dtype_choices[] = {{"f32", 0}, {"float32", 0}, {"bf16", 1}, {"bfloat16", 1},
                                           {"f16", 2}, {"float16", 2}, {NULL, 0}};
static const opt_spec generate_table[] = {
    [G_PROMPT] = OPTION_STRING("--prompt", "TEXT", "the text to continue (required); the tokenizer's template adds "
                               "its special tokens (a BOS)"),
    [G_MAX_NEW] = OPTION_INT("--max-new-tokens", "N", 1, 1 << 20, "generate at most N tokens (default 64)"),
    [G_TEMPERATURE] = OPTION_DOUBLE("--temperature", "T", 0, 100, "0 (the default): greedy; else draw from "
                                    "softmax(logits / T)"),
    [G_TOP_K] = OPTION_INT("--top-k", "K", 0, INT64_MAX, "draw among the K most likely tokens (0: all, the default)"),
    [G_TOP_P] = OPTION_DOUBLE("--top-p", "P", 0, 1, "draw among the most likely tokens up to probability P (1: all, "
                              "the default)"),
    [G_REPETITION] = OPTION_DOUBLE("--repetition-penalty", "R", 0, 100, "divide the logits of tokens already in the "
                                   "text by R (multiply when negative); 1: none, the default"),
    [G_SEED] = OPTION_INT("--seed", "S", 0, INT64_MAX, "the draws' seed (default 0): the same seed, the same text on "
                          "every device"),
    [G_STOP] = OPTION_STRING("--stop", "STR", "stop once the generated text contains STR"),
    [G_DEVICE] = OPTION_DEVICE("--device", "cpu (default), cuda:N, opencl:N, auto"),
    [G_DTYPE] = OPTION_CHOICE("--dtype", dtype_choices, "the dtype the model computes in (default f32; the weights "
                              "are converted on load when the folder's differ)"),
    [G_ADAPTER] = OPTION_STRING("--adapter", "DIR", "a PEFT LoRA adapter folder (ember finetune's --out, or peft's "
                                "save_pretrained) applied to the model"),
    [G_THREADS] = OPTION_INT("--threads", "N", 1, 4096, "CPU threads (default: every core)"),
    [G_NO_MMAP] = OPTION_FLAG("--no-mmap", "read the weight files into memory (2 MiB pages) instead of mapping "
                              "them: slower to load, a copy of the model in the process, faster to decode on the CPU"),
    [G_JSON] = OPTION_FLAG("--json", "print one JSON object at the end instead of streaming"),
};
OPT_TABLE_FITS(generate_table);

const opt_command generate_options = {
    .name = "ember generate",
    .usage = "ember generate MODEL_DIR --prompt TEXT [options]",
    .about = "Continues a text with a language model from a Hugging Face model folder (config.json, "
             "generation_config.json, model.safetensors or its shards, tokenizer.json): Llama, Mistral, Qwen2 or "
             "GPT-2. The text is printed as it comes, then the prompt's and the generation's tokens/s and the memory "
             "used: the weights, the key-value cache and the process's peak resident memory. Generation stops at "
             "the model's end-of-sequence ids (generation_config.json), at --stop, or after --max-new-tokens.",
    .positional = "MODEL_DIR",
    .positional_help = "a model folder as save_pretrained writes it, with its tokenizer.json",
    .extra = "MODEL_DIR and options (quote a prompt with spaces)",
    .options = generate_table,
    .count = OPT_COUNT(generate_table),
    .epilogue = "The sampling follows transformers' generate(): repetition penalty, then temperature, top-k and "
                "top-p; greedy takes the most likely token. The statistics go to standard error, the text to "
                "standard output. --json prints {\"prompt_tokens\": [ids], \"tokens\": [generated ids], \"text\": "
                "the generated text, \"finish\", \"prompt_tokens_per_s\", \"tokens_per_s\", \"weight_bytes\", "
                "\"kv_cache_bytes\", \"peak_rss_bytes\", ...} (docs/schemas/generate.schema.json).",
    .exit_status = "0 done; 1 the folder cannot be loaded or the generation failed; 2 bad arguments",
};

/* The process's peak resident memory in bytes (Linux reports KiB). */
static double peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? 1024.0 * (double)ru.ru_maxrss : NAN;
}

typedef struct stream_state {
    size_t printed;   /* bytes of text written so far */
} stream_state;

static bool print_piece(int64_t row, int64_t token, const char *text, size_t len, void *user) {
    (void)row;
    (void)token;
    stream_state *s = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    s->printed += len;
    return true;
}

static const char *finish_name(em_finish_reason f) {
    switch (f) {
    case EM_FINISH_LENGTH: return "length";
    case EM_FINISH_EOS: return "eos";
    case EM_FINISH_STOP: return "stop";
    case EM_FINISH_CALLBACK: return "callback";
    }
    return "?";
}

static double per_second(int64_t n, double seconds) { return seconds > 0 ? (double)n / seconds : 0; }

int cmd_generate(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&generate_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    const char *dir = opts.positional;
    if (!dir) return opt_usage_error(&generate_options, stderr, "expected MODEL_DIR (a model folder)");
    if (!v[G_PROMPT].given) return opt_usage_error(&generate_options, stderr, "expected --prompt TEXT");
    if (v[G_STOP].given && !v[G_STOP].text[0]) return opt_usage_error(&generate_options, stderr, "--stop is empty");
    em_device dev = EM_DEVICE_CPU;
    if (v[G_DEVICE].given && !mlp_parse_device(tool, "--device", v[G_DEVICE].text, &dev)) return 2;
    const em_dtype dtypes[] = {EM_F32, EM_BF16, EM_F16};
    em_dtype dtype = v[G_DTYPE].given ? dtypes[v[G_DTYPE].choice] : EM_F32;
    bool json = v[G_JSON].given;
    if (v[G_THREADS].given) em_set_num_threads((int)v[G_THREADS].i);

    em_lm *lm = em_lm_load(dir, &(em_model_opts){.device = dev, .dtype = dtype, .read_weights = v[G_NO_MMAP].given});
    if (!lm) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        return 1;
    }
    if (v[G_ADAPTER].given && em_model_lora_load(em_lm_model(lm), v[G_ADAPTER].text) != EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        em_lm_free(lm);
        return 1;
    }
    const char *stop = v[G_STOP].given ? v[G_STOP].text : NULL;
    stream_state stream = {0};
    em_generate_opts o = {
        .max_new_tokens = v[G_MAX_NEW].given ? v[G_MAX_NEW].i : 64,
        .sampling = {.temperature = v[G_TEMPERATURE].given ? v[G_TEMPERATURE].d : 0,
                     .top_k = v[G_TOP_K].given ? v[G_TOP_K].i : 0,
                     .top_p = v[G_TOP_P].given ? v[G_TOP_P].d : 0,
                     .repetition_penalty = v[G_REPETITION].given ? v[G_REPETITION].d : 0,
                     .seed = v[G_SEED].given ? (uint64_t)v[G_SEED].i : 0},
        .stop = stop ? &stop : NULL,
        .n_stop = stop ? 1 : 0,
        .on_token = json ? NULL : print_piece,
        .user = &stream,
    };
    const char *prompt = v[G_PROMPT].text;
    em_generation g;
    if (!json) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    em_model *m = em_lm_model(lm);
    if (em_lm_generate(lm, &prompt, 1, &o, &g) != EM_OK) {
        if (!json) putchar('\n');
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        em_lm_free(lm);
        return 1;
    }
    const em_generated_row *row = &g.row[0];
    double prompt_tps = per_second(g.prompt_tokens, g.prefill_seconds);
    double tps = per_second(g.decode_tokens, g.decode_seconds);
    double peak = peak_rss_bytes();
    size_t weights = em_model_weight_bytes(m), mapped = em_model_mapped_bytes(m);
    if (json) {
        printf("{\"prompt_tokens\": ");
        tool_json_ids(stdout, row->prompt, row->n_prompt);
        printf(", \"tokens\": ");
        tool_json_ids(stdout, row->tokens, row->n_tokens);
        printf(", \"text\": ");
        tool_json_string(stdout, row->text, row->text_len);
        printf(", \"finish\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"prefill_seconds\": %.6f, "
               "\"decode_seconds\": %.6f, \"decode_tokens\": %lld, \"prompt_tokens_per_s\": %.3f, \"tokens_per_s\": %.3f, "
               "\"weight_bytes\": %zu, \"mapped_bytes\": %zu, \"kv_cache_bytes\": %zu, \"peak_rss_bytes\": %.0f, "
               "\"graph_replays\": %lld, \"cuda_graph\": ",
               finish_name(row->finish), em_device_str(em_model_device(m)).s, em_dtype_name(em_model_dtype(m)),
               g.prefill_seconds, g.decode_seconds, (long long)g.decode_tokens, prompt_tps, tps, weights, mapped,
               g.kv_cache_bytes, peak, (long long)g.graph_replays);
        tool_json_string(stdout, g.decode_graph, strlen(g.decode_graph));
        printf("}\n");
    } else {
        /* what the decoder held back to the end (a character the last token left unfinished) */
        if (row->text_len > stream.printed) fwrite(row->text + stream.printed, 1, row->text_len - stream.printed, stdout);
        putchar('\n');
        fflush(stdout);
        fprintf(stderr, "\nprompt: %lld tokens in %.3f s (%.1f tokens/s)\n", (long long)g.prompt_tokens,
                g.prefill_seconds, prompt_tps);
        fprintf(stderr, "generated: %lld tokens (%s), %lld after the first in %.3f s (%.2f tokens/s)\n",
                (long long)row->n_tokens, finish_name(row->finish), (long long)g.decode_tokens, g.decode_seconds, tps);
        fprintf(stderr, "memory: weights %.1f MB (%.1f MB mapped from the files), KV cache %.1f MB, peak RSS %.1f MB\n",
                weights / 1e6, mapped / 1e6, g.kv_cache_bytes / 1e6, peak / 1e6);
        fprintf(stderr, "cuda graph: %s\n", g.decode_graph);
    }
    int rc = 0;
    if (fflush(stdout) != 0) {
        fprintf(stderr, "%s: could not write the output\n", tool);
        rc = 1;
    }
    em_generation_free(&g);
    em_lm_free(lm);
    return rc;
}
