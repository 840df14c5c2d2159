/* ReLU's forward on bf16 straight on the bits (src/backends/cpu/cpu_relu.c, reached from
 * em_relu on contiguous bf16): every one of the 65536 bf16 bit patterns, bit for bit against
 * the float32 path it replaces (relu in float32, then the cast to bf16: NaN made quiet,
 * negatives +0, -0 kept), at offsets that put each pattern in the 32-lane body and in the
 * tail; sizes around the vector width; a non-contiguous input; with denormals flushed (where the float32 path
 * runs again and reads a negative subnormal as zero). */
#include <stdint.h>
#include <stdlib.h>
#include "core/internal_api.h"
#include "test.h"

/* what relu in float32 and the cast back give, written here from the rule */
static uint16_t want_bits(uint16_t v) {
    uint16_t a = v & 0x7FFF;
    if (a > 0x7F80) return v | 0x40;
    return (v & 0x8000) && a ? 0 : v;
}

static int64_t count_bad(const uint16_t *got, const uint16_t *in, int64_t n, const char *what) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t w = want_bits(in[i]);
        if (got[i] != w && bad++ < 3)
            fprintf(stderr, "  %s: x %04x got %04x want %04x\n", what, in[i], got[i], w);
    }
    return bad;
}

/* all patterns, shifted by `shift` so each lands in a different lane and in the tail */
static void all_patterns(int shift) {
    enum { N = 65536 + 45 };
    uint16_t *x = malloc(sizeof(uint16_t) * N);
    CHECK(x != NULL);
    if (!x) return;
    for (int64_t i = 0; i < N; i++) x[i] = (uint16_t)(i + shift);
    em_scope sc = em_scope_begin();
    em_tensor *t = em_from_data(x, EM_BF16, EM_SHAPE(N), EM_OPTS(.dtype = EM_BF16));
    em_tensor *y = em_relu(t);
    em_tensor *ref = em_to_dtype(em_relu(em_to_dtype(t, EM_F32)), EM_BF16); /* the float32 path */
    CHECK(y && ref && em_dtype_of(y) == EM_BF16);
    if (y && ref) {
        CHECK(count_bad(em_data_ptr(y), x, N, "relu") == 0);
        CHECK(count_bad(em_data_ptr(ref), x, N, "float32 path") == 0);
    }
    em_scope_end(sc);
    free(x);
}

static void test_all_patterns(void) {
    all_patterns(0);
    all_patterns(17);
    all_patterns(31);
}

static void test_sizes_strided(void) {
    static const int64_t sizes[] = {1, 31, 32, 33, 63, 64, 65, 300000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n);
        CHECK(x != NULL);
        if (!x) return;
        for (int64_t i = 0; i < n; i++) x[i] = (uint16_t)(i * 40503u + 7u); /* all over the patterns */
        em_scope sc = em_scope_begin();
        em_tensor *t = em_from_data(x, EM_BF16, EM_SHAPE(n), EM_OPTS(.dtype = EM_BF16));
        em_tensor *y = em_relu(t);
        CHECK(y && count_bad(em_data_ptr(y), x, n, "sizes") == 0);
        em_scope_end(sc);
        free(x);
    }
    /* a transposed input: the block path, the same bits */
    em_scope sc = em_scope_begin();
    uint16_t x[6 * 7];
    for (int i = 0; i < 42; i++) x[i] = (uint16_t)(i * 1561u + 0x7F70u);
    em_tensor *t = em_transpose(em_from_data(x, EM_BF16, EM_SHAPE(6, 7), EM_OPTS(.dtype = EM_BF16)), 0, 1);
    em_tensor *y = em_contiguous(em_relu(t)), *tc = em_contiguous(t);
    CHECK(y && tc && count_bad(em_data_ptr(y), em_data_ptr(tc), 42, "transposed") == 0);
    em_scope_end(sc);
}

/* flushed denormals: the float32 path again, so a negative subnormal reads as zero and stays */
static void test_flushed(void) {
    if (!em_set_flush_denormal(true)) {
        test_skip_case("flushed", "this CPU cannot flush denormals");
        return;
    }
    em_scope sc = em_scope_begin();
    uint16_t x[4] = {0x8001, 0x807F, 0x8080, 0x0001};
    em_tensor *y = em_relu(em_from_data(x, EM_BF16, EM_SHAPE(4), EM_OPTS(.dtype = EM_BF16)));
    const uint16_t *d = y ? em_data_ptr(y) : NULL;
    CHECK(d != NULL);
    if (d) {
        CHECK(d[2] == 0);      /* a normal negative: +0 */
        CHECK(d[3] == 0x0001); /* a positive subnormal is kept */
        /* a negative subnormal compares as zero under DAZ: the float32 path's own answer */
        em_tensor *ref = em_to_dtype(em_relu(em_to_dtype(em_from_data(x, EM_BF16, EM_SHAPE(4), EM_OPTS(.dtype = EM_BF16)),
                                                         EM_F32)), EM_BF16);
        CHECK(ref && memcmp(em_data_ptr(ref), d, sizeof x) == 0);
    }
    em_scope_end(sc);
    em_set_flush_denormal(false);
}

int main(void) {
    em_set_num_threads(2);
    RUN(test_all_patterns);
    RUN(test_sizes_strided);
    RUN(test_flushed);
    return test_summary();
}
