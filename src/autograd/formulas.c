/* Gradient formulas of the pointwise ops (listed in grad_ops.h, with the helpers they use
 * here), and the dispatch for every node. Formulas use the public ops API, so they run on
 * every device; GELU's takes core's fused kernel (internal_api.h) where the backend has it. */
#include <math.h>
#include <string.h>
#include <ember/ops.h>
#include "../util/errors.h"
#include "../core/internal_api.h"
#include "formulas.h"

em_tensor *em__ag_scalar_like(const em_tensor *like, double v) {
    if (!like) return NULL;
    return em_scalar(v, EM_OPTS(.dtype = em_dtype_of(like), .device = em_device_of(like)));
}

em_tensor *em__ag_reduce_to(em_tensor *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    int lead = em_ndim(g) - ndim;
    if (lead < 0) {
        em_error(EM_ERR_INTERNAL, "autograd: gradient has fewer dims (%d) than its input (%d)",
                 em_ndim(g), ndim);
        return NULL;
    }
    em_dims dims = {0};
    bool only_lead = true;   /* then the sum drops those dims itself: no reshaped view after */
    for (int d = 0; d < em_ndim(g); d++)
        if (d < lead || (shape[d - lead] == 1 && em_size(g, d) != 1)) {
            dims.d[dims.n++] = d;
            only_lead &= d < lead;
        }
    if (dims.n) g = em_sum(g, dims, !only_lead);
    bool same = em_ndim(g) == ndim;
    for (int d = 0; same && d < ndim; d++) same = em_size(g, d) == shape[d];
    if (!same) {
        em_shape s = {.ndim = ndim};
        memcpy(s.d, shape, (size_t)ndim * sizeof *shape);
        g = em_reshape(g, s);
    }
    return g;
}

bool em__ag_grad_widens(const ag_input *in) {
    if (in->dtype != EM_BF16 && in->dtype != EM_F16) return false;
    const ag_node *n = in->node;
    for (int hops = 0; n && !n->custom && n->n == 1 && hops < 8; hops++) {
        const ag_input *src = &n->in[0];
        if (n->op == EM_GRAD_COPY)
            return src->dtype == EM_F32 && src->device.type == in->device.type && src->device.index == in->device.index;
        if ((n->op != EM_GRAD_PERMUTE && n->op != EM_GRAD_VIEW) || src->dtype != in->dtype) return false;
        n = src->node; /* a bf16 leaf (no node) ends the walk: it wants its own dtype */
    }
    return false;
}

em_tensor *em__ag_finish(em_tensor *g, const ag_input *in) {
    g = em__ag_reduce_to(g, in->ndim, in->shape);
    if (g && em_dtype_of(g) != in->dtype && !(em_dtype_of(g) == EM_F32 && em__ag_grad_widens(in)))
        g = em_to_dtype(g, in->dtype);
    return g;
}

/* where(cond, x, 0) and where(cond, 0, x) */
static em_tensor *ag_keep_where(em_tensor *cond, em_tensor *x) {
    return em_where(cond, x, em__ag_scalar_like(x, 0.0));
}
static em_tensor *ag_zero_where(em_tensor *cond, em_tensor *x) {
    return em_where(cond, em__ag_scalar_like(x, 0.0), x);
}

/* d/dx of exact GELU: Phi(x) + x * phi(x). Phi comes from gelu(x) / x (no public erf);
 * near zero Phi(x) = 1/2 + x / sqrt(2 pi) to 1e-10. */
static em_tensor *ag_gelu_grad(em_tensor *x) {
    const double inv_sqrt_2pi = 0.3989422804014327;
    em_tensor *small = em_lt(em_abs(x), em__ag_scalar_like(x, 1e-3));
    em_tensor *safe_x = em_where(small, em__ag_scalar_like(x, 1.0), x);
    em_tensor *cdf = em_where(small, em_add_scalar(em_mul_scalar(x, inv_sqrt_2pi), 0.5),
                              em_div(em_gelu(x), safe_x));
    em_tensor *pdf = em_mul_scalar(em_exp(em_mul_scalar(em_mul(x, x), -0.5)), inv_sqrt_2pi);
    return em_add(cdf, em_mul(x, pdf));
}

/* g * gelu'(x): one kernel where the backend has it (norms, embedding, attention: the
 * transformer's MLP spends its backward here), else the composition above */
static em_tensor *ag_gelu_backward(em_tensor *g, em_tensor *x) {
    unsigned long seq = em__error_seq();
    em_tensor *fused = em__gelu_backward(g, x);
    if (!fused && em__error_seq() != seq) return NULL;   /* it applied and failed (no memory) */
    return fused ? fused : em_mul(g, ag_gelu_grad(x));
}

/* ReLU's: g where the output a > 0; one kernel where the backend has it, else gt and where */
static em_tensor *ag_relu_backward(em_tensor *g, em_tensor *a) {
    unsigned long seq = em__error_seq();
    em_tensor *fused = em__relu_backward(g, a);
    if (!fused && em__error_seq() != seq) return NULL;   /* it applied and failed (no memory) */
    return fused ? fused : ag_keep_where(em_gt(a, em__ag_scalar_like(a, 0.0)), g);
}

/* SwiGLU's silu(a) * b: one kernel for both gradients where the backend has it, else with
 * s = sigmoid(a): db = g a s, da = g b s (1 + a (1 - s)) */
static void ag_swiglu_backward(em_tensor *g, em_tensor *a, em_tensor *b, bool need0, bool need1, em_tensor **out) {
    em_tensor *da, *db;
    em_status st = em__swiglu_backward(g, a, b, &da, &db);
    if (st == EM_OK) {
        if (need0) out[0] = da;
        if (need1) out[1] = db;
        return;
    }
    if (st != EM_ERR_NOT_SUPPORTED) return; /* it applied and failed (no memory) */
    em_tensor *sg = em_sigmoid(a), *gs = em_mul(g, sg);
    if (need1) out[1] = em_mul(gs, a);
    if (need0) out[0] = em_mul(em_mul(gs, b), em_add_scalar(em_mul(a, em_add_scalar(em_neg(sg), 1.0)), 1.0));
}

/* d(a^b): exponent == 0 gives 0 even where a^(b-1) is inf; for b, a == 0 with b >= 0
 * gives 0 instead of 0 * -inf */
static void ag_pow_grad(em_tensor *g, em_tensor *a, em_tensor *b, bool need0, bool need1,
                        em_tensor **out) {
    em_tensor *zero = em__ag_scalar_like(g, 0.0);
    if (need0) {
        em_tensor *d = em_mul(em_mul(g, b), em_pow(a, em_sub_scalar(b, 1.0)));
        out[0] = em_where(em_eq(b, zero), zero, d);
    }
    if (need1) {
        em_tensor *d = em_mul(g, em_mul(em_pow(a, b), em_log(a)));
        out[1] = em_where(em_eq(a, zero), em_where(em_ge(b, zero), zero, d), d);
    }
}

/* gradient of max/min-like binary ops: g where this side wins, g/2 on ties */
static em_tensor *tie_split(em_tensor *g, em_tensor *loses, em_tensor *ties) {
    em_tensor *half = em_where(ties, em_mul_scalar(g, 0.5), g);
    return ag_zero_where(loses, half);
}
static void ag_max_min_grad(em_tensor *g, em_tensor *a, em_tensor *b, bool maxi, bool need0,
                            bool need1, em_tensor **out) {
    em_tensor *ties = em_eq(a, b);
    if (need0) out[0] = tie_split(g, maxi ? em_lt(a, b) : em_gt(a, b), ties);
    if (need1) out[1] = tie_split(g, maxi ? em_gt(a, b) : em_lt(a, b), ties);
}

/* The pointwise formulas of grad_ops.h, one case each. */
#define AG_FORMULA_(NAME, node, saves, ...)                                               \
    case EM_GRAD_##NAME: { __VA_ARGS__ } break;
static void backward_pointwise(ag_node *n, em_tensor *g, em_tensor **out) {
    const double s0 = n->args.s[0], s1 = n->args.s[1];
    em_tensor *a = n->nsaved > 0 ? ag_saved_t(n, 0) : NULL;
    em_tensor *b = n->nsaved > 1 ? ag_saved_t(n, 1) : NULL;
    bool need0 = ag_input_needs(&n->in[0]);
    bool need1 = n->n > 1 && ag_input_needs(&n->in[1]);
    /* not every formula reads them all */
    (void)s0, (void)s1, (void)a, (void)b, (void)need0, (void)need1;
    switch (n->op) {
    EM_GRAD_POINTWISE(AG_FORMULA_)
    default:
        break;
    }
}

#define AG_IS_POINTWISE_(NAME, node, saves, ...) case EM_GRAD_##NAME:
static bool is_pointwise(em_grad_op op) {
    switch (op) {
    EM_GRAD_POINTWISE(AG_IS_POINTWISE_)
        return true;
    default:
        return false;
    }
}

em_status em__ag_node_backward(ag_node *n, em_tensor *g, em_tensor **out) {
    em_tensor *tmp[8] = {0};
    em_tensor **res = n->n <= 8 ? tmp : out; /* out is zeroed by the engine */
    const char *name = n->custom ? n->custom->name : em__ag_op_name(n->op);
    unsigned long seq = em__error_seq(); /* a formula that failed recorded why after this */
    if (n->custom) {
        em_status cs = n->custom->backward(n->custom_ctx, g, n->n, res);
        if (cs != EM_OK) {
            for (int i = 0; i < n->n; i++) out[i] = NULL;
            return em__error_seq() != seq ? em_last_status() : em_error(cs, "%s: backward failed", name);
        }
    }
    else if (is_pointwise(n->op))
        backward_pointwise(n, g, res);
    else
        em__ag_backward_shape(n, g, res);
    em_status st = EM_OK;
    for (int i = 0; i < n->n; i++) {
        em_tensor *r = NULL;
        if (ag_input_needs(&n->in[i])) {
            r = em__ag_finish(res[i], &n->in[i]);
            if (!r && st == EM_OK) {
                st = em__error_seq() != seq ? em_last_status()
                                            : em_error(EM_ERR_INTERNAL, "%s: no gradient computed for input %d",
                                                       name, i);
            }
        }
        out[i] = st == EM_OK && r ? em_retain(r) : NULL;
    }
    if (st != EM_OK)
        for (int i = 0; i < n->n; i++) {
            em_release(out[i]);
            out[i] = NULL;
        }
    return st;
}
