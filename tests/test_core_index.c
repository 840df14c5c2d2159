/* index_select, gather, cat, stack, one_hot. */
#include "test_core_util.h"

#define BEGIN em_scope sc__ = em_scope_begin()
#define END em_scope_end(sc__)

static em_tensor *m34(void) { return em_view(em_arange(0, 12, 1, (em_opts){0}), EM_SHAPE(3, 4)); }

static void test_index_select(void) {
    BEGIN;
    em_tensor *a = m34();
    em_tensor *r = em_index_select(a, 0, TI64(EM_SHAPE(3), 2, 0, 2));
    CHECK_SHAPE(r, 3, 4);
    CHECK_VALUES(r, 0, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11);
    em_tensor *i32 = em_from_data((const int32_t[]){3, 1}, EM_I32, EM_SHAPE(2), EM_OPTS(.dtype = EM_I32));
    em_tensor *c = em_index_select(a, -1, i32);
    CHECK_SHAPE(c, 3, 2);
    CHECK_VALUES(c, 0, 3, 1, 7, 5, 11, 9);
    CHECK_SHAPE(em_index_select(a, 0, em_zeros(EM_SHAPE(0), EM_OPTS(.dtype = EM_I64))), 0, 4);
    CHECK_VALUES(em_index_select(em_transpose(a, 0, 1), 1, TI64(EM_SHAPE(1), 1)), 0, 4, 5, 6, 7);
    CHECK(em_index_select(a, 0, TI64(EM_SHAPE(2), 1, 3)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_index_select: index 3 is out of bounds for dimension 0 with size 3");
    CHECK(em_index_select(a, 1, TI64(EM_SHAPE(1), -1)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "index -1 is out of bounds for dimension 1 with size 4");
    CHECK(em_index_select(a, 0, TF32(EM_SHAPE(1), 0)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "Expected dtype int32 or int64 for index, got Float");
    CHECK(em_index_select(a, 0, TI64(EM_SHAPE(1, 1), 0)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Index is supposed to be a vector");
    CHECK(em_index_select(a, 2, TI64(EM_SHAPE(1), 0)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range");
    END;
}

static void test_gather(void) {
    BEGIN;
    em_tensor *a = m34();
    em_tensor *g = em_gather(a, 1, TI64(EM_SHAPE(3, 2), 0, 3, 1, 1, 2, 0));
    CHECK_SHAPE(g, 3, 2);
    CHECK_VALUES(g, 0, 0, 3, 5, 5, 10, 8);
    em_tensor *g0 = em_gather(a, 0, TI64(EM_SHAPE(1, 4), 2, 1, 0, 2));
    CHECK_VALUES(g0, 0, 8, 5, 2, 11);
    CHECK(em_gather(a, 1, TI64(EM_SHAPE(3, 1), 0, 4, 0)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_gather: index 4 is out of bounds for dimension 1 with size 4");
    CHECK(em_gather(a, 1, TI64(EM_SHAPE(3), 0, 0, 0)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Index tensor must have the same number of dimensions as input tensor");
    CHECK(em_gather(a, 1, em_zeros(EM_SHAPE(4, 1), EM_OPTS(.dtype = EM_I64))) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Size does not match at dimension 0 expected index [4, 1] to be smaller than self [3, 4]");
    CHECK(em_gather(a, 1, em_zeros(EM_SHAPE(3, 1), EM_OPTS(.dtype = EM_BOOL))) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "gather(): Expected dtype int64");
    END;
}

static void test_cat_stack(void) {
    BEGIN;
    em_tensor *a = TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), *b = TF32(EM_SHAPE(1, 2), 5, 6);
    em_tensor *c = em_cat((em_tensor *[]){a, b}, 2, 0);
    CHECK_SHAPE(c, 3, 2);
    CHECK_VALUES(c, 0, 1, 2, 3, 4, 5, 6);
    em_tensor *d = em_cat((em_tensor *[]){a, em_transpose(a, 0, 1)}, 2, 1);
    CHECK_SHAPE(d, 2, 4);
    CHECK_VALUES(d, 0, 1, 2, 1, 3, 3, 4, 2, 4);
    /* dtypes promote; a legacy empty [0] tensor is skipped. */
    em_tensor *e = em_cat((em_tensor *[]){TI64(EM_SHAPE(2), 1, 2), em_zeros(EM_SHAPE(0), (em_opts){0}),
                                         TI64(EM_SHAPE(1), 3)}, 3, 0);
    CHECK(em_dtype_of(e) == EM_F32);
    CHECK_VALUES(e, 0, 1, 2, 3);
    CHECK_SHAPE(em_cat((em_tensor *[]){a, em_zeros(EM_SHAPE(0), (em_opts){0})}, 2, 1), 2, 2);
    CHECK(em_cat((em_tensor *[]){a, b}, 2, 1) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Sizes of tensors must match except in dimension 1. Expected size 2 but got size 1 "
                              "for tensor number 1 in the list.");
    CHECK(em_cat((em_tensor *[]){a, TF32(EM_SHAPE(2), 1, 2)}, 2, 0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Tensors must have same number of dimensions: got 2 and 1");
    CHECK(em_cat((em_tensor *[]){a, em_scalar(1, (em_opts){0})}, 2, 0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "zero-dimensional tensor (at position 1) cannot be concatenated");
    CHECK(em_cat(NULL, 0, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a non-empty list of Tensors");
    CHECK(em_cat((em_tensor *[]){a, NULL}, 2, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 'tensors[i]' is NULL");
    em_tensor *s = em_stack((em_tensor *[]){a, a}, 2, 0);
    CHECK_SHAPE(s, 2, 2, 2);
    CHECK_VALUES(s, 0, 1, 2, 3, 4, 1, 2, 3, 4);
    em_tensor *s2 = em_stack((em_tensor *[]){a, em_mul_scalar(a, 10)}, 2, -1);
    CHECK_SHAPE(s2, 2, 2, 2);
    CHECK_VALUES(s2, 0, 1, 10, 2, 20, 3, 30, 4, 40);
    CHECK_SHAPE(em_stack((em_tensor *[]){em_scalar(1, (em_opts){0}), em_scalar(2, (em_opts){0})}, 2, 0), 2);
    CHECK(em_stack((em_tensor *[]){a, b}, 2, 0) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "stack expects each tensor to be equal size, but got [2, 2] at entry 0 and [1, 2] at entry 1");
    CHECK(em_stack((em_tensor *[]){a}, 1, 3) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range");
    END;
}

static void test_one_hot(void) {
    BEGIN;
    em_tensor *o = em_one_hot(TI64(EM_SHAPE(3), 0, 2, 1), 3);
    CHECK(em_dtype_of(o) == EM_I64);
    CHECK_SHAPE(o, 3, 3);
    CHECK_VALUES(o, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0);
    em_tensor *inf = em_one_hot(TI64(EM_SHAPE(2, 1), 3, 1), -1);
    CHECK_SHAPE(inf, 2, 1, 4);
    CHECK_VALUES(inf, 0, 0, 0, 0, 1, 0, 1, 0, 0);
    CHECK(em_one_hot(TI64(EM_SHAPE(2), 0, 3), 3) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Class values must be smaller than num_classes");
    CHECK(em_one_hot(TI64(EM_SHAPE(2), 0, -1), 3) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Class values must be non-negative");
    CHECK(em_one_hot(em_zeros(EM_SHAPE(0), EM_OPTS(.dtype = EM_I64)), -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Can not infer total number of classes from empty tensor.");
    CHECK_SHAPE(em_one_hot(em_zeros(EM_SHAPE(0), EM_OPTS(.dtype = EM_I64)), 5), 0, 5);
    CHECK(em_one_hot(TF32(EM_SHAPE(1), 0), 2) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "one_hot is only applicable to index tensor");
    END;
}

int main(void) {
    RUN(test_index_select);
    RUN(test_gather);
    RUN(test_cat_stack);
    RUN(test_one_hot);
    return test_summary();
}
