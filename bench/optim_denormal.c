/* Subnormal optimizer state: Adam steps while moments decay into the subnormal range. One step with random
 * gradients, then zero gradients (the weights of always-black pixels): exp_avg shrinks by 0.9
 * per step and passes below FLT_MIN around step 760, where x86 arithmetic on the subnormal
 * values it would hold takes microcode assists. Prints, for the fused kernels (which store
 * such state as zero), the op-by-op path (IEEE gradual underflow: the slowdown the fix
 * removes) and the fused kernels under em_set_flush_denormal, the time per step of the
 * first window of steps and of the slowest, on one thread:
 *   <path> first_us <x> mean_us <m> slowest_us <y> (steps i-j) mean/first slowest/first
 * Without a flush, exp_avg never even reaches zero: the smallest subnormal times 0.9 rounds
 * back to itself, so every later step stays slow.
 * Each window's time is the best over the repeats (noise on a shared machine). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>
#include "optim/optim_internal.h"

#define STEPS 1000
#define WINDOW 50
#define NWIN (STEPS / WINDOW)
#define REPEATS 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(const char *what) {
    fprintf(stderr, "%s failed: %s\n", what, em_last_error());
    exit(1);
}

/* the gradients of every parameter of m set to randn * scale (scale 0: zeros) */
static void set_grads(em_module *m, double scale) {
    em_named_tensor nt[8];
    int n = em_module_parameters(m, nt, 8);
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *g = em_mul_scalar(em_randn(em_shape_of(nt[i].tensor), EM_OPTS()), scale);
        if (em_set_grad(nt[i].tensor, g) != EM_OK) fail("em_set_grad");
    }
    em_scope_end(s);
}

/* seconds per step in each window, the minimum over calls into best[] */
static void run(bool fused, double *best) {
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    if (!m) fail("model");
    em_optimizer *o = em_adam(m, 1e-3);
    if (!o) fail("em_adam");
    em__optim_set_fused(o, fused);
    set_grads(m, 1e-2);
    if (em_step(o) != EM_OK) fail("em_step");
    set_grads(m, 0);
    for (int w = 0; w < NWIN; w++) {
        double t0 = now();
        for (int i = 0; i < WINDOW; i++)
            if (em_step(o) != EM_OK) fail("em_step");
        double dt = (now() - t0) / WINDOW;
        if (dt < best[w]) best[w] = dt;
    }
    em_optim_free(o);
    em_module_free(m);
}

static void report(const char *name, bool fused, bool ftz) {
    double best[NWIN];
    for (int w = 0; w < NWIN; w++) best[w] = 1e30;
    if (ftz && !em_set_flush_denormal(true)) {
        printf("%-22s (em_set_flush_denormal not supported here)\n", name);
        return;
    }
    for (int r = 0; r < REPEATS; r++) run(fused, best);
    if (ftz) em_set_flush_denormal(false);
    int slow = 0;
    double sum = best[0];
    for (int w = 1; w < NWIN; w++) {
        if (best[w] > best[slow]) slow = w;
        sum += best[w];
    }
    printf("%-22s first_us %7.1f mean_us %7.1f slowest_us %7.1f (steps %d-%d) mean/first %5.2f "
           "slowest/first %5.2f\n", name, best[0] * 1e6, sum / NWIN * 1e6, best[slow] * 1e6, 2 + slow * WINDOW,
           1 + (slow + 1) * WINDOW, sum / NWIN / best[0], best[slow] / best[0]);
}

int main(void) {
    em_manual_seed(0);
    em_set_num_threads(1);
    printf("Adam on the 784-256-10 MLP (203530 floats), zero gradients after step 1, 1 thread, "
           "%d windows of %d steps\n", NWIN, WINDOW);
    report("fused (flushes state)", true, false);
    report("op-by-op (IEEE)", false, false);
    report("fused + flush_denormal", true, true);
    return 0;
}
