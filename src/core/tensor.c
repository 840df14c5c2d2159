/* Tensor and storage objects: allocation, reference counting, properties, and the small
 * shape helpers every other core file uses. */
#include "core_internal.h"
#include "../util/errors.h"
#include "internal_api.h"
#include "../memory/allocator.h"
#include <stdio.h>
#include <stdlib.h>

/* ---- storage ---- */

em_storage *em__storage_new(const em_backend *be, em_device d, size_t nbytes, bool pinned) {
    em_storage *s = malloc(sizeof *s);
    if (!s) {
        em_error(EM_ERR_OUT_OF_MEMORY, "out of host memory allocating a storage header");
        return NULL;
    }
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->device = d;
    s->backend = be;
    s->nbytes = nbytes;
    s->pinned = pinned;
    s->external = false;
    s->read_only = false;
    s->external_release = NULL;
    s->external_ctx = NULL;
    atomic_init(&s->attached, NULL);
    s->index_bound = 0;
    s->index_bound_version = 0;
    unsigned long seq = em__error_seq();
    em_status st = pinned ? em__mem_alloc_pinned(nbytes, &s->block) : em__mem_alloc(be, d, nbytes, &s->block);
    if (st != EM_OK) {
        if (em__error_seq() == seq) /* the allocator said nothing: say what failed */
            em_error(st, "allocating %zu bytes on %s failed", nbytes, em_device_str(d).s);
        free(s);
        return NULL;
    }
    return s;
}

void em__storage_release(em_storage *s) {
    if (!s || atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    for (em_storage_attachment *a = atomic_load_explicit(&s->attached, memory_order_acquire), *next; a; a = next) {
        next = a->next;
        a->release(a);
    }
    if (!s->external) {
        if (s->pinned) em__mem_free_pinned(&s->block);
        else em__mem_free(s->backend, s->device, &s->block);
    } else if (s->external_release) {
        s->external_release(s->external_ctx);
    }
    free(s);
}

void em__storage_attach(em_storage *s, em_storage_attachment *a) {
    em_storage_attachment *head = atomic_load_explicit(&s->attached, memory_order_relaxed);
    do {
        a->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&s->attached, &head, a, memory_order_release, memory_order_relaxed));
}

em_storage_attachment *em__storage_attachment(em_storage *s, const void *key) {
    for (em_storage_attachment *a = atomic_load_explicit(&s->attached, memory_order_acquire); a; a = a->next)
        if (a->key == key) return a;
    return NULL;
}

/* ---- tensors ---- */

int64_t em__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t n = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = n;
        n *= shape[i];
    }
    return n;
}

int64_t em__numel_raw(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

em_tensor *em__tensor_alloc(em_storage *storage, em_dtype dt, int ndim, const int64_t *shape,
                            const int64_t *strides, int64_t offset) {
    em_tensor *t = malloc(sizeof *t);
    if (!t) {
        em_error(EM_ERR_OUT_OF_MEMORY, "out of host memory allocating a tensor header");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    atomic_init(&t->refcount, 1);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    t->storage = storage;
    atomic_fetch_add_explicit(&storage->refcount, 1, memory_order_relaxed);
    t->is_leaf = true;
    return t;
}

/* Whether a shape can be indexed: sizes >= 0, and the product of the sizes, a size 0 counted
 * as 1 (so that contiguous strides fit too), times the largest element size fits in int64. */
static bool shape_fits(int ndim, const int64_t *shape) {
    int64_t span = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span) || span > INT64_MAX / 8)
            return false;
    return true;
}

em_tensor *em__tensor_new_on(const em_backend *be, em_device d, int ndim, const int64_t *shape,
                             em_dtype dt) {
    /* ops compute their results' shapes from their inputs' (broadcast, concatenation, windows):
     * one that cannot be indexed is refused here, before a size computed from it wraps around */
    int64_t strides[EM_MAX_DIMS], numel = 1, span = 1; /* span: shape_fits's product, in the same pass */
    bool fits = true;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = numel;
        fits &= shape[i] >= 0 && !__builtin_mul_overflow(numel, shape[i], &numel) &&
                !__builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span) && span <= INT64_MAX / 8;
    }
    if (!fits) {
        char buf[128];
        em_error(EM_ERR_ARGUMENT, "the result's shape %s has too many elements (its size in bytes overflows)",
                 em__shape_str(buf, sizeof buf, ndim, shape));
        return NULL;
    }
    em_storage *s = em__storage_new(be, d, (size_t)numel * em_dtype_size(dt), false);
    if (!s) return NULL;
    em_tensor *t = em__tensor_alloc(s, dt, ndim, shape, strides, 0);
    em__storage_release(s); /* the tensor holds it now (or nothing does) */
    return t;
}

em_status em__check_shape(const char *op, int ndim, const int64_t *shape, em_dtype dt, int64_t *numel) {
    if ((unsigned)dt >= EM_DTYPE_COUNT)
        return em_error(EM_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_SHAPE, "%s: a shape has 0 to %d dims, got %d", op, EM_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char buf[128];
            return em_error(EM_ERR_SHAPE, "%s: negative dimension %lld in shape %s", op,
                            (long long)shape[i], em__shape_str(buf, sizeof buf, ndim, shape));
        }
    }
    if (!shape_fits(ndim, shape)) {
        char buf[128];
        return em_error(EM_ERR_SHAPE, "%s: shape %s has too many elements (the product of its sizes, "
                        "a size 0 counted as 1, times 8 bytes overflows)", op, em__shape_str(buf, sizeof buf, ndim, shape));
    }
    if (numel) *numel = em__numel_raw(ndim, shape);
    return EM_OK;
}

em_tensor *em__tensor_new(em_shape shape, em_dtype dt, em_device d) {
    if (em__check_shape("em_empty", shape.ndim, shape.d, dt, NULL) != EM_OK) return NULL;
    const em_backend *be = em__backend_checked(d, "em_empty");
    if (!be) return NULL;
    return em__tensor_new_on(be, em_device_resolve(d), shape.ndim, shape.d, dt);
}

/* The last line of defence of every view: its elements lie inside its storage. Each view op
 * checks its own arguments first (with PyTorch's messages); this catches what they miss. */
static bool view_inside_storage(const em_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t offset) {
    char sb[128], tb[128];
    if (!shape_fits(ndim, shape)) {
        em_error(EM_ERR_ARGUMENT, "view: shape %s has too many elements (its size in bytes overflows)",
                 em__shape_str(sb, sizeof sb, ndim, shape));
        return false;
    }
    if (em__numel_raw(ndim, shape) == 0) return true;   /* reaches no element */
    int64_t lo = offset, hi = offset, reach;
    bool overflow = offset < 0;
    for (int i = 0; i < ndim && !overflow; i++) {
        overflow = __builtin_mul_overflow(shape[i] - 1, strides[i], &reach) ||
                   __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
    }
    int64_t elems = (int64_t)(t->storage->nbytes / em_dtype_size(t->dtype));
    if (overflow || lo < 0 || hi >= elems) {
        char reached[96];
        if (overflow) snprintf(reached, sizeof reached, "past the int64 range");
        else snprintf(reached, sizeof reached, "elements %lld to %lld", (long long)lo, (long long)hi);
        em_error(EM_ERR_ARGUMENT, "view: shape %s with strides %s at offset %lld reaches %s, outside its storage "
                 "of %lld elements", em__shape_str(sb, sizeof sb, ndim, shape), em__shape_str(tb, sizeof tb, ndim, strides),
                 (long long)offset, reached, (long long)elems);
        return false;
    }
    return true;
}

em_tensor *em__view_of(const em_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                       int64_t offset) {
    if (!view_inside_storage(t, ndim, shape, strides, offset)) return NULL;
    return em__tensor_alloc(t->storage, t->dtype, ndim, shape, strides, offset);
}

void em__wrap_host(em_tensor *t, em_storage *st, void *data, em_dtype dt, int ndim,
                   const int64_t *shape) {
    memset(st, 0, sizeof *st);
    atomic_init(&st->refcount, 1);
    st->device = EM_DEVICE_CPU;
    st->backend = em__backend_for(EM_CPU);
    st->block.handle = data;
    st->nbytes = st->block.size = (size_t)em__numel_raw(ndim, shape) * em_dtype_size(dt);
    st->external = true;
    memset(t, 0, sizeof *t);
    atomic_init(&t->refcount, 1);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    em__contiguous_strides(ndim, shape, t->strides);
    t->storage = st;
    t->is_leaf = true;
}

em_tensor *em_retain(em_tensor *t) {
    if (t) atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

void em_release(em_tensor *t) {
    if (!t || atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1) return;
    em__storage_release(t->storage);
    em_release(t->grad);
    em__grad_node_release(t->grad_fn);
    free(t);
}

/* ---- small helpers ---- */

char *em__shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

em_status em__wrap_dim(int *dim, int ndim, const char *op) {
    int n = ndim > 0 ? ndim : 1; /* a 0-d tensor accepts dims 0 and -1, as PyTorch does */
    if (*dim < -n || *dim >= n)
        return em_error(EM_ERR_ARGUMENT,
                        "%s: Dimension out of range (expected to be in range of [%d, %d], but got %d)", op,
                        -n, n - 1, *dim);
    if (*dim < 0) *dim += n;
    return EM_OK;
}

em_status em__check_same_device(const char *op, int n, const em_tensor *const *ts) {
    em_device d0 = ts[0]->storage->device;
    for (int i = 1; i < n; i++) {
        em_device d = ts[i]->storage->device;
        if (d.type != d0.type || d.index != d0.index)
            return em_error(EM_ERR_DEVICE,
                            "%s: Expected all tensors to be on the same device, but found at least two "
                            "devices, %s and %s!",
                            op, em_device_str(d0).s, em_device_str(d).s);
    }
    return EM_OK;
}

bool em__is_contiguous_raw(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] == 0) return true;
        if (shape[i] == 1) continue;
        if (strides[i] != expected) return false;
        expected *= shape[i];
    }
    return true;
}

double em__load_f64(const void *p, em_dtype dt) {
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_F16: return em_f16_to_f32(*(const uint16_t *)p);
    case EM_BF16: return em_bf16_to_f32(*(const uint16_t *)p);
    case EM_I64: return (double)*(const int64_t *)p;
    case EM_I32: return *(const int32_t *)p;
    case EM_U8: return *(const uint8_t *)p;
    case EM_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    default: return 0.0;
    }
}

void em__store_f64(void *p, em_dtype dt, double v) {
    switch (dt) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
    case EM_F16: *(uint16_t *)p = em_f32_to_f16((float)v); break;
    case EM_BF16: *(uint16_t *)p = em_f32_to_bf16((float)v); break;
    case EM_I64: *(int64_t *)p = (int64_t)v; break;
    case EM_I32: *(int32_t *)p = (int32_t)v; break;
    case EM_U8: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
    case EM_BOOL: *(uint8_t *)p = v != 0.0; break;
    default: break;
    }
}

/* ---- properties ---- */

#define PROP_CHECK(t, op, fail)                                                           \
    do {                                                                                  \
        if (!(t)) {                                                                       \
            if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: argument 't' is NULL", (op)); \
            return fail;                                                                  \
        }                                                                                 \
    } while (0)

int em_ndim(const em_tensor *t) {
    PROP_CHECK(t, "em_ndim", -1);
    return t->ndim;
}

static bool real_dim(const em_tensor *t, int *dim, const char *op) {
    if (t->ndim == 0) {
        em_error(EM_ERR_ARGUMENT, "%s: dimension specified as %d but tensor has no dimensions", op, *dim);
        return false;
    }
    return em__wrap_dim(dim, t->ndim, op) == EM_OK;
}

int64_t em_size(const em_tensor *t, int dim) {
    PROP_CHECK(t, "em_size", -1);
    return real_dim(t, &dim, "em_size") ? t->shape[dim] : -1;
}

int64_t em_stride(const em_tensor *t, int dim) {
    PROP_CHECK(t, "em_stride", -1);
    return real_dim(t, &dim, "em_stride") ? t->strides[dim] : -1;
}

em_shape em_shape_of(const em_tensor *t) {
    em_shape s = EM_SHAPE0;
    PROP_CHECK(t, "em_shape_of", s);
    s.ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) s.d[i] = t->shape[i];
    return s;
}

int64_t em_numel(const em_tensor *t) {
    PROP_CHECK(t, "em_numel", -1);
    return em__numel_raw(t->ndim, t->shape);
}

size_t em_nbytes(const em_tensor *t) {
    PROP_CHECK(t, "em_nbytes", 0);
    return (size_t)em__numel_raw(t->ndim, t->shape) * em_dtype_size(t->dtype);
}

em_dtype em_dtype_of(const em_tensor *t) {
    PROP_CHECK(t, "em_dtype_of", EM_F32);
    return t->dtype;
}

em_device em_device_of(const em_tensor *t) {
    PROP_CHECK(t, "em_device_of", EM_DEVICE_CPU);
    return t->storage->device;
}

bool em_is_contiguous(const em_tensor *t) {
    PROP_CHECK(t, "em_is_contiguous", false);
    return em__is_contiguous_raw(t->ndim, t->shape, t->strides);
}

bool em_shares_storage(const em_tensor *a, const em_tensor *b) {
    return a && b && a->storage == b->storage;
}

em_tensor *em__grad_borrowed(const em_tensor *t) { return t ? t->grad : NULL; }
