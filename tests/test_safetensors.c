/* safetensors: the header parser over memory (offsets, overlaps, sizes, JSON edge cases),
 * the header writer, the interop file written by tests/data/gen_data_files.py following
 * the spec, and the tensor-level save/load round trip (bit-exact, atomic). */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
    /* each offset must be a non-negative integer, the second as well as the first */
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,-8]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "data_offsets must be two non-negative integers");
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-1,0]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "data_offsets must be two non-negative integers");
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
    /* the tensors fill the data section without gaps, as the reference reader requires: a
     * hidden byte between two tensors, or before the first, is refused */
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", data, 12, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "of the data section belong to no tensor (a gap before tensor 'b')");
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "belong to no tensor (a gap before tensor 'a')");
    /* an empty tensor sits where the next tensor begins, not inside another's bytes */
    CHECK(st_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", data, 8, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "overlap");
    /* the header is UTF-8: a name (or any text) with a byte that is not is refused */
    CHECK(st_parse("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", data, 1, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.safetensors: bad safetensors header at byte 11: byte 0xff is not valid UTF-8");
    static const char *const not_utf8[] = {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe6\x97", "\x80", "\xf8\x88\x80\x80\x80"};
    for (size_t i = 0; i < sizeof not_utf8 / sizeof not_utf8[0]; i++) {
        char h[160];
        snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"%s\"}}", not_utf8[i]);
        CHECK(st_parse(h, NULL, 0, &f) == EM_ERR_FORMAT);
        CHECK_ERROR(EM_ERR_FORMAT, "is not valid UTF-8");
    }
    CHECK_OK(st_parse("{\"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                      data, 1, &f));
    CHECK(f.count == 1 && !strcmp(f.tensors[0].name, "\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80"));
    em__st_file_free(&f);
    /* empty tensors may share an offset with others; a file of only metadata is fine */
    CHECK_OK(st_parse("{\"__metadata__\":{},\"e\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[0,0]},"
                      "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", data, 2, &f));
    CHECK(f.count == 2 && f.meta_count == 0);
    em__st_file_free(&f);
}


/* ---------------------------------------------------------------- tensor level */

static char *tmp;

static void test_roundtrip_all_dtypes(void) {
    em_scope s = em_scope_begin();
    const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8, EM_BOOL};
    const char *names[8] = {"z.f32", "a.f64", "m.f16", "b.bf16", "y.i64", "c.i32", "x.u8", "d.bool"};
    em_tensor *ts[8];
    unsigned char *raw[8];
    size_t raw_len[8];
    for (int i = 0; i < 8; i++) {
        ts[i] = pattern(dts[i], i % 3 == 0 ? EM_SHAPE(3, 5) : i % 3 == 1 ? EM_SHAPE0 : EM_SHAPE(2, 0, 4));
        raw[i] = last_pattern;  /* take the generator's bytes over */
        raw_len[i] = last_pattern_len;
        last_pattern = NULL;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/all.safetensors", tmp);
    CHECK_OK(em_safetensors_save(path, names, ts, 8));
    em_safetensors *st = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(st != NULL && em_safetensors_count(st) == 8);
    for (int i = 0; i < 8 && st; i++) {
        em_tensor *t = em_safetensors_get(st, names[i]);
        size_t n;
        unsigned char *b = t ? bytes_of(t, &n) : NULL;
        CHECK(t && em_dtype_of(t) == dts[i] && em_ndim(t) == em_ndim(ts[i]));
        CHECK(b && n == raw_len[i] && memcmp(b, raw[i], n) == 0);
        free(b);
    }
    /* the header lists names sorted, and data follows in that order */
    for (int i = 1; i < em_safetensors_count(st); i++)
        CHECK(strcmp(em_safetensors_name(st, i - 1), em_safetensors_name(st, i)) < 0);
    CHECK(em_safetensors_name(st, 8) == NULL && em_safetensors_metadata(st, "format") == NULL);
    CHECK(em_safetensors_get(st, "nope") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no tensor named 'nope'");
    /* tensors handed out outlive the file object */
    em_tensor *keep = em_safetensors_get(st, "a.f64");
    em_safetensors_free(st);
    CHECK(keep && em_numel(keep) == 1);
    for (int i = 0; i < 8; i++) free(raw[i]);
    em_scope_end(s);
}

static void test_load_reference_tensors(void) {
    em_scope s = em_scope_begin();
    em_safetensors *st = em_safetensors_load(test_data_path("reference.safetensors"), EM_DEVICE_CPU);
    CHECK(st && em_safetensors_count(st) == 10);
    if (!st) {
        em_scope_end(s);
        return;
    }
    CHECK(em_safetensors_metadata(st, "format") && strcmp(em_safetensors_metadata(st, "format"), "pt") == 0);
    uint16_t h[5];
    em_tensor *half = em_safetensors_get(st, "half");
    CHECK(half && em_dtype_of(half) == EM_F16 && em_copy_to_host(half, h, sizeof h) == EM_OK);
    for (int i = 0; i < 5; i++) CHECK(em_f16_to_f32(h[i]) == i / 4.0f);
    double bias[3];
    CHECK_OK(em_copy_to_host(em_safetensors_get(st, "bias"), bias, sizeof bias));
    CHECK(bias[0] == 1.5 && bias[1] == -2.0 && bias[2] == 3.25);
    int32_t ids[6];
    CHECK_OK(em_copy_to_host(em_safetensors_get(st, "ids"), ids, sizeof ids));
    for (int i = 0; i < 6; i++) CHECK(ids[i] == i - 2);
    CHECK(em_item(em_safetensors_get(st, "scalar")) == 42.5);
    em_tensor *e = em_safetensors_get(st, "empty");
    CHECK(e && em_numel(e) == 0 && em_size(e, 1) == 3);
    em_safetensors_free(st);
    em_scope_end(s);
}

static void test_save_errors_and_atomic(void) {
    em_scope s = em_scope_begin();
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", tmp);
    em_tensor *a = pattern(EM_F32, EM_SHAPE(2));
    const char *names[2] = {"w", "w"};
    em_tensor *ts[2] = {a, a};
    CHECK(em_safetensors_save(path, names, ts, 2) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the name 'w' is given twice");
    names[1] = "__metadata__";
    CHECK(em_safetensors_save(path, names, ts, 2) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "reserved");
    /* names and metadata are written as UTF-8 text or refused, and nothing is written */
    char bad_path[700];
    snprintf(bad_path, sizeof bad_path, "%s/not_utf8.safetensors", tmp);
    names[1] = "w\xff";
    CHECK(em_safetensors_save(bad_path, names, ts, 2) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "tensor name 1 is not valid UTF-8 (byte 0xff at offset 1)");
    names[1] = "\xed\xb0\x80";   /* a lone surrogate, as CESU-8 would write it */
    CHECK(em_safetensors_save(bad_path, names, ts, 2) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "is not valid UTF-8");
    CHECK(em_safetensors_save_meta(bad_path, names, ts, 1, (const char *[]){"k"}, (const char *[]){"v\xc0\x80"}, 1) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "metadata value 0 is not valid UTF-8");
    CHECK(access(bad_path, F_OK) != 0);
    names[1] = "\xc3\xa9t\xc3\xa9";   /* UTF-8 names save and load back */
    CHECK_OK(em_safetensors_save(bad_path, names, ts, 2));
    em_safetensors *back = em_safetensors_load(bad_path, EM_DEVICE_CPU);
    CHECK(back && em_safetensors_count(back) == 2 && em_safetensors_get(back, "\xc3\xa9t\xc3\xa9") != NULL);
    em_safetensors_free(back);
    names[1] = "__metadata__";
    CHECK_OK(em_safetensors_save(path, names, ts, 1));
    size_t before_len, after_len;
    unsigned char *before = test_read_file(path, &before_len);
    /* fail mid-write: the old file stays, no temporary is left */
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    names[0] = "big";
    ts[0] = pattern(EM_F64, EM_SHAPE(1000));
    em_status st = em_safetensors_save(path, names, ts, 1);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    CHECK(st == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "w.safetensors: write failed");
    unsigned char *after = test_read_file(path, &after_len);
    CHECK(before && after && before_len == after_len && memcmp(before, after, before_len) == 0);
    DIR *d = opendir(tmp);
    int temps = 0;
    for (struct dirent *e; d && (e = readdir(d));) temps += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK(temps == 0);
    /* an empty file (no tensors) is valid */
    CHECK_OK(em_safetensors_save(path, NULL, NULL, 0));
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(f && em_safetensors_count(f) == 0);
    em_safetensors_free(f);
    free(before);
    free(after);
    em_scope_end(s);
}

/* With EMBER_WRITE_INTEROP=<dir>, write the reference tensors (the formulas of
 * tests/data/gen_data_files.py) as <dir>/ember.safetensors and <dir>/<name>.npy, for
 * tests/data/check_interop.py to read with PyTorch and NumPy. Not part of ctest. */
static int write_interop(const char *dir) {
    float weight[12], half_f[5], brain_f[4];
    uint16_t half[5], brain[4];
    for (int i = 0; i < 12; i++) weight[i] = i * 0.25f - 1.0f;
    for (int i = 0; i < 5; i++) half[i] = em_f32_to_f16(half_f[i] = i / 4.0f);
    for (int i = 0; i < 4; i++) brain[i] = em_f32_to_bf16(brain_f[i] = i * 1.5f);
    const double bias[3] = {1.5, -2.0, 3.25};
    const int64_t steps[4] = {-3, 0, 7, (int64_t)1 << 40};
    const int32_t ids[6] = {-2, -1, 0, 1, 2, 3};
    const uint8_t pixels[6] = {250, 251, 252, 253, 254, 255}, mask[3] = {1, 0, 1};
    const float scalar = 42.5f;
    em_scope s = em_scope_begin();
    const char *names[10] = {"weight", "bias", "half", "brain", "steps", "ids", "pixels", "mask", "empty", "scalar"};
    em_tensor *ts[10] = {
        em_from_data(weight, EM_F32, EM_SHAPE(3, 4), EM_OPTS(.dtype = EM_F32)),
        em_from_data(bias, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F64)),
        em_from_data(half, EM_F16, EM_SHAPE(5), EM_OPTS(.dtype = EM_F16)),
        em_from_data(brain, EM_BF16, EM_SHAPE(4), EM_OPTS(.dtype = EM_BF16)),
        em_from_data(steps, EM_I64, EM_SHAPE(2, 2), EM_OPTS(.dtype = EM_I64)),
        em_from_data(ids, EM_I32, EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_I32)),
        em_from_data(pixels, EM_U8, EM_SHAPE(6), EM_OPTS(.dtype = EM_U8)),
        em_from_data(mask, EM_BOOL, EM_SHAPE(3), EM_OPTS(.dtype = EM_BOOL)),
        em_zeros(EM_SHAPE(0, 3), EM_OPTS(0)),
        em_from_data(&scalar, EM_F32, EM_SHAPE0, EM_OPTS(0)),
    };
    char path[1024];
    snprintf(path, sizeof path, "%s/ember.safetensors", dir);
    em_safetensors_save(path, names, ts, 10);
    for (int i = 0; i < 10; i++) {
        if (i == 3) continue;  /* .npy has no bfloat16 */
        snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
        em_save_npy(path, ts[i]);
    }
    em_scope_end(s);
    if (em_failed()) {
        fprintf(stderr, "write_interop: %s\n", em_last_error());
        return 1;
    }
    printf("wrote %s/ember.safetensors and .npy files\n", dir);
    return 0;
}

/* A file cut short by another process while it is being loaded fails with an error that says
 * so. (Loaded through a mapping, the missing pages faulted with SIGBUS and killed the process.)
 * A child cuts the file to its first 4 KiB and extends it back, again and again, while this
 * process loads it; each load must succeed or fail with a message, until one has met the cut. */
static void test_truncated_while_loading(void) {
    char path[700];
    snprintf(path, sizeof path, "%s/shrinking.safetensors", tmp);
    em_scope s = em_scope_begin();
    em_tensor *big = em_zeros(EM_SHAPE(8 << 20), EM_OPTS(0));   /* 32 MiB */
    const char *names[] = {"big"};
    CHECK_OK(em_safetensors_save(path, names, &big, 1));
    em_scope_end(s);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(path, O_WRONLY);
        for (int i = 0; fd >= 0 && i < 2000000; i++) {   /* the parent kills it long before */
            if (ftruncate(fd, 4096) != 0 || ftruncate(fd, st.st_size) != 0) break;
            usleep(200);
        }
        _exit(0);
    }
    CHECK(child > 0);
    int loads = 0, ok = 0, cut = 0, other = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
        loads++;
        if (f) {
            ok++;
            em_safetensors_free(f);
        } else if (strstr(em_last_error(), "it was truncated or replaced while being read") ||
                   strstr(em_last_error(), "run past the end of the data section")) {
            cut++;   /* met the cut during the reads, or found the file cut when opening it */
            CHECK(strstr(em_last_error(), path) != NULL);
        } else {
            other++;
            fprintf(stderr, "  unexpected error: %s\n", em_last_error());
        }
        em_clear_error();
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (cut < 3 && now.tv_sec - t0.tv_sec < 20);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("  %d loads while another process cut the file: %d whole, %d refused as cut, %d other errors\n", loads, ok,
           cut, other);
    CHECK(cut >= 3);
    CHECK(other == 0);
}

int main(void) {
    const char *interop = getenv("EMBER_WRITE_INTEROP");
    if (interop && *interop) return write_interop(interop);
    RUN(test_reference_file);
    RUN(test_header_writer_roundtrip);
    RUN(test_json_escapes);
    RUN(test_header_errors);
    tmp = test_tmpdir();
    if (!tmp) {
        fprintf(stderr, "cannot create a temporary directory\n");
        return 1;
    } else {
        RUN(test_roundtrip_all_dtypes);
        RUN(test_load_reference_tensors);
        RUN(test_save_errors_and_atomic);
        RUN(test_truncated_while_loading);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    free(last_pattern);
    return test_summary();
}
