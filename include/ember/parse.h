/* Whole-string numbers with range checks: the one parser behind every number Ember reads from
 * a file, an option or the environment, public so that programs built on Ember (the `ember`
 * command among them) read theirs the same way. Why not strtol and friends: strtoll/strtoull/strtod alone accept leading spaces, trailing
 * garbage and (strtoull) "-1", and saturate or wrap on overflow. */
#ifndef EMBER_PARSE_H
#define EMBER_PARSE_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>

/* How parsing a number went. */
typedef enum em_num_result {
    EM_NUM_OK = 0,
    EM_NUM_EMPTY,      /* NULL or "" */
    EM_NUM_SYNTAX,     /* not a number, or something after it */
    EM_NUM_RANGE,      /* a number outside [min, max] (overflow included) */
} em_num_result;

/* A decimal integer (optional leading '-' or '+') in [min, max]; *out is set only on OK. */
EM_API em_num_result em_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/* A decimal integer with no sign in [0, max]. */
EM_API em_num_result em_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* A finite decimal number (no inf, nan or hex) in [min, max]. */
EM_API em_num_result em_parse_f64(const char *s, double min, double max, double *out);
/* "empty", "not a number", "out of range": for messages. */
EM_API const char *em_num_why(em_num_result r);

#endif
