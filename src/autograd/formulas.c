/* Gradient formulas of the pointwise ops, and the dispatch for every node. Formulas use only
 * the public ops API, so they run on every device. They follow PyTorch's derivatives.yaml
 * (ties of maximum/minimum split the gradient, abs'(0) = 0, clamp passes at the bounds). */
#include <math.h>
#include <string.h>
#include <ember/ops.h>
#include "../core/errors.h"
#include "formulas.h"

em_tensor *ag_scalar_like(const em_tensor *like, double v) {
    if (!like) return NULL;
    return em_scalar(v, EM_OPTS(.dtype = em_dtype_of(like), .device = em_device_of(like)));
}

em_tensor *ag_reduce_to(em_tensor *g, int ndim, const int64_t *shape) {
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

em_tensor *ag_finish(em_tensor *g, const ag_input *in) {
    g = ag_reduce_to(g, in->ndim, in->shape);
    if (g && em_dtype_of(g) != in->dtype) g = em_to_dtype(g, in->dtype);
    return g;
}

/* where(cond, x, 0) and where(cond, 0, x) */
static em_tensor *keep_where(em_tensor *cond, em_tensor *x) {
    return em_where(cond, x, ag_scalar_like(x, 0.0));
}
static em_tensor *zero_where(em_tensor *cond, em_tensor *x) {
    return em_where(cond, ag_scalar_like(x, 0.0), x);
}

/* d/dx of exact GELU: Phi(x) + x * phi(x). Phi comes from gelu(x) / x (no public erf);
 * near zero Phi(x) = 1/2 + x / sqrt(2 pi) to 1e-10. */
static em_tensor *gelu_grad(em_tensor *x) {
    const double inv_sqrt_2pi = 0.3989422804014327;
    em_tensor *small = em_lt(em_abs(x), ag_scalar_like(x, 1e-3));
    em_tensor *safe_x = em_where(small, ag_scalar_like(x, 1.0), x);
    em_tensor *cdf = em_where(small, em_add_scalar(em_mul_scalar(x, inv_sqrt_2pi), 0.5),
                              em_div(em_gelu(x), safe_x));
    em_tensor *pdf = em_mul_scalar(em_exp(em_mul_scalar(em_mul(x, x), -0.5)), inv_sqrt_2pi);
    return em_add(cdf, em_mul(x, pdf));
}

/* gradient of max/min-like binary ops: g where this side wins, g/2 on ties */
static em_tensor *tie_split(em_tensor *g, em_tensor *loses, em_tensor *ties) {
    em_tensor *half = em_where(ties, em_mul_scalar(g, 0.5), g);
    return zero_where(loses, half);
}

static void backward_pointwise(ag_node *n, em_tensor *g, em_tensor **out) {
    const double s0 = n->args.s[0], s1 = n->args.s[1];
    em_tensor *a = n->nsaved > 0 ? ag_saved_t(n, 0) : NULL;
    em_tensor *b = n->nsaved > 1 ? ag_saved_t(n, 1) : NULL;
    bool need0 = ag_input_needs(&n->in[0]);
    bool need1 = n->n > 1 && ag_input_needs(&n->in[1]);
    switch (n->op) {
    case EM_GRAD_ADD:
        out[0] = g;
        out[1] = g;
        break;
    case EM_GRAD_SUB:
        out[0] = g;
        if (need1) out[1] = em_neg(g);
        break;
    case EM_GRAD_MUL:
        if (need0) out[0] = em_mul(g, b);
        if (need1) out[1] = em_mul(g, a);
        break;
    case EM_GRAD_DIV:
        if (need0) out[0] = em_div(g, b);
        if (need1) out[1] = em_neg(em_div(em_mul(g, a), em_mul(b, b)));
        break;
    case EM_GRAD_POW: {
        em_tensor *zero = ag_scalar_like(g, 0.0);
        if (need0) { /* exponent == 0 gives 0 even where a^(b-1) is inf */
            em_tensor *d = em_mul(em_mul(g, b), em_pow(a, em_sub_scalar(b, 1.0)));
            out[0] = em_where(em_eq(b, zero), zero, d);
        }
        if (need1) { /* a == 0 with b >= 0: 0 instead of 0 * -inf */
            em_tensor *d = em_mul(g, em_mul(em_pow(a, b), em_log(a)));
            out[1] = em_where(em_eq(a, zero), em_where(em_ge(b, zero), zero, d), d);
        }
        break;
    }
    case EM_GRAD_MAXIMUM:
    case EM_GRAD_MINIMUM: {
        em_tensor *ties = em_eq(a, b);
        bool maxi = n->op == EM_GRAD_MAXIMUM;
        if (need0) out[0] = tie_split(g, maxi ? em_lt(a, b) : em_gt(a, b), ties);
        if (need1) out[1] = tie_split(g, maxi ? em_gt(a, b) : em_lt(a, b), ties);
        break;
    }
    case EM_GRAD_ADD_SCALAR: out[0] = g; break;
    case EM_GRAD_MUL_SCALAR: out[0] = em_mul_scalar(g, s0); break;
    case EM_GRAD_DIV_SCALAR: out[0] = em_div_scalar(g, s0); break;
    case EM_GRAD_RSUB_SCALAR: out[0] = em_neg(g); break;
    case EM_GRAD_POW_SCALAR:
        if (s0 == 0.0)
            out[0] = em_mul_scalar(g, 0.0);
        else
            out[0] = em_mul(em_mul_scalar(g, s0), em_pow_scalar(a, s0 - 1.0));
        break;
    case EM_GRAD_CLAMP:
        out[0] = keep_where(em_ge(a, ag_scalar_like(a, s0)),
                            keep_where(em_le(a, ag_scalar_like(a, s1)), g));
        break;
    case EM_GRAD_NEG: out[0] = em_neg(g); break;
    case EM_GRAD_ABS: {
        em_tensor *zero = ag_scalar_like(a, 0.0);
        out[0] = em_where(em_gt(a, zero), g, keep_where(em_lt(a, zero), em_neg(g)));
        break;
    }
    case EM_GRAD_EXP: out[0] = em_mul(g, a); break; /* a is the saved output */
    case EM_GRAD_LOG: out[0] = em_div(g, a); break;
    case EM_GRAD_SQRT: out[0] = em_div(g, em_mul_scalar(a, 2.0)); break;
    case EM_GRAD_TANH: out[0] = em_mul(g, em_add_scalar(em_neg(em_mul(a, a)), 1.0)); break;
    case EM_GRAD_SIGMOID: out[0] = em_mul(g, em_mul(a, em_add_scalar(em_neg(a), 1.0))); break;
    case EM_GRAD_RELU: out[0] = keep_where(em_gt(a, ag_scalar_like(a, 0.0)), g); break;
    case EM_GRAD_GELU: out[0] = em_mul(g, gelu_grad(a)); break;
    case EM_GRAD_WHERE: /* inputs {cond, a, b}; a is the saved condition */
        if (need1) out[1] = keep_where(a, g);
        if (n->n > 2 && ag_input_needs(&n->in[2])) out[2] = zero_where(a, g);
        break;
    default:
        break;
    }
}

static bool is_pointwise(em_grad_op op) {
    return op <= EM_GRAD_WHERE;
}

em_status ag_node_backward(ag_node *n, em_tensor *g, em_tensor **out) {
    em_tensor *tmp[8] = {0};
    em_tensor **res = n->n <= 8 ? tmp : out; /* out is zeroed by the engine */
    if (is_pointwise(n->op))
        backward_pointwise(n, g, res);
    else
        ag_backward_shape(n, g, res);
    em_status st = EM_OK;
    for (int i = 0; i < n->n; i++) {
        em_tensor *r = NULL;
        if (ag_input_needs(&n->in[i])) {
            r = ag_finish(res[i], &n->in[i]);
            if (!r && st == EM_OK) {
                st = em_failed() ? em_last_status()
                                 : em_error(EM_ERR_INTERNAL, "%s: no gradient computed for input %d",
                                            ag_op_name(n->op), i);
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
