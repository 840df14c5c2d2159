/* A language model's loss head on the CPU: em_linear_cross_entropy (chunked, the [N, V] logits
 * never held) against the composition it replaces, em_cross_entropy(em_addmm(b, h, W^T)), one
 * training step each (forward and backward, h, W and b requiring grad). The two alternate,
 * round after round, and each reports the median of its rounds' wall times and the largest peak
 * of allocated CPU memory above the inputs (em_memory_max_allocated). One "key value" per line,
 * for bench/run_linear_ce.sh.
 * Usage: bench_linear_ce [N H V chunk rounds [f32|bf16]]  (default 1024 1024 32000 0 5 f32;
 * chunk 0: the op's default) */
#include <ember/ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* one step; its time in seconds, its peak above what was allocated before in *peak */
static double step(bool fused, em_tensor *h, em_tensor *w, em_tensor *b, em_tensor *t, int64_t chunk,
                   int64_t *peak, double *loss_value) {
    em_device cpu = EM_DEVICE_CPU;
    em_set_grad(h, NULL);
    em_set_grad(w, NULL);
    em_set_grad(b, NULL);
    int64_t base = em_memory_allocated(cpu);
    em_memory_reset_peak_stats(cpu);
    em_scope s = em_scope_begin();
    double t0 = now();
    em_tensor *loss = fused ? em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.chunk_size = chunk})
                            : em_cross_entropy(em_to_dtype(em_addmm(b, h, em_transpose(w, 0, 1), 1.0, 1.0), EM_F32), t, 0.0);
    if (loss) em_backward(loss);
    double dt = now() - t0;
    *loss_value = loss ? em_item(loss) : 0.0;
    em_scope_end(s);
    int64_t p = em_memory_max_allocated(cpu) - base;
    if (p > *peak) *peak = p;
    return dt;
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 1024, hd = argc > 2 ? atoll(argv[2]) : 1024;
    int64_t v = argc > 3 ? atoll(argv[3]) : 32000, chunk = argc > 4 ? atoll(argv[4]) : 0;
    int rounds = argc > 5 ? atoi(argv[5]) : 5;
    em_dtype dt = argc > 6 && !strcmp(argv[6], "bf16") ? EM_BF16 : EM_F32;
    if (n < 1 || hd < 1 || v < 1 || chunk < 0 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: bench_linear_ce [N H V chunk rounds [f32|bf16]] (positive sizes, 1..100 rounds)\n");
        return 2;
    }
    em_manual_seed(5);
    em_tensor *h = em_keep(em_to_dtype(em_randn(EM_SHAPE(n, hd), EM_OPTS()), dt));
    em_tensor *w = em_keep(em_to_dtype(em_mul_scalar(em_randn(EM_SHAPE(v, hd), EM_OPTS()), 0.02), dt));
    em_tensor *b = em_keep(em_zeros(EM_SHAPE(v), EM_OPTS(.dtype = dt)));
    em_tensor *t = em_keep(em_randint(0, v, EM_SHAPE(n), EM_OPTS(.dtype = EM_I64)));
    if (!h || !w || !b || !t) {
        fprintf(stderr, "bench_linear_ce: %s\n", em_last_error());
        return 1;
    }
    em_set_requires_grad(h, true);
    em_set_requires_grad(w, true);
    em_set_requires_grad(b, true);
    double tf[100], tc[100], lf = 0, lc = 0;
    int64_t pf = 0, pc = 0;
    step(true, h, w, b, t, chunk, &pf, &lf); /* warm-up: the allocator's cache and the GEMM's packing */
    step(false, h, w, b, t, chunk, &pc, &lc);
    pf = pc = 0;
    for (int r = 0; r < rounds; r++) { /* alternated, the first of each round changing sides */
        if (r % 2 == 0) {
            tf[r] = step(true, h, w, b, t, chunk, &pf, &lf);
            tc[r] = step(false, h, w, b, t, chunk, &pc, &lc);
        } else {
            tc[r] = step(false, h, w, b, t, chunk, &pc, &lc);
            tf[r] = step(true, h, w, b, t, chunk, &pf, &lf);
        }
    }
    if (em_failed()) {
        fprintf(stderr, "bench_linear_ce: %s\n", em_last_error());
        return 1;
    }
    qsort(tf, (size_t)rounds, sizeof tf[0], cmp_double);
    qsort(tc, (size_t)rounds, sizeof tc[0], cmp_double);
    printf("shape N=%lld H=%lld V=%lld %s threads=%d rounds=%d\n", (long long)n, (long long)hd, (long long)v,
           em_dtype_name(dt), em_get_num_threads(), rounds);
    printf("fused_ms %.1f\nfused_peak_mib %.1f\nfused_loss %.6f\n", 1e3 * tf[rounds / 2], pf / 1048576.0, lf);
    printf("composed_ms %.1f\ncomposed_peak_mib %.1f\ncomposed_loss %.6f\n", 1e3 * tc[rounds / 2], pc / 1048576.0, lc);
    em_release(h);
    em_release(w);
    em_release(b);
    em_release(t);
    return 0;
}
