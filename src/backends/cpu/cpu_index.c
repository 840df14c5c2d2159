/* index_select, index_add, gather and scatter_add. Slices are views handed to the copy and
 * add kernels; gather and scatter_add walk (out, index, in) together with the iterator, the
 * indexed dim of the third operand given stride 0 so the index supplies it. Indices are
 * checked again here (cheap) so a bad one is an error, never a stray write. */
#include "cpu_internal.h"

static em_status out_of_bounds(const char *op, int64_t idx, int dim, int64_t size) {
    return em_error(EM_ERR_ARGUMENT, "%s(): index %lld is out of bounds for dimension %d with size %lld", op,
                    (long long)idx, dim, (long long)size);
}

static int64_t index_at(const em_tensor *index, int64_t i) {
    return ((const int64_t *)em__host_ptr(index))[i * (index->ndim ? index->strides[0] : 0)];
}

/* t narrowed to position i of dim (size 1 there). */
static em_tensor narrow1(const em_tensor *t, int dim, int64_t i) {
    em_tensor v = *t;
    v.shape[dim] = 1;
    v.offset += i * t->strides[dim];
    return v;
}

typedef struct sel_ctx { em_tensor *out; const em_tensor *in, *index; int dim; } sel_ctx;

static void select_chunk(void *arg, int64_t begin, int64_t end) {
    const sel_ctx *c = arg;
    for (int64_t i = begin; i < end; i++) {
        em_tensor o = narrow1(c->out, c->dim, i), s = narrow1(c->in, c->dim, index_at(c->index, i));
        em__cpu_copy(&o, &s);
    }
}

static em_status check_indices(const char *op, const em_tensor *index, int dim, int64_t size) {
    int64_t n = em__cpu_numel(index);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(index, i);
        if (v < 0 || v >= size) return out_of_bounds(op, v, dim, size);
    }
    return EM_OK;
}

em_status em__cpu_index_select(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index) {
    if (index->dtype != EM_I64 || index->ndim > 1 || out->dtype != in->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: index_select expects a 1-d int64 index and out of in's dtype");
    em_status st = check_indices("index_select", index, dim, in->shape[dim]);
    if (st) return st;
    int64_t n = em__cpu_numel(index), slice = n ? em__cpu_numel(out) / n : 0;
    if (n == 0 || slice == 0) return EM_OK;
    sel_ctx c = {out, in, index, dim};
    em__cpu_parallel_for(n, EM_CPU_PARALLEL_ELEMS / slice + 1, select_chunk, &c);
    return EM_OK;
}

em_status em__cpu_index_add(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src) {
    if (index->dtype != EM_I64 || index->ndim > 1 || out->dtype != src->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: index_add expects a 1-d int64 index and src of out's dtype");
    em_status st = check_indices("index_add", index, dim, out->shape[dim]);
    if (st) return st;
    int64_t n = em__cpu_numel(index);
    /* in order, one slice at a time: repeated indices accumulate */
    for (int64_t i = 0; i < n && st == EM_OK; i++) {
        em_tensor o = narrow1(out, dim, index_at(index, i)), s = narrow1(src, dim, i);
        st = em__cpu_binary(EM_OP_ADD, &o, &o, &s);
    }
    return st;
}

/* ---- gather / scatter_add ---- */
typedef struct gs_ctx {
    em_dtype dt;
    int64_t dim_stride; /* bytes per step of the indexed dim in the indexed tensor */
    int64_t size;       /* that dim's size */
    int dim;
    atomic_bool has_bad;
    int64_t bad;        /* a bad index, written by the thread that set has_bad */
} gs_ctx;

static void note_bad(gs_ctx *c, int64_t v) {
    bool expected = false;
    if (atomic_compare_exchange_strong(&c->has_bad, &expected, true)) c->bad = v;
}

static void gather_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    gs_ctx *c = arg;
    size_t es = em_dtype_size(c->dt);
    for (int64_t k = 0; k < n; k++) {
        int64_t v = *(const int64_t *)(d[1] + k * st[1]);
        if (v < 0 || v >= c->size) {
            note_bad(c, v);
            return;
        }
        memcpy(d[0] + k * st[0], d[2] + k * st[2] + v * c->dim_stride, es);
    }
}

static void scatter_add_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    gs_ctx *c = arg;
    bool fl = em_dtype_is_floating(c->dt);
    for (int64_t k = 0; k < n; k++) {
        int64_t v = *(const int64_t *)(d[1] + k * st[1]);
        if (v < 0 || v >= c->size) {
            note_bad(c, v);
            return;
        }
        char *dst = d[2] + k * st[2] + v * c->dim_stride;
        const char *src = d[0] + k * st[0];
        if (fl)
            em__cpu_store_f64(dst, c->dt, em__cpu_load_f64(dst, c->dt) + em__cpu_load_f64(src, c->dt));
        else
            em__cpu_store_i64(dst, c->dt, (int64_t)((uint64_t)em__cpu_load_i64(dst, c->dt) +
                                                    (uint64_t)em__cpu_load_i64(src, c->dt)));
    }
}

/* A view of t with `like`'s shape, t's strides, and stride 0 on dim (the index supplies it). */
static em_tensor indexed_view(const em_tensor *t, const em_tensor *like, int dim) {
    em_tensor v = *t;
    for (int d = 0; d < t->ndim; d++) v.shape[d] = like->shape[d];
    v.strides[dim] = 0;
    return v;
}

static em_status gs_result(gs_ctx *c, const char *op) {
    if (!atomic_load(&c->has_bad)) return EM_OK;
    return out_of_bounds(op, c->bad, c->dim, c->size);
}

em_status em__cpu_gather(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index) {
    if (index->dtype != EM_I64 || out->dtype != in->dtype || index->ndim != out->ndim || in->ndim != out->ndim)
        return em_error(EM_ERR_INTERNAL, "cpu: gather expects an int64 index of out's shape");
    if (in->ndim == 0) return em__cpu_copy(out, in);
    gs_ctx c = {in->dtype, in->strides[dim] * (int64_t)em_dtype_size(in->dtype), in->shape[dim], dim, false, 0};
    em_tensor src = indexed_view(in, out, dim);
    const em_tensor *ts[3] = {out, index, &src};
    cpu_iter it;
    em__cpu_iter_init(&it, 3, ts, false);
    em__cpu_iter_run(&it, gather_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return gs_result(&c, "gather");
}

em_status em__cpu_scatter_add(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src) {
    if (index->dtype != EM_I64 || out->dtype != src->dtype || index->ndim != src->ndim || out->ndim != src->ndim)
        return em_error(EM_ERR_INTERNAL, "cpu: scatter_add expects an int64 index of src's shape");
    if (out->ndim == 0) return em__cpu_binary(EM_OP_ADD, out, out, src);
    gs_ctx c = {out->dtype, out->strides[dim] * (int64_t)em_dtype_size(out->dtype), out->shape[dim], dim, false, 0};
    em_tensor dst = indexed_view(out, src, dim);
    const em_tensor *ts[3] = {src, index, &dst};
    cpu_iter it;
    em__cpu_iter_init(&it, 3, ts, true); /* row-major over src, serial: indices may repeat */
    em__cpu_iter_run(&it, scatter_add_loop, &c, 0);
    return gs_result(&c, "scatter_add");
}
