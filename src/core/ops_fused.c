/* Fused ops over inputs of one shape: one backend pass where the backend has the kernel
 * (op_list.h's EMK_OPS_FUSED), the composition of public ops elsewhere. em__fused_map is the
 * one path they share; autograd's one-pass backward helpers (ReLU's, GELU's, softmax's) are
 * its simplest users, and a public fused op adds its checks, its composed path and its
 * gradient node (em__fused_op). */
#include "ops_internal.h"
#include "internal_api.h"
#include <ember/nn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* em__fused_map's result before it is handed out (not scoped); *st says why there is none:
 * EM_ERR_NOT_SUPPORTED (nothing recorded) where it does not apply, else the recorded error.
 * nd outputs like in[0] (out[0..nd)). */
static em_status fused_run_n(em_op kop, int nd, int n, em_tensor *const *in, const int64_t *i, const double *f,
                             em_tensor **out) {
    const em_tensor *x = in[0];
    const em_backend *be = x->storage->backend;
    for (int k = 0; k < nd; k++) out[k] = NULL;
    if (!em__op_supported(be, kop, x->dtype)) return EM_ERR_NOT_SUPPORTED;
    for (int k = 1; k < n; k++)
        if (in[k]->dtype != x->dtype || !em__same_shape(in[k], x) || !em__same_device(in[k], x))
            return EM_ERR_NOT_SUPPORTED;
    em_op_call c = {.op = kop, .dtype = x->dtype};
    for (int k = 0; k < EM_OP_MAX_PARAMS; k++) {
        c.i[k] = i ? i[k] : 0;
        c.f[k] = f ? f[k] : 0;
    }
    em_tensor *tmp[EM_OP_MAX_SRC] = {NULL}; /* contiguous copies of views */
    em_status st = EM_OK;
    for (int k = 0; k < n && st == EM_OK; k++) {
        c.src[k] = in[k];
        if (!em__is_contiguous_raw(in[k]->ndim, in[k]->shape, in[k]->strides) &&
            !(c.src[k] = tmp[k] = em__copy_raw(in[k], in[k]->dtype)))
            st = em_last_status();
    }
    for (int k = 0; k < nd && st == EM_OK; k++)
        if (!(c.dst[k] = out[k] = em__tensor_new_on(be, x->storage->device, x->ndim, x->shape, x->dtype)))
            st = em_last_status();
    if (st == EM_OK && em__numel_raw(x->ndim, x->shape) > 0) st = em__op_try(&c);
    for (int k = 0; k < n; k++) em_release(tmp[k]);
    if (st != EM_OK)
        for (int k = 0; k < nd; k++) {
            em_release(out[k]);
            out[k] = NULL;
        }
    return st;
}

static em_tensor *fused_run(em_op kop, int n, em_tensor *const *in, const int64_t *i, const double *f,
                            em_status *st) {
    em_tensor *out;
    *st = fused_run_n(kop, 1, n, in, i, f, &out);
    return out;
}

em_tensor *em__fused_map(em_op kop, int n, em_tensor *const *in, const int64_t *i, const double *f) {
    em_status st;
    return em__scoped(fused_run(kop, n, in, i, f, &st));
}

em_tensor *em__fused_op(const char *op, em_op kop, em_grad_op gop, int n, em_tensor *const *in,
                        em_tensor *(*compose)(em_tensor *const *in)) {
    static const char *const names[] = {"a", "b", "c", "d", "e", "f"};
    for (int k = 0; k < n; k++) EM_CHECK_ARG(in[k], op, names[k]);
    if (em__check_same_device(op, n, (const em_tensor *const *)in)) return NULL;
    char s0[128], s1[128];
    for (int k = 1; k < n; k++) {
        if (!em__same_shape(in[k], in[0])) {
            em_error(EM_ERR_SHAPE, "%s: expected inputs of one shape, got %s and %s", op,
                     em__shape_str(s0, sizeof s0, in[0]->ndim, in[0]->shape),
                     em__shape_str(s1, sizeof s1, in[k]->ndim, in[k]->shape));
            return NULL;
        }
        if (in[k]->dtype != in[0]->dtype) {
            em_error(EM_ERR_DTYPE, "%s: expected inputs of one dtype, got %s and %s", op,
                     em_dtype_name(in[0]->dtype), em_dtype_name(in[k]->dtype));
            return NULL;
        }
    }
    if (!em_dtype_is_floating(in[0]->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating dtype, got %s", op, em_dtype_name(in[0]->dtype));
        return NULL;
    }
    em_status st;
    em_tensor *out = fused_run(kop, n, in, NULL, NULL, &st);
    if (!out) return st == EM_ERR_NOT_SUPPORTED ? compose(in) : NULL; /* composed ops record their own gradient */
    return em__finish(out, gop, n, in, &em__no_args);
}

/* ---- autograd's one-pass backward helpers (internal_api.h): NULL without an error where
 * they do not apply, and the caller composes. No gradient of their own. ---- */

em_tensor *em__relu_backward(em_tensor *g, em_tensor *y) {
    if (!g || !y) return NULL;
    return em__fused_map(EM_OP_RELU_BACKWARD, 2, (em_tensor *[]){g, y}, NULL, NULL);
}

em_tensor *em__gelu_backward(em_tensor *g, em_tensor *x) {
    if (!g || !x) return NULL;
    return em__fused_map(EM_OP_GELU_BACKWARD, 2, (em_tensor *[]){g, x}, NULL, NULL);
}

em_tensor *em__softmax_backward(em_tensor *g, em_tensor *y, int dim, bool log) {
    if (!g || !y || y->ndim == 0 || dim != y->ndim - 1) return NULL;
    int64_t i[EM_OP_MAX_PARAMS] = {y->shape[y->ndim - 1], log};
    return em__fused_map(EM_OP_SOFTMAX_BACKWARD, 2, (em_tensor *[]){g, y}, i, NULL);
}

/* ---- SwiGLU ---- */

static em_tensor *swiglu_composed(em_tensor *const *in) {
    return em_mul(em_mul(in[0], em_sigmoid(in[0])), in[1]);
}

em_status em__ce_rows(em_tensor *z, em_tensor *target, em_tensor *valid, em_tensor *rowscale, double smoothing,
                      em_tensor *loss, em_tensor **dz) {
    *dz = NULL;
    const em_backend *be = z ? z->storage->backend : NULL;
    em_tensor *ts[4] = {target, valid, rowscale, loss};
    bool ok = be && z->ndim == 2 && target && valid && (rowscale || loss) &&
              em__is_contiguous_raw(2, z->shape, z->strides);
    for (int i = 0; i < 4 && ok; i++) {
        em_tensor *t = ts[i];
        if (!t) continue;
        ok = t->ndim == 1 && t->shape[0] == z->shape[0] && t->dtype == (i == 0 ? EM_I64 : z->dtype) &&
             em__same_device(t, z) && em__is_contiguous_raw(1, t->shape, t->strides);
    }
    if (!ok || !em__op_supported(be, EM_OP_CE_ROWS, z->dtype)) return EM_ERR_NOT_SUPPORTED;
    em_tensor *d = rowscale ? em__tensor_new_on(be, z->storage->device, 2, z->shape, z->dtype) : NULL;
    /* the op always writes the rows' losses: somewhere to put them when the caller wants none */
    em_tensor *scratch = !loss && (d || !rowscale) ? em__tensor_new_on(be, z->storage->device, 1, z->shape, z->dtype) : NULL;
    if ((rowscale && !d) || (!loss && !scratch)) {
        em_release(d);
        return em_last_status();
    }
    em_status st = em__op_try(&(em_op_call){.op = EM_OP_CE_ROWS, .dtype = z->dtype, .dst = {loss ? loss : scratch, d},
                                            .src = {z, target, valid, rowscale}, .f = {smoothing}});
    em_release(scratch);
    if (st != EM_OK) {
        em_release(d);
        return st;
    }
    if (loss) em__bump_version(loss);
    if (d) *dz = em__scoped(d);
    return EM_OK;
}

em_tensor *em_swiglu(em_tensor *gate, em_tensor *up) {
    return em__fused_op("em_swiglu", EM_OP_SWIGLU, EM_GRAD_SWIGLU, 2, (em_tensor *[]){gate, up}, swiglu_composed);
}

em_status em__swiglu_backward(em_tensor *g, em_tensor *gate, em_tensor *up, em_tensor **dgate, em_tensor **dup) {
    *dgate = *dup = NULL;
    if (!g || !gate || !up) return EM_ERR_NOT_SUPPORTED;
    em_tensor *out[2];
    em_status st = fused_run_n(EM_OP_SWIGLU_BACKWARD, 2, 3, (em_tensor *[]){g, gate, up}, NULL, NULL, out);
    if (st != EM_OK) return st;
    *dgate = em__scoped(out[0]);
    *dup = em__scoped(out[1]);
    return EM_OK;
}

/* ---- RMSNorm ---- */

/* x's contiguous copy where it is a view (*tmp, released by the caller), else x */
static const em_tensor *dense(const em_tensor *t, em_tensor **tmp) {
    *tmp = NULL;
    if (!t || em__is_contiguous_raw(t->ndim, t->shape, t->strides)) return t;
    return *tmp = em__copy_raw(t, t->dtype);
}

/* HF's LlamaRMSNorm, op by op: float32 (16-bit x upcast), rounded back to x's dtype, then
 * weight * y (promoting as mul does) */
static em_tensor *rms_norm_composed(em_tensor *x, int k, em_tensor *w, double eps) {
    em_dtype dt = em_dtype_of(x);
    em_tensor *xf = dt == EM_F16 || dt == EM_BF16 ? em_to_dtype(x, EM_F32) : x;
    em_dims dims = {.n = k};
    for (int i = 0; i < k; i++) dims.d[i] = x ? x->ndim - k + i : 0;
    em_tensor *ms = em_mean(em_mul(xf, xf), dims, true);
    em_tensor *y = em_to_dtype(em_mul(xf, em_pow_scalar(em_add_scalar(ms, eps), -0.5)), dt);
    return w ? em_mul(w, y) : y;
}

static bool rms_norm_fused_applies(const em_tensor *x, const em_tensor *w, bool grad) {
    const em_backend *be = x->storage->backend;
    if (!em__op_supported(be, EM_OP_RMS_NORM, x->dtype)) return false;
    if (grad && !em__op_supported(be, EM_OP_RMS_NORM_BACKWARD, x->dtype)) return false;
    return !w || w->dtype == x->dtype;
}

em_tensor *em_rms_norm(em_tensor *x, em_shape normalized_shape, em_tensor *weight, double eps) {
    const char *op = "rms_norm";
    EM_CHECK_ARG(x, op, "input");
    EM_AUTOCAST2(EM_AC_RMS_NORM, em_rms_norm(x, normalized_shape, weight, eps), x, weight);
    char a[128], b[128];
    int k = normalized_shape.ndim;
    bool match = k >= 1 && k <= x->ndim;
    for (int i = 0; match && i < k; i++) match = normalized_shape.d[i] == x->shape[x->ndim - k + i];
    if (!match) {
        em_error(EM_ERR_SHAPE, "%s: normalized_shape %s must be the input's last dims (at least one), got input %s",
                 op, em__shape_str(a, sizeof a, k < 0 ? 0 : k > EM_MAX_DIMS ? EM_MAX_DIMS : k, normalized_shape.d),
                 em__shape_str(b, sizeof b, x->ndim, x->shape));
        return NULL;
    }
    if (!em_dtype_is_floating(x->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s", op, em_dtype_name(x->dtype));
        return NULL;
    }
    if (!(eps >= 0 && isfinite(eps))) {
        em_error(EM_ERR_ARGUMENT, "%s: eps must be finite and >= 0, got %g", op, eps);
        return NULL;
    }
    int64_t n = em__numel_raw(k, normalized_shape.d);
    if (weight) {
        if (em__check_same_device(op, 2, (const em_tensor *const[]){x, weight})) return NULL;
        bool same = weight->ndim == k;
        for (int i = 0; same && i < k; i++) same = weight->shape[i] == normalized_shape.d[i];
        if (!same) {
            em_error(EM_ERR_SHAPE, "%s: weight of shape %s must have normalized_shape %s", op,
                     em__shape_str(a, sizeof a, weight->ndim, weight->shape), em__shape_str(b, sizeof b, k, normalized_shape.d));
            return NULL;
        }
        if (!em_dtype_is_floating(weight->dtype)) {
            em_error(EM_ERR_DTYPE, "%s: expected a floating weight, got %s", op, em_dtype_name(weight->dtype));
            return NULL;
        }
    }
    em_tensor *in[2] = {x, weight};
    bool grad = em__grad_needed(2, in);
    if (n == 0 || !rms_norm_fused_applies(x, weight, grad)) {
        em_scope s = em_scope_begin();
        return em__scope_return(s, rms_norm_composed(x, k, weight, eps));
    }
    const em_backend *be = x->storage->backend;
    em_tensor *tx, *tw;
    const em_tensor *xc = dense(x, &tx), *wc = xc ? dense(weight, &tw) : NULL;
    em_tensor *out = xc && (wc || !weight) ? em__tensor_new_on(be, x->storage->device, x->ndim, x->shape, x->dtype) : NULL;
    em_status st = out ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(x->ndim, x->shape) > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_RMS_NORM, .dtype = x->dtype, .dst = {out}, .src = {xc, wc},
                                      .i = {n, weight != NULL}, .f = {eps}}, op);
    em_release(tx);
    if (xc) em_release(tw);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_grad_args args = em__no_args;
    args.s[0] = eps;
    args.i[0] = n;
    return em__finish(out, EM_GRAD_RMS_NORM, 2, in, &args);
}

em_status em__rms_norm_backward(em_tensor *g, em_tensor *x, em_tensor *w, int64_t n, double eps, bool want_gxhat,
                                em_tensor **dx, em_tensor **gxhat) {
    *dx = *gxhat = NULL;
    if (!g || !x) return em_failed() ? em_last_status() : em_error(EM_ERR_INTERNAL, "RMSNorm backward: NULL");
    if (g->dtype != x->dtype)
        return em_error(EM_ERR_INTERNAL, "RMSNorm backward: gradient %s for a %s input", em_dtype_name(g->dtype),
                        em_dtype_name(x->dtype));
    const em_backend *be = x->storage->backend;
    em_device dev = x->storage->device;
    em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
    em_tensor *tg, *tx, *tw = NULL;
    const em_tensor *gc = dense(g, &tg), *xc = gc ? dense(x, &tx) : NULL, *wc = xc ? dense(w, &tw) : NULL;
    em_tensor *a = xc && (wc || !w) ? em__tensor_new_on(be, dev, x->ndim, x->shape, x->dtype) : NULL;
    em_tensor *c = a && want_gxhat ? em__tensor_new_on(be, dev, x->ndim, x->shape, ct) : NULL;
    em_status st = a && (c || !want_gxhat) ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(x->ndim, x->shape) > 0)
        st = em__op_run(&(em_op_call){.op = EM_OP_RMS_NORM_BACKWARD, .dtype = x->dtype, .dst = {a, c},
                                      .src = {gc, xc, wc}, .i = {n, w != NULL, want_gxhat}, .f = {eps}},
                        "RMSNorm backward");
    em_release(tg);
    if (gc) em_release(tx);
    if (xc) em_release(tw);
    if (st != EM_OK) {
        em_release(a);
        em_release(c);
        return st;
    }
    *dx = em__scoped(a);
    *gxhat = c ? em__scoped(c) : NULL;
    return EM_OK;
}

/* ---- rotary position embedding ---- */

/* cos or sin as [B or 1, 1, T, D] for x [B, H, T, D] (a view; NULL with an error if it does
 * not fit) */
static bool rope_table_fits(const em_tensor *t, const em_tensor *x) {
    int64_t B = x->shape[0], T = x->shape[2], D = x->shape[3];
    if (t->shape[t->ndim - 1] != D || t->shape[t->ndim - 2] != T) return false;
    if (t->ndim == 2) return true;
    if (t->ndim == 3) return t->shape[0] == B || t->shape[0] == 1;
    return t->ndim == 4 && (t->shape[0] == B || t->shape[0] == 1) && t->shape[1] == 1;
}

static em_tensor *rope_table4(em_tensor *t) {
    em_shape s = em_shape_of(t);
    int64_t B = s.ndim >= 3 ? s.d[0] : 1;
    return em_reshape(t, EM_SHAPE(B, 1, s.d[s.ndim - 2], s.d[s.ndim - 1]));
}

/* cat(-x[..., h:], x[..., :h]) (sign +1) or its transpose cat(x[..., h:], -x[..., :h]) (-1) */
static em_tensor *rotate_half(em_tensor *x, int sign) {
    int64_t h = em_size(x, -1) / 2;
    em_tensor *x1 = em_narrow(x, -1, 0, h), *x2 = em_narrow(x, -1, h, h);
    em_tensor *parts[2] = {sign > 0 ? em_neg(x2) : x2, sign > 0 ? x1 : em_neg(x1)};
    return em_cat(parts, 2, -1);
}

/* the ROPE kernel on x (rows of any strides, the last 1) with [T, D] or [B, T, D] tables;
 * not scoped. *st EM_ERR_NOT_SUPPORTED (nothing recorded) where the backend declines. */
static em_tensor *rope_run(em_tensor *x, em_tensor *cos, em_tensor *sin, bool backward, em_status *st) {
    const em_backend *be = x->storage->backend;
    *st = EM_ERR_NOT_SUPPORTED;
    if (!em__op_supported(be, EM_OP_ROPE, x->dtype) || cos->dtype != x->dtype || sin->dtype != x->dtype ||
        !em__same_device(cos, x) || !em__same_device(sin, x))
        return NULL;
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3];
    bool per_batch = cos->ndim >= 3 && cos->shape[0] == B && B > 1;
    em_tensor *tx = NULL, *tc = NULL, *ts = NULL;
    const em_tensor *xc = x;
    *st = EM_OK;
    if (D > 1 && x->strides[3] != 1 && !(xc = tx = em__copy_raw(x, x->dtype))) *st = em_last_status();
    const em_tensor *cc = *st == EM_OK ? dense(cos, &tc) : NULL, *sc = cc ? dense(sin, &ts) : NULL;
    if (*st == EM_OK && !sc) *st = em_last_status();
    em_tensor *out = *st == EM_OK ? em__tensor_new_on(be, x->storage->device, 4, x->shape, x->dtype) : NULL;
    if (*st == EM_OK && !out) *st = em_last_status();
    if (*st == EM_OK && em__numel_raw(4, x->shape) > 0)
        *st = em__op_try(&(em_op_call){.op = EM_OP_ROPE, .dtype = x->dtype, .dst = {out}, .src = {xc, cc, sc},
                                       .i = {D, H, T, xc->strides[0], xc->strides[1], xc->strides[2], per_batch,
                                             backward}});
    em_release(tx);
    em_release(tc);
    em_release(ts);
    if (*st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_rope(em_tensor *x, em_tensor *cos, em_tensor *sin) {
    const char *op = "rope";
    EM_CHECK_ARG(x, op, "x");
    EM_CHECK_ARG(cos, op, "cos");
    EM_CHECK_ARG(sin, op, "sin");
    if (em__check_same_device(op, 3, (const em_tensor *const[]){x, cos, sin})) return NULL;
    char a[128], b[128], c[128];
    if (x->ndim != 4 || x->shape[3] % 2 || !rope_table_fits(cos, x) || !rope_table_fits(sin, x) ||
        cos->ndim != sin->ndim || memcmp(cos->shape, sin->shape, sizeof(int64_t) * (size_t)cos->ndim)) {
        em_error(EM_ERR_SHAPE, "%s: expected x [B, H, T, D] with D even and cos, sin of one shape [T, D], [B, T, D] "
                 "or [B, 1, T, D] (B may be 1), got x %s, cos %s, sin %s", op,
                 em__shape_str(a, sizeof a, x->ndim, x->shape), em__shape_str(b, sizeof b, cos->ndim, cos->shape),
                 em__shape_str(c, sizeof c, sin->ndim, sin->shape));
        return NULL;
    }
    if (!em_dtype_is_floating(x->dtype) || !em_dtype_is_floating(cos->dtype) || !em_dtype_is_floating(sin->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: expected floating x, cos and sin, got %s, %s, %s", op, em_dtype_name(x->dtype),
                 em_dtype_name(cos->dtype), em_dtype_name(sin->dtype));
        return NULL;
    }
    em_tensor *in[3] = {x, cos, sin};
    /* the fused node differentiates x only: tables that need a gradient take the composition */
    bool tables_grad = em__grad_needed(2, in + 1);
    if (!tables_grad) {
        /* cos and sin as [T, D] or [B, T, D] */
        em_scope s = em_scope_begin();
        em_tensor *c3 = cos->ndim == 4 ? em_reshape(cos, EM_SHAPE(cos->shape[0], cos->shape[2], cos->shape[3])) : cos;
        em_tensor *s3 = sin->ndim == 4 ? em_reshape(sin, EM_SHAPE(sin->shape[0], sin->shape[2], sin->shape[3])) : sin;
        em_status st = c3 && s3 ? EM_OK : em_last_status();
        em_tensor *out = st == EM_OK ? rope_run(x, c3, s3, false, &st) : NULL;
        if (out) {
            em_grad_args args = em__no_args;
            em_tensor *rec[3] = {x, c3, s3};
            if (em__grad_needed(1, &x) && em__grad_record(EM_GRAD_ROPE, out, 3, rec, &args) != EM_OK) {
                em_release(out);
                out = NULL;
            }
            return em__scope_return(s, out ? em__scoped(out) : NULL);
        }
        em_scope_end(s);
        if (st != EM_ERR_NOT_SUPPORTED) return NULL;
    }
    em_scope s = em_scope_begin();
    em_tensor *c4 = rope_table4(cos), *s4 = rope_table4(sin);
    return em__scope_return(s, em_add(em_mul(x, c4), em_mul(rotate_half(x, 1), s4)));
}

em_tensor *em__rope_backward(em_tensor *g, em_tensor *cos, em_tensor *sin) {
    if (!g || !cos || !sin) return NULL;
    em_status st;
    em_tensor *dx = rope_run(g, cos, sin, true, &st);
    if (dx) return em__scoped(dx);
    if (st != EM_ERR_NOT_SUPPORTED) return NULL;
    /* dx = g cos + rotate_half^T(g sin) */
    em_tensor *c4 = rope_table4(cos), *s4 = rope_table4(sin);
    return em_add(em_mul(g, c4), rotate_half(em_mul(g, s4), -1));
}

/* ---- the rotary tables ---- */

em_status em_rope_inv_freq(const em_rope_config *cfg, float *inv_freq) {
    const char *op = "em_rope_inv_freq";
    EM_CHECK_ARG_STATUS(cfg, op, "cfg");
    EM_CHECK_ARG_STATUS(inv_freq, op, "inv_freq");
    int64_t D = cfg->head_dim;
    if (D <= 0 || D % 2)
        return em_error(EM_ERR_ARGUMENT, "%s: head_dim must be even and > 0, got %lld", op, (long long)D);
    if (!(cfg->theta > 0 && isfinite(cfg->theta)))
        return em_error(EM_ERR_ARGUMENT, "%s: rope_theta must be finite and > 0, got %g", op, cfg->theta);
    bool scaled = cfg->scaling == EM_ROPE_LINEAR || cfg->scaling == EM_ROPE_LLAMA3;
    if (cfg->scaling != EM_ROPE_DEFAULT && !scaled)
        return em_error(EM_ERR_ARGUMENT, "%s: unknown rope scaling %d (expected EM_ROPE_DEFAULT, EM_ROPE_LINEAR or "
                        "EM_ROPE_LLAMA3)", op, (int)cfg->scaling);
    if (scaled && !(cfg->factor > 0 && isfinite(cfg->factor)))
        return em_error(EM_ERR_ARGUMENT, "%s: rope_scaling factor must be finite and > 0, got %g", op, cfg->factor);
    if (cfg->scaling == EM_ROPE_LLAMA3 &&
        !(cfg->low_freq_factor > 0 && cfg->high_freq_factor > cfg->low_freq_factor &&
          cfg->original_max_position_embeddings > 0 && isfinite(cfg->high_freq_factor) &&
          isfinite(cfg->original_max_position_embeddings)))
        return em_error(EM_ERR_ARGUMENT, "%s: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                        "original_max_position_embeddings > 0, got %g, %g and %g", op, cfg->low_freq_factor,
                        cfg->high_freq_factor, cfg->original_max_position_embeddings);
    /* transformers' float32 arithmetic, step by step: base ** (arange(0, D, 2) / D), then
     * its reciprocal (pow in double, rounded once: the correctly rounded float) */
    for (int64_t k = 0; k < D / 2; k++) {
        float e = (float)(2 * k) / (float)D;
        float p = (float)pow(cfg->theta, (double)e);
        inv_freq[k] = 1.0f / p;
    }
    if (cfg->scaling == EM_ROPE_LINEAR) {
        for (int64_t k = 0; k < D / 2; k++) inv_freq[k] = inv_freq[k] / (float)cfg->factor;
    } else if (cfg->scaling == EM_ROPE_LLAMA3) {
        /* _compute_llama3_parameters: wavelengths above old / low_freq_factor are divided
         * by factor, below old / high_freq_factor kept, and blended in between */
        float factor = (float)cfg->factor, lo = (float)cfg->low_freq_factor;
        float span = (float)(cfg->high_freq_factor - cfg->low_freq_factor); /* a Python float, then float32 */
        float old = (float)cfg->original_max_position_embeddings;
        float lo_wave = (float)(cfg->original_max_position_embeddings / cfg->low_freq_factor);
        float hi_wave = (float)(cfg->original_max_position_embeddings / cfg->high_freq_factor);
        float two_pi = (float)(2 * 3.14159265358979323846);
        for (int64_t k = 0; k < D / 2; k++) {
            float f = inv_freq[k], wave = (1.0f / f) * two_pi; /* 2 pi / t: t.reciprocal() * 2 pi */
            float scaled_f = wave > lo_wave ? f / factor : f;
            if (!(wave < hi_wave) && !(wave > lo_wave)) {
                float smooth = (old * (1.0f / wave) - lo) / span;
                scaled_f = (1.0f - smooth) * scaled_f / factor + smooth * scaled_f;
            }
            inv_freq[k] = scaled_f;
        }
    }
    return EM_OK;
}

em_status em_rope_tables(const em_rope_config *cfg, em_tensor *positions, em_dtype dtype, em_device device,
                         em_tensor **cos_out, em_tensor **sin_out) {
    const char *op = "em_rope_tables";
    EM_CHECK_ARG_STATUS(cos_out, op, "cos");
    EM_CHECK_ARG_STATUS(sin_out, op, "sin");
    *cos_out = *sin_out = NULL;
    EM_CHECK_ARG_STATUS(cfg, op, "cfg");
    EM_CHECK_ARG_STATUS(positions, op, "positions");
    char a[128];
    if ((positions->ndim != 1 && positions->ndim != 2) ||
        (positions->dtype != EM_I64 && positions->dtype != EM_I32))
        return em_error(EM_ERR_SHAPE, "%s: positions must be int64 or int32 of shape [T] or [B, T], got %s %s", op,
                        em_dtype_name(positions->dtype), em__shape_str(a, sizeof a, positions->ndim, positions->shape));
    if (!em_dtype_is_floating(dtype))
        return em_error(EM_ERR_DTYPE, "%s: the tables' dtype must be floating, got %s", op, em_dtype_name(dtype));
    int64_t D = cfg->head_dim, h = D / 2, np = em__numel_raw(positions->ndim, positions->shape);
    float *inv = malloc(sizeof(float) * (size_t)(h > 0 ? h : 1));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(np > 0 ? np : 1));
    float *tc = NULL, *tsn = NULL;
    em_status st = inv && pos ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (st == EM_OK) st = em_rope_inv_freq(cfg, inv);
    if (st == EM_OK) st = em__to_host(positions, EM_I64, pos);
    if (st == EM_OK) {
        size_t bytes = sizeof(float) * (size_t)np * (size_t)D;
        if (np > 0 && bytes / (size_t)np / sizeof(float) != (size_t)D) bytes = SIZE_MAX;
        tc = bytes != SIZE_MAX ? malloc(bytes ? bytes : 1) : NULL;
        tsn = tc ? malloc(bytes ? bytes : 1) : NULL;
        if (!tsn) st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld x %lld tables", op,
                                (long long)np, (long long)D);
    }
    if (st == EM_OK) {
        /* freqs = inv_freq * position in float32 (transformers' matmul of a [D/2, 1] by a
         * [1, T] is one rounded product per entry), emb = cat(freqs, freqs), then cos and sin
         * of that float (in double, rounded once) */
        for (int64_t p = 0; p < np; p++)
            for (int64_t k = 0; k < h; k++) {
                float f = inv[k] * (float)pos[p];
                float cv = (float)cos((double)f), sv = (float)sin((double)f);
                tc[p * D + k] = tc[p * D + k + h] = cv;
                tsn[p * D + k] = tsn[p * D + k + h] = sv;
            }
        em_shape shape = positions->ndim == 1 ? EM_SHAPE(np, D) : EM_SHAPE(positions->shape[0], positions->shape[1], D);
        em_scope s = em_scope_begin();
        em_opts o = EM_OPTS(.dtype = dtype, .device = device);
        em_tensor *c = em_from_data(tc, EM_F32, shape, o), *sn = c ? em_from_data(tsn, EM_F32, shape, o) : NULL;
        if (sn) {
            *cos_out = em_keep(c);
            *sin_out = em_keep(sn);
        }
        st = sn ? EM_OK : em_last_status();
        em_scope_end(s);
        if (st == EM_OK) {
            *cos_out = em__scoped(*cos_out);
            *sin_out = em__scoped(*sin_out);
        }
    }
    free(inv);
    free(pos);
    free(tc);
    free(tsn);
    return st;
}
