/* View ops: new tensor headers over the same storage (no data moves), except reshape /
 * flatten / contiguous, which copy when the strides cannot express the result. */
#include "core_internal.h"
#include "../util/errors.h"
#include <stdio.h>

static const em_grad_args no_args;

/* Resolve a requested shape against numel: one -1 may be inferred. */
static em_status infer_shape(const char *op, int64_t numel, em_shape *s) {
    if (s->ndim < 0 || s->ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_SHAPE, "%s: a shape has 0 to %d dims, got %d", op, EM_MAX_DIMS, s->ndim);
    int infer = -1;
    int64_t prod = 1;
    bool overflow = false;   /* a product past int64 cannot be numel */
    char buf[128];
    for (int i = 0; i < s->ndim; i++) {
        if (s->d[i] == -1) {
            if (infer >= 0) return em_error(EM_ERR_SHAPE, "%s: only one dimension can be inferred", op);
            infer = i;
        } else if (s->d[i] < 0) {
            return em_error(EM_ERR_SHAPE, "%s: invalid shape dimension %lld", op, (long long)s->d[i]);
        } else {
            overflow |= __builtin_mul_overflow(prod, s->d[i], &prod);
        }
    }
    if (overflow) {
        /* falls through to the message below */
    } else if (infer >= 0) {
        if (prod == 0)
            return em_error(EM_ERR_SHAPE,
                            "%s: cannot reshape tensor of %lld elements into shape %s because the "
                            "unspecified dimension size -1 can be any value and is ambiguous",
                            op, (long long)numel, em__shape_str(buf, sizeof buf, s->ndim, s->d));
        if (numel % prod == 0) {
            s->d[infer] = numel / prod;
            return EM_OK;
        }
    } else if (prod == numel) {
        /* numel 0 allows any sizes beside the 0: they must still have strides that fit */
        return numel > 0 ? EM_OK : em__check_shape(op, s->ndim, s->d, EM_F64, NULL);
    }
    return em_error(EM_ERR_SHAPE, "%s: shape '%s' is invalid for input of size %lld", op,
                    em__shape_str(buf, sizeof buf, s->ndim, s->d), (long long)numel);
}

/* Strides that let t's elements be seen with shape ns without copying, or false
 * (the algorithm of PyTorch's computeStride: walk the old dims in contiguous chunks and
 * check that the new dims tile each chunk exactly). */
static bool view_strides(const em_tensor *t, const em_shape *ns, int64_t *out) {
    int64_t numel = em__numel_raw(t->ndim, t->shape);
    if (t->ndim == 0 || numel == 0) {
        em__contiguous_strides(ns->ndim, ns->d, out);
        if (numel == 0) /* any strides do; keep them positive for size-0 dims */
            for (int i = 0; i < ns->ndim; i++) if (out[i] == 0) out[i] = 1;
        return true;
    }
    /* numel > 0 here, so every product of sizes is at most numel; a product with a stride
     * that overflows describes no element of the tensor, so no view exists */
    int vd = ns->ndim - 1;
    int64_t chunk_stride = t->strides[t->ndim - 1], tensor_n = 1, view_n = 1, span;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_n *= t->shape[td];
        bool chunk_ends = td == 0 || (t->shape[td - 1] != 1 &&
                                      (__builtin_mul_overflow(tensor_n, chunk_stride, &span) || t->strides[td - 1] != span));
        if (!chunk_ends) continue;
        while (vd >= 0 && (view_n < tensor_n || ns->d[vd] == 1)) {
            if (__builtin_mul_overflow(view_n, chunk_stride, &out[vd])) return false;
            view_n *= ns->d[vd];
            vd--;
        }
        if (view_n != tensor_n) return false;
        if (td > 0) {
            chunk_stride = t->strides[td - 1];
            tensor_n = view_n = 1;
        }
    }
    return vd == -1;
}

em_tensor *em_view(em_tensor *t, em_shape shape) {
    EM_CHECK_ARG(t, "em_view", "t");
    if (infer_shape("em_view", em__numel_raw(t->ndim, t->shape), &shape) != EM_OK) return NULL;
    int64_t strides[EM_MAX_DIMS];
    if (!view_strides(t, &shape, strides)) {
        em_error(EM_ERR_SHAPE, "em_view: view size is not compatible with input tensor's size and stride "
                               "(at least one dimension spans across two contiguous subspaces). Use "
                               "em_reshape(...) instead.");
        return NULL;
    }
    return em__finish(em__view_of(t, shape.ndim, shape.d, strides, t->offset), EM_GRAD_VIEW, 1, &t, &no_args);
}

static em_tensor *reshape_impl(em_tensor *t, em_shape shape, const char *op) {
    if (infer_shape(op, em__numel_raw(t->ndim, t->shape), &shape) != EM_OK) return NULL;
    int64_t strides[EM_MAX_DIMS];
    em_tensor *out;
    if (view_strides(t, &shape, strides)) {
        out = em__view_of(t, shape.ndim, shape.d, strides, t->offset);
    } else {
        em_tensor *c = em__copy_raw(t, t->dtype);
        if (!c) return NULL;
        em__contiguous_strides(shape.ndim, shape.d, strides);
        out = em__view_of(c, shape.ndim, shape.d, strides, 0);
        em_release(c);
    }
    return em__finish(out, EM_GRAD_VIEW, 1, &t, &no_args);
}

em_tensor *em_reshape(em_tensor *t, em_shape shape) {
    EM_CHECK_ARG(t, "em_reshape", "t");
    return reshape_impl(t, shape, "em_reshape");
}

static em_tensor *permuted(em_tensor *t, const int *perm) {
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    em_grad_args args = no_args;
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = t->shape[perm[i]];
        strides[i] = t->strides[perm[i]];
        args.perm[i] = perm[i];
    }
    return em__finish(em__view_of(t, t->ndim, shape, strides, t->offset), EM_GRAD_PERMUTE, 1, &t, &args);
}

em_tensor *em_transpose(em_tensor *t, int d0, int d1) {
    EM_CHECK_ARG(t, "em_transpose", "t");
    if (em__wrap_dim(&d0, t->ndim, "em_transpose") || em__wrap_dim(&d1, t->ndim, "em_transpose"))
        return NULL;
    int perm[EM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    if (t->ndim > 0) {
        perm[d0] = d1;
        perm[d1] = d0;
    }
    return permuted(t, perm);
}

em_tensor *em_permute(em_tensor *t, em_dims order) {
    EM_CHECK_ARG(t, "em_permute", "t");
    if (order.n != t->ndim) {
        em_error(EM_ERR_ARGUMENT,
                 "em_permute: number of dims don't match in permute (the tensor has %d, the order %d)",
                 t->ndim, order.n);
        return NULL;
    }
    bool seen[EM_MAX_DIMS] = {false};
    for (int i = 0; i < order.n; i++) {
        if (em__wrap_dim(&order.d[i], t->ndim, "em_permute")) return NULL;
        if (seen[order.d[i]]) {
            em_error(EM_ERR_ARGUMENT, "em_permute: duplicate dims are not allowed (dim %d appears twice)",
                     order.d[i]);
            return NULL;
        }
        seen[order.d[i]] = true;
    }
    return permuted(t, order.d);
}

/* A view keeping every `step`-th element of dim from start, `len` of them. */
static em_tensor *strided_dim(em_tensor *t, int dim, int64_t start, int64_t len, int64_t step) {
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[dim] = len;
    /* with one element or none the stride is never used to address: keep the old one rather
     * than a product that can overflow (a step of INT64_MAX); with two or more, element
     * start + step lies inside the dim, so the product is within the tensor's extent */
    strides[dim] = t->strides[dim];
    if (len > 1 && __builtin_mul_overflow(t->strides[dim], step, &strides[dim])) {
        em_error(EM_ERR_ARGUMENT, "em_slice: stride %lld times step %lld overflows", (long long)t->strides[dim],
                 (long long)step);
        return NULL;
    }
    int64_t offset = t->offset + (len > 0 ? start * t->strides[dim] : 0);
    em_grad_args args = no_args;
    args.dim = dim;
    args.i[0] = start;
    args.i[1] = step;
    return em__finish(em__view_of(t, t->ndim, shape, strides, offset), EM_GRAD_SLICE, 1, &t, &args);
}

static bool dim_of_real_tensor(em_tensor *t, int *dim, const char *op, const char *torch_name) {
    if (t->ndim == 0) {
        em_error(EM_ERR_ARGUMENT, "%s: %s() cannot be applied to a 0-dim tensor.", op, torch_name);
        return false;
    }
    return em__wrap_dim(dim, t->ndim, op) == EM_OK;
}

em_tensor *em_narrow(em_tensor *t, int dim, int64_t start, int64_t length) {
    EM_CHECK_ARG(t, "em_narrow", "t");
    if (!dim_of_real_tensor(t, &dim, "em_narrow", "narrow")) return NULL;
    int64_t size = t->shape[dim];
    if (start < 0) start += size;
    if (start < 0 || start > size) {
        em_error(EM_ERR_ARGUMENT, "em_narrow: start out of range (expected to be in range of [%lld, %lld], but got %lld)",
                 (long long)-size, (long long)size, (long long)(start < 0 ? start - size : start));
        return NULL;
    }
    if (length < 0 || length > size - start) {   /* not start + length: it can overflow */
        em_error(EM_ERR_ARGUMENT, "em_narrow: start (%lld) + length (%lld) exceeds dimension size (%lld).",
                 (long long)start, (long long)length, (long long)size);
        return NULL;
    }
    return strided_dim(t, dim, start, length, 1);
}

em_tensor *em_slice(em_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    EM_CHECK_ARG(t, "em_slice", "t");
    if (!dim_of_real_tensor(t, &dim, "em_slice", "slice")) return NULL;
    if (step <= 0) {
        em_error(EM_ERR_ARGUMENT, "em_slice: slice step must be positive, got %lld", (long long)step);
        return NULL;
    }
    int64_t size = t->shape[dim];
    /* Python's clamping: negative bounds count from the end, then clamp to [0, size]. */
    if (start < 0) start = start < -size ? 0 : start + size;
    if (end < 0) end = end < -size ? 0 : end + size;
    if (start > size) start = size;
    if (end > size) end = size;
    if (end < start) end = start;
    /* ceil((end - start) / step), written so that a step near INT64_MAX cannot overflow */
    int64_t len = end == start ? 0 : (end - start - 1) / step + 1;
    return strided_dim(t, dim, start, len, step);
}

em_tensor *em_select(em_tensor *t, int dim, int64_t index) {
    EM_CHECK_ARG(t, "em_select", "t");
    if (!dim_of_real_tensor(t, &dim, "em_select", "select")) return NULL;
    int64_t size = t->shape[dim];
    if (index < -size || index >= size) {
        char buf[128];
        em_error(EM_ERR_ARGUMENT, "em_select: index %lld out of range for tensor of size %s at dimension %d",
                 (long long)index, em__shape_str(buf, sizeof buf, t->ndim, t->shape), dim);
        return NULL;
    }
    if (index < 0) index += size;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == dim) continue;
        shape[n] = t->shape[i];
        strides[n++] = t->strides[i];
    }
    em_grad_args args = no_args;
    args.dim = dim;
    args.i[0] = index;
    args.i[1] = 1;
    args.i[2] = 1;
    em_tensor *out = em__view_of(t, n, shape, strides, t->offset + index * t->strides[dim]);
    return em__finish(out, EM_GRAD_SLICE, 1, &t, &args);
}

em_tensor *em_expand(em_tensor *t, em_shape shape) {
    EM_CHECK_ARG(t, "em_expand", "t");
    char want[128], have[128];
    if (shape.ndim < t->ndim || shape.ndim > EM_MAX_DIMS) {
        em_error(EM_ERR_SHAPE,
                 "em_expand: the number of sizes provided (%d) must be greater or equal to the number of "
                 "dimensions in the tensor (%d)", shape.ndim, t->ndim);
        return NULL;
    }
    int64_t strides[EM_MAX_DIMS];
    int lead = shape.ndim - t->ndim;
    for (int i = shape.ndim - 1; i >= 0; i--) {
        int j = i - lead;
        if (j < 0) {
            if (shape.d[i] < 0) {
                em_error(EM_ERR_SHAPE,
                         "em_expand: The expanded size of the tensor (%lld) isn't allowed in a leading, "
                         "non-existing dimension %d", (long long)shape.d[i], i);
                return NULL;
            }
            strides[i] = 0;
            continue;
        }
        if (shape.d[i] == -1) shape.d[i] = t->shape[j];
        if (shape.d[i] == t->shape[j]) {
            strides[i] = t->strides[j];
        } else if (t->shape[j] == 1 && shape.d[i] >= 0) {
            strides[i] = 0;
        } else {
            em_error(EM_ERR_SHAPE,
                     "em_expand: The expanded size of the tensor (%lld) must match the existing size (%lld) "
                     "at non-singleton dimension %d.  Target sizes: %s.  Tensor sizes: %s",
                     (long long)shape.d[i], (long long)t->shape[j], i,
                     em__shape_str(want, sizeof want, shape.ndim, shape.d),
                     em__shape_str(have, sizeof have, t->ndim, t->shape));
            return NULL;
        }
    }
    int64_t span = 1;   /* as em_empty: the new sizes' product (a 0 counted as 1) must fit */
    for (int i = 0; i < shape.ndim; i++) {
        if (__builtin_mul_overflow(span, shape.d[i] ? shape.d[i] : 1, &span) || span > INT64_MAX / 8) {
            em_error(EM_ERR_ARGUMENT, "em_expand: the expanded shape %s has too many elements (its size in bytes "
                     "overflows)", em__shape_str(want, sizeof want, shape.ndim, shape.d));
            return NULL;
        }
    }
    em_tensor *out = em__view_of(t, shape.ndim, shape.d, strides, t->offset);
    return em__finish(out, EM_GRAD_EXPAND, 1, &t, &no_args);
}

em_tensor *em_squeeze(em_tensor *t, int dim) {
    EM_CHECK_ARG(t, "em_squeeze", "t");
    if (em__wrap_dim(&dim, t->ndim, "em_squeeze")) return NULL;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == dim && t->shape[i] == 1) continue; /* a dim of another size stays, as in PyTorch */
        shape[n] = t->shape[i];
        strides[n++] = t->strides[i];
    }
    return em__finish(em__view_of(t, n, shape, strides, t->offset), EM_GRAD_VIEW, 1, &t, &no_args);
}

em_tensor *em_unsqueeze(em_tensor *t, int dim) {
    EM_CHECK_ARG(t, "em_unsqueeze", "t");
    if (t->ndim >= EM_MAX_DIMS) {
        em_error(EM_ERR_SHAPE, "em_unsqueeze: tensors have at most %d dims", EM_MAX_DIMS);
        return NULL;
    }
    if (em__wrap_dim(&dim, t->ndim + 1, "em_unsqueeze")) return NULL;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == dim) {
            shape[i] = 1;
            /* PyTorch's stride for the new dim; it never addresses anything (size 1), so 1
             * where the product overflows */
            if (dim >= t->ndim || __builtin_mul_overflow(t->shape[dim], t->strides[dim], &strides[i])) strides[i] = 1;
        } else {
            shape[i] = t->shape[j];
            strides[i] = t->strides[j++];
        }
    }
    return em__finish(em__view_of(t, t->ndim + 1, shape, strides, t->offset), EM_GRAD_VIEW, 1, &t, &no_args);
}

em_tensor *em_flatten(em_tensor *t, int start_dim, int end_dim) {
    EM_CHECK_ARG(t, "em_flatten", "t");
    if (em__wrap_dim(&start_dim, t->ndim, "em_flatten") || em__wrap_dim(&end_dim, t->ndim, "em_flatten"))
        return NULL;
    if (start_dim > end_dim) {
        em_error(EM_ERR_ARGUMENT, "em_flatten: flatten() has invalid args: start_dim cannot come after end_dim");
        return NULL;
    }
    if (t->ndim == 0) return reshape_impl(t, EM_SHAPE(1), "em_flatten");
    if (start_dim == end_dim) return em__scoped(em_retain(t));
    em_shape s = {.ndim = 0};
    for (int i = 0; i < t->ndim; i++) {
        if (i > start_dim && i <= end_dim) s.d[s.ndim - 1] *= t->shape[i];
        else s.d[s.ndim++] = t->shape[i];
    }
    return reshape_impl(t, s, "em_flatten");
}

em_tensor *em_contiguous(em_tensor *t) {
    EM_CHECK_ARG(t, "em_contiguous", "t");
    if (em__is_contiguous_raw(t->ndim, t->shape, t->strides)) return em__scoped(em_retain(t));
    return em__finish(em__copy_raw(t, t->dtype), EM_GRAD_COPY, 1, &t, &no_args);
}

em_tensor *em_detach(em_tensor *t) {
    EM_CHECK_ARG(t, "em_detach", "t");
    return em__scoped(em__view_of(t, t->ndim, t->shape, t->strides, t->offset));
}
