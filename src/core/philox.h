/* Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), and how
 * Ember turns its output into samples. Every backend must produce exactly these numbers:
 *
 *   The stream is a sequence of 32-bit words. Word w is lane (w & 3) of
 *   philox(counter = {lo32(w >> 2), hi32(w >> 2), 0, 0}, key = {lo32(seed), hi32(seed)}).
 *   Element i (row-major) of a draw uses word (offset + i); core advances offset by
 *   numel rounded up to a multiple of 4, so every draw starts on a fresh counter.
 *
 *   uniform [p0, p1):  p0 + (p1 - p0) * u,  u = (word >> 8) * 2^-24 (float)
 *   normal (p0, p1):   Box-Muller on the pair of words (w & ~1, w | 1): u1 = ((w0 >> 8) + 1) * 2^-24,
 *                      u2 = (w1 >> 8) * 2^-24, r = sqrt(-2 ln u1); even w -> r cos(2 pi u2),
 *                      odd w -> r sin(2 pi u2); result p0 + p1 * z (float math)
 *   randint [p0, p1):  range r = p1 - p0; r <= 2^32: p0 + word % r; larger: the high 32 bits
 *                      come from the same lane of counter {.., .., 1, 0}: p0 + (hi:word) % r
 *   bernoulli(p0):     1 if uniform u < p0 else 0
 * Header-only so the CPU backend and tests share one definition; GPU kernels port it. */
#ifndef EM_CORE_PHILOX_H
#define EM_CORE_PHILOX_H

#include <math.h>
#include <stdint.h>

#define EM_PHILOX_M0 0xD2511F53u
#define EM_PHILOX_M1 0xCD9E8D57u
#define EM_PHILOX_W0 0x9E3779B9u
#define EM_PHILOX_W1 0xBB67AE85u

/* The raw block function: 4 words out for a 128-bit counter and a 64-bit key. */
static inline void em__philox4x32_10(const uint32_t ctr_in[4], uint64_t seed, uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)EM_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)EM_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += EM_PHILOX_W0;
        k1 += EM_PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Word w of the stream for `seed` (stream 0 is the main one, stream 1 the randint high words). */
static inline uint32_t em__philox_word_stream(uint64_t seed, uint64_t w, uint32_t stream) {
    uint64_t block = w >> 2;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), stream, 0}, out[4];
    em__philox4x32_10(ctr, seed, out);
    return out[w & 3];
}

static inline uint32_t em__philox_word(uint64_t seed, uint64_t w) {
    return em__philox_word_stream(seed, w, 0);
}

/* Uniform in [0, 1) with 24 random bits (exact in float). */
static inline float em__philox_uniform(uint64_t seed, uint64_t w) {
    return (float)(em__philox_word(seed, w) >> 8) * 0x1p-24f;
}

/* Standard normal sample for word w (Box-Muller on its even/odd pair). */
static inline float em__philox_normal(uint64_t seed, uint64_t w) {
    uint64_t base = w & ~(uint64_t)1;
    uint32_t a = em__philox_word(seed, base), b = em__philox_word(seed, base + 1);
    float u1 = (float)((a >> 8) + 1) * 0x1p-24f; /* (0, 1]: log is finite */
    float u2 = (float)(b >> 8) * 0x1p-24f;
    float r = sqrtf(-2.0f * logf(u1));
    float theta = 6.28318530717958647692f * u2;
    return (w & 1) ? r * sinf(theta) : r * cosf(theta);
}

/* Integer in [lo, hi) (hi > lo). */
static inline int64_t em__philox_randint(uint64_t seed, uint64_t w, int64_t lo, int64_t hi) {
    uint64_t range = (uint64_t)hi - (uint64_t)lo;
    uint64_t x = em__philox_word(seed, w);
    if (range > 0x100000000ull) x |= (uint64_t)em__philox_word_stream(seed, w, 1) << 32;
    return (int64_t)((uint64_t)lo + x % range);
}

#endif
