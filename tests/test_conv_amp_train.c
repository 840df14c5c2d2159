/* `ember train --model cnn --amp`: the convolutions run under autocast too (conv2d in the
 * low dtype, float32 weights). On the CPU, 2 epochs on the first 3000 training samples reach
 * float32's test accuracy within 2 points with bf16, and f16 (with loss scaling) trains
 * without skipping every step; on an OpenCL device a short bf16 run trains (PoCL is slow).
 * Under the sanitizers only the short runs. */
#include <math.h>
#include <stdlib.h>
#include <ember/ember.h>
#include "test.h"
#include "tool_run.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

typedef struct run_result {
    int rc, epochs;
    double first_loss, last_loss, accuracy;
    char out[16384];
} run_result;

static void train(const char *device, const char *amp, int epochs, const char *data, run_result *r) {
    char args[512];
    snprintf(args, sizeof args, "train --model cnn --device %s %s --epochs %d %s --checkpoint none", device, amp,
             epochs, data);
    memset(r, 0, sizeof *r);
    r->rc = tool_run(args, r->out, sizeof r->out);
    r->first_loss = r->last_loss = r->accuracy = NAN;
    for (const char *p = r->out; (p = strstr(p, "epoch ")) != NULL; p++) {
        int e, n;
        double loss, acc;
        if (sscanf(p, "epoch %d/%d: train loss %lf, test accuracy %lf%%", &e, &n, &loss, &acc) != 4) continue;
        if (r->epochs++ == 0) r->first_loss = loss;
        r->last_loss = loss;
        r->accuracy = acc;
    }
    if (r->rc != 0 || r->epochs != epochs) fprintf(stderr, "  ember %s:\n%s\n", args, r->out);
}

static void test_cpu_bf16_matches_f32(void) {
    if (SANITIZED) SKIP("the accuracy comparison runs in the release build (sanitizers are 10x slower)");
    const char *data = "--train-samples 3000 --test-samples 1500 --seed 1";
    static run_result f32, bf16;
    train("cpu", "", 2, data, &f32);
    train("cpu", "--amp bf16", 2, data, &bf16);
    CHECK(f32.rc == 0 && bf16.rc == 0 && f32.epochs == 2 && bf16.epochs == 2);
    CHECK(strstr(bf16.out, "autocast bfloat16") != NULL);
    printf("  cnn, cpu, 2 epochs on 3000 samples: test accuracy float32 %.2f%%, --amp bf16 %.2f%%\n", f32.accuracy,
           bf16.accuracy);
    CHECK(fabs(bf16.accuracy - f32.accuracy) <= 2.0);
    CHECK(bf16.accuracy > 60.0); /* it learned: 10 classes, chance is 10% */
}

static void test_short_runs(void) {
    const char *small = "--train-samples 640 --test-samples 200 --seed 2";
    static run_result r;
    train("cpu", "--amp f16", 1, small, &r);
    CHECK(r.rc == 0 && r.epochs == 1 && isfinite(r.last_loss));
    CHECK(strstr(r.out, "0 skipped steps") != NULL);
    train("cpu", "--amp bf16", 1, small, &r);
    CHECK(r.rc == 0 && r.epochs == 1 && isfinite(r.last_loss) && r.accuracy > 20.0);
}

static void test_opencl_bf16(void) {
    if (SANITIZED) SKIP("PoCL under the sanitizers is too slow for a training run");
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    static run_result r;
    train("opencl:0", "--amp bf16", 1, "--train-samples 640 --test-samples 200 --seed 1", &r);
    CHECK(r.rc == 0 && r.epochs == 1 && isfinite(r.last_loss) && r.accuracy > 20.0);
    printf("  cnn, opencl:0, --amp bf16, 640 samples: train loss %.4f, test accuracy %.2f%%\n", r.last_loss,
           r.accuracy);
}

int main(void) {
    if (!tool_path()) {
        CHECK(false); /* build/ember must be built next to the tests */
        return test_summary();
    }
    RUN(test_short_runs);
    RUN(test_cpu_bf16_matches_f32);
    RUN(test_opencl_bf16);
    return test_summary();
}
