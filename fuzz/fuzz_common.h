/* Shared by the libFuzzer targets: touch every byte a parser hands back, so that
 * AddressSanitizer sees any out-of-range pointer or length. */
#ifndef EMBER_FUZZ_COMMON_H
#define EMBER_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <ember/ember.h>
#include "data/parsers.h"

static inline unsigned fuzz_touch(const void *p, size_t n) {
    const volatile uint8_t *b = p;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) sum += b[i];
    return sum;
}

static inline void fuzz_check_array(const em__array *a) {
    int64_t numel = 1;
    for (int i = 0; i < a->ndim; i++) numel *= a->shape[i];
    if (numel != a->numel || (size_t)numel * em_dtype_size(a->dtype) != a->nbytes) __builtin_trap();
    fuzz_touch(a->data, a->nbytes);
}

/* A failed parse must leave a message; a successful one must leave none. */
static inline void fuzz_check_status(em_status s) {
    if ((s != EM_OK) != em_failed()) __builtin_trap();
    if (s != EM_OK && em_last_error()[0] == 0) __builtin_trap();
    em_clear_error();
}

#endif
