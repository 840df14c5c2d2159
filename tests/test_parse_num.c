/* src/util/parse_num: every number Ember reads (options, checkpoint metadata, environment)
 * is a whole string in range; strtoll/strtod alone accept garbage and overflow. */
#include <float.h>
#include "test.h"
#include <ember/parse.h>

static void test_integers(void) {
    int64_t v = 7;
    CHECK(em_parse_i64("0", 0, 10, &v) == EM_NUM_OK && v == 0);
    CHECK(em_parse_i64("-5", -10, 10, &v) == EM_NUM_OK && v == -5);
    CHECK(em_parse_i64("+5", -10, 10, &v) == EM_NUM_OK && v == 5);
    CHECK(em_parse_i64("9223372036854775807", 0, INT64_MAX, &v) == EM_NUM_OK && v == INT64_MAX);
    CHECK(em_parse_i64("-9223372036854775808", INT64_MIN, 0, &v) == EM_NUM_OK && v == INT64_MIN);
    v = 7;
    /* the checkpoint's train.epoch that used to resume at epoch -9223372036854775808 */
    CHECK(em_parse_i64("99999999999999999999", 0, INT64_MAX, &v) == EM_NUM_RANGE);
    CHECK(em_parse_i64("9223372036854775808", 0, INT64_MAX, &v) == EM_NUM_RANGE);
    CHECK(em_parse_i64("-1", 0, 10, &v) == EM_NUM_RANGE);
    CHECK(em_parse_i64("11", 0, 10, &v) == EM_NUM_RANGE);
    CHECK(em_parse_i64("", 0, 10, &v) == EM_NUM_EMPTY);
    CHECK(em_parse_i64(NULL, 0, 10, &v) == EM_NUM_EMPTY);
    static const char *garbage[] = {"1x", " 1", "1 ", "0x10", "1.0", "1e3", "-", "+", "--1", "1,000", "١"};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        bool ok = em_parse_i64(garbage[i], INT64_MIN, INT64_MAX, &v) == EM_NUM_SYNTAX;
        if (!ok) fprintf(stderr, "  '%s' was accepted as an integer\n", garbage[i]);
        CHECK(ok);
    }
    CHECK(v == 7);   /* never written on failure */
}

static void test_unsigned(void) {
    uint64_t u = 3;
    CHECK(em_parse_u64("18446744073709551615", UINT64_MAX, &u) == EM_NUM_OK && u == UINT64_MAX);
    CHECK(em_parse_u64("18446744073709551616", UINT64_MAX, &u) == EM_NUM_RANGE);
    CHECK(em_parse_u64("-1", UINT64_MAX, &u) == EM_NUM_RANGE);   /* strtoull wraps it to 2^64-1 */
    CHECK(em_parse_u64("+1", UINT64_MAX, &u) == EM_NUM_SYNTAX);
    CHECK(em_parse_u64("256", 255, &u) == EM_NUM_RANGE);
    CHECK(u == UINT64_MAX);
}

static void test_reals(void) {
    double d = 0;
    CHECK(em_parse_f64("0.001", 0, 10, &d) == EM_NUM_OK && d == 0.001);
    CHECK(em_parse_f64("1e-3", 0, 10, &d) == EM_NUM_OK && d == 1e-3);
    CHECK(em_parse_f64(".5", 0, 10, &d) == EM_NUM_OK && d == 0.5);
    CHECK(em_parse_f64("-2.5", -10, 10, &d) == EM_NUM_OK && d == -2.5);
    CHECK(em_parse_f64("1e-320", 0, 10, &d) == EM_NUM_OK);           /* subnormal: in range */
    CHECK(em_parse_f64("1e999", 0, DBL_MAX, &d) == EM_NUM_RANGE);
    CHECK(em_parse_f64("-0.1", 0, 10, &d) == EM_NUM_RANGE);
    CHECK(em_parse_f64("10.5", 0, 10, &d) == EM_NUM_RANGE);
    static const char *garbage[] = {"inf", "nan", "-inf", "0x1p3", " 1", "1 ", "1e", "1.0.0", "abc", ".", "e5", "1f"};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        em_num_result r = em_parse_f64(garbage[i], -DBL_MAX, DBL_MAX, &d);
        if (r == EM_NUM_OK) fprintf(stderr, "  '%s' was accepted as a number\n", garbage[i]);
        CHECK(r != EM_NUM_OK);
    }
    CHECK(em_parse_f64("", 0, 1, &d) == EM_NUM_EMPTY);
    CHECK(strcmp(em_num_why(EM_NUM_RANGE), "out of range") == 0);
}

int main(void) {
    RUN(test_integers);
    RUN(test_unsigned);
    RUN(test_reals);
    return test_summary();
}
