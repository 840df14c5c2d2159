/* ember train --model gpt on a fixed small text (tests/data/gpt_tiny.txt): the loss falls
 * below a fixed threshold within a bounded number of steps on the CPU, training runs on
 * PoCL, ember eval reads the checkpoint back, and bad options are clear errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ember/ember.h>
#include "test.h"
#include "tool_run.h"

static char out[1 << 16];

/* The number after the n-th (0-based) occurrence of key in s; NAN if missing. */
static double number_after(const char *s, const char *key, int n) {
    for (const char *p = s; (p = strstr(p, key)); p += strlen(key))
        if (n-- == 0) return strtod(p + strlen(key), NULL);
    return NAN;
}

#define SMALL "--text tests/data/gpt_tiny.txt --context 32 --d-model 64 --layers 2 --heads 4 --batch-size 16 " \
              "--threads 1 --seed 1 --sample-chars 40"

static void test_cpu_loss_falls_below_threshold(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    char ckpt[96], args[768];
    snprintf(ckpt, sizeof ckpt, "/tmp/ember_gpt_test_%d.safetensors", (int)getpid());
    /* 300 steps in all: the train loss of the last 100 must be under 1.6 nats per character
     * (uniform over the 41 characters is 3.71; the text's unigram entropy is about 2.9) */
    snprintf(args, sizeof args, "train --model gpt --device cpu " SMALL " --epochs 3 --steps-per-epoch 100 --checkpoint %s",
             ckpt);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    double first = number_after(out, ": train loss ", 0), last = number_after(out, ": train loss ", 2);
    double val0 = number_after(out, "val loss ", 0), val2 = number_after(out, "val loss ", 2);
    printf("  cpu: train loss %.4f -> %.4f, val loss %.4f -> %.4f after 300 steps\n", first, last, val0, val2);
    CHECK(last < 1.6);
    CHECK(last < first);
    CHECK(val2 < val0);
    CHECK(strstr(out, "sample:\n") != NULL);
    if (rc || !(last < 1.6)) fprintf(stderr, "%s\n", out);
    /* ember eval: the same validation loss from the checkpoint */
    snprintf(args, sizeof args, "eval %s --device cpu --text tests/data/gpt_tiny.txt --threads 1", ckpt);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK_NEAR(number_after(out, "val loss ", 0), val2, 1e-4);
    CHECK(strstr(out, "sample:\n") != NULL);
    /* a text with a character the checkpoint never saw: a clear error */
    snprintf(args, sizeof args, "eval %s --device cpu --text CMakeLists.txt", ckpt);
    CHECK(tool_run(args, out, sizeof out) == 1);
    CHECK(strstr(out, "vocabulary lacks") != NULL);
    unlink(ckpt);
}

static void test_trains_on_opencl(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    int rc = tool_run("train --model gpt --device opencl:0 " SMALL " --epochs 2 --steps-per-epoch 15 --checkpoint none",
                      out, sizeof out);
    CHECK(rc == 0);
    double first = number_after(out, ": train loss ", 0), last = number_after(out, ": train loss ", 1);
    printf("  opencl:0: train loss %.4f -> %.4f after 30 steps\n", first, last);
    CHECK(last < first);
    CHECK(last < 3.71);
    if (rc) fprintf(stderr, "%s\n", out);
}

static void test_bad_options(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    CHECK(tool_run("train --model gpt --heads 3 --device cpu", out, sizeof out) == 2);
    CHECK(strstr(out, "--d-model 128 must be divisible by --heads 3") != NULL);
    CHECK(tool_run("train --model cnnx --device cpu", out, sizeof out) == 2);
    CHECK(strstr(out, "--model expects") != NULL);
    CHECK(tool_run("train --model gpt --device cpu --text /nonexistent/file --checkpoint none", out, sizeof out) == 1);
    CHECK(strstr(out, "/nonexistent/file") != NULL);
    CHECK(tool_run("train --model gpt --device cpu --text tests/data/gpt_tiny.txt --context 4096 --checkpoint none", out,
                   sizeof out) == 1);
    CHECK(strstr(out, "too short for --context 4096") != NULL);
    CHECK(tool_run("train --model gpt --bogus 1", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown option '--bogus'") != NULL);
    CHECK(tool_run("train --model gpt --help", out, sizeof out) == 0);
    CHECK(strstr(out, "--text PATH") != NULL);
}

static void test_mem_model_gpt(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    CHECK(tool_run("mem --model gpt --json --batch 4 --layers 2 --hidden 64 --seq 32", out, sizeof out) == 0);
    double params = number_after(out, "\"params\": ", 0), total = number_after(out, "\"total_bytes\": ", 0);
    double peak = number_after(out, "\"measured_peak_bytes\": ", 0);
    printf("  ember mem --model gpt: %.0f parameters, estimate %.2f MB, measured peak %.2f MB\n", params, total / 1e6,
           peak / 1e6);
    /* 2 x (LayerNorms 4d, in_proj 3d^2 + 3d, out_proj d^2 + d, MLP 8d^2 + 5d) + embeddings + ln_f + head, d = 64 */
    CHECK(params == 128 * 64 + 32 * 64 + 2 * (4 * 64 + 3 * 64 * 64 + 3 * 64 + 64 * 64 + 64 + 8 * 64 * 64 + 5 * 64) +
                        2 * 64 + 64 * 128 + 128);
    CHECK(total > 16 * params && peak > 16 * params); /* weights, gradients and two AdamW states at least */
    CHECK(tool_run("mem --model gpt --layers 3", out, sizeof out) == 0);
    CHECK(strstr(out, "3 layers") != NULL && strstr(out, "measured") != NULL);
}

/* `ember ARGS` with stderr joined, killed after limit seconds: its status (-1 when killed) and
 * the seconds it took. */
static int run_limited(const char *args, int limit, double *seconds) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout -s KILL %d '%s' %s 2>&1", limit, tool_path(), args);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return rc == 137 || rc == 124 ? -1 : rc;
}

/* An estimator answers from its formula at once: a model too large to build here (a 7B-class
 * GPT, a 100-million-sample MLP batch) is estimated in well under a second and "not measured",
 * never built and trained; the shapes ember train refuses are refused, not miscounted. */
static void test_mem_large_models_answer_at_once(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    static const char *const large[] = {
        "mem --model gpt --layers 32 --hidden 4096",
        "mem --model gpt --layers 8 --hidden 1024",
        "mem --model gpt --layers 256 --hidden 65536 --seq 65536 --batch 1048576",
        "mem --model mlp --batch 100000000 --mode full",
        "mem --model cnn --batch 1000000 --mode full",
    };
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
        double took;
        int rc = run_limited(large[i], 60, &took);
        printf("  ember %s: status %d in %.2f s\n", large[i], rc, took);
        CHECK(rc == 0 && took < 10);
        CHECK(strstr(out, "not measured: two steps would take") != NULL);
        CHECK(strstr(out, "internal") == NULL && strstr(out, " -1 ") == NULL);
        if (rc != 0) fprintf(stderr, "%s\n", out);
    }
    double took;
    CHECK(run_limited("mem --model gpt --layers 32 --hidden 4096 --json", 60, &took) == 0 && took < 10);
    CHECK(strstr(out, "\"total_bytes\": ") && !strstr(out, "measured_peak_bytes"));
    /* 32 blocks of 12 d^2 + 13 d, the embeddings (vocab 128, context 64), ln_f and the head */
    double d = 4096;
    CHECK(number_after(out, "\"params\": ", 0) == 128 * d + 64 * d + 32 * (12 * d * d + 13 * d) + 2 * d + d * 128 + 128);
    static const struct { const char *args, *msg; } refused[] = {
        {"mem --model gpt --hidden 100000", "--hidden 100000: expected 1 to 65536 with --model gpt, the range of ember "
                                            "train --model gpt's --d-model"},
        {"mem --model gpt --layers 100000 --hidden 64", "--layers 100000: expected 1 to 256"},
        {"mem --model gpt --seq 70000", "--seq 70000: expected 1 to 65536"},
        {"mem --model gpt --batch 2000000", "--batch 2000000: expected 1 to 1048576"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = run_limited(refused[i].args, 60, &took);
        CHECK(rc == 2 && strstr(out, refused[i].msg) && took < 10);
        if (rc != 2 || !strstr(out, refused[i].msg)) fprintf(stderr, "  ember %s: %d: %s\n", refused[i].args, rc, out);
    }
}

/* the value after "peak " in the n-th epoch line, in MiB (em_memory_format_size: KiB or MiB) */
static double peak_mib(const char *s, int n) {
    for (const char *p = s; (p = strstr(p, ", peak ")); p += 7)
        if (n-- == 0) {
            char *end;
            double v = strtod(p + 7, &end);
            return !strncmp(end, " KiB", 4) ? v / 1024 : !strncmp(end, " MiB", 4) ? v : NAN;
        }
    return NAN;
}

/* --checkpoint-activations: each block under em_checkpoint. The same losses as without (the
 * printed 4 decimals of every epoch's train and validation loss, and the sample: the
 * recomputation runs the same kernels on the same inputs, bit-identical as
 * test_activation_checkpoint's transformer blocks check), and a lower peak. */
static void test_checkpoint_activations(void) {
    if (!tool_path()) SKIP("build/ember is not built");
    static char plain[1 << 16];
    const char *args = "train --model gpt --device cpu " SMALL " --epochs 2 --steps-per-epoch 10 --checkpoint none";
    char ck_args[768];
    snprintf(ck_args, sizeof ck_args, "%s --checkpoint-activations", args);
    CHECK(tool_run(args, plain, sizeof plain) == 0);
    CHECK(tool_run(ck_args, out, sizeof out) == 0);
    CHECK(strstr(out, "activation checkpointing: each of the 2 blocks") != NULL);
    for (int e = 0; e < 2; e++) {
        double a = number_after(plain, ": train loss ", e), b = number_after(out, ": train loss ", e);
        double va = number_after(plain, "val loss ", e), vb = number_after(out, "val loss ", e);
        double pa = peak_mib(plain, e), pb = peak_mib(out, e);
        printf("  epoch %d: train loss %.4f / %.4f, val loss %.4f / %.4f, peak %.2f / %.2f MiB (plain / checkpointed)\n",
               e + 1, a, b, va, vb, pa, pb);
        CHECK(isfinite(a) && a == b && va == vb);
        CHECK(pb < pa);
    }
    const char *sa = strstr(plain, "sample:\n"), *sb = strstr(out, "sample:\n");
    CHECK(sa && sb && !strncmp(sa, sb, 48));
}

int main(void) {
    RUN(test_cpu_loss_falls_below_threshold);
    RUN(test_trains_on_opencl);
    RUN(test_bad_options);
    RUN(test_mem_model_gpt);
    RUN(test_mem_large_models_answer_at_once);
    RUN(test_checkpoint_activations);
    return test_summary();
}
