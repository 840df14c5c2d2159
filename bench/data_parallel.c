/* DataParallel step time (include/ember/parallel.h): one training step of the 784-256-10
 * MLP (forward, cross-entropy, backward, Adam) on one device, and with em_data_parallel
 * over one and two devices, the same global batch. Prints lines
 *   <setup> batch <B> step_us <t> ratio <t / t(one device)>
 * plus, for the two-device runs, the share of the step spent copying the model into the
 * other replica (em_dp_sync). Each time is the best of several windows (a shared machine's
 * preemption spoils a window, not the result). PoCL gives two devices with
 * POCL_DEVICES="pthread pthread" (set here when unset).
 * Usage: bench_data_parallel [steps per window, default 20] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>

#define WINDOWS 7

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_data_parallel: %s: %s\n", what, em_last_error());
    exit(1);
}

/* Seconds per step, best window: plain (dp NULL) or DataParallel. */
static double time_steps(em_module *m, em_dp *dp, em_optimizer *opt, em_tensor *x, em_tensor *y, int steps) {
    double best = 1e30;
    em_device dev = em_device_of(y);
    for (int w = 0; w < WINDOWS; w++) {
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
        double dt = (now() - t0) / steps;
        if (dt < best) best = dt;
    }
    return best;
}

static double time_sync(em_dp *dp, int steps) {
    double best = 1e30;
    for (int w = 0; w < WINDOWS; w++) {
        double t0 = now();
        for (int i = 0; i < steps; i++)
            if (em_dp_sync(dp) != EM_OK) die("em_dp_sync failed");
        double dt = (now() - t0) / steps;
        if (dt < best) best = dt;
    }
    return best;
}

/* One setup: devs[0..n-1]; n == 0 means plain training on devs[0]. */
static double run(const char *label, const em_device *devs, int n, int64_t batch, int steps, double base) {
    em_manual_seed(0);
    em_module *m = em_sequential(em_linear(784, 256), em_relu_module(), em_linear(256, 10));
    if (!m || em_module_to(m, devs[0]) != EM_OK) die("cannot build the model");
    em_optimizer *opt = em_adam(m, 1e-3);
    em_dp *dp = n ? em_data_parallel(m, devs, n) : NULL;
    if (!opt || (n && !dp)) die("cannot set up");
    em_scope s = em_scope_begin();
    em_tensor *x = em_to(em_rand(EM_SHAPE(batch, 784), EM_OPTS(0)), devs[0]);
    em_tensor *y = em_to(em_randint(0, 10, EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64)), devs[0]);
    time_steps(m, dp, opt, x, y, 3);   /* warm-up: kernels compiled, caches filled */
    double t = time_steps(m, dp, opt, x, y, steps);
    printf("%-32s batch %4lld step_us %9.1f ratio %5.2f", label, (long long)batch, t * 1e6, base > 0 ? t / base : 1.0);
    if (dp && n > 1) {
        double sync = time_sync(dp, steps);
        printf("  sync_us %7.1f (%.0f%% of the step)", sync * 1e6, 100.0 * sync / t);
    }
    printf("\n");
    fflush(stdout);
    em_scope_end(s);
    em_dp_free(dp);
    em_optim_free(opt);
    em_module_free(m);
    return t;
}

int main(int argc, char **argv) {
    setenv("POCL_DEVICES", "pthread pthread", 0);
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    if (steps < 1) steps = 20;
    int ocl = em_device_available(EM_OPENCL) ? em_device_count(EM_OPENCL) : 0;
    printf("# %d CPU thread%s per device, %d OpenCL device%s; step = zero_grad, forward, cross-entropy, backward, Adam\n",
           em_get_num_threads(), em_get_num_threads() == 1 ? "" : "s", ocl, ocl == 1 ? "" : "s");
    em_device cpu[] = {EM_DEVICE_CPU};
    em_device o1[] = {EM_DEVICE(EM_OPENCL, 0)};
    em_device o2[] = {EM_DEVICE(EM_OPENCL, 0), EM_DEVICE(EM_OPENCL, 1)};
    em_device co[] = {EM_DEVICE_CPU, EM_DEVICE(EM_OPENCL, 0)};
    int64_t batches[] = {64, 256};
    for (int b = 0; b < 2; b++) {
        double base = run("cpu", cpu, 0, batches[b], steps, 0);
        run("DataParallel(cpu)", cpu, 1, batches[b], steps, base);
        if (ocl >= 1) {
            double obase = run("opencl:0", o1, 0, batches[b], steps, 0);
            run("DataParallel(opencl:0)", o1, 1, batches[b], steps, obase);
            if (ocl >= 2) run("DataParallel(opencl:0,opencl:1)", o2, 2, batches[b], steps, obase);
            run("DataParallel(cpu,opencl:0)", co, 2, batches[b], steps, base);
        }
    }
    return 0;
}
