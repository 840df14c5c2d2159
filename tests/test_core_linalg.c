/* em_matmul with torch.matmul's rules: vectors, matrices, batches with broadcasting. */
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

int main(void) {
    RUN(test_matrix);
    RUN(test_vectors);
    RUN(test_batched);
    RUN(test_empty);
    return test_summary();
}
