/* Fused scaled-dot-product attention where the backend has the kernels (the CPU:
 * src/backends/cpu/cpu_attention.c; OpenCL and CUDA: src/kernels/attention.k, which decline
 * heads wider than they hold, so core composes those), as PyTorch 2.x runs F.scaled_dot_product_attention on
 * its flash kernel: one node whose backward recomputes the probabilities from q, k and each
 * row's log-sum-exp, so no [L, S] tensor outlives the forward. src/nn/attention.c asks
 * em__sdpa_applies and composes matmul, softmax and matmul elsewhere (masks, dropout,
 * autocast, other dtypes, backends without the kernels, EMBER_ATTENTION=composed).
 *
 * The output, and the gradients of 4-d q, k and v, are laid out [B, L, H, E] in memory and
 * handed out as [B, H, L, E] views: MultiheadAttention's merge of the heads (transpose, then
 * reshape to [B, L, H * E]) is then a view, not a copy, and so are the split heads'
 * gradients on their way back to the projections. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <ember/amp.h>
#include <ember/autograd.h>
#include "ops_internal.h"
#include "internal_api.h"
#include <ember/nn.h>

static bool fused_wanted(void) {
    const char *e = getenv("EMBER_ATTENTION"); /* read on every call: tests compare both */
    return !e || strcmp(e, "composed") != 0;
}

/* Whether be's kernels take this attention (the backend's `supports` with the operands: the
 * GPUs' kernels have a largest head dim). src {q, k, v} as the call's forward or backward
 * reads them. */
static bool kernels_take(const em_backend *be, em_op op, em_dtype dt, const em_tensor *q, const em_tensor *k,
                         const em_tensor *v) {
    em_op_call c = {.op = op, .dtype = dt};
    if (op == EM_OP_SDPA) {
        c.src[0] = q;
        c.src[1] = k;
        c.src[2] = v;
    } else {
        c.src[1] = q;
        c.src[2] = k;
        c.src[3] = v;
    }
    return be->supports && be->supports(&c);
}

bool em_sdpa_fused(em_device_type t) {
    const em_backend *be = em__backend_for(t);
    return be && em__op_supported(be, EM_OP_SDPA, EM_F32) && em__op_supported(be, EM_OP_SDPA_BACKWARD, EM_F32) &&
           fused_wanted();
}

bool em__sdpa_applies(const em_tensor *q, const em_tensor *k, const em_tensor *v) {
    if (!q || !k || !v || !fused_wanted()) return false;
    const em_backend *be = q->storage->backend;
    if (!em__op_supported(be, EM_OP_SDPA, EM_F32) || !em__op_supported(be, EM_OP_SDPA_BACKWARD, EM_F32) ||
        !em__same_device(q, k) || !em__same_device(q, v))
        return false;
    if (em_autocast_enabled(q->storage->device.type)) return false; /* the region decides the products' dtype */
    const em_tensor *ts[3] = {q, k, v};
    int nd = q->ndim;
    if (nd < 2 || nd > 4) return false;
    for (int i = 0; i < 3; i++) {
        const em_tensor *t = ts[i];
        if (t->dtype != EM_F32 || t->ndim != nd || (t->shape[nd - 1] > 1 && t->strides[nd - 1] != 1)) return false;
        for (int d = 0; d < nd; d++)
            if (t->shape[d] <= 0 || (d < nd - 2 && t->shape[d] != q->shape[d])) return false;
    }
    return k->shape[nd - 1] == q->shape[nd - 1] && v->shape[nd - 2] == k->shape[nd - 2] &&
           kernels_take(be, EM_OP_SDPA, EM_F32, q, k, v) && kernels_take(be, EM_OP_SDPA_BACKWARD, EM_F32, q, k, v);
}

/* t as the kernels' [B, H, rows, cols]: size-1 dims in front (a new view, not scoped). */
static em_tensor *as4(const em_tensor *t) {
    int64_t shape[4] = {1, 1, 1, 1}, strides[4] = {0, 0, 0, 1};
    for (int i = 0; i < t->ndim; i++) {
        shape[4 - t->ndim + i] = t->shape[i];
        strides[4 - t->ndim + i] = t->strides[i];
    }
    return em__view_of(t, 4, shape, strides, t->offset);
}

/* A new tensor of like's shape with dims 1 and 2 swapped in memory when 4-d ([B, L, H, E]
 * stored, [B, H, L, E] seen), contiguous otherwise. Not scoped. */
static em_tensor *heads_last(const em_tensor *like, int64_t cols, em_dtype dt) {
    const em_backend *be = like->storage->backend;
    em_device dev = like->storage->device;
    int nd = like->ndim;
    int64_t shape[4];
    memcpy(shape, like->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = cols;
    if (nd != 4) return em__tensor_new_on(be, dev, nd, shape, dt);
    int64_t B = shape[0], H = shape[1], L = shape[2];
    em_tensor *t = em__tensor_new_on(be, dev, 4, (int64_t[]){B, L, H, cols}, dt);
    if (!t) return NULL;
    memcpy(t->shape, shape, sizeof shape);
    int64_t strides[4] = {L * H * cols, cols, H * cols, 1};
    memcpy(t->strides, strides, sizeof strides);
    return t;
}

typedef struct sdpa_ctx {
    em_tensor *q, *k, *v, *out, *lse; /* detached aliases and the row statistics */
    unsigned version[4];              /* q, k, v, out's storages when saved */
    double scale;
    int64_t past;
    bool causal, needs[3], released;
} sdpa_ctx;

static void sdpa_release(void *c) {
    sdpa_ctx *x = c;
    em_tensor *ts[5] = {x->q, x->k, x->v, x->out, x->lse};
    for (int i = 0; i < 5; i++) em_release(ts[i]);
    x->q = x->k = x->v = x->out = x->lse = NULL;
    x->released = true;
}

static void sdpa_destroy(void *c) {
    if (!c) return;
    sdpa_release(c);
    free(c);
}

static em_status sdpa_backward(void *c, em_tensor *g, int n, em_tensor **grads) {
    sdpa_ctx *x = c;
    const char *op = "ScaledDotProductAttentionBackward";
    if (x->released)
        return em_error(EM_ERR_AUTOGRAD, "%s: trying to backward through the graph a second time; the saved tensors "
                        "were freed by the first backward (use em_backward_with(..., retain_graph=true))", op);
    const em_tensor *saved[4] = {x->q, x->k, x->v, x->out};
    static const char *const names[4] = {"query", "key", "value", "output"};
    for (int i = 0; i < 4; i++) {
        unsigned now = atomic_load(&saved[i]->storage->version);
        if (now != x->version[i])
            return em_error(EM_ERR_AUTOGRAD, "one of the variables needed for gradient computation has been modified "
                            "by an inplace operation: the attention's %s is at version %u; expected version %u "
                            "instead. Hint: the tensor was saved by %s; modify a clone instead, or modify it after "
                            "backward.", names[i], now, x->version[i], op);
    }
    em_dtype dt = x->q->dtype; /* float32 on the CPU; also f16/bf16 where the backend has them */
    if (!g || g->dtype != dt || !em__same_device(g, x->out) || g->ndim != x->out->ndim ||
        memcmp(g->shape, x->out->shape, sizeof(int64_t) * (size_t)g->ndim) != 0)
        return em_failed() ? em_last_status() : em_error(EM_ERR_INTERNAL, "%s: a gradient unlike the output", op);
    em_tensor *gc = NULL;
    if (g->shape[g->ndim - 1] > 1 && g->strides[g->ndim - 1] != 1) { /* the kernels read rows */
        gc = em__copy_raw(g, dt);
        if (!gc) return em_last_status();
        g = gc;
    }
    em_tensor *d[3] = {heads_last(x->q, x->q->shape[x->q->ndim - 1], dt), NULL, NULL};
    d[1] = d[0] ? heads_last(x->k, x->k->shape[x->k->ndim - 1], dt) : NULL;
    d[2] = d[1] ? heads_last(x->v, x->v->shape[x->v->ndim - 1], dt) : NULL;
    em_tensor *v4[8] = {NULL};
    const em_tensor *src[8] = {d[0], d[1], d[2], g, x->q, x->k, x->v, x->out};
    em_status st = d[2] ? EM_OK : em_last_status();
    for (int i = 0; i < 8 && st == EM_OK; i++)
        if (!(v4[i] = as4(src[i]))) st = em_last_status();
    if (st == EM_OK)
        st = em__op_run(&(em_op_call){.op = EM_OP_SDPA_BACKWARD, .dtype = dt, .dst = {v4[0], v4[1], v4[2]},
                                      .src = {v4[3], v4[4], v4[5], v4[6], v4[7], x->lse}, .f = {x->scale},
                                      .i = {x->causal, x->past}}, op);
    for (int i = 0; i < 8; i++) em_release(v4[i]);
    em_release(gc);
    for (int i = 0; i < 3; i++) {
        if (st == EM_OK && i < n && x->needs[i]) grads[i] = em__scoped(d[i]);
        else em_release(d[i]);
    }
    return st;
}

static const em_custom_grad SDPA_GRAD = {
    .name = "ScaledDotProductAttentionBackward",
    .backward = sdpa_backward,
    .release = sdpa_release,
    .destroy = sdpa_destroy,
};

/* The GPUs' split decode: how many parts of the keys a few query rows (at most 16 per
 * key/value head: one work-group of attention.k) against many keys are split into, each part
 * of at least SPLIT_KEYS keys, so that decoding one token still occupies the GPU; 1 for
 * everything else. The CPU splits its own way (cpu_attention.c) and gets no workspace. */
#define SPLIT_KEYS 256
#define SPLIT_MAX 64
static int64_t decode_splits(const em_backend *be, int64_t group_rows, int64_t keys) {
    if (!be->gpu || group_rows > 16 || keys < 2 * SPLIT_KEYS) return 1;
    int64_t n = keys / SPLIT_KEYS;
    return n < SPLIT_MAX ? n : SPLIT_MAX;
}

/* The kernels on q, k, v (2 to 4 dims, last strides 1, one dtype) with the node when a
 * gradient is needed (the caller checked that the backward applies: no mask). NULL with
 * *declined set (nothing recorded) where the backend declines these operands. */
static em_tensor *sdpa_fused(const char *op, em_tensor *q, em_tensor *k, em_tensor *v, double scale, bool causal,
                             int64_t past, const em_tensor *mask, bool *declined) {
    const em_backend *be = q->storage->backend;
    int nd = q->ndim;
    *declined = false;
    int64_t rows = 1;
    for (int i = 0; i < nd - 1; i++) rows *= q->shape[i];
    em_tensor *in[3] = {q, k, v};
    bool grad = em__grad_needed(3, in);
    em_tensor *out = heads_last(q, v->shape[nd - 1], q->dtype);
    em_tensor *lse = out && grad ? em__tensor_new_on(be, q->storage->device, 1, &rows, EM_F32) : NULL;
    em_tensor *v4[4] = {NULL}, *work = NULL;
    const em_tensor *src[4] = {out, q, k, v};
    em_status st = out && (lse || !grad) ? EM_OK : em_last_status();
    for (int i = 0; i < 4 && st == EM_OK; i++)
        if (!(v4[i] = as4(src[i]))) st = em_last_status();
    int64_t splits = 1;
    if (st == EM_OK) {
        int64_t L = v4[1]->shape[2], S = v4[2]->shape[2], G = v4[1]->shape[1] / v4[2]->shape[1];
        splits = decode_splits(be, G * L, causal && past + L < S ? past + L : S);
        int64_t n = splits * rows * (v->shape[nd - 1] + 2);
        if (splits > 1 && !(work = em__tensor_new_on(be, q->storage->device, 1, &n, EM_F32))) st = em_last_status();
    }
    if (st == EM_OK) {
        st = em__op_try(&(em_op_call){.op = EM_OP_SDPA, .dtype = q->dtype, .dst = {v4[0], lse, work},
                                      .src = {v4[1], v4[2], v4[3], mask}, .f = {scale},
                                      .i = {causal, past, splits}});
        if (st == EM_ERR_NOT_SUPPORTED && !em_failed()) *declined = true;
    }
    em_release(work);
    for (int i = 0; i < 4; i++) em_release(v4[i]);
    if (st != EM_OK || !grad) {
        em_release(lse);
        if (st != EM_OK) {
            em_release(out);
            return NULL;
        }
        return em__scoped(out);
    }
    sdpa_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        em_release(lse);
        em_release(out);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for its autograd node", op);
        return NULL;
    }
    c->scale = scale;
    c->causal = causal;
    c->past = past;
    c->lse = lse;
    const em_tensor *keep[4] = {q, k, v, out};
    em_tensor **dst[4] = {&c->q, &c->k, &c->v, &c->out};
    for (int i = 0; i < 4; i++) {
        *dst[i] = em__view_of(keep[i], keep[i]->ndim, keep[i]->shape, keep[i]->strides, keep[i]->offset);
        if (!*dst[i]) st = em_last_status();
        c->version[i] = atomic_load(&keep[i]->storage->version);
        if (i < 3) c->needs[i] = em_requires_grad(in[i]);
    }
    if (st != EM_OK) {
        sdpa_destroy(c);
        em_release(out);
        return NULL;
    }
    if (em__grad_record_custom(&SDPA_GRAD, c, out, 3, in) != EM_OK) { /* owns c now */
        em_release(out);
        return NULL;
    }
    return em__scoped(out);
}

em_tensor *em__sdpa(em_tensor *q, em_tensor *k, em_tensor *v, double scale, bool causal) {
    if (!em__sdpa_applies(q, k, v)) {
        em_error(EM_ERR_INTERNAL, "scaled_dot_product_attention: the fused kernel does not apply here");
        return NULL;
    }
    bool declined;
    em_tensor *y = sdpa_fused("scaled_dot_product_attention", q, k, v, scale, causal, 0, NULL, &declined);
    if (declined)
        em_error(EM_ERR_INTERNAL, "scaled_dot_product_attention: the backend declined operands em__sdpa_applies took");
    return y;
}

/* ---- em_attention: grouped-query heads, a causal offset, a key mask ---- */

/* The lowest finite value of a floating dtype (transformers' torch.finfo(dtype).min mask) */
static double lowest(em_dtype dt) {
    switch (dt) {
    case EM_F64: return -1.7976931348623157e308;
    case EM_F16: return -65504.0;
    case EM_BF16: return -3.3895313892515355e38;
    default: return -3.4028234663852886e38;
    }
}

/* The composition: q viewed as [B, Hkv, G L, E] against k [B, Hkv, S, E] (no repeated k or v),
 * hidden scores set to the dtype's lowest value before the softmax and the probabilities
 * where hidden to 0 (so a row that sees nothing gives zeros, and no NaN enters a gradient). */
static em_tensor *attention_composed(em_tensor *q, em_tensor *k, em_tensor *v, double scale, bool causal,
                                     int64_t past, em_tensor *mask) {
    int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], E = q->shape[3];
    int64_t Hkv = k->shape[1], S = k->shape[2], Ev = v->shape[3], G = Hq / Hkv;
    em_device dev = q->storage->device;
    if (causal && past + L < S) { /* keys past the last query's position: never read (a cache's unused rows) */
        S = past + L;
        k = em_narrow(k, 2, 0, S);
        v = em_narrow(v, 2, 0, S);
        if (mask) mask = em_narrow(mask, 1, 0, S);
    }
    em_tensor *qg = em_reshape(q, EM_SHAPE(B, Hkv, G * L, E));
    em_tensor *scores = em_matmul(em_mul_scalar(qg, scale), em_transpose(k, -2, -1));
    scores = em_reshape(scores, EM_SHAPE(B, Hkv, G, L, S));
    em_tensor *keep = NULL;
    if (causal) { /* [L, S]: key j <= past + i */
        em_opts o = EM_OPTS(.dtype = EM_I64, .device = dev);
        keep = em_le(em_unsqueeze(em_arange(0, (double)S, 1, o), 0),
                     em_unsqueeze(em_arange((double)past, (double)(past + L), 1, o), 1));
    }
    if (mask) {
        em_tensor *m = em_reshape(mask, EM_SHAPE(B, 1, 1, 1, S));
        keep = keep ? em_mul(keep, m) : m; /* bool * bool: and */
    }
    em_tensor *p;
    if (keep) {
        em_opts o = EM_OPTS(.dtype = q->dtype, .device = dev);
        p = em_softmax(em_where(keep, scores, em_scalar(lowest(q->dtype), o)), -1);
        p = em_where(keep, p, em_scalar(0, o));
    } else {
        p = em_softmax(scores, -1);
    }
    em_tensor *y = em_matmul(em_reshape(p, EM_SHAPE(B, Hkv, G * L, S)), v);
    return em_reshape(y, EM_SHAPE(B, Hq, L, Ev));
}

/* t with its last stride 1: t, or its contiguous copy (scoped, recorded by autograd) */
static em_tensor *rows_unit(em_tensor *t) {
    if (t->shape[t->ndim - 1] <= 1 || t->strides[t->ndim - 1] == 1) return t;
    return em_contiguous(t);
}

em_tensor *em_attention(em_tensor *q, em_tensor *k, em_tensor *v, const em_attention_opts *opts) {
    const char *op = "attention";
    EM_CHECK_ARG(q, op, "q");
    EM_CHECK_ARG(k, op, "k");
    EM_CHECK_ARG(v, op, "v");
    em_attention_opts o = opts ? *opts : (em_attention_opts){0};
    em_tensor *mask = o.key_mask;
    int nin = mask ? 4 : 3;
    if (em__check_same_device(op, nin, (const em_tensor *const[]){q, k, v, mask})) return NULL;
    char a[128], b[128], c[128];
    bool ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && k->shape[0] == q->shape[0] &&
              v->shape[0] == q->shape[0] && k->shape[1] > 0 && k->shape[1] == v->shape[1] &&
              q->shape[1] % k->shape[1] == 0 && k->shape[2] == v->shape[2] && k->shape[3] == q->shape[3];
    if (!ok) {
        em_error(EM_ERR_SHAPE, "%s: expected q [B, Hq, L, E], k [B, Hkv, S, E] and v [B, Hkv, S, Ev] with Hq a multiple "
                 "of Hkv > 0, got q %s, k %s, v %s", op, em__shape_str(a, sizeof a, q->ndim, q->shape),
                 em__shape_str(b, sizeof b, k->ndim, k->shape), em__shape_str(c, sizeof c, v->ndim, v->shape));
        return NULL;
    }
    if (!em_dtype_is_floating(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype) {
        em_error(EM_ERR_DTYPE, "%s: expected q, k and v of one floating dtype, got %s, %s and %s", op,
                 em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
        return NULL;
    }
    if (mask && (mask->dtype != EM_BOOL || mask->ndim != 2 || mask->shape[0] != q->shape[0] ||
                 mask->shape[1] != k->shape[2])) {
        em_error(EM_ERR_SHAPE, "%s: key_mask must be bool [B, S] = [%lld, %lld], got %s %s", op, (long long)q->shape[0],
                 (long long)k->shape[2], em_dtype_name(mask->dtype), em__shape_str(a, sizeof a, mask->ndim, mask->shape));
        return NULL;
    }
    if (o.past < 0 || !(o.scale >= 0 && isfinite(o.scale))) {
        em_error(EM_ERR_ARGUMENT, "%s: expected past >= 0 and a finite scale >= 0 (0: 1 / sqrt(E)), got past %lld, "
                 "scale %g", op, (long long)o.past, o.scale);
        return NULL;
    }
    EM_AUTOCAST3(EM_AC_ATTENTION, em_attention(q, k, v, opts), q, k, v);
    double scale = o.scale > 0 ? o.scale : 1.0 / sqrt((double)(q->shape[3] > 0 ? q->shape[3] : 1));
    int64_t numel = em__numel_raw(4, q->shape) * k->shape[2] * v->shape[3];
    em_tensor *in[3] = {q, k, v};
    bool grad = em__grad_needed(3, in);
    const em_backend *be = q->storage->backend;
    bool fused = fused_wanted() && numel > 0 && kernels_take(be, EM_OP_SDPA, q->dtype, q, k, v) &&
                 (!grad || (!mask && kernels_take(be, EM_OP_SDPA_BACKWARD, q->dtype, q, k, v)));
    em_scope s = em_scope_begin();
    if (fused) {
        em_tensor *qq = rows_unit(q), *kk = rows_unit(k), *vv = rows_unit(v), *mm = mask ? em_contiguous(mask) : NULL;
        bool declined = false;
        em_tensor *y = qq && kk && vv && (mm || !mask) ? sdpa_fused(op, qq, kk, vv, scale, o.causal, o.past, mm, &declined)
                                                       : NULL;
        if (!declined) return em__scope_return(s, y);
    }
    return em__scope_return(s, attention_composed(q, k, v, scale, o.causal, o.past, mask));
}
