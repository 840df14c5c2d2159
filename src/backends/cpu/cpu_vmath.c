/* Vectorized float32 exp, erf, GELU and softmax rows (see cpu_vmath.h): glibc's expf and erff
 * are scalar calls, and the transformer's GELU and attention softmax spent a fifth of a
 * training step in them. The kernels are in cpu_vmath_impl.h, compiled here for AVX-512 and
 * AVX2+FMA; the scalar libm loops below are the portable path and the reference semantics. */
#include "cpu_vmath.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- the portable path ---- */
static void exp_n_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}
static void erf_n_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = erff(x[i]);
}
static void gelu_n_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
    }
}
static void gelu_bwd_n_scalar(const float *g, const float *x, float *dx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
        float pdf = expf(-0.5f * v * v) * 0.39894228040143267794f;
        dx[i] = g[i] * (cdf + v * pdf);
    }
}
/* the max subtracted first; a NaN anywhere makes the row NaN; the sum in double */
static bool softmax_row_scalar(const float *x, float *y, int64_t n, bool lg) {
    float m = -INFINITY;
    for (int64_t k = 0; k < n; k++) m = x[k] > m ? x[k] : m;
    for (int64_t k = 0; k < n; k++) m = x[k] != x[k] ? x[k] : m;
    double s = 0;
    if (lg) {
        for (int64_t k = 0; k < n; k++) s += expf(x[k] - m);
        float ls = (float)log(s);
        for (int64_t k = 0; k < n; k++) y[k] = (x[k] - m) - ls;
    } else {
        for (int64_t k = 0; k < n; k++) {
            y[k] = expf(x[k] - m);
            s += y[k];
        }
        float inv = (float)(1 / s);
        for (int64_t k = 0; k < n; k++) y[k] *= inv;
    }
    return true;
}

static void ln_moments_scalar(const float *x, int64_t n, double eps, double *mean, double *rstd) {
    double s = 0, v = 0;
    for (int64_t j = 0; j < n; j++) s += x[j];
    double m = n ? s / (double)n : 0;
    for (int64_t j = 0; j < n; j++) v += ((double)x[j] - m) * ((double)x[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt((n ? v / (double)n : 0) + eps);
}
static void ln_fwd_row_scalar(const float *x, const float *w, const float *b, float *y, int64_t n, double eps,
                              float *mean, float *rstd) {
    double m, rs;
    ln_moments_scalar(x, n, eps, &m, &rs);
    float tm = (float)m, trs = (float)rs;
    for (int64_t j = 0; j < n; j++) y[j] = (x[j] - tm) * trs * w[j] + b[j];
    *mean = tm;
    *rstd = trs;
}
static void ln_bwd_row_scalar(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                              double eps) {
    double m, rs, a = 0, d = 0;
    ln_moments_scalar(x, n, eps, &m, &rs);
    float tm = (float)m, trs = (float)rs;
    for (int64_t j = 0; j < n; j++) {
        float xh = (x[j] - tm) * trs, gw = g[j] * w[j];
        a += gw;
        d += (double)gw * xh;
        gx[j] = g[j] * xh;
    }
    float ta = (float)(a / (double)n), td = (float)(d / (double)n);
    for (int64_t j = 0; j < n; j++) {
        float xh = (x[j] - tm) * trs;
        dx[j] = trs * (g[j] * w[j] - ta - xh * td);
    }
}

static void softmax_bwd_row_scalar(const float *g, const float *y, float *dx, int64_t n, bool lg) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += lg ? (double)g[i] : (double)g[i] * y[i];
    float fs = (float)s;
    for (int64_t i = 0; i < n; i++) dx[i] = lg ? g[i] - expf(y[i]) * fs : y[i] * (g[i] - fs);
}

static double sumsq_scalar(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}
static void rms_row_scalar(const float *x, const float *w, float *y, int64_t n, float inv) {
    for (int64_t i = 0; i < n; i++) y[i] = w ? (x[i] * inv) * w[i] : x[i] * inv;
}
static void rms_bwd_row_scalar(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                               float inv) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        float xh = x[i] * inv, gw = w ? g[i] * w[i] : g[i];
        d += (double)gw * xh;
        if (gx) gx[i] = g[i] * xh;
    }
    float td = (float)(d / (double)n);
    for (int64_t i = 0; i < n; i++) {
        float gw = w ? g[i] * w[i] : g[i];
        dx[i] = inv * (gw - (x[i] * inv) * td);
    }
}
static void swiglu_n_scalar(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = a[i] / (1.0f + expf(-a[i]));
        y[i] = b ? s * b[i] : s;
    }
}
static void swiglu_bwd_n_scalar(const float *g, const float *a, const float *b, float *da, float *db, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float av = a[i], bv = b[i], s = 1.0f / (1.0f + expf(-av)), gs = g[i] * s;
        db[i] = gs * av;
        da[i] = gs * bv * (av * (1.0f - s) + 1.0f);
    }
}

typedef struct vm_impl {
    const char *name;
    void (*exp_n)(const float *, float *, int64_t);
    void (*erf_n)(const float *, float *, int64_t);
    void (*gelu_n)(const float *, float *, int64_t);
    void (*gelu_bwd_n)(const float *, const float *, float *, int64_t);
    bool (*softmax_row)(const float *, float *, int64_t, bool); /* false: a NaN, use the scalar row */
    void (*ln_fwd_row)(const float *, const float *, const float *, float *, int64_t, double, float *, float *);
    void (*ln_bwd_row)(const float *, const float *, const float *, float *, float *, int64_t, double);
    void (*softmax_bwd_row)(const float *, const float *, float *, int64_t, bool);
    double (*sumsq)(const float *, int64_t);
    void (*rms_row)(const float *, const float *, float *, int64_t, float);
    void (*rms_bwd_row)(const float *, const float *, const float *, float *, float *, int64_t, float);
    void (*swiglu_n)(const float *, const float *, float *, int64_t);
    void (*swiglu_bwd_n)(const float *, const float *, const float *, float *, float *, int64_t);
} vm_impl;

static const vm_impl g_scalar = {"scalar", exp_n_scalar, erf_n_scalar, gelu_n_scalar, gelu_bwd_n_scalar,
                                 softmax_row_scalar, ln_fwd_row_scalar, ln_bwd_row_scalar,
                                 softmax_bwd_row_scalar, sumsq_scalar, rms_row_scalar, rms_bwd_row_scalar,
                                 swiglu_n_scalar, swiglu_bwd_n_scalar};

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define EM_VMATH_X86 1
#include <immintrin.h>

/* ---- AVX-512: 16 lanes, k-register masks ---- */
#define V __m512
#define VI __m512i
#define VD __m512d
#define W 16
#define ATTR __attribute__((target("avx512f")))
#define VF(name) name##_avx512
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET _mm512_set1_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VRCP _mm512_rcp14_ps
#define VFMA _mm512_fmadd_ps
#define VMIN _mm512_min_ps
#define VMAX _mm512_max_ps
#define VROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VLT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define VGT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define VGE(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ)
#define VM __mmask16
#define VMAND(a, b) ((__mmask16)((a) & (b)))
#define VNAN(a) _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)
#define VSEL(m, t, f) _mm512_mask_blend_ps(m, f, t)
#define VANY(m) ((m) != 0)
#define VTOI _mm512_cvtps_epi32
#define VIADD _mm512_add_epi32
#define VISUB _mm512_sub_epi32
#define VISRA _mm512_srai_epi32
#define VISLL _mm512_slli_epi32
#define VISET _mm512_set1_epi32
#define VFROMI _mm512_castsi512_ps
#define VDZERO _mm512_setzero_pd()
#define VDACC(a0, a1, v)                                                                          \
    do {                                                                                          \
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));                       \
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)))); \
    } while (0)
#define VDSUM(a) _mm512_reduce_add_pd(a)
#define VDLO(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define VDHI(v) _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)))
#define VDSET _mm512_set1_pd
#define VDSUBV _mm512_sub_pd
#define VDFMA _mm512_fmadd_pd
#include "cpu_vmath_impl.h"
#undef V
#undef VI
#undef VD
#undef W
#undef ATTR
#undef VF
#undef VLOAD
#undef VSTORE
#undef VSET
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VRCP
#undef VFMA
#undef VMIN
#undef VMAX
#undef VROUND
#undef VLT
#undef VGT
#undef VGE
#undef VM
#undef VMAND
#undef VNAN
#undef VSEL
#undef VANY
#undef VTOI
#undef VIADD
#undef VISUB
#undef VISRA
#undef VISLL
#undef VISET
#undef VFROMI
#undef VDZERO
#undef VDACC
#undef VDSUM
#undef VDLO
#undef VDHI
#undef VDSET
#undef VDSUBV
#undef VDFMA

/* ---- AVX2 + FMA: 8 lanes, masks as vectors ---- */
#define V __m256
#define VI __m256i
#define VD __m256d
#define W 8
#define ATTR __attribute__((target("avx2,fma")))
#define VF(name) name##_avx2
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET _mm256_set1_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VRCP _mm256_rcp_ps
#define VFMA _mm256_fmadd_ps
#define VMIN _mm256_min_ps
#define VMAX _mm256_max_ps
#define VROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VLT(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define VGT(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define VGE(a, b) _mm256_cmp_ps(a, b, _CMP_GE_OQ)
#define VM __m256
#define VMAND _mm256_and_ps
#define VNAN(a) _mm256_cmp_ps(a, a, _CMP_UNORD_Q)
#define VSEL(m, t, f) _mm256_blendv_ps(f, t, m)
#define VANY(m) (_mm256_movemask_ps(m) != 0)
#define VTOI _mm256_cvtps_epi32
#define VIADD _mm256_add_epi32
#define VISUB _mm256_sub_epi32
#define VISRA _mm256_srai_epi32
#define VISLL _mm256_slli_epi32
#define VISET _mm256_set1_epi32
#define VFROMI _mm256_castsi256_ps
#define VDZERO _mm256_setzero_pd()
#define VDACC(a0, a1, v)                                                                          \
    do {                                                                                          \
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));                       \
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));                     \
    } while (0)
#define VDSUM(a) vdsum_avx2(a)
#define VDLO(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define VDHI(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))
#define VDSET _mm256_set1_pd
#define VDSUBV _mm256_sub_pd
#define VDFMA _mm256_fmadd_pd
__attribute__((target("avx2,fma"))) static inline double vdsum_avx2(__m256d a) {
    double l[4];
    _mm256_storeu_pd(l, a);
    return (l[0] + l[1]) + (l[2] + l[3]);
}
#include "cpu_vmath_impl.h"

static const vm_impl g_avx2 = {"avx2", exp_n_avx2, erf_n_avx2, gelu_n_avx2, gelu_bwd_n_avx2, softmax_row_avx2,
                               ln_fwd_row_avx2, ln_bwd_row_avx2, softmax_bwd_row_avx2, sumsq_avx2, rms_row_avx2,
                               rms_bwd_row_avx2, swiglu_n_avx2, swiglu_bwd_n_avx2};
static const vm_impl g_avx512 = {"avx512", exp_n_avx512, erf_n_avx512, gelu_n_avx512, gelu_bwd_n_avx512,
                                 softmax_row_avx512, ln_fwd_row_avx512, ln_bwd_row_avx512,
                                 softmax_bwd_row_avx512, sumsq_avx512, rms_row_avx512, rms_bwd_row_avx512,
                                 swiglu_n_avx512, swiglu_bwd_n_avx512};
#endif

static const vm_impl *impl_by_name(const char *name) {
    if (!strcmp(name, "scalar")) return &g_scalar;
#ifdef EM_VMATH_X86
    if (!strcmp(name, "avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &g_avx2;
    if (!strcmp(name, "avx512") && __builtin_cpu_supports("avx512f")) return &g_avx512;
#endif
    return NULL;
}

static _Atomic(const vm_impl *) g_impl;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void impl_pick(void) {
    const vm_impl *best = &g_scalar;
#ifdef EM_VMATH_X86
    __builtin_cpu_init();
    if (impl_by_name("avx2")) best = &g_avx2;
    if (impl_by_name("avx512")) best = &g_avx512;
#endif
    const char *env = getenv("EMBER_CPU_VMATH");
    const vm_impl *want = env && *env ? impl_by_name(env) : NULL;
    atomic_store(&g_impl, want ? want : best);
}

static const vm_impl *impl_now(void) {
    pthread_once(&g_once, impl_pick);
    return atomic_load(&g_impl);
}

const char *em__cpu_vmath_isa(void) { return impl_now()->name; }

bool em__cpu_vmath_use(const char *isa) {
    impl_now();
    const vm_impl *want = isa ? impl_by_name(isa) : NULL;
    if (!want) return false;
    atomic_store(&g_impl, want);
    return true;
}

void em__cpu_vexp_f32(const float *x, float *y, int64_t n) { impl_now()->exp_n(x, y, n); }
void em__cpu_verf_f32(const float *x, float *y, int64_t n) { impl_now()->erf_n(x, y, n); }
void em__cpu_vgelu_f32(const float *x, float *y, int64_t n) { impl_now()->gelu_n(x, y, n); }
void em__cpu_vgelu_backward_f32(const float *g, const float *x, float *dx, int64_t n) {
    impl_now()->gelu_bwd_n(g, x, dx, n);
}
void em__cpu_vsoftmax_row_f32(const float *x, float *y, int64_t n, bool log) {
    if (!impl_now()->softmax_row(x, y, n, log)) softmax_row_scalar(x, y, n, log);
}
void em__cpu_vln_row_f32(const float *x, const float *w, const float *b, float *y, int64_t n, double eps, float *mean,
                         float *rstd) {
    impl_now()->ln_fwd_row(x, w, b, y, n, eps, mean, rstd);
}
void em__cpu_vln_backward_row_f32(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                  double eps) {
    impl_now()->ln_bwd_row(x, w, g, dx, gx, n, eps);
}
void em__cpu_vsoftmax_backward_row_f32(const float *g, const float *y, float *dx, int64_t n, bool log) {
    impl_now()->softmax_bwd_row(g, y, dx, n, log);
}
double em__cpu_vsumsq_f32(const float *x, int64_t n) { return impl_now()->sumsq(x, n); }
void em__cpu_vrms_row_f32(const float *x, const float *w, float *y, int64_t n, float inv) {
    impl_now()->rms_row(x, w, y, n, inv);
}
void em__cpu_vrms_backward_row_f32(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                   float inv) {
    impl_now()->rms_bwd_row(x, w, g, dx, gx, n, inv);
}
void em__cpu_vswiglu_f32(const float *a, const float *b, float *y, int64_t n) { impl_now()->swiglu_n(a, b, y, n); }
void em__cpu_vswiglu_backward_f32(const float *g, const float *a, const float *b, float *da, float *db, int64_t n) {
    impl_now()->swiglu_bwd_n(g, a, b, da, db, n);
}
