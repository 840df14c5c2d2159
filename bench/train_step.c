/* One training step of `ember train`'s model (Linear 784-256, ReLU, Linear 256-10,
 * cross-entropy, Adam lr 1e-3) on random inputs, one thread, split into forward + loss,
 * backward (zero_grad included) and the optimizer step: the minimum and the median over the
 * steps of each phase in thread CPU time (time the thread ran: a loaded machine stretches the
 * wall clock, much less this), and the share of the step the GEMMs' FLOPs would take at the
 * given GFLOP/s. The minimum is the number to compare between builds on a shared machine.
 * Usage: bench_train_step [steps] [batch...]   (default 400 steps, batches 64 256)
 * Environment: EMBER_CPU_SGEMM=auto|dnnl|openblas (which f32 GEMM; see cpu_sgemm_dnnl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ember/ember.h>

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats(const char *name, double *v, int n, double total_min) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("  %-22s min %8.1f us  median %8.1f us", name, 1e6 * v[0], 1e6 * v[n / 2]);
    if (total_min > 0) printf("  (%4.1f%% of the step's min)", 100 * v[0] / total_min);
    printf("\n");
}

static int run(int64_t batch, int steps) {
    em_scope s = em_scope_begin();
    em_manual_seed(0);
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    em_optimizer *opt = m ? em_adam_ex(m, em_adam_defaults(1e-3)) : NULL;
    em_tensor *x = em_rand(EM_SHAPE(batch, 784), EM_OPTS(0));
    em_tensor *y = em_to_dtype(em_mul_scalar(em_rand(EM_SHAPE(batch), EM_OPTS(0)), 9.999), EM_I64);
    double *t = calloc((size_t)steps * 4, sizeof *t);
    if (!opt || !x || !y || !t) {
        fprintf(stderr, "bench_train_step: %s\n", em_failed() ? em_last_error() : "out of memory");
        free(t);
        em_module_free(m);
        em_scope_end(s);
        return 1;
    }
    int warm = 20;
    for (int i = -warm; i < steps; i++) {
        em_scope st = em_scope_begin();
        double t0 = cpu_now();
        em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
        double t1 = cpu_now();
        bool ok = loss && em_zero_grad(opt) == EM_OK && em_backward(loss) == EM_OK;
        double t2 = cpu_now();
        ok = ok && em_step(opt) == EM_OK;
        double t3 = cpu_now();
        em_scope_end(st);
        if (!ok) {
            fprintf(stderr, "bench_train_step: %s\n", em_last_error());
            free(t);
            em_optim_free(opt);
            em_module_free(m);
            em_scope_end(s);
            return 1;
        }
        if (i >= 0) {
            t[i] = t1 - t0;
            t[steps + i] = t2 - t1;
            t[2 * steps + i] = t3 - t2;
            t[3 * steps + i] = t3 - t0;
        }
    }
    double flops = 2.0 * (double)batch * (2 * 784 * 256 + 3 * 256 * 10);
    printf("batch %lld, %d steps (thread CPU time):\n", (long long)batch, steps);
    stats("step", t + 3 * steps, steps, 0);
    double total = t[3 * steps];
    stats("forward + loss", t, steps, total);
    stats("zero_grad + backward", t + steps, steps, total);
    stats("optimizer (Adam)", t + 2 * steps, steps, total);
    printf("  GEMM work %.1f MFLOP per step: %.0f GFLOP/s over the whole step's min\n", flops / 1e6,
           flops / total / 1e9);
    free(t);
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
    return 0;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 400;
    if (steps < 1) steps = 400;
    em_set_num_threads(1);
    int rc = 0;
    if (argc > 2) {
        for (int i = 2; i < argc; i++) rc |= run(atoll(argv[i]), steps);
    } else {
        rc |= run(64, steps);
        rc |= run(256, steps);
    }
    return rc;
}
