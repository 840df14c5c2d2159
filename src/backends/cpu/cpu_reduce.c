/* sum / mean / max / min over any set of dims, argmax / argmin over one dim.
 * Floats accumulate in double (exact max/min, accurate sums), integers in int64 with
 * wrapping sums. NaN propagates through max/min and wins argmax/argmin, as in PyTorch.
 * Two shapes of work:
 *   inner: the reduced dims are the innermost in memory: each output reduces its own run;
 *          long runs are cut into fixed blocks whose partials combine in order, so the result
 *          never depends on the thread count;
 *   outer: a kept dim is innermost (e.g. the sum over the batch of [B, N]): rows of the
 *          input are accumulated into a tile of per-column accumulators. */
#include "cpu_internal.h"
#include <stdatomic.h>
#include <stdlib.h>

#define RBLOCK 32768 /* elements per partial of a long reduction */
#define TILE 4096    /* output columns per tile of an outer reduction (long rows stream well) */
#define CBUF 256     /* conversion buffer */

typedef struct racc { double d; int64_t i, idx; } racc; /* d: float dtypes, i: integer dtypes */

typedef struct red_ctx {
    em_op op;
    em_dtype dt;
    bool isf;                       /* float dtype: accumulate in d */
    const char *in;
    char *out;
    em_dtype out_dt;
    int nk, nr;                     /* kept and reduced dims after dropping size 1 and merging */
    int64_t kshape[EM_MAX_DIMS], kin[EM_MAX_DIMS], kout[EM_MAX_DIMS];
    int64_t rshape[EM_MAX_DIMS], rin[EM_MAX_DIMS];
    int64_t R, O;                   /* reduced elements per output; outputs */
    atomic_bool oom;                /* a worker could not get scratch memory */
} red_ctx;

static bool is_arg(em_op op) { return op == EM_OP_ARGMAX || op == EM_OP_ARGMIN; }

static void acc_init(const red_ctx *c, racc *a) {
    a->idx = -1;
    switch (c->op) {
    case EM_OP_MAX: a->d = -INFINITY; a->i = INT64_MIN; break;
    case EM_OP_MIN: a->d = INFINITY; a->i = INT64_MAX; break;
    default: a->d = 0; a->i = 0; break;
    }
}

/* ---- accumulating a contiguous run of values (f = flat reduced index of v[0]) ---- */
#define ISNAN_F(x) ((x) != (x))
#define ISNAN_I(x) 0
#define ACC_FN(SFX, T, FIELD, SUMT, ISNAN)                                                  \
    static void acc_##SFX(racc *a, em_op op, const T *v, int64_t n, int64_t f) {             \
        switch (op) {                                                                       \
        case EM_OP_SUM: case EM_OP_MEAN: {                                                  \
            SUMT s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                            \
            int64_t k = 0;                                                                  \
            for (; k + 4 <= n; k += 4) {                                                    \
                s0 += (SUMT)v[k]; s1 += (SUMT)v[k + 1]; s2 += (SUMT)v[k + 2]; s3 += (SUMT)v[k + 3]; \
            }                                                                               \
            for (; k < n; k++) s0 += (SUMT)v[k];                                            \
            SUMT cur = (SUMT)a->FIELD;                                                      \
            cur += (s0 + s1) + (s2 + s3);                                                   \
            a->FIELD = (__typeof__(a->FIELD))cur;                                           \
            break;                                                                          \
        }                                                                                   \
        case EM_OP_MAX:                                                                     \
            for (int64_t k = 0; k < n; k++)                                                 \
                if (v[k] > a->FIELD || ISNAN(v[k])) a->FIELD = v[k];                        \
            break;                                                                          \
        case EM_OP_MIN:                                                                     \
            for (int64_t k = 0; k < n; k++)                                                 \
                if (v[k] < a->FIELD || ISNAN(v[k])) a->FIELD = v[k];                        \
            break;                                                                          \
        default: { /* argmax / argmin: the first extreme; the first NaN wins for good */     \
            bool mx = op == EM_OP_ARGMAX;                                                   \
            if (a->idx >= 0 && ISNAN(a->FIELD)) return;                                     \
            for (int64_t k = 0; k < n; k++) {                                               \
                T x = v[k];                                                                 \
                if (a->idx < 0 || (mx ? x > a->FIELD : x < a->FIELD) || ISNAN(x)) {         \
                    a->FIELD = x;                                                           \
                    a->idx = f + k;                                                         \
                    if (ISNAN(x)) return;                                                   \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        }                                                                                   \
    }
ACC_FN(f32, float, d, double, ISNAN_F)
ACC_FN(f64, double, d, double, ISNAN_F)
ACC_FN(i64, int64_t, i, uint64_t, ISNAN_I)

/* b (the later partial) into a. */
static void acc_combine(const red_ctx *c, racc *a, const racc *b) {
    switch (c->op) {
    case EM_OP_SUM: case EM_OP_MEAN:
        a->d += b->d;
        a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
        break;
    case EM_OP_MAX:
        if (!(a->d != a->d) && (b->d > a->d || b->d != b->d)) a->d = b->d;
        if (b->i > a->i) a->i = b->i;
        break;
    case EM_OP_MIN:
        if (!(a->d != a->d) && (b->d < a->d || b->d != b->d)) a->d = b->d;
        if (b->i < a->i) a->i = b->i;
        break;
    default: {
        if (b->idx < 0) return;
        if (a->idx < 0) { *a = *b; return; }
        bool mx = c->op == EM_OP_ARGMAX;
        if (c->isf) {
            if (a->d != a->d) return;
            if (b->d != b->d || (mx ? b->d > a->d : b->d < a->d)) *a = *b;
        } else if (mx ? b->i > a->i : b->i < a->i) {
            *a = *b;
        }
    }
    }
}

/* Accumulate n elements from p (stride bytes), whatever the dtype. */
static void acc_run(const red_ctx *c, racc *a, const char *p, int64_t stride, int64_t n, int64_t f) {
    if (c->dt == EM_F32 && stride == 4) { acc_f32(a, c->op, (const float *)p, n, f); return; }
    if (c->dt == EM_F64 && stride == 8) { acc_f64(a, c->op, (const double *)p, n, f); return; }
    if (c->dt == EM_I64 && stride == 8) { acc_i64(a, c->op, (const int64_t *)p, n, f); return; }
    _Alignas(64) unsigned char buf[CBUF * 8];
    for (int64_t off = 0; off < n; off += CBUF) {
        int64_t m = n - off < CBUF ? n - off : CBUF;
        em__cpu_cast_block((char *)buf, 8, c->isf ? EM_F64 : EM_I64, p + off * stride, stride, c->dt, m);
        if (c->isf) acc_f64(a, c->op, (const double *)buf, m, f + off);
        else acc_i64(a, c->op, (const int64_t *)buf, m, f + off);
    }
}

/* Reduced elements [begin, end) (row-major over the reduced dims) starting from base. */
static void acc_range(const red_ctx *c, racc *a, const char *base, int64_t begin, int64_t end) {
    int nr = c->nr;
    if (nr == 0) { acc_run(c, a, base, 0, end - begin, begin); return; }
    int64_t idx[EM_MAX_DIMS], rem = begin;
    for (int d = nr - 1; d >= 0; d--) { idx[d] = rem % c->rshape[d]; rem /= c->rshape[d]; }
    const char *row = base;
    for (int d = 0; d < nr - 1; d++) row += idx[d] * c->rin[d];
    int64_t pos = begin, j = idx[nr - 1], inner = c->rshape[nr - 1], st = c->rin[nr - 1];
    while (pos < end) {
        int64_t n = inner - j < end - pos ? inner - j : end - pos;
        acc_run(c, a, row + j * st, st, n, pos);
        pos += n;
        j = 0;
        for (int d = nr - 2; d >= 0 && pos < end; d--) {
            row += c->rin[d];
            if (++idx[d] < c->rshape[d]) break;
            row -= c->rshape[d] * c->rin[d];
            idx[d] = 0;
        }
    }
}

/* Byte offsets of output o in the input and in out. */
static void out_offsets(const red_ctx *c, int64_t o, int64_t *in_off, int64_t *out_off) {
    int64_t io = 0, oo = 0;
    for (int d = c->nk - 1; d >= 0; d--) {
        int64_t k = o % c->kshape[d];
        o /= c->kshape[d];
        io += k * c->kin[d];
        oo += k * c->kout[d];
    }
    *in_off = io;
    *out_off = oo;
}

static void store_result(const red_ctx *c, char *dst, const racc *a) {
    if (is_arg(c->op)) {
        int64_t idx = a->idx < 0 ? 0 : a->idx;
        em__cpu_cast_block(dst, 0, c->out_dt, (const char *)&idx, 8, EM_I64, 1);
    } else if (c->isf) {
        double v = c->op == EM_OP_MEAN ? a->d / (double)c->R : a->d;
        em__cpu_cast_block(dst, 0, c->out_dt, (const char *)&v, 8, EM_F64, 1);
    } else {
        em__cpu_cast_block(dst, 0, c->out_dt, (const char *)&a->i, 8, EM_I64, 1);
    }
}

/* One output, its run cut into fixed RBLOCK partials combined in order. */
static void reduce_one(const red_ctx *c, int64_t o) {
    int64_t io, oo;
    out_offsets(c, o, &io, &oo);
    racc a;
    acc_init(c, &a);
    for (int64_t b = 0; b < c->R; b += RBLOCK) {
        racc p;
        acc_init(c, &p);
        acc_range(c, &p, c->in + io, b, b + RBLOCK < c->R ? b + RBLOCK : c->R);
        acc_combine(c, &a, &p);
    }
    store_result(c, c->out + oo, &a);
}

static void inner_outputs(void *arg, int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; o++) reduce_one(arg, o);
}

typedef struct partial_job { const red_ctx *c; const char *base; racc *parts; } partial_job;

static void inner_partials(void *arg, int64_t begin, int64_t end) {
    const partial_job *j = arg;
    for (int64_t b = begin; b < end; b++) {
        acc_init(j->c, &j->parts[b]);
        int64_t e = (b + 1) * RBLOCK < j->c->R ? (b + 1) * RBLOCK : j->c->R;
        acc_range(j->c, &j->parts[b], j->base, b * RBLOCK, e);
    }
}

/* ---- outer reduction: per-column accumulators for a tile of the innermost kept dim ---- */
typedef struct col_state {
    double d[TILE];
    int64_t i[TILE], idx[TILE];
    _Alignas(64) unsigned char conv[TILE * 8]; /* one row converted to double / int64 */
} col_state;

static void col_init(const red_ctx *c, col_state *s, int64_t n) {
    racc a;
    acc_init(c, &a);
    for (int64_t j = 0; j < n; j++) { s->d[j] = a.d; s->i[j] = a.i; s->idx[j] = -1; }
}

/* bf16 bits as a float (exact) */
static inline float bf16_bits(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

/* Fold one row (n values of the tile at reduced index r) into the column state. */
static void col_acc(const red_ctx *c, col_state *s, const char *p, int64_t stride, int64_t n, int64_t r) {
    if (c->dt == EM_F32 && stride == 4 && (c->op == EM_OP_SUM || c->op == EM_OP_MEAN)) {
        const float *restrict x = (const float *)p;
        double *restrict acc = s->d;
        EM_CPU_VLOOP(n, acc[i] += x[i];)
        return;
    }
    /* bf16 rows (a bf16 Linear's bias gradient: the batch summed): the same sums, vectorized
     * rather than one cast call per element (6% of a bf16 step of the seed MLP at batch 1024) */
    if (c->dt == EM_BF16 && stride == 2 && (c->op == EM_OP_SUM || c->op == EM_OP_MEAN)) {
        const uint16_t *restrict x = (const uint16_t *)p;
        double *restrict acc = s->d;
        EM_CPU_VLOOP(n, acc[i] += bf16_bits(x[i]);)
        return;
    }
    unsigned char *buf = s->conv;
    em__cpu_cast_block((char *)buf, 8, c->isf ? EM_F64 : EM_I64, p, stride, c->dt, n);
    const double *restrict xd = (const double *)buf;
    const int64_t *restrict xi = (const int64_t *)buf;
    bool mx = c->op == EM_OP_ARGMAX;
    double *restrict sd = s->d;
    int64_t *restrict si = s->i;
    switch (c->op) {
    case EM_OP_SUM: case EM_OP_MEAN:
        if (c->isf) EM_CPU_VLOOP(n, sd[i] += xd[i];)
        else EM_CPU_VLOOP(n, si[i] = (int64_t)((uint64_t)si[i] + (uint64_t)xi[i]);)
        break;
    case EM_OP_MAX:
        if (c->isf) { for (int64_t j = 0; j < n; j++) if (xd[j] > s->d[j] || xd[j] != xd[j]) s->d[j] = xd[j]; }
        else for (int64_t j = 0; j < n; j++) if (xi[j] > s->i[j]) s->i[j] = xi[j];
        break;
    case EM_OP_MIN:
        if (c->isf) { for (int64_t j = 0; j < n; j++) if (xd[j] < s->d[j] || xd[j] != xd[j]) s->d[j] = xd[j]; }
        else for (int64_t j = 0; j < n; j++) if (xi[j] < s->i[j]) s->i[j] = xi[j];
        break;
    default:
        for (int64_t j = 0; j < n; j++) {
            if (c->isf) {
                double x = xd[j], b = s->d[j];
                if (s->idx[j] >= 0 && b != b) continue;
                if (s->idx[j] < 0 || (mx ? x > b : x < b) || x != x) { s->d[j] = x; s->idx[j] = r; }
            } else {
                int64_t x = xi[j], b = s->i[j];
                if (s->idx[j] < 0 || (mx ? x > b : x < b)) { s->i[j] = x; s->idx[j] = r; }
            }
        }
    }
}

/* Task t = (outer position, tile) of an outer reduction; kept dim nk-1 is the column dim. */
static void outer_tasks(void *arg, int64_t begin, int64_t end) {
    const red_ctx *c = arg;
    int64_t cols = c->kshape[c->nk - 1], ntiles = (cols + TILE - 1) / TILE;
    int64_t cin = c->kin[c->nk - 1], cout = c->kout[c->nk - 1];
    col_state *s = malloc(sizeof *s);
    if (!s) {
        atomic_store(&((red_ctx *)arg)->oom, true);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        int64_t outer = t / ntiles, j0 = (t % ntiles) * TILE, n = cols - j0 < TILE ? cols - j0 : TILE;
        int64_t io, oo;
        out_offsets(c, outer * cols, &io, &oo); /* outer positions are whole rows of columns */
        io += j0 * cin;
        oo += j0 * cout;
        col_init(c, s, n);
        /* walk the reduced space in order, one row of the tile per reduced index */
        int64_t idx[EM_MAX_DIMS] = {0};
        const char *p = c->in + io;
        for (int64_t r = 0; r < c->R; r++) {
            col_acc(c, s, p, cin, n, r);
            for (int d = c->nr - 1; d >= 0; d--) {
                p += c->rin[d];
                if (++idx[d] < c->rshape[d]) break;
                p -= c->rshape[d] * c->rin[d];
                idx[d] = 0;
            }
        }
        for (int64_t j = 0; j < n; j++) {
            racc a = {s->d[j], s->i[j], s->idx[j]};
            store_result(c, c->out + oo + j * cout, &a);
        }
    }
    free(s);
}

/* ---- the column sums of a float32 [rows, cols] matrix (a bias's gradient over a batch of
 * rows): fixed blocks of rows, four rows per pass over the double accumulators, the blocks
 * summed in parallel and combined in order (the result never depends on the thread count) */
#define COLSUM_ROWS 256
typedef struct colsum_job { const red_ctx *c; double *parts; int64_t cols; } colsum_job;

static void colsum_blocks(void *arg, int64_t begin, int64_t end) {
    const colsum_job *j = arg;
    int64_t cols = j->cols, rs = j->c->rin[0], R = j->c->R;
    for (int64_t b = begin; b < end; b++) {
        double *restrict acc = j->parts + b * cols;
        for (int64_t k = 0; k < cols; k++) acc[k] = 0;
        int64_t r = b * COLSUM_ROWS, r1 = r + COLSUM_ROWS < R ? r + COLSUM_ROWS : R;
        for (; r + 4 <= r1; r += 4) {
            const float *restrict x0 = (const float *)(j->c->in + r * rs), *restrict x1 = (const float *)(j->c->in + (r + 1) * rs);
            const float *restrict x2 = (const float *)(j->c->in + (r + 2) * rs), *restrict x3 = (const float *)(j->c->in + (r + 3) * rs);
            EM_CPU_VLOOP(cols, acc[i] += ((double)x0[i] + (double)x1[i]) + ((double)x2[i] + (double)x3[i]);)
        }
        for (; r < r1; r++) {
            const float *restrict x = (const float *)(j->c->in + r * rs);
            EM_CPU_VLOOP(cols, acc[i] += x[i];)
        }
    }
}

/* false: not this case (or no memory for the partials), take the general outer path */
static bool colsum_f32(red_ctx *c) {
    if (c->dt != EM_F32 || (c->op != EM_OP_SUM && c->op != EM_OP_MEAN) || c->nk != 1 || c->nr != 1 || c->kin[0] != 4)
        return false;
    int64_t cols = c->kshape[0], nb = (c->R + COLSUM_ROWS - 1) / COLSUM_ROWS;
    if (nb * cols > ((int64_t)1 << 22)) return false;
    colsum_job j = {c, malloc(sizeof(double) * (size_t)(nb * cols)), cols};
    if (!j.parts) return false;
    em__cpu_parallel_for(nb, EM_CPU_PARALLEL_ELEMS / (COLSUM_ROWS * cols) + 1, colsum_blocks, &j);
    for (int64_t k = 0; k < cols; k++) {
        racc a = {0, 0, -1};
        for (int64_t b = 0; b < nb; b++) a.d += j.parts[b * cols + k];
        store_result(c, c->out + k * c->kout[0], &a);
    }
    free(j.parts);
    return true;
}

/* Sort dims (indices into the tensor) by |in stride|, outermost first, then merge neighbours. */
static int merge_dims(const em_tensor *in, const em_tensor *out, const int *dims, int n, int64_t *shape,
                      int64_t *sin, int64_t *sout, bool sort) {
    int perm[EM_MAX_DIMS];
    for (int i = 0; i < n; i++) perm[i] = dims[i];
    for (int i = 1; sort && i < n; i++) {
        int d = perm[i], j = i;
        while (j > 0 && in->strides[perm[j - 1]] < in->strides[d]) { perm[j] = perm[j - 1]; j--; }
        perm[j] = d;
    }
    int64_t ies = (int64_t)em_dtype_size(in->dtype), oes = out ? (int64_t)em_dtype_size(out->dtype) : 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        int d = perm[i];
        int64_t si = in->strides[d] * ies, so = out ? out->strides[d] * oes : 0;
        if (m > 0 && sin[m - 1] == in->shape[d] * si && (!out || sout[m - 1] == in->shape[d] * so)) {
            shape[m - 1] *= in->shape[d];
            sin[m - 1] = si;
            if (out) sout[m - 1] = so;
            continue;
        }
        shape[m] = in->shape[d];
        sin[m] = si;
        if (out) sout[m] = so;
        m++;
    }
    return m;
}

em_status em__cpu_reduce(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce) {
    if (op < EM_OP_SUM || op > EM_OP_ARGMIN || !em__op_dtype_ok(op, in->dtype))
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: %s is not supported for dtype %s", em__cpu_op_name(op),
                        em_dtype_name(in->dtype));
    red_ctx c = {.op = op, .dt = in->dtype, .isf = em_dtype_is_floating(in->dtype), .in = em__host_ptr(in),
                 .out = em__host_ptr(out), .out_dt = out->dtype, .R = 1, .O = 1};
    int kd[EM_MAX_DIMS], rd[EM_MAX_DIMS], nk = 0, nr = 0, nreduced = 0;
    for (int d = 0; d < in->ndim; d++) {
        if (reduce[d]) nreduced++;
        if (reduce[d]) c.R *= in->shape[d];
        else c.O *= in->shape[d];
        if (in->shape[d] == 1) continue;
        if (reduce[d]) rd[nr++] = d;
        else kd[nk++] = d;
    }
    if (is_arg(op) && nreduced != 1)
        return em_error(EM_ERR_INTERNAL, "cpu: %s reduces exactly one dim, got %d", em__cpu_op_name(op), nreduced);
    if (c.O == 0) return EM_OK;
    if (c.R == 0 && op != EM_OP_SUM && op != EM_OP_MEAN) {
        int d = 0;
        while (d < in->ndim && !(reduce[d] && in->shape[d] == 0)) d++;
        return em_error(EM_ERR_ARGUMENT, "%s(): Expected reduction dim %d to have non-zero size.",
                        em__cpu_op_name(op), d);
    }
    c.nk = merge_dims(in, out, kd, nk, c.kshape, c.kin, c.kout, false);
    c.nr = merge_dims(in, NULL, rd, nr, c.rshape, c.rin, NULL, !is_arg(op));

    /* outer when a kept dim is closer to contiguous than every reduced dim */
    bool outer = c.nk > 0 && c.nr > 0 && c.R > 1 && c.kin[c.nk - 1] < c.rin[c.nr - 1] && c.kshape[c.nk - 1] >= 4;
    if (outer && colsum_f32(&c)) return EM_OK;
    if (outer) {
        int64_t ntiles = (c.kshape[c.nk - 1] + TILE - 1) / TILE, tasks = c.O / c.kshape[c.nk - 1] * ntiles;
        int64_t per_task = c.R * (c.kshape[c.nk - 1] < TILE ? c.kshape[c.nk - 1] : TILE);
        em__cpu_parallel_for(tasks, EM_CPU_PARALLEL_ELEMS / per_task + 1, outer_tasks, &c);
        if (atomic_load(&c.oom)) return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: %s: no memory for scratch", em__cpu_op_name(op));
    } else if (c.O > 1 || c.R <= RBLOCK) {
        em__cpu_parallel_for(c.O, EM_CPU_PARALLEL_ELEMS / (c.R + 1) + 1, inner_outputs, &c);
    } else { /* one long reduction: fixed partials in parallel, combined in order */
        int64_t nb = (c.R + RBLOCK - 1) / RBLOCK;
        racc *parts = malloc(sizeof(racc) * (size_t)nb);
        if (!parts) return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: %s: no memory for %lld partials",
                                    em__cpu_op_name(op), (long long)nb);
        partial_job j = {&c, c.in, parts};
        em__cpu_parallel_for(nb, EM_CPU_PARALLEL_ELEMS / RBLOCK, inner_partials, &j);
        racc a;
        acc_init(&c, &a);
        for (int64_t b = 0; b < nb; b++) acc_combine(&c, &a, &parts[b]);
        store_result(&c, c.out, &a);
        free(parts);
    }
    return EM_OK;
}
