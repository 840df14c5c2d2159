/* One optimizer step over the 784-256-10 MLP's parameters (784*256 + 256 + 256*10 + 10 =
 * 203530 floats), fused backend kernels against the op-by-op path, printed as lines
 *   <device> <optimizer> t<threads> fused_us <x> unfused_us <y> speedup <y/x>
 * Adam is the main number; SGD with momentum for comparison. Each time is the best of
 * several short windows (a shared machine's preemption spoils one window, not the result).
 * Usage: bench_optim [steps per window, default 50]
 *
 *   bench_optim big
 * The fused CPU Adam step over the 4096-wide MLP's 50,343,936 float32 parameters (three
 * Linear(4096, 4096): bench/run_amp.sh's big model), on 1 and 2 threads, against a plain
 * loop moving the same bytes: Adam's access pattern (reads p, g, m, v; writes p, m, v in
 * place: 28 bytes per parameter) with one multiply-add per stream and no division, on as
 * many threads, its four arrays from the same allocator. Prints
 *   adam_big t<threads> adam_ms <x> adam_gbs <y> stream_ms <z> stream_gbs <w> adam_vs_stream <z/x>
 * Adam's square root and two divisions would take about 2 cycles per parameter (AVX2;
 * AVX-512 divides no faster per element): where adam_vs_stream is near 1 or above, Adam goes
 * as fast as its memory traffic allows on this machine. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
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

/* ---- bench_optim big ---- */
typedef struct rmw_part { float *p, *g, *m, *v; int64_t n; } rmw_part;

/* Adam's streams with one multiply-add each: what moving its bytes costs; vectorized as
 * Adam's kernel is (its AVX2 clone, src/backends/cpu/cpu_optim.c) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default"), optimize("O3")))
#endif
static void *rmw_run(void *arg) {
    rmw_part *r = arg;
    float *restrict p = r->p, *restrict m = r->m, *restrict v = r->v;
    const float *restrict g = r->g;
    for (int64_t i = 0; i < r->n; i++) {
        float gi = g[i];
        m[i] = m[i] * 0.9f + gi;
        v[i] = v[i] * 0.999f + gi;
        p[i] = p[i] + gi * 1e-3f;
    }
    return NULL;
}

static double rmw_seconds(float *const a[4], int64_t n, int threads) {
    pthread_t th[2];
    rmw_part parts[2];
    int64_t per = (n + threads - 1) / threads;
    double t0 = now();
    for (int k = 0; k < threads; k++) {
        int64_t lo = k * per, hi = lo + per < n ? lo + per : n;
        parts[k] = (rmw_part){a[0] + lo, a[1] + lo, a[2] + lo, a[3] + lo, hi - lo};
        if (k > 0 && pthread_create(&th[k], NULL, rmw_run, &parts[k]) != 0) {
            fprintf(stderr, "bench_optim: pthread_create failed\n");
            exit(1);
        }
    }
    rmw_run(&parts[0]);
    for (int k = 1; k < threads; k++) pthread_join(th[k], NULL);
    return now() - t0;
}

static int big(void) {
    int maxt = em_get_num_threads();
    em_module *m = em_nn_sequential(em_nn_linear(4096, 4096), em_nn_linear(4096, 4096), em_nn_linear(4096, 4096));
    em_named_tensor nt[8];
    int n = m ? em_module_parameters(m, nt, 8) : 0;
    int64_t np = 0;
    for (int i = 0; i < n; i++) {
        em_scope s = em_scope_begin();
        em_tensor *g = em_mul_scalar(em_randn(em_shape_of(nt[i].tensor), EM_OPTS(0)), 1e-2);
        if (em_set_grad(nt[i].tensor, g) != EM_OK) n = -1;
        em_scope_end(s);
        if (n < 0) break;
        np += em_numel(nt[i].tensor);
    }
    em_optimizer *opt = n > 0 ? em_adam(m, 1e-3) : NULL;
    /* the plain loop's arrays: as big, from the same allocator */
    em_tensor *buf[4];
    float *a[4];
    for (int k = 0; k < 4; k++) {
        buf[k] = em_full(EM_SHAPE(np), 0.5, EM_OPTS(0));
        a[k] = buf[k] ? em_data_ptr(buf[k]) : NULL;
        if (!a[k]) opt = NULL;
    }
    if (!opt) {
        fprintf(stderr, "bench_optim big: %s\n", em_last_error());
        return 1;
    }
    for (int t = 1; t <= (maxt < 2 ? maxt : 2); t++) {
        em_set_num_threads(t);
        double ta = 1e30, tb = 1e30;
        for (int r = 0; r < 8; r++) { /* alternated; the first of each warms up */
            double t0 = now();
            if (em_step(opt) != EM_OK) {
                fprintf(stderr, "bench_optim big: %s\n", em_last_error());
                return 1;
            }
            double x = now() - t0, y = rmw_seconds(a, np, t);
            if (r > 0 && x < ta) ta = x;
            if (r > 0 && y < tb) tb = y;
        }
        printf("adam_big t%d adam_ms %.2f adam_gbs %.1f stream_ms %.2f stream_gbs %.1f adam_vs_stream %.2f\n", t, ta * 1e3,
               28.0 * (double)np / ta / 1e9, tb * 1e3, 28.0 * (double)np / tb / 1e9, tb / ta);
    }
    em_set_num_threads(maxt);
    for (int k = 0; k < 4; k++) em_release(buf[k]);
    em_optim_free(opt);
    em_module_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "big") == 0) return big();
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
