/* Memory estimates (`ember mem`): the seed's numbers, the conventions, bad input, the tool. */
#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"
#include "tool_run.h"
#include <ember/estimate.h>
#include <ember/memory.h>

static em_estimate est(em_estimate_opts o) {
    em_estimate e;
    memset(&e, 0, sizeof e);
    CHECK_OK(em_estimate_memory(&o, &e));
    return e;
}

#define REL(a, b) (fabs((a) - (b)) / (b))

static void test_parse_params(void) {
    struct { const char *s; double v; } good[] = {
        {"7B", 7e9}, {"7b", 7e9}, {"125M", 125e6}, {"1.3e9", 1.3e9}, {"350K", 350e3}, {"1.5T", 1.5e12},
        {"70G", 70e9}, {"  13B ", 13e9}, {"1000", 1000},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double v = 0;
        CHECK_OK(em_estimate_parse_params(good[i].s, &v));
        CHECK_NEAR(v, good[i].v, good[i].v * 1e-12);
    }
    double v;
    CHECK(em_estimate_parse_params("7Q", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cannot read the parameter count '7Q'");
    CHECK(em_estimate_parse_params("-7B", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must be at least 1");
    CHECK(em_estimate_parse_params("", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cannot read");
    CHECK(em_estimate_parse_params("B", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cannot read");
    CHECK(em_estimate_parse_params("7BB", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cannot read");
    CHECK(em_estimate_parse_params("1e20", &v) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "beyond 1e15");
    em_estimate_optimizer o;
    CHECK_OK(em_estimate_parse_optimizer("AdamW", &o));
    CHECK(o == EM_ESTIMATE_ADAMW);
    CHECK(em_estimate_parse_optimizer("lion", &o) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "unknown optimizer 'lion'");
}

/* The seed: "7B fine-tuning needs about 56 GB (model 14 GB + optimizer states 42 GB);
 * inference in FP16 about 14 GB; LoRA fits one RTX 4090 24 GB". */
static void test_seed_numbers(void) {
    em_estimate inf = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_INFERENCE});
    CHECK(REL(inf.bytes[EM_ESTIMATE_TOTAL], 14e9) < 0.01);
    CHECK(REL(inf.bytes[EM_ESTIMATE_WEIGHTS], 14e9) < 1e-12);
    CHECK(inf.bytes[EM_ESTIMATE_GRADIENTS] == 0 && inf.bytes[EM_ESTIMATE_OPTIMIZER_STATES] == 0);

    em_estimate full = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_FULL,
                                              .optimizer = EM_ESTIMATE_ADAM});
    CHECK(REL(full.bytes[EM_ESTIMATE_TOTAL], 56e9) < 0.01);
    CHECK(REL(full.bytes[EM_ESTIMATE_WEIGHTS], 14e9) < 1e-12);
    /* the seed's "optimizer states 42 GB" = gradients + Adam's two moments */
    CHECK(REL(full.bytes[EM_ESTIMATE_GRADIENTS] + full.bytes[EM_ESTIMATE_OPTIMIZER_STATES], 42e9) < 1e-12);
    CHECK(full.bytes[EM_ESTIMATE_MASTER_WEIGHTS] == 0);
    CHECK(strstr(full.why[EM_ESTIMATE_OPTIMIZER_STATES], "Adam keeps 2 states") != NULL);

    em_estimate mixed = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_FULL,
                                               .optimizer = EM_ESTIMATE_ADAM, .master_weights = true});
    CHECK(REL(mixed.bytes[EM_ESTIMATE_TOTAL], 112e9) < 0.01);
    CHECK(REL(mixed.bytes[EM_ESTIMATE_MASTER_WEIGHTS], 28e9) < 1e-12);
    CHECK(REL(mixed.bytes[EM_ESTIMATE_OPTIMIZER_STATES], 56e9) < 1e-12);
    /* float32 training without master weights: 4 + 4 + 8 = 16 B per parameter as well */
    em_estimate f32 = est((em_estimate_opts){.params = 7e9, .dtype = EM_F32, .mode = EM_ESTIMATE_FULL,
                                             .optimizer = EM_ESTIMATE_ADAMW, .master_weights = true});
    CHECK(REL(f32.bytes[EM_ESTIMATE_TOTAL], 112e9) < 1e-12 && f32.bytes[EM_ESTIMATE_MASTER_WEIGHTS] == 0);

    em_estimate lora = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_LORA,
                                              .optimizer = EM_ESTIMATE_ADAM});
    CHECK(lora.bytes[EM_ESTIMATE_TOTAL] < 24e9);                 /* one RTX 4090 */
    CHECK(lora.bytes[EM_ESTIMATE_TOTAL] > 14e9);                 /* the frozen base is still there */
    CHECK(lora.bytes[EM_ESTIMATE_TOTAL] < full.bytes[EM_ESTIMATE_TOTAL] / 3);
    CHECK(lora.trainable_params > 1e6 && lora.trainable_params < 0.01 * 7e9);
}

static void test_optimizers_and_dtypes(void) {
    double P = 1e9;
    int states[] = {0, 1, 2, 2};
    for (int o = EM_ESTIMATE_SGD; o <= EM_ESTIMATE_ADAMW; o++) {
        em_estimate e = est((em_estimate_opts){.params = P, .dtype = EM_BF16, .mode = EM_ESTIMATE_FULL,
                                               .optimizer = (em_estimate_optimizer)o});
        CHECK_NEAR(e.bytes[EM_ESTIMATE_OPTIMIZER_STATES], P * 2 * states[o], 1);
        CHECK_NEAR(e.bytes[EM_ESTIMATE_TOTAL], P * (2 + 2 + 2 * states[o]), 1);
    }
    em_estimate e = est((em_estimate_opts){.params = P, .dtype = EM_F32, .mode = EM_ESTIMATE_INFERENCE});
    CHECK_NEAR(e.bytes[EM_ESTIMATE_TOTAL], 4 * P, 1);
    em_estimate_opts bad = {.params = P, .dtype = EM_I64};
    CHECK(em_estimate_memory(&bad, &e) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "float32, float16 or bfloat16");
    bad = (em_estimate_opts){.params = -5};
    CHECK(em_estimate_memory(&bad, &e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "at least 1");
    bad = (em_estimate_opts){.params = P, .batch = -1};
    CHECK(em_estimate_memory(&bad, &e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must not be negative");
}

static void test_lora_and_activations(void) {
    /* LLaMA-7B's shape: LoRA rank 8 on q and v: 32 x 2 x 8 x (4096 + 4096) = 4,194,304 parameters */
    em_estimate e = est((em_estimate_opts){.params = 6.74e9, .dtype = EM_F16, .mode = EM_ESTIMATE_LORA,
                                           .optimizer = EM_ESTIMATE_ADAM, .hidden = 4096, .layers = 32});
    CHECK(e.trainable_params == 4194304 && !e.shape_inferred);
    CHECK_NEAR(e.bytes[EM_ESTIMATE_GRADIENTS], 4194304.0 * 4, 1);
    CHECK_NEAR(e.bytes[EM_ESTIMATE_OPTIMIZER_STATES], 4194304.0 * 8, 1);
    CHECK_NEAR(e.bytes[EM_ESTIMATE_WEIGHTS], 6.74e9 * 2 + 4194304.0 * 4, 1);
    em_estimate r16 = est((em_estimate_opts){.params = 6.74e9, .dtype = EM_F16, .mode = EM_ESTIMATE_LORA,
                                             .lora_rank = 16, .hidden = 4096, .layers = 32});
    CHECK(r16.trainable_params == 2 * e.trainable_params);
    /* the inferred shape of 7B is close to LLaMA's */
    em_estimate inf = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_LORA});
    CHECK(inf.shape_inferred && inf.hidden % 64 == 0 && inf.hidden >= 3840 && inf.hidden <= 4608);
    CHECK(inf.layers >= 28 && inf.layers <= 36);
    /* activations: given per sample, the KV cache for inference, the training formula */
    em_estimate a = est((em_estimate_opts){.params = 1e9, .dtype = EM_F16, .mode = EM_ESTIMATE_FULL,
                                           .optimizer = EM_ESTIMATE_ADAM, .batch = 8,
                                           .activation_bytes_per_sample = 1e8});
    CHECK_NEAR(a.bytes[EM_ESTIMATE_ACTIVATIONS], 8e8, 1);
    CHECK_NEAR(a.bytes[EM_ESTIMATE_TOTAL], 1e9 * 8 + 8e8, 1);
    em_estimate kv = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_INFERENCE,
                                            .hidden = 4096, .layers = 32, .batch = 1, .seq = 4096});
    CHECK_NEAR(kv.bytes[EM_ESTIMATE_ACTIVATIONS], 2.0 * 32 * 4096 * 4096 * 2, 1);  /* 2 GiB: LLaMA-7B at 4k */
    em_estimate tr = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .mode = EM_ESTIMATE_FULL,
                                            .hidden = 4096, .layers = 32, .batch = 1, .seq = 2048});
    double per_layer = 2048.0 * 1 * 4096 * (34 + 5.0 * 32 * 2048 / 4096);
    CHECK(REL(tr.bytes[EM_ESTIMATE_ACTIVATIONS], 32 * per_layer) < 1e-12);
    em_estimate none = est((em_estimate_opts){.params = 7e9, .dtype = EM_F16, .batch = 4});
    CHECK(none.bytes[EM_ESTIMATE_ACTIVATIONS] == 0 && strstr(none.why[EM_ESTIMATE_ACTIVATIONS], "not counted"));
}

/* ---- the `ember mem` command, run from the build folder next to this test ---- */

/* `ember mem ARGS` (tests/tool_run.h runs the built binary) */
static int run_ember(const char *args, char *out, size_t size) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mem %s", args);
    return tool_run(cmd, out, size);
}

static void test_command(void) {
    CHECK(tool_path() != NULL);
    static char out[65536];
    CHECK(run_ember("7B", out, sizeof out) == 0);
    CHECK(strstr(out, "Inference") && strstr(out, "Full fine-tuning (adam)") && strstr(out, "LoRA fine-tuning"));
    CHECK(strstr(out, "  total                 14.00 GB (   13.04 GiB)") != NULL);
    CHECK(strstr(out, "  total                 56.00 GB (   52.15 GiB)") != NULL);
    CHECK(strstr(out, "weights 14.00 GB + optimizer states 42.00 GB") != NULL);
    CHECK(strstr(out, "112.00 GB") != NULL);
    CHECK(strstr(out, "RTX 4090 24 GB") && strstr(out, "H100 80 GB") && strstr(out, "A100 40 GB"));
    CHECK(run_ember("7B --mode full --json", out, sizeof out) == 0);
    CHECK(strstr(out, "\"total_bytes\": 56000000000") != NULL);
    CHECK(strstr(out, "\"with_master_weights_total_bytes\": 112000000000") != NULL);
    CHECK(run_ember("7Q", out, sizeof out) == 2);
    CHECK(strstr(out, "cannot read the parameter count '7Q'") != NULL);
    CHECK(run_ember("-7B", out, sizeof out) == 2);
    CHECK(strstr(out, "at least 1") != NULL);
    CHECK(run_ember("7B --optim lion", out, sizeof out) == 2);
    CHECK(run_ember("7B --dtype int8", out, sizeof out) == 2);
    CHECK(run_ember("7B --batch 4", out, sizeof out) == 2);
    CHECK(run_ember("7B --lora-rank -3", out, sizeof out) == 2);
    CHECK(run_ember("", out, sizeof out) == 2);
    CHECK(run_ember("--help", out, sizeof out) == 0 && strstr(out, "usage: ember mem"));
}

int main(void) {
    RUN(test_parse_params);
    RUN(test_seed_numbers);
    RUN(test_optimizers_and_dtypes);
    RUN(test_lora_and_activations);
    RUN(test_command);
    return test_summary();
}
