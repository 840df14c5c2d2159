/* Whole-string numbers with range checks, for every number Ember reads from a file, an
 * option or the environment: strtoll/strtoull/strtod alone accept leading spaces, trailing
 * garbage and (strtoull) "-1", and saturate or wrap on overflow. */
#ifndef EM_UTIL_PARSE_NUM_H
#define EM_UTIL_PARSE_NUM_H

#include <stdbool.h>
#include <stdint.h>

typedef enum em__num_result {
    EM__NUM_OK = 0,
    EM__NUM_EMPTY,      /* NULL or "" */
    EM__NUM_SYNTAX,     /* not a number, or something after it */
    EM__NUM_RANGE,      /* a number outside [min, max] (overflow included) */
} em__num_result;

/* A decimal integer (optional leading '-' or '+') in [min, max]; *out is set only on OK. */
em__num_result em__parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/* A decimal integer with no sign in [0, max]. */
em__num_result em__parse_u64(const char *s, uint64_t max, uint64_t *out);
/* A finite decimal number (no inf, nan or hex) in [min, max]. */
em__num_result em__parse_f64(const char *s, double min, double max, double *out);
/* "empty", "not a number", "out of range": for messages. */
const char *em__num_why(em__num_result r);

#endif
