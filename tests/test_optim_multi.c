/* The GPUs' multi-tensor Adam/AdamW step (ADAM_STEP_MULTI: optim.k's adam_multi_f32, core's
 * em__fused_adam_multi_step, the optimizer's collection of updates during em_step) on the
 * OpenCL device (PoCL runs the kernel): bit for bit the per-tensor fused step over parameters
 * of many sizes (more than one launch's slots), with Adam and AdamW, weight decay, maximize and
 * different step counts; em_step on a model takes it (counted) and lands on the same bits as
 * the per-tensor fused path (the CPU declines it and steps each parameter); the bf16/f16 copy it writes in the same pass is the cast of
 * the new weights; parameters it does not take (amsgrad, float64) step on their own. */
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "core/internal_api.h"
#include "core/core_internal.h"
#include "optim/optim_internal.h"

static em_device g_gpu;

static bool have_gpu(void) {
    if (em_device_count(EM_OPENCL) <= 0) return false;
    g_gpu = EM_DEVICE(EM_OPENCL, 0);
    return true;
}

static const int64_t k_sizes[] = {1, 7, 300, 4099, 33, 2, 1024, 5, 77, 129, 3, 20000};
#define NP ((int)(sizeof k_sizes / sizeof k_sizes[0]))

static em_optim_args args_for(int i, int64_t step) {
    double b1 = 0.9, b2 = 0.999;
    em_optim_args a = {.lr = 1e-2 * (1 + i % 3), .weight_decay = i % 4 ? 0.01 : 0.0, .beta1 = b1, .beta2 = b2,
                       .eps = 1e-8, .decoupled = i % 2 == 0, .maximize = i == 5, .step = step + i % 2};
    a.bias_correction1 = 1.0 - pow(b1, (double)a.step);
    a.bias_correction2 = 1.0 - pow(b2, (double)a.step);
    return a;
}

static void test_bit_identical_to_per_tensor(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_manual_seed(31);
    em_tensor *p[2][NP], *g[NP], *m[2][NP], *v[2][NP];
    for (int i = 0; i < NP; i++) {
        em_shape sh = EM_SHAPE(k_sizes[i]);
        p[0][i] = em_to(em_randn(sh, EM_OPTS()), g_gpu);
        g[i] = em_to(em_randn(sh, EM_OPTS()), g_gpu);
        m[0][i] = em_to(em_mul_scalar(em_randn(sh, EM_OPTS()), 0.1), g_gpu);
        v[0][i] = em_to(em_mul_scalar(em_rand(sh, EM_OPTS()), 0.01), g_gpu);
        p[1][i] = em_clone(p[0][i]);
        m[1][i] = em_clone(m[0][i]);
        v[1][i] = em_clone(v[0][i]);
    }
    em_adam_multi_item items[NP];
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < NP; i++) {
            em_optim_args a = args_for(i, step);
            CHECK_OK(em__fused_adam_step(&a, p[0][i], g[i], m[0][i], v[0][i], NULL));
            items[i] = (em_adam_multi_item){.p = p[1][i], .g = g[i], .m = m[1][i], .v = v[1][i], .args = a};
            CHECK(em__fused_adam_multi_applies(&items[i]));
        }
        em_adam_multi mt = {.n = NP, .items = items};
        CHECK_OK(em__fused_adam_multi_step(&mt));
    }
    int same = 0;
    for (int i = 0; i < NP; i++) same += test_same_bits(p[0][i], p[1][i]) && test_same_bits(m[0][i], m[1][i]) &&
                                         test_same_bits(v[0][i], v[1][i]);
    printf("  %d of %d parameters (p, exp_avg, exp_avg_sq) bit-identical after 3 steps\n", same, NP);
    CHECK(same == NP);
    /* what it does not take: amsgrad, a scaler, float64, a non-contiguous state */
    em_adam_multi_item bad = items[0];
    bad.args.amsgrad = true;
    CHECK(!em__fused_adam_multi_applies(&bad));
    bad = items[0];
    bad.p = em_to(em_zeros(EM_SHAPE(1), EM_OPTS(.dtype = EM_F64)), g_gpu);
    CHECK(!em__fused_adam_multi_applies(&bad));
    bad = items[2];
    bad.m = em_transpose(em_reshape(m[1][2], EM_SHAPE(20, 15)), 0, 1);
    CHECK(!em__fused_adam_multi_applies(&bad));
    em_adam_multi one = {.n = 1, .items = &bad};
    CHECK(em__fused_adam_multi_step(&one) == EM_ERR_ARGUMENT);
    em_clear_error();
    /* the CPU declines the op: nothing written, nothing recorded */
    em_adam_multi_item cpu = {.p = em_zeros(EM_SHAPE(4), EM_OPTS()), .g = em_ones(EM_SHAPE(4), EM_OPTS()),
                              .m = em_zeros(EM_SHAPE(4), EM_OPTS()), .v = em_zeros(EM_SHAPE(4), EM_OPTS()),
                              .args = args_for(1, 1)};
    CHECK(!em__fused_adam_multi_applies(&cpu));
    em_scope_end(s);
}

/* An MLP of several layers trained by AdamW on dev; its parameters after `steps` steps. */
static em_module *train(em_device dev, bool fused, bool multi, int steps, int64_t *calls, int64_t *fused_updates) {
    em_manual_seed(32);
    em_module *m = em_nn_sequential(em_nn_linear(13, 40), em_nn_relu(), em_nn_linear(40, 300), em_nn_relu(),
                                    em_nn_linear(300, 3));
    CHECK_OK(em_module_to(m, dev));
    em_adam_opts ao = em_adam_defaults(1e-2);
    ao.weight_decay = 0.05;
    em_optimizer *opt = em_adamw_ex(m, ao);
    em__optim_set_fused(opt, fused);
    em__optim_batch_of(opt)->per_tensor = !multi;
    em_tensor *x = em_keep(em_to(em_randn(EM_SHAPE(8, 13), EM_OPTS()), dev));
    for (int s = 0; s < steps; s++) {
        em_scope sc = em_scope_begin();
        CHECK_OK(em_zero_grad(opt));
        em_tensor *y = em_forward(m, x);
        CHECK_OK(em_backward(em_mean(em_mul(y, y), EM_ALL_DIMS, false)));
        CHECK_OK(em_step(opt));
        em_scope_end(sc);
    }
    *calls = em__optim_batch_of(opt)->calls;
    *fused_updates = em__optim_fused_updates(opt);
    em_optim_free(opt);
    em_release(x);
    return m;
}

static void test_em_step_takes_it(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    int64_t calls = 0, upd = 0, cpu_calls = 0, cpu_upd = 0, ref_calls = 0, ref_upd = 0;
    em_module *gm = train(g_gpu, true, true, 3, &calls, &upd);
    em_module *cm = train(g_gpu, true, false, 3, &cpu_calls, &cpu_upd);
    em_module *rm = train(g_gpu, false, true, 3, &ref_calls, &ref_upd);
    CHECK(calls == 3 && upd == 3 * 6); /* one multi-tensor call per step, all six parameters */
    CHECK(cpu_calls == 0 && cpu_upd == 3 * 6); /* each parameter's own fused step */
    CHECK(ref_calls == 0 && ref_upd == 0);
    int64_t c_calls = 0, c_upd = 0;
    em_module *on_cpu = train(EM_DEVICE_CPU, true, true, 1, &c_calls, &c_upd);
    CHECK(c_calls == 0 && c_upd == 6); /* the CPU declines the op: each parameter on its own */
    em_module_free(on_cpu);
    em_named_tensor a[6], b[6], c[6];
    CHECK(em_module_parameters(gm, a, 6) == 6 && em_module_parameters(cm, b, 6) == 6 &&
          em_module_parameters(rm, c, 6) == 6);
    for (int i = 0; i < 6; i++) {
        /* the per-tensor fused steps: the same bits */
        CHECK(test_same_bits(a[i].tensor, b[i].tensor));
        /* the op-by-op path agrees within float32 rounding (its own order of operations) */
        em_tensor *d = em_abs(em_sub(a[i].tensor, c[i].tensor));
        CHECK(em_item(em_max(d, EM_ALL_DIMS, false)) < 1e-5);
    }
    em_module_free(gm);
    em_module_free(cm);
    em_module_free(rm);
    em_scope_end(s);
}

/* The low-precision copy written in the same pass is the cast of the new weights. */
static void check_copy(em_dtype dt) {
    em_scope s = em_scope_begin();
    em_manual_seed(33);
    em_module *lin = em_nn_linear(301, 57);
    CHECK_OK(em_module_to(lin, g_gpu));
    em_optimizer *opt = em_adam(lin, 1e-2);
    em_named_tensor p[2];
    CHECK(em_module_parameters(lin, p, 2) == 2);
    em_tensor *w = p[0].tensor, *x = em_keep(em_to(em_randn(EM_SHAPE(16, 301), EM_OPTS()), g_gpu));
    for (int step = 0; step < 3; step++) {
        em_scope in = em_scope_begin();
        CHECK_OK(em_zero_grad(opt));
        em_tensor *wl = em_to_dtype(w, dt); /* asks for the copy; from the second step it is the step's */
        em_tensor *y = em_to_dtype(em_matmul(em_to_dtype(x, dt), em_transpose(wl, 0, 1)), EM_F32);
        CHECK_OK(em_backward(em_mean(em_mul(y, y), EM_ALL_DIMS, false)));
        CHECK_OK(em_step(opt));
        em_dtype asked = EM_F32;
        em_storage *copy = em__shadow_of(w, &asked);
        CHECK(copy != NULL && asked == dt);
        em_tensor *got = em_to_dtype(w, dt);
        CHECK(got && got->storage == copy);
        CHECK(test_same_bits(got, em_to_dtype(em_clone(em_detach(w)), dt)));
        em_scope_end(in);
    }
    CHECK(em__optim_batch_of(opt)->calls == 3);
    em_optim_free(opt);
    em_module_free(lin);
    em_release(x);
    em_scope_end(s);
}

static void test_low_precision_copy(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    check_copy(EM_BF16);
    check_copy(EM_F16);
}

/* amsgrad: each parameter's own fused step, the same answers as op by op */
static void test_amsgrad_steps_each(void) {
    if (!have_gpu()) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_manual_seed(34);
    em_module *lin = em_nn_linear(5, 3);
    CHECK_OK(em_module_to(lin, g_gpu));
    em_adam_opts ao = em_adam_defaults(1e-2);
    ao.amsgrad = true;
    em_optimizer *opt = em_adamw_ex(lin, ao);
    em_tensor *x = em_to(em_randn(EM_SHAPE(4, 5), EM_OPTS()), g_gpu);
    CHECK_OK(em_zero_grad(opt));
    CHECK_OK(em_backward(em_sum(em_forward(lin, x), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(opt));
    CHECK(em__optim_batch_of(opt)->calls == 0 && em__optim_fused_updates(opt) == 2);
    em_optim_free(opt);
    em_module_free(lin);
    em_scope_end(s);
}

int main(void) {
    RUN(test_bit_identical_to_per_tensor);
    RUN(test_em_step_takes_it);
    RUN(test_low_precision_copy);
    RUN(test_amsgrad_steps_each);
    return test_summary();
}
