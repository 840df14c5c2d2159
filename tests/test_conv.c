#define _POSIX_C_SOURCE 200809L
/* Convolution and pooling beyond the golden replay: float64 finite-difference gradient
 * checks (portable and library paths), bad input (a clear error naming the op or layer and
 * the shapes, nothing leaked), the nn layers (names, init, repr, state dict round trip) and
 * the two CPU paths agreeing on a larger batch that runs in chunks. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <ember/ember.h>
#include "core/internal_api.h"
#include "test.h"

#define H 1e-6

typedef em_tensor *(*fn_t)(em_tensor **x);

/* analytic gradient of sum(f(x) * w) against central differences, every element of every
 * input; float64 runs the portable path (the library path is float32: the golden replay
 * covers it) */
static void gradcheck(const char *name, fn_t f, int n, const em_shape *shapes) {
    em_scope s = em_scope_begin();
    em_tensor *x[3];
    for (int i = 0; i < n; i++) {
        x[i] = em_contiguous(em_randn(shapes[i], EM_OPTS(.dtype = EM_F64)));
        CHECK_OK(em_set_requires_grad(x[i], true));
    }
    em_tensor *y = f(x);
    CHECK(y != NULL);
    if (!y) {
        fprintf(stderr, "  %s: %s\n", name, em_last_error());
        em_clear_error();
        em_scope_end(s);
        return;
    }
    em_tensor *w = em_randn(em_shape_of(y), EM_OPTS(.dtype = EM_F64));
    CHECK_OK(em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)));
    em_grad_mode g = em_no_grad_begin();
    int bad = 0;
    for (int i = 0; i < n; i++) {
        em_tensor *grad = em_grad(x[i]);
        CHECK(grad != NULL);
        if (!grad) continue;
        double *xd = em_data_ptr(x[i]), *gd = em_data_ptr(em_contiguous(grad));
        for (int64_t j = 0; j < em_numel(x[i]); j++) {
            double keep = xd[j];
            em_scope t = em_scope_begin();
            xd[j] = keep + H;
            double lp = em_item(em_sum(em_mul(f(x), w), EM_ALL_DIMS, false));
            xd[j] = keep - H;
            double lm = em_item(em_sum(em_mul(f(x), w), EM_ALL_DIMS, false));
            em_scope_end(t);
            xd[j] = keep;
            double num = (lp - lm) / (2 * H);
            if (fabs(num - gd[j]) > 1e-6 * (1 + fabs(num))) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s: input %d element %lld: analytic %.10g, numeric %.10g\n", name, i,
                            (long long)j, gd[j], num);
            }
        }
    }
    CHECK(bad == 0);
    em_no_grad_end(g);
    em_scope_end(s);
}

static em_tensor *conv_plain(em_tensor **x) {
    return em_conv2d(x[0], x[1], x[2], EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
}
static em_tensor *conv_mixed(em_tensor **x) {
    return em_conv2d(x[0], x[1], x[2], EM_HW(2, 1), EM_HW(1, 2), EM_HW(1, 2), 2);
}
static em_tensor *conv_nobias_dilated(em_tensor **x) {
    return em_conv2d(x[0], x[1], NULL, EM_HW1(1), EM_HW1(2), EM_HW1(2), 1);
}
/* a transposed (non-contiguous) input, through the op's copy */
static em_tensor *conv_transposed(em_tensor **x) {
    return em_conv2d(em_transpose(x[0], 2, 3), x[1], NULL, EM_HW1(1), EM_HW1(1), EM_HW1(1), 1);
}
static em_tensor *maxpool(em_tensor **x) {
    return em_max_pool2d(x[0], EM_HW1(3), EM_HW1(2), EM_HW1(1), EM_HW1(1), true);
}
static em_tensor *maxpool_dilated(em_tensor **x) {
    return em_max_pool2d(x[0], EM_HW(2, 3), EM_HW1(1), EM_HW1(1), EM_HW1(2), false);
}
static em_tensor *avgpool(em_tensor **x) {
    return em_avg_pool2d(x[0], EM_HW1(3), EM_HW1(2), EM_HW1(1), true, false, 0);
}
static em_tensor *avgpool_divisor(em_tensor **x) {
    return em_avg_pool2d(x[0], EM_HW(2, 3), EM_HW(1, 2), EM_HW1(1), false, true, 4);
}
static em_tensor *adaptive(em_tensor **x) { return em_adaptive_avg_pool2d(x[0], EM_HW(3, 4)); }
/* conv, relu, pool, conv: gradients through a chain */
static em_tensor *chain(em_tensor **x) {
    em_tensor *h = em_relu(em_conv2d(x[0], x[1], NULL, EM_HW1(1), EM_HW1(1), EM_HW1(1), 1));
    h = em_max_pool2d(h, EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false);
    return em_conv2d(h, x[2], NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
}

static void test_gradcheck_conv(void) {
    gradcheck("conv plain", conv_plain, 3, (em_shape[]){EM_SHAPE(2, 2, 5, 6), EM_SHAPE(3, 2, 3, 3), EM_SHAPE(3)});
    gradcheck("conv stride/pad/dilation/groups", conv_mixed, 3,
              (em_shape[]){EM_SHAPE(1, 4, 7, 6), EM_SHAPE(4, 2, 2, 3), EM_SHAPE(4)});
    gradcheck("conv dilated, no bias", conv_nobias_dilated, 2, (em_shape[]){EM_SHAPE(2, 1, 5, 5), EM_SHAPE(2, 1, 3, 3)});
    gradcheck("conv non-contiguous input", conv_transposed, 2, (em_shape[]){EM_SHAPE(1, 2, 4, 5), EM_SHAPE(2, 2, 3, 3)});
    gradcheck("conv relu pool conv", chain, 3,
              (em_shape[]){EM_SHAPE(2, 1, 6, 6), EM_SHAPE(2, 1, 3, 3), EM_SHAPE(3, 2, 2, 2)});
}

static void test_gradcheck_pools(void) {
    gradcheck("max_pool2d ceil", maxpool, 1, (em_shape[]){EM_SHAPE(2, 2, 7, 6)});
    gradcheck("max_pool2d dilated", maxpool_dilated, 1, (em_shape[]){EM_SHAPE(1, 2, 6, 7)});
    gradcheck("avg_pool2d", avgpool, 1, (em_shape[]){EM_SHAPE(2, 2, 7, 6)});
    gradcheck("avg_pool2d divisor", avgpool_divisor, 1, (em_shape[]){EM_SHAPE(1, 2, 5, 7)});
    gradcheck("adaptive_avg_pool2d", adaptive, 1, (em_shape[]){EM_SHAPE(2, 2, 7, 9)});
}

/* the f32 library path (oneDNN) and the portable path agree, on a batch large enough that
 * the portable path's im2col runs in chunks */
static void test_library_and_portable_agree(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *x = em_randn(EM_SHAPE(700, 3, 30, 30), EM_OPTS(0));
    em_tensor *w = em_mul_scalar(em_randn(EM_SHAPE(8, 3, 5, 5), EM_OPTS(0)), 0.2);
    em_tensor *b = em_randn(EM_SHAPE(8), EM_OPTS(0));
    CHECK_OK(em_set_requires_grad(x, true));
    CHECK_OK(em_set_requires_grad(w, true));
    CHECK_OK(em_set_requires_grad(b, true)); /* oneDNN sums its gradient with the weight's */
    em_tensor *gy = em_randn(EM_SHAPE(700, 8, 28, 28), EM_OPTS(0));
    em_tensor *out[2][4];
    for (int p = 0; p < 2; p++) {
        bool prev = em__conv_force_portable(p == 1);
        em_tensor *y = em_conv2d(x, w, b, EM_HW1(1), EM_HW1(1), EM_HW1(1), 1);
        CHECK_OK(em_backward_with(y, gy, false));
        out[p][0] = y, out[p][1] = em_clone(em_grad(x)), out[p][2] = em_clone(em_grad(w));
        out[p][3] = em_clone(em_grad(b));
        CHECK_OK(em_zero_grad_tensor(x));
        CHECK_OK(em_zero_grad_tensor(w));
        CHECK_OK(em_zero_grad_tensor(b));
        em__conv_force_portable(prev);
    }
    /* the bias's gradient as its definition: gy summed over N, H, W */
    double bdiff = em_item(em_max(em_abs(em_sub(out[0][3], em_sum(gy, EM_DIMS(0, 2, 3), false))), EM_ALL_DIMS, false));
    CHECK(bdiff <= 1e-4 * em_item(em_max(em_abs(out[1][3]), EM_ALL_DIMS, false)));
    for (int k = 0; k < 4; k++) {
        double diff = em_item(em_max(em_abs(em_sub(out[0][k], out[1][k])), EM_ALL_DIMS, false));
        double scale = em_item(em_max(em_abs(out[1][k]), EM_ALL_DIMS, false));
        CHECK(diff <= 1e-4 * scale);
    }
    em_scope_end(s);
}

/* r is NULL, with code and a message holding every substring */
static void expect_error(em_tensor *r, em_status code, const char *const *subs, int n) {
    CHECK(r == NULL);
    CHECK(em_last_status() == code);
    for (int i = 0; i < n; i++) {
        bool has = strstr(em_last_error(), subs[i]) != NULL;
        CHECK(has);
        if (!has) fprintf(stderr, "  expected '%s' in: %s\n", subs[i], em_last_error());
    }
    em_clear_error();
}

/* the call, in a scope of its own: it fails as expected and everything it (and its
 * arguments) allocated is freed with the scope */
#define EXPECT_ERR(call, code, ...)                                                        \
    do {                                                                                   \
        int64_t b_ = em_memory_allocated(EM_DEVICE_CPU);                                   \
        em_scope s_ = em_scope_begin();                                                    \
        const char *subs_[] = {__VA_ARGS__};                                               \
        expect_error((call), (code), subs_, (int)(sizeof subs_ / sizeof subs_[0]));        \
        em_scope_end(s_);                                                                  \
        CHECK(em_memory_allocated(EM_DEVICE_CPU) == b_);                                   \
    } while (0)

/* The input's gradient is computed only where one is needed (as PyTorch: the CNN's first layer
 * reads the batch, which needs none): x without requires_grad gets none while w and b still
 * get theirs, unchanged; a leaf x that requires grad and a non-leaf one both get it, against
 * the definition written here (stride 1, padding 1). Library and portable paths both. */
static void test_input_gradient_only_when_needed(void) {
    enum { QN = 2, QC = 3, QH = 6, QW = 5, QO = 4, QK = 3, QP = 1 };
    em_scope s = em_scope_begin();
    em_manual_seed(11);
    em_tensor *x0 = em_randn(EM_SHAPE(QN, QC, QH, QW), EM_OPTS(0));
    em_tensor *w = em_randn(EM_SHAPE(QO, QC, QK, QK), EM_OPTS(.requires_grad = true));
    em_tensor *b = em_randn(EM_SHAPE(QO), EM_OPTS(.requires_grad = true));
    em_tensor *gy = em_randn(EM_SHAPE(QN, QO, QH, QW), EM_OPTS(0));
    const float *wp = em_data_ptr(w), *gp = em_data_ptr(gy);
    double ref[QN * QC * QH * QW] = {0};
    for (int n = 0; n < QN; n++)
        for (int c = 0; c < QC; c++)
            for (int i = 0; i < QH; i++)
                for (int j = 0; j < QW; j++)
                    for (int o = 0; o < QO; o++)
                        for (int ki = 0; ki < QK; ki++)
                            for (int kj = 0; kj < QK; kj++) {
                                int oy = i + QP - ki, ox = j + QP - kj;
                                if (oy < 0 || oy >= QH || ox < 0 || ox >= QW) continue;
                                double gv = gp[((n * QO + o) * QH + oy) * QW + ox];
                                ref[((n * QC + c) * QH + i) * QW + j] += gv * wp[((o * QC + c) * QK + ki) * QK + kj];
                            }
    for (int p = 0; p < 2; p++) {
        bool prev = em__conv_force_portable(p == 1);
        em_tensor *gw[3] = {NULL}, *gb[3] = {NULL};
        for (int mode = 0; mode < 3; mode++) { /* x: no grad, a leaf with grad, a non-leaf from a leaf */
            em_tensor *a = mode ? em_clone(x0) : x0;
            if (mode) CHECK_OK(em_set_requires_grad(a, true));
            em_tensor *x = mode == 2 ? em_div_scalar(em_mul_scalar(a, 4), 4) : a; /* = a exactly */
            em_tensor *y = em_conv2d(x, w, b, EM_HW1(1), EM_HW1(QP), EM_HW1(1), 1);
            CHECK_OK(em_backward_with(y, gy, false));
            CHECK(mode ? em_grad(a) != NULL : em_grad(a) == NULL);
            CHECK(mode != 2 || em_grad(x) == NULL); /* a non-leaf keeps no .grad */
            gw[mode] = em_clone(em_grad(w)), gb[mode] = em_clone(em_grad(b));
            CHECK(gw[mode] && gb[mode]);
            if (mode && em_grad(a)) {
                const float *gx = em_data_ptr(em_contiguous(em_grad(a)));
                double worst = 0;
                for (int i = 0; i < QN * QC * QH * QW; i++) {
                    double e = fabs(gx[i] - ref[i]);
                    worst = e > worst ? e : worst;
                }
                CHECK(worst < 1e-4);
            }
            CHECK_OK(em_zero_grad_tensor(w));
            CHECK_OK(em_zero_grad_tensor(b));
        }
        for (int mode = 1; mode < 3; mode++) { /* the weight's and bias's gradients do not depend on x's */
            CHECK(em_item(em_max(em_abs(em_sub(gw[mode], gw[0])), EM_ALL_DIMS, false)) == 0);
            CHECK(em_item(em_max(em_abs(em_sub(gb[mode], gb[0])), EM_ALL_DIMS, false)) == 0);
        }
        em__conv_force_portable(prev);
    }
    em_scope_end(s);
}

static void test_bad_input(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(2, 3, 8, 8), EM_OPTS(0));
    em_tensor *w = em_randn(EM_SHAPE(6, 1, 5, 5), EM_OPTS(0));
    /* wrong input channels */
    EXPECT_ERR(em_conv2d(x, w, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1), EM_ERR_SHAPE, "conv2d", "[6, 1, 5, 5]", "[2, 3, 8, 8]", "1 channels", "got 3 channels");
    /* kernel larger than the padded input */
    em_tensor *w9 = em_randn(EM_SHAPE(2, 3, 11, 3), EM_OPTS(0));
    EXPECT_ERR(em_conv2d(x, w9, NULL, EM_HW1(1), EM_HW1(1), EM_HW1(1), 1), EM_ERR_SHAPE, "conv2d", "(10 x 10)", "Kernel size: (11 x 3)", "[2, 3, 8, 8]");
    /* negative padding */
    em_tensor *w3 = em_randn(EM_SHAPE(4, 3, 3, 3), EM_OPTS(0));
    EXPECT_ERR(em_conv2d(x, w3, NULL, EM_HW1(1), EM_HW(0, -1), EM_HW1(1), 1), EM_ERR_ARGUMENT, "conv2d", "negative padding", "(0, -1)");
    /* groups that do not divide the channels */
    EXPECT_ERR(em_conv2d(x, w3, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 3), EM_ERR_SHAPE, "conv2d", "groups=3", "[4, 3, 3, 3]");
    EXPECT_ERR(em_conv2d(x, w3, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 0), EM_ERR_ARGUMENT, "non-positive groups");
    /* a bias of the wrong size, a 2-d input, an integer input, a zero stride, mixed dtypes */
    EXPECT_ERR(em_conv2d(x, w3, em_zeros(EM_SHAPE(3), EM_OPTS(0)), EM_HW1(1), EM_HW1(0), EM_HW1(1), 1),
                 EM_ERR_SHAPE, "bias", "4 elements", "[3]");
    EXPECT_ERR(em_conv2d(em_zeros(EM_SHAPE(3, 8), EM_OPTS(0)), w3, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1),
                 EM_ERR_SHAPE, "3D (unbatched) or 4D", "[3, 8]");
    EXPECT_ERR(em_conv2d(em_zeros(EM_SHAPE(2, 3, 8, 8), EM_OPTS(.dtype = EM_I64)), w3, NULL, EM_HW1(1), EM_HW1(0),
                           EM_HW1(1), 1),
                 EM_ERR_DTYPE, "conv2d", "int64");
    EXPECT_ERR(em_conv2d(x, w3, NULL, EM_HW(1, 0), EM_HW1(0), EM_HW1(1), 1), EM_ERR_ARGUMENT, "non-positive stride");
    EXPECT_ERR(em_conv2d(x, em_to_dtype(w3, EM_F64), NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1), EM_ERR_DTYPE, "float32", "float64");
    /* pools */
    EXPECT_ERR(em_max_pool2d(x, EM_HW1(2), EM_HW1(0), EM_HW1(2), EM_HW1(1), false), EM_ERR_ARGUMENT, "max_pool2d", "half of kernel size");
    EXPECT_ERR(em_max_pool2d(x, EM_HW1(9), EM_HW1(1), EM_HW1(0), EM_HW1(1), false), EM_ERR_SHAPE, "max_pool2d", "[2, 3, 8, 8]", "too small");
    EXPECT_ERR(em_avg_pool2d(x, EM_HW1(3), EM_HW1(1), EM_HW(-1, 0), false, true, 0), EM_ERR_ARGUMENT, "avg_pool2d", "negative padding");
    EXPECT_ERR(em_adaptive_avg_pool2d(em_zeros(EM_SHAPE(8), EM_OPTS(0)), EM_HW1(2)), EM_ERR_SHAPE, "adaptive_avg_pool2d", "[8]");
    /* the layer names itself */
    em_module *conv = em_nn_conv2d_ex(1, 6, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true);
    CHECK(conv != NULL);
    EXPECT_ERR(em_forward(conv, x), EM_ERR_SHAPE, "Conv2d(1, 6, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))", "[2, 3, 8, 8]",
                                  "got 3 channels");
    em_module_free(conv);
    em_module *pool = em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false);
    EXPECT_ERR(em_forward(pool, em_zeros(EM_SHAPE(2, 3, 1, 8), EM_OPTS(0))), EM_ERR_SHAPE, "MaxPool2d(kernel_size=2, stride=2", "[2, 3, 1, 8]");
    em_module_free(pool);
    /* bad constructor arguments */
    CHECK(em_nn_conv2d_ex(4, 6, EM_HW1(3), EM_HW1(1), EM_HW1(0), EM_HW1(1), 4, true) == NULL);
    CHECK(strstr(em_last_error(), "divisible by groups") != NULL);
    em_clear_error();
    CHECK(em_nn_conv2d_ex(4, 6, EM_HW1(3), EM_HW1(1), EM_HW1(-1), EM_HW1(1), 1, true) == NULL);
    CHECK(strstr(em_last_error(), "padding") != NULL);
    em_clear_error();
    em_scope_end(s);
}

static void test_layers(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(1);
    em_module *m = em_nn_sequential(em_nn_conv2d_ex(4, 6, EM_HW(3, 2), EM_HW1(1), EM_HW1(1), EM_HW1(1), 2, true),
                                 em_nn_relu(),
                                 em_nn_avg_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), false, true, 0),
                                 em_nn_adaptive_avg_pool2d(EM_HW1(1)), em_nn_flatten());
    CHECK(m != NULL);
    if (!m) {
        em_scope_end(s);
        return;
    }
    em_named_tensor p[4];
    CHECK(em_module_parameters(m, p, 4) == 2);
    CHECK(!strcmp(p[0].name, "0.weight") && !strcmp(p[1].name, "0.bias"));
    em_shape ws = em_shape_of(p[0].tensor);
    CHECK(ws.ndim == 4 && ws.d[0] == 6 && ws.d[1] == 2 && ws.d[2] == 3 && ws.d[3] == 2);
    /* kaiming_uniform(a=sqrt(5)): |w| <= 1/sqrt(fan_in), fan_in = 2 * 3 * 2, and spread out */
    double bound = 1.0 / sqrt(12.0);
    double mx = em_item(em_max(em_abs(p[0].tensor), EM_ALL_DIMS, false));
    CHECK(mx <= bound && mx > 0.7 * bound);
    CHECK(em_item(em_max(em_abs(p[1].tensor), EM_ALL_DIMS, false)) <= bound);
    CHECK(em_module_kind_of(em_module_child(m, 0)) == EM_MODULE_CONV2D);
    CHECK(em_module_kind_of(em_module_child(m, 2)) == EM_MODULE_AVG_POOL2D);
    CHECK(em_module_kind_of(em_module_child(m, 3)) == EM_MODULE_ADAPTIVE_AVG_POOL2D);
    int64_t ci, co;
    em_hw k;
    CHECK_OK(em_module_conv2d_shape(em_module_child(m, 0), &ci, &co, &k));
    CHECK(ci == 4 && co == 6 && k.h == 3 && k.w == 2);
    char repr[1024];
    em_module_format(m, repr, sizeof repr);
    CHECK(strstr(repr, "(0): Conv2d(4, 6, kernel_size=(3, 2), stride=(1, 1), padding=(1, 1), groups=2)") != NULL);
    CHECK(strstr(repr, "(2): AvgPool2d(kernel_size=2, stride=2, padding=0)") != NULL);
    CHECK(strstr(repr, "(3): AdaptiveAvgPool2d(output_size=(1, 1))") != NULL);
    /* state dict round trip through a safetensors file */
    em_tensor *x = em_randn(EM_SHAPE(2, 4, 9, 8), EM_OPTS(0));
    em_tensor *y = em_forward(m, x);
    CHECK(y && em_ndim(y) == 2 && em_size(y, 0) == 2 && em_size(y, 1) == 6);
    char path[] = "/tmp/ember_conv_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_OK(em_module_save(m, path));
    em_manual_seed(2);
    em_module *m2 = em_nn_sequential(em_nn_conv2d_ex(4, 6, EM_HW(3, 2), EM_HW1(1), EM_HW1(1), EM_HW1(1), 2, true),
                                  em_nn_relu(),
                                  em_nn_avg_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), false, true, 0),
                                  em_nn_adaptive_avg_pool2d(EM_HW1(1)), em_nn_flatten());
    CHECK(em_item(em_max(em_abs(em_sub(em_forward(m2, x), y)), EM_ALL_DIMS, false)) > 0);
    CHECK_OK(em_module_load(m2, path));
    CHECK(em_item(em_max(em_abs(em_sub(em_forward(m2, x), y)), EM_ALL_DIMS, false)) == 0);
    unlink(path);
    em_module_free(m2);
    em_module_free(m);
    em_scope_end(s);
}

int main(void) {
    RUN(test_gradcheck_conv);
    RUN(test_gradcheck_pools);
    RUN(test_library_and_portable_agree);
    RUN(test_input_gradient_only_when_needed);
    RUN(test_bad_input);
    RUN(test_layers);
    return test_summary();
}
