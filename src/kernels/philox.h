/* Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11) and the contract every Ember backend follows to turn it into samples, so that the
 * same seed gives the same tensor on the CPU, OpenCL and CUDA.
 *
 * Written in a tiny C subset (uint32/uint64 integer math and float, no libc, no pointers
 * beyond small arrays) so OpenCL C and CUDA C kernels can include this same text: they
 * define EM_PHILOX_FN (e.g. `static __device__ __forceinline__`), the uint32_t/uint64_t
 * types and the unfused emk_mulf/emk_addf (emk_muld/emk_addd) before including it
 * (src/kernels/compat.h does).
 *
 * THE CONTRACT. A draw of n elements with (seed, offset) fills its output in row-major
 * order; element i uses one Philox block:
 *     c = offset + i (uint64)
 *     key     = (lo32(seed), hi32(seed))
 *     counter = (lo32(c), hi32(c), 0, 0)
 *     out[0..3] = philox4x32_10(counter, key)
 * and then, by kind (backend.h's em_rng_kind), with p0, p1 its parameters:
 *   uniform [p0, p1):  u = (out[0] >> 8) * 2^-24 (exact in float);
 *                      v = lo + u * (hi - lo) with lo = p0, hi = p1 in the compute type
 *                      (float for f32/f16/bf16, double for f64); if rounding gives v >= hi,
 *                      v = lo (keeps the interval half-open).
 *   normal (p0, p1):   v = em__normal_f32(out[0], out[1]) * p1 + p0 (f64: em__normal_f64 and
 *                      double math; f16/bf16: the f32 value), the Box-Muller transform
 *                      sqrt(-2 ln u1) * cos(2 pi u2) of u1 = ((out[0] >> 8) + 1) * 2^-24 in (0, 1]
 *                      and u2 = (out[1] >> 8) * 2^-24, computed below from float (double)
 *                      add, subtract and multiply, integer ops and comparisons only, so every
 *                      device gives the same bits (see em__normal_f32).
 *   randint [p0, p1):  r = p1 - p0 (int64, as uint64); v = p0 + (((uint64)out[1] << 32 | out[0]) % r)
 *                      in wrapping uint64 math (r == 0 gives p0).
 *   bernoulli (p0):    v = 1 if u < p0 (u as for uniform, compared in double) else 0.
 * Then v is converted to the output dtype (f16/bf16: round to nearest even from float).
 * Core advances the generator's offset by at least n after each draw. */
#ifndef EM_KERNELS_PHILOX_H
#define EM_KERNELS_PHILOX_H

#ifndef EM_PHILOX_FN
#include <stdint.h>
#define EM_PHILOX_FN static inline
#endif

#define EM_PHILOX_M0 0xD2511F53u /* multipliers */
#define EM_PHILOX_M1 0xCD9E8D57u
#define EM_PHILOX_W0 0x9E3779B9u /* Weyl key increments (golden ratio, sqrt(3) - 1) */
#define EM_PHILOX_W1 0xBB67AE85u

/* The block function: 4 words out of a 128-bit counter and a 64-bit key (k0 | k1 << 32). */
EM_PHILOX_FN void em__philox4x32_10(const uint32_t ctr[4], uint64_t key, uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)EM_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)EM_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += EM_PHILOX_W0;
        k1 += EM_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The block of element c (= offset + i) of a draw with this seed. */
EM_PHILOX_FN void em__philox_element(uint64_t seed, uint64_t c, uint32_t out[4]) {
    uint32_t ctr[4];
    ctr[0] = (uint32_t)c;
    ctr[1] = (uint32_t)(c >> 32);
    ctr[2] = 0;
    ctr[3] = 0;
    em__philox4x32_10(ctr, seed, out);
}

/* u = (w >> 8) * 2^-24 in [0, 1): 24 random bits, exact in float. */
EM_PHILOX_FN float em__philox_unit(uint32_t w) { return (float)(w >> 8) * 5.9604644775390625e-8f; }

/* ---------------------------------------------------------------- normal samples
 * Box-Muller with no libm: OpenCL lets float division and sqrt be inexact and every device's
 * log and cos differ in the last bits, but add, subtract and multiply round the same on all
 * IEEE hardware. So: ln u1 from the exponent of u1 (exact: (w >> 8) + 1 converts to float
 * exactly) plus a polynomial for log1p of the mantissa; sqrt by the inverse-sqrt bit-trick
 * seed, Newton steps and one correction whose residual is exact (Dekker's product);
 * cos(2 pi u2) by reducing u2's numerator to an octant exactly and polynomials for
 * sin/cos(pi/2 t) on t in [0, 1/2]. Polynomials: mpmath.chebyfit (tests/normal_coeffs.py).
 * Error against the exact value (tests/test_core_rng.c): radius and cos under 1 ulp each,
 * the product under 2.5 ulp. Every multiply and add goes through EM__MULF/EM__ADDF so that
 * no compiler fuses them into FMAs (which round differently): on the host they are
 * functions (clang contracts only within one expression) and the
 * library is built -std=c11 (GCC: -ffp-contract=off); kernels use compat.h's emk_mulf. */
#if defined(EMK_OPENCL) || defined(EMK_CUDA)
#define EM__MULF emk_mulf
#define EM__ADDF emk_addf
#define EM__MULD emk_muld
#define EM__ADDD emk_addd
#define EM__F2U AS_U32 /* bit casts */
#define EM__U2F AS_F32
#define EM__D2U AS_U64
#define EM__U2D AS_F64
#define EM__U64C EMK_U64C
#else
#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__) && defined(__FP_FAST_FMA)
#error "philox.h: GCC in GNU mode fuses across statements (-ffp-contract=fast); build with -std=c11"
#endif
EM_PHILOX_FN float em__mulf(float a, float b) { return a * b; }
EM_PHILOX_FN float em__addf(float a, float b) { return a + b; }
EM_PHILOX_FN double em__muld(double a, double b) { return a * b; }
EM_PHILOX_FN double em__addd(double a, double b) { return a + b; }
#define EM__MULF em__mulf
#define EM__ADDF em__addf
#define EM__MULD em__muld
#define EM__ADDD em__addd
EM_PHILOX_FN uint32_t em__f2u(float f) { union { float f; uint32_t u; } x; x.f = f; return x.u; }
EM_PHILOX_FN float em__u2f(uint32_t u) { union { float f; uint32_t u; } x; x.u = u; return x.f; }
EM_PHILOX_FN uint64_t em__d2u(double d) { union { double d; uint64_t u; } x; x.d = d; return x.u; }
EM_PHILOX_FN double em__u2d(uint64_t u) { union { double d; uint64_t u; } x; x.u = u; return x.d; }
#define EM__F2U em__f2u
#define EM__U2F em__u2f
#define EM__D2U em__d2u
#define EM__U2D em__u2d
#define EM__U64C(x) ((uint64_t)x##ull)
#endif
#define EM__SUBF(a, b) EM__ADDF((a), -(b))
#define EM__SUBD(a, b) EM__ADDD((a), -(b))
#define EM__HORF(p, x, c) p = EM__ADDF(EM__MULF(p, x), c) /* one Horner step */
#define EM__HORD(p, x, c) p = EM__ADDD(EM__MULD(p, x), c)

/* u1 = ((w >> 8) + 1) * 2^-24 = 2^n * (1 + f), f = fi * 2^-24 in [sqrt(1/2) - 1, sqrt(2) - 1]:
 * r[0] = n, r[1] = fi; exact. */
EM_PHILOX_FN void em__normal_log_reduce(uint32_t w, int32_t r[2]) {
    /* (w >> 8) + 1 <= 2^24 is exact in float: m * 2^(e - 23) with m in [2^23, 2^24) */
    uint32_t b = EM__F2U((float)((w >> 8) + 1u)), m = (b & 0x7fffffu) | 0x800000u;
    int32_t e = (int32_t)(b >> 23) - 127;
    /* u1 = (m * 2^-23) * 2^(e - 24); above sqrt(2) take the mantissa / 2 instead */
    int big = m > 11863283u; /* floor(sqrt(2) * 2^23) */
    r[0] = big ? e - 23 : e - 24;
    r[1] = big ? (int32_t)m - 0x1000000 : ((int32_t)m - 0x800000) * 2;
}

/* sin(pi/2 t) (s != 0) or cos(pi/2 t) of t = j * 2^-22 in [0, 1/2], with the sign flipped
 * when neg != 0, chosen so that the result is cos(2 pi u2) of u2 = (w >> 8) * 2^-24:
 * r[0] = j, r[1] = s, r[2] = neg. Exact: 4 u2 = q + t' with the quadrant q and t' exactly
 * representable, and cos(pi/2 (q + t')) is +-sin or +-cos of pi/2 t' or of pi/2 (1 - t'). */
EM_PHILOX_FN void em__normal_cos_reduce(uint32_t w, uint32_t r[3]) {
    uint32_t k = w >> 8, q = k >> 22, j = k & 0x3fffffu;
    uint32_t flip = j > 0x200000u ? 1u : 0u;
    r[0] = flip ? 0x400000u - j : j;
    r[1] = (q & 1u) ^ flip;
    r[2] = q == 1u || q == 2u ? 1u : 0u;
}

/* sqrt(-2 ln u1) of u1 = ((w0 >> 8) + 1) * 2^-24, in float; see above. */
EM_PHILOX_FN float em__normal_radius_f32(uint32_t w0) {
    /* y = -2 ln u1 = -2 (n ln 2 + log1p(f)), log1p(f) = f - f^2/2 + f^3 P(f) */
    int32_t lr[2];
    em__normal_log_reduce(w0, lr);
    float n = (float)lr[0], f = EM__MULF((float)lr[1], 5.9604644775390625e-8f);
    /* P(f) by Estrin's scheme (a shorter dependency chain than Horner) */
    float f2 = EM__MULF(f, f), f4 = EM__MULF(f2, f2), f8 = EM__MULF(f4, f4);
    float a0 = EM__ADDF(3.333333433e-01f, EM__MULF(-2.499998957e-01f, f));
    float a1 = EM__ADDF(2.000001073e-01f, EM__MULF(-1.666800082e-01f, f));
    float a2 = EM__ADDF(1.428652406e-01f, EM__MULF(-1.245074347e-01f, f));
    float a3 = EM__ADDF(1.103778332e-01f, EM__MULF(-1.064619124e-01f, f));
    float a4 = EM__ADDF(1.053086370e-01f, EM__MULF(-6.201498955e-02f, f));
    float b0 = EM__ADDF(a0, EM__MULF(a1, f2)), b1 = EM__ADDF(a2, EM__MULF(a3, f2));
    float p = EM__ADDF(EM__ADDF(b0, EM__MULF(b1, f4)), EM__MULF(a4, f8));
    float hf2 = EM__MULF(0.5f, f2);
    float rr = EM__MULF(EM__MULF(f, f2), p);
    /* n ln2_hi is exact (ln2_hi has 17 bits); the small terms first */
    float lo = EM__SUBF(EM__SUBF(hf2, EM__ADDF(rr, EM__MULF(n, 9.0580006145e-06f))), f);
    float y = EM__MULF(-2.0f, EM__SUBF(EM__MULF(n, 6.9313812256e-01f), lo));
    /* sqrt(y) (y >= 2^-23 or 0): 1/sqrt seed from the bits, Newton, one exact-residual step */
    float rad = 0.0f;
    if (y > 0.0f) {
        float r = EM__U2F(0x5f3759dfu - (EM__F2U(y) >> 1)), hy = EM__MULF(0.5f, y); /* within 3.5% */
        for (int it = 0; it < 2; it++) r = EM__MULF(r, EM__SUBF(1.5f, EM__MULF(hy, EM__MULF(r, r))));
        float s = EM__MULF(y, r);
        /* s * s = pp + pe exactly (Veltkamp split, Dekker product) */
        float sp = EM__MULF(s, 4097.0f), sh = EM__SUBF(sp, EM__SUBF(sp, s)), sl = EM__SUBF(s, sh);
        float pp = EM__MULF(s, s);
        float pe = EM__ADDF(EM__ADDF(EM__SUBF(EM__MULF(sh, sh), pp), EM__MULF(EM__MULF(2.0f, sh), sl)),
                            EM__MULF(sl, sl));
        s = EM__ADDF(s, EM__MULF(EM__MULF(0.5f, r), EM__SUBF(EM__SUBF(y, pp), pe)));
        rad = s;
    }
    return rad;
}

/* cos(2 pi u2) of u2 = (w1 >> 8) * 2^-24. */
EM_PHILOX_FN float em__normal_cos_f32(uint32_t w1) {
    uint32_t cr[3];
    em__normal_cos_reduce(w1, cr);
    float t = EM__MULF((float)cr[0], 2.384185791015625e-07f), z = EM__MULF(t, t);
    /* both, then pick: the choice is a coin flip, a branch would mispredict half the time */
    /* sin(pi/2 t) = 1.5 t + t (pi/2 - 1.5 + z S(z)), 1.5 t exact */
    float qs = 1.586515136e-04f;
    EM__HORF(qs, z, -4.681474995e-03f);
    EM__HORF(qs, z, 7.969260961e-02f);
    EM__HORF(qs, z, -6.459640861e-01f);
    EM__HORF(qs, z, 7.079632580e-02f);
    float sn = EM__ADDF(EM__MULF(t, 1.5f), EM__MULF(t, qs));
    /* cos(pi/2 t) = 1 - c1 z + z^2 C(z), the rounding of 1 - c1 z kept */
    float qc = 9.098590235e-04f;
    EM__HORF(qc, z, -2.086259983e-02f);
    EM__HORF(qc, z, 2.536695004e-01f);
    float hz = EM__MULF(1.233700514e+00f, z), w = EM__SUBF(1.0f, hz);
    float tail = EM__SUBF(EM__MULF(EM__MULF(z, z), qc), EM__MULF(z, 3.629644851e-08f));
    float cs = EM__ADDF(w, EM__ADDF(EM__SUBF(EM__SUBF(1.0f, w), hz), tail));
    float c = cr[1] ? sn : cs;
    return cr[2] ? -c : c;
}

/* sqrt(-2 ln u1) * cos(2 pi u2) */
EM_PHILOX_FN float em__normal_f32(uint32_t w0, uint32_t w1) {
    return EM__MULF(em__normal_radius_f32(w0), em__normal_cos_f32(w1));
}

#if !(defined(EMK_OPENCL) || defined(EMK_CUDA)) || defined(EMK_HAS_F64)
/* The same in double (more polynomial terms and Newton steps). */
EM_PHILOX_FN double em__normal_radius_f64(uint32_t w0) {
    /* y = -2 ln u1 = -2 (n ln 2 + log1p(f)), log1p(f) = f - f^2/2 + f^3 P(f) */
    int32_t lr[2];
    em__normal_log_reduce(w0, lr);
    double n = (double)lr[0], f = EM__MULD((double)lr[1], 5.9604644775390625e-8);
    double f2 = EM__MULD(f, f), f4 = EM__MULD(f2, f2), f8 = EM__MULD(f4, f4), f16 = EM__MULD(f8, f8);
    double a0 = EM__ADDD(3.33333333333333315e-01, EM__MULD(-2.50000000000000389e-01, f));
    double a1 = EM__ADDD(1.99999999999994599e-01, EM__MULD(-1.66666666666432234e-01, f));
    double a2 = EM__ADDD(1.42857142858507730e-01, EM__MULD(-1.25000000043235804e-01, f));
    double a3 = EM__ADDD(1.11111110998404428e-01, EM__MULD(-9.99999963478141046e-02, f));
    double a4 = EM__ADDD(9.09090937165222962e-02, EM__MULD(-8.33335003292854926e-02, f));
    double a5 = EM__ADDD(7.69231588992809329e-02, EM__MULD(-7.14241504001737471e-02, f));
    double a6 = EM__ADDD(6.66601535888535490e-02, EM__MULD(-6.25678194187990061e-02, f));
    double a7 = EM__ADDD(5.89852833544629168e-02, EM__MULD(-5.50070456728450063e-02, f));
    double a8 = EM__ADDD(5.06540988580047521e-02, EM__MULD(-5.13853075838123438e-02, f));
    double a9 = EM__ADDD(5.91879023968794327e-02, EM__MULD(-5.39616060067995978e-02, f));
    double b0 = EM__ADDD(a0, EM__MULD(a1, f2));
    double b1 = EM__ADDD(a2, EM__MULD(a3, f2));
    double b2 = EM__ADDD(a4, EM__MULD(a5, f2));
    double b3 = EM__ADDD(a6, EM__MULD(a7, f2));
    double b4 = EM__ADDD(a8, EM__MULD(a9, f2));
    double d0 = EM__ADDD(b0, EM__MULD(b1, f4)), d1 = EM__ADDD(b2, EM__MULD(b3, f4));
    double d2 = EM__ADDD(b4, EM__MULD(2.32642127282733716e-02, f4));
    double p = EM__ADDD(EM__ADDD(d0, EM__MULD(d1, f8)), EM__MULD(d2, f16));
    double hf2 = EM__MULD(0.5, f2);
    double rr = EM__MULD(EM__MULD(f, f2), p);
    /* n ln2_hi is exact (ln2_hi has 32 bits); the small terms first */
    double lo = EM__SUBD(EM__SUBD(hf2, EM__ADDD(rr, EM__MULD(n, 1.90821492927058770002e-10))), f);
    double y = EM__MULD(-2.0, EM__SUBD(EM__MULD(n, 6.93147180369123816490e-01), lo));
    /* sqrt(y) as in float, one Newton step more */
    double rad = 0.0;
    if (y > 0.0) {
        double r = EM__U2D(EM__U64C(0x5fe6eb50c7b537a9) - (EM__D2U(y) >> 1)), hy = EM__MULD(0.5, y);
        for (int it = 0; it < 3; it++) r = EM__MULD(r, EM__SUBD(1.5, EM__MULD(hy, EM__MULD(r, r))));
        double s = EM__MULD(y, r);
        /* s * s = pp + pe exactly (Veltkamp split, Dekker product) */
        double sp = EM__MULD(s, 134217729.0), sh = EM__SUBD(sp, EM__SUBD(sp, s)), sl = EM__SUBD(s, sh);
        double pp = EM__MULD(s, s);
        double pe = EM__ADDD(EM__ADDD(EM__SUBD(EM__MULD(sh, sh), pp), EM__MULD(EM__MULD(2.0, sh), sl)),
                            EM__MULD(sl, sl));
        s = EM__ADDD(s, EM__MULD(EM__MULD(0.5, r), EM__SUBD(EM__SUBD(y, pp), pe)));
        rad = s;
    }
    return rad;
}

/* cos(2 pi u2) of u2 = (w1 >> 8) * 2^-24. */
EM_PHILOX_FN double em__normal_cos_f64(uint32_t w1) {
    uint32_t cr[3];
    em__normal_cos_reduce(w1, cr);
    double t = EM__MULD((double)cr[0], 2.384185791015625e-07), z = EM__MULD(t, t);
    /* both, then pick: the choice is a coin flip, a branch would mispredict half the time */
    /* sin(pi/2 t) = 1.5 t + t (pi/2 - 1.5 + z S(z)), 1.5 t exact */
    double qs = 5.64222536916352820e-08;
    EM__HORD(qs, z, -3.59870295097351049e-06);
    EM__HORD(qs, z, 1.60441166614094230e-04);
    EM__HORD(qs, z, -4.68175413425420735e-03);
    EM__HORD(qs, z, 7.96926262461442325e-02);
    EM__HORD(qs, z, -6.45964097506246171e-01);
    EM__HORD(qs, z, 7.07963267948966135e-02);
    double sn = EM__ADDD(EM__MULD(t, 1.5), EM__MULD(t, qs));
    /* cos(pi/2 t) = 1 - c1 z + z^2 C(z), the rounding of 1 - c1 z kept */
    double qc = -6.33754403592510215e-09;
    EM__HORD(qc, z, 4.71073696895978173e-07);
    EM__HORD(qc, z, -2.52020405876604911e-05);
    EM__HORD(qc, z, 9.19260274734844660e-04);
    EM__HORD(qc, z, -2.08634807633507197e-02);
    EM__HORD(qc, z, 2.53669507901048030e-01);
    double hz = EM__MULD(1.23370055013616975e+00, z), w = EM__SUBD(1.0, hz);
    double tail = EM__SUBD(EM__MULD(EM__MULD(z, z), qc), EM__MULD(z, 7.83161938592463921e-17));
    double cs = EM__ADDD(w, EM__ADDD(EM__SUBD(EM__SUBD(1.0, w), hz), tail));
    double c = cr[1] ? sn : cs;
    return cr[2] ? -c : c;
}

/* sqrt(-2 ln u1) * cos(2 pi u2) */
EM_PHILOX_FN double em__normal_f64(uint32_t w0, uint32_t w1) {
    return EM__MULD(em__normal_radius_f64(w0), em__normal_cos_f64(w1));
}
#endif

#endif
