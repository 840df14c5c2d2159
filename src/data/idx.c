/* IDX files (MNIST, Fashion-MNIST): a 4-byte magic 00 00 <type> <ndim>, ndim big-endian
 * u32 dims, then the elements in big-endian order. The file may be gzip-compressed. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "parsers.h"
#include "../core/internal_api.h"

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The stored element type: size in the file, and the Ember dtype it becomes. */
static bool idx_type(uint8_t code, size_t *file_size, em_dtype *dt, const char **what) {
    switch (code) {
    case 0x08: *file_size = 1; *dt = EM_U8; *what = "unsigned byte"; return true;
    case 0x09: *file_size = 1; *dt = EM_I32; *what = "signed byte"; return true;
    case 0x0B: *file_size = 2; *dt = EM_I32; *what = "short"; return true;
    case 0x0C: *file_size = 4; *dt = EM_I32; *what = "int"; return true;
    case 0x0D: *file_size = 4; *dt = EM_F32; *what = "float"; return true;
    case 0x0E: *file_size = 8; *dt = EM_F64; *what = "double"; return true;
    default: return false;
    }
}

/* A view of the decompressed stream: either the raw buffer, or a growing inflate output. */
typedef struct idx_src {
    const char *name;
    bool gz;
    const uint8_t *raw;  /* !gz */
    size_t raw_len;
    z_stream zs;         /* gz */
    const uint8_t *gz_start;
    size_t gz_len;
    bool z_init, z_end, z_cut;  /* z_cut: the compressed stream stopped before its end */
    uint8_t *out;        /* gz: decompressed bytes so far */
    size_t out_len, out_cap;
} idx_src;

static size_t gz_offset(const idx_src *s) { return (size_t)(s->zs.next_in - s->gz_start); }

/* Make at least `want` decompressed bytes available (fewer only at the end of the data).
 * Returns the number available, or SIZE_MAX after recording an error. */
static size_t src_fill(idx_src *s, size_t want) {
    if (!s->gz) return s->raw_len;
    while (s->out_len < want && !s->z_end) {
        if (s->out_len == s->out_cap) {
            /* grow geometrically, so a forged header cannot make us allocate more than
             * about twice what the stream really inflates to */
            size_t cap = s->out_cap ? s->out_cap * 2 : 1 << 16;
            if (cap > want && want > s->out_cap) cap = want;
            uint8_t *nb = realloc(s->out, cap);
            if (!nb) {
                em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory inflating %zu bytes", s->name, cap);
                return SIZE_MAX;
            }
            s->out = nb;
            s->out_cap = cap;
        }
        if (s->zs.avail_in == 0) {  /* zlib counts in uInt: feed large inputs in pieces */
            size_t rest = s->gz_len - gz_offset(s);
            s->zs.avail_in = rest > (1u << 30) ? (1u << 30) : (uInt)rest;
        }
        size_t room = s->out_cap - s->out_len;
        s->zs.next_out = s->out + s->out_len;
        s->zs.avail_out = room > (1u << 30) ? (1u << 30) : (uInt)room;
        uInt before = s->zs.avail_out;
        const uint8_t *in_before = s->zs.next_in;
        int rc = inflate(&s->zs, Z_NO_FLUSH);
        s->out_len += before - s->zs.avail_out;
        bool input_left = gz_offset(s) < s->gz_len;
        if (rc == Z_STREAM_END) {
            /* concatenated gzip members are legal (gzip -c a b); continue with the next */
            if (input_left && inflateReset(&s->zs) == Z_OK) continue;
            s->z_end = true;
        } else if (rc == Z_BUF_ERROR && !input_left) {
            s->z_end = s->z_cut = true;  /* the caller reports what is missing */
        } else if ((rc != Z_OK && rc != Z_BUF_ERROR) ||
                   (before == s->zs.avail_out && in_before == s->zs.next_in && s->zs.avail_in > 0)) {
            em_error(EM_ERR_FORMAT, "%s: corrupt gzip data near byte %zu of the file: %s",
                     s->name, gz_offset(s), s->zs.msg ? s->zs.msg : zError(rc));
            return SIZE_MAX;
        }
    }
    return s->out_len;
}

static const uint8_t *src_bytes(idx_src *s) { return s->gz ? s->out : s->raw; }

/* Appended to "truncated" messages: offsets count decompressed bytes, so say so. */
static const char *cut_note(const idx_src *s) {
    return s->z_cut ? " (the gzip stream is cut off; offsets count decompressed bytes)" : "";
}

static void byteswap_to_host(uint8_t *dst, const uint8_t *src, size_t count, size_t elem,
                             em_dtype dt, uint8_t code) {
    for (size_t i = 0; i < count; i++) {
        const uint8_t *p = src + i * elem;
        switch (code) {
        case 0x09: { int32_t v = (int8_t)p[0]; memcpy(dst + i * 4, &v, 4); break; }
        case 0x0B: { int32_t v = (int16_t)(uint16_t)(p[0] << 8 | p[1]); memcpy(dst + i * 4, &v, 4); break; }
        case 0x0C:
        case 0x0D: { uint32_t v = be32(p); memcpy(dst + i * 4, &v, 4); break; }
        case 0x0E: {
            uint64_t v = (uint64_t)be32(p) << 32 | be32(p + 4);
            memcpy(dst + i * 8, &v, 8);
            break;
        }
        default: dst[i] = p[0]; break;
        }
    }
    (void)dt;
}

static em_status idx_parse(idx_src *s, em__array *out) {
    const char *name = s->name;
    size_t have = src_fill(s, 4);
    if (have == SIZE_MAX) return em_last_status();
    if (have < 4)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected a 4-byte IDX magic number%s",
                        name, have, cut_note(s));
    const uint8_t *b = src_bytes(s);
    if (b[0] != 0 || b[1] != 0)
        return em_error(EM_ERR_FORMAT,
                        "%s: not an IDX file: bytes 0-1 are %02x %02x, expected 00 00 (IDX magic)",
                        name, b[0], b[1]);
    size_t esize;
    em_dtype dt;
    const char *what;
    uint8_t code = b[2];
    if (!idx_type(code, &esize, &dt, &what))
        return em_error(EM_ERR_FORMAT,
                        "%s: bad IDX element type 0x%02x at byte 2: expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E",
                        name, code);
    int ndim = b[3];
    if (ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_FORMAT, "%s: IDX file has %d dimensions (byte 3); Ember supports at most %d",
                        name, ndim, EM_MAX_DIMS);
    size_t hdr = 4 + 4 * (size_t)ndim;
    have = src_fill(s, hdr);
    if (have == SIZE_MAX) return em_last_status();
    if (have < hdr)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected %d dimension sizes (%zu header bytes)%s",
                        name, have, ndim, hdr, cut_note(s));
    b = src_bytes(s);
    memset(out, 0, sizeof *out);
    out->ndim = ndim;
    out->dtype = dt;
    for (int i = 0; i < ndim; i++) out->shape[i] = be32(b + 4 + 4 * i);
    int64_t numel;
    size_t file_bytes, nbytes;
    if (!em__shape_bytes(ndim, out->shape, esize, &numel, &file_bytes) ||
        !em__shape_bytes(ndim, out->shape, em_dtype_size(dt), NULL, &nbytes))
        return em_error(EM_ERR_FORMAT, "%s: IDX dimensions at bytes 4-%zu describe more than %llu bytes of data",
                        name, hdr - 1, (unsigned long long)EM__MAX_ARRAY_BYTES);
    /* ask for one byte more than needed, to notice trailing garbage */
    have = src_fill(s, hdr + file_bytes + 1);
    if (have == SIZE_MAX) return em_last_status();
    if (have < hdr + file_bytes)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu: expected %zu bytes of %s data, found %zu%s",
                        name, have, file_bytes, what, have - hdr, cut_note(s));
    if (have > hdr + file_bytes)
        return em_error(EM_ERR_FORMAT, "%s: unexpected data at byte %zu: the header describes %zu bytes of %s data",
                        name, hdr + file_bytes, file_bytes, what);
    if (s->z_cut)
        return em_error(EM_ERR_FORMAT, "%s: truncated at byte %zu of the file: the gzip stream ends before its checksum",
                        name, gz_offset(s));
    b = src_bytes(s);
    out->numel = numel;
    out->nbytes = nbytes;
    if (code == 0x08 && !s->gz) {
        out->data = (void *)(b + hdr);  /* borrowed: the bytes need no conversion */
        out->owned = false;
        return EM_OK;
    }
    if (code == 0x08) {
        /* take the inflate buffer over instead of copying it */
        memmove(s->out, s->out + hdr, file_bytes);
        out->data = s->out;
        s->out = NULL;
        out->owned = true;
        return EM_OK;
    }
    out->data = malloc(nbytes ? nbytes : 1);
    if (!out->data)
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes of data", name, nbytes);
    out->owned = true;
    byteswap_to_host(out->data, b + hdr, (size_t)numel, esize, dt, code);
    return EM_OK;
}

em_status em__idx_parse(const char *name, const void *buf, size_t len, em__array *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    if (!buf && len) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: NULL buffer", name);
    idx_src s = {.name = name};
    const uint8_t *p = buf;
    if (len >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        s.gz = true;
        if (inflateInit2(&s.zs, 16 + MAX_WBITS) != Z_OK)
            return em_error(EM_ERR_OUT_OF_MEMORY, "%s: cannot initialise zlib", name);
        s.z_init = true;
        s.zs.next_in = (Bytef *)p;
        s.gz_start = p;
        s.gz_len = len;
    } else {
        s.raw = p;
        s.raw_len = len;
    }
    em_status st = idx_parse(&s, out);
    if (s.z_init) inflateEnd(&s.zs);
    free(s.out);
    if (st != EM_OK) em__array_free(out);
    return st;
}

em_status em__idx_size(const char *name, const uint8_t *buf, size_t len, uint64_t *total) {
    *total = 0;
    if (!name) name = "<memory>";
    if (len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b) return EM_OK;  /* gzip: only inflating tells */
    if (len < 4) return EM_OK;
    size_t esize;
    em_dtype dt;
    const char *what;
    em__array a;   /* the parser, given the header alone, reports a bad one in its own words */
    if (buf[0] != 0 || buf[1] != 0 || !idx_type(buf[2], &esize, &dt, &what) || buf[3] > EM_MAX_DIMS)
        return em__idx_parse(name, buf, 4, &a);
    int ndim = buf[3];
    size_t hdr = 4 + 4 * (size_t)ndim, file_bytes;
    if (len < hdr) return EM_OK;
    int64_t shape[EM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) shape[i] = be32(buf + 4 + 4 * i);
    if (!em__shape_bytes(ndim, shape, esize, NULL, &file_bytes)) return em__idx_parse(name, buf, hdr, &a);
    *total = hdr + file_bytes;
    return EM_OK;
}
