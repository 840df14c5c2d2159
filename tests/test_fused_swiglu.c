/* The throwaway fused op em_swiglu on every device: the kernel against the composition,
 * its gradient against central differences. */
#include <math.h>
#include <stdio.h>
#include <ember/ember.h>
#include "test.h"

static void check_device(em_device d) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_tensor *a = em_to(em_randn(EM_SHAPE(4, 37), EM_OPTS(.dtype = EM_F32)), d);
    em_tensor *b = em_to(em_randn(EM_SHAPE(4, 37), EM_OPTS(.dtype = EM_F32)), d);
    em_tensor *fused = em_to(em_swiglu(a, b), EM_DEVICE_CPU);
    em_tensor *comp = em_to(em_mul(em_mul(a, em_sigmoid(a)), b), EM_DEVICE_CPU);
    CHECK(fused && comp);
    if (fused && comp) {
        const float *x = em_data_ptr(fused), *y = em_data_ptr(comp);
        double worst = 0;
        for (int i = 0; i < 4 * 37; i++) worst = fmax(worst, fabs(x[i] - y[i]));
        printf("  %s: max |fused - composed| = %g\n", em_device_str(d).s, worst);
        CHECK(worst < 1e-5);
    }
    em_scope_end(s);
}

static void test_devices(void) {
    check_device(EM_DEVICE_CPU);
    if (em_device_count(EM_OPENCL) > 0) check_device(EM_DEVICE(EM_OPENCL, 0));
}

static void test_gradient(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_randn(EM_SHAPE(3, 5), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *b = em_randn(EM_SHAPE(3, 5), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    CHECK_OK(em_backward(em_sum(em_swiglu(a, b), EM_ALL_DIMS, false)));
    double *ad = em_data_ptr(a), *bd = em_data_ptr(b);
    const double *ga = em_data_ptr(em_grad(a)), *gb = em_data_ptr(em_grad(b));
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < 15; i++) {
        double h = 1e-6, keep = ad[i];
        ad[i] = keep + h;
        double lp = em_item(em_sum(em_swiglu(a, b), EM_ALL_DIMS, false));
        ad[i] = keep - h;
        double lm = em_item(em_sum(em_swiglu(a, b), EM_ALL_DIMS, false));
        ad[i] = keep;
        CHECK(fabs((lp - lm) / (2 * h) - ga[i]) < 1e-6);
        CHECK(fabs(ad[i] / (1 + exp(-ad[i])) - gb[i]) < 1e-12);
    }
    (void)bd;
    em_no_grad_end(g);
    em_scope_end(s);
}

static void test_bad_inputs(void) {
    em_scope s = em_scope_begin();
    CHECK(em_swiglu(em_zeros(EM_SHAPE(2), EM_OPTS()), em_zeros(EM_SHAPE(3), EM_OPTS())) == NULL);
    printf("  %s\n", em_last_error());
    em_clear_error();
    em_scope_end(s);
}

int main(void) {
    RUN(test_devices);
    RUN(test_gradient);
    RUN(test_bad_inputs);
    return test_summary();
}
