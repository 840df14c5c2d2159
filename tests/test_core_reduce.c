/* Reductions: dims lists, keepdim, dtypes, empty inputs, errors. */
#include "test_core_util.h"

#define BEGIN em_scope sc__ = em_scope_begin()
#define END em_scope_end(sc__)

static em_tensor *m23(void) { return TF32(EM_SHAPE(2, 3), 1, 5, 3, 4, 2, 6); }

static void test_sum_mean(void) {
    BEGIN;
    em_tensor *a = m23();
    em_tensor *s = em_sum(a, EM_ALL_DIMS, false);
    CHECK_SHAPE0(s);
    CHECK(em_item(s) == 21);
    CHECK_SHAPE(em_sum(a, EM_ALL_DIMS, true), 1, 1);
    em_tensor *s0 = em_sum(a, EM_DIMS(0), false);
    CHECK_SHAPE(s0, 3);
    CHECK_VALUES(s0, 0, 5, 7, 9);
    em_tensor *s1 = em_sum(a, EM_DIMS(-1), true);
    CHECK_SHAPE(s1, 2, 1);
    CHECK_VALUES(s1, 0, 9, 12);
    CHECK_VALUES(em_sum(a, EM_DIMS(1, 0), false), 0, 21);
    CHECK_VALUES(em_mean(a, EM_DIMS(1), false), 1e-6, 3, 4);
    CHECK_VALUES(em_mean(a, EM_ALL_DIMS, false), 1e-6, 3.5);
    /* Non-contiguous input. */
    CHECK_VALUES(em_sum(em_transpose(a, 0, 1), EM_DIMS(1), false), 0, 5, 7, 9);
    /* 3-d, middle dim. */
    em_tensor *b = em_view(em_arange(0, 24, 1, (em_opts){0}), EM_SHAPE(2, 3, 4));
    em_tensor *sb = em_sum(b, EM_DIMS(1), false);
    CHECK_SHAPE(sb, 2, 4);
    CHECK_VALUES(sb, 0, 12, 15, 18, 21, 48, 51, 54, 57);
    CHECK_SHAPE(em_sum(b, EM_DIMS(0, 2), true), 1, 3, 1);
    END;
}

static void test_sum_dtypes(void) {
    BEGIN;
    em_tensor *i = em_sum(em_from_data((const int32_t[]){1, 2, 3}, EM_I32, EM_SHAPE(3), EM_OPTS(.dtype = EM_I32)),
                          EM_ALL_DIMS, false);
    CHECK(em_dtype_of(i) == EM_I64);
    CHECK(em_item(i) == 6);
    em_tensor *b = em_sum(em_from_data((const uint8_t[]){1, 0, 1, 1}, EM_BOOL, EM_SHAPE(4), EM_OPTS(.dtype = EM_BOOL)),
                          EM_ALL_DIMS, false);
    CHECK(em_dtype_of(b) == EM_I64);
    CHECK(em_item(b) == 3);
    em_tensor *h = em_sum(em_ones(EM_SHAPE(3000), EM_OPTS(.dtype = EM_F16)), EM_ALL_DIMS, false);
    CHECK(em_dtype_of(h) == EM_F16);
    CHECK(em_item(h) == 3000); /* accumulated wider than half: 3000 is exact in f16 */
    CHECK(em_mean(TI64(EM_SHAPE(2), 1, 2), EM_ALL_DIMS, false) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "mean(): could not infer output dtype. Input dtype must be either a floating point or "
                              "complex dtype. Got: Long");
    em_tensor *m = em_mean(em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_F64)), EM_ALL_DIMS, false);
    CHECK(em_dtype_of(m) == EM_F64);
    END;
}

static void test_max_min(void) {
    BEGIN;
    em_tensor *a = m23();
    CHECK(em_item(em_max(a, EM_ALL_DIMS, false)) == 6);
    CHECK(em_item(em_min(a, EM_ALL_DIMS, false)) == 1);
    CHECK_VALUES(em_max(a, EM_DIMS(0), false), 0, 4, 5, 6);
    CHECK_VALUES(em_min(a, EM_DIMS(1), true), 0, 1, 2);
    CHECK_SHAPE(em_min(a, EM_DIMS(1), true), 2, 1);
    em_tensor *i = em_max(TI64(EM_SHAPE(3), -5, 7, 2), EM_ALL_DIMS, false);
    CHECK(em_dtype_of(i) == EM_I64 && em_item(i) == 7);
    em_tensor *am = em_argmax(a, 1, false);
    CHECK(em_dtype_of(am) == EM_I64);
    CHECK_VALUES(am, 0, 1, 2);
    CHECK_VALUES(em_argmin(a, 0, false), 0, 0, 1, 0);
    CHECK_SHAPE(em_argmax(a, -1, true), 2, 1);
    /* First index of the maximum on ties. */
    CHECK_VALUES(em_argmax(TF32(EM_SHAPE(4), 3, 7, 7, 1), 0, false), 0, 1);
    END;
}

static void test_zero_d_and_empty(void) {
    BEGIN;
    em_tensor *z = em_scalar(4, (em_opts){0});
    CHECK_SHAPE0(em_sum(z, EM_ALL_DIMS, false));
    CHECK(em_item(em_sum(z, EM_DIMS(0), false)) == 4);
    CHECK_SHAPE0(em_sum(z, EM_DIMS(-1), true));
    CHECK(em_item(em_max(z, EM_ALL_DIMS, false)) == 4);
    CHECK(em_item(em_argmax(z, 0, false)) == 0);
    CHECK(em_sum(z, EM_DIMS(1), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range (expected to be in range of [-1, 0], but got 1)");
    em_tensor *e = em_zeros(EM_SHAPE(0, 3), (em_opts){0});
    em_tensor *se = em_sum(e, EM_ALL_DIMS, false);
    CHECK(se && em_item(se) == 0);
    CHECK_VALUES(em_sum(e, EM_DIMS(0), false), 0, 0, 0, 0);
    CHECK_SHAPE(em_sum(e, EM_DIMS(1), false), 0);
    CHECK(isnan(em_item(em_mean(e, EM_ALL_DIMS, false))));
    CHECK(em_max(e, EM_ALL_DIMS, false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "max(): Expected reduction dim to be specified for input.numel() == 0.");
    CHECK(em_min(e, EM_DIMS(0), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "min(): Expected reduction dim 0 to have non-zero size.");
    CHECK_SHAPE(em_max(e, EM_DIMS(1), false), 0);
    CHECK(em_argmax(e, 0, false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argmax(): Expected reduction dim 0 to have non-zero size.");
    END;
}

static void test_dims_errors(void) {
    BEGIN;
    em_tensor *a = m23();
    CHECK(em_sum(a, EM_DIMS(1, -1), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_sum: dim 1 appears multiple times in the list of dims");
    CHECK(em_mean(a, EM_DIMS(2), false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_mean: Dimension out of range (expected to be in range of [-2, 1], but got 2)");
    CHECK(em_argmax(a, -3, false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_argmax: Dimension out of range");
    em_dims bad = {9, {0}};
    CHECK(em_sum(a, bad, false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "a list of 0 to 8 dims");
    CHECK(em_sum(NULL, EM_ALL_DIMS, false) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_sum: argument 'a' is NULL");
    END;
}

int main(void) {
    RUN(test_sum_mean);
    RUN(test_sum_dtypes);
    RUN(test_max_min);
    RUN(test_zero_d_and_empty);
    RUN(test_dims_errors);
    return test_summary();
}
