/* The TensorBoard summary writer (src/data/summary.c): CRC-32C against RFC 3720's vectors,
 * the TFRecord framing and the protobuf fields parsed back by a small reader written here,
 * and the errors (a folder that cannot be made, bad arguments). TensorBoard's own reader
 * checks the same files in tests/python/test_tensorboard.py. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "data/crc32c.h"

static void test_crc32c_vectors(void) {
    unsigned char buf[32];
    memset(buf, 0, sizeof buf);
    CHECK(em__crc32c(buf, 32) == 0x8A9136AAu);   /* RFC 3720 B.4: 32 bytes of zeros */
    memset(buf, 0xFF, sizeof buf);
    CHECK(em__crc32c(buf, 32) == 0x62A8AB43u);   /* 32 bytes of ones */
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    CHECK(em__crc32c(buf, 32) == 0x46DD794Eu);   /* incrementing */
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    CHECK(em__crc32c(buf, 32) == 0x113FDB5Cu);   /* decrementing */
    CHECK(em__crc32c("123456789", 9) == 0xE3069283u);   /* the usual check value */
    uint32_t c = em__crc32c("123456789", 9);
    CHECK(em__crc32c_masked("123456789", 9) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

/* ---- a small reader: TFRecords, then protobuf fields ---- */

typedef struct rec { unsigned char *p; size_t n; } rec;

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Splits a file into records, checking both CRCs; the count, or -1 on a bad frame. */
static int read_records(const char *path, unsigned char **file, rec *out, int max) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char *buf = malloc(1 << 20);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    *file = buf;
    int n = 0;
    size_t at = 0;
    while (at < len) {
        if (len - at < 12 || n == max) return -1;
        uint64_t dlen = le(buf + at, 8);
        if ((uint32_t)le(buf + at + 8, 4) != em__crc32c_masked(buf + at, 8)) return -1;
        if (len - at - 12 < dlen + 4) return -1;
        if ((uint32_t)le(buf + at + 12 + dlen, 4) != em__crc32c_masked(buf + at + 12, dlen)) return -1;
        out[n++] = (rec){buf + at + 12, dlen};
        at += 12 + dlen + 4;
    }
    return n;
}

typedef struct field { int wire; uint64_t v; const unsigned char *p; size_t n; } field;

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int s = 0; *p < end && s < 64; s += 7) {
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << s;
        if (!(b & 0x80)) break;
    }
    return v;
}

/* The k-th (from 0) occurrence of field number num in message m; false if absent. */
static bool get(rec m, unsigned num, int k, field *f) {
    const unsigned char *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint64_t key = varint(&p, end);
        field x = {.wire = (int)(key & 7)};
        if (x.wire == 0) x.v = varint(&p, end);
        else if (x.wire == 1) x.v = le(p, 8), p += 8;
        else if (x.wire == 5) x.v = le(p, 4), p += 4;
        else if (x.wire == 2) x.n = varint(&p, end), x.p = p, p += x.n;
        else return false;
        if (p > end) return false;
        if ((key >> 3) == num && k-- == 0) {
            *f = x;
            return true;
        }
    }
    return false;
}

static rec sub(field f) { return (rec){(unsigned char *)f.p, f.n}; }
static double as_double(uint64_t v) { double d; memcpy(&d, &v, 8); return d; }
static float as_float(uint64_t v) { uint32_t u = (uint32_t)v; float x; memcpy(&x, &u, 4); return x; }
static bool is_str(field f, const char *s) { return f.wire == 2 && f.n == strlen(s) && !memcmp(f.p, s, f.n); }

/* Event.summary.value[0] of an event record. */
static bool value_of(rec ev, rec *value) {
    field s, v;
    if (!get(ev, 5, 0, &s) || !get(sub(s), 1, 0, &v)) return false;
    *value = sub(v);
    return true;
}

static char dir_template[] = "/tmp/ember_summary_XXXXXX";

static void test_write_and_read_back(void) {
    char *tmp = mkdtemp(dir_template);
    CHECK(tmp != NULL);
    if (!tmp) return;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run/a", tmp);   /* two missing levels: made by open */
    em_summary_writer *w = em_summary_writer_open(dir);
    CHECK(w != NULL);
    if (!w) return;
    const char *path = em_summary_writer_path(w);
    CHECK(strncmp(path, dir, strlen(dir)) == 0 && strstr(path, "/events.out.tfevents.") != NULL);
    CHECK_OK(em_summary_add_scalar(w, "loss", 0.25, 7));
    float xs[] = {-1, 0, 0.5, 2, 3.5, 3.5};
    em_tensor *t = em_from_data(xs, EM_F32, EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_F32));
    CHECK_OK(em_summary_add_histogram(w, "weights", t, 8));
    CHECK_OK(em_summary_add_text(w, "note", "hello *world*", 9));
    CHECK_OK(em_summary_writer_flush(w));
    char saved[512];
    snprintf(saved, sizeof saved, "%s", path);
    CHECK_OK(em_summary_writer_close(w));
    em_release(t);

    unsigned char *file = NULL;
    rec r[8];
    int n = read_records(saved, &file, r, 8);
    CHECK(n == 4);
    if (n != 4) {
        free(file);
        return;
    }
    field f, g;
    /* the file_version event first, with a wall time of now */
    CHECK(get(r[0], 3, 0, &f) && is_str(f, "brain.Event:2"));
    CHECK(get(r[0], 1, 0, &f) && f.wire == 1 && fabs(as_double(f.v) - (double)time(NULL)) < 60);
    /* the scalar */
    rec v;
    CHECK(get(r[1], 2, 0, &f) && f.v == 7);
    CHECK(value_of(r[1], &v) && get(v, 1, 0, &f) && is_str(f, "loss"));
    CHECK(value_of(r[1], &v) && get(v, 2, 0, &f) && f.wire == 5 && as_float(f.v) == 0.25f);
    /* the histogram */
    CHECK(get(r[2], 2, 0, &f) && f.v == 8);
    CHECK(value_of(r[2], &v) && get(v, 1, 0, &f) && is_str(f, "weights"));
    if (value_of(r[2], &v) && get(v, 5, 0, &g)) {
        rec h = sub(g);
        CHECK(get(h, 1, 0, &f) && as_double(f.v) == -1);
        CHECK(get(h, 2, 0, &f) && as_double(f.v) == 3.5);
        CHECK(get(h, 3, 0, &f) && as_double(f.v) == 6);
        CHECK(get(h, 4, 0, &f) && as_double(f.v) == 8.5);
        CHECK(get(h, 5, 0, &f) && as_double(f.v) == 1 + 0.25 + 4 + 12.25 + 12.25);
        field lim, cnt;
        CHECK(get(h, 6, 0, &lim) && get(h, 7, 0, &cnt) && lim.n == cnt.n && lim.n % 8 == 0);
        double total = 0, last = -INFINITY;
        for (size_t i = 0; i + 8 <= cnt.n; i += 8) {
            double l = as_double(le(lim.p + i, 8)), c = as_double(le(cnt.p + i, 8));
            CHECK(l > last);   /* increasing limits */
            last = l, total += c;
        }
        CHECK(total == 6 && last == 3.5);
        /* -1 lands in the first bucket, the two 3.5s in the last */
        CHECK(as_double(le(cnt.p, 8)) == 1 && as_double(le(cnt.p + cnt.n - 8, 8)) == 2);
    } else {
        CHECK(!"no histo field");
    }
    /* the text: metadata names the text plugin, the tensor is one DT_STRING */
    CHECK(get(r[3], 2, 0, &f) && f.v == 9);
    if (value_of(r[3], &v) && get(v, 9, 0, &f) && get(sub(f), 1, 0, &g) && get(sub(g), 1, 0, &f))
        CHECK(is_str(f, "text"));
    else
        CHECK(!"no plugin_data.plugin_name");
    if (value_of(r[3], &v) && get(v, 8, 0, &g)) {
        CHECK(get(sub(g), 1, 0, &f) && f.v == 7);
        CHECK(get(sub(g), 8, 0, &f) && is_str(f, "hello *world*"));
    } else {
        CHECK(!"no tensor field");
    }
    free(file);
    unlink(saved);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

static void test_bad_folder(void) {
    char tmp[] = "/tmp/ember_summary_bad_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    char file[300], dir[320];
    snprintf(file, sizeof file, "%s/plain_file", tmp);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(dir, sizeof dir, "%s/sub", file);   /* under a regular file: cannot be made */
    CHECK(em_summary_writer_open(dir) == NULL);
    CHECK_ERROR(EM_ERR_IO, "cannot create the folder");
    CHECK(em_summary_writer_open(file) == NULL);   /* a file, not a folder */
    CHECK_ERROR(EM_ERR_IO, "plain_file");
    CHECK(em_summary_writer_open("/proc/ember_no_such_dir") == NULL);
    CHECK_ERROR(EM_ERR_IO, "/proc/ember_no_such_dir");
    CHECK(em_summary_writer_open("") == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a folder");
    unlink(file);
    rmdir(tmp);
}

static void test_bad_arguments(void) {
    char tmp[] = "/tmp/ember_summary_args_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    em_summary_writer *w = em_summary_writer_open(tmp);
    CHECK(w != NULL);
    if (!w) return;
    CHECK(em_summary_add_scalar(NULL, "x", 1, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 'w' is NULL");
    CHECK(em_summary_add_scalar(w, "", 1, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a tag");
    CHECK(em_summary_add_text(w, "t", NULL, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'text' is NULL");
    float nan_data[] = {1, NAN};
    em_tensor *t = em_from_data(nan_data, EM_F32, EM_SHAPE(2), EM_OPTS(.dtype = EM_F32));
    CHECK(em_summary_add_histogram(w, "h", t, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "found NaN at element 1");
    em_release(t);
    char path[512];
    snprintf(path, sizeof path, "%s", em_summary_writer_path(w));
    CHECK_OK(em_summary_writer_close(w));
    CHECK(em_summary_writer_close(NULL) == EM_OK);
    /* the failed calls wrote nothing: the file holds the file_version record alone */
    unsigned char *file = NULL;
    rec r[4];
    CHECK(read_records(path, &file, r, 4) == 1);
    free(file);
    unlink(path);
    rmdir(tmp);
}

/* Two writers open in one folder in the same second: a file each, each readable. */
static void test_two_writers(void) {
    char tmp[] = "/tmp/ember_summary_two_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    em_summary_writer *a = em_summary_writer_open(tmp), *b = em_summary_writer_open(tmp);
    CHECK(a && b);
    if (!a || !b) return;
    CHECK(strcmp(em_summary_writer_path(a), em_summary_writer_path(b)) != 0);
    CHECK_OK(em_summary_add_scalar(a, "x", 1, 1));
    CHECK_OK(em_summary_add_scalar(b, "x", 2, 1));
    char pa[512], pbuf[512];
    snprintf(pa, sizeof pa, "%s", em_summary_writer_path(a));
    snprintf(pbuf, sizeof pbuf, "%s", em_summary_writer_path(b));
    CHECK_OK(em_summary_writer_close(a));
    CHECK_OK(em_summary_writer_close(b));
    unsigned char *file = NULL;
    rec r[4];
    CHECK(read_records(pa, &file, r, 4) == 2);
    free(file);
    CHECK(read_records(pbuf, &file, r, 4) == 2);
    free(file);
    unlink(pa), unlink(pbuf);
    rmdir(tmp);
}

int main(void) {
    RUN(test_crc32c_vectors);
    RUN(test_write_and_read_back);
    RUN(test_bad_folder);
    RUN(test_bad_arguments);
    RUN(test_two_writers);
    return test_summary();
}
