/* Helpers for the CPU backend tests: tensors built by hand over malloc'd buffers (so the
 * tests do not depend on core's constructors), a guard pattern around every byte that is not
 * part of a view (catches out-of-bounds and stray writes), and an independent element
 * accessor for references. */
#ifndef EMBER_TEST_CPU_UTIL_H
#define EMBER_TEST_CPU_UTIL_H

#include <stdlib.h>
#include "test.h"
#include "backends/backend.h"
#include "core/tensor_impl.h"

#define GUARD_BYTE 0xA5
#define GUARD_PAD 64 /* guard bytes after the last element */

/* Layouts a test tensor can have. */
typedef enum tlayout {
    L_CONTIG,     /* row-major */
    L_TRANSPOSED, /* column-major: strides of the reversed dims */
    L_SLICED,     /* every dim strided by 2 (a slice [::2]) with a storage offset */
    L_BCAST0,     /* dim 0 broadcast (stride 0) over a row-major rest */
    L_LAYOUT_COUNT
} tlayout;
static const char *const tlayout_name[] = {"contig", "transposed", "sliced", "bcast0"};

typedef struct ttensor {
    em_storage st;
    em_tensor t;
    size_t bytes;          /* the whole buffer, guards included */
    unsigned char *mask;   /* 1 for bytes that belong to the view */
    int64_t *offs;         /* byte offset of each logical element (row-major) */
} ttensor;

static inline size_t tt_esize(em_dtype dt) {
    static const size_t s[] = {4, 8, 2, 2, 8, 4, 1, 1};
    return s[dt];
}

static inline int64_t tt_numel(const em_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Byte offset (from the block start) of logical element i (row-major) of t. */
static inline int64_t tt_offset(const em_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    return off * (int64_t)tt_esize(t->dtype);
}

static inline ttensor *tt_make_strided(em_dtype dt, int ndim, const int64_t *shape, const int64_t *strides,
                                       int64_t offset) {
    ttensor *x = calloc(1, sizeof *x);
    int64_t span = 0, n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
        if (shape[d] > 0) span += (shape[d] - 1) * strides[d];
    }
    size_t es = tt_esize(dt);
    x->bytes = (size_t)(offset + (n ? span + 1 : 0)) * es + GUARD_PAD;
    x->st.refcount = 1;
    x->st.device = EM_DEVICE_CPU;
    x->st.block.handle = malloc(x->bytes);
    x->st.block.size = x->bytes;
    x->st.nbytes = x->bytes;
    memset(x->st.block.handle, GUARD_BYTE, x->bytes);
    x->t.refcount = 1;
    x->t.dtype = dt;
    x->t.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        x->t.shape[d] = shape[d];
        x->t.strides[d] = strides[d];
    }
    x->t.offset = offset;
    x->t.storage = &x->st;
    x->mask = calloc(x->bytes, 1);
    x->offs = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        x->offs[i] = tt_offset(&x->t, i);
        memset(x->mask + x->offs[i], 1, es);
    }
    return x;
}

static inline ttensor *tt_make(em_dtype dt, int ndim, const int64_t *shape, tlayout layout) {
    int64_t strides[EM_MAX_DIMS] = {0}, s = 1, offset = 0;
    switch (layout) {
    case L_CONTIG:
    case L_BCAST0:
        for (int d = ndim - 1; d >= 0; d--) { strides[d] = s; s *= shape[d] > 0 ? shape[d] : 1; }
        if (layout == L_BCAST0 && ndim > 0) strides[0] = 0;
        break;
    case L_TRANSPOSED:
        for (int d = 0; d < ndim; d++) { strides[d] = s; s *= shape[d] > 0 ? shape[d] : 1; }
        break;
    default:
        for (int d = ndim - 1; d >= 0; d--) { strides[d] = 2 * s; s *= 2 * (shape[d] > 0 ? shape[d] : 1); }
        offset = 3;
        break;
    }
    return tt_make_strided(dt, ndim, shape, strides, offset);
}

static inline void tt_free(ttensor *x) {
    if (!x) return;
    free(x->st.block.handle);
    free(x->mask);
    free(x->offs);
    free(x);
}

static inline unsigned char *tt_ptr(ttensor *x, int64_t i) {
    return (unsigned char *)x->st.block.handle + x->offs[i];
}

/* Bytes outside the view still hold the guard pattern? */
static inline bool tt_guard_ok(const ttensor *x) {
    const unsigned char *b = x->st.block.handle;
    for (size_t i = 0; i < x->bytes; i++)
        if (!x->mask[i] && b[i] != GUARD_BYTE) return false;
    return true;
}

/* Independent element access (the test's own conversions, except f16/bf16 bit formats,
 * which use the library's em_f16_to_f32 family). */
static inline double tt_get_raw(const ttensor *x, const unsigned char *p) {
    switch (x->t.dtype) {
    case EM_F32: { float v; memcpy(&v, p, 4); return v; }
    case EM_F64: { double v; memcpy(&v, p, 8); return v; }
    case EM_F16: { uint16_t v; memcpy(&v, p, 2); return em_f16_to_f32(v); }
    case EM_BF16: { uint16_t v; memcpy(&v, p, 2); return em_bf16_to_f32(v); }
    case EM_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case EM_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case EM_U8: return *p;
    default: return *p != 0;
    }
}
static inline int64_t tt_get_i64_raw(const ttensor *x, const unsigned char *p) {
    switch (x->t.dtype) {
    case EM_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    case EM_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case EM_U8: return *p;
    case EM_BOOL: return *p != 0;
    default: return (int64_t)tt_get_raw(x, p);
    }
}
static inline double tt_get(ttensor *x, int64_t i) { return tt_get_raw(x, tt_ptr(x, i)); }
static inline int64_t tt_get_i64(ttensor *x, int64_t i) { return tt_get_i64_raw(x, tt_ptr(x, i)); }
/* Store v (already representable in the dtype) into element i. */
static inline void tt_set(ttensor *x, int64_t i, double v) {
    unsigned char *p = tt_ptr(x, i);
    switch (x->t.dtype) {
    case EM_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case EM_F64: memcpy(p, &v, 8); break;
    case EM_F16: { uint16_t h = em_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
    case EM_BF16: { uint16_t h = em_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
    case EM_I64: { int64_t k = (int64_t)v; memcpy(p, &k, 8); break; }
    case EM_I32: { int32_t k = (int32_t)v; memcpy(p, &k, 4); break; }
    case EM_U8: *p = (uint8_t)v; break;
    default: *p = v != 0; break;
    }
}

static inline bool em_dtype_is_floating_test(em_dtype dt) {
    return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
}

/* Deterministic pseudo-random numbers for inputs. */
static uint64_t tt_rng_state = 0x9E3779B97F4A7C15ull;
static inline double tt_rand01(void) {
    tt_rng_state ^= tt_rng_state << 13;
    tt_rng_state ^= tt_rng_state >> 7;
    tt_rng_state ^= tt_rng_state << 17;
    return (double)(tt_rng_state >> 11) * (1.0 / 9007199254740992.0);
}
/* Fill a tensor with values exactly representable in its dtype in [lo, hi] (integers
 * for integer dtypes, 0/1 for bool, multiples of 1/64 for floats so f16/bf16 hold them). */
static inline void tt_fill_random(ttensor *x, double lo, double hi) {
    int64_t n = tt_numel(&x->t);
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * tt_rand01();
        if (x->t.dtype == EM_BOOL) v = tt_rand01() < 0.5;
        else if (x->t.dtype == EM_BF16) v = round(v * 8) / 8;
        else if (em_dtype_is_floating_test(x->t.dtype)) v = round(v * 64) / 64;
        else v = round(v);
        tt_set(x, i, v);
    }
}

/* Tolerance for a value computed in the dtype's precision. */
static inline double tt_tol(em_dtype dt, double expect) {
    double rel = dt == EM_F32 ? 2e-6 : dt == EM_F64 ? 1e-13 : dt == EM_F16 ? 2e-3 : dt == EM_BF16 ? 1.6e-2 : 0;
    return rel * (fabs(expect) > 1 ? fabs(expect) : 1);
}

/* Same value, treating NaN == NaN and equal infinities as equal. */
static inline bool tt_close(double got, double expect, double tol) {
    if (isnan(expect)) return isnan(got);
    if (isinf(expect)) return got == expect;
    return fabs(got - expect) <= tol;
}

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8, EM_BOOL};
static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"};

#endif
