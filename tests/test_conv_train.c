/* The CNN of `ember train --model cnn` trains on every device: a few Adam steps on
 * Fashion-MNIST batches (synthetic stripes when the dataset is missing) and the loss must
 * fall. On PoCL this is the OpenCL kernels (im2col, col2im, pools) under real training.
 * Without the dataset every case is a skip. */
#include <stdio.h>
#include <ember/ember.h>
#include "test.h"

#define STEPS 25
#define BATCH 32

static em_module *cnn(void) {
    return em_nn_sequential(em_nn_conv2d_ex(1, 6, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true),
                         em_nn_relu(), em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_nn_conv2d(6, 16, EM_HW1(5)), em_nn_relu(),
                         em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false), em_nn_flatten(),
                         em_nn_linear(400, 120), em_nn_relu(), em_nn_linear(120, 10));
}

static em_dataset *g_data;

static void train_on(em_device dev) {
    em_manual_seed(3);
    em_module *m = cnn();
    CHECK(m != NULL);
    if (!m) return;
    CHECK_OK(em_module_to(m, dev));
    em_optimizer *opt = em_adam(m, 2e-3);
    em_scope s = em_scope_begin();
    em_tensor *x = em_to(em_narrow(em_dataset_x(g_data), 0, 0, STEPS * BATCH), dev); /* [N, 1, 28, 28] */
    em_tensor *y = em_to(em_narrow(em_dataset_y(g_data), 0, 0, STEPS * BATCH), dev);
    double first = 0, last = 0;
    for (int i = 0; i < STEPS && opt && x && y; i++) {
        em_scope step = em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_forward(m, em_narrow(x, 0, i * BATCH, BATCH)),
                                           em_narrow(y, 0, i * BATCH, BATCH), 0.0);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_step(opt));
        double l = em_item(loss);
        if (i < 3) first += l / 3;
        if (i >= STEPS - 3) last += l / 3;
        em_scope_end(step);
    }
    printf("  %s: loss %.3f (first 3 steps) -> %.3f (last 3)\n", em_device_str(dev).s, first, last);
    CHECK(first > 1.5);           /* it starts near log(10) */
    CHECK(last < 0.75 * first);
    em_scope_end(s);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_train_cpu(void) { train_on(EM_DEVICE_CPU); }

static void test_train_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    train_on(EM_DEVICE(EM_OPENCL, 0));
}

static void test_train_cuda(void) {
    if (!em_device_available(EM_CUDA)) SKIP("no CUDA device: %s", em_device_unavailable_reason(EM_CUDA));
    train_on(EM_DEVICE(EM_CUDA, 0));
}

int main(void) {
    g_data = em_dataset_fashion_mnist(NULL, true);
    if (!g_data) {
        test_skip("Fashion-MNIST is missing (scripts/setup.sh installs dataset-fashion-mnist): %s", em_last_error());
        em_clear_error();
        return test_summary();
    }
    RUN(test_train_cpu);
    RUN(test_train_opencl);
    RUN(test_train_cuda);
    em_dataset_free(g_data);
    return test_summary();
}
