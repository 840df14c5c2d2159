/* LayerNorm forward and backward over contiguous rows, and GELU's backward in one pass
 * (the transformer's fused kernels), one row (or block) per task, f32 and f64. Each
 * row's mean and variance are two passes in double (the variance of x - mean, so that a
 * large mean costs no precision); the backward recomputes them rather than keeping them. */
#include <math.h>
#include "cpu_internal.h"
#include "cpu_threads.h"
#include "cpu_vmath.h"

typedef struct ln_ctx {
    void *out, *mean, *rstd, *gxhat;
    const void *x, *w, *b, *g;
    int64_t n;
    double eps;
} ln_ctx;

#define LN_ROWS(SFX, T)                                                                       \
    static void ln_stats_##SFX(const T *x, int64_t n, double eps, double *mean, double *rstd) { \
        double s = 0, v = 0;                                                                  \
        for (int64_t j = 0; j < n; j++) s += x[j];                                            \
        double m = n ? s / (double)n : 0;                                                     \
        for (int64_t j = 0; j < n; j++) v += ((double)x[j] - m) * ((double)x[j] - m);         \
        *mean = m;                                                                            \
        *rstd = 1.0 / sqrt((n ? v / (double)n : 0) + eps);                                    \
    }                                                                                         \
    static void ln_fwd_##SFX(void *arg, int64_t r0, int64_t r1) {                             \
        const ln_ctx *c = arg;                                                                \
        const T *w = c->w, *b = c->b;                                                         \
        for (int64_t r = r0; r < r1; r++) {                                                   \
            const T *x = (const T *)c->x + r * c->n;                                          \
            T *y = (T *)c->out + r * c->n;                                                    \
            double m, rs;                                                                     \
            ln_stats_##SFX(x, c->n, c->eps, &m, &rs);                                         \
            T tm = (T)m, trs = (T)rs;                                                         \
            for (int64_t j = 0; j < c->n; j++) y[j] = (x[j] - tm) * trs * w[j] + b[j];        \
            ((T *)c->mean)[r] = tm;                                                           \
            ((T *)c->rstd)[r] = trs;                                                          \
        }                                                                                     \
    }                                                                                         \
    /* dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)), gxhat = g * xhat */             \
    static void ln_bwd_##SFX(void *arg, int64_t r0, int64_t r1) {                             \
        const ln_ctx *c = arg;                                                                \
        const T *w = c->w;                                                                    \
        int64_t n = c->n;                                                                     \
        for (int64_t r = r0; r < r1; r++) {                                                   \
            const T *x = (const T *)c->x + r * n, *g = (const T *)c->g + r * n;               \
            T *dx = (T *)c->out + r * n, *gx = (T *)c->gxhat + r * n;                         \
            double m, rs, a = 0, d = 0;                                                       \
            ln_stats_##SFX(x, n, c->eps, &m, &rs);                                            \
            T tm = (T)m, trs = (T)rs;                                                         \
            for (int64_t j = 0; j < n; j++) {                                                 \
                T xh = (x[j] - tm) * trs, gw = g[j] * w[j];                                   \
                a += gw;                                                                      \
                d += (double)gw * xh;                                                         \
                gx[j] = g[j] * xh;                                                            \
            }                                                                                 \
            T ta = (T)(a / (double)n), td = (T)(d / (double)n);                               \
            for (int64_t j = 0; j < n; j++) {                                                 \
                T xh = (x[j] - tm) * trs;                                                     \
                dx[j] = trs * (g[j] * w[j] - ta - xh * td);                                   \
            }                                                                                 \
        }                                                                                     \
    }
LN_ROWS(f64, double)
/* f32 rows: the same steps in vectors (cpu_vmath.c) */
static void ln_fwd_f32(void *arg, int64_t r0, int64_t r1) {
    const ln_ctx *c = arg;
    for (int64_t r = r0; r < r1; r++)
        em__cpu_vln_row_f32((const float *)c->x + r * c->n, c->w, c->b, (float *)c->out + r * c->n, c->n, c->eps,
                            (float *)c->mean + r, (float *)c->rstd + r);
}
static void ln_bwd_f32(void *arg, int64_t r0, int64_t r1) {
    const ln_ctx *c = arg;
    for (int64_t r = r0; r < r1; r++)
        em__cpu_vln_backward_row_f32((const float *)c->x + r * c->n, c->w, (const float *)c->g + r * c->n,
                                     (float *)c->out + r * c->n, (float *)c->gxhat + r * c->n, c->n, c->eps);
}

static em_status ln_check(const char *op, const em_tensor *x, int64_t n) {
    if ((x->dtype != EM_F32 && x->dtype != EM_F64) || n <= 0)
        return em_error(EM_ERR_INTERNAL, "cpu: %s expects f32/f64 rows of n > 0 elements", op);
    return EM_OK;
}

em_status em__cpu_layer_norm(const em_op_call *call) {
    em_tensor *out = call->dst[0], *mean = call->dst[1], *rstd = call->dst[2];
    const em_tensor *x = call->src[0], *w = call->src[1], *b = call->src[2];
    int64_t n = call->i[0];
    double eps = call->f[0];
    if (ln_check("layer_norm", x, n)) return em_last_status();
    ln_ctx c = {em__host_ptr(out), em__host_ptr(mean), em__host_ptr(rstd), NULL,
                em__host_ptr(x), em__host_ptr(w), em__host_ptr(b), NULL, n, eps};
    int64_t rows = em__cpu_numel(x) / n;
    em__cpu_parallel_for(rows, EM_CPU_PARALLEL_ELEMS / (4 * n) + 1, x->dtype == EM_F64 ? ln_fwd_f64 : ln_fwd_f32, &c);
    return EM_OK;
}

em_status em__cpu_layer_norm_backward(const em_op_call *call) {
    em_tensor *dx = call->dst[0], *gxhat = call->dst[1];
    const em_tensor *g = call->src[0], *x = call->src[1], *w = call->src[2];
    int64_t n = call->i[0];
    double eps = call->f[0];
    if (ln_check("layer_norm_backward", x, n)) return em_last_status();
    ln_ctx c = {em__host_ptr(dx), NULL, NULL, em__host_ptr(gxhat), em__host_ptr(x), em__host_ptr(w), NULL,
                em__host_ptr(g), n, eps};
    int64_t rows = em__cpu_numel(x) / n;
    em__cpu_parallel_for(rows, EM_CPU_PARALLEL_ELEMS / (8 * n) + 1, x->dtype == EM_F64 ? ln_bwd_f64 : ln_bwd_f32, &c);
    return EM_OK;
}

/* dx = g * (Phi(x) + x * phi(x)), Phi(x) = (1 + erf(x / sqrt 2)) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
#define GELU_BWD(SFX, T, ERF, EXP)                                                            \
    static void gelu_bwd_##SFX(void *arg, int64_t i0, int64_t i1) {                           \
        const ln_ctx *c = arg;                                                                \
        const T *g = c->g, *x = c->x;                                                         \
        T *dx = c->out;                                                                       \
        for (int64_t i = i0; i < i1; i++) {                                                   \
            T v = x[i];                                                                       \
            T cdf = (T)0.5 * ((T)1 + ERF(v * (T)0.70710678118654752440));                     \
            T pdf = EXP((T)-0.5 * v * v) * (T)0.39894228040143267794;                        \
            dx[i] = g[i] * (cdf + v * pdf);                                                   \
        }                                                                                     \
    }
GELU_BWD(f64, double, erf, exp)
/* f32: the vectorized erf and exp (cpu_vmath.c) */
static void gelu_bwd_f32(void *arg, int64_t i0, int64_t i1) {
    const ln_ctx *c = arg;
    em__cpu_vgelu_backward_f32((const float *)c->g + i0, (const float *)c->x + i0, (float *)c->out + i0, i1 - i0);
}

em_status em__cpu_gelu_backward(const em_op_call *call) {
    em_tensor *dx = call->dst[0];
    const em_tensor *g = call->src[0], *x = call->src[1];
    if ((x->dtype != EM_F32 && x->dtype != EM_F64) || g->dtype != x->dtype || dx->dtype != x->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: gelu_backward expects f32/f64 operands of one dtype");
    ln_ctx c = {em__host_ptr(dx), NULL, NULL, NULL, em__host_ptr(x), NULL, NULL, em__host_ptr(g), 0, 0};
    em__cpu_parallel_for(em__cpu_numel(x), EM_CPU_PARALLEL_ELEMS / 4, x->dtype == EM_F64 ? gelu_bwd_f64 : gelu_bwd_f32,
                         &c);
    return EM_OK;
}
