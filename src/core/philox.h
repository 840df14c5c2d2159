/* Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11) and the contract every Ember backend follows to turn it into samples, so that the
 * same seed gives the same tensor on the CPU, OpenCL and CUDA.
 *
 * Written in a tiny C subset (uint32/uint64 integer math and float, no libc, no pointers
 * beyond small arrays) so OpenCL C and CUDA C kernels can include this same text: they
 * define EM_PHILOX_FN (e.g. `static __device__ __forceinline__`) and the uint32_t/uint64_t
 * types before including it.
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
 *   normal (p0, p1):   u1 = ((out[0] >> 8) + 1) * 2^-24 (in (0, 1], so log is finite),
 *                      u2 = (out[1] >> 8) * 2^-24,
 *                      v = sqrt(-2 ln u1) * cos(2 pi u2) * p1 + p0
 *                      (float math for f32/f16/bf16, double math for f64).
 *   randint [p0, p1):  r = p1 - p0 (int64, as uint64); v = p0 + (((uint64)out[1] << 32 | out[0]) % r)
 *                      in wrapping uint64 math (r == 0 gives p0).
 *   bernoulli (p0):    v = 1 if u < p0 (u as for uniform, compared in double) else 0.
 * Then v is converted to the output dtype (f16/bf16: round to nearest even from float).
 * Core advances the generator's offset by at least n after each draw. */
#ifndef EM_CORE_PHILOX_H
#define EM_CORE_PHILOX_H

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
/* ((w >> 8) + 1) * 2^-24 in (0, 1]: the Box-Muller radius input, never 0. */
EM_PHILOX_FN float em__philox_unit_open0(uint32_t w) { return (float)((w >> 8) + 1u) * 5.9604644775390625e-8f; }

#endif
