/* The file parsers over plain memory (src/data/parsers.h): IDX, .npy, CSV. Values are
 * checked against the formulas tests/data/gen_data_files.py used; every prefix of every
 * valid file must fail cleanly with a message that names the file. */
#include <stdint.h>
#include <stdlib.h>
#include <zlib.h>

#include "test.h"
#include "test_data_util.h"
#include "data/parsers.h"

/* Every strict prefix of a valid file is an error that names the file and a byte. */
typedef em_status (*parse_fn)(const char *name, const void *buf, size_t len, em__array *out);

static void check_prefixes(parse_fn parse, const unsigned char *buf, size_t len, const char *name) {
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        /* a copy of exactly n bytes, so ASan catches any read past the prefix */
        unsigned char *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        em__array a;
        em_status s = parse(name, copy, n, &a);
        if (s == EM_OK || !strstr(em_last_error(), name) || !strstr(em_last_error(), "byte")) {
            if (bad++ < 3) fprintf(stderr, "  prefix %zu of %s: status %d, \"%s\"\n", n, name, s, em_last_error());
        }
        em__array_free(&a);
        em_clear_error();
        free(copy);
    }
    CHECK(bad == 0);
}

static unsigned char *gz_compress(const unsigned char *src, size_t n, size_t *out_len) {
    z_stream z = {0};
    deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    size_t cap = deflateBound(&z, n) + 64;
    unsigned char *out = malloc(cap);
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    *out_len = z.total_out;
    deflateEnd(&z);
    return out;
}

/* ---------------------------------------------------------------- IDX */

static void test_idx_tiny_gz(void) {
    size_t len;
    unsigned char *buf = test_read_file(test_data_path("tiny-images-idx3-ubyte.gz"), &len);
    CHECK(buf != NULL);
    if (!buf) return;
    em__array a;
    CHECK_OK(em__idx_parse("tiny.gz", buf, len, &a));
    CHECK(a.dtype == EM_U8 && a.ndim == 3 && a.shape[0] == 4 && a.shape[1] == 3 && a.shape[2] == 2);
    CHECK(a.numel == 24 && a.nbytes == 24);
    int wrong = 0;
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 2; c++)
                wrong += ((uint8_t *)a.data)[i * 6 + r * 2 + c] != 10 * i + 3 * r + c;
    CHECK(wrong == 0);
    em__array_free(&a);
    check_prefixes(em__idx_parse, buf, len, "tiny.gz");
    free(buf);
}

static void test_idx_labels_raw(void) {
    size_t len;
    unsigned char *buf = test_read_file(test_data_path("tiny-labels-idx1-ubyte"), &len);
    CHECK(buf != NULL);
    if (!buf) return;
    em__array a;
    CHECK_OK(em__idx_parse("labels", buf, len, &a));
    CHECK(a.ndim == 1 && a.shape[0] == 4 && a.dtype == EM_U8);
    const uint8_t expect[4] = {3, 1, 4, 1};
    CHECK(a.data && memcmp(a.data, expect, 4) == 0);
    em__array_free(&a);
    check_prefixes(em__idx_parse, buf, len, "labels");
    free(buf);
}

static void test_idx_types_big_endian(void) {
    /* int16 [2]: -300, 32767 */
    const unsigned char i16[] = {0, 0, 0x0B, 1, 0, 0, 0, 2, 0xFE, 0xD4, 0x7F, 0xFF};
    em__array a;
    CHECK_OK(em__idx_parse("i16", i16, sizeof i16, &a));
    CHECK(a.dtype == EM_I32 && a.numel == 2);
    int32_t v[2];
    memcpy(v, a.data, 8);
    CHECK(v[0] == -300 && v[1] == 32767);
    em__array_free(&a);
    /* int8 [1]: -128 */
    const unsigned char i8[] = {0, 0, 0x09, 1, 0, 0, 0, 1, 0x80};
    CHECK_OK(em__idx_parse("i8", i8, sizeof i8, &a));
    memcpy(v, a.data, 4);
    CHECK(a.dtype == EM_I32 && v[0] == -128);
    em__array_free(&a);
    /* float32 0-d: -2.25 = 0xC0100000 */
    const unsigned char f32[] = {0, 0, 0x0D, 0, 0xC0, 0x10, 0, 0};
    CHECK_OK(em__idx_parse("f32", f32, sizeof f32, &a));
    float f;
    memcpy(&f, a.data, 4);
    CHECK(a.dtype == EM_F32 && a.ndim == 0 && a.numel == 1 && f == -2.25f);
    em__array_free(&a);
    /* float64 [1]: 0.1 */
    double d = 0.1, got;
    uint64_t bits;
    memcpy(&bits, &d, 8);
    unsigned char f64[16] = {0, 0, 0x0E, 1, 0, 0, 0, 1};
    for (int k = 0; k < 8; k++) f64[8 + k] = (unsigned char)(bits >> (56 - 8 * k));
    CHECK_OK(em__idx_parse("f64", f64, sizeof f64, &a));
    memcpy(&got, a.data, 8);
    CHECK(a.dtype == EM_F64 && got == 0.1);
    em__array_free(&a);
}

static void test_idx_errors(void) {
    em__array a;
    const unsigned char bad_magic[] = {1, 0, 8, 1, 0, 0, 0, 0};
    CHECK(em__idx_parse("m.idx", bad_magic, sizeof bad_magic, &a) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "m.idx: not an IDX file");
    /* the second magic byte is checked too, not only the first */
    const unsigned char bad_magic1[] = {0, 1, 8, 1, 0, 0, 0, 0};
    CHECK(em__idx_parse("m1.idx", bad_magic1, sizeof bad_magic1, &a) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "m1.idx: not an IDX file: bytes 0-1 are 00 01, expected 00 00");
    const unsigned char bad_type[] = {0, 0, 0x0A, 1, 0, 0, 0, 0};
    CHECK(em__idx_parse("t.idx", bad_type, sizeof bad_type, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "bad IDX element type 0x0a at byte 2");
    const unsigned char many_dims[] = {0, 0, 8, 9};
    CHECK(em__idx_parse("d.idx", many_dims, sizeof many_dims, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "9 dimensions");
    /* 2^32-1 to the 4th power overflows any 64-bit product */
    unsigned char huge[4 + 16] = {0, 0, 8, 4};
    memset(huge + 4, 0xFF, 16);
    CHECK(em__idx_parse("h.idx", huge, sizeof huge, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "h.idx: IDX dimensions");
    /* 47040000 pixels promised, 6 found */
    unsigned char trunc[16 + 6] = {0, 0, 8, 3, 0, 0, 0xEA, 0x60, 0, 0, 0, 28, 0, 0, 0, 28};
    CHECK(em__idx_parse("train-images-idx3-ubyte", trunc, sizeof trunc, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT,
                "train-images-idx3-ubyte: truncated at byte 22: expected 47040000 bytes of unsigned byte data, found 6");
    const unsigned char trailing[] = {0, 0, 8, 1, 0, 0, 0, 1, 7, 8};
    CHECK(em__idx_parse("x.idx", trailing, sizeof trailing, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "unexpected data at byte 9");
}

static void test_idx_gzip_truncated_and_corrupt(void) {
    /* a 100x100 image: the header promises 10000 bytes; cut the gzip stream early */
    size_t raw_len = 8 + 4 + 10000;
    unsigned char *raw = calloc(1, raw_len);
    unsigned char hdr[12] = {0, 0, 8, 2, 0, 0, 0, 100, 0, 0, 0, 100};
    memcpy(raw, hdr, 12);
    for (size_t i = 12; i < raw_len; i++) raw[i] = (unsigned char)(i * 7 + (i >> 5));
    size_t gl;
    unsigned char *g = gz_compress(raw, raw_len, &gl);
    em__array a;
    CHECK_OK(em__idx_parse("img.gz", g, gl, &a));
    CHECK(a.numel == 10000 && a.owned && memcmp(a.data, raw + 12, 10000) == 0);
    em__array_free(&a);
    CHECK(em__idx_parse("img.gz", g, gl / 2, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "img.gz: truncated at byte");
    check_prefixes(em__idx_parse, g, gl, "img.gz");
    /* flip bytes in the deflate body: a clean error (or, rarely, valid data), never a crash */
    for (size_t k = 10; k < gl; k += 3) {
        unsigned char *m = malloc(gl);
        memcpy(m, g, gl);
        m[k] ^= 0x5A;
        em_status s = em__idx_parse("img.gz", m, gl, &a);
        CHECK(s == EM_OK || strstr(em_last_error(), "img.gz"));
        em__array_free(&a);
        em_clear_error();
        free(m);
    }
    free(g);
    free(raw);
}

/* ---------------------------------------------------------------- .npy */

static void test_npy_numpy_files(void) {
    size_t len;
    em__array a;
    unsigned char *buf = test_read_file(test_data_path("numpy_f4.npy"), &len);
    CHECK(buf != NULL);
    if (!buf) return;
    CHECK_OK(em__npy_parse("f4.npy", buf, len, &a));
    CHECK(a.dtype == EM_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && !a.owned);
    float f[6];
    memcpy(f, a.data, sizeof f);
    for (int i = 0; i < 6; i++) CHECK(f[i] == (float)i / 4);
    check_prefixes(em__npy_parse, buf, len, "f4.npy");
    free(buf);

    buf = test_read_file(test_data_path("numpy_f8_v2.npy"), &len);
    CHECK_OK(em__npy_parse("f8.npy", buf, len, &a));
    double d[3];
    memcpy(d, a.data, sizeof d);
    CHECK(a.dtype == EM_F64 && a.ndim == 1 && a.shape[0] == 3 && d[0] == 1.5 && d[1] == -2.0 && d[2] == 1e-300);
    check_prefixes(em__npy_parse, buf, len, "f8.npy");
    free(buf);

    buf = test_read_file(test_data_path("numpy_i8.npy"), &len);
    CHECK_OK(em__npy_parse("i8.npy", buf, len, &a));
    int64_t i8[2];
    memcpy(i8, a.data, sizeof i8);
    CHECK(a.dtype == EM_I64 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 1 && i8[0] == -1 && i8[1] == (int64_t)1 << 40);
    free(buf);

    buf = test_read_file(test_data_path("numpy_b1_v3.npy"), &len);
    CHECK_OK(em__npy_parse("b1.npy", buf, len, &a));
    CHECK(a.dtype == EM_BOOL && a.numel == 3 && memcmp(a.data, "\1\0\1", 3) == 0);
    free(buf);

    buf = test_read_file(test_data_path("numpy_fortran.npy"), &len);
    CHECK(em__npy_parse("fortran.npy", buf, len, &a) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "fortran.npy: fortran_order True");
    free(buf);
}

/* Build a v1.0 file around a hand-written dict. */
static size_t npy_with_dict(unsigned char *out, const char *dict, const void *data, size_t n) {
    size_t dl = strlen(dict);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(dl & 0xff);
    out[9] = (unsigned char)(dl >> 8);
    memcpy(out + 10, dict, dl);
    memcpy(out + 10 + dl, data, n);
    return 10 + dl + n;
}

static void test_npy_headers(void) {
    unsigned char buf[512];
    em__array a;
    const int32_t vals[3] = {1, -2, 3};
    size_t n = npy_with_dict(buf, "{\"shape\": (3L,), 'fortran_order':False,'descr':'<i4'}\n", vals, 12);
    CHECK_OK(em__npy_parse("py2.npy", buf, n, &a));
    CHECK(a.dtype == EM_I32 && a.ndim == 1 && a.shape[0] == 3);
    em__array_free(&a);
    /* one-byte types carry no byte order: '|u1' as NumPy writes it, and '<u1', '=u1' */
    const char *u1[] = {"|u1", "<u1", "=u1", "|b1", "=b1"};
    for (int k = 0; k < 5; k++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3,), }\n", u1[k]);
        n = npy_with_dict(buf, dict, "\x01\x00\x01", 3);
        em_status st = em__npy_parse("u1.npy", buf, n, &a);
        if (st != EM_OK) fprintf(stderr, "  descr %s: %s\n", u1[k], em_last_error());
        CHECK(st == EM_OK && a.dtype == (k < 3 ? EM_U8 : EM_BOOL) && a.shape[0] == 3);
        em__array_free(&a);
        em_clear_error();
    }
    n = npy_with_dict(buf, "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }\n", vals, 12);
    CHECK(em__npy_parse("be.npy", buf, n, &a) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "be.npy: .npy dtype '>f4' at byte 20 is not supported (big-endian)");
    n = npy_with_dict(buf, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }\n", vals, 12);
    CHECK(em__npy_parse("u2.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "'<u2'");
    n = npy_with_dict(buf, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }\n", vals, 12);
    CHECK(em__npy_parse("s.npy", buf, n, &a) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "structured");
    n = npy_with_dict(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), 'x': 1}\n", vals, 12);
    CHECK(em__npy_parse("k.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "unexpected or repeated key 'x'");
    n = npy_with_dict(buf, "{'descr': '<i4', 'fortran_order': False}\n", vals, 12);
    CHECK(em__npy_parse("m.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "lacks the key 'shape'");
    n = npy_with_dict(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,3), }\n", vals, 12);
    CHECK(em__npy_parse("dims.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "more than 8 dimensions");
    n = npy_with_dict(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", vals, 12);
    CHECK(em__npy_parse("long.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "unexpected data at byte");
    n = npy_with_dict(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }\n", vals, 12);
    CHECK(em__npy_parse("big.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "big.npy: the .npy shape describes more than");
    const unsigned char two = 2;
    n = npy_with_dict(buf, "{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }\n", &two, 1);
    CHECK(em__npy_parse("b.npy", buf, n, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "bool value 2");
    memcpy(buf, "\x93NUMPY\x04\x00", 8);
    CHECK(em__npy_parse("v4.npy", buf, 12, &a) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "version 4.0");
    CHECK(em__npy_parse("e.npy", "", 0, &a) != EM_OK);
    CHECK_ERROR(EM_ERR_FORMAT, "e.npy");
}

static void test_npy_header_writer(void) {
    char hdr[1024];
    const int64_t shapes[3][3] = {{0}, {5}, {2, 0, 7}};
    const int ndims[3] = {0, 1, 3};
    for (int k = 0; k < 3; k++) {
        size_t n = em__npy_header(EM_I64, ndims[k], shapes[k], hdr, sizeof hdr);
        CHECK(n > 0 && n % 64 == 0 && hdr[n - 1] == '\n');
        size_t data_bytes = 8;
        for (int d = 0; d < ndims[k]; d++) data_bytes *= (size_t)shapes[k][d];
        unsigned char *file = calloc(1, n + data_bytes);
        memcpy(file, hdr, n);
        em__array a;
        CHECK_OK(em__npy_parse("w.npy", file, n + data_bytes, &a));
        CHECK(a.dtype == EM_I64 && a.ndim == ndims[k]);
        for (int d = 0; d < ndims[k]; d++) CHECK(a.shape[d] == shapes[k][d]);
        free(file);
    }
    CHECK(em__npy_header(EM_BF16, 0, NULL, hdr, sizeof hdr) == 0);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "bfloat16");
}

/* ---------------------------------------------------------------- CSV */

static em_status csv(const char *text, em_csv_opts o, em__array *x, em__array *y) {
    /* an exact-size copy: no NUL after the text, so a read past it is caught by ASan */
    size_t n = strlen(text);
    char *copy = malloc(n ? n : 1);
    memcpy(copy, text, n);
    em_status s = em__csv_parse("t.csv", copy, n, &o, x, y);
    free(copy);
    return s;
}

static void test_csv_basic(void) {
    em__array x, y;
    CHECK_OK(csv("label,a,b\n1,0.5,2\n\n0, -1e3 ,\"3.25\"\r\n7,1,1", (em_csv_opts){.header = true}, &x, &y));
    CHECK(x.dtype == EM_F32 && x.ndim == 2 && x.shape[0] == 3 && x.shape[1] == 2);
    CHECK(y.dtype == EM_I64 && y.ndim == 1 && y.shape[0] == 3);
    const float *xf = x.data;
    const int64_t *yi = y.data;
    CHECK(xf[0] == 0.5f && xf[1] == 2 && xf[2] == -1000 && xf[3] == 3.25f && xf[4] == 1 && xf[5] == 1);
    CHECK(yi[0] == 1 && yi[1] == 0 && yi[2] == 7);
    em__array_free(&x);
    em__array_free(&y);
    /* last column as label, ';' delimiter */
    CHECK_OK(csv("1;2;3\n4;5;-6\n", (em_csv_opts){.label_column = -1, .delimiter = ';'}, &x, &y));
    CHECK(x.shape[0] == 2 && x.shape[1] == 2 && ((int64_t *)y.data)[1] == -6 && ((float *)x.data)[2] == 4);
    em__array_free(&x);
    em__array_free(&y);
    /* no label: every column is a feature; y stays empty */
    CHECK_OK(csv("1,2\n3,4\n", (em_csv_opts){.label_column = EM_CSV_NO_LABEL}, &x, &y));
    CHECK(x.shape[1] == 2 && y.data == NULL && y.ndim == 0);
    em__array_free(&x);
    CHECK_OK(csv("1,2\n3,4\n", (em_csv_opts){0}, &x, NULL));
    CHECK(x.shape[0] == 2 && x.shape[1] == 2);
    em__array_free(&x);
    /* "" inside a quoted field is an escaped quote, not its end */
    CHECK_OK(csv("\"say \"\"hi\"\"\",\"b\"\"\"\n1,2\n", (em_csv_opts){.header = true}, &x, &y));
    CHECK(x.shape[0] == 1 && x.shape[1] == 1 && ((float *)x.data)[0] == 2 && ((int64_t *)y.data)[0] == 1);
    em__array_free(&x);
    em__array_free(&y);
}

static void test_csv_errors(void) {
    em__array x, y;
    CHECK(csv("1,2,3\n4,5\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.csv: line 2, column 3 (byte 9): ragged row: expected 3 columns, found 2");
    CHECK(csv("1,2\n4,5,6\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "line 2, column 3 (byte 8): ragged row: expected 2 columns, found more");
    CHECK(csv("a,b\n1,x2\n", (em_csv_opts){.header = true}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.csv: line 2, column 2 (byte 6): 'x2' is not a number");
    CHECK(csv("1,,2\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "line 1, column 2 (byte 2): empty field");
    CHECK(csv("1.5,2\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "label '1.5' is not an integer");
    CHECK(csv("1,2\n", (em_csv_opts){.label_column = 2}, &x, &y) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "label column 2 is out of range");
    CHECK(csv("\"1,2\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "unterminated quote");
    /* decimal only: strtod's hexadecimal forms are not numbers in a CSV file */
    CHECK(csv("0x10,2\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.csv: line 1, column 1 (byte 0): '0x10' is not a number (decimal expected)");
    CHECK(csv("1,0X1p3\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "column 2 (byte 2): '0X1p3' is not a number");
    CHECK(csv("1e999,2\n", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "out of range");
    CHECK(csv("a,b\n\n", (em_csv_opts){.header = true}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "no data rows");
    CHECK(csv("", (em_csv_opts){0}, &x, &y) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "t.csv: no data rows");
    /* every prefix of a valid file parses or fails cleanly */
    const char *text = "label,a\n1,0.5\n2,\"3\"\n";
    for (size_t n = 0; n <= strlen(text); n++) {
        char *c = malloc(n ? n : 1);
        memcpy(c, text, n);
        em_status s = em__csv_parse("p.csv", c, n, &(em_csv_opts){.header = true}, &x, &y);
        CHECK(s == EM_OK || strstr(em_last_error(), "p.csv"));
        em__array_free(&x);
        em__array_free(&y);
        em_clear_error();
        free(c);
    }
}

int main(void) {
    RUN(test_idx_tiny_gz);
    RUN(test_idx_labels_raw);
    RUN(test_idx_types_big_endian);
    RUN(test_idx_errors);
    RUN(test_idx_gzip_truncated_and_corrupt);
    RUN(test_npy_numpy_files);
    RUN(test_npy_headers);
    RUN(test_npy_header_writer);
    RUN(test_csv_basic);
    RUN(test_csv_errors);
    return test_summary();
}
