/* ReLU's gradient (one backend pass on the CPU: src/backends/cpu/cpu_relu.c, through
 * em__relu_backward) against the rule written here: g where relu's output > 0, else +0 (a
 * NaN input gives 0, -0 gives 0, g's own NaN and -0 pass where the output is positive);
 * f32 (the AVX-512 loop and its scalar tail) and f64, sizes around the 16-lane vector and
 * one big enough to split over threads, a non-contiguous output gradient, and a chain where
 * ReLU's input is not a leaf. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/internal_api.h"
#include "test.h"

static uint64_t g_rng = 0xD1B54A32D192ED03ull;
static double rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}
static double sample(void) {
    double r = rnd();
    if (r < -0.97) return NAN;
    if (r < -0.94) return -0.0;
    if (r < -0.91) return 0.0;
    return rnd();
}

/* relu's input x, the output's gradient g (NaN and -0 now and then), gradients compared bit for bit */
static void one(int64_t n, em_dtype dt, bool transposed_g) {
    em_scope sc = em_scope_begin();
    int64_t rows = transposed_g ? 2 : 1, cols = n / rows;
    double *x = malloc(sizeof(double) * (size_t)n), *g = malloc(sizeof(double) * (size_t)n);
    CHECK(x && g);
    if (!x || !g) goto done;
    for (int64_t i = 0; i < n; i++) x[i] = sample(), g[i] = sample();
    em_tensor *xt = em_from_data(x, EM_F64, EM_SHAPE(rows, cols), EM_OPTS(.dtype = dt));
    em_tensor *gt = em_from_data(g, EM_F64, EM_SHAPE(rows, cols), EM_OPTS(.dtype = dt));
    if (transposed_g) gt = em_transpose(em_contiguous(em_transpose(gt, 0, 1)), 0, 1);
    CHECK(!transposed_g || !em_is_contiguous(gt));
    CHECK_OK(em_set_requires_grad(xt, true));
    em_tensor *y = em_relu(xt);
    CHECK_OK(em_backward_with(y, gt, false));
    em_tensor *gx = em_to_dtype(em_grad(xt), EM_F64);
    CHECK(gx && em_numel(gx) == n);
    if (!gx) goto done;
    const double *d = em_data_ptr(gx);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        /* x and g as the dtype holds them */
        double xi = dt == EM_F32 ? (double)(float)x[i] : x[i], gi = dt == EM_F32 ? (double)(float)g[i] : g[i];
        double want = xi > 0 ? gi : 0.0;
        bool same = isnan(want) ? isnan(d[i]) : d[i] == want && !signbit(d[i]) == !signbit(want);
        if (!same && bad < 3)
            fprintf(stderr, "  i %lld x %g g %g: got %.17g, want %.17g\n", (long long)i, xi, gi, d[i], want);
        bad += !same;
    }
    CHECK(bad == 0);
done:
    free(x), free(g);
    em_scope_end(sc);
}

static void test_sizes(void) {
    static const int64_t sizes[] = {1, 15, 16, 17, 33, 1000, (1 << 20) + 7};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        one(sizes[i], EM_F32, false);
        one(sizes[i], EM_F64, false);
    }
}

static void test_non_contiguous_gradient(void) {
    one(2 * 37, EM_F32, true);
    one(2 * 1000, EM_F64, true);
}

/* the fused op itself: declines what it cannot run, so the caller composes */
static void test_declines(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_ones(EM_SHAPE(4), EM_OPTS(0)), *b = em_ones(EM_SHAPE(5), EM_OPTS(0));
    CHECK(em__relu_backward(a, b) == NULL); /* shapes differ */
    CHECK(em__relu_backward(a, em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_F64))) == NULL);
    em_tensor *i32 = em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_I32));
    CHECK(em__relu_backward(i32, i32) == NULL); /* not floating */
    em_tensor *ok = em__relu_backward(a, em_neg(a));
    CHECK(ok && em_item(em_sum(ok, EM_ALL_DIMS, false)) == 0);
    em_scope_end(sc);
}

/* relu inside a chain: x -> 3x -> relu -> * w -> sum; x's gradient 3 w where 3x > 0 */
static void test_chain(void) {
    em_scope sc = em_scope_begin();
    float xv[6] = {-1, 2, 0, 4, -0.5f, 0.25f}, wv[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *x = em_from_data(xv, EM_F32, EM_SHAPE(6), EM_OPTS(.requires_grad = true));
    em_tensor *w = em_from_data(wv, EM_F32, EM_SHAPE(6), EM_OPTS(0));
    CHECK_OK(em_backward(em_sum(em_mul(em_relu(em_mul_scalar(x, 3)), w), EM_ALL_DIMS, false)));
    const float *gx = em_grad(x) ? em_data_ptr(em_grad(x)) : NULL;
    CHECK(gx != NULL);
    for (int i = 0; gx && i < 6; i++) CHECK(gx[i] == (xv[i] > 0 ? 3 * wv[i] : 0));
    em_scope_end(sc);
}

int main(void) {
    em_set_num_threads(2);
    RUN(test_sizes);
    RUN(test_non_contiguous_gradient);
    RUN(test_declines);
    RUN(test_chain);
    return test_summary();
}
