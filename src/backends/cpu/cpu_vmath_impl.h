/* The vector kernels of cpu_vmath.c, written once over a few macros and included once per
 * instruction set, which cpu_vmath.c defines before each inclusion:
 *   V, VM, VI          float vector, comparison mask, int32 vector;  W lanes
 *   ATTR, VF(name)     the target attribute, the per-set function name
 *   VLOAD VSTORE VSET VADD VSUB VMUL VDIV VFMA(a, b, c) = a * b + c, VMIN VMAX VROUND (to nearest),
 *   VRCP (an approximate reciprocal: 12 bits or more)
 *   VLT VGE VGT VNAN VMAND (masks), VSEL(m, t, f) (t where m), VTOI VIADD VISUB VISRA VISLL VISET VFROMI
 *   VD, VDZERO, VDACC(acc, v) (adds v's lanes to a double accumulator), VDSUM(acc)
 * No file but cpu_vmath.c includes this one. The per-vector helpers are always inlined: out
 * of line (GCC's choice once erf grew) they cost a call with spilled vectors per element
 * block, measured at 10% of a GPT step. */
#define VINLINE __attribute__((always_inline))

/* e^r by its Taylor series to r^7 (|r| <= ln 2 / 2: error below 2^-27), times 2^n in two
 * factors (n from -150 to 128 fits neither one exponent field nor, below -126, a normal) */
ATTR VINLINE static inline V VF(exp_scaled)(V yc) {
    V n = VROUND(VMUL(yc, VSET(0x1.715476p+0f)));
    V r = VFMA(n, VSET(-0x1.62e400p-1f), yc); /* ln 2 in two parts: n * hi is exact */
    r = VFMA(n, VSET(-0x1.7f7d1cp-20f), r);
    V p = VSET(1.0f / 5040);
    p = VFMA(p, r, VSET(1.0f / 720));
    p = VFMA(p, r, VSET(1.0f / 120));
    p = VFMA(p, r, VSET(1.0f / 24));
    p = VFMA(p, r, VSET(1.0f / 6));
    p = VFMA(p, r, VSET(0.5f));
    p = VFMA(p, r, VSET(1.0f));
    p = VFMA(p, r, VSET(1.0f));
    VI ni = VTOI(n), n1 = VISRA(ni, 1), n2 = VISUB(ni, n1);
    V s1 = VFROMI(VISLL(VIADD(n1, VISET(127)), 23)), s2 = VFROMI(VISLL(VIADD(n2, VISET(127)), 23));
    return VMUL(VMUL(p, s1), s2);
}

/* exp(y) for every float: y above log(FLT_MAX) gives inf, below -104 zero, NaN stays NaN.
 * Inputs are clamped to where the result is a normal float: a subnormal result costs the
 * CPU a microcode assist of ~100 cycles, and masked attention scores (-inf) are common.
 * Only a vector with some y in [-104, -87.33) takes the second, subnormal-producing pass. */
ATTR VINLINE static inline V VF(exp_v)(V y) {
    V e = VF(exp_scaled)(VMIN(VMAX(y, VSET(-87.33f)), VSET(0x1.62e430p+6f)));
    VM sub = VMAND(VLT(y, VSET(-87.33f)), VGE(y, VSET(-104.0f)));
    if (VANY(sub)) e = VSEL(sub, VF(exp_scaled)(VMAX(y, VSET(-104.0f))), e);
    e = VSEL(VGT(y, VSET(0x1.62e430p+6f)), VSET(INFINITY), e);
    e = VSEL(VLT(y, VSET(-104.0f)), VSET(0.0f), e);
    return VSEL(VNAN(y), y, e);
}

/* erf(x): below |x| = 1.125, x + x Q(x^2) (Q of degree 7); above, sign(x) (1 - exp(R(|x|))),
 * R of degree 8 in |x| - 2.5234375 approximating log(erfc(|x|)) up to 3.921875, past which
 * erf(x) rounds to +-1 in float. Coefficients: scripts/fit_vmath.py (least squares refined
 * towards minimax, rounded to float). */
ATTR VINLINE static inline V VF(erf_v)(V x) {
    V s = VMUL(x, x);
    V q = VSET(-0x1.224fa2p-17f);
    q = VFMA(q, s, VSET(0x1.c8ea72p-14f));
    q = VFMA(q, s, VSET(-0x1.ba00f0p-11f));
    q = VFMA(q, s, VSET(0x1.55ea88p-8f));
    q = VFMA(q, s, VSET(-0x1.b823fcp-6f));
    q = VFMA(q, s, VSET(0x1.ce2ecap-4f));
    q = VFMA(q, s, VSET(-0x1.812746p-2f));
    q = VFMA(q, s, VSET(0x1.06eba8p-3f));
    V small = VFMA(x, q, x);
    V a = VMAX(x, VSUB(VSET(0.0f), x));
    V u = VSUB(VMIN(a, VSET(3.921875f)), VSET(2.5234375f));
    V r = VSET(0x1.b1fab4p-20f);
    r = VFMA(r, u, VSET(-0x1.b2e452p-17f));
    r = VFMA(r, u, VSET(0x1.3b8942p-14f));
    r = VFMA(r, u, VSET(-0x1.ad73d4p-12f));
    r = VFMA(r, u, VSET(0x1.156beap-9f));
    r = VFMA(r, u, VSET(-0x1.5d3b3ap-7f));
    r = VFMA(r, u, VSET(-0x1.e3a92cp-1f));
    r = VFMA(r, u, VSET(-0x1.596786p+2f));
    r = VFMA(r, u, VSET(-0x1.fbb2cap+2f));
    V big = VSUB(VSET(1.0f), VF(exp_scaled)(r)); /* r in [-17, -1.5]: no guards needed */
    big = VSEL(VLT(x, VSET(0.0f)), VSUB(VSET(0.0f), big), big);
    V e = VSEL(VLT(a, VSET(1.125f)), small, big);
    return VSEL(VNAN(x), x, e);
}

/* GELU's Phi(x) = (1 + erf(x / sqrt 2)) / 2 and *e = e^(-x^2 / 2) (phi's exponential, which
 * backward needs too): with z = |x| / sqrt 2, erfc(z) = t P(t) e^(-z^2), t = 1 / (1 + p z)
 * (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7, as PyTorch's vectorized erf), so Phi is
 * erfc(z) / 2 below 0 (no cancellation) and 1 - erfc(z) / 2 above, for one exponential, a
 * reciprocal and a degree-4 polynomial instead of erf_v's two polynomials and exponential
 * (bench_transformer_ops times GELU against PyTorch's). */
ATTR VINLINE static inline V VF(gelu_phi)(V x, V *e) {
    V a = VMAX(x, VSUB(VSET(0.0f), x));
    V d = VFMA(a, VSET(0.3275911f * 0x1.6a09e6p-1f), VSET(1.0f)); /* 1 + p z */
    V t = VRCP(d);
    t = VMUL(t, VFMA(VSUB(VSET(0.0f), d), t, VSET(2.0f))); /* one Newton step: float precision */
    V r = VSET(1.061405429f);
    r = VFMA(r, t, VSET(-1.453152027f));
    r = VFMA(r, t, VSET(1.421413741f));
    r = VFMA(r, t, VSET(-0.284496736f));
    r = VFMA(r, t, VSET(0.254829592f));
    /* -x^2 / 2 kept where e is a normal float; past |x| = 13.2 Phi(-|x|) < 2^-126 counts as 0
     * (so GELU(-inf) = -inf * 0 = NaN, as 0.5 x (1 + erf) gives; NaN stays NaN throughout) */
    *e = VF(exp_scaled)(VMAX(VMUL(VMUL(x, x), VSET(-0.5f)), VSET(-87.0f)));
    V tail = VMUL(VMUL(VMUL(r, t), *e), VSET(0.5f)); /* erfc(z) / 2 = Phi(-|x|) */
    tail = VSEL(VGT(a, VSET(13.2f)), VSET(0.0f), tail);
    *e = VSEL(VGT(a, VSET(13.2f)), VSET(0.0f), *e);
    return VSEL(VLT(x, VSET(0.0f)), tail, VSUB(VSET(1.0f), tail));
}

ATTR VINLINE static inline V VF(gelu_v)(V x) {
    V e;
    return VMUL(x, VF(gelu_phi)(x, &e));
}

ATTR VINLINE static inline V VF(gelu_bwd_v)(V g, V x) {
    V e, cdf = VF(gelu_phi)(x, &e);
    V pdf = VMUL(e, VSET(0x1.988454p-2f)); /* 1 / sqrt(2 pi) */
    return VMUL(g, VFMA(x, pdf, cdf));
}

/* whole vectors straight from memory; the last partial one through a padded buffer */
#define VM_UNARY(NAME, FN)                                                                    \
    ATTR static void VF(NAME)(const float *x, float *y, int64_t n) {                          \
        int64_t i = 0;                                                                        \
        for (; i + W <= n; i += W) VSTORE(y + i, FN(VLOAD(x + i)));                           \
        if (i < n) {                                                                          \
            float b[W] = {0};                                                                 \
            memcpy(b, x + i, sizeof(float) * (size_t)(n - i));                                \
            VSTORE(b, FN(VLOAD(b)));                                                          \
            memcpy(y + i, b, sizeof(float) * (size_t)(n - i));                                \
        }                                                                                     \
    }
VM_UNARY(exp_n, VF(exp_v))
VM_UNARY(erf_n, VF(erf_v))
VM_UNARY(gelu_n, VF(gelu_v))
#undef VM_UNARY

ATTR static void VF(gelu_bwd_n)(const float *g, const float *x, float *dx, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) VSTORE(dx + i, VF(gelu_bwd_v)(VLOAD(g + i), VLOAD(x + i)));
    if (i < n) {
        float bg[W] = {0}, bx[W] = {0};
        memcpy(bg, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(bx, x + i, sizeof(float) * (size_t)(n - i));
        VSTORE(bg, VF(gelu_bwd_v)(VLOAD(bg), VLOAD(bx)));
        memcpy(dx + i, bg, sizeof(float) * (size_t)(n - i));
    }
}

/* A softmax row; false (nothing written) when the row holds a NaN, which the scalar row
 * handles. The partial last vector is padded with -inf: it adds nothing to the max or the sum. */
ATTR static bool VF(softmax_row)(const float *x, float *y, int64_t n, bool lg) {
    int64_t full = n / W * W, rest = n - full;
    float pad[W];
    if (rest)
        for (int k = 0; k < W; k++) pad[k] = k < rest ? x[full + k] : -INFINITY;
    V m = VSET(-INFINITY);
    bool nan = false;
    for (int64_t i = 0; i < full; i += W) {
        V v = VLOAD(x + i);
        nan |= VANY(VNAN(v));
        m = VMAX(m, v);
    }
    if (rest) {
        V v = VLOAD(pad);
        nan |= VANY(VNAN(v));
        m = VMAX(m, v);
    }
    if (nan) return false;
    float lanes[W];
    VSTORE(lanes, m);
    float mx = lanes[0];
    for (int k = 1; k < W; k++) mx = lanes[k] > mx ? lanes[k] : mx;
    V vm = VSET(mx);
    VD acc0 = VDZERO, acc1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V e = VF(exp_v)(VSUB(VLOAD(x + i), vm));
        if (!lg) VSTORE(y + i, e);
        VDACC(acc0, acc1, e);
    }
    if (rest) {
        V e = VF(exp_v)(VSUB(VLOAD(pad), vm));
        if (!lg) VSTORE(pad, e);
        VDACC(acc0, acc1, e);
    }
    double s = VDSUM(acc0) + VDSUM(acc1);
    if (lg) { /* (x - max) - log(sum) */
        float lsf = (float)log(s);
        V ls = VSET(lsf);
        for (int64_t i = 0; i < full; i += W) VSTORE(y + i, VSUB(VSUB(VLOAD(x + i), vm), ls));
        for (int64_t i = full; i < n; i++) y[i] = (x[i] - mx) - lsf;
        return true;
    }
    V inv = VSET((float)(1 / s));
    for (int64_t i = 0; i < full; i += W) VSTORE(y + i, VMUL(VLOAD(y + i), inv));
    for (int64_t k = 0; k < rest; k++) y[full + k] = pad[k] * (float)(1 / s);
    return true;
}

/* LayerNorm rows (cpu_norm.c's steps in vectors): the mean and the variance of x - mean in
 * double, as the scalar rows; whole vectors here, the last n % W elements one by one. */
ATTR static void VF(moments)(const float *x, int64_t n, double eps, double *mean, double *rstd) {
    int64_t full = n / W * W;
    VD a0 = VDZERO, a1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) VDACC(a0, a1, VLOAD(x + i));
    double s = VDSUM(a0) + VDSUM(a1);
    for (int64_t i = full; i < n; i++) s += x[i];
    double m = n ? s / (double)n : 0;
    VD dm = VDSET(m);
    a0 = a1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V v = VLOAD(x + i);
        VD lo = VDSUBV(VDLO(v), dm), hi = VDSUBV(VDHI(v), dm);
        a0 = VDFMA(lo, lo, a0);
        a1 = VDFMA(hi, hi, a1);
    }
    double var = VDSUM(a0) + VDSUM(a1);
    for (int64_t i = full; i < n; i++) var += ((double)x[i] - m) * ((double)x[i] - m);
    *mean = m;
    *rstd = 1.0 / sqrt((n ? var / (double)n : 0) + eps);
}

ATTR static void VF(ln_fwd_row)(const float *x, const float *w, const float *b, float *y, int64_t n, double eps,
                                 float *mean, float *rstd) {
    double m, rs;
    VF(moments)(x, n, eps, &m, &rs);
    float tm = (float)m, trs = (float)rs;
    int64_t full = n / W * W;
    V vm = VSET(tm), vr = VSET(trs);
    for (int64_t i = 0; i < full; i += W)
        VSTORE(y + i, VADD(VMUL(VMUL(VSUB(VLOAD(x + i), vm), vr), VLOAD(w + i)), VLOAD(b + i)));
    for (int64_t i = full; i < n; i++) y[i] = (x[i] - tm) * trs * w[i] + b[i];
    *mean = tm;
    *rstd = trs;
}

/* dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)), gx = g * xhat */
ATTR static void VF(ln_bwd_row)(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                 double eps) {
    double m, rs;
    VF(moments)(x, n, eps, &m, &rs);
    float tm = (float)m, trs = (float)rs;
    int64_t full = n / W * W;
    V vm = VSET(tm), vr = VSET(trs);
    VD a0 = VDZERO, a1 = VDZERO, d0 = VDZERO, d1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V xh = VMUL(VSUB(VLOAD(x + i), vm), vr), gv = VLOAD(g + i), gw = VMUL(gv, VLOAD(w + i));
        VDACC(a0, a1, gw);
        d0 = VDFMA(VDLO(gw), VDLO(xh), d0); /* a product of two floats is exact in double */
        d1 = VDFMA(VDHI(gw), VDHI(xh), d1);
        VSTORE(gx + i, VMUL(gv, xh));
    }
    double a = VDSUM(a0) + VDSUM(a1), d = VDSUM(d0) + VDSUM(d1);
    for (int64_t i = full; i < n; i++) {
        float xh = (x[i] - tm) * trs, gw = g[i] * w[i];
        a += gw;
        d += (double)gw * xh;
        gx[i] = g[i] * xh;
    }
    float ta = (float)(a / (double)n), td = (float)(d / (double)n);
    V va = VSET(ta), vd = VSET(td);
    for (int64_t i = 0; i < full; i += W) {
        V xh = VMUL(VSUB(VLOAD(x + i), vm), vr);
        VSTORE(dx + i, VMUL(vr, VSUB(VSUB(VMUL(VLOAD(g + i), VLOAD(w + i)), va), VMUL(xh, vd))));
    }
    for (int64_t i = full; i < n; i++) {
        float xh = (x[i] - tm) * trs;
        dx[i] = trs * (g[i] * w[i] - ta - xh * td);
    }
}

/* softmax's backward on one row: dx = y * (g - sum(g * y)); log-softmax's (y its output):
 * dx = g - exp(y) * sum(g). The sum in double lanes; the last n % W elements one by one. */
ATTR static void VF(softmax_bwd_row)(const float *g, const float *y, float *dx, int64_t n, bool lg) {
    int64_t full = n / W * W;
    VD a0 = VDZERO, a1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V gv = VLOAD(g + i);
        if (lg) {
            VDACC(a0, a1, gv);
        } else {
            V yv = VLOAD(y + i);
            a0 = VDFMA(VDLO(gv), VDLO(yv), a0); /* a product of two floats is exact in double */
            a1 = VDFMA(VDHI(gv), VDHI(yv), a1);
        }
    }
    double s = VDSUM(a0) + VDSUM(a1);
    for (int64_t i = full; i < n; i++) s += lg ? (double)g[i] : (double)g[i] * y[i];
    float fs = (float)s;
    V vs = VSET(fs);
    for (int64_t i = 0; i < full; i += W) {
        V gv = VLOAD(g + i), yv = VLOAD(y + i);
        VSTORE(dx + i, lg ? VSUB(gv, VMUL(VF(exp_v)(yv), vs)) : VMUL(yv, VSUB(gv, vs)));
    }
    if (full < n) { /* the last n % W as one padded vector (a class head's 10 columns are all tail) */
        float pg[W] = {0}, py[W] = {0};
        memcpy(pg, g + full, sizeof(float) * (size_t)(n - full));
        memcpy(py, y + full, sizeof(float) * (size_t)(n - full));
        V gv = VLOAD(pg), yv = VLOAD(py);
        VSTORE(pg, lg ? VSUB(gv, VMUL(VF(exp_v)(yv), vs)) : VMUL(yv, VSUB(gv, vs)));
        memcpy(dx + full, pg, sizeof(float) * (size_t)(n - full));
    }
}

/* ---- the language models' rows (cpu_lm.c) ---- */

/* sum of x^2 in double lanes (the square of a float is exact in double) */
ATTR static double VF(sumsq)(const float *x, int64_t n) {
    int64_t full = n / W * W;
    VD a0 = VDZERO, a1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V v = VLOAD(x + i);
        a0 = VDFMA(VDLO(v), VDLO(v), a0);
        a1 = VDFMA(VDHI(v), VDHI(v), a1);
    }
    double s = VDSUM(a0) + VDSUM(a1);
    for (int64_t i = full; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

/* y = (x * inv) * w, or x * inv without w: two roundings, as PyTorch's two ops */
ATTR static void VF(rms_row)(const float *x, const float *w, float *y, int64_t n, float inv) {
    int64_t full = n / W * W;
    V vr = VSET(inv);
    if (w) {
        for (int64_t i = 0; i < full; i += W) VSTORE(y + i, VMUL(VMUL(VLOAD(x + i), vr), VLOAD(w + i)));
        for (int64_t i = full; i < n; i++) y[i] = (x[i] * inv) * w[i];
    } else {
        for (int64_t i = 0; i < full; i += W) VSTORE(y + i, VMUL(VLOAD(x + i), vr));
        for (int64_t i = full; i < n; i++) y[i] = x[i] * inv;
    }
}

/* xhat = x inv, gw = g w (g without w): dx = inv (gw - xhat mean(gw xhat)), gx = g xhat */
ATTR static void VF(rms_bwd_row)(const float *x, const float *w, const float *g, float *dx, float *gx, int64_t n,
                                  float inv) {
    int64_t full = n / W * W;
    V vr = VSET(inv);
    VD d0 = VDZERO, d1 = VDZERO;
    for (int64_t i = 0; i < full; i += W) {
        V xh = VMUL(VLOAD(x + i), vr), gv = VLOAD(g + i), gw = w ? VMUL(gv, VLOAD(w + i)) : gv;
        d0 = VDFMA(VDLO(gw), VDLO(xh), d0);
        d1 = VDFMA(VDHI(gw), VDHI(xh), d1);
        if (gx) VSTORE(gx + i, VMUL(gv, xh));
    }
    double d = VDSUM(d0) + VDSUM(d1);
    for (int64_t i = full; i < n; i++) {
        float xh = x[i] * inv, gw = w ? g[i] * w[i] : g[i];
        d += (double)gw * xh;
        if (gx) gx[i] = g[i] * xh;
    }
    V vd = VSET((float)(d / (double)n));
    float td = (float)(d / (double)n);
    for (int64_t i = 0; i < full; i += W) {
        V gv = VLOAD(g + i), gw = w ? VMUL(gv, VLOAD(w + i)) : gv;
        VSTORE(dx + i, VMUL(vr, VSUB(gw, VMUL(VMUL(VLOAD(x + i), vr), vd))));
    }
    for (int64_t i = full; i < n; i++) {
        float gw = w ? g[i] * w[i] : g[i];
        dx[i] = inv * (gw - (x[i] * inv) * td);
    }
}

/* silu(a) = a / (1 + e^-a), times b where given (y may be a or b) */
ATTR VINLINE static inline V VF(silu_v)(V a) {
    return VDIV(a, VADD(VSET(1.0f), VF(exp_v)(VSUB(VSET(0.0f), a))));
}
ATTR static void VF(swiglu_n)(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        V s = VF(silu_v)(VLOAD(a + i));
        VSTORE(y + i, b ? VMUL(s, VLOAD(b + i)) : s);
    }
    if (i < n) {
        float pa[W] = {0}, pb[W] = {0};
        memcpy(pa, a + i, sizeof(float) * (size_t)(n - i));
        if (b) memcpy(pb, b + i, sizeof(float) * (size_t)(n - i));
        V s = VF(silu_v)(VLOAD(pa));
        VSTORE(pa, b ? VMUL(s, VLOAD(pb)) : s);
        memcpy(y + i, pa, sizeof(float) * (size_t)(n - i));
    }
}

/* s = sigmoid(a): db = g a s, da = g b s (1 + a (1 - s)); da may be a, db may be b */
ATTR VINLINE static inline void VF(swiglu_bwd_v)(V g, V a, V b, V *da, V *db) {
    V one = VSET(1.0f);
    V s = VDIV(one, VADD(one, VF(exp_v)(VSUB(VSET(0.0f), a))));
    V gs = VMUL(g, s);
    *db = VMUL(gs, a);
    *da = VMUL(VMUL(gs, b), VFMA(a, VSUB(one, s), one));
}
ATTR static void VF(swiglu_bwd_n)(const float *g, const float *a, const float *b, float *da, float *db, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        V x, y;
        VF(swiglu_bwd_v)(VLOAD(g + i), VLOAD(a + i), VLOAD(b + i), &x, &y);
        VSTORE(da + i, x);
        VSTORE(db + i, y);
    }
    if (i < n) {
        float pg[W] = {0}, pa[W] = {0}, pb[W] = {0};
        size_t m = sizeof(float) * (size_t)(n - i);
        memcpy(pg, g + i, m);
        memcpy(pa, a + i, m);
        memcpy(pb, b + i, m);
        V x, y;
        VF(swiglu_bwd_v)(VLOAD(pg), VLOAD(pa), VLOAD(pb), &x, &y);
        VSTORE(pa, x);
        VSTORE(pb, y);
        memcpy(da + i, pa, m);
        memcpy(db + i, pb, m);
    }
}

#undef VINLINE
