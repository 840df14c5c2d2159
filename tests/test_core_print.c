/* em_format / em_print: PyTorch's repr, character for character (the expected strings are
 * what torch 1.13 prints for the same tensors). */
#include "test_core_util.h"

static bool formats_as(em_tensor *t, const char *expected) {
    char buf[8192];
    int n = em_format(t, buf, sizeof buf);
    if (n != (int)strlen(expected) || strcmp(buf, expected) != 0) {
        fprintf(stderr, "    got      %s\n    expected %s\n", buf, expected);
        return false;
    }
    return true;
}
#define CHECK_FORMAT(t, s) CHECK(formats_as((t), (s)))

static em_tensor *nan_inf(void) {
    return TF32(EM_SHAPE(4), NAN, 1, INFINITY, -INFINITY);
}

static void test_floats(void) {
    em_scope s = em_scope_begin();
    CHECK_FORMAT(TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), "tensor([[1., 2.],\n        [3., 4.]])");
    CHECK_FORMAT(TF32(EM_SHAPE(3), 1.5, -2.25, 3), "tensor([ 1.5000, -2.2500,  3.0000])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), 1e-5, 1), "tensor([1.0000e-05, 1.0000e+00])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), 1e9, 1), "tensor([1.0000e+09, 1.0000e+00])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), 123456.789, 1), "tensor([1.2346e+05, 1.0000e+00])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), 0, 0), "tensor([0., 0.])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), -0.0, 1), "tensor([-0., 1.])");
    CHECK_FORMAT(nan_inf(), "tensor([nan, 1., inf, -inf])");
    CHECK_FORMAT(TF32(EM_SHAPE(2), NAN, 1.5), "tensor([   nan, 1.5000])");
    CHECK_FORMAT(em_scalar(3, (em_opts){0}), "tensor(3.)");
    CHECK_FORMAT(em_scalar(2.5, EM_OPTS(.dtype = EM_F64)), "tensor(2.5000, dtype=torch.float64)");
    CHECK_FORMAT(em_from_data((const float[]){1, 2}, EM_F32, EM_SHAPE(2), EM_OPTS(.dtype = EM_F16)),
                 "tensor([1., 2.], dtype=torch.float16)");
    CHECK_FORMAT(em_from_data((const float[]){1e-5f, 2e-5f}, EM_F32, EM_SHAPE(2), EM_OPTS(.dtype = EM_F16)),
                 "tensor([1.0014e-05, 2.0027e-05], dtype=torch.float16)");
    CHECK_FORMAT(em_view(em_arange(0, 12, 1, (em_opts){0}), EM_SHAPE(2, 3, 2)),
                 "tensor([[[ 0.,  1.],\n         [ 2.,  3.],\n         [ 4.,  5.]],\n\n"
                 "        [[ 6.,  7.],\n         [ 8.,  9.],\n         [10., 11.]]])");
    em_scope_end(s);
}

static void test_other_dtypes(void) {
    em_scope s = em_scope_begin();
    CHECK_FORMAT(TI64(EM_SHAPE(3), 1, 2, 300), "tensor([  1,   2, 300])");
    CHECK_FORMAT(em_from_data((const int64_t[]){1, 2, 300}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I32)),
                 "tensor([  1,   2, 300], dtype=torch.int32)");
    CHECK_FORMAT(em_from_data((const uint8_t[]){1, 0}, EM_BOOL, EM_SHAPE(2), EM_OPTS(.dtype = EM_BOOL)),
                 "tensor([ True, False])");
    em_tensor *u = em_mul_scalar(em_view(em_arange(0, 8, 1, EM_OPTS(.dtype = EM_U8)), EM_SHAPE(2, 2, 2)), 30);
    CHECK_FORMAT(u, "tensor([[[  0,  30],\n         [ 60,  90]],\n\n        [[120, 150],\n         [180, 210]]], "
                    "dtype=torch.uint8)");
    CHECK_FORMAT(TI64(EM_SHAPE(1), INT64_MIN), "tensor([-9223372036854775808])");
    em_scope_end(s);
}

static void test_empty_and_flags(void) {
    em_scope s = em_scope_begin();
    CHECK_FORMAT(em_zeros(EM_SHAPE(0), (em_opts){0}), "tensor([])");
    CHECK_FORMAT(em_zeros(EM_SHAPE(2, 0), (em_opts){0}), "tensor([], size=(2, 0))");
    CHECK_FORMAT(em_zeros(EM_SHAPE(0), EM_OPTS(.dtype = EM_I64)), "tensor([], dtype=torch.int64)");
    CHECK_FORMAT(em_ones(EM_SHAPE(2, 3), EM_OPTS(.requires_grad = true)),
                 "tensor([[1., 1., 1.],\n        [1., 1., 1.]], requires_grad=True)");
    em_scope_end(s);
}

static void test_wrapping_and_summary(void) {
    em_scope s = em_scope_begin();
    CHECK_FORMAT(em_arange(0, 30, 1, (em_opts){0}),
                 "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
                 "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
                 "        28., 29.])");
    CHECK_FORMAT(em_arange(0, 2000, 1, (em_opts){0}),
                 "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n        1.9990e+03])");
    CHECK_FORMAT(em_view(em_arange(0, 1200, 1, EM_OPTS(.dtype = EM_I64)), EM_SHAPE(40, 30)),
                 "tensor([[   0,    1,    2,  ...,   27,   28,   29],\n"
                 "        [  30,   31,   32,  ...,   57,   58,   59],\n"
                 "        [  60,   61,   62,  ...,   87,   88,   89],\n"
                 "        ...,\n"
                 "        [1110, 1111, 1112,  ..., 1137, 1138, 1139],\n"
                 "        [1140, 1141, 1142,  ..., 1167, 1168, 1169],\n"
                 "        [1170, 1171, 1172,  ..., 1197, 1198, 1199]])");
    /* A non-contiguous view prints its own elements. */
    CHECK_FORMAT(em_transpose(TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), 0, 1), "tensor([[1., 3.],\n        [2., 4.]])");
    em_scope_end(s);
}

static void test_format_buffer(void) {
    em_scope s = em_scope_begin();
    em_tensor *t = TF32(EM_SHAPE(2), 1, 2);
    char small[8];
    int n = em_format(t, small, sizeof small);
    CHECK(n == (int)strlen("tensor([1., 2.])"));
    CHECK(strcmp(small, "tensor(") == 0); /* truncated, NUL-terminated */
    CHECK(em_format(t, NULL, 0) == n);
    CHECK(em_format(NULL, small, sizeof small) < 0);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_format");
    CHECK(small[0] == '\0');
    CHECK(em_print(NULL) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK_OK(em_print(t));
    em_scope_end(s);
}

int main(void) {
    RUN(test_floats);
    RUN(test_other_dtypes);
    RUN(test_empty_and_flags);
    RUN(test_wrapping_and_summary);
    RUN(test_format_buffer);
    return test_summary();
}
