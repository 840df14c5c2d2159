/* Gradient formulas of reductions, matmul, softmax, indexing, joining and views. */
#include <string.h>
#include <ember/ops.h>
#include "../util/errors.h"
#include "../core/internal_api.h"
#include "formulas.h"

em_dims em__ag_reduced_dims(const em_grad_args *args, int ndim) {
    em_dims d = {0};
    for (int i = 0; i < ndim; i++)
        if (args->reduce[i]) d.d[d.n++] = i;
    return d;
}

em_tensor *em__ag_restore_dims(em_tensor *g, const em_grad_args *args, int ndim) {
    if (args->keepdim) return g;
    for (int i = 0; i < ndim; i++) /* increasing order: each insert lands at its final place */
        if (args->reduce[i]) g = em_unsqueeze(g, i);
    return g;
}

static em_shape shape_of_input(const ag_input *in) {
    em_shape s = {.ndim = in->ndim};
    memcpy(s.d, in->shape, (size_t)in->ndim * sizeof in->shape[0]);
    return s;
}

static em_opts opts_like(const em_tensor *g) {
    return EM_OPTS(.dtype = em_dtype_of(g), .device = em_device_of(g));
}

static int wrap(int dim, int ndim) { return dim < 0 ? dim + ndim : dim; }

/* sum, mean, amax, amin */
static void backward_reduce(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    em_shape shape = shape_of_input(in);
    if (n->op == EM_GRAD_SUM || n->op == EM_GRAD_MEAN) {
        if (n->op == EM_GRAD_MEAN) {
            double count = 1;
            for (int i = 0; i < in->ndim; i++)
                if (n->args.reduce[i]) count *= (double)in->shape[i];
            g = em_div_scalar(g, count);
        }
        out[0] = em_expand(em__ag_restore_dims(g, &n->args, in->ndim), shape);
        return;
    }
    /* amax/amin: the gradient is shared evenly by the elements equal to the result */
    em_tensor *a = ag_saved_t(n, 0), *res = em__ag_restore_dims(ag_saved_t(n, 1), &n->args, in->ndim);
    em_tensor *mask = em_to_dtype(em_eq(a, res), em_dtype_of(g));
    em_dims dims = em__ag_reduced_dims(&n->args, in->ndim);
    em_tensor *count = dims.n ? em_sum(mask, dims, true) : mask;
    out[0] = em_mul(mask, em_div(em__ag_restore_dims(g, &n->args, in->ndim), count));
}

/* torch.matmul: 1-d operands become [1, K] / [K, 1]; batch dims broadcast. Each gradient is
 * reduced to the 2-d form of its operand and then given the operand's own shape (right-aligned
 * reduction against a 1-d [K] would sum the wrong dim). */
/* t given the shape of like, without a new view when it has it already */
static em_tensor *shaped_like(em_tensor *t, em_tensor *like) {
    em_shape a = em_shape_of(t), b = em_shape_of(like);
    bool same = t && a.ndim == b.ndim;
    for (int d = 0; same && d < a.ndim; d++) same = a.d[d] == b.d[d];
    return same ? t : em_reshape(t, b);
}

/* b is the transpose of a contiguous matrix (Linear's weight.t()). Read from the strides, not
 * from a transposed view: a view that could not be allocated would choose the other layout
 * and leave the error behind a step that goes on. */
static bool is_transposed_matrix(em_tensor *b) {
    if (!b || em_ndim(b) != 2 || em_is_contiguous(b)) return false;
    int64_t rows = em_size(b, 0), cols = em_size(b, 1);
    return (rows == 1 || em_stride(b, 0) == 1) && (cols == 1 || em_stride(b, 1) == rows);
}

/* x @ y, in float32 when widen (em__ag_grad_widens: the gradient of a float32 tensor's bf16/f16
 * cast) and the backend can: no rounding to bf16 for the cast's backward to undo */
static em_tensor *product(em_tensor *x, em_tensor *y, bool widen) {
    if (widen) {
        unsigned long seq = em__error_seq();
        em_tensor *w = em__matmul_widen(x, y);
        if (w || em__error_seq() != seq) return w; /* done, or it applied and failed */
    }
    return em_matmul(x, y);
}

/* the gradients of a @ b into out[0] (a) and out[1] (b), for those need0 / need1 ask; widen0,
 * widen1: that gradient may be float32 (product) */
static void matmul_grads(em_tensor *a, em_tensor *b, em_tensor *g, bool need0, bool need1, bool widen0, bool widen1,
                         em_tensor **out) {
    int an = em_ndim(a), bn = em_ndim(b);
    em_tensor *a2 = an == 1 ? em_unsqueeze(a, 0) : a;
    em_tensor *b2 = bn == 1 ? em_unsqueeze(b, -1) : b;
    em_tensor *g2 = g;
    if (bn == 1) g2 = em_unsqueeze(g2, -1);
    if (an == 1) g2 = em_unsqueeze(g2, -2);
    if (need0) {
        em_tensor *ga = product(g2, em_transpose(b2, -1, -2), widen0);
        em_shape s2 = em_shape_of(a2);
        out[0] = a2 ? shaped_like(em__ag_reduce_to(ga, s2.ndim, s2.d), a) : NULL;
    }
    if (need1) {
        /* x @ w.t(): w's gradient is g.t() @ x computed in w's own layout, so that it comes
         * out of the transpose's backward contiguous (as PyTorch's linear does) */
        em_tensor *gb = an == 2 && is_transposed_matrix(b)
                            ? em_transpose(product(em_transpose(g2, 0, 1), a2, widen1), 0, 1)
                            : product(em_transpose(a2, -1, -2), g2, widen1);
        em_shape s2 = em_shape_of(b2);
        out[1] = b2 ? shaped_like(em__ag_reduce_to(gb, s2.ndim, s2.d), b) : NULL;
    }
}

static void backward_matmul(ag_node *n, em_tensor *g, em_tensor **out) {
    matmul_grads(ag_saved_t(n, 0), ag_saved_t(n, 1), g, ag_input_needs(&n->in[0]), ag_input_needs(&n->in[1]),
                 em__ag_grad_widens(&n->in[0]), em__ag_grad_widens(&n->in[1]), out);
}

/* addmm: input's gradient is g (the engine sums it back to input's broadcast shape), the
 * matrices' those of matmul */
static void backward_addmm(ag_node *n, em_tensor *g, em_tensor **out) {
    if (ag_input_needs(&n->in[0])) out[0] = g;
    matmul_grads(ag_saved_t(n, 0), ag_saved_t(n, 1), g, ag_input_needs(&n->in[1]), ag_input_needs(&n->in[2]),
                 em__ag_grad_widens(&n->in[1]), em__ag_grad_widens(&n->in[2]), out + 1);
}

static void backward_softmax(ag_node *n, em_tensor *g, em_tensor **out) {
    em_tensor *y = ag_saved_t(n, 0);
    em_dims dim = EM_DIMS(wrap(n->args.dim, em_ndim(y)));
    if (em_ndim(y) == 0) { /* softmax of a 0-d tensor is 1: no gradient flows */
        out[0] = em_mul_scalar(g, 0.0);
        return;
    }
    unsigned long seq = em__error_seq();
    em_tensor *fused = em__softmax_backward(g, y, dim.d[0], n->op == EM_GRAD_LOG_SOFTMAX);
    if (fused) /* one kernel where the backend has it (the attention's [B, H, T, T] scores) */
        out[0] = fused;
    else if (em__error_seq() != seq) /* it applied and failed (no memory): the step fails */
        out[0] = NULL;
    else if (n->op == EM_GRAD_SOFTMAX) /* y * (g - sum(g * y)) */
        out[0] = em_mul(y, em_sub(g, em_sum(em_mul(g, y), dim, true)));
    else /* g - exp(y) * sum(g) */
        out[0] = em_sub(g, em_mul(em_exp(y), em_sum(g, dim, true)));
}

/* r (of a shape no larger than in's) placed in the leading corner of a zero tensor of in's
 * shape; r itself when it has that shape already. */
static em_tensor *in_corner(const ag_input *in, em_tensor *r, em_tensor *g) {
    bool fits = r != NULL && em_ndim(r) == in->ndim;
    for (int d = 0; fits && d < in->ndim; d++) fits = em_size(r, d) == in->shape[d];
    if (!r || fits) return r;
    em_tensor *z = em_zeros(shape_of_input(in), opts_like(g));
    em_tensor *corner = z;
    for (int d = 0; d < in->ndim; d++) corner = em_narrow(corner, d, 0, em_size(r, d));
    return em_copy_(corner, r) == EM_OK ? z : NULL;
}

/* index_select: the gradient of row i goes to row index[i], summed over repeats: an
 * index_add into zeros (deterministic on every backend: repeats are added in order). */
static void backward_index_select(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    if (in->ndim == 0) { /* a 0-d input: g has one element */
        out[0] = em_reshape(em_sum(g, EM_ALL_DIMS, false), EM_SHAPE0);
        return;
    }
    int dim = wrap(n->args.dim, in->ndim);
    em_tensor *z = em_zeros(shape_of_input(in), opts_like(g)); /* added into in place: no second copy */
    out[0] = z && em__index_add_(z, dim, ag_saved_t(n, 0), g) == EM_OK ? z : NULL;
}

/* gather: out[.., j, ..] = a[.., index[.., j, ..], ..]; the gradient is scattered back and
 * summed: scatter_add into zeros. */
static void backward_gather(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    if (in->ndim == 0) {
        out[0] = em_reshape(em_sum(g, EM_ALL_DIMS, false), EM_SHAPE0);
        return;
    }
    int dim = wrap(n->args.dim, in->ndim);
    out[0] = em_scatter_add(em_zeros(shape_of_input(in), opts_like(g)), dim, ag_saved_t(n, 0), g);
}

/* index_add / scatter_add {a, index, src}: a's gradient is g; src's is g read back at the
 * indices (index_select / gather), placed in src's shape. */
static void backward_accumulate(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *src = &n->in[2];
    if (ag_input_needs(&n->in[0])) out[0] = g;
    if (!ag_input_needs(src)) return;
    int dim = wrap(n->args.dim, n->in[0].ndim > 0 ? n->in[0].ndim : 1);
    em_tensor *index = ag_saved_t(n, 0);
    if (n->op == EM_GRAD_INDEX_ADD) {
        out[2] = em_reshape(em_index_select(g, dim, index), shape_of_input(src));
        return;
    }
    if (src->ndim == 0) {
        out[2] = em_reshape(em_gather(g, 0, index), EM_SHAPE0);
        return;
    }
    out[2] = in_corner(src, em_gather(g, dim, index), g);
}

/* fused LayerNorm {x, w, b}: dx from the backward kernel; w's gradient sums g * xhat over
 * the rows, b's sums g */
static void backward_layer_norm(ag_node *n, em_tensor *g, em_tensor **out) {
    int64_t len = n->args.i[0];
    em_tensor *dx, *gxhat;
    if (em__layer_norm_backward(g, ag_saved_t(n, 0), ag_saved_t(n, 1), len, n->args.s[0], &dx, &gxhat) != EM_OK)
        return;
    if (ag_input_needs(&n->in[0])) out[0] = dx;
    if (ag_input_needs(&n->in[1]))
        out[1] = em_reshape(em_sum(em_reshape(gxhat, EM_SHAPE(-1, len)), EM_DIMS(0), false), shape_of_input(&n->in[1]));
    if (ag_input_needs(&n->in[2]))
        out[2] = em_reshape(em_sum(em_reshape(g, EM_SHAPE(-1, len)), EM_DIMS(0), false), shape_of_input(&n->in[2]));
}

/* fused RMSNorm {x, w or NULL}: dx from the backward kernel; w's gradient sums g * xhat
 * (kept in float32 for f16/bf16 x) over the rows, then takes w's dtype */
static void backward_rms_norm(ag_node *n, em_tensor *g, em_tensor **out) {
    int64_t len = n->args.i[0];
    em_tensor *w = ag_saved_t(n, 1);
    bool need_w = n->n > 1 && ag_input_needs(&n->in[1]);
    em_tensor *dx, *gxhat;
    if (em__rms_norm_backward(g, ag_saved_t(n, 0), w, len, n->args.s[0], need_w, &dx, &gxhat) != EM_OK) return;
    if (ag_input_needs(&n->in[0])) out[0] = dx;
    if (need_w)
        out[1] = em_to_dtype(em_reshape(em_sum(em_reshape(gxhat, EM_SHAPE(-1, len)), EM_DIMS(0), false),
                                        shape_of_input(&n->in[1])), n->in[1].dtype);
}

static void backward_cat(ag_node *n, em_tensor *g, em_tensor **out) {
    int dim = wrap(n->args.dim, n->out_ndim);
    int64_t off = 0;
    for (int i = 0; i < n->n; i++) {
        const ag_input *in = &n->in[i];
        if (in->ndim != n->out_ndim) { /* a legacy empty 1-d input took no part */
            if (ag_input_needs(in)) out[i] = em_zeros(shape_of_input(in), opts_like(g));
            continue;
        }
        if (ag_input_needs(in)) out[i] = em_narrow(g, dim, off, in->shape[dim]);
        off += in->shape[dim];
    }
}

static void backward_slice(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    int dim = wrap(n->args.dim, in->ndim);
    int64_t start = n->args.i[0], step = n->args.i[1] > 0 ? n->args.i[1] : 1;
    if (start < 0) start += in->shape[dim];
    if (n->args.i[2]) g = em_unsqueeze(g, dim);
    em_tensor *z = em_zeros(shape_of_input(in), opts_like(g));
    int64_t len = g ? em_size(g, dim) : 0;
    if (len > 0) {
        em_tensor *part = em_slice(z, dim, start, start + (len - 1) * step + 1, step);
        if (em_copy_(part, g) != EM_OK) z = NULL;
    }
    out[0] = z;
}

void em__ag_backward_shape(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    switch (n->op) {
    case EM_GRAD_SUM: case EM_GRAD_MEAN: case EM_GRAD_MAX: case EM_GRAD_MIN:
        backward_reduce(n, g, out);
        break;
    case EM_GRAD_MATMUL: backward_matmul(n, g, out); break;
    case EM_GRAD_ADDMM: backward_addmm(n, g, out); break;
    case EM_GRAD_SOFTMAX: case EM_GRAD_LOG_SOFTMAX: backward_softmax(n, g, out); break;
    case EM_GRAD_INDEX_SELECT: backward_index_select(n, g, out); break;
    case EM_GRAD_GATHER: backward_gather(n, g, out); break;
    case EM_GRAD_INDEX_ADD: case EM_GRAD_SCATTER_ADD: backward_accumulate(n, g, out); break;
    case EM_GRAD_LAYER_NORM: backward_layer_norm(n, g, out); break;
    case EM_GRAD_RMS_NORM: backward_rms_norm(n, g, out); break;
    case EM_GRAD_ROPE: out[0] = em__rope_backward(g, ag_saved_t(n, 0), ag_saved_t(n, 1)); break;
    case EM_GRAD_CAT: backward_cat(n, g, out); break;
    case EM_GRAD_VIEW: out[0] = em_reshape(g, shape_of_input(in)); break;
    case EM_GRAD_PERMUTE: {
        em_dims inv = {.n = in->ndim};
        for (int i = 0; i < in->ndim; i++) inv.d[wrap(n->args.perm[i], in->ndim)] = i;
        out[0] = em_permute(g, inv);
        break;
    }
    case EM_GRAD_SLICE: backward_slice(n, g, out); break;
    case EM_GRAD_EXPAND: out[0] = g; break; /* em__ag_finish sums over the expanded dims */
    case EM_GRAD_COPY: out[0] = em_to_device_dtype(g, in->device, in->dtype, false); break;
    case EM_GRAD_CONV2D: case EM_GRAD_MAX_POOL2D: case EM_GRAD_AVG_POOL2D: case EM_GRAD_ADAPTIVE_AVG_POOL2D:
        em__ag_backward_conv(n, g, out); /* convolution and pooling */
        break;
    default:
        em_error(EM_ERR_INTERNAL, "autograd: no formula for %s", em__ag_op_name(n->op));
        break;
    }
}
