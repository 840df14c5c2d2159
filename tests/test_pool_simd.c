/* MaxPool2d on the CPU, forward and backward, against a reference written here (PyTorch's
 * rule: the first maximum of each window in row-major order, a NaN wins, ties keep the
 * earlier element), with each instruction set of src/backends/cpu/cpu_pool_simd.c this CPU
 * has (AVX-512, AVX2, the scalar loops):
 * MaxPool2d(2) at odd sizes (rows and columns no window covers), widths on both sides of
 * the 16-lane vector, batch 1 and unbatched input, non-contiguous input, data full of ties,
 * signed zeros, infinities and NaNs; other windows (padding, stride 1, dilation, ceil_mode)
 * checked the same way so the dispatch cannot send them to the 2x2 kernels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/cpu_pool_simd.h"
#include "test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

/* few distinct values, so windows often tie; NaN, -0 and -inf now and then */
static float sample(bool specials) {
    static const float vals[] = {-1.5f, 0.0f, 0.5f, 1.0f, 2.0f, 2.0f};
    uint32_t r = rnd_u32() % 100;
    if (specials && r < 3) return NAN;
    if (specials && r < 6) return -0.0f;
    if (specials && r < 8) return -INFINITY;
    return vals[rnd_u32() % 6];
}

typedef struct pcase {
    int64_t n, c, h, w; /* n = 0: an unbatched (c, h, w) input */
    int64_t k, s, p, d;
    bool ceil_mode;
} pcase;

static int64_t out_size(int64_t in, const pcase *q) { /* PyTorch's pooling_output_shape */
    int64_t span = in + 2 * q->p - q->d * (q->k - 1) - 1;
    int64_t o = (span + (q->ceil_mode ? q->s - 1 : 0)) / q->s + 1;
    if (q->ceil_mode && (o - 1) * q->s >= in + q->p) o--;
    return o;
}

/* the reference forward on one plane */
static void ref_plane(const float *x, const pcase *q, int64_t oh, int64_t ow, float *y, int64_t *ix) {
    for (int64_t oy = 0; oy < oh; oy++)
        for (int64_t ox = 0; ox < ow; ox++) {
            float m = -INFINITY;
            int64_t best = -1;
            for (int64_t ki = 0; ki < q->k; ki++)
                for (int64_t kj = 0; kj < q->k; kj++) {
                    int64_t iy = oy * q->s - q->p + ki * q->d, jx = ox * q->s - q->p + kj * q->d;
                    if (iy < 0 || iy >= q->h || jx < 0 || jx >= q->w) continue;
                    float v = x[iy * q->w + jx];
                    if (best < 0 || v > m || isnan(v)) m = v, best = iy * q->w + jx;
                }
            y[oy * ow + ox] = m, ix[oy * ow + ox] = best;
        }
}

/* one case with the kernels of one instruction set: forward values and indices bit for bit,
 * and the input's gradient (the reference scatters in output order, as the kernels' sums do) */
static void run_case(const pcase *q, int level, bool transposed) {
    em_scope sc = em_scope_begin();
    int prev = em__cpu_pool_simd(level);
    int64_t n = q->n ? q->n : 1, planes = n * q->c, hw = q->h * q->w;
    int64_t oh = out_size(q->h, q), ow = out_size(q->w, q), ohw = oh * ow;
    float *x = malloc(sizeof(float) * (size_t)(planes * hw)), *gy = malloc(sizeof(float) * (size_t)(planes * ohw));
    float *ry = malloc(sizeof(float) * (size_t)(planes * ohw)), *rg = calloc((size_t)(planes * hw), sizeof(float));
    int64_t *ri = malloc(sizeof(int64_t) * (size_t)(planes * ohw));
    CHECK(x && gy && ry && rg && ri);
    if (!x || !gy || !ry || !rg || !ri) goto done;
    for (int64_t i = 0; i < planes * hw; i++) x[i] = sample(true);
    for (int64_t i = 0; i < planes * ohw; i++) gy[i] = (float)(rnd_u32() % 64) / 8 - 4;
    for (int64_t p = 0; p < planes; p++) {
        ref_plane(x + p * hw, q, oh, ow, ry + p * ohw, ri + p * ohw);
        for (int64_t o = 0; o < ohw; o++) rg[p * hw + ri[p * ohw + o]] += gy[p * ohw + o];
    }
    em_shape xs = q->n ? EM_SHAPE(q->n, q->c, q->h, q->w) : EM_SHAPE(q->c, q->h, q->w);
    em_shape ys = q->n ? EM_SHAPE(q->n, q->c, oh, ow) : EM_SHAPE(q->c, oh, ow);
    em_tensor *xt = em_from_data(x, EM_F32, xs, EM_OPTS(0));
    if (transposed) { /* the same values through a non-contiguous view: stored (.., w, h), transposed back */
        int nd = q->n ? 4 : 3;
        xt = em_transpose(em_contiguous(em_transpose(xt, nd - 2, nd - 1)), nd - 2, nd - 1);
        CHECK(!em_is_contiguous(xt) || q->h == 1 || q->w == 1);
    }
    CHECK_OK(em_set_requires_grad(xt, true));
    em_tensor *idx = NULL;
    em_tensor *y = em_max_pool2d_with_indices(xt, EM_HW1(q->k), EM_HW1(q->s), EM_HW1(q->p), EM_HW1(q->d), q->ceil_mode,
                                              &idx);
    CHECK(y && idx);
    if (!y || !idx) goto done;
    CHECK(em_numel(y) == planes * ohw);
    CHECK(em_numel(y) == planes * ohw && !memcmp(em_data_ptr(y), ry, sizeof(float) * (size_t)(planes * ohw)));
    CHECK(em_numel(idx) == planes * ohw && !memcmp(em_data_ptr(idx), ri, sizeof(int64_t) * (size_t)(planes * ohw)));
    CHECK_OK(em_backward_with(y, em_from_data(gy, EM_F32, ys, EM_OPTS(0)), false));
    em_tensor *gx = em_contiguous(em_grad(xt));
    CHECK(gx && em_numel(gx) == planes * hw);
    if (gx) CHECK(!memcmp(em_data_ptr(gx), rg, sizeof(float) * (size_t)(planes * hw)));
done:
    em__cpu_pool_simd(prev);
    free(x), free(gy), free(ry), free(rg), free(ri);
    em_scope_end(sc);
}

static const pcase k2_cases[] = {
    {1, 1, 2, 2, 2, 2, 0, 1, false},    /* one window */
    {0, 3, 5, 7, 2, 2, 0, 1, false},    /* unbatched; last row and column uncovered */
    {1, 2, 4, 34, 2, 2, 0, 1, false},   /* 17 outputs a row: one full vector and one lane */
    {2, 3, 7, 9, 2, 2, 0, 1, false},    /* odd both ways */
    {1, 1, 3, 32, 2, 2, 0, 1, false},   /* exactly 16 outputs a row */
    {2, 1, 9, 31, 2, 2, 0, 1, false},   /* 15 outputs a row */
    {1, 2, 6, 67, 2, 2, 0, 1, false},   /* 33 a row, one column uncovered */
    {3, 16, 28, 28, 2, 2, 0, 1, false}, /* the CNN's first pool */
    {2, 32, 10, 10, 2, 2, 0, 1, false}, /* and its second */
};
static const pcase other_cases[] = {
    {2, 2, 7, 7, 2, 2, 0, 1, true},   /* ceil_mode: the last window hangs over the edge */
    {1, 2, 6, 9, 2, 2, 1, 1, false},  /* padding */
    {1, 2, 6, 9, 2, 1, 0, 1, false},  /* stride 1: overlapping windows */
    {1, 2, 9, 11, 2, 2, 0, 2, false}, /* dilation */
    {2, 1, 9, 8, 3, 2, 1, 1, true},   /* kernel 3, padding and ceil_mode */
};

/* the sets this CPU runs, from the scalar loops up */
static int top_level(void) {
    int prev = em__cpu_pool_simd(EM_POOL_AVX512), top = em__cpu_pool_simd_active();
    em__cpu_pool_simd(prev);
    return top;
}

static void test_max2x2(void) {
    for (size_t i = 0; i < sizeof k2_cases / sizeof k2_cases[0]; i++)
        for (int level = EM_POOL_SCALAR; level <= top_level(); level++)
            for (int tr = 0; tr < 2; tr++) run_case(&k2_cases[i], level, tr);
    if (top_level() < EM_POOL_AVX512) SKIP("this CPU lacks AVX-512 (its kernels untested; the lower sets passed)");
}

static void test_other_windows(void) {
    for (size_t i = 0; i < sizeof other_cases / sizeof other_cases[0]; i++)
        for (int level = EM_POOL_SCALAR; level <= top_level(); level++) run_case(&other_cases[i], level, level & 1);
}

/* the kernels called directly, at each set: the forward's indices point at its maxima; the
 * backward (AVX-512 only) writes every element and declines an index outside its window (the
 * caller then scatters) and rows of under 8 outputs; the scalar setting declines everything */
static void test_kernels_direct(void) {
    enum { H = 5, W = 21, OH = 2, OW = 10 }; /* the last row and column uncovered */
    float x[H * W], y[OH * OW], gx[H * W], gy[OH * OW];
    int64_t ix[OH * OW];
    for (int i = 0; i < H * W; i++) x[i] = (float)((i * 7) % 11);
    for (int o = 0; o < OH * OW; o++) gy[o] = (float)(o + 1);
    for (int level = EM_POOL_SCALAR; level <= top_level(); level++) {
        int prev = em__cpu_pool_simd(level);
        bool ran = em__cpu_max2x2_f32(x, y, ix, H, W, OH, OW);
        CHECK(ran == (level != EM_POOL_SCALAR));
        for (int o = 0; ran && o < OH * OW; o++) CHECK(x[ix[o]] == y[o]);
        if (!ran) { /* the indices the backward reads */
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) ix[oy * OW + ox] = (2 * oy + 1) * W + 2 * ox;
        }
        for (int i = 0; i < H * W; i++) gx[i] = NAN; /* every element must be written */
        bool back = em__cpu_max2x2_backward_f32(gx, gy, ix, H, W, OH, OW);
        CHECK(back == (level == EM_POOL_AVX512));
        if (back) {
            float sum = 0;
            for (int i = 0; i < H * W; i++) sum += gx[i];
            CHECK(sum == OH * OW * (OH * OW + 1) / 2);
            for (int o = 0; o < OH * OW; o++) CHECK(gx[ix[o]] == gy[o]);
            int64_t keep = ix[4];
            ix[4] = ix[1]; /* output 4's index now points into output 1's window */
            CHECK(!em__cpu_max2x2_backward_f32(gx, gy, ix, H, W, OH, OW));
            ix[4] = -1;
            CHECK(!em__cpu_max2x2_backward_f32(gx, gy, ix, H, W, OH, OW));
            ix[4] = ix[14]; /* the window below */
            CHECK(!em__cpu_max2x2_backward_f32(gx, gy, ix, H, W, OH, OW));
            ix[4] = keep;
            CHECK(!em__cpu_max2x2_backward_f32(gx, gy, ix, H, W, OH, 7)); /* narrow rows: declined */
        }
        em__cpu_pool_simd(prev);
    }
    if (top_level() < EM_POOL_AVX512) SKIP("this CPU lacks AVX-512 (its kernels untested; the lower sets passed)");
}

int main(void) {
    em_set_num_threads(2); /* planes split over threads too */
    RUN(test_max2x2);
    RUN(test_other_windows);
    RUN(test_kernels_direct);
    return test_summary();
}
