/* The backends' fused optimizer kernels against the op-by-op path (the reference), on
 * random data: SGD (momentum, dampening, nesterov, weight decay), Adam, AdamW, amsgrad, in
 * f32 and f64 (and, loosely, f16/bf16), on the CPU and on opencl:0 when it is there. Both optimizers see the same
 * parameters and gradients; every parameter and state must agree within 1e-6 relative
 * after each step (bit for bit on the CPU), and the fused one must really have run its
 * kernels. */
#include <stdlib.h>
#include "test.h"
#include "optim/optim_internal.h"

/* sizes: odd, tiny, and one that the CPU splits across threads */
#define NP 3
static const int64_t g_sizes[NP] = {37, 1, 150001};
#define STEPS 4

static em_tensor *identity_forward(em_module *m, em_tensor *x) { (void)m; return x; }
static const em_module_ops holder_ops = {.name = "Holder", .forward = identity_forward};

/* Random normal host data times scale (em_randn on the CPU, so every device sees the same). */
static double *random_data(int64_t n, double scale) {
    double *d = malloc((size_t)n * sizeof *d);
    em_scope s = em_scope_begin();
    em_tensor *t = em_randn(EM_SHAPE(n), EM_OPTS(.dtype = EM_F64));
    CHECK_OK(em_copy_to_host(t, d, (size_t)n * sizeof *d));
    em_scope_end(s);
    for (int64_t i = 0; i < n; i++) d[i] *= scale;
    return d;
}

/* A module holding NP parameters with the values p[k], of dtype dt on device dev. */
static em_module *holder(double *const *p, em_dtype dt, em_device dev, em_tensor **params) {
    em_module *m = em_module_new(&holder_ops, NULL);
    em_scope s = em_scope_begin();
    for (int k = 0; k < NP; k++) {
        char name[8];
        snprintf(name, sizeof name, "p%d", k);
        CHECK_OK(em_module_add_parameter(m, name, em_from_data(p[k], EM_F64, EM_SHAPE(g_sizes[k]),
                                                                EM_OPTS(.dtype = dt))));
    }
    em_scope_end(s);
    CHECK_OK(em_module_to(m, dev));
    em_named_tensor nt[NP];
    CHECK(em_module_parameters(m, nt, NP) == NP);
    for (int k = 0; k < NP; k++) params[k] = nt[k].tensor;
    return m;
}

/* The gradient g of parameter p; strided: a non-contiguous view with p's shape. */
static void set_grad(em_tensor *p, const double *g, int64_t n, bool strided) {
    em_scope s = em_scope_begin();
    em_tensor *t = em_to(em_from_data(g, EM_F64, EM_SHAPE(n), EM_OPTS(.dtype = em_dtype_of(p))), em_device_of(p));
    if (strided) { /* every other element of a tensor twice as long */
        em_tensor *wide = em_zeros(EM_SHAPE(n, 2), EM_OPTS(.dtype = em_dtype_of(p), .device = em_device_of(p)));
        CHECK_OK(em_copy_(em_select(wide, 1, 0), em_reshape(t, EM_SHAPE(n))));
        t = em_select(wide, 1, 0);
        CHECK(n == 1 || !em_is_contiguous(t)); /* a one-element view is contiguous anyway */
    }
    CHECK_OK(em_set_grad(p, t));
    em_scope_end(s);
}

/* Largest |a - b| / max(|b|, floor) over two tensors of the same shape. */
static double rel_diff(em_tensor *a, em_tensor *b, double floor) {
    int64_t n = em_numel(b);
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y), worst = 0;
    em_scope s = em_scope_begin();
    CHECK_OK(em_copy_to_host(em_to_dtype(a, EM_F64), x, (size_t)n * sizeof *x));
    CHECK_OK(em_copy_to_host(em_to_dtype(b, EM_F64), y, (size_t)n * sizeof *y));
    em_scope_end(s);
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(x[i] - y[i]) / fmax(fabs(y[i]), floor);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    free(x);
    free(y);
    return worst;
}

typedef struct config {
    const char *name;
    bool adam, adamw;
    em_sgd_opts sgd;
    em_adam_opts am;
} config;

static em_optimizer *make(const config *c, em_module *m) {
    if (!c->adam) return em_sgd_ex(m, c->sgd);
    return c->adamw ? em_adamw_ex(m, c->am) : em_adam_ex(m, c->am);
}

static const char *const g_sgd_states[] = {"momentum_buffer"};
static const char *const g_adam_states[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

/* Fused and unfused from the same start; strided_grad: the fused path must stand aside. */
static void compare(const config *c, em_dtype dt, em_device dev, bool strided_grad) {
    /* f16/bf16: the fused kernels round once per element, the ops after every op */
    bool half = dt == EM_F16 || dt == EM_BF16;
    double floor = half ? 1 : 1e-30, tol = dt == EM_BF16 ? 5e-2 : half ? 1e-2 : 1e-6;
    double *p0[NP];
    for (int k = 0; k < NP; k++) p0[k] = random_data(g_sizes[k], 1.0);
    em_tensor *pf[NP], *pu[NP];
    em_module *mf = holder(p0, dt, dev, pf), *mu = holder(p0, dt, dev, pu);
    em_optimizer *of = make(c, mf), *ou = make(c, mu);
    CHECK(of && ou);
    if (!of || !ou) return;
    em__optim_set_fused(ou, false);
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int k = 0; k < NP; k++) {
            double *g = random_data(g_sizes[k], step == 2 ? 1e-3 : 1.0);
            set_grad(pf[k], g, g_sizes[k], strided_grad);
            set_grad(pu[k], g, g_sizes[k], strided_grad);
            free(g);
        }
        CHECK_OK(em_step(of));
        CHECK_OK(em_step(ou));
        for (int k = 0; k < NP; k++) {
            worst = fmax(worst, rel_diff(pf[k], pu[k], floor));
            int ns = c->adam ? 3 : 1;
            for (int j = 0; j < ns; j++) {
                const char *st = c->adam ? g_adam_states[j] : g_sgd_states[j];
                em_scope s = em_scope_begin();
                em_tensor *a = em_optim_state(of, pf[k], st), *b = em_optim_state(ou, pu[k], st);
                em_clear_error();
                CHECK((a == NULL) == (b == NULL));
                if (a && b) worst = fmax(worst, rel_diff(a, b, floor));
                em_scope_end(s);
            }
        }
    }
    int64_t want = 0; /* every update fused, or with strided gradients only the 1-element one */
    for (int k = 0; k < NP; k++) want += !strided_grad || g_sizes[k] == 1 ? STEPS : 0;
    printf("     %-26s %-4s %-9s fused updates %3lld, worst relative difference %.2g\n", c->name,
           em_dtype_name(dt), em_device_str(dev).s, (long long)em__optim_fused_updates(of), worst);
    CHECK(em__optim_fused_updates(of) == want);
    CHECK(em__optim_fused_updates(ou) == 0);
    CHECK(worst <= tol);
    /* the CPU kernels round exactly like the ops: bit-equal results */
    if (em_device_of(pf[0]).type == EM_CPU && !half) CHECK(worst == 0);
    em_optim_free(of);
    em_optim_free(ou);
    em_module_free(mf);
    em_module_free(mu);
    for (int k = 0; k < NP; k++) free(p0[k]);
}

static config g_configs[] = {
    {.name = "sgd"},
    {.name = "sgd weight_decay"},
    {.name = "sgd momentum"},
    {.name = "sgd momentum dampening wd"},
    {.name = "sgd nesterov wd"},
    {.name = "adam", .adam = true},
    {.name = "adam weight_decay", .adam = true},
    {.name = "adam amsgrad wd", .adam = true},
    {.name = "adamw", .adam = true, .adamw = true},
    {.name = "adamw amsgrad", .adam = true, .adamw = true},
};
#define NCONFIG (int)(sizeof g_configs / sizeof g_configs[0])

static void init_configs(void) {
    g_configs[0].sgd = em_sgd_defaults(0.1);
    g_configs[1].sgd = (em_sgd_opts){.lr = 0.05, .weight_decay = 0.01};
    g_configs[2].sgd = (em_sgd_opts){.lr = 0.05, .momentum = 0.9};
    g_configs[3].sgd = (em_sgd_opts){.lr = 0.02, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1};
    g_configs[4].sgd = (em_sgd_opts){.lr = 0.02, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
    g_configs[5].am = em_adam_defaults(1e-3);
    g_configs[6].am = em_adam_defaults(3e-3);
    g_configs[6].am.weight_decay = 0.05;
    g_configs[7].am = em_adam_defaults(1e-2);
    g_configs[7].am.weight_decay = 0.01;
    g_configs[7].am.amsgrad = true;
    g_configs[8].am = em_adamw_defaults(1e-3);
    g_configs[9].am = em_adamw_defaults(5e-3);
    g_configs[9].am.amsgrad = true;
    g_configs[9].am.beta1 = 0.5;
}

static void run_all(em_device dev, em_dtype dt) {
    for (int i = 0; i < NCONFIG; i++) compare(&g_configs[i], dt, dev, false);
}

static void test_cpu_f32(void) { run_all(EM_DEVICE_CPU, EM_F32); }
static void test_cpu_f64(void) { run_all(EM_DEVICE_CPU, EM_F64); }

/* Half types are computed in float and rounded once: close to the ops, not equal. */
static void test_cpu_half(void) {
    run_all(EM_DEVICE_CPU, EM_F16);
    run_all(EM_DEVICE_CPU, EM_BF16);
}

/* A strided gradient takes the op-by-op path on both sides (and still agrees). */
static void test_fallback_when_not_contiguous(void) {
    compare(&g_configs[3], EM_F32, EM_DEVICE_CPU, true);
    compare(&g_configs[7], EM_F32, EM_DEVICE_CPU, true);
}

static bool opencl_here(void) {
    if (em_device_available(EM_OPENCL)) return true;
    test_skip("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    return false;
}

static void test_opencl_f32(void) {
    if (opencl_here()) run_all(EM_DEVICE(EM_OPENCL, 0), EM_F32);
}

static void test_opencl_f64(void) {
    if (!opencl_here()) return;
    em_scope s = em_scope_begin();
    bool f64 = em_add(em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = EM_DEVICE(EM_OPENCL, 0))),
                      em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F64, .device = EM_DEVICE(EM_OPENCL, 0)))) != NULL;
    em_clear_error();
    em_scope_end(s);
    if (!f64) SKIP("opencl:0 has no double precision");
    run_all(EM_DEVICE(EM_OPENCL, 0), EM_F64);
}

static void test_opencl_half(void) {
    if (!opencl_here()) return;
    run_all(EM_DEVICE(EM_OPENCL, 0), EM_F16);
    run_all(EM_DEVICE(EM_OPENCL, 0), EM_BF16);
}

static void test_opencl_fallback(void) {
    if (opencl_here()) compare(&g_configs[9], EM_F32, EM_DEVICE(EM_OPENCL, 0), true);
}

/* The same on CUDA when this machine has it (the GPU check script runs these there). */
static bool cuda_here(void) {
    if (em_device_available(EM_CUDA)) return true;
    printf("     skipped: no CUDA device here: %s\n", em_device_unavailable_reason(EM_CUDA));
    return false;
}

static void test_cuda_f32(void) {
    if (cuda_here()) run_all(EM_DEVICE(EM_CUDA, 0), EM_F32);
}

static void test_cuda_f64(void) {
    if (cuda_here()) run_all(EM_DEVICE(EM_CUDA, 0), EM_F64); /* every CUDA device has f64 */
}

static void test_cuda_half(void) {
    if (!cuda_here()) return;
    run_all(EM_DEVICE(EM_CUDA, 0), EM_F16);
    run_all(EM_DEVICE(EM_CUDA, 0), EM_BF16);
}

static void test_cuda_fallback(void) {
    if (cuda_here()) compare(&g_configs[9], EM_F32, EM_DEVICE(EM_CUDA, 0), true);
}

int main(void) {
    em_manual_seed(1234);
    init_configs();
    RUN(test_cpu_f32);
    RUN(test_cpu_f64);
    RUN(test_cpu_half);
    RUN(test_fallback_when_not_contiguous);
    RUN(test_opencl_f32);
    RUN(test_opencl_f64);
    RUN(test_opencl_half);
    RUN(test_opencl_fallback);
    RUN(test_cuda_f32);
    RUN(test_cuda_f64);
    RUN(test_cuda_half);
    RUN(test_cuda_fallback);
    return test_summary();
}
