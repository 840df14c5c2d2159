/* One optimizer step over the 784-256-10 MLP's parameters (784*256 + 256 + 256*10 + 10 =
 * 203530 floats), fused backend kernels against the op-by-op path, printed as lines
 *   <device> <optimizer> t<threads> fused_us <x> unfused_us <y> speedup <y/x>
 * Adam is the main number; SGD with momentum for comparison. Each time is the best of
 * several short windows (a shared machine's preemption spoils one window, not the result).
 * Usage: bench_optim [steps per window, default 50] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>
#include "optim/optim_internal.h"

#define WINDOWS 9

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static em_module *mlp_with_grads(em_device dev) {
    em_module *m = em_sequential(em_linear(784, 256), em_relu_module(), em_linear(256, 10));
    if (!m || em_module_to(m, dev) != EM_OK) return NULL;
    em_named_tensor nt[8];
    int n = em_module_parameters(m, nt, 8);
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *g = em_mul_scalar(em_randn(em_shape_of(nt[i].tensor), EM_OPTS(.device = dev)), 1e-2);
        if (em_set_grad(nt[i].tensor, g) != EM_OK) m = NULL;
    }
    em_scope_end(s);
    return m;
}

/* Seconds per em_step, best window. */
static double time_steps(em_optimizer *opt, em_device dev, int steps) {
    double best = 1e30;
    for (int w = 0; w < WINDOWS; w++) {
        em_device_synchronize(dev);
        double t0 = now();
        for (int i = 0; i < steps; i++)
            if (em_step(opt) != EM_OK) {
                fprintf(stderr, "em_step failed: %s\n", em_last_error());
                exit(1);
            }
        em_device_synchronize(dev);
        double dt = (now() - t0) / steps;
        if (dt < best) best = dt;
    }
    return best;
}

static void bench(em_device dev, bool adam, int threads, int steps) {
    em_set_num_threads(threads);
    em_module *mf = mlp_with_grads(dev), *mu = mlp_with_grads(dev);
    if (!mf || !mu) {
        fprintf(stderr, "%s: cannot build the model: %s\n", em_device_str(dev).s, em_last_error());
        exit(1);
    }
    em_optimizer *of = adam ? em_adam(mf, 1e-3) : em_sgd_ex(mf, (em_sgd_opts){.lr = 1e-2, .momentum = 0.9});
    em_optimizer *ou = adam ? em_adam(mu, 1e-3) : em_sgd_ex(mu, (em_sgd_opts){.lr = 1e-2, .momentum = 0.9});
    em__optim_set_fused(ou, false);
    time_steps(of, dev, 3); /* warm-up: states, kernels compiled, caches */
    time_steps(ou, dev, 3);
    double tf = 1e30, tu = 1e30;
    for (int r = 0; r < 3; r++) { /* alternate, so that noise falls on both */
        double a = time_steps(of, dev, steps), b = time_steps(ou, dev, steps);
        if (a < tf) tf = a;
        if (b < tu) tu = b;
    }
    printf("%-9s %-12s t%d fused_us %8.1f unfused_us %8.1f speedup %5.2f\n", em_device_str(dev).s,
           adam ? "adam" : "sgd_momentum", threads, tf * 1e6, tu * 1e6, tu / tf);
    em_optim_free(of);
    em_optim_free(ou);
    em_module_free(mf);
    em_module_free(mu);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    if (steps < 1) steps = 1;
    em_manual_seed(0);
    int maxt = em_get_num_threads();
    for (int t = 1; t <= (maxt < 2 ? maxt : 2); t++) {
        bench(EM_DEVICE_CPU, true, t, steps);
        bench(EM_DEVICE_CPU, false, t, steps);
    }
    em_set_num_threads(maxt);
    if (em_device_available(EM_OPENCL)) {
        bench(EM_DEVICE(EM_OPENCL, 0), true, maxt, steps);
        bench(EM_DEVICE(EM_OPENCL, 0), false, maxt, steps);
    } else {
        printf("opencl: not available, skipped\n");
    }
    if (em_device_available(EM_CUDA)) {
        bench(EM_DEVICE(EM_CUDA, 0), true, maxt, steps);
        bench(EM_DEVICE(EM_CUDA, 0), false, maxt, steps);
    }
    return 0;
}
