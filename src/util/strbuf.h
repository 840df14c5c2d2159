/* Appending text to a buffer, for every layer (src/util has no dependencies inside Ember).
 * Two kinds:
 *  - fixed: the caller's char[size], with snprintf's contract: what fits is written and
 *    NUL-terminated, and len counts the whole text, so a caller can report the size needed;
 *  - growing: heap memory doubled as needed; if it cannot grow, oom is set and later appends
 *    do nothing (check oom once at the end). The text is NUL-terminated; free it with
 *    em__sb_free or keep b.s. */
#ifndef EM_UTIL_STRBUF_H
#define EM_UTIL_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct em_strbuf {
    char *s;
    size_t len;     /* bytes of text appended (fixed: may exceed what fit) */
    size_t cap;     /* bytes of s */
    bool growing;
    bool oom;       /* growing: an allocation failed */
} em_strbuf;

/* A fixed buffer over buf[size] (buf may be NULL with size 0: only counts). */
em_strbuf em__sb_fixed(char *buf, size_t size);
/* An empty growing buffer (allocates at the first append). */
em_strbuf em__sb_growing(void);
void em__sb_put(em_strbuf *b, const char *s, size_t n);
void em__sb_str(em_strbuf *b, const char *s);
void em__sb_spaces(em_strbuf *b, int n);
/* s as a JSON string: in quotes, '"' and '\\' escaped, control characters as \u00XX (the
 * other bytes as they are: the caller's text is UTF-8). */
void em__sb_json_string(em_strbuf *b, const char *s);
/* The same JSON string written to f. */
void em__json_fputs(FILE *f, const char *s);
void em__sb_printf(em_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees a growing buffer's memory (nothing for a fixed one). */
void em__sb_free(em_strbuf *b);

#endif
