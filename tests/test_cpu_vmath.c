/* The vectorized float32 kernels (src/backends/cpu/cpu_vmath.c), for every instruction set
 * this CPU runs, against double precision: erf over a dense sweep of float bit patterns
 * (every 61st float from 0 to 6, both signs, every float around the two branch points), exp
 * over [-110, 90], special values (+-0, +-inf, NaN, subnormals), GELU and its backward, and
 * softmax / log-softmax rows of odd lengths, in place, with -inf and NaN entries, and
 * LayerNorm rows forward and backward, softmax's backward rows. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include "backends/cpu/cpu_vmath.h"
#include "test.h"

static const char *const g_sets[] = {"scalar", "avx2", "avx512"};

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* |got - want| in units of the float spacing at want (subnormal spacing below FLT_MIN) */
static double ulps(float got, double want) {
    float w = (float)want;
    double sp = fabs(w) < FLT_MIN ? (double)FLT_TRUE_MIN : (double)nextafterf(fabsf(w), INFINITY) - fabsf(w);
    if (isinf(w)) return got == w ? 0 : INFINITY;
    return fabs((double)got - want) / sp;
}

#define SWEEP 4096
/* runs f over xs[0..n) in chunks of odd sizes (every tail length), returns the worst ulp
 * against ref, reporting the first input past tol */
static double sweep(void (*f)(const float *, float *, int64_t), double (*ref)(double), const float *xs, int64_t n,
                    double tol, const char *what) {
    static float out[SWEEP];
    double worst = 0;
    bool reported = false;
    for (int64_t i = 0; i < n;) {
        int64_t m = n - i < SWEEP - 3 ? n - i : SWEEP - 3 - (i / SWEEP) % 17; /* odd chunk sizes */
        f(xs + i, out, m);
        for (int64_t k = 0; k < m; k++) {
            double u = ulps(out[k], ref(xs[i + k]));
            if (u > worst) worst = u;
            if (!(u <= tol) && !reported) {
                fprintf(stderr, "  %s(%.9g) = %.9g, expected %.9g (%.2f ulp)\n", what, xs[i + k], out[k], ref(xs[i + k]), u);
                reported = true;
            }
        }
        i += m;
    }
    return worst;
}

static void test_erf_sweep(void) {
    /* positive floats up to 6 (erf is 1 in float from 3.92), every 61st bit pattern, both signs */
    uint32_t top = 0x40C00000u; /* 6.0f */
    int64_t n = 0, cap = 2 * (int64_t)(top / 61 + 1) + 2 * 2 * 60000;
    float *xs = malloc(sizeof(float) * (size_t)cap);
    CHECK(xs != NULL);
    if (!xs) return;
    for (uint32_t u = 0; u < top; u += 61) {
        xs[n++] = from_bits(u);
        xs[n++] = -from_bits(u);
    }
    /* every float within about 0.03 of the two branch points (1.125 and the clamp at 3.921875) */
    const float edges[2] = {1.125f, 3.921875f};
    for (int e = 0; e < 2; e++) {
        float v = edges[e];
        for (int k = 0; k < 60000; k++) v = nextafterf(v, 0);
        for (int k = 0; k < 120000; k++, v = nextafterf(v, INFINITY)) xs[n++] = v;
    }
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) {
            printf("  (%s: not on this CPU)\n", g_sets[s]);
            continue;
        }
        double worst = sweep(em__cpu_verf_f32, erf, xs, n, 2.0, "erf");
        printf("  erf %-6s worst %.3f ulp over %lld floats\n", g_sets[s], worst, (long long)n);
        CHECK(worst <= 2.0);
    }
    free(xs);
}

static void test_erf_special(void) {
    float x[9] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_TRUE_MIN, -FLT_MIN, 1e-30f, 100.0f}, y[9];
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        em__cpu_verf_f32(x, y, 9);
        CHECK(y[0] == 0 && !signbit(y[0]) && y[1] == 0 && signbit(y[1]));
        CHECK(y[2] == 1.0f && y[3] == -1.0f && isnan(y[4]) && y[8] == 1.0f);
        CHECK(ulps(y[6], erf((double)x[6])) <= 2 && ulps(y[7], erf((double)x[7])) <= 2);
        CHECK(fabs(y[5] - erf((double)x[5])) <= 2 * (double)FLT_TRUE_MIN);
        em__cpu_verf_f32(x, x + 0, 0); /* n = 0 writes nothing */
        CHECK(x[0] == 0.0f);
    }
}

static void test_exp_sweep(void) {
    int64_t n = 0, cap = 2000000 + 16;
    float *xs = malloc(sizeof(float) * (size_t)cap);
    CHECK(xs != NULL);
    if (!xs) return;
    for (int64_t i = 0; i < 2000000; i++) xs[n++] = -110.0f + 200.0f * (float)i / 2000000.0f;
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        float *y = malloc(sizeof(float) * (size_t)n);
        CHECK(y != NULL);
        if (!y) break;
        em__cpu_vexp_f32(xs, y, n);
        double worst = 0, worst_sub = 0;
        for (int64_t i = 0; i < n; i++) {
            double want = exp((double)xs[i]);
            if (want > FLT_MAX) { /* overflow is inf */
                if (!(isinf(y[i]) && y[i] > 0)) worst = INFINITY;
            } else if (want >= FLT_MIN) {
                double u = ulps(y[i], want);
                worst = u > worst ? u : worst;
            } else {
                double d = fabs((double)y[i] - want) / FLT_TRUE_MIN;
                worst_sub = d > worst_sub ? d : worst_sub;
            }
        }
        printf("  exp %-6s worst %.3f ulp (normal), %.2f x 2^-149 (subnormal)\n", g_sets[s], worst, worst_sub);
        CHECK(worst <= 2.0);
        CHECK(worst_sub <= 2.0);
        float sp[5] = {-INFINITY, INFINITY, NAN, 0.0f, -200.0f};
        em__cpu_vexp_f32(sp, sp, 5); /* in place */
        CHECK(sp[0] == 0 && isinf(sp[1]) && sp[1] > 0 && isnan(sp[2]) && sp[3] == 1.0f && sp[4] == 0);
        free(y);
    }
    free(xs);
}

static double gelu_ref(double v) { return 0.5 * v * (1 + erf(v / sqrt(2.0))); }
static double gelu_grad_ref(double v) { return 0.5 * (1 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2 * M_PI); }

static void test_gelu(void) {
    enum { N = 20003 }; /* odd: a partial last vector */
    static float x[N], g[N], y[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / N;
        g[i] = 0.5f + (float)(i % 7) / 7.0f;
    }
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        em__cpu_vgelu_f32(x, y, N);
        em__cpu_vgelu_backward_f32(g, x, dx, N);
        double wf = 0, wb = 0;
        for (int i = 0; i < N; i++) {
            /* errors in eps of the result, or of x (and g) where 1 + erf cancels (x << 0), as in
             * the scalar formula */
            double ef = fabs(y[i] - gelu_ref(x[i])) / ((fabs(gelu_ref(x[i])) + fabs(x[i])) * FLT_EPSILON + FLT_TRUE_MIN);
            double rb = g[i] * gelu_grad_ref(x[i]);
            double eb = fabs(dx[i] - rb) / ((fabs(rb) + fabs(g[i])) * FLT_EPSILON);
            wf = ef > wf ? ef : wf;
            wb = eb > wb ? eb : wb;
        }
        printf("  gelu %-6s worst %.2f eps forward, %.2f eps backward\n", g_sets[s], wf, wb);
        CHECK(wf <= 8);
        CHECK(wb <= 8);
        float sp[3] = {NAN, INFINITY, -INFINITY}, o[3];
        em__cpu_vgelu_f32(sp, o, 3);
        CHECK(isnan(o[0]) && isinf(o[1]) && o[1] > 0 && isnan(o[2])); /* -inf * 0, as 0.5 x (1 + erf) gives */
        memcpy(o, g, sizeof o);
        em__cpu_vgelu_backward_f32(o, x, o, 3); /* in place over g */
        for (int i = 0; i < 3; i++) CHECK(fabs(o[i] - g[i] * gelu_grad_ref(x[i])) <= 1e-6);
    }
}

static void softmax_ref(const float *x, double *y, int n, bool lg) {
    double m = -INFINITY, s = 0;
    for (int k = 0; k < n; k++) m = x[k] > m ? x[k] : m;
    for (int k = 0; k < n; k++) s += exp(x[k] - m);
    for (int k = 0; k < n; k++) y[k] = lg ? (x[k] - m) - log(s) : exp(x[k] - m) / s;
}

static void test_softmax_rows(void) {
    static const int lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 1000};
    float x[1000], y[1000];
    double r[1000];
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li];
            for (int lg = 0; lg < 2; lg++) {
                for (int k = 0; k < n; k++) x[k] = (float)(7.3 * sin(k * 1.7 + n)) + (k % 5 == 3 ? -INFINITY : 0);
                if (n == 1) x[0] = 0.25f;
                softmax_ref(x, r, n, lg);
                em__cpu_vsoftmax_row_f32(x, y, n, lg);
                double worst = 0, sum = 0;
                for (int k = 0; k < n; k++) {
                    double d = lg ? (isinf(r[k]) ? (y[k] == r[k] ? 0 : INFINITY) : fabs(y[k] - r[k]) / (1 + fabs(r[k])))
                                  : fabs(y[k] - r[k]);
                    worst = d > worst ? d : worst;
                    sum += lg ? 0 : y[k];
                }
                CHECK(worst <= 4 * FLT_EPSILON);
                if (!lg) CHECK(fabs(sum - 1) <= 1e-5);
                memcpy(y, x, sizeof(float) * (size_t)n); /* in place gives the same */
                em__cpu_vsoftmax_row_f32(y, y, n, lg);
                float y2[1000];
                em__cpu_vsoftmax_row_f32(x, y2, n, lg);
                CHECK(memcmp(y, y2, sizeof(float) * (size_t)n) == 0);
            }
        }
        /* a NaN makes the row NaN; a row of -inf is NaN too (as 0 / 0 in PyTorch) */
        for (int k = 0; k < 17; k++) x[k] = (float)k;
        x[16] = NAN;
        em__cpu_vsoftmax_row_f32(x, y, 17, false);
        bool all_nan = true;
        for (int k = 0; k < 17; k++) all_nan &= isnan(y[k]);
        CHECK(all_nan);
        for (int k = 0; k < 5; k++) x[k] = -INFINITY;
        em__cpu_vsoftmax_row_f32(x, y, 5, false);
        CHECK(isnan(y[0]) && isnan(y[4]));
    }
}

/* LayerNorm rows against double precision: odd lengths (tails), a constant row (variance 0) */
static void test_layer_norm_rows(void) {
    static const int lens[] = {1, 7, 16, 17, 100, 128, 515};
    float x[515], w[515], b[515], g[515], y[515], dx[515], gx[515], mean, rstd;
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li];
            for (int cst = 0; cst < 2; cst++) {
                for (int k = 0; k < n; k++) {
                    x[k] = cst ? 3.5f : (float)(100 + 2 * sin(k * 0.37 + n)); /* a large mean */
                    w[k] = 0.5f + (float)(k % 3);
                    b[k] = (float)(k % 4) - 1.5f;
                    g[k] = (float)cos(k * 0.91);
                }
                double m = 0, v = 0, eps = 1e-5;
                for (int k = 0; k < n; k++) m += x[k];
                m /= n;
                for (int k = 0; k < n; k++) v += (x[k] - m) * (x[k] - m);
                double rs = 1 / sqrt(v / n + eps), a = 0, d = 0;
                em__cpu_vln_row_f32(x, w, b, y, n, eps, &mean, &rstd);
                CHECK(fabs(mean - m) <= 1e-6 * fabs(m) && fabs(rstd - rs) <= 1e-6 * rs);
                double worst = 0;
                for (int k = 0; k < n; k++) {
                    double xh = (x[k] - m) * rs, ref = xh * w[k] + b[k];
                    double e = fabs(y[k] - ref) / (1 + fabs(ref));
                    worst = e > worst ? e : worst;
                    a += g[k] * w[k];
                    d += g[k] * w[k] * xh;
                }
                CHECK(worst <= 1e-4); /* x - mean in float loses digits of a mean of 100 */
                em__cpu_vln_backward_row_f32(x, w, g, dx, gx, n, eps);
                worst = 0;
                for (int k = 0; k < n; k++) {
                    double xh = (x[k] - m) * rs, rdx = rs * (g[k] * w[k] - a / n - xh * d / n);
                    double e1 = fabs(dx[k] - rdx) / (rs * (1 + fabs(g[k] * w[k]))), e2 = fabs(gx[k] - g[k] * xh) / (1 + fabs(xh));
                    worst = e1 > worst ? e1 : worst;
                    worst = e2 > worst ? e2 : worst;
                }
                CHECK(worst <= 1e-4);
            }
        }
    }
}

/* softmax's backward rows against double: dx = y (g - sum g y); log: dx = g - exp(y) sum g */
static void test_softmax_backward_rows(void) {
    static const int lens[] = {1, 15, 16, 17, 64, 100};
    float g[100], y[100], dx[100];
    for (int s = 0; s < 3; s++) {
        if (!em__cpu_vmath_use(g_sets[s])) continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li];
            for (int lg = 0; lg < 2; lg++) {
                float x[100];
                for (int k = 0; k < n; k++) {
                    x[k] = (float)(3 * sin(k * 0.77 + n));
                    g[k] = (float)cos(k * 1.3 + lg);
                }
                em__cpu_vsoftmax_row_f32(x, y, n, lg);
                double sum = 0;
                for (int k = 0; k < n; k++) sum += lg ? g[k] : (double)g[k] * y[k];
                em__cpu_vsoftmax_backward_row_f32(g, y, dx, n, lg);
                double worst = 0;
                for (int k = 0; k < n; k++) {
                    double ref = lg ? g[k] - exp((double)y[k]) * sum : y[k] * (g[k] - sum);
                    double e = fabs(dx[k] - ref) / (1 + fabs(sum));
                    worst = e > worst ? e : worst;
                }
                CHECK(worst <= 4 * FLT_EPSILON);
                float g2[100];
                memcpy(g2, g, sizeof(float) * (size_t)n);
                em__cpu_vsoftmax_backward_row_f32(g2, y, g2, n, lg); /* in place over g */
                CHECK(memcmp(g2, dx, sizeof(float) * (size_t)n) == 0);
            }
        }
    }
}

int main(void) {
    RUN(test_erf_sweep);
    RUN(test_erf_special);
    RUN(test_exp_sweep);
    RUN(test_gelu);
    RUN(test_softmax_rows);
    RUN(test_layer_norm_rows);
    RUN(test_softmax_backward_rows);
    return test_summary();
}
