/* Column sums of float32 matrices (the CPU's fast path for a bias's gradient: sum or mean
 * over dim 0 of [rows, cols]): against float64 on row counts around its block of 256 rows
 * and its four-row steps, strided rows, mean, and the same bits on one thread and on two. */
#include "test.h"

static void check(int64_t rows, int64_t cols, bool strided, bool mean) {
    em_scope s = em_scope_begin();
    em_tensor *full = em_randn(EM_SHAPE(rows, cols + (strided ? 3 : 0)), (em_opts){0});
    em_tensor *x = strided ? em_narrow(full, 1, 1, cols) : full;
    em_tensor *got = mean ? em_mean(x, EM_DIMS(0), false) : em_sum(x, EM_DIMS(0), false);
    em_tensor *x64 = em_to_dtype(x, EM_F64);
    em_tensor *want = mean ? em_mean(x64, EM_DIMS(0), false) : em_sum(x64, EM_DIMS(0), false);
    double err = em_item(em_max(em_abs(em_sub(em_to_dtype(got, EM_F64), want)), EM_ALL_DIMS, false));
    /* the double sum rounded once to float: within one float rounding of the exact value */
    double scale = em_item(em_max(em_abs(want), EM_ALL_DIMS, false));
    CHECK(em_dtype_of(got) == EM_F32 && em_ndim(got) == 1 && em_size(got, 0) == cols);
    CHECK(err <= 1e-6 * (scale + 1e-30));
    em_set_num_threads(1);
    em_tensor *one = mean ? em_mean(x, EM_DIMS(0), false) : em_sum(x, EM_DIMS(0), false);
    em_set_num_threads(2);
    em_tensor *two = mean ? em_mean(x, EM_DIMS(0), false) : em_sum(x, EM_DIMS(0), false);
    float a[700], b[700];
    CHECK_OK(em_copy_to_host(one, a, sizeof(float) * (size_t)cols));
    CHECK_OK(em_copy_to_host(two, b, sizeof(float) * (size_t)cols));
    CHECK(memcmp(a, b, sizeof(float) * (size_t)cols) == 0);
    CHECK(!em_failed());
    em_scope_end(s);
}

static void test_row_counts(void) {
    static const int64_t rows[] = {2, 3, 5, 255, 256, 257, 1023, 2048, 5001};
    em_manual_seed(6);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        check(rows[i], 7, false, false);
        check(rows[i], 512, false, false);
    }
}

static void test_strided_and_mean(void) {
    em_manual_seed(7);
    check(1001, 129, true, false);
    check(1001, 129, false, true);
    check(300, 700, true, true);
}

int main(void) {
    int threads = em_get_num_threads();
    RUN(test_row_counts);
    RUN(test_strided_and_mean);
    em_set_num_threads(threads);
    return test_summary();
}
