/* A hand-written forward keeps PyTorch's peak memory: pytorch/examples' mnist Net written as
 * in Python (x = F.relu(x)), each `x = ...` an em_rebind, run on the test batch of 1000
 * under no_grad, peaks within 10% of PyTorch's (tests/data/golden_peak_forward.txt, made by
 * scripts/golden_peak_forward.py); the same forward without em_rebind keeps every
 * intermediate to the end and peaks far above. The children are reached by name
 * (em_module_get), as self.conv1 in Python; then em_rebind's and em_module_get's own cases. */
#include <stdio.h>
#include <stdlib.h>
#include "test.h"

static bool g_rebind;

/* x = op(x), with or without releasing the old x at once */
static em_tensor *set(em_tensor *old, em_tensor *t) { return g_rebind ? em_rebind(old, t) : t; }

static em_tensor *net_forward(em_module *m, em_tensor *x) {
    x = set(x, em_forward(em_module_get(m, "conv1"), x));
    x = set(x, em_relu(x));
    x = set(x, em_forward(em_module_get(m, "conv2"), x));
    x = set(x, em_relu(x));
    x = set(x, em_max_pool2d(x, EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false));
    x = set(x, em_forward(em_module_get(m, "dropout1"), x));
    x = set(x, em_flatten(x, 1, -1));
    x = set(x, em_forward(em_module_get(m, "fc1"), x));
    x = set(x, em_relu(x));
    x = set(x, em_forward(em_module_get(m, "dropout2"), x));
    x = set(x, em_forward(em_module_get(m, "fc2"), x));
    return set(x, em_log_softmax(x, 1));
}

static const em_module_ops net_ops = {.name = "Net", .forward = net_forward};

static em_module *make_net(void) {
    em_module *m = em_module_new(&net_ops, NULL);
    bool ok = m && em_module_add_child(m, "conv1", em_nn_conv2d(1, 32, EM_HW1(3))) == EM_OK &&
              em_module_add_child(m, "conv2", em_nn_conv2d(32, 64, EM_HW1(3))) == EM_OK &&
              em_module_add_child(m, "dropout1", em_nn_dropout(0.25)) == EM_OK &&
              em_module_add_child(m, "dropout2", em_nn_dropout(0.5)) == EM_OK &&
              em_module_add_child(m, "fc1", em_nn_linear(9216, 128)) == EM_OK &&
              em_module_add_child(m, "fc2", em_nn_linear(128, 10)) == EM_OK;
    if (!ok) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* the bytes the forward of a batch of 1000 added at its peak on the CPU */
static int64_t forward_peak(em_module *net, em_tensor *x, bool rebind) {
    g_rebind = rebind;
    em_grad_mode g = em_no_grad_begin();
    em_scope s = em_scope_begin();
    int64_t before = em_memory_allocated(EM_DEVICE_CPU);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    em_tensor *y = em_forward(net, x);
    int64_t peak = em_memory_max_allocated(EM_DEVICE_CPU) - before;
    CHECK(y && em_ndim(y) == 2 && em_size(y, 0) == 1000 && em_size(y, 1) == 10);
    em_scope_end(s);
    em_no_grad_end(g);
    return peak;
}

static void test_peak_like_pytorch(void) {
    FILE *f = fopen("tests/data/golden_peak_forward.txt", "r");
    long long torch_peak = 0;
    CHECK(f && fscanf(f, "%lld", &torch_peak) == 1 && torch_peak > 0);
    if (f) fclose(f);
    em_module *net = make_net();
    CHECK(net != NULL);
    if (!net || torch_peak <= 0) {
        em_module_free(net);
        return;
    }
    em_module_eval(net);
    em_tensor *x = em_rand(EM_SHAPE(1000, 1, 28, 28), EM_OPTS(0));
    forward_peak(net, x, true); /* warm: the backend's one-time buffers are not the forward's */
    int64_t with = forward_peak(net, x, true), without = forward_peak(net, x, false);
    printf("forward of 1000: peak %.1f MB with em_rebind, %.1f MB without; PyTorch %.1f MB\n", with / 1e6,
           without / 1e6, torch_peak / 1e6);
    CHECK(with <= 1.10 * (double)torch_peak);
    CHECK(without > 1.5 * (double)torch_peak); /* what the test would catch */
    em_release(x);
    em_module_free(net);
}

static void test_rebind_cases(void) {
    em_scope outer = em_scope_begin();
    em_tensor *input = em_ones(EM_SHAPE(3), EM_OPTS(0));
    em_scope s = em_scope_begin();
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_tensor *a = em_mul_scalar(input, 2.0);
    /* the outer scope's tensor is not released: rebinding the input of a forward is safe */
    em_tensor *b = em_rebind(input, em_add_scalar(a, 1.0));
    CHECK(em_item(em_sum(input, EM_ALL_DIMS, false)) == 3.0);
    /* a: the inner scope's only reference goes now */
    int64_t held = em_memory_allocated(EM_DEVICE_CPU);
    em_tensor *c = em_rebind(a, em_mul_scalar(b, 1.0));
    CHECK(em_memory_allocated(EM_DEVICE_CPU) <= held); /* c's bytes came, a's went */
    CHECK(em_item(em_sum(c, EM_ALL_DIMS, false)) == 9.0);
    /* a kept reference keeps the tensor alive */
    em_tensor *kept = em_keep(b);
    em_tensor *d = em_rebind(b, em_neg(c));
    CHECK(em_item(em_sum(kept, EM_ALL_DIMS, false)) == 9.0 && em_item(em_sum(d, EM_ALL_DIMS, false)) == -9.0);
    em_release(kept);
    /* NULL and the same tensor: nothing released */
    CHECK(em_rebind(NULL, d) == d && em_rebind(d, d) == d && em_rebind(d, NULL) == NULL);
    /* autograd keeps what backward needs */
    em_tensor *w = em_keep(em_ones(EM_SHAPE(3), EM_OPTS(0)));
    CHECK_OK(em_set_requires_grad(w, true));
    em_tensor *h = em_mul(w, w);
    h = em_rebind(h, em_sum(em_rebind(h, em_mul(h, w)), EM_ALL_DIMS, false));
    CHECK_OK(em_backward(h));
    CHECK(em_item(em_sum(em_grad(w), EM_ALL_DIMS, false)) == 9.0); /* d(w^3)/dw = 3 w^2 */
    em_scope_end(s);
    em_release(w);
    CHECK(em_memory_allocated(EM_DEVICE_CPU) == base); /* nothing released twice or kept */
    /* outside any scope, a caller-owned tensor is the caller's to release */
    em_scope_end(outer);
    em_tensor *own = em_ones(EM_SHAPE(2), EM_OPTS(0));
    em_tensor *next = em_rebind(own, em_add_scalar(own, 1.0));
    em_tensor *total = em_sum(own, EM_ALL_DIMS, false);
    CHECK(em_item(total) == 2.0 && em_numel(next) == 2);
    em_release(total);
    em_release(own);
    em_release(next);
    CHECK(!em_failed());
}

static void test_module_get(void) {
    em_module *net = make_net();
    CHECK(net != NULL);
    if (!net) return;
    em_module *seq = em_nn_sequential(em_nn_linear(2, 3), em_nn_relu());
    em_module *outer = em_module_new(&net_ops, NULL);
    CHECK(em_module_add_child(outer, "net", net) == EM_OK && em_module_add_child(outer, "head", seq) == EM_OK);
    CHECK(em_module_get(outer, "net.conv1") == em_module_child(net, 0));
    CHECK(em_module_get(outer, "head.1") == em_module_child(seq, 1));
    CHECK(em_module_get(outer, "") == outer && em_module_get(net, "fc2") == em_module_child(net, 5));
    CHECK(!strcmp(em_module_child_name(net, 4), "fc1") && em_module_child_name(net, 6) == NULL);
    /* the names of the state dict reach the same tensors */
    em_named_tensor p[16];
    int n = em_module_parameters(outer, p, 16);
    CHECK(n == 10);
    for (int i = 0; i < n && i < 16; i++) CHECK(em_module_get_parameter(outer, p[i].name) == p[i].tensor);
    CHECK(!strcmp(p[0].name, "net.conv1.weight"));
    /* what is not there */
    CHECK(em_module_get(outer, "net.conv3") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_module_get: \"net.conv3\": Net has no attribute `conv3`");
    CHECK(em_module_get(outer, "net.conv1.weight") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "`weight` is a tensor of Conv2d, not a module");
    CHECK(em_module_get(outer, "net.") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "\"net.\" ends with '.'");
    CHECK(em_module_get_parameter(outer, "net.conv1.scale") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_module_get_parameter: \"net.conv1.scale\": Conv2d has no parameter `scale`");
    CHECK(em_module_get_parameter(outer, "x.weight") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Net has no attribute `x`");
    CHECK(em_module_get(NULL, "a") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_module_get: the module is NULL");
    CHECK(em_module_get_parameter(outer, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_module_get_parameter: the path is NULL");
    em_module_free(outer);
}

int main(void) {
    RUN(test_peak_like_pytorch);
    RUN(test_rebind_cases);
    RUN(test_module_get);
    return test_summary();
}
