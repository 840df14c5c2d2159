/* TensorBoard event files (include/ember/summary.h): TFRecord records of Event protobuf
 * messages.
 *
 * The protobuf messages are written by a small hand encoder rather than protobuf-c: Ember
 * writes a handful of fields of five messages (Event, Summary, Summary.Value,
 * HistogramProto, SummaryMetadata/PluginData, TensorProto) and never reads them, so a
 * varint, a fixed64/fixed32 and a length-delimited writer are all it takes. protobuf-c
 * would need TensorFlow's .proto files vendored, protoc-c at build time, generated code in
 * the tree and libprotobuf-c as a new run-time dependency of libember and its .deb.
 * Field numbers are those of tensorboard/compat/proto/{event,summary,tensor}.proto;
 * tests/python/test_tensorboard.py reads the files back with TensorBoard's own reader.
 *
 * Each record is built in memory and written with one write() call (retried on a short
 * write), so a process killed between calls leaves only whole records. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <ember/summary.h>
#include "crc32c.h"
#include "../core/internal_api.h"

/* ---- CRC-32C ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));   /* reflected 0x1EDC6F41 */
        crc_table[i] = c;
    }
}

uint32_t em__crc32c(const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t em__crc32c_masked(const void *data, size_t n) {
    uint32_t c = em__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding ---- */

typedef struct pb {
    unsigned char *p;
    size_t len, cap;
    bool oom;   /* an allocation failed: every later write is dropped, checked once at the end */
} pb;

static void pb_put(pb *b, const void *src, size_t n) {
    if (b->oom || n == 0) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void pb_varint(pb *b, uint64_t v) {
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    pb_put(b, tmp, n);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void pb_key(pb *b, unsigned field, unsigned wire) { pb_varint(b, ((uint64_t)field << 3) | wire); }

static void pb_le(pb *b, uint64_t v, int nbytes) {
    unsigned char tmp[8];
    for (int i = 0; i < nbytes; i++) tmp[i] = (unsigned char)(v >> (8 * i));
    pb_put(b, tmp, (size_t)nbytes);
}

static void pb_double(pb *b, unsigned field, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    pb_key(b, field, WIRE_FIXED64);
    pb_le(b, u, 8);
}

static void pb_float(pb *b, unsigned field, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    pb_key(b, field, WIRE_FIXED32);
    pb_le(b, u, 4);
}

static void pb_bytes(pb *b, unsigned field, const void *p, size_t n) {
    pb_key(b, field, WIRE_BYTES);
    pb_varint(b, n);
    pb_put(b, p, n);
}

/* A nested message: inner's bytes as a length-delimited field; inner is freed. */
static void pb_message(pb *b, unsigned field, pb *inner) {
    if (inner->oom) b->oom = true;
    pb_bytes(b, field, inner->p, inner->len);
    free(inner->p);
    *inner = (pb){0};
}

/* ---- the writer ---- */

struct em_summary_writer {
    int fd;
    char *path;
};

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* One TFRecord: length, masked CRC of the length, data, masked CRC of the data; written
 * with a single write() so that no partial record is left by a kill between calls. */
static em_status write_record(em_summary_writer *w, const pb *data, const char *op) {
    if (data->oom) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for the event", op);
    pb rec = {0};
    pb_le(&rec, data->len, 8);
    uint32_t lcrc = em__crc32c_masked(rec.p ? rec.p : (unsigned char *)"", rec.len);
    pb_le(&rec, lcrc, 4);
    pb_put(&rec, data->p, data->len);
    pb_le(&rec, em__crc32c_masked(data->p, data->len), 4);
    if (rec.oom) {
        free(rec.p);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for the record", op);
    }
    size_t done = 0;
    while (done < rec.len) {
        ssize_t n = write(w->fd, rec.p + done, rec.len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(rec.p);
            return em_error(EM_ERR_IO, "%s: cannot write to '%s': %s", op, w->path, strerror(e));
        }
        done += (size_t)n;
    }
    free(rec.p);
    return EM_OK;
}

/* An Event with wall_time (1), step (2) and either file_version (3) or a summary (5) made
 * of one Value; value is freed. */
static em_status write_event(em_summary_writer *w, int64_t step, const char *file_version, pb *value,
                             const char *op) {
    pb ev = {0};
    pb_double(&ev, 1, wall_time());
    if (step) {
        pb_key(&ev, 2, WIRE_VARINT);
        pb_varint(&ev, (uint64_t)step);
    }
    if (file_version) pb_bytes(&ev, 3, file_version, strlen(file_version));
    if (value) {
        pb summary = {0};
        pb_message(&summary, 1, value);   /* Summary.value */
        pb_message(&ev, 5, &summary);
    }
    em_status s = write_record(w, &ev, op);
    free(ev.p);
    return s;
}

/* mkdir -p: each missing component in turn. */
static int make_dirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return ENOMEM;
    int err = 0;
    for (char *c = p + 1;; c++) {
        if (*c == '/' || *c == '\0') {
            char saved = *c;
            *c = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                err = errno;
                break;
            }
            *c = saved;
            if (!saved) break;
        }
    }
    struct stat st;
    if (!err && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) err = stat(dir, &st) != 0 ? errno : ENOTDIR;
    free(p);
    return err;
}

em_summary_writer *em_summary_writer_open(const char *dir) {
    static const char op[] = "em_summary_writer_open";
    if (!dir || !*dir) {
        if (dir) em_error(EM_ERR_ARGUMENT, "%s: expected a folder, got an empty string", op);
        else em__error_unless_pending(EM_ERR_ARGUMENT, "%s: expected a folder, got NULL", op);
        return NULL;
    }
    int err = make_dirs(dir);
    if (err) {
        em_error(EM_ERR_IO, "%s: cannot create the folder '%s': %s", op, dir, strerror(err));
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    long long now = (long long)time(NULL);
    /* room for a ".N" suffix: two writers opened in one second by one process get a file each */
    int n = snprintf(NULL, 0, "%s/events.out.tfevents.%lld.%s.%ld", dir, now, host, (long)getpid()) + 12;
    em_summary_writer *w = calloc(1, sizeof *w);
    char *path = n > 12 ? malloc((size_t)n) : NULL;
    if (!w || !path) {
        free(w), free(path);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    int base = snprintf(path, (size_t)n, "%s/events.out.tfevents.%lld.%s.%ld", dir, now, host, (long)getpid());
    w->path = path;
    w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
    for (int k = 1; w->fd < 0 && errno == EEXIST && k < 1000; k++) {
        snprintf(path + base, (size_t)(n - base), ".%d", k);
        w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
    }
    if (w->fd < 0) {
        em_error(EM_ERR_IO, "%s: cannot write an event file in the folder '%s': %s", op, dir, strerror(errno));
        free(path), free(w);
        return NULL;
    }
    if (write_event(w, 0, "brain.Event:2", NULL, op) != EM_OK) {
        close(w->fd);
        unlink(path);
        free(path), free(w);
        return NULL;
    }
    return w;
}

const char *em_summary_writer_path(const em_summary_writer *w) { return w ? w->path : NULL; }

static em_status check_args(const em_summary_writer *w, const char *tag, const char *op) {
    if (!w) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: argument 'w' is NULL", op);
    if (!tag) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: expected a tag, got NULL", op);
    if (!*tag) return em_error(EM_ERR_ARGUMENT, "%s: expected a tag, got \"\"", op);
    return EM_OK;
}

em_status em_summary_add_scalar(em_summary_writer *w, const char *tag, double value, int64_t step) {
    em_status s = check_args(w, tag, "em_summary_add_scalar");
    if (s != EM_OK) return s;
    pb v = {0};
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_float(&v, 2, (float)value);   /* simple_value is a float in summary.proto */
    return write_event(w, step, NULL, &v, "em_summary_add_scalar");
}

#define HIST_BUCKETS 30

/* t's values as doubles in a malloc'ed buffer (n of them). */
static em_status tensor_doubles(em_tensor *t, double **out, int64_t *n, const char *op) {
    *out = NULL;
    *n = em_numel(t);
    em_scope sc = em_scope_begin();
    em_tensor *d = em_to_dtype(em_detach(t), EM_F64);   /* detached: no autograd node */
    em_status s = d ? EM_OK : em_last_status();
    double *buf = NULL;
    if (s == EM_OK) {
        buf = malloc((size_t)(*n ? *n : 1) * sizeof *buf);
        if (!buf) s = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %lld values", op, (long long)*n);
    }
    if (s == EM_OK) s = em_copy_to_host(d, buf, (size_t)*n * sizeof *buf);
    em_scope_end(sc);
    if (s != EM_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return EM_OK;
}

em_status em_summary_add_histogram(em_summary_writer *w, const char *tag, em_tensor *t, int64_t step) {
    static const char op[] = "em_summary_add_histogram";
    em_status s = check_args(w, tag, op);
    if (s != EM_OK) return s;
    if (!t) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: argument 't' is NULL", op);
    double *x;
    int64_t n;
    if ((s = tensor_doubles(t, &x, &n, op)) != EM_OK) return s;
    double lo = n ? INFINITY : 0, hi = n ? -INFINITY : 0, sum = 0, sumsq = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            free(x);
            return em_error(EM_ERR_ARGUMENT, "%s: '%s': expected values without NaN, found NaN at element %lld", op,
                            tag, (long long)i);
        }
        lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
        sum += x[i], sumsq += x[i] * x[i];
    }
    /* bucket i holds (limit[i-1], limit[i]]; bucket 0 everything up to limit[0] */
    int nb = hi > lo && isfinite(hi - lo) ? HIST_BUCKETS : 1;
    double width = (hi - lo) / nb, limit[HIST_BUCKETS], count[HIST_BUCKETS] = {0};
    for (int b = 0; b < nb; b++) limit[b] = b == nb - 1 ? hi : lo + width * (b + 1);
    for (int64_t i = 0; i < n; i++) {
        int b = nb == 1 ? 0 : (int)ceil((x[i] - lo) / width) - 1;
        b = b < 0 ? 0 : b >= nb ? nb - 1 : b;
        count[b] += 1;
    }
    free(x);
    pb h = {0};
    pb_double(&h, 1, lo);
    pb_double(&h, 2, hi);
    pb_double(&h, 3, (double)n);
    pb_double(&h, 4, sum);
    pb_double(&h, 5, sumsq);
    pb packed = {0};   /* repeated double [packed = true] */
    for (int b = 0; b < nb; b++) {
        uint64_t u;
        memcpy(&u, &limit[b], sizeof u);
        pb_le(&packed, u, 8);
    }
    pb_message(&h, 6, &packed);
    for (int b = 0; b < nb; b++) {
        uint64_t u;
        memcpy(&u, &count[b], sizeof u);
        pb_le(&packed, u, 8);
    }
    pb_message(&h, 7, &packed);
    pb v = {0};
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_message(&v, 5, &h);   /* Value.histo */
    return write_event(w, step, NULL, &v, op);
}

em_status em_summary_add_text(em_summary_writer *w, const char *tag, const char *text, int64_t step) {
    static const char op[] = "em_summary_add_text";
    em_status s = check_args(w, tag, op);
    if (s != EM_OK) return s;
    if (!text) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: argument 'text' is NULL", op);
    pb plugin = {0}, meta = {0}, tensor = {0}, v = {0};
    pb_bytes(&plugin, 1, "text", 4);           /* PluginData.plugin_name */
    pb_message(&meta, 1, &plugin);             /* SummaryMetadata.plugin_data */
    pb_key(&tensor, 1, WIRE_VARINT);           /* TensorProto.dtype = DT_STRING (7) */
    pb_varint(&tensor, 7);
    pb tshape = {0};                           /* tensor_shape: a scalar, no dims */
    pb_message(&tensor, 2, &tshape);
    pb_bytes(&tensor, 8, text, strlen(text));  /* string_val */
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_message(&v, 8, &tensor);                /* Value.tensor */
    pb_message(&v, 9, &meta);                  /* Value.metadata */
    return write_event(w, step, NULL, &v, op);
}

em_status em_summary_writer_flush(em_summary_writer *w) {
    if (!w) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_summary_writer_flush: argument 'w' is NULL");
    if (fsync(w->fd) != 0 && errno != EINVAL)
        return em_error(EM_ERR_IO, "em_summary_writer_flush: cannot flush '%s': %s", w->path, strerror(errno));
    return EM_OK;
}

em_status em_summary_writer_close(em_summary_writer *w) {
    if (!w) return EM_OK;
    em_status s = EM_OK;
    if (fsync(w->fd) != 0 && errno != EINVAL)
        s = em_error(EM_ERR_IO, "em_summary_writer_close: cannot flush '%s': %s", w->path, strerror(errno));
    if (close(w->fd) != 0 && s == EM_OK)
        s = em_error(EM_ERR_IO, "em_summary_writer_close: cannot close '%s': %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return s;
}
