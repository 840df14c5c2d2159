/* em_linear_cross_entropy against PyTorch 2.15 (tests/data/golden_linear_ce.safetensors, made by
 * scripts/golden_linear_ce.py): F.cross_entropy(F.linear(h, w, b).float(), target, ...) for each
 * reduction, with ignored rows, label smoothing, a custom ignore_index, no bias, in float32 and
 * bfloat16; the loss and the gradients of h, w and b, on every available device and with chunk
 * sizes that divide N (10) and do not, the default chunk and one chunk larger than N. The GPUs'
 * kernel for the rows' loss and gradient (CE_ROWS, softmax.k's ce_rows_f32) against the CPU's
 * composition of the same rows, on PoCL. Then the memory it saves on the CPU against the
 * unfused composition, and bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"
#include "core/internal_api.h"

static em_safetensors *g_file;
static em_device g_dev;
static const char *g_case;
static int64_t g_chunk;

static em_tensor *get(const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s/%s", g_case, name);
    for (int i = 0; i < em_safetensors_count(g_file); i++)
        if (!strcmp(em_safetensors_name(g_file, i), key)) return em_to(em_safetensors_get(g_file, key), g_dev);
    return NULL;
}
static em_tensor *leaf(const char *name) {
    em_tensor *t = em_clone(get(name));
    if (t) em_set_requires_grad(t, true);
    return t;
}
static const char *meta_str(const char *key, char *buf, size_t size) {
    const char *m = em_safetensors_metadata(g_file, g_case);
    size_t kl = strlen(key);
    for (const char *p = m; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') {
            size_t n = strcspn(p + kl + 1, " ");
            snprintf(buf, size, "%.*s", (int)n, p + kl + 1);
            return buf;
        }
        p = strchr(p, ' ');
        if (p) p++;
    }
    snprintf(buf, size, "?");
    return buf;
}

/* got against want: within atol + rtol |want| in float32; in bf16 within atol plus one bf16
 * unit of want (a rounding one way or the other), with the bit-identical share printed */
static void expect(const char *what, em_tensor *got, em_tensor *want, double atol, double rtol) {
    char label[200];
    snprintf(label, sizeof label, "%s %s chunk %lld %s", em_device_str(g_dev).s, g_case, (long long)g_chunk, what);
    if (!got || !want) {
        fprintf(stderr, "  %s: missing (%s)\n", label, em_failed() ? em_last_error() : "no error");
        CHECK(got && want);
        em_clear_error();
        return;
    }
    CHECK(em_numel(got) == em_numel(want) && em_dtype_of(got) == em_dtype_of(want));
    if (em_numel(got) != em_numel(want) || em_dtype_of(got) != em_dtype_of(want)) {
        fprintf(stderr, "  %s: %lld elements of %s, expected %lld of %s\n", label, (long long)em_numel(got),
                em_dtype_name(em_dtype_of(got)), (long long)em_numel(want), em_dtype_name(em_dtype_of(want)));
        return;
    }
    int64_t n = em_numel(want), same = 0;
    double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(em_contiguous(got)), EM_F64), x, (size_t)n * sizeof *x));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(want), EM_F64), y, (size_t)n * sizeof *y));
    bool low = em_dtype_of(want) == EM_BF16;
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        same += x[i] == y[i];
        double tol = low ? atol + ldexp(fabs(y[i]), -7) : atol + rtol * fabs(y[i]);
        double e = fabs(x[i] - y[i]) / tol;
        if (!(e <= worst)) worst = e, at = i;
    }
    if (low && g_chunk == 3) printf("  %s: %lld of %lld bit-identical to PyTorch\n", label, (long long)same, (long long)n);
    if (!(worst <= 1)) fprintf(stderr, "  %s: element %lld is %.9g, expected %.9g\n", label, (long long)at, x[at], y[at]);
    CHECK(worst <= 1);
    free(x);
    free(y);
}

static void run_case(void) {
    char red[16], sm[32], ig[32], bias[8], dt[8];
    meta_str("reduction", red, sizeof red);
    meta_str("smoothing", sm, sizeof sm);
    meta_str("ignore", ig, sizeof ig);
    meta_str("bias", bias, sizeof bias);
    meta_str("dtype", dt, sizeof dt);
    int64_t ignore = strtoll(ig, NULL, 10);
    em_linear_ce_opts o = {.chunk_size = g_chunk,
                           .reduction = !strcmp(red, "sum") ? EM_REDUCTION_SUM
                                        : !strcmp(red, "none") ? EM_REDUCTION_NONE : EM_REDUCTION_MEAN,
                           .ignore_index = ignore == -100 ? NULL : &ignore,
                           .label_smoothing = strtod(sm, NULL)};
    em_tensor *h = leaf("h"), *w = leaf("w"), *b = !strcmp(bias, "1") ? leaf("b") : NULL;
    em_tensor *loss = em_linear_cross_entropy(h, w, b, get("target"), &o);
    bool low = !strcmp(dt, "bf16");
    /* bf16: the logits are rounded as PyTorch's bf16 linear rounds them, the loss is float32 */
    expect("loss", loss, get("loss"), 1e-6, 1e-5);
    if (!loss) return;
    CHECK(!strcmp(em_grad_fn_name(loss), "LinearCrossEntropyBackward"));
    CHECK_OK(em_backward_with(loss, get("gy"), false));
    /* bf16 gradients: within one rounding (sums in another order; on the CPU all are
     * bit-identical to PyTorch's, the counts printed above) */
    double atol = low ? 0.0 : 1e-6;
    expect("dh", em_grad(h), get("dh"), atol, 1e-5);
    expect("dw", em_grad(w), get("dw"), atol, 1e-5);
    if (b) expect("db", em_grad(b), get("db"), atol, 1e-5);
}

static void run_device(em_device d) {
    g_dev = d;
    static const int64_t chunks[] = {3, 5, 0, 64};
    int cases = 0;
    static char seen[32][64];
    for (int i = 0; i < em_safetensors_count(g_file); i++) {
        const char *name = em_safetensors_name(g_file, i), *slash = strchr(name, '/');
        char c[64];
        snprintf(c, sizeof c, "%.*s", (int)(slash - name), name);
        bool done = false;
        for (int k = 0; k < cases && !done; k++) done = !strcmp(seen[k], c);
        if (done || cases == 32) continue;
        snprintf(seen[cases++], 64, "%s", c);
        g_case = seen[cases - 1];
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            g_chunk = chunks[k];
            em_scope s = em_scope_begin();
            run_case();
            if (em_failed()) {
                fprintf(stderr, "  %s %s: %s\n", em_device_str(d).s, g_case, em_last_error());
                CHECK(!em_failed());
                em_clear_error();
            }
            em_scope_end(s);
        }
    }
    CHECK(cases == 14);
}

static void test_golden_cpu(void) { run_device(EM_DEVICE_CPU); }
static void test_golden_opencl(void) {
    if (em_device_count(EM_OPENCL) == 0) SKIP("no OpenCL device");
    run_device(EM_DEVICE(EM_OPENCL, 0));
}
static void test_golden_cuda(void) {
    if (em_device_count(EM_CUDA) == 0) SKIP("no CUDA device");
    run_device(EM_DEVICE(EM_CUDA, 0));
}

/* No gradient wanted: no graph, and the same loss. */
/* max |a - b| / max |b| (normwise: the GEMMs of the two devices sum in other orders) */
static double rel_diff(em_tensor *a, em_tensor *b) {
    em_tensor *d = em_max(em_abs(em_sub(em_cpu(a), em_cpu(b))), EM_ALL_DIMS, false);
    em_tensor *m = em_max(em_abs(em_cpu(b)), EM_ALL_DIMS, false);
    return d && m ? em_item(d) / (em_item(m) + 1e-30) : INFINITY;
}

/* The rows' kernel on the GPU against the composition on the CPU (which declines the op):
 * rows longer and shorter than a block, label smoothing or none, every reduction, an ignored
 * row; and the op itself runs on the GPU only. */
static void test_gpu_rows_kernel(void) {
    if (em_device_count(EM_OPENCL) == 0) SKIP("no OpenCL device");
    em_device gpu = EM_DEVICE(EM_OPENCL, 0);
    static const int64_t vocab[2] = {37, 1000};
    static const double smooth[2] = {0.0, 0.1};
    static const em_reduction red[3] = {EM_REDUCTION_MEAN, EM_REDUCTION_SUM, EM_REDUCTION_NONE};
    for (int vi = 0; vi < 2; vi++)
        for (int si = 0; si < 2; si++)
            for (int ri = 0; ri < 3; ri++) {
                em_scope s = em_scope_begin();
                em_manual_seed(41);
                int64_t N = 9, H = 16, V = vocab[vi];
                em_tensor *h0 = em_randn(EM_SHAPE(N, H), EM_OPTS()), *w0 = em_randn(EM_SHAPE(V, H), EM_OPTS());
                em_tensor *b0 = em_randn(EM_SHAPE(V), EM_OPTS());
                int64_t tv[9] = {0, 5, V - 1, -100, 3, 7, 11, 2, 1};
                em_tensor *t = em_from_data(tv, EM_I64, EM_SHAPE(N), EM_OPTS(.dtype = EM_I64));
                em_linear_ce_opts o = {.chunk_size = 4, .reduction = red[ri], .label_smoothing = smooth[si]};
                em_tensor *loss[2], *gr[2][3];
                for (int d = 0; d < 2; d++) {
                    em_device dev = d ? gpu : EM_DEVICE_CPU;
                    em_tensor *in[3] = {em_clone(em_to(h0, dev)), em_clone(em_to(w0, dev)), em_clone(em_to(b0, dev))};
                    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(in[i], true));
                    loss[d] = em_linear_cross_entropy(in[0], in[1], in[2], em_to(t, dev), &o);
                    CHECK(loss[d] != NULL);
                    if (!loss[d]) break;
                    CHECK_OK(em_backward(em_sum(loss[d], EM_ALL_DIMS, false)));
                    for (int i = 0; i < 3; i++) gr[d][i] = em_grad(in[i]);
                }
                char what[96];
                snprintf(what, sizeof what, "V=%lld s=%g reduction %d", (long long)V, smooth[si], ri);
                double e = loss[0] && loss[1] ? rel_diff(loss[1], loss[0]) : INFINITY;
                for (int i = 0; i < 3 && loss[1]; i++) {
                    double gi = rel_diff(gr[1][i], gr[0][i]);
                    e = gi > e ? gi : e;
                }
                if (!(e < 1e-5)) fprintf(stderr, "  %s: relative difference %g\n", what, e);
                CHECK(e < 1e-5);
                em_scope_end(s);
            }
    /* the op: on the GPU it runs, the CPU declines it (nothing recorded) */
    em_scope s = em_scope_begin();
    for (int d = 0; d < 2; d++) {
        em_device dev = d ? gpu : EM_DEVICE_CPU;
        em_tensor *z = em_to(em_randn(EM_SHAPE(3, 50), EM_OPTS()), dev);
        em_tensor *tg = em_to(em_from_data((int64_t[]){1, 49, 0}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64)), dev);
        em_tensor *valid = em_to(em_ones(EM_SHAPE(3), EM_OPTS()), dev), *rs = em_to(em_full(EM_SHAPE(3), 0.5, EM_OPTS()), dev);
        em_tensor *lo = em_to(em_zeros(EM_SHAPE(3), EM_OPTS()), dev), *dz = NULL;
        em_status st = em__ce_rows(z, tg, valid, rs, 0.1, lo, &dz);
        CHECK(d ? st == EM_OK && dz != NULL : st == EM_ERR_NOT_SUPPORTED && !em_failed());
        if (d && dz) { /* dz rows sum to 0: rowscale (1 - (1 - s) - s) */
            double sum = em_item(em_max(em_abs(em_sum(dz, EM_DIMS(1), false)), EM_ALL_DIMS, false));
            CHECK(sum < 1e-6);
        }
    }
    em_scope_end(s);
}

static void test_no_grad(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_tensor *h = em_randn(EM_SHAPE(9, 8), EM_OPTS()), *w = em_randn(EM_SHAPE(20, 8), EM_OPTS());
    em_tensor *t = em_randint(0, 20, EM_SHAPE(9), EM_OPTS(.dtype = EM_I64));
    em_tensor *fused = em_linear_cross_entropy(h, w, NULL, t, &(em_linear_ce_opts){.chunk_size = 4});
    CHECK(fused && !em_requires_grad(fused) && em_grad_fn_name(fused) == NULL);
    em_tensor *composed = em_cross_entropy(em_matmul(h, em_transpose(w, 0, 1)), t, 0.0);
    CHECK_NEAR(em_item(fused), em_item(composed), 1e-5);
    em_scope_end(s);
}

/* float64 against the composition (which PyTorch's formula is), a chunk that does not divide N;
 * and 'mean' over rows all ignored: NaN, zero gradients, as PyTorch's. */
static void test_f64_and_all_ignored(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_opts o = EM_OPTS(.dtype = EM_F64, .requires_grad = true);
    em_tensor *h = em_randn(EM_SHAPE(7, 5), o), *w = em_randn(EM_SHAPE(11, 5), o), *b = em_randn(EM_SHAPE(11), o);
    em_tensor *t = em_randint(0, 11, EM_SHAPE(7), EM_OPTS(.dtype = EM_I64));
    em_tensor *fused = em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.chunk_size = 2, .label_smoothing = 0.3});
    CHECK(fused && em_dtype_of(fused) == EM_F64);
    CHECK_OK(em_backward(fused));
    em_tensor *gh = em_clone(em_grad(h)), *gw = em_clone(em_grad(w)), *gb = em_clone(em_grad(b));
    CHECK_OK(em_zero_grad_tensor(h));
    CHECK_OK(em_zero_grad_tensor(w));
    CHECK_OK(em_zero_grad_tensor(b));
    em_tensor *composed = em_cross_entropy(em_addmm(b, h, em_transpose(w, 0, 1), 1.0, 1.0), t, 0.3);
    CHECK_OK(em_backward(composed));
    CHECK_NEAR(em_item(fused), em_item(composed), 1e-12);
    CHECK(em_item(em_max(em_abs(em_sub(gh, em_grad(h))), EM_ALL_DIMS, false)) < 1e-12);
    CHECK(em_item(em_max(em_abs(em_sub(gw, em_grad(w))), EM_ALL_DIMS, false)) < 1e-12);
    CHECK(em_item(em_max(em_abs(em_sub(gb, em_grad(b))), EM_ALL_DIMS, false)) < 1e-12);

    em_tensor *h2 = em_randn(EM_SHAPE(3, 5), EM_OPTS(.requires_grad = true)), *w2 = em_randn(EM_SHAPE(11, 5), EM_OPTS());
    int64_t pad = 4;
    em_tensor *all_pad = em_full(EM_SHAPE(3), 4, EM_OPTS(.dtype = EM_I64));
    em_tensor *nan_loss = em_linear_cross_entropy(h2, w2, NULL, all_pad, &(em_linear_ce_opts){.ignore_index = &pad});
    CHECK(nan_loss && isnan(em_item(nan_loss)));
    CHECK_OK(em_backward(nan_loss));
    CHECK(em_item(em_max(em_abs(em_grad(h2)), EM_ALL_DIMS, false)) == 0.0);
    em_scope_end(s);
}

/* The peak of a training step's loss on the CPU: forward and backward, h, w, b requiring grad.
 * The fused op holds a chunk's logits (a few [chunk, V] float32 buffers at once) and the
 * gradients; the composition holds the [N, V] logits, their log-softmax and the target's
 * one-hot rows. */
static int64_t step_peak(bool fused, int64_t n, int64_t hd, int64_t v, int64_t chunk) {
    em_device cpu = EM_DEVICE_CPU;
    em_scope s = em_scope_begin();
    em_manual_seed(11);
    em_tensor *h = em_randn(EM_SHAPE(n, hd), EM_OPTS(.requires_grad = true));
    em_tensor *w = em_randn(EM_SHAPE(v, hd), EM_OPTS(.requires_grad = true));
    em_tensor *b = em_zeros(EM_SHAPE(v), EM_OPTS(.requires_grad = true));
    em_tensor *t = em_randint(0, v, EM_SHAPE(n), EM_OPTS(.dtype = EM_I64));
    int64_t base = em_memory_allocated(cpu);
    em_memory_reset_peak_stats(cpu);
    em_scope step = em_scope_begin();
    em_tensor *loss = fused ? em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.chunk_size = chunk})
                            : em_cross_entropy(em_addmm(b, h, em_transpose(w, 0, 1), 1.0, 1.0), t, 0.0);
    CHECK_OK(em_backward(loss));
    em_scope_end(step);
    int64_t peak = em_memory_max_allocated(cpu) - base;
    em_scope_end(s);
    return peak;
}

static void test_memory(void) {
    const int64_t n = 512, hd = 32, v = 4096, chunk = 32;
    int64_t fused = step_peak(true, n, hd, v, chunk), composed = step_peak(false, n, hd, v, chunk);
    int64_t logits = n * v * 4, chunk_logits = chunk * v * 4, grads = (n * hd + v * hd + v) * 4;
    printf("  peak above the inputs: fused %.2f MiB (chunk logits %.2f MiB, gradients %.2f MiB), "
           "composed %.2f MiB ([N, V] logits %.2f MiB)\n",
           fused / 1048576.0, chunk_logits / 1048576.0, grads / 1048576.0, composed / 1048576.0, logits / 1048576.0);
    /* at most three [chunk, V] buffers at once, the gradients twice (the float32 sums and the
     * ones autograd accumulates) and small change */
    CHECK(fused <= 3 * chunk_logits + 2 * grads + (256 << 10));
    CHECK(fused < logits);
    CHECK(composed >= logits);
}

/* The divisor: the loss is the sum divided by it, and the gradients are those of the sum
 * divided after the call (bit for bit in bf16, where that division makes backward run the
 * chunks again to round g * (p - q) once; float32 within the rounding of its sums); and backward hands over the forward's gradients
 * instead of running the chunks again: it allocates no [chunk, V] logits. */
static em_tensor *divided_grad(em_dtype dt, bool inside, double *loss_value, int64_t *backward_peak) {
    em_device cpu = EM_DEVICE_CPU;
    em_manual_seed(5);
    em_tensor *h = em_to_dtype(em_randn(EM_SHAPE(48, 16), EM_OPTS()), dt);
    em_tensor *w = em_to_dtype(em_randn(EM_SHAPE(512, 16), EM_OPTS()), dt);
    em_tensor *t = em_randint(0, 512, EM_SHAPE(48), EM_OPTS(.dtype = EM_I64));
    em_set_requires_grad(h, true);
    const double items = 37.0; /* not a power of two: a bf16 division after the call reruns */
    em_linear_ce_opts o = {.chunk_size = 8, .reduction = EM_REDUCTION_SUM, .divisor = inside ? items : 0.0};
    em_tensor *loss = em_linear_cross_entropy(h, w, NULL, t, &o);
    if (loss && !inside) loss = em_div_scalar(loss, items);
    *loss_value = loss ? em_item(loss) : NAN;
    em_memory_reset_peak_stats(cpu);
    int64_t before = em_memory_allocated(cpu);
    CHECK_OK(loss ? em_backward(loss) : em_last_status());
    *backward_peak = em_memory_max_allocated(cpu) - before;
    return em_grad(h);
}

static void test_divisor(void) {
    em_dtype dts[] = {EM_F32, EM_BF16};
    for (int i = 0; i < 2; i++) {
        em_scope s = em_scope_begin();
        double in_loss, out_loss;
        int64_t in_peak, out_peak;
        em_tensor *g_in = divided_grad(dts[i], true, &in_loss, &in_peak);
        em_tensor *g_out = divided_grad(dts[i], false, &out_loss, &out_peak);
        CHECK(g_in && g_out);
        CHECK(in_loss == out_loss);
        /* bf16: the rerun rounds g * (p - q) once, as the divided forward does; float32 scales the
         * kept p - q by g instead of folding g into each term: within its rounding */
        double diff = g_in && g_out ? em_item(em_max(em_abs(em_sub(em_to_dtype(g_in, EM_F32), em_to_dtype(g_out, EM_F32))),
                                                     EM_ALL_DIMS, false))
                                    : 1.0;
        double scale = g_out ? em_item(em_max(em_abs(em_to_dtype(g_out, EM_F32)), EM_ALL_DIMS, false)) : 1.0;
        CHECK(dts[i] == EM_BF16 ? diff == 0.0 : diff <= 1e-5 * scale); /* rounded terms of a 512-term sum */
        const int64_t chunk_logits = 8 * 512 * 4;
        printf("  %s: input gradients differ by at most %.3g (largest %.3g); backward allocated %lld bytes with "
               "the divisor, %lld dividing after the call\n", em_dtype_name(dts[i]), diff, scale, (long long)in_peak,
               (long long)out_peak);
        CHECK(in_peak < chunk_logits);
        if (dts[i] == EM_BF16) CHECK(out_peak >= chunk_logits); /* the rerun this option spares */
        em_scope_end(s);
    }
}

static void test_bad_arguments(void) {
    em_scope s = em_scope_begin();
    em_tensor *h = em_randn(EM_SHAPE(4, 8), EM_OPTS()), *w = em_randn(EM_SHAPE(6, 8), EM_OPTS());
    em_tensor *b = em_zeros(EM_SHAPE(6), EM_OPTS()), *t = em_from_data((int64_t[]){0, 5, -100, 2}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    CHECK(em_linear_cross_entropy(NULL, w, b, t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "input is NULL");
    CHECK(em_linear_cross_entropy(h, w, b, NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "target is NULL");
    CHECK(em_linear_cross_entropy(h, em_randn(EM_SHAPE(6, 7), EM_OPTS()), NULL, t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "expected input [N, H] and weight [V, H], got input [4, 8] and weight [6, 7]");
    CHECK(em_linear_cross_entropy(h, w, em_zeros(EM_SHAPE(5), EM_OPTS()), t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "expected bias [6] (weight's rows), got [5]");
    CHECK(em_linear_cross_entropy(h, em_to_dtype(w, EM_F64), NULL, t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "one floating dtype, got float32, float64");
    CHECK(em_linear_cross_entropy(h, w, b, em_to_dtype(t, EM_F32), NULL) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "expected integer class indices as target, got float32");
    CHECK(em_linear_cross_entropy(h, w, b, em_narrow(t, 0, 0, 3), NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "expected target size [4], got [3]");
    em_tensor *bad = em_from_data((int64_t[]){0, 6, 1, 2}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    CHECK(em_linear_cross_entropy(h, w, b, bad, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "target[1] = 6 is out of bounds: expected a class in [0, 6)");
    CHECK(em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.label_smoothing = 1.5}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "label_smoothing must be between 0.0 and 1.0. Got: 1.5");
    CHECK(em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.reduction = (em_reduction)7}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "reduction must be EM_REDUCTION_MEAN, _SUM or _NONE, got 7");
    CHECK(em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.chunk_size = -1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "chunk_size must be >= 0");
    CHECK(em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.divisor = 2.0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "divides only EM_REDUCTION_SUM's loss");
    CHECK(em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.reduction = EM_REDUCTION_SUM, .divisor = -1.0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "divisor must be >= 0");
    /* a valid call after the errors, with gradients, leaves nothing behind (ASan's leak check) */
    em_set_requires_grad(h, true);
    em_tensor *loss = em_linear_cross_entropy(h, w, b, t, NULL);
    CHECK(loss != NULL);
    CHECK_OK(em_backward(loss));
    CHECK(em_grad(h) != NULL);
    /* retain_graph: the second backward runs the chunks again and gives the same gradients */
    em_tensor *first = em_clone(em_grad(h));
    em_tensor *again = em_linear_cross_entropy(h, w, b, t, &(em_linear_ce_opts){.chunk_size = 3});
    CHECK_OK(em_zero_grad_tensor(h));
    CHECK_OK(em_backward_with(again, NULL, true));
    CHECK_OK(em_zero_grad_tensor(h));
    CHECK_OK(em_backward_with(again, NULL, false));
    CHECK(em_item(em_max(em_abs(em_sub(em_grad(h), first)), EM_ALL_DIMS, false)) < 1e-6);
    /* a second backward without retain_graph is an error, not a crash */
    CHECK(em_backward(loss) != EM_OK);
    em_clear_error();
    if (em_device_count(EM_OPENCL) > 0) {
        CHECK(em_linear_cross_entropy(h, em_to(w, EM_DEVICE(EM_OPENCL, 0)), NULL, t, NULL) == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "on one device");
    }
    em_scope_end(s);
}

int main(void) {
    g_file = em_safetensors_load("tests/data/golden_linear_ce.safetensors", EM_DEVICE_CPU);
    if (!g_file) {
        fprintf(stderr, "cannot load the golden file (run from the source root): %s\n", em_last_error());
        return 1;
    }
    RUN(test_golden_cpu);
    RUN(test_golden_opencl);
    RUN(test_golden_cuda);
    RUN(test_gpu_rows_kernel);
    RUN(test_no_grad);
    RUN(test_f64_and_all_ignored);
    RUN(test_memory);
    RUN(test_divisor);
    RUN(test_bad_arguments);
    em_safetensors_free(g_file);
    return test_summary();
}
