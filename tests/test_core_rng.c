/* The global generator: seeding, offsets, and samples that follow philox.h's contract. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "test_core_util.h"
#include "kernels/philox.h"

static void test_philox_known_answers(void) {
    /* Random123's known-answer vectors for philox4x32-10. */
    uint32_t out[4];
    em__philox4x32_10((const uint32_t[]){0, 0, 0, 0}, 0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
    em__philox4x32_10((const uint32_t[]){0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffffffffffull, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
    em__philox4x32_10((const uint32_t[]){0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                      0x299f31d0a4093822ull, out);
    CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u && out[3] == 0x24126ea1u);
}

static float expected_uniform(uint64_t seed, uint64_t c) {
    uint32_t out[4];
    em__philox_element(seed, c, out);
    return em__philox_unit(out[0]);
}

static void test_rand_follows_contract(void) {
    em_manual_seed(42);
    em_tensor *a = em_rand(EM_SHAPE(5), (em_opts){0});
    em_tensor *b = em_rand(EM_SHAPE(3), (em_opts){0});
    for (int i = 0; i < 5; i++) CHECK(tval(a, i) == expected_uniform(42, (uint64_t)i));
    /* The second draw starts after the first (offset 5 rounded up to 8). */
    for (int i = 0; i < 3; i++) CHECK(tval(b, i) == expected_uniform(42, (uint64_t)(8 + i)));
    em_manual_seed(42);
    em_tensor *c = em_rand(EM_SHAPE(5), (em_opts){0});
    CHECK_OK(em_copy_to_host(c, (float[5]){0}, 20));
    for (int i = 0; i < 5; i++) CHECK(tval(c, i) == tval(a, i));
    em_manual_seed(43);
    em_tensor *d = em_rand(EM_SHAPE(5), (em_opts){0});
    CHECK(tval(d, 0) != tval(a, 0));
    em_release(a); em_release(b); em_release(c); em_release(d);
}

static void test_rand_statistics(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(1);
    em_tensor *u = em_rand(EM_SHAPE(10000), (em_opts){0});
    em_tensor *n = em_randn(EM_SHAPE(10000), EM_OPTS(.dtype = EM_F64));
    float *pu = em_data_ptr(u);
    double *pn = em_data_ptr(n);
    double su = 0, sn = 0, sn2 = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < 10000; i++) {
        su += pu[i];
        sn += pn[i];
        sn2 += pn[i] * pn[i];
        if (pu[i] < lo) lo = pu[i];
        if (pu[i] > hi) hi = pu[i];
    }
    CHECK(lo >= 0 && hi < 1);
    CHECK_NEAR(su / 10000, 0.5, 0.02);
    CHECK_NEAR(sn / 10000, 0.0, 0.05);
    CHECK_NEAR(sn2 / 10000, 1.0, 0.05);
    em_scope_end(s);
}

static void test_randint(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_tensor *r = em_randint(-3, 4, EM_SHAPE(2000), EM_OPTS(.dtype = EM_I64));
    int64_t *p = em_data_ptr(r);
    int seen[7] = {0};
    bool in_range = true;
    for (int i = 0; i < 2000; i++) {
        in_range &= p[i] >= -3 && p[i] < 4;
        if (p[i] >= -3 && p[i] < 4) seen[p[i] + 3]++;
    }
    CHECK(in_range);
    for (int k = 0; k < 7; k++) CHECK(seen[k] > 200);
    em_tensor *f = em_randint(0, 10, EM_SHAPE(50), EM_OPTS(.dtype = EM_F32));
    bool integral = true;
    for (int i = 0; i < 50; i++) integral &= tval(f, i) == floor(tval(f, i));
    CHECK(integral);
    CHECK(em_randint(5, 3, EM_SHAPE(2), EM_OPTS(.dtype = EM_I64)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "random_ expects 'from' to be less than 'to', but got from=5 >= to=3");
    CHECK(em_randint(0, 2, EM_SHAPE(2), EM_OPTS(.dtype = EM_BOOL)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "expected a numeric dtype");
    CHECK(em_rand(EM_SHAPE(2), EM_OPTS(.dtype = EM_I32)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "em_rand: expected a floating point dtype, got int32");
    CHECK(em_randn(EM_SHAPE(2), EM_OPTS(.dtype = EM_U8)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "em_randn");
    em_tensor *e = em_rand(EM_SHAPE(0), (em_opts){0});
    CHECK(e && em_numel(e) == 0);
    em_tensor *h = em_randn(EM_SHAPE(4), EM_OPTS(.dtype = EM_BF16, .requires_grad = true));
    CHECK(h && h->requires_grad);
    em_scope_end(s);
}

/* ---------------------------------------------------------------- philox.h's Box-Muller */

/* sqrt(-2 ln u1) and cos(2 pi u2) of the contract's u1, u2 from long double libm (64-bit
 * mantissa on x86; cos with the quadrant and octant reduced exactly, as libm's cos(2 pi u2)
 * with 2 pi u2 rounded is itself off by many ulp near the zeros of cos). */
static long double ref_radius(uint32_t w0) {
    return sqrtl(-2.0L * logl((long double)((w0 >> 8) + 1) / 16777216.0L));
}
static long double ref_cos(uint32_t w1) {
    uint32_t k = w1 >> 8, q = k >> 22;
    long double t = (long double)(k & 0x3fffffu) / 4194304.0L, h = 1.5707963267948966192313216916397514L;
    long double c = t > 0.5L ? sinl((1 - t) * h) : cosl(t * h);
    long double s = t > 0.5L ? cosl((1 - t) * h) : sinl(t * h);
    return q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
}
/* |got - want| in units of the last place of want (mant: 23 for float, 52 for double) */
static double ulp_error(long double got, long double want, int mant) {
    if (want == 0) return got == 0 ? 0 : INFINITY;
    int e;
    frexpl(want, &e);
    return (double)(fabsl(got - want) / ldexpl(1.0L, e - 1 - mant));
}

static void test_normal_transform_accuracy(void) {
    /* the f64 reference needs more than double precision */
    bool f64_ref = LDBL_MANT_DIG >= 64;
    double rad32 = 0, rad64 = 0, cos32 = 0, cos64 = 0, v32 = 0, v64 = 0;
    for (uint32_t k = 0; k < (1u << 24); k += 13) { /* ~1.3e6 of the 2^24 inputs, ends included */
        uint32_t w = k << 8;
        long double r = ref_radius(w), c = ref_cos(w);
        rad32 = fmax(rad32, ulp_error(em__normal_radius_f32(w), r, 23));
        rad64 = fmax(rad64, ulp_error(em__normal_radius_f64(w), r, 52));
        cos32 = fmax(cos32, ulp_error(em__normal_cos_f32(w), c, 23));
        cos64 = fmax(cos64, ulp_error(em__normal_cos_f64(w), c, 52));
    }
    uint32_t last = 0xffffff00u; /* u1 = 1: radius 0; u2 = 1 - 2^-24 */
    rad32 = fmax(rad32, ulp_error(em__normal_radius_f32(last), 0, 23));
    cos32 = fmax(cos32, ulp_error(em__normal_cos_f32(last), ref_cos(last), 23));
    cos64 = fmax(cos64, ulp_error(em__normal_cos_f64(last), ref_cos(last), 52));
    uint32_t out[4];
    for (uint64_t i = 0; i < (1u << 20); i++) { /* the product, on the generator's own words */
        em__philox_element(99, i, out);
        long double want = ref_radius(out[0]) * ref_cos(out[1]);
        v32 = fmax(v32, ulp_error(em__normal_f32(out[0], out[1]), want, 23));
        v64 = fmax(v64, ulp_error(em__normal_f64(out[0], out[1]), want, 52));
    }
    printf("  normal transform, max error in ulp: sqrt(-2 ln u1) f32 %.2f f64 %.2f, cos(2 pi u2) f32 "
           "%.2f f64 %.2f, product f32 %.2f f64 %.2f%s\n", rad32, rad64, cos32, cos64, v32, v64,
           f64_ref ? "" : " (f64 not checked: long double is double here)");
    /* over every input: radius 0.98 / 0.97, cos 0.89 / 0.77 (f32 / f64); 1e7 products 2.43 / 2.39 */
    CHECK(rad32 <= 1.0 && cos32 <= 1.0 && v32 <= 2.5);
    if (f64_ref) CHECK(rad64 <= 1.0 && cos64 <= 1.0 && v64 <= 2.5);
    /* the sample is a normal one: sign from cos, zero radius at u1 = 1, the extremes */
    CHECK(em__normal_f32(0xffffff00u, 0) == 0);
    CHECK(em__normal_cos_f32(0x40000000u) == 0 && em__normal_cos_f32(0x80000000u) == -1);
    CHECK(fabs(em__normal_radius_f32(0) - sqrt(48 * log(2.0))) < 1e-6); /* u1 = 2^-24 */
}

/* The transform's bits, pinned: they are the contract every device reproduces, so a change
 * here (a new polynomial, a fused multiply-add slipping into a build) changes every seed's
 * normal numbers. The values are this implementation's own, recorded when it was written. */
static void test_normal_transform_pinned(void) {
    const uint32_t w[4][2] = {{0x6627e8d5u, 0xe169c58du}, {0x00000100u, 0x3fffff00u},
                              {0xfffffe00u, 0x20000000u}, {0x12345678u, 0x9abcdef0u}};
    const uint32_t want32[4] = {0x3f7dbb30u, 0x360dea82u, 0x397fffffu, 0xbfe92f3au};
    const uint64_t want64[4] = {0x3fefb765f032eebcull, 0x3ec1bd50421accd7ull, 0x3f30000004000002ull,
                                0xbffd25e74ec7e8b1ull};
    for (int i = 0; i < 4; i++) {
        float f = em__normal_f32(w[i][0], w[i][1]);
        double d = em__normal_f64(w[i][0], w[i][1]);
        uint32_t b32;
        uint64_t b64;
        memcpy(&b32, &f, 4);
        memcpy(&b64, &d, 8);
        if (b32 != want32[i] || b64 != want64[i])
            fprintf(stderr, "  pin %d: f32 %#010x (want %#010x), f64 %#018llx (want %#018llx)\n", i, b32,
                    want32[i], (unsigned long long)b64, (unsigned long long)want64[i]);
        CHECK(b32 == want32[i] && b64 == want64[i]);
    }
    /* and a hash of 65536 samples' bits (FNV-1a), which a single fused multiply-add changes */
    uint64_t h32 = 0xcbf29ce484222325ull, h64 = h32;
    uint32_t out[4];
    for (uint64_t i = 0; i < 65536; i++) {
        em__philox_element(2024, i, out);
        float f = em__normal_f32(out[0], out[1]);
        double d = em__normal_f64(out[0], out[1]);
        uint32_t b32;
        uint64_t b64;
        memcpy(&b32, &f, 4);
        memcpy(&b64, &d, 8);
        h32 = (h32 ^ b32) * 0x100000001b3ull;
        h64 = (h64 ^ b64) * 0x100000001b3ull;
    }
    if (h32 != 0x897a102c17322557ull || h64 != 0x442697f64c7da96full)
        fprintf(stderr, "  hash of 65536 samples: f32 %#018llx, f64 %#018llx\n", (unsigned long long)h32,
                (unsigned long long)h64);
    CHECK(h32 == 0x897a102c17322557ull && h64 == 0x442697f64c7da96full);
}

int main(void) {
    RUN(test_philox_known_answers);
    RUN(test_rand_follows_contract);
    RUN(test_rand_statistics);
    RUN(test_randint);
    RUN(test_normal_transform_accuracy);
    RUN(test_normal_transform_pinned);
    return test_summary();
}
