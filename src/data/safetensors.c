/* safetensors: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
 *    "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to its start (byte 8 + N). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "parsers.h"
#include "../core/internal_api.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

static const struct { const char *name; em_dtype dt; } ST_TYPES[] = {
    {"F32", EM_F32}, {"F64", EM_F64}, {"F16", EM_F16}, {"BF16", EM_BF16},
    {"I64", EM_I64}, {"I32", EM_I32}, {"U8", EM_U8},   {"BOOL", EM_BOOL},
};
#define ST_ACCEPTED "F32 F64 F16 BF16 I64 I32 U8 BOOL"

const char *em__st_dtype_name(em_dtype dt) {
    for (size_t k = 0; k < sizeof ST_TYPES / sizeof ST_TYPES[0]; k++)
        if (ST_TYPES[k].dt == dt) return ST_TYPES[k].name;
    return NULL;
}

void em__st_file_free(em__st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->count; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    memset(f, 0, sizeof *f);
}

static int cmp_begin(const void *a, const void *b) {
    const em__st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Offsets in messages: JSON offsets + 8 (the length prefix) are file offsets. */
static em_status st_fail(em_status code, const char *name, const char *tensor, size_t at,
                         const char *what) {
    if (tensor)
        return em_error(code, "%s: tensor '%.200s' (header byte %zu): %s", name, tensor, at, what);
    return em_error(code, "%s: bad safetensors header at byte %zu: %s", name, at, what);
}

static em_status read_metadata(const char *name, const em__json *m, em__st_file *f) {
    if (m->type != EM__JSON_OBJECT)
        return st_fail(EM_ERR_FORMAT, name, NULL, 8 + m->at, "__metadata__ must be an object of strings");
    if (m->count == 0) return EM_OK;
    f->meta_keys = calloc((size_t)m->count, sizeof(char *));
    f->meta_values = calloc((size_t)m->count, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", name);
    for (int k = 0; k < m->count; k++) {
        if (m->items[k].type != EM__JSON_STRING)
            return st_fail(EM_ERR_FORMAT, name, NULL, 8 + m->items[k].at, "__metadata__ values must be strings");
        f->meta_keys[k] = strdup(m->keys[k]);
        f->meta_values[k] = strdup(m->items[k].str);
        f->meta_count++;
        if (!f->meta_keys[k] || !f->meta_values[k])
            return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", name);
    }
    return EM_OK;
}

static em_status read_tensor(const char *name, const char *tname, const em__json *v,
                             size_t data_len, em__st_tensor *t) {
    size_t at = 8 + v->at;
    if (v->type != EM__JSON_OBJECT) return st_fail(EM_ERR_FORMAT, name, tname, at, "expected an object");
    const em__json *dt = em__json_get(v, "dtype"), *shape = em__json_get(v, "shape"),
                   *offs = em__json_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return st_fail(EM_ERR_FORMAT, name, tname, at, "needs the keys dtype, shape and data_offsets");
    if (dt->type != EM__JSON_STRING) return st_fail(EM_ERR_FORMAT, name, tname, 8 + dt->at, "dtype must be a string");
    bool found = false;
    for (size_t k = 0; k < sizeof ST_TYPES / sizeof ST_TYPES[0]; k++)
        if (strcmp(dt->str, ST_TYPES[k].name) == 0) {
            t->dtype = ST_TYPES[k].dt;
            found = true;
        }
    if (!found) {
        char msg[160];
        snprintf(msg, sizeof msg, "dtype '%.40s' is not supported; Ember reads " ST_ACCEPTED, dt->str);
        return st_fail(EM_ERR_NOT_SUPPORTED, name, tname, 8 + dt->at, msg);
    }
    if (shape->type != EM__JSON_ARRAY) return st_fail(EM_ERR_FORMAT, name, tname, 8 + shape->at, "shape must be an array");
    if (shape->count > EM_MAX_DIMS)
        return st_fail(EM_ERR_NOT_SUPPORTED, name, tname, 8 + shape->at, "more dimensions than Ember's maximum of 8");
    t->ndim = shape->count;
    for (int d = 0; d < shape->count; d++) {
        const em__json *e = &shape->items[d];
        if (e->type != EM__JSON_NUMBER || !e->is_uint || e->u > (uint64_t)INT64_MAX)
            return st_fail(EM_ERR_FORMAT, name, tname, 8 + e->at, "shape entries must be non-negative integers");
        t->shape[d] = (int64_t)e->u;
    }
    size_t nbytes;
    if (!em__shape_bytes(t->ndim, t->shape, em_dtype_size(t->dtype), NULL, &nbytes))
        return st_fail(EM_ERR_FORMAT, name, tname, 8 + shape->at, "shape describes too many bytes");
    if (offs->type != EM__JSON_ARRAY || offs->count != 2 || offs->items[0].type != EM__JSON_NUMBER ||
        !offs->items[0].is_uint || offs->items[1].type != EM__JSON_NUMBER || !offs->items[1].is_uint)
        return st_fail(EM_ERR_FORMAT, name, tname, 8 + offs->at, "data_offsets must be two non-negative integers");
    t->begin = offs->items[0].u;
    t->end = offs->items[1].u;
    char msg[200];
    if (t->begin > t->end) {
        snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] end before they begin",
                 (unsigned long long)t->begin, (unsigned long long)t->end);
        return st_fail(EM_ERR_FORMAT, name, tname, 8 + offs->at, msg);
    }
    if (t->end > data_len) {
        snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] run past the end of the data section (%zu bytes): the file is truncated",
                 (unsigned long long)t->begin, (unsigned long long)t->end, data_len);
        return st_fail(EM_ERR_FORMAT, name, tname, 8 + offs->at, msg);
    }
    if (t->end - t->begin != nbytes) {
        snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] hold %llu bytes, but %s with this shape needs %zu",
                 (unsigned long long)t->begin, (unsigned long long)t->end,
                 (unsigned long long)(t->end - t->begin), dt->str, nbytes);
        return st_fail(EM_ERR_FORMAT, name, tname, 8 + offs->at, msg);
    }
    t->name = strdup(tname);
    if (!t->name) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", name);
    return EM_OK;
}

static em_status parse_header(const char *name, uint64_t file_len, const em__json *root, em__st_file *out) {
    if (root->type != EM__JSON_OBJECT)
        return st_fail(EM_ERR_FORMAT, name, NULL, 8 + root->at, "the header must be a JSON object");
    size_t data_len = (size_t)(file_len - out->data_start);
    out->tensors = calloc((size_t)root->count + 1, sizeof *out->tensors);
    if (!out->tensors) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", name);
    for (int k = 0; k < root->count; k++) {
        em_status s;
        if (strcmp(root->keys[k], "__metadata__") == 0) {
            s = read_metadata(name, &root->items[k], out);
        } else {
            s = read_tensor(name, root->keys[k], &root->items[k], data_len, &out->tensors[out->count]);
            if (s == EM_OK) out->count++;
        }
        if (s != EM_OK) return s;
    }
    qsort(out->tensors, (size_t)out->count, sizeof *out->tensors, cmp_begin);
    /* the reference reader's rule: in the order of their offsets, each tensor begins where the
     * one before it ends (the first at 0), so no two share bytes and no byte is hidden between
     * them; an empty tensor sits at the offset it would take (its begin is that end) */
    uint64_t prev_end = 0;
    const char *prev = NULL;
    for (int i = 0; i < out->count; i++) {
        const em__st_tensor *t = &out->tensors[i];
        if (t->begin < prev_end)
            return em_error(EM_ERR_FORMAT, "%s: tensors '%.200s' and '%.200s' overlap in the data section (bytes %llu-%llu)",
                            name, prev, t->name, (unsigned long long)(out->data_start + t->begin),
                            (unsigned long long)(out->data_start + prev_end - 1));
        if (t->begin > prev_end)
            return em_error(EM_ERR_FORMAT, "%s: bytes %llu-%llu of the data section belong to no tensor (a gap before tensor '%.200s'): "
                            "the format requires the tensors to fill it without gaps", name,
                            (unsigned long long)(out->data_start + prev_end), (unsigned long long)(out->data_start + t->begin - 1),
                            t->name);
        prev_end = t->end;
        prev = t->name;
    }
    /* the data section ends where the last tensor does: the reference reader rejects
     * bytes after it, and so do we (a file cut and re-joined, or two files concatenated) */
    uint64_t last = 0;
    for (int i = 0; i < out->count; i++)
        if (out->tensors[i].end > last) last = out->tensors[i].end;
    if (data_len > last)
        return em_error(EM_ERR_FORMAT, "%s: unexpected data at byte %llu: the header's tensors end there, "
                        "but the file has %llu more bytes", name, (unsigned long long)(out->data_start + last),
                        (unsigned long long)(data_len - last));
    return EM_OK;
}

em_status em__st_check_values(const char *name, const em__st_tensor *t, const uint8_t *bytes, uint64_t at) {
    if (t->dtype != EM_BOOL) return EM_OK;
    for (uint64_t j = 0; j < t->end - t->begin; j++)
        if (bytes[j] > 1)
            return em_error(EM_ERR_FORMAT, "%s: tensor '%.200s': bool value %d at byte %llu: expected 0 or 1", name,
                            t->name, bytes[j], (unsigned long long)(at + j));
    return EM_OK;
}

em_status em__safetensors_parse(const char *name, const void *buf, size_t len, em__st_file *out) {
    if (!name) name = "<memory>";
    em_status s = em__safetensors_parse_header(name, buf, len, len, out);
    for (int i = 0; s == EM_OK && i < out->count; i++) {
        const em__st_tensor *t = &out->tensors[i];
        s = em__st_check_values(name, t, (const uint8_t *)buf + out->data_start + t->begin, out->data_start + t->begin);
    }
    if (s != EM_OK) em__st_file_free(out);
    return s;
}

em_status em__safetensors_header_length(const char *name, const void *buf, size_t avail, uint64_t file_len,
                                        uint64_t *hl) {
    const uint8_t *b = buf;
    *hl = 0;
    if (file_len < 8 || avail < 8)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %llu: expected an 8-byte header length", name,
                        (unsigned long long)file_len);
    for (int k = 7; k >= 0; k--) *hl = *hl << 8 | b[k];
    if (*hl > EM__ST_MAX_HEADER)
        return em_error(EM_ERR_FORMAT, "%s: header length %llu (bytes 0-7) is over the limit: expected at most %llu (not a safetensors file?)",
                        name, (unsigned long long)*hl, (unsigned long long)EM__ST_MAX_HEADER);
    if (*hl > file_len - 8)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %llu: expected a %llu-byte JSON header, found %llu",
                        name, (unsigned long long)file_len, (unsigned long long)*hl, (unsigned long long)(file_len - 8));
    return EM_OK;
}

em_status em__safetensors_parse_header(const char *name, const void *buf, size_t avail, uint64_t file_len,
                                       em__st_file *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    if (!buf && avail) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL buffer", name);
    const uint8_t *b = buf;
    uint64_t hl;
    em_status hs = em__safetensors_header_length(name, buf, avail, file_len, &hl);
    if (hs != EM_OK) return hs;
    if (hl > avail - 8)
        return em_error(EM_ERR_INTERNAL, "%s: %zu bytes given for a %llu-byte header", name, avail,
                        (unsigned long long)hl);
    if (hl < 2 || b[8] != '{')
        return em_error(EM_ERR_FORMAT, "%s: bad safetensors header at byte 8: expected '{' starting the JSON header", name);
    size_t bad;
    if (!em__utf8_valid((const char *)b + 8, (size_t)hl, &bad))
        return em_error(EM_ERR_FORMAT, "%s: bad safetensors header at byte %zu: byte 0x%02x is not valid UTF-8 "
                        "(the header is UTF-8 JSON; names and metadata must be UTF-8 text)", name, 8 + bad, b[8 + bad]);
    out->data_start = 8 + (size_t)hl;
    em__json root;
    em_status s = em__json_parse(name, (const char *)b + 8, (size_t)hl, 8, &root);
    if (s != EM_OK) return s;
    s = parse_header(name, file_len, &root, out);
    em__json_free(&root);
    if (s != EM_OK) em__st_file_free(out);
    return s;
}

em_status em__safetensors_size(const char *name, const uint8_t *b, size_t len, uint64_t *total) {
    *total = 0;
    if (!name) name = "<memory>";
    if (len < 8) return EM_OK;
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | b[k];
    em__st_file f;
    /* a bad length or first byte: the parser's own message */
    if (hl > EM__ST_MAX_HEADER || hl < 2 || (len > 8 && b[8] != '{')) {
        em_status s = em__safetensors_parse(name, b, len, &f);
        if (s == EM_OK) em__st_file_free(&f);
        return s;
    }
    if (len < 8 + hl) return EM_OK;
    *total = 8 + hl;   /* a header we cannot read: the parser reports it, from these bytes */
    em__json root;
    em_error_state saved;
    em__error_save(&saved);
    bool parsed = em__json_parse(name, (const char *)b + 8, (size_t)hl, 8, &root) == EM_OK;
    em__error_restore(&saved);
    if (!parsed) return EM_OK;
    uint64_t end = 0;
    for (int k = 0; root.type == EM__JSON_OBJECT && k < root.count; k++) {
        const em__json *o = em__json_get(&root.items[k], "data_offsets");
        if (strcmp(root.keys[k], "__metadata__") && o && o->type == EM__JSON_ARRAY && o->count == 2 &&
            o->items[1].type == EM__JSON_NUMBER && o->items[1].is_uint && o->items[1].u > end)
            end = o->items[1].u;
    }
    em__json_free(&root);
    *total = end > UINT64_MAX - 8 - hl ? UINT64_MAX : 8 + hl + end;
    return EM_OK;
}

/* ---- writing ---- */

char *em__st_header(int n, const char *const *names, const em_dtype *dtypes,
                    const em_shape *shapes, size_t *len) {
    return em__st_header_meta(n, names, dtypes, shapes, 0, NULL, NULL, len);
}

char *em__st_header_meta(int n, const char *const *names, const em_dtype *dtypes, const em_shape *shapes,
                         int nmeta, const char *const *keys, const char *const *values, size_t *len) {
    em_strbuf b = em__sb_growing();
    em__sb_put(&b, "12345678", 8);  /* room for the length */
    em__sb_str(&b, "{");
    if (nmeta > 0) {            /* "__metadata__": a flat string-to-string map, first as in the reference */
        em__sb_str(&b, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i) em__sb_str(&b, ",");
            em__sb_json_string(&b, keys[i]);
            em__sb_str(&b, ":");
            em__sb_json_string(&b, values[i]);
        }
        em__sb_str(&b, "}");
        if (n) em__sb_str(&b, ",");
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t nbytes = 0;
        const char *dn = em__st_dtype_name(dtypes[i]);
        if (!dn || !em__shape_bytes(shapes[i].ndim, shapes[i].d, em_dtype_size(dtypes[i]), NULL, &nbytes)) {
            free(b.s);
            em_error(EM_ERR_INTERNAL, "safetensors header: bad dtype or shape for '%s'", names[i]);
            return NULL;
        }
        char num[64];
        if (i) em__sb_str(&b, ",");
        em__sb_json_string(&b, names[i]);
        em__sb_str(&b, ":{\"dtype\":\"");
        em__sb_str(&b, dn);
        em__sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < shapes[i].ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)shapes[i].d[d]);
            em__sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + nbytes));
        em__sb_str(&b, num);
        off += nbytes;
    }
    em__sb_str(&b, "}");
    /* pad with spaces so the data section starts 8-byte aligned, as the reference does */
    while (!b.oom && b.len % 8) em__sb_put(&b, " ", 1);
    if (b.oom) {
        free(b.s);
        em_error(EM_ERR_OUT_OF_MEMORY, "safetensors header: out of memory");
        return NULL;
    }
    uint64_t hl = b.len - 8;
    for (int k = 0; k < 8; k++) b.s[k] = (char)(hl >> (8 * k) & 0xff);
    *len = b.len;
    return b.s;
}
