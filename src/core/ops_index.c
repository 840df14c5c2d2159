/* Indexing and joining: index_select, gather, cat, stack, one_hot. Index values are
 * checked on the host before any kernel runs (device indices are copied back first), so
 * an out-of-range index is a clear error rather than a wild read on the device; an index
 * whose storage a caller made in range on the device (em__index_mark_in_range: the class-index
 * loss, which checks its targets on the device) is not read back. */
#include "ops_internal.h"
#include <stdio.h>
#include <stdlib.h>

static bool is_index_dtype(em_dtype dt) { return dt == EM_I64 || dt == EM_I32; }

/* The index values as int64 on the host (malloc'ed; caller frees). */
static int64_t *index_values(const em_tensor *idx, int64_t *n) {
    *n = em__numel_raw(idx->ndim, idx->shape);
    int64_t *v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    if (!v) {
        em_error(EM_ERR_OUT_OF_MEMORY, "out of host memory reading an index");
        return NULL;
    }
    if (em__to_host(idx, EM_I64, v) != EM_OK) {
        free(v);
        return NULL;
    }
    return v;
}

bool em__index_known_in_range(const em_tensor *index, int64_t bound) {
    const em_storage *s = index ? index->storage : NULL;
    return s && s->index_bound > 0 && s->index_bound <= bound && atomic_load(&s->version) == s->index_bound_version;
}

static em_status check_range(const char *op, const em_tensor *idx, int dim, int64_t bound) {
    if (em__index_known_in_range(idx, bound))
        return EM_OK; /* made in range on the device (em__index_mark_in_range): no host read */
    int64_t n;
    int64_t *v = index_values(idx, &n);
    if (!v) return em_last_status();
    em_status st = EM_OK;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= bound) {
            st = em_error(EM_ERR_ARGUMENT, "%s: index %lld is out of bounds for dimension %d with size %lld", op,
                          (long long)v[i], dim, (long long)bound);
            break;
        }
    }
    free(v);
    return st;
}

void em__index_mark_in_range(em_tensor *index, int64_t bound) {
    if (!index || bound <= 0) return;
    index->storage->index_bound = bound;
    index->storage->index_bound_version = atomic_load(&index->storage->version);
}

/* idx as the backend wants it: int64 (a copy when int32). */
static const em_tensor *index_i64(const em_tensor *idx, em_tensor **tmp) {
    *tmp = NULL;
    if (idx->dtype == EM_I64) return idx;
    *tmp = em__copy_raw(idx, EM_I64);
    return *tmp;
}

em_tensor *em_index_select(em_tensor *a, int dim, em_tensor *index) {
    const char *op = "em_index_select";
    EM_CHECK_ARG(a, op, "a");
    EM_CHECK_ARG(index, op, "index");
    em_tensor *in[2] = {a, index};
    if (em__check_same_device(op, 2, (const em_tensor *const *)in)) return NULL;
    if (!is_index_dtype(index->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: index_select(): Expected dtype int32 or int64 for index, got %s", op,
                 em__dtype_torch_name(index->dtype));
        return NULL;
    }
    if (index->ndim > 1) {
        em_error(EM_ERR_SHAPE, "%s: index_select(): Index is supposed to be a vector, got %d dims", op, index->ndim);
        return NULL;
    }
    if (em__wrap_dim(&dim, a->ndim, op)) return NULL;
    /* A 0-d input is seen as [1]; a 0-d index as [1]. */
    int64_t one = 1, st1 = 1;
    em_tensor a_view, i_view;
    const em_tensor *src = a;
    if (a->ndim == 0) {
        em__stack_view(&a_view, a, 1, &one, &st1, a->offset);
        src = &a_view;
    }
    if (check_range(op, index, dim, src->shape[dim])) return NULL;
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    int64_t n = em__numel_raw(index->ndim, index->shape);
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[dim] = n;
    em_tensor *out = em__tensor_new_on(be, dev, src->ndim, shape, a->dtype);
    if (!out) return NULL;
    em_tensor *tmp;
    const em_tensor *idx = index_i64(index, &tmp);
    em_status st = idx ? EM_OK : em_last_status();
    if (st == EM_OK && idx->ndim == 0) {
        em__stack_view(&i_view, idx, 1, &one, &st1, idx->offset);
        idx = &i_view;
    }
    if (st == EM_OK && em__numel_raw(src->ndim, shape) > 0) st = em__op_run(&(em_op_call){.op = EM_OP_INDEX_SELECT, .dtype = src->dtype, .dst = {out}, .src = {src, idx}, .i = {dim}}, op);
    em_release(tmp);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    if (a->ndim == 0 && index->ndim == 0) { /* 0-d in, 0-d index: 0-d out */
        out->ndim = 0;
    }
    em_grad_args args = em__no_args;
    args.dim = dim;
    return em__finish(out, EM_GRAD_INDEX_SELECT, 2, in, &args);
}

em_tensor *em_gather(em_tensor *a, int dim, em_tensor *index) {
    const char *op = "em_gather";
    EM_CHECK_ARG(a, op, "a");
    EM_CHECK_ARG(index, op, "index");
    em_tensor *in[2] = {a, index};
    if (em__check_same_device(op, 2, (const em_tensor *const *)in)) return NULL;
    if (!is_index_dtype(index->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: gather(): Expected dtype int64 (or int32) for index, got %s", op,
                 em__dtype_torch_name(index->dtype));
        return NULL;
    }
    if (em__wrap_dim(&dim, a->ndim, op)) return NULL;
    int nd = a->ndim > 0 ? a->ndim : 1;
    int ind = index->ndim > 0 ? index->ndim : 1;
    if (nd != ind) {
        em_error(EM_ERR_SHAPE, "%s: Index tensor must have the same number of dimensions as input tensor (%d vs %d)",
                 op, index->ndim, a->ndim);
        return NULL;
    }
    int64_t one = 1, st1 = 1;
    em_tensor a_view, i_view;
    const em_tensor *src = a, *idx0 = index;
    if (a->ndim == 0) {
        em__stack_view(&a_view, a, 1, &one, &st1, a->offset);
        src = &a_view;
    }
    if (index->ndim == 0) {
        em__stack_view(&i_view, index, 1, &one, &st1, index->offset);
        idx0 = &i_view;
    }
    for (int d = 0; d < nd; d++) {
        if (d != dim && idx0->shape[d] > src->shape[d]) {
            char s1[128], s2[128];
            em_error(EM_ERR_SHAPE,
                     "%s: Size does not match at dimension %d expected index %s to be smaller than self %s apart "
                     "from dimension %d", op, d, em__shape_str(s1, sizeof s1, index->ndim, index->shape),
                     em__shape_str(s2, sizeof s2, a->ndim, a->shape), dim);
            return NULL;
        }
    }
    if (check_range(op, index, dim, src->shape[dim])) return NULL;
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    em_tensor *out = em__tensor_new_on(be, dev, index->ndim, index->shape, a->dtype);
    if (!out) return NULL;
    em_tensor *tmp, i64_view, out_view;
    const em_tensor *idx = index_i64(idx0, &tmp);
    em_status st = idx ? EM_OK : em_last_status();
    if (st == EM_OK && em__numel_raw(index->ndim, index->shape) > 0) {
        em_tensor *dst = out;
        if (index->ndim == 0) {
            em__stack_view(&out_view, out, 1, &one, &st1, 0);
            dst = &out_view;
            if (idx->ndim == 0) {
                em__stack_view(&i64_view, idx, 1, &one, &st1, idx->offset);
                idx = &i64_view;
            }
        }
        st = em__op_run(&(em_op_call){.op = EM_OP_GATHER, .dtype = src->dtype, .dst = {dst}, .src = {src, idx}, .i = {dim}}, op);
    }
    em_release(tmp);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_grad_args args = em__no_args;
    args.dim = dim;
    return em__finish(out, EM_GRAD_GATHER, 2, in, &args);
}

/* A legacy empty 1-d tensor ([0]) may join anything: PyTorch skips it. */
static bool skipped_in_cat(const em_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

em_tensor *em_cat(em_tensor *const *tensors, int n, int dim) {
    const char *op = "em_cat";
    if (!tensors || n <= 0) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: expected a non-empty list of Tensors", op);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        EM_CHECK_ARG(tensors[i], op, "tensors[i]");
        if (tensors[i]->ndim == 0) {
            em_error(EM_ERR_SHAPE, "%s: zero-dimensional tensor (at position %d) cannot be concatenated", op, i);
            return NULL;
        }
    }
    if (em__check_same_device(op, n, (const em_tensor *const *)tensors)) return NULL;
    int ref = -1;
    for (int i = 0; i < n && ref < 0; i++)
        if (!skipped_in_cat(tensors[i])) ref = i;
    const em_tensor *r = tensors[ref < 0 ? 0 : ref];
    if (em__wrap_dim(&dim, r->ndim, op)) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, r->shape, sizeof shape);
    shape[dim] = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = tensors[i];
        if (ref >= 0 && skipped_in_cat(t)) continue;
        if (t->ndim != r->ndim) {
            em_error(EM_ERR_SHAPE, "%s: Tensors must have same number of dimensions: got %d and %d", op, r->ndim,
                     t->ndim);
            return NULL;
        }
        for (int d = 0; d < r->ndim; d++) {
            if (d != dim && t->shape[d] != r->shape[d]) {
                em_error(EM_ERR_SHAPE, "%s: Sizes of tensors must match except in dimension %d. Expected size %lld but "
                                       "got size %lld for tensor number %d in the list.",
                         op, dim, (long long)r->shape[d], (long long)t->shape[d], i);
                return NULL;
            }
        }
        if (__builtin_add_overflow(shape[dim], t->shape[dim], &shape[dim])) {
            em_error(EM_ERR_ARGUMENT, "%s: the sizes of dimension %d add up past the int64 range (at tensor number %d)",
                     op, dim, i);
            return NULL;
        }
        used++;
    }
    em_dtype dt = em__result_type(n, tensors);
    const em_backend *be = r->storage->backend;
    em_device dev = r->storage->device;
    em_tensor *out = em__tensor_new_on(be, dev, r->ndim, shape, dt);
    if (!out) return NULL;
    /* Each input is copied (and cast) into its slice of out. */
    em_tensor **parts = malloc((size_t)n * sizeof *parts);
    em_status st = parts ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    int64_t at = 0;
    used = 0;
    for (int i = 0; st == EM_OK && i < n; i++) {
        em_tensor *t = tensors[i];
        if (ref >= 0 && skipped_in_cat(t)) continue;
        parts[used++] = t;
        if (em__numel_raw(t->ndim, t->shape) > 0) {
            em_tensor slot;
            em__stack_view(&slot, out, out->ndim, t->shape, out->strides, at * out->strides[dim]);
            st = em__run_copy(&slot, t, op);
        }
        at += t->shape[dim];
    }
    if (st != EM_OK) {
        free(parts);
        em_release(out);
        return NULL;
    }
    em_grad_args args = em__no_args;
    args.dim = dim;
    em_tensor *res = em__finish(out, EM_GRAD_CAT, used, parts, &args);
    free(parts);
    return res;
}

em_tensor *em_stack(em_tensor *const *tensors, int n, int dim) {
    const char *op = "em_stack";
    if (!tensors || n <= 0) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: expected a non-empty list of Tensors", op);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        EM_CHECK_ARG(tensors[i], op, "tensors[i]");
        if (!em__same_shape(tensors[i], tensors[0])) {
            char s1[128], s2[128];
            em_error(EM_ERR_SHAPE, "%s: stack expects each tensor to be equal size, but got %s at entry 0 and %s at "
                                   "entry %d", op,
                     em__shape_str(s1, sizeof s1, tensors[0]->ndim, tensors[0]->shape),
                     em__shape_str(s2, sizeof s2, tensors[i]->ndim, tensors[i]->shape), i);
            return NULL;
        }
    }
    if (tensors[0]->ndim >= EM_MAX_DIMS) {
        em_error(EM_ERR_SHAPE, "%s: tensors have at most %d dims", op, EM_MAX_DIMS);
        return NULL;
    }
    if (em__wrap_dim(&dim, tensors[0]->ndim + 1, op)) return NULL;
    em_tensor **parts = malloc((size_t)n * sizeof *parts);
    if (!parts) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    /* stack = cat of unsqueezed inputs (autograd records exactly that); the inner scope
     * frees the unsqueezed views. */
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) parts[i] = em_unsqueeze(tensors[i], dim);
    em_tensor *r = em_retain(em_cat(parts, n, dim));
    em_scope_end(s);
    free(parts);
    return em__scoped(r);
}

em_tensor *em_one_hot(em_tensor *index, int64_t num_classes) {
    const char *op = "em_one_hot";
    EM_CHECK_ARG(index, op, "index");
    if (!is_index_dtype(index->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: one_hot is only applicable to index tensor of type int64 (or int32), got %s", op,
                 em__dtype_torch_name(index->dtype));
        return NULL;
    }
    if (num_classes < -1) {
        em_error(EM_ERR_ARGUMENT, "%s: num_classes should be -1 (infer) or positive, got %lld", op, (long long)num_classes);
        return NULL;
    }
    int64_t n;
    int64_t *v = index_values(index, &n);
    if (!v) return NULL;
    if (n == 0 && num_classes == -1) {
        free(v);
        em_error(EM_ERR_ARGUMENT, "%s: Can not infer total number of classes from empty tensor.", op);
        return NULL;
    }
    int64_t max = -1;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0) {
            em_error(EM_ERR_ARGUMENT, "%s: Class values must be non-negative (found %lld).", op, (long long)v[i]);
            free(v);
            return NULL;
        }
        if (v[i] > max) max = v[i];
    }
    free(v);
    if (num_classes == -1) num_classes = max + 1;
    if (max >= num_classes) {
        em_error(EM_ERR_ARGUMENT, "%s: Class values must be smaller than num_classes (found %lld, num_classes %lld).",
                 op, (long long)max, (long long)num_classes);
        return NULL;
    }
    /* Composite: (index[..., None] == arange(C)) as int64. */
    em_scope s = em_scope_begin();
    em_tensor *classes = em_arange(0, (double)num_classes, 1, EM_OPTS(.dtype = EM_I64, .device = index->storage->device));
    em_tensor *r = em_retain(em_to_dtype(em_eq(em_unsqueeze(index, -1), classes), EM_I64));
    em_scope_end(s);
    return em__scoped(r);
}

/* ---- norms, embedding, attention: index_add and scatter_add (out of place, as
 * torch.index_add / torch.scatter_add). The backend adds into a contiguous copy of a. ---- */

/* A 0-d tensor seen as [1] (a stack view into *v), else t itself. */
static const em_tensor *as_1d(const em_tensor *t, em_tensor *v) {
    static const int64_t one = 1, st1 = 1;
    if (t->ndim > 0) return t;
    em__stack_view(v, t, 1, &one, &st1, t->offset);
    return v;
}

static em_status check_accumulate_args(const char *op, em_tensor *a, em_tensor *index, em_tensor *src) {
    em_tensor *in[3] = {a, index, src};
    if (em__check_same_device(op, 3, (const em_tensor *const *)in)) return em_last_status();
    if (!is_index_dtype(index->dtype))
        return em_error(EM_ERR_DTYPE, "%s: Expected dtype int64 (or int32) for index, got %s", op,
                        em__dtype_torch_name(index->dtype));
    if (a->dtype != src->dtype)
        return em_error(EM_ERR_DTYPE, "%s: self (%s) and source (%s) must have the same scalar type", op,
                        em__dtype_torch_name(a->dtype), em__dtype_torch_name(src->dtype));
    if (a->dtype == EM_BOOL)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: not supported for bool", op);
    return EM_OK;
}

/* index_add's checks of its operands' shapes and index values; dim wrapped in place. */
static em_status check_index_add(const char *op, em_tensor *a, int *dim, em_tensor *index, em_tensor *src) {
    if (check_accumulate_args(op, a, index, src)) return em_last_status();
    if (index->ndim > 1)
        return em_error(EM_ERR_SHAPE, "%s: index_add_(): Index is supposed to be a vector, got %d dims", op,
                        index->ndim);
    if (em__wrap_dim(dim, a->ndim, op)) return em_last_status();
    em_tensor av, sv;
    const em_tensor *a1 = as_1d(a, &av), *s1 = as_1d(src, &sv);
    int64_t n = em__numel_raw(index->ndim, index->shape);
    bool ok = a1->ndim == s1->ndim && s1->shape[*dim] == n;
    for (int d = 0; ok && d < a1->ndim; d++) ok = d == *dim || a1->shape[d] == s1->shape[d];
    if (!ok) {
        char s_a[128], s_s[128];
        return em_error(EM_ERR_SHAPE, "%s: source %s must have self's shape %s except at dimension %d, where it must "
                        "equal the number of indices (%lld)", op, em__shape_str(s_s, sizeof s_s, src->ndim, src->shape),
                        em__shape_str(s_a, sizeof s_a, a->ndim, a->shape), *dim, (long long)n);
    }
    return check_range(op, index, *dim, a1->shape[*dim]);
}

/* out[index[i]] += src[i] along dim, in the order of i (the kernel; operands checked). */
static em_status index_add_kernel(const char *op, em_tensor *out, int dim, em_tensor *index, em_tensor *src) {
    em_tensor ov, sv, iv, *tmp;
    const em_tensor *s1 = as_1d(src, &sv);
    if (em__numel_raw(index->ndim, index->shape) == 0 || em__numel_raw(s1->ndim, s1->shape) == 0) return EM_OK;
    const em_tensor *idx = index_i64(index, &tmp);
    em_status st = idx ? em__op_run(&(em_op_call){.op = EM_OP_INDEX_ADD, .dtype = out->dtype,
                                                  .dst = {(em_tensor *)as_1d(out, &ov)},
                                                  .src = {as_1d(idx, &iv), s1}, .i = {dim}}, op)
                       : em_last_status();
    em_release(tmp);
    return st;
}

em_tensor *em_index_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src, double alpha) {
    const char *op = "em_index_add";
    EM_CHECK_ARG(a, op, "a");
    EM_CHECK_ARG(index, op, "index");
    EM_CHECK_ARG(src, op, "source");
    if (check_index_add(op, a, &dim, index, src)) return NULL;
    if (alpha != 1.0) { /* composed, so that autograd sees the scaling */
        em_scope s = em_scope_begin();
        em_tensor *r = em_retain(em_index_add(a, dim, index, em_mul_scalar(src, alpha), 1.0));
        em_scope_end(s);
        return em__scoped(r);
    }
    em_tensor *out = em__copy_raw(a, a->dtype);
    if (!out) return NULL;
    if (index_add_kernel(op, out, dim, index, src) != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_tensor *in[3] = {a, index, src};
    em_grad_args args = em__no_args;
    args.dim = dim;
    return em__finish(out, EM_GRAD_INDEX_ADD, 3, in, &args);
}

/* dst of the in-place forms: contiguous, writable, and nothing autograd would see change */
static em_status check_in_place_dst(const char *op, const em_tensor *dst) {
    if (dst->ndim == 0 || !em__is_contiguous_raw(dst->ndim, dst->shape, dst->strides) || dst->requires_grad ||
        dst->grad_fn || dst->storage->read_only)
        return em_error(EM_ERR_ARGUMENT, "%s: the tensor added into must have at least one dimension and be "
                        "contiguous, writable and outside autograd (no history, no requires_grad)", op);
    return EM_OK;
}

em_status em__index_add_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src) {
    const char *op = "index_add (in place)";
    if (!dst || !index || !src) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    if (check_in_place_dst(op, dst) || check_index_add(op, dst, &dim, index, src)) return em_last_status();
    em_status st = index_add_kernel(op, dst, dim, index, src);
    if (st == EM_OK) em__bump_version(dst);
    return st;
}

/* (value, position) pairs of an index, sorted by value then position */
typedef struct index_at_pos { int64_t value, pos; } index_at_pos;

static int by_value_then_pos(const void *x, const void *y) {
    const index_at_pos *a = x, *b = y;
    if (a->value != b->value) return a->value < b->value ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* The out-of-place sum dst + index_add(zeros, dim, index, src) rounds each slice of dst
 * once, after its repeats were summed in index order from zero. Here the repeats are summed
 * the same way into a buffer of one slice per distinct index, which then goes into dst once
 * per slice: the same values bit for bit, without a dst-sized temporary. */
em_status em__index_add_summed_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src) {
    const char *op = "index_add (summed, in place)";
    if (!dst || !index || !src) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    if (check_in_place_dst(op, dst) || check_index_add(op, dst, &dim, index, src)) return em_last_status();
    int64_t n;
    int64_t *v = index_values(index, &n);
    if (!v) return em_last_status();
    size_t count = (size_t)(n > 0 ? n : 1);
    index_at_pos *order = malloc(count * sizeof *order);
    int64_t *slice_of = malloc(count * sizeof *slice_of); /* index position -> its slice of the buffer */
    int64_t *distinct = malloc(count * sizeof *distinct); /* buffer slice -> the index value it sums */
    em_status st = EM_OK;
    if (!order || !slice_of || !distinct)
        st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld indices", op, (long long)n);
    int64_t k = 0;
    if (st == EM_OK) {
        for (int64_t i = 0; i < n; i++) order[i] = (index_at_pos){v[i], i};
        qsort(order, (size_t)n, sizeof *order, by_value_then_pos);
        for (int64_t i = 0; i < n; i++) {
            if (i == 0 || order[i].value != order[i - 1].value) distinct[k++] = order[i].value;
            slice_of[order[i].pos] = k - 1;
        }
    }
    if (st == EM_OK && n > 0) {
        em_scope s = em_scope_begin();
        em_device at = em_device_of(index);
        em_tensor *slices = em_from_data(slice_of, EM_I64, EM_SHAPE(n), EM_OPTS(.dtype = EM_I64, .device = at));
        em_tensor *rows = em_from_data(distinct, EM_I64, EM_SHAPE(k), EM_OPTS(.dtype = EM_I64, .device = at));
        em_shape bs = {.ndim = src->ndim};
        for (int d = 0; d < src->ndim; d++) bs.d[d] = d == dim ? k : src->shape[d];
        em_tensor *sums = em_zeros(bs, EM_OPTS(.dtype = src->dtype, .device = em_device_of(src)));
        st = slices && rows && sums ? index_add_kernel(op, sums, dim, slices, src) : em_last_status();
        if (st == EM_OK) st = index_add_kernel(op, dst, dim, rows, sums);
        em_scope_end(s);
    }
    free(v);
    free(order);
    free(slice_of);
    free(distinct);
    if (st == EM_OK) em__bump_version(dst);
    return st;
}

/* scatter_add's checks of its operands (dim wrapped in place). */
static em_status check_scatter_add(const char *op, em_tensor *a, int *dim, em_tensor *index, em_tensor *src) {
    if (check_accumulate_args(op, a, index, src)) return em_last_status();
    if (em__wrap_dim(dim, a->ndim, op)) return em_last_status();
    em_tensor av, sv, iv;
    const em_tensor *a1 = as_1d(a, &av), *s1 = as_1d(src, &sv), *i1 = as_1d(index, &iv);
    bool ok = a1->ndim == i1->ndim && s1->ndim == i1->ndim;
    for (int d = 0; ok && d < i1->ndim; d++)
        ok = i1->shape[d] <= s1->shape[d] && (d == *dim || i1->shape[d] <= a1->shape[d]);
    if (!ok) {
        char s_a[128], s_i[128], s_s[128];
        return em_error(EM_ERR_SHAPE, "%s: index %s must have as many dims as self %s and src %s and be no larger "
                                      "than src in every dimension and than self apart from dimension %d", op,
                        em__shape_str(s_i, sizeof s_i, index->ndim, index->shape),
                        em__shape_str(s_a, sizeof s_a, a->ndim, a->shape),
                        em__shape_str(s_s, sizeof s_s, src->ndim, src->shape), *dim);
    }
    return check_range(op, index, *dim, a1->shape[*dim]);
}

/* out[i][index[i][j]] += src[i][j] (dim 1 shown; the kernel; operands checked). */
static em_status scatter_add_kernel(const char *op, em_tensor *out, int dim, em_tensor *index, em_tensor *src) {
    em_tensor iv, sv;
    const em_tensor *i1 = as_1d(index, &iv), *s1 = as_1d(src, &sv);
    if (em__numel_raw(i1->ndim, i1->shape) == 0) return EM_OK;
    em_tensor *tmp, ov, sn, xv;
    const em_tensor *idx = index_i64(index, &tmp);
    em_status st = idx ? EM_OK : em_last_status();
    if (st == EM_OK) {
        /* the backend wants src of index's shape: its leading corner */
        em__stack_view(&sn, s1, s1->ndim, i1->shape, s1->strides, s1->offset);
        st = em__op_run(&(em_op_call){.op = EM_OP_SCATTER_ADD, .dtype = out->dtype, .dst = {(em_tensor *)as_1d(out, &ov)},
                                      .src = {as_1d(idx, &xv), &sn}, .i = {dim}}, op);
    }
    em_release(tmp);
    return st;
}

em_tensor *em_scatter_add(em_tensor *a, int dim, em_tensor *index, em_tensor *src) {
    const char *op = "em_scatter_add";
    EM_CHECK_ARG(a, op, "a");
    EM_CHECK_ARG(index, op, "index");
    EM_CHECK_ARG(src, op, "src");
    if (check_scatter_add(op, a, &dim, index, src)) return NULL;
    em_tensor *out = em__copy_raw(a, a->dtype);
    if (!out) return NULL;
    if (scatter_add_kernel(op, out, dim, index, src) != EM_OK) {
        em_release(out);
        return NULL;
    }
    em_tensor *in[3] = {a, index, src};
    em_grad_args args = em__no_args;
    args.dim = dim;
    return em__finish(out, EM_GRAD_SCATTER_ADD, 3, in, &args);
}

em_status em__scatter_add_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src) {
    const char *op = "scatter_add (in place)";
    if (!dst || !index || !src) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    if (check_in_place_dst(op, dst) || check_scatter_add(op, dst, &dim, index, src)) return em_last_status();
    em_status st = scatter_add_kernel(op, dst, dim, index, src);
    if (st == EM_OK) em__bump_version(dst);
    return st;
}
