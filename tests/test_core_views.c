/* View ops: shapes, strides, storage sharing, errors. Runs inside one scope per test. */
#include "test_core_util.h"

/* 0 .. n-1 as float32 with the given shape. */
static em_tensor *iota(em_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return em_view(em_arange(0, (double)n, 1, (em_opts){0}), s);
}

static void test_view(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(2, 6));
    em_tensor *v = em_view(a, EM_SHAPE(3, -1));
    CHECK_SHAPE(v, 3, 4);
    CHECK(em_shares_storage(a, v));
    CHECK_VALUES(v, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    CHECK_SHAPE(em_view(a, EM_SHAPE(12)), 12);
    CHECK_SHAPE(em_view(em_view(a, EM_SHAPE(12, 1)), EM_SHAPE(-1, 12)), 1, 12);
    CHECK(em_view(a, EM_SHAPE(-1, -1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "only one dimension can be inferred");
    CHECK(em_view(a, EM_SHAPE(5, -1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_view: shape '[5, -1]' is invalid for input of size 12");
    CHECK(em_view(a, EM_SHAPE(2, 5)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "shape '[2, 5]' is invalid for input of size 12");
    CHECK(em_view(a, EM_SHAPE(2, -3)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "invalid shape dimension -3");
    /* A transposed tensor can still split its dims, but not merge them. */
    em_tensor *t = em_transpose(iota(EM_SHAPE(3, 4)), 0, 1); /* [4, 3], strides [1, 4] */
    em_tensor *split = em_view(t, EM_SHAPE(2, 2, 3));
    CHECK(split && em_stride(split, 0) == 2 && em_stride(split, 1) == 1 && em_stride(split, 2) == 4);
    CHECK_VALUES(split, 0, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    CHECK(em_view(t, EM_SHAPE(12)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "view size is not compatible with input tensor's size and stride");
    /* Size-1 dims never block a view. */
    em_tensor *u = em_unsqueeze(t, 1); /* [4, 1, 3] */
    CHECK_SHAPE(em_view(u, EM_SHAPE(4, 3)), 4, 3);
    /* Empty and 0-d. */
    em_tensor *e = em_zeros(EM_SHAPE(0, 3), (em_opts){0});
    CHECK_SHAPE(em_view(e, EM_SHAPE(3, 0, 2)), 3, 0, 2);
    CHECK(em_view(e, EM_SHAPE(0, -1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "ambiguous");
    em_tensor *s = em_scalar(5, (em_opts){0});
    CHECK_SHAPE(em_view(s, EM_SHAPE(1, 1)), 1, 1);
    CHECK_SHAPE0(em_view(em_view(s, EM_SHAPE(-1)), EM_SHAPE0));
    em_scope_end(sc);
}

static void test_reshape(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(3, 4));
    em_tensor *r = em_reshape(a, EM_SHAPE(4, 3));
    CHECK(em_shares_storage(a, r));
    em_tensor *t = em_transpose(a, 0, 1);
    em_tensor *flat = em_reshape(t, EM_SHAPE(-1));
    CHECK(flat && !em_shares_storage(a, flat) && em_is_contiguous(flat));
    CHECK_VALUES(flat, 0, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    CHECK(em_reshape(a, EM_SHAPE(5, 5)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_reshape: shape '[5, 5]' is invalid for input of size 12");
    em_scope_end(sc);
}

static void test_transpose_permute(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(2, 3, 4));
    em_tensor *t = em_transpose(a, 0, -1);
    CHECK_SHAPE(t, 4, 3, 2);
    CHECK(!em_is_contiguous(t));
    CHECK(em_stride(t, 0) == 1 && em_stride(t, 2) == 12);
    CHECK(tval(t, 1) == 12); /* t[0][0][1] = a[1][0][0] */
    em_tensor *p = em_permute(a, EM_DIMS(1, 2, 0));
    CHECK_SHAPE(p, 3, 4, 2);
    CHECK(tval(p, 3) == 13); /* p[0][1][1] = a[1][0][1] */
    CHECK(em_permute(a, EM_DIMS(0, 1)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "number of dims don't match in permute");
    CHECK(em_permute(a, EM_DIMS(0, 1, 1)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "duplicate dims are not allowed");
    CHECK(em_permute(a, EM_DIMS(0, 1, 3)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range (expected to be in range of [-3, 2], but got 3)");
    CHECK(em_transpose(a, 0, 5) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_transpose: Dimension out of range");
    em_tensor *s = em_scalar(1, (em_opts){0});
    CHECK_SHAPE0(em_transpose(s, 0, -1));
    em_scope_end(sc);
}

static void test_narrow_slice_select(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(4, 5));
    em_tensor *n = em_narrow(a, 1, -3, 2);
    CHECK_SHAPE(n, 4, 2);
    CHECK_VALUES(n, 0, 2, 3, 7, 8, 12, 13, 17, 18);
    CHECK(em_narrow(a, 0, 3, 2) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "start (3) + length (2) exceeds dimension size (4).");
    CHECK(em_narrow(a, 0, 5, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "start out of range");
    CHECK_SHAPE(em_narrow(a, 0, 4, 0), 0, 5);
    em_tensor *s = em_slice(a, 1, 1, 100, 2);
    CHECK_SHAPE(s, 4, 2);
    CHECK(em_stride(s, 1) == 2);
    CHECK_VALUES(s, 0, 1, 3, 6, 8, 11, 13, 16, 18);
    CHECK_SHAPE(em_slice(a, 0, -2, INT64_MAX, 1), 2, 5);
    CHECK_SHAPE(em_slice(a, 0, 3, 1, 1), 0, 5); /* end before start: empty */
    CHECK_SHAPE(em_slice(a, 0, -100, 2, 3), 1, 5);
    CHECK(em_slice(a, 0, 0, 2, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "slice step must be positive");
    em_tensor *r = em_select(a, 0, -1);
    CHECK_SHAPE(r, 5);
    CHECK_VALUES(r, 0, 15, 16, 17, 18, 19);
    em_tensor *c = em_select(a, 1, 2);
    CHECK_VALUES(c, 0, 2, 7, 12, 17);
    CHECK(em_select(a, 0, 4) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_select: index 4 out of range for tensor of size [4, 5] at dimension 0");
    em_tensor *z = em_scalar(3, (em_opts){0});
    CHECK(em_select(z, 0, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "select() cannot be applied to a 0-dim tensor.");
    CHECK(em_narrow(z, 0, 0, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "narrow() cannot be applied to a 0-dim tensor.");
    CHECK_SHAPE0(em_select(em_select(a, 0, 1), 0, 1));
    em_scope_end(sc);
}

static void test_expand(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(3, 1));
    em_tensor *e = em_expand(a, EM_SHAPE(2, -1, 4));
    CHECK_SHAPE(e, 2, 3, 4);
    CHECK(em_stride(e, 0) == 0 && em_stride(e, 2) == 0 && em_stride(e, 1) == 1);
    CHECK(em_shares_storage(a, e));
    CHECK(tval(e, 23) == 2 && tval(e, 4) == 1);
    CHECK(em_expand(a, EM_SHAPE(3, 2, 4)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "The expanded size of the tensor (2) must match the existing size (3) at non-singleton "
                              "dimension 1.  Target sizes: [3, 2, 4].  Tensor sizes: [3, 1]");
    CHECK(em_expand(a, EM_SHAPE(4)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "must be greater or equal to the number of dimensions");
    CHECK(em_expand(a, EM_SHAPE(-1, 3, 1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "isn't allowed in a leading, non-existing dimension 0");
    CHECK_SHAPE(em_expand(a, EM_SHAPE(3, 0)), 3, 0);
    CHECK_SHAPE(em_expand(em_scalar(1, (em_opts){0}), EM_SHAPE(2, 2)), 2, 2);
    em_scope_end(sc);
}

static void test_squeeze_unsqueeze_flatten(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(2, 1, 3));
    CHECK_SHAPE(em_squeeze(a, 1), 2, 3);
    CHECK_SHAPE(em_squeeze(a, -3), 2, 1, 3); /* size 2: unchanged, as in PyTorch */
    CHECK(em_squeeze(a, 3) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range");
    em_tensor *u = em_unsqueeze(a, -1);
    CHECK_SHAPE(u, 2, 1, 3, 1);
    CHECK(em_stride(u, 3) == 1);
    em_tensor *u0 = em_unsqueeze(a, 0);
    CHECK_SHAPE(u0, 1, 2, 1, 3);
    CHECK(em_stride(u0, 0) == 6);
    CHECK(em_unsqueeze(a, 4) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected to be in range of [-4, 3], but got 4");
    CHECK_SHAPE(em_unsqueeze(em_scalar(1, (em_opts){0}), 0), 1);
    CHECK_SHAPE0(em_squeeze(em_scalar(1, (em_opts){0}), 0));
    em_tensor *b = iota(EM_SHAPE(2, 3, 4));
    CHECK_SHAPE(em_flatten(b, 0, -1), 24);
    CHECK_SHAPE(em_flatten(b, 1, 2), 2, 12);
    CHECK(em_shares_storage(b, em_flatten(b, 0, 1)));
    CHECK_SHAPE(em_flatten(b, 1, 1), 2, 3, 4);
    CHECK(em_flatten(b, 2, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "start_dim cannot come after end_dim");
    CHECK_SHAPE(em_flatten(em_scalar(2, (em_opts){0}), 0, -1), 1);
    em_tensor *tb = em_transpose(b, 0, 2); /* [4, 3, 2]: flattening needs a copy */
    em_tensor *f = em_flatten(tb, 0, 1);
    CHECK_SHAPE(f, 12, 2);
    CHECK(!em_shares_storage(b, f));
    CHECK(tval(f, 1) == 12 && tval(f, 2) == 4);
    em_scope_end(sc);
}

static void test_contiguous_detach(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = iota(EM_SHAPE(2, 3));
    CHECK(em_contiguous(a) == a);
    em_tensor *t = em_transpose(a, 0, 1);
    em_tensor *c = em_contiguous(t);
    CHECK(c != t && em_is_contiguous(c) && !em_shares_storage(c, a));
    CHECK_VALUES(c, 0, 0, 3, 1, 4, 2, 5);
    em_tensor *g = em_ones(EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    em_tensor *d = em_detach(g);
    CHECK(d && !d->requires_grad && d->is_leaf && em_shares_storage(d, g));
    em_scope_end(sc);
}

/* Writes through one view are seen by every other view of the storage. */
static void test_aliasing(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_zeros(EM_SHAPE(3, 4), (em_opts){0});
    CHECK_OK(em_fill_(em_select(a, 1, 2), 7));          /* column 2 */
    CHECK_OK(em_fill_(em_slice(a, 0, 0, 3, 2), 1));       /* rows 0 and 2 */
    CHECK_VALUES(a, 0, 1, 1, 1, 1, 0, 0, 7, 0, 1, 1, 1, 1);
    em_tensor *t = em_transpose(a, 0, 1);
    CHECK_OK(em_copy_(em_select(t, 0, 3), TF32(EM_SHAPE(3), 5, 6, 8))); /* column 3 of a */
    CHECK_VALUES(a, 0, 1, 1, 1, 5, 0, 0, 7, 6, 1, 1, 1, 8);
    unsigned v = atomic_load(&a->storage->version);
    CHECK(v == 3);
    CHECK(em_fill_(em_expand(em_zeros(EM_SHAPE(1), (em_opts){0}), EM_SHAPE(3)), 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "more than one element of the written-to tensor refers to a single memory location");
    em_scope_end(sc);
}

/* Sizes, starts, steps and paddings near INT64_MAX: each view stays inside its tensor (or is
 * refused with EM_ERR_ARGUMENT), as PyTorch's answers say, and no arithmetic overflows (the
 * ASan + UBSan build aborts on a signed overflow). */
static void test_view_arithmetic_overflow(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_arange(0, 8, 1, (em_opts){0});
    /* narrow(0, 1, 2^63 - 1) ran past the tensor (2^63 - 1 elements over a storage of 8) */
    CHECK(em_narrow(a, 0, 1, INT64_MAX) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "exceeds dimension size (8)");
    CHECK(em_narrow(a, 0, -1, INT64_MAX) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "exceeds dimension size");
    CHECK(em_narrow(a, 0, INT64_MIN, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "start out of range");
    CHECK_SHAPE(em_narrow(a, 0, 8, 0), 0);
    /* slice with a step of 2^63 - 1: one element, as in PyTorch (a[2:8:2**63-1] is [2]) */
    em_tensor *s1 = em_slice(a, 0, 2, 8, INT64_MAX);
    CHECK_SHAPE(s1, 1);
    CHECK_VALUES(s1, 0, 2);
    CHECK(s1 && em_fill_(s1, -1) == EM_OK);
    CHECK_VALUES(a, 0, 0, 1, -1, 3, 4, 5, 6, 7);
    CHECK_SHAPE(em_slice(a, 0, INT64_MIN, INT64_MAX, INT64_MAX), 1);
    CHECK_SHAPE(em_slice(a, 0, INT64_MAX, INT64_MIN, 1), 0);
    CHECK_SHAPE(em_slice(a, 0, 7, INT64_MAX, 3), 1);
    /* m[2, 3, 4][0:4:2**63-1] is m[0:1]: size 1 (it was size -1 with stride -12) */
    em_tensor *m = iota(EM_SHAPE(2, 3, 4));
    em_tensor *s2 = em_slice(m, 0, 0, 4, INT64_MAX);
    CHECK_SHAPE(s2, 1, 3, 4);
    CHECK(s2 && em_stride(s2, 0) > 0);
    em_tensor *s2c = em_contiguous(s2);
    CHECK(s2c && em_item(em_sum(s2c, EM_ALL_DIMS, false)) == 66);   /* 0 + 1 + ... + 11 */
    CHECK_SHAPE(em_slice(m, 2, 1, INT64_MAX, INT64_MAX - 1), 2, 3, 1);
    /* shapes whose element count overflows */
    em_tensor *one = em_ones(EM_SHAPE(1, 1), (em_opts){0});
    CHECK(em_expand(one, EM_SHAPE((int64_t)1 << 40, (int64_t)1 << 40)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_expand: the expanded shape [1099511627776, 1099511627776] has too many elements");
    CHECK(em_expand(one, EM_SHAPE(INT64_MAX, INT64_MAX, 0)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "too many elements");
    CHECK(em_view(m, EM_SHAPE(INT64_MAX, 3, 0)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "is invalid for input of size 24");
    CHECK(em_view(m, EM_SHAPE(INT64_MAX, INT64_MAX, -1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "is invalid for input of size 24");
    em_tensor *empty = em_empty(EM_SHAPE(0), (em_opts){0});
    CHECK(em_view(empty, EM_SHAPE(0, INT64_MAX, INT64_MAX)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "too many elements");
    CHECK(em_reshape(empty, EM_SHAPE(INT64_MAX, 4, 0)) == NULL);   /* the product overflows before the 0 */
    CHECK_ERROR(EM_ERR_SHAPE, "is invalid for input of size 0");
    CHECK(em_empty(EM_SHAPE(0, INT64_MAX, INT64_MAX), (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "too many elements");
    /* a broadcast result that cannot be indexed: [2^40, 1] + [1, 2^40] */
    em_tensor *col = em_expand(one, EM_SHAPE((int64_t)1 << 40, 1)), *row = em_expand(one, EM_SHAPE(1, (int64_t)1 << 40));
    CHECK(col && row && em_add(col, row) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "too many elements");
    /* concatenating nine [2^60 - 1] views: their sizes add up past int64 */
    em_tensor *huge = em_expand(em_ones(EM_SHAPE(1), (em_opts){0}), EM_SHAPE(((int64_t)1 << 60) - 1));
    CHECK(huge != NULL);
    em_tensor *nine[9];
    for (int i = 0; i < 9; i++) nine[i] = huge;
    CHECK(huge && em_cat(nine, 9, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "add up past the int64 range");
    CHECK(huge && em_cat(nine, 2, 0) == NULL);   /* 2^61 - 2 elements: too many to index */
    CHECK_ERROR(EM_ERR_ARGUMENT, "too many elements");
    /* unsqueeze of a size-1 dim with a huge stride keeps a stride that fits */
    em_tensor *u = em_unsqueeze(em_slice(m, 0, 0, 1, 1), 0);
    CHECK_SHAPE(u, 1, 1, 3, 4);
    /* convolution and pooling windows: padding INT64_MAX / 2 made in + 2p overflow */
    em_tensor *x = em_ones(EM_SHAPE(1, 1, 4, 4), (em_opts){0}), *w = em_ones(EM_SHAPE(1, 1, 3, 3), (em_opts){0});
    CHECK(em_conv2d(x, w, NULL, EM_HW1(1), EM_HW1(INT64_MAX / 2), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "conv2d: the padded input or the dilated kernel size overflows int64");
    CHECK(em_conv2d(x, w, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(INT64_MAX), 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "overflows int64");
    /* padding 2^40: an output of [1, 1, 2^41, 2^41] is too large to index, not a wrapped size */
    CHECK(em_conv2d(x, w, NULL, EM_HW1(1), EM_HW1((int64_t)1 << 40), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "too many elements");
    CHECK(em_max_pool2d(x, EM_HW1(INT64_MAX), EM_HW1(1), EM_HW1(INT64_MAX / 2), EM_HW1(1), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "max_pool2d: the padded input or the dilated kernel size overflows int64");
    CHECK(em_max_pool2d(x, EM_HW1(3), EM_HW1(INT64_MAX), EM_HW1(1), EM_HW1(1), true) != NULL);
    CHECK(em_avg_pool2d(x, EM_HW1(3), EM_HW1(INT64_MAX), EM_HW1(1), true, true, 0) != NULL);
    CHECK(em_max_pool2d(x, EM_HW1(2), EM_HW1(1), EM_HW1(1), EM_HW1(INT64_MAX), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "overflows int64");
    CHECK(!em_failed());
    em_scope_end(sc);
}

static void test_null_args(void) {
    CHECK(em_view(NULL, EM_SHAPE(1)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_view: argument 't' is NULL");
    CHECK(em_transpose(NULL, 0, 1) == NULL);
    CHECK(em_expand(NULL, EM_SHAPE(1)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_transpose: argument 't' is NULL"); /* the first one stays */
}

int main(void) {
    RUN(test_view);
    RUN(test_reshape);
    RUN(test_transpose_permute);
    RUN(test_narrow_slice_select);
    RUN(test_expand);
    RUN(test_squeeze_unsqueeze_flatten);
    RUN(test_contiguous_detach);
    RUN(test_aliasing);
    RUN(test_view_arithmetic_overflow);
    RUN(test_null_args);
    return test_summary();
}
