/* A small, bounded JSON parser for file headers (safetensors) and whole JSON files (a
 * model folder's tokenizer.json and configs, read by src/models). Nesting is limited to
 * EM__JSON_MAX_DEPTH, so hostile input cannot exhaust the stack. */
#ifndef EM_DATA_JSON_H
#define EM_DATA_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/error.h>

#define EM__JSON_MAX_DEPTH 32

typedef enum em__json_type {
    EM__JSON_NULL, EM__JSON_BOOL, EM__JSON_NUMBER, EM__JSON_STRING, EM__JSON_ARRAY,
    EM__JSON_OBJECT
} em__json_type;

typedef struct em__json {
    em__json_type type;
    size_t at;              /* offset of the value's first byte in the parsed text */
    bool b;                 /* BOOL */
    double num;             /* NUMBER */
    bool is_uint;           /* NUMBER written as a non-negative integer that fits in u */
    uint64_t u;
    char *str;              /* STRING: decoded UTF-8, NUL-terminated (no NUL inside) */
    size_t len;
    int count;              /* ARRAY / OBJECT */
    struct em__json *items; /* count values */
    char **keys;            /* OBJECT: count keys (decoded, no duplicates) */
} em__json;

/* Parse text[0..n) as one JSON value followed only by whitespace. Errors read
 * "<name>: bad JSON header at byte <base + offset>: ...". */
em_status em__json_parse(const char *name, const char *text, size_t n, size_t base, em__json *out);
/* The same for a whole file: errors read "<name>: bad JSON at byte <offset>: ...". */
em_status em__json_parse_file(const char *name, const char *text, size_t n, em__json *out);
void em__json_free(em__json *j);
/* The value of key in an object, or NULL. */
const em__json *em__json_get(const em__json *obj, const char *key);

#endif
