/* Optimizers against PyTorch's update formulas re-derived here in double, zero_grad and
 * accumulation, clipping, LR schedules. */
#include <stdlib.h>
#include "test.h"

#define N 5

/* A module holding one float64 parameter vector p. */
static em_tensor *identity_forward(em_module *m, em_tensor *x) { (void)m; return x; }
static const em_module_ops holder_ops = {.name = "Holder", .forward = identity_forward};

static em_module *holder(const double *p0, em_tensor **param) {
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    em_tensor *p = em_from_data(p0, EM_F64, EM_SHAPE(N), EM_OPTS(.dtype = EM_F64));
    CHECK_OK(em_module_add_parameter(m, "p", p));
    em_scope_end(s);
    em_named_tensor nt[1];
    em_module_parameters(m, nt, 1);
    *param = nt[0].tensor;
    return m;
}

static void grad_of_step(int step, double *g) {
    for (int i = 0; i < N; i++) g[i] = sin(1.0 + i * 0.7 + step * 1.3) * (i + 1) * 0.5;
}

static void set_grad(em_tensor *p, const double *g) {
    em_scope s = em_scope_begin();
    CHECK_OK(em_set_grad(p, em_from_data(g, EM_F64, EM_SHAPE(N), EM_OPTS(.dtype = EM_F64))));
    em_scope_end(s);
}

static void check_param(em_tensor *p, const double *want, const char *what, int step) {
    double v[N];
    CHECK_OK(em_copy_to_host(p, v, sizeof v));
    for (int i = 0; i < N; i++)
        if (fabs(v[i] - want[i]) > 1e-12 * (1 + fabs(want[i]))) {
            fprintf(stderr, "  %s step %d: p[%d] = %.17g, want %.17g\n", what, step, i, v[i], want[i]);
            CHECK(0);
            return;
        }
}

static void run_sgd(em_sgd_opts o, const char *what) {
    double p[N] = {0.5, -1.0, 2.0, 0.0, 0.25}, buf[N] = {0};
    em_tensor *param;
    em_module *m = holder(p, &param);
    em_optimizer *opt = em_sgd_ex(m, o);
    for (int step = 0; step < 6; step++) {
        double g[N];
        grad_of_step(step, g);
        set_grad(param, g);
        CHECK_OK(em_step(opt));
        for (int i = 0; i < N; i++) { /* torch/optim/sgd.py, _single_tensor_sgd */
            double d = g[i] + o.weight_decay * p[i];
            if (o.momentum != 0) {
                buf[i] = step == 0 ? d : buf[i] * o.momentum + (1 - o.dampening) * d;
                d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
            }
            p[i] -= o.lr * d;
        }
        check_param(param, p, what, step);
    }
    if (o.momentum != 0) {
        em_scope s = em_scope_begin();
        CHECK(em_optim_state(opt, param, "momentum_buffer") != NULL);
        em_scope_end(s);
    }
    em_optim_free(opt);
    em_module_free(m);
}

static void test_sgd(void) {
    run_sgd(em_sgd_defaults(0.1), "sgd");
    run_sgd((em_sgd_opts){.lr = 0.05, .momentum = 0.9}, "momentum");
    run_sgd((em_sgd_opts){.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01}, "dampening");
    run_sgd((em_sgd_opts){.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.1}, "nesterov");
    CHECK(em_sgd_ex(NULL, (em_sgd_opts){.lr = 0.1, .nesterov = true}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Nesterov");
}

static void run_adam(em_adam_opts o, bool decoupled, const char *what) {
    double p[N] = {0.5, -1.0, 2.0, 0.0, 0.25}, m1[N] = {0}, v[N] = {0}, vmax[N] = {0};
    em_tensor *param;
    em_module *m = holder(p, &param);
    em_optimizer *opt = decoupled ? em_adamw_ex(m, o) : em_adam_ex(m, o);
    for (int step = 1; step <= 6; step++) {
        double g[N];
        grad_of_step(step, g);
        set_grad(param, g);
        CHECK_OK(em_step(opt));
        double bc1 = 1 - pow(o.beta1, step), bc2 = 1 - pow(o.beta2, step);
        for (int i = 0; i < N; i++) { /* torch/optim/adam.py and adamw.py, single tensor */
            double gi = g[i];
            if (decoupled) p[i] *= 1 - o.lr * o.weight_decay;
            else gi += o.weight_decay * p[i];
            m1[i] = m1[i] * o.beta1 + (1 - o.beta1) * gi;
            v[i] = v[i] * o.beta2 + (1 - o.beta2) * gi * gi;
            vmax[i] = v[i] > vmax[i] ? v[i] : vmax[i];
            double denom = sqrt(o.amsgrad ? vmax[i] : v[i]) / sqrt(bc2) + o.eps;
            p[i] -= o.lr / bc1 * m1[i] / denom;
        }
        check_param(param, p, what, step);
    }
    em_optim_free(opt);
    em_module_free(m);
}

static void test_adam(void) {
    run_adam(em_adam_defaults(1e-2), false, "adam");
    em_adam_opts o = em_adam_defaults(5e-2);
    o.beta1 = 0.5, o.beta2 = 0.9, o.eps = 1e-3, o.weight_decay = 0.1;
    run_adam(o, false, "adam-wd");
    o.amsgrad = true;
    run_adam(o, false, "adam-amsgrad");
    run_adam(em_adamw_defaults(1e-2), true, "adamw");
    o.amsgrad = false;
    o.weight_decay = 0.3;
    run_adam(o, true, "adamw-wd");
    o.beta2 = 1.0;
    CHECK(em_adam_ex(NULL, o) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid beta parameter at index 1");
}

/* Gradients accumulate over backwards until zero_grad, which sets them to none. */
static void test_zero_grad_and_accumulation(void) {
    em_scope s = em_scope_begin();
    double p0[N] = {1, 2, 3, 4, 5};
    em_tensor *p;
    em_module *m = holder(p0, &p);
    em_optimizer *opt = em_sgd(m, 0.1);
    for (int micro = 0; micro < 3; micro++) /* three micro-batches */
        CHECK_OK(em_backward(em_sum(em_mul(p, p), EM_ALL_DIMS, false)));
    double g[N];
    CHECK_OK(em_copy_to_host(em_grad(p), g, sizeof g));
    for (int i = 0; i < N; i++) CHECK_NEAR(g[i], 3 * 2 * p0[i], 1e-12);
    CHECK_OK(em_step(opt));
    double v[N];
    CHECK_OK(em_copy_to_host(p, v, sizeof v));
    for (int i = 0; i < N; i++) CHECK_NEAR(v[i], p0[i] - 0.1 * 6 * p0[i], 1e-12);
    CHECK_OK(em_zero_grad(opt));
    CHECK(em_grad(p) == NULL);
    CHECK_OK(em_step(opt)); /* no grads: nothing moves */
    double w[N];
    CHECK_OK(em_copy_to_host(p, w, sizeof w));
    for (int i = 0; i < N; i++) CHECK(w[i] == v[i]);
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
}

static void test_clip_grad_norm(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(3, 4), em_nn_linear(4, 2));
    em_tensor *x = em_randn(EM_SHAPE(6, 3), (em_opts){0});
    CHECK_OK(em_backward(em_sum(em_mul_scalar(em_forward(m, x), 10.0), EM_ALL_DIMS, false)));
    em_named_tensor ps[4];
    em_module_parameters(m, ps, 4);
    double sq = 0;
    for (int i = 0; i < 4; i++) {
        em_tensor *g = em_grad(ps[i].tensor);
        sq += em_item(em_sum(em_mul(g, g), EM_ALL_DIMS, false));
    }
    double norm = em_clip_grad_norm(m, 1.0);
    CHECK_NEAR(norm, sqrt(sq), 1e-4 * sqrt(sq));
    CHECK(norm > 1.0);
    double after = 0;
    for (int i = 0; i < 4; i++) {
        em_tensor *g = em_grad(ps[i].tensor);
        after += em_item(em_sum(em_mul(g, g), EM_ALL_DIMS, false));
    }
    CHECK_NEAR(sqrt(after), 1.0, 1e-4);
    /* below the limit: unchanged */
    CHECK_NEAR(em_clip_grad_norm(m, 10.0), 1.0, 1e-4);
    CHECK_NEAR(em_clip_grad_norm(m, 10.0), 1.0, 1e-4);
    /* a replay's bookkeeping without a replay: refused, the counts unchanged */
    em_optimizer *opt = em_sgd(m, 0.1);
    CHECK(opt != NULL);
    CHECK(em_optim_step_replayed(NULL) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK(em_optim_step_replayed(opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "recorded by a graph");
    CHECK(em_optim_steps(opt) == 0);
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
}

/* The norm's temporaries come and go a slice of a gradient at a time: with four gradients of
 * 4 MiB, clipping's peak above what is already allocated stays within a slice's square
 * (1 MiB), not one gradient's square, nor the four that a scope held to the end would keep;
 * and the norm is the one of the whole gradients. */
static void test_clip_grad_norm_memory(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(1024, 1024), em_nn_linear(1024, 1024), em_nn_linear(1024, 1024),
                                    em_nn_linear(1024, 1024));
    em_tensor *x = em_randn(EM_SHAPE(4, 1024), (em_opts){0});
    CHECK_OK(em_backward(em_sum(em_forward(m, x), EM_ALL_DIMS, false)));
    em_named_tensor ps[8];
    CHECK(em_module_parameters(m, ps, 8) == 8);
    double sq = 0;
    for (int i = 0; i < 8; i++) {
        em_tensor *g = em_to_dtype(em_grad(ps[i].tensor), EM_F64);
        sq += em_item(em_sum(em_mul(g, g), EM_ALL_DIMS, false));
    }
    em_device cpu = EM_DEVICE_CPU;
    em_memory_reset_peak_stats(cpu);
    int64_t before = em_memory_allocated(cpu);
    double norm = em_clip_grad_norm(m, 1e-3);
    CHECK_NEAR(norm, sqrt(sq), 1e-5 * sqrt(sq));
    int64_t above = em_memory_max_allocated(cpu) - before;
    int64_t one_grad = 1024 * 1024 * 4;
    CHECK(above <= one_grad / 4 + 4096);
    CHECK(em_memory_allocated(cpu) <= before); /* nothing left behind */
    em_module_free(m);
    em_scope_end(s);
}

/* The first schedule interface (em_optim_set_schedule / em_optim_schedule_step), deprecated
 * for em_lr_scheduler but kept working for a release. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void test_schedules(void) {
    em_lr_schedule st = em_lr_step(3, 0.5);
    CHECK_NEAR(em_lr_at(st, 0.1, 0), 0.1, 0);
    CHECK_NEAR(em_lr_at(st, 0.1, 2), 0.1, 0);
    CHECK_NEAR(em_lr_at(st, 0.1, 3), 0.05, 1e-15);
    CHECK_NEAR(em_lr_at(st, 0.1, 7), 0.025, 1e-15);
    em_lr_schedule c = em_lr_cosine(0, 10, 0.0); /* CosineAnnealingLR(T_max=10) */
    for (int t = 0; t <= 10; t++) CHECK_NEAR(em_lr_at(c, 1.0, t), 0.5 * (1 + cos(M_PI * t / 10)), 1e-12);
    em_lr_schedule w = em_lr_cosine(4, 14, 0.1);
    CHECK_NEAR(em_lr_at(w, 1.0, 0), 0.25, 1e-12);
    CHECK_NEAR(em_lr_at(w, 1.0, 3), 1.0, 1e-12);
    CHECK_NEAR(em_lr_at(w, 1.0, 4), 1.0, 1e-12);
    CHECK_NEAR(em_lr_at(w, 1.0, 9), 0.55, 1e-12);
    CHECK_NEAR(em_lr_at(w, 1.0, 14), 0.1, 1e-12);
    CHECK_NEAR(em_lr_at(w, 1.0, 100), 0.1, 1e-12);
    /* attached to an optimizer */
    em_module *m = em_nn_linear(2, 2);
    em_optimizer *opt = em_sgd(m, 0.2);
    CHECK_OK(em_optim_set_schedule(opt, em_lr_step(2, 0.1)));
    CHECK_NEAR(em_optim_lr(opt), 0.2, 0);
    CHECK_OK(em_optim_schedule_step(opt));
    CHECK_NEAR(em_optim_lr(opt), 0.2, 0);
    CHECK_OK(em_optim_schedule_step(opt));
    CHECK_NEAR(em_optim_lr(opt), 0.02, 1e-15);
    CHECK(em_optim_set_schedule(opt, em_lr_step(0, 0.1)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "step_size");
    /* a kind that is none of the schedules: refused, the learning rate and schedule kept */
    CHECK(em_optim_set_schedule(opt, (em_lr_schedule){.kind = (em_lr_kind)99}) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "unknown schedule kind 99");
    CHECK_NEAR(em_optim_lr(opt), 0.02, 1e-15);
    /* freeing the module first leaves the optimizer usable and freeable */
    em_module_free(m);
    CHECK_OK(em_step(opt));
    em_optim_free(opt);
}
#pragma GCC diagnostic pop

int main(void) {
    RUN(test_sgd);
    RUN(test_adam);
    RUN(test_zero_grad_and_accumulation);
    RUN(test_clip_grad_norm);
    RUN(test_clip_grad_norm_memory);
    RUN(test_schedules);
    return test_summary();
}
