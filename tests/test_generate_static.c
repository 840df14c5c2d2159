/* The static decode form (src/models/models_internal.h's em_kv_cache): the one-token step
 * whose cache write position, attention length and rotary rows come from device memory, so
 * that a CUDA graph can replay it. Its logic runs on every device: forced on here (the
 * default keeps it to CUDA), it must give the dynamic form's greedy tokens for the tiny
 * goldens (tests/data/models, Llama, Qwen2 and GPT-2), each prompt alone and two prompts as
 * one left-padded batch, and one-token forwards whose logits match the dynamic form's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"
#include "models/generate_internal.h"

static const char *g_data;
static em_safetensors *g_golden;
static em_device g_devs[4];
static int g_ndev;

static const char *MODELS[] = {"llama", "qwen2", "gpt2"};
#define NMODELS 3
#define NPROMPTS 3
#define NEW_TOKENS 32

static int64_t *golden_ids(const char *key, int64_t *n) {
    em_scope s = em_scope_begin();
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

static em_model *load_model(const char *name, em_device dev) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", g_data, name);
    em_model *m = em_model_load(dir, &(em_model_opts){.device = dev, .dtype = EM_F32});
    if (!m) fprintf(stderr, "  load %s on %s: %s\n", name, em_device_str(dev).s, em_last_error());
    return m;
}

static bool same_rows(const em_generation *a, const em_generation *b) {
    if (a->rows != b->rows) return false;
    for (int64_t r = 0; r < a->rows; r++)
        if (a->row[r].n_tokens != b->row[r].n_tokens ||
            memcmp(a->row[r].tokens, b->row[r].tokens, sizeof(int64_t) * (size_t)a->row[r].n_tokens) != 0)
            return false;
    return true;
}

static void print_rows(const char *label, const em_generation *g) {
    for (int64_t r = 0; r < g->rows; r++) {
        fprintf(stderr, "    %s row %lld:", label, (long long)r);
        for (int64_t i = 0; i < g->row[r].n_tokens; i++) fprintf(stderr, " %lld", (long long)g->row[r].tokens[i]);
        fprintf(stderr, "\n");
    }
}

/* Greedy generation in the dynamic and the static form: the same tokens. */
static void generate_both(em_model *m, const int64_t *const *ids, const int64_t *len, int64_t rows, const char *what) {
    em_generate_opts o = {.max_new_tokens = NEW_TOKENS, .ignore_eos = true};
    em_generation dyn, sta;
    int was = em__generate_static_decode(0);
    CHECK_OK(em_generate(m, NULL, ids, len, rows, &o, &dyn));
    em__generate_static_decode(1);
    CHECK_OK(em_generate(m, NULL, ids, len, rows, &o, &sta));
    em__generate_static_decode(was);
    bool ok = same_rows(&dyn, &sta);
    if (!ok) {
        fprintf(stderr, "  %s: the static form's tokens differ\n", what);
        print_rows("dynamic", &dyn);
        print_rows("static", &sta);
    }
    CHECK(ok);
    CHECK(sta.rows == rows && sta.steps == NEW_TOKENS - 1 && sta.generated_tokens == rows * NEW_TOKENS);
    for (int64_t r = 0; r < sta.rows; r++) CHECK(sta.row[r].n_tokens == NEW_TOKENS);
    /* no graph here (CPU, OpenCL): the note says the graph is off, and nothing replayed */
    CHECK(sta.graph_replays == 0 && strncmp(sta.decode_graph, "off (", 5) == 0);
    CHECK(strncmp(dyn.decode_graph, "off (", 5) == 0);
    em_generation_free(&dyn);
    em_generation_free(&sta);
}

static void test_static_decode_tokens(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int mi = 0; mi < NMODELS; mi++) {
            em_model *m = load_model(MODELS[mi], g_devs[d]);
            CHECK(m != NULL);
            if (!m) continue;
            int64_t *ids[NPROMPTS] = {0}, len[NPROMPTS] = {0};
            bool have = true;
            for (int i = 0; i < NPROMPTS; i++) {
                char key[64];
                snprintf(key, sizeof key, "gen/%s/prompt/%d", MODELS[mi], i);
                have &= (ids[i] = golden_ids(key, &len[i])) != NULL;
            }
            CHECK(have);
            char what[128];
            for (int i = 0; have && i < NPROMPTS; i++) {
                snprintf(what, sizeof what, "%s prompt %d on %s", MODELS[mi], i, em_device_str(g_devs[d]).s);
                generate_both(m, (const int64_t *const *)&ids[i], &len[i], 1, what);
            }
            /* two prompts of different lengths: the shorter one left-padded */
            int a = 0, b = 1;
            for (int i = 1; have && i < NPROMPTS && len[a] == len[b]; i++) b = i;
            CHECK(!have || len[a] != len[b]);
            if (have) {
                const int64_t *pair[2] = {ids[a], ids[b]};
                int64_t plen[2] = {len[a], len[b]};
                snprintf(what, sizeof what, "%s padded batch on %s", MODELS[mi], em_device_str(g_devs[d]).s);
                generate_both(m, pair, plen, 2, what);
            }
            for (int i = 0; i < NPROMPTS; i++) free(ids[i]);
            em_model_free(m);
            em_clear_error();
        }
}

/* The logits [rows, 1, vocab] as float32 on the host. */
static bool host_logits(em_tensor *logits, float *out, int64_t n) {
    return logits && em_copy_to_host(em_to_dtype(logits, EM_F32), out, sizeof *out * (size_t)n) == EM_OK;
}

/* One-token forwards on two caches, one dynamic and one in the static form, fed the same
 * tokens: logits within 1e-5 at every step, and the cache's keys the same. */
static void test_static_decode_logits(void) {
    for (int d = 0; d < g_ndev; d++)
        for (int mi = 0; mi < NMODELS; mi++) {
            em_model *m = load_model(MODELS[mi], g_devs[d]);
            CHECK(m != NULL);
            if (!m) continue;
            int64_t V = em_model_config_of(m)->vocab_size, n = 0;
            char key[64];
            snprintf(key, sizeof key, "gen/%s/prompt/0", MODELS[mi]);
            int64_t *prompt = golden_ids(key, &n);
            CHECK(prompt != NULL);
            const int64_t steps = 8, cap = n + steps;
            em_kv_cache *dyn = em_kv_cache_new(m, 1, cap), *sta = em_kv_cache_new(m, 1, cap);
            CHECK(dyn && sta);
            CHECK_OK(em__kv_cache_static_begin(sta));
            float *ld = malloc(sizeof *ld * (size_t)V), *ls = malloc(sizeof *ls * (size_t)V);
            em_scope s = em_scope_begin();
            em_tensor *p = prompt ? em_from_data(prompt, EM_I64, EM_SHAPE(1, n), EM_OPTS(.dtype = EM_I64)) : NULL;
            em_tensor *ids = em_zeros(EM_SHAPE(1, 1), EM_OPTS(.dtype = EM_I64, .device = g_devs[d]));
            em_tensor *pos = em_zeros(EM_SHAPE(1, 1), EM_OPTS(.dtype = EM_I64, .device = g_devs[d]));
            bool ok = p && ids && pos && dyn && sta && sta->write_pos && ld && ls &&
                      host_logits(em_model_forward(m, p, &(em_forward_opts){.cache = dyn, .logits_to_keep = 1}), ld, V) &&
                      host_logits(em_model_forward(m, p, &(em_forward_opts){.cache = sta, .logits_to_keep = 1}), ls, V);
            CHECK(ok);
            double worst = 0;
            for (int64_t t = 0; ok && t < steps; t++) {
                int64_t next = 0;
                for (int64_t v = 1; v < V; v++)
                    if (ld[v] > ld[next]) next = v;
                int64_t at = n + t;
                em_tensor *hi = em_from_data(&next, EM_I64, EM_SHAPE(1, 1), EM_OPTS(.dtype = EM_I64));
                em_tensor *hp = em_from_data(&at, EM_I64, EM_SHAPE(1, 1), EM_OPTS(.dtype = EM_I64));
                em_tensor *hs = em_from_data(&at, EM_I64, EM_SHAPE(1), EM_OPTS(.dtype = EM_I64));
                ok = em_copy_(ids, hi) == EM_OK && em_copy_(pos, hp) == EM_OK && em_copy_(sta->write_pos, hs) == EM_OK;
                CHECK(ok);
                em__index_mark_in_range(ids, V);
                em__index_mark_in_range(pos, cap);
                sta->length = at;
                ok = ok &&
                     host_logits(em_model_forward(m, hi, &(em_forward_opts){.position_ids = hp, .cache = dyn,
                                                                            .logits_to_keep = 1}), ld, V) &&
                     host_logits(em_model_forward(m, ids, &(em_forward_opts){.position_ids = pos, .cache = sta,
                                                                             .logits_to_keep = 1}), ls, V);
                CHECK(ok);
                CHECK(sta->static_step);   /* the step took the static form */
                for (int64_t v = 0; ok && v < V; v++) {
                    double e = fabs((double)ld[v] - (double)ls[v]);
                    if (e > worst) worst = e;
                }
            }
            if (worst > 1e-5) fprintf(stderr, "  %s on %s: logits differ by %g\n", MODELS[mi], em_device_str(g_devs[d]).s, worst);
            CHECK(worst <= 1e-5);
            /* the keys written at the device position are the dynamic form's */
            em_tensor *diff = ok ? em_max(em_abs(em_sub(dyn->k[0], sta->k[0])), EM_ALL_DIMS, false) : NULL;
            CHECK(diff && em_item(diff) <= 1e-5);
            em_scope_end(s);
            free(ld);
            free(ls);
            free(prompt);
            em_kv_cache_free(dyn);
            em_kv_cache_free(sta);
            em_model_free(m);
            em_clear_error();
        }
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
    if (em_device_count(EM_OPENCL) > 0) g_devs[g_ndev++] = EM_DEVICE(EM_OPENCL, 0);
    else test_skip_case("opencl", "%s", em_device_unavailable_reason(EM_OPENCL) ? em_device_unavailable_reason(EM_OPENCL)
                                                                              : "no device");
    em_clear_error();
    RUN(test_static_decode_tokens);
    RUN(test_static_decode_logits);
    em_safetensors_free(g_golden);
    return test_summary();
}
