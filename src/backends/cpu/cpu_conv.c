/* Convolution and pooling on the CPU, portable kernels: im2col, col2im and the pools over
 * contiguous NCHW f32/f64 (backend.h's contract). Work splits over rows of cols or over
 * (n, c) planes, so no two threads write one element. The library path (oneDNN) is in
 * cpu_conv_dnnl.c. */
#include <float.h>
#include "cpu_internal.h"
#include "cpu_pool_simd.h"

typedef struct conv_job {
    const em_window2d *g;
    em_pool_kind kind;
    char *out;
    int64_t *idx;
    const char *in;
    const int64_t *cidx;
    bool f64;
} conv_job;

/* planes per thread chunk so each chunk touches about EM_CPU_MIN_GRAIN elements */
static int64_t grain_for(int64_t per_item) {
    int64_t g = EM_CPU_MIN_GRAIN / (per_item > 0 ? per_item : 1);
    return g < 1 ? 1 : g;
}

/* ---- im2col: one row (n, c, ki, kj) of cols per item ---- */
#define DEF_IM2COL(T, SFX)                                                                        \
    static void im2col_##SFX(void *ctx, int64_t begin, int64_t end) {                            \
        const conv_job *j = ctx;                                                                  \
        const em_window2d *g = j->g;                                                              \
        int64_t L = g->oh * g->ow, kk = g->kh * g->kw;                                           \
        for (int64_t r = begin; r < end; r++) {                                                   \
            int64_t plane = r / kk, ki = (r % kk) / g->kw, kj = r % g->kw;                        \
            const T *x = (const T *)j->in + plane * g->h * g->w;                                  \
            T *c = (T *)j->out + r * L;                                                           \
            for (int64_t oy = 0; oy < g->oh; oy++) {                                              \
                int64_t iy = oy * g->sh - g->ph + ki * g->dh;                                     \
                T *crow = c + oy * g->ow;                                                         \
                if (iy < 0 || iy >= g->h) {                                                       \
                    for (int64_t ox = 0; ox < g->ow; ox++) crow[ox] = 0;                          \
                    continue;                                                                     \
                }                                                                                 \
                const T *xrow = x + iy * g->w;                                                    \
                int64_t ix0 = kj * g->dw - g->pw;                                                 \
                if (g->sw == 1 && ix0 >= 0 && ix0 + g->ow <= g->w) {                              \
                    memcpy(crow, xrow + ix0, (size_t)g->ow * sizeof(T));                          \
                    continue;                                                                     \
                }                                                                                 \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    int64_t ix = ox * g->sw + ix0;                                                \
                    crow[ox] = ix >= 0 && ix < g->w ? xrow[ix] : (T)0;                            \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    /* col2im: one (n, c) plane per item, zeroed then summed into */                             \
    static void col2im_##SFX(void *ctx, int64_t begin, int64_t end) {                            \
        const conv_job *j = ctx;                                                                  \
        const em_window2d *g = j->g;                                                              \
        int64_t L = g->oh * g->ow, kk = g->kh * g->kw;                                           \
        for (int64_t p = begin; p < end; p++) {                                                   \
            T *x = (T *)j->out + p * g->h * g->w;                                                 \
            memset(x, 0, (size_t)(g->h * g->w) * sizeof(T));                                      \
            for (int64_t k = 0; k < kk; k++) {                                                    \
                int64_t ki = k / g->kw, kj = k % g->kw;                                           \
                const T *c = (const T *)j->in + (p * kk + k) * L;                                 \
                for (int64_t oy = 0; oy < g->oh; oy++) {                                          \
                    int64_t iy = oy * g->sh - g->ph + ki * g->dh;                                 \
                    if (iy < 0 || iy >= g->h) continue;                                           \
                    T *xrow = x + iy * g->w;                                                      \
                    const T *crow = c + oy * g->ow;                                               \
                    for (int64_t ox = 0; ox < g->ow; ox++) {                                      \
                        int64_t ix = ox * g->sw - g->pw + kj * g->dw;                             \
                        if (ix >= 0 && ix < g->w) xrow[ix] += crow[ox];                           \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }
DEF_IM2COL(float, f32)
DEF_IM2COL(double, f64)

static em_status check_dtype(const char *op, const em_tensor *t) {
    if (t->dtype == EM_F32 || t->dtype == EM_F64) return EM_OK;
    return em_error(EM_ERR_NOT_SUPPORTED, "%s: not supported for dtype %s on cpu", op, em_dtype_name(t->dtype));
}

em_status em__cpu_im2col(em_tensor *cols, const em_tensor *in, const em_window2d *g) {
    if (check_dtype("im2col", in)) return em_last_status();
    conv_job j = {.g = g, .out = em__host_ptr(cols), .in = em__host_ptr(in)};
    int64_t rows = g->n * g->c * g->kh * g->kw;
    em__cpu_parallel_for(rows, grain_for(g->oh * g->ow), in->dtype == EM_F64 ? im2col_f64 : im2col_f32, &j);
    return EM_OK;
}

em_status em__cpu_col2im(em_tensor *in, const em_tensor *cols, const em_window2d *g) {
    if (check_dtype("col2im", in)) return em_last_status();
    conv_job j = {.g = g, .out = em__host_ptr(in), .in = em__host_ptr(cols)};
    em__cpu_parallel_for(g->n * g->c, grain_for(g->kh * g->kw * g->oh * g->ow),
                         in->dtype == EM_F64 ? col2im_f64 : col2im_f32, &j);
    return EM_OK;
}

/* ---- pools: one (n, c) plane per item ----
 * The windows follow PyTorch's CPU kernels: max takes the first maximum and lets NaN win;
 * avg clips the window to the padded input for count_include_pad and to the input for the
 * sum; adaptive windows are [floor(o I / O), ceil((o + 1) I / O)). */
static inline int64_t ad_start(int64_t o, int64_t out, int64_t in) { return o * in / out; }
static inline int64_t ad_end(int64_t o, int64_t out, int64_t in) { return ((o + 1) * in + out - 1) / out; }

/* the avg window of output (oy, ox) clipped to the input, and its divisor */
static inline bool avg_window(const em_window2d *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                              int64_t *x1, double *div) {
    int64_t h0 = oy * g->sh - g->ph, w0 = ox * g->sw - g->pw;
    int64_t h1 = h0 + g->kh < g->h + g->ph ? h0 + g->kh : g->h + g->ph;
    int64_t w1 = w0 + g->kw < g->w + g->pw ? w0 + g->kw : g->w + g->pw;
    int64_t pool = (h1 - h0) * (w1 - w0);
    *y0 = h0 < 0 ? 0 : h0, *x0 = w0 < 0 ? 0 : w0;
    *y1 = h1 < g->h ? h1 : g->h, *x1 = w1 < g->w ? w1 : g->w;
    if (*y0 >= *y1 || *x0 >= *x1) return false;
    *div = g->divisor ? (double)g->divisor
                      : g->count_include_pad ? (double)pool : (double)((*y1 - *y0) * (*x1 - *x0));
    return true;
}

/* the max of one window (first maximum; NaN wins) and its flat index in the plane; g is a
 * local copy, so the compiler keeps its fields in registers */
#define DEF_MAX_WINDOW(T, SFX)                                                                    \
    static inline T max_window_##SFX(const T *x, const em_window2d *g, int64_t oy, int64_t ox,   \
                                     int64_t *index) {                                            \
        int64_t h0 = oy * g->sh - g->ph, w0 = ox * g->sw - g->pw;                                 \
        int64_t h1 = h0 + (g->kh - 1) * g->dh + 1, w1 = w0 + (g->kw - 1) * g->dw + 1;             \
        if (h1 > g->h) h1 = g->h;                                                                 \
        if (w1 > g->w) w1 = g->w;                                                                 \
        if (h0 < 0) h0 += (-h0 + g->dh - 1) / g->dh * g->dh;                                      \
        if (w0 < 0) w0 += (-w0 + g->dw - 1) / g->dw * g->dw;                                      \
        int64_t best = h0 * g->w + w0;                                                            \
        T m = -(T)INFINITY;                                                                       \
        for (int64_t iy = h0; iy < h1; iy += g->dh)                                               \
            for (int64_t jx = w0; jx < w1; jx += g->dw) {                                         \
                T v = x[iy * g->w + jx];                                                          \
                if (v > m || v != v) {                                                            \
                    m = v;                                                                        \
                    best = iy * g->w + jx;                                                        \
                }                                                                                 \
            }                                                                                     \
        *index = best;                                                                            \
        return m;                                                                                 \
    }
DEF_MAX_WINDOW(float, f32)
DEF_MAX_WINDOW(double, f64)

/* MaxPool2d(2) on a whole plane whose windows all lie inside it (the common case): four
 * loads and selects per output, no loop or bounds per window (the general loop's comparisons
 * branch unpredictably on real data) */
#define DEF_MAX2X2(T, SFX)                                                                        \
    static void max2x2_##SFX(const T *x, T *y, int64_t *ix, int64_t w, int64_t oh, int64_t ow) { \
        for (int64_t oy = 0; oy < oh; oy++) {                                                     \
            const T *r0 = x + 2 * oy * w, *r1 = r0 + w;                                           \
            T *yr = y + oy * ow;                                                                  \
            int64_t *ir = ix + oy * ow, base = 2 * oy * w;                                        \
            for (int64_t ox = 0; ox < ow; ox++) {                                                 \
                int64_t j = 2 * ox;                                                               \
                T m = r0[j], v;                                                                   \
                int64_t k = base + j;                                                             \
                bool t;                                                                           \
                v = r0[j + 1], t = (v > m) | (v != v), m = t ? v : m, k = t ? base + j + 1 : k;   \
                v = r1[j], t = (v > m) | (v != v), m = t ? v : m, k = t ? base + w + j : k;       \
                v = r1[j + 1], t = (v > m) | (v != v), m = t ? v : m, k = t ? base + w + j + 1 : k; \
                yr[ox] = m;                                                                       \
                ir[ox] = k;                                                                       \
            }                                                                                     \
        }                                                                                         \
    }
DEF_MAX2X2(float, f32)
DEF_MAX2X2(double, f64)

/* the vector kernels (cpu_pool_simd.c) where the CPU has them; f32 only */
static inline bool max2x2_simd_f32(const float *x, float *y, int64_t *ix, const em_window2d *g) {
    return em__cpu_max2x2_f32(x, y, ix, g->h, g->w, g->oh, g->ow);
}
static inline bool max2x2_simd_f64(const double *x, double *y, int64_t *ix, const em_window2d *g) {
    (void)x, (void)y, (void)ix, (void)g;
    return false;
}
static inline bool max2x2_bwd_simd_f32(float *gx, const float *gy, const int64_t *ix, const em_window2d *g) {
    return em__cpu_max2x2_backward_f32(gx, gy, ix, g->h, g->w, g->oh, g->ow);
}
static inline bool max2x2_bwd_simd_f64(double *gx, const double *gy, const int64_t *ix, const em_window2d *g) {
    (void)gx, (void)gy, (void)ix, (void)g;
    return false;
}

/* MaxPool2d(2) with every window inside the plane */
static inline bool is_max2x2(em_pool_kind kind, const em_window2d *g) {
    return kind == EM_POOL_MAX && g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->dh == 1 && g->dw == 1 &&
           g->ph == 0 && g->pw == 0 && 2 * g->oh <= g->h && 2 * g->ow <= g->w;
}

#define DEF_POOL(T, SFX)                                                                          \
    static void pool_##SFX(void *ctx, int64_t begin, int64_t end) {                              \
        const conv_job *j = ctx;                                                                  \
        const em_window2d w = *j->g, *g = &w; /* a local copy: stores cannot alias it */          \
        for (int64_t p = begin; p < end; p++) {                                                   \
            const T *x = (const T *)j->in + p * g->h * g->w;                                      \
            T *y = (T *)j->out + p * g->oh * g->ow;                                               \
            int64_t *ix = j->idx ? j->idx + p * g->oh * g->ow : NULL;                             \
            if (is_max2x2(j->kind, g)) {                                                          \
                if (!max2x2_simd_##SFX(x, y, ix, g)) max2x2_##SFX(x, y, ix, g->w, g->oh, g->ow);      \
                continue;                                                                         \
            }                                                                                     \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    int64_t o = oy * g->ow + ox;                                                  \
                    if (j->kind == EM_POOL_MAX) {                                                 \
                        y[o] = max_window_##SFX(x, &w, oy, ox, &ix[o]);                           \
                        continue;                                                                 \
                    }                                                                             \
                    int64_t y0, y1, x0, x1;                                                       \
                    double div = 1, s = 0;                                                        \
                    if (j->kind == EM_POOL_AVG) {                                                 \
                        if (!avg_window(g, oy, ox, &y0, &y1, &x0, &x1, &div)) {                   \
                            y[o] = 0;                                                             \
                            continue;                                                             \
                        }                                                                         \
                    } else {                                                                      \
                        y0 = ad_start(oy, g->oh, g->h), y1 = ad_end(oy, g->oh, g->h);             \
                        x0 = ad_start(ox, g->ow, g->w), x1 = ad_end(ox, g->ow, g->w);             \
                        div = (double)((y1 - y0) * (x1 - x0));                                    \
                    }                                                                             \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t jx = x0; jx < x1; jx++) s += x[iy * g->w + jx];              \
                    y[o] = (T)(s / div);                                                          \
                }                                                                                 \
        }                                                                                         \
    }                                                                                             \
    static void pool_bwd_##SFX(void *ctx, int64_t begin, int64_t end) {                          \
        const conv_job *j = ctx;                                                                  \
        const em_window2d *g = j->g;                                                              \
        for (int64_t p = begin; p < end; p++) {                                                   \
            T *gx = (T *)j->out + p * g->h * g->w;                                                \
            const T *gy = (const T *)j->in + p * g->oh * g->ow;                                   \
            const int64_t *ix = j->cidx ? j->cidx + p * g->oh * g->ow : NULL;                     \
            if (is_max2x2(j->kind, g) && max2x2_bwd_simd_##SFX(gx, gy, ix, g)) continue;          \
            memset(gx, 0, (size_t)(g->h * g->w) * sizeof(T));                                     \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    int64_t o = oy * g->ow + ox;                                                  \
                    if (j->kind == EM_POOL_MAX) {                                                 \
                        int64_t k = ix[o];                                                        \
                        if (k >= 0 && k < g->h * g->w) gx[k] += gy[o];                            \
                        continue;                                                                 \
                    }                                                                             \
                    int64_t y0, y1, x0, x1;                                                       \
                    double div;                                                                   \
                    if (j->kind == EM_POOL_AVG) {                                                 \
                        if (!avg_window(g, oy, ox, &y0, &y1, &x0, &x1, &div)) continue;           \
                    } else {                                                                      \
                        y0 = ad_start(oy, g->oh, g->h), y1 = ad_end(oy, g->oh, g->h);             \
                        x0 = ad_start(ox, g->ow, g->w), x1 = ad_end(ox, g->ow, g->w);             \
                        div = (double)((y1 - y0) * (x1 - x0));                                    \
                    }                                                                             \
                    T v = (T)(gy[o] / div);                                                       \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t jx = x0; jx < x1; jx++) gx[iy * g->w + jx] += v;             \
                }                                                                                 \
        }                                                                                         \
    }
DEF_POOL(float, f32)
DEF_POOL(double, f64)

em_status em__cpu_pool2d(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                         const em_window2d *g) {
    if (check_dtype("pool2d", in)) return em_last_status();
    conv_job j = {.g = g, .kind = kind, .out = em__host_ptr(out), .in = em__host_ptr(in),
                  .idx = indices ? em__host_ptr(indices) : NULL};
    if (kind == EM_POOL_MAX && !j.idx) return em_error(EM_ERR_INTERNAL, "cpu: max_pool2d needs an indices tensor");
    em__cpu_parallel_for(g->n * g->c, grain_for(g->h * g->w + g->oh * g->ow), in->dtype == EM_F64 ? pool_f64 : pool_f32,
                         &j);
    return EM_OK;
}

em_status em__cpu_pool2d_backward(em_pool_kind kind, em_tensor *gin, const em_tensor *gout, const em_tensor *indices,
                                  const em_window2d *g) {
    if (check_dtype("pool2d backward", gin)) return em_last_status();
    conv_job j = {.g = g, .kind = kind, .out = em__host_ptr(gin), .in = em__host_ptr(gout),
                  .cidx = indices ? em__host_ptr(indices) : NULL};
    if (kind == EM_POOL_MAX && !j.cidx) return em_error(EM_ERR_INTERNAL, "cpu: max_pool2d backward needs indices");
    em__cpu_parallel_for(g->n * g->c, grain_for(g->h * g->w + g->oh * g->ow),
                         gin->dtype == EM_F64 ? pool_bwd_f64 : pool_bwd_f32, &j);
    return EM_OK;
}
