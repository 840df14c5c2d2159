/* Every optimizer and learning-rate schedule against PyTorch, from
 * scripts/golden_optim.py's file (tests/data/golden_optim.safetensors; the script describes
 * it). Optimizers: each case's parameters and every state PyTorch keeps (and only those)
 * after each of 10 steps, in float64 on both of Ember's paths (fused kernel and op-by-op),
 * in float32 on the CPU, and on opencl:0 and cuda:0 when they are there. The options come
 * from the file's metadata with PyTorch's names, applied over Ember's defaults, so Ember's
 * defaults are PyTorch's too. Schedules: the rates (and OneCycleLR's momentum) of 50 steps attached
 * to an optimizer and on their own, and again resumed at step 17 three ways: through a
 * checkpoint, made at the position (last_epoch), and through the state dict. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdlib.h>
#include <unistd.h>
#include "optim/optim_internal.h"
#include "test.h"

#define STEPS 10
#define SCHED_STEPS 50
#define RESUME_AT 17

static em_safetensors *g_file;

static const char *data_path(void) {
    static char path[512];
    const char *d = getenv("EMBER_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden_optim.safetensors", d ? d : "tests/data");
    return path;
}

/* The value of key in a "kind=x key=value ..." string, or NULL (a static buffer). */
static const char *opt_value(const char *meta, const char *key) {
    static char buf[64];
    size_t n = strlen(key);
    for (const char *s = meta; s && *s;) {
        while (*s == ' ') s++;
        if (!strncmp(s, key, n) && s[n] == '=') {
            size_t len = strcspn(s + n + 1, " ");
            if (len >= sizeof buf) len = sizeof buf - 1;
            memcpy(buf, s + n + 1, len);
            buf[len] = '\0';
            return buf;
        }
        s = strchr(s, ' ');
    }
    return NULL;
}

/* key's number into *out when the string has it (every option a case sets is used). */
static void num(const char *meta, const char *key, double *out) {
    const char *v = opt_value(meta, key);
    if (v) *out = strtod(v, NULL);
}
static void flag(const char *meta, const char *key, bool *out) {
    const char *v = opt_value(meta, key);
    if (v) *out = atoi(v) != 0;
}

static em_tensor *identity_forward(em_module *m, em_tensor *x) { (void)m; return x; }
static const em_module_ops holder_ops = {.name = "Holder", .forward = identity_forward};

static em_tensor *golden(const char *name) {
    em_tensor *t = em_safetensors_get(g_file, name);
    if (!t) fprintf(stderr, "  missing record %s: %s\n", name, em_last_error());
    return t;
}

static bool has(const char *name) {
    for (int i = 0; i < em_safetensors_count(g_file); i++)
        if (!strcmp(em_safetensors_name(g_file, i), name)) return true;
    return false;
}

/* ---- optimizers ---- */

/* The case's optimizer over m, from its metadata over Ember's defaults, with PyTorch's
 * default learning rates where the case gives none. */
static em_optimizer *make_optimizer(const char *meta, em_module *m) {
    const char *k = opt_value(meta, "kind");
    char kind[32];
    snprintf(kind, sizeof kind, "%s", k ? k : "?");
    if (!strcmp(kind, "sgd")) {
        em_sgd_opts o = em_sgd_defaults(0);
        num(meta, "lr", &o.lr), num(meta, "momentum", &o.momentum), num(meta, "dampening", &o.dampening);
        num(meta, "weight_decay", &o.weight_decay), flag(meta, "nesterov", &o.nesterov);
        flag(meta, "maximize", &o.maximize);
        return em_sgd_ex(m, o);
    }
    if (!strcmp(kind, "adam") || !strcmp(kind, "adamw")) {
        bool w = kind[4] == 'w';
        em_adam_opts o = w ? em_adamw_defaults(1e-3) : em_adam_defaults(1e-3);
        num(meta, "lr", &o.lr), num(meta, "beta1", &o.beta1), num(meta, "beta2", &o.beta2);
        num(meta, "eps", &o.eps), num(meta, "weight_decay", &o.weight_decay);
        flag(meta, "amsgrad", &o.amsgrad), flag(meta, "maximize", &o.maximize);
        return w ? em_adamw_ex(m, o) : em_adam_ex(m, o);
    }
    if (!strcmp(kind, "adadelta")) {
        em_adadelta_opts o = em_adadelta_defaults(1.0);
        num(meta, "lr", &o.lr), num(meta, "rho", &o.rho), num(meta, "eps", &o.eps);
        num(meta, "weight_decay", &o.weight_decay), flag(meta, "maximize", &o.maximize);
        return em_adadelta_ex(m, o);
    }
    if (!strcmp(kind, "adagrad")) {
        em_adagrad_opts o = em_adagrad_defaults(1e-2);
        num(meta, "lr", &o.lr), num(meta, "lr_decay", &o.lr_decay), num(meta, "weight_decay", &o.weight_decay);
        num(meta, "initial_accumulator_value", &o.initial_accumulator_value), num(meta, "eps", &o.eps);
        flag(meta, "maximize", &o.maximize);
        return em_adagrad_ex(m, o);
    }
    if (!strcmp(kind, "rmsprop")) {
        em_rmsprop_opts o = em_rmsprop_defaults(1e-2);
        num(meta, "lr", &o.lr), num(meta, "alpha", &o.alpha), num(meta, "eps", &o.eps);
        num(meta, "weight_decay", &o.weight_decay), num(meta, "momentum", &o.momentum);
        flag(meta, "centered", &o.centered), flag(meta, "maximize", &o.maximize);
        return em_rmsprop_ex(m, o);
    }
    if (!strcmp(kind, "adamax")) {
        em_adamax_opts o = em_adamax_defaults(2e-3);
        num(meta, "lr", &o.lr), num(meta, "beta1", &o.beta1), num(meta, "beta2", &o.beta2);
        num(meta, "eps", &o.eps), num(meta, "weight_decay", &o.weight_decay), flag(meta, "maximize", &o.maximize);
        return em_adamax_ex(m, o);
    }
    if (!strcmp(kind, "nadam")) {
        em_nadam_opts o = em_nadam_defaults(2e-3);
        num(meta, "lr", &o.lr), num(meta, "beta1", &o.beta1), num(meta, "beta2", &o.beta2);
        num(meta, "eps", &o.eps), num(meta, "weight_decay", &o.weight_decay);
        num(meta, "momentum_decay", &o.momentum_decay);
        flag(meta, "decoupled_weight_decay", &o.decoupled_weight_decay), flag(meta, "maximize", &o.maximize);
        return em_nadam_ex(m, o);
    }
    if (!strcmp(kind, "radam")) {
        em_radam_opts o = em_radam_defaults(1e-3);
        num(meta, "lr", &o.lr), num(meta, "beta1", &o.beta1), num(meta, "beta2", &o.beta2);
        num(meta, "eps", &o.eps), num(meta, "weight_decay", &o.weight_decay);
        flag(meta, "decoupled_weight_decay", &o.decoupled_weight_decay), flag(meta, "maximize", &o.maximize);
        return em_radam_ex(m, o);
    }
    fprintf(stderr, "  unknown optimizer kind '%s'\n", kind);
    return NULL;
}

/* Every state name any optimizer keeps, and the scalar ones. */
static const char *const g_state_names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg",
                                            "acc_delta", "sum", "grad_avg", "exp_inf"};
#define NSTATE_NAMES (int)(sizeof g_state_names / sizeof *g_state_names)

/* Largest |a - b| / max(|b|, floor), over tensors of b's shape (a on any device). */
static double rel_diff(em_tensor *a, em_tensor *b, double floor) {
    int64_t n = em_numel(b);
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y), worst = 0;
    em_scope s = em_scope_begin();
    em_status st = em_copy_to_host(em_to_dtype(em_to(a, EM_DEVICE_CPU), EM_F64), x, (size_t)n * sizeof *x);
    if (st == EM_OK) st = em_copy_to_host(em_to_dtype(b, EM_F64), y, (size_t)n * sizeof *y);
    em_scope_end(s);
    for (int64_t i = 0; st == EM_OK && i < n; i++) {
        double d = fabs(x[i] - y[i]) / fmax(fabs(y[i]), floor);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    free(x);
    free(y);
    return st == EM_OK ? worst : INFINITY;
}

typedef struct run_cfg {
    em_device dev;
    em_dtype dt;
    bool fused;
    double tol;      /* relative to max(|PyTorch's value|, floor) */
} run_cfg;

/* One case on one configuration: its worst relative difference, and checks. */
static double replay_optimizer(const char *cname, const run_cfg *cfg) {
    char key[256], meta_key[128];
    snprintf(meta_key, sizeof meta_key, "opt/%s", cname);
    const char *meta = em_safetensors_metadata(g_file, meta_key);
    CHECK(meta != NULL);
    if (!meta) return INFINITY;
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    for (int k = 0; k < 2; k++) {
        snprintf(key, sizeof key, "opt/%s/p%d/init", cname, k);
        em_tensor *init = golden(key);
        char pname[4] = {'p', (char)('0' + k), 0};
        CHECK_OK(em_module_add_parameter(m, pname, em_to_dtype(em_clone(init), cfg->dt)));
    }
    em_scope_end(s);
    CHECK_OK(em_module_to(m, cfg->dev));
    em_named_tensor ps[2];
    CHECK(em_module_parameters(m, ps, 2) == 2);
    em_optimizer *opt = make_optimizer(meta, m);
    CHECK(opt != NULL);
    if (!opt) {
        fprintf(stderr, "  %s: %s\n", cname, em_last_error());
        em_clear_error();
        em_module_free(m);
        return INFINITY;
    }
    em__optim_set_fused(opt, cfg->fused);
    double floor = cfg->dt == EM_F64 ? 1e-12 : 1e-6, worst = 0;
    for (int t = 1; t <= STEPS; t++) {
        em_scope st = em_scope_begin();
        for (int k = 0; k < 2; k++) {
            snprintf(key, sizeof key, "opt/%s/p%d/grad%d", cname, k, t);
            CHECK_OK(em_set_grad(ps[k].tensor, em_to(em_to_dtype(golden(key), cfg->dt), cfg->dev)));
        }
        CHECK_OK(em_step(opt));
        for (int k = 0; k < 2; k++) {
            em_tensor *p = ps[k].tensor;
            snprintf(key, sizeof key, "opt/%s/p%d/after%d", cname, k, t);
            worst = fmax(worst, rel_diff(p, golden(key), floor));
            for (int j = 0; j < NSTATE_NAMES; j++) {   /* the states PyTorch keeps, and only those */
                snprintf(key, sizeof key, "opt/%s/p%d/after%d/%s", cname, k, t, g_state_names[j]);
                em_tensor *mine = em_optim_state(opt, p, g_state_names[j]);
                em_clear_error();   /* a name this kind does not keep */
                bool theirs = has(key);
                if (!!mine != theirs)
                    fprintf(stderr, "  %s step %d: state %s is %s in Ember, %s in PyTorch\n", cname, t,
                            g_state_names[j], mine ? "kept" : "absent", theirs ? "kept" : "absent");
                CHECK(!!mine == theirs);
                if (mine && theirs) worst = fmax(worst, rel_diff(mine, golden(key), floor));
            }
            const char *scalars[] = {"step", "mu_product"};
            for (int j = 0; j < 2; j++) {
                snprintf(key, sizeof key, "opt/%s/p%d/after%d/%s", cname, k, t, scalars[j]);
                if (!has(key)) continue;
                double want;
                CHECK_OK(em_copy_to_host(golden(key), &want, sizeof want));
                double got = em_optim_scalar(opt, p, scalars[j]);
                worst = fmax(worst, fabs(got - want) / fmax(fabs(want), floor));
            }
        }
        em_scope_end(st);
    }
    if (!(worst <= cfg->tol))
        fprintf(stderr, "  %s (%s %s %s): worst relative difference %.3g > %.3g\n", cname, em_device_str(cfg->dev).s,
                em_dtype_name(cfg->dt), cfg->fused ? "fused" : "op-by-op", worst, cfg->tol);
    CHECK(worst <= cfg->tol);
    /* the path asked for is the path taken */
    int64_t fused = em__optim_fused_updates(opt);
    CHECK(cfg->fused ? fused == 2 * STEPS : fused == 0);
    em_optim_free(opt);
    em_module_free(m);
    return worst;
}

static void replay_all_optimizers(const run_cfg *cfg) {
    double worst = 0;
    int cases = 0;
    for (int i = 0; i < em_safetensors_count(g_file); i++) {
        const char *name = em_safetensors_name(g_file, i);
        size_t n = strlen(name);
        if (strncmp(name, "opt/", 4) || n < 12 || strcmp(name + n - 8, "/p0/init")) continue;
        char cname[96];
        snprintf(cname, sizeof cname, "%.*s", (int)(n - 12), name + 4);
        worst = fmax(worst, replay_optimizer(cname, cfg));
        cases++;
    }
    CHECK(cases >= 30);
    printf("     %-9s %-7s %-9s %d cases, worst relative difference from PyTorch %.2g\n", em_device_str(cfg->dev).s,
           em_dtype_name(cfg->dt), cfg->fused ? "fused" : "op-by-op", cases, worst);
}

static void test_optimizers_f64_fused(void) {
    replay_all_optimizers(&(run_cfg){EM_DEVICE_CPU, EM_F64, true, 1e-10});
}
static void test_optimizers_f64_op_by_op(void) {
    replay_all_optimizers(&(run_cfg){EM_DEVICE_CPU, EM_F64, false, 1e-10});
}
/* float32 against PyTorch's float64: ten steps of rounding, amplified where a state is tiny */
static void test_optimizers_f32(void) {
    replay_all_optimizers(&(run_cfg){EM_DEVICE_CPU, EM_F32, true, 2e-3});
    replay_all_optimizers(&(run_cfg){EM_DEVICE_CPU, EM_F32, false, 2e-3});
}

/* The fused kernels of an accelerator, in float32 and (where it has them) float64. */
static void replay_on(em_device_type type) {
    if (!em_device_available(type)) {
        test_skip("no %s device: %s", em_device_type_name(type), em_device_unavailable_reason(type));
        return;
    }
    em_device dev = EM_DEVICE(type, 0);
    replay_all_optimizers(&(run_cfg){dev, EM_F32, true, 2e-3});
    em_scope s = em_scope_begin();
    bool f64 = em_add(em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = dev)),
                      em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = dev))) != NULL;
    em_clear_error();
    em_scope_end(s);
    if (f64) replay_all_optimizers(&(run_cfg){dev, EM_F64, true, 1e-10});
    else printf("     %s has no double precision: float32 only\n", em_device_str(dev).s);
}

static void test_optimizers_opencl(void) { replay_on(EM_OPENCL); }
static void test_optimizers_cuda(void) { replay_on(EM_CUDA); }

/* ---- schedules ---- */

typedef struct sched_case {
    char name[64];
    em_lr_schedule s;
    double base_lr;
    bool adam;                      /* the optimizer: Adam, else SGD with momentum 0.9 */
    double lr[SCHED_STEPS + 1];
    double momentum[SCHED_STEPS + 1];
    bool has_momentum;
    double metrics[SCHED_STEPS];
    bool plateau;
} sched_case;

static bool load_sched_case(const char *cname, sched_case *c) {
    char key[128];
    snprintf(c->name, sizeof c->name, "%s", cname);
    snprintf(key, sizeof key, "sched/%s", cname);
    const char *meta = em_safetensors_metadata(g_file, key);
    if (!meta) return false;
    const char *k = opt_value(meta, "kind");
    char kind[32];
    snprintf(kind, sizeof kind, "%s", k ? k : "?");
    double v = 0;
    em_lr_schedule *s = &c->s;
    if (!strcmp(kind, "step")) {
        num(meta, "step_size", &v);
        *s = em_lr_step((int64_t)v, 0.1);
        num(meta, "gamma", &s->gamma);
    } else if (!strcmp(kind, "multistep")) {
        int64_t ms[EM_LR_MAX_MILESTONES];
        int n = 0;
        for (; n < EM_LR_MAX_MILESTONES; n++) {
            char mk[8];
            snprintf(mk, sizeof mk, "m%d", n);
            const char *mv = opt_value(meta, mk);
            if (!mv) break;
            ms[n] = atoll(mv);
        }
        *s = em_lr_multistep(ms, n, 0.1);
        num(meta, "gamma", &s->gamma);
    } else if (!strcmp(kind, "exponential")) {
        *s = em_lr_exponential(0);
        num(meta, "gamma", &s->gamma);
    } else if (!strcmp(kind, "cosine_annealing")) {
        num(meta, "T_max", &v);
        *s = em_lr_cosine_annealing((int64_t)v, 0);
        num(meta, "eta_min", &s->eta_min);
    } else if (!strcmp(kind, "cosine_warm_restarts")) {
        double t0 = 0, tm = 1;
        num(meta, "T_0", &t0), num(meta, "T_mult", &tm);
        *s = em_lr_cosine_warm_restarts((int64_t)t0, (int64_t)tm, 0);
        num(meta, "eta_min", &s->eta_min);
    } else if (!strcmp(kind, "linear")) {
        double total = 5;
        *s = em_lr_linear(1.0 / 3, 1.0, 5);
        num(meta, "start_factor", &s->start_factor), num(meta, "end_factor", &s->end_factor);
        num(meta, "total_iters", &total);
        s->total_iters = (int64_t)total;
    } else if (!strcmp(kind, "one_cycle")) {
        double max_lr = 0, total = 0;
        num(meta, "max_lr", &max_lr), num(meta, "total_steps", &total);
        *s = em_lr_one_cycle(max_lr, (int64_t)total);
        num(meta, "pct_start", &s->pct_start), num(meta, "div_factor", &s->div_factor);
        num(meta, "final_div_factor", &s->final_div_factor), num(meta, "base_momentum", &s->base_momentum);
        num(meta, "max_momentum", &s->max_momentum), flag(meta, "anneal_linear", &s->anneal_linear);
        flag(meta, "three_phase", &s->three_phase);
    } else if (!strcmp(kind, "plateau")) {
        double patience = 10, cooldown = 0;
        *s = em_lr_plateau();
        num(meta, "factor", &s->factor), num(meta, "threshold", &s->threshold), num(meta, "min_lr", &s->min_lr);
        num(meta, "eps", &s->eps), num(meta, "patience", &patience), num(meta, "cooldown", &cooldown);
        flag(meta, "mode_max", &s->mode_max), flag(meta, "threshold_abs", &s->threshold_abs);
        s->patience = (int64_t)patience, s->cooldown = (int64_t)cooldown;
        c->plateau = true;
    } else {
        fprintf(stderr, "  unknown schedule kind '%s'\n", kind);
        return false;
    }
    num(meta, "base_lr", &c->base_lr);
    const char *o = opt_value(meta, "optimizer");
    c->adam = o && !strcmp(o, "adam");
    snprintf(key, sizeof key, "sched/%s/lr", cname);
    bool ok = em_copy_to_host(golden(key), c->lr, sizeof c->lr) == EM_OK;
    snprintf(key, sizeof key, "sched/%s/momentum", cname);
    if ((c->has_momentum = has(key))) ok = ok && em_copy_to_host(golden(key), c->momentum, sizeof c->momentum) == EM_OK;
    snprintf(key, sizeof key, "sched/%s/metrics", cname);
    if (c->plateau) ok = ok && em_copy_to_host(golden(key), c->metrics, sizeof c->metrics) == EM_OK;
    return ok;
}

static int g_nsched;
static sched_case g_sched[24];

static void load_sched_cases(void) {
    em_scope s = em_scope_begin();   /* the file's tensors read here */
    for (int i = 0; i < em_safetensors_count(g_file) && g_nsched < 24; i++) {
        const char *name = em_safetensors_name(g_file, i);
        size_t n = strlen(name);
        if (strncmp(name, "sched/", 6) || n < 10 || strcmp(name + n - 3, "/lr")) continue;
        char cname[64];
        snprintf(cname, sizeof cname, "%.*s", (int)(n - 9), name + 6);
        if (load_sched_case(cname, &g_sched[g_nsched])) g_nsched++;
        else fprintf(stderr, "  cannot load schedule case %s\n", cname);
    }
    em_scope_end(s);
}

/* The rate PyTorch had at position t, within 1e-12 relative (its recursive forms round
 * differently from the closed forms). */
static bool rate_ok(const sched_case *c, int t, double got, const char *how) {
    double want = c->lr[t];
    bool ok = fabs(got - want) <= 1e-12 * fabs(want) + 1e-18;
    if (!ok) fprintf(stderr, "  %s (%s) step %d: lr %.17g, PyTorch %.17g\n", c->name, how, t, got, want);
    return ok;
}

static double momentum_of(em_optimizer *opt, bool adam) {
    void *h = em_optim_hyper(opt);
    return adam ? ((em_adam_opts *)h)->beta1 : ((em_sgd_opts *)h)->momentum;
}

static bool momentum_ok(const sched_case *c, int t, double got, const char *how) {
    if (!c->has_momentum) return true;
    bool ok = fabs(got - c->momentum[t]) <= 1e-12;
    if (!ok) fprintf(stderr, "  %s (%s) step %d: momentum %.17g, PyTorch %.17g\n", c->name, how, t, got, c->momentum[t]);
    return ok;
}

static em_module *one_param_model(void) {
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    CHECK_OK(em_module_add_parameter(m, "w", em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64))));
    em_scope_end(s);
    return m;
}

static em_optimizer *sched_optimizer(const sched_case *c, em_module *m) {
    if (c->adam) return em_adam(m, c->base_lr);
    em_sgd_opts o = em_sgd_defaults(c->base_lr);
    o.momentum = 0.9;
    return em_sgd_ex(m, o);
}

/* Steps an attached scheduler from its position to `to`, checking every rate. */
static int run_attached(const sched_case *c, em_optimizer *opt, em_lr_scheduler *s, int from, int to, const char *how) {
    int bad = 0;
    for (int t = from + 1; t <= to; t++) {
        CHECK_OK(em_step(opt));
        CHECK_OK(c->plateau ? em_lr_scheduler_step_metric(s, c->metrics[t - 1]) : em_lr_scheduler_step(s));
        bad += !rate_ok(c, t, em_lr_scheduler_get_last_lr(s), how);
        bad += !rate_ok(c, t, em_optim_lr(opt), how);
        bad += !momentum_ok(c, t, momentum_of(opt, c->adam), how);
        CHECK(em_lr_scheduler_last_epoch(s) == t);
    }
    return bad;
}

static void test_schedules_attached(void) {
    CHECK(g_nsched >= 12);
    for (int i = 0; i < g_nsched; i++) {
        const sched_case *c = &g_sched[i];
        em_module *m = one_param_model();
        em_optimizer *opt = sched_optimizer(c, m);
        em_lr_scheduler *s = em_lr_scheduler_new(opt, c->s, -1);
        CHECK(s != NULL);
        if (!s) {
            fprintf(stderr, "  %s: %s\n", c->name, em_last_error());
            em_clear_error();
        } else {
            int bad = !rate_ok(c, 0, em_optim_lr(opt), "attached") + !momentum_ok(c, 0, momentum_of(opt, c->adam), "attached");
            bad += run_attached(c, opt, s, 0, SCHED_STEPS, "attached");
            CHECK(bad == 0);
            /* the closed form, without a scheduler */
            for (int t = 0; t <= SCHED_STEPS && !c->plateau; t++)
                CHECK(rate_ok(c, t, em_lr_at(c->s, c->base_lr, t), "em_lr_at"));
        }
        em_lr_scheduler_free(s);
        em_optim_free(opt);
        em_module_free(m);
    }
    printf("     %d schedules, 50 steps each, attached to SGD or Adam\n", g_nsched);
}

static void test_schedules_standalone(void) {
    for (int i = 0; i < g_nsched; i++) {
        const sched_case *c = &g_sched[i];
        em_lr_scheduler *s = em_lr_scheduler_standalone(c->s, c->base_lr, -1);
        CHECK(s != NULL);
        if (!s) continue;
        int bad = !rate_ok(c, 0, em_lr_scheduler_get_last_lr(s), "standalone");
        bad += !momentum_ok(c, 0, em_lr_scheduler_get_last_momentum(s), "standalone");
        for (int t = 1; t <= SCHED_STEPS; t++) {
            CHECK_OK(c->plateau ? em_lr_scheduler_step_metric(s, c->metrics[t - 1]) : em_lr_scheduler_step(s));
            bad += !rate_ok(c, t, em_lr_scheduler_get_last_lr(s), "standalone");
            bad += !momentum_ok(c, t, em_lr_scheduler_get_last_momentum(s), "standalone");
        }
        CHECK(bad == 0);
        em_lr_scheduler_free(s);
    }
}

/* Saved with em_checkpoint_save at step 17, loaded into a fresh model, optimizer and
 * scheduler (made at -1, as a program's natural resume code makes them): the rest of the
 * run gives PyTorch's uninterrupted rates. */
static void test_schedules_resume_from_checkpoint(void) {
    char path[] = "/tmp/ember_test_sched_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    for (int i = 0; i < g_nsched; i++) {
        const sched_case *c = &g_sched[i];
        em_module *m = one_param_model();
        em_optimizer *opt = sched_optimizer(c, m);
        em_lr_scheduler *s = em_lr_scheduler_new(opt, c->s, -1);
        int bad = run_attached(c, opt, s, 0, RESUME_AT, "before saving");
        CHECK_OK(em_checkpoint_save(path, m, opt, NULL, NULL, 0));
        em_lr_scheduler_free(s);
        em_optim_free(opt);
        em_module_free(m);

        m = one_param_model();
        opt = sched_optimizer(c, m);
        s = em_lr_scheduler_new(opt, c->s, -1);
        CHECK_OK(em_checkpoint_load(path, m, opt, NULL));
        CHECK(em_lr_scheduler_last_epoch(s) == RESUME_AT);
        bad += !rate_ok(c, RESUME_AT, em_optim_lr(opt), "loaded");
        bad += !momentum_ok(c, RESUME_AT, momentum_of(opt, c->adam), "loaded");
        bad += run_attached(c, opt, s, RESUME_AT, SCHED_STEPS, "resumed from a checkpoint");
        CHECK(bad == 0);
        em_lr_scheduler_free(s);
        em_optim_free(opt);
        em_module_free(m);
    }
    remove(path);
}

/* Made at the position: last_epoch 16 is the position 17 (PyTorch's constructor steps once). */
static void test_schedules_resume_at_last_epoch(void) {
    int resumed = 0;
    for (int i = 0; i < g_nsched; i++) {
        const sched_case *c = &g_sched[i];
        if (c->plateau) continue;   /* no closed form: refused (test_lr_scheduler.c) */
        em_module *m = one_param_model();
        em_optimizer *opt = sched_optimizer(c, m);
        em_lr_scheduler *s = em_lr_scheduler_new(opt, c->s, RESUME_AT - 1);
        CHECK(s != NULL);
        if (s) {
            CHECK(em_lr_scheduler_last_epoch(s) == RESUME_AT);
            int bad = !rate_ok(c, RESUME_AT, em_optim_lr(opt), "made at last_epoch 16");
            bad += !momentum_ok(c, RESUME_AT, momentum_of(opt, c->adam), "made at last_epoch 16");
            bad += run_attached(c, opt, s, RESUME_AT, SCHED_STEPS, "made at last_epoch 16");
            CHECK(bad == 0);
            resumed++;
        }
        em_lr_scheduler_free(s);
        em_optim_free(opt);
        em_module_free(m);
    }
    CHECK(resumed >= 10);
}

/* A standalone scheduler through its state dict. */
static void test_schedules_resume_from_state_dict(void) {
    for (int i = 0; i < g_nsched; i++) {
        const sched_case *c = &g_sched[i];
        em_lr_scheduler *s = em_lr_scheduler_standalone(c->s, c->base_lr, -1);
        for (int t = 1; t <= RESUME_AT; t++)
            CHECK_OK(c->plateau ? em_lr_scheduler_step_metric(s, c->metrics[t - 1]) : em_lr_scheduler_step(s));
        em_lr_scheduler_state st;
        CHECK_OK(em_lr_scheduler_state_dict(s, &st));
        em_lr_scheduler_free(s);
        s = em_lr_scheduler_standalone(c->s, c->base_lr, -1);
        CHECK_OK(em_lr_scheduler_load_state_dict(s, &st));
        int bad = !rate_ok(c, RESUME_AT, em_lr_scheduler_get_last_lr(s), "state dict");
        for (int t = RESUME_AT + 1; t <= SCHED_STEPS; t++) {
            CHECK_OK(c->plateau ? em_lr_scheduler_step_metric(s, c->metrics[t - 1]) : em_lr_scheduler_step(s));
            bad += !rate_ok(c, t, em_lr_scheduler_get_last_lr(s), "state dict");
            bad += !momentum_ok(c, t, em_lr_scheduler_get_last_momentum(s), "state dict");
        }
        CHECK(bad == 0);
        em_lr_scheduler_free(s);
    }
}

int main(void) {
    em_set_num_threads(1);
    g_file = em_safetensors_load(data_path(), EM_DEVICE_CPU);
    if (!g_file) {
        fprintf(stderr, "cannot read %s (run scripts/golden_optim.py): %s\n", data_path(), em_last_error());
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    load_sched_cases();
    RUN(test_optimizers_f64_fused);
    RUN(test_optimizers_f64_op_by_op);
    RUN(test_optimizers_f32);
    RUN(test_optimizers_opencl);
    RUN(test_optimizers_cuda);
    RUN(test_schedules_attached);
    RUN(test_schedules_standalone);
    RUN(test_schedules_resume_from_checkpoint);
    RUN(test_schedules_resume_at_last_epoch);
    RUN(test_schedules_resume_from_state_dict);
    em_safetensors_free(g_file);
    return test_summary();
}
