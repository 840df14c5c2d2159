/* The entries core gives the layers above it (src/core/internal_api.h) and the public calls
 * that let them stop reaching inside: fused optimizer steps checked and dispatched by core,
 * the in-place move, and what a module is. */
#include "test.h"
#include "core/internal_api.h"
#include "core/tensor_impl.h"

static unsigned version(const em_tensor *t) { return atomic_load(&t->storage->version); }

static void test_fused_sgd_checks_and_bumps(void) {
    em_scope s = em_scope_begin();
    em_tensor *p = em_ones(EM_SHAPE(4, 3), (em_opts){0});
    em_tensor *g = em_full(EM_SHAPE(4, 3), 0.5, (em_opts){0});
    em_tensor *buf = em_zeros(EM_SHAPE(4, 3), (em_opts){0});
    CHECK(em__fused_sgd_applies(p, g, NULL) && em__fused_sgd_applies(p, g, buf));
    /* what does not fit takes the op-by-op path: no error recorded by the query */
    CHECK(!em__fused_sgd_applies(em_transpose(p, 0, 1), em_transpose(g, 0, 1), NULL)); /* p not contiguous */
    CHECK(!em__fused_sgd_applies(p, em_to_dtype(g, EM_F64), NULL));
    CHECK(!em__fused_sgd_applies(p, em_ones(EM_SHAPE(3, 4), (em_opts){0}), NULL));
    CHECK(!em__fused_sgd_applies(p, g, em_transpose(em_zeros(EM_SHAPE(3, 4), (em_opts){0}), 0, 1)));
    CHECK(!em__fused_sgd_applies(em_ones(EM_SHAPE(4, 3), (em_opts){.dtype = EM_I32}),
                                 em_ones(EM_SHAPE(4, 3), (em_opts){.dtype = EM_I32}), NULL));
    CHECK(!em__fused_sgd_applies(p, NULL, NULL));
    CHECK(!em_failed());
    unsigned vp = version(p), vb = version(buf), vg = version(g);
    em_optim_args a = {.lr = 0.1, .momentum = 0.9, .dampening = 0, .first_step = true};
    CHECK_OK(em__fused_sgd_step(&a, p, g, buf));
    CHECK(version(p) == vp + 1 && version(buf) == vb + 1 && version(g) == vg); /* g is only read */
    float host[12];
    CHECK_OK(em_copy_to_host(p, host, sizeof host));
    CHECK_NEAR(host[0], 1.0 - 0.1 * 0.5, 1e-6); /* first step: buf = g, p -= lr * buf */
    CHECK(em__fused_sgd_step(&a, p, em_to_dtype(g, EM_F64), buf) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "fused SGD step: the fused step needs");
    CHECK(em__fused_sgd_step(&a, p, g, NULL) == EM_ERR_ARGUMENT); /* momentum needs buf */
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    CHECK(version(p) == vp + 1);  /* refused steps wrote nothing */
    em_scope_end(s);
}

static void test_fused_adam_checks_and_bumps(void) {
    em_scope s = em_scope_begin();
    em_opts o = {0};
    em_tensor *p = em_ones(EM_SHAPE(5), o), *g = em_ones(EM_SHAPE(5), o);
    em_tensor *m = em_zeros(EM_SHAPE(5), o), *v = em_zeros(EM_SHAPE(5), o), *vmax = em_zeros(EM_SHAPE(5), o);
    CHECK(em__fused_adam_applies(p, g, m, v, NULL) && em__fused_adam_applies(p, g, m, v, vmax));
    CHECK(!em__fused_adam_applies(p, g, m, NULL, NULL));
    CHECK(!em__fused_adam_applies(p, g, m, v, em_zeros(EM_SHAPE(6), o)));
    em_optim_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .bias_correction1 = 0.1,
                       .bias_correction2 = 0.001, .amsgrad = true};
    unsigned vp = version(p), vm = version(m), vv = version(v), vx = version(vmax);
    CHECK_OK(em__fused_adam_step(&a, p, g, m, v, vmax));
    CHECK(version(p) == vp + 1 && version(m) == vm + 1 && version(v) == vv + 1 && version(vmax) == vx + 1);
    CHECK(em_item(em_sum(m, EM_ALL_DIMS, false)) > 0);
    CHECK(em__fused_adam_step(&a, p, g, m, v, NULL) == EM_ERR_ARGUMENT); /* amsgrad needs vmax */
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    em_scope_end(s);
}

static void test_move_in_place_keeps_the_handle(void) {
    em_scope s0 = em_scope_begin();
    em_tensor *t = em_keep(em_transpose(em_reshape(em_arange(0, 6, 1, (em_opts){0}), EM_SHAPE(2, 3)), 0, 1));
    CHECK(t != NULL && !em_is_contiguous(t));
    CHECK_OK(em_set_requires_grad(t, true));
    CHECK_OK(em_set_grad(t, em_ones(EM_SHAPE(3, 2), (em_opts){0})));
    em_scope_end(s0);
    CHECK_OK(em__tensor_move_(t, EM_DEVICE_CPU, EM_F64));
    CHECK(em_dtype_of(t) == EM_F64 && em_is_contiguous(t) && em_size(t, 0) == 3 && em_size(t, 1) == 2);
    double host[6];
    CHECK_OK(em_copy_to_host(t, host, sizeof host));
    CHECK(host[0] == 0 && host[1] == 3 && host[2] == 1 && host[5] == 5);   /* the transposed values */
    em_scope s = em_scope_begin();
    CHECK(em_dtype_of(em_grad(t)) == EM_F64);                              /* .grad moved too */
    em_scope_end(s);
    CHECK(em__tensor_move_(NULL, EM_DEVICE_CPU, EM_F32) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    CHECK(em__tensor_move_(t, EM_DEVICE(EM_OPENCL, 99), EM_F32) != EM_OK);
    CHECK(em_failed());
    em_clear_error();
    CHECK(em_dtype_of(t) == EM_F64);                                       /* a failed move leaves t */
    em_release(t);
}

static em_tensor *identity(em_module *m, em_tensor *x) { (void)m; return em_retain(x); }

static void test_module_kinds(void) {
    em_module *seq = em_nn_sequential(em_nn_linear(3, 5), em_nn_relu(), em_nn_gelu(), em_nn_sigmoid(),
                                   em_nn_tanh(), em_nn_dropout(0.5), em_nn_flatten());
    CHECK(seq != NULL);
    static const em_module_kind want[] = {EM_MODULE_LINEAR, EM_MODULE_RELU, EM_MODULE_GELU, EM_MODULE_SIGMOID,
                                          EM_MODULE_TANH, EM_MODULE_DROPOUT, EM_MODULE_FLATTEN};
    CHECK(em_module_kind_of(seq) == EM_MODULE_SEQUENTIAL && !strcmp(em_module_name(seq), "Sequential"));
    for (int i = 0; i < 7; i++) CHECK(em_module_kind_of(em_module_child(seq, i)) == want[i]);
    int64_t in = 0, out = 0;
    CHECK_OK(em_module_linear_shape(em_module_child(seq, 0), &in, &out));
    CHECK(in == 3 && out == 5);
    CHECK(em_module_linear_shape(em_module_child(seq, 1), &in, &out) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a Linear module, got ReLU");
    /* a custom module is custom whatever it calls itself */
    static const em_module_ops fake = {.name = "Linear", .forward = identity};
    em_module *custom = em_module_new(&fake, NULL);
    CHECK(em_module_kind_of(custom) == EM_MODULE_CUSTOM && !strcmp(em_module_name(custom), "Linear"));
    CHECK(em_module_linear_shape(custom, &in, &out) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK(em_module_kind_of(NULL) == EM_MODULE_CUSTOM && em_last_status() == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK(em_module_name(NULL) == NULL);
    em_module_free(custom);
    em_module_free(seq);
}

int main(void) {
    RUN(test_fused_sgd_checks_and_bumps);
    RUN(test_fused_adam_checks_and_bumps);
    RUN(test_move_in_place_keeps_the_handle);
    RUN(test_module_kinds);
    return test_summary();
}
