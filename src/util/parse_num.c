/* Whole-string numbers with range checks (see include/ember/parse.h). */
#include <ember/parse.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A decimal integer's text: optional sign (when allowed), then one or more digits, nothing
 * else. Checked by hand because strto* skip spaces and stop silently at garbage. */
static em_num_result int_syntax(const char *s, bool sign_ok) {
    if (!s || !*s) return EM_NUM_EMPTY;
    const char *p = s;
    if (*p == '-' || *p == '+') {
        if (!sign_ok) return EM_NUM_SYNTAX;
        p++;
    }
    if (!*p) return EM_NUM_SYNTAX;
    for (; *p; p++)
        if (!isdigit((unsigned char)*p)) return EM_NUM_SYNTAX;
    return EM_NUM_OK;
}

em_num_result em_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    em_num_result r = int_syntax(s, true);
    if (r != EM_NUM_OK) return r;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < min || v > max) return EM_NUM_RANGE;
    if (out) *out = (int64_t)v;
    return EM_NUM_OK;
}

em_num_result em_parse_u64(const char *s, uint64_t max, uint64_t *out) {
    em_num_result r = int_syntax(s, false);
    if (r == EM_NUM_SYNTAX && s[0] == '-' && int_syntax(s, true) == EM_NUM_OK) return EM_NUM_RANGE;
    if (r != EM_NUM_OK) return r;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v > max) return EM_NUM_RANGE;
    if (out) *out = (uint64_t)v;
    return EM_NUM_OK;
}

em_num_result em_parse_f64(const char *s, double min, double max, double *out) {
    if (!s || !*s) return EM_NUM_EMPTY;
    /* strtod also reads " 1", "inf", "nan" and "0x1p3": none of those is an option's number */
    const char *p = s + (*s == '-' || *s == '+');
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1]))) return EM_NUM_SYNTAX;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) return EM_NUM_SYNTAX;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end) return EM_NUM_SYNTAX;
    /* ERANGE is also set for underflow to a tiny value, which is in range when 0 is */
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0) || !(v >= min && v <= max)) return EM_NUM_RANGE;
    if (out) *out = v;
    return EM_NUM_OK;
}

const char *em_num_why(em_num_result r) {
    switch (r) {
    case EM_NUM_OK: return "valid";
    case EM_NUM_EMPTY: return "empty";
    case EM_NUM_SYNTAX: return "not a number";
    case EM_NUM_RANGE: return "out of range";
    }
    return "not valid";
}
