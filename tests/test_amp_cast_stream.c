/* bf16 -> float32 casts large enough for streaming stores (src/backends/cpu/cpu_copy.c: 1 MiB
 * of output and more), into aligned and misaligned destinations, one and two threads: every
 * element must be exactly the bf16 bits shifted into a float (NaN payloads, infinities,
 * subnormals and -0 included), the head before the first aligned store and the tail too.
 * And float32 -> bf16 over spread bit patterns: each element em_f32_to_bf16's rounding
 * (nearest even, NaN kept quiet, subnormals kept), whichever vector kernel the CPU has. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

#define N 300007 /* about 1.2 MB of float32: above the streaming threshold, odd tail */

static void check_cast(int threads, int64_t shift) {
    em_set_num_threads(threads);
    em_scope s = em_scope_begin();
    uint16_t *h = malloc(N * sizeof *h);
    uint32_t *got = malloc((N + 3) * sizeof *got);
    for (int64_t i = 0; i < N; i++) h[i] = (uint16_t)(i * 40503u); /* every pattern, spread */
    h[0] = 0x7fc1; h[1] = 0xff80; h[2] = 0x0001; h[3] = 0x8000; h[N - 1] = 0xffff;
    em_tensor *src = em_from_data(h, EM_BF16, EM_SHAPE(N), EM_OPTS(.dtype = EM_BF16));
    em_tensor *dst = em_zeros(EM_SHAPE(N + 3), EM_OPTS(0));
    CHECK_OK(em_copy_(em_narrow(dst, 0, shift, N), src)); /* shift 1..3: misaligned by 4-12 bytes */
    CHECK_OK(em_copy_to_host(dst, got, (N + 3) * sizeof *got));
    int64_t bad = 0;
    for (int64_t i = 0; i < N; i++) bad += got[i + shift] != (uint32_t)h[i] << 16;
    for (int64_t i = 0; i < shift; i++) bad += got[i] != 0; /* nothing written before the view */
    CHECK(bad == 0);
    em_tensor *whole = em_to_dtype(src, EM_F32); /* a fresh, aligned output */
    CHECK_OK(em_copy_to_host(whole, got, N * sizeof *got));
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += got[i] != (uint32_t)h[i] << 16;
    CHECK(bad == 0);
    free(h);
    free(got);
    em_scope_end(s);
}

static void test_one_thread(void) {
    for (int64_t shift = 0; shift < 3; shift++) check_cast(1, shift);
}

static void test_two_threads(void) {
    for (int64_t shift = 0; shift < 3; shift++) check_cast(2, shift);
}

static void test_f32_to_bf16_rounding(void) {
    enum { M = 1 << 20 };
    uint32_t *bits = malloc(M * sizeof *bits);
    uint16_t *got = malloc(M * sizeof *got);
    for (uint32_t i = 0; i < M; i++) bits[i] = i * 4099u + (i & 1 ? 0x8000u : 0); /* ties and near-ties too */
    bits[0] = 0x7fc00001u; bits[1] = 0xff800000u; bits[2] = 0x00000001u; bits[3] = 0x80000000u;
    bits[4] = 0x7f7fffffu; bits[5] = 0x7f800001u; bits[6] = 0x3f808000u; bits[7] = 0x3f818000u;
    em_scope s = em_scope_begin();
    em_tensor *src = em_from_data(bits, EM_F32, EM_SHAPE(M), EM_OPTS(0));
    em_tensor *dst = em_to_dtype(src, EM_BF16);
    CHECK_OK(em_copy_to_host(dst, got, M * sizeof *got));
    int64_t bad = 0;
    for (uint32_t i = 0; i < M; i++) {
        float f;
        memcpy(&f, &bits[i], 4);
        bad += got[i] != em_f32_to_bf16(f);
    }
    CHECK(bad == 0);
    em_scope_end(s);
    free(bits);
    free(got);
}

int main(void) {
    int threads = em_get_num_threads();
    RUN(test_one_thread);
    RUN(test_two_threads);
    em_set_num_threads(threads);
    RUN(test_f32_to_bf16_rounding);
    return test_summary();
}
