/* Philox 4x32-10 known answers (Random123's kat_vectors) and the CPU backend's rng kernel
 * against the contract written in src/kernels/philox.h. */
#include "test_cpu_util.h"
#include "kernels/philox.h"
#include "backend_calls.h"

static void test_philox_kat(void) {
    uint32_t out[4];
    const uint32_t zero[4] = {0, 0, 0, 0};
    em__philox4x32_10(zero, 0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
    const uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    em__philox4x32_10(ones, 0xffffffffffffffffull, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
    const uint32_t pi[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    em__philox4x32_10(pi, (uint64_t)0x299f31d0u << 32 | 0xa4093822u, out);
    CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u && out[3] == 0x24126ea1u);
    /* element c uses counter (lo32(c), hi32(c), 0, 0) */
    uint32_t a[4], b[4];
    const uint32_t ctr[4] = {5, 1, 0, 0};
    em__philox_element(42, (1ull << 32) + 5, a);
    em__philox4x32_10(ctr, 42, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

/* Element c of a draw, computed from the contract's text. */
static double contract_value(em_rng_kind kind, em_dtype dt, uint64_t seed, uint64_t c, double p0, double p1) {
    uint32_t w[4];
    const uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
    em__philox4x32_10(ctr, seed, w);
    double u = (double)(w[0] >> 8) / 16777216.0;
    bool dbl = dt == EM_F64;
    switch (kind) {
    case EM_RNG_UNIFORM:
        if (dbl) { double v = p0 + u * (p1 - p0); return v < p1 ? v : p0; }
        else { float lo = (float)p0, hi = (float)p1, v = lo + (float)u * (hi - lo); return v < hi ? v : lo; }
    case EM_RNG_NORMAL: {
        /* philox.h's transform (its accuracy against libm: tests/test_core_rng.c) */
        if (dbl) return em__normal_f64(w[0], w[1]) * p1 + p0;
        return em__normal_f32(w[0], w[1]) * (float)p1 + (float)p0;
    }
    case EM_RNG_RANDINT: {
        uint64_t r = (uint64_t)((int64_t)p1 - (int64_t)p0), x = (uint64_t)w[1] << 32 | w[0];
        return (double)(int64_t)((uint64_t)(int64_t)p0 + (r ? x % r : 0));
    }
    default: return u < p0;
    }
}

static void test_rng_matches_contract(void) {
    const int64_t shape[2] = {37, 29};
    const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8, EM_BOOL};
    const double params[4][2] = {{-2, 3}, {1.5, 2}, {-5, 100}, {0.3, 0}};
    int bad = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int di = 0; di < 8; di++)
            for (int lo = 0; lo < 3; lo++) {
                em_dtype dt = dts[di];
                if (kind <= EM_RNG_NORMAL && !em_dtype_is_floating_test(dt)) continue;
                if (kind == EM_RNG_RANDINT && dt == EM_BOOL) continue;
                double p0 = params[kind][0], p1 = params[kind][1];
                if (kind == EM_RNG_RANDINT && dt == EM_U8) p0 = 0;
                ttensor *x = tt_make(dt, 2, shape, (tlayout)lo);
                uint64_t seed = 0x1234567890abcdefull + (uint64_t)kind, offset = 1000 + (uint64_t)di;
                CHECK_OK(be_rng(&em__cpu_backend, &x->t, (em_rng_kind)kind, seed, offset, p0, p1));
                for (int64_t i = 0; i < 37 * 29; i++) {
                    double v = contract_value((em_rng_kind)kind, dt, seed, offset + (uint64_t)i, p0, p1);
                    double want = dt == EM_F16 ? em_f16_to_f32(em_f32_to_f16((float)v))
                                  : dt == EM_BF16 ? em_bf16_to_f32(em_f32_to_bf16((float)v)) : v;
                    if (!(tt_get(x, i) == want) && bad++ < 10)
                        fprintf(stderr, "  rng kind %d %s %s [%lld]: got %.9g want %.9g\n", kind, dtype_names[di],
                                tlayout_name[lo], (long long)i, tt_get(x, i), want);
                    if (kind == EM_RNG_UNIFORM && !(tt_get(x, i) >= p0 && tt_get(x, i) <= p1)) bad++;
                }
                if (!tt_guard_ok(x)) bad++;
                tt_free(x);
            }
    CHECK(bad == 0);
}

/* Statistics of large draws, and identical results for any thread count. */
static void test_rng_statistics_and_threads(void) {
    int64_t n = 400000, shape[1] = {400000};
    ttensor *u = tt_make(EM_F32, 1, shape, L_CONTIG), *g = tt_make(EM_F64, 1, shape, L_CONTIG);
    ttensor *r = tt_make(EM_I64, 1, shape, L_CONTIG), *b = tt_make(EM_BOOL, 1, shape, L_CONTIG);
    ttensor *u1 = tt_make(EM_F32, 1, shape, L_CONTIG);
    em_set_num_threads(2);
    CHECK_OK(be_rng(&em__cpu_backend, &u->t, EM_RNG_UNIFORM, 7, 0, 0, 1));
    CHECK_OK(be_rng(&em__cpu_backend, &g->t, EM_RNG_NORMAL, 7, 0, 1, 2));
    CHECK_OK(be_rng(&em__cpu_backend, &r->t, EM_RNG_RANDINT, 7, 0, -3, 4));
    CHECK_OK(be_rng(&em__cpu_backend, &b->t, EM_RNG_BERNOULLI, 7, 0, 0.25, 0));
    em_set_num_threads(1);
    CHECK_OK(be_rng(&em__cpu_backend, &u1->t, EM_RNG_UNIFORM, 7, 0, 0, 1));
    em_set_num_threads(2);
    CHECK(memcmp(u->st.block.handle, u1->st.block.handle, (size_t)n * 4) == 0);
    double su = 0, sg = 0, sg2 = 0, sb = 0;
    int64_t counts[7] = {0};
    bool range_ok = true;
    for (int64_t i = 0; i < n; i++) {
        double x = tt_get(u, i), y = tt_get(g, i);
        int64_t k = tt_get_i64(r, i);
        range_ok &= x >= 0 && x < 1 && k >= -3 && k < 4;
        su += x;
        sg += y;
        sg2 += y * y;
        sb += tt_get(b, i);
        if (k >= -3 && k < 4) counts[k + 3]++;
    }
    CHECK(range_ok);
    CHECK_NEAR(su / n, 0.5, 0.005);
    CHECK_NEAR(sg / n, 1.0, 0.01);
    CHECK_NEAR(sqrt(sg2 / n - (sg / n) * (sg / n)), 2.0, 0.01);
    CHECK_NEAR(sb / n, 0.25, 0.005);
    for (int k = 0; k < 7; k++) CHECK_NEAR(counts[k] / (double)n, 1.0 / 7, 0.005);
    /* a draw at offset 10 is the draw at offset 0 shifted by 10 */
    int64_t s2[1] = {100};
    ttensor *a = tt_make(EM_F32, 1, s2, L_CONTIG);
    CHECK_OK(be_rng(&em__cpu_backend, &a->t, EM_RNG_UNIFORM, 7, 10, 0, 1));
    for (int i = 0; i < 90; i++) CHECK(tt_get(a, i) == tt_get(u, i + 10));
    tt_free(u); tt_free(g); tt_free(r); tt_free(b); tt_free(u1); tt_free(a);
}

int main(void) {
    RUN(test_philox_kat);
    RUN(test_rng_matches_contract);
    RUN(test_rng_statistics_and_threads);
    return test_summary();
}
