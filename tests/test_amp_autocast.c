/* Autocast regions (include/ember/amp.h): nesting, the enabled = false form, device types,
 * the GPU policy table, gradients' dtypes, the cast cache and its invalidation, the pure
 * low-precision mode, and bad input (integer dtype, ended twice, out of order, on another
 * thread). PyTorch's values for the CPU table are checked in test_amp_golden.c. */
#include <pthread.h>
#include "core/autocast.h"
#include "optim/optim_internal.h"
#include "test_amp_util.h"

static em_tensor *param(em_shape s, uint64_t seed) {
    em_manual_seed(seed);
    em_tensor *p = em_randn(s, EM_OPTS(0));
    CHECK_OK(em_set_requires_grad(p, true));
    return p;
}

static void test_outside_nothing_changes(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_randn(EM_SHAPE(3, 4), EM_OPTS(0)), *b = em_randn(EM_SHAPE(4, 2), EM_OPTS(0));
    CHECK(!em_autocast_enabled(EM_CPU));
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_F32);
    CHECK(em_dtype_of(em_matmul(em_to_dtype(a, EM_BF16), em_to_dtype(b, EM_BF16))) == EM_BF16);
    em_scope_end(s);
}

static void test_nesting_and_disabled(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_randn(EM_SHAPE(3, 4), EM_OPTS(0)), *b = em_randn(EM_SHAPE(4, 2), EM_OPTS(0));
    em_autocast outer = em_autocast_begin(EM_CPU, EM_BF16);
    CHECK(em_autocast_enabled(EM_CPU) && em_autocast_dtype(EM_CPU) == EM_BF16);
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_BF16);
    em_autocast off = em_autocast_begin_ex(EM_CPU, EM_BF16, false);
    CHECK(!em_autocast_enabled(EM_CPU));
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_F32);
    em_autocast half = em_autocast_begin(EM_CPU, EM_F16);
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_F16);
    CHECK_OK(em_autocast_end(half));
    CHECK_OK(em_autocast_end(off));
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_BF16);
    /* a region for another device type leaves CPU tensors alone, and float64 stays float64 */
    em_autocast gpu = em_autocast_begin(EM_CUDA, EM_F16);
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_BF16);
    CHECK(em_dtype_of(em_matmul(em_to_dtype(a, EM_F64), em_to_dtype(b, EM_F64))) == EM_F64);
    CHECK_OK(em_autocast_end(gpu));
    CHECK_OK(em_autocast_end(outer));
    CHECK(!em_autocast_enabled(EM_CPU));
    CHECK(em_dtype_of(em_matmul(a, b)) == EM_F32);
    em_scope_end(s);
}

/* CUDA's lists on GPU devices: precision-sensitive ops run in float32. */
static void test_gpu_policy(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_scope s = em_scope_begin();
    em_device d = EM_DEVICE(EM_OPENCL, 0);
    em_tensor *a = em_randn(EM_SHAPE(3, 4), EM_OPTS(.device = d)), *b = em_randn(EM_SHAPE(4, 5), EM_OPTS(.device = d));
    em_autocast ac = em_autocast_begin(EM_OPENCL, EM_BF16);
    em_tensor *h = em_matmul(a, b);
    CHECK(h && em_dtype_of(h) == EM_BF16);
    CHECK(em_dtype_of(em_softmax(h, 1)) == EM_F32);
    CHECK(em_dtype_of(em_log_softmax(h, 1)) == EM_F32);
    CHECK(em_dtype_of(em_exp(h)) == EM_F32);
    CHECK(em_dtype_of(em_sum(h, EM_ALL_DIMS, false)) == EM_F32);
    CHECK(em_dtype_of(em_pow_scalar(h, 2.0)) == EM_F32);
    CHECK(em_dtype_of(em_relu(h)) == EM_BF16);            /* not on a list: its input's dtype */
    CHECK(em_dtype_of(em_add(h, em_zeros(EM_SHAPE(3, 5), EM_OPTS(.device = d)))) == EM_F32); /* promote */
    em_tensor *ref = em_softmax(em_to_dtype(h, EM_F32), 1);
    CHECK(amp_err(em_softmax(h, 1), ref, 1e-6, 1e-5) <= 1);
    CHECK_OK(em_autocast_end(ac));
    CHECK(em_dtype_of(em_softmax(h, 1)) == EM_BF16);
    em_scope_end(s);
}

/* The casts are recorded: a float32 leaf gets a float32 gradient close to float32's. */
static void test_gradient_dtype(void) {
    em_scope s = em_scope_begin();
    em_tensor *w = param(EM_SHAPE(4, 3), 1), *x = em_randn(EM_SHAPE(5, 4), EM_OPTS(0));
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *y = em_matmul(x, w);
    CHECK(y && em_dtype_of(y) == EM_BF16);
    CHECK(em_grad_fn_name(y) != NULL);
    em_tensor *loss = em_sum(em_mul(y, y), EM_ALL_DIMS, false);
    CHECK_OK(em_autocast_end(ac));
    CHECK_OK(em_backward(loss));
    em_tensor *gw = em_grad(w);
    CHECK(gw && em_dtype_of(gw) == EM_F32);
    /* float32 reference: d/dw sum((xw)^2) = 2 x^T x w */
    em_tensor *ref = em_mul_scalar(em_matmul(em_transpose(x, 0, 1), em_matmul(x, w)), 2.0);
    CHECK(amp_err(gw, ref, 5e-2, 3e-2) <= 1);
    em_scope_end(s);
}

/* A parameter is cast once per region; the cast is dropped when the parameter changes. */
static void test_cast_cache(void) {
    em_scope s = em_scope_begin();
    em_tensor *w = param(EM_SHAPE(4, 3), 2), *x = em_randn(EM_SHAPE(2, 4), EM_OPTS(0));
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *w1 = w, *w2 = w, *x1 = x, *x2 = x;
    em_ac_held h1, h2, h3, h4;
    CHECK(em__autocast_apply(EM_AC_MATMUL, 1, (em_tensor **const[]){&w1}, &h1) == 1);
    CHECK(em__autocast_apply(EM_AC_MATMUL, 1, (em_tensor **const[]){&w2}, &h2) == 1);
    CHECK(w1 == w2 && em_dtype_of(w1) == EM_BF16);          /* the same cast, cached */
    /* tensors that are not parameters are cast each time */
    CHECK(em__autocast_apply(EM_AC_MATMUL, 1, (em_tensor **const[]){&x1}, &h3) == 1);
    CHECK(em__autocast_apply(EM_AC_MATMUL, 1, (em_tensor **const[]){&x2}, &h4) == 1);
    CHECK(x1 != x2);
    em__autocast_done(&h3, NULL);
    em__autocast_done(&h4, NULL);
    /* an in-place change of w bumps its version: the next use casts again */
    em_grad_mode gm = em_no_grad_begin();
    CHECK_OK(em_mul_scalar_(w, 1.5));
    em_no_grad_end(gm);
    em_tensor *w3 = w;
    em_ac_held h5;
    CHECK(em__autocast_apply(EM_AC_MATMUL, 1, (em_tensor **const[]){&w3}, &h5) == 1);
    CHECK(w3 != w1);
    CHECK_NEAR(amp_at(w3, 0), amp_at(em_to_dtype(w, EM_BF16), 0), 0);
    em__autocast_done(&h1, NULL);
    em__autocast_done(&h2, NULL);
    em__autocast_done(&h5, NULL);
    CHECK_OK(em_autocast_end(ac));
    em_scope_end(s);
}

/* The cache after an optimizer step, through the public API only: a second forward in the
 * same region must see the updated weights (a stale cast would give the old output). */
static void test_cache_invalidated_by_step(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_module *m = em_nn_linear(4, 3);
    em_optimizer *opt = em_sgd(m, 0.5);
    em_tensor *x = em_randn(EM_SHAPE(8, 4), EM_OPTS(0));
    em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *y0 = em_forward(m, x);
    CHECK_OK(em_backward(em_sum(em_mul(y0, y0), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(opt));
    em_tensor *y1 = em_forward(m, x);
    CHECK_OK(em_autocast_end(ac));
    /* the same forward in a fresh region, with the new weights */
    em_autocast fresh = em_autocast_begin(EM_CPU, EM_BF16);
    em_tensor *want = em_forward(m, x);
    CHECK_OK(em_autocast_end(fresh));
    CHECK(amp_err(y1, want, 1e-30, 0) <= 1);      /* bit for bit */
    CHECK(amp_err(y1, y0, 1e-3, 0) > 1);          /* and the step did change it */
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
}

/* Master weights: under autocast with a scaler the parameters, gradients and optimizer state
 * stay float32; the pure low-precision mode (em_module_to_dtype) still trains. */
static void test_master_weights_and_pure_mode(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(4);
    em_module *m = em_nn_sequential(em_nn_linear(4, 8), em_nn_relu(), em_nn_linear(8, 3));
    em_optimizer *opt = em_adam(m, 1e-2);
    em_grad_scaler *sc = em_grad_scaler_new(em_grad_scaler_defaults());
    em_tensor *x = em_randn(EM_SHAPE(16, 4), EM_OPTS(0));
    em_tensor *t = em_randint(0, 3, EM_SHAPE(16), EM_OPTS(.dtype = EM_I64));
    for (int i = 0; i < 3; i++) {
        em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
        em_tensor *loss = em_cross_entropy(em_forward(m, x), t, 0.0);
        CHECK_OK(em_autocast_end(ac));
        CHECK(loss && em_dtype_of(loss) == EM_F32);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(em_grad_scaler_scale(sc, loss)));
        CHECK_OK(em_grad_scaler_step(sc, opt));
        CHECK_OK(em_grad_scaler_update(sc));
    }
    em_named_tensor ps[4];
    CHECK(em_module_parameters(m, ps, 4) == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(em_dtype_of(ps[i].tensor) == EM_F32);
        CHECK(em_dtype_of(em_grad(ps[i].tensor)) == EM_F32);
        em_tensor *st = em_optim_state(opt, ps[i].tensor, "exp_avg");
        CHECK(st && em_dtype_of(st) == EM_F32);
    }
    CHECK(em__optim_fused_updates(opt) > 0);
    em_grad_scaler_free(sc);
    em_optim_free(opt);
    /* pure bf16: parameters themselves in bf16, no autocast needed */
    CHECK_OK(em_module_to_dtype(m, EM_BF16));
    opt = em_sgd(m, 0.1);
    double first = NAN, last = NAN;
    for (int i = 0; i < 20; i++) {
        CHECK_OK(em_zero_grad(opt));
        em_tensor *loss = em_cross_entropy(em_forward(m, em_to_dtype(x, EM_BF16)), t, 0.0);
        CHECK(loss && em_dtype_of(loss) == EM_BF16);
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_step(opt));
        last = em_item(loss);
        if (i == 0) first = last;
    }
    CHECK(last < first);
    CHECK(em_dtype_of(ps[0].tensor) == EM_BF16);
    em_optim_free(opt);
    em_module_free(m);
    em_scope_end(s);
}

static void test_bad_dtype(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_randn(EM_SHAPE(2, 2), EM_OPTS(0));
    em_autocast ac = em_autocast_begin(EM_CPU, EM_I64);
    CHECK_ERROR(EM_ERR_DTYPE, "expected float16 or bfloat16, got int64");
    CHECK(!em_autocast_enabled(EM_CPU));
    CHECK(em_dtype_of(em_matmul(a, a)) == EM_F32);
    CHECK_OK(em_autocast_end(ac)); /* ending a region that never began does nothing */
    em_autocast_begin(EM_CPU, EM_F32);
    CHECK_ERROR(EM_ERR_DTYPE, "got float32");
    em_autocast_begin((em_device_type)99, EM_BF16);
    CHECK_ERROR(EM_ERR_ARGUMENT, "invalid device type");
    CHECK(!em_autocast_enabled(EM_CPU));
    em_scope_end(s);
}

static void test_bad_end(void) {
    em_autocast never = {0};
    CHECK(em_autocast_end(never) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no region was begun");
    em_autocast outer = em_autocast_begin(EM_CPU, EM_BF16);
    em_autocast inner = em_autocast_begin(EM_CPU, EM_F16);
    CHECK(em_autocast_end(outer) == EM_ERR_ARGUMENT);          /* out of order */
    CHECK_ERROR(EM_ERR_ARGUMENT, "not the innermost");
    CHECK(em_autocast_dtype(EM_CPU) == EM_F16);                /* nothing changed */
    CHECK_OK(em_autocast_end(inner));
    CHECK(em_autocast_end(inner) == EM_ERR_ARGUMENT);          /* twice */
    CHECK_ERROR(EM_ERR_ARGUMENT, "already ended");
    CHECK(em_autocast_dtype(EM_CPU) == EM_BF16);
    CHECK_OK(em_autocast_end(outer));
    CHECK(em_autocast_end(outer) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already ended");
    CHECK(!em_autocast_enabled(EM_CPU));
}

typedef struct { em_autocast r; em_status st; char msg[256]; bool enabled; } thread_arg;

static void *end_elsewhere(void *p) {
    thread_arg *a = p;
    a->enabled = em_autocast_enabled(EM_CPU);   /* regions are per thread */
    a->st = em_autocast_end(a->r);
    snprintf(a->msg, sizeof a->msg, "%s", em_last_error());
    em_clear_error();
    return NULL;
}

static void test_end_on_another_thread(void) {
    em_scope s = em_scope_begin();
    em_tensor *w = param(EM_SHAPE(3, 3), 5);
    thread_arg a = {.r = em_autocast_begin(EM_CPU, EM_BF16)};
    CHECK(em_dtype_of(em_matmul(w, w)) == EM_BF16);  /* fills the cast cache */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, end_elsewhere, &a) == 0);
    pthread_join(th, NULL);
    CHECK(!a.enabled);
    CHECK(a.st == EM_ERR_ARGUMENT);
    CHECK(strstr(a.msg, "another thread") != NULL);
    CHECK(em_autocast_enabled(EM_CPU));              /* still open here */
    CHECK_OK(em_autocast_end(a.r));
    CHECK(!em_autocast_enabled(EM_CPU));
    em_scope_end(s);
}

int main(void) {
    RUN(test_outside_nothing_changes);
    RUN(test_nesting_and_disabled);
    RUN(test_gpu_policy);
    RUN(test_gradient_dtype);
    RUN(test_cast_cache);
    RUN(test_cache_invalidated_by_step);
    RUN(test_master_weights_and_pure_mode);
    RUN(test_bad_dtype);
    RUN(test_bad_end);
    RUN(test_end_on_another_thread);
    return test_summary();
}
