/* The global generator: seeding, offsets, and samples that follow philox.h's contract. */
#include "test_core_util.h"
#include "core/philox.h"

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

int main(void) {
    RUN(test_philox_known_answers);
    RUN(test_rand_follows_contract);
    RUN(test_rand_statistics);
    RUN(test_randint);
    return test_summary();
}
