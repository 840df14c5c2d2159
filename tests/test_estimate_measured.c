/* em_estimate_module against the allocator: one model, real training steps, the measured
 * peak (em_memory_max_allocated) next to the estimate. Also the checkpoint form and
 * `ember mem --model`.
 *
 * Why they differ (measured, see the table this test prints):
 *  - Step 1 creates Adam's states one parameter at a time, so while the largest (first)
 *    parameter is updated the other parameters' states do not exist yet; the estimate counts
 *    them all (the steady state from step 2 on). The test measures the peak over two steps.
 *  - No workspace: Adam's fused step makes no temporaries and gradients become .grad without
 *    a copy. On OpenCL (PoCL's CPU devices) the matmul kernel copies x @ w.t()'s transposed
 *    weight to contiguous rows: the measured peak may exceed the estimate by up to the largest
 *    weight; the test checks estimate <= peak <= estimate + that copy there.
 *  - Not counted: integer targets (8 B per sample), the loss's small temporaries, gradients of
 *    activations (they matter only when they outgrow the workspace), 512 B block rounding. */
#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"
#include "tool_run.h"
#include <ember/estimate.h>

#define REL(a, b) (fabs((a) - (b)) / (b))
/* The estimate must be within this fraction of the measured peak (the allocator is deterministic;
 * worst seen +6.3%: the small MLP at batch 1024, whose activations the estimate overcounts a
 * little, hidden until Adam's step was fused and its 6 temporaries stopped setting the peak;
 * +4.4%: the deep MLP at batch 8192, where backward frees some gradients early). */
#define TOLERANCE 0.07

static em_module *mlp(int deep) {
    return deep ? em_nn_sequential(em_nn_linear(784, 512), em_nn_relu(), em_nn_linear(512, 256), em_nn_relu(),
                                em_nn_linear(256, 128), em_nn_relu(), em_nn_linear(128, 10))
                : em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
}

typedef struct measured { int64_t first, two; } measured;

/* Peaks of step 1 and of steps 1-2 (forward, cross-entropy, backward, Adam step), counted
 * from a model, optimizer and batch already on dev. */
static measured train_peak(em_device dev, em_module *m, int64_t batch) {
    measured r = {0, 0};
    em_optimizer *opt = em_adam(m, 1e-3);
    em_scope s0 = em_scope_begin();
    em_tensor *x = em_keep(em_randn(EM_SHAPE(batch, 784), EM_OPTS(.device = dev)));
    em_tensor *y = em_keep(em_randint(0, 10, EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64, .device = dev)));
    em_scope_end(s0);
    CHECK(x && y && opt);
    CHECK_OK(em_device_synchronize(dev));
    em_memory_reset_peak_stats(dev);
    for (int step = 0; step < 2; step++) {
        em_scope s = em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_step(opt));
        CHECK(isfinite(em_item(loss)));
        em_scope_end(s);
        if (step == 0) r.first = em_memory_max_allocated(dev);
    }
    r.two = em_memory_max_allocated(dev);

    em_clear_error();
    em_release(x);
    em_release(y);
    em_optim_free(opt);
    return r;
}

static void compare_on(em_device dev) {
    for (int deep = 0; deep < 2; deep++) {
        int64_t batches[] = {1, 64, 1024, 8192};
        for (int b = 0; b < 4; b++) {
            em_manual_seed(7);
            em_module *m = mlp(deep);
            CHECK_OK(em_module_to(m, dev));
            em_estimate e;
            CHECK_OK(em_estimate_module(m, &(em_estimate_opts){.mode = EM_ESTIMATE_FULL,
                                                               .optimizer = EM_ESTIMATE_ADAM,
                                                               .batch = batches[b]}, &e));
            int64_t before = em_memory_allocated(dev);
            measured p = train_peak(dev, m, batches[b]);
            double est = e.bytes[EM_ESTIMATE_TOTAL];
            printf("  %-8s %s batch %4lld: estimate %9.0f B, measured peak %9lld B (step 1 alone %9lld B): %+.1f%%\n",
                   em_device_str(dev).s, deep ? "784-512-256-128-10" : "784-256-10        ", (long long)batches[b],
                   est, (long long)p.two, (long long)p.first, 100.0 * (est - (double)p.two) / (double)p.two);
            CHECK(before >= 0 && p.two >= p.first && p.first > 0);
            if (dev.type == EM_OPENCL) {
                double copy = (double)(deep ? 784 * 512 : 784 * 256) * 4;   /* the transposed weight */
                CHECK(est <= (double)p.two * (1 + TOLERANCE) && (double)p.two <= (est + copy) * (1 + TOLERANCE));
            } else {
                CHECK(REL(est, (double)p.two) < TOLERANCE);
            }
            em_module_free(m);
        }
    }
}

/* ---- the checkpoint form and `ember mem --model` ---- */

/* `ember mem ARGS` (tests/tool_run.h runs the built binary) */
static int run_ember(const char *args, char *out, size_t size) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mem %s", args);
    return tool_run(cmd, out, size);
}

static void test_checkpoint_and_command(void) {
    /* 11 children: "10.weight" must come after "8.weight", not after "0.weight" */
    em_module *m = em_nn_sequential(em_nn_linear(784, 300), em_nn_relu(), em_nn_linear(300, 200), em_nn_relu(),
                                 em_nn_linear(200, 100), em_nn_relu(), em_nn_linear(100, 50), em_nn_relu(),
                                 em_nn_linear(50, 20), em_nn_relu(), em_nn_linear(20, 10));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/tmp/ember_test_estimate_%d.safetensors", (int)getpid());
    CHECK_OK(em_module_save(m, path));
    em_estimate_opts o = {.mode = EM_ESTIMATE_FULL, .optimizer = EM_ESTIMATE_ADAM, .batch = 64};
    em_estimate a, b;
    CHECK_OK(em_estimate_module(m, &o, &a));
    CHECK_OK(em_estimate_checkpoint(path, &o, &b));
    for (int l = 0; l < EM_ESTIMATE_LINES; l++) CHECK(a.bytes[l] == b.bytes[l]);
    CHECK(a.params == (double)em_module_num_parameters(m) && b.params == a.params);
    CHECK(a.layers == 6 && b.layers == 6 && a.hidden == 784 && a.dtype == EM_F32);
    {   /* a training checkpoint's optimizer state is not part of the model */
        em_optimizer *adam = em_adam(m, 1e-3);
        em_scope s = em_scope_begin();
        CHECK_OK(em_backward(em_sum(em_forward(m, em_randn(EM_SHAPE(2, 784), EM_OPTS(0))), EM_ALL_DIMS, false)));
        CHECK_OK(em_step(adam));
        em_scope_end(s);
        CHECK_OK(em_checkpoint_save(path, m, adam, NULL, NULL, 0));
        em_estimate c;
        CHECK_OK(em_estimate_checkpoint(path, &o, &c));
        CHECK(c.params == a.params && c.bytes[EM_ESTIMATE_TOTAL] == a.bytes[EM_ESTIMATE_TOTAL]);
        em_optim_free(adam);
    }
    /* by hand: weights, grads, 2 states, input 784 x 64 x 4, and the saved activations
     * (outputs 680 + log-softmax 10 + 2 x 300) x 64 x 4; no workspace (fused Adam) */
    double P = a.params, act = (680 + 10 + 600) * 64 * 4.0, in = 784 * 64 * 4.0;
    /* the peak is the larger of two moments: the widest layer's backward, before the first
     * Linear's gradient (784 x 300 + 300 floats) exists, and the step's end (every gradient,
     * only the input); here the second */
    double first_grad = (784 * 300 + 300) * 4.0;
    double peak = fmax(16 * P + in + act - first_grad, 16 * P + in);
    CHECK(a.bytes[EM_ESTIMATE_WORKSPACE] == 0);
    CHECK_NEAR(a.bytes[EM_ESTIMATE_TOTAL], peak, 0.5);
    CHECK_NEAR(a.bytes[EM_ESTIMATE_ACTIVATIONS], peak - 16 * P, 0.5);
    CHECK(strstr(a.why[EM_ESTIMATE_ACTIVATIONS], "the step's end") != NULL);
    CHECK(strstr(b.why[EM_ESTIMATE_ACTIVATIONS], "assumes ReLU-like") != NULL);

    CHECK(tool_path() != NULL);
    {
        static char out[65536];
        char args[PATH_MAX + 64], want[64];
        snprintf(args, sizeof args, "--model '%s' --batch 64 --mode full --json", path);
        CHECK(run_ember(args, out, sizeof out) == 0);
        snprintf(want, sizeof want, "\"total_bytes\": %.0f,", a.bytes[EM_ESTIMATE_TOTAL]);
        CHECK(strstr(out, want) != NULL);
        snprintf(want, sizeof want, "\"params\": %.0f,", a.params);
        CHECK(strstr(out, want) != NULL);
        snprintf(args, sizeof args, "--model '%s' --batch 64", path);
        CHECK(run_ember(args, out, sizeof out) == 0);
        CHECK(strstr(out, "6 Linear layers") && strstr(out, "Inference") && strstr(out, "LoRA fine-tuning"));
        CHECK(strstr(out, "workspace") && strstr(out, "fused step makes no temporaries") && strstr(out, " MB ("));
        snprintf(args, sizeof args, "7B --model '%s'", path);
        CHECK(run_ember(args, out, sizeof out) == 2 && strstr(out, "not both"));
        snprintf(args, sizeof args, "--model '%s' --hidden 64", path);
        CHECK(run_ember(args, out, sizeof out) == 2 && strstr(out, "come from the checkpoint"));
        CHECK(run_ember("--model /nonexistent/x.safetensors", out, sizeof out) == 1); /* a failure, not usage */
        CHECK(strstr(out, "/nonexistent/x.safetensors") != NULL);
        CHECK(run_ember("--model", out, sizeof out) == 2);
    }
    CHECK(em_estimate_checkpoint("/nonexistent/x.safetensors", &o, &b) != EM_OK);
    em_clear_error();
    CHECK(em_estimate_module(NULL, &o, &b) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    CHECK_OK(em_module_to_dtype(m, EM_F16));
    CHECK_OK(em_estimate_module(m, &o, &a));
    CHECK(a.dtype == EM_F16 && a.bytes[EM_ESTIMATE_WEIGHTS] == 2 * P);
    em_module *empty = em_nn_sequential(em_nn_relu());
    CHECK(em_estimate_module(empty, &o, &a) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no parameters");
    em_module_free(empty);
    remove(path);
    em_module_free(m);
}

static void test_cpu(void) { compare_on(EM_DEVICE_CPU); }

/* ---- `ember mem --model mlp|cnn|gpt`: plain, --checkpoint-activations, --lora-rank ----
 * Each run prints its estimate and the CPU allocator's peak over two real training steps of
 * the same model (peak reset after the model is built). The estimates count the step's
 * peak moment op by op (tools/ember/model_gpt.c, model_cnn.c, src/optim/estimate.c).
 * TOOL_TOLERANCE: worst seen over the 24 GPT shapes and variants of docs/BENCHMARKS.md was
 * 7.0% (d_model 128, checkpointed: backward's recomputation holds less than counted), over
 * the MLP and CNN from batch 1 to 1024 6.3% (the MLP at batch 1024, as above); the allocator
 * is deterministic, so 8% fails only when a count is wrong.
 * SAVING_TOLERANCE: what checkpointing changes (the plain peak less the checkpointed one) may
 * differ from the estimated change by 30% of it; worst seen 11% (the GPT, d_model 128). */
#define TOOL_TOLERANCE 0.08
#define SAVING_TOLERANCE 0.30

static double json_number(const char *s, const char *key) {
    const char *p = strstr(s, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* `ember mem ARGS --json`: the estimate's total and the measured peak. */
static bool mem_case(const char *args, double *est, double *peak) {
    static char out[65536];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --json", args);
    int rc = run_ember(cmd, out, sizeof out);
    *est = json_number(out, "\"total_bytes\": ");
    *peak = json_number(out, "\"measured_peak_bytes\": ");
    bool ok = rc == 0 && *est > 0 && *peak > 0;
    printf("  ember mem %-62s estimate %8.3f MB, measured %8.3f MB: %+5.1f%%\n", args, *est / 1e6, *peak / 1e6,
           100.0 * (*est - *peak) / *peak);
    if (!ok) printf("%s\n", out);
    return ok;
}

/* base: a model and shape; checks base, base + checkpointing, base + LoRA (and LoRA with
 * checkpointing where ember mem estimates it) and that checkpointing changes the measured
 * peak by what the estimate says, within SAVING_TOLERANCE (for the MLP, whose checkpointed
 * segment keeps nothing the plain step keeps, the estimate says no change: the measured
 * change must stay under 2% of the peak). */
static void tool_model_case(const char *model, bool lora_ckpt) {
    char base[300], args[400];
    bool gpt = strstr(model, "gpt") != NULL;   /* mlp and cnn print the modes asked for */
    snprintf(base, sizeof base, "%s%s", model, gpt ? "" : " --mode full");
    double e0, p0, e1, p1, e2, p2, e3, p3;
    CHECK(mem_case(base, &e0, &p0));
    CHECK(REL(e0, p0) < TOOL_TOLERANCE);
    snprintf(args, sizeof args, "%s --checkpoint-activations", base);
    CHECK(mem_case(args, &e1, &p1));
    CHECK(REL(e1, p1) < TOOL_TOLERANCE);
    double est_saving = e0 - e1, saving = p0 - p1;
    if (fabs(est_saving) < 0.02 * p0) {
        CHECK(fabs(saving) < 0.02 * p0);
    } else {
        CHECK((saving > 0) == (est_saving > 0));   /* the direction: lower, or higher for the CNN */
        CHECK(fabs(saving - est_saving) <= SAVING_TOLERANCE * fabs(est_saving));
    }
    printf("    checkpointing: estimated %+.3f MB, measured %+.3f MB\n", -est_saving / 1e6, -saving / 1e6);
    snprintf(args, sizeof args, "%s --lora-rank 8%s", model, gpt ? "" : " --mode lora");
    CHECK(mem_case(args, &e2, &p2));
    CHECK(REL(e2, p2) < TOOL_TOLERANCE);
    CHECK(p2 < p0);   /* frozen weights: no gradients, no optimizer states */
    if (lora_ckpt) {
        snprintf(args, sizeof args, "%s --lora-rank 8 --checkpoint-activations", model);
        CHECK(mem_case(args, &e3, &p3));
        CHECK(REL(e3, p3) < TOOL_TOLERANCE);
        CHECK(p3 < p2 && e3 < e2);
    }
}

static void test_tool_models(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    tool_model_case("--model mlp --batch 64", false);
    tool_model_case("--model mlp --batch 1024", false);
    tool_model_case("--model cnn --batch 64", false);
    /* the GPT: small, deeper, and attention-heavy (context 128) */
    tool_model_case("--model gpt --layers 2 --hidden 64 --seq 32 --batch 4", true);
    tool_model_case("--model gpt --layers 3 --hidden 64 --seq 32 --batch 4", true);
    tool_model_case("--model gpt --layers 2 --hidden 64 --seq 128 --batch 8", true);
    /* the same with attention composed (matmul, softmax, matmul: what OpenCL and CUDA run),
     * which keeps the softmax [H, T] per token: the estimate follows em_sdpa_fused */
    setenv("EMBER_ATTENTION", "composed", 1);
    tool_model_case("--model gpt --layers 2 --hidden 64 --seq 128 --batch 8", true);
    unsetenv("EMBER_ATTENTION");
    static char out[65536];
    CHECK(run_ember("--model mlp --checkpoint-activations --lora-rank 4 --mode lora", out, sizeof out) == 2);
    CHECK(strstr(out, "recomputes the frozen layers") != NULL);
    CHECK(run_ember("7B --checkpoint-activations", out, sizeof out) == 2);
    CHECK(strstr(out, "--checkpoint-activations needs --model mlp, cnn or gpt") != NULL);
    CHECK(run_ember("--model gpt --hidden 64 --lora-rank 65", out, sizeof out) == 2);
    CHECK(strstr(out, "larger than the GPT's d_model (64)") != NULL);
}

/* PoCL here; skipped where no OpenCL device is found. */
static void test_opencl(void) {
    if (em_device_count(EM_OPENCL) < 1) {
        em_clear_error();
        SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    }
    compare_on(EM_DEVICE(EM_OPENCL, 0));
    em_clear_error();
}

int main(void) {
    printf("estimate vs measured peak, Adam, float32:\n");
    RUN(test_cpu);
    RUN(test_opencl);
    RUN(test_checkpoint_and_command);
    RUN(test_tool_models);
    return test_summary();
}
