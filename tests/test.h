/* A tiny test harness: each tests/test_*.c is one program.
 *   static void test_add(void) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 *   int main(void) { RUN(test_add); return test_summary(); }
 * A failed check prints file:line and the expression, and the test goes on.
 * The summary is the plain line "N passed, N failed" that CI reads. */
#ifndef EMBER_TEST_H
#define EMBER_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <ember/ember.h>

static int test__checks_failed_in_case;
static int test__passed, test__failed;

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

#define RUN(fn)                                                                      \
    do {                                                                             \
        test__checks_failed_in_case = 0;                                             \
        em_clear_error();                                                            \
        fn();                                                                        \
        if (em_failed()) {                                                           \
            fprintf(stderr, "  %s left an error pending: %s\n", #fn, em_last_error()); \
            test__checks_failed_in_case++;                                           \
            em_clear_error();                                                        \
        }                                                                            \
        if (test__checks_failed_in_case) {                                           \
            test__failed++;                                                          \
            fprintf(stderr, "FAIL %s\n", #fn);                                       \
        } else {                                                                     \
            test__passed++;                                                          \
            printf("ok   %s\n", #fn);                                                \
        }                                                                            \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test__passed, test__failed);
    return test__failed ? 1 : 0;
}

#endif
