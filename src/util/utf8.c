/* UTF-8 validation by the table of well-formed byte sequences (Unicode's Table 3-7). */
#include "utf8.h"

#include <stdint.h>

bool em__utf8_valid(const char *s, size_t n, size_t *bad) {
    const uint8_t *b = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = b[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;   /* the range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;          /* overlong below U+0800 */
            else if (c == 0xED) hi = 0x9F;     /* surrogates U+D800..U+DFFF */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;          /* overlong below U+10000 */
            else if (c == 0xF4) hi = 0x8F;     /* above U+10FFFF */
        } else {                               /* a continuation byte, C0/C1 or F5..FF */
            if (bad) *bad = i;
            return false;
        }
        bool ok = n - i >= len && b[i + 1] >= lo && b[i + 1] <= hi;
        for (size_t k = 2; ok && k < len; k++) ok = b[i + k] >= 0x80 && b[i + k] <= 0xBF;
        if (!ok) {
            if (bad) *bad = i;
            return false;
        }
        i += len;
    }
    return true;
}
