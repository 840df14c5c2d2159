/* Convolution and pooling in bfloat16 / float16 on the CPU, float32 accumulation throughout
 * (cpu_conv_lowp.h). The portable path's im2col moves 16-bit values as they are; col2im
 * sums each input position in float32 and rounds once. The pools run their float32 kernels
 * on float32 copies (max picks one of the inputs, so it is exact; avg rounds once).
 * The library path: bf16 through oneDNN's bf16 convolution (AVX512-BF16 / AMX kernels, float32
 * accumulation inside) where cpu_dnnl.c's probe found a fast bf16 kernel; f16 (oneDNN 2.6
 * has no f16 convolution on the CPU) and bf16 elsewhere through float32 copies and the
 * float32 oneDNN convolution, as the lowp matmul does. cpu_conv_dnnl.c builds, caches and
 * runs oneDNN's convolutions in both dtypes; this file only chooses which one runs. */
#include "cpu_conv_lowp.h"
#include <stdlib.h>
#include "cpu_dnnl.h"

static bool is_lowp(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16; }

/* ---- scratch tensors: contiguous, on the host, freed by tmp_free ---- */
typedef em_cpu_tmp tmp_tensor;
static em_status tmp_make(tmp_tensor *x, em_dtype dt, int nd, const int64_t *shape) {
    return em__cpu_tmp_make(x, dt, nd, shape, "conv2d");
}
static void tmp_free(tmp_tensor *x) { em__cpu_tmp_free(x); }

/* a float32 copy of t (any dtype) in x */
static em_status tmp_f32_of(tmp_tensor *x, const em_tensor *t) {
    em_status st = tmp_make(x, EM_F32, t->ndim, t->shape);
    if (st == EM_OK && (st = em__cpu_copy(&x->t, t)) != EM_OK) tmp_free(x);
    return st;
}

/* ---- im2col / col2im in 16 bits ---- */
typedef struct lowp_job {
    const em_window2d *g;
    em_dtype dt;
    char *out;
    const char *in;
    atomic_bool oom; /* a worker found no memory for its float32 plane */
} lowp_job;

static int64_t grain_for(int64_t per_item) {
    int64_t g = EM_CPU_MIN_GRAIN / (per_item > 0 ? per_item : 1);
    return g < 1 ? 1 : g;
}

/* one row (n, c, ki, kj) of cols per item; a 16-bit zero is 0.0 in both dtypes */
static void im2col_u16(void *ctx, int64_t begin, int64_t end) {
    const lowp_job *j = ctx;
    const em_window2d *g = j->g;
    int64_t L = g->oh * g->ow, kk = g->kh * g->kw;
    for (int64_t r = begin; r < end; r++) {
        int64_t plane = r / kk, ki = (r % kk) / g->kw, kj = r % g->kw;
        const uint16_t *x = (const uint16_t *)j->in + plane * g->h * g->w;
        uint16_t *c = (uint16_t *)j->out + r * L;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
            uint16_t *crow = c + oy * g->ow;
            if (iy < 0 || iy >= g->h) {
                memset(crow, 0, (size_t)g->ow * sizeof *crow);
                continue;
            }
            const uint16_t *xrow = x + iy * g->w;
            int64_t ix0 = kj * g->dw - g->pw;
            if (g->sw == 1 && ix0 >= 0 && ix0 + g->ow <= g->w) {
                memcpy(crow, xrow + ix0, (size_t)g->ow * sizeof *crow);
                continue;
            }
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t ix = ox * g->sw + ix0;
                crow[ox] = ix >= 0 && ix < g->w ? xrow[ix] : 0;
            }
        }
    }
}

/* one (n, c) plane per item: summed in float32 (a plane and a row of scratch), rounded once */
static void col2im_u16(void *ctx, int64_t begin, int64_t end) {
    const lowp_job *j = ctx;
    const em_window2d *g = j->g;
    int64_t L = g->oh * g->ow, kk = g->kh * g->kw, hw = g->h * g->w;
    float *acc = malloc((size_t)(hw + L) * sizeof(float));
    if (!acc) {
        atomic_store(&((lowp_job *)ctx)->oom, true);
        return;
    }
    float *row = acc + hw;
    for (int64_t p = begin; p < end; p++) {
        for (int64_t i = 0; i < hw; i++) acc[i] = 0;
        for (int64_t k = 0; k < kk; k++) {
            int64_t ki = k / g->kw, kj = k % g->kw;
            em__cpu_load_block(row, j->in + (p * kk + k) * L * 2, 2, L, j->dt);
            for (int64_t oy = 0; oy < g->oh; oy++) {
                int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                if (iy < 0 || iy >= g->h) continue;
                float *xrow = acc + iy * g->w;
                const float *crow = row + oy * g->ow;
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t ix = ox * g->sw - g->pw + kj * g->dw;
                    if (ix >= 0 && ix < g->w) xrow[ix] += crow[ox];
                }
            }
        }
        em__cpu_store_block(j->out + p * hw * 2, 2, hw, j->dt, acc);
    }
    free(acc);
}

em_status em__cpu_im2col_any(em_tensor *cols, const em_tensor *in, const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_im2col(cols, in, g);
    lowp_job j = {.g = g, .dt = in->dtype, .out = em__host_ptr(cols), .in = em__host_ptr(in)};
    int64_t rows = g->n * g->c * g->kh * g->kw;
    em__cpu_parallel_for(rows, grain_for(g->oh * g->ow), im2col_u16, &j);
    return EM_OK;
}

em_status em__cpu_col2im_any(em_tensor *in, const em_tensor *cols, const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_col2im(in, cols, g);
    lowp_job j = {.g = g, .dt = in->dtype, .out = em__host_ptr(in), .in = em__host_ptr(cols)};
    em__cpu_parallel_for(g->n * g->c, grain_for(g->h * g->w * g->kh * g->kw), col2im_u16, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: conv2d backward: no memory for a float32 plane of %lld elements",
                        (long long)(g->h * g->w + g->oh * g->ow));
    return EM_OK;
}

/* ---- pools: the float32 kernels on float32 copies ---- */
em_status em__cpu_pool2d_any(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                             const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_pool2d(kind, out, indices, in, g);
    tmp_tensor x, y;
    em_status st = tmp_f32_of(&x, in);
    if (st) return st;
    if ((st = tmp_make(&y, EM_F32, out->ndim, out->shape))) {
        tmp_free(&x);
        return st;
    }
    st = em__cpu_pool2d(kind, &y.t, indices, &x.t, g);
    if (st == EM_OK) st = em__cpu_copy(out, &y.t);
    tmp_free(&x);
    tmp_free(&y);
    return st;
}

em_status em__cpu_pool2d_backward_any(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                      const em_tensor *indices, const em_window2d *g) {
    if (!is_lowp(gin->dtype)) return em__cpu_pool2d_backward(kind, gin, gout, indices, g);
    tmp_tensor gy, gx;
    em_status st = tmp_f32_of(&gy, gout);
    if (st) return st;
    if ((st = tmp_make(&gx, EM_F32, gin->ndim, gin->shape))) {
        tmp_free(&gy);
        return st;
    }
    st = em__cpu_pool2d_backward(kind, &gx.t, &gy.t, indices, g);
    if (st == EM_OK) st = em__cpu_copy(gin, &gx.t);
    tmp_free(&gy);
    tmp_free(&gx);
    return st;
}

#ifdef EMBER_HAVE_DNNL
/* ---- oneDNN's bf16 convolution (built and cached in cpu_conv_dnnl.c with the f32 one) ---- */
/* EM_ERR_NOT_SUPPORTED (nothing recorded) when oneDNN has no fast bf16 kernel for the pass */
static em_status run_bf16(const char *op, em_conv_pass pass, const em_window2d *g, int64_t O, int64_t G, bool bias,
                          void *const *ptr) {
    if (!em__cpu_dnnl_runs(EM_BF16)) return EM_ERR_NOT_SUPPORTED; /* no AVX512-BF16/AMX, or switched off */
    return em__cpu_conv_dnnl_run(op, pass, EM_BF16, g, O, G, bias, ptr);
}

const char *em__cpu_conv_lowp_describe(void) {
    if (!em__cpu_dnnl_runs(EM_BF16)) return "float32 copies (no fast oneDNN bf16 kernel here, or EMBER_CPU_LOWP_GEMM=portable)";
    static char copy[160];
    em__cpu_conv_dnnl_bf16_kernel(copy, sizeof copy);
    return copy;
}

/* ---- the entries: f32 on to cpu_conv_dnnl.c, bf16 to oneDNN's bf16 kernels, else float32
 * copies through the float32 ones ---- */
typedef struct f32_args { tmp_tensor t[4]; int n; } f32_args;

static em_status f32_add(f32_args *a, const em_tensor *t, bool copy) {
    tmp_tensor *x = &a->t[a->n];
    em_status st = copy ? tmp_f32_of(x, t) : tmp_make(x, EM_F32, t->ndim, t->shape);
    if (st == EM_OK) a->n++;
    return st;
}

static void f32_free(f32_args *a) {
    for (int i = 0; i < a->n; i++) tmp_free(&a->t[i]);
}

em_status em__cpu_conv2d_any(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                             const em_window2d *g, int64_t groups) {
    if (!is_lowp(in->dtype)) return em__cpu_conv2d_dnnl(out, in, w, bias, g, groups);
    if (in->dtype == EM_BF16) {
        void *ptr[4] = {em__host_ptr(in), em__host_ptr(w), em__host_ptr(out), bias ? em__host_ptr(bias) : NULL};
        em_status st = run_bf16("conv2d", EM_CONV_FWD, g, w->shape[0], groups, bias != NULL, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, in, true);
    if (st == EM_OK) st = f32_add(&a, w, true);
    if (st == EM_OK) st = f32_add(&a, out, false);
    if (st == EM_OK && bias) st = f32_add(&a, bias, true);
    if (st == EM_OK) st = em__cpu_conv2d_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, bias ? &a.t[3].t : NULL, g, groups);
    if (st == EM_OK) st = em__cpu_copy(out, &a.t[2].t);
    f32_free(&a);
    return st;
}

em_status em__cpu_conv2d_backward_input_any(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                            const em_window2d *g, int64_t groups) {
    if (!is_lowp(gin->dtype)) return em__cpu_conv2d_backward_input_dnnl(gin, gout, w, g, groups);
    if (gin->dtype == EM_BF16) {
        void *ptr[3] = {em__host_ptr(gout), em__host_ptr(w), em__host_ptr(gin)};
        em_status st = run_bf16("conv2d backward (input)", EM_CONV_BWD_DATA, g, w->shape[0], groups, false, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, gout, true);
    if (st == EM_OK) st = f32_add(&a, w, true);
    if (st == EM_OK) st = f32_add(&a, gin, false);
    if (st == EM_OK) st = em__cpu_conv2d_backward_input_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, g, groups);
    if (st == EM_OK) st = em__cpu_copy(gin, &a.t[2].t);
    f32_free(&a);
    return st;
}

em_status em__cpu_conv2d_backward_weight_any(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                             const em_window2d *g, int64_t groups) {
    if (!is_lowp(gw->dtype)) return em__cpu_conv2d_backward_weight_dnnl(gw, gout, in, g, groups);
    if (gw->dtype == EM_BF16) {
        void *ptr[3] = {em__host_ptr(in), em__host_ptr(gout), em__host_ptr(gw)};
        em_status st = run_bf16("conv2d backward (weight)", EM_CONV_BWD_WEIGHTS, g, gw->shape[0], groups, false, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, gout, true);
    if (st == EM_OK) st = f32_add(&a, in, true);
    if (st == EM_OK) st = f32_add(&a, gw, false);
    if (st == EM_OK) st = em__cpu_conv2d_backward_weight_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, g, groups);
    if (st == EM_OK) st = em__cpu_copy(gw, &a.t[2].t);
    f32_free(&a);
    return st;
}
#endif
