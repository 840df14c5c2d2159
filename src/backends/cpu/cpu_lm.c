/* The language models' fused ops on the CPU (op_list.h's RMS_NORM, RMS_NORM_BACKWARD,
 * SWIGLU, SWIGLU_BACKWARD, ROPE): one pass over the data each, rows (or blocks of elements)
 * split over the thread pool.
 *
 * float32 runs the vector kernels of cpu_vmath.c; float64 plain loops in double. float16 and
 * bfloat16 are loaded into float32 blocks (the casts' AVX-512 / F16C paths), computed there,
 * and rounded back where PyTorch's composition rounds: Hugging Face's LlamaRMSNorm rounds
 * x * rsqrt(mean(x^2) + eps) to the input's dtype before it multiplies by the weight, its
 * MLP rounds silu(gate) before the product with up, and its rotary embedding rounds both
 * products before their sum. Matching those roundings makes a bf16 model's logits the same
 * bits as transformers' rather than merely close. The backward passes compute in float32 and
 * round once (autograd's composition rounds at every op; one rounding is closer to exact).
 * The rotary embedding is float32/float64 only here: for f16/bf16 the CPU's supports says no
 * and core composes it (the same ops as transformers, so the same bits), because rows of 64
 * or 128 16-bit elements measured faster composed than converted and rounded row by row
 * (bench/lm_ops.c). */
#include <math.h>
#include <stdlib.h>
#include "cpu_internal.h"
#include "cpu_vmath.h"

#define LM_BLOCK 1024 /* elements of an elementwise op's float32 block */

typedef struct lm_job {
    em_dtype dt;
    void *o0, *o1;              /* outputs */
    const void *a, *b, *c, *w;  /* inputs */
    int64_t n, numel;
    double eps;
    bool want1;
    /* rope */
    int64_t H, T, sb, sh, st;
    bool per_batch, backward;
    atomic_bool oom;
} lm_job;

static inline size_t esize(em_dtype dt) { return em__cpu_esize(dt); }
static inline const char *at_c(const void *p, int64_t i, em_dtype dt) { return (const char *)p + i * (int64_t)esize(dt); }
static inline char *at_m(void *p, int64_t i, em_dtype dt) { return (char *)p + i * (int64_t)esize(dt); }

/* buf[0..n) rounded to dt (f16/bf16) and back: the rounding a composition's store makes. */
static void round_to(em_dtype dt, float *buf, int64_t n, uint16_t *tmp) {
    em__cpu_store_block((char *)tmp, 2, n, dt, buf);
    em__cpu_load_block(buf, (const char *)tmp, 2, n, dt);
}

/* ---- RMSNorm ---- */

static double rms_inv(const float *x, int64_t n, double eps) {
    return 1.0 / sqrt(em__cpu_vsumsq_f32(x, n) / (double)n + eps);
}

static void rms_fwd_f64(void *arg, int64_t r0, int64_t r1) {
    const lm_job *j = arg;
    const double *w = j->w;
    for (int64_t r = r0; r < r1; r++) {
        const double *x = (const double *)j->a + r * j->n;
        double *y = (double *)j->o0 + r * j->n, s = 0;
        for (int64_t k = 0; k < j->n; k++) s += x[k] * x[k];
        double inv = 1.0 / sqrt(s / (double)j->n + j->eps);
        for (int64_t k = 0; k < j->n; k++) y[k] = w ? (x[k] * inv) * w[k] : x[k] * inv;
    }
}

static void rms_fwd_f32(void *arg, int64_t r0, int64_t r1) {
    const lm_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)j->a + r * j->n;
        em__cpu_vrms_row_f32(x, j->w, (float *)j->o0 + r * j->n, j->n, (float)rms_inv(x, j->n, j->eps));
    }
}

/* f16/bf16: x into float32, y = round(x * r), then round(y * w) */
static void rms_fwd_16(void *arg, int64_t r0, int64_t r1) {
    lm_job *j = arg;
    int64_t n = j->n;
    float *buf = malloc(sizeof(float) * (size_t)n * 2 + sizeof(uint16_t) * (size_t)n);
    if (!buf) {
        atomic_store(&j->oom, true);
        return;
    }
    float *wf = buf + n;
    uint16_t *tmp = (uint16_t *)(wf + n);
    if (j->w) em__cpu_load_block(wf, j->w, 2, n, j->dt);
    for (int64_t r = r0; r < r1; r++) {
        em__cpu_load_block(buf, at_c(j->a, r * n, j->dt), 2, n, j->dt);
        float inv = (float)rms_inv(buf, n, j->eps);
        em__cpu_vrms_row_f32(buf, NULL, buf, n, inv);
        if (j->w) {
            round_to(j->dt, buf, n, tmp);
            em__cpu_vrms_row_f32(buf, wf, buf, n, 1.0f); /* y * w: r = 1 is exact */
        }
        em__cpu_store_block(at_m(j->o0, r * n, j->dt), 2, n, j->dt, buf);
    }
    free(buf);
}

em_status em__cpu_rms_norm(const em_op_call *call) {
    const em_tensor *x = call->src[0], *w = call->i[1] ? call->src[1] : NULL;
    int64_t n = call->i[0];
    if (n <= 0 || !em_dtype_is_floating(x->dtype))
        return em_error(EM_ERR_INTERNAL, "cpu: rms_norm expects floating rows of n > 0 elements");
    lm_job j = {.dt = x->dtype, .o0 = em__host_ptr(call->dst[0]), .a = em__host_ptr(x), .w = w ? em__host_ptr(w) : NULL,
                .n = n, .eps = call->f[0]};
    atomic_init(&j.oom, false);
    em_cpu_range_fn fn = x->dtype == EM_F64 ? rms_fwd_f64 : x->dtype == EM_F32 ? rms_fwd_f32 : rms_fwd_16;
    em__cpu_parallel_for(em__cpu_numel(x) / n, EM_CPU_PARALLEL_ELEMS / (4 * n) + 1, fn, &j);
    if (atomic_load(&j.oom)) return em_error(EM_ERR_OUT_OF_MEMORY, "rms_norm: out of host memory for a row buffer");
    return EM_OK;
}

/* backward, one row in the compute type: xhat = x r, gw = g w (or g), dx = r (gw - xhat *
 * mean(gw xhat)), gx = g xhat */
static void rms_bwd_f64(void *arg, int64_t r0, int64_t r1) {
    const lm_job *j = arg;
    const double *w = j->w;
    int64_t n = j->n;
    for (int64_t r = r0; r < r1; r++) {
        const double *x = (const double *)j->b + r * n, *g = (const double *)j->a + r * n;
        double *dx = (double *)j->o0 + r * n, *gx = j->want1 ? (double *)j->o1 + r * n : NULL, s = 0, d = 0;
        for (int64_t k = 0; k < n; k++) s += x[k] * x[k];
        double inv = 1.0 / sqrt(s / (double)n + j->eps);
        for (int64_t k = 0; k < n; k++) d += (w ? g[k] * w[k] : g[k]) * (x[k] * inv);
        d /= (double)n;
        for (int64_t k = 0; k < n; k++) {
            double xh = x[k] * inv;
            dx[k] = inv * ((w ? g[k] * w[k] : g[k]) - xh * d);
            if (gx) gx[k] = g[k] * xh;
        }
    }
}

/* float32 and the 16-bit types (their rows loaded into float32 first) */
static void rms_bwd_f32(void *arg, int64_t r0, int64_t r1) {
    lm_job *j = arg;
    int64_t n = j->n;
    bool wide = j->dt != EM_F32;
    float *buf = wide ? malloc(sizeof(float) * (size_t)n * 4) : NULL;
    if (wide && !buf) {
        atomic_store(&j->oom, true);
        return;
    }
    const float *w = j->w;
    if (wide && j->w) {
        em__cpu_load_block(buf + 3 * n, j->w, 2, n, j->dt);
        w = buf + 3 * n;
    }
    for (int64_t r = r0; r < r1; r++) {
        const float *g, *x;
        float *dx = wide ? buf + 2 * n : (float *)j->o0 + r * n;
        if (wide) {
            em__cpu_load_block(buf, at_c(j->a, r * n, j->dt), 2, n, j->dt);
            em__cpu_load_block(buf + n, at_c(j->b, r * n, j->dt), 2, n, j->dt);
            g = buf;
            x = buf + n;
        } else {
            g = (const float *)j->a + r * n;
            x = (const float *)j->b + r * n;
        }
        float inv = (float)rms_inv(x, n, j->eps);
        em__cpu_vrms_backward_row_f32(x, w, g, dx, j->want1 ? (float *)j->o1 + r * n : NULL, n, inv);
        if (wide) em__cpu_store_block(at_m(j->o0, r * n, j->dt), 2, n, j->dt, dx);
    }
    free(buf);
}

em_status em__cpu_rms_norm_backward(const em_op_call *call) {
    const em_tensor *g = call->src[0], *x = call->src[1], *w = call->i[1] ? call->src[2] : NULL;
    int64_t n = call->i[0];
    bool want = call->i[2] && call->dst[1];
    if (n <= 0 || !em_dtype_is_floating(x->dtype) || g->dtype != x->dtype ||
        (want && call->dst[1]->dtype != em__cpu_compute_type(x->dtype)))
        return em_error(EM_ERR_INTERNAL, "cpu: rms_norm_backward expects floating rows of n > 0 elements and gxhat "
                        "in the compute dtype");
    lm_job j = {.dt = x->dtype, .o0 = em__host_ptr(call->dst[0]), .o1 = want ? em__host_ptr(call->dst[1]) : NULL,
                .a = em__host_ptr(g), .b = em__host_ptr(x), .w = w ? em__host_ptr(w) : NULL, .n = n,
                .eps = call->f[0], .want1 = want};
    atomic_init(&j.oom, false);
    em__cpu_parallel_for(em__cpu_numel(x) / n, EM_CPU_PARALLEL_ELEMS / (8 * n) + 1,
                         x->dtype == EM_F64 ? rms_bwd_f64 : rms_bwd_f32, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "rms_norm backward: out of host memory for a row buffer");
    return EM_OK;
}

/* ---- SwiGLU ---- */

static void swiglu_fwd(void *arg, int64_t i0, int64_t i1) {
    lm_job *j = arg;
    if (j->dt == EM_F64) {
        const double *a = j->a, *b = j->b;
        double *o = j->o0;
        for (int64_t i = i0; i < i1; i++) o[i] = a[i] / (1.0 + exp(-a[i])) * b[i];
        return;
    }
    if (j->dt == EM_F32) {
        em__cpu_vswiglu_f32((const float *)j->a + i0, (const float *)j->b + i0, (float *)j->o0 + i0, i1 - i0);
        return;
    }
    float ga[LM_BLOCK], ub[LM_BLOCK];
    uint16_t tmp[LM_BLOCK];
    for (int64_t i = i0; i < i1; i += LM_BLOCK) {
        int64_t m = i1 - i < LM_BLOCK ? i1 - i : LM_BLOCK;
        em__cpu_load_block(ga, at_c(j->a, i, j->dt), 2, m, j->dt);
        em__cpu_load_block(ub, at_c(j->b, i, j->dt), 2, m, j->dt);
        em__cpu_vswiglu_f32(ga, NULL, ga, m); /* silu(gate) */
        round_to(j->dt, ga, m, tmp);
        EM_CPU_VLOOP(m, ga[i] *= ub[i];)
        em__cpu_store_block(at_m(j->o0, i, j->dt), 2, m, j->dt, ga);
    }
}

em_status em__cpu_swiglu(const em_op_call *call) {
    const em_tensor *a = call->src[0], *b = call->src[1];
    lm_job j = {.dt = a->dtype, .o0 = em__host_ptr(call->dst[0]), .a = em__host_ptr(a), .b = em__host_ptr(b)};
    em__cpu_parallel_for(em__cpu_numel(a), EM_CPU_PARALLEL_ELEMS / 4, swiglu_fwd, &j);
    return EM_OK;
}

static void swiglu_bwd(void *arg, int64_t i0, int64_t i1) {
    lm_job *j = arg;
    if (j->dt == EM_F64) {
        const double *g = j->a, *a = j->b, *b = j->c;
        double *da = j->o0, *db = j->o1;
        for (int64_t i = i0; i < i1; i++) {
            double s = 1.0 / (1.0 + exp(-a[i]));
            db[i] = g[i] * a[i] * s;
            da[i] = g[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
        }
        return;
    }
    if (j->dt == EM_F32) {
        em__cpu_vswiglu_backward_f32((const float *)j->a + i0, (const float *)j->b + i0, (const float *)j->c + i0,
                                     (float *)j->o0 + i0, (float *)j->o1 + i0, i1 - i0);
        return;
    }
    float g[LM_BLOCK], a[LM_BLOCK], b[LM_BLOCK];
    for (int64_t i = i0; i < i1; i += LM_BLOCK) {
        int64_t m = i1 - i < LM_BLOCK ? i1 - i : LM_BLOCK;
        em__cpu_load_block(g, at_c(j->a, i, j->dt), 2, m, j->dt);
        em__cpu_load_block(a, at_c(j->b, i, j->dt), 2, m, j->dt);
        em__cpu_load_block(b, at_c(j->c, i, j->dt), 2, m, j->dt);
        em__cpu_vswiglu_backward_f32(g, a, b, a, b, m); /* in place: da over a, db over b */
        em__cpu_store_block(at_m(j->o0, i, j->dt), 2, m, j->dt, a);
        em__cpu_store_block(at_m(j->o1, i, j->dt), 2, m, j->dt, b);
    }
}

em_status em__cpu_swiglu_backward(const em_op_call *call) {
    const em_tensor *g = call->src[0];
    lm_job j = {.dt = g->dtype, .o0 = em__host_ptr(call->dst[0]), .o1 = em__host_ptr(call->dst[1]),
                .a = em__host_ptr(g), .b = em__host_ptr(call->src[1]), .c = em__host_ptr(call->src[2])};
    em__cpu_parallel_for(em__cpu_numel(g), EM_CPU_PARALLEL_ELEMS / 8, swiglu_bwd, &j);
    return EM_OK;
}

/* ---- rotary embedding ----
 * Row r of the output is (b, h, t) = (r / (H T), r / T % H, r % T); its input row starts at
 * b sb + h sh + t st, its cos and sin rows at (b T + t) D (per batch) or t D. */

static void rope_rows_f64(void *arg, int64_t r0, int64_t r1) {
    const lm_job *j = arg;
    int64_t D = j->n, h2 = D / 2;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / (j->H * j->T), hh = r / j->T % j->H, t = r % j->T;
        const double *x = (const double *)j->a + b * j->sb + hh * j->sh + t * j->st;
        int64_t cr = ((j->per_batch ? b * j->T : 0) + t) * D;
        const double *c = (const double *)j->b + cr, *s = (const double *)j->c + cr;
        double *y = (double *)j->o0 + r * D;
        for (int64_t k = 0; k < h2; k++) {
            double x1 = x[k], x2 = x[k + h2];
            if (!j->backward) {
                y[k] = x1 * c[k] - x2 * s[k];
                y[k + h2] = x2 * c[k + h2] + x1 * s[k + h2];
            } else {
                y[k] = x1 * c[k] + x2 * s[k + h2];
                y[k + h2] = x2 * c[k + h2] - x1 * s[k];
            }
        }
    }
}

/* float32 rows: p = x cos, q = rotate_half(x) sin (forward) or rotate_half^T(x sin)
 * (backward), out = p + q */
static void rope_rows_f32(void *arg, int64_t r0, int64_t r1) {
    const lm_job *j = arg;
    int64_t D = j->n, h2 = D / 2;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / (j->H * j->T), hh = r / j->T % j->H, t = r % j->T;
        const float *x = (const float *)j->a + b * j->sb + hh * j->sh + t * j->st;
        int64_t cr = ((j->per_batch ? b * j->T : 0) + t) * D;
        const float *c = (const float *)j->b + cr, *s = (const float *)j->c + cr;
        float *y = (float *)j->o0 + r * D;
        if (!j->backward) {
            EM_CPU_VLOOP(h2, y[i] = x[i] * c[i] - x[i + h2] * s[i]; y[i + h2] = x[i + h2] * c[i + h2] + x[i] * s[i + h2];)
        } else {
            EM_CPU_VLOOP(h2, y[i] = x[i] * c[i] + x[i + h2] * s[i + h2]; y[i + h2] = x[i + h2] * c[i + h2] - x[i] * s[i];)
        }
    }
}

em_status em__cpu_rope(const em_op_call *call) {
    const em_tensor *x = call->src[0];
    int64_t D = call->i[0];
    if (D <= 0 || D % 2 || call->i[1] <= 0 || call->i[2] <= 0 || (x->dtype != EM_F32 && x->dtype != EM_F64))
        return em_error(EM_ERR_INTERNAL, "cpu: rope expects f32/f64 rows of an even D > 0 and H, T > 0");
    lm_job j = {.dt = x->dtype, .o0 = em__host_ptr(call->dst[0]), .a = em__host_ptr(x),
                .b = em__host_ptr(call->src[1]), .c = em__host_ptr(call->src[2]), .n = D, .H = call->i[1],
                .T = call->i[2], .sb = call->i[3], .sh = call->i[4], .st = call->i[5], .per_batch = call->i[6] != 0,
                .backward = call->i[7] != 0};
    em__cpu_parallel_for(em__cpu_numel(call->dst[0]) / D, EM_CPU_PARALLEL_ELEMS / (4 * D) + 1,
                         x->dtype == EM_F64 ? rope_rows_f64 : rope_rows_f32, &j);
    return EM_OK;
}
