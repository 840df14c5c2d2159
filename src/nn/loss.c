/* Losses with PyTorch's reductions and options: cross entropy (class weights, ignore_index,
 * label smoothing, class-probability targets), NLL, MSE.
 *
 * Class-index targets are read to the host once (they are small: one index per sample):
 * that finds an out-of-range target and names its position, and gives each element its
 * factor, computed in double: the class weight w[t] of its target (0 when the target is
 * ignore_index) and the denominator of the mean, the sum of those weights (PyTorch's
 * nll_loss divides by it, not by the count). The loss itself is public ops, differentiable
 * through their own formulas: log_softmax, a gather of each target's log-probability (its
 * gradient a scatter, no one-hot [N, C] tensor) and, with label smoothing, a sum over the
 * classes. With smoothing eps, PyTorch's loss is (1 - eps) * nll + (eps / C) * smooth with
 * smooth_n = -sum_c w_c log p_nc (0 where ignored), both reduced alike; here each element is
 * l_n = -(1 - eps) w_n log p_n,t + (eps / C) * smooth_n, then reduced once.
 *
 * On a CUDA device the targets are not read to the host (that read waits for the device at
 * every step and cannot be recorded in a graph): the same factors are computed there, in the
 * loss's dtype, with each out-of-range target gathered as class 0 and weighted 0, and the
 * check queued as a device-side flag (em__device_check_queue) that the host reads at its next
 * wait for the device (em_item of the loss, say), which then fails with the same message the
 * host check gives. A device assert, as PyTorch's, without the abort. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "nn_internal.h"

#define DEFAULT_IGNORE_INDEX (-100) /* PyTorch's ignore_index */

static void shape_str(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

static bool same_shape(em_shape a, em_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

static bool check_input(const char *fn, em_tensor *x, em_tensor *target, bool class_dim) {
    if (!x || !target) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, x ? "target" : "input");
        return false;
    }
    if (!em_dtype_is_floating(em_dtype_of(x))) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s", fn, em_dtype_name(em_dtype_of(x)));
        return false;
    }
    if (class_dim && em_ndim(x) < 1) {
        em_error(EM_ERR_SHAPE, "%s: input must have a class dimension (got a 0-d tensor)", fn);
        return false;
    }
    return true;
}

/* The options every loss reads (NULL: PyTorch's defaults), checked. */
static bool read_opts(const char *fn, const em_loss_opts *o, em_loss_opts *out, int64_t *ignore_index) {
    *out = o ? *o : (em_loss_opts){0};
    *ignore_index = out->ignore_index ? *out->ignore_index : DEFAULT_IGNORE_INDEX;
    if ((unsigned)out->reduction > EM_REDUCTION_NONE) {
        em_error(EM_ERR_ARGUMENT, "%s: reduction must be EM_REDUCTION_MEAN, EM_REDUCTION_SUM or EM_REDUCTION_NONE, got %d",
                 fn, (int)out->reduction);
        return false;
    }
    if (!(out->label_smoothing >= 0.0 && out->label_smoothing <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "%s: label_smoothing must be between 0.0 and 1.0. Got: %g", fn, out->label_smoothing);
        return false;
    }
    return true;
}

/* weight [C] (floating, any device) as double on the host; NULL weight: all ones. */
static bool check_weight(const char *fn, em_tensor *weight, int64_t classes) {
    if (!weight) return true;
    if (!em_dtype_is_floating(em_dtype_of(weight))) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating weight, got %s", fn, em_dtype_name(em_dtype_of(weight)));
        return false;
    }
    if (em_ndim(weight) != 1 || em_size(weight, 0) != classes) {
        char s[128];
        shape_str(s, sizeof s, em_shape_of(weight));
        em_error(EM_ERR_SHAPE, "%s: weight tensor should be defined either for all %lld classes or no classes but "
                 "got weight tensor of shape: %s", fn, (long long)classes, s);
        return false;
    }
    return true;
}

static bool read_weight(const char *fn, em_tensor *weight, int64_t classes, double **w) {
    *w = NULL;
    if (!weight) return true;
    if (!check_weight(fn, weight, classes)) return false;
    *w = malloc(sizeof(double) * (size_t)(classes + 1));
    if (!*w) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld class weights", fn, (long long)classes);
        return false;
    }
    em_scope s = em_scope_begin();
    em_status st = em_copy_to_host(em_to_dtype(em_detach(weight), EM_F64), *w, sizeof(double) * (size_t)classes);
    em_scope_end(s);
    if (st != EM_OK) {
        free(*w);
        *w = NULL;
    }
    return st == EM_OK;
}

/* "[3]" or "[3, 4, 1]": the position of flat element i of a tensor of shape s */
static void position_str(char *buf, size_t size, em_shape s, int64_t i) {
    em_shape at = {.ndim = s.ndim};
    for (int d = s.ndim - 1; d >= 0; d--) {
        at.d[d] = s.d[d] ? i % s.d[d] : 0;
        i = s.d[d] ? i / s.d[d] : 0;
    }
    shape_str(buf, size, at);
}

/* What the host makes of class-index targets: the index to gather (0 where ignored), each
 * element's factors and the mean's denominator. Tensors are scoped, on log_p's device and
 * dtype. */
typedef struct class_targets {
    em_tensor *index;     /* int64, target's shape, unsqueezed at the class dim */
    em_tensor *nll_factor;    /* -(1 - eps) * w[t] (0 where ignored) */
    em_tensor *smooth_factor; /* (eps / C) where not ignored, 0 where ignored (NULL without smoothing) */
    double denominator;   /* sum of w[t] over the elements not ignored */
} class_targets;

/* The target's shape is log_p's without the class dim. */
static bool check_target_shape(const char *fn, em_tensor *log_p, em_tensor *target, int cdim) {
    em_shape ls = em_shape_of(log_p), ts = em_shape_of(target);
    em_shape want = {.ndim = ls.ndim - 1};
    for (int i = 0, k = 0; i < ls.ndim; i++)
        if (i != cdim) want.d[k++] = ls.d[i];
    if (!same_shape(ts, want)) {
        char a[128], b[128];
        shape_str(a, sizeof a, want);
        shape_str(b, sizeof b, ts);
        em_error(EM_ERR_SHAPE, "%s: expected target size %s, got %s", fn, a, b);
        return false;
    }
    return true;
}

static bool read_targets(const char *fn, em_tensor *log_p, em_tensor *target, int cdim, const double *w,
                         int64_t ignore_index, double eps, class_targets *ct) {
    *ct = (class_targets){0};
    em_shape ts = em_shape_of(target);
    int64_t classes = em_size(log_p, cdim);
    if (!check_target_shape(fn, log_p, target, cdim)) return false;
    int64_t n = em_numel(target);
    size_t cap = (size_t)(n ? n : 1);
    int64_t *t = malloc(cap * sizeof *t), *index = malloc(cap * sizeof *index);
    double *nll = malloc(cap * sizeof *nll), *smooth = eps > 0 ? malloc(cap * sizeof *smooth) : NULL;
    bool ok = t && index && nll && (eps <= 0 || smooth);
    if (!ok) em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld targets", fn, (long long)n);
    em_scope s = em_scope_begin();
    ok = ok && em_copy_to_host(em_to_dtype(target, EM_I64), t, (size_t)n * sizeof *t) == EM_OK;
    for (int64_t i = 0; ok && i < n; i++) {
        bool ignored = t[i] == ignore_index;
        if (!ignored && (t[i] < 0 || t[i] >= classes)) {
            char at[128];
            position_str(at, sizeof at, ts, i);
            em_error(EM_ERR_ARGUMENT, "%s: Target %lld is out of bounds: target%s must be a class index in [0, %lld) "
                     "or ignore_index (%lld)", fn, (long long)t[i], at, (long long)classes, (long long)ignore_index);
            ok = false;
            break;
        }
        double weight = ignored ? 0.0 : w ? w[t[i]] : 1.0;
        index[i] = ignored ? 0 : t[i];
        nll[i] = -(1.0 - eps) * weight;
        if (smooth) smooth[i] = ignored ? 0.0 : eps / (double)classes;
        ct->denominator += weight;
    }
    em_opts o = {.dtype = EM_I64, .device = em_device_of(log_p)};
    em_opts f = {.dtype = em_dtype_of(log_p), .device = em_device_of(log_p)};
    if (ok) {
        ct->index = em_unsqueeze(em_from_data(index, EM_I64, ts, o), cdim);
        ct->nll_factor = em_from_data(nll, EM_F64, ts, f);
        if (smooth) ct->smooth_factor = em_from_data(smooth, EM_F64, ts, f);
        ok = ct->index && ct->nll_factor && (!smooth || ct->smooth_factor);
    }
    if (ok) {
        em_keep(ct->index);
        em_keep(ct->nll_factor);
        if (ct->smooth_factor) em_keep(ct->smooth_factor);
    }
    em_scope_end(s);
    free(t);
    free(index);
    free(nll);
    free(smooth);
    if (!ok) return false;
    /* handed to the caller's scope, where the loss's other temporaries are */
    em__scoped(ct->index);
    em__scoped(ct->nll_factor);
    if (ct->smooth_factor) em__scoped(ct->smooth_factor);
    return true;
}

/* weight viewed to broadcast along the class dim of log_p: [C] or [1, C, 1, ...] */
static em_tensor *class_view(em_tensor *weight, em_tensor *log_p, int cdim) {
    em_shape v = {.ndim = em_ndim(log_p)};
    for (int i = 0; i < v.ndim; i++) v.d[i] = i == cdim ? em_size(log_p, cdim) : 1;
    em_tensor *w = em_to_device_dtype(em_detach(weight), em_device_of(log_p), em_dtype_of(log_p), false);
    return em_reshape(w, v);
}

static em_tensor *reduce(em_tensor *l, em_reduction r, double denominator) {
    if (r == EM_REDUCTION_NONE) return l;
    em_tensor *total = em_sum(l, EM_ALL_DIMS, false);
    if (r == EM_REDUCTION_SUM) return total;
    if (denominator != 0.0) return em_mul_scalar(total, 1.0 / denominator);
    /* 0 / 0 (every target ignored, or an empty batch): the loss is NaN and the gradient 0, as
     * PyTorch's (each element's factor is 0; a NaN scale would make the gradient NaN) */
    return em_add_scalar(em_mul_scalar(total, 0.0), NAN);
}

static int g_device_targets = -1;   /* em__loss_device_targets */

int em__loss_device_targets(int mode) {
    int was = g_device_targets;
    g_device_targets = mode < 0 ? -1 : mode > 0 ? 1 : 0;
    return was;
}

static bool targets_on_device(em_tensor *log_p) {
    em_device_type t = em_device_of(log_p).type;
    return g_device_targets < 0 ? t == EM_CUDA : g_device_targets > 0 && t != EM_CPU;
}

/* What an out-of-range target's message needs (copied into the device check's record). */
typedef struct target_check {
    const char *fn;               /* a string literal */
    em_shape shape;               /* the target's */
    int64_t classes, ignore_index;
} target_check;

/* numbers: the first bad target's flat position and its value */
static void describe_bad_target(const int64_t numbers[2], const void *ctx, char *buf, size_t size) {
    const target_check *c = ctx;
    char at[128];
    position_str(at, sizeof at, c->shape, numbers[0]);
    snprintf(buf, size, "%s: Target %lld is out of bounds: target%s must be a class index in [0, %lld) or "
             "ignore_index (%lld)", c->fn, (long long)numbers[1], at, (long long)c->classes,
             (long long)c->ignore_index);
}

/* int64 0/1 of a comparison */
static em_tensor *as_i64(em_tensor *b) { return em_to_dtype(b, EM_I64); }

/* read_targets' factors computed on log_p's device, nothing read to the host; the check of the
 * targets' range queued as a device flag. ct->denominator is unused: *denominator is the 0-d
 * sum of the weights, on the device. */
static bool device_targets(const char *fn, em_tensor *log_p, em_tensor *target, int cdim, em_tensor *weight,
                           int64_t ignore_index, double eps, class_targets *ct, em_tensor **denominator) {
    *ct = (class_targets){0};
    if (!check_target_shape(fn, log_p, target, cdim)) return false;
    em_shape ts = em_shape_of(target);
    int64_t classes = em_size(log_p, cdim), n = em_numel(target);
    em_device dev = em_device_of(log_p);
    em_opts io = {.dtype = EM_I64, .device = dev}, fo = {.dtype = em_dtype_of(log_p), .device = dev};
    /* targets kept elsewhere (on the host, say) come to the loss's device, as the host path takes any */
    em_tensor *t = em_to_device_dtype(em_detach(target), dev, EM_I64, false);
    em_tensor *ignored = t ? as_i64(em_eq(t, em_scalar((double)ignore_index, io))) : NULL;
    em_tensor *in_range =
        t ? em_mul(as_i64(em_ge(t, em_scalar(0, io))), as_i64(em_lt(t, em_scalar((double)classes, io)))) : NULL;
    em_tensor *kept = ignored ? em_add_scalar(em_neg(ignored), 1) : NULL;
    em_tensor *valid = em_mul(in_range, kept);                           /* counted */
    em_tensor *bad = kept ? em_mul(em_add_scalar(em_neg(in_range), 1), kept) : NULL;
    em_tensor *index = em_mul(t, valid);                                 /* 0 where not counted */
    if (!index || !bad) return false;
    em__index_mark_in_range(index, classes);
    if (n > 0) {   /* the first bad target: its flat position and value, and how many there are */
        em_tensor *flat_bad = em_reshape(bad, EM_SHAPE(n));
        em_tensor *pos = em_reshape(em_argmax(flat_bad, 0, false), EM_SHAPE(1));
        if (pos) em__index_mark_in_range(pos, n);
        em_tensor *parts[3] = {em_reshape(em_sum(flat_bad, EM_ALL_DIMS, false), EM_SHAPE(1)), pos,
                               pos ? em_gather(em_reshape(t, EM_SHAPE(n)), 0, pos) : NULL};
        em_tensor *found = parts[0] && parts[2] ? em_cat(parts, 3, 0) : NULL;
        target_check c = {.fn = fn, .shape = ts, .classes = classes, .ignore_index = ignore_index};
        if (!found || em__device_check_queue(found, describe_bad_target, &c, sizeof c) != EM_OK) return false;
    }
    em_tensor *w = em_to_dtype(valid, fo.dtype);                          /* w[t], 0 where not counted */
    if (weight) {
        em_tensor *wd = em_to_device_dtype(em_detach(weight), dev, fo.dtype, false);
        em_tensor *flat = em_reshape(index, EM_SHAPE(n));
        w = wd && flat ? em_mul(em_reshape(em_gather(wd, 0, flat), ts), w) : NULL;
    }
    ct->index = em_unsqueeze(index, cdim);
    ct->nll_factor = w ? em_mul_scalar(w, -(1.0 - eps)) : NULL;
    if (eps > 0) ct->smooth_factor = em_mul_scalar(em_to_dtype(valid, fo.dtype), eps / (double)classes);
    *denominator = w ? em_sum(w, EM_ALL_DIMS, false) : NULL;
    return ct->index && ct->nll_factor && (eps <= 0 || ct->smooth_factor) && *denominator;
}

/* reduce()'s mean with the denominator a 0-d tensor on the device: total / den, and NaN with a
 * zero gradient when den is 0 (the host's rule, without reading den) */
static em_tensor *reduce_on_device(em_tensor *l, em_reduction r, em_tensor *den) {
    if (r == EM_REDUCTION_NONE) return l;
    em_tensor *total = em_sum(l, EM_ALL_DIMS, false);
    if (r == EM_REDUCTION_SUM || !total) return total;
    em_opts fo = {.dtype = em_dtype_of(den), .device = em_device_of(den)};
    em_tensor *zero = em_scalar(0, fo);
    em_tensor *counted = em_ne(den, zero);
    em_tensor *scale = em_where(counted, em_div(em_scalar(1, fo), den), zero);
    em_tensor *nan_if_none = em_where(counted, zero, em_scalar(NAN, fo));
    return em_add(em_mul(total, scale), nan_if_none);
}

/* The loss of log-probabilities log_p against class indices. */
static em_tensor *class_index_loss(const char *fn, em_tensor *log_p, em_tensor *target, int cdim,
                                   const em_loss_opts *o, int64_t ignore_index) {
    int64_t classes = em_size(log_p, cdim);
    if (targets_on_device(log_p)) {
        if (!check_weight(fn, o->weight, classes)) return NULL;
        class_targets ct;
        em_tensor *den = NULL;
        if (!device_targets(fn, log_p, target, cdim, o->weight, ignore_index, o->label_smoothing, &ct, &den))
            return NULL;
        em_tensor *l = em_mul(em_reshape(em_gather(log_p, cdim, ct.index), em_shape_of(target)), ct.nll_factor);
        if (ct.smooth_factor) {
            em_tensor *weighted = o->weight ? em_mul(log_p, class_view(o->weight, log_p, cdim)) : log_p;
            l = em_add(l, em_mul(em_neg(em_sum(weighted, EM_DIMS(cdim), false)), ct.smooth_factor));
        }
        return l ? reduce_on_device(l, o->reduction, den) : NULL;
    }
    double *w = NULL;
    if (!read_weight(fn, o->weight, classes, &w)) return NULL;
    class_targets ct;
    bool ok = read_targets(fn, log_p, target, cdim, w, ignore_index, o->label_smoothing, &ct);
    free(w);
    if (!ok) return NULL;
    em_shape ts = em_shape_of(target);
    em_tensor *picked = em_reshape(em_gather(log_p, cdim, ct.index), ts);
    em_tensor *l = em_mul(picked, ct.nll_factor);
    if (ct.smooth_factor) {
        em_tensor *weighted = o->weight ? em_mul(log_p, class_view(o->weight, log_p, cdim)) : log_p;
        em_tensor *smooth = em_neg(em_sum(weighted, EM_DIMS(cdim), false));
        l = em_add(l, em_mul(smooth, ct.smooth_factor));
    }
    return reduce(l, o->reduction, ct.denominator);
}

/* The loss of log_p against class probabilities q (target's shape = input's). */
static em_tensor *class_prob_loss(const char *fn, em_tensor *log_p, em_tensor *target, int cdim,
                                  const em_loss_opts *o, int64_t ignore_index) {
    if (!same_shape(em_shape_of(target), em_shape_of(log_p))) {
        char a[128], b[128];
        shape_str(a, sizeof a, em_shape_of(log_p));
        shape_str(b, sizeof b, em_shape_of(target));
        em_error(EM_ERR_SHAPE, "%s: probability targets must have the input's shape %s, got %s", fn, a, b);
        return NULL;
    }
    if (ignore_index >= 0) {
        em_error(EM_ERR_ARGUMENT, "%s: ignore_index is not supported for floating point target (got ignore_index %lld)",
                 fn, (long long)ignore_index);
        return NULL;
    }
    int64_t classes = em_size(log_p, cdim);
    if (o->weight) {
        double *w = NULL;
        if (!read_weight(fn, o->weight, classes, &w)) return NULL;
        free(w);
    }
    em_tensor *q = em_to_dtype(target, em_dtype_of(log_p));
    double eps = o->label_smoothing;
    if (eps > 0.0) q = em_add_scalar(em_mul_scalar(q, 1.0 - eps), eps / (double)classes);
    em_tensor *prod = em_mul(log_p, q);
    if (o->weight) prod = em_mul(prod, class_view(o->weight, log_p, cdim));
    em_tensor *l = em_neg(em_sum(prod, EM_DIMS(cdim), false));
    /* PyTorch's mean here divides by the number of samples, not by the weights */
    double rows = classes > 0 ? (double)em_numel(log_p) / (double)classes : 0.0;
    return reduce(l, o->reduction, rows);
}

em_tensor *em_cross_entropy_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts) {
    const char *fn = "cross_entropy";
    if (!check_input(fn, input, target, true)) return NULL;
    EM_AUTOCAST1(EM_AC_CROSS_ENTROPY, em_cross_entropy_ex(input, target, opts), input);
    em_loss_opts o;
    int64_t ignore_index;
    if (!read_opts(fn, opts, &o, &ignore_index)) return NULL;
    int cdim = em_ndim(input) == 1 ? 0 : 1;
    em_scope s = em_scope_begin();
    em_tensor *log_p = em_log_softmax(input, cdim);
    em_tensor *loss = NULL;
    if (log_p)
        loss = em_dtype_is_floating(em_dtype_of(target)) ? class_prob_loss(fn, log_p, target, cdim, &o, ignore_index)
                                                         : class_index_loss(fn, log_p, target, cdim, &o, ignore_index);
    return em__scope_return(s, loss);
}

em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *target, double label_smoothing) {
    return em_cross_entropy_ex(logits, target, &(em_loss_opts){.label_smoothing = label_smoothing});
}

em_tensor *em_nll_loss_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts) {
    const char *fn = "nll_loss";
    if (!check_input(fn, input, target, true)) return NULL;
    EM_AUTOCAST1(EM_AC_NLL_LOSS, em_nll_loss_ex(input, target, opts), input);
    em_loss_opts o;
    int64_t ignore_index;
    if (!read_opts(fn, opts, &o, &ignore_index)) return NULL;
    if (o.label_smoothing != 0.0) {
        em_error(EM_ERR_ARGUMENT, "%s: takes no label_smoothing (got %g): that is cross_entropy's", fn, o.label_smoothing);
        return NULL;
    }
    if (em_dtype_is_floating(em_dtype_of(target))) {
        em_error(EM_ERR_DTYPE, "%s: expected class indices (an integer target), got %s", fn,
                 em_dtype_name(em_dtype_of(target)));
        return NULL;
    }
    int cdim = em_ndim(input) == 1 ? 0 : 1;
    em_scope s = em_scope_begin();
    em_tensor *loss = class_index_loss(fn, input, target, cdim, &o, ignore_index);
    return em__scope_return(s, loss);
}

em_tensor *em_nll_loss(em_tensor *log_probs, em_tensor *target) { return em_nll_loss_ex(log_probs, target, NULL); }

em_tensor *em_mse_loss_ex(em_tensor *input, em_tensor *target, const em_loss_opts *opts) {
    const char *fn = "mse_loss";
    if (!check_input(fn, input, target, false)) return NULL;
    EM_AUTOCAST2(EM_AC_MSE_LOSS, em_mse_loss_ex(input, target, opts), input, target);
    em_loss_opts o;
    int64_t ignore_index;
    if (!read_opts(fn, opts, &o, &ignore_index)) return NULL;
    if (o.weight || o.ignore_index || o.label_smoothing != 0.0) {
        em_error(EM_ERR_ARGUMENT, "%s: takes only a reduction (weight, ignore_index and label_smoothing are "
                 "cross_entropy's and nll_loss's)", fn);
        return NULL;
    }
    em_scope s = em_scope_begin();
    em_tensor *d = em_sub(input, target);
    em_tensor *l = em_mul(d, d);
    em_tensor *loss = o.reduction == EM_REDUCTION_NONE ? l
                      : o.reduction == EM_REDUCTION_SUM ? em_sum(l, EM_ALL_DIMS, false)
                                                        : em_mean(l, EM_ALL_DIMS, false);
    return em__scope_return(s, loss);
}

em_tensor *em_mse_loss(em_tensor *input, em_tensor *target) { return em_mse_loss_ex(input, target, NULL); }
