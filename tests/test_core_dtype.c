/* dtype names, parsing, sizes, promotion, and the half / bfloat16 conversions. */
#include "test_core_util.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_names_and_sizes(void) {
    const char *names[] = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool"};
    const size_t sizes[] = {4, 8, 2, 2, 8, 4, 1, 1};
    for (int d = 0; d < EM_DTYPE_COUNT; d++) {
        CHECK(strcmp(em_dtype_name((em_dtype)d), names[d]) == 0);
        CHECK(em_dtype_size((em_dtype)d) == sizes[d]);
        em_dtype back = EM_BOOL;
        CHECK_OK(em_dtype_parse(names[d], &back));
        CHECK(back == (em_dtype)d);
    }
    CHECK(em_dtype_size(EM_DTYPE_COUNT) == 0);
    CHECK(em_dtype_is_floating(EM_F32) && em_dtype_is_floating(EM_F64) && em_dtype_is_floating(EM_F16) &&
          em_dtype_is_floating(EM_BF16));
    CHECK(!em_dtype_is_floating(EM_I64) && !em_dtype_is_floating(EM_I32) && !em_dtype_is_floating(EM_U8) &&
          !em_dtype_is_floating(EM_BOOL));
}

static void test_parse_aliases(void) {
    struct { const char *s; em_dtype dt; } cases[] = {
        {"f32", EM_F32}, {"float", EM_F32}, {"half", EM_F16}, {"double", EM_F64}, {"long", EM_I64},
        {"int", EM_I32}, {"bf16", EM_BF16}, {"torch.float16", EM_F16}, {"u8", EM_U8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_dtype d = EM_BOOL;
        CHECK_OK(em_dtype_parse(cases[i].s, &d));
        CHECK(d == cases[i].dt);
    }
    em_dtype d = EM_I32;
    CHECK(em_dtype_parse("float8", &d) == EM_ERR_ARGUMENT);
    CHECK(d == EM_I32); /* untouched on failure */
    CHECK_ERROR(EM_ERR_ARGUMENT, "unknown dtype 'float8': expected one of float32");
    CHECK(em_dtype_parse("Float32", &d) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK(em_dtype_parse(NULL, &d) == EM_ERR_ARGUMENT);
    em_clear_error();
}

static void test_promotion(void) {
    /* The lattice bool < uint8 < int32 < int64 < floats, as in PyTorch. */
    CHECK(em_promote_types(EM_BOOL, EM_U8) == EM_U8);
    CHECK(em_promote_types(EM_U8, EM_I32) == EM_I32);
    CHECK(em_promote_types(EM_I32, EM_I64) == EM_I64);
    CHECK(em_promote_types(EM_BOOL, EM_I64) == EM_I64);
    CHECK(em_promote_types(EM_I64, EM_F16) == EM_F16); /* int with float: that float */
    CHECK(em_promote_types(EM_I64, EM_BF16) == EM_BF16);
    CHECK(em_promote_types(EM_I32, EM_F32) == EM_F32);
    CHECK(em_promote_types(EM_F16, EM_BF16) == EM_F32);
    CHECK(em_promote_types(EM_BF16, EM_F16) == EM_F32);
    CHECK(em_promote_types(EM_F16, EM_F32) == EM_F32);
    CHECK(em_promote_types(EM_F64, EM_F16) == EM_F64);
    CHECK(em_promote_types(EM_BOOL, EM_BOOL) == EM_BOOL);
    for (int a = 0; a < EM_DTYPE_COUNT; a++)
        for (int b = 0; b < EM_DTYPE_COUNT; b++)
            CHECK(em_promote_types((em_dtype)a, (em_dtype)b) == em_promote_types((em_dtype)b, (em_dtype)a));
}

static void test_f16_known_values(void) {
    CHECK(em_f32_to_f16(1.0f) == 0x3c00);
    CHECK(em_f32_to_f16(-2.0f) == 0xc000);
    CHECK(em_f32_to_f16(0.0f) == 0x0000);
    CHECK(em_f32_to_f16(-0.0f) == 0x8000);
    CHECK(em_f32_to_f16(65504.0f) == 0x7bff);         /* largest half */
    CHECK(em_f32_to_f16(65519.0f) == 0x7bff);         /* below the midpoint to infinity */
    CHECK(em_f32_to_f16(65520.0f) == 0x7c00);         /* the midpoint rounds (to even) up to inf */
    CHECK(em_f32_to_f16(1e10f) == 0x7c00);
    CHECK(em_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(em_f32_to_f16(0x1p-24f) == 0x0001);         /* smallest subnormal */
    CHECK(em_f32_to_f16(0x1p-25f) == 0x0000);         /* tie between 0 and 2^-24: even is 0 */
    CHECK(em_f32_to_f16(0x1.8p-25f) == 0x0001);
    CHECK(em_f32_to_f16(0x1.8p-24f) == 0x0002);       /* 1.5 ulp ties to 2 */
    CHECK(em_f32_to_f16(0x1.4p-24f) == 0x0001);       /* 1.25 ulp rounds down */
    CHECK(em_f32_to_f16(0x1.ff8p-15f) == 0x03ff);     /* the largest subnormal */
    CHECK(em_f32_to_f16(0x1.ffcp-15f) == 0x0400);     /* half an ulp above it ties up to the smallest normal */
    CHECK(em_f32_to_f16(0x1p-14f) == 0x0400);
    CHECK(em_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);  /* tie: even */
    CHECK(em_f32_to_f16(1.0f + 0x1.8p-10f) == 0x3c02);/* 1.5 ulp: up to even */
    CHECK(em_f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f) == 0x3c02);
    CHECK(em_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01); /* just above the tie */
    uint16_t nan = em_f32_to_f16(NAN);
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x03ff) != 0);
    uint16_t snan = em_f32_to_f16(from_bits(0x7f800001u)); /* signalling NaN with a low payload stays NaN */
    CHECK((snan & 0x7c00) == 0x7c00 && (snan & 0x03ff) != 0);
    CHECK(em_f16_to_f32(0x3c00) == 1.0f);
    CHECK(em_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(em_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(em_f16_to_f32(0x03ff) == 0x1.ff8p-15f);
    CHECK(em_f16_to_f32(0x8000) == 0.0f && signbit(em_f16_to_f32(0x8000)));
    CHECK(isinf(em_f16_to_f32(0x7c00)) && em_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(em_f16_to_f32(0x7e00)));
}

/* Every half survives half -> float -> half; the compiler's _Float16 agrees on conversions. */
static void test_f16_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = em_f16_to_f32((uint16_t)h);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            bad += !isnan(f);
            continue;
        }
        bad += em_f32_to_f16(f) != h;
        _Float16 ref;
        uint16_t hb = (uint16_t)h;
        memcpy(&ref, &hb, 2);
        bad += (float)ref != f;
    }
    CHECK(bad == 0);
    /* Float -> half against the compiler on a sweep of bit patterns (every rounding case). */
    bad = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 0x1357) {
        float f = from_bits((uint32_t)u);
        if (isnan(f)) continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (em_f32_to_f16(f) != rb) bad++;
    }
    CHECK(bad == 0);
}

static void test_bf16(void) {
    CHECK(em_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(em_f32_to_bf16(-1.0f) == 0xbf80);
    CHECK(em_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);            /* tie: even */
    CHECK(em_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);  /* tie: up to even */
    CHECK(em_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81); /* above the tie */
    CHECK(em_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);    /* FLT_MAX rounds to inf */
    CHECK(em_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(em_f32_to_bf16(from_bits(0x00000001u)) == 0x0000);    /* tiny subnormal to zero */
    CHECK(em_f32_to_bf16(from_bits(0x00018000u)) == 0x0002);    /* subnormal tie to even */
    uint16_t nan = em_f32_to_bf16(from_bits(0x7f800001u));       /* low-payload NaN must not become inf */
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
    CHECK(em_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(em_bf16_to_f32(0x4049) == 3.140625f);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = em_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        bad += em_f32_to_bf16(f) != h;
    }
    CHECK(bad == 0);
}

int main(void) {
    RUN(test_names_and_sizes);
    RUN(test_parse_aliases);
    RUN(test_promotion);
    RUN(test_f16_known_values);
    RUN(test_f16_exhaustive);
    RUN(test_bf16);
    return test_summary();
}
