/* Subnormal optimizer state. The fused Adam and SGD kernels store moments (and the
 * momentum buffer) below the smallest normal number as zero, on the CPU and on opencl:0 alike
 * (bit for bit), leave normal values, NaN and the parameters alone; em_set_flush_denormal
 * sets FTZ/DAZ on the caller and Ember's workers and clears them again; em_cpu_features and
 * em_cpu_fma_lanes agree with each other. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "core/internal_api.h"

/* elements: a moment that decays below FLT_MIN (flushed), one that stays just above it,
 * a negative tiny one, a NaN, an ordinary one; the gradients are zero except the last */
#define N 5
static const float g_m0[N] = {1.2e-38f, 1.4e-38f, -1.2e-38f, NAN, 0.01f};
static const float g_v0[N] = {1.1e-38f, 4.0e-38f, 1.0e-38f, 1.0f, 0.02f};
static const float g_p0[N] = {0.5f, -0.25f, 0.125f, 1.0f, 2.0f};
static const float g_g0[N] = {0, 0, 0, 0, 0.1f};

static em_tensor *on(const float *d, em_device dev) {
    return em_to(em_from_data(d, EM_F32, EM_SHAPE(N), EM_OPTS(.dtype = EM_F32)), dev);
}

static void host(em_tensor *t, float *out) { CHECK_OK(em_copy_to_host(t, out, N * sizeof(float))); }

static em_optim_args adam_args(void) {
    return (em_optim_args){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                           .bias_correction1 = 1 - 0.9, .bias_correction2 = 1 - 0.999};
}

/* one fused Adam step on dev: p, m, v after it */
static void adam_on(em_device dev, float *p, float *m, float *v) {
    em_scope s = em_scope_begin();
    em_tensor *tp = on(g_p0, dev), *tg = on(g_g0, dev), *tm = on(g_m0, dev), *tv = on(g_v0, dev);
    em_optim_args a = adam_args();
    CHECK_OK(em__fused_adam_step(&a, tp, tg, tm, tv, NULL));
    host(tp, p);
    host(tm, m);
    host(tv, v);
    em_scope_end(s);
}

static void test_cpu_adam_flushes_state(void) {
    float p[N], m[N], v[N];
    adam_on(EM_DEVICE_CPU, p, m, v);
    /* 1.2e-38 * 0.9 < FLT_MIN: zero, and +0 (not -0) for the negative one too */
    CHECK(m[0] == 0 && !signbit(m[0]));
    CHECK(m[2] == 0 && !signbit(m[2]));
    CHECK(v[0] == 0 && v[2] == 0);
    /* 1.4e-38 * 0.9 and 4e-38 * 0.999 stay normal: kept as computed */
    CHECK(m[1] == 1.4e-38f * 0.9f && m[1] >= FLT_MIN);
    CHECK(v[1] == 4.0e-38f * 0.999f);
    CHECK(isnan(m[3]));
    CHECK(m[4] == 0.01f * 0.9f + 0.1f * 0.1f);
    /* the parameters of flushed elements did not move (their update was below rounding) */
    for (int i = 0; i < 3; i++) CHECK(p[i] == g_p0[i]);
    CHECK(p[4] != g_p0[4]);
}

static void test_cpu_sgd_flushes_buffer(void) {
    em_scope s = em_scope_begin();
    const float buf0[N] = {1.2e-38f, 1.4e-38f, -1.2e-38f, 3.0f, 0.5f};
    em_tensor *tp = on(g_p0, EM_DEVICE_CPU), *tg = on(g_g0, EM_DEVICE_CPU), *tb = on(buf0, EM_DEVICE_CPU);
    em_optim_args a = {.lr = 0.1, .momentum = 0.9};
    CHECK_OK(em__fused_sgd_step(&a, tp, tg, tb));
    float b[N];
    host(tb, b);
    CHECK(b[0] == 0 && b[2] == 0);
    CHECK(b[1] == 1.4e-38f * 0.9f);
    CHECK(b[3] == 3.0f * 0.9f);
    em_scope_end(s);
}

static void test_cpu_f64_flushes_at_dbl_min(void) {
    em_scope s = em_scope_begin();
    const double m0[2] = {2.3e-308, 3.0e-308}, v0[2] = {1.0, 1.0}, p0[2] = {1.0, 1.0}, g0[2] = {0, 0};
    em_tensor *t[4];
    const double *src[4] = {p0, g0, m0, v0};
    for (int k = 0; k < 4; k++) t[k] = em_from_data(src[k], EM_F64, EM_SHAPE(2), EM_OPTS(.dtype = EM_F64));
    em_optim_args a = adam_args();
    CHECK_OK(em__fused_adam_step(&a, t[0], t[1], t[2], t[3], NULL));
    double m[2];
    CHECK_OK(em_copy_to_host(t[2], m, sizeof m));
    CHECK(m[0] == 0);               /* 2.07e-308 < DBL_MIN */
    CHECK(m[1] == 3.0e-308 * 0.9);  /* 2.7e-308: normal */
    em_scope_end(s);
}

static void test_opencl_agrees_bit_for_bit(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    float p[2][N], m[2][N], v[2][N];
    adam_on(EM_DEVICE_CPU, p[0], m[0], v[0]);
    adam_on(EM_DEVICE(EM_OPENCL, 0), p[1], m[1], v[1]);
    CHECK(m[1][0] == 0 && m[1][2] == 0 && v[1][0] == 0);
    for (int i = 0; i < N; i++)
        if (i != 3) CHECK(memcmp(&m[0][i], &m[1][i], 4) == 0 && memcmp(&v[0][i], &v[1][i], 4) == 0 &&
                          memcmp(&p[0][i], &p[1][i], 4) == 0);
    CHECK(isnan(m[1][3]));
}

/* x * y computed where the compiler cannot fold it */
static float mul(float x, float y) {
    volatile float a = x, b = y;
    return a * b;
}

/* how many elements of a float tensor are not zero */
static int64_t nonzero(em_tensor *t) {
    int64_t n = em_numel(t), c = 0;
    float *d = malloc((size_t)n * sizeof *d);
    CHECK_OK(em_copy_to_host(t, d, (size_t)n * sizeof *d));
    for (int64_t i = 0; i < n; i++) c += d[i] != 0;
    free(d);
    return c;
}

static void test_set_flush_denormal(void) {
    CHECK(!em_get_flush_denormal());
    CHECK(mul(1e-30f, 1e-10f) != 0); /* gradual underflow by default */
#if defined(__x86_64__)
    CHECK(em_set_flush_denormal(true));
    CHECK(em_get_flush_denormal());
    CHECK(mul(1e-30f, 1e-10f) == 0);
    /* the worker threads follow: a large product of tiny values split across 2 threads */
    int threads = em_get_num_threads();
    em_set_num_threads(2);
    em_scope s = em_scope_begin();
    int64_t n = 1 << 20;
    em_tensor *x = em_full(EM_SHAPE(n), 1e-30, EM_OPTS(.dtype = EM_F32));
    CHECK(nonzero(em_mul_scalar(x, 1e-10)) == 0);
    CHECK(em_set_flush_denormal(false));
    CHECK(!em_get_flush_denormal());
    CHECK(mul(1e-30f, 1e-10f) != 0);
    CHECK(nonzero(em_mul_scalar(x, 1e-10)) == n);
    em_scope_end(s);
    em_set_num_threads(threads);
#else
    CHECK(!em_set_flush_denormal(true));
    CHECK(!em_get_flush_denormal());
#endif
}

static void test_cpu_features(void) {
    const char *f = em_cpu_features();
    CHECK(f && f[0]);
    CHECK(f == em_cpu_features()); /* one static line */
    int lanes = em_cpu_fma_lanes();
    CHECK(lanes == 0 || lanes == 8 || lanes == 16);
    CHECK((lanes == 16) == (strstr(f, "avx512f") != NULL));
    if (lanes == 8) CHECK(strstr(f, "avx2") && strstr(f, "fma"));
#if defined(__x86_64__)
    CHECK(strcmp(f, "none") != 0 && strstr(f, "sse4.2")); /* x86-64-v2 is the library's baseline */
#endif
}

int main(void) {
    RUN(test_cpu_adam_flushes_state);
    RUN(test_cpu_sgd_flushes_buffer);
    RUN(test_cpu_f64_flushes_at_dbl_min);
    RUN(test_opencl_agrees_bit_for_bit);
    RUN(test_set_flush_denormal);
    RUN(test_cpu_features);
    return test_summary();
}
