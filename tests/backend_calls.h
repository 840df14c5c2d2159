/* Tests that call a backend directly build its op calls here: one short function per op,
 * with the operands in the op list's order (src/kernels/op_list.h), each running the call
 * through the backend's run as core would after its checks. be_has says whether the
 * backend's supports takes an op in a dtype. */
#ifndef EMBER_TESTS_BACKEND_CALLS_H
#define EMBER_TESTS_BACKEND_CALLS_H

#include "backends/backend.h"

static inline bool be_has(const em_backend *be, em_op op, em_dtype dt) {
    em_op_call c = {.op = op, .dtype = dt};
    return be->supports(&c);
}
static inline em_status be_call(const em_backend *be, em_op_call c) { return be->run(&c); }

static inline em_status be_fill(const em_backend *be, em_tensor *out, double v) {
    return be_call(be, (em_op_call){.op = EM_OP_FILL, .dtype = out->dtype, .dst = {out}, .f = {v}});
}
static inline em_status be_fill_affine(const em_backend *be, em_tensor *out, double start, double step) {
    return be_call(be, (em_op_call){.op = EM_OP_FILL_AFFINE, .dtype = out->dtype, .dst = {out}, .f = {start, step}});
}
static inline em_status be_copy(const em_backend *be, em_tensor *out, const em_tensor *in) {
    return be_call(be, (em_op_call){.op = EM_OP_COPY, .dtype = out->dtype, .dst = {out}, .src = {in}});
}
/* params: NULL, one scalar, or clamp's two */
static inline em_status be_unary(const em_backend *be, em_op op, em_tensor *out, const em_tensor *in,
                                 const double *params) {
    em_op_call c = {.op = op, .dtype = in->dtype, .dst = {out}, .src = {in}};
    if (params) c.f[0] = params[0];
    if (params && op == EM_OP_CLAMP) c.f[1] = params[1];
    return be->run(&c);
}
static inline em_status be_binary(const em_backend *be, em_op op, em_tensor *out, const em_tensor *a,
                                  const em_tensor *b) {
    return be_call(be, (em_op_call){.op = op, .dtype = a->dtype, .dst = {out}, .src = {a, b}});
}
static inline em_status be_where(const em_backend *be, em_tensor *out, const em_tensor *cond, const em_tensor *a,
                                 const em_tensor *b) {
    return be_call(be, (em_op_call){.op = EM_OP_WHERE, .dtype = out->dtype, .dst = {out}, .src = {cond, a, b}});
}
/* reduce[d] for each of in's dims */
static inline em_status be_reduce(const em_backend *be, em_op op, em_tensor *out, const em_tensor *in,
                                  const bool *reduce) {
    int64_t bits = 0;
    for (int d = 0; d < in->ndim; d++)
        if (reduce[d]) bits |= (int64_t)1 << d;
    return be_call(be, (em_op_call){.op = op, .dtype = in->dtype, .dst = {out}, .src = {in}, .i = {bits}});
}
static inline em_status be_matmul(const em_backend *be, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return be_call(be, (em_op_call){.op = EM_OP_MATMUL, .dtype = a->dtype, .dst = {out}, .src = {a, b}});
}
static inline em_status be_matmul_acc(const em_backend *be, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return be_call(be, (em_op_call){.op = EM_OP_MATMUL_ACC, .dtype = a->dtype, .dst = {out}, .src = {a, b}});
}
static inline em_status be_matmul_widen(const em_backend *be, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    return be_call(be, (em_op_call){.op = EM_OP_MATMUL_WIDEN, .dtype = a->dtype, .dst = {out}, .src = {a, b}});
}
static inline em_status be_softmax(const em_backend *be, em_tensor *out, const em_tensor *in, int dim, bool log) {
    return be_call(be, (em_op_call){.op = EM_OP_SOFTMAX, .dtype = in->dtype, .dst = {out}, .src = {in}, .i = {dim, log}});
}
static inline em_status be_index_select(const em_backend *be, em_tensor *out, const em_tensor *in, int dim,
                                        const em_tensor *index) {
    return be_call(be, (em_op_call){.op = EM_OP_INDEX_SELECT, .dtype = in->dtype, .dst = {out}, .src = {in, index},
                                    .i = {dim}});
}
static inline em_status be_index_add(const em_backend *be, em_tensor *out, int dim, const em_tensor *index,
                                     const em_tensor *src) {
    return be_call(be, (em_op_call){.op = EM_OP_INDEX_ADD, .dtype = out->dtype, .dst = {out}, .src = {index, src},
                                    .i = {dim}});
}
static inline em_status be_gather(const em_backend *be, em_tensor *out, const em_tensor *in, int dim,
                                  const em_tensor *index) {
    return be_call(be, (em_op_call){.op = EM_OP_GATHER, .dtype = in->dtype, .dst = {out}, .src = {in, index}, .i = {dim}});
}
static inline em_status be_scatter_add(const em_backend *be, em_tensor *out, int dim, const em_tensor *index,
                                       const em_tensor *src) {
    return be_call(be, (em_op_call){.op = EM_OP_SCATTER_ADD, .dtype = out->dtype, .dst = {out}, .src = {index, src},
                                    .i = {dim}});
}
static inline em_status be_rng(const em_backend *be, em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset,
                               double p0, double p1) {
    return be_call(be, (em_op_call){.op = EM_OP_RNG, .dtype = out->dtype, .dst = {out},
                                    .i = {kind, (int64_t)seed, (int64_t)offset}, .f = {p0, p1}});
}
static inline em_status be_fused_sgd(const em_backend *be, const em_optim_args *a, em_tensor *p, const em_tensor *g,
                                     em_tensor *buf) {
    return be_call(be, (em_op_call){.op = EM_OP_SGD_STEP, .dtype = p->dtype, .dst = {p, buf}, .src = {g}, .arg = a});
}
static inline em_status be_fused_adam(const em_backend *be, const em_optim_args *a, em_tensor *p, const em_tensor *g,
                                      em_tensor *m, em_tensor *v, em_tensor *vmax) {
    return be_call(be, (em_op_call){.op = EM_OP_ADAM_STEP, .dtype = p->dtype, .dst = {p, m, v, vmax}, .src = {g},
                                    .arg = a});
}
static inline em_status be_conv2d(const em_backend *be, em_tensor *out, const em_tensor *in, const em_tensor *w,
                                  const em_tensor *bias, const em_window2d *g, int64_t groups) {
    return be_call(be, (em_op_call){.op = EM_OP_CONV2D, .dtype = in->dtype, .dst = {out}, .src = {in, w, bias},
                                    .i = {groups}, .arg = g});
}
static inline em_status be_conv2d_backward_input(const em_backend *be, em_tensor *gin, const em_tensor *gout,
                                                 const em_tensor *w, const em_window2d *g, int64_t groups) {
    return be_call(be, (em_op_call){.op = EM_OP_CONV2D_BACKWARD_INPUT, .dtype = gout->dtype, .dst = {gin},
                                    .src = {gout, w}, .i = {groups}, .arg = g});
}
static inline em_status be_conv2d_backward_weight(const em_backend *be, em_tensor *gw, const em_tensor *gout,
                                                  const em_tensor *in, const em_window2d *g, int64_t groups) {
    return be_call(be, (em_op_call){.op = EM_OP_CONV2D_BACKWARD_WEIGHT, .dtype = gout->dtype, .dst = {gw},
                                    .src = {gout, in}, .i = {groups}, .arg = g});
}

#endif
