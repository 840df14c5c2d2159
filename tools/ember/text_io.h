/* What the commands that read text and write JSON share: a whole file (or standard input)
 * read into memory, and JSON strings and id lists written as they are. */
#ifndef EMBER_TOOL_TEXT_IO_H
#define EMBER_TOOL_TEXT_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The whole of path ("-": standard input), NUL-terminated, its length (without the NUL) in
 * *len; NULL after a message "TOOL: PATH: why" on standard error. The caller frees it. */
char *tool_read_all(const char *tool, const char *path, size_t *len);
/* s[0..n) as a JSON string: quotes, backslashes and control characters escaped, every other
 * byte as it is (UTF-8 text stays UTF-8). */
void tool_json_string(FILE *f, const char *s, size_t n);
/* ids[0..n) as a JSON array of integers. */
void tool_json_ids(FILE *f, const int64_t *ids, int64_t n);

#endif
