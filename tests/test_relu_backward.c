/* ReLU's gradient (one backend pass on the CPU: src/backends/cpu/cpu_relu.c, through
 * em__relu_backward) against the rule written here: g where relu's output > 0, else +0 (a
 * NaN input gives 0, -0 gives 0, g's own NaN and -0 pass where the output is positive);
 * f32 (the AVX-512 loop and its scalar tail), f64, bf16 and f16 (the 32-lane bit test),
 * sizes around the vector widths and one big enough to split over threads, a non-contiguous
 * output gradient, a chain where ReLU's input is not a leaf; for bf16/f16 every special bit
 * pattern (NaNs, infinities, -0, subnormals) bit for bit against the composed where(y > 0,
 * g, 0), with denormals flushed too. */
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
    em_tensor *xh = em_to_dtype(xt, EM_F64), *gh = em_to_dtype(em_contiguous(gt), EM_F64);
    CHECK(gx && em_numel(gx) == n && xh && gh);
    if (!gx || !xh || !gh) goto done;
    const double *d = em_data_ptr(gx), *xd = em_data_ptr(xh), *gd = em_data_ptr(gh);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double xi = xd[i], gi = gd[i]; /* x and g as the dtype holds them */
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
    static const int64_t sizes[] = {1, 15, 16, 17, 31, 32, 33, 63, 65, 1000, (1 << 20) + 7};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        one(sizes[i], EM_F32, false);
        one(sizes[i], EM_F64, false);
        one(sizes[i], EM_BF16, false);
        one(sizes[i], EM_F16, false);
    }
}

static void test_non_contiguous_gradient(void) {
    one(2 * 37, EM_F32, true);
    one(2 * 1000, EM_F64, true);
    one(2 * 37, EM_BF16, true);
    one(2 * 1001, EM_F16, true);
}

/* bf16/f16: every special pattern as y, each against a few gradients, at positions in and
 * after the 32-lane body; fused and composed (where(y > 0, g, 0)) compared bit for bit */
static void specials(em_dtype dt, bool flush) {
    static const uint16_t bf[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x8080, 0x3F80,
                                  0xBF80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7F81, 0xFF81, 0x7FC0, 0xFFC0, 0x7FFF, 0xFFFF};
    static const uint16_t hf[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00,
                                  0xBC00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7FFF, 0xFFFF};
    static const uint16_t gb[] = {0x3F80, 0x8000, 0x7FC0, 0x0001}, gh[] = {0x3C00, 0x8000, 0x7E00, 0x0001};
    const uint16_t *sp = dt == EM_BF16 ? bf : hf, *gs = dt == EM_BF16 ? gb : gh;
    enum { NS = 20, N = 4 * NS + 13 }; /* 93: two 32-lane blocks and a tail of 29 */
    uint16_t yv[N], gv[N];
    for (int i = 0; i < N; i++) yv[i] = sp[(i * 7) % NS], gv[i] = gs[i % 4];
    bool was = em_get_flush_denormal();
    CHECK(em_set_flush_denormal(flush) || !flush);
    em_scope sc = em_scope_begin();
    em_tensor *y = em_from_data(yv, dt, EM_SHAPE(N), EM_OPTS(.dtype = dt));
    em_tensor *g = em_from_data(gv, dt, EM_SHAPE(N), EM_OPTS(.dtype = dt));
    em_tensor *fused = em__relu_backward(g, y);
    em_tensor *zero = em_zeros(EM_SHAPE(1), EM_OPTS(.dtype = dt));
    em_tensor *comp = em_contiguous(em_where(em_gt(y, zero), g, zero));
    CHECK(fused && comp);
    if (fused && comp) {
        const uint16_t *a = em_data_ptr(fused), *b = em_data_ptr(comp);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            bool pos = dt == EM_BF16 ? (yv[i] >= (flush ? 0x0080 : 0x0001) && yv[i] <= 0x7F80)
                                     : (yv[i] >= 0x0001 && yv[i] <= 0x7C00);
            uint16_t want = pos ? gv[i] : 0;
            if ((a[i] != b[i] || a[i] != want) && bad++ < 3)
                fprintf(stderr, "  %s flush %d y %04x g %04x: fused %04x composed %04x want %04x\n",
                        em_dtype_name(dt), flush, yv[i], gv[i], a[i], b[i], want);
        }
        CHECK(bad == 0);
    }
    em_scope_end(sc);
    em_set_flush_denormal(was);
}

static void test_half_specials(void) {
    specials(EM_BF16, false);
    specials(EM_F16, false);
    if (em_set_flush_denormal(true)) {
        specials(EM_BF16, true);
        specials(EM_F16, true);
    } else {
        test_skip_case("flush-denormal specials", "this CPU cannot flush denormals");
    }
    em_set_flush_denormal(false);
}

/* the fused op itself: declines what it cannot run, so the caller composes */
static void test_declines(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_ones(EM_SHAPE(4), EM_OPTS(0)), *b = em_ones(EM_SHAPE(5), EM_OPTS(0));
    CHECK(em__relu_backward(a, b) == NULL); /* shapes differ */
    CHECK(em__relu_backward(a, em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_F64))) == NULL);
    CHECK(em__relu_backward(em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_F16)),
                            em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_BF16))) == NULL); /* dtypes differ */
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
    RUN(test_half_specials);
    RUN(test_declines);
    RUN(test_chain);
    return test_summary();
}
