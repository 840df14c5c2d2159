/* A tiny test harness: each tests/test_*.c is one program.
 *   static void test_add(void) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 *   static void test_gpu(void) { if (!have_gpu) SKIP("no GPU: %s", why); ... }
 *   int main(void) { RUN(test_add); RUN(test_gpu); return test_summary(); }
 * A failed check prints file:line and the expression, and the test goes on. A check that
 * fails outside any RUN (in main, before, between or after the cases) fails the program
 * too: it is counted as one failed case, "(outside any RUN)".
 * SKIP("why", ...) ends the current case as skipped (a failed check before it still fails
 * the case); test_skip_case("name", "why", ...) records a case that main decided not to run.
 * Each skip prints "SKIP name: why"; scripts/test.sh lists them at the end.
 * The summary is the plain line "N passed, N failed, N skipped" that CI reads. The exit
 * status is 1 when anything failed, TEST_SKIP_CODE (77, ctest's SKIP_RETURN_CODE) when
 * every case was skipped, else 0. */
#ifndef EMBER_TEST_H
#define EMBER_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* bf16 <-> float32 on the host, written apart from Ember's own conversions: round to nearest
 * even, a NaN stays a (quiet) NaN */
static inline uint16_t test_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static inline float test_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
#include <ember/ember.h>

#define TEST_SKIP_CODE 77

/* failed checks since the current case began (or, outside a case, since the last one ended) */
static int test__checks_failed_in_case;
static int test__passed, test__failed, test__skipped;
static int test__in_case;         /* inside RUN */
static char test__skip_reason[256]; /* set by SKIP in the current case */

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            test__checks_failed_in_case++;                                           \
        }                                                                            \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double test__a = (double)(a), test__b = (double)(b);                         \
        if (!(fabs(test__a - test__b) <= (tol))) {                                    \
            fprintf(stderr, "  %s:%d: %s = %.9g, expected %s = %.9g (tol %g)\n", __FILE__, \
                    __LINE__, #a, test__a, #b, test__b, (double)(tol));               \
            test__checks_failed_in_case++;                                           \
        }                                                                            \
    } while (0)

/* An Ember call that must succeed; on failure prints the pending error. */
#define CHECK_OK(expr)                                                               \
    do {                                                                             \
        em_status test__s = (expr);                                                  \
        if (test__s != EM_OK) {                                                      \
            fprintf(stderr, "  %s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,   \
                    em_last_error());                                                \
            test__checks_failed_in_case++;                                           \
        }                                                                            \
    } while (0)

/* A pending error of kind `code` whose message contains `substr`; clears it. */
#define CHECK_ERROR(code, substr)                                                    \
    do {                                                                             \
        if (em_last_status() != (code) || !strstr(em_last_error(), (substr))) {      \
            fprintf(stderr, "  %s:%d: expected error %s containing \"%s\", got %s: \"%s\"\n", \
                    __FILE__, __LINE__, em_status_name(code), (substr),              \
                    em_status_name(em_last_status()), em_last_error());              \
            test__checks_failed_in_case++;                                           \
        }                                                                            \
        em_clear_error();                                                            \
    } while (0)

/* Checks that failed outside any case count as one failed case. */
static inline void test__flush_outside(void) {
    if (test__in_case || !test__checks_failed_in_case) return;
    test__failed++;
    fprintf(stderr, "FAIL (outside any RUN): %d failed check(s)\n", test__checks_failed_in_case);
    test__checks_failed_in_case = 0;
}

static inline void test__vskip(const char *name, const char *fmt, va_list ap) {
    char why[sizeof test__skip_reason];
    vsnprintf(why, sizeof why, fmt, ap);
    if (test__in_case) {
        memcpy(test__skip_reason, why, sizeof why);
        return; /* RUN reports it when the case returns */
    }
    test__skipped++;
    printf("SKIP %s: %s\n", name, why[0] ? why : "(no reason given)");
}

/* Marks the current case skipped (it goes on: use SKIP to also return). Outside a case it
 * records one skipped case named "main". */
static inline void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    test__vskip("main", fmt, ap);
    va_end(ap);
}

/* A case main decided not to run, e.g. test_skip_case("replay cuda", "%s", why). */
static inline void test_skip_case(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void test_skip_case(const char *name, const char *fmt, ...) {
    test__flush_outside();
    int in = test__in_case;
    test__in_case = 0;
    va_list ap;
    va_start(ap, fmt);
    test__vskip(name, fmt, ap);
    va_end(ap);
    test__in_case = in;
}

/* Ends the current case (a void function) as skipped, with a printf-style reason. */
#define SKIP(...)                                                                    \
    do {                                                                             \
        test_skip(__VA_ARGS__);                                                      \
        return;                                                                      \
    } while (0)

static inline void test__begin(void) {
    test__flush_outside();
    test__in_case = 1;
    test__checks_failed_in_case = 0;
    test__skip_reason[0] = '\0';
    em_clear_error();
}

static inline void test__end(const char *name) {
    if (em_failed()) {
        fprintf(stderr, "  %s left an error pending: %s\n", name, em_last_error());
        test__checks_failed_in_case++;
        em_clear_error();
    }
    test__in_case = 0;
    if (test__checks_failed_in_case) {
        test__failed++;
        fprintf(stderr, "FAIL %s\n", name);
        if (test__skip_reason[0]) fprintf(stderr, "  (it then skipped: %s)\n", test__skip_reason);
    } else if (test__skip_reason[0]) {
        test__skipped++;
        printf("SKIP %s: %s\n", name, test__skip_reason);
    } else {
        test__passed++;
        printf("ok   %s\n", name);
    }
    test__checks_failed_in_case = 0;
    test__skip_reason[0] = '\0';
}

#define RUN(fn)                                                                      \
    do {                                                                             \
        test__begin();                                                               \
        fn();                                                                        \
        test__end(#fn);                                                              \
    } while (0)

static inline int test_summary(void) {
    test__flush_outside();
    printf("%d passed, %d failed, %d skipped\n", test__passed, test__failed, test__skipped);
    fflush(stdout);
    if (test__failed) return 1;
    return test__skipped && !test__passed ? TEST_SKIP_CODE : 0;
}

/* Do a and b hold the same bytes (same dtype and size; a copy to the host of each)? */
static inline bool test_same_bits(em_tensor *a, em_tensor *b) {
    if (!a || !b || em_dtype_of(a) != em_dtype_of(b) || em_numel(a) != em_numel(b)) return false;
    size_t n = (size_t)em_numel(a) * em_dtype_size(em_dtype_of(a));
    char *x = malloc(n + 1), *y = malloc(n + 1);
    bool ok = x && y && em_copy_to_host(a, x, n) == EM_OK && em_copy_to_host(b, y, n) == EM_OK && !memcmp(x, y, n);
    free(x);
    free(y);
    return ok;
}

#endif
