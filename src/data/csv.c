/* Numeric CSV: one sample per line, fields separated by a delimiter (',' by default),
 * optionally a header line of column names and a label column. Fields may be quoted
 * and padded with spaces. Lines and columns in messages count from 1. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parsers.h"
#include "../core/internal_api.h"

typedef struct csv_state {
    const char *name;
    const char *buf;
    size_t len;
    char delim;
    size_t line_no;      /* 1-based number of the current line */
    size_t line_start;   /* byte offset of the current line */
} csv_state;

/* A growing array of `elem`-byte values, bounded by EM__MAX_ARRAY_BYTES. */
typedef struct growbuf { void *p; size_t n, cap, elem; } growbuf;

static bool grow_push(growbuf *g, const void *v) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 1024;
        if ((uint64_t)cap * g->elem > EM__MAX_ARRAY_BYTES) return false;
        void *np = realloc(g->p, cap * g->elem);
        if (!np) return false;
        g->p = np;
        g->cap = cap;
    }
    memcpy((char *)g->p + g->n * g->elem, v, g->elem);
    g->n++;
    return true;
}

static bool is_space(char c) { return c == ' ' || c == '\t'; }

/* Show a field in a message: at most 40 characters, non-printable bytes as '?'. */
static void show_field(const char *f, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        if (i == 40) {
            memcpy(out + k, "...", 3);
            k += 3;
            break;
        }
        out[k++] = (f[i] >= 0x20 && f[i] < 0x7f) ? f[i] : '?';
    }
    out[k] = 0;
}

/* The field starting at *pos on a line ending at `end` (exclusive): trims spaces and
 * one level of double quotes (with "" inside as an escaped quote, kept verbatim).
 * Returns false with an error for an unterminated quote. *pos moves past the delimiter;
 * *last tells whether this was the line's final field. */
static bool next_field(csv_state *s, size_t *pos, size_t end, size_t *fstart, size_t *flen,
                       bool *last, int col) {
    size_t i = *pos;
    while (i < end && is_space(s->buf[i])) i++;
    if (i < end && s->buf[i] == '"') {
        size_t q = i + 1;
        for (;;) {
            if (q >= end) {
                em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): unterminated quote",
                         s->name, s->line_no, col, i);
                return false;
            }
            if (s->buf[q] == '"') {
                if (q + 1 < end && s->buf[q + 1] == '"') { q += 2; continue; }
                break;
            }
            q++;
        }
        *fstart = i + 1;
        *flen = q - (i + 1);
        i = q + 1;
        while (i < end && is_space(s->buf[i])) i++;
        if (i < end && s->buf[i] != s->delim) {
            em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): text after a closing quote",
                     s->name, s->line_no, col, i);
            return false;
        }
    } else {
        size_t j = i;
        while (j < end && s->buf[j] != s->delim) j++;
        size_t e = j;
        while (e > i && is_space(s->buf[e - 1])) e--;
        *fstart = i;
        *flen = e - i;
        i = j;
    }
    *last = i >= end;
    *pos = i < end ? i + 1 : end;
    return true;
}

static bool parse_number(csv_state *s, size_t fstart, size_t flen, int col, double *v) {
    char tmp[72], shown[64];
    if (flen == 0) {
        em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): empty field, expected a number",
                 s->name, s->line_no, col, fstart);
        return false;
    }
    if (flen >= sizeof tmp) {
        show_field(s->buf + fstart, flen, shown, sizeof shown);
        em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): '%s' is not a number (too long)",
                 s->name, s->line_no, col, fstart, shown);
        return false;
    }
    memcpy(tmp, s->buf + fstart, flen);
    tmp[flen] = 0;
    char *endp;
    errno = 0;
    *v = strtod(tmp, &endp);
    /* decimal only: strtod also reads hexadecimal ("0x10" as 16), which a CSV file's number
     * never is (NumPy and pandas read "0x10" as text) */
    if (endp != tmp + flen || is_space(tmp[0]) || strpbrk(tmp, "xX")) {
        show_field(s->buf + fstart, flen, shown, sizeof shown);
        em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): '%s' is not a number%s",
                 s->name, s->line_no, col, fstart, shown, strpbrk(tmp, "xX") ? " (decimal expected)" : "");
        return false;
    }
    if (errno == ERANGE && isinf(*v)) {
        show_field(s->buf + fstart, flen, shown, sizeof shown);
        em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): '%s' is out of range",
                 s->name, s->line_no, col, fstart, shown);
        return false;
    }
    return true;
}

/* Count the fields of the header line (their text is not checked). */
static bool count_fields(csv_state *s, size_t start, size_t end, int *ncols) {
    size_t pos = start, fs, fl;
    bool last = false;
    int col = 0;
    while (!last) {
        if (!next_field(s, &pos, end, &fs, &fl, &last, col + 1)) return false;
        if (col == INT32_MAX - 1) {
            em_error(EM_ERR_FORMAT, "%s: line %zu: too many columns", s->name, s->line_no);
            return false;
        }
        col++;
    }
    *ncols = col;
    return true;
}

em_status em__csv_parse(const char *name, const void *buf, size_t len, const em_csv_opts *o,
                        em__array *x, em__array *y) {
    memset(x, 0, sizeof *x);
    if (y) memset(y, 0, sizeof *y);
    if (!name) name = "<memory>";
    if (!buf && len) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL buffer", name);
    em_csv_opts opts = o ? *o : (em_csv_opts){0};
    csv_state s = {.name = name, .buf = buf, .len = len, .delim = opts.delimiter ? opts.delimiter : ','};
    if (s.delim == '"' || s.delim == '\n' || s.delim == '\r' || s.delim == ' ')
        return em_error(EM_ERR_ARGUMENT, "%s: CSV delimiter cannot be a quote, space or newline", name);
    bool want_label = y && opts.label_column != EM_CSV_NO_LABEL;
    int ncols = -1, label = -1;
    size_t rows = 0;
    growbuf gx = {.elem = sizeof(float)}, gy = {.elem = sizeof(int64_t)};
    em_status st = EM_OK;
    bool header_pending = opts.header;
    size_t pos = 0;
    while (pos < len && st == EM_OK) {
        s.line_no++;
        s.line_start = pos;
        const char *nl = memchr(s.buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - s.buf) : len;
        pos = nl ? end + 1 : len;
        if (end > s.line_start && s.buf[end - 1] == '\r') end--;
        size_t k = s.line_start;
        while (k < end && is_space(s.buf[k])) k++;
        if (k == end) continue;  /* blank line */

        if (ncols < 0) {
            if (!count_fields(&s, s.line_start, end, &ncols)) { st = EM_ERR_FORMAT; break; }
            if (want_label) {
                label = opts.label_column < 0 ? opts.label_column + ncols : opts.label_column;
                if (label < 0 || label >= ncols) {
                    st = em_error(EM_ERR_ARGUMENT, "%s: label column %d is out of range: line %zu has %d columns",
                                  name, opts.label_column, s.line_no, ncols);
                    break;
                }
            }
        }
        if (header_pending) {
            header_pending = false;
            continue;
        }
        size_t fpos = s.line_start, fs, fl;
        bool last = false;
        int col = 0;
        while (!last) {
            if (!next_field(&s, &fpos, end, &fs, &fl, &last, col + 1)) { st = EM_ERR_FORMAT; break; }
            if (col >= ncols) {
                st = em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): ragged row: expected %d columns, found more",
                              name, s.line_no, col + 1, fs, ncols);
                break;
            }
            double v;
            if (!parse_number(&s, fs, fl, col + 1, &v)) { st = EM_ERR_FORMAT; break; }
            bool ok;
            if (col == label) {
                if (!(v == floor(v) && fabs(v) < 9.2e18)) {
                    char shown[64];
                    show_field(s.buf + fs, fl, shown, sizeof shown);
                    st = em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): label '%s' is not an integer",
                                  name, s.line_no, col + 1, fs, shown);
                    break;
                }
                int64_t iv = (int64_t)v;
                ok = grow_push(&gy, &iv);
            } else {
                float f = (float)v;
                ok = grow_push(&gx, &f);
            }
            if (!ok) {
                st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory at line %zu", name, s.line_no);
                break;
            }
            col++;
        }
        if (st == EM_OK && col < ncols)
            st = em_error(EM_ERR_FORMAT, "%s: line %zu, column %d (byte %zu): ragged row: expected %d columns, found %d",
                          name, s.line_no, col + 1, end, ncols, col);
        rows++;
    }
    if (st == EM_OK && rows == 0)
        st = em_error(EM_ERR_FORMAT, "%s: no data rows (byte %zu is the end of the file)", name, len);
    if (st != EM_OK) {
        free(gx.p);
        free(gy.p);
        return st;
    }
    int nfeat = ncols - (label >= 0 ? 1 : 0);
    *x = (em__array){.dtype = EM_F32, .ndim = 2, .shape = {(int64_t)rows, nfeat},
                     .numel = (int64_t)gx.n, .nbytes = gx.n * sizeof(float), .data = gx.p, .owned = true};
    if (y) {
        if (label >= 0)
            *y = (em__array){.dtype = EM_I64, .ndim = 1, .shape = {(int64_t)rows}, .numel = (int64_t)gy.n,
                             .nbytes = gy.n * sizeof(int64_t), .data = gy.p, .owned = true};
        else
            free(gy.p);
    }
    return EM_OK;
}
