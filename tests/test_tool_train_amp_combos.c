/* `ember train`: mixed precision with checkpoints, DataParallel and gradient accumulation.
 * - --amp f16 stopped after epoch 1 and resumed ends bit for bit where an uninterrupted run
 *   does (weights, Adam state, the loss scaler's scale, tracker and skipped count, the
 *   printed losses); the scale had moved (--loss-scale 2^30 backs off), so restoring it
 *   matters. A checkpoint without scaler state resumes with --amp f16 from the initial scale,
 *   with a note; a negative or NaN scale in the checkpoint is an error, exit status 1.
 * - --devices opencl:0,opencl:1 --amp bf16 trains as --device opencl:0 --amp bf16 does,
 *   within bf16's tolerance.
 * - --accumulate 4 of batches of 16 with --amp bf16 trains as batches of 64 within bf16's
 *   tolerance (plain batches of 16 do not); with --devices too; stopped inside a group it
 *   stops at the group's end and resumes bit for bit.
 * ctest gives it two PoCL devices (EMBER_TWO_POCL_TESTS). */
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static char out[65536], ref[65536];
static char dir[64];
static bool have_data;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* Largest |a - b| over every tensor of two checkpoints (INFINITY when they differ in names). */
static double checkpoint_diff(const char *a, const char *b) {
    em_safetensors *fa = em_safetensors_load(a, EM_DEVICE_CPU), *fb = em_safetensors_load(b, EM_DEVICE_CPU);
    double worst = fa && fb && em_safetensors_count(fa) == em_safetensors_count(fb) ? 0 : INFINITY;
    for (int i = 0; isfinite(worst) && i < em_safetensors_count(fa); i++) {
        em_scope s = em_scope_begin();
        const char *name = em_safetensors_name(fa, i);
        em_tensor *x = em_safetensors_get(fa, name), *y = em_safetensors_get(fb, name);
        em_tensor *d = x && y ? em_max(em_abs(em_sub(em_to_dtype(x, EM_F64), em_to_dtype(y, EM_F64))), EM_ALL_DIMS, false)
                              : NULL;
        double v = d ? em_item(d) : INFINITY;
        if (!(v <= worst)) worst = v;
        em_scope_end(s);
    }
    em_clear_error();
    em_safetensors_free(fa);
    em_safetensors_free(fb);
    return worst;
}

/* The checkpoint's metadata value for key into buf ("" when missing). */
static void meta_of(const char *path, const char *key, char *buf, size_t size) {
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    const char *v = f ? em_safetensors_metadata(f, key) : NULL;
    snprintf(buf, size, "%s", v ? v : "");
    em_clear_error();
    em_safetensors_free(f);
}

/* The line of out that starts with prefix into buf ("" when none). */
static void line_of(const char *text, const char *prefix, char *buf, size_t size) {
    const char *p = strstr(text, prefix);
    size_t n = p ? strcspn(p, "\n") : 0;
    snprintf(buf, size, "%.*s", (int)n, p ? p : "");
}

#define SMALL "--train-samples 2000 --test-samples 500 --threads 1 --seed 3 --device cpu"
#define F16 "--amp f16 --loss-scale 1073741824"

static const char *const scaler_keys[] = {"amp.scaler.scale", "amp.scaler.growth_tracker", "amp.scaler.skipped_steps",
                                          "amp.scaler.growth_interval"};

/* Stopped by stop_opts ("--epochs 1": after epoch 1; "--epochs 2 --max-steps 45": in epoch 2),
 * resumed into b: the same as the uninterrupted run's a, bit for bit. Returns the growth
 * tracker the stopped run saved. */
static int resume_matches(const char *a, const char *b, const char *stop_opts, const char *label) {
    char args[512], la[256], lb[256], ampa[256], ampb[256];
    snprintf(args, sizeof args, "train " SMALL " " F16 " %s --checkpoint %s", stop_opts, b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    char scale1[64], tracker1[64], skipped1[64];
    meta_of(b, "amp.scaler.scale", scale1, sizeof scale1);
    meta_of(b, "amp.scaler.growth_tracker", tracker1, sizeof tracker1);
    meta_of(b, "amp.scaler.skipped_steps", skipped1, sizeof skipped1);
    printf("  stopped %s: scale %s, growth tracker %s, %s skipped steps (initial scale 2^30)\n", label, scale1,
           tracker1, skipped1);
    /* it backed off: the state restored is not the initial one */
    CHECK(scale1[0] && strtod(scale1, NULL) < 1073741824.0 && atoi(skipped1) > 0);
    snprintf(args, sizeof args, "train " SMALL " " F16 " --epochs 2 --resume --checkpoint %s", b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "resumed from") != NULL);
    char banner[128];
    snprintf(banner, sizeof banner, "loss scaling (scale %s)", scale1);
    CHECK(strstr(out, banner) != NULL);
    line_of(ref, "epoch 2/2:", la, sizeof la);
    line_of(out, "epoch 2/2:", lb, sizeof lb);
    line_of(strstr(ref, "epoch 2/2:") ? strstr(ref, "epoch 2/2:") : ref, "  amp float16", ampa, sizeof ampa);
    line_of(out, "  amp float16", ampb, sizeof ampb);
    /* the losses and accuracy (the line up to its samples/s), and the scale and skipped
     * counts printed after epoch 2: the same text */
    char *cut_a = strstr(la, " samples/s"), *cut_b = strstr(lb, " samples/s");
    if (cut_a) *cut_a = '\0', *strrchr(la, ',') = '\0';   /* the comma before the samples/s */
    if (cut_b) *cut_b = '\0', *strrchr(lb, ',') = '\0';
    CHECK(cut_a && cut_b && strcmp(la, lb) == 0);
    CHECK(ampa[0] && strcmp(ampa, ampb) == 0);
    printf("    uninterrupted: %s;%s\n    resumed:       %s;%s\n", la, ampa, lb, ampb);
    double d = checkpoint_diff(a, b);
    printf("    resumed vs uninterrupted: max |difference| %g over weights and Adam state\n", d);
    CHECK(d == 0);   /* bit-identical */
    for (size_t i = 0; i < sizeof scaler_keys / sizeof scaler_keys[0]; i++) {
        char va[64], vb[64];
        meta_of(a, scaler_keys[i], va, sizeof va);
        meta_of(b, scaler_keys[i], vb, sizeof vb);
        if (strcmp(va, vb)) fprintf(stderr, "  %s: %s vs %s\n", scaler_keys[i], va, vb);
        CHECK(va[0] && strcmp(va, vb) == 0);
    }
    return atoi(tracker1);
}

static void test_f16_resume_is_exact(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char a[128], b[128], c[128], args[512];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(c, sizeof c, "%s/mid.safetensors", dir);
    snprintf(args, sizeof args, "train " SMALL " " F16 " --epochs 2 --checkpoint %s", a);
    CHECK(tool_run(args, ref, sizeof ref) == 0);
    resume_matches(a, b, "--epochs 1", "after epoch 1");
    /* in epoch 2, where the growth tracker is not 0: it is restored too */
    CHECK(resume_matches(a, c, "--epochs 2 --max-steps 45", "at step 45") > 0);
    remove(a);
    remove(c);
    /* b (a scaler state after 2 epochs) is damaged below */
}

/* A checkpoint's scale value replaced by text of the same length (the header keeps its size). */
static bool damage_scale(const char *src, const char *dst, char fill) {
    FILE *f = fopen(src, "rb");
    if (!f) return false;
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *key = "\"amp.scaler.scale\":\"";
    char *p = NULL;
    for (size_t i = 0; i + strlen(key) < n && !p; i++)
        if (!memcmp(buf + i, key, strlen(key))) p = buf + i + strlen(key);
    if (!p) return false;
    size_t len = 0;
    while (p + len < buf + n && p[len] != '"') len++;
    if (len < 3) return false;
    if (fill == '-') memset(p, '1', len), p[0] = '-';   /* -111... */
    else memcpy(p, "nan", 3), memset(p + 3, '0', len - 3);   /* nan00... */
    f = fopen(dst, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    if (f) fclose(f);
    return ok;
}

static void test_missing_and_bad_scaler_state(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char c[128], b[128], bad[128], args[512];
    snprintf(c, sizeof c, "%s/c.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    /* saved without --amp: resumed with --amp f16 from the default scale, with a note */
    snprintf(args, sizeof args, "train " SMALL " --epochs 1 --checkpoint %s", c);
    CHECK(tool_run(args, out, sizeof out) == 0);
    snprintf(args, sizeof args, "train " SMALL " --amp f16 --epochs 2 --max-steps 40 --resume --checkpoint %s", c);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "holds no loss scaler state") && strstr(out, "initial scale 65536"));
    CHECK(strstr(out, "loss scaling (scale 65536)") != NULL);
    /* and the f16 checkpoint resumed without --amp: a note, the state left alone */
    snprintf(args, sizeof args, "train " SMALL " --epochs 3 --max-steps 70 --resume --checkpoint %s", c);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "holds a loss scaler's state; without --amp f16 it is not used") != NULL);
    /* a negative and a NaN scale: a clear error, status 1 */
    static const char fills[] = {'-', 'n'};
    for (int i = 0; i < 2; i++) {
        if (!damage_scale(b, bad, fills[i])) {
            CHECK(false);   /* the f16 checkpoint of the test before is missing */
            continue;
        }
        snprintf(args, sizeof args, "train " SMALL " --amp f16 --epochs 3 --resume --checkpoint %s", bad);
        int rc = tool_run(args, out, sizeof out);
        printf("  damaged scale (%s): status %d: %.*s\n", i ? "nan" : "negative", rc, (int)strcspn(out, "\n"), out);
        CHECK(rc == 1);
        CHECK(strstr(out, "cannot resume") != NULL);
        CHECK(strstr(out, i ? "not a number" : "expected a finite scale > 0") != NULL);
    }
    remove(b);
    remove(c);
    remove(bad);
}

/* The "epoch 1/1: train loss L, test accuracy A%, test loss T" numbers; false on a failed run. */
static bool run_epoch(const char *opts, double *loss, double *acc, double *test_loss) {
    char args[512];
    snprintf(args, sizeof args, "train %s --epochs 1 --checkpoint none", opts);
    int rc = tool_run(args, out, sizeof out);
    const char *p = strstr(out, "epoch 1/1: train loss");
    bool ok = rc == 0 && p &&
              sscanf(p, "epoch 1/1: train loss %lf, test accuracy %lf%%, test loss %lf", loss, acc, test_loss) == 3;
    if (!ok) fprintf(stderr, "  ember %s (rc %d):\n%s\n", args, rc, out);
    return ok;
}

static void test_devices_with_bf16(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    if (!em_device_available(EM_OPENCL) || em_device_count(EM_OPENCL) < 2)
        SKIP("needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\"), found %d", em_device_count(EM_OPENCL));
    const char *data = "--train-samples 1024 --test-samples 300 --seed 1 --batch-size 64 --amp bf16";
    char one[256], two[256];
    snprintf(one, sizeof one, "--device opencl:0 %s", data);
    snprintf(two, sizeof two, "--devices opencl:0,opencl:1 %s", data);
    double l0 = NAN, a0 = NAN, t0 = NAN, l1 = NAN, a1 = NAN, t1 = NAN;
    CHECK(run_epoch(one, &l0, &a0, &t0));
    CHECK(run_epoch(two, &l1, &a1, &t1));
    CHECK(strstr(out, "(DataParallel)") && strstr(out, "autocast bfloat16"));
    printf("  --amp bf16, 16 steps: one device loss %.4f / test loss %.4f; --devices opencl:0,opencl:1 %.4f / %.4f\n",
           l0, t0, l1, t1);
    CHECK_NEAR(l0, l1, 2e-3);
    CHECK_NEAR(t0, t1, 2e-3);
}

static void test_accumulate_with_bf16(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    const char *data = "--train-samples 1024 --test-samples 300 --seed 1 --threads 1 --device cpu --optimizer sgd "
                       "--amp bf16";
    char whole[256], acc[256], small[256];
    snprintf(whole, sizeof whole, "%s --batch-size 64", data);
    snprintf(acc, sizeof acc, "%s --batch-size 16 --accumulate 4", data);
    snprintf(small, sizeof small, "%s --batch-size 16", data);
    double l0 = NAN, a0, t0 = NAN, l1 = NAN, a1, t1 = NAN, l2, a2, t2 = NAN;
    CHECK(run_epoch(whole, &l0, &a0, &t0));
    CHECK(run_epoch(acc, &l1, &a1, &t1));
    CHECK(run_epoch(small, &l2, &a2, &t2));
    printf("  --amp bf16: batch 64 loss %.4f / test loss %.4f; 4 x 16 accumulated %.4f / %.4f; plain 16: test loss "
           "%.4f\n", l0, t0, l1, t1, t2);
    CHECK_NEAR(l0, l1, 2e-3);
    CHECK_NEAR(t0, t1, 2e-3);
    CHECK(fabs(t0 - t2) > 1e-2);   /* the comparison can fail: batches of 16 train differently */
    /* --amp f16 with --accumulate: trains, the scaler steps once per 4 batches */
    char f16[256];
    snprintf(f16, sizeof f16, "--train-samples 1024 --test-samples 300 --seed 1 --threads 1 --device cpu "
             "--amp f16 --batch-size 16 --accumulate 4");
    CHECK(run_epoch(f16, &l1, &a1, &t1));
    CHECK(isfinite(l1) && strstr(out, "0 skipped steps") != NULL);
}

static void test_accumulate_with_devices(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    if (SANITIZED) SKIP("two PoCL runs of an epoch: in the release build (sanitizers are 10x slower)");
    if (!em_device_available(EM_OPENCL)) SKIP("needs an OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    const char *data = "--train-samples 1024 --test-samples 300 --seed 1 --optimizer sgd";
    char whole[256], acc[256];
    snprintf(whole, sizeof whole, "%s --device cpu --batch-size 64", data);
    snprintf(acc, sizeof acc, "%s --devices cpu,opencl:0 --batch-size 16 --accumulate 4", data);
    double l0 = NAN, a0, t0 = NAN, l1 = NAN, a1, t1 = NAN;
    CHECK(run_epoch(whole, &l0, &a0, &t0));
    CHECK(run_epoch(acc, &l1, &a1, &t1));
    printf("  batch 64 on cpu: loss %.4f / %.4f; --devices cpu,opencl:0 4 x 16 accumulated: %.4f / %.4f\n", l0, t0,
           l1, t1);
    CHECK_NEAR(l0, l1, 1e-4);
    CHECK_NEAR(t0, t1, 1e-4);
}

/* --accumulate with --amp bf16 stopped by --max-steps inside a group: the run goes on to the
 * group's end (a checkpoint keeps no partial gradients), and the resumed run ends bit for bit
 * where an uninterrupted one does. 2000 samples in batches of 16: 125 per epoch (the last
 * group of one batch is stepped at the epoch's end); step 130 is in epoch 2's second group. */
static void test_accumulate_resume_is_exact(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char a[128], b[128], args[512];
    snprintf(a, sizeof a, "%s/acc_a.safetensors", dir);
    snprintf(b, sizeof b, "%s/acc_b.safetensors", dir);
#define ACC SMALL " --amp bf16 --batch-size 16 --accumulate 4 --epochs 2"
    snprintf(args, sizeof args, "train " ACC " --checkpoint %s", a);
    CHECK(tool_run(args, ref, sizeof ref) == 0);
    snprintf(args, sizeof args, "train " ACC " --max-steps 130 --checkpoint %s", b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "stopped (--max-steps) at epoch 2, batch 8 (133 steps)") != NULL);
    snprintf(args, sizeof args, "train " ACC " --resume --checkpoint %s", b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "at epoch 2, batch 8 (133 steps done)") != NULL);   /* batches, not the 34 optimizer steps */
    double d = checkpoint_diff(a, b);
    char la[256], lb[256];
    line_of(ref, "epoch 2/2:", la, sizeof la);
    line_of(out, "epoch 2/2:", lb, sizeof lb);
    char *cut_a = strstr(la, " samples/s"), *cut_b = strstr(lb, " samples/s");
    if (cut_a) *cut_a = '\0', *strrchr(la, ',') = '\0';
    if (cut_b) *cut_b = '\0', *strrchr(lb, ',') = '\0';
    printf("  --accumulate 4 --amp bf16 resumed at step 133: %s; max |difference| %g over weights and Adam state\n",
           lb, d);
    CHECK(cut_a && cut_b && strcmp(la, lb) == 0);
    CHECK(d == 0);   /* bit-identical */
    remove(a);
    remove(b);
#undef ACC
}

static void test_refusals(void) {
    CHECK(tool_run("train --loss-scale 1024", out, sizeof out) == 2);
    CHECK(strstr(out, "--loss-scale sets the loss scaler of --amp f16, got no --amp") != NULL);
    CHECK(tool_run("train --amp bf16 --loss-scale 1024", out, sizeof out) == 2);
    CHECK(strstr(out, "bfloat16 needs no loss scaling") != NULL);
    CHECK(tool_run("train --amp f16 --loss-scale -1", out, sizeof out) == 2);
    CHECK(strstr(out, "--loss-scale expects a number > 0") != NULL);
    CHECK(tool_run("train --amp f16 --loss-scale 1e39", out, sizeof out) == 2);
    CHECK(strstr(out, "--loss-scale expects a number > 0") != NULL);
    CHECK(tool_run("train --checkpoint-activations --devices cpu,opencl:0", out, sizeof out) == 2);
    CHECK(strstr(out, "--checkpoint-activations cannot go together with --devices") != NULL);
}

/* --checkpoint-activations with --amp bf16: the recomputation in backward enters the forward's
 * autocast region, so the run is the un-checkpointed one bit for bit (recomputed in float32,
 * the Linears' gradients would differ) */
static void test_checkpoint_with_bf16(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    const char *data = "--train-samples 1024 --test-samples 300 --seed 1 --threads 1 --device cpu --amp bf16";
    char ck[256];
    snprintf(ck, sizeof ck, "%s --checkpoint-activations", data);
    double l0 = NAN, a0 = NAN, t0 = NAN, l1 = NAN, a1 = NAN, t1 = NAN;
    CHECK(run_epoch(data, &l0, &a0, &t0));
    CHECK(run_epoch(ck, &l1, &a1, &t1));
    CHECK(strstr(out, "autocast bfloat16") != NULL);
    printf("  --amp bf16: loss %.6f / test loss %.6f; with --checkpoint-activations %.6f / %.6f\n", l0, t0, l1, t1);
    CHECK(isfinite(l0) && l0 == l1 && t0 == t1 && a0 == a1);
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_amp_combos_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    em_dataset *probe = em_dataset_fashion_mnist(NULL, false);
    have_data = probe != NULL;
    /* scripts/setup.sh installs the data: without it this test fails rather than skips */
    if (!have_data) fprintf(stderr, "Fashion-MNIST is not installed: %s\n", em_last_error());
    CHECK(have_data);
    em_clear_error();
    em_dataset_free(probe);
    RUN(test_refusals);
    RUN(test_f16_resume_is_exact);
    RUN(test_missing_and_bad_scaler_state);
    RUN(test_devices_with_bf16);
    RUN(test_accumulate_with_bf16);
    RUN(test_accumulate_with_devices);
    RUN(test_accumulate_resume_is_exact);
    RUN(test_checkpoint_with_bf16);
    rmdir(dir);
    const char *want = getenv("EMBER_TEST_OPENCL_DEVICES");
    if (want && em_device_available(EM_OPENCL)) CHECK(em_device_count(EM_OPENCL) == atoi(want));
    em_clear_error();
    return test_summary();
}
