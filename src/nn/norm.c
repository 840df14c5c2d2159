/* LayerNorm and BatchNorm1d/2d, functional and as modules. Written with public ops, so each
 * runs on every backend and its gradient is the composition's (autograd records every op):
 * y = (x - mean) / sqrt(var + eps) * weight + bias, var biased, as PyTorch normalizes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

static void shape_text(char *buf, size_t size, em_shape s) {
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

/* (x - mean) * rsqrt(var + eps) over dims, var biased; *mean_out and *var_out (optional)
 * get the statistics (keepdim). */
static em_tensor *normalize(em_tensor *x, em_dims dims, double eps, em_tensor **mean_out, em_tensor **var_out) {
    em_tensor *mean = em_mean(x, dims, true);
    em_tensor *xc = em_sub(x, mean);
    em_tensor *var = em_mean(em_mul(xc, xc), dims, true);
    if (mean_out) *mean_out = mean;
    if (var_out) *var_out = var;
    return em_mul(xc, em_div(em_ones_like(var), em_sqrt(em_add_scalar(var, eps))));
}

/* ---- LayerNorm ---- */

em_tensor *em_layer_norm(em_tensor *x, em_shape normalized_shape, em_tensor *weight, em_tensor *bias, double eps) {
    const char *fn = "layer_norm";
    if (!x) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: input is NULL", fn);
        return NULL;
    }
    em_shape xs = em_shape_of(x), ns = normalized_shape;
    bool ok = ns.ndim >= 1 && ns.ndim <= xs.ndim;
    for (int i = 0; ok && i < ns.ndim; i++) ok = xs.d[xs.ndim - ns.ndim + i] == ns.d[i];
    if (!ok) {
        char a[160], b[160];
        shape_text(a, sizeof a, ns);
        shape_text(b, sizeof b, xs);
        em_error(EM_ERR_SHAPE, "%s: normalized_shape %s must match the last dims of the input, got input of shape %s",
                 fn, a, b);
        return NULL;
    }
    if (!em_dtype_is_floating(em_dtype_of(x))) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s", fn, em_dtype_name(em_dtype_of(x)));
        return NULL;
    }
    em_tensor *affine[2] = {weight, bias};
    for (int k = 0; k < 2; k++) {
        if (affine[k] && !same_shape(em_shape_of(affine[k]), ns)) {
            char a[160], b[160];
            shape_text(a, sizeof a, ns);
            shape_text(b, sizeof b, em_shape_of(affine[k]));
            em_error(EM_ERR_SHAPE, "%s: %s must have normalized_shape %s, got %s", fn, k ? "bias" : "weight", a, b);
            return NULL;
        }
    }
    em_dims dims = {.n = ns.ndim};
    for (int i = 0; i < ns.ndim; i++) dims.d[i] = xs.ndim - ns.ndim + i;
    int64_t n = 1;
    for (int i = 0; i < ns.ndim; i++) n *= ns.d[i];
    if (em__layer_norm_applies(x, weight, bias, n)) return em__layer_norm(x, n, weight, bias, eps); /* one kernel */
    em_scope s = em_scope_begin();
    em_tensor *y = normalize(x, dims, eps, NULL, NULL);
    if (weight) y = em_mul(y, weight);
    if (bias) y = em_add(y, bias);
    return em__scope_return(s, y);
}

typedef struct ln_ctx { em_shape shape; double eps; bool affine; } ln_ctx;

static em_tensor *ln_forward(em_module *m, em_tensor *x) {
    const ln_ctx *c = m->ctx;
    return em_layer_norm(x, c->shape, c->affine ? m->params[0].t : NULL, c->affine ? m->params[1].t : NULL, c->eps);
}

static void ln_describe(const em_module *m, char *buf, size_t size) {
    const ln_ctx *c = m->ctx;
    char sh[160];
    size_t len = (size_t)snprintf(sh, sizeof sh, "(");
    for (int i = 0; i < c->shape.ndim && len < sizeof sh; i++)
        len += (size_t)snprintf(sh + len, sizeof sh - len, "%lld,%s", (long long)c->shape.d[i],
                                i + 1 < c->shape.ndim ? " " : "");
    if (len < sizeof sh) snprintf(sh + len, sizeof sh - len, ")");
    snprintf(buf, size, "%s, eps=%g, elementwise_affine=%s", sh, c->eps, c->affine ? "True" : "False");
}

static const em_module_ops ln_ops = {.name = "LayerNorm", .forward = ln_forward, .describe = ln_describe,
                                     .free_ctx = free};

/* Registers a new tensor as a parameter (buffer: false) of m; false on failure. */
static bool add_tensor(em_module *m, const char *name, em_tensor *t, bool param) {
    return (param ? em_module_add_parameter(m, name, t) : em_module_add_buffer(m, name, t)) == EM_OK;
}

em_module *em_nn_layer_norm(em_shape normalized_shape, double eps, bool elementwise_affine) {
    const char *fn = "em_nn_layer_norm";
    bool ok = normalized_shape.ndim >= 1 && normalized_shape.ndim <= EM_MAX_DIMS;
    for (int i = 0; ok && i < normalized_shape.ndim; i++) ok = normalized_shape.d[i] > 0;
    if (!ok || !(eps >= 0)) {
        em_error(EM_ERR_ARGUMENT, "%s: normalized_shape needs 1 to %d positive sizes (got %d dims) and "
                                   "eps >= 0 (got %g)", fn, EM_MAX_DIMS, normalized_shape.ndim, eps);
        return NULL;
    }
    ln_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        return NULL;
    }
    *c = (ln_ctx){normalized_shape, eps, elementwise_affine};
    em_module *m = em_module_new(&ln_ops, c);
    if (!m) return NULL;
    em_scope s = em_scope_begin();
    ok = !elementwise_affine || (add_tensor(m, "weight", em_ones(normalized_shape, (em_opts){0}), true) &&
                                 add_tensor(m, "bias", em_zeros(normalized_shape, (em_opts){0}), true));
    em_scope_end(s);
    if (!ok) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- BatchNorm ---- */

em_tensor *em_batch_norm(em_tensor *x, em_tensor *running_mean, em_tensor *running_var, em_tensor *weight,
                         em_tensor *bias, bool training, double momentum, double eps) {
    const char *fn = "batch_norm";
    if (!x) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: input is NULL", fn);
        return NULL;
    }
    em_shape xs = em_shape_of(x);
    char a[160], b[160];
    if (xs.ndim < 2) {
        shape_text(a, sizeof a, xs);
        em_error(EM_ERR_SHAPE, "%s: expected an input of at least 2 dims [N, C, ...], got %s", fn, a);
        return NULL;
    }
    if (!em_dtype_is_floating(em_dtype_of(x))) {
        em_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s", fn, em_dtype_name(em_dtype_of(x)));
        return NULL;
    }
    int64_t channels = xs.d[1];
    em_tensor *per_channel[4] = {running_mean, running_var, weight, bias};
    static const char *const names[4] = {"running_mean", "running_var", "weight", "bias"};
    for (int k = 0; k < 4; k++) {
        if (per_channel[k] && !same_shape(em_shape_of(per_channel[k]), EM_SHAPE(channels))) {
            shape_text(a, sizeof a, xs);
            shape_text(b, sizeof b, em_shape_of(per_channel[k]));
            em_error(EM_ERR_SHAPE, "%s: %s must have shape [%lld] (the channels of input %s), got %s", fn, names[k],
                     (long long)channels, a, b);
            return NULL;
        }
    }
    if (!training && (!running_mean || !running_var)) {
        em_error(EM_ERR_ARGUMENT, "%s: evaluation without batch statistics needs running_mean and running_var", fn);
        return NULL;
    }
    bool batch_stats = training || !running_mean || !running_var;
    int64_t per = em_numel(x) / (channels > 0 ? channels : 1);
    if (batch_stats && per <= 1) {
        shape_text(a, sizeof a, xs);
        em_error(EM_ERR_SHAPE, "%s: Expected more than 1 value per channel when training, got input size %s", fn, a);
        return NULL;
    }
    em_dims dims = {.n = 0};
    for (int i = 0; i < xs.ndim; i++)
        if (i != 1) dims.d[dims.n++] = i;
    em_shape cs = {.ndim = xs.ndim}; /* [1, C, 1, ...]: the per-channel tensors broadcast */
    for (int i = 0; i < xs.ndim; i++) cs.d[i] = i == 1 ? channels : 1;
    em_scope s = em_scope_begin();
    em_tensor *y;
    if (batch_stats) {
        em_tensor *mean, *var;
        y = normalize(x, dims, eps, &mean, &var);
        if (training && running_mean && running_var && y) {
            /* running = (1 - momentum) * running + momentum * batch, the variance unbiased */
            em_grad_mode g = em_no_grad_begin();
            em_tensor *m1 = em_to_dtype(em_reshape(em_detach(mean), EM_SHAPE(channels)), em_dtype_of(running_mean));
            em_tensor *v1 = em_to_dtype(em_mul_scalar(em_reshape(em_detach(var), EM_SHAPE(channels)),
                                                      (double)per / (double)(per - 1)),
                                        em_dtype_of(running_var));
            bool ok = em_mul_scalar_(running_mean, 1.0 - momentum) == EM_OK &&
                      em_add_(running_mean, m1, momentum) == EM_OK &&
                      em_mul_scalar_(running_var, 1.0 - momentum) == EM_OK &&
                      em_add_(running_var, v1, momentum) == EM_OK;
            em_no_grad_end(g);
            if (!ok) y = NULL;
        }
    } else {
        em_tensor *rm = em_reshape(running_mean, cs), *rv = em_reshape(running_var, cs);
        y = em_mul(em_sub(x, rm), em_div(em_ones_like(rv), em_sqrt(em_add_scalar(rv, eps))));
    }
    if (weight) y = em_mul(y, em_reshape(weight, cs));
    if (bias) y = em_add(y, em_reshape(bias, cs));
    return em__scope_return(s, y);
}

typedef struct bn_ctx {
    int kind; /* 1: BatchNorm1d, 2: BatchNorm2d */
    int64_t features;
    double eps, momentum; /* momentum NAN: a cumulative average (PyTorch's momentum=None) */
    bool affine, track;
} bn_ctx;

static em_tensor *bn_forward(em_module *m, em_tensor *x) {
    const bn_ctx *c = m->ctx;
    int nd = x ? em_ndim(x) : 0;
    if (x && (c->kind == 1 ? (nd != 2 && nd != 3) : nd != 4)) {
        char a[160];
        shape_text(a, sizeof a, em_shape_of(x));
        em_error(EM_ERR_SHAPE, "%s: expected %s input, got %s", m->ops->name,
                 c->kind == 1 ? "2D or 3D ([N, C] or [N, C, L])" : "4D ([N, C, H, W])", a);
        return NULL;
    }
    if (x && em_size(x, 1) != c->features) {
        char a[160];
        shape_text(a, sizeof a, em_shape_of(x));
        em_error(EM_ERR_SHAPE, "%s: expected input with %lld channels (dim 1), got input of shape %s", m->ops->name,
                 (long long)c->features, a);
        return NULL;
    }
    em_tensor *w = c->affine ? m->params[0].t : NULL, *b = c->affine ? m->params[1].t : NULL;
    em_tensor *rm = c->track ? m->bufs[0].t : NULL, *rv = c->track ? m->bufs[1].t : NULL;
    double momentum = c->momentum;
    if (m->training && c->track) {
        em_tensor *count = m->bufs[2].t;
        em_grad_mode g = em_no_grad_begin();
        em_status st = em_add_(count, em_ones_like(count), 1.0);
        em_no_grad_end(g);
        if (st != EM_OK) return NULL;
        if (isnan(momentum)) momentum = 1.0 / em_item(count);
    }
    return em_batch_norm(x, rm, rv, w, b, m->training || !c->track, momentum, c->eps);
}

static void bn_describe(const em_module *m, char *buf, size_t size) {
    const bn_ctx *c = m->ctx;
    char mom[32];
    if (isnan(c->momentum)) snprintf(mom, sizeof mom, "None");
    else snprintf(mom, sizeof mom, "%g", c->momentum);
    snprintf(buf, size, "%lld, eps=%g, momentum=%s, affine=%s, track_running_stats=%s", (long long)c->features, c->eps,
             mom, c->affine ? "True" : "False", c->track ? "True" : "False");
}

static const em_module_ops bn1_ops = {.name = "BatchNorm1d", .forward = bn_forward, .describe = bn_describe,
                                      .free_ctx = free};
static const em_module_ops bn2_ops = {.name = "BatchNorm2d", .forward = bn_forward, .describe = bn_describe,
                                      .free_ctx = free};

em_module *em_nn_batch_norm_ex(int spatial_dims, int64_t num_features, double eps, double momentum, bool affine,
                            bool track_running_stats) {
    const char *fn = "em_nn_batch_norm_ex";
    if ((spatial_dims != 1 && spatial_dims != 2) || num_features <= 0 || !(eps >= 0) ||
        !(isnan(momentum) || (momentum >= 0 && momentum <= 1))) {
        em_error(EM_ERR_ARGUMENT, "%s: expected BatchNorm1d or 2d (got %dd), num_features > 0 (got %lld), "
                                   "eps >= 0 (got %g) and momentum in [0, 1] or NAN for None (got %g)", fn,
                                   spatial_dims, (long long)num_features, eps, momentum);
        return NULL;
    }
    bn_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        return NULL;
    }
    *c = (bn_ctx){spatial_dims, num_features, eps, momentum, affine, track_running_stats};
    em_module *m = em_module_new(spatial_dims == 1 ? &bn1_ops : &bn2_ops, c);
    if (!m) return NULL;
    em_scope s = em_scope_begin();
    em_shape sh = EM_SHAPE(num_features);
    bool ok = !affine || (add_tensor(m, "weight", em_ones(sh, (em_opts){0}), true) &&
                          add_tensor(m, "bias", em_zeros(sh, (em_opts){0}), true));
    ok = ok && (!track_running_stats ||
                (add_tensor(m, "running_mean", em_zeros(sh, (em_opts){0}), false) &&
                 add_tensor(m, "running_var", em_ones(sh, (em_opts){0}), false) &&
                 add_tensor(m, "num_batches_tracked", em_zeros(EM_SHAPE0, EM_OPTS(.dtype = EM_I64)), false)));
    em_scope_end(s);
    if (!ok) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_nn_batch_norm1d(int64_t num_features) { return em_nn_batch_norm_ex(1, num_features, 1e-5, 0.1, true, true); }
em_module *em_nn_batch_norm2d(int64_t num_features) { return em_nn_batch_norm_ex(2, num_features, 1e-5, 0.1, true, true); }
