/* UTF-8 validation, for formats whose text must be UTF-8 (safetensors headers). */
#ifndef EM_UTIL_UTF8_H
#define EM_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Whether s[0..n) is well-formed UTF-8 as Unicode defines it (RFC 3629): no overlong forms,
 * no UTF-16 surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no sequence cut short.
 * When not, *bad (if not NULL) gets the offset of the first byte of the bad sequence. */
bool em__utf8_valid(const char *s, size_t n, size_t *bad);

#endif
