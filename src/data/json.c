/* Recursive descent JSON (RFC 8259) with a depth limit; every read is bounds-checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "../core/internal_api.h"

typedef struct jp {
    const char *name;
    const char *what;   /* "JSON header" (safetensors), "JSON" (a whole file) */
    const char *s;
    size_t n, i, base;
} jp;

static em_status jfail(jp *p, size_t at, const char *what) {
    return em_error(EM_ERR_FORMAT, "%s: bad %s at byte %zu: %s", p->name, p->what, p->base + at, what);
}

static void jws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(jp *p, size_t at, unsigned *v) {
    if (p->n - at < 4) return false;
    unsigned r = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[at + k]);
        if (h < 0) return false;
        r = r << 4 | (unsigned)h;
    }
    *v = r;
    return true;
}

static em_status parse_string(jp *p, char **out, size_t *out_len) {
    size_t start = p->i;  /* at the opening quote */
    p->i++;
    /* the decoded string is never longer than the encoded one */
    size_t end = p->i;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->n) return jfail(p, start, "unterminated string");
    char *buf = malloc(end - p->i + 1);
    if (!buf) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory parsing JSON", p->name);
    size_t k = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            free(buf);
            return jfail(p, p->i, "control character inside a string");
        }
        if (c != '\\') {
            buf[k++] = (char)c;
            p->i++;
            continue;
        }
        size_t esc = p->i;
        char e = p->s[p->i + 1];  /* in range: the scan above stepped over pairs */
        p->i += 2;
        switch (e) {
        case '"': buf[k++] = '"'; break;
        case '\\': buf[k++] = '\\'; break;
        case '/': buf[k++] = '/'; break;
        case 'b': buf[k++] = '\b'; break;
        case 'f': buf[k++] = '\f'; break;
        case 'n': buf[k++] = '\n'; break;
        case 'r': buf[k++] = '\r'; break;
        case 't': buf[k++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (p->i + 4 > end || !read_hex4(p, p->i, &cp)) {
                free(buf);
                return jfail(p, esc, "bad \\u escape: expected 4 hex digits");
            }
            p->i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->i + 6 > end || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                    !read_hex4(p, p->i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    free(buf);
                    return jfail(p, esc, "unpaired UTF-16 surrogate in \\u escape");
                }
                p->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(buf);
                return jfail(p, esc, "unpaired UTF-16 surrogate in \\u escape");
            }
            if (cp == 0) {
                free(buf);
                return jfail(p, esc, "\\u0000 is not allowed in a string");
            }
            /* 6 encoded bytes always cover the (at most 4) UTF-8 bytes written */
            if (cp < 0x80) buf[k++] = (char)cp;
            else if (cp < 0x800) {
                buf[k++] = (char)(0xC0 | cp >> 6);
                buf[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[k++] = (char)(0xE0 | cp >> 12);
                buf[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[k++] = (char)(0xF0 | cp >> 18);
                buf[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[k++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            free(buf);
            return jfail(p, esc, "bad escape sequence in a string");
        }
    }
    buf[k] = 0;
    p->i = end + 1;
    *out = buf;
    *out_len = k;
    return EM_OK;
}

static em_status parse_number(jp *p, em__json *out) {
    size_t start = p->i, i = p->i;
    bool neg = false, integer = true;
    if (i < p->n && p->s[i] == '-') { neg = true; i++; }
    if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return jfail(p, start, "bad number");
    if (p->s[i] == '0') i++;
    else while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    if (i < p->n && p->s[i] == '.') {
        integer = false;
        i++;
        if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return jfail(p, start, "bad number: digits expected after '.'");
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integer = false;
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return jfail(p, start, "bad number: digits expected in the exponent");
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    char tmp[64];
    if (i - start >= sizeof tmp) return jfail(p, start, "number too long");
    memcpy(tmp, p->s + start, i - start);
    tmp[i - start] = 0;
    out->type = EM__JSON_NUMBER;
    out->num = strtod(tmp, NULL);
    if (integer && !neg) {
        uint64_t u = 0;
        bool fits = true;
        for (size_t k = start; k < i; k++) {
            unsigned d = (unsigned)(p->s[k] - '0');
            if (u > (UINT64_MAX - d) / 10) { fits = false; break; }
            u = u * 10 + d;
        }
        out->is_uint = fits;
        out->u = fits ? u : 0;
    }
    p->i = i;
    return EM_OK;
}

static em_status parse_value(jp *p, em__json *out, int depth);

static em_status push_item(jp *p, em__json *parent, int *cap, em__json *item, char *key) {
    if (parent->count == *cap) {
        int nc = *cap ? *cap * 2 : 4;
        em__json *ni = realloc(parent->items, (size_t)nc * sizeof *ni);
        if (ni) parent->items = ni;
        char **nk = ni && parent->type == EM__JSON_OBJECT ? realloc(parent->keys, (size_t)nc * sizeof *nk) : NULL;
        if (nk) parent->keys = nk;
        if (!ni || (parent->type == EM__JSON_OBJECT && !nk)) {
            em__json_free(item);
            free(key);
            return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory parsing JSON", p->name);
        }
        *cap = nc;
    }
    parent->items[parent->count] = *item;
    if (parent->type == EM__JSON_OBJECT) parent->keys[parent->count] = key;
    parent->count++;
    return EM_OK;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* Duplicate keys are an error; sorting pointers to the keys finds them in n log n. */
static em_status check_duplicates(jp *p, const em__json *obj) {
    if (obj->count < 2) return EM_OK;
    char **(*sorted) = malloc((size_t)obj->count * sizeof *sorted);
    if (!sorted) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory parsing JSON", p->name);
    for (int k = 0; k < obj->count; k++) sorted[k] = &obj->keys[k];
    qsort(sorted, (size_t)obj->count, sizeof *sorted, cmp_key);
    em_status s = EM_OK;
    for (int k = 1; k < obj->count && s == EM_OK; k++)
        if (strcmp(*sorted[k - 1], *sorted[k]) == 0) {
            size_t later = sorted[k] > sorted[k - 1] ? (size_t)(sorted[k] - obj->keys) : (size_t)(sorted[k - 1] - obj->keys);
            char msg[200];
            snprintf(msg, sizeof msg, "duplicate key \"%.100s\" in an object", *sorted[k]);
            s = jfail(p, obj->items[later].at, msg);
        }
    free(sorted);
    return s;
}

static em_status parse_container(jp *p, em__json *out, int depth) {
    bool obj = p->s[p->i] == '{';
    char close = obj ? '}' : ']';
    out->type = obj ? EM__JSON_OBJECT : EM__JSON_ARRAY;
    p->i++;
    int cap = 0;
    jws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return EM_OK;
    }
    for (;;) {
        char *key = NULL;
        jws(p);
        if (obj) {
            if (p->i >= p->n || p->s[p->i] != '"') return jfail(p, p->i, "expected a string key");
            size_t key_len;
            em_status s = parse_string(p, &key, &key_len);
            if (s != EM_OK) return s;
            jws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                return jfail(p, p->i, "expected ':' after an object key");
            }
            p->i++;
        }
        em__json item;
        em_status s = parse_value(p, &item, depth + 1);
        if (s != EM_OK) {
            free(key);
            return s;
        }
        s = push_item(p, out, &cap, &item, key);
        if (s != EM_OK) return s;
        jws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return obj ? check_duplicates(p, out) : EM_OK;
        }
        return jfail(p, p->i, obj ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
    }
}

static em_status parse_value(jp *p, em__json *out, int depth) {
    memset(out, 0, sizeof *out);
    jws(p);
    out->at = p->i;
    if (depth > EM__JSON_MAX_DEPTH) return jfail(p, p->i, "nesting too deep");
    if (p->i >= p->n) return jfail(p, p->i, "unexpected end, expected a value");
    char c = p->s[p->i];
    em_status s;
    switch (c) {
    case '{':
    case '[':
        s = parse_container(p, out, depth);
        if (s != EM_OK) em__json_free(out);
        return s;
    case '"':
        out->type = EM__JSON_STRING;
        return parse_string(p, &out->str, &out->len);
    case 't':
    case 'f':
    case 'n': {
        const char *w = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t wl = strlen(w);
        if (p->n - p->i < wl || memcmp(p->s + p->i, w, wl) != 0) return jfail(p, p->i, "unexpected word");
        p->i += wl;
        out->type = c == 'n' ? EM__JSON_NULL : EM__JSON_BOOL;
        out->b = c == 't';
        return EM_OK;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
        return jfail(p, p->i, "unexpected character, expected a value");
    }
}

static em_status parse_document(jp p, em__json *out) {
    em_status s = parse_value(&p, out, 0);
    if (s != EM_OK) return s;
    jws(&p);
    if (p.i != p.n) {
        em__json_free(out);
        return jfail(&p, p.i, "unexpected text after the JSON value");
    }
    return EM_OK;
}

em_status em__json_parse(const char *name, const char *text, size_t n, size_t base, em__json *out) {
    jp p = {.name = name ? name : "<memory>", .what = "JSON header", .s = text, .n = text ? n : 0, .base = base};
    return parse_document(p, out);
}

em_status em__json_parse_file(const char *name, const char *text, size_t n, em__json *out) {
    jp p = {.name = name ? name : "<memory>", .what = "JSON", .s = text, .n = text ? n : 0};
    return parse_document(p, out);
}

void em__json_free(em__json *j) {
    if (!j) return;
    free(j->str);
    for (int k = 0; k < j->count; k++) {
        em__json_free(&j->items[k]);
        if (j->keys) free(j->keys[k]);
    }
    free(j->items);
    free(j->keys);
    memset(j, 0, sizeof *j);
}

const em__json *em__json_get(const em__json *obj, const char *key) {
    if (!obj || obj->type != EM__JSON_OBJECT) return NULL;
    for (int k = 0; k < obj->count; k++)
        if (strcmp(obj->keys[k], key) == 0) return &obj->items[k];
    return NULL;
}
