/* Convolution and pooling layers: Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, with
 * PyTorch's parameter names (weight, bias), default init and reprs. A shape error from the
 * op comes back prefixed with the layer's repr (em_forward does that for every layer), so
 * it names the layer as well as the shapes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/nn.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

typedef struct conv_ctx {
    int64_t in, out, groups;
    em_hw k, stride, padding, dilation;
    bool bias;
} conv_ctx;

typedef struct pool_ctx {
    em_hw k, stride, padding, dilation;
    bool ceil_mode, count_include_pad;
    int64_t divisor;
} pool_ctx;

/* "(2, 3)", or "2" when both are equal and the layer takes a plain int */
static void hw_str(char *buf, size_t n, em_hw v, bool tuple) {
    if (!tuple && v.h == v.w) snprintf(buf, n, "%lld", (long long)v.h);
    else snprintf(buf, n, "(%lld, %lld)", (long long)v.h, (long long)v.w);
}

static em_tensor *conv_forward(em_module *m, em_tensor *x) {
    const conv_ctx *c = m->ctx;
    return em_conv2d(x, m->params[0].t, c->bias ? m->params[1].t : NULL, c->stride, c->padding, c->dilation,
                     c->groups);
}

static void conv_describe(const em_module *m, char *buf, size_t size) {
    const conv_ctx *c = m->ctx;
    char k[48], s[48], p[48], d[48];
    hw_str(k, sizeof k, c->k, true);
    hw_str(s, sizeof s, c->stride, true);
    hw_str(p, sizeof p, c->padding, true);
    hw_str(d, sizeof d, c->dilation, true);
    int n = snprintf(buf, size, "%lld, %lld, kernel_size=%s, stride=%s", (long long)c->in, (long long)c->out, k, s);
    /* PyTorch's extra_repr leaves out what is at its default */
    if (n >= 0 && (size_t)n < size && (c->padding.h || c->padding.w)) n += snprintf(buf + n, size - (size_t)n, ", padding=%s", p);
    if (n >= 0 && (size_t)n < size && (c->dilation.h != 1 || c->dilation.w != 1))
        n += snprintf(buf + n, size - (size_t)n, ", dilation=%s", d);
    if (n >= 0 && (size_t)n < size && c->groups != 1)
        n += snprintf(buf + n, size - (size_t)n, ", groups=%lld", (long long)c->groups);
    if (n >= 0 && (size_t)n < size && !c->bias) snprintf(buf + n, size - (size_t)n, ", bias=False");
}

static const em_module_ops conv_ops = {.name = "Conv2d", .forward = conv_forward, .describe = conv_describe,
                                       .free_ctx = free};

static em_tensor *uniform(em_shape shape, double bound) {
    return em_add_scalar(em_mul_scalar(em_rand(shape, (em_opts){0}), 2.0 * bound), -bound);
}

em_module *em_nn_conv2d_ex(int64_t in_channels, int64_t out_channels, em_hw kernel_size, em_hw stride,
                               em_hw padding, em_hw dilation, int64_t groups, bool bias) {
    const char *bad = NULL;
    if (in_channels <= 0 || out_channels <= 0) bad = "in_channels and out_channels must be positive";
    else if (groups <= 0) bad = "groups must be a positive integer";
    else if (in_channels % groups || out_channels % groups) bad = "in_channels and out_channels must be divisible by groups";
    else if (kernel_size.h <= 0 || kernel_size.w <= 0) bad = "kernel_size must be positive";
    else if (stride.h <= 0 || stride.w <= 0) bad = "stride must be positive";
    else if (padding.h < 0 || padding.w < 0) bad = "padding must be non-negative";
    else if (dilation.h <= 0 || dilation.w <= 0) bad = "dilation must be positive";
    if (bad) {
        em_error(EM_ERR_ARGUMENT, "Conv2d(%lld, %lld, kernel_size=(%lld, %lld), stride=(%lld, %lld), padding=(%lld, %lld), "
                     "dilation=(%lld, %lld), groups=%lld): %s", (long long)in_channels, (long long)out_channels,
                     (long long)kernel_size.h, (long long)kernel_size.w, (long long)stride.h, (long long)stride.w,
                     (long long)padding.h, (long long)padding.w, (long long)dilation.h, (long long)dilation.w,
                     (long long)groups, bad);
        return NULL;
    }
    conv_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_nn_conv2d: out of host memory");
        return NULL;
    }
    *c = (conv_ctx){in_channels, out_channels, groups, kernel_size, stride, padding, dilation, bias};
    em_module *m = em_module_new(&conv_ops, c);
    if (!m) return NULL;
    /* kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as does the bias */
    int64_t fan_in = in_channels / groups * kernel_size.h * kernel_size.w;
    double bound = 1.0 / sqrt((double)fan_in);
    em_grad_mode g = em_no_grad_begin();
    em_scope s = em_scope_begin();
    em_status st = em_module_add_parameter(
        m, "weight", uniform(EM_SHAPE(out_channels, in_channels / groups, kernel_size.h, kernel_size.w), bound));
    if (st == EM_OK && bias) st = em_module_add_parameter(m, "bias", uniform(EM_SHAPE(out_channels), bound));
    em_scope_end(s);
    em_no_grad_end(g);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_nn_conv2d(int64_t in_channels, int64_t out_channels, em_hw kernel_size) {
    return em_nn_conv2d_ex(in_channels, out_channels, kernel_size, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1, true);
}

/* ---- pools ---- */

static em_tensor *max_pool_forward(em_module *m, em_tensor *x) {
    const pool_ctx *c = m->ctx;
    return em_max_pool2d(x, c->k, c->stride, c->padding, c->dilation, c->ceil_mode);
}

static em_tensor *avg_pool_forward(em_module *m, em_tensor *x) {
    const pool_ctx *c = m->ctx;
    return em_avg_pool2d(x, c->k, c->stride, c->padding, c->ceil_mode, c->count_include_pad, c->divisor);
}

static em_tensor *adaptive_forward(em_module *m, em_tensor *x) {
    const pool_ctx *c = m->ctx;
    return em_adaptive_avg_pool2d(x, c->k);
}

static void max_pool_describe(const em_module *m, char *buf, size_t size) {
    const pool_ctx *c = m->ctx;
    char k[48], s[48], p[48], d[48];
    hw_str(k, sizeof k, c->k, false);
    hw_str(s, sizeof s, c->stride, false);
    hw_str(p, sizeof p, c->padding, false);
    hw_str(d, sizeof d, c->dilation, false);
    snprintf(buf, size, "kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s", k, s, p, d,
             c->ceil_mode ? "True" : "False");
}

static void avg_pool_describe(const em_module *m, char *buf, size_t size) {
    const pool_ctx *c = m->ctx;
    char k[48], s[48], p[48];
    hw_str(k, sizeof k, c->k, false);
    hw_str(s, sizeof s, c->stride, false);
    hw_str(p, sizeof p, c->padding, false);
    snprintf(buf, size, "kernel_size=%s, stride=%s, padding=%s", k, s, p);
}

static void adaptive_describe(const em_module *m, char *buf, size_t size) {
    const pool_ctx *c = m->ctx;
    char o[48];
    hw_str(o, sizeof o, c->k, true);
    snprintf(buf, size, "output_size=%s", o);
}

static const em_module_ops max_pool_ops = {.name = "MaxPool2d", .forward = max_pool_forward,
                                           .describe = max_pool_describe, .free_ctx = free};
static const em_module_ops avg_pool_ops = {.name = "AvgPool2d", .forward = avg_pool_forward,
                                           .describe = avg_pool_describe, .free_ctx = free};
static const em_module_ops adaptive_ops = {.name = "AdaptiveAvgPool2d", .forward = adaptive_forward,
                                           .describe = adaptive_describe, .free_ctx = free};

static em_module *pool_new(const em_module_ops *ops, pool_ctx v) {
    const char *bad = NULL;
    bool adaptive = ops == &adaptive_ops;
    if (adaptive ? v.k.h < 0 || v.k.w < 0 : v.k.h <= 0 || v.k.w <= 0)
        bad = adaptive ? "output_size must be non-negative" : "kernel_size must be positive";
    else if (v.stride.h < 0 || v.stride.w < 0) bad = "stride must be positive (0 for kernel_size)";
    else if (v.padding.h < 0 || v.padding.w < 0) bad = "padding must be non-negative";
    else if (v.dilation.h <= 0 || v.dilation.w <= 0) bad = "dilation must be positive";
    if (bad) {
        em_error(EM_ERR_ARGUMENT, "%s(%s=(%lld, %lld)): %s", ops->name, adaptive ? "output_size" : "kernel_size",
                     (long long)v.k.h, (long long)v.k.w, bad);
        return NULL;
    }
    if (!adaptive && v.stride.h == 0 && v.stride.w == 0) v.stride = v.k; /* PyTorch's stride=None */
    pool_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", ops->name);
        return NULL;
    }
    *c = v;
    return em_module_new(ops, c);
}

em_module *em_nn_max_pool2d(em_hw kernel_size, em_hw stride, em_hw padding, em_hw dilation, bool ceil_mode) {
    return pool_new(&max_pool_ops, (pool_ctx){.k = kernel_size, .stride = stride, .padding = padding,
                                              .dilation = dilation, .ceil_mode = ceil_mode});
}

em_module *em_nn_avg_pool2d(em_hw kernel_size, em_hw stride, em_hw padding, bool ceil_mode,
                                bool count_include_pad, int64_t divisor_override) {
    return pool_new(&avg_pool_ops, (pool_ctx){.k = kernel_size, .stride = stride, .padding = padding,
                                              .dilation = EM_HW1(1), .ceil_mode = ceil_mode,
                                              .count_include_pad = count_include_pad,
                                              .divisor = divisor_override});
}

em_module *em_nn_adaptive_avg_pool2d(em_hw output_size) {
    return pool_new(&adaptive_ops, (pool_ctx){.k = output_size, .dilation = EM_HW1(1)});
}

/* ---- what a module is (em_module_kind_of asks here for these kinds) ---- */

em_module_kind em__nn_conv_kind(const em_module *m) {
    if (m->ops == &conv_ops) return EM_MODULE_CONV2D;
    if (m->ops == &max_pool_ops) return EM_MODULE_MAX_POOL2D;
    if (m->ops == &avg_pool_ops) return EM_MODULE_AVG_POOL2D;
    if (m->ops == &adaptive_ops) return EM_MODULE_ADAPTIVE_AVG_POOL2D;
    return EM_MODULE_CUSTOM;
}

em_status em_module_conv2d_shape(const em_module *m, int64_t *in_channels, int64_t *out_channels,
                                 em_hw *kernel_size) {
    if (!m || m->ops != &conv_ops)
        return em_error(EM_ERR_ARGUMENT, "em_module_conv2d_shape: expected a Conv2d module, got %s",
                        m ? m->ops->name : "NULL");
    const conv_ctx *c = m->ctx;
    if (in_channels) *in_channels = c->in;
    if (out_channels) *out_channels = c->out;
    if (kernel_size) *kernel_size = c->k;
    return EM_OK;
}
