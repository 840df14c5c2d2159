/* Mixed precision against PyTorch (scripts/golden_amp.py, tests/data/golden_amp.bin):
 * every autocast category's output dtype and values under a CPU bf16 region, a small MLP's
 * loss and gradients (float32 on the float32 weights), a Conv2d and max pool's (conv2d is on
 * autocast's list too), and GradScaler's sequence of scales,
 * growth trackers and skipped steps with injected inf/NaN, with SGD and Adam, on the CPU and
 * on an OpenCL device (PoCL in CI). */
#include "optim/optim_internal.h"
#include "test_amp_util.h"

static amp_archive g;

/* bf16 keeps 8 significant bits; results are compared elementwise to PyTorch's. */
#define BF16_ATOL 2e-2
#define BF16_RTOL 2e-2

typedef em_tensor *(*op_fn)(em_tensor *x, em_tensor *w, em_tensor *bias, em_tensor *y, em_tensor *t, em_tensor *h);

static em_tensor *op_matmul(em_tensor *x, em_tensor *w, em_tensor *b, em_tensor *y, em_tensor *t, em_tensor *h) {
    (void)b, (void)y, (void)t, (void)h;
    return em_matmul(x, w);
}
static em_tensor *op_addmm(em_tensor *x, em_tensor *w, em_tensor *b, em_tensor *y, em_tensor *t, em_tensor *h) {
    (void)y, (void)t, (void)h;
    return em_addmm(b, x, w, 1.0, 1.0);
}
#define ON_H(name, expr)                                                                            \
    static em_tensor *op_##name(em_tensor *x, em_tensor *w, em_tensor *b, em_tensor *y, em_tensor *t, \
                                em_tensor *h) {                                                     \
        (void)x, (void)w, (void)b, (void)y, (void)t;                                                \
        return expr;                                                                                \
    }
ON_H(softmax, em_softmax(h, 1))
ON_H(log_softmax, em_log_softmax(h, 1))
ON_H(sum, em_sum(h, EM_ALL_DIMS, false))
ON_H(mean, em_mean(h, EM_ALL_DIMS, false))
ON_H(exp, em_exp(h))
ON_H(log, em_log(em_add_scalar(em_abs(h), 1.0)))
ON_H(pow, em_pow_scalar(h, 2.0))
ON_H(tanh, em_tanh(h))
ON_H(relu, em_relu(h))
ON_H(mse_loss, em_mse_loss(h, y))
ON_H(cross_entropy, em_cross_entropy(h, t, 0.0))
ON_H(nll_loss, em_nll_loss(em_log_softmax(h, 1), t))
ON_H(add, em_add(h, y))
ON_H(mul, em_mul(h, y))
ON_H(cat, em_cat((em_tensor *[]){h, y}, 2, 0))
ON_H(stack, em_stack((em_tensor *[]){h, y}, 2, 0))
ON_H(where, em_where(em_gt(y, em_zeros_like(y)), h, y))

static const struct {
    const char *name;
    op_fn fn;
} ops[] = {
    {"matmul", op_matmul}, {"addmm", op_addmm}, {"softmax", op_softmax}, {"log_softmax", op_log_softmax},
    {"sum", op_sum}, {"mean", op_mean}, {"exp", op_exp}, {"log", op_log}, {"pow", op_pow},
    {"tanh", op_tanh}, {"relu", op_relu}, {"mse_loss", op_mse_loss}, {"cross_entropy", op_cross_entropy},
    {"nll_loss", op_nll_loss}, {"add", op_add}, {"mul", op_mul}, {"cat", op_cat}, {"stack", op_stack},
    {"where", op_where},
};

static void test_ops_cpu_bf16(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = amp_get(&g, "in.x"), *w = amp_get(&g, "in.w"), *b = amp_get(&g, "in.bias");
    em_tensor *y = amp_get(&g, "in.y"), *t = amp_get(&g, "in.t");
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *h = em_matmul(x, w);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        char key[80];
        snprintf(key, sizeof key, "%s.dtype", ops[i].name);
        em_tensor *r = ops[i].fn(x, w, b, y, t, h);
        em_tensor *want_dt = amp_get(&g, key), *want = amp_get(&g, ops[i].name);
        if (!r || !want_dt || !want) {
            fprintf(stderr, "  %s: %s\n", ops[i].name, em_last_error());
            CHECK(false);
            em_clear_error();
            continue;
        }
        em_dtype dt = (em_dtype)amp_at(want_dt, 0);
        if (em_dtype_of(r) != dt)
            fprintf(stderr, "  %s: dtype %s, PyTorch's %s\n", ops[i].name, em_dtype_name(em_dtype_of(r)),
                    em_dtype_name(dt));
        CHECK(em_dtype_of(r) == dt);
        double e = amp_err(r, want, BF16_ATOL, BF16_RTOL);
        if (!(e <= 1)) fprintf(stderr, "  %s: error %g of the bf16 tolerance\n", ops[i].name, e);
        CHECK(e <= 1);
    }
    CHECK_OK(em_autocast_end(ac));
    /* outside the region the same call is float32 again */
    CHECK(em_dtype_of(em_matmul(x, w)) == EM_F32);
    em_scope_end(s);
}

static void test_mlp_gradients(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(6, 8), em_nn_relu(), em_nn_linear(8, 5));
    CHECK(m != NULL);
    em_named_tensor ps[4];
    CHECK(em_module_parameters(m, ps, 4) == 4);
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    em_grad_mode gm = em_no_grad_begin();
    for (int i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof key, "mlp.in.%s", names[i]);
        CHECK_OK(em_copy_(ps[i].tensor, amp_get(&g, key)));
    }
    em_no_grad_end(gm);
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *logits = em_forward(m, amp_get(&g, "mlp.in.x"));
    em_tensor *loss = em_cross_entropy(logits, amp_get(&g, "mlp.in.t"), 0.0);
    CHECK_OK(em_autocast_end(ac));
    CHECK(logits && em_dtype_of(logits) == (em_dtype)amp_at(amp_get(&g, "mlp.logits.dtype"), 0));
    CHECK(loss && em_dtype_of(loss) == (em_dtype)amp_at(amp_get(&g, "mlp.loss.dtype"), 0));
    CHECK(amp_err(logits, amp_get(&g, "mlp.logits"), BF16_ATOL, BF16_RTOL) <= 1);
    CHECK(amp_err(loss, amp_get(&g, "mlp.loss"), 1e-2, 1e-2) <= 1);
    CHECK_OK(em_backward(loss));
    for (int i = 0; i < 4; i++) {
        char key[64], dkey[80];
        snprintf(key, sizeof key, "mlp.grad.%s", names[i]);
        snprintf(dkey, sizeof dkey, "mlp.grad.%s.dtype", names[i]);
        em_tensor *gr = em_grad(ps[i].tensor);
        CHECK(gr && em_dtype_of(gr) == EM_F32);
        CHECK(gr && em_dtype_of(gr) == (em_dtype)amp_at(amp_get(&g, dkey), 0));
        double e = amp_err(gr, amp_get(&g, key), 3e-2, 3e-2);
        if (!(e <= 1)) fprintf(stderr, "  grad %s: error %g of the tolerance\n", names[i], e);
        CHECK(e <= 1);
    }
    em_module_free(m);
    em_scope_end(s);
}

/* conv2d (autocast's lower-precision list) and max_pool2d (its input's dtype) under a CPU
 * bf16 region, backward outside it: dtypes, values and the float32 parameters' gradients */
static void test_conv_cpu_bf16(void) {
    em_scope s = em_scope_begin();
    em_module *conv = em_nn_conv2d_ex(3, 4, EM_HW1(3), EM_HW1(1), EM_HW1(1), EM_HW1(1), 1, true);
    CHECK(conv != NULL);
    em_named_tensor ps[2];
    CHECK(conv && em_module_parameters(conv, ps, 2) == 2);
    em_grad_mode gm = em_no_grad_begin();
    CHECK_OK(em_copy_(ps[0].tensor, amp_get(&g, "conv.in.w")));
    CHECK_OK(em_copy_(ps[1].tensor, amp_get(&g, "conv.in.b")));
    em_no_grad_end(gm);
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *y = em_forward(conv, amp_get(&g, "conv.in.x"));
    em_tensor *z = em_max_pool2d(y, EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false);
    CHECK_OK(em_autocast_end(ac));
    const char *names[2] = {"conv2d", "max_pool2d"};
    em_tensor *got[2] = {y, z};
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s.dtype", names[i]);
        CHECK(got[i] && em_dtype_of(got[i]) == (em_dtype)amp_at(amp_get(&g, key), 0));
        double e = amp_err(got[i], amp_get(&g, names[i]), BF16_ATOL, BF16_RTOL);
        if (!(e <= 1)) fprintf(stderr, "  %s: error %g of the bf16 tolerance\n", names[i], e);
        CHECK(e <= 1);
    }
    CHECK_OK(em_backward(em_sum(em_mul(em_to_dtype(z, EM_F32), amp_get(&g, "conv.in.gy")), EM_ALL_DIMS, false)));
    const char *gnames[2] = {"conv.grad.w", "conv.grad.b"};
    for (int i = 0; i < 2; i++) {
        char dkey[64];
        snprintf(dkey, sizeof dkey, "%s.dtype", gnames[i]);
        em_tensor *gr = em_grad(ps[i].tensor);
        CHECK(gr && em_dtype_of(gr) == EM_F32 && em_dtype_of(gr) == (em_dtype)amp_at(amp_get(&g, dkey), 0));
        double e = amp_err(gr, amp_get(&g, gnames[i]), 3e-2, 3e-2);
        if (!(e <= 1)) fprintf(stderr, "  %s: error %g of the tolerance\n", gnames[i], e);
        CHECK(e <= 1);
    }
    em_module_free(conv);
    em_scope_end(s);
}

/* PyTorch's GradScaler sequence (growth_interval 3, inf/NaN at steps 2, 3 and 8). */
static void scaler_sequence(em_device dev, const char *run, bool adam, bool fused) {
    char key[64];
    em_scope s = em_scope_begin();
    em_module *lin = em_nn_linear_ex(4, 1, false);
    em_named_tensor w;
    CHECK(em_module_parameters(lin, &w, 1) == 1);
    snprintf(key, sizeof key, "%s.w0", run);
    em_grad_mode gm = em_no_grad_begin();
    CHECK_OK(em_copy_(w.tensor, amp_get(&g, key)));
    em_no_grad_end(gm);
    CHECK_OK(em_module_to(lin, dev));
    em_optimizer *opt = adam ? em_adam(lin, 0.1) : em_sgd(lin, 0.1);
    em__optim_set_fused(opt, fused);   /* unfused: the op-by-op path reads the flag on the host */
    em_grad_scaler_opts so = em_grad_scaler_defaults();
    so.growth_interval = 3;
    em_grad_scaler *sc = em_grad_scaler_new(so);
    CHECK(opt && sc);
    snprintf(key, sizeof key, "%s.c", run);
    em_tensor *cs = em_to(amp_get(&g, key), dev);
    char ks[64], kt[64], kk[64], kw[64];
    snprintf(ks, sizeof ks, "%s.scale", run);
    snprintf(kt, sizeof kt, "%s.tracker", run);
    snprintf(kk, sizeof kk, "%s.skipped", run);
    snprintf(kw, sizeof kw, "%s.w", run);
    CHECK(em_grad_scaler_get_scale(sc) == 65536.0);
    for (int k = 0; k < 12; k++) {
        em_scope it = em_scope_begin();
        CHECK_OK(em_zero_grad(opt));
        em_tensor *loss = em_sum(em_mul(w.tensor, em_select(cs, 0, k)), EM_ALL_DIMS, false);
        CHECK_OK(em_backward(em_grad_scaler_scale(sc, loss)));
        CHECK_OK(em_grad_scaler_step(sc, opt));
        CHECK_OK(em_grad_scaler_update(sc));
        CHECK(em_grad_scaler_get_scale(sc) == amp_at(amp_get(&g, ks), k));
        CHECK(em_grad_scaler_growth_tracker(sc) == (int64_t)amp_at(amp_get(&g, kt), k));
        int64_t skipped_so_far = 0;
        for (int j = 0; j <= k; j++) skipped_so_far += (int64_t)amp_at(amp_get(&g, kk), j);
        CHECK(em_grad_scaler_skipped_steps(sc) == skipped_so_far);
        double e = amp_err(w.tensor, em_select(amp_get(&g, kw), 0, k), 1e-5, 1e-5);
        if (!(e <= 1)) fprintf(stderr, "  %s step %d on %s: weight error %g of the tolerance\n", run, k,
                               em_device_str(dev).s, e);
        CHECK(e <= 1);
        em_scope_end(it);
    }
    CHECK(em_dtype_of(w.tensor) == EM_F32);   /* master weights stay float32 */
    CHECK(fused ? em__optim_fused_updates(opt) > 0 : em__optim_fused_updates(opt) == 0);
    em_grad_scaler_free(sc);
    em_optim_free(opt);
    em_module_free(lin);
    em_scope_end(s);
}

static void test_scaler_sgd_cpu(void) {
    scaler_sequence(EM_DEVICE_CPU, "sgd", false, true);
    scaler_sequence(EM_DEVICE_CPU, "sgd", false, false);
}
static void test_scaler_adam_cpu(void) {
    scaler_sequence(EM_DEVICE_CPU, "adam", true, true);
    scaler_sequence(EM_DEVICE_CPU, "adam", true, false);
}

static void test_scaler_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    scaler_sequence(EM_DEVICE(EM_OPENCL, 0), "sgd", false, true);
    scaler_sequence(EM_DEVICE(EM_OPENCL, 0), "adam", true, true);
}

int main(void) {
    if (!amp_load(&g)) {
        CHECK(false); /* the committed data must be there */
        return test_summary();
    }
    RUN(test_ops_cpu_bf16);
    RUN(test_mlp_gradients);
    RUN(test_conv_cpu_bf16);
    RUN(test_scaler_sgd_cpu);
    RUN(test_scaler_adam_cpu);
    RUN(test_scaler_opencl);
    amp_unload(&g);
    return test_summary();
}
