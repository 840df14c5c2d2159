/* Attention alone through Ember: em_attention, causal, bf16 (or --dtype), q, k and v
 * [B, H, L, E], forward and forward + backward, for each sequence length given; the same
 * shapes and FLOP count as bench/lm_gpu_torch.py's `sdpa` (a causal forward counts
 * 2 x 2 x B x H x L x L x E / 2 FLOPs, the backward 2.5 times that), so the GPU check sets the
 * two side by side. Each timing repeats the call for at least --min-time seconds after 3
 * warm-up calls, synchronizing the device before the clock is read.
 * Prints one `result run=sdpa impl=ember ...` line a length.
 * Usage: bench_attention [DEVICE] [--lengths 1024,2048,...] [--batch B] [--heads H]
 *                        [--head-dim E] [--dtype bf16|f16|f32] [--min-time S] */
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

static int fail(const char *what) {
    fprintf(stderr, "bench_attention: %s: %s\n", what, em_failed() ? em_last_error() : "failed");
    return 1;
}

/* one call, forward alone or with its backward; 0 on success */
static int run_once(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *g, bool backward) {
    em_scope s = em_scope_begin();
    em_attention_opts o = {.causal = true};
    em_tensor *y = em_attention(q, k, v, &o);
    int rc = y ? 0 : 1;
    if (y && backward && em_backward_with(y, g, false) != EM_OK) rc = 1;
    em_scope_end(s);
    return rc;
}

/* seconds a call, after 3 warm-up calls, over at least min_time; negative on error */
static double time_call(em_device dev, em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *g, bool backward,
                        double min_time) {
    for (int i = 0; i < 3; i++)
        if (run_once(q, k, v, g, backward)) return -1;
    if (em_device_synchronize(dev) != EM_OK) return -1;
    long reps = 0;
    double t0 = now(), t = 0;
    do {
        if (run_once(q, k, v, g, backward)) return -1;
        reps++;
        if (reps % 4 == 0 || reps < 4) {
            if (em_device_synchronize(dev) != EM_OK) return -1;
            t = now() - t0;
        }
    } while (t < min_time || reps < 3);
    if (em_device_synchronize(dev) != EM_OK) return -1;
    return (now() - t0) / (double)reps;
}

int main(int argc, char **argv) {
    em_device dev = em_device_auto();
    const char *lengths = "1024,2048,4096,8192", *dtype_name = "bf16";
    long batch = 4, heads = 16, head_dim = 64;
    double min_time = 0.5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--lengths") && val) lengths = argv[++i];
        else if (!strcmp(a, "--batch") && val) batch = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--heads") && val) heads = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--head-dim") && val) head_dim = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--dtype") && val) dtype_name = argv[++i];
        else if (!strcmp(a, "--min-time") && val) min_time = strtod(argv[++i], NULL);
        else if (a[0] != '-' && em_device_parse(a, &dev) == EM_OK) continue;
        else {
            fprintf(stderr, "bench_attention: unknown argument '%s' (see the file's header for usage)\n", a);
            return 2;
        }
    }
    em_dtype dt;
    if (!strcmp(dtype_name, "bf16")) dt = EM_BF16;
    else if (!strcmp(dtype_name, "f16")) dt = EM_F16;
    else if (!strcmp(dtype_name, "f32")) dt = EM_F32;
    else {
        fprintf(stderr, "bench_attention: --dtype expects bf16, f16 or f32, got '%s'\n", dtype_name);
        return 2;
    }
    if (batch < 1 || heads < 1 || head_dim < 1 || min_time < 0) {
        fprintf(stderr, "bench_attention: --batch, --heads and --head-dim must be positive\n");
        return 2;
    }
    em_manual_seed(0);
    char *list = strdup(lengths);
    if (!list) return fail("out of memory");
    int rc = 0;
    for (char *tok = strtok(list, ","); tok && !rc; tok = strtok(NULL, ",")) {
        long n = strtol(tok, NULL, 10);
        if (n < 1) {
            fprintf(stderr, "bench_attention: --lengths expects positive integers, got '%s'\n", tok);
            rc = 2;
            break;
        }
        em_scope s = em_scope_begin();
        em_shape shp = EM_SHAPE(batch, heads, n, head_dim);
        em_tensor *t[4];
        for (int i = 0; i < 4; i++) {
            em_tensor *f = em_randn(shp, EM_OPTS(.device = dev));
            t[i] = f ? em_to_dtype(f, dt) : NULL;
            if (!t[i]) { rc = fail("inputs"); break; }
            if (i < 3 && em_set_requires_grad(t[i], true) != EM_OK) { rc = fail("requires_grad"); break; }
        }
        if (!rc) {
            double fwd = time_call(dev, t[0], t[1], t[2], t[3], false, min_time);
            double both = fwd < 0 ? -1 : time_call(dev, t[0], t[1], t[2], t[3], true, min_time);
            if (fwd < 0 || both < 0) {
                rc = fail("attention");
            } else {
                double flops = 2.0 * 2.0 * (double)batch * (double)heads * (double)n * (double)n * (double)head_dim / 2;
                printf("result run=sdpa impl=ember device=%s dtype=%s batch=%ld heads=%ld seq=%ld head_dim=%ld "
                       "fwd_ms=%.4f fwd_bwd_ms=%.4f fwd_tflops=%.2f fwd_bwd_tflops=%.2f fused=%d\n",
                       em_device_str(dev).s, dtype_name, batch, heads, n, head_dim, fwd * 1e3, both * 1e3,
                       flops / fwd / 1e12, 3.5 * flops / both / 1e12,
                       em_sdpa_fused(dev.type) ? 1 : 0);
                fflush(stdout);
            }
        }
        em_scope_end(s);
    }
    free(list);
    return rc;
}
