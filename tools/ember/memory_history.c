/* A reader for the memory history's JSON (memory_history.h): a small recursive-descent JSON
 * parser that keeps what the timeline needs ("columns", "events", "dropped", "format") and
 * skips every other value, whatever it holds. */
#include "memory_history.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
    const char *start, *s, *end;
    char *why;
    size_t why_size;
    bool failed;
} reader;

static bool fail(reader *r, const char *what) {
    if (!r->failed) snprintf(r->why, r->why_size, "at byte %zu: %s", (size_t)(r->s - r->start), what);
    r->failed = true;
    return false;
}

static void ws(reader *r) {
    while (r->s < r->end && (*r->s == ' ' || *r->s == '\t' || *r->s == '\n' || *r->s == '\r')) r->s++;
}

static bool lit(reader *r, char c) {
    ws(r);
    if (r->s < r->end && *r->s == c) {
        r->s++;
        return true;
    }
    return false;
}

/* A string into out (truncated to size, always terminated); escapes decoded, \u as UTF-8. */
static bool string(reader *r, char *out, size_t size) {
    ws(r);
    if (r->s >= r->end || *r->s != '"') return fail(r, "expected a string");
    r->s++;
    size_t n = 0;
    while (r->s < r->end && *r->s != '"') {
        unsigned c = (unsigned char)*r->s++;
        if (c == '\\') {
            if (r->s >= r->end) break;
            char e = *r->s++;
            const char *map = "\"\"\\\\//b\bf\fn\nr\rt\t";
            const char *m = strchr(map, e);
            if (e == 'u') {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    if (r->s >= r->end) return fail(r, "a \\u escape ends early");
                    char h = *r->s++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                         : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                    if (v > 0xffff) return fail(r, "a bad \\u escape");
                }
                unsigned char buf[3];
                int len = v < 0x80 ? 1 : v < 0x800 ? 2 : 3;
                if (len == 1) buf[0] = (unsigned char)v;
                else if (len == 2) buf[0] = (unsigned char)(0xc0 | v >> 6), buf[1] = (unsigned char)(0x80 | (v & 0x3f));
                else buf[0] = (unsigned char)(0xe0 | v >> 12), buf[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f)),
                     buf[2] = (unsigned char)(0x80 | (v & 0x3f));
                for (int k = 0; k < len; k++)
                    if (n + 1 < size) out[n++] = (char)buf[k];
                continue;
            }
            if (!m || (m - map) % 2) return fail(r, "a bad escape in a string");
            c = (unsigned char)m[1];
        } else if (c < 0x20) {
            return fail(r, "a control character in a string");
        }
        if (n + 1 < size) out[n++] = (char)c;
    }
    if (r->s >= r->end) return fail(r, "a string does not end");
    r->s++;
    if (size) out[n] = '\0';
    return true;
}

static bool number(reader *r, double *out) {
    ws(r);
    if (r->s >= r->end || !(*r->s == '-' || (*r->s >= '0' && *r->s <= '9'))) return fail(r, "expected a number");
    char buf[64];
    size_t n = 0;
    while (r->s < r->end && n + 1 < sizeof buf && strchr("+-0123456789.eE", *r->s)) buf[n++] = *r->s++;
    buf[n] = '\0';
    char *end;
    errno = 0;
    *out = strtod(buf, &end);
    if (*end || errno == ERANGE) return fail(r, "a malformed number");
    return true;
}

static bool skip(reader *r, int depth) {
    ws(r);
    if (depth > 64) return fail(r, "values nested too deeply");
    if (r->s >= r->end) return fail(r, "the text ends early");
    char c = *r->s;
    if (c == '"') {
        char scratch[1];
        return string(r, scratch, sizeof scratch);
    }
    if (c == '{' || c == '[') {
        r->s++;
        char close = c == '{' ? '}' : ']';
        if (lit(r, close)) return true;
        do {
            if (c == '{') {
                char scratch[1];
                if (!string(r, scratch, sizeof scratch) || !lit(r, ':')) return fail(r, "expected \"key\": value");
            }
            if (!skip(r, depth + 1)) return false;
        } while (lit(r, ','));
        return lit(r, close) || fail(r, c == '{' ? "expected , or }" : "expected , or ]");
    }
    for (const char *const *w = (const char *const[]){"true", "false", "null", NULL}; *w; w++)
        if ((size_t)(r->end - r->s) >= strlen(*w) && !strncmp(r->s, *w, strlen(*w))) {
            r->s += strlen(*w);
            return true;
        }
    double d;
    return number(r, &d);
}

enum { C_T, C_ACTION, C_DEVICE, C_STREAM, C_ADDRESS, C_SIZE, C_TAG, C_ALLOCATED, C_RESERVED, C_COUNT };
static const char *const needed[C_COUNT] = {"time_ns", "action", "device", "stream", "address", "size", "tag",
                                            "allocated", "reserved"};

static bool columns(reader *r, int *where, int *ncols) {
    for (int k = 0; k < C_COUNT; k++) where[k] = -1;
    if (!lit(r, '[')) return fail(r, "\"columns\" is not a list");
    *ncols = 0;
    if (lit(r, ']')) return true;
    do {
        char name[64];
        if (!string(r, name, sizeof name)) return false;
        for (int k = 0; k < C_COUNT; k++)
            if (!strcmp(name, needed[k])) where[k] = *ncols;
        (*ncols)++;
    } while (lit(r, ','));
    return lit(r, ']') || fail(r, "expected , or ] in \"columns\"");
}

static bool row(reader *r, const int *where, int ncols, mh_event *e) {
    memset(e, 0, sizeof *e);
    if (!lit(r, '[')) return fail(r, "an event is not a list");
    for (int i = 0; i < ncols; i++) {
        if (i && !lit(r, ',')) return fail(r, "an event has fewer values than \"columns\" names");
        int k = -1;
        for (int c = 0; c < C_COUNT; c++)
            if (where[c] == i) k = c;
        double d = 0;
        char text[48];
        bool ok = k == C_ACTION ? string(r, text, sizeof text)
                : k == C_DEVICE ? string(r, e->device, sizeof e->device)
                : k == C_TAG ? string(r, e->tag, sizeof e->tag)
                : k >= 0 ? number(r, &d) : skip(r, 1);
        if (!ok) return false;
        if (k == C_ACTION) {
            if (strcmp(text, "alloc") && strcmp(text, "free")) return fail(r, "an action is neither alloc nor free");
            e->alloc = !strcmp(text, "alloc");
        }
        if (k == C_T) e->t_ns = d;
        if (k == C_STREAM) e->stream = (int)d;
        if (k == C_ADDRESS) e->address = (uint64_t)d;
        if (k == C_SIZE) e->size = (int64_t)d;
        if (k == C_ALLOCATED) e->allocated = (int64_t)d;
        if (k == C_RESERVED) e->reserved = (int64_t)d;
    }
    return lit(r, ']') || fail(r, "an event has more values than \"columns\" names");
}

/* The rows of "events" into h. */
static bool events(reader *r, const int *where, int ncols, mh_history *h) {
    for (int k = 0; k < C_COUNT; k++)
        if (where[k] < 0) {
            snprintf(r->why, r->why_size, "\"columns\" lacks \"%s\"", needed[k]);
            r->failed = true;
            return false;
        }
    if (!lit(r, '[')) return fail(r, "\"events\" is not a list");
    if (lit(r, ']')) return true;
    size_t cap = 0;
    do {
        if (h->n == cap) {
            cap = cap ? 2 * cap : 1024;
            mh_event *grown = realloc(h->events, cap * sizeof *grown);
            if (!grown) return fail(r, "out of memory reading the events");
            h->events = grown;
        }
        if (!row(r, where, ncols, &h->events[h->n])) return false;
        h->n++;
    } while (lit(r, ','));
    return lit(r, ']') || fail(r, "expected , or ] in \"events\"");
}

bool mh_parse(const char *text, size_t len, mh_history *h, char *why, size_t why_size) {
    reader r = {.start = text, .s = text, .end = text + len, .why = why, .why_size = why_size};
    memset(h, 0, sizeof *h);
    int where[C_COUNT], ncols = -1;
    bool format = false, have_events = false;
    if (!lit(&r, '{')) {
        fail(&r, "expected a JSON object");
        goto bad;
    }
    if (!lit(&r, '}')) do {
        char key[64];
        if (!string(&r, key, sizeof key) || !lit(&r, ':')) {
            fail(&r, "expected \"key\": value");
            goto bad;
        }
        if (!strcmp(key, "format")) {
            char f[64];
            if (!string(&r, f, sizeof f)) goto bad;
            if (strcmp(f, "ember-memory-history")) {
                fail(&r, "\"format\" is not \"ember-memory-history\"");
                goto bad;
            }
            format = true;
        } else if (!strcmp(key, "dropped")) {
            double d;
            if (!number(&r, &d)) goto bad;
            h->dropped = (int64_t)d;
        } else if (!strcmp(key, "columns")) {
            if (!columns(&r, where, &ncols)) goto bad;
        } else if (!strcmp(key, "events")) {
            if (ncols < 0) {
                fail(&r, "\"events\" comes before \"columns\"");
                goto bad;
            }
            if (!events(&r, where, ncols, h)) goto bad;
            have_events = true;
        } else if (!skip(&r, 1)) {
            goto bad;
        }
    } while (lit(&r, ','));
    if (!lit(&r, '}')) {
        fail(&r, "expected , or }");
        goto bad;
    }
    ws(&r);
    if (r.s != r.end) {
        fail(&r, "text after the object");
        goto bad;
    }
    if (!format || !have_events) {
        snprintf(why, why_size, "not a memory history: %s", !format ? "no \"format\": \"ember-memory-history\""
                                                                    : "no \"events\"");
        goto bad;
    }
    return true;
bad:
    mh_free(h);
    return false;
}

void mh_free(mh_history *h) {
    free(h->events);
    memset(h, 0, sizeof *h);
}
