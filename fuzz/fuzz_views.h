/* Chains of view ops with hostile arguments. The input is a small program: a starting tensor,
 * then up to FUZZ_VIEW_MAX_OPS view ops (narrow, slice, select, view, reshape, expand,
 * permute, transpose, squeeze, unsqueeze, flatten, contiguous, detach), each taking its
 * arguments from the following bytes, with sizes, starts and steps drawn often from the
 * int64 edges. Every result is checked apart from core's own arithmetic (in 128 bits): its
 * elements lie inside its storage, its numel and nbytes agree with its shape; a small one is
 * read (em_copy_to_host) and written (em_fill_, unless its elements overlap), so that
 * AddressSanitizer sees a view outside its memory. A refused op must leave a message and change nothing. (Ember has no unfold or
 * as_strided.)
 * Shared, like fuzz_more.h, by fuzz/fuzz_views.c and tests/test_fuzz_corpus_more.c. Include
 * fuzz_common.h first (FUZZ_FAIL). */
#ifndef EMBER_FUZZ_VIEWS_H
#define EMBER_FUZZ_VIEWS_H

#include <stdint.h>
#include <stdlib.h>
#include "fuzz_common.h"
#include "core/tensor_impl.h"

#define FUZZ_VIEW_MAX_OPS 32
#define FUZZ_VIEW_TOUCH 4096          /* elements read and written at most */
#define FUZZ_VIEW_COPY_MAX (1 << 16)  /* elements a copying op (reshape, contiguous) may make */

typedef struct fuzz_bytes {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

static inline uint8_t fuzz_byte(fuzz_bytes *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Mostly small numbers (-8 .. 23, sizes and starts that hit the tensor), often an int64
 * edge, sometimes 8 raw bytes. */
static inline int64_t fuzz_i64(fuzz_bytes *in) {
    static const int64_t edges[] = {
        INT64_MAX,          INT64_MIN,          INT64_MAX - 1,      INT64_MIN + 1,
        INT64_MAX / 2,      INT64_MAX / 2 + 1,  -(INT64_MAX / 2),   (int64_t)1 << 62,
        -((int64_t)1 << 62), (int64_t)1 << 32,  ((int64_t)1 << 31) - 1, (int64_t)1 << 40,
        ((int64_t)1 << 60) - 1, (int64_t)1 << 60, INT64_MAX / 3,    INT64_MAX / 8,
    };
    uint8_t sel = fuzz_byte(in);
    if (sel < 0xC0) return (int64_t)(sel & 0x1f) - 8;
    if (sel < 0xF8) return edges[sel % (sizeof edges / sizeof edges[0])];
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v = v << 8 | fuzz_byte(in);
    return (int64_t)v;
}

static inline int fuzz_dim(fuzz_bytes *in) { return (int)(int8_t)fuzz_byte(in) % 12; }

static inline em_shape fuzz_shape(fuzz_bytes *in) {
    em_shape s = {.ndim = fuzz_byte(in) % (EM_MAX_DIMS + 1)};
    for (int i = 0; i < s.ndim; i++) s.d[i] = fuzz_i64(in);
    return s;
}

/* t's elements lie inside its storage and its sizes agree; small views are read and written. */
static inline void fuzz_check_view(em_tensor *t) {
    if (t->ndim < 0 || t->ndim > EM_MAX_DIMS) {
        FUZZ_FAIL("view with a bad number of dims");
        return;
    }
    size_t esize = em_dtype_size(t->dtype);
    __int128 numel = 1, lo = t->offset, hi = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            FUZZ_FAIL("view with a negative size");
            return;
        }
        numel *= t->shape[i];
        if (numel > ((__int128)1 << 64)) numel = (__int128)1 << 64;   /* stays far from 128-bit overflow */
    }
    if (numel > 0) {
        for (int i = 0; i < t->ndim; i++) {
            __int128 reach = (__int128)(t->shape[i] - 1) * t->strides[i];
            if (reach < 0) lo += reach;
            else hi += reach;
        }
        if (lo < 0 || (hi + 1) * (__int128)esize > (__int128)t->storage->nbytes) {
            FUZZ_FAIL("view outside its storage");
            return;
        }
    }
    if (numel > INT64_MAX || em_numel(t) != (int64_t)numel || em_nbytes(t) != (size_t)numel * esize) {
        FUZZ_FAIL("view's numel or nbytes disagree with its shape");
        return;
    }
    if (numel > 0 && numel <= FUZZ_VIEW_TOUCH) {
        size_t bytes = (size_t)numel * esize;
        void *buf = malloc(bytes);
        if (buf) {
            if (em_copy_to_host(t, buf, bytes) != EM_OK) FUZZ_FAIL("a valid view cannot be read");
            else fuzz_touch(buf, bytes);
            free(buf);
        }
        /* an in-place write is refused only where elements share memory (an expanded view), as
         * in PyTorch */
        if (em_fill_(t, 1) != EM_OK && !strstr(em_last_error(), "more than one element of the written-to tensor"))
            FUZZ_FAIL("a valid view cannot be written");
        em_clear_error();
    }
}

static inline em_tensor *fuzz_view_op(em_tensor *t, fuzz_bytes *in) {
    bool small = em_numel(t) <= FUZZ_VIEW_COPY_MAX;   /* the ops that may copy run on small tensors only */
    switch (fuzz_byte(in) % 14) {
    case 0: {
        int d = fuzz_dim(in);
        int64_t start = fuzz_i64(in);
        return em_narrow(t, d, start, fuzz_i64(in));
    }
    case 1: {
        int d = fuzz_dim(in);
        int64_t start = fuzz_i64(in), end = fuzz_i64(in);
        return em_slice(t, d, start, end, fuzz_i64(in));
    }
    case 2: {
        int d = fuzz_dim(in);
        return em_select(t, d, fuzz_i64(in));
    }
    case 3: return em_view(t, fuzz_shape(in));
    case 4: {
        em_shape s = fuzz_shape(in);
        return small ? em_reshape(t, s) : em_view(t, s);
    }
    case 5: return em_expand(t, fuzz_shape(in));
    case 6: {
        em_dims order = {.n = fuzz_byte(in) % (EM_MAX_DIMS + 1)};
        for (int i = 0; i < order.n; i++) order.d[i] = fuzz_dim(in);
        return em_permute(t, order);
    }
    case 7: {
        int d0 = fuzz_dim(in);
        return em_transpose(t, d0, fuzz_dim(in));
    }
    case 8: return em_squeeze(t, fuzz_dim(in));
    case 9: return em_unsqueeze(t, fuzz_dim(in));
    case 10: {
        int d0 = fuzz_dim(in), d1 = fuzz_dim(in);
        return small ? em_flatten(t, d0, d1) : NULL;
    }
    case 11: return small ? em_contiguous(t) : NULL;
    case 12: return em_detach(t);
    default: {   /* slice with a step from the edges, the probe's favourite */
        int d = fuzz_dim(in);
        int64_t start = fuzz_i64(in);
        return em_slice(t, d, start, INT64_MAX, fuzz_i64(in));
    }
    }
}

static inline void fuzz_views_one(const uint8_t *data, size_t size) {
    fuzz_bytes in = {data, size};
    static const em_dtype dtypes[] = {EM_F32, EM_I64, EM_U8, EM_F64};
    em_dtype dt = dtypes[fuzz_byte(&in) % 4];
    em_shape s = {.ndim = fuzz_byte(&in) % 5};
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i] = fuzz_byte(&in) % 6;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_view(em_arange(0, (double)n, 1, EM_OPTS(.dtype = dt)), s);
    if (!t) {
        FUZZ_FAIL("cannot make the starting tensor");
        em_scope_end(sc);
        em_clear_error();
        return;
    }
    fuzz_check_view(t);
    for (int op = 0; op < FUZZ_VIEW_MAX_OPS && in.n; op++) {
        em_shape before = em_shape_of(t);
        em_tensor *r = fuzz_view_op(t, &in);
        if (r) {
            if (em_failed()) FUZZ_FAIL("a view op succeeded with an error pending");
            fuzz_check_view(r);
            t = r;
        } else {
            /* a refused op says why (or was skipped above, leaving no error) and changes nothing */
            em_shape after = em_shape_of(t);
            if (em_failed() && !em_last_error()[0]) FUZZ_FAIL("a refused view op without a message");
            if (before.ndim != after.ndim || memcmp(before.d, after.d, sizeof before.d))
                FUZZ_FAIL("a refused view op changed its input");
        }
        em_clear_error();
    }
    em_scope_end(sc);
}

#endif
