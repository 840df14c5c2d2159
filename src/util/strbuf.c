/* See strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

em_strbuf em__sb_fixed(char *buf, size_t size) {
    em_strbuf b = {.s = buf, .cap = buf ? size : 0};
    return b;
}

em_strbuf em__sb_growing(void) { return (em_strbuf){.growing = true}; }

/* Room for n more bytes and the NUL; false when a growing buffer cannot have it. */
static bool reserve(em_strbuf *b, size_t n) {
    if (b->oom) return false;
    if (!b->growing || b->len + n + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->s = p;
    b->cap = cap;
    return true;
}

void em__sb_put(em_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (b->len < b->cap) { /* fixed: copy what fits, keep the text terminated */
        size_t fit = b->cap - b->len - 1 < n ? b->cap - b->len - 1 : n;
        memcpy(b->s + b->len, s, fit);
        b->s[b->len + fit] = '\0';
    }
    b->len += n;
}

void em__sb_str(em_strbuf *b, const char *s) { em__sb_put(b, s, strlen(s)); }

void em__sb_spaces(em_strbuf *b, int n) {
    static const char spaces[] = "                                ";
    while (n > 0) {
        int k = n < (int)sizeof spaces - 1 ? n : (int)sizeof spaces - 1;
        em__sb_put(b, spaces, (size_t)k);
        n -= k;
    }
}

void em__sb_printf(em_strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    size_t room = b->len < b->cap ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->s + b->len : NULL, room, fmt, ap);
    if (n > 0 && b->growing && (size_t)n >= room) { /* did not fit: grow and write again */
        if (reserve(b, (size_t)n)) vsnprintf(b->s + b->len, (size_t)n + 1, fmt, again);
        else n = 0;
    }
    va_end(again);
    va_end(ap);
    if (n > 0) b->len += (size_t)n;
}

void em__sb_free(em_strbuf *b) {
    if (b->growing) free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

void em__sb_json_string(em_strbuf *b, const char *s) {
    em__sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            em__sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            em__sb_put(b, esc, 6);
        } else {
            em__sb_put(b, (const char *)&c, 1);
        }
    }
    em__sb_put(b, "\"", 1);
}

void em__json_fputs(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}
