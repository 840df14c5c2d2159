/* Generation against transformers (tests/data/models/golden_generate.safetensors, from
 * scripts/golden_generate.py), on every available device:
 *   - greedy continuations of 32 tokens identical to generate(do_sample=False) in float32
 *     for Llama (GQA, llama3 rope), Qwen2 (its bfloat16 folder loaded as float32) and GPT-2,
 *     and with repetition_penalty=1.3; the prompts' ids through em_lm_tokenize;
 *   - the prompts as one left-padded batch give each the tokens it gets alone;
 *   - the logits processors on fixed logits against transformers' (penalty, temperature,
 *     top-k, top-p, all four in generate()'s order);
 *   - a seed gives the same draws twice and on every device; top-k 1 is greedy;
 *   - end-of-sequence ids, stop strings, a callback that stops, the streamed pieces;
 *   - bad arguments: an error that says what is wrong, nothing left allocated (ASan). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"
#include "tool_run.h"

static const char *g_data;
static em_safetensors *g_golden;
static em_device g_devs[4];
static int g_ndev;

static const char *MODELS[] = {"llama", "qwen2", "gpt2"};
#define NMODELS 3
#define NPROMPTS 3

static void folder(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/models/%s", g_data, name); }

/* A golden int64 vector as a malloc'ed array (*n its length); NULL when missing. */
static int64_t *golden_ids(const char *key, int64_t *n) {
    em_scope s = em_scope_begin();   /* the tensors' references end here */
    em_tensor *t = em_safetensors_get(g_golden, key);
    int64_t *v = t ? malloc(sizeof *v * (size_t)(em_numel(t) + 1)) : NULL;
    if (v) *n = em_numel(t);
    if (v && em_copy_to_host(em_to_dtype(t, EM_I64), v, sizeof *v * (size_t)*n) != EM_OK) {
        free(v);
        v = NULL;
    }
    em_scope_end(s);
    return v;
}

static float *golden_f32(const char *key, int64_t *n) {
    em_scope s = em_scope_begin();
    em_tensor *t = em_safetensors_get(g_golden, key);
    float *v = t ? malloc(sizeof *v * (size_t)em_numel(t)) : NULL;
    if (v) *n = em_numel(t);
    if (v && em_copy_to_host(t, v, sizeof *v * (size_t)*n) != EM_OK) {
        free(v);
        v = NULL;
    }
    em_scope_end(s);
    return v;
}

static em_lm *load_lm(const char *name, em_device dev) {
    char dir[512];
    folder(dir, sizeof dir, name);
    em_lm *lm = em_lm_load(dir, &(em_model_opts){.device = dev, .dtype = EM_F32});
    if (!lm) fprintf(stderr, "  load %s on %s: %s\n", name, em_device_str(dev).s, em_last_error());
    return lm;
}

static bool same_ids(const int64_t *a, int64_t na, const int64_t *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, sizeof *a * (size_t)na) == 0);
}

static void print_ids(const char *label, const int64_t *v, int64_t n) {
    fprintf(stderr, "    %s:", label);
    for (int64_t i = 0; i < n; i++) fprintf(stderr, " %lld", (long long)v[i]);
    fprintf(stderr, "\n");
}

/* The prompts of model `name` from the golden data, and their texts from its metadata. */
typedef struct prompts {
    int64_t *ids[NPROMPTS], len[NPROMPTS];
    char text[NPROMPTS][256];
} prompts;

static bool read_prompts(const char *name, prompts *p) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < NPROMPTS; i++) {
        char key[64];
        snprintf(key, sizeof key, "gen/%s/prompt/%d", name, i);
        if (!(p->ids[i] = golden_ids(key, &p->len[i]))) return false;
        snprintf(key, sizeof key, "prompt/%d", i);
        const char *text = em_safetensors_metadata(g_golden, key);
        if (!text) return false;
        snprintf(p->text[i], sizeof p->text[i], "%s", text);
    }
    return true;
}

static void free_prompts(prompts *p) {
    for (int i = 0; i < NPROMPTS; i++) free(p->ids[i]);
}

/* Greedy, and greedy with the repetition penalty, identical to transformers for every model,
 * prompt and device; each prompt alone and the three as one padded batch. */
static void test_greedy_golden(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int mi = 0; mi < NMODELS; mi++) {
            em_lm *lm = load_lm(MODELS[mi], g_devs[d]);
            CHECK(lm != NULL);
            prompts p;
            CHECK(read_prompts(MODELS[mi], &p));
            for (int c = 0; lm && c < 2; c++) {
                const char *kase = c ? "rep" : "greedy";
                em_generate_opts o = {.max_new_tokens = 32, .sampling.repetition_penalty = c ? 1.3 : 0};
                int64_t *want[NPROMPTS] = {0}, nwant[NPROMPTS] = {0};
                for (int i = 0; i < NPROMPTS; i++) {
                    char key[64];
                    snprintf(key, sizeof key, "gen/%s/%s/%d", MODELS[mi], kase, i);
                    want[i] = golden_ids(key, &nwant[i]);
                    CHECK(want[i] != NULL);
                    if (!want[i]) continue;
                    /* the prompt as em_lm_tokenize reads the text */
                    int64_t *ids = NULL, n = 0;
                    CHECK_OK(em_lm_tokenize(lm, p.text[i], &ids, &n));
                    CHECK(same_ids(ids, n, p.ids[i], p.len[i]));
                    free(ids);
                    em_generation g;
                    const char *text = p.text[i];
                    CHECK_OK(em_lm_generate(lm, &text, 1, &o, &g));
                    bool ok = g.rows == 1 && same_ids(g.row[0].tokens, g.row[0].n_tokens, want[i], nwant[i]);
                    if (!ok) {
                        fprintf(stderr, "  %s %s prompt %d on %s:\n", MODELS[mi], kase, i,
                                em_device_str(g_devs[d]).s);
                        if (g.rows) print_ids("ember", g.row[0].tokens, g.row[0].n_tokens);
                        print_ids("transformers", want[i], nwant[i]);
                    }
                    CHECK(ok);
                    CHECK(g.prompt_tokens == p.len[i] && g.generated_tokens == nwant[i]);
                    CHECK(g.rows && g.row[0].finish == (nwant[i] == 32 ? EM_FINISH_LENGTH : EM_FINISH_EOS));
                    CHECK(g.steps == nwant[i] - 1 && g.kv_cache_bytes > 0);
                    em_generation_free(&g);
                }
                /* the three at once, left-padded: each row as alone */
                em_generation g;
                CHECK_OK(em_generate(em_lm_model(lm), em_lm_tokenizer(lm), (const int64_t *const *)p.ids, p.len,
                                     NPROMPTS, &o, &g));
                for (int i = 0; i < NPROMPTS && g.rows == NPROMPTS; i++) {
                    bool ok = want[i] && same_ids(g.row[i].tokens, g.row[i].n_tokens, want[i], nwant[i]);
                    if (!ok) {
                        fprintf(stderr, "  %s %s batch row %d on %s:\n", MODELS[mi], kase, i,
                                em_device_str(g_devs[d]).s);
                        print_ids("ember", g.row[i].tokens, g.row[i].n_tokens);
                    }
                    CHECK(ok);
                }
                em_generation_free(&g);
                for (int i = 0; i < NPROMPTS; i++) free(want[i]);
            }
            free_prompts(&p);
            em_lm_free(lm);
            em_clear_error();
        }
}

/* Each processor and all four in order against transformers' on fixed logits. */
static void test_processors(void) {
    int64_t n = 0, nc = 0;
    float *logits = golden_f32("proc/logits", &n);
    int64_t *context = golden_ids("proc/context", &nc);
    CHECK(logits && context);
    if (!logits || !context) {
        free(logits);
        free(context);
        return;
    }
    const int64_t rows = 4, vocab = n / rows, nctx = nc / rows;
    struct { const char *name; em_sampling s; } cases[] = {
        {"rep", {.repetition_penalty = 1.5}},
        {"temp", {.temperature = 0.7}},
        {"topk", {.temperature = 1, .top_k = 10}},
        {"topp", {.temperature = 1, .top_p = 0.9}},
        {"all", {.repetition_penalty = 1.2, .temperature = 0.8, .top_k = 50, .top_p = 0.8}},
    };
    float *got = malloc(sizeof *got * (size_t)n);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char key[64];
        snprintf(key, sizeof key, "proc/%s", cases[c].name);
        int64_t nw = 0;
        float *want = golden_f32(key, &nw);
        CHECK(want && nw == n);
        if (!want || nw != n) {
            free(want);
            continue;
        }
        memcpy(got, logits, sizeof *got * (size_t)n);
        int64_t kept = 0, wrong = 0;
        double worst = 0;
        for (int64_t r = 0; r < rows; r++) {
            em_sampling s = cases[c].s;
            if (!strcmp(cases[c].name, "rep")) s.temperature = 0;   /* the penalty alone: as greedy applies it */
            CHECK_OK(em_logits_process(got + r * vocab, vocab, context + r * nctx, nctx, &s));
        }
        for (int64_t i = 0; i < n; i++) {
            if (isinf(want[i]) != isinf(got[i])) {
                wrong++;
                continue;
            }
            if (isinf(want[i])) continue;
            kept++;
            double e = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1e-30);
            if (e > worst) worst = e;
        }
        if (wrong || worst > 1e-6)
            fprintf(stderr, "  %s: %lld entries removed differently, worst relative error %g\n", cases[c].name,
                    (long long)wrong, worst);
        CHECK(wrong == 0 && worst <= 1e-6);
        /* a processor that removes must have removed some and kept some */
        if (cases[c].s.top_k || cases[c].s.top_p) CHECK(kept > 0 && kept < n);
        free(want);
    }
    free(got);
    free(logits);
    free(context);
}

/* Same seed, same tokens (twice, and on every device); another seed, other tokens; top-k 1
 * is greedy. */
static void test_sampling_seed(void) {
    prompts p;
    CHECK(read_prompts("llama", &p));
    int64_t nwant = 0;
    int64_t *greedy = golden_ids("gen/llama/greedy/0", &nwant);
    int64_t *first = NULL, nfirst = 0;
    for (int d = 0; d < g_ndev; d++) {
        em_lm *lm = load_lm("llama", g_devs[d]);
        CHECK(lm != NULL);
        if (!lm) continue;
        const int64_t *ids0 = p.ids[0];
        em_generate_opts o = {.max_new_tokens = 32, .ignore_eos = true,
                              .sampling = {.temperature = 0.9, .top_k = 40, .top_p = 0.95, .seed = 1234}};
        em_generation a, b, c;
        CHECK_OK(em_generate(em_lm_model(lm), NULL, &ids0, &p.len[0], 1, &o, &a));
        CHECK_OK(em_generate(em_lm_model(lm), NULL, &ids0, &p.len[0], 1, &o, &b));
        o.sampling.seed = 99;
        CHECK_OK(em_generate(em_lm_model(lm), NULL, &ids0, &p.len[0], 1, &o, &c));
        if (a.rows && b.rows && c.rows) {
            CHECK(a.row[0].n_tokens == 32 && a.row[0].text == NULL);
            CHECK(same_ids(a.row[0].tokens, a.row[0].n_tokens, b.row[0].tokens, b.row[0].n_tokens));
            CHECK(!same_ids(a.row[0].tokens, a.row[0].n_tokens, c.row[0].tokens, c.row[0].n_tokens));
            CHECK(!same_ids(a.row[0].tokens, a.row[0].n_tokens, greedy, nwant));
            if (!first) {
                nfirst = a.row[0].n_tokens;
                first = malloc(sizeof *first * (size_t)nfirst);
                memcpy(first, a.row[0].tokens, sizeof *first * (size_t)nfirst);
            } else {
                bool ok = same_ids(first, nfirst, a.row[0].tokens, a.row[0].n_tokens);
                if (!ok) {
                    fprintf(stderr, "  seed 1234 on %s differs from the CPU:\n", em_device_str(g_devs[d]).s);
                    print_ids("cpu", first, nfirst);
                    print_ids("here", a.row[0].tokens, a.row[0].n_tokens);
                }
                CHECK(ok);
            }
        }
        em_generation_free(&a);
        em_generation_free(&b);
        em_generation_free(&c);
        /* top-k 1 keeps the largest logit only: the draw is the argmax */
        o.sampling = (em_sampling){.temperature = 1.5, .top_k = 1, .seed = 5};
        o.ignore_eos = false;
        CHECK_OK(em_generate(em_lm_model(lm), NULL, &ids0, &p.len[0], 1, &o, &a));
        CHECK(a.rows && greedy && same_ids(a.row[0].tokens, a.row[0].n_tokens, greedy, nwant));
        em_generation_free(&a);
        em_lm_free(lm);
    }
    free(first);
    free(greedy);
    free_prompts(&p);
}

/* A draw follows the distribution: with two tokens of probability 0.25 and 0.75, the counts
 * over 4000 counters come within a few standard deviations. */
static void test_draw_distribution(void) {
    float scores[3] = {logf(0.25f), -INFINITY, logf(0.75f)};
    em_sampling s = {.temperature = 1, .seed = 42};
    int count[3] = {0};
    for (uint64_t c = 0; c < 4000; c++) {
        int64_t id = em_sample_token(scores, 3, &s, c);
        CHECK(id == 0 || id == 2);
        if (id >= 0 && id < 3) count[id]++;
    }
    CHECK(count[1] == 0 && fabs((double)count[0] - 1000) < 4 * sqrt(4000 * 0.25 * 0.75));
    CHECK(em_sample_token(scores, 3, &s, 7) == em_sample_token(scores, 3, &s, 7));
    CHECK(em_sample_token(scores, 3, NULL, 7) == 2);   /* greedy */
}

typedef struct pieces {
    char text[4096];
    size_t len;
    int calls, stop_after;
    int64_t last_row;
} pieces;

static bool collect(int64_t row, int64_t token, const char *text, size_t len, void *user) {
    pieces *p = user;
    (void)token;
    p->last_row = row;
    if (p->len + len < sizeof p->text) {
        memcpy(p->text + p->len, text, len);
        p->len += len;
        p->text[p->len] = '\0';
    }
    return ++p->calls != p->stop_after;
}

/* End-of-sequence ids, stop strings, and the callback: its pieces make the text, and it can
 * stop the generation. */
static void test_stops_and_callback(void) {
    em_lm *lm = load_lm("gpt2", EM_DEVICE_CPU);
    CHECK(lm != NULL);
    if (!lm) return;
    prompts p;
    CHECK(read_prompts("gpt2", &p));
    int64_t n = 0;
    int64_t *greedy = golden_ids("gen/gpt2/greedy/2", &n);
    CHECK(greedy && n == 32);
    const char *text = p.text[2];
    if (!greedy || n != 32) goto done;

    /* the pieces put together are the text; the text is the decode of the tokens */
    pieces got = {.stop_after = -1};
    em_generation g;
    CHECK_OK(em_lm_generate(lm, &text, 1, &(em_generate_opts){.max_new_tokens = 32, .on_token = collect,
                                                               .user = &got}, &g));
    char full[4096];
    size_t flen = 0;
    CHECK_OK(em_tokenizer_decode_i64(em_lm_tokenizer(lm), greedy, 32, EM_DECODE_SKIP_SPECIAL, full, sizeof full,
                                     &flen));
    CHECK(g.rows == 1 && got.calls == 32 && g.row[0].text_len == flen && !strcmp(g.row[0].text, full));
    CHECK(got.len == flen && !strcmp(got.text, full));
    em_generation_free(&g);

    /* the callback stops after 5 tokens */
    got = (pieces){.stop_after = 5};
    CHECK_OK(em_lm_generate(lm, &text, 1, &(em_generate_opts){.max_new_tokens = 32, .on_token = collect,
                                                               .user = &got}, &g));
    CHECK(g.rows == 1 && g.row[0].n_tokens == 5 && g.row[0].finish == EM_FINISH_CALLBACK && g.steps == 4);
    CHECK(g.rows && same_ids(g.row[0].tokens, 5, greedy, 5));
    em_generation_free(&g);

    /* an end-of-sequence id: the row ends at its first appearance, keeping it */
    int64_t eos = greedy[20], first = 20;
    for (int64_t i = 0; i < 20; i++)
        if (greedy[i] == eos) {
            first = i;
            break;
        }
    CHECK_OK(em_lm_generate(lm, &text, 1, &(em_generate_opts){.max_new_tokens = 32, .eos_ids = &eos, .n_eos = 1},
                            &g));
    CHECK(g.rows == 1 && g.row[0].n_tokens == first + 1 && g.row[0].finish == EM_FINISH_EOS);
    CHECK(g.rows && g.row[0].tokens[first] == eos);
    em_generation_free(&g);

    /* a stop string: three bytes that the 13th token's text ends; the row ends at the first
     * token whose text completes it, wherever that is */
    char prefix[4096];
    size_t plen = 0, before = 0;
    CHECK_OK(em_tokenizer_decode_i64(em_lm_tokenizer(lm), greedy, 13, EM_DECODE_SKIP_SPECIAL, prefix, sizeof prefix,
                                     &plen));
    CHECK(plen >= 3);
    char stop[4] = {0};
    memcpy(stop, prefix + plen - 3, 3);
    int64_t expect = -1;
    for (int64_t k = 1; k <= 13 && expect < 0; k++) {
        em_tokenizer_decode_i64(em_lm_tokenizer(lm), greedy, (size_t)k, EM_DECODE_SKIP_SPECIAL, prefix,
                                sizeof prefix, &before);
        if (strstr(prefix, stop)) expect = k;
    }
    const char *stops[] = {"never appears \x01", stop};
    CHECK_OK(em_lm_generate(lm, &text, 1, &(em_generate_opts){.max_new_tokens = 32, .stop = stops, .n_stop = 2},
                            &g));
    CHECK(g.rows == 1 && g.row[0].n_tokens == expect && g.row[0].finish == EM_FINISH_STOP);
    CHECK(g.rows && strstr(g.row[0].text, stop) != NULL);
    em_generation_free(&g);

    /* ignore_eos with the model's own end-of-sequence id as the first token's id */
    eos = greedy[0];
    CHECK_OK(em_lm_generate(lm, &text, 1, &(em_generate_opts){.max_new_tokens = 6, .eos_ids = &eos, .n_eos = 1,
                                                               .ignore_eos = true}, &g));
    CHECK(g.rows == 1 && g.row[0].n_tokens == 6 && g.row[0].finish == EM_FINISH_LENGTH);
    em_generation_free(&g);
done:
    free(greedy);
    free_prompts(&p);
    em_lm_free(lm);
}

/* Bad arguments: an error saying what was expected, and nothing allocated (ASan checks). */
static void test_bad_arguments(void) {
    em_lm *lm = load_lm("gpt2", EM_DEVICE_CPU);
    CHECK(lm != NULL);
    if (!lm) return;
    em_model *m = em_lm_model(lm);
    const em_tokenizer *tok = em_lm_tokenizer(lm);
    int64_t ids[3] = {5, 6, 7}, len = 3, bad_id[1] = {500}, zero = 0;
    const int64_t *pp = ids, *pbad = bad_id;
    em_generation g;
    CHECK(em_generate(NULL, tok, &pp, &len, 1, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'m' is NULL");
    CHECK(em_generate(m, tok, &pp, &len, 0, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rows must be at least 1");
    CHECK(em_generate(m, tok, &pp, &len, 1, NULL, NULL) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'out' is NULL");
    CHECK(em_generate(m, tok, &pp, &zero, 1, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "prompt 0 has no ids");
    int64_t one = 1;
    CHECK(em_generate(m, tok, &pbad, &one, 1, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "outside the model's vocabulary [0, 500)");
    struct { em_generate_opts o; const char *msg; } bad[] = {
        {{.max_new_tokens = -1}, "max_new_tokens must be at least 1"},
        {{.sampling.temperature = -1}, "temperature must be 0 (greedy) or a positive number, got -1"},
        {{.sampling.temperature = NAN}, "temperature must be"},
        {{.sampling.top_k = -3}, "top_k must be 0 (all tokens) or positive, got -3"},
        {{.sampling.top_p = 1.5}, "top_p must be in [0, 1]"},
        {{.sampling.repetition_penalty = -2}, "repetition_penalty must be a positive number"},
        {{.n_eos = 2}, "eos_ids must hold n_eos (2) ids"},
        {{.n_stop = 1}, "stop must hold n_stop (1) strings"},
        {{.stop = (const char *[]){""}, .n_stop = 1}, "stop string 0 is empty"},
        {{.max_new_tokens = 200}, "GPT-2 has 128 (n_positions)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&g, 0xAB, sizeof g);
        CHECK(em_generate(m, tok, &pp, &len, 1, &bad[i].o, &g) != EM_OK);
        CHECK_ERROR(EM_ERR_ARGUMENT, bad[i].msg);
        CHECK(g.rows == 0 && g.row == NULL);   /* zeroed on error */
    }
    CHECK(em_generate(m, NULL, &pp, &len, 1, &(em_generate_opts){.stop = (const char *[]){"x"}, .n_stop = 1}, &g) !=
          EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "needs a tokenizer");
    const char *null_prompt = NULL;
    CHECK(em_lm_generate(lm, &null_prompt, 1, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "prompt 0 is NULL");
    const char *empty = "";
    CHECK(em_lm_generate(lm, &empty, 1, NULL, &g) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "encodes to no ids");
    float all_removed[2] = {-INFINITY, -INFINITY};
    CHECK(em_sample_token(all_removed, 2, NULL, 0) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no token is left");
    CHECK(em_logits_process(NULL, 5, NULL, 0, NULL) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected scores");
    em_generation_free(NULL);
    em_lm_free(lm);

    /* a folder without a tokenizer.json, and no folder: nothing stays loaded */
    char dir[512];
    folder(dir, sizeof dir, "mistral");
    CHECK(em_lm_load(dir, NULL) == NULL);
    CHECK_ERROR(EM_ERR_IO, "tokenizer.json");
    CHECK(em_lm_load("/nonexistent/model", NULL) == NULL);
    CHECK(em_failed());
    em_clear_error();
    CHECK(em_lm_load(NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "dir is NULL");
}

/* ember generate: the text streamed then the numbers; --json's object; bad options. */
static void test_command(void) {
    if (!tool_path()) SKIP("build/ember is not built next to the tests");
    char dir[512], args[1024];
    static char out[1 << 16];
    folder(dir, sizeof dir, "gpt2");
    snprintf(args, sizeof args, "generate '%s' --prompt 'int main(void) { return 0; }\nstatic' --max-new-tokens 8 "
             "--temperature 0 --json", dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    int64_t n = 0;
    int64_t *want = golden_ids("gen/gpt2/greedy/1", &n);
    char expect[512] = "\"tokens\": [";
    for (int i = 0; want && i < 8; i++)
        snprintf(expect + strlen(expect), sizeof expect - strlen(expect), "%s%lld", i ? ", " : "", (long long)want[i]);
    strcat(expect, "]");
    if (!strstr(out, expect)) fprintf(stderr, "  want %s in:\n%s\n", expect, out);
    CHECK(strstr(out, expect) != NULL);
    CHECK(strstr(out, "\"prompt_tokens\": [") != NULL && strstr(out, "\"tokens_per_s\": ") != NULL);
    CHECK(strstr(out, "\"kv_cache_bytes\": ") != NULL && strstr(out, "\"finish\": \"length\"") != NULL);
    /* on the CPU the decode steps stay eager: the note says so, and why */
    CHECK(strstr(out, "\"graph_replays\": 0, \"cuda_graph\": \"off (") != NULL);
    free(want);

    snprintf(args, sizeof args, "generate '%s' --prompt 'The quick' --max-new-tokens 5 --seed 3 --temperature 0.8 "
             "--top-k 20 --top-p 0.9 --repetition-penalty 1.1", dir);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "cuda graph: off (") != NULL);
    CHECK(strstr(out, "prompt:") != NULL && strstr(out, "tokens/s") != NULL && strstr(out, "peak RSS") != NULL);
    CHECK(strstr(out, "KV cache") != NULL);

    snprintf(args, sizeof args, "generate '%s' --prompt x --top-p 2", dir);
    CHECK(tool_run(args, out, sizeof out) == 2);
    snprintf(args, sizeof args, "generate '%s'", dir);
    CHECK(tool_run(args, out, sizeof out) == 2 && strstr(out, "--prompt") != NULL);
    CHECK(tool_run("generate /nonexistent/model --prompt x", out, sizeof out) == 1);
    CHECK(strstr(out, "/nonexistent/model") != NULL);
}

int main(void) {
    g_data = getenv("EMBER_TEST_DATA");
    if (!g_data) g_data = "tests/data";
    char path[512];
    snprintf(path, sizeof path, "%s/models/golden_generate.safetensors", g_data);
    g_golden = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!g_golden) {
        fprintf(stderr, "cannot read %s: %s\n", path, em_last_error());
        return 1;
    }
    g_devs[g_ndev++] = EM_DEVICE_CPU;
    em_device_type gpus[] = {EM_OPENCL, EM_CUDA};
    for (int i = 0; i < 2; i++) {
        if (em_device_count(gpus[i]) > 0) g_devs[g_ndev++] = EM_DEVICE(gpus[i], 0);
        else test_skip_case(gpus[i] == EM_OPENCL ? "opencl" : "cuda", "%s",
                            em_device_unavailable_reason(gpus[i]) ? em_device_unavailable_reason(gpus[i]) : "no device");
    }
    em_clear_error();
    RUN(test_processors);
    RUN(test_draw_distribution);
    RUN(test_greedy_golden);
    RUN(test_sampling_seed);
    RUN(test_stops_and_callback);
    RUN(test_bad_arguments);
    RUN(test_command);
    em_safetensors_free(g_golden);
    return test_summary();
}
