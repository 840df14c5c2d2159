/* `ember train --checkpoint-activations` and `--accumulate N`: checkpointing changes no
 * number of the run (the same losses and accuracy as without it, MLP and CNN); 4 batches of
 * 16 accumulated train exactly as batches of 64 (SGD, the same shuffled order); the options
 * that do not combine yet are refused with exit status 2 (--accumulate with --amp and
 * --devices: test_tool_train_amp_combos.c). */
#include <stdlib.h>
#include "test.h"
#include "tool_run.h"

static bool have_data;

#define DATA "--epochs 1 --train-samples 1024 --test-samples 300 --seed 1 --checkpoint none --threads 1"

/* The "epoch 1/1: ..." line's numbers; false when the run failed or printed none. */
static bool run_epoch(const char *opts, double *loss, double *acc, double *test_loss, char *out, size_t size) {
    char args[512];
    snprintf(args, sizeof args, "train %s %s", opts, DATA);
    int rc = tool_run(args, out, size);
    const char *p = strstr(out, "epoch 1/1: train loss");
    bool ok = rc == 0 && p && sscanf(p, "epoch 1/1: train loss %lf, test accuracy %lf%%, test loss %lf", loss, acc,
                                     test_loss) == 3;
    if (!ok) fprintf(stderr, "  ember %s (rc %d):\n%s\n", args, rc, out);
    return ok;
}

static void same_run(const char *plain, const char *other, double tol) {
    static char out[16384];
    double l0 = NAN, a0 = NAN, t0 = NAN, l1 = NAN, a1 = NAN, t1 = NAN;
    CHECK(run_epoch(plain, &l0, &a0, &t0, out, sizeof out));
    CHECK(run_epoch(other, &l1, &a1, &t1, out, sizeof out));
    printf("  '%s': loss %.4f acc %.2f%% | '%s': loss %.4f acc %.2f%%\n", plain, l0, a0, other, l1, a1);
    CHECK_NEAR(l0, l1, tol);
    CHECK_NEAR(t0, t1, tol);
    CHECK_NEAR(a0, a1, 0.34);   /* at most one of 300 test samples */
}

static void test_checkpoint_mlp(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    same_run("--model mlp", "--model mlp --checkpoint-activations", 1e-4);
}

static void test_checkpoint_cnn(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    same_run("--model cnn --batch-size 128", "--model cnn --batch-size 128 --checkpoint-activations", 1e-4);
}

static void test_checkpoint_banner(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    static char out[16384];
    double l, a, t;
    CHECK(run_epoch("--model cnn --batch-size 256 --checkpoint-activations --max-steps 2", &l, &a, &t, out,
                    sizeof out) || strstr(out, "stopped"));
    CHECK(strstr(out, "activation checkpointing: 3 segments") != NULL);
}

static void test_accumulate(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    same_run("--optimizer sgd --batch-size 64", "--optimizer sgd --batch-size 16 --accumulate 4", 1e-4);
    /* and it is not a no-op: plain batches of 16 train differently */
    static char out[16384];
    double l0, a0, t0, l1, a1, t1;
    CHECK(run_epoch("--optimizer sgd --batch-size 64", &l0, &a0, &t0, out, sizeof out));
    CHECK(run_epoch("--optimizer sgd --batch-size 16", &l1, &a1, &t1, out, sizeof out));
    CHECK(fabs(t0 - t1) > 1e-3);
}

static void test_bad_combinations(void) {
    static char out[4096];
    /* (--checkpoint-activations with --amp trains: test_tool_train_amp_combos) */
    CHECK(tool_run("train --checkpoint-activations --devices cpu,opencl:0", out, sizeof out) == 2);
    CHECK(strstr(out, "--checkpoint-activations cannot go together with --devices") != NULL);
    CHECK(tool_run("train --accumulate 0", out, sizeof out) == 2);
    CHECK(strstr(out, "--accumulate expects an integer") != NULL);
    CHECK(tool_run("train --checkpoint-activations --checkpoint-activations", out, sizeof out) == 2);
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    em_dataset *probe = em_dataset_fashion_mnist(NULL, false);
    have_data = probe != NULL;
    /* scripts/setup.sh installs the data: without it this test fails rather than skips */
    if (!have_data) fprintf(stderr, "Fashion-MNIST is not installed: %s\n", em_last_error());
    CHECK(have_data);
    em_clear_error();
    em_dataset_free(probe);
    RUN(test_checkpoint_mlp);
    RUN(test_checkpoint_cnn);
    RUN(test_checkpoint_banner);
    RUN(test_accumulate);
    RUN(test_bad_combinations);
    return test_summary();
}
