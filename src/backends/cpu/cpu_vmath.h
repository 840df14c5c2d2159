/* Vectorized float32 exp and erf, and the kernels built on them that the transformer spends
 * its time in: GELU forward and backward, softmax rows. Written once (cpu_vmath_impl.h) and
 * compiled for AVX-512 and AVX2+FMA; the best set this CPU runs is picked at first use, and
 * without either (or on another architecture) the scalar libm loops run instead.
 * Accuracy (tests/test_cpu_vmath.c sweeps it against double precision): erf within 2 ulp,
 * exp within 2 ulp over the normal range (subnormal results are within 2^-148). */
#ifndef EM_BACKENDS_CPU_VMATH_H
#define EM_BACKENDS_CPU_VMATH_H

#include <stdbool.h>
#include <stdint.h>

/* y[i] = f(x[i]) for i < n; y may equal x (in place), otherwise they do not overlap. */
void em__cpu_vexp_f32(const float *x, float *y, int64_t n);
void em__cpu_verf_f32(const float *x, float *y, int64_t n);
/* GELU (exact, erf): y = x / 2 * (1 + erf(x / sqrt 2)) */
void em__cpu_vgelu_f32(const float *x, float *y, int64_t n);
/* its backward: dx = g * (Phi(x) + x * phi(x)); dx may equal g or x */
void em__cpu_vgelu_backward_f32(const float *g, const float *x, float *dx, int64_t n);
/* one softmax (or log-softmax) row of n contiguous floats; y may equal x. The sum is kept
 * in double, as the scalar path does. */
void em__cpu_vsoftmax_row_f32(const float *x, float *y, int64_t n, bool log);
/* LayerNorm of one row of n > 0 floats (cpu_norm.c's rows): y = (x - mean) * rstd * w + b with
 * the mean and 1 / sqrt(var + eps) computed in double and returned as floats; and its
 * backward: dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)), gx = g * xhat. */
void em__cpu_vln_row_f32(const float *x, const float *w, const float *b, float *y, int64_t n, double eps, float *mean,
                         float *rstd);
void em__cpu_vln_backward_row_f32(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                  double eps);
/* softmax's backward on one row of n floats from its output y: dx = y * (g - sum(g * y)), or
 * for log-softmax dx = g - exp(y) * sum(g); the sum in double. dx may equal g. */
void em__cpu_vsoftmax_backward_row_f32(const float *g, const float *y, float *dx, int64_t n, bool log);

/* The language models' rows (cpu_lm.c). The sum of x^2 in double; an RMSNorm row
 * y = (x * inv) * w (x * inv without w; y may equal x) and its backward, xhat = x * inv,
 * gw = g * w (g without w): dx = inv * (gw - xhat * mean(gw * xhat)), gx = g * xhat (gx may
 * be NULL). SwiGLU: y = silu(a) * b (silu(a) without b; y may equal a or b) and its backward,
 * s = sigmoid(a): db = g * a * s, da = g * b * s * (1 + a * (1 - s)) (da may equal a, db b). */
double em__cpu_vsumsq_f32(const float *x, int64_t n);
void em__cpu_vrms_row_f32(const float *x, const float *w, float *y, int64_t n, float inv);
void em__cpu_vrms_backward_row_f32(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                   float inv);
void em__cpu_vswiglu_f32(const float *a, const float *b, float *y, int64_t n);
void em__cpu_vswiglu_backward_f32(const float *g, const float *a, const float *b, float *da, float *db, int64_t n);

/* "avx512", "avx2" or "scalar": the set in use (EMBER_CPU_VMATH=scalar|avx2|avx512 asks
 * for a lower one; one this CPU lacks is ignored). em__cpu_vmath_use switches (tests compare
 * them) and returns false, keeping the current one, when this CPU lacks that set. */
const char *em__cpu_vmath_isa(void);
bool em__cpu_vmath_use(const char *isa);

#endif
