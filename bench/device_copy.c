/* Device-to-device copy bandwidth through Ember (em_copy_ between two tensors on one
 * device): the memory roofline scripts/gpu_check.sh divides by. Prints
 *   device_copy device=cuda:0 bytes=1073741824 seconds=... traffic_GBps=...
 * where traffic counts each byte read and written (2 x bytes per copy), as HBM bandwidth
 * figures do. Usage: bench_device_copy [device] [MiB] [min-seconds]
 * (defaults: auto, 1024, 1). Exit status 1, with the reason, when the device fails. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_device_copy: %s: %s\n", what, em_failed() ? em_last_error() : "failed");
    return 1;
}

int main(int argc, char **argv) {
    em_device dev = em_device_auto();
    if (argc > 1 && em_device_parse(argv[1], &dev) != EM_OK) return fail("device");
    char *end = NULL;
    long mib = argc > 2 ? strtol(argv[2], &end, 10) : 1024;
    double min_time = argc > 3 ? strtod(argv[3], NULL) : 1.0;
    if ((end && *end) || mib < 1 || mib > (1L << 20) || !(min_time > 0 && min_time <= 60)) {
        fprintf(stderr, "usage: bench_device_copy [device] [MiB, 1 to 1048576] [min-seconds, up to 60]\n");
        return 2;
    }
    int64_t n = (int64_t)mib * (1 << 20) / 4;
    em_tensor *src = em_ones(EM_SHAPE(n), EM_OPTS(.device = dev));
    em_tensor *dst = em_empty(EM_SHAPE(n), EM_OPTS(.device = dev));
    if (!src || !dst) return fail("allocating two tensors");
    /* warm-up, then batches of copies until min_time has passed; the best batch counts */
    if (em_copy_(dst, src) != EM_OK || em_device_synchronize(dev) != EM_OK) return fail("copy");
    double best = 1e30, total = 0;
    int reps = 1;
    while (total < min_time) {
        double t0 = now();
        for (int i = 0; i < reps; i++)
            if (em_copy_(dst, src) != EM_OK) return fail("copy");
        if (em_device_synchronize(dev) != EM_OK) return fail("synchronize");
        double dt = now() - t0;
        total += dt;
        if (dt / reps < best) best = dt / reps;
        if (dt < 0.05 && reps < (1 << 20)) reps *= 2;
    }
    int64_t bytes = n * 4;
    printf("device_copy device=%s bytes=%lld seconds=%.6g traffic_GBps=%.1f\n", em_device_str(dev).s,
           (long long)bytes, best, 2.0 * (double)bytes / best / 1e9);
    em_release(src);
    em_release(dst);
    return 0;
}
