/* Softmax and log-softmax along one dim, numerically stable (the row max is subtracted
 * before exp). f32/f16/bf16 compute in float, f64 in double. Rows are the positions of the
 * other dims; each is gathered into a contiguous buffer unless it already is one. */
#include <math.h>
#include <stdlib.h>
#include "cpu_internal.h"
#include "cpu_vmath.h"

#define STACK_ROW 1024

typedef struct sm_ctx {
    em_dtype dt;
    int64_t len, in_step, out_step; /* row length; element strides along dim, in bytes */
    bool log;
    atomic_bool oom;
} sm_ctx;

/* The sum accumulates in double (f32 rows can be long); log-softmax subtracts the max first
 * so x - max stays exact for large inputs. */
#define SOFTMAX_ROW(SFX, T, EXP, LOG)                                                   \
    static void softmax_row_##SFX(T *y, const T *x, int64_t n, bool lg) {                \
        T m = -INFINITY;                                                                \
        for (int64_t k = 0; k < n; k++) m = x[k] > m ? x[k] : m;                        \
        for (int64_t k = 0; k < n; k++) m = x[k] != x[k] ? x[k] : m; /* NaN row -> NaN */ \
        double s = 0;                                                                   \
        if (lg) {                                                                       \
            for (int64_t k = 0; k < n; k++) s += EXP(x[k] - m);                          \
            T ls = (T)log(s);                                                           \
            for (int64_t k = 0; k < n; k++) y[k] = (x[k] - m) - ls;                     \
        } else {                                                                        \
            for (int64_t k = 0; k < n; k++) { y[k] = EXP(x[k] - m); s += y[k]; }         \
            T inv = (T)(1 / s);                                                         \
            for (int64_t k = 0; k < n; k++) y[k] *= inv;                                \
        }                                                                               \
    }
SOFTMAX_ROW(f64, double, exp, log)
/* f32 rows: the vectorized exp (cpu_vmath.c), the same steps */
static void softmax_row_f32(float *y, const float *x, int64_t n, bool lg) { em__cpu_vsoftmax_row_f32(x, y, n, lg); }

static void softmax_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    sm_ctx *c = arg;
    em_dtype ct = c->dt == EM_F64 ? EM_F64 : EM_F32;
    int64_t es = (int64_t)em_dtype_size(c->dt), cs = (int64_t)em_dtype_size(ct), len = c->len;
    _Alignas(64) unsigned char stack_buf[STACK_ROW * 8 * 2];
    unsigned char *buf = stack_buf;
    bool direct = c->dt == ct && c->in_step == es && c->out_step == es;
    if (!direct && len > STACK_ROW && !(buf = malloc((size_t)(2 * len * cs)))) {
        atomic_store(&c->oom, true);
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        char *o = d[0] + r * st[0];
        const char *i = d[1] + r * st[1];
        if (direct) {
            if (ct == EM_F64) softmax_row_f64((double *)o, (const double *)i, len, c->log);
            else softmax_row_f32((float *)o, (const float *)i, len, c->log);
            continue;
        }
        unsigned char *xb = buf, *yb = buf + len * cs;
        em__cpu_cast_block((char *)xb, cs, ct, i, c->in_step, c->dt, len);
        if (ct == EM_F64) softmax_row_f64((double *)yb, (const double *)xb, len, c->log);
        else softmax_row_f32((float *)yb, (const float *)xb, len, c->log);
        em__cpu_cast_block(o, c->out_step, c->dt, (const char *)yb, cs, ct, len);
    }
    if (buf != stack_buf) free(buf);
}

em_status em__cpu_softmax(em_tensor *out, const em_tensor *in, int dim, bool log) {
    if (!em_dtype_is_floating(in->dtype) || out->dtype != in->dtype)
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: %s is not supported for dtype %s",
                        log ? "log_softmax" : "softmax", em_dtype_name(in->dtype));
    if (in->ndim == 0) { /* a scalar is its own row */
        em_tensor o1 = *out, i1 = *in;
        o1.ndim = i1.ndim = 1;
        o1.shape[0] = i1.shape[0] = 1;
        o1.strides[0] = i1.strides[0] = 1;
        return em__cpu_softmax(&o1, &i1, 0, log);
    }
    if (dim < 0 || dim >= in->ndim)
        return em_error(EM_ERR_INTERNAL, "cpu: softmax dim %d out of range for %d dims", dim, in->ndim);
    int64_t es = (int64_t)em_dtype_size(in->dtype);
    sm_ctx c = {in->dtype, in->shape[dim], in->strides[dim] * es, out->strides[dim] * es, log, false};
    if (c.len == 0 || em__cpu_numel(in) == 0) return EM_OK;
    /* iterate over row starts: the same tensors with dim collapsed to size 1 */
    em_tensor orows = *out, irows = *in;
    orows.shape[dim] = irows.shape[dim] = 1;
    const em_tensor *ts[2] = {&orows, &irows};
    cpu_iter it;
    em__cpu_iter_init(&it, 2, ts, false);
    em__cpu_iter_run(&it, softmax_loop, &c, 2 * (EM_CPU_PARALLEL_ELEMS / (4 * c.len) + 1));
    if (atomic_load(&c.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: softmax: no memory for a row of %lld", (long long)c.len);
    return EM_OK;
}

/* ---- backward in one pass over rows along the last dim (autograd's softmax node) ---- */
typedef struct smb_ctx { const void *g, *y; void *dx; int64_t n; bool log; } smb_ctx;

static void smb_rows(void *arg, int64_t r0, int64_t r1) {
    const smb_ctx *c = arg;
    int64_t n = c->n;
    for (int64_t r = r0; r < r1; r++) {
        em__cpu_vsoftmax_backward_row_f32((const float *)c->g + r * n, (const float *)c->y + r * n, (float *)c->dx + r * n,
                                          n, c->log);
    }
}

static void smb_rows_f64(void *arg, int64_t r0, int64_t r1) {
    const smb_ctx *c = arg;
    int64_t n = c->n;
    for (int64_t r = r0; r < r1; r++) {
        const double *g = (const double *)c->g + r * n, *y = (const double *)c->y + r * n;
        double *dx = (double *)c->dx + r * n, s = 0;
        for (int64_t i = 0; i < n; i++) s += c->log ? g[i] : g[i] * y[i];
        for (int64_t i = 0; i < n; i++) dx[i] = c->log ? g[i] - exp(y[i]) * s : y[i] * (g[i] - s);
    }
}

em_status em__cpu_softmax_backward(const em_op_call *call) {
    em_tensor *dx = call->dst[0];
    const em_tensor *g = call->src[0], *y = call->src[1];
    int64_t n = call->i[0];
    bool log = call->i[1] != 0;
    if ((y->dtype != EM_F32 && y->dtype != EM_F64) || g->dtype != y->dtype || dx->dtype != y->dtype || n <= 0 ||
        em__cpu_numel(y) % n != 0)
        return em_error(EM_ERR_INTERNAL, "cpu: softmax_backward expects f32/f64 operands of one dtype in rows of n > 0");
    smb_ctx c = {em__host_ptr(g), em__host_ptr(y), em__host_ptr(dx), n, log};
    em__cpu_parallel_for(em__cpu_numel(y) / n, EM_CPU_PARALLEL_ELEMS / (4 * n) + 1,
                         y->dtype == EM_F64 ? smb_rows_f64 : smb_rows, &c);
    return EM_OK;
}
