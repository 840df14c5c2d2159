/* NumPy .npy files: "\x93NUMPY", version, header length (u16 for 1.0, u32 for 2.0/3.0),
 * a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a newline, then the data in C order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parsers.h"
#include "../core/internal_api.h"

static const struct { const char *descr; em_dtype dt; } NPY_TYPES[] = {
    {"<f4", EM_F32}, {"<f8", EM_F64}, {"<f2", EM_F16}, {"<i8", EM_I64},
    {"<i4", EM_I32}, {"|u1", EM_U8}, {"|b1", EM_BOOL},
};
#define NPY_ACCEPTED "<f4 <f8 <f2 <i8 <i4 |u1 |b1"

/* A cursor over the header dict; offsets in messages are file offsets. */
typedef struct npy_lex {
    const char *name;
    const char *p;     /* header start */
    size_t n, i;       /* length, position */
    size_t base;       /* file offset of p[0] */
} npy_lex;

static void skip_ws(npy_lex *l) {
    while (l->i < l->n && (l->p[l->i] == ' ' || l->p[l->i] == '\t' || l->p[l->i] == '\n' ||
                           l->p[l->i] == '\r'))
        l->i++;
}

static em_status lex_fail(npy_lex *l, const char *expected) {
    if (l->i >= l->n)
        return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: expected %s, found the end of the header",
                        l->name, l->base + l->i, expected);
    char c = l->p[l->i];
    if (c >= 0x20 && c < 0x7f)
        return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: expected %s, found '%c'",
                        l->name, l->base + l->i, expected, c);
    return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: expected %s, found byte 0x%02x",
                    l->name, l->base + l->i, expected, (unsigned char)c);
}

static bool eat(npy_lex *l, char c) {
    skip_ws(l);
    if (l->i < l->n && l->p[l->i] == c) {
        l->i++;
        return true;
    }
    return false;
}

/* A quoted string without escapes, copied into buf (truncated to cap - 1). */
static em_status lex_string(npy_lex *l, char *buf, size_t cap) {
    skip_ws(l);
    if (l->i >= l->n || (l->p[l->i] != '\'' && l->p[l->i] != '"')) return lex_fail(l, "a quoted string");
    char q = l->p[l->i++];
    size_t start = l->i, k = 0;
    while (l->i < l->n && l->p[l->i] != q) {
        if (l->p[l->i] == '\\') return lex_fail(l, "a string without escapes");
        if (k + 1 < cap) buf[k++] = l->p[l->i];
        l->i++;
    }
    if (l->i >= l->n) {
        l->i = start - 1;
        return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: unterminated string",
                        l->name, l->base + l->i);
    }
    l->i++;
    buf[k] = 0;
    return EM_OK;
}

static bool lex_word(npy_lex *l, const char *w) {
    skip_ws(l);
    size_t n = strlen(w);
    if (l->n - l->i >= n && memcmp(l->p + l->i, w, n) == 0) {
        l->i += n;
        return true;
    }
    return false;
}

/* (d0, d1, ...) with optional trailing comma; Python 2 files may write 3L. */
static em_status lex_shape(npy_lex *l, int *ndim, int64_t *shape) {
    if (!eat(l, '(')) return lex_fail(l, "'(' starting the shape tuple");
    *ndim = 0;
    for (;;) {
        if (eat(l, ')')) return EM_OK;
        skip_ws(l);
        if (l->i >= l->n || l->p[l->i] < '0' || l->p[l->i] > '9')
            return lex_fail(l, "a non-negative integer dimension or ')'");
        size_t at = l->i;
        uint64_t v = 0;
        while (l->i < l->n && l->p[l->i] >= '0' && l->p[l->i] <= '9') {
            v = v * 10 + (uint64_t)(l->p[l->i] - '0');
            if (v > (uint64_t)INT64_MAX / 16) {
                l->i = at;
                return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: dimension too large",
                                l->name, l->base + at);
            }
            l->i++;
        }
        if (l->i < l->n && l->p[l->i] == 'L') l->i++;
        if (*ndim == EM_MAX_DIMS) {
            l->i = at;
            return em_error(EM_ERR_FORMAT, "%s: .npy array has more than %d dimensions (byte %zu); Ember supports at most %d",
                            l->name, EM_MAX_DIMS, l->base + at, EM_MAX_DIMS);
        }
        shape[(*ndim)++] = (int64_t)v;
        if (eat(l, ',')) continue;
        if (eat(l, ')')) return EM_OK;
        return lex_fail(l, "',' or ')' in the shape tuple");
    }
}

static em_status parse_dict(npy_lex *l, em__array *out) {
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(l, '{')) return lex_fail(l, "'{' starting the header dict");
    for (;;) {
        if (eat(l, '}')) break;
        char key[32];
        size_t key_at = (skip_ws(l), l->i);
        em_status s = lex_string(l, key, sizeof key);
        if (s != EM_OK) return s;
        if (!eat(l, ':')) return lex_fail(l, "':' after a key");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            skip_ws(l);
            if (l->i < l->n && (l->p[l->i] == '[' || l->p[l->i] == '('))
                return em_error(EM_ERR_NOT_SUPPORTED, "%s: structured .npy dtypes are not supported (byte %zu); expected one of " NPY_ACCEPTED,
                                l->name, l->base + l->i);
            size_t at = l->i;
            char d[16];
            s = lex_string(l, d, sizeof d);
            if (s != EM_OK) return s;
            bool found = false;
            for (size_t k = 0; k < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; k++) {
                /* one-byte types carry no byte order: accept '<' or '=' in place of '|' */
                bool one = NPY_TYPES[k].descr[0] == '|';
                if (strcmp(d, NPY_TYPES[k].descr) == 0 ||
                    (one && (d[0] == '<' || d[0] == '=') && strcmp(d + 1, NPY_TYPES[k].descr + 1) == 0)) {
                    out->dtype = NPY_TYPES[k].dt;
                    found = true;
                }
            }
            if (!found)
                return em_error(d[0] == '>' ? EM_ERR_NOT_SUPPORTED : EM_ERR_FORMAT,
                                "%s: .npy dtype '%s' at byte %zu is not supported%s; expected one of " NPY_ACCEPTED,
                                l->name, d, l->base + at, d[0] == '>' ? " (big-endian)" : "");
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            size_t at = (skip_ws(l), l->i);
            if (lex_word(l, "True"))
                return em_error(EM_ERR_NOT_SUPPORTED, "%s: fortran_order True (byte %zu) is not supported: save the array in C order (np.ascontiguousarray)",
                                l->name, l->base + at);
            if (!lex_word(l, "False")) return lex_fail(l, "True or False");
            have_order = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            s = lex_shape(l, &out->ndim, out->shape);
            if (s != EM_OK) return s;
            have_shape = true;
        } else {
            return em_error(EM_ERR_FORMAT, "%s: bad .npy header at byte %zu: unexpected or repeated key '%s' (expected descr, fortran_order, shape)",
                            l->name, l->base + key_at, key);
        }
        if (eat(l, ',')) continue;
        if (eat(l, '}')) break;
        return lex_fail(l, "',' or '}' in the header dict");
    }
    skip_ws(l);
    if (l->i != l->n) return lex_fail(l, "only spaces and a newline after the header dict");
    if (!have_descr || !have_order || !have_shape)
        return em_error(EM_ERR_FORMAT, "%s: .npy header lacks the key '%s'", l->name,
                        !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return EM_OK;
}

em_status em__npy_parse(const char *name, const void *buf, size_t len, em__array *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    if (!buf && len) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL buffer", name);
    const uint8_t *b = buf;
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    size_t m = len < 6 ? len : 6;
    if (memcmp(b, magic, m) != 0)
        return em_error(EM_ERR_FORMAT, "%s: not a .npy file: bytes 0-5 should be \\x93NUMPY", name);
    if (len < 8) return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected the 8-byte .npy magic and version", name, len);
    int major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: .npy format version %d.%d (bytes 6-7) is not supported; expected 1.0, 2.0 or 3.0",
                        name, major, minor);
    size_t lenbytes = major == 1 ? 2 : 4, start = 8 + lenbytes;
    if (len < start)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected a %zu-byte header length", name, len, lenbytes);
    size_t hl = major == 1 ? (size_t)(b[8] | b[9] << 8)
                           : (size_t)((uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24);
    if (hl > len - start)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected a %zu-byte header, found %zu",
                        name, len, hl, len - start);
    npy_lex l = {.name = name, .p = (const char *)b + start, .n = hl, .base = start};
    em_status s = parse_dict(&l, out);
    if (s != EM_OK) return s;
    size_t data = start + hl;
    if (!em__shape_bytes(out->ndim, out->shape, em_dtype_size(out->dtype), &out->numel, &out->nbytes))
        return em_error(EM_ERR_FORMAT, "%s: the .npy shape describes more than %llu bytes", name,
                        (unsigned long long)EM__MAX_ARRAY_BYTES);
    if (len - data < out->nbytes)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected %zu bytes of %s data, found %zu",
                        name, len, out->nbytes, em_dtype_name(out->dtype), len - data);
    if (len - data > out->nbytes)
        return em_error(EM_ERR_FORMAT, "%s: unexpected data at byte %zu: the header describes %zu bytes of data",
                        name, data + out->nbytes, out->nbytes);
    if (out->dtype == EM_BOOL)
        for (size_t i = 0; i < out->nbytes; i++)
            if (b[data + i] > 1)
                return em_error(EM_ERR_FORMAT, "%s: bool value %d at byte %zu: expected 0 or 1", name,
                                b[data + i], data + i);
    out->data = (void *)(b + data);
    out->owned = false;
    return EM_OK;
}

size_t em__npy_header(em_dtype dt, int ndim, const int64_t *shape, char *out, size_t cap) {
    const char *descr = NULL;
    for (size_t k = 0; k < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; k++)
        if (NPY_TYPES[k].dt == dt) descr = NPY_TYPES[k].descr;
    if (!descr) {
        em_error(EM_ERR_NOT_SUPPORTED, ".npy has no %s dtype; convert the tensor first (em_to_dtype)",
                 em_dtype_name(dt));
        return 0;
    }
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld%s", (long long)shape[i],
                      ndim == 1 ? "," : i + 1 < ndim ? ", " : "");
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic(6) + version(2) + length(2) + dict + spaces + '\n' is a multiple of 64 */
    size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    if (total > cap) {
        em_error(EM_ERR_INTERNAL, ".npy header buffer too small");
        return 0;
    }
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    size_t hl = total - 10;
    out[8] = (char)(hl & 0xff);
    out[9] = (char)(hl >> 8);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', total - 10 - (size_t)n - 1);
    out[total - 1] = '\n';
    return total;
}
