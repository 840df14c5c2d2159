/* DataParallel step time (include/ember/parallel.h): one training step of the 784-256-10
 * MLP (forward, cross-entropy, backward, Adam) on one device, and with em_data_parallel
 * over one and two devices, the same global batch. Prints lines
 *   <setup> batch <B> step_us <t> ratio <t / t(one device)>
 * plus, for the two-device runs, the share of the step spent copying the model into the
 * other replica (em_dp_sync). Each time is the best of 15 windows, the setups taking turns
 * window by window (a shared machine's busy spell spoils windows of all, not one's result). PoCL gives two devices with
 * POCL_DEVICES="pthread pthread" (set here when unset).
 * Usage: bench_data_parallel [steps per window, default 20] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>

#define WINDOWS 15

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_data_parallel: %s: %s\n", what, em_last_error());
    exit(1);
}

/* Seconds per step over one window: plain (dp NULL) or DataParallel. */
static double time_steps(em_module *m, em_dp *dp, em_optimizer *opt, em_tensor *x, em_tensor *y, int steps) {
    em_device dev = em_device_of(y);
    em_device_synchronize(dev);
    double t0 = now();
    for (int i = 0; i < steps; i++) {
        em_scope s = em_scope_begin();
        em_status st = em_zero_grad(opt);
        if (dp) {
            em_tensor *loss = em_cross_entropy(em_dp_forward(dp, x), y, 0.0);
            if (st == EM_OK) st = em_dp_backward(dp, loss);
            if (st == EM_OK) st = em_dp_step(dp, opt);
        } else {
            em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
            if (st == EM_OK) st = em_backward(loss);
            if (st == EM_OK) st = em_step(opt);
        }
        em_scope_end(s);
        if (st != EM_OK) die("a step failed");
    }
    em_device_synchronize(dev);
    return (now() - t0) / steps;
}

/* One setup: devs[0..n-1]; n == 0 means plain training on devs[0]. base: the index of the
 * setup its ratio is against. */
typedef struct setup {
    const char *label;
    em_device devs[2];
    int n, base;
    em_module *m;
    em_optimizer *opt;
    em_dp *dp;
    em_tensor *x, *y;
    double best, sync;
} setup;

static void make(setup *u, int64_t batch) {
    em_manual_seed(0);
    u->m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    if (!u->m || em_module_to(u->m, u->devs[0]) != EM_OK) die("cannot build the model");
    u->opt = em_adam(u->m, 1e-3);
    u->dp = u->n ? em_data_parallel(u->m, u->devs, u->n) : NULL;
    if (!u->opt || (u->n && !u->dp)) die("cannot set up");
    u->x = em_to(em_rand(EM_SHAPE(batch, 784), EM_OPTS(0)), u->devs[0]);
    u->y = em_to(em_randint(0, 10, EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64)), u->devs[0]);
    if (!u->x || !u->y) die("cannot make the batch");
    time_steps(u->m, u->dp, u->opt, u->x, u->y, 3);   /* warm-up: kernels compiled, caches filled */
    u->best = u->sync = 1e30;
}

/* The setups take turns window by window, so that a busy spell of a shared machine falls on
 * all of them rather than on one; each keeps its best window. */
static void bench_batch(setup *u, int n, int64_t batch, int steps) {
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) make(&u[i], batch);
    for (int w = 0; w < WINDOWS; w++)
        for (int i = 0; i < n; i++) {
            double t = time_steps(u[i].m, u[i].dp, u[i].opt, u[i].x, u[i].y, steps);
            if (t < u[i].best) u[i].best = t;
            if (u[i].dp && u[i].n > 1) {
                double t0 = now();
                for (int k = 0; k < steps; k++)
                    if (em_dp_sync(u[i].dp) != EM_OK) die("em_dp_sync failed");
                double sync = (now() - t0) / steps;
                if (sync < u[i].sync) u[i].sync = sync;
            }
        }
    for (int i = 0; i < n; i++) {
        printf("%-32s batch %4lld step_us %9.1f ratio %5.2f", u[i].label, (long long)batch, u[i].best * 1e6,
               u[i].best / u[u[i].base].best);
        if (u[i].dp && u[i].n > 1) printf("  sync_us %7.1f (%.0f%% of the step)", u[i].sync * 1e6, 100.0 * u[i].sync / u[i].best);
        printf("\n");
        em_dp_free(u[i].dp);
        em_optim_free(u[i].opt);
        em_module_free(u[i].m);
    }
    fflush(stdout);
    em_scope_end(s);
}

int main(int argc, char **argv) {
    setenv("POCL_DEVICES", "pthread pthread", 0);
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    if (steps < 1) steps = 20;
    int ocl = em_device_available(EM_OPENCL) ? em_device_count(EM_OPENCL) : 0;
    printf("# %d CPU thread%s per device, %d OpenCL device%s; step = zero_grad, forward, cross-entropy, backward, Adam\n",
           em_get_num_threads(), em_get_num_threads() == 1 ? "" : "s", ocl, ocl == 1 ? "" : "s");
    em_device cpu = EM_DEVICE_CPU, o0 = EM_DEVICE(EM_OPENCL, 0), o1 = EM_DEVICE(EM_OPENCL, 1);
    setup all[] = {
        {.label = "cpu", .devs = {cpu}, .n = 0, .base = 0},
        {.label = "DataParallel(cpu)", .devs = {cpu}, .n = 1, .base = 0},
        {.label = "opencl:0", .devs = {o0}, .n = 0, .base = 2},
        {.label = "DataParallel(opencl:0)", .devs = {o0}, .n = 1, .base = 2},
        {.label = "DataParallel(cpu,opencl:0)", .devs = {cpu, o0}, .n = 2, .base = 0},
        {.label = "DataParallel(opencl:0,opencl:1)", .devs = {o0, o1}, .n = 2, .base = 2},
    };
    int count = ocl >= 2 ? 6 : ocl == 1 ? 5 : 2;
    int64_t batches[] = {64, 256};
    for (int b = 0; b < 2; b++) {
        setup u[6];
        memcpy(u, all, sizeof u);
        bench_batch(u, count, batches[b], steps);
    }
    return 0;
}
