/* `ember perplexity` and `ember mem --model MODEL_DIR` on the golden model folders of
 * tests/data/models (scripts/golden_models.py): the command's perplexity is transformers'
 * (the same numbers as tests/test_models.c checks through the library), the memory estimate
 * is em_model_estimate's for the folder's config, and every bad input is exit status 2 (a
 * usage error) or 1 (a folder or file that cannot be read) with a message naming it. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static const char *g_data;     /* tests/data, or $EMBER_TEST_DATA */
static em_safetensors *g_golden;
static char g_dir[64];         /* everything this test writes */
static char out[1 << 16];

static double meta_num(const char *model, const char *key) {
    const char *m = em_safetensors_metadata(g_golden, model);
    size_t kl = strlen(key);
    for (const char *p = m; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') return strtod(p + kl + 1, NULL);
        p = strchr(p, ' ');
        if (p) p++;
    }
    return NAN;
}

/* The number after "key": in a JSON text (the first one), NAN when there is none. */
static double json_num(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* Writes model's perplexity ids to g_dir/<model>.ids, separated as sep says; the count. */
static int64_t write_ids(const char *model, const char *sep) {
    char name[128], path[256];
    snprintf(name, sizeof name, "%s/ppl/ids", model);
    em_scope s = em_scope_begin();
    em_tensor *ids = em_safetensors_get(g_golden, name);
    int64_t n = ids ? em_numel(ids) : 0;
    int64_t *buf = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!ids || !buf || em_copy_to_host(ids, buf, sizeof(int64_t) * (size_t)n) != EM_OK) n = 0;
    snprintf(path, sizeof path, "%s/%s.ids", g_dir, model);
    FILE *f = fopen(path, "w");
    for (int64_t i = 0; f && i < n; i++) fprintf(f, "%lld%s", (long long)buf[i], i + 1 < n ? sep : "\n");
    if (f) fclose(f);
    free(buf);
    em_scope_end(s);
    return f ? n : 0;
}

static void test_perplexity_matches_transformers(void) {
    static const char *const models[] = {"llama", "gpt2", "qwen2"};
    for (int k = 0; k < 3; k++) {
        int64_t n = write_ids(models[k], k == 1 ? ", " : "\n");
        CHECK(n == 300);
        char args[1024];
        /* --dtype left at auto: the config's dtype, as the goldens were computed */
        snprintf(args, sizeof args, "perplexity %s/models/%s %s/%s.ids --ids --max-length %d --stride %d "
                 "--device cpu --json", g_data, models[k], g_dir, models[k], (int)meta_num(models[k], "max_length"),
                 (int)meta_num(models[k], "stride"));
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc != 0) {
            fprintf(stderr, "  ember %s:\n%s\n", args, out);
            continue;
        }
        double nll = json_num(out, "nll"), want = meta_num(models[k], "nll");
        printf("  %s: nll %.8f (transformers in its dtype %.8f), perplexity %.4f\n", models[k], nll, want,
               json_num(out, "perplexity"));
        /* the 16-bit goldens come from the 16-bit model: within its rounding, as test_models */
        double tol = (strstr(em_safetensors_metadata(g_golden, models[k]), "dtype=float32") ? 1e-4 : 2e-3) * want;
        CHECK_NEAR(nll, want, tol);
        CHECK_NEAR(json_num(out, "perplexity"), exp(nll), 1e-9 * exp(nll));
        CHECK(json_num(out, "tokens") == meta_num(models[k], "tokens"));
        CHECK(json_num(out, "ids") == 300);
        CHECK(json_num(out, "max_length") == meta_num(models[k], "max_length"));
        CHECK(json_num(out, "stride") == meta_num(models[k], "stride"));
        char dtype[48];
        const char *meta = em_safetensors_metadata(g_golden, models[k]);
        snprintf(dtype, sizeof dtype, "\"dtype\": \"%.*s\"", (int)strcspn(meta + 6, " "), meta + 6);
        CHECK(!strncmp(meta, "dtype=", 6) && strstr(out, dtype) != NULL);
    }
    /* the text form: the same number, said in words */
    char args[1024];
    snprintf(args, sizeof args, "perplexity %s/models/llama %s/llama.ids --ids --max-length 64 --stride 24",
             g_data, g_dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "LlamaForCausalLM") != NULL);
    const char *p = strstr(out, "\nperplexity: ");
    CHECK(p != NULL);
    if (p) CHECK_NEAR(strtod(p + 13, NULL), meta_num("llama", "ppl"), 1e-4 * meta_num("llama", "ppl"));
    /* the defaults: windows of max_position_embeddings (128) every 64 */
    snprintf(args, sizeof args, "perplexity %s/models/llama %s/llama.ids --ids --json", g_data, g_dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(json_num(out, "max_length") == 128 && json_num(out, "stride") == 64);
    CHECK(json_num(out, "windows") == 4);
}

/* g_dir/<name>: the golden GPT-2 folder's files, linked, with tests/data/tokenizer/<tok>'s
 * tokenizer.json (none when tok is NULL). */
static void folder_with_tokenizer(const char *name, const char *tok) {
    char path[PATH_MAX], src[PATH_MAX + 64], abs_data[PATH_MAX];
    CHECK(realpath(g_data, abs_data) != NULL);
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    CHECK(mkdir(path, 0700) == 0);
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/models/gpt2/%s", abs_data, files[i]);
        snprintf(path, sizeof path, "%s/%s/%s", g_dir, name, files[i]);
        CHECK(symlink(src, path) == 0);
    }
    if (tok) {
        snprintf(src, sizeof src, "%s/tokenizer/%s/tokenizer.json", abs_data, tok);
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", g_dir, name);
        CHECK(symlink(src, path) == 0);
    }
}

/* A text file: the command encodes it with the folder's tokenizer, and its perplexity is the
 * one of the ids the library's tokenizer gives (a BOS and EOS from the template included). */
static void test_perplexity_of_text(void) {
    /* a tokenizer trained on local text whose ids for this text are all within the tiny
     * model's 500 */
    folder_with_tokenizer("with_tokenizer", "misc2");
    static const char text[] = "the cat sat on the mat.\nthe dog sat on the log.\n";
    char path[256], dir[256], args[1024];
    snprintf(dir, sizeof dir, "%s/with_tokenizer", g_dir);
    snprintf(path, sizeof path, "%s/text.txt", g_dir);
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
    em_tokenizer *tok = em_tokenizer_load(dir);
    CHECK(tok != NULL);
    if (!tok) return;
    int64_t ids[256];
    size_t n = 0;
    CHECK_OK(em_tokenizer_encode_i64(tok, text, strlen(text), EM_TOKENIZE_ADD_SPECIAL, ids, 256, &n));
    em_tokenizer_free(tok);
    CHECK(n > 10 && ids[0] == 1 && ids[n - 1] == 2);   /* misc2's template: <s> ... </s> */
    snprintf(path, sizeof path, "%s/text.ids", g_dir);
    f = fopen(path, "w");
    for (size_t i = 0; f && i < n; i++) fprintf(f, "%lld ", (long long)ids[i]);
    if (f) fclose(f);
    snprintf(args, sizeof args, "perplexity %s %s/text.txt --max-length 16 --stride 5 --json", dir, g_dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    double from_text = json_num(out, "nll");
    CHECK(json_num(out, "ids") == (double)n);
    snprintf(args, sizeof args, "perplexity %s %s/text.ids --ids --max-length 16 --stride 5 --json", dir, g_dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    double from_ids = json_num(out, "nll");
    printf("  text: %zu ids, nll %.8f; the same ids given: %.8f\n", n, from_text, from_ids);
    CHECK(isfinite(from_text) && from_text > 0);
    CHECK(from_text == from_ids);
    /* standard input */
    snprintf(args, sizeof args, "perplexity %s - --max-length 16 --stride 5 --json < %s/text.txt", dir, g_dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(json_num(out, "nll") == from_ids);
    /* the folders the bad cases use */
    folder_with_tokenizer("no_tokenizer", NULL);
    folder_with_tokenizer("other_tokenizer", "gpt2");
}

typedef struct bad_case {
    const char *args;  /* after "ember"; "@D" is tests/data, "@T" the test's directory */
    int rc;
    const char *msg;   /* a fragment the output must hold */
} bad_case;

static void expand(const char *s, char *buf, size_t size) {
    size_t n = 0;
    for (; *s && n + 1 < size; s++) {
        if (s[0] == '@' && (s[1] == 'D' || s[1] == 'T')) {
            n += (size_t)snprintf(buf + n, size - n, "%s", s[1] == 'D' ? g_data : g_dir);
            s++;
        } else {
            buf[n++] = *s;
        }
        if (n >= size) n = size - 1;
    }
    buf[n] = '\0';
}

static void test_bad_inputs(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/empty", g_dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/letters.ids", g_dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("1 2 three 4\n", f), fclose(f);
    snprintf(path, sizeof path, "%s/one.ids", g_dir);
    f = fopen(path, "w");
    if (f) fputs("7\n", f), fclose(f);
    snprintf(path, sizeof path, "%s/big.ids", g_dir);
    f = fopen(path, "w");
    if (f) fputs("1 2 3 100000\n", f), fclose(f);
    static const bad_case cases[] = {
        {"perplexity", 2, "expected MODEL_DIR and FILE, got 0 arguments"},
        {"perplexity @D/models/llama", 2, "expected MODEL_DIR and FILE, got 1 argument"},
        {"perplexity @D/models/llama @T/llama.ids @T/llama.ids extra", 2, "unexpected argument"},
        {"perplexity @D/models/llama @T/llama.ids --ids --stride 0", 2, "--stride"},
        {"perplexity @D/models/llama @T/llama.ids --ids --max-length 1", 2, "--max-length"},
        {"perplexity @D/models/llama @T/llama.ids --ids --dtype f64", 2, "--dtype"},
        {"perplexity @D/models/llama @T/llama.ids --ids --device tpu:0", 2, "tpu:0"},
        {"perplexity @T/missing @T/llama.ids --ids", 1, "@T/missing/config.json"},
        {"perplexity @T/empty @T/llama.ids --ids", 1, "@T/empty/config.json"},
        {"perplexity @D/models/llama @T/nothing.ids --ids", 1, "@T/nothing.ids: cannot open"},
        {"perplexity @D/models/llama /dev/zero", 1, "/dev/zero: not a regular file, and it goes on past 1073741824"},
        {"perplexity @D/models/llama @T/empty", 1, "@T/empty: is a folder, not a file"},
        {"tokenize @D/models/llama --file /dev/zero", 1, "/dev/zero: not a regular file, and it goes on past"},
        {"perplexity @D/models/llama @T/letters.ids --ids", 1, "expected token ids"},
        {"perplexity @D/models/llama @T/one.ids --ids", 1, "at least 2"},
        {"perplexity @D/models/llama @T/big.ids --ids", 1, "outside the model's vocabulary"},
        {"perplexity @D/models/gpt2 @T/gpt2.ids --ids --max-length 1000", 1, "n_positions"},
        {"perplexity @T/no_tokenizer @T/text.txt", 1, "@T/no_tokenizer/tokenizer.json: cannot open"},
        {"perplexity @T/no_tokenizer @T/text.txt", 1, "token ids go through --ids"},
        {"perplexity @T/other_tokenizer @T/text.txt", 1, "the folder's tokenizer.json is not the model's"},
        {"mem --model @T/empty", 1, "@T/empty/config.json"},
        {"mem --model @D/models/llama 7B", 2, "not both"},
        {"mem --model @D/models/llama --hidden 64", 2, "config.json"},
        {"mem --model @D/models/llama --batch 2", 2, "--seq"},
        {"mem --model @D/models/llama --checkpoint-activations", 2, "needs --batch and --seq"},
        {"mem --model @D/models/llama --mode sideways", 2, "--mode expects all, inference, full or lora"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024], msg[512];
        expand(cases[i].args, args, sizeof args);
        expand(cases[i].msg, msg, sizeof msg);
        int rc = tool_run(args, out, sizeof out);
        bool ok = rc == cases[i].rc && strstr(out, msg) != NULL;
        CHECK(ok);
        if (!ok) fprintf(stderr, "  ember %s: exit %d (expected %d), wanted '%s' in:\n%s\n", args, rc, cases[i].rc,
                         msg, out);
    }
}

static void test_mem_model_dir(void) {
    static const char *const models[] = {"llama", "qwen2", "gpt2", "mistral"};
    for (int k = 0; k < 4; k++) {
        char dir[512], args[1024];
        snprintf(dir, sizeof dir, "%s/models/%s", g_data, models[k]);
        em_model_config cfg;
        CHECK_OK(em_model_config_load(dir, &cfg));
        snprintf(args, sizeof args, "mem --model %s --batch 2 --seq 48 --json", dir);
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc != 0) {
            fprintf(stderr, "  ember %s:\n%s\n", args, out);
            continue;
        }
        CHECK(json_num(out, "params") == (double)em_model_config_num_parameters(&cfg));
        CHECK(json_num(out, "kv_width") == (double)(cfg.num_key_value_heads * cfg.head_dim));
        CHECK(strstr(out, cfg.architecture) != NULL);
        /* each mode's lines are the library's for the same request (the dtype is the config's) */
        static const char *const mode_names[] = {"inference", "full", "lora"};
        for (int m = 0; m < 3; m++) {
            em_estimate e;
            static const em_estimate_mode modes[] = {EM_ESTIMATE_INFERENCE, EM_ESTIMATE_FULL, EM_ESTIMATE_LORA};
            em_estimate_opts o = {.mode = modes[m], .dtype = cfg.dtype, .optimizer = EM_ESTIMATE_ADAM, .batch = 2,
                                  .seq = 48};
            /* with a batch, LoRA is one step of ember finetune (em_model_estimate_finetune), and so is
             * full fine-tuning of float32 weights (--full) */
            bool full_step = modes[m] == EM_ESTIMATE_FULL && cfg.dtype == EM_F32;
            if (modes[m] == EM_ESTIMATE_LORA || full_step)
                CHECK_OK(em_model_estimate_finetune(&cfg, &(em_finetune_estimate_opts){.batch = 2, .seq = 48,
                                                    .dtype = cfg.dtype, .full = full_step}, &e));
            else
                CHECK_OK(em_model_estimate(&cfg, &o, &e));
            char pat[64];
            snprintf(pat, sizeof pat, "\"mode\": \"%s\"", mode_names[m]);
            const char *at = strstr(out, pat);
            CHECK(at != NULL);
            if (!at) continue;
            CHECK(json_num(at, "total_bytes") == e.bytes[EM_ESTIMATE_TOTAL]);
            CHECK(json_num(at, "trainable_params") == e.trainable_params);
            printf("  %s %s: %.0f bytes, %.0f trainable\n", models[k], mode_names[m], e.bytes[EM_ESTIMATE_TOTAL],
                   e.trainable_params);
        }
    }
    /* --checkpoint-activations: the checkpointed step's estimate */
    char args[1024];
    snprintf(args, sizeof args, "mem --model %s/models/llama --mode lora --batch 2 --seq 48 --checkpoint-activations "
             "--lora-rank 4 --json", g_data);
    CHECK(tool_run(args, out, sizeof out) == 0);
    em_model_config cfg;
    snprintf(args, sizeof args, "%s/models/llama", g_data);
    CHECK_OK(em_model_config_load(args, &cfg));
    em_estimate ck;
    CHECK_OK(em_model_estimate_finetune(&cfg, &(em_finetune_estimate_opts){.batch = 2, .seq = 48, .lora_rank = 4,
                                                                            .checkpoint = true, .dtype = cfg.dtype}, &ck));
    CHECK(json_num(out, "total_bytes") == ck.bytes[EM_ESTIMATE_TOTAL]);
    CHECK(json_num(out, "activations_bytes") == ck.bytes[EM_ESTIMATE_ACTIVATIONS]);
    /* the text form names the shape */
    snprintf(args, sizeof args, "mem --model %s/models/llama --mode inference", g_data);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "LlamaForCausalLM") && strstr(out, "4 heads and 2 key-value heads of 16"));
}

/* ember mem --model DIR --zero S --ranks N: the folder's parameter count through the ZeRO
 * paper's formulas (em_zero_estimate), float32 and mixed precision */
static void test_mem_zero(void) {
    char dir[512], args[1024];
    snprintf(dir, sizeof dir, "%s/models/llama", g_data);
    em_model_config cfg;
    CHECK_OK(em_model_config_load(dir, &cfg));
    double p = (double)em_model_config_num_parameters(&cfg);
    for (int stage = 0; stage <= 3; stage++)
        for (int mixed = 0; mixed < 2; mixed++) {
            snprintf(args, sizeof args, "mem --model %s --mode full --zero %d --ranks 3 --dtype %s --json", dir, stage,
                     mixed ? "bf16" : "f32");
            CHECK(tool_run(args, out, sizeof out) == 0);
            em_zero_memory z;
            CHECK_OK(em_zero_estimate(p, stage, 3, mixed, &z));
            CHECK(json_num(out, "params") == p);
            CHECK(json_num(out, "total_bytes") == z.total);
            /* plain data parallel as em_ddp runs it: a second copy of the gradients in its
             * buckets (test_dist measures that copy) */
            em_zero_memory plain;
            CHECK_OK(em_zero_estimate(p, 0, 3, mixed, &plain));
            CHECK(json_num(out, "ddp_buckets_bytes") == p * (mixed ? 2 : 4));
            CHECK(json_num(out, "ddp_total_bytes") == plain.total + p * (mixed ? 2 : 4));
            /* the paper's per-parameter bytes */
            static const double f32[] = {16, 8 + 8.0 / 3, 4 + 12.0 / 3, 16.0 / 3};
            static const double mix[] = {16, 4 + 12.0 / 3, 2 + 14.0 / 3, 16.0 / 3};
            CHECK_NEAR(z.total / p, mixed ? mix[stage] : f32[stage], 1e-12);
        }
    snprintf(args, sizeof args, "mem --model %s --zero 3 --ranks 4", dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "ZeRO stage 3 over 4 ranks") && strstr(out, "this rank's shard") && strstr(out, "with DDP's buckets"));
    snprintf(args, sizeof args, "mem --model %s --zero 0 --ranks 2 --dtype f32", dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "+ DDP buckets") && strstr(out, "flat copy of every gradient"));
}

int main(void) {
    if (!tool_path()) {
        test_skip_case("test_tool_models", "build/ember is missing next to this test");
        return test_summary();
    }
    g_data = getenv("EMBER_TEST_DATA");
    if (!g_data) g_data = "tests/data";
    char path[512];
    snprintf(path, sizeof path, "%s/models/golden.safetensors", g_data);
    g_golden = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!g_golden) {
        fprintf(stderr, "cannot read %s: %s\n", path, em_last_error());
        return 1;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/ember_tool_models_XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "cannot make a temporary folder: %s\n", strerror(errno));
        return 1;
    }
    RUN(test_perplexity_matches_transformers);
    RUN(test_perplexity_of_text);
    RUN(test_bad_inputs);
    RUN(test_mem_model_dir);
    RUN(test_mem_zero);
    em_safetensors_free(g_golden);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_summary();
}
