/* The scheduler interface around the rates (which tests/test_optim_parity.c checks against
 * PyTorch): every bad schedule and bad call refused with a clear error and nothing changed,
 * one scheduler per optimizer, either freed first, the resume paths a program takes
 * (checkpoint with or without a scheduler attached, a scheduler made after the load at its
 * position), and em_optim_set_lr between scheduler steps. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdlib.h>
#include <unistd.h>
#include "test.h"

static em_tensor *identity_forward(em_module *m, em_tensor *x) { (void)m; return x; }
static const em_module_ops holder_ops = {.name = "Holder", .forward = identity_forward};

static em_module *one_param_model(void) {
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    CHECK_OK(em_module_add_parameter(m, "w", em_ones(EM_SHAPE(3), EM_OPTS())));
    em_scope_end(s);
    return m;
}

/* Each schedule a constructor can be given wrong, and the words of its refusal. */
static void test_bad_schedules(void) {
    em_module *m = one_param_model();
    em_optimizer *opt = em_sgd(m, 0.1);
    int64_t ms[EM_LR_MAX_MILESTONES + 1] = {0};
    em_lr_schedule oc_pct = em_lr_one_cycle(1.0, 10), oc_div = em_lr_one_cycle(1.0, 10), pl_factor = em_lr_plateau(),
                   pl_patience = em_lr_plateau();
    oc_pct.pct_start = 1.5;
    oc_div.div_factor = 0;
    pl_factor.factor = 1.0;
    pl_patience.patience = -1;
    struct {
        em_lr_schedule s;
        const char *why;
    } bad[] = {
        {em_lr_step(0, 0.1), "StepLR needs step_size > 0, got 0"},
        {em_lr_step(3, NAN), "StepLR needs a finite gamma"},
        {em_lr_multistep(ms, EM_LR_MAX_MILESTONES + 1, 0.1), "MultiStepLR takes 0 to 32 milestones"},
        {em_lr_multistep(NULL, 3, 0.1), "a non-NULL array"},
        {em_lr_exponential(INFINITY), "ExponentialLR needs a finite gamma"},
        {em_lr_cosine_annealing(0, 0), "CosineAnnealingLR needs T_max > 0, got 0"},
        {em_lr_cosine_warm_restarts(0, 1, 0), "Expected positive integer T_0, but got 0"},
        {em_lr_cosine_warm_restarts(5, 0, 0), "Expected integer T_mult >= 1, but got 0"},
        {em_lr_linear(0, 1, 5), "Starting multiplicative factor expected to be greater than 0"},
        {em_lr_linear(0.5, 2, 5), "Ending multiplicative factor expected to be between 0 and 1 (got 2)"},
        {em_lr_linear(0.5, 1, 0), "LinearLR needs total_iters > 0"},
        {em_lr_one_cycle(1.0, 0), "Expected positive integer total_steps, but got 0"},
        {oc_pct, "Expected float between 0 and 1 pct_start, but got 1.5"},
        {oc_div, "div_factor > 0"},
        {pl_factor, "Factor should be < 1.0. (got 1)"},
        {pl_patience, "patience >= 0 and cooldown >= 0"},
        {(em_lr_schedule){.kind = (em_lr_kind)42}, "unknown schedule kind 42"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(em_lr_scheduler_new(opt, bad[i].s, -1) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, bad[i].why);
        CHECK(em_lr_scheduler_standalone(bad[i].s, 0.1, -1) == NULL);
        CHECK_ERROR(EM_ERR_ARGUMENT, bad[i].why);
        if (bad[i].s.kind != EM_LR_PLATEAU) CHECK(isnan(em_lr_at(bad[i].s, 0.1, 3)));
        CHECK(em_optim_lr(opt) == 0.1);   /* a refused scheduler changed nothing */
    }
    CHECK(isnan(em_lr_at(em_lr_plateau(), 0.1, 3)));   /* no closed form */
    /* the positions */
    CHECK(em_lr_scheduler_new(opt, em_lr_step(2, 0.5), -2) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "last_epoch must be -1 (a new schedule) or the last position done (0 to 2^53), got -2");
    CHECK(em_lr_scheduler_new(opt, em_lr_step(2, 0.5), INT64_MAX) == NULL);   /* no room to count on */
    CHECK_ERROR(EM_ERR_ARGUMENT, "(0 to 2^53), got 9223372036854775807");
    CHECK(em_optim_set_steps(opt, INT64_MAX) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected 0 <= steps <= 2^53, got 9223372036854775807");
    CHECK_OK(em_optim_set_steps(opt, INT64_C(1) << 53));
    CHECK_OK(em_optim_set_steps(opt, 0));
    CHECK(em_lr_scheduler_new(opt, em_lr_plateau(), 4) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "ReduceLROnPlateau has no position to start from");
    CHECK(em_lr_scheduler_standalone(em_lr_one_cycle(1.0, 10), 0.1, 10) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Tried to step 11 times. The specified number of total steps is 10");
    /* the other arguments */
    CHECK(em_lr_scheduler_new(NULL, em_lr_step(2, 0.5), -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_lr_scheduler_new: optimizer is NULL");
    CHECK(em_lr_scheduler_standalone(em_lr_step(2, 0.5), -1, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate: -1");
    CHECK(em_lr_scheduler_standalone(em_lr_step(2, 0.5), NAN, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a finite base_lr >= 0");
    CHECK(em_lr_scheduler_step(NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_lr_scheduler_step: scheduler is NULL");
    CHECK(em_lr_scheduler_step_metric(NULL, 1.0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_lr_scheduler_step_metric: scheduler is NULL");
    CHECK(isnan(em_lr_scheduler_get_last_lr(NULL)));
    CHECK(isnan(em_lr_scheduler_get_last_momentum(NULL)));
    CHECK(em_lr_scheduler_last_epoch(NULL) == -1);
    em_lr_scheduler_free(NULL);
    em_optim_free(opt);
    em_module_free(m);
}

/* Stepping a scheduler the wrong way, and the one-per-optimizer rule. */
static void test_bad_steps(void) {
    em_module *m = one_param_model();
    em_optimizer *opt = em_sgd(m, 0.1);
    em_lr_scheduler *plateau = em_lr_scheduler_new(opt, em_lr_plateau(), -1);
    CHECK(plateau != NULL);
    CHECK(em_lr_scheduler_step(plateau) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "ReduceLROnPlateau steps with a metric: em_lr_scheduler_step_metric");
    CHECK(em_lr_scheduler_new(opt, em_lr_step(2, 0.5), -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the optimizer has a scheduler already");
    em_lr_scheduler_free(plateau);
    em_lr_scheduler *step = em_lr_scheduler_new(opt, em_lr_step(2, 0.5), -1);   /* free again */
    CHECK(step != NULL);
    CHECK(em_lr_scheduler_step_metric(step, 1.0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "only ReduceLROnPlateau steps with a metric (this is StepLR");
    CHECK(em_lr_scheduler_last_epoch(step) == 0);
    /* em_optim_set_lr lasts until the scheduler's next step */
    CHECK_OK(em_optim_set_lr(opt, 7.0));
    CHECK(em_optim_lr(opt) == 7.0);
    CHECK_OK(em_lr_scheduler_step(step));
    CHECK_OK(em_lr_scheduler_step(step));
    CHECK_NEAR(em_optim_lr(opt), 0.05, 1e-16);
    /* the optimizer freed first: the scheduler says so, and can still be freed */
    em_optim_free(opt);
    CHECK(em_lr_scheduler_step(step) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the scheduler's optimizer was freed");
    em_lr_scheduler_free(step);
    /* OneCycleLR past its total_steps, as PyTorch */
    em_lr_scheduler *s = em_lr_scheduler_standalone(em_lr_one_cycle(1.0, 10), 0, -1);
    for (int t = 0; t < 10; t++) CHECK_OK(em_lr_scheduler_step(s));
    CHECK(em_lr_scheduler_step(s) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Tried to step 11 times. The specified number of total steps is 10");
    CHECK(em_lr_scheduler_last_epoch(s) == 10);
    /* too few steps for its phases: refused where PyTorch would divide by zero */
    CHECK(em_lr_scheduler_standalone(em_lr_one_cycle(1.0, 3), 0, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "leaves phase 1 without steps");
    em_lr_scheduler_free(s);
    em_module_free(m);
}

/* A state dict is checked before anything changes. */
static void test_bad_state_dicts(void) {
    em_lr_scheduler *s = em_lr_scheduler_standalone(em_lr_exponential(0.5), 1.0, 2);
    CHECK(s != NULL);
    em_lr_scheduler_state st, good;
    CHECK_OK(em_lr_scheduler_state_dict(s, &good));
    CHECK(good.kind == EM_LR_EXPONENTIAL && good.last_epoch == 3 && good.base_lr == 1.0);
    CHECK_NEAR(good.last_lr, 0.125, 1e-16);
    CHECK(em_lr_scheduler_state_dict(s, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_lr_scheduler_state_dict: out is NULL");
    CHECK(em_lr_scheduler_state_dict(NULL, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_lr_scheduler_state_dict: scheduler is NULL");
    CHECK(em_lr_scheduler_load_state_dict(s, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the state is NULL");
    CHECK(em_lr_scheduler_load_state_dict(NULL, &good) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "scheduler is NULL");
    st = good, st.kind = EM_LR_STEP;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds the state of a StepLR scheduler, but the scheduler is ExponentialLR");
    st = good, st.kind = (em_lr_kind)77;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds the state of a ? scheduler");
    st = good, st.last_epoch = -3;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "position -3 is outside the schedule");
    st = good, st.base_lr = NAN;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rates must be finite and >= 0");
    st = good, st.last_lr = -1;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rates must be finite and >= 0");
    st = good, st.num_bad_epochs = -1;
    CHECK(em_lr_scheduler_load_state_dict(s, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "counters must be >= 0");
    /* nothing changed by the refusals */
    CHECK_OK(em_lr_scheduler_state_dict(s, &st));
    CHECK(!memcmp(&st, &good, sizeof st));
    /* OneCycleLR's position is bounded by its steps */
    em_lr_scheduler *oc = em_lr_scheduler_standalone(em_lr_one_cycle(1.0, 10), 0, -1);
    CHECK_OK(em_lr_scheduler_state_dict(oc, &st));
    st.last_epoch = 11;
    CHECK(em_lr_scheduler_load_state_dict(oc, &st) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "position 11 is outside the schedule (expected 0 to 10)");
    em_lr_scheduler_free(oc);
    em_lr_scheduler_free(s);
}

static char g_path[64];

/* The resume code programs write, each giving the uninterrupted rates. */
static void test_resume_paths(void) {
    snprintf(g_path, sizeof g_path, "/tmp/ember_test_lrs_XXXXXX");
    int fd = mkstemp(g_path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    em_lr_schedule cos = em_lr_cosine_annealing(20, 0.001);
    double want[31];
    for (int t = 0; t <= 30; t++) want[t] = em_lr_at(cos, 0.1, t);

    em_module *m = one_param_model();
    em_optimizer *opt = em_sgd(m, 0.1);
    em_lr_scheduler *s = em_lr_scheduler_new(opt, cos, -1);
    for (int t = 1; t <= 12; t++) CHECK_OK(em_lr_scheduler_step(s));
    const char *keys[] = {"epoch"}, *values[] = {"12"};
    CHECK_OK(em_checkpoint_save(g_path, m, opt, keys, values, 1));
    em_lr_scheduler_free(s);
    em_optim_free(opt);
    em_module_free(m);

    /* 1: the scheduler made first (last_epoch -1), then the load restores its position */
    m = one_param_model(), opt = em_sgd(m, 0.1), s = em_lr_scheduler_new(opt, cos, -1);
    CHECK_OK(em_checkpoint_load(g_path, m, opt, NULL));
    CHECK(em_lr_scheduler_last_epoch(s) == 12);
    CHECK_NEAR(em_optim_lr(opt), want[12], 1e-15);
    for (int t = 13; t <= 30; t++) {
        CHECK_OK(em_lr_scheduler_step(s));
        CHECK_NEAR(em_optim_lr(opt), want[t], 1e-15);
    }
    em_lr_scheduler_free(s), em_optim_free(opt), em_module_free(m);

    /* 2: loaded with no scheduler attached, one made after at the saved position: the base
     * is the checkpoint's initial_lr, not the rate the optimizer was left at */
    m = one_param_model(), opt = em_sgd(m, 0.1);
    em_safetensors *meta = NULL;
    CHECK_OK(em_checkpoint_load(g_path, m, opt, &meta));
    CHECK_NEAR(em_optim_lr(opt), want[12], 1e-15);
    const char *epoch = meta ? em_safetensors_metadata(meta, "epoch") : NULL;
    CHECK(epoch && !strcmp(epoch, "12"));
    em_safetensors_free(meta);
    s = em_lr_scheduler_new(opt, cos, 11);
    CHECK(s && em_lr_scheduler_last_epoch(s) == 12);
    CHECK_NEAR(em_optim_lr(opt), want[12], 1e-15);
    CHECK_OK(em_lr_scheduler_step(s));
    CHECK_NEAR(em_optim_lr(opt), want[13], 1e-15);
    em_lr_scheduler_free(s), em_optim_free(opt), em_module_free(m);

    /* 3: a scheduler of another kind attached: refused, nothing changed */
    m = one_param_model(), opt = em_sgd(m, 0.3), s = em_lr_scheduler_new(opt, em_lr_step(5, 0.5), -1);
    CHECK(em_checkpoint_load(g_path, m, opt, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds the state of a CosineAnnealingLR scheduler, but the scheduler is StepLR");
    CHECK(em_optim_lr(opt) == 0.3 && em_lr_scheduler_last_epoch(s) == 0);
    em_lr_scheduler_free(s), em_optim_free(opt), em_module_free(m);

    /* 4: saved without a scheduler, loaded into an optimizer that has one: refused */
    m = one_param_model(), opt = em_sgd(m, 0.1);
    CHECK_OK(em_checkpoint_save(g_path, m, opt, NULL, NULL, 0));
    s = em_lr_scheduler_new(opt, cos, -1);
    CHECK(em_checkpoint_load(g_path, m, opt, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds no scheduler state");
    em_lr_scheduler_free(s), em_optim_free(opt), em_module_free(m);
    remove(g_path);
}

/* The deprecated interface's scheduler belongs to the optimizer; a new scheduler replaces it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void test_owned_schedule_replaced(void) {
    em_module *m = one_param_model();
    em_optimizer *opt = em_sgd(m, 1.0);
    CHECK_OK(em_optim_set_schedule(opt, em_lr_step(1, 0.5)));
    CHECK_OK(em_optim_schedule_step(opt));
    CHECK_NEAR(em_optim_lr(opt), 0.5, 1e-16);
    em_lr_scheduler *s = em_lr_scheduler_new(opt, em_lr_exponential(0.1), -1);
    CHECK(s != NULL);
    /* the owned scheduler sets no initial_lr: the new one's base is the rate now */
    CHECK_NEAR(em_optim_lr(opt), 0.5, 1e-16);
    CHECK_OK(em_optim_schedule_step(opt));        /* steps the attached one */
    CHECK(em_lr_scheduler_last_epoch(s) == 1);
    CHECK_NEAR(em_optim_lr(opt), 0.05, 1e-16);
    CHECK(em_optim_set_schedule(opt, em_lr_step(1, 0.5)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "has a scheduler already");
    em_optim_free(opt);   /* before the scheduler */
    em_lr_scheduler_free(s);
    em_module_free(m);
}
#pragma GCC diagnostic pop

int main(void) {
    RUN(test_bad_schedules);
    RUN(test_bad_steps);
    RUN(test_bad_state_dicts);
    RUN(test_resume_paths);
    RUN(test_owned_schedule_replaced);
    return test_summary();
}
