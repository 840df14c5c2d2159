/* The pieces that make a training step recordable as a CUDA graph, proven where they run
 * here (the CPU, and OpenCL on PoCL: the fake CUDA driver runs no kernel):
 * - Adam/AdamW with the step count and learning rate on the device (PyTorch's capturable):
 *   the same numbers as the host-scalar Adam on the same device and as the CPU's, step after
 *   step, with a learning rate changed between steps; the device's count follows the host's.
 * - em_cross_entropy on class indices with its targets checked and weighed on the device:
 *   the same loss and gradient as the host path (ignore_index, class weights, label
 *   smoothing, every reduction); an out-of-range target is an error at the next wait with
 *   the host path's message, reported once, never an abort; on the CPU the host check as
 *   before. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "nn/nn_internal.h"
#include "optim/optim_internal.h"

static const em_device OCL = {EM_OPENCL, 0};

static bool opencl_here(void) {
    if (em_device_available(EM_OPENCL)) return true;
    test_skip("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    return false;
}

/* float32 values of t on the host (n of them) */
static void host_f32(em_tensor *t, float *out, int64_t n) {
    em_scope s = em_scope_begin();
    CHECK_OK(em_copy_to_host(em_to_dtype(em_contiguous(t), EM_F32), out, (size_t)n * sizeof *out));
    em_scope_end(s);
}

/* ---- Adam with its schedule on the device ---- */

#define STEPS 6
#define NPARAM 4

/* The seed MLP's shapes, scaled down; each model from one seed. */
static em_module *mlp_on(em_device d) {
    em_manual_seed(7);
    em_module *m = em_nn_sequential(em_nn_linear(20, 16), em_nn_relu(), em_nn_linear(16, 5));
    CHECK(m && em_module_to(m, d) == EM_OK);
    return m;
}

/* STEPS steps of opt on m with gradients from one seed (the same on every device), the rate
 * changed after step 3. */
static void train(em_module *m, em_optimizer *opt) {
    em_named_tensor ps[NPARAM];
    CHECK(em_module_parameters(m, ps, NPARAM) == NPARAM);
    em_manual_seed(11);
    for (int s = 0; s < STEPS; s++) {
        em_scope sc = em_scope_begin();
        for (int k = 0; k < NPARAM; k++) {
            em_tensor *p = ps[k].tensor;
            em_tensor *g = em_randn(em_shape_of(p), EM_OPTS(.dtype = EM_F32));   /* on the CPU: same draws */
            CHECK_OK(em_set_grad(p, em_to(g, em_device_of(p))));
        }
        CHECK_OK(em_step(opt));
        if (s == 2) CHECK_OK(em_optim_set_lr(opt, 0.003));
        em_scope_end(sc);
    }
}

static void params_of(em_module *m, float *out, int64_t cap) {
    em_named_tensor ps[NPARAM];
    CHECK(em_module_parameters(m, ps, NPARAM) == NPARAM);
    int64_t at = 0;
    for (int k = 0; k < NPARAM; k++) {
        int64_t n = em_numel(ps[k].tensor);
        CHECK(at + n <= cap);
        host_f32(ps[k].tensor, out + at, n);
        at += n;
    }
}

static void adam_schedule_matches(bool decoupled) {
    if (!opencl_here()) return;
    enum { CAP = 20 * 16 + 16 + 16 * 5 + 5 };
    float ref[CAP], host[CAP], dev[CAP];
    em_adam_opts o = decoupled ? em_adamw_defaults(0.01) : em_adam_defaults(0.01);
    if (!decoupled) o.weight_decay = 0.02;   /* Adam's L2 term too */
    em_optimizer *(*make)(em_module *, em_adam_opts) = decoupled ? em_adamw_ex : em_adam_ex;
    /* the CPU's Adam */
    em_module *mc = mlp_on(EM_DEVICE_CPU);
    em_optimizer *oc = make(mc, o);
    train(mc, oc);
    params_of(mc, ref, CAP);
    /* OpenCL, host scalars */
    em_module *mh = mlp_on(OCL);
    em_optimizer *oh = make(mh, o);
    em__optim_device_schedule_of(oh)->mode = 0;
    train(mh, oh);
    params_of(mh, host, CAP);
    CHECK(em__optim_device_schedule_of(oh)->state == NULL);
    /* OpenCL, the schedule on the device */
    em_module *md = mlp_on(OCL);
    em_optimizer *od = make(md, o);
    em__optim_device_schedule_of(od)->mode = 1;
    train(md, od);
    params_of(md, dev, CAP);
    em__optim_device_schedule *ds = em__optim_device_schedule_of(od);
    if (!ds->state) {   /* a device without float64 declines the schedule: host scalars */
        SKIP("opencl:0 has no float64: Adam's schedule stays on the host");
    }
    CHECK(ds->used && ds->steps == STEPS);
    double st[2] = {0};
    CHECK_OK(em_copy_to_host(ds->state, st, sizeof st));
    CHECK(st[0] == STEPS && st[1] == 0.003);   /* the device's count and the rate set between steps */
    CHECK(em_optim_steps(od) == STEPS);
    int mismatch = 0, first = -1;
    for (int i = 0; i < CAP; i++) {
        if (memcmp(&dev[i], &host[i], sizeof(float)) != 0 && mismatch++ == 0) first = i;
    }
    if (mismatch) fprintf(stderr, "  %d of %d differ from the host-scalar step, first [%d]: %.9g vs %.9g\n", mismatch,
                          (int)CAP, first, (double)dev[first], (double)host[first]);
    CHECK(mismatch == 0);   /* bit for bit */
    double worst = 0;
    for (int i = 0; i < CAP; i++) worst = fmax(worst, fabs((double)dev[i] - (double)ref[i]));
    CHECK(worst < 1e-6);   /* as the fused OpenCL step agrees with the CPU's (test_optim_fused) */
    /* no capture held: nothing was replayed */
    CHECK(em_optim_step_replayed(od) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no em_step of this optimizer was recorded");
    em_optim_free(oc);
    em_optim_free(oh);
    em_optim_free(od);
    em_module_free(mc);
    em_module_free(mh);
    em_module_free(md);
}

static void test_adam_schedule_on_device(void) { adam_schedule_matches(false); }
static void test_adamw_schedule_on_device(void) { adam_schedule_matches(true); }

/* A checkpoint-like change of the host's count rewrites the device's before the next step. */
static void test_schedule_follows_host_count(void) {
    if (!opencl_here()) return;
    em_module *m = mlp_on(OCL);
    em_optimizer *opt = em_adam(m, 0.01);
    em__optim_device_schedule *ds = em__optim_device_schedule_of(opt);
    ds->mode = 1;
    train(m, opt);
    if (!ds->state) {
        em_optim_free(opt);
        em_module_free(m);
        SKIP("opencl:0 has no float64");
    }
    for (int i = 0; i < em__optim_nparams(opt); i++) *em__optim_param_step(opt, i) = 100;
    train(m, opt);
    double st[2] = {0};
    CHECK_OK(em_copy_to_host(ds->state, st, sizeof st));
    CHECK(st[0] == 100 + STEPS && ds->steps == 100 + STEPS);
    em_optim_free(opt);
    em_module_free(m);
}

/* ---- class-index targets on the device ---- */

/* loss and input gradient of cross_entropy_ex on dev, host or device targets */
static double ce_on(em_device dev, bool device_targets, const em_loss_opts *o, const float *x, const int64_t *t,
                    float *grad) {
    int was = em__loss_device_targets(device_targets ? 1 : 0);
    em_scope s = em_scope_begin();
    em_tensor *in = em_to(em_from_data(x, EM_F32, EM_SHAPE(6, 4), EM_OPTS(.dtype = EM_F32)), dev);
    CHECK_OK(em_set_requires_grad(in, true));
    em_tensor *tg = em_to(em_from_data(t, EM_I64, EM_SHAPE(6), EM_OPTS(.dtype = EM_I64)), dev);
    em_loss_opts oo = *o;
    if (o->weight) oo.weight = em_to(o->weight, dev);
    em_tensor *loss = em_cross_entropy_ex(in, tg, &oo);
    CHECK(loss != NULL);
    double v = NAN;
    if (loss) {
        em_tensor *l = oo.reduction == EM_REDUCTION_NONE ? em_sum(loss, EM_ALL_DIMS, false) : loss;
        CHECK_OK(em_backward(l));
        v = em_item(l);
        host_f32(em_grad(in), grad, 24);
    }
    em_scope_end(s);
    em__loss_device_targets(was);
    return v;
}

static void test_device_targets_match_host(void) {
    if (!opencl_here()) return;
    float x[24];
    for (int i = 0; i < 24; i++) x[i] = (float)sin(1.7 * i) * 2.0f;
    const int64_t t[6] = {0, 3, -100, 2, 1, 3};
    const int64_t none_counted[6] = {-100, -100, -100, -100, -100, -100};
    const int64_t three_ignored[6] = {0, 3, 1, 2, 3, 3};
    em_scope s = em_scope_begin();
    em_tensor *w = em_from_data((float[]){0.5f, 2.0f, 1.0f, 0.25f}, EM_F32, EM_SHAPE(4), EM_OPTS(.dtype = EM_F32));
    em_loss_opts cases[] = {
        {0},
        {.reduction = EM_REDUCTION_SUM},
        {.reduction = EM_REDUCTION_NONE},
        {.weight = w},
        {.weight = w, .label_smoothing = 0.1},
        {.label_smoothing = 0.2, .reduction = EM_REDUCTION_NONE},
        {.ignore_index = &(int64_t){-100}, .weight = w, .reduction = EM_REDUCTION_SUM},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float gh[24], gd[24], gc[24];
        double lh = ce_on(OCL, false, &cases[c], x, t, gh);
        double ld = ce_on(OCL, true, &cases[c], x, t, gd);
        double lc = ce_on(EM_DEVICE_CPU, false, &cases[c], x, t, gc);
        CHECK_NEAR(ld, lh, 1e-6 * fmax(1.0, fabs(lh)));
        CHECK_NEAR(ld, lc, 1e-5 * fmax(1.0, fabs(lc)));
        for (int i = 0; i < 24; i++) CHECK_NEAR(gd[i], gh[i], 1e-6);
    }
    /* an ignore_index that is a class: those targets are not counted */
    float gh[24], gd[24];
    em_loss_opts ign3 = {.ignore_index = &(int64_t){3}};
    double lh3 = ce_on(OCL, false, &ign3, x, three_ignored, gh), ld3 = ce_on(OCL, true, &ign3, x, three_ignored, gd);
    CHECK_NEAR(ld3, lh3, 1e-6);
    for (int i = 0; i < 24; i++) CHECK_NEAR(gd[i], gh[i], 1e-6);
    /* every target ignored: NaN loss and a zero gradient, as the host path (and PyTorch) */
    float g[24];
    double l = ce_on(OCL, true, &(em_loss_opts){0}, x, none_counted, g);
    CHECK(isnan(l));
    for (int i = 0; i < 24; i++) CHECK(g[i] == 0.0f);
    em_scope_end(s);
}

/* An out-of-range target: the loss is made (nothing was read), the next wait fails with the
 * host check's message, once. */
static void test_bad_target_reported_at_wait(void) {
    if (!opencl_here()) return;
    int was = em__loss_device_targets(1);
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_SHAPE(3, 5), EM_OPTS(.device = OCL));
    em_tensor *t = em_to(em_from_data((int64_t[]){1, 7, 9}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64)), OCL);
    em_tensor *loss = em_cross_entropy(x, t, 0.0);
    CHECK(loss != NULL && !em_failed());
    double v = em_item(loss);
    CHECK(isnan(v));
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: Target 7 is out of bounds: target[1] must be a class index in "
                                 "[0, 5) or ignore_index (-100)");
    CHECK(!isnan(em_item(loss)) && !em_failed());   /* reported once */
    /* good targets queue a clear check; a later wait stays quiet */
    em_tensor *good = em_to(em_from_data((int64_t[]){1, 2, 4}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64)), OCL);
    em_tensor *ok = em_cross_entropy(x, good, 0.0);
    CHECK(ok && fabs(em_item(ok) - log(5.0)) < 1e-6 && !em_failed());
    CHECK_OK(em_device_synchronize(OCL));
    /* targets on the host with the input on the device: taken, as the host path takes them */
    em_tensor *host_t = em_from_data((int64_t[]){1, 2, 4}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64));
    em_tensor *mixed = em_cross_entropy(x, host_t, 0.0);
    CHECK(mixed && fabs(em_item(mixed) - log(5.0)) < 1e-6 && !em_failed());
    /* and the first of two bad losses is the one reported, at a synchronize */
    em_tensor *neg = em_to(em_from_data((int64_t[]){-2, 0, 0}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64)), OCL);
    CHECK(em_cross_entropy(x, neg, 0.0) != NULL);
    CHECK(em_cross_entropy(x, t, 0.0) != NULL);
    CHECK(em_device_synchronize(OCL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Target -2 is out of bounds: target[0]");
    em_scope_end(s);
    em__loss_device_targets(was);
}

/* The CPU keeps the host check: the error at once, the loss NULL. */
static void test_bad_target_on_cpu_at_once(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_SHAPE(3, 5), EM_OPTS(.dtype = EM_F32));
    em_tensor *t = em_from_data((int64_t[]){1, 7, 9}, EM_I64, EM_SHAPE(3), EM_OPTS(.dtype = EM_I64));
    CHECK(em_cross_entropy(x, t, 0.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: Target 7 is out of bounds: target[1] must be a class index in "
                                 "[0, 5) or ignore_index (-100)");
    em_scope_end(s);
}

int main(void) {
    RUN(test_adam_schedule_on_device);
    RUN(test_adamw_schedule_on_device);
    RUN(test_schedule_follows_host_count);
    RUN(test_device_targets_match_host);
    RUN(test_bad_target_reported_at_wait);
    RUN(test_bad_target_on_cpu_at_once);
    em__device_checks_reset();
    return test_summary();
}
