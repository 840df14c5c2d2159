/* Linear on inputs of more than two dims: the contiguous ones run as one [rows, in] matrix
 * (addmm with the bias inside the GEMM; one weight-gradient GEMM over all rows), the others
 * as a batched matmul. Both must give x @ w^T + b and its gradients, checked against the
 * same formula composed by hand in float64. */
#include "test.h"

static double max_diff(em_tensor *a, em_tensor *b) {
    return em_item(em_max(em_abs(em_sub(em_to_dtype(a, EM_F64), em_to_dtype(b, EM_F64))), EM_ALL_DIMS, false));
}

/* x: the input as Linear sees it (any strides); bias: with or without */
static void check_linear(em_tensor *x, bool bias) {
    em_scope s = em_scope_begin();
    int64_t in = em_size(x, -1), out = 3;
    em_module *m = em_nn_linear_ex(in, out, bias);
    CHECK(m != NULL);
    if (!m) {
        em_scope_end(s);
        return;
    }
    em_named_tensor p[2];
    CHECK(em_module_parameters(m, p, 2) == (bias ? 2 : 1));
    em_tensor *xg = em_detach(x);
    CHECK_OK(em_set_requires_grad(xg, true));
    em_tensor *y = em_forward(m, xg);
    CHECK(y != NULL && em_ndim(y) == em_ndim(x) && em_size(y, -1) == out);
    em_tensor *r = em_randn(em_shape_of(y), (em_opts){0}); /* a random upstream gradient */
    CHECK_OK(em_backward(em_sum(em_mul(y, r), EM_ALL_DIMS, false)));

    /* the reference in float64: y = x @ w^T + b, dx = r @ w, dw = sum over rows of r^T x, db = sum r */
    em_tensor *x64 = em_to_dtype(em_detach(x), EM_F64), *w64 = em_to_dtype(em_detach(p[0].tensor), EM_F64);
    em_tensor *r64 = em_to_dtype(r, EM_F64);
    em_tensor *yref = em_matmul(x64, em_transpose(w64, 0, 1));
    if (bias) yref = em_add(yref, em_to_dtype(em_detach(p[1].tensor), EM_F64));
    int64_t rows = em_numel(x) / in;
    em_tensor *x2 = em_reshape(em_contiguous(x64), EM_SHAPE(rows, in)), *r2 = em_reshape(em_contiguous(r64), EM_SHAPE(rows, out));
    CHECK(max_diff(y, yref) < 1e-5);
    CHECK(max_diff(em_grad(xg), em_matmul(r64, w64)) < 1e-5);
    CHECK(max_diff(em_grad(p[0].tensor), em_matmul(em_transpose(r2, 0, 1), x2)) < 1e-4);
    if (bias) CHECK(max_diff(em_grad(p[1].tensor), em_sum(r2, EM_DIMS(0), false)) < 1e-4);
    CHECK(!em_failed());
    em_module_free(m);
    em_scope_end(s);
}

static void test_contiguous_rows(void) {
    em_scope s = em_scope_begin(); /* the inputs made here */
    em_manual_seed(1);
    check_linear(em_randn(EM_SHAPE(2, 3, 5), (em_opts){0}), true);
    check_linear(em_randn(EM_SHAPE(2, 3, 5), (em_opts){0}), false);
    check_linear(em_randn(EM_SHAPE(2, 2, 3, 7), (em_opts){0}), true); /* 4-d */
    check_linear(em_randn(EM_SHAPE(1, 1, 4), (em_opts){0}), true);    /* batch 1, one row */
    em_scope_end(s);
}

static void test_strided_rows(void) {
    em_scope s = em_scope_begin(); /* the inputs made here */
    em_manual_seed(2);
    /* transposed leading dims: not one matrix in memory, so the batched path */
    check_linear(em_transpose(em_randn(EM_SHAPE(3, 2, 5), (em_opts){0}), 0, 1), true);
    check_linear(em_transpose(em_randn(EM_SHAPE(3, 2, 5), (em_opts){0}), 0, 1), false);
    /* every other feature: strided rows */
    check_linear(em_narrow(em_randn(EM_SHAPE(2, 3, 8), (em_opts){0}), 2, 0, 5), true);
    em_scope_end(s);
}

static void test_empty_rows(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_linear(4, 3);
    em_tensor *y = em_forward(m, em_zeros(EM_SHAPE(2, 0, 4), (em_opts){0}));
    CHECK(y != NULL && em_ndim(y) == 3 && em_size(y, 0) == 2 && em_size(y, 1) == 0 && em_size(y, 2) == 3);
    em_forward(m, em_zeros(EM_SHAPE(2, 3, 5), (em_opts){0})); /* a wrong feature count is an error */
    CHECK(em_failed());
    em_clear_error();
    em_module_free(m);
    em_scope_end(s);
}

int main(void) {
    RUN(test_contiguous_rows);
    RUN(test_strided_rows);
    RUN(test_empty_rows);
    return test_summary();
}
