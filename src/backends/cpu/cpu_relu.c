/* ReLU's backward in one pass (backend.h's relu_backward): dx = g where y > 0, else 0. The
 * composition autograd uses without it (gt, then where) makes two passes and a bool tensor:
 * 0.4 ms of the CNN's 7 ms step on one thread. f32 runs 16 lanes with AVX-512 where the CPU
 * has it; same results as the scalar loop (a select, no arithmetic). bf16 and f16 (a bf16
 * Linear's ReLU under autocast) compare the output's bits, 32 lanes with AVX-512BW:
 * y > 0 exactly when its bits, read as a signed 16-bit integer, lie in [lo, hi]: lo the
 * smallest positive value (the smallest normal for bf16 when denormals are flushed, as the
 * float compare of the composed path then reads a bf16 subnormal as 0; f16's subnormals are
 * float32 normals), hi +infinity (NaNs lie above it, negatives and -0 below 1). */
#include "cpu_internal.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct relu_job {
    char *dx;
    const char *g, *y;
    bool f64, avx512;
    bool half;        /* bf16 or f16: the bit test below */
    int16_t lo, hi;   /* y > 0 iff lo <= (int16_t)bits(y) <= hi */
} relu_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void relu_bwd_avx512(float *dx, const float *g, const float *y, int64_t n) {
    const __m512 z = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), z, _CMP_GT_OQ); /* NaN: false */
        _mm512_storeu_ps(dx + i, _mm512_maskz_loadu_ps(m, g + i));
    }
    for (; i < n; i++) dx[i] = y[i] > 0 ? g[i] : 0.0f;
}
#endif

static inline uint16_t relu_bwd_half1(uint16_t g, uint16_t y, int16_t lo, int16_t hi) {
    int16_t v = (int16_t)y;
    return v >= lo && v <= hi ? g : 0;
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw"))) static void relu_bwd_half_avx512(uint16_t *dx, const uint16_t *g,
                                                                            const uint16_t *y, int64_t n,
                                                                            int16_t lo, int16_t hi) {
    const __m512i vlo = _mm512_set1_epi16(lo), vhi = _mm512_set1_epi16(hi);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i v = _mm512_loadu_si512((const void *)(y + i));
        __mmask32 m = _mm512_cmpge_epi16_mask(v, vlo) & _mm512_cmple_epi16_mask(v, vhi);
        _mm512_storeu_si512((void *)(dx + i), _mm512_maskz_loadu_epi16(m, g + i));
    }
    for (; i < n; i++) dx[i] = relu_bwd_half1(g[i], y[i], lo, hi);
}
#endif

static void relu_bwd_range(void *ctx, int64_t begin, int64_t end) {
    const relu_job *j = ctx;
    if (j->half) {
        uint16_t *dx = (uint16_t *)j->dx + begin;
        const uint16_t *g = (const uint16_t *)j->g + begin, *y = (const uint16_t *)j->y + begin;
#if defined(__x86_64__)
        if (j->avx512) {
            relu_bwd_half_avx512(dx, g, y, end - begin, j->lo, j->hi);
            return;
        }
#endif
        for (int64_t i = 0; i < end - begin; i++) dx[i] = relu_bwd_half1(g[i], y[i], j->lo, j->hi);
        return;
    }
    if (j->f64) {
        double *dx = (double *)j->dx;
        const double *g = (const double *)j->g, *y = (const double *)j->y;
        for (int64_t i = begin; i < end; i++) dx[i] = y[i] > 0 ? g[i] : 0.0;
        return;
    }
    float *dx = (float *)j->dx + begin;
    const float *g = (const float *)j->g + begin, *y = (const float *)j->y + begin;
#if defined(__x86_64__)
    if (j->avx512) {
        relu_bwd_avx512(dx, g, y, end - begin);
        return;
    }
#endif
    for (int64_t i = 0; i < end - begin; i++) dx[i] = y[i] > 0 ? g[i] : 0.0f;
}

static bool have_avx512(bool bw) {
#if defined(__x86_64__)
    static atomic_int have = -1, have_bw = -1; /* threads racing on first use all compute the same */
    atomic_int *slot = bw ? &have_bw : &have;
    int h = atomic_load_explicit(slot, memory_order_relaxed);
    if (h < 0) {
        h = bw ? __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               : __builtin_cpu_supports("avx512f");
        atomic_store_explicit(slot, h, memory_order_relaxed);
    }
    return h;
#else
    (void)bw;
    return false;
#endif
}

em_status em__cpu_relu_backward(const em_op_call *call) {
    em_tensor *dx = call->dst[0];
    const em_tensor *g = call->src[0], *y = call->src[1];
    em_dtype dt = y->dtype;
    if ((dt != EM_F32 && dt != EM_F64 && dt != EM_BF16 && dt != EM_F16) || g->dtype != dt || dx->dtype != dt)
        return em_error(EM_ERR_INTERNAL, "cpu: relu_backward expects f32/f64/bf16/f16 operands of one dtype");
    bool half = dt == EM_BF16 || dt == EM_F16;
    relu_job j = {em__host_ptr(dx), em__host_ptr(g), em__host_ptr(y), dt == EM_F64,
                  half ? have_avx512(true) : dt == EM_F32 && have_avx512(false), half,
                  (int16_t)(dt == EM_BF16 && em_get_flush_denormal() ? 0x0080 : 0x0001),
                  (int16_t)(dt == EM_BF16 ? 0x7F80 : 0x7C00)};
    em__cpu_parallel_for(em__cpu_numel(y), EM_CPU_PARALLEL_ELEMS, relu_bwd_range, &j);
    return EM_OK;
}

/* ReLU's forward on contiguous bf16 (a bf16 Linear's output under autocast) straight
 * on the bits, 32 lanes with AVX-512BW, instead of converting blocks to float32 and back: the
 * same bits as that path (v < 0 ? 0 : v in float32, then round to bf16): negative non-NaN
 * values give +0, -0 stays -0, NaN comes back quiet (| 0x40, as emk_f32_to_bf16 makes it).
 * With denormals flushed the float compare reads a negative subnormal as zero: the caller
 * keeps the float32 path then (em__cpu_relu_bf16_applies). */
static inline uint16_t relu_bf16_1(uint16_t v) {
    uint16_t a = v & 0x7FFF;
    if (a > 0x7F80) return v | 0x40;      /* NaN */
    return (v & 0x8000) && a ? 0 : v;     /* negative, -0 kept */
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw"))) static void relu_bf16_avx512(uint16_t *o, const uint16_t *x, int64_t n) {
    const __m512i mag = _mm512_set1_epi16(0x7FFF), inf = _mm512_set1_epi16(0x7F80), quiet = _mm512_set1_epi16(0x40),
                  zero = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i)), a = _mm512_and_si512(v, mag);
        __mmask32 nan = _mm512_cmpgt_epi16_mask(a, inf); /* a <= 0x7FFF: signed compare is fine */
        __mmask32 neg = _mm512_cmplt_epi16_mask(v, zero) & _mm512_cmpgt_epi16_mask(a, zero) & ~nan;
        v = _mm512_mask_mov_epi16(v, nan, _mm512_or_si512(v, quiet));
        _mm512_storeu_si512((void *)(o + i), _mm512_maskz_mov_epi16(~neg, v));
    }
    for (; i < n; i++) o[i] = relu_bf16_1(x[i]);
}
#endif

typedef struct relu_fwd_job {
    uint16_t *o;
    const uint16_t *x;
    bool avx512;
} relu_fwd_job;

static void relu_fwd_range(void *ctx, int64_t begin, int64_t end) {
    const relu_fwd_job *j = ctx;
#if defined(__x86_64__)
    if (j->avx512) {
        relu_bf16_avx512(j->o + begin, j->x + begin, end - begin);
        return;
    }
#endif
    for (int64_t i = begin; i < end; i++) j->o[i] = relu_bf16_1(j->x[i]);
}

bool em__cpu_relu_bf16_applies(const em_tensor *out, const em_tensor *in) {
    return in->dtype == EM_BF16 && out->dtype == EM_BF16 && !em_get_flush_denormal() && em__cpu_is_contiguous(in) &&
           em__cpu_is_contiguous(out) && em__cpu_numel(in) == em__cpu_numel(out);
}

void em__cpu_relu_bf16(em_tensor *out, const em_tensor *in) {
    relu_fwd_job j = {em__host_ptr(out), em__host_ptr(in), have_avx512(true)};
    em__cpu_parallel_for(em__cpu_numel(out), EM_CPU_PARALLEL_ELEMS, relu_fwd_range, &j);
}
