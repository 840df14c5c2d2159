/* Element types: names, sizes, PyTorch's promotion lattice, and IEEE half / bfloat16
 * conversions done with integer arithmetic (exact round-to-nearest-even, independent
 * of the FPU's rounding mode and flush-to-zero settings). */
#include "core_internal.h"
#include "../util/errors.h"
#include <string.h>

static const char *const dtype_names[EM_DTYPE_COUNT] = {
    [EM_F32] = "float32", [EM_F64] = "float64", [EM_F16] = "float16", [EM_BF16] = "bfloat16",
    [EM_I64] = "int64",   [EM_I32] = "int32",   [EM_U8] = "uint8",    [EM_BOOL] = "bool",
};

/* c10's ScalarType names, used in messages copied from PyTorch. */
static const char *const torch_names[EM_DTYPE_COUNT] = {
    [EM_F32] = "Float", [EM_F64] = "Double", [EM_F16] = "Half", [EM_BF16] = "BFloat16",
    [EM_I64] = "Long",  [EM_I32] = "Int",    [EM_U8] = "Byte",  [EM_BOOL] = "Bool",
};

static const size_t dtype_sizes[EM_DTYPE_COUNT] = {
    [EM_F32] = 4, [EM_F64] = 8, [EM_F16] = 2, [EM_BF16] = 2,
    [EM_I64] = 8, [EM_I32] = 4, [EM_U8] = 1,  [EM_BOOL] = 1,
};

const char *em_dtype_name(em_dtype dt) {
    return (unsigned)dt < EM_DTYPE_COUNT ? dtype_names[dt] : "invalid dtype";
}

const char *em__dtype_torch_name(em_dtype dt) {
    return (unsigned)dt < EM_DTYPE_COUNT ? torch_names[dt] : "Undefined";
}

em_status em_dtype_parse(const char *s, em_dtype *out) {
    static const struct { const char *name; em_dtype dt; } aliases[] = {
        {"float32", EM_F32}, {"f32", EM_F32},   {"float", EM_F32},    {"float64", EM_F64},
        {"f64", EM_F64},     {"double", EM_F64}, {"float16", EM_F16},  {"f16", EM_F16},
        {"half", EM_F16},    {"bfloat16", EM_BF16}, {"bf16", EM_BF16}, {"int64", EM_I64},
        {"i64", EM_I64},     {"long", EM_I64},   {"int32", EM_I32},    {"i32", EM_I32},
        {"int", EM_I32},     {"uint8", EM_U8},   {"u8", EM_U8},        {"bool", EM_BOOL},
    };
    if (!s || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_dtype_parse: NULL argument");
    const char *name = strncmp(s, "torch.", 6) == 0 ? s + 6 : s;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(name, aliases[i].name) == 0) {
            *out = aliases[i].dt;
            return EM_OK;
        }
    }
    return em_error(EM_ERR_ARGUMENT,
                    "unknown dtype '%s': expected one of float32 (f32, float), float64 (f64, double), "
                    "float16 (f16, half), bfloat16 (bf16), int64 (i64, long), int32 (i32, int), "
                    "uint8 (u8), bool",
                    s);
}

size_t em_dtype_size(em_dtype dt) { return (unsigned)dt < EM_DTYPE_COUNT ? dtype_sizes[dt] : 0; }

bool em_dtype_is_floating(em_dtype dt) {
    return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
}

/* Rank in the lattice bool < uint8 < int32 < int64 < {float16, bfloat16} < float32 < float64. */
static int promote_rank(em_dtype dt) {
    switch (dt) {
    case EM_BOOL: return 0;
    case EM_U8: return 1;
    case EM_I32: return 2;
    case EM_I64: return 3;
    case EM_F16: case EM_BF16: return 4;
    case EM_F32: return 5;
    case EM_F64: return 6;
    default: return -1;
    }
}

em_dtype em_promote_types(em_dtype a, em_dtype b) {
    if (a == b) return a;
    int ra = promote_rank(a), rb = promote_rank(b);
    if (ra == 4 && rb == 4) return EM_F32; /* float16 with bfloat16: neither holds the other */
    return ra >= rb ? a : b;
}

/* ---- IEEE conversions ---- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Shift right by `shift` bits rounding to nearest, ties to even. */
static inline uint32_t shift_rne(uint32_t m, int shift) {
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

uint16_t em_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: stays a quiet NaN, keeping the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
    if (ax >= 0x47800000u) return sign | 0x7c00u; /* >= 65536 (and inf): infinity */
    if (ax >= 0x38800000u) {                      /* >= 2^-14: a normal half */
        uint32_t h = ((((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13));
        uint32_t rem = ax & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1)); /* a carry may reach infinity: right */
        return (uint16_t)(sign | h);
    }
    if (ax < 0x33000000u) return sign; /* < 2^-25 rounds to zero (2^-25 itself ties to even 0) */
    /* Subnormal half: value / 2^-24 = mantissa (with its hidden bit) >> (126 - exponent). */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_rne(mant, 126 - (int)(ax >> 23)));
}

float em_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        uint32_t e = 113; /* normalise the subnormal: 2^-24 * mant */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t em_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float em_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
