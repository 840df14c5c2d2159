/* Full fine-tuning (em_model_unfreeze) against PyTorch + transformers
 * (tests/data/finetune/golden_full.safetensors, from scripts/golden_finetune.py): five AdamW
 * steps over every weight of the tiny Llama and GPT-2 folders, with weight decay on the
 * matrices only, warm-up then cosine, clipping: the loss before each step and weights after
 * them (a matrix, the token embedding that a tied head also trains, norm weights and a bias
 * that no decay reaches). Also the parameters' names and count, gradients reaching every
 * weight, what is refused (adapters already there, a bf16 model), and the trained folder
 * written by em_model_save_merged loading back with the same logits; the units a sharded
 * trainer gets (em_model_unit_of, a runner that changes nothing, em_model_save_units). And
 * `ember finetune
 * --full`: the trained folder loads, a run stopped by SIGTERM and resumed ends on the same
 * weights bit for bit, the adapters' options are refused with it. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "tool_run.h"

#define GOLDEN_FULL "tests/data/finetune/golden_full.safetensors"
#define GOLDEN "tests/data/finetune/golden.safetensors"
static em_safetensors *g_golden, *g_batch;
static const char *const cases[] = {"llama", "gpt2"};

static double rel_diff(em_tensor *a, em_tensor *b) {
    em_tensor *d = em_max(em_abs(em_sub(em_to_dtype(a, EM_F32), em_to_dtype(b, EM_F32))), EM_ALL_DIMS, false);
    em_tensor *s = em_max(em_abs(em_to_dtype(b, EM_F32)), EM_ALL_DIMS, false);
    double dv = d ? em_item(d) : INFINITY, sv = s ? em_item(s) : 1;
    return dv / (sv > 1e-12 ? sv : 1);
}

static em_model *load(const char *name, em_dtype dt) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/models/%s", name);
    em_model *m = em_model_load(dir, &(em_model_opts){.dtype = dt});
    CHECK(m != NULL);
    return m;
}

static void test_five_adamw_steps(void) {
    em_scope outer = em_scope_begin();
    em_tensor *ids = em_safetensors_get(g_batch, "ids"), *labels = em_safetensors_get(g_batch, "labels");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        em_scope scope = em_scope_begin();
        const char *name = cases[c];
        em_model *m = load(name, EM_F32);
        if (!m) continue;
        CHECK(em_model_module(m) == NULL && em_failed()); /* frozen until unfrozen */
        em_clear_error();
        CHECK(em_model_unfreeze(m) == EM_OK);
        CHECK(em_model_unfreeze(m) == EM_OK); /* twice: a no-op */
        em_module *all = em_model_module(m);
        CHECK(all != NULL);
        /* every weight once, as transformers names them */
        CHECK(em_module_num_parameters(all) == em_model_config_num_parameters(em_model_config_of(m)));
        const char *first = NULL;
        em_tensor *w0 = em_model_parameter(m, 0, &first);
        CHECK(em_requires_grad(w0));
        CHECK(em_module_get_parameter(all, first) == w0);
        em_adam_opts o = em_adam_defaults(1e-3);
        o.weight_decay = 0.1;
        o.decay_matrices_only = true;
        em_optimizer *opt = em_adamw_ex(all, o);
        CHECK(opt != NULL);
        char key[256];
        snprintf(key, sizeof key, "%s/losses", name);
        float losses[5] = {0};
        em_tensor *want = em_safetensors_get(g_golden, key);
        CHECK(want != NULL);
        if (want) em_copy_to_host(want, losses, sizeof losses);
        em_lr_schedule sched = em_lr_cosine(2, 5, 0);
        for (int t = 0; t < 5 && opt; t++) {
            em_scope s = em_scope_begin();
            em_optim_set_lr(opt, em_lr_at(sched, 1e-3, t));
            em_tensor *loss = em_model_loss(m, ids, labels, NULL);
            CHECK(loss != NULL);
            if (!loss) {
                em_scope_end(s);
                break;
            }
            double l = em_item(loss);
            if (!(fabs(l - losses[t]) <= 1e-4 * fabs(losses[t]) + 1e-5))
                fprintf(stderr, "  %s step %d: loss %.8g, PyTorch %.8g\n", name, t, l, losses[t]);
            CHECK_NEAR(l, losses[t], 1e-4 * fabs(losses[t]) + 1e-5);
            CHECK(em_backward(loss) == EM_OK);
            if (t == 0) { /* the gradient reaches every weight, the embedding included */
                int n = em_model_num_parameters(m), missing = 0;
                for (int i = 0; i < n; i++)
                    if (!em_grad(em_model_parameter(m, i, NULL))) missing++;
                CHECK(missing == 0);
            }
            CHECK(!isnan(em_clip_grad_norm(all, 1.0)));
            CHECK(em_step(opt) == EM_OK);
            CHECK(em_zero_grad(opt) == EM_OK);
            em_scope_end(s);
        }
        em_optim_free(opt);
        /* the weights after the steps: matrices decayed, norms and biases not */
        int checked = 0;
        for (int i = 0; i < em_model_num_parameters(m); i++) {
            const char *pname;
            em_tensor *p = em_model_parameter(m, i, &pname);
            snprintf(key, sizeof key, "%s/final/%s", name, pname);
            em_tensor *ref = em_safetensors_get(g_golden, key);
            em_clear_error();
            if (!ref) continue;
            double d = rel_diff(p, ref);
            if (!(d < 2e-4)) fprintf(stderr, "  %s: relative difference %g\n", key, d);
            CHECK(d < 2e-4);
            checked++;
        }
        CHECK(checked >= 4);
        /* the trained folder loads back with the same logits */
        char out[64];
        snprintf(out, sizeof out, "/tmp/ember-full-XXXXXX");
        if (mkdtemp(out)) {
            char src[256];
            snprintf(src, sizeof src, "tests/data/models/%s", name);
            CHECK(em_model_save_merged(m, src, out) == EM_OK);
            em_model *back = em_model_load(out, NULL);
            CHECK(back != NULL);
            if (back) {
                em_tensor *a = em_model_forward(m, ids, NULL), *b = em_model_forward(back, ids, NULL);
                CHECK(a && b && rel_diff(a, b) < 1e-6);
                em_model_free(back);
            }
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
            CHECK(system(cmd) == 0);
        }
        em_model_free(m);
        em_scope_end(scope);
    }
    em_scope_end(outer);
}

static void test_refused(void) {
    em_scope scope = em_scope_begin();
    em_model *m = load("llama", EM_BF16);
    if (m) {
        CHECK(em_model_unfreeze(m) == EM_ERR_DTYPE);
        CHECK(strstr(em_last_error(), "float32") != NULL);
        em_clear_error();
        CHECK(!em_requires_grad(em_model_parameter(m, 1, NULL))); /* unchanged */
        em_model_free(m);
    }
    m = load("llama", EM_F32);
    if (m) {
        CHECK(em_model_lora_add(m, NULL) == EM_OK);
        CHECK(em_model_unfreeze(m) == EM_ERR_ARGUMENT);
        CHECK(strstr(em_last_error(), "adapters") != NULL);
        em_clear_error();
        em_model_free(m);
    }
    CHECK(em_model_unfreeze(NULL) == EM_ERR_ARGUMENT);
    em_clear_error();
    /* the per-unit writer: NULL arguments, and a model whose weights are frozen */
    CHECK(em_model_save_units(NULL, "tests/data/models/llama", "/nonexistent", true) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL argument");
    m = load("llama", EM_F32);
    if (m) {
        CHECK(em_model_save_units(m, "tests/data/models/llama", NULL, true) == EM_ERR_ARGUMENT);
        CHECK_ERROR(EM_ERR_ARGUMENT, "NULL argument");
        CHECK(em_model_save_units(m, "tests/data/models/llama", "/nonexistent/units", true) == EM_ERR_ARGUMENT);
        CHECK_ERROR(EM_ERR_ARGUMENT, "frozen");
        em_model_free(m);
    }
    em_scope_end(scope);
}

/* The units for a sharded trainer: a runner that only calls the function (what ZeRO's stages
 * 1-2 do) gives the same logits and loss as the plain forward, each unit called as
 * em_model_unit_of numbers them (GPT-2's tied unit 0 twice: the lookup, then the head), and
 * em_model_save_units writes a folder per unit that loads back with the same weights. */
static int unit_calls[16];
static em_tensor *counting_runner(void *ctx, int unit, em_checkpoint_fn fn, void *fn_ctx, void (*free_fn_ctx)(void *),
                                  em_tensor *const *in, int n) {
    (void)ctx;
    if (unit >= 0 && unit < 16) unit_calls[unit]++;
    em_tensor *y = fn(fn_ctx, in, n);
    if (free_fn_ctx) free_fn_ctx(fn_ctx);
    return y;
}

static void test_units_and_runner(void) {
    em_scope outer = em_scope_begin();
    em_tensor *ids = em_safetensors_get(g_batch, "ids"), *labels = em_safetensors_get(g_batch, "labels");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        em_scope scope = em_scope_begin();
        em_model *m = load(cases[c], EM_F32);
        if (!m) continue;
        CHECK(em_model_set_unit_runner(m, counting_runner, NULL) == EM_ERR_ARGUMENT);   /* frozen */
        em_clear_error();
        CHECK_OK(em_model_unfreeze(m));
        int layers = (int)em_model_config_of(m)->num_hidden_layers;
        bool tied = em_model_config_of(m)->tie_word_embeddings;
        CHECK(em_model_num_units(m) == 1 + layers + (tied ? 0 : 1));
        /* every weight in a unit; each layer's weights in unit 1 + L */
        for (int i = 0; i < em_model_num_parameters(m); i++) {
            const char *name = NULL;
            em_model_parameter(m, i, &name);
            int u = em_model_unit_of(m, name);
            CHECK(u >= 0 && u < em_model_num_units(m));
            const char *layer = strstr(name, "layers.") ? strstr(name, "layers.") + 7 : strstr(name, ".h.") ? strstr(name, ".h.") + 3 : NULL;
            if (layer) CHECK(u == 1 + atoi(layer));
        }
        CHECK(em_model_unit_of(m, "no.such.weight") == -1);
        em_tensor *plain_logits = em_model_forward(m, ids, NULL);
        em_tensor *plain_loss = em_model_loss(m, ids, labels, NULL);
        memset(unit_calls, 0, sizeof unit_calls);
        CHECK_OK(em_model_set_unit_runner(m, counting_runner, NULL));
        em_tensor *logits = em_model_forward(m, ids, NULL);
        CHECK(unit_calls[0] == (tied ? 2 : 1) && unit_calls[1] == 1 && unit_calls[layers] == 1);
        if (!tied) CHECK(unit_calls[layers + 1] == 1);
        em_tensor *loss = em_model_loss(m, ids, labels, NULL);
        CHECK(logits && loss && plain_logits && plain_loss);
        if (logits && loss && plain_logits && plain_loss) {
            CHECK(rel_diff(logits, plain_logits) == 0);
            CHECK(rel_diff(loss, plain_loss) == 0);
        }
        /* written a unit at a time through the runner: the same weights load back */
        char dir[128], src[128];
        snprintf(dir, sizeof dir, "/tmp/ember_units_%s_%d", cases[c], (int)getpid());
        snprintf(src, sizeof src, "tests/data/models/%s", cases[c]);
        memset(unit_calls, 0, sizeof unit_calls);
        CHECK_OK(em_model_save_units(m, src, dir, true));
        for (int u = 0; u < em_model_num_units(m); u++) CHECK(unit_calls[u] == 1);
        CHECK_OK(em_model_set_unit_runner(m, NULL, NULL));
        em_model *back = em_model_load(dir, NULL);
        CHECK(back != NULL);
        for (int i = 0; back && i < em_model_num_parameters(m); i++) {
            const char *name = NULL;
            em_tensor *w = em_model_parameter(m, i, &name), *b = em_model_parameter_by_name(back, name);
            CHECK(b != NULL && rel_diff(b, w) == 0);
        }
        em_model_free(back);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
        em_model_free(m);
        em_scope_end(scope);
    }
    em_scope_end(outer);
}

static bool same_file(const char *a, const char *b) {
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    bool same = f && g;
    for (int x = 0, y = 0; same && (x != EOF || y != EOF);) {
        x = fgetc(f);
        y = fgetc(g);
        same = x == y;
    }
    if (f) fclose(f);
    if (g) fclose(g);
    return same;
}

static void test_command(void) {
    if (!tool_path()) {
        test_skip_case("ember finetune --full", "build/ember is missing");
        return;
    }
    char tmp[64], path[256], cmd[1024], a[256], b[256];
    static char out[1 << 16];
    snprintf(tmp, sizeof tmp, "/tmp/ember_full_XXXXXX");
    if (!mkdtemp(tmp)) return;
    snprintf(path, sizeof path, "%s/text.txt", tmp);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int i = 0; i < 60; i++) fprintf(f, "Line %d of a plain text, with words to learn. ", i);
    fclose(f);
    const char *common = "--full --seq 32 --batch-size 2 --max-steps 6 --lr 1e-3 --seed 2 --warmup-steps 2";
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s %s --out %s/whole", path, common, tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "step 6/6") != NULL && strstr(out, "trained parameters") != NULL);
    snprintf(cmd, sizeof cmd, "generate %s/whole --prompt hello --max-new-tokens 3 --temperature 0", tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 0);
    /* stopped after step 4, resumed: the same weights */
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s %s --out %s/stopped --interrupt-after 4", path,
             common, tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 128 + 15);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s %s --out %s/stopped --resume", path, common,
             tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "(resumed)") != NULL && strstr(out, "step 5/6") != NULL);
    snprintf(a, sizeof a, "%s/whole/model.safetensors", tmp);
    snprintf(b, sizeof b, "%s/stopped/model.safetensors", tmp);
    CHECK(same_file(a, b));
    /* the adapters' options, and a dtype that is not float32, are refused */
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s --full --lora-rank 4 --out %s/x", path, tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 2 && strstr(out, "--lora-rank") != NULL);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s --full --dtype bf16 --out %s/x", path, tmp);
    CHECK(tool_run(cmd, out, sizeof out) == 2 && strstr(out, "float32") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    g_golden = em_safetensors_load(GOLDEN_FULL, EM_DEVICE_CPU);
    g_batch = em_safetensors_load(GOLDEN, EM_DEVICE_CPU);
    if (!g_golden || !g_batch) {
        fprintf(stderr, "%s: %s\n", g_golden ? GOLDEN : GOLDEN_FULL, em_last_error());
        return 1;
    }
    RUN(test_five_adamw_steps);
    RUN(test_refused);
    RUN(test_units_and_runner);
    RUN(test_command);
    em_safetensors_free(g_golden);
    em_safetensors_free(g_batch);
    return test_summary();
}
