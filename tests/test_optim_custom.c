/* Optimizers defined outside Ember (em_optimizer_new, include/ember/optim.h): the header's
 * Adadelta, written with public ops, against em_adadelta; what it gets for free (em_zero_grad,
 * a scheduler, checkpoints of its states and scalars, em_module_to); and every bad ops table
 * and bad option refused with a clear error. Also the built-in optimizers' states (all of
 * them, options that keep every one) through a checkpoint: a resumed run continues exactly. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdlib.h>
#include <unistd.h>
#include "test.h"

/* ---- the header's example ---- */
typedef struct adadelta_hyper {
    double rho, eps;
} adadelta_hyper;

static em_status my_adadelta_step(const em_optim_update *u) {
    const adadelta_hyper *h = u->hyper;
    em_tensor *sq = u->state[0], *acc = u->state[1], *g = u->grad;
    em_mul_scalar_(sq, h->rho);
    em_add_(sq, em_mul(g, g), 1 - h->rho);
    em_tensor *delta = em_mul(em_div(em_sqrt(em_add_scalar(acc, h->eps)), em_sqrt(em_add_scalar(sq, h->eps))), g);
    em_mul_scalar_(acc, h->rho);
    em_add_(acc, em_mul(delta, delta), 1 - h->rho);
    return em_add_(u->param, delta, -u->lr);
}
static const char *const adadelta_names[] = {"square_avg", "acc_delta"};
static const em_optimizer_ops my_adadelta_ops = {.name = "my_adadelta", .nstate = 2, .state_names = adadelta_names,
                                                 .hyper_size = sizeof(adadelta_hyper), .step = my_adadelta_step};

/* An optimizer with a per-parameter scalar: it counts the gradient's sign flips in "flips"
 * and steps p -= lr * g; "seen_lr" records the rate each step saw (schedules reach it). */
static double g_seen_lr[64];
static int g_nseen;
static em_status counting_step(const em_optim_update *u) {
    if (g_nseen < 64) g_seen_lr[g_nseen++] = u->lr;
    u->scalars[0] += 1;
    return em_add_(u->param, u->grad, -u->lr);
}
static const char *const counting_scalars[] = {"flips"};
static const double counting_init[] = {10};
static const em_optimizer_ops counting_ops = {.name = "counting", .nscalar = 1, .scalar_names = counting_scalars,
                                              .scalar_init = counting_init, .step = counting_step};

static em_tensor *identity_forward(em_module *m, em_tensor *x) { (void)m; return x; }
static const em_module_ops holder_ops = {.name = "Holder", .forward = identity_forward};

/* Two float64 parameters, the same values for the same seed. */
static em_module *model(uint64_t seed) {
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    em_manual_seed(seed);
    CHECK_OK(em_module_add_parameter(m, "w", em_randn(EM_SHAPE(3, 4), EM_OPTS(.dtype = EM_F64))));
    CHECK_OK(em_module_add_parameter(m, "b", em_randn(EM_SHAPE(4), EM_OPTS(.dtype = EM_F64))));
    em_scope_end(s);
    return m;
}

static em_tensor *param(em_module *m, int i) {
    em_named_tensor ps[2];
    CHECK(em_module_parameters(m, ps, 2) == 2);
    return ps[i].tensor;
}

/* Gradients of step t (the same for every model): set on each of m's parameters. */
static void set_grads(em_module *m, int t) {
    em_scope s = em_scope_begin();
    em_manual_seed(1000 + (uint64_t)t);
    for (int i = 0; i < 2; i++) {
        em_tensor *p = param(m, i);
        em_tensor *g = em_randn(EM_SHAPE(em_numel(p)), EM_OPTS(.dtype = EM_F64));
        CHECK_OK(em_set_grad(p, em_to(em_reshape(g, em_shape_of(p)), em_device_of(p))));
    }
    em_scope_end(s);
}

/* Largest |a - b| / max(|b|, 1e-12) (a and b of one shape, any device). */
static double rel_diff(em_tensor *a, em_tensor *b) {
    int64_t n = em_numel(b);
    double x[64], y[64], worst = 0;
    CHECK(n <= 64);
    em_scope s = em_scope_begin();
    em_status st = em_copy_to_host(em_to(a, EM_DEVICE_CPU), x, (size_t)n * sizeof *x);
    if (st == EM_OK) st = em_copy_to_host(em_to(b, EM_DEVICE_CPU), y, (size_t)n * sizeof *y);
    em_scope_end(s);
    for (int64_t i = 0; st == EM_OK && i < n; i++) {
        double d = fabs(x[i] - y[i]) / fmax(fabs(y[i]), 1e-12);
        if (!(d <= worst)) worst = d;
    }
    return st == EM_OK ? worst : INFINITY;
}

static double models_diff(em_module *a, em_module *b) {
    return fmax(rel_diff(param(a, 0), param(b, 0)), rel_diff(param(a, 1), param(b, 1)));
}

static void test_custom_matches_builtin(void) {
    em_module *mine = model(7), *theirs = model(7);
    em_optimizer *o1 = em_optimizer_new(mine, &my_adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0);
    em_optimizer *o2 = em_adadelta(theirs, 1.0);
    CHECK(o1 && o2);
    if (!o1 || !o2) {
        fprintf(stderr, "  %s\n", em_last_error());
        em_clear_error();
    }
    CHECK(!strcmp(em_optim_name(o1), "my_adadelta"));
    CHECK(!strcmp(em_optim_name(o2), "adadelta"));
    CHECK(em_optim_state(o1, param(mine, 0), "square_avg") == NULL);   /* made at the first step */
    CHECK(!em_failed());
    for (int t = 1; t <= 6; t++) {
        set_grads(mine, t), set_grads(theirs, t);
        CHECK_OK(em_step(o1));
        CHECK_OK(em_step(o2));
        CHECK(models_diff(mine, theirs) <= 1e-12);
        for (int k = 0; k < 2; k++) {
            em_tensor *a = em_optim_state(o1, param(mine, 0), adadelta_names[k]);
            em_tensor *b = em_optim_state(o2, param(theirs, 0), adadelta_names[k]);
            CHECK(a && b && rel_diff(a, b) <= 1e-12);
            em_release(a), em_release(b);
        }
        CHECK_OK(em_zero_grad(o1));
        CHECK(em_grad(param(mine, 0)) == NULL && em_grad(param(mine, 1)) == NULL);
    }
    CHECK(em_optim_steps(o1) == 6);
    CHECK(em_optim_scalar(o1, param(mine, 1), "step") == 6);
    /* the options are the optimizer's copy: changing them changes the next step */
    adadelta_hyper *h = em_optim_hyper(o1);
    CHECK(h && h->rho == 0.9);
    /* a step with no gradient changes nothing */
    em_tensor *before = em_clone(param(mine, 0));
    CHECK_OK(em_step(o1));
    CHECK(rel_diff(param(mine, 0), before) == 0);
    em_release(before);
    em_optim_free(o1), em_optim_free(o2);
    em_module_free(mine), em_module_free(theirs);
}

static char g_path[64];
static void temp_path(void) {
    snprintf(g_path, sizeof g_path, "/tmp/ember_test_custom_XXXXXX");
    int fd = mkstemp(g_path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
}

/* Stopped after 3 steps, saved, loaded into a fresh model and optimizer: 3 more steps end
 * where 6 uninterrupted ones do, the states and scalars included. */
static void test_custom_checkpoint(void) {
    temp_path();
    em_module *ref = model(3), *a = model(3);
    em_optimizer *oref = em_optimizer_new(ref, &my_adadelta_ops, &(adadelta_hyper){0.8, 1e-5}, 0.5);
    em_optimizer *oa = em_optimizer_new(a, &my_adadelta_ops, &(adadelta_hyper){0.8, 1e-5}, 0.5);
    for (int t = 1; t <= 6; t++) {
        set_grads(ref, t);
        CHECK_OK(em_step(oref));
        if (t > 3) continue;
        set_grads(a, t);
        CHECK_OK(em_step(oa));
    }
    CHECK_OK(em_checkpoint_save(g_path, a, oa, NULL, NULL, 0));
    em_optim_free(oa), em_module_free(a);

    em_module *b = model(99);   /* other values: the checkpoint brings them */
    em_optimizer *ob = em_optimizer_new(b, &my_adadelta_ops, &(adadelta_hyper){0.8, 1e-5}, 0.5);
    CHECK_OK(em_checkpoint_load(g_path, b, ob, NULL));
    CHECK(em_optim_steps(ob) == 3);
    for (int t = 4; t <= 6; t++) {
        set_grads(b, t);
        CHECK_OK(em_step(ob));
    }
    CHECK(models_diff(b, ref) == 0);
    em_tensor *x = em_optim_state(ob, param(b, 1), "acc_delta"), *y = em_optim_state(oref, param(ref, 1), "acc_delta");
    CHECK(x && y && rel_diff(x, y) == 0);
    em_release(x), em_release(y);

    /* another kind's checkpoint is refused, and changes nothing */
    em_module *c = model(5);
    em_optimizer *oc = em_optimizer_new(c, &counting_ops, NULL, 0.1);
    em_tensor *w = em_clone(param(c, 0));
    CHECK(em_checkpoint_load(g_path, c, oc, NULL) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "my_adadelta");
    CHECK(rel_diff(param(c, 0), w) == 0);
    em_release(w);

    /* scalars: kept per parameter from scalar_init, saved and restored */
    set_grads(c, 1);
    CHECK_OK(em_step(oc));
    CHECK_OK(em_step(oc));
    CHECK(em_optim_scalar(oc, param(c, 0), "flips") == 12);
    CHECK_OK(em_checkpoint_save(g_path, c, oc, NULL, NULL, 0));
    em_module *d = model(5);
    em_optimizer *od = em_optimizer_new(d, &counting_ops, NULL, 0.1);
    CHECK(em_optim_scalar(od, param(d, 1), "flips") == 10);
    CHECK_OK(em_checkpoint_load(g_path, d, od, NULL));
    CHECK(em_optim_scalar(od, param(d, 1), "flips") == 12);
    CHECK(em_optim_scalar(od, param(d, 1), "step") == 2);
    CHECK(isnan(em_optim_scalar(od, param(d, 1), "nope")));
    CHECK_ERROR(EM_ERR_ARGUMENT, "keeps no scalar \"nope\"");
    remove(g_path);
    em_optim_free(ob), em_optim_free(oref), em_optim_free(oc), em_optim_free(od);
    em_module_free(b), em_module_free(ref), em_module_free(c), em_module_free(d);
}

/* A scheduler drives a user optimizer's rate: the step function sees it. */
static void test_custom_schedule(void) {
    em_module *m = model(1);
    em_optimizer *o = em_optimizer_new(m, &counting_ops, NULL, 0.4);
    em_lr_scheduler *s = em_lr_scheduler_new(o, em_lr_step(2, 0.5), -1);
    CHECK(s != NULL);
    g_nseen = 0;
    for (int t = 0; t < 6; t++) {
        set_grads(m, t);
        CHECK_OK(em_step(o));
        CHECK_OK(em_lr_scheduler_step(s));
    }
    const double want[] = {0.4, 0.4, 0.2, 0.2, 0.1, 0.1};
    CHECK(g_nseen == 12);   /* two parameters a step */
    for (int t = 0; t < 6 && g_nseen == 12; t++) CHECK_NEAR(g_seen_lr[2 * t], want[t], 1e-15);
    /* OneCycleLR cycling momentum needs the ops' momentum: refused without one */
    em_lr_scheduler_free(s);
    CHECK(em_lr_scheduler_new(o, em_lr_one_cycle(1.0, 10), -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cycle_momentum");
    em_lr_schedule oc = em_lr_one_cycle(1.0, 10);
    oc.cycle_momentum = false;
    s = em_lr_scheduler_new(o, oc, -1);
    CHECK(s != NULL);
    CHECK_NEAR(em_optim_lr(o), 1.0 / 25, 1e-15);
    em_lr_scheduler_free(s);
    em_optim_free(o);
    em_module_free(m);
}

/* em_module_to moves a user optimizer's states with the parameters. */
static void test_custom_moves_with_module(void) {
    if (!em_device_available(EM_OPENCL)) {
        test_skip("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
        return;
    }
    em_device dev = EM_DEVICE(EM_OPENCL, 0);
    em_module *ref = model(4), *m = model(4);
    em_optimizer *oref = em_optimizer_new(ref, &my_adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0);
    em_optimizer *o = em_optimizer_new(m, &my_adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0);
    for (int t = 1; t <= 4; t++) {
        if (t == 3) CHECK_OK(em_module_to(m, dev));   /* after its states were made */
        set_grads(ref, t), set_grads(m, t);
        CHECK_OK(em_step(oref));
        CHECK_OK(em_step(o));
    }
    em_tensor *sq = em_optim_state(o, param(m, 0), "square_avg");
    CHECK(sq && em_device_equal(em_device_of(sq), dev));
    em_release(sq);
    em_scope s = em_scope_begin();
    bool f64 = em_add(em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = dev)),
                      em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = dev))) != NULL;
    em_clear_error();
    em_scope_end(s);
    if (f64) CHECK(models_diff(m, ref) <= 1e-12);
    em_optim_free(o), em_optim_free(oref);
    em_module_free(m), em_module_free(ref);
}

static em_status step_nothing(const em_optim_update *u) { (void)u; return EM_OK; }
static em_status refuse_all(const void *hyper) {
    (void)hyper;
    return em_error(EM_ERR_ARGUMENT, "my_check: option x must be positive");
}

/* Every promise of the ops table, checked by em_optimizer_new with a clear error. */
static void test_optimizer_new_bad_args(void) {
    em_module *m = model(2);
    adadelta_hyper h = {0.9, 1e-6};
    CHECK(em_optimizer_new(m, NULL, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "ops is NULL");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "needs a name and a step function");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x"}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no step");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 9, .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 0 to 8");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nscalar = -1, .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 0 to 8");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 1, .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "state 0's name is NULL");
    static const char *const step_name[] = {"step"}, *const dup[] = {"a", "a"}, *const empty[] = {""};
    static const char *const long_name[] = {"a_name_longer_than_thirty_two_characters"};
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nscalar = 1, .scalar_names = step_name,
                                                  .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "not \"step\"");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 2, .state_names = dup, .step = step_nothing},
                           NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "state 1's name is \"a\"");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 1, .state_names = dup, .nscalar = 1,
                                                  .scalar_names = dup, .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "scalar 0's name is \"a\"");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 1, .state_names = empty, .step = step_nothing},
                           NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "state 0's name is \"\"");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .nstate = 1, .state_names = long_name,
                                                  .step = step_nothing}, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 1 to 32 characters");
    CHECK(em_optimizer_new(m, &my_adadelta_ops, NULL, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "hyper is NULL");
    CHECK(em_optimizer_new(m, &(em_optimizer_ops){.name = "x", .check = refuse_all, .step = step_nothing}, NULL, 0.1) ==
          NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "option x must be positive");
    CHECK(em_optimizer_new(m, &my_adadelta_ops, &h, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate: -1");
    CHECK(em_optimizer_new(m, &my_adadelta_ops, &h, NAN) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate");
    CHECK(em_optimizer_new(NULL, &my_adadelta_ops, &h, 0.1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "module is NULL");
    /* the queries on NULL or on what the optimizer does not have */
    CHECK(em_optim_hyper(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "optimizer is NULL");
    CHECK(em_optim_name(NULL) == NULL);
    em_optimizer *o = em_optimizer_new(m, &my_adadelta_ops, &h, 0.1);
    CHECK(o != NULL);
    CHECK(em_optim_state(o, param(m, 0), "exp_avg") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "my_adadelta keeps no state \"exp_avg\"");
    CHECK(isnan(em_optim_scalar(NULL, param(m, 0), "step")));
    CHECK_ERROR(EM_ERR_ARGUMENT, "is NULL");
    CHECK(isnan(em_optim_scalar(o, NULL, "step")));
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 'p' is NULL");
    em_tensor *stranger = em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64));
    CHECK(isnan(em_optim_scalar(o, stranger, "step")));
    CHECK_ERROR(EM_ERR_ARGUMENT, "not a parameter of this optimizer");
    em_release(stranger);
    em_optim_free(o);
    em_module_free(m);
}

/* Each built-in constructor refuses what PyTorch refuses, with PyTorch's words. */
static void test_builtin_bad_options(void) {
    em_module *m = model(2);
    em_adadelta_opts ad = em_adadelta_defaults(1.0);
    ad.rho = 2;
    CHECK(em_adadelta_ex(m, ad) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid rho value: 2");
    em_adagrad_opts ag = em_adagrad_defaults(0.01);
    ag.lr_decay = -1;
    CHECK(em_adagrad_ex(m, ag) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid lr_decay value: -1");
    ag = em_adagrad_defaults(0.01);
    ag.initial_accumulator_value = -0.5;
    CHECK(em_adagrad_ex(m, ag) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid initial_accumulator_value value: -0.5");
    em_rmsprop_opts rm = em_rmsprop_defaults(0.01);
    rm.alpha = -0.1;
    CHECK(em_rmsprop_ex(m, rm) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid alpha value: -0.1");
    rm = em_rmsprop_defaults(0.01);
    rm.momentum = -1;
    CHECK(em_rmsprop_ex(m, rm) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid momentum value: -1");
    em_adamax_opts am = em_adamax_defaults(0.002);
    am.beta1 = 1.0;
    CHECK(em_adamax_ex(m, am) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid beta parameter at index 0: 1");
    em_nadam_opts na = em_nadam_defaults(0.002);
    na.momentum_decay = -1;
    CHECK(em_nadam_ex(m, na) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid momentum_decay value: -1");
    na = em_nadam_defaults(0.002);
    na.beta2 = -0.5;
    CHECK(em_nadam_ex(m, na) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid beta parameter at index 1: -0.5");
    em_radam_opts ra = em_radam_defaults(0.001);
    ra.eps = -1;
    CHECK(em_radam_ex(m, ra) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid epsilon value: -1");
    ra = em_radam_defaults(0.001);
    ra.weight_decay = -1;
    CHECK(em_radam_ex(m, ra) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid weight_decay value: -1");
    /* every constructor: a bad learning rate, and no module */
    em_optimizer *(*const ctor[])(em_module *, double) = {em_adadelta, em_adagrad, em_rmsprop,
                                                           em_adamax,   em_nadam,   em_radam};
    for (size_t i = 0; i < sizeof ctor / sizeof *ctor; i++) {
        CHECK(ctor[i](m, -1) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate: -1");
        CHECK(ctor[i](NULL, 0.1) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, "module is NULL");
    }
    em_module_free(m);
}

/* Every built-in optimizer, with options that keep every state it has, saved after 3 steps
 * and resumed: the run ends where an uninterrupted one does, bit for bit. */
static em_optimizer *builtin(int kind, em_module *m) {
    switch (kind) {
    case 0: { em_sgd_opts o = em_sgd_defaults(0.05); o.momentum = 0.9; o.nesterov = true; return em_sgd_ex(m, o); }
    case 1: { em_adam_opts o = em_adam_defaults(0.01); o.amsgrad = true; return em_adam_ex(m, o); }
    case 2: { em_adam_opts o = em_adamw_defaults(0.01); o.amsgrad = true; return em_adamw_ex(m, o); }
    case 3: { em_adadelta_opts o = em_adadelta_defaults(1.0); o.weight_decay = 0.1; return em_adadelta_ex(m, o); }
    case 4: { em_adagrad_opts o = em_adagrad_defaults(0.1); o.lr_decay = 0.01; return em_adagrad_ex(m, o); }
    case 5: {
        em_rmsprop_opts o = em_rmsprop_defaults(0.01);
        o.centered = true, o.momentum = 0.5;
        return em_rmsprop_ex(m, o);
    }
    case 6: return em_adamax(m, 0.01);
    case 7: return em_nadam(m, 0.01);
    default: { em_radam_opts o = em_radam_defaults(0.01); o.decoupled_weight_decay = true, o.weight_decay = 0.1; return em_radam_ex(m, o); }
    }
}

static void test_builtin_states_resume(void) {
    static const char *const all[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg",
                                      "acc_delta", "sum", "grad_avg", "exp_inf"};
    temp_path();
    for (int kind = 0; kind < 9; kind++) {
        em_module *ref = model(8), *a = model(8);
        em_optimizer *oref = builtin(kind, ref), *oa = builtin(kind, a);
        CHECK(oref && oa);
        if (!oref || !oa) {
            fprintf(stderr, "  kind %d: %s\n", kind, em_last_error());
            em_clear_error();
            em_optim_free(oref), em_optim_free(oa), em_module_free(ref), em_module_free(a);
            continue;
        }
        for (int t = 1; t <= 6; t++) {
            set_grads(ref, t);
            CHECK_OK(em_step(oref));
            if (t > 3) continue;
            set_grads(a, t);
            CHECK_OK(em_step(oa));
        }
        CHECK_OK(em_checkpoint_save(g_path, a, oa, NULL, NULL, 0));
        em_optim_free(oa), em_module_free(a);
        em_module *b = model(9);
        em_optimizer *ob = builtin(kind, b);
        CHECK_OK(em_checkpoint_load(g_path, b, ob, NULL));
        for (int t = 4; t <= 6; t++) {
            set_grads(b, t);
            CHECK_OK(em_step(ob));
        }
        double worst = models_diff(b, ref);
        int nstates = 0;
        for (int j = 0; j < 9; j++) {
            em_tensor *x = em_optim_state(ob, param(b, 0), all[j]), *y = em_optim_state(oref, param(ref, 0), all[j]);
            em_clear_error();
            CHECK(!x == !y);
            if (x && y) worst = fmax(worst, rel_diff(x, y)), nstates++;
            em_release(x), em_release(y);
        }
        if (kind == 7)   /* NAdam's mu_product, a scalar state */
            worst = fmax(worst, fabs(em_optim_scalar(ob, param(b, 0), "mu_product") -
                                     em_optim_scalar(oref, param(ref, 0), "mu_product")));
        if (worst != 0) fprintf(stderr, "  %s: resumed run differs by %g\n", em_optim_name(ob), worst);
        CHECK(worst == 0);
        CHECK(nstates >= 1);
        em_optim_free(ob), em_optim_free(oref);
        em_module_free(b), em_module_free(ref);
    }
    remove(g_path);
}

/* GradScaler with an optimizer that reads no found-inf flag in its kernels (a new built-in
 * one, a user's): an inf gradient skips the whole step, parameters and states untouched, and
 * a clean one is unscaled first and stepped as without a scaler. */
static void test_scaler_skips_and_unscales(void) {
    for (int which = 0; which < 2; which++) {
        em_module *m = model(6), *ref = model(6);
        em_optimizer *o = which ? em_optimizer_new(m, &my_adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0)
                                : em_rmsprop(m, 0.01);
        em_optimizer *oref = which ? em_optimizer_new(ref, &my_adadelta_ops, &(adadelta_hyper){0.9, 1e-6}, 1.0)
                                   : em_rmsprop(ref, 0.01);
        em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
        CHECK(o && oref && sc);
        /* an inf in the gradient: skipped */
        em_tensor *before = em_clone(param(m, 0));
        set_grads(m, 1);
        em_scope s = em_scope_begin();
        CHECK(em_grad_scaler_scale(sc, em_ones(EM_SHAPE(1), EM_OPTS(0))) != NULL);   /* a scaled loss, as backward's */
        CHECK_OK(em_set_grad(param(m, 1), em_full(EM_SHAPE(4), INFINITY, EM_OPTS(.dtype = EM_F64))));
        em_scope_end(s);
        CHECK_OK(em_grad_scaler_step(sc, o));
        CHECK_OK(em_grad_scaler_update(sc));
        CHECK(em_grad_scaler_skipped_steps(sc) == 1);
        CHECK(rel_diff(param(m, 0), before) == 0);
        em_release(before);
        /* a clean gradient, scaled as the scaler's loss would scale it: the same step as plain */
        double scale = em_grad_scaler_get_scale(sc);
        set_grads(m, 2), set_grads(ref, 2);
        s = em_scope_begin();
        CHECK(em_grad_scaler_scale(sc, em_ones(EM_SHAPE(1), EM_OPTS(0))) != NULL);
        for (int i = 0; i < 2; i++) CHECK_OK(em_set_grad(param(m, i), em_mul_scalar(em_grad(param(m, i)), scale)));
        em_scope_end(s);
        CHECK_OK(em_grad_scaler_step(sc, o));
        CHECK_OK(em_step(oref));
        CHECK(models_diff(m, ref) <= 1e-12);
        em_grad_scaler_free(sc);
        em_optim_free(o), em_optim_free(oref);
        em_module_free(m), em_module_free(ref);
    }
}

/* Restoring an optimizer by hand (em_optim_ops, _set_state, _set_scalar, _set_steps): a
 * second Adam given the first one's table, states, steps and scalars continues exactly as the
 * first does. */
static void test_restore_by_hand(void) {
    em_manual_seed(4);
    em_module *a = em_nn_linear(6, 3);
    em_module *b = em_nn_linear(6, 3);
    em_named_tensor pa[2], pb[2];
    CHECK(em_module_parameters(a, pa, 2) == 2 && em_module_parameters(b, pb, 2) == 2);
    em_optimizer *oa = em_adamw(a, 1e-2);
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    for (int i = 0; i < 2; i++) CHECK_OK(em_copy_(pb[i].tensor, pa[i].tensor));
    em_no_grad_end(mode);
    em_tensor *x = em_randn(EM_SHAPE(5, 6), EM_OPTS(0));
    for (int step = 0; step < 3; step++) {
        em_zero_grad(oa);
        CHECK_OK(em_backward(em_sum(em_mul(em_forward(a, x), em_forward(a, x)), EM_ALL_DIMS, false)));
        CHECK_OK(em_step(oa));
    }
    CHECK(em_optim_ops(oa) != NULL && !strcmp(em_optim_ops(oa)->name, "adamw"));
    em_optimizer *ob = em_optimizer_new(b, em_optim_ops(oa), em_optim_hyper(oa), em_optim_lr(oa));
    CHECK(ob != NULL);
    mode = em_no_grad_begin();
    for (int i = 0; i < 2; i++) CHECK_OK(em_copy_(pb[i].tensor, pa[i].tensor));
    em_no_grad_end(mode);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(em_optim_set_state(ob, pb[i].tensor, "exp_avg", em_reshape(em_optim_state(oa, pa[i].tensor, "exp_avg"), EM_SHAPE(-1))));
        CHECK_OK(em_optim_set_state(ob, pb[i].tensor, "exp_avg_sq", em_optim_state(oa, pa[i].tensor, "exp_avg_sq")));
        CHECK_OK(em_optim_set_scalar(ob, pb[i].tensor, "step", em_optim_scalar(oa, pa[i].tensor, "step")));
    }
    CHECK_OK(em_optim_set_steps(ob, em_optim_steps(oa)));
    CHECK(em_optim_steps(ob) == 3 && em_optim_scalar(ob, pb[0].tensor, "step") == 3);
    for (em_optimizer *o = oa; o; o = o == oa ? ob : NULL) {
        em_module *m = o == oa ? a : b;
        em_zero_grad(o);
        CHECK_OK(em_backward(em_sum(em_mul(em_forward(m, x), em_forward(m, x)), EM_ALL_DIMS, false)));
        CHECK_OK(em_step(o));
    }
    for (int i = 0; i < 2; i++)
        CHECK(em_item(em_max(em_abs(em_sub(pa[i].tensor, pb[i].tensor)), EM_ALL_DIMS, false)) == 0);
    /* refusals name what is wrong */
    CHECK(em_optim_set_state(ob, pb[0].tensor, "momentum_buffer", x) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "keeps no state \"momentum_buffer\"") != NULL);
    CHECK(em_optim_set_state(ob, pb[0].tensor, "exp_avg", x) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "needs 18 elements (the parameter's), got 30") != NULL);
    CHECK(em_optim_set_scalar(ob, pb[0].tensor, "step", -1) == EM_ERR_ARGUMENT);
    CHECK(em_optim_set_scalar(ob, pb[0].tensor, "mu_product", 1) == EM_ERR_ARGUMENT);
    CHECK(em_optim_set_scalar(ob, x, "step", 1) == EM_ERR_ARGUMENT);
    CHECK(em_optim_set_steps(ob, -2) == EM_ERR_ARGUMENT);
    CHECK(em_optim_ops(NULL) == NULL);
    em_clear_error();
    em_scope_end(s);
    em_optim_free(oa);
    em_optim_free(ob);
    em_module_free(a);
    em_module_free(b);
}

int main(void) {
    RUN(test_custom_matches_builtin);
    RUN(test_custom_checkpoint);
    RUN(test_custom_schedule);
    RUN(test_custom_moves_with_module);
    RUN(test_optimizer_new_bad_args);
    RUN(test_builtin_bad_options);
    RUN(test_builtin_states_resume);
    RUN(test_scaler_skips_and_unscales);
    RUN(test_restore_by_hand);
    return test_summary();
}
