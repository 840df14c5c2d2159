/* safetensors: the header parser over memory (offsets, overlaps, sizes, JSON edge cases),
 * the header writer, the interop file written by tests/data/gen_data_files.py following
 * the spec, and the tensor-level save/load round trip (bit-exact, atomic). */
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "test_data_util.h"
#include "data/parsers.h"

/* A file: 8-byte length, the header (padded to 8 with spaces), then data. */
static unsigned char *st_file(const char *header, const void *data, size_t data_len, size_t *len) {
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8;
    *len = 8 + hl + pad + data_len;
    unsigned char *b = malloc(*len);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((hl + pad) >> (8 * k));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', pad);
    if (data_len) memcpy(b + 8 + hl + pad, data, data_len);
    return b;
}

static em_status st_parse(const char *header, const void *data, size_t data_len, em__st_file *f) {
    size_t len;
    unsigned char *b = st_file(header, data, data_len, &len);
    em_status s = em__safetensors_parse("t.safetensors", b, len, f);
    free(b);
    return s;
}

static const em__st_tensor *find(const em__st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static void test_reference_file(void) {
    size_t len;
    unsigned char *buf = test_read_file(test_data_path("reference.safetensors"), &len);
    CHECK(buf != NULL);
    if (!buf) return;
    em__st_file f;
    CHECK_OK(em__safetensors_parse("reference.safetensors", buf, len, &f));
    CHECK(f.count == 10 && f.meta_count == 2 && f.data_start % 8 == 0);
    for (int i = 1; i < f.count; i++) CHECK(f.tensors[i - 1].begin <= f.tensors[i].begin);
    const unsigned char *data = buf + f.data_start;
    const em__st_tensor *t = find(&f, "weight");
    CHECK(t && t->dtype == EM_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    if (t)
        for (int i = 0; i < 12; i++) {
            float v;
            memcpy(&v, data + t->begin + 4 * (size_t)i, 4);
            CHECK(v == i * 0.25f - 1.0f);
        }
    t = find(&f, "steps");
    CHECK(t && t->dtype == EM_I64 && t->ndim == 2);
    if (t) {
        int64_t v[4];
        memcpy(v, data + t->begin, 32);
        CHECK(v[0] == -3 && v[1] == 0 && v[2] == 7 && v[3] == (int64_t)1 << 40);
    }
    t = find(&f, "brain");
    CHECK(t && t->dtype == EM_BF16 && t->end - t->begin == 8);
    if (t)
        for (int i = 0; i < 4; i++) {
            float x = i * 1.5f;
            uint32_t bits;
            memcpy(&bits, &x, 4);
            uint16_t h;
            memcpy(&h, data + t->begin + 2 * (size_t)i, 2);
            CHECK(h == bits >> 16); /* these values are exact in bfloat16 */
        }
    t = find(&f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->begin == t->end);
    t = find(&f, "scalar");
    CHECK(t && t->ndim == 0 && t->end - t->begin == 4);
    t = find(&f, "mask");
    CHECK(t && t->dtype == EM_BOOL && memcmp(data + t->begin, "\1\0\1", 3) == 0);
    t = find(&f, "pixels");
    CHECK(t && t->dtype == EM_U8 && data[t->begin] == 250 && data[t->begin + 5] == 255);
    bool meta_ok = false;
    for (int i = 0; i < f.meta_count; i++)
        if (!strcmp(f.meta_keys[i], "format") && !strcmp(f.meta_values[i], "pt")) meta_ok = true;
    CHECK(meta_ok);
    em__st_file_free(&f);

    /* every prefix is a clean error naming the file */
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        unsigned char *c = malloc(n ? n : 1);
        memcpy(c, buf, n);
        em_status s = em__safetensors_parse("ref.st", c, n, &f);
        if (s == EM_OK || !strstr(em_last_error(), "ref.st") || !strstr(em_last_error(), "byte")) {
            if (bad++ < 3) fprintf(stderr, "  prefix %zu: \"%s\"\n", n, em_last_error());
        }
        em__st_file_free(&f);
        em_clear_error();
        free(c);
    }
    CHECK(bad == 0);
    free(buf);
}

static void test_header_writer_roundtrip(void) {
    const char *names[3] = {"a\"quote\\back", "b\nnewline", "z\xc3\xa9"};
    em_dtype dts[3] = {EM_BF16, EM_BOOL, EM_I32};
    em_shape shapes[3] = {EM_SHAPE(2, 3), EM_SHAPE0, EM_SHAPE(0)};
    size_t hl;
    char *h = em__st_header(3, names, dts, shapes, &hl);
    CHECK(h != NULL && hl % 8 == 0);
    if (!h) return;
    /* data: 12 bytes of bf16, 1 bool */
    unsigned char *file = calloc(1, hl + 13);
    memcpy(file, h, hl);
    em__st_file f;
    CHECK_OK(em__safetensors_parse("w", file, hl + 13, &f));
    CHECK(f.count == 3);
    for (int i = 0; i < 3 && f.count == 3; i++) {
        CHECK(strcmp(f.tensors[i].name, names[i]) == 0);
        CHECK(f.tensors[i].dtype == dts[i] && f.tensors[i].ndim == shapes[i].ndim);
    }
    CHECK(f.count == 3 && f.tensors[0].begin == 0 && f.tensors[0].end == 12 && f.tensors[1].end == 13);
    em__st_file_free(&f);
    free(file);
    free(h);
}

static void test_json_escapes(void) {
    em__st_file f;
    CHECK_OK(st_parse("{\"caf\\u00e9 \\ud83d\\ude00\\t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                      "\7", 1, &f));
    CHECK(f.count == 1 && strcmp(f.tensors[0].name, "caf\xc3\xa9 \xf0\x9f\x98\x80\t") == 0);
    em__st_file_free(&f);
    CHECK(st_parse("{\"\\ud83d\":{}}", NULL, 0, &f) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "unpaired UTF-16 surrogate");
    CHECK(st_parse("{\"a\\u0000\":{}}", NULL, 0, &f) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "\\u0000");
    CHECK(st_parse("{\"a\\q\":{}}", NULL, 0, &f) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "bad escape");
    CHECK(st_parse("{\"a\tb\":{}}", NULL, 0, &f) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "control character");
}

static void test_header_errors(void) {
    em__st_file f;
    unsigned char data[64] = {0};
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "tensors 'a' and 'b' overlap");
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 4, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.safetensors: tensor 'a' (header byte 55): data_offsets [0, 8] run past the end of the data section (4 bytes)");
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "hold 8 bytes, but F32 with this shape needs 12");
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "end before they begin");
    CHECK(st_parse("{\"a\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}", data, 2, &f) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "dtype 'I8' is not supported");
    CHECK(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", data, 2, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "duplicate key \"a\"");
    CHECK(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", data, 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "shape entries must be non-negative integers");
    CHECK(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", data, 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "shape entries");
    CHECK(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,1]}}", data, 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "too many bytes");
    CHECK(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", data, 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "needs the keys dtype, shape and data_offsets");
    CHECK(st_parse("{\"__metadata__\":{\"k\":1}}", NULL, 0, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "__metadata__ values must be strings");
    CHECK(st_parse("{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", "\2", 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "bool value 2");
    CHECK(st_parse("[]", NULL, 0, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "expected '{'");
    CHECK(st_parse("{} x", NULL, 0, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "bad JSON header at byte 11: unexpected text after the JSON value");
    CHECK(st_parse("{\"a\":1,}", NULL, 0, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "expected a string key");
    /* a nesting bomb stops at the depth limit instead of exhausting the stack */
    char bomb[20001];
    bomb[0] = '{';
    memcpy(bomb + 1, "\"a\":", 4);
    memset(bomb + 5, '[', sizeof bomb - 6);
    bomb[sizeof bomb - 1] = 0;
    CHECK(st_parse(bomb, NULL, 0, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "nesting too deep");
    /* header length larger than the file, and over the 100 MB limit */
    unsigned char b[16] = {0xFF, 0xFF, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK(em__safetensors_parse("big", b, sizeof b, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "big: truncated at byte 16: expected a 65535-byte JSON header, found 8");
    memset(b, 0xFF, 8);
    CHECK(em__safetensors_parse("huge", b, sizeof b, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "over the limit");
    /* empty tensors may share an offset with others; a file of only metadata is fine */
    CHECK_OK(st_parse("{\"__metadata__\":{},\"e\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[0,0]},"
                      "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", data, 2, &f));
    CHECK(f.count == 2 && f.meta_count == 0);
    em__st_file_free(&f);
}

int main(void) {
    RUN(test_reference_file);
    RUN(test_header_writer_roundtrip);
    RUN(test_json_escapes);
    RUN(test_header_errors);
    return test_summary();
}
