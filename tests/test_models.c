/* Language models against transformers: the folders and logits of
 * tests/data/models/ (scripts/golden_models.py) loaded with em_model_load and run on every
 * available device (the CPU, PoCL's OpenCL device, CUDA).
 *   - logits: float32 within 1e-4 relative of transformers' (relative to |logit| plus the
 *     tensor's mean |logit|); bfloat16 and float16 models run in their dtype within their
 *     rounding (see expect_logits), and the same weights loaded as float32 within 1e-4 of
 *     transformers' float32 run of them; for a prompt, a left- and a right-padded batch with
 *     its attention_mask, and the left one with generate()'s position_ids;
 *   - the KV cache: prefill then one token per step gives the same logits, for a prompt and
 *     for the padded batch;
 *   - perplexity by the strided windows of transformers' guide, within 1e-4 (float32);
 *   - the CPU maps a folder whose dtype matches (read-only weights, no copy) and converts one
 *     that does not; a weight outlives its model;
 *   - the configs as read, and the memory estimate of a config's exact shape;
 *   - bad folders and bad calls: an error naming the file, the tensor or the key, and nothing
 *     left allocated or mapped. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ember/ember.h>
#include <ember/dlpack.h> /* em_is_read_only */
#include "test.h"

static const char *g_data;
static em_safetensors *g_golden;
static char g_tmp[64];

static const char *MODELS[] = {"llama", "qwen2", "gpt2", "mistral"};
#define NMODELS 4

static void folder(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/models/%s", g_data, name); }

static em_tensor *golden(const char *model, const char *key) {
    char name[128];
    snprintf(name, sizeof name, "%s/%s", model, key);
    for (int i = 0; i < em_safetensors_count(g_golden); i++)
        if (!strcmp(em_safetensors_name(g_golden, i), name)) return em_safetensors_get(g_golden, name);
    return NULL;
}

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

static em_model *load(const char *name, em_device dev, bool dtype_auto, em_dtype dt) {
    char dir[512];
    folder(dir, sizeof dir, name);
    em_model *m = em_model_load(dir, &(em_model_opts){.device = dev, .dtype = dt, .dtype_auto = dtype_auto});
    if (!m) fprintf(stderr, "  load %s on %s: %s\n", name, em_device_str(dev).s, em_last_error());
    return m;
}

static double *host_f64(em_tensor *t, int64_t *n) {
    *n = em_numel(t);
    double *x = malloc(sizeof(double) * (size_t)(*n + 1));
    if (em_copy_to_host(em_to_dtype(em_cpu(em_contiguous(t)), EM_F64), x, (size_t)*n * sizeof *x) != EM_OK) {
        free(x);
        return NULL;
    }
    return x;
}

/* |a - b| in units of the dtype (unit) relative to |b| + scale, for each logit where the mask
 * ([B, T] per row of vocab logits; NULL: all) is set: the largest and the root mean square. */
typedef struct diff { double max, rms; int64_t at, same, n; } diff;
static diff compare(const double *a, const double *b, const double *mask, int64_t n, int64_t vocab, double unit,
                    double scale) {
    diff d = {0};
    double sq = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mask && mask[i / vocab] == 0) continue;
        d.n++;
        d.same += a[i] == b[i];
        double e = fabs(a[i] - b[i]) / (unit * (fabs(b[i]) + scale));
        sq += e * e;
        if (!(e <= d.max)) d.max = e, d.at = i;
    }
    d.rms = d.n ? sqrt(sq / (double)d.n) : 0;
    return d;
}

/* got against transformers' want ([B, T, V]) where mask ([B, T], NULL: all) is set.
 * float32: every logit within 1e-4 relative (of |logit| + the tensor's mean |logit|).
 * 16-bit (model's dtype): every op rounds, and two correct implementations that sum in
 * different orders pass last-bit differences on through the layers, so "within its rounding"
 * is measured against transformers itself: the golden data holds how far apart its own two
 * attention paths (sdpa, which made want, and eager) put these logits (spread_max, spread_rms,
 * in units of the dtype relative to |logit| + the mean |logit|), and Ember must be as close to
 * want as that: rms within 1.5x spread_rms, max within 2x spread_max. With truth (the same
 * weights in float32): Ember's rms error against it at most 1.25x transformers' own. */
static void expect_logits(const char *label, const char *model, em_tensor *got, em_tensor *want, em_tensor *mask,
                          em_tensor *truth) {
    if (!got || !want) {
        fprintf(stderr, "  %s: missing (%s)\n", label, em_failed() ? em_last_error() : "no golden");
        CHECK(got && want);
        em_clear_error();
        return;
    }
    CHECK(em_numel(got) == em_numel(want) && em_dtype_of(got) == em_dtype_of(want));
    if (em_numel(got) != em_numel(want)) return;
    int64_t n, nm = 0;
    double *x = host_f64(got, &n), *y = host_f64(want, &n), *mk = mask ? host_f64(mask, &nm) : NULL;
    double *t = truth ? host_f64(truth, &n) : NULL;
    CHECK(x && y);
    em_dtype dt = em_dtype_of(want);
    double unit = dt == EM_BF16 ? ldexp(1, -8) : dt == EM_F16 ? ldexp(1, -11) : 1e-4, scale = 0;
    int64_t vocab = em_size(want, -1);
    for (int64_t i = 0; x && y && i < n; i++) scale += fabs(y[i]) / (double)n;
    diff d = x && y ? compare(x, y, mk, n, vocab, unit, scale) : (diff){0};
    if (dt == EM_F32) {
        if (!(d.max <= 1))
            fprintf(stderr, "  %s: logit %lld is %.9g, expected %.9g (%.3g of the tolerance)\n", label, (long long)d.at,
                    x[d.at], y[d.at], d.max);
        CHECK(d.max <= 1);
    } else {
        double spread_max = meta_num(model, "spread_max"), spread_rms = meta_num(model, "spread_rms");
        printf("  %s: %lld of %lld bit-identical; max %.2f, rms %.2f units from transformers (its sdpa and eager paths: "
               "%.2f, %.2f)", label, (long long)d.same, (long long)d.n, d.max, d.rms, spread_max, spread_rms);
        if (t) {
            double tscale = 0;
            for (int64_t i = 0; i < n; i++) tscale += fabs(t[i]) / (double)n;
            diff ours = compare(x, t, mk, n, vocab, unit, tscale), theirs = compare(y, t, mk, n, vocab, unit, tscale);
            printf("; rms error against float32 %.2f units (transformers %.2f)", ours.rms, theirs.rms);
            CHECK(ours.rms <= 1.25 * theirs.rms);
        }
        printf("\n");
        if (!(d.max <= 2 * spread_max))
            fprintf(stderr, "  %s: logit %lld is %.9g, expected %.9g\n", label, (long long)d.at, x[d.at], y[d.at]);
        CHECK(d.rms <= 1.5 * spread_rms && d.max <= 2 * spread_max);
    }
    free(x), free(y), free(mk), free(t);
}

static int g_ndev;
static em_device g_devs[4];

static void logits_case(em_model *m, const char *name, const char *cs, bool f32_of_lowp, em_device dev) {
    char label[160];
    snprintf(label, sizeof label, "%s %s %s %s", em_device_str(dev).s, name, em_dtype_name(em_model_dtype(m)), cs);
    char key[64];
    snprintf(key, sizeof key, "%s/ids", cs);
    em_tensor *ids = golden(name, key), *mask = NULL, *pos = NULL;
    snprintf(key, sizeof key, "%s/mask", cs);
    if (strcmp(cs, "single")) mask = golden(name, key);
    snprintf(key, sizeof key, "%s/positions", cs);
    if (!strcmp(cs, "left_pos")) pos = golden(name, key);
    snprintf(key, sizeof key, "%s/logits_f32", cs);
    em_tensor *truth = golden(name, key);   /* a 16-bit model's, in float32 */
    snprintf(key, sizeof key, "%s/logits", cs);
    em_tensor *want = f32_of_lowp ? truth : golden(name, key);
    em_tensor *got = em_model_forward(m, ids, &(em_forward_opts){.attention_mask = mask, .position_ids = pos});
    expect_logits(label, name, got, want, mask, f32_of_lowp ? NULL : truth);
}

static void test_logits(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int k = 0; k < NMODELS; k++) {
            em_scope s = em_scope_begin();
            em_model *m = load(MODELS[k], g_devs[d], true, EM_F32);
            CHECK(m != NULL);
            const char *cases[] = {"single", "left", "right", "left_pos"};
            for (int c = 0; m && c < 4; c++) logits_case(m, MODELS[k], cases[c], false, g_devs[d]);
            /* a 16-bit folder loaded as float32 (converted on load) against transformers' float32 run */
            if (m && em_model_dtype(m) != EM_F32) {
                em_model *f = load(MODELS[k], g_devs[d], false, EM_F32);
                CHECK(f && em_model_dtype(f) == EM_F32);
                if (f) logits_case(f, MODELS[k], "single", true, g_devs[d]);
                em_model_free(f);
            }
            em_model_free(m);
            em_scope_end(s);
            em_clear_error();
        }
}

/* The padded rows' logits where the mask is set equal the unpadded prompt's when
 * generate()'s positions are given (a check of the golden data's premise, on Ember). */
static void test_padding_positions(void) {
    em_scope s = em_scope_begin();
    em_model *m = load("llama", EM_DEVICE_CPU, true, EM_F32);
    CHECK(m != NULL);
    if (m) {
        em_tensor *ids = golden("llama", "left_pos/ids"), *row = em_narrow(em_narrow(ids, 0, 1, 1), 1, 4, 6);
        em_tensor *alone = em_model_forward(m, em_contiguous(row), NULL);
        em_tensor *padded = em_model_forward(m, ids, &(em_forward_opts){.attention_mask = golden("llama", "left_pos/mask"),
                                                                         .position_ids = golden("llama", "left_pos/positions")});
        expect_logits("cpu llama padded row vs alone", "llama", em_narrow(em_narrow(padded, 0, 1, 1), 1, 4, 6), alone,
                      NULL, NULL);
    }
    em_model_free(m);
    em_scope_end(s);
}

/* Prefill the first `prefill` positions, then one token per step, with a cache; the steps'
 * logits, put together, against the whole forward's (the golden). */
static void cache_run(em_model *m, const char *name, const char *cs, int64_t prefill, bool full_mask, em_device dev) {
    char label[200], key[64];
    snprintf(key, sizeof key, "%s/ids", cs);
    em_tensor *ids = golden(name, key);
    snprintf(key, sizeof key, "%s/mask", cs);
    em_tensor *mask = strcmp(cs, "single") ? golden(name, key) : NULL;
    snprintf(key, sizeof key, "%s/positions", cs);
    em_tensor *pos = strcmp(cs, "left_pos") ? NULL : golden(name, key);
    snprintf(key, sizeof key, "%s/logits", cs);
    em_tensor *want = golden(name, key);
    snprintf(key, sizeof key, "%s/logits_f32", cs);
    em_tensor *truth = golden(name, key);
    int64_t B = em_size(ids, 0), T = em_size(ids, 1);
    em_kv_cache *cache = em_kv_cache_new(m, B, T + 3);
    CHECK(cache != NULL);
    if (!cache) return;
    CHECK(em_kv_cache_capacity(cache) == T + 3 && em_kv_cache_batch(cache) == B);
    CHECK(em_kv_cache_nbytes(cache) == (size_t)(2 * em_model_config_of(m)->num_hidden_layers * B *
                                                em_model_config_of(m)->num_key_value_heads * (T + 3) *
                                                em_model_config_of(m)->head_dim) * em_dtype_size(em_model_dtype(m)));
    em_tensor *steps[32];
    int nsteps = 0;
    for (int64_t t = 0; t < T && nsteps < 32;) {
        int64_t n = t == 0 ? prefill : 1;
        em_forward_opts o = {.cache = cache};
        if (mask) o.attention_mask = full_mask ? em_narrow(mask, 1, 0, t + n) : em_narrow(mask, 1, t, n);
        if (pos) o.position_ids = em_narrow(pos, 1, t, n);
        steps[nsteps] = em_model_forward(m, em_narrow(ids, 1, t, n), &o);
        CHECK(steps[nsteps] && em_size(steps[nsteps], 1) == n);
        if (!steps[nsteps++]) break;
        t += n;
        CHECK(em_kv_cache_length(cache) == t);
    }
    snprintf(label, sizeof label, "%s %s %s cache %s, prefill %lld then 1 by 1%s", em_device_str(dev).s, name,
             em_dtype_name(em_model_dtype(m)), cs, (long long)prefill, full_mask ? " (whole mask)" : "");
    expect_logits(label, name, em_cat(steps, nsteps, 1), want, mask, truth);
    /* the cache's keys: written up to its length, zeros after */
    em_tensor *k = em_kv_cache_layer(cache, 0, false);
    CHECK(k && em_size(k, 2) == T + 3);
    if (k) CHECK(em_item(em_sum(em_abs(em_narrow(k, 2, T, 3)), EM_ALL_DIMS, false)) == 0);
    if (k) CHECK(em_item(em_sum(em_abs(em_narrow(k, 2, 0, T)), EM_ALL_DIMS, false)) > 0);
    CHECK_OK(em_kv_cache_reset(cache));
    CHECK(em_kv_cache_length(cache) == 0);
    em_kv_cache_free(cache);
}

static void test_kv_cache(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int k = 0; k < NMODELS; k++) {
            em_scope s = em_scope_begin();
            em_model *m = load(MODELS[k], g_devs[d], true, EM_F32);
            CHECK(m != NULL);
            if (m) {
                cache_run(m, MODELS[k], "single", 9, false, g_devs[d]);
                cache_run(m, MODELS[k], "left_pos", 6, false, g_devs[d]);
                cache_run(m, MODELS[k], "left_pos", 6, true, g_devs[d]);
                cache_run(m, MODELS[k], "right", 4, true, g_devs[d]);
                /* logits_to_keep: the last 3 positions only */
                em_tensor *ids = golden(MODELS[k], "single/ids");
                em_tensor *last = em_model_forward(m, ids, &(em_forward_opts){.logits_to_keep = 3});
                CHECK(last && em_size(last, 1) == 3);
                em_tensor *truth = golden(MODELS[k], "single/logits_f32");
                char label[96];
                snprintf(label, sizeof label, "%s %s logits_to_keep 3", em_device_str(g_devs[d]).s, MODELS[k]);
                expect_logits(label, MODELS[k], last, em_narrow(golden(MODELS[k], "single/logits"), 1, 13, 3),
                              NULL, truth ? em_narrow(truth, 1, 13, 3) : NULL);
            }
            em_model_free(m);
            em_scope_end(s);
            em_clear_error();
        }
}

static void test_perplexity(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int k = 0; k < NMODELS; k++) {
            em_scope s = em_scope_begin();
            em_model *m = load(MODELS[k], g_devs[d], true, EM_F32);
            em_tensor *ids = golden(MODELS[k], "ppl/ids");
            CHECK(m && ids);
            if (m && ids) {
                int64_t n = em_numel(ids), *buf = malloc(sizeof(int64_t) * (size_t)n);
                CHECK_OK(em_copy_to_host(ids, buf, sizeof(int64_t) * (size_t)n));
                em_perplexity r;
                em_perplexity_opts o = {.max_length = (int64_t)meta_num(MODELS[k], "max_length"),
                                        .stride = (int64_t)meta_num(MODELS[k], "stride")};
                CHECK_OK(em_model_perplexity(m, buf, n, &o, &r));
                double want = meta_num(MODELS[k], "nll");
                bool lowp = em_model_dtype(m) != EM_F32;
                /* float32: 1e-4 relative; a 16-bit model's mean of 289 roundings-apart losses: 2e-3 */
                double tol = (lowp ? 2e-3 : 1e-4) * want;
                printf("  %s %s perplexity %.6f (transformers %.6f), nll %.8f (%.8f), %lld tokens in %lld windows\n",
                       em_device_str(g_devs[d]).s, MODELS[k], r.perplexity, meta_num(MODELS[k], "ppl"), r.nll, want,
                       (long long)r.tokens, (long long)r.windows);
                CHECK_NEAR(r.nll, want, tol);
                CHECK_NEAR(r.perplexity, exp(r.nll), 1e-9 * r.perplexity);
                CHECK(r.tokens == (int64_t)meta_num(MODELS[k], "tokens"));
                free(buf);
            }
            em_model_free(m);
            em_scope_end(s);
            em_clear_error();
        }
}

/* ---- loading ---- */

static void test_configs(void) {
    char dir[512];
    em_model_config c;
    folder(dir, sizeof dir, "llama");
    CHECK_OK(em_model_config_load(dir, &c));
    CHECK(!strcmp(c.architecture, "LlamaForCausalLM") && c.family == EM_MODEL_LLAMA);
    CHECK(c.hidden_size == 64 && c.num_attention_heads == 4 && c.num_key_value_heads == 2 && c.head_dim == 16);
    CHECK(c.rope.scaling == EM_ROPE_LLAMA3 && c.rope.theta == 500000 && c.rope.factor == 8 &&
          c.rope.original_max_position_embeddings == 32 && c.rope.high_freq_factor == 4);
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 2 && c.eos_token_ids[1] == 3);   /* generation_config.json's list */
    CHECK(c.bos_token_id == 1 && c.pad_token_id == 0 && !c.tie_word_embeddings && c.norm_eps == 1e-5);
    CHECK(c.dtype == EM_F32 && !c.qkv_bias && !c.o_bias && c.sliding_window == 0);
    folder(dir, sizeof dir, "qwen2");
    CHECK_OK(em_model_config_load(dir, &c));
    CHECK(c.qkv_bias && !c.o_bias && c.tie_word_embeddings && c.dtype == EM_BF16 && c.num_key_value_heads == 1);
    CHECK(c.rope.theta == 1000000 && c.rope.scaling == EM_ROPE_DEFAULT && c.sliding_window == 0);
    folder(dir, sizeof dir, "gpt2");
    CHECK_OK(em_model_config_load(dir, &c));
    CHECK(c.family == EM_MODEL_GPT2 && c.head_dim == 16 && c.intermediate_size == 256 && c.norm_eps == 1e-5);
    CHECK(c.max_position_embeddings == 128 && c.tie_word_embeddings && c.qkv_bias && c.n_eos == 1);
    folder(dir, sizeof dir, "mistral");
    CHECK_OK(em_model_config_load(dir, &c));
    CHECK(c.hidden_size == 48 && c.head_dim == 16 && c.sliding_window == 64 && c.dtype == EM_F16);
    CHECK(c.rope.scaling == EM_ROPE_LINEAR && c.rope.factor == 2 && c.bos_token_id == 1 && c.pad_token_id == -1);

    /* every model: the config's parameter count is the loaded one */
    for (int k = 0; k < NMODELS; k++) {
        em_scope s = em_scope_begin();
        folder(dir, sizeof dir, MODELS[k]);
        CHECK_OK(em_model_config_load(dir, &c));
        em_model *m = load(MODELS[k], EM_DEVICE_CPU, true, EM_F32);
        CHECK(m != NULL);
        int64_t total = 0;
        for (int i = 0; m && i < em_model_num_parameters(m); i++) total += em_numel(em_model_parameter(m, i, NULL));
        CHECK(total == em_model_config_num_parameters(&c));
        em_model_free(m);
        em_scope_end(s);
    }
}

static bool mapping_of(const char *needle) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    bool found = false;
    while (f && fgets(line, sizeof line, f)) found |= strstr(line, needle) != NULL;
    if (f) fclose(f);
    return found;
}

static void test_mapping(void) {
    em_scope s = em_scope_begin();
    em_model *m = load("gpt2", EM_DEVICE_CPU, false, EM_F32);
    CHECK(m != NULL);
    if (!m) {
        em_scope_end(s);
        return;
    }
    CHECK(em_model_mapped_bytes(m) == em_model_weight_bytes(m) && em_model_weight_bytes(m) > 0);
    CHECK(mapping_of("models/gpt2/model.safetensors"));
    const char *name = NULL;
    em_tensor *wte = em_model_parameter(m, 0, &name);
    CHECK(name && !strcmp(name, "transformer.wte.weight"));
    CHECK(em_is_read_only(wte));
    CHECK(em_fill_(wte, 0) != EM_OK);   /* a mapped weight is never written */
    em_clear_error();
    CHECK(em_model_parameter_by_name(m, "transformer.h.1.mlp.c_proj.bias") != NULL);
    CHECK(em_model_parameter_by_name(m, "transformer.h.2.mlp.c_proj.bias") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no parameter 'transformer.h.2.mlp.c_proj.bias'");
    double before = em_item(em_sum(wte, EM_ALL_DIMS, false));
    em_tensor *kept = em_keep(wte);
    em_model_free(m);
    em_scope_end(s);
    /* the weight outlives its model: the mapping is the tensor's */
    CHECK(mapping_of("models/gpt2/model.safetensors"));
    s = em_scope_begin();   /* the sum's result is scoped: freed at its end */
    CHECK_NEAR(em_item(em_sum(kept, EM_ALL_DIMS, false)), before, 0);
    em_scope_end(s);
    em_release(kept);
    CHECK(!mapping_of("models/gpt2/model.safetensors"));

    /* another dtype: converted copies, no mapping left once loaded */
    m = load("gpt2", EM_DEVICE_CPU, false, EM_BF16);
    CHECK(m && em_model_mapped_bytes(m) == 0 && em_model_dtype(m) == EM_BF16);
    CHECK(!mapping_of("models/gpt2/model.safetensors"));
    em_model_free(m);
    /* a bfloat16 folder loaded in its dtype: mapped; in float32: converted */
    m = load("qwen2", EM_DEVICE_CPU, true, EM_F32);
    CHECK(m && em_model_mapped_bytes(m) == em_model_weight_bytes(m));
    em_model_free(m);
    em_clear_error();
}

/* The logits of ids [1, 5] as float32 on the host (vocab of them per position), or NULL. */
static float *logits_of(em_model *m, int64_t *n) {
    const int64_t ids[5] = {1, 7, 3, 12, 5};
    em_tensor *t = em_from_data(ids, EM_I64, EM_SHAPE(1, 5), EM_OPTS(.dtype = EM_I64));
    em_tensor *y = em_to_dtype(em_model_forward(m, t, NULL), EM_F32);
    *n = y ? em_numel(y) : 0;
    float *x = y ? malloc(sizeof(float) * (size_t)*n) : NULL;
    if (x && em_copy_to_host(y, x, sizeof(float) * (size_t)*n) != EM_OK) {
        free(x);
        x = NULL;
    }
    return x;
}

/* read_weights: the files read into memory, not mapped; the same weights, so the same logits
 * bit for bit, in the files' dtype (views over the copy) and in another (converted from it). */
static void test_read_weights(void) {
    const char *names[] = {"qwen2", "gpt2"};
    for (int k = 0; k < 2; k++)
        for (int convert = 0; convert < 2; convert++) {
            em_scope s = em_scope_begin();
            char dir[512];
            folder(dir, sizeof dir, names[k]);
            /* qwen2's folder is bfloat16 and gpt2's float32: convert loads the other dtype */
            em_dtype dt = (k == 0) == !convert ? EM_BF16 : EM_F32;
            em_model *mapped = em_model_load(dir, &(em_model_opts){.dtype = dt});
            em_model *read = em_model_load(dir, &(em_model_opts){.dtype = dt, .read_weights = true});
            CHECK(mapped && read);
            if (!mapped || !read) {
                fprintf(stderr, "  %s: %s\n", names[k], em_last_error());
                em_model_free(mapped);
                em_model_free(read);
                em_scope_end(s);
                continue;
            }
            CHECK(em_model_mapped_bytes(read) == 0);
            CHECK(em_model_mapped_bytes(mapped) == (convert ? 0 : em_model_weight_bytes(mapped)));
            CHECK(em_model_weight_bytes(read) == em_model_weight_bytes(mapped));
            em_tensor *w = em_model_parameter(read, 0, NULL);
            CHECK(w && em_is_read_only(w) == !convert);
            int64_t na = 0, nb = 0;
            float *a = logits_of(mapped, &na);
            em_model_free(mapped);   /* its mapping gone: the copy must not depend on it */
            float *b = logits_of(read, &nb);
            em_model_free(read);
            CHECK(a && b && na == nb && na > 0);
            if (a && b && na == nb) CHECK(memcmp(a, b, sizeof(float) * (size_t)na) == 0);
            free(a);
            free(b);
            em_scope_end(s);
            em_clear_error();
        }
}

/* ---- bad folders: a temporary copy of a good one, then one thing broken ---- */

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void clear_tmp(void) {
    DIR *d = opendir(g_tmp);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_tmp, e->d_name);
            unlink(p);
        }
    if (d) closedir(d);
}

/* g_tmp becomes a copy of the model's folder */
static void copy_model(const char *name) {
    clear_tmp();
    char dir[512], from[800], to[800];
    folder(dir, sizeof dir, name);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
            snprintf(to, sizeof to, "%s/%s", g_tmp, e->d_name);
            copy_file(from, to);
        }
    if (d) closedir(d);
}

/* Replace the first `from` in g_tmp/file by `to`. */
static void edit(const char *file, const char *from, const char *to) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_tmp, file);
    FILE *f = fopen(p, "rb");
    char *text = calloc(1, 1 << 20);
    size_t n = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    char *at = strstr(text, from);
    CHECK(at != NULL);
    f = fopen(p, "wb");
    if (f && at) {
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(to, f);
        fputs(at + strlen(from), f);
    } else if (f) {
        fwrite(text, 1, n, f);
    }
    if (f) fclose(f);
    free(text);
}

/* Loading g_tmp fails with code and a message holding each of the two strings, and leaves
 * nothing: no host memory the allocator counts, no mapping of the folder's files. */
static void expect_bad(const char *what, em_status code, const char *s1, const char *s2) {
    int64_t before = em_memory_allocated(EM_DEVICE_CPU);
    em_model *m = em_model_load(g_tmp, NULL);
    CHECK(m == NULL);
    if (m) {
        fprintf(stderr, "  %s: loaded\n", what);
        em_model_free(m);
        return;
    }
    printf("  %s: %s\n", what, em_last_error());
    if (s2 && !strstr(em_last_error(), s2)) {
        fprintf(stderr, "  %s: the message does not name '%s'\n", what, s2);
        CHECK(strstr(em_last_error(), s2) != NULL);
    }
    CHECK_ERROR(code, s1);
    CHECK(em_memory_allocated(EM_DEVICE_CPU) == before);
    CHECK(!mapping_of(g_tmp));
}

static void write_without(const char *name, const char *drop, const char *extra_name, em_dtype extra_dtype) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", g_tmp);
    em_scope s = em_scope_begin();
    em_safetensors *st = em_safetensors_load(p, EM_DEVICE_CPU);
    CHECK(st != NULL);
    int n = st ? em_safetensors_count(st) : 0;
    const char *names[64];
    em_tensor *ts[64];
    int k = 0;
    for (int i = 0; i < n && k < 62; i++) {
        const char *nm = em_safetensors_name(st, i);
        if (drop && !strcmp(nm, drop)) continue;
        names[k] = nm;
        ts[k++] = em_safetensors_get(st, nm);
    }
    if (extra_name) {
        names[k] = extra_name;
        ts[k++] = em_zeros(EM_SHAPE(4), EM_OPTS(.dtype = extra_dtype));
    }
    /* (the writer wants sorted names) */
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (strcmp(names[j], names[i]) < 0) {
                const char *tn = names[i];
                em_tensor *tt = ts[i];
                names[i] = names[j], ts[i] = ts[j], names[j] = tn, ts[j] = tt;
            }
    CHECK_OK(em_safetensors_save(p, names, ts, k));
    em_safetensors_free(st);
    em_scope_end(s);
    (void)name;
}

static void test_bad_folders(void) {
    char p[512];
    copy_model("llama");
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", g_tmp);
    unlink(p);
    expect_bad("missing shard", EM_ERR_IO, "model-00002-of-00003.safetensors", "index.json names");

    copy_model("llama");
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", g_tmp);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size - 100) == 0);
    expect_bad("truncated shard", EM_ERR_FORMAT, "truncated", "model-00003-of-00003.safetensors");

    copy_model("llama");
    edit("model.safetensors.index.json", "\"model.norm.weight\": \"model-00003", "\"model.norm.weight\": \"model-00001");
    expect_bad("index names another shard", EM_ERR_FORMAT, "model.norm.weight", "index.json puts it in");

    copy_model("gpt2");
    edit("config.json", "\"n_inner\": null", "\"n_inner\": 128");
    expect_bad("wrong shape", EM_ERR_SHAPE, "transformer.h.0.mlp.c_fc.", "gives it [128]");

    copy_model("llama");
    edit("config.json", "LlamaForCausalLM", "FalconForCausalLM");
    expect_bad("unknown architecture", EM_ERR_NOT_SUPPORTED, "FalconForCausalLM", "config.json");

    copy_model("llama");
    edit("config.json", "\"num_hidden_layers\": 2,", "");
    expect_bad("missing config key", EM_ERR_FORMAT, "num_hidden_layers", "config.json");

    copy_model("qwen2");
    edit("config.json", "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
    expect_bad("rope type", EM_ERR_NOT_SUPPORTED, "yarn", "config.json");

    /* dimensions each within their bound whose weights, summed, pass what 64 bits count */
    copy_model("gpt2");
    edit("config.json", "\"n_embd\": 64", "\"n_embd\": 2147483648");
    expect_bad("parameter count past 64 bits", EM_ERR_ARGUMENT, "more parameters than a 64-bit count", "config.json");
    em_model_config big = {0};
    folder(p, sizeof p, "gpt2");
    CHECK_OK(em_model_config_load(p, &big));
    big.hidden_size = big.intermediate_size = (int64_t)1 << 31;
    CHECK(em_model_config_num_parameters(&big) == 0);
    CHECK_ERROR(EM_ERR_ARGUMENT, "more parameters than a 64-bit count");

    copy_model("gpt2");
    edit("config.json", "{", "{,");
    expect_bad("bad JSON", EM_ERR_FORMAT, "bad JSON", "config.json");

    copy_model("gpt2");
    snprintf(p, sizeof p, "%s/config.json", g_tmp);
    unlink(p);
    expect_bad("no config.json", EM_ERR_IO, "config.json", "cannot open");

    copy_model("gpt2");
    snprintf(p, sizeof p, "%s/model.safetensors", g_tmp);
    unlink(p);
    expect_bad("no weights", EM_ERR_IO, "no model.safetensors", NULL);

    copy_model("gpt2");
    write_without("gpt2", "transformer.ln_f.bias", NULL, EM_F32);
    expect_bad("missing tensor", EM_ERR_FORMAT, "transformer.ln_f.bias", "missing");

    copy_model("gpt2");
    write_without("gpt2", NULL, "transformer.h.0.extra", EM_F32);
    expect_bad("extra tensor", EM_ERR_FORMAT, "transformer.h.0.extra", "model.safetensors");

    copy_model("gpt2");
    write_without("gpt2", "transformer.ln_f.bias", "transformer.ln_f.bias", EM_I64);
    expect_bad("integer weight", EM_ERR_DTYPE, "transformer.ln_f.bias", "int64");

    /* what transformers accepts besides: GPT-2's original names and buffers, a tied lm_head */
    copy_model("gpt2");
    write_without("gpt2", NULL, "transformer.h.0.attn.bias", EM_F32);
    em_model *m = em_model_load(g_tmp, NULL);
    CHECK(m != NULL);
    em_model_free(m);
    copy_model("qwen2");
    write_without("qwen2", NULL, "lm_head.weight", EM_BF16);
    m = em_model_load(g_tmp, NULL);
    CHECK(m != NULL);
    em_model_free(m);
    clear_tmp();
    em_clear_error();
}

/* A GPT-2 file as the original checkpoints name it (GPT2Model's names, the causal-mask buffers):
 * the same logits. */
static void test_gpt2_original_names(void) {
    copy_model("gpt2");
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", g_tmp);
    em_scope s = em_scope_begin();
    em_safetensors *st = em_safetensors_load(p, EM_DEVICE_CPU);
    CHECK(st != NULL);
    int n = st ? em_safetensors_count(st) : 0;
    char names[40][96];
    const char *np[40];
    em_tensor *ts[40];
    int k = 0;
    for (int i = 0; i < n && k < 38; i++) {
        snprintf(names[k], sizeof names[k], "%s", em_safetensors_name(st, i) + strlen("transformer."));
        np[k] = names[k];
        ts[k++] = em_safetensors_get(st, em_safetensors_name(st, i));
    }
    snprintf(names[k], sizeof names[k], "h.0.attn.bias");
    np[k] = names[k];
    ts[k++] = em_ones(EM_SHAPE(1, 1, 128, 128), EM_OPTS(.dtype = EM_BOOL));
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (strcmp(np[j], np[i]) < 0) {
                const char *tn = np[i];
                em_tensor *tt = ts[i];
                np[i] = np[j], ts[i] = ts[j], np[j] = tn, ts[j] = tt;
            }
    CHECK_OK(em_safetensors_save(p, np, ts, k));
    em_safetensors_free(st);
    em_model *m = em_model_load(g_tmp, NULL);
    CHECK(m != NULL);
    if (m)
        expect_logits("gpt2 original names", "gpt2", em_model_forward(m, golden("gpt2", "single/ids"), NULL),
                      golden("gpt2", "single/logits"), NULL, NULL);
    em_model_free(m);
    em_scope_end(s);
    clear_tmp();
}

static void test_bad_calls(void) {
    em_scope s = em_scope_begin();
    em_model *m = load("gpt2", EM_DEVICE_CPU, false, EM_F32), *other = load("llama", EM_DEVICE_CPU, false, EM_F32);
    em_model *mistral = load("mistral", EM_DEVICE_CPU, false, EM_F32);
    CHECK(m && other && mistral);
    if (!m || !other || !mistral) goto out;
    em_tensor *ids = golden("gpt2", "single/ids");
    CHECK(em_model_forward(m, em_to_dtype(ids, EM_F32), NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "input_ids must be int64 or int32");
    CHECK(em_model_forward(m, em_flatten(ids, 0, 1), NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "[batch, tokens]");
    CHECK(em_model_forward(m, ids, &(em_forward_opts){.attention_mask = em_ones(EM_SHAPE(1, 15), EM_OPTS())}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "attention_mask");
    CHECK(em_model_forward(m, ids, &(em_forward_opts){.position_ids = em_arange(0, 3, 1, EM_OPTS(.dtype = EM_I64))}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "position_ids");
    CHECK(em_model_forward(m, ids, &(em_forward_opts){.logits_to_keep = -1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "logits_to_keep");
    em_kv_cache *small = em_kv_cache_new(m, 1, 8), *wrong = em_kv_cache_new(other, 1, 64);
    CHECK(small && wrong);
    CHECK(em_model_forward(m, ids, &(em_forward_opts){.cache = small}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "do not fit the cache");
    CHECK(em_kv_cache_length(small) == 0);
    CHECK(em_model_forward(m, ids, &(em_forward_opts){.cache = wrong}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "another model");
    em_kv_cache_free(small);
    em_kv_cache_free(wrong);
    CHECK(em_kv_cache_new(m, 0, 8) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "at least 1");
    /* GPT-2 has 128 learned positions */
    em_tensor *long_ids = em_zeros(EM_SHAPE(1, 129), EM_OPTS(.dtype = EM_I64));
    CHECK(em_model_forward(m, long_ids, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "n_positions");
    /* Mistral's sliding window (64): a longer context is refused, not attended in full */
    CHECK(em_model_forward(mistral, em_narrow(long_ids, 1, 0, 65), NULL) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "sliding window of 64");
    CHECK(em_model_forward(mistral, em_narrow(long_ids, 1, 0, 64), NULL) != NULL);
    CHECK(em_model_forward(NULL, ids, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    CHECK(em_model_load(g_data, &(em_model_opts){.dtype = EM_I64}) == NULL);
    em_clear_error();
    int64_t one[1] = {5};
    em_perplexity r;
    CHECK(em_model_perplexity(m, one, 1, NULL, &r) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "at least 2");
out:
    em_model_free(m);
    em_model_free(other);
    em_model_free(mistral);
    em_scope_end(s);
    em_clear_error();
}

static void test_estimate(void) {
    char dir[512];
    em_model_config c;
    folder(dir, sizeof dir, "llama");
    CHECK_OK(em_model_config_load(dir, &c));
    em_estimate e;
    CHECK_OK(em_model_estimate(&c, &(em_estimate_opts){.mode = EM_ESTIMATE_INFERENCE, .dtype = EM_F32, .batch = 1,
                                                        .seq = 100}, &e));
    CHECK(e.params == (double)em_model_config_num_parameters(&c));
    CHECK(e.bytes[EM_ESTIMATE_WEIGHTS] == e.params * 4);
    /* the KV cache's width is 2 key-value heads of 16, not hidden 64 */
    CHECK(e.bytes[EM_ESTIMATE_ACTIVATIONS] == 2.0 * 2 * 1 * 100 * 32 * 4);
    CHECK(strstr(e.why[EM_ESTIMATE_ACTIVATIONS], "key-value width 32") != NULL);
    CHECK_OK(em_model_estimate(&c, &(em_estimate_opts){.mode = EM_ESTIMATE_LORA, .dtype = EM_BF16,
                                                        .optimizer = EM_ESTIMATE_ADAM}, &e));
    /* q_proj (64 -> 64) and v_proj (64 -> 32) in each of 2 layers, rank 8 */
    CHECK(e.trainable_params == 2.0 * (8 * (64 + 64) + 8 * (64 + 32)));
    CHECK(em_model_estimate(&c, &(em_estimate_opts){.mode = EM_ESTIMATE_LORA, .lora_rank = 33}, &e) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rank 33");
}

int main(void) {
    g_data = getenv("EMBER_TEST_DATA");
    if (!g_data) g_data = "tests/data";
    char path[512];
    snprintf(path, sizeof path, "%s/models/golden.safetensors", g_data);
    g_golden = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!g_golden) {
        fprintf(stderr, "cannot read %s: %s\n", path, em_last_error());
        return 1;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ember-models-XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    g_devs[g_ndev++] = EM_DEVICE_CPU;
    em_device_type gpus[] = {EM_OPENCL, EM_CUDA};
    for (int i = 0; i < 2; i++) {
        if (em_device_count(gpus[i]) > 0) g_devs[g_ndev++] = EM_DEVICE(gpus[i], 0);
        else test_skip_case(gpus[i] == EM_OPENCL ? "opencl" : "cuda", "%s",
                            em_device_unavailable_reason(gpus[i]) ? em_device_unavailable_reason(gpus[i]) : "no device");
    }
    em_clear_error();
    RUN(test_configs);
    RUN(test_logits);
    RUN(test_padding_positions);
    RUN(test_kv_cache);
    RUN(test_perplexity);
    RUN(test_mapping);
    RUN(test_read_weights);
    RUN(test_bad_folders);
    RUN(test_gpt2_original_names);
    RUN(test_bad_calls);
    RUN(test_estimate);
    em_safetensors_free(g_golden);
    clear_tmp();
    rmdir(g_tmp);
    return test_summary();
}
