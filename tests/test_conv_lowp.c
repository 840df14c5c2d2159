#define _POSIX_C_SOURCE 200809L
/* conv2d and the pools in bfloat16 / float16 beyond the golden replay (test_conv_golden runs
 * PyTorch's cases in both dtypes):
 *  - float32 accumulation: on the CNN's second convolution (400 products a sum) every output
 *    and both gradients are within one rounding of the exact answer on the same rounded
 *    inputs; sums in bf16 would be off by several units of the last place;
 *  - max pool picks the same element as float32 (ties included) on every device;
 *  - which kernel the CPU's bf16 convolution gets (oneDNN's own bf16 kernel where the CPU
 *    has AVX512-BF16/AMX);
 *  - autocast: conv2d runs in the region's dtype, the pools in their input's, a float32
 *    weight gets a float32 gradient;
 *  - bad input: mixed dtypes and integer inputs still give a clear error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "core/internal_api.h"
#include "backends/cpu/cpu_dnnl.h"
#include "backends/cpu/cpu_conv_lowp.h"
#include "test.h"

/* one ulp's half relative to the value: bf16 keeps 8 significant bits, f16 11 */
static double half_ulp(em_dtype dt) { return dt == EM_BF16 ? 1.0 / 256 : 1.0 / 2048; }

/* largest |got - want| / (half_ulp * |want| + floor), want in float64 */
static double err_ulps(em_tensor *got, em_tensor *want, em_dtype dt) {
    int64_t n = em_numel(want);
    double *g = malloc((size_t)n * 8), *w = malloc((size_t)n * 8), worst = INFINITY;
    if (g && w && em_copy_to_host(em_to_dtype(got, EM_F64), g, (size_t)n * 8) == EM_OK &&
        em_copy_to_host(em_contiguous(want), w, (size_t)n * 8) == EM_OK) {
        double scale = 0;
        for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(w[i]));
        worst = 0;
        /* the floor: float32 accumulation's own error, far below a 16-bit rounding */
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - w[i]) / (half_ulp(dt) * fabs(w[i]) + 1e-5 * scale));
    }
    free(g);
    free(w);
    return worst;
}

/* x [4, 16, 14, 14] * w [32, 16, 5, 5] (the CNN's conv2) in dt on dev against float64 on the
 * same rounded values; backward too when `backward` (one rounding on the library paths) */
static void check_accumulation(em_device dev, em_dtype dt, bool portable, bool backward, const char *cfg) {
    em_scope s = em_scope_begin();
    em_manual_seed(21);
    bool prev = em__conv_force_portable(portable);
    em_tensor *x = em_to_dtype(em_randn(EM_SHAPE(4, 16, 14, 14), EM_OPTS(0)), dt);
    em_tensor *w = em_to_dtype(em_mul_scalar(em_randn(EM_SHAPE(32, 16, 5, 5), EM_OPTS(0)), 0.2), dt);
    em_tensor *gy = em_to_dtype(em_randn(EM_SHAPE(4, 32, 10, 10), EM_OPTS(0)), dt);
    em_tensor *x64 = em_to_dtype(x, EM_F64), *w64 = em_to_dtype(w, EM_F64), *gy64 = em_to_dtype(gy, EM_F64);
    CHECK_OK(em_set_requires_grad(x64, true));
    CHECK_OK(em_set_requires_grad(w64, true));
    em_tensor *ref = em_conv2d(x64, w64, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
    CHECK_OK(em_backward_with(ref, gy64, false));
    em_tensor *xd = em_to(x, dev), *wd = em_to(w, dev);
    CHECK_OK(em_set_requires_grad(xd, true));
    CHECK_OK(em_set_requires_grad(wd, true));
    em_tensor *y = em_conv2d(xd, wd, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
    CHECK(y && em_dtype_of(y) == dt);
    if (y) {
        double e = err_ulps(em_to(y, EM_DEVICE_CPU), ref, dt);
        printf("  %-36s forward: %.2f of one rounding\n", cfg, e);
        CHECK(e <= 1.0);
    }
    if (y && backward) {
        CHECK_OK(em_backward_with(y, em_to(gy, dev), false));
        double ex = err_ulps(em_to(em_grad(xd), EM_DEVICE_CPU), em_grad(x64), dt);
        double ew = err_ulps(em_to(em_grad(wd), EM_DEVICE_CPU), em_grad(w64), dt);
        printf("  %-36s input grad %.2f, weight grad %.2f\n", cfg, ex, ew);
        CHECK(ex <= 1.0 && ew <= 1.0);
        CHECK(em_dtype_of(em_grad(wd)) == dt);
    }
    em__conv_force_portable(prev);
    if (em_failed()) fprintf(stderr, "  %s: %s\n", cfg, em_last_error());
    em_scope_end(s);
}

static void test_accumulation_cpu(void) {
#ifdef EMBER_HAVE_DNNL
    check_accumulation(EM_DEVICE_CPU, EM_BF16, false, true, "cpu bf16 (oneDNN)");
    check_accumulation(EM_DEVICE_CPU, EM_F16, false, true, "cpu f16 (oneDNN on float32 copies)");
    setenv("EMBER_CPU_LOWP_GEMM", "portable", 1);
    check_accumulation(EM_DEVICE_CPU, EM_BF16, false, true, "cpu bf16 (oneDNN on float32 copies)");
    check_accumulation(EM_DEVICE_CPU, EM_BF16, true, false, "cpu bf16 (im2col, float32 GEMM)");
    unsetenv("EMBER_CPU_LOWP_GEMM");
#else
    test_skip("built without oneDNN: the portable path only");
#endif
    /* the portable path's backward rounds its column buffer (as PyTorch's im2col path does):
     * the forward is one rounding, the golden replay bounds the rest */
    check_accumulation(EM_DEVICE_CPU, EM_BF16, true, false, "cpu bf16 (im2col)");
    check_accumulation(EM_DEVICE_CPU, EM_F16, true, false, "cpu f16 (im2col)");
}

static void test_accumulation_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_device d = EM_DEVICE(EM_OPENCL, 0);
    check_accumulation(d, EM_BF16, false, false, "opencl:0 bf16 (im2col)");
    check_accumulation(d, EM_F16, false, false, "opencl:0 f16 (im2col)");
}

/* the CPU's bf16 convolution runs oneDNN's own bf16 kernel where matmul found one */
static void test_cpu_bf16_kernel(void) {
#ifdef EMBER_HAVE_DNNL
    if (!em__cpu_dnnl_runs(EM_BF16)) SKIP("no fast oneDNN bf16 kernel on this CPU: float32 copies run instead");
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_SHAPE(2, 16, 14, 14), EM_OPTS(.dtype = EM_BF16));
    em_tensor *w = em_ones(EM_SHAPE(32, 16, 5, 5), EM_OPTS(.dtype = EM_BF16));
    em_tensor *y = em_conv2d(x, w, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
    CHECK(y != NULL);
    CHECK(y && em_item(em_sum(em_to_dtype(y, EM_F64), EM_ALL_DIMS, false)) == 2.0 * 32 * 100 * 400);
    const char *d = em__cpu_conv_lowp_describe();
    printf("  cpu bf16 conv2d: %s\n", d);
    CHECK(strstr(d, "oneDNN") != NULL && strstr(d, "ref") == NULL);
    em_scope_end(s);
#else
    SKIP("built without oneDNN");
#endif
}

/* max pool in dt picks what float32 picks on the same values, ties included (values from
 * a small set), and sends the gradient to the same elements */
static void check_max_pool(em_device dev, em_dtype dt) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *x = em_to(em_to_dtype(em_mul_scalar(em_randint(-3, 4, EM_SHAPE(2, 3, 9, 9), EM_OPTS(0)), 0.25), dt), dev);
    em_tensor *x32 = em_to_dtype(x, EM_F32);
    CHECK_OK(em_set_requires_grad(x, true));
    CHECK_OK(em_set_requires_grad(x32, true));
    em_tensor *i16 = NULL, *i32 = NULL;
    em_tensor *y = em_max_pool2d_with_indices(x, EM_HW1(3), EM_HW1(2), EM_HW1(1), EM_HW1(1), false, &i16);
    em_tensor *y32 = em_max_pool2d_with_indices(x32, EM_HW1(3), EM_HW1(2), EM_HW1(1), EM_HW1(1), false, &i32);
    CHECK(y && y32 && em_dtype_of(y) == dt);
    if (y && y32) {
        CHECK(em_item(em_max(em_abs(em_sub(em_to_dtype(y, EM_F32), y32)), EM_ALL_DIMS, false)) == 0);
        CHECK(em_item(em_sum(em_ne(i16, i32), EM_ALL_DIMS, false)) == 0);
        em_tensor *gy = em_to_dtype(em_add_scalar(em_randint(0, 3, em_shape_of(y), EM_OPTS(.device = dev)), 1), dt);
        CHECK_OK(em_backward_with(y, gy, false));
        CHECK_OK(em_backward_with(y32, em_to_dtype(gy, EM_F32), false));
        CHECK(em_dtype_of(em_grad(x)) == dt);
        CHECK(em_item(em_max(em_abs(em_sub(em_to_dtype(em_grad(x), EM_F32), em_grad(x32))), EM_ALL_DIMS, false)) == 0);
        /* avg pool: within one rounding of float32 */
        em_tensor *a = em_avg_pool2d(x, EM_HW1(3), EM_HW1(2), EM_HW1(1), false, true, 0);
        em_tensor *a32 = em_avg_pool2d(x32, EM_HW1(3), EM_HW1(2), EM_HW1(1), false, true, 0);
        CHECK(a && em_dtype_of(a) == dt);
        if (a) CHECK(err_ulps(em_to(a, EM_DEVICE_CPU), em_to(em_to_dtype(a32, EM_F64), EM_DEVICE_CPU), dt) <= 1.0);
    }
    if (em_failed()) fprintf(stderr, "  %s: %s\n", em_device_str(dev).s, em_last_error());
    em_scope_end(s);
}

static void test_pools_cpu(void) {
    check_max_pool(EM_DEVICE_CPU, EM_BF16);
    check_max_pool(EM_DEVICE_CPU, EM_F16);
}

static void test_pools_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    check_max_pool(EM_DEVICE(EM_OPENCL, 0), EM_BF16);
    check_max_pool(EM_DEVICE(EM_OPENCL, 0), EM_F16);
}

/* Conv2d layer -> max pool under a region: the conv in dt, the pool in its input's dtype,
 * the float32 weight and bias get float32 gradients (through the region's cast) */
static void check_autocast(em_device dev, em_dtype dt) {
    em_scope s = em_scope_begin();
    em_manual_seed(8);
    em_module *conv = em_nn_conv2d_ex(3, 4, EM_HW1(3), EM_HW1(1), EM_HW1(1), EM_HW1(1), 1, true);
    CHECK(conv && em_module_to(conv, dev) == EM_OK);
    em_named_tensor p[2];
    CHECK(conv && em_module_parameters(conv, p, 2) == 2);
    em_tensor *x = em_randn(EM_SHAPE(2, 3, 8, 8), EM_OPTS(.device = dev));
    em_autocast ac = em_autocast_begin(dev.type, dt);
    em_tensor *y = em_forward(conv, x);
    em_tensor *z = em_max_pool2d(y, EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false);
    /* float64 inputs stay float64, as in PyTorch */
    em_tensor *y64 = em_conv2d(em_to_dtype(x, EM_F64), em_to_dtype(p[0].tensor, EM_F64), NULL, EM_HW1(1),
                               EM_HW1(1), EM_HW1(1), 1);
    CHECK_OK(em_autocast_end(ac));
    CHECK(y && em_dtype_of(y) == dt);
    CHECK(z && em_dtype_of(z) == dt);
    CHECK(y64 && em_dtype_of(y64) == EM_F64);
    CHECK(em_dtype_of(em_forward(conv, x)) == EM_F32); /* outside the region: float32 again */
    if (z) {
        CHECK_OK(em_backward(em_sum(em_to_dtype(z, EM_F32), EM_ALL_DIMS, false)));
        for (int i = 0; i < 2; i++) {
            em_tensor *g = em_grad(p[i].tensor);
            CHECK(g && em_dtype_of(g) == EM_F32);
            CHECK(g && em_item(em_sum(em_abs(g), EM_ALL_DIMS, false)) > 0);
        }
    }
    if (em_failed()) fprintf(stderr, "  %s: %s\n", em_device_str(dev).s, em_last_error());
    em_module_free(conv);
    em_scope_end(s);
}

static void test_autocast_cpu(void) {
    check_autocast(EM_DEVICE_CPU, EM_BF16);
    check_autocast(EM_DEVICE_CPU, EM_F16);
}

static void test_autocast_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    check_autocast(EM_DEVICE(EM_OPENCL, 0), EM_F16);
    check_autocast(EM_DEVICE(EM_OPENCL, 0), EM_BF16);
}

static void test_bad_input(void) {
    em_scope s = em_scope_begin();
    em_tensor *xb = em_zeros(EM_SHAPE(1, 3, 8, 8), EM_OPTS(.dtype = EM_BF16));
    em_tensor *w32 = em_zeros(EM_SHAPE(4, 3, 3, 3), EM_OPTS(0));
    em_tensor *wh = em_zeros(EM_SHAPE(4, 3, 3, 3), EM_OPTS(.dtype = EM_F16));
    CHECK(em_conv2d(xb, w32, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "input (bfloat16), weight (float32) must have one dtype");
    CHECK(em_conv2d(xb, em_to_dtype(w32, EM_BF16), em_zeros(EM_SHAPE(4), EM_OPTS(.dtype = EM_F16)), EM_HW1(1),
                    EM_HW1(0), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "bias float16");
    CHECK(em_conv2d(em_to_dtype(xb, EM_F16), em_to_dtype(wh, EM_BF16), NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "must have one dtype");
    CHECK(em_conv2d(em_to_dtype(xb, EM_I32), em_to_dtype(w32, EM_I32), NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "expected input of a floating dtype");
    CHECK(em_max_pool2d(em_to_dtype(xb, EM_U8), EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "max_pool2d: expected input of a floating dtype");
    em_scope_end(s);
}

int main(void) {
    RUN(test_accumulation_cpu);
    RUN(test_accumulation_opencl);
    RUN(test_cpu_bf16_kernel);
    RUN(test_pools_cpu);
    RUN(test_pools_opencl);
    RUN(test_autocast_cpu);
    RUN(test_autocast_opencl);
    RUN(test_bad_input);
    return test_summary();
}
