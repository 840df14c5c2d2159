/* `ember train --devices`: DataParallel over two PoCL devices, and over the CPU and a PoCL
 * device, trains as one device does (the same losses and accuracy to the printed digits,
 * checkpoints within 1e-5); the checkpoint it writes resumes on one device; bad device
 * lists fail with status 2 and a message. ctest gives it two PoCL devices (EMBER_TWO_POCL_TESTS). */
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static char out[65536], ref[65536];
static char dir[64];
static bool have_data;

static double number_after(const char *text, const char *key) {
    const char *hit = NULL;
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key)) hit = p;
    return hit ? strtod(hit + strlen(key), NULL) : NAN;
}

static double checkpoint_diff(const char *a, const char *b) {
    em_safetensors *fa = em_safetensors_load(a, EM_DEVICE_CPU), *fb = em_safetensors_load(b, EM_DEVICE_CPU);
    double worst = fa && fb && em_safetensors_count(fa) == em_safetensors_count(fb) ? 0 : INFINITY;
    for (int i = 0; isfinite(worst) && i < em_safetensors_count(fa); i++) {
        em_scope s = em_scope_begin();
        const char *name = em_safetensors_name(fa, i);
        em_tensor *x = em_safetensors_get(fa, name), *y = em_safetensors_get(fb, name);
        em_tensor *d = x && y ? em_max(em_abs(em_sub(em_to_dtype(x, EM_F64), em_to_dtype(y, EM_F64))), EM_ALL_DIMS, false) : NULL;
        double v = d ? em_item(d) : INFINITY;
        if (!(v <= worst)) worst = v;
        em_scope_end(s);
    }
    em_clear_error();
    em_safetensors_free(fa);
    em_safetensors_free(fb);
    return worst;
}

#define RUN_ARGS "--epochs 1 --train-samples 2048 --test-samples 500 --batch-size 64"

/* `--devices list` against `--device list's first`: the same numbers. */
static void compare(const char *list, const char *first) {
    char args[512], ck1[128], ck2[128];
    snprintf(ck1, sizeof ck1, "%s/one.safetensors", dir);
    snprintf(ck2, sizeof ck2, "%s/dp.safetensors", dir);
    snprintf(args, sizeof args, "train --device %s " RUN_ARGS " --checkpoint %s", first, ck1);
    int ref_rc = tool_run(args, ref, sizeof ref);
    CHECK(ref_rc == 0);
    if (ref_rc != 0) fprintf(stderr, "  ember %s: exit %d, output:\n%s\n", args, ref_rc, ref);
    snprintf(args, sizeof args, "train --devices %s " RUN_ARGS " --checkpoint %s", list, ck2);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    char want[128];
    snprintf(want, sizeof want, "on %s (DataParallel)", list);
    CHECK(strstr(out, want) != NULL);
    double l1 = number_after(ref, "train loss "), l2 = number_after(out, "train loss ");
    double a1 = number_after(ref, "test accuracy "), a2 = number_after(out, "test accuracy ");
    double d = checkpoint_diff(ck1, ck2);
    printf("  --devices %s: train loss %.4f (one device %.4f), accuracy %.2f%% (%.2f%%), weights differ by %.3g\n",
           list, l2, l1, a2, a1, d);
    CHECK(isfinite(l1) && fabs(l1 - l2) <= 1e-4);
    CHECK(isfinite(a1) && a1 == a2);
    CHECK(d <= 1e-5);
    if (rc != 0) fprintf(stderr, "  output:\n%s\n", out);
    /* the checkpoint of a DataParallel run holds the model's own names: it resumes on one device */
    snprintf(args, sizeof args, "train --device %s --epochs 2 --train-samples 2048 --test-samples 500 --resume "
             "--checkpoint %s", first, ck2);
    rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "resumed from"));
    if (rc != 0 || !strstr(out, "resumed from")) fprintf(stderr, "  ember %s: exit %d, output:\n%s\n", args, rc, out);
    remove(ck1);
    remove(ck2);
}

static void test_two_pocl_devices(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    if (!em_device_available(EM_OPENCL) || em_device_count(EM_OPENCL) < 2)
        SKIP("needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\"), found %d", em_device_count(EM_OPENCL));
    compare("opencl:0,opencl:1", "opencl:0");
}

static void test_cpu_and_pocl(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    if (!em_device_available(EM_OPENCL)) SKIP("needs an OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    compare("cpu,opencl:0", "cpu");
}

static void test_bad_device_lists(void) {
    static const struct { const char *args, *want; } cases[] = {
        {"train --devices opencl:0", "two devices or more"},
        {"train --devices cpu,cpu", "cpu is listed twice"},
        {"train --devices cpu,opencl:9", "opencl:9 does not exist here"},
        {"train --devices cpu,,opencl:0", "separated by commas"},
        {"train --devices cpu,gpu", "--devices:"},
        {"train --devices ,cpu", "separated by commas"},
        {"train --device cpu --devices cpu,opencl:0", "cannot go together"},
        {"train --devices", "--devices needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the conflict case needs an OpenCL device to get past the list itself */
        if (strstr(cases[i].args, "--device cpu") && !em_device_available(EM_OPENCL)) continue;
        int rc = tool_run(cases[i].args, out, sizeof out);
        if (rc != 2 || !strstr(out, cases[i].want))
            fprintf(stderr, "  ember %s: status %d, output:\n%s\n  (expected 2 and \"%s\")\n", cases[i].args, rc, out,
                    cases[i].want);
        CHECK(rc == 2 && strstr(out, cases[i].want));
    }
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_train_dp_XXXXXX");
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
    RUN(test_two_pocl_devices);
    RUN(test_cpu_and_pocl);
    RUN(test_bad_device_lists);
    rmdir(dir);
    /* where ctest promised two OpenCL devices, having fewer is a failure, not a skip */
    const char *want = getenv("EMBER_TEST_OPENCL_DEVICES");
    if (want && em_device_available(EM_OPENCL)) CHECK(em_device_count(EM_OPENCL) == atoi(want));
    em_clear_error();
    return test_summary();
}
