/* The GPT's attention products (batch 32, 4 heads, context 64, head dim 32: q k^T, w v and
 * the four backward products on head views of [32, 64, 128] tensors), each as one batched
 * matmul, through oneDNN's batched primitive, per-matrix BLAS calls, the default per-shape choice
 * (EMBER_CPU_BATCHED_GEMM) and the built-in GEMM per matrix; process CPU microseconds per product, best of 30.
 * Usage: bench_attn_bmm [threads]   (default 1) */
#include <ember/ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "backends/cpu/cpu_gemm.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* [32, 64, 128] as heads [32, 4, 64, 32] (a view, as split_heads makes it) */
static em_tensor *heads(em_tensor *x) { return em_transpose(em_reshape(x, EM_SHAPE(32, 64, 4, 32)), 1, 2); }

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    em_set_num_threads(threads);
    em_scope s = em_scope_begin();
    em_tensor *q = heads(em_randn(EM_SHAPE(32, 64, 128), EM_OPTS(0))), *k = heads(em_randn(EM_SHAPE(32, 64, 128), EM_OPTS(0)));
    em_tensor *v = heads(em_randn(EM_SHAPE(32, 64, 128), EM_OPTS(0))), *dy = heads(em_randn(EM_SHAPE(32, 64, 128), EM_OPTS(0)));
    em_tensor *w = em_randn(EM_SHAPE(32, 4, 64, 64), EM_OPTS(0)), *ds = em_randn(EM_SHAPE(32, 4, 64, 64), EM_OPTS(0));
    struct { const char *name; em_tensor *a, *b; } prods[] = {
        {"q k^T", q, em_transpose(k, -2, -1)}, {"w v", w, v}, {"dy v^T (dw)", dy, em_transpose(v, -2, -1)},
        {"w^T dy (dv)", em_transpose(w, -2, -1), dy}, {"ds k (dq)", ds, k}, {"ds^T q (dk)", em_transpose(ds, -2, -1), q},
    };
    const char *paths[] = {"dnnl", "blas", "auto"};
    printf("threads %d; CPU us per product (all threads), best of 30\n%-14s %10s %10s %10s %10s\n", threads, "product", paths[0], paths[1], paths[2], "built-in");
    double total[3] = {0, 0, 0};
    for (size_t i = 0; i < sizeof prods / sizeof prods[0]; i++) {
        double best[3] = {1e30, 1e30, 1e30};
        for (int r = 0; r < 30; r++)
            for (int p = 0; p < 3; p++) {
                setenv("EMBER_CPU_BATCHED_GEMM", paths[p], 1);
                em_scope si = em_scope_begin();
                double t0 = cpu_now();
                em_tensor *o = em_matmul(prods[i].a, prods[i].b);
                double dt = cpu_now() - t0;
                em_scope_end(si);
                if (!o) { fprintf(stderr, "matmul failed: %s\n", em_last_error()); return 1; }
                if (dt < best[p]) best[p] = dt;
            }
        /* Ember's built-in GEMM, one call per matrix (one thread), for comparison */
        em_tensor *a = prods[i].a, *b = prods[i].b;
        em_tensor *o = em_empty(EM_SHAPE(32, 4, em_size(a, 2), em_size(b, 3)), EM_OPTS(0));
        const float *pa = (const float *)em_data_ptr(a), *pb = (const float *)em_data_ptr(b);
        float *po = (float *)em_data_ptr(o);
        int64_t M = em_size(a, 2), K = em_size(a, 3), N = em_size(b, 3);
        double bi = 1e30;
        for (int r = 0; r < 30; r++) {
            double t0 = cpu_now();
            for (int64_t n = 0; n < 32; n++)
                for (int64_t h = 0; h < 4; h++)
                    em__cpu_gemm_f32(M, N, K, pa + n * em_stride(a, 0) + h * em_stride(a, 1), em_stride(a, 2), em_stride(a, 3),
                                     pb + n * em_stride(b, 0) + h * em_stride(b, 1), em_stride(b, 2), em_stride(b, 3),
                                     po + (n * 4 + h) * M * N, N);
            double dt = cpu_now() - t0;
            if (dt < bi) bi = dt;
        }
        printf("%-14s %10.1f %10.1f %10.1f %10.1f\n", prods[i].name, 1e6 * best[0], 1e6 * best[1], 1e6 * best[2], 1e6 * bi);
        total[0] += best[0], total[1] += best[1], total[2] += best[2];
    }
    printf("%-14s %10.1f %10.1f %10.1f\n", "total", 1e6 * total[0], 1e6 * total[1], 1e6 * total[2]);
    em_scope_end(s);
    return 0;
}
