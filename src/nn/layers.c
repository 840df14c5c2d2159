/* The built-in layers: Linear, activations, Dropout, Flatten, Sequential. Forward functions
 * may create temporaries freely: em_forward frees them and keeps the result. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

/* ---- Linear ---- */

typedef struct linear_ctx { int64_t in, out; bool bias; } linear_ctx;

static em_tensor *linear_forward(em_module *m, em_tensor *x) {
    em_tensor *w = m->params[0].t;
    /* a batch of rows with a bias: addmm, as PyTorch's linear (one GEMM adding into the bias) */
    if (m->nparams > 1 && x && em_ndim(x) == 2) return em_addmm(m->params[1].t, x, em_transpose(w, 0, 1), 1.0, 1.0);
    if (x && em_ndim(x) > 2) { /* [..., in] as rows (PyTorch's linear does the same): backward's weight
                                * gradient is one GEMM, not a weight-sized product per batch index summed */
        em_shape s = em_shape_of(x);
        s.d[s.ndim - 1] = em_size(w, 0);
        em_tensor *x2 = em_reshape(x, EM_SHAPE(-1, em_size(x, -1)));
        em_tensor *y2 = m->nparams > 1 ? em_addmm(m->params[1].t, x2, em_transpose(w, 0, 1), 1.0, 1.0)
                                       : em_matmul(x2, em_transpose(w, 0, 1));
        return em_reshape(y2, s);
    }
    em_tensor *y = em_matmul(x, em_transpose(w, 0, 1));
    return m->nparams > 1 ? em_add(y, m->params[1].t) : y;
}

static void linear_describe(const em_module *m, char *buf, size_t size) {
    const linear_ctx *c = m->ctx;
    snprintf(buf, size, "in_features=%lld, out_features=%lld, bias=%s", (long long)c->in,
             (long long)c->out, c->bias ? "True" : "False");
}

static const em_module_ops linear_ops = {
    .name = "Linear", .forward = linear_forward, .describe = linear_describe, .free_ctx = free};

/* U(-bound, bound) from Ember's generator. */
static em_tensor *uniform(em_shape shape, double bound) {
    return em_add_scalar(em_mul_scalar(em_rand(shape, (em_opts){0}), 2.0 * bound), -bound);
}

em_module *em_nn_linear_ex(int64_t in_features, int64_t out_features, bool bias) {
    if (in_features < 0 || out_features < 0) {
        em_error(EM_ERR_ARGUMENT, "em_nn_linear: features must be >= 0, got in=%lld, out=%lld",
                                   (long long)in_features, (long long)out_features);
        return NULL;
    }
    linear_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_nn_linear: out of host memory");
        return NULL;
    }
    *c = (linear_ctx){in_features, out_features, bias};
    em_module *m = em_module_new(&linear_ops, c);
    if (!m) return NULL;
    /* kaiming_uniform(a=sqrt(5)) on the weight and PyTorch's bias init both give this bound */
    double bound = in_features > 0 ? 1.0 / sqrt((double)in_features) : 0.0;
    em_grad_mode g = em_no_grad_begin();
    em_scope s = em_scope_begin();
    em_status st = em_module_add_parameter(m, "weight", uniform(EM_SHAPE(out_features, in_features), bound));
    if (st == EM_OK && bias) st = em_module_add_parameter(m, "bias", uniform(EM_SHAPE(out_features), bound));
    em_scope_end(s);
    em_no_grad_end(g);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_nn_linear(int64_t in_features, int64_t out_features) {
    return em_nn_linear_ex(in_features, out_features, true);
}

/* ---- activations ---- */

static em_tensor *relu_forward(em_module *m, em_tensor *x) { (void)m; return em_relu(x); }
static em_tensor *gelu_forward(em_module *m, em_tensor *x) { (void)m; return em_gelu(x); }
static em_tensor *sigmoid_forward(em_module *m, em_tensor *x) { (void)m; return em_sigmoid(x); }
static em_tensor *tanh_forward(em_module *m, em_tensor *x) { (void)m; return em_tanh(x); }
static em_tensor *flatten_forward(em_module *m, em_tensor *x) { (void)m; return em_flatten(x, 1, -1); }

static const em_module_ops relu_ops = {.name = "ReLU", .forward = relu_forward};
static const em_module_ops gelu_ops = {.name = "GELU", .forward = gelu_forward};
static const em_module_ops sigmoid_ops = {.name = "Sigmoid", .forward = sigmoid_forward};
static const em_module_ops tanh_ops = {.name = "Tanh", .forward = tanh_forward};

static void flatten_describe(const em_module *m, char *buf, size_t size) {
    (void)m;
    snprintf(buf, size, "start_dim=1, end_dim=-1");
}
static const em_module_ops flatten_ops = {
    .name = "Flatten", .forward = flatten_forward, .describe = flatten_describe};

em_module *em_nn_relu(void) { return em_module_new(&relu_ops, NULL); }
em_module *em_nn_gelu(void) { return em_module_new(&gelu_ops, NULL); }
em_module *em_nn_sigmoid(void) { return em_module_new(&sigmoid_ops, NULL); }
em_module *em_nn_tanh(void) { return em_module_new(&tanh_ops, NULL); }
em_module *em_nn_flatten(void) { return em_module_new(&flatten_ops, NULL); }

/* ---- Dropout ---- */

typedef struct dropout_ctx { double p; } dropout_ctx;

static em_tensor *dropout_forward(em_module *m, em_tensor *x) {
    double p = ((dropout_ctx *)m->ctx)->p;
    if (!m->training || p == 0.0) return x;
    if (p == 1.0) return em_mul_scalar(x, 0.0);
    em_opts o = {.dtype = em_dtype_of(x), .device = em_device_of(x)};
    em_tensor *keep = em_lt(em_rand(em_shape_of(x), o), em_scalar(1.0 - p, o));
    em_tensor *mask = em_mul_scalar(em_to_dtype(keep, o.dtype), 1.0 / (1.0 - p));
    return em_mul(x, mask);
}

static void dropout_describe(const em_module *m, char *buf, size_t size) {
    snprintf(buf, size, "p=%g, inplace=False", ((dropout_ctx *)m->ctx)->p);
}
static const em_module_ops dropout_ops = {
    .name = "Dropout", .forward = dropout_forward, .describe = dropout_describe, .free_ctx = free};

em_module *em_nn_dropout(double p) {
    if (!(p >= 0.0 && p <= 1.0)) {
        em_error(EM_ERR_ARGUMENT, "dropout probability has to be between 0 and 1, but got %g", p);
        return NULL;
    }
    dropout_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_nn_dropout: out of host memory");
        return NULL;
    }
    c->p = p;
    return em_module_new(&dropout_ops, c);
}

/* ---- Sequential ---- */

static em_tensor *sequential_forward(em_module *m, em_tensor *x) {
    em_tensor *h = x;
    for (int i = 0; i < m->nkids && h; i++) h = em_forward(m->kids[i].m, h);
    return h;
}

static const em_module_ops sequential_ops = {.name = "Sequential", .forward = sequential_forward};

em_status em_sequential_append(em_module *seq, em_module *m) {
    if (!seq || seq->ops != &sequential_ops) {
        em_module_free(m);
        if (!seq) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_sequential_append: the Sequential is NULL");
        return em_error(EM_ERR_ARGUMENT, "em_sequential_append: not a Sequential module");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->nkids);
    return em_module_add_child(seq, name, m);
}

em_module *em_nn_sequential_n(int n, em_module *const *modules) {
    bool ok = n >= 0 && (n == 0 || modules);
    for (int i = 0; ok && i < n; i++) ok = modules[i] != NULL;
    em_module *seq = ok ? em_module_new(&sequential_ops, NULL) : NULL;
    for (int i = 0; i < n && modules; i++) {
        if (!seq) {
            em_module_free(modules[i]);
        } else if (em_sequential_append(seq, modules[i]) != EM_OK) {
            em_module_free(seq);
            seq = NULL;
        }
    }
    if (!ok && !em_failed())
        em_error(EM_ERR_ARGUMENT, "em_nn_sequential: a module is NULL (its constructor failed)");
    return seq;
}

/* ---- what a module is ---- */

em_module_kind em_module_kind_of(const em_module *m) {
    static const struct { const em_module_ops *ops; em_module_kind kind; } kinds[] = {
        {&sequential_ops, EM_MODULE_SEQUENTIAL}, {&linear_ops, EM_MODULE_LINEAR}, {&relu_ops, EM_MODULE_RELU},
        {&gelu_ops, EM_MODULE_GELU}, {&sigmoid_ops, EM_MODULE_SIGMOID}, {&tanh_ops, EM_MODULE_TANH},
        {&dropout_ops, EM_MODULE_DROPOUT}, {&flatten_ops, EM_MODULE_FLATTEN}};
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_module_kind_of: module is NULL");
        return EM_MODULE_CUSTOM;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (m->ops == kinds[i].ops) return kinds[i].kind;
    return em__nn_conv_kind(m); /* convolution and pooling (conv.c) */
}

const char *em_module_name(const em_module *m) { return m ? m->ops->name : NULL; }

em_status em_module_linear_shape(const em_module *m, int64_t *in_features, int64_t *out_features) {
    if (!m || m->ops != &linear_ops)
        return em_error(EM_ERR_ARGUMENT, "em_module_linear_shape: expected a Linear module, got %s",
                        m ? m->ops->name : "NULL");
    const linear_ctx *c = m->ctx;
    if (in_features) *in_features = c->in;
    if (out_features) *out_features = c->out;
    return EM_OK;
}
