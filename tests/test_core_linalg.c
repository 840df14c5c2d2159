/* em_matmul with torch.matmul's rules: vectors, matrices, batches with broadcasting; em_addmm
 * (torch.addmm) against matmul + add. */
#include "test_core_util.h"

#define BEGIN em_scope sc__ = em_scope_begin()
#define END em_scope_end(sc__)

static void test_matrix(void) {
    BEGIN;
    em_tensor *a = TF32(EM_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *b = TF32(EM_SHAPE(3, 2), 7, 8, 9, 10, 11, 12);
    em_tensor *c = em_matmul(a, b);
    CHECK_SHAPE(c, 2, 2);
    CHECK_VALUES(c, 0, 58, 64, 139, 154);
    /* Transposed (non-contiguous) operands. */
    em_tensor *ct = em_matmul(em_transpose(b, 0, 1), em_transpose(a, 0, 1));
    CHECK_VALUES(ct, 0, 58, 139, 64, 154);
    /* Mixed dtypes promote. */
    em_tensor *m = em_matmul(TI64(EM_SHAPE(1, 2), 1, 2), TF32(EM_SHAPE(2, 1), 0.5, 0.25));
    CHECK(em_dtype_of(m) == EM_F32);
    CHECK_VALUES(m, 0, 1);
    CHECK(em_matmul(a, a) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_matmul: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
    END;
}

static void test_vectors(void) {
    BEGIN;
    em_tensor *v = TF32(EM_SHAPE(3), 1, 2, 3);
    em_tensor *d = em_matmul(v, v);
    CHECK_SHAPE0(d);
    CHECK(em_item(d) == 14);
    em_tensor *a = TF32(EM_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *mv = em_matmul(a, v);
    CHECK_SHAPE(mv, 2);
    CHECK_VALUES(mv, 0, 14, 32);
    em_tensor *vm = em_matmul(TF32(EM_SHAPE(2), 1, -1), a);
    CHECK_SHAPE(vm, 3);
    CHECK_VALUES(vm, 0, -3, -3, -3);
    CHECK(em_matmul(v, TF32(EM_SHAPE(2), 1, 1)) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cannot be multiplied (1x3 and 2x1)");
    CHECK(em_matmul(em_scalar(1, (em_opts){0}), v) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "both arguments to matmul need to be at least 1D, but they are 0D and 1D");
    END;
}

static void test_batched(void) {
    BEGIN;
    /* [2, 2, 3] @ [3, 2]: the matrix broadcasts over the batch. */
    em_tensor *a = em_view(em_arange(0, 12, 1, (em_opts){0}), EM_SHAPE(2, 2, 3));
    em_tensor *b = TF32(EM_SHAPE(3, 2), 1, 0, 0, 1, 1, 1);
    em_tensor *c = em_matmul(a, b);
    CHECK_SHAPE(c, 2, 2, 2);
    CHECK_VALUES(c, 0, 2, 3, 8, 9, 14, 15, 20, 21);
    /* [2, 1, 2, 3] @ [3, 3, 1]: batch dims broadcast to [2, 3]. */
    em_tensor *x = em_view(em_arange(0, 12, 1, (em_opts){0}), EM_SHAPE(2, 1, 2, 3));
    em_tensor *y = em_view(em_arange(0, 9, 1, (em_opts){0}), EM_SHAPE(3, 3, 1));
    em_tensor *z = em_matmul(x, y);
    CHECK_SHAPE(z, 2, 3, 2, 1);
    /* z[1][2] = x[1][0] @ y[2] = [[6,7,8],[9,10,11]] @ [6,7,8]^T = [149, 212] */
    CHECK(tval(z, 10) == 149 && tval(z, 11) == 212);
    /* z[0][0] = [[0,1,2],[3,4,5]] @ [0,1,2] = [5, 14] */
    CHECK(tval(z, 0) == 5 && tval(z, 1) == 14);
    /* Batched with a vector on either side. */
    em_tensor *bv = em_matmul(a, TF32(EM_SHAPE(3), 1, 1, 1));
    CHECK_SHAPE(bv, 2, 2);
    CHECK_VALUES(bv, 0, 3, 12, 21, 30);
    em_tensor *vb = em_matmul(TF32(EM_SHAPE(2), 1, 1), a);
    CHECK_SHAPE(vb, 2, 3);
    CHECK_VALUES(vb, 0, 3, 5, 7, 15, 17, 19);
    CHECK(em_matmul(em_ones(EM_SHAPE(2, 2, 3), (em_opts){0}), em_ones(EM_SHAPE(3, 3, 1), (em_opts){0})) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_matmul: batch shapes [2] and [3] cannot be broadcast");
    END;
}

static void test_empty(void) {
    BEGIN;
    em_tensor *z = em_matmul(em_ones(EM_SHAPE(2, 0), (em_opts){0}), em_ones(EM_SHAPE(0, 3), (em_opts){0}));
    CHECK_SHAPE(z, 2, 3);
    CHECK_VALUES(z, 0, 0, 0, 0, 0, 0, 0);
    CHECK_SHAPE(em_matmul(em_ones(EM_SHAPE(0, 4), (em_opts){0}), em_ones(EM_SHAPE(4, 5), (em_opts){0})), 0, 5);
    END;
}

/* max |x - y| over two tensors of one shape (as f64) */
static double max_diff(em_tensor *x, em_tensor *y) {
    em_tensor *d = em_max(em_abs(em_sub(em_to_dtype(x, EM_F64), em_to_dtype(y, EM_F64))), EM_ALL_DIMS, false);
    return d ? em_item(d) : INFINITY;
}

static void test_addmm(void) {
    BEGIN;
    em_tensor *a = TF32(EM_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *b = TF32(EM_SHAPE(3, 2), 7, 8, 9, 10, 11, 12);
    /* bias [N], row [1, N], column [M, 1], full [M, N], 0-d */
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2), 1, -1), a, b, 1, 1), 0, 59, 63, 140, 153);
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(1, 2), 1, -1), a, b, 1, 1), 0, 59, 63, 140, 153);
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2, 1), 1, -1), a, b, 1, 1), 0, 59, 65, 138, 153);
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), a, b, 1, 1), 0, 59, 66, 142, 158);
    CHECK_VALUES(em_addmm(em_scalar(0.5, (em_opts){0}), a, b, 1, 1), 0, 58.5, 64.5, 139.5, 154.5);
    /* beta and alpha; beta = 0 ignores a nan input */
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2), 2, 4), a, b, 0.5, 2), 0, 117, 130, 279, 310);
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2), NAN, NAN), a, b, 0, 1), 0, 58, 64, 139, 154);
    /* Linear's layout, bigger than a BLAS block, f32 and f64: same as matmul + add */
    for (int dbl = 0; dbl < 2; dbl++) {
        em_opts o = {.dtype = dbl ? EM_F64 : EM_F32};
        em_tensor *x = em_randn(EM_SHAPE(70, 33), o), *w = em_randn(EM_SHAPE(41, 33), o), *bias = em_randn(EM_SHAPE(41), o);
        em_tensor *y = em_addmm(bias, x, em_transpose(w, 0, 1), 1, 1);
        CHECK_SHAPE(y, 70, 41);
        CHECK(em_dtype_of(y) == o.dtype);
        CHECK(max_diff(y, em_add(em_matmul(x, em_transpose(w, 0, 1)), bias)) < (dbl ? 1e-12 : 1e-4));
        /* a non-contiguous, non-transposed mat1 (every other column) goes through a copy */
        em_tensor *xs = em_slice(em_randn(EM_SHAPE(70, 66), o), 1, 0, 66, 2);
        CHECK(max_diff(em_addmm(bias, xs, em_transpose(w, 0, 1), 1, 1),
                       em_add(em_matmul(xs, em_transpose(w, 0, 1)), bias)) < (dbl ? 1e-12 : 1e-4));
    }
    /* mixed dtypes promote like matmul + add */
    em_tensor *m = em_addmm(TI64(EM_SHAPE(2), 1, 2), TF32(EM_SHAPE(1, 2), 1, 1), TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), 1, 1);
    CHECK(m && em_dtype_of(m) == EM_F32);
    CHECK_VALUES(m, 0, 5, 8);
    /* empty K: just the bias */
    CHECK_VALUES(em_addmm(TF32(EM_SHAPE(2), 3, 4), em_ones(EM_SHAPE(1, 0), (em_opts){0}),
                          em_ones(EM_SHAPE(0, 2), (em_opts){0}), 1, 1), 0, 3, 4);
    /* bad shapes: a clean error, no result */
    CHECK(em_addmm(TF32(EM_SHAPE(2), 1, 1), a, a, 1, 1) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_addmm: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
    CHECK(em_addmm(TF32(EM_SHAPE(3), 1, 1, 1), a, b, 1, 1) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_addmm: input of shape [3] cannot be broadcast to the product's shape [2, 2]");
    CHECK(em_addmm(em_ones(EM_SHAPE(1, 2, 2), (em_opts){0}), a, b, 1, 1) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "input of shape [1, 2, 2] cannot be broadcast");
    CHECK(em_addmm(TF32(EM_SHAPE(2), 1, 1), TF32(EM_SHAPE(3), 1, 2, 3), b, 1, 1) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_addmm: mat1 must be a matrix, got 1-D tensor");
    em_clear_error(); /* a NULL argument reports only when no error is pending */
    CHECK(em_addmm(TF32(EM_SHAPE(2), 1, 1), a, NULL, 1, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_addmm: argument 'mat2' is NULL");
    END;
}

int main(void) {
    RUN(test_matrix);
    RUN(test_vectors);
    RUN(test_batched);
    RUN(test_empty);
    RUN(test_addmm);
    return test_summary();
}
