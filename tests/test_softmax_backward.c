/* Softmax's and log-softmax's backward through autograd: the fused one-pass kernel (the last
 * dim, f32/f64 on the CPU) against the formulas in float64 on odd shapes, a batch of one,
 * non-contiguous inputs and upstream gradients, and a dim other than the last (which
 * composes the gradient from ops). */
#include "test.h"

static double max_diff(em_tensor *a, em_tensor *b) {
    return em_item(em_max(em_abs(em_sub(em_to_dtype(a, EM_F64), em_to_dtype(b, EM_F64))), EM_ALL_DIMS, false));
}

/* x: any strides; dim: the softmax's; transpose_g: the upstream gradient arrives transposed */
static void check(em_tensor *x, int dim, bool log, bool transpose_g, em_dtype dt) {
    em_scope s = em_scope_begin();
    em_tensor *xg = em_to_dtype(em_detach(x), dt);
    if (!em_is_contiguous(x) && em_ndim(x) >= 2) xg = em_transpose(em_contiguous(em_transpose(xg, 0, 1)), 0, 1);
    CHECK_OK(em_set_requires_grad(xg, true));
    em_tensor *y = log ? em_log_softmax(xg, dim) : em_softmax(xg, dim);
    em_tensor *yt = transpose_g ? em_transpose(y, 0, 1) : y;
    em_tensor *r = em_to_dtype(em_randn(em_shape_of(yt), (em_opts){0}), dt);
    CHECK_OK(em_backward(em_sum(em_mul(yt, r), EM_ALL_DIMS, false)));
    /* the reference: g = r (transposed back), y in float64 */
    em_tensor *g = em_to_dtype(transpose_g ? em_transpose(r, 0, 1) : r, EM_F64);
    em_tensor *y64 = log ? em_log_softmax(em_to_dtype(em_detach(x), EM_F64), dim)
                         : em_softmax(em_to_dtype(em_detach(x), EM_F64), dim);
    em_tensor *ref = log ? em_sub(g, em_mul(em_exp(y64), em_sum(g, EM_DIMS(dim), true)))
                         : em_mul(y64, em_sub(g, em_sum(em_mul(g, y64), EM_DIMS(dim), true)));
    double tol = dt == EM_F64 ? 1e-12 : 2e-5;
    CHECK(max_diff(em_grad(xg), ref) < tol);
    CHECK(!em_failed());
    em_scope_end(s);
}

static void test_last_dim(void) {
    em_scope s = em_scope_begin(); /* the inputs made here */
    em_manual_seed(3);
    for (int lg = 0; lg < 2; lg++) {
        check(em_randn(EM_SHAPE(2, 3, 5, 17), (em_opts){0}), -1, lg, false, EM_F32); /* odd rows */
        check(em_randn(EM_SHAPE(1, 4, 64), (em_opts){0}), 2, lg, false, EM_F32);      /* batch 1 */
        check(em_randn(EM_SHAPE(7), (em_opts){0}), 0, lg, false, EM_F32);             /* one row */
        check(em_randn(EM_SHAPE(3, 33), (em_opts){0}), -1, lg, false, EM_F64);
    }
    em_scope_end(s);
}

static void test_strided(void) {
    em_scope s = em_scope_begin(); /* the inputs made here */
    em_manual_seed(4);
    for (int lg = 0; lg < 2; lg++) {
        check(em_transpose(em_randn(EM_SHAPE(9, 4), (em_opts){0}), 0, 1), -1, lg, false, EM_F32); /* x transposed */
        check(em_randn(EM_SHAPE(5, 6, 19), (em_opts){0}), -1, lg, true, EM_F32); /* g transposed */
    }
    em_scope_end(s);
}

static void test_other_dim(void) {
    em_scope s = em_scope_begin(); /* the inputs made here */
    em_manual_seed(5);
    for (int lg = 0; lg < 2; lg++) check(em_randn(EM_SHAPE(4, 6, 3), (em_opts){0}), 1, lg, false, EM_F32);
    em_scope_end(s);
}

static void test_masked_scores(void) { /* rows with -inf scores (a causal mask): their gradient is 0 */
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(2, 5), (em_opts){0});
    float mask[10] = {0, -INFINITY, -INFINITY, 0, 0, 0, 0, -INFINITY, 0, 0};
    em_tensor *m = em_from_data(mask, EM_F32, EM_SHAPE(2, 5), (em_opts){0});
    CHECK_OK(em_set_requires_grad(x, true));
    em_tensor *y = em_softmax(em_add(x, m), -1);
    CHECK_OK(em_backward(em_sum(em_mul(y, em_randn(EM_SHAPE(2, 5), (em_opts){0})), EM_ALL_DIMS, false)));
    float gx[10];
    CHECK_OK(em_copy_to_host(em_grad(x), gx, sizeof gx));
    CHECK(gx[1] == 0 && gx[2] == 0 && gx[7] == 0 && !isnan(gx[0]) && !isnan(gx[9]));
    em_scope_end(s);
}

int main(void) {
    RUN(test_last_dim);
    RUN(test_strided);
    RUN(test_other_dim);
    RUN(test_masked_scores);
    return test_summary();
}
