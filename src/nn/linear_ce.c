/* Fused linear cross-entropy: cross_entropy(h @ W^T + b, target) over chunks of rows, so that
 * the [N, V] logits of a language model's head never exist at once (llm.c's fused classifier,
 * Liger's FusedLinearCrossEntropy). Written with public ops, so it runs on every backend; its
 * autograd node is a custom one (em__grad_record_custom) whose gradients are computed in the
 * forward's chunk loop and kept, since recomputing the logits in backward would cost a third
 * [N, H] x [H, V] GEMM. 'none' cannot do that (the per-row gradient is known only in
 * backward): its backward runs the chunk loop again.
 *
 * Per row, with p = softmax(z), q = (1 - s) one_hot(t) + s / V and log p = z - lse:
 *   loss = -sum_c q_c log p_c = -(1 - s) log p_t - (s / V) sum_c log p_c
 *   dloss/dz = p - q
 * and the chunk's dz (times the row's share of the reduction) gives dh = dz W, dW += dz^T h,
 * db += sum of dz's rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/nn.h>
#include <ember/ops.h>
#include "../core/internal_api.h"

typedef struct lce_ctx {
    em_tensor *h, *w, *b;       /* the inputs, detached (b may be NULL) */
    em_tensor *target;          /* int64 [N], ignored rows as class 0 (a valid index for gather) */
    em_tensor *valid;           /* [N] in the loss's dtype: 1 for a counted row, 0 for an ignored one */
    em_tensor *gh, *gw, *gb;    /* the forward's gradients ('mean', 'sum'), in the inputs' dtype */
    bool need[3];               /* which of h, w, b require grad */
    em_reduction reduction;
    double smoothing;
    double share;               /* a counted row's share of 'mean' or 'sum' */
    int64_t chunk;
    em_dtype acc;               /* the loss's dtype: float32 for bf16/f16 inputs */
} lce_ctx;

static bool low_precision(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16; }

/* The chunk loop. loss_rows (acc [N]) receives each row's loss when not NULL; rowscale (acc
 * [N], zero on ignored rows) weights each row's gradient when not NULL, which is written into
 * gh (the inputs' dtype, [N, H]) and summed into gw (acc [V, H]) and gb (acc [V]), each when
 * not NULL. */
static em_status lce_chunks(const lce_ctx *k, em_tensor *loss_rows, em_tensor *rowscale, em_tensor *gh,
                            em_tensor *gw, em_tensor *gb) {
    int64_t n = em_size(k->h, 0), v = em_size(k->w, 0);
    em_dtype dt = em_dtype_of(k->h);
    bool low = low_precision(dt);
    double s = k->smoothing;
    em_tensor *wt = em_transpose(k->w, 0, 1);
    if (!wt) return em_last_status();
    for (int64_t start = 0; start < n; start += k->chunk) {
        int64_t c = n - start < k->chunk ? n - start : k->chunk;
        em_scope chunk_scope = em_scope_begin();
        em_tensor *logp = NULL, *dz = NULL;
        em_tensor *hc = em_narrow(k->h, 0, start, c);
        em_tensor *tcol = em_unsqueeze(em_narrow(k->target, 0, start, c), 1);
        /* the logits are F.linear's in h's dtype, widened after; only their log-softmax outlives
         * this inner scope */
        em_scope inner = em_scope_begin();
        em_tensor *z = k->b ? em_addmm(k->b, hc, wt, 1.0, 1.0) : em_matmul(hc, wt);
        if (z && low) z = em_rebind(z, em_to_dtype(z, k->acc)); /* the 16-bit logits gone before log-softmax */
        /* the backend's kernel for the rows' loss and dz where it has one (the GPUs), else the
         * composition below */
        em_tensor *dz_fused = NULL;
        em_status fs = z ? em__ce_rows(z, em_narrow(k->target, 0, start, c), em_narrow(k->valid, 0, start, c),
                                       rowscale ? em_narrow(rowscale, 0, start, c) : NULL, s,
                                       loss_rows ? em_narrow(loss_rows, 0, start, c) : NULL, &dz_fused)
                         : EM_ERR_NOT_SUPPORTED;
        if (fs == EM_OK) dz = dz_fused ? em_keep(dz_fused) : NULL;
        else if (!em_failed()) logp = em_keep(em_log_softmax(z, 1));
        em_scope_end(inner);
        if (logp && loss_rows) {
            em_tensor *row = em_mul_scalar(em_squeeze(em_gather(logp, 1, tcol), 1), -(1.0 - s));
            if (s > 0.0) row = em_add(row, em_mul_scalar(em_sum(logp, EM_DIMS(1), false), -s / (double)v));
            row = em_mul(row, em_narrow(k->valid, 0, start, c));
            if (row) em_copy_(em_narrow(loss_rows, 0, start, c), row);
        }
        if (logp && rowscale && !em_failed()) {
            /* dz = (p - q) times the row's share, made in logp's own buffer: exp, scale, then
             * the smoothing's and the target's terms, each in place (one [c, V] buffer at a
             * time, the same values as the out-of-place ops) */
            em_tensor *rs = em_unsqueeze(em_narrow(rowscale, 0, start, c), 1); /* [c, 1] */
            dz = logp;
            logp = NULL;
            if (em_exp_(dz) == EM_OK && em_mul_(dz, rs) == EM_OK && s > 0.0) em_add_(dz, rs, -s / (double)v);
            if (!em_failed()) em__scatter_add_(dz, 1, tcol, em_mul_scalar(rs, -(1.0 - s)));
        }
        if (dz && rowscale && !em_failed()) {
            /* 16-bit: dz rounded to h's dtype as the .float() cast's backward rounds it; the
             * weight's and bias's sums see those rounded values, widened again, in float32:
             * widened back into dz's own buffer */
            em_tensor *dz_low = dz && low ? em_to_dtype(dz, dt) : dz;
            if (dz_low && low && (gw || gb)) em_copy_(dz, dz_low);
            if (gh && dz_low) em_copy_(em_narrow(gh, 0, start, c), em_matmul(dz_low, k->w));
            if (gw && !em_failed()) em__addmm_acc_(gw, em_transpose(dz, 0, 1), low ? em_to_dtype(hc, k->acc) : hc);
            if (gb && !em_failed()) em_add_(gb, em_sum(dz, EM_DIMS(0), false), 1.0);
        }
        em_release(logp);
        em_release(dz);
        em_scope_end(chunk_scope);
        if (em_failed()) return em_last_status();
    }
    return EM_OK;
}

static void lce_release(void *p) {
    lce_ctx *k = p;
    em_tensor **ts[] = {&k->h, &k->w, &k->b, &k->target, &k->valid, &k->gh, &k->gw, &k->gb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        em_release(*ts[i]);
        *ts[i] = NULL;
    }
}

static void lce_destroy(void *p) {
    if (!p) return;
    lce_release(p);
    free(p);
}

/* The gradients by running the chunks again, each row's weighted by rowscale (acc [N]). */
static em_status lce_rerun(const lce_ctx *k, em_tensor *rowscale, int n, em_tensor **grads) {
    em_dtype dt = em_dtype_of(k->h);
    int64_t v = em_size(k->w, 0), hd = em_size(k->h, 1);
    em_opts acc = EM_OPTS(.dtype = k->acc, .device = em_device_of(k->h));
    em_tensor *gh = k->need[0] ? em_empty(em_shape_of(k->h), EM_OPTS(.dtype = dt, .device = acc.device)) : NULL;
    em_tensor *gw = k->need[1] ? em_zeros(EM_SHAPE(v, hd), acc) : NULL;
    em_tensor *gb = k->need[2] && k->b ? em_zeros(EM_SHAPE(v), acc) : NULL;
    if (em_failed()) return em_last_status();
    em_status st = lce_chunks(k, NULL, rowscale, gh, gw, gb);
    if (st != EM_OK) return st;
    grads[0] = gh;
    if (n > 1) grads[1] = gw && low_precision(dt) ? em_to_dtype(gw, dt) : gw;
    if (n > 2) grads[2] = gb && low_precision(dt) ? em_to_dtype(gb, dt) : gb;
    return em_last_status();
}

/* g: the loss's gradient, 0-d ('mean', 'sum') or [N] ('none'). The forward's gradients serve
 * 'mean' and 'sum' when scaling them by g rounds nothing more: always in float32 and float64
 * (to within their rounding), and in bf16/f16 when g is a power of two (loss.backward()'s 1, a
 * loss scaler's scale). Otherwise PyTorch rounds g * (p - q) to the 16-bit dtype once, so the
 * chunks run again with g in each row's weight, as 'none' always does. */
static em_status lce_backward(void *p, em_tensor *g, int n, em_tensor **grads) {
    lce_ctx *k = p;
    for (int i = 0; i < n; i++) grads[i] = NULL;
    if (!k->h) return em_error(EM_ERR_ARGUMENT, "linear_cross_entropy: backward through the graph a second time "
                                                "(call em_backward_with(..., retain_graph=true) the first time)");
    if (k->reduction == EM_REDUCTION_NONE) return lce_rerun(k, em_mul(k->valid, em_to_dtype(g, k->acc)), n, grads);
    double gv = em_item(g);
    if (em_failed()) return em_last_status();
    int exp2;
    bool exact = !low_precision(em_dtype_of(k->h)) || gv == 0.0 || fabs(frexp(gv, &exp2)) == 0.5;
    em_tensor **kept[3] = {&k->gh, &k->gw, &k->gb};
    bool have = (!k->need[0] || k->gh) && (!k->need[1] || k->gw) && (!k->need[2] || !k->b || k->gb);
    if (!exact || !have) return lce_rerun(k, em_mul_scalar(k->valid, k->share * gv), n, grads);
    /* the kept gradients are handed over (scoped, no other holder: autograd takes each as the
     * leaf's .grad without a copy); a second backward (retain_graph) runs the chunks again */
    for (int i = 0; i < 3 && i < n; i++) {
        if (!*kept[i]) continue;
        em_tensor *g_i = em__scoped(*kept[i]);
        *kept[i] = NULL;
        if (k->need[i]) grads[i] = gv == 1.0 ? g_i : em_mul_scalar(g_i, gv);
    }
    return em_last_status();
}

static const em_custom_grad LCE_GRAD = {
    .name = "LinearCrossEntropyBackward",
    .backward = lce_backward,
    .release = lce_release,
    .destroy = lce_destroy,
};

static void shape_text(char *buf, size_t size, const em_tensor *t) {
    em_shape s = em_shape_of(t);
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* Shapes, dtypes, devices and options; NULL and an error when something is wrong. */
static bool lce_check(const char *fn, em_tensor *h, em_tensor *w, em_tensor *b, em_tensor *target,
                      const em_linear_ce_opts *o) {
    if (!h || !w || !target) {
        if (!em_failed())
            em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, !h ? "input" : !w ? "weight" : "target");
        return false;
    }
    char a[128], c[128];
    if (em_ndim(h) != 2 || em_ndim(w) != 2 || em_size(h, 1) != em_size(w, 1)) {
        shape_text(a, sizeof a, h);
        shape_text(c, sizeof c, w);
        em_error(EM_ERR_SHAPE, "%s: expected input [N, H] and weight [V, H], got input %s and weight %s", fn, a, c);
        return false;
    }
    em_dtype dt = em_dtype_of(h);
    if (!em_dtype_is_floating(dt) || em_dtype_of(w) != dt || (b && em_dtype_of(b) != dt)) {
        em_error(EM_ERR_DTYPE, "%s: expected input, weight and bias of one floating dtype, got %s, %s and %s", fn,
                 em_dtype_name(dt), em_dtype_name(em_dtype_of(w)), b ? em_dtype_name(em_dtype_of(b)) : "no bias");
        return false;
    }
    if (b && (em_ndim(b) != 1 || em_size(b, 0) != em_size(w, 0))) {
        shape_text(a, sizeof a, b);
        em_error(EM_ERR_SHAPE, "%s: expected bias [%lld] (weight's rows), got %s", fn, (long long)em_size(w, 0), a);
        return false;
    }
    em_dtype tt = em_dtype_of(target);
    if (em_dtype_is_floating(tt) || tt == EM_BOOL) {
        em_error(EM_ERR_DTYPE, "%s: expected integer class indices as target, got %s", fn, em_dtype_name(tt));
        return false;
    }
    if (em_ndim(target) != 1 || em_size(target, 0) != em_size(h, 0)) {
        shape_text(a, sizeof a, target);
        em_error(EM_ERR_SHAPE, "%s: expected target size [%lld], got %s", fn, (long long)em_size(h, 0), a);
        return false;
    }
    em_device d = em_device_of(h);
    if (!em_device_equal(em_device_of(w), d) || !em_device_equal(em_device_of(target), d) ||
        (b && !em_device_equal(em_device_of(b), d))) {
        em_error(EM_ERR_DEVICE, "%s: expected input, weight, bias and target on one device (input is on %s)", fn,
                 em_device_str(d).s);
        return false;
    }
    if (!o) return true;
    if (!(o->label_smoothing >= 0.0 && o->label_smoothing <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "%s: label_smoothing must be between 0.0 and 1.0. Got: %g", fn, o->label_smoothing);
        return false;
    }
    if (o->reduction != EM_REDUCTION_MEAN && o->reduction != EM_REDUCTION_SUM && o->reduction != EM_REDUCTION_NONE) {
        em_error(EM_ERR_ARGUMENT, "%s: reduction must be EM_REDUCTION_MEAN, _SUM or _NONE, got %d", fn, (int)o->reduction);
        return false;
    }
    if (!(o->divisor >= 0.0) || (o->divisor > 0.0 && o->reduction != EM_REDUCTION_SUM)) {
        em_error(EM_ERR_ARGUMENT, "%s: divisor must be >= 0 (0: none), and divides only EM_REDUCTION_SUM's loss; got "
                 "%g with reduction %d", fn, o->divisor, (int)o->reduction);
        return false;
    }
    if (o->chunk_size < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: chunk_size must be >= 0 (0: the default), got %lld", fn, (long long)o->chunk_size);
        return false;
    }
    return true;
}

/* Liger's chunk, the power of two nearest above N / ceil(V / H), so that a chunk's logits are
 * about the size of h; but no fewer than 256 rows: each chunk reads W three times (the logits,
 * dh, dW), and a thinner chunk's GEMMs are too thin to keep the cores busy (docs/BENCHMARKS.md) */
static int64_t default_chunk(int64_t n, int64_t h, int64_t v) {
    int64_t inc = h > 0 ? (v + h - 1) / h : 1;
    if (inc < 1) inc = 1;
    int64_t want = (n + inc - 1) / inc, c = 256;
    while (c < want) c <<= 1;
    return c;
}

/* The targets read on the host: ignored rows become class 0 with valid 0; a class outside
 * [0, V) is an error naming its row. */
static em_status read_targets(const char *fn, em_tensor *target, int64_t v, int64_t ignore, int64_t *cls,
                              double *valid, int64_t *counted) {
    int64_t n = em_size(target, 0);
    em_scope s = em_scope_begin();
    em_status st = n ? em_copy_to_host(em_to_dtype(em_cpu(target), EM_I64), cls, (size_t)n * sizeof *cls) : EM_OK;
    em_scope_end(s);
    if (st != EM_OK) return st;
    *counted = 0;
    for (int64_t i = 0; i < n; i++) {
        if (cls[i] == ignore) {
            cls[i] = 0;
            valid[i] = 0.0;
            continue;
        }
        if (cls[i] < 0 || cls[i] >= v)
            return em_error(EM_ERR_ARGUMENT, "%s: target[%lld] = %lld is out of bounds: expected a class in [0, %lld) "
                            "or ignore_index %lld", fn, (long long)i, (long long)cls[i], (long long)v, (long long)ignore);
        valid[i] = 1.0;
        (*counted)++;
    }
    return EM_OK;
}

em_tensor *em_linear_cross_entropy(em_tensor *h, em_tensor *weight, em_tensor *bias, em_tensor *target,
                                   const em_linear_ce_opts *opts) {
    const char *fn = "linear_cross_entropy";
    if (!lce_check(fn, h, weight, bias, target, opts)) return NULL;
    em_linear_ce_opts o = opts ? *opts : (em_linear_ce_opts){0};
    int64_t n = em_size(h, 0), hd = em_size(h, 1), v = em_size(weight, 0);
    int64_t ignore = o.ignore_index ? *o.ignore_index : -100;
    em_dtype dt = em_dtype_of(h);
    em_device dev = em_device_of(h);
    lce_ctx *k = calloc(1, sizeof *k);
    int64_t *cls = malloc(sizeof *cls * (size_t)(n + 1));
    double *valid = malloc(sizeof *valid * (size_t)(n + 1));
    if (!k || !cls || !valid) {
        free(k);
        free(cls);
        free(valid);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld targets", fn, (long long)n);
        return NULL;
    }
    int64_t counted = 0;
    if (read_targets(fn, target, v, ignore, cls, valid, &counted) != EM_OK) {
        free(k);
        free(cls);
        free(valid);
        return NULL;
    }
    k->need[0] = em_requires_grad(h);
    k->need[1] = em_requires_grad(weight);
    k->need[2] = bias && em_requires_grad(bias);
    bool want_grad = em_is_grad_enabled() && (k->need[0] || k->need[1] || k->need[2]);
    k->reduction = o.reduction;
    k->smoothing = o.label_smoothing;
    /* 'mean' over no counted row: the loss is NaN (0 / 0) and the gradients zero */
    k->share = o.reduction == EM_REDUCTION_SUM ? 1.0 : counted ? 1.0 / (double)counted : 0.0;
    /* the divided sum's gradient is 1 / divisor a row, as a division's backward gives it */
    if (o.divisor > 0.0) k->share = 1.0 / o.divisor;
    k->chunk = o.chunk_size > 0 ? o.chunk_size : default_chunk(n, hd, v);
    k->acc = low_precision(dt) ? EM_F32 : dt;
    em_opts acc = EM_OPTS(.dtype = k->acc, .device = dev);

    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    k->h = em_retain(em_detach(h));
    k->w = em_retain(em_detach(weight));
    k->b = bias ? em_retain(em_detach(bias)) : NULL;
    k->target = em_retain(em_from_data(cls, EM_I64, EM_SHAPE(n), EM_OPTS(.dtype = EM_I64, .device = dev)));
    k->valid = em_retain(em_from_data(valid, EM_F64, EM_SHAPE(n), acc));
    free(cls);
    free(valid);
    em_tensor *loss_rows = em_zeros(EM_SHAPE(n), acc), *rowscale = NULL, *gw = NULL, *gb = NULL;
    bool early = want_grad && o.reduction != EM_REDUCTION_NONE;
    if (early && !em_failed()) {
        rowscale = em_mul_scalar(k->valid, k->share);
        if (k->need[0]) k->gh = em_retain(em_empty(em_shape_of(h), EM_OPTS(.dtype = dt, .device = dev)));
        if (k->need[1]) gw = em_zeros(EM_SHAPE(v, hd), acc);
        if (k->need[2]) gb = em_zeros(EM_SHAPE(v), acc);
    }
    if (!em_failed()) lce_chunks(k, loss_rows, rowscale, k->gh, gw, gb);
    if (early && !em_failed()) {
        if (gw) k->gw = em_retain(low_precision(dt) ? em_to_dtype(gw, dt) : gw);
        if (gb) k->gb = em_retain(low_precision(dt) ? em_to_dtype(gb, dt) : gb);
    }
    em_tensor *loss = NULL;
    if (!em_failed()) {
        if (o.reduction == EM_REDUCTION_NONE) loss = loss_rows;
        else {
            loss = em_sum(loss_rows, EM_ALL_DIMS, false);
            if (o.reduction == EM_REDUCTION_MEAN) loss = em_div_scalar(loss, (double)counted);
            else if (o.divisor > 0.0) loss = em_div_scalar(loss, o.divisor);
        }
    }
    em_no_grad_end(mode);
    if (em_failed()) loss = NULL;
    if (loss) em_retain(loss);
    em_status st = EM_OK;
    if (loss && want_grad) {
        em_tensor *in[3] = {h, weight, bias};
        st = em__grad_record_custom(&LCE_GRAD, k, loss, 3, in); /* owns k now */
    } else
        lce_destroy(k);
    em_scope_end(s);
    if (st != EM_OK) {
        em_release(loss);
        return NULL;
    }
    return loss ? em__scoped(loss) : NULL;
}
