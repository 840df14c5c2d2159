/* Convolution and pooling: F.conv2d, max/avg/adaptive-avg pool2d and their backward passes.
 * Core checks arguments as PyTorch does (with its messages), makes the inputs contiguous
 * NCHW, and runs either the backend's convolution library (the CPU's oneDNN) or the portable
 * path: im2col + the backend's batched matmul, col2im for the input's gradient. Pools are
 * one backend entry each way. Autograd's formulas call the backward functions below
 * (declared in internal_api.h). */
#include <stdio.h>
#include <stdlib.h>
#include "ops_internal.h"
#include "internal_api.h"

/* em_grad_args.win, in this order */
enum {
    EM_GRAD_WIN_KH, EM_GRAD_WIN_KW, EM_GRAD_WIN_SH, EM_GRAD_WIN_SW, EM_GRAD_WIN_PH, EM_GRAD_WIN_PW,
    EM_GRAD_WIN_DH, EM_GRAD_WIN_DW, EM_GRAD_WIN_GROUPS, EM_GRAD_WIN_CIP, EM_GRAD_WIN_DIV
};

/* The portable path's im2col buffer holds at most this many elements; larger batches run in
 * chunks of samples. */
#define CONV_COLS_LIMIT ((int64_t)1 << 24)

static _Atomic int force_portable = -1; /* -1: not yet read from EMBER_CONV */

bool em__conv_force_portable(bool on) {
    int prev = atomic_exchange(&force_portable, on ? 1 : 0);
    if (prev < 0) {
        const char *e = getenv("EMBER_CONV");
        prev = e && strcmp(e, "portable") == 0;
    }
    return prev == 1;
}

static bool use_portable(void) {
    int v = atomic_load(&force_portable);
    if (v < 0) {
        const char *e = getenv("EMBER_CONV");
        v = e && strcmp(e, "portable") == 0;
        int expected = -1;
        atomic_compare_exchange_strong(&force_portable, &expected, v);
    }
    return v == 1;
}

static char *shp(char *buf, size_t n, const em_tensor *t) { return em__shape_str(buf, n, t->ndim, t->shape); }

/* every floating dtype: f16/bf16 run with float32 accumulation on every backend */
static em_status check_float(const char *op, const char *what, const em_tensor *t) {
    if (em_dtype_is_floating(t->dtype)) return EM_OK;
    return em_error(EM_ERR_DTYPE, "%s: expected %s of a floating dtype (float32, float64, float16 or bfloat16), "
                    "but got %s", op, what, em_dtype_name(t->dtype));
}

/* t itself when contiguous, else a new contiguous copy kept in *tmp (caller releases). */
static const em_tensor *contig(const em_tensor *t, em_tensor **tmp) {
    *tmp = NULL;
    if (em__is_contiguous_raw(t->ndim, t->shape, t->strides)) return t;
    *tmp = em__copy_raw(t, t->dtype);
    return *tmp;
}

/* A stack view of contiguous t with another shape and strides. */
static void view(em_tensor *dst, const em_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                 int64_t offset) {
    em__stack_view(dst, t, ndim, shape, strides, t->offset + offset);
}

static void win_to_args(const em_window2d *g, int64_t groups, int64_t *win) {
    win[EM_GRAD_WIN_KH] = g->kh, win[EM_GRAD_WIN_KW] = g->kw;
    win[EM_GRAD_WIN_SH] = g->sh, win[EM_GRAD_WIN_SW] = g->sw;
    win[EM_GRAD_WIN_PH] = g->ph, win[EM_GRAD_WIN_PW] = g->pw;
    win[EM_GRAD_WIN_DH] = g->dh, win[EM_GRAD_WIN_DW] = g->dw;
    win[EM_GRAD_WIN_GROUPS] = groups;
    win[EM_GRAD_WIN_CIP] = g->count_include_pad;
    win[EM_GRAD_WIN_DIV] = g->divisor;
}

static em_window2d win_from_args(const int64_t *in_shape, int64_t oh, int64_t ow, const int64_t *win) {
    em_window2d g = {.n = in_shape[0], .c = in_shape[1], .h = in_shape[2], .w = in_shape[3], .oh = oh, .ow = ow,
                     .kh = win[EM_GRAD_WIN_KH], .kw = win[EM_GRAD_WIN_KW], .sh = win[EM_GRAD_WIN_SH],
                     .sw = win[EM_GRAD_WIN_SW], .ph = win[EM_GRAD_WIN_PH], .pw = win[EM_GRAD_WIN_PW],
                     .dh = win[EM_GRAD_WIN_DH], .dw = win[EM_GRAD_WIN_DW],
                     .count_include_pad = win[EM_GRAD_WIN_CIP], .divisor = win[EM_GRAD_WIN_DIV]};
    return g;
}

/* The ops each path needs of the backend, asked before anything is allocated. */
static em_status need_ops(const char *op, const em_backend *be, em_device d, em_dtype dt, bool conv) {
    static const em_op conv_ops[] = {EM_OP_IM2COL, EM_OP_COL2IM, EM_OP_MATMUL};
    static const em_op pool_ops[] = {EM_OP_POOL2D, EM_OP_POOL2D_BACKWARD};
    const em_op *ops = conv ? conv_ops : pool_ops;
    for (int k = 0; k < (conv ? 3 : 2); k++)
        if (em__check_support(op, be, ops[k], dt, d)) return em_last_status();
    return EM_OK;
}

/* The backend calls of the three passes. */
static em_status run_window(em_op op, em_tensor *out, const em_tensor *in, const em_window2d *g) {
    return em__op_run(&(em_op_call){.op = op, .dtype = in->dtype, .dst = {out}, .src = {in}, .arg = g}, "conv2d");
}
static em_status run_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return em__op_run(&(em_op_call){.op = EM_OP_MATMUL, .dtype = a->dtype, .dst = {out}, .src = {a, b}}, "conv2d");
}
static em_status run_add(em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return em__op_run(&(em_op_call){.op = EM_OP_ADD, .dtype = a->dtype, .dst = {out}, .src = {a, b}}, "conv2d");
}
/* out = in summed over the first four dims where reduce says so */
static em_status run_sum4(em_tensor *out, const em_tensor *in, const bool reduce[4]) {
    return em__op_run(&(em_op_call){.op = EM_OP_SUM, .dtype = in->dtype, .dst = {out}, .src = {in},
                                    .i = {em__reduce_bits(4, reduce)}}, "conv2d");
}
/* A convolution library's pass: EM_ERR_NOT_SUPPORTED, nothing recorded, where the backend
 * has none or it declines this one. */
static em_status run_library(em_op op, em_tensor *out, em_tensor *out2, const em_tensor *a, const em_tensor *b,
                             const em_tensor *c, const em_window2d *g, int64_t G) {
    return em__op_try(&(em_op_call){.op = op, .dtype = a->dtype, .dst = {out, out2}, .src = {a, b, c}, .i = {G},
                                    .arg = g});
}

/* ---- the convolution's three passes on contiguous operands ---- */

typedef struct conv_dims {
    int64_t N, C, O, G, Cg, Og, K, L, CK; /* K = Cg * kh * kw per group, CK = C * kh * kw */
} conv_dims;

static conv_dims dims_of(const em_window2d *g, int64_t O, int64_t G) {
    conv_dims d = {.N = g->n, .C = g->c, .O = O, .G = G, .Cg = g->c / G, .Og = O / G,
                   .L = g->oh * g->ow};
    d.K = d.Cg * g->kh * g->kw;
    d.CK = d.C * g->kh * g->kw;
    return d;
}

static int64_t chunk_of(const conv_dims *d) {
    int64_t per = d->CK * d->L > 0 ? d->CK * d->L : 1;
    int64_t c = CONV_COLS_LIMIT / per;
    if (c < 1) c = 1;
    return c < d->N ? c : d->N;
}

/* The portable path's views of samples n0 .. n0 + nc - 1, the same in all three passes: the
 * image (or its gradient) [nc, C, H, W], its columns [nc, CK, L] (rows of a group contiguous),
 * the output (or its gradient) per group [nc, G, Og, L], and the window with n = nc. The
 * passes add their own views of the weight and of the columns per group. */
typedef struct chunk_views {
    em_tensor img, cols, out;
    em_window2d g;
} chunk_views;

static void chunk_views_of(chunk_views *v, const conv_dims *d, const em_window2d *g, const em_tensor *img,
                           const em_tensor *cols, const em_tensor *out, int64_t n0, int64_t nc) {
    int64_t hw = g->h * g->w;
    int64_t xs[4] = {nc, d->C, g->h, g->w}, xst[4] = {d->C * hw, hw, g->w, 1};
    int64_t cs[3] = {nc, d->CK, d->L}, cst[3] = {d->CK * d->L, d->L, 1};
    int64_t os[4] = {nc, d->G, d->Og, d->L}, ost[4] = {d->O * d->L, d->Og * d->L, d->L, 1};
    view(&v->img, img, 4, xs, xst, n0 * d->C * hw);
    view(&v->cols, cols, 3, cs, cst, 0);
    view(&v->out, out, 4, os, ost, n0 * d->O * d->L);
    v->g = *g;
    v->g.n = nc;
}

/* out [N, O, oh, ow] = conv(x, w) + bias; everything contiguous */
static em_status conv_forward(const em_backend *be, em_tensor *out, const em_tensor *x, const em_tensor *w,
                              const em_tensor *bias, em_window2d g, int64_t G) {
    conv_dims d = dims_of(&g, w->shape[0], G);
    if (d.N == 0 || d.O == 0 || d.L == 0) return EM_OK;
    if (x->dtype != EM_F64 && !use_portable()) {
        em_status st = run_library(EM_OP_CONV2D, out, NULL, x, w, bias, &g, G);
        if (st != EM_ERR_NOT_SUPPORTED) return st; /* unsupported: recorded nothing, go portable */
    }
    int64_t chunk = chunk_of(&d);
    int64_t cshape[3] = {chunk, d.CK, d.L};
    em_tensor *cols = em__tensor_new_on(be, out->storage->device, 3, cshape, x->dtype);
    if (!cols) return em_last_status();
    em_status st = EM_OK;
    for (int64_t n0 = 0; st == EM_OK && n0 < d.N; n0 += chunk) {
        int64_t nc = d.N - n0 < chunk ? d.N - n0 : chunk;
        chunk_views v;
        chunk_views_of(&v, &d, &g, x, cols, out, n0, nc);
        st = run_window(EM_OP_IM2COL, &v.cols, &v.img, &v.g);
        /* out[n, grp] = w[grp] @ cols[n, grp] */
        em_tensor wv, cgv;
        int64_t ws[4] = {nc, G, d.Og, d.K}, wst[4] = {0, d.Og * d.K, d.K, 1};
        int64_t gs[4] = {nc, G, d.K, d.L}, gst[4] = {d.CK * d.L, d.K * d.L, d.L, 1};
        view(&wv, w, 4, ws, wst, 0);
        view(&cgv, cols, 4, gs, gst, 0);
        if (st == EM_OK) st = run_matmul(&v.out, &wv, &cgv);
    }
    em_release(cols);
    if (st == EM_OK && bias) {
        em_tensor ov, bv;
        int64_t s3[3] = {d.N, d.O, d.L}, ost[3] = {d.O * d.L, d.L, 1}, bst[3] = {0, 1, 0};
        view(&ov, out, 3, s3, ost, 0);
        view(&bv, bias, 3, s3, bst, 0);
        st = run_add(&ov, &ov, &bv);
    }
    return st;
}

/* gx [N, C, H, W] from gy [N, O, oh, ow] and w (unused: no second output) */
static em_status conv_backward_input(const em_backend *be, em_tensor *gx, em_tensor *unused, const em_tensor *gy,
                                     const em_tensor *w, em_window2d g, int64_t G) {
    (void)unused;
    conv_dims d = dims_of(&g, w->shape[0], G);
    if (d.N == 0 || d.C == 0) return EM_OK;
    if (d.O == 0 || d.L == 0) return em__run_fill(gx, 0.0, "conv2d");
    if (gx->dtype != EM_F64 && !use_portable()) {
        em_status st = run_library(EM_OP_CONV2D_BACKWARD_INPUT, gx, NULL, gy, w, NULL, &g, G);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    int64_t chunk = chunk_of(&d);
    int64_t cshape[3] = {chunk, d.CK, d.L};
    em_tensor *cols = em__tensor_new_on(be, gx->storage->device, 3, cshape, gx->dtype);
    if (!cols) return em_last_status();
    em_status st = EM_OK;
    for (int64_t n0 = 0; st == EM_OK && n0 < d.N; n0 += chunk) {
        int64_t nc = d.N - n0 < chunk ? d.N - n0 : chunk;
        chunk_views v;
        chunk_views_of(&v, &d, &g, gx, cols, gy, n0, nc);
        /* cols[n, grp] = w[grp]^T @ gy[n, grp] */
        em_tensor wv, cgv;
        int64_t gs[4] = {nc, G, d.K, d.L}, gst[4] = {d.CK * d.L, d.K * d.L, d.L, 1};
        int64_t ws[4] = {nc, G, d.K, d.Og}, wst[4] = {0, d.Og * d.K, 1, d.K};
        view(&cgv, cols, 4, gs, gst, 0);
        view(&wv, w, 4, ws, wst, 0);
        st = run_matmul(&cgv, &wv, &v.out);
        if (st == EM_OK) st = run_window(EM_OP_COL2IM, &v.img, &v.cols, &v.g);
    }
    em_release(cols);
    return st;
}

/* gb [O] = gy summed over N, H and W */
static em_status bias_grad(em_tensor *gb, const em_tensor *gy) {
    em_tensor bv;
    int64_t bs[4] = {1, gb->shape[0], 1, 1}, bst[4] = {0, 1, 0, 0};
    bool reduce[4] = {true, false, true, true};
    view(&bv, gb, 4, bs, bst, 0);
    return run_sum4(&bv, gy, reduce);
}

/* gw [O, Cg, kh, kw] from gy and x; and gb [O] when not NULL (oneDNN sums it in the same
 * pass over gy: the separate sum took 4% of the CNN's step) */
static em_status conv_backward_weight(const em_backend *be, em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                                      const em_tensor *x, em_window2d g, int64_t G) {
    conv_dims d = dims_of(&g, gw->shape[0], G);
    if (d.O == 0) return EM_OK;
    if (d.N == 0 || d.L == 0) {
        em_status st = d.K ? em__run_fill(gw, 0.0, "conv2d") : EM_OK;
        return st == EM_OK && gb ? em__run_fill(gb, 0.0, "conv2d") : st;
    }
    if (d.K == 0) return gb ? bias_grad(gb, gy) : EM_OK;
    if (gw->dtype != EM_F64 && !use_portable()) { /* the library: with the bias's gradient, else without */
        em_status st = EM_ERR_NOT_SUPPORTED;
        if (gb) st = run_library(EM_OP_CONV2D_BACKWARD_WEIGHT_BIAS, gw, gb, gy, x, NULL, &g, G);
        if (st == EM_ERR_NOT_SUPPORTED) {
            st = run_library(EM_OP_CONV2D_BACKWARD_WEIGHT, gw, NULL, gy, x, NULL, &g, G);
            if (st == EM_OK && gb) st = bias_grad(gb, gy);
        }
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    int64_t chunk = chunk_of(&d);
    int64_t cshape[3] = {chunk, d.CK, d.L}, pshape[4] = {chunk, G, d.Og, d.K}, rshape[4] = {1, G, d.Og, d.K};
    em_device dev = gw->storage->device;
    em_tensor *cols = em__tensor_new_on(be, dev, 3, cshape, gw->dtype);
    em_tensor *part = cols ? em__tensor_new_on(be, dev, 4, pshape, gw->dtype) : NULL;
    em_tensor *sum = part && d.N > chunk ? em__tensor_new_on(be, dev, 4, rshape, gw->dtype) : NULL;
    em_status st = part && (sum || d.N <= chunk) ? EM_OK : em_last_status();
    em_tensor gwv;
    int64_t gwst[4] = {G * d.Og * d.K, d.Og * d.K, d.K, 1};
    view(&gwv, gw, 4, rshape, gwst, 0);
    bool reduce[4] = {true, false, false, false};
    for (int64_t n0 = 0; st == EM_OK && n0 < d.N; n0 += chunk) {
        int64_t nc = d.N - n0 < chunk ? d.N - n0 : chunk;
        chunk_views v;
        chunk_views_of(&v, &d, &g, x, cols, gy, n0, nc);
        st = run_window(EM_OP_IM2COL, &v.cols, &v.img, &v.g);
        /* part[n, grp] = gy[n, grp] @ cols[n, grp]^T, then summed over n */
        em_tensor cgv, pv;
        int64_t gs[4] = {nc, G, d.L, d.K}, gst[4] = {d.CK * d.L, d.K * d.L, 1, d.L};
        int64_t ps[4] = {nc, G, d.Og, d.K}, pst[4] = {G * d.Og * d.K, d.Og * d.K, d.K, 1};
        view(&cgv, cols, 4, gs, gst, 0);
        view(&pv, part, 4, ps, pst, 0);
        if (st == EM_OK) st = run_matmul(&pv, &v.out, &cgv);
        if (st != EM_OK) break;
        if (n0 == 0) {
            st = run_sum4(&gwv, &pv, reduce);
        } else {
            st = run_sum4(sum, &pv, reduce);
            if (st == EM_OK) st = run_add(&gwv, &gwv, sum);
        }
    }
    em_release(sum);
    em_release(part);
    em_release(cols);
    return st == EM_OK && gb ? bias_grad(gb, gy) : st;
}

/* ---- shapes and checks ---- */

/* The padded input size in + 2p and the dilated window dl * (k - 1) + 1 of one spatial dim
 * (sizes, padding and dilation checked non-negative / positive by the caller), or false when
 * either overflows int64 (a padding or kernel near INT64_MAX). */
static bool window_sizes(int64_t in, int64_t k, int64_t p, int64_t dl, int64_t *padded, int64_t *window) {
    return !__builtin_mul_overflow(p, 2, padded) && !__builtin_add_overflow(*padded, in, padded) &&
           !__builtin_mul_overflow(dl, k - 1, window) && !__builtin_add_overflow(*window, 1, window);
}

static em_status window_overflow(const char *op, em_hw k, em_hw p, em_hw d) {
    return em_error(EM_ERR_ARGUMENT, "%s: the padded input or the dilated kernel size overflows int64 "
                    "(kernel_size=(%lld, %lld), padding=(%lld, %lld), dilation=(%lld, %lld))", op,
                    (long long)k.h, (long long)k.w, (long long)p.h, (long long)p.w, (long long)d.h, (long long)d.w);
}

/* PyTorch's pooling_output_shape, (padded - window + (ceil_mode ? s - 1 : 0)) / s + 1 rounded
 * down, written as a floor or ceiling division of padded - window so that nothing overflows */
static int64_t pool_out(int64_t in, int64_t padded, int64_t window, int64_t s, int64_t p, bool ceil_mode) {
    int64_t num = padded - window;   /* both in [0, INT64_MAX]: no overflow */
    int64_t o;
    if (ceil_mode) o = (num > 0 ? (num - 1) / s + 1 : -(-num / s)) + 1;
    else o = (num >= 0 ? num / s : -((-num - 1) / s) - 1) + 1;
    if (ceil_mode && o > 0 && (o - 1) * s >= in + p) --o;   /* (o - 1) * s <= num */
    return o;
}

/* 3-d (unbatched) input runs as a batch of one; *squeeze says to drop the dim again */
static em_tensor *batched(const char *op, em_tensor *x, bool *squeeze) {
    char sb[128];
    *squeeze = false;
    if (x->ndim == 4) return x;
    if (x->ndim == 3) {
        *squeeze = true;
        return em_unsqueeze(x, 0);
    }
    em_error(EM_ERR_SHAPE, "%s: expected 3D (unbatched) or 4D (batched) input, but got input of size: %s", op,
             shp(sb, sizeof sb, x));
    return NULL;
}

static em_tensor *unbatched(em_tensor *out, bool squeeze) { return squeeze && out ? em_squeeze(out, 0) : out; }

static em_tensor *conv2d_impl(em_tensor *x, em_tensor *w, em_tensor *b, em_hw stride, em_hw padding,
                              em_hw dilation, int64_t groups) {
    const char *op = "conv2d";
    char sx[128], sw[128], sb[128];
    if (check_float(op, "input", x) || check_float(op, "weight", w)) return NULL;
    em_tensor *ts[3] = {x, w, b};
    const em_tensor *cts[3] = {x, w, b};
    if (em__check_same_device(op, b ? 3 : 2, cts)) return NULL;
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: input (%s), weight (%s)%s%s must have one dtype", op, em_dtype_name(x->dtype),
                 em_dtype_name(w->dtype), b ? " and bias " : "", b ? em_dtype_name(b->dtype) : "");
        return NULL;
    }
    if (w->ndim != 4) {
        em_error(EM_ERR_SHAPE, "%s: expected a 4D weight [out_channels, in_channels / groups, kH, kW], but got weight of size %s",
                 op, shp(sw, sizeof sw, w));
        return NULL;
    }
    if (groups <= 0) {
        em_error(EM_ERR_ARGUMENT, "%s: non-positive groups is not supported (groups=%lld)", op, (long long)groups);
        return NULL;
    }
    if (stride.h <= 0 || stride.w <= 0) {
        em_error(EM_ERR_ARGUMENT, "%s: non-positive stride is not supported (stride=(%lld, %lld))", op,
                 (long long)stride.h, (long long)stride.w);
        return NULL;
    }
    if (padding.h < 0 || padding.w < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: negative padding is not supported (padding=(%lld, %lld))", op,
                 (long long)padding.h, (long long)padding.w);
        return NULL;
    }
    if (dilation.h <= 0 || dilation.w <= 0) {
        em_error(EM_ERR_ARGUMENT, "%s: dilation should be greater than zero (dilation=(%lld, %lld))", op,
                 (long long)dilation.h, (long long)dilation.w);
        return NULL;
    }
    int64_t O = w->shape[0], C = x->shape[1];
    if (O % groups != 0) {
        em_error(EM_ERR_SHAPE, "%s: given groups=%lld, expected weight to be divisible by %lld at dimension 0, but got weight of size %s instead",
                 op, (long long)groups, (long long)groups, shp(sw, sizeof sw, w));
        return NULL;
    }
    if (C != w->shape[1] * groups) {
        em_error(EM_ERR_SHAPE, "%s: given groups=%lld, weight of size %s, expected input%s to have %lld channels, but got %lld channels instead",
                 op, (long long)groups, shp(sw, sizeof sw, w), shp(sx, sizeof sx, x),
                 (long long)(w->shape[1] * groups), (long long)C);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != O)) {
        em_error(EM_ERR_SHAPE, "%s: given weight of size %s, expected bias to be 1-dimensional with %lld elements, but got bias of size %s instead",
                 op, shp(sw, sizeof sw, w), (long long)O, shp(sb, sizeof sb, b));
        return NULL;
    }
    int64_t kh = w->shape[2], kw = w->shape[3];
    if (kh < 1 || kw < 1) {
        em_error(EM_ERR_SHAPE, "%s: expected a kernel of at least 1 x 1, but got weight of size %s", op, shp(sw, sizeof sw, w));
        return NULL;
    }
    int64_t ph_in, pw_in, win_h, win_w;
    if (!window_sizes(x->shape[2], kh, padding.h, dilation.h, &ph_in, &win_h) ||
        !window_sizes(x->shape[3], kw, padding.w, dilation.w, &pw_in, &win_w)) {
        window_overflow(op, (em_hw){kh, kw}, padding, dilation);
        return NULL;
    }
    if (win_h > ph_in || win_w > pw_in) {
        em_error(EM_ERR_SHAPE, "%s: calculated padded input size per channel: (%lld x %lld) for input%s. Kernel size: (%lld x %lld) (dilated: %lld x %lld). Kernel size can't be greater than actual input size",
                 op, (long long)ph_in, (long long)pw_in, shp(sx, sizeof sx, x), (long long)kh, (long long)kw,
                 (long long)win_h, (long long)win_w);
        return NULL;
    }
    em_window2d g = {.n = x->shape[0], .c = C, .h = x->shape[2], .w = x->shape[3], .kh = kh, .kw = kw,
                     .sh = stride.h, .sw = stride.w, .ph = padding.h, .pw = padding.w, .dh = dilation.h,
                     .dw = dilation.w};
    g.oh = (ph_in - win_h) / g.sh + 1;   /* PyTorch's conv output size; win <= padded here */
    g.ow = (pw_in - win_w) / g.sw + 1;
    const em_backend *be = x->storage->backend;
    em_device dev = x->storage->device;
    if (need_ops(op, be, dev, x->dtype, true)) return NULL;
    int64_t oshape[4] = {g.n, O, g.oh, g.ow};
    em_tensor *out = em__tensor_new_on(be, dev, 4, oshape, x->dtype);
    if (!out) return NULL;
    em_tensor *tx, *tw, *tb = NULL;
    const em_tensor *cx = contig(x, &tx), *cw = cx ? contig(w, &tw) : NULL, *cb = NULL;
    if (!cx) tw = NULL;
    if (cw && b) cb = contig(b, &tb);
    em_status st = cx && cw && (!b || cb) ? conv_forward(be, out, cx, cw, cb, g, groups) : em_last_status();
    em_release(tx);
    em_release(tw);
    em_release(tb);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_grad_args args = em__no_args;
    win_to_args(&g, groups, args.win);
    return em__finish(out, EM_GRAD_CONV2D, b ? 3 : 2, ts, &args);
}

em_tensor *em_conv2d(em_tensor *input, em_tensor *weight, em_tensor *bias, em_hw stride, em_hw padding,
                     em_hw dilation, int64_t groups) {
    EM_CHECK_ARG(input, "em_conv2d", "input");
    EM_CHECK_ARG(weight, "em_conv2d", "weight");
    /* bias NULL means no bias, also while an earlier error is pending: a call with valid
     * arguments runs (a bias that is NULL because its call failed leaves that error pending) */
    EM_AUTOCAST3(EM_AC_CONV2D, em_conv2d(input, weight, bias, stride, padding, dilation, groups), input, weight,
                 bias);
    bool squeeze;
    em_tensor *x = batched("conv2d", input, &squeeze);
    return unbatched(x ? conv2d_impl(x, weight, bias, stride, padding, dilation, groups) : NULL, squeeze);
}

/* ---- pools ---- */

static em_status pool_checks(const char *op, const em_tensor *x, em_hw k, em_hw s, em_hw p, em_hw d) {
    if (check_float(op, "input", x)) return em_last_status();
    if (k.h <= 0 || k.w <= 0)
        return em_error(EM_ERR_ARGUMENT, "%s: kernel_size must be greater than zero, but got (%lld, %lld)", op,
                        (long long)k.h, (long long)k.w);
    if (s.h <= 0 || s.w <= 0)
        return em_error(EM_ERR_ARGUMENT, "%s: stride must be greater than zero, but got (%lld, %lld)", op,
                        (long long)s.h, (long long)s.w);
    if (d.h <= 0 || d.w <= 0)
        return em_error(EM_ERR_ARGUMENT, "%s: dilation must be greater than zero, but got (%lld, %lld)", op,
                        (long long)d.h, (long long)d.w);
    if (p.h < 0 || p.w < 0)
        return em_error(EM_ERR_ARGUMENT, "%s: negative padding is not supported (padding=(%lld, %lld))", op,
                        (long long)p.h, (long long)p.w);
    if (p.h > k.h / 2 || p.w > k.w / 2)
        return em_error(EM_ERR_ARGUMENT, "%s: pad should be at most half of kernel size, but got pad=(%lld, %lld) and kernel_size=(%lld, %lld)",
                        op, (long long)p.h, (long long)p.w, (long long)k.h, (long long)k.w);
    return EM_OK;
}

static em_tensor *pool_impl(const char *op, em_pool_kind kind, em_tensor *x, em_window2d g,
                            em_tensor **indices_out) {
    char sx[128];
    if (g.oh <= 0 || g.ow <= 0) {
        em_error(EM_ERR_SHAPE, "%s: given input size %s, the calculated output size (%lld x %lld) is too small",
                 op, shp(sx, sizeof sx, x), (long long)g.oh, (long long)g.ow);
        return NULL;
    }
    const em_backend *be = x->storage->backend;
    em_device dev = x->storage->device;
    if (need_ops(op, be, dev, x->dtype, false)) return NULL;
    int64_t oshape[4] = {g.n, g.c, g.oh, g.ow};
    em_tensor *out = em__tensor_new_on(be, dev, 4, oshape, x->dtype);
    em_tensor *idx = out && kind == EM_POOL_MAX ? em__tensor_new_on(be, dev, 4, oshape, EM_I64) : NULL;
    em_tensor *tx = NULL;
    const em_tensor *cx = out && (idx || kind != EM_POOL_MAX) ? contig(x, &tx) : NULL;
    em_status st = cx ? EM_OK : em_last_status();
    if (st == EM_OK && g.n * g.c * g.oh * g.ow > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_POOL2D, .dtype = x->dtype, .dst = {out, idx}, .src = {cx},
                                      .i = {kind}, .arg = &g}, op);
    em_release(tx);
    if (st != EM_OK) {
        em_release(out);
        em_release(idx);
        return NULL;
    }
    em_grad_args args = em__no_args;
    win_to_args(&g, 1, args.win);
    em_tensor *ins[2] = {x, idx};
    em_grad_op gop = kind == EM_POOL_MAX ? EM_GRAD_MAX_POOL2D : kind == EM_POOL_AVG ? EM_GRAD_AVG_POOL2D
                                                                                   : EM_GRAD_ADAPTIVE_AVG_POOL2D;
    out = em__finish(out, gop, kind == EM_POOL_MAX ? 2 : 1, ins, &args);
    if (idx) {
        if (out && indices_out) *indices_out = em__scoped(idx);
        else em_release(idx);
    }
    return out;
}

static em_status pool_window(const char *op, const em_tensor *x, em_hw k, em_hw s, em_hw p, em_hw d, bool ceil_mode,
                             em_window2d *g) {
    *g = (em_window2d){.n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3], .kh = k.h,
                       .kw = k.w, .sh = s.h, .sw = s.w, .ph = p.h, .pw = p.w, .dh = d.h, .dw = d.w};
    int64_t ph, pw, wh, ww;
    if (!window_sizes(g->h, k.h, p.h, d.h, &ph, &wh) || !window_sizes(g->w, k.w, p.w, d.w, &pw, &ww))
        return window_overflow(op, k, p, d);
    g->oh = pool_out(g->h, ph, wh, s.h, p.h, ceil_mode);
    g->ow = pool_out(g->w, pw, ww, s.w, p.w, ceil_mode);
    return EM_OK;
}

em_tensor *em_max_pool2d_with_indices(em_tensor *input, em_hw kernel_size, em_hw stride, em_hw padding,
                                      em_hw dilation, bool ceil_mode, em_tensor **indices) {
    const char *op = "max_pool2d";
    if (indices) *indices = NULL;
    EM_CHECK_ARG(input, "em_max_pool2d", "input");
    if (stride.h == 0 && stride.w == 0) stride = kernel_size;
    if (pool_checks(op, input, kernel_size, stride, padding, dilation)) return NULL;
    bool squeeze;
    em_tensor *x = batched(op, input, &squeeze);
    if (!x) return NULL;
    em_tensor *idx = NULL;
    em_window2d g;
    em_tensor *out = pool_window(op, x, kernel_size, stride, padding, dilation, ceil_mode, &g) == EM_OK
                         ? pool_impl(op, EM_POOL_MAX, x, g, &idx)
                         : NULL;
    if (indices) *indices = unbatched(idx, squeeze);
    return unbatched(out, squeeze);
}

em_tensor *em_max_pool2d(em_tensor *input, em_hw kernel_size, em_hw stride, em_hw padding, em_hw dilation,
                         bool ceil_mode) {
    return em_max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode, NULL);
}

em_tensor *em_avg_pool2d(em_tensor *input, em_hw kernel_size, em_hw stride, em_hw padding, bool ceil_mode,
                         bool count_include_pad, int64_t divisor_override) {
    const char *op = "avg_pool2d";
    EM_CHECK_ARG(input, "em_avg_pool2d", "input");
    if (stride.h == 0 && stride.w == 0) stride = kernel_size;
    if (pool_checks(op, input, kernel_size, stride, padding, EM_HW1(1))) return NULL;
    if (divisor_override < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: divisor must be not zero (divisor_override=%lld; 0 means none)", op,
                 (long long)divisor_override);
        return NULL;
    }
    bool squeeze;
    em_tensor *x = batched(op, input, &squeeze);
    if (!x) return NULL;
    em_window2d g;
    if (pool_window(op, x, kernel_size, stride, padding, EM_HW1(1), ceil_mode, &g) != EM_OK)
        return unbatched(NULL, squeeze);
    g.count_include_pad = count_include_pad;
    g.divisor = divisor_override;
    return unbatched(pool_impl(op, EM_POOL_AVG, x, g, NULL), squeeze);
}

em_tensor *em_adaptive_avg_pool2d(em_tensor *input, em_hw output_size) {
    const char *op = "adaptive_avg_pool2d";
    char sx[128];
    EM_CHECK_ARG(input, "em_adaptive_avg_pool2d", "input");
    if (check_float(op, "input", input)) return NULL;
    if (output_size.h < 0 || output_size.w < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: output_size must be non-negative, but got (%lld, %lld)", op,
                 (long long)output_size.h, (long long)output_size.w);
        return NULL;
    }
    bool squeeze;
    em_tensor *x = batched(op, input, &squeeze);
    if (!x) return NULL;
    if ((x->shape[2] == 0 || x->shape[3] == 0) && x->shape[0] * x->shape[1] > 0) {
        em_error(EM_ERR_SHAPE, "%s: expected input to have non-zero size for non-batch dimensions, but input has sizes %s",
                 op, shp(sx, sizeof sx, x));
        return NULL;
    }
    em_window2d g = {.n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3],
                     .oh = output_size.h, .ow = output_size.w, .kh = 1, .kw = 1, .sh = 1, .sw = 1, .dh = 1, .dw = 1};
    if (g.oh == 0 || g.ow == 0) { /* an empty output: nothing to pool */
        int64_t oshape[4] = {g.n, g.c, g.oh, g.ow};
        em_tensor *out = em__tensor_new_on(x->storage->backend, x->storage->device, 4, oshape, x->dtype);
        em_grad_args args = em__no_args;
        return unbatched(em__finish(out, EM_GRAD_ADAPTIVE_AVG_POOL2D, 1, &x, &args), squeeze);
    }
    return unbatched(pool_impl(op, EM_POOL_ADAPTIVE_AVG, x, g, NULL), squeeze);
}

/* ---- backward passes (autograd's formulas) ---- */

static bool backward_args_ok(const char *op, em_tensor *g, em_tensor *other) {
    if (!g || !other) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: a NULL argument", op);
        return false;
    }
    if (g->ndim != 4) {
        em_error(EM_ERR_INTERNAL, "%s: expected a 4D gradient, got %d dims", op, g->ndim);
        return false;
    }
    const em_tensor *ts[2] = {g, other};
    return em__check_same_device(op, 2, ts) == EM_OK;
}

/* out = the new contiguous result of fn over contiguous copies of a and b (in a's dtype);
 * with out2, fn's second result too: a new [n2] tensor */
typedef em_status (*conv_pass)(const em_backend *be, em_tensor *out, em_tensor *out2, const em_tensor *a,
                               const em_tensor *b, em_window2d g, int64_t G);

static em_tensor *run_pass(const char *op, conv_pass fn, em_tensor *a, em_tensor *b, const int64_t *oshape,
                           em_window2d g, int64_t G, em_tensor **out2, int64_t n2) {
    const em_backend *be = a->storage->backend;
    if (need_ops(op, be, a->storage->device, a->dtype, true)) return NULL;
    em_tensor *out = em__tensor_new_on(be, a->storage->device, 4, oshape, a->dtype);
    em_tensor *o2 = out && out2 ? em__tensor_new_on(be, a->storage->device, 1, &n2, a->dtype) : NULL;
    if (!out || (out2 && !o2)) {
        em_release(out);
        return NULL;
    }
    em_tensor *ta = NULL, *tb = NULL;
    const em_tensor *ca = contig(a, &ta), *cb = NULL;
    if (ca && b->dtype != a->dtype) cb = tb = em__copy_raw(b, a->dtype);
    else if (ca) cb = contig(b, &tb);
    em_status st = ca && cb ? fn(be, out, o2, ca, cb, g, G) : em_last_status();
    em_release(ta);
    em_release(tb);
    if (st != EM_OK) {
        em_release(out);
        em_release(o2);
        return NULL;
    }
    if (out2) *out2 = em__scoped(o2);
    return em__scoped(out);
}

em_tensor *em__conv2d_backward_input(em_tensor *g, em_tensor *weight, const int64_t *input_shape, const int64_t *win) {
    const char *op = "conv2d backward (input)";
    if (!backward_args_ok(op, g, weight)) return NULL;
    em_window2d wg = win_from_args(input_shape, g->shape[2], g->shape[3], win);
    return run_pass(op, conv_backward_input, g, weight, input_shape, wg, win[EM_GRAD_WIN_GROUPS], NULL, 0);
}

em_tensor *em__conv2d_backward_weight_bias(em_tensor *g, em_tensor *input, const int64_t *weight_shape,
                                           const int64_t *win, em_tensor **gbias) {
    const char *op = "conv2d backward (weight)";
    if (gbias) *gbias = NULL;
    if (!backward_args_ok(op, g, input)) return NULL;
    em_window2d wg = win_from_args(input->shape, g->shape[2], g->shape[3], win);
    return run_pass(op, conv_backward_weight, g, input, weight_shape, wg, win[EM_GRAD_WIN_GROUPS], gbias,
                    weight_shape[0]);
}

em_tensor *em__conv2d_backward_weight(em_tensor *g, em_tensor *input, const int64_t *weight_shape,
                                      const int64_t *win) {
    return em__conv2d_backward_weight_bias(g, input, weight_shape, win, NULL);
}

em_tensor *em__pool2d_backward(int kind, em_tensor *g, em_tensor *indices, const int64_t *input_shape,
                               const int64_t *win) {
    const char *op = "pool2d backward";
    if (!backward_args_ok(op, g, indices ? indices : g)) return NULL;
    if (kind == EM_POOL_MAX && !indices) {
        em_error(EM_ERR_INTERNAL, "%s: max pool needs its indices", op);
        return NULL;
    }
    const em_backend *be = g->storage->backend;
    em_device dev = g->storage->device;
    if (need_ops(op, be, dev, g->dtype, false)) return NULL;
    em_window2d wg = win_from_args(input_shape, g->shape[2], g->shape[3], win);
    em_tensor *gin = em__tensor_new_on(be, dev, 4, input_shape, g->dtype);
    if (!gin) return NULL;
    em_tensor *tg = NULL, *ti = NULL;
    const em_tensor *cg = contig(g, &tg), *ci = cg && indices ? contig(indices, &ti) : NULL;
    em_status st = cg && (ci || !indices) ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(4, input_shape) > 0)
        st = wg.oh * wg.ow > 0 ? em__op_run(&(em_op_call){.op = EM_OP_POOL2D_BACKWARD, .dtype = g->dtype, .dst = {gin},
                                                          .src = {cg, ci}, .i = {kind}, .arg = &wg}, op)
                               : em__run_fill(gin, 0.0, op);
    em_release(tg);
    em_release(ti);
    if (st != EM_OK) {
        em_release(gin);
        return NULL;
    }
    return em__scoped(gin);
}
