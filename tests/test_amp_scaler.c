/* The gradient scaler beyond PyTorch's sequence (test_amp_golden.c): a scaled step never
 * waits for its device (the backends' host waits are counted over 10 steps), unscale gives
 * the true gradients (clipping sees them), a disabled scaler is the identity, f16 autocast
 * with the scaler, and misuse (unscale twice, step twice, update with nothing recorded,
 * bad options, NULL) is a clear error. */
#include "backends/backend.h"
#include "optim/optim_internal.h"
#include "test_amp_util.h"

typedef struct setup {
    em_module *m;
    em_optimizer *opt;
    em_tensor *x, *t, *y; /* y: a float target (mse_loss needs no host check of class indices) */
} setup;

static setup make(em_device d, bool adam) {
    setup s;
    em_manual_seed(7);
    s.m = em_nn_sequential(em_nn_linear(16, 32), em_nn_relu(), em_nn_linear(32, 4));
    CHECK_OK(em_module_to(s.m, d));
    s.opt = adam ? em_adam(s.m, 1e-3) : em_sgd_ex(s.m, (em_sgd_opts){.lr = 0.05, .momentum = 0.9});
    em_scope sc = em_scope_begin();
    s.x = em_keep(em_randn(EM_SHAPE(32, 16), EM_OPTS(.device = d)));
    s.t = em_keep(em_randint(0, 4, EM_SHAPE(32), EM_OPTS(.dtype = EM_I64, .device = d)));
    s.y = em_keep(em_randn(EM_SHAPE(32, 4), EM_OPTS(.device = d)));
    em_scope_end(sc);
    return s;
}

static void unmake(setup *s) {
    em_release(s->x);
    em_release(s->t);
    em_release(s->y);
    em_optim_free(s->opt);
    em_module_free(s->m);
}

/* n training steps, with the scaler or plain; returns the host waits they made. The loss is
 * mse_loss: cross entropy's one-hot checks its class indices on the host (as PyTorch's
 * does), which would hide what the scaler does. */
static long steps(setup *s, em_grad_scaler *sc, em_device_type type, em_dtype low, int n) {
    long before = em__host_wait_count();
    for (int i = 0; i < n; i++) {
        em_scope it = em_scope_begin();
        em_autocast ac = em_autocast_begin(type, low);
        em_tensor *loss = em_mse_loss(em_forward(s->m, s->x), s->y);
        CHECK_OK(em_autocast_end(ac));
        CHECK_OK(em_zero_grad(s->opt));
        if (sc) {
            CHECK_OK(em_backward(em_grad_scaler_scale(sc, loss)));
            CHECK_OK(em_grad_scaler_step(sc, s->opt));
            CHECK_OK(em_grad_scaler_update(sc));
        } else {
            CHECK_OK(em_backward(loss));
            CHECK_OK(em_step(s->opt));
        }
        em_scope_end(it);
    }
    return em__host_wait_count() - before;
}

static void no_sync(em_device d, em_dtype low, bool adam) {
    setup s = make(d, adam);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    steps(&s, sc, d.type, low, 2);                   /* warm up: kernels built, caches filled */
    steps(&s, NULL, d.type, low, 2);
    long plain = steps(&s, NULL, d.type, low, 10);
    long scaled = steps(&s, sc, d.type, low, 10);
    printf("  %s %s %s: host waits over 10 steps: %ld plain, %ld with the scaler\n", em_device_str(d).s,
           em_dtype_name(low), adam ? "adam" : "sgd", plain, scaled);
    CHECK(scaled == plain);   /* the scaler adds none */
    CHECK(scaled == 0);
    CHECK(em__optim_fused_updates(s.opt) > 0);
    /* the counter does count: the op-by-op path reads the flag on the host */
    em__optim_set_fused(s.opt, false);
    long unfused = steps(&s, sc, d.type, low, 1);
    CHECK(unfused > 0);
    CHECK(em_grad_scaler_skipped_steps(sc) == 0);
    CHECK(em_grad_scaler_get_scale(sc) == 65536.0);
    em_grad_scaler_free(sc);
    unmake(&s);
}

static void test_no_sync_cpu(void) {
    no_sync(EM_DEVICE_CPU, EM_BF16, true);
    no_sync(EM_DEVICE_CPU, EM_F16, false);
}

static void test_no_sync_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    no_sync(EM_DEVICE(EM_OPENCL, 0), EM_BF16, true);
    no_sync(EM_DEVICE(EM_OPENCL, 0), EM_F16, false);
}

/* unscale leaves the true gradients, so clipping sees them; an inf gradient is skipped. */
static void unscale_then_clip(em_device d) {
    em_scope sc0 = em_scope_begin();
    setup a = make(d, false), b = make(d, false);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    em_tensor *la = em_cross_entropy(em_forward(a.m, a.x), a.t, 0.0);
    em_tensor *lb = em_cross_entropy(em_forward(b.m, b.x), b.t, 0.0);
    CHECK_OK(em_backward(la));
    CHECK_OK(em_backward(em_grad_scaler_scale(sc, lb)));
    CHECK_OK(em_grad_scaler_unscale(sc, b.opt));
    em_named_tensor pa[4], pb[4];
    CHECK(em_module_parameters(a.m, pa, 4) == 4 && em_module_parameters(b.m, pb, 4) == 4);
    for (int i = 0; i < 4; i++) CHECK(amp_err(em_grad(pb[i].tensor), em_grad(pa[i].tensor), 1e-6, 1e-5) <= 1);
    double na = em_clip_grad_norm(a.m, 0.1), nb = em_clip_grad_norm(b.m, 0.1);
    CHECK_NEAR(nb, na, 1e-5 * na);
    CHECK_OK(em_grad_scaler_step(sc, b.opt));
    CHECK_OK(em_step(a.opt));
    CHECK_OK(em_grad_scaler_update(sc));
    for (int i = 0; i < 4; i++) CHECK(amp_err(pb[i].tensor, pa[i].tensor, 1e-6, 1e-5) <= 1);
    /* an inf in one gradient: nothing moves, the scale halves */
    em_tensor *before = em_clone(pb[0].tensor);
    CHECK_OK(em_zero_grad(b.opt));
    CHECK_OK(em_backward(em_grad_scaler_scale(sc, em_cross_entropy(em_forward(b.m, b.x), b.t, 0.0))));
    em_grad_mode gm = em_no_grad_begin();
    CHECK_OK(em_fill_(em_narrow(em_grad(pb[1].tensor), 0, 3, 1), INFINITY));
    em_no_grad_end(gm);
    CHECK_OK(em_grad_scaler_step(sc, b.opt));
    CHECK_OK(em_grad_scaler_update(sc));
    CHECK(amp_err(pb[0].tensor, before, 1e-30, 0) <= 1);
    CHECK(em_grad_scaler_skipped_steps(sc) == 1);
    CHECK(em_grad_scaler_get_scale(sc) == 32768.0);
    CHECK(em_grad_scaler_growth_tracker(sc) == 0);
    em_grad_scaler_free(sc);
    unmake(&a);
    unmake(&b);
    em_scope_end(sc0);
}

static void test_unscale_then_clip_cpu(void) { unscale_then_clip(EM_DEVICE_CPU); }
static void test_unscale_then_clip_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    unscale_then_clip(EM_DEVICE(EM_OPENCL, 0));
}

/* A non-contiguous gradient is unscaled with ops, still on the device. */
static void test_unscale_strided(void) {
    em_scope s = em_scope_begin();
    setup a = make(EM_DEVICE_CPU, false);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    CHECK_OK(em_backward(em_grad_scaler_scale(sc, em_cross_entropy(em_forward(a.m, a.x), a.t, 0.0))));
    em_named_tensor p;
    CHECK(em_module_parameters(a.m, &p, 1) == 4);
    em_tensor *g = em_grad(p.tensor);
    em_tensor *gt = em_contiguous(em_transpose(g, 0, 1));      /* [16, 32] */
    em_tensor *strided = em_transpose(gt, 0, 1);                /* g's shape, not contiguous */
    CHECK_OK(em_set_grad(p.tensor, NULL));
    em_tensor *expect = em_div_scalar(strided, 65536.0);
    CHECK_OK(em_set_grad(p.tensor, strided));
    CHECK_OK(em_grad_scaler_unscale(sc, a.opt));
    CHECK(amp_err(em_grad(p.tensor), expect, 1e-30, 0) <= 1);
    CHECK_OK(em_grad_scaler_step(sc, a.opt));
    CHECK_OK(em_grad_scaler_update(sc));
    CHECK(em_grad_scaler_skipped_steps(sc) == 0);
    em_grad_scaler_free(sc);
    unmake(&a);
    em_scope_end(s);
}

static void test_disabled_is_identity(void) {
    em_scope s = em_scope_begin();
    em_grad_scaler_opts o = em_grad_scaler_defaults();
    o.enabled = false;
    em_grad_scaler *sc = em_grad_scaler_new(o);
    em_tensor *l = em_full(EM_SHAPE0, 2.5, EM_OPTS(0));
    CHECK_NEAR(em_item(em_grad_scaler_scale(sc, l)), 2.5, 0);
    CHECK(em_grad_scaler_get_scale(sc) == 1.0);
    CHECK_OK(em_grad_scaler_update(sc));
    em_grad_scaler_free(sc);
    em_scope_end(s);
}

static void test_defaults(void) {
    em_grad_scaler_opts o = em_grad_scaler_defaults();
    CHECK(o.init_scale == 65536.0 && o.growth_factor == 2.0 && o.backoff_factor == 0.5);
    CHECK(o.growth_interval == 2000 && o.enabled);
}

static void test_misuse(void) {
    em_scope s = em_scope_begin();
    em_grad_scaler_opts o = em_grad_scaler_defaults();
    o.backoff_factor = 2.0;
    CHECK(em_grad_scaler_new(o) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "0 < backoff_factor < 1");
    setup a = make(EM_DEVICE_CPU, true);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    CHECK(em_grad_scaler_unscale(sc, a.opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "nothing was scaled yet");
    CHECK(em_grad_scaler_update(sc) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no inf checks were recorded");
    CHECK(em_grad_scaler_scale(sc, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "loss is NULL");
    CHECK_OK(em_backward(em_grad_scaler_scale(sc, em_cross_entropy(em_forward(a.m, a.x), a.t, 0.0))));
    CHECK_OK(em_grad_scaler_unscale(sc, a.opt));
    CHECK(em_grad_scaler_unscale(sc, a.opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already called on this optimizer");
    CHECK_OK(em_grad_scaler_step(sc, a.opt));
    CHECK(em_grad_scaler_step(sc, a.opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already called on this optimizer");
    CHECK(em_grad_scaler_unscale(sc, a.opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already called");
    CHECK_OK(em_grad_scaler_update(sc));
    CHECK(em_grad_scaler_step(NULL, a.opt) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "scaler is NULL");
    if (em_device_available(EM_OPENCL)) { /* one scaler per device */
        em_tensor *l = em_full(EM_SHAPE0, 1.0, EM_OPTS(.device = EM_DEVICE(EM_OPENCL, 0)));
        CHECK(em_grad_scaler_scale(sc, l) == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "one scaler per device");
    }
    em_grad_scaler_free(sc);
    em_grad_scaler_free(NULL);
    unmake(&a);
    em_scope_end(s);
}

/* state_dict / load_state_dict: a scaler that skipped a step and took clean ones hands its
 * scale, tracker and count to a new one, which goes on as it would have; absurd states are
 * errors that change nothing. */
static void test_state_dict(void) {
    em_scope s0 = em_scope_begin();
    setup a = make(EM_DEVICE_CPU, false);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    em_named_tensor p[4];
    CHECK(em_module_parameters(a.m, p, 4) == 4);
    for (int step = 0; step < 4; step++) {   /* step 0 skipped (inf), then 3 clean ones */
        em_scope it = em_scope_begin();
        CHECK_OK(em_zero_grad(a.opt));
        CHECK_OK(em_backward(em_grad_scaler_scale(sc, em_mse_loss(em_forward(a.m, a.x), a.y))));
        if (step == 0) {
            em_grad_mode gm = em_no_grad_begin();
            CHECK_OK(em_fill_(em_narrow(em_grad(p[1].tensor), 0, 0, 1), NAN));
            em_no_grad_end(gm);
        }
        CHECK_OK(em_grad_scaler_step(sc, a.opt));
        CHECK_OK(em_grad_scaler_update(sc));
        em_scope_end(it);
    }
    em_grad_scaler_state st;
    CHECK_OK(em_grad_scaler_state_dict(sc, &st));
    CHECK(st.scale == 32768.0 && st.growth_tracker == 3 && st.skipped_steps == 1 && st.enabled);
    CHECK(st.growth_factor == 2.0 && st.backoff_factor == 0.5 && st.growth_interval == 2000);
    /* a fresh scaler with other settings takes all of it, before its first scale */
    em_grad_scaler_opts o = em_grad_scaler_defaults();
    o.init_scale = 8.0;
    o.growth_interval = 5;
    em_grad_scaler *b = em_grad_scaler_new(o);
    CHECK_OK(em_grad_scaler_load_state_dict(b, &st));
    CHECK(em_grad_scaler_get_scale(b) == 32768.0 && em_grad_scaler_growth_tracker(b) == 3);
    CHECK(em_grad_scaler_skipped_steps(b) == 1);
    /* one more clean step on each: the same state (growth_interval 2000 came along: no growth at 5) */
    em_grad_scaler *both[2] = {sc, b};
    for (int k = 0; k < 2; k++) {
        em_scope it = em_scope_begin();
        CHECK_OK(em_zero_grad(a.opt));
        CHECK_OK(em_backward(em_grad_scaler_scale(both[k], em_mse_loss(em_forward(a.m, a.x), a.y))));
        CHECK_OK(em_grad_scaler_step(both[k], a.opt));
        CHECK_OK(em_grad_scaler_update(both[k]));
        em_scope_end(it);
    }
    em_grad_scaler_state sa, sb;
    CHECK_OK(em_grad_scaler_state_dict(sc, &sa));
    CHECK_OK(em_grad_scaler_state_dict(b, &sb));
    CHECK(sa.scale == sb.scale && sa.growth_tracker == 4 && sb.growth_tracker == 4 && sb.skipped_steps == 1);
    /* absurd states: errors naming what was expected, the scaler unchanged */
    static const struct { double scale; int64_t tracker; double growth; bool enabled; const char *want; } bad[] = {
        {-1.0, 0, 2.0, true, "expected a finite scale > 0"},
        {NAN, 0, 2.0, true, "expected a finite scale > 0"},
        {INFINITY, 0, 2.0, true, "expected a finite scale > 0"},
        {0.0, 0, 2.0, true, "expected a finite scale > 0"},
        {1e300, 0, 2.0, true, "within float32's range"},
        {1024.0, 2000, 2.0, true, "growth tracker from 0 to growth_interval - 1"},
        {1024.0, -3, 2.0, true, "growth tracker"},
        {1024.0, 0, 0.5, true, "growth_factor > 1"},
        {1024.0, 0, 2.0, false, "disabled scaler"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        em_grad_scaler_state x = sb;
        x.scale = bad[i].scale;
        x.growth_tracker = bad[i].tracker;
        x.growth_factor = bad[i].growth;
        x.enabled = bad[i].enabled;
        CHECK(em_grad_scaler_load_state_dict(b, &x) == EM_ERR_ARGUMENT);
        CHECK_ERROR(EM_ERR_ARGUMENT, bad[i].want);
    }
    CHECK_OK(em_grad_scaler_state_dict(b, &st));
    CHECK(st.scale == sb.scale && st.growth_tracker == 4);
    /* not between step and update */
    CHECK_OK(em_zero_grad(a.opt));
    CHECK_OK(em_backward(em_grad_scaler_scale(b, em_mse_loss(em_forward(a.m, a.x), a.y))));
    CHECK_OK(em_grad_scaler_step(b, a.opt));
    CHECK(em_grad_scaler_load_state_dict(b, &sa) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "between em_grad_scaler_unscale/step and em_grad_scaler_update");
    CHECK_OK(em_grad_scaler_update(b));
    /* a disabled scaler: enabled false in its state, nothing to load into it */
    o = em_grad_scaler_defaults();
    o.enabled = false;
    em_grad_scaler *off = em_grad_scaler_new(o);
    CHECK_OK(em_grad_scaler_state_dict(off, &st));
    CHECK(!st.enabled && st.scale == 1.0);
    CHECK(em_grad_scaler_load_state_dict(off, &sa) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "this scaler is disabled");
    CHECK(em_grad_scaler_load_state_dict(NULL, &sa) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "scaler is NULL");
    CHECK(em_grad_scaler_state_dict(sc, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "out is NULL");
    em_grad_scaler_free(off);
    em_grad_scaler_free(b);
    em_grad_scaler_free(sc);
    unmake(&a);
    em_scope_end(s0);
}

int main(void) {
    RUN(test_defaults);
    RUN(test_no_sync_cpu);
    RUN(test_no_sync_opencl);
    RUN(test_unscale_then_clip_cpu);
    RUN(test_unscale_then_clip_opencl);
    RUN(test_unscale_strided);
    RUN(test_disabled_is_identity);
    RUN(test_misuse);
    RUN(test_state_dict);
    return test_summary();
}
