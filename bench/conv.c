/* conv2d forward + backward GFLOP/s for the shapes of `ember train --model cnn` (batch 64):
 * Ember's em_conv2d through autograd (oneDNN path and portable im2col path) against oneDNN
 * called directly, with the plain NCHW layouts Ember hands it and with the blocked layouts
 * oneDNN picks itself (format "any", reorders not timed: its best case). Also the pools.
 * Usage: bench_conv [threads] [reps]   (bench/run_cnn.sh runs it with 1 and 2 threads)
 * Prints one "conv NAME IMPL ..." line per implementation: milliseconds and GFLOP/s of the
 * forward, the backward to the data and the backward to the weights (medians), of all three,
 * and of the passes training runs ("training": the CNN's first layer needs no backward to the
 * data, its input being the batch); FLOPs count 2 per multiply-add, 2 N O OH OW C/G KH KW for
 * each pass. Ember's weight pass also gives the bias's gradient (as in training); oneDNN's
 * alone does not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>
#include "core/internal_api.h"
#include "backends/cpu/cpu_pool_simd.h"
#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <dnnl.h>
#endif

typedef struct shape {
    const char *name;
    int64_t n, c, h, w, o, k, pad;
    bool data_grad; /* training computes the input's gradient (not for the first layer: the batch) */
} shape;

static const shape shapes[] = {{"conv1 64x1x28x28 -> 16, k5 p2", 64, 1, 28, 28, 16, 5, 2, false},
                               {"conv2 64x16x14x14 -> 32, k5", 64, 16, 14, 14, 32, 5, 0, true}};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static double flops_fwd(const shape *s) {
    int64_t oh = s->h + 2 * s->pad - s->k + 1, ow = s->w + 2 * s->pad - s->k + 1;
    return 2.0 * (double)(s->n * s->o * oh * ow * s->c * s->k * s->k);
}

/* milliseconds of forward, backward to the data, backward to the weights; "training": the
 * passes a training step runs (no data gradient for the first layer) */
static void report(const shape *s, const char *impl, const double *t) {
    double f = flops_fwd(s), train = s->data_grad ? t[0] + t[1] + t[2] : t[0] + t[2];
    printf("conv %-30s %-34s fwd %6.3f ms %6.2f GF/s | bwd data %6.3f ms %6.2f GF/s | bwd weights %6.3f ms %6.2f GF/s"
           " | all %6.2f GFLOP/s | training %6.2f GFLOP/s\n", s->name, impl, 1e3 * t[0], f / t[0] / 1e9, 1e3 * t[1],
           f / t[1] / 1e9, 1e3 * t[2], f / t[2] / 1e9, 3 * f / (t[0] + t[1] + t[2]) / 1e9,
           (s->data_grad ? 3 : 2) * f / train / 1e9);
}

/* Ember's three passes as autograd runs them (the backward functions its formulas call) */
static void bench_ember(const shape *s, int reps, bool portable) {
    bool prev = em__conv_force_portable(portable);
    em_scope sc = em_scope_begin();
    em_grad_mode gm = em_no_grad_begin();
    em_tensor *x = em_randn(EM_SHAPE(s->n, s->c, s->h, s->w), EM_OPTS(0));
    em_tensor *w = em_randn(EM_SHAPE(s->o, s->c, s->k, s->k), EM_OPTS(0));
    em_tensor *b = em_randn(EM_SHAPE(s->o), EM_OPTS(0));
    int64_t xs[4] = {s->n, s->c, s->h, s->w}, ws[4] = {s->o, s->c, s->k, s->k};
    int64_t win[11] = {s->k, s->k, 1, 1, s->pad, s->pad, 1, 1, 1, 0, 0};
    double t[3][64];
    for (int r = -2; r < reps; r++) {
        em_scope it = em_scope_begin();
        double t0 = now();
        em_tensor *y = em_conv2d(x, w, b, EM_HW1(1), EM_HW1(s->pad), EM_HW1(1), 1);
        double t1 = now();
        em__conv2d_backward_input(y, w, xs, win);
        double t2 = now();
        em_tensor *gb; /* the bias's gradient with the weight's, as training asks */
        em__conv2d_backward_weight_bias(y, x, ws, win, &gb);
        double t3 = now();
        if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
        em_scope_end(it);
    }
    if (em_failed()) {
        printf("conv %s ember: %s\n", s->name, em_last_error());
        em_clear_error();
    } else {
        double m[3] = {median(t[0], reps), median(t[1], reps), median(t[2], reps)};
        report(s, portable ? "ember portable im2col" : "ember (oneDNN, nchw)", m);
    }
    em_no_grad_end(gm);
    em_scope_end(sc);
    em__conv_force_portable(prev);
}

#ifdef EMBER_HAVE_DNNL
/* oneDNN alone: primitives made once, buffers in its chosen layouts (any) or plain ones */
static void bench_dnnl(const shape *s, int reps, bool any, int threads) {
    void (*set_threads)(int);
    *(void **)&set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set_threads) set_threads(threads);
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    int64_t oh = s->h + 2 * s->pad - s->k + 1, ow = s->w + 2 * s->pad - s->k + 1;
    dnnl_dims_t sd = {s->n, s->c, s->h, s->w}, wd = {s->o, s->c, s->k, s->k}, bd = {s->o}, dd = {s->n, s->o, oh, ow};
    dnnl_dims_t strides = {1, 1}, dil = {0, 0}, pad = {s->pad, s->pad};
    dnnl_memory_desc_t src, wei, bia, dst;
    dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_x);
    dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw);
    dnnl_convolution_desc_t fd, bdd, bwd;
    dnnl_primitive_desc_t fpd, dpd, wpd;
    dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &src, &wei, &bia,
                                               &dst, strides, dil, pad, pad);
    dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL);
    dnnl_dilated_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &src, &wei, &dst, strides, dil,
                                                     pad, pad);
    dnnl_primitive_desc_create(&dpd, &bdd, NULL, eng, fpd);
    dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &src, &wei, &bia, &dst,
                                                        strides, dil, pad, pad);
    dnnl_primitive_desc_create(&wpd, &bwd, NULL, eng, fpd);
    /* memory in each primitive's own layouts (what "any" resolved to) */
    const dnnl_memory_desc_t *q[] = {
        dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0),
        dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 1), dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0),
        dnnl_primitive_desc_query_md(dpd, dnnl_query_diff_src_md, 0), dnnl_primitive_desc_query_md(dpd, dnnl_query_weights_md, 0),
        dnnl_primitive_desc_query_md(dpd, dnnl_query_diff_dst_md, 0), dnnl_primitive_desc_query_md(wpd, dnnl_query_src_md, 0),
        dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0), dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 1),
        dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_dst_md, 0)};
    dnnl_memory_t m[11];
    for (int i = 0; i < 11; i++) {
        dnnl_memory_create(&m[i], q[i], eng, DNNL_MEMORY_ALLOCATE);
        void *p;
        dnnl_memory_get_data_handle(m[i], &p);
        /* random values in every buffer (padding included): zeros could flatter a kernel */
        float *f = p;
        for (size_t k = 0; k < dnnl_memory_desc_get_size(q[i]) / sizeof *f; k++) f[k] = (float)rand() / RAND_MAX - 0.5f;
    }
    dnnl_primitive_t fp, dp, wp;
    dnnl_primitive_create(&fp, fpd);
    dnnl_primitive_create(&dp, dpd);
    dnnl_primitive_create(&wp, wpd);
    dnnl_exec_arg_t fa[] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_BIAS, m[2]}, {DNNL_ARG_DST, m[3]}};
    dnnl_exec_arg_t da[] = {{DNNL_ARG_DIFF_SRC, m[4]}, {DNNL_ARG_WEIGHTS, m[5]}, {DNNL_ARG_DIFF_DST, m[6]}};
    dnnl_exec_arg_t wa[] = {{DNNL_ARG_SRC, m[7]}, {DNNL_ARG_DIFF_WEIGHTS, m[8]}, {DNNL_ARG_DIFF_BIAS, m[9]},
                            {DNNL_ARG_DIFF_DST, m[10]}};
    double t[3][64];
    for (int r = -2; r < reps; r++) {
        double t0 = now();
        dnnl_primitive_execute(fp, st, 4, fa);
        dnnl_stream_wait(st);
        double t1 = now();
        dnnl_primitive_execute(dp, st, 3, da);
        dnnl_stream_wait(st);
        double t2 = now();
        dnnl_primitive_execute(wp, st, 4, wa);
        dnnl_stream_wait(st);
        double t3 = now();
        if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
    }
    const char *impl = NULL;
    dnnl_primitive_desc_query(fpd, dnnl_query_impl_info_str, 0, &impl);
    char label[64];
    snprintf(label, sizeof label, "oneDNN %s (%s)", any ? "any" : "nchw", impl ? impl : "?");
    double md[3] = {median(t[0], reps), median(t[1], reps), median(t[2], reps)};
    report(s, label, md);
    for (int i = 0; i < 11; i++) dnnl_memory_destroy(m[i]);
    dnnl_primitive_destroy(fp);
    dnnl_primitive_destroy(dp);
    dnnl_primitive_destroy(wp);
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(dpd);
    dnnl_primitive_desc_destroy(wpd);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
}
#endif

/* the CNN's two MaxPool2d(2), with the vector kernels (cpu_pool_simd.c) and the scalar loops */
static void bench_pools(int reps) {
    static const int64_t pool_shapes[2][4] = {{64, 16, 28, 28}, {64, 32, 10, 10}};
    em_scope sc = em_scope_begin();
    for (int s = 0; s < 2; s++) {
        const int64_t *d = pool_shapes[s];
        em_tensor *x = em_randn(EM_SHAPE(d[0], d[1], d[2], d[3]), EM_OPTS(0));
        em_set_requires_grad(x, true);
        static const char *names[] = {"scalar loops", "AVX2", "AVX-512"};
        for (int level = EM_POOL_AVX512; level >= EM_POOL_SCALAR; level--) {
            int prev = em__cpu_pool_simd(level);
            if (em__cpu_pool_simd_active() != level) { /* this CPU lacks it */
                em__cpu_pool_simd(prev);
                continue;
            }
            double tf[64], tb[64];
            for (int r = -2; r < reps; r++) {
                em_scope it = em_scope_begin();
                double t0 = now();
                em_tensor *y = em_max_pool2d(x, EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false);
                double t1 = now();
                em_tensor *gy = em_randn(em_shape_of(y), EM_OPTS(0));
                double t2 = now();
                em_backward_with(y, gy, false);
                double t3 = now();
                if (r >= 0) tf[r] = t1 - t0, tb[r] = t3 - t2;
                em_set_grad(x, NULL);
                em_scope_end(it);
            }
            em__cpu_pool_simd(prev);
            printf("max_pool2d %lldx%lldx%lldx%lld k2 (%s): fwd %.3f ms, bwd %.3f ms\n", (long long)d[0],
                   (long long)d[1], (long long)d[2], (long long)d[3], names[level],
                   1e3 * median(tf, reps), 1e3 * median(tb, reps));
        }
    }
    em_scope_end(sc);
}

/* the step's other cuts: ReLU's backward in one pass against the gt + where it
 * replaced, and the bias's gradient inside oneDNN's weight pass against a separate sum */
static void bench_relu_bias(int reps) {
    em_scope sc = em_scope_begin();
    em_grad_mode gm = em_no_grad_begin();
    em_tensor *y = em_relu(em_randn(EM_SHAPE(64, 16, 28, 28), EM_OPTS(0))), *g = em_randn(em_shape_of(y), EM_OPTS(0));
    double t[2][64];
    for (int r = -2; r < reps; r++) {
        em_scope it = em_scope_begin();
        double t0 = now();
        em__relu_backward(g, y);
        double t1 = now();
        em_where(em_gt(y, em_zeros(EM_SHAPE(1), EM_OPTS(0))), g, em_zeros(EM_SHAPE(1), EM_OPTS(0)));
        double t2 = now();
        if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1;
        em_scope_end(it);
    }
    printf("relu backward 64x16x28x28: one pass %.3f ms, gt + where %.3f ms\n", 1e3 * median(t[0], reps),
           1e3 * median(t[1], reps));
    const shape *s = &shapes[1];
    em_tensor *x = em_randn(EM_SHAPE(s->n, s->c, s->h, s->w), EM_OPTS(0));
    em_tensor *gy = em_randn(EM_SHAPE(s->n, s->o, s->h - s->k + 1, s->w - s->k + 1), EM_OPTS(0));
    int64_t ws[4] = {s->o, s->c, s->k, s->k}, win[11] = {s->k, s->k, 1, 1, 0, 0, 1, 1, 1, 0, 0};
    for (int r = -2; r < reps; r++) {
        em_scope it = em_scope_begin();
        em_tensor *gb;
        double t0 = now();
        em__conv2d_backward_weight_bias(gy, x, ws, win, &gb);
        double t1 = now();
        em__conv2d_backward_weight(gy, x, ws, win);
        em_sum(gy, EM_DIMS(0, 2, 3), false);
        double t2 = now();
        if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1;
        em_scope_end(it);
    }
    printf("%s weight + bias gradients: one oneDNN pass %.3f ms, weight pass then sum %.3f ms\n", s->name,
           1e3 * median(t[0], reps), 1e3 * median(t[1], reps));
    em_no_grad_end(gm);
    em_scope_end(sc);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 30;
    if (reps < 1 || reps > 64) reps = 30;
    em_set_num_threads(threads);
    printf("threads %d, %d reps (median)\n", threads, reps);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        bench_ember(&shapes[i], reps, false);
        bench_ember(&shapes[i], reps, true);
#ifdef EMBER_HAVE_DNNL
        bench_dnnl(&shapes[i], reps, false, threads);
        bench_dnnl(&shapes[i], reps, true, threads);
#endif
        printf("conv_flops %s %.0f\n", shapes[i].name, 3 * flops_fwd(&shapes[i]));
    }
    bench_pools(reps);
    bench_relu_bias(reps);
    return 0;
}
