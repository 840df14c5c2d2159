/* Softmax and log-softmax: values, stability, dtypes, dims, 0-d and empty inputs. */
#include "test_core_util.h"

#define BEGIN em_scope sc__ = em_scope_begin()
#define END em_scope_end(sc__)

static void test_softmax(void) {
    BEGIN;
    em_tensor *a = TF32(EM_SHAPE(2, 3), 1, 2, 3, 0, 0, 0);
    em_tensor *s = em_softmax(a, 1);
    CHECK_VALUES(s, 1e-6, 0.090030573, 0.244728471, 0.665240956, 1. / 3, 1. / 3, 1. / 3);
    em_tensor *l = em_log_softmax(a, -1);
    CHECK_VALUES(l, 1e-5, -2.407605964, -1.407605964, -0.407605964, -1.098612289, -1.098612289, -1.098612289);
    em_tensor *s0 = em_softmax(a, 0);
    CHECK_VALUES(s0, 1e-6, 0.731058579, 0.880797078, 0.952574127, 0.268941421, 0.119202922, 0.047425873);
    /* Large inputs do not overflow. */
    CHECK_VALUES(em_softmax(TF32(EM_SHAPE(2), 1000, 1000), 0), 1e-6, 0.5, 0.5);
    /* Integers compute in float32. */
    em_tensor *i = em_softmax(TI64(EM_SHAPE(2), 0, 0), 0);
    CHECK(em_dtype_of(i) == EM_F32);
    CHECK_VALUES(i, 1e-6, 0.5, 0.5);
    em_tensor *t = em_softmax(em_transpose(a, 0, 1), 0); /* non-contiguous */
    CHECK_VALUES(t, 1e-6, 0.090030573, 1. / 3, 0.244728471, 1. / 3, 0.665240956, 1. / 3);
    CHECK(em_item(em_softmax(em_scalar(5, (em_opts){0}), 0)) == 1);
    CHECK_SHAPE(em_softmax(em_zeros(EM_SHAPE(0, 4), (em_opts){0}), 1), 0, 4);
    CHECK(em_softmax(a, 2) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_softmax: Dimension out of range");
    END;
}

int main(void) {
    RUN(test_softmax);
    return test_summary();
}
