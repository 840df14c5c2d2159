/* Sums over the batch of bf16 rows (a bf16 Linear's bias gradient) take a vectorized path in
 * src/backends/cpu/cpu_reduce.c; they must give exactly what the general path gives. The
 * values are bf16 normals and at most 300 are summed, so every sum is exact in the double
 * accumulator whatever the order: contiguous rows (the fast path) and the transposed layout
 * (the general path, reducing another way) must agree bit for bit, for sum and mean, one and
 * two threads, with a NaN and an infinity in their own columns. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

static void check(int threads) {
    em_set_num_threads(threads);
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    const int64_t R = 300, C = 4099; /* C: a full tile of columns and a partial one */
    em_tensor *base = em_to_dtype(em_randn(EM_SHAPE(C, R), EM_OPTS(0)), EM_BF16);
    em_grad_mode g = em_no_grad_begin();
    CHECK_OK(em_fill_(em_narrow(em_narrow(base, 0, 7, 1), 1, 3, 1), NAN));
    CHECK_OK(em_fill_(em_narrow(em_narrow(base, 0, 9, 1), 1, 5, 1), INFINITY));
    em_no_grad_end(g);
    em_tensor *strided = em_transpose(base, 0, 1);    /* [R, C], columns 2 bytes x R apart */
    em_tensor *rows = em_contiguous(strided);         /* [R, C], contiguous rows */
    CHECK(em_dtype_of(rows) == EM_BF16 && em_is_contiguous(rows) && !em_is_contiguous(strided));
    em_tensor *a = em_sum(rows, EM_DIMS(0), false), *b = em_sum(strided, EM_DIMS(0), false);
    CHECK(a && b && em_dtype_of(a) == EM_BF16 && test_same_bits(a, b));
    em_tensor *am = em_mean(rows, EM_DIMS(0), true), *bm = em_mean(strided, EM_DIMS(0), true);
    CHECK(am && bm && test_same_bits(am, bm));
    /* and the sums are right: against float32 sums of the same values, within bf16 rounding */
    em_tensor *ref = em_sum(em_to_dtype(rows, EM_F32), EM_DIMS(0), false);
    em_tensor *err = em_abs(em_sub(em_to_dtype(a, EM_F32), ref));
    em_tensor *tol = em_add_scalar(em_mul_scalar(em_abs(ref), 1.0 / 128), 1e-6);
    /* the NaN and inf columns compare unordered (NaN error): never counted */
    em_tensor *bad = em_sum(em_to_dtype(em_gt(err, tol), EM_F32), EM_ALL_DIMS, false);
    CHECK(em_item(bad) == 0.0);
    em_scope_end(s);
}

static void test_one_thread(void) { check(1); }
static void test_two_threads(void) { check(2); }

int main(void) {
    int threads = em_get_num_threads();
    RUN(test_one_thread);
    RUN(test_two_threads);
    em_set_num_threads(threads);
    return test_summary();
}
