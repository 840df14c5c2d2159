/* Losses with mean reduction: cross entropy (with label smoothing), NLL, MSE. The class
 * targets become one-hot rows so that the loss is -sum(q * log_p) / N: one mul and one sum,
 * differentiable through the ops' own formulas. */
#include <stdio.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "nn_internal.h"

static void shape_str(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* The target distribution q, shaped like log_p, from class indices or probabilities. */
static em_tensor *target_dist(const char *fn, em_tensor *log_p, em_tensor *target, int cdim,
                              double smoothing) {
    em_shape ls = em_shape_of(log_p);
    int64_t classes = ls.d[cdim];
    em_tensor *q;
    if (em_dtype_is_floating(em_dtype_of(target))) {
        em_shape ts = em_shape_of(target);
        bool same = ts.ndim == ls.ndim;
        for (int i = 0; same && i < ls.ndim; i++) same = ts.d[i] == ls.d[i];
        if (!same) {
            char a[128], b[128];
            shape_str(a, sizeof a, ls);
            shape_str(b, sizeof b, ts);
            em_error(EM_ERR_SHAPE, "%s: probability targets must have the input's shape %s, got %s", fn, a, b);
            return NULL;
        }
        q = em_to_dtype(target, em_dtype_of(log_p));
    } else {
        /* indices: target's shape is the input's without the class dim */
        em_shape want = {.ndim = ls.ndim - 1};
        for (int i = 0, k = 0; i < ls.ndim; i++)
            if (i != cdim) want.d[k++] = ls.d[i];
        em_shape ts = em_shape_of(target);
        bool same = ts.ndim == want.ndim;
        for (int i = 0; same && i < want.ndim; i++) same = ts.d[i] == want.d[i];
        if (!same) {
            char a[128], b[128];
            shape_str(a, sizeof a, want);
            shape_str(b, sizeof b, ts);
            em_error(EM_ERR_SHAPE, "%s: expected target size %s, got %s", fn, a, b);
            return NULL;
        }
        q = em_one_hot(em_to_dtype(target, EM_I64), classes);
        if (q && cdim != ls.ndim - 1) { /* [N, d..., C] -> [N, C, d...] */
            em_dims perm = {.n = ls.ndim};
            for (int i = 0; i < ls.ndim; i++)
                perm.d[i] = i < cdim ? i : (i == cdim ? ls.ndim - 1 : i - 1);
            q = em_permute(q, perm);
        }
        q = em_to_dtype(q, em_dtype_of(log_p));
    }
    if (smoothing > 0.0) q = em_add_scalar(em_mul_scalar(q, 1.0 - smoothing), smoothing / (double)classes);
    return q;
}

/* -sum(q * log_p) / (numel / C) */
static em_tensor *soft_nll(const char *fn, em_tensor *log_p, em_tensor *target, int cdim, double smoothing) {
    em_tensor *q = target_dist(fn, log_p, target, cdim, smoothing);
    if (!q) return NULL;
    int64_t classes = em_size(log_p, cdim);
    double rows = classes > 0 ? (double)em_numel(log_p) / (double)classes : 0.0;
    em_tensor *total = em_sum(em_mul(q, log_p), EM_ALL_DIMS, false);
    return em_mul_scalar(total, rows > 0 ? -1.0 / rows : -1.0);
}

static bool check_input(const char *fn, em_tensor *x, em_tensor *target, bool class_dim) {
    if (!x || !target) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, x ? "target" : "input");
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

em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *target, double label_smoothing) {
    const char *fn = "cross_entropy";
    if (!check_input(fn, logits, target, true)) return NULL;
    EM_AUTOCAST1(EM_AC_CROSS_ENTROPY, em_cross_entropy(logits, target, label_smoothing), logits);
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "%s: label_smoothing must be between 0.0 and 1.0. Got: %g", fn, label_smoothing);
        return NULL;
    }
    int cdim = em_ndim(logits) == 1 ? 0 : 1;
    em_scope s = em_scope_begin();
    em_tensor *loss = soft_nll(fn, em_log_softmax(logits, cdim), target, cdim, label_smoothing);
    return em__scope_return(s, loss);
}

em_tensor *em_nll_loss(em_tensor *log_probs, em_tensor *target) {
    const char *fn = "nll_loss";
    if (!check_input(fn, log_probs, target, true)) return NULL;
    EM_AUTOCAST1(EM_AC_NLL_LOSS, em_nll_loss(log_probs, target), log_probs);
    if (em_dtype_is_floating(em_dtype_of(target))) {
        em_error(EM_ERR_DTYPE, "%s: expected class indices (an integer target), got %s", fn,
                 em_dtype_name(em_dtype_of(target)));
        return NULL;
    }
    int cdim = em_ndim(log_probs) == 1 ? 0 : 1;
    em_scope s = em_scope_begin();
    em_tensor *loss = soft_nll(fn, log_probs, target, cdim, 0.0);
    return em__scope_return(s, loss);
}

em_tensor *em_mse_loss(em_tensor *input, em_tensor *target) {
    if (!check_input("mse_loss", input, target, false)) return NULL;
    EM_AUTOCAST2(EM_AC_MSE_LOSS, em_mse_loss(input, target), input, target);
    em_scope s = em_scope_begin();
    em_tensor *d = em_sub(input, target);
    em_tensor *loss = em_mean(em_mul(d, d), EM_ALL_DIMS, false);
    return em__scope_return(s, loss);
}
