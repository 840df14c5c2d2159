/* The checks of the readers that are not file parsers of data/parsers.h: the gzip path of the
 * idx reader, the checkpoint loader (safetensors + Ember's metadata, into a model and an
 * optimizer), the JSON parser, the device-string parser and EMBER_MEMORY_CAP. Shared, like
 * fuzz_common.h, by the libFuzzer targets (fuzz/fuzz_*.c) and tests/test_fuzz_corpus_more.c.
 * Include fuzz_common.h first (FUZZ_FAIL). */
#ifndef EMBER_FUZZ_MORE_H
#define EMBER_FUZZ_MORE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>
#include "fuzz_common.h"
#include "data/json.h"
#include "memory/internal.h"

/* ---- idx, gzip path ----
 * The first byte picks how the rest reaches the parser: 0 gzip-compress it (so the
 * decompressed idx content is what is fuzzed), 1 compress it and cut the stream at a point
 * given by the second byte, 2 compress it twice over (two gzip members), 3 the bytes as
 * they are after a gzip magic (so the deflate stream itself is fuzzed). */
static inline size_t fuzz_gzip(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    size_t len = cap - z.avail_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END ? len : 0;
}

static inline void fuzz_idx_gz_one(const uint8_t *data, size_t size) {
    if (size < 2) return;
    int mode = data[0] & 3;
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    size_t cap = 2 * n + 64;
    uint8_t *buf = malloc(2 * cap);
    if (!buf) return;
    size_t len = 0;
    if (mode == 3) {
        buf[0] = 0x1f, buf[1] = 0x8b;
        memcpy(buf + 2, body, n);
        len = n + 2;
    } else {
        len = fuzz_gzip(body, n, buf, cap);
        if (mode == 1 && len) len = len * body[0] / 256;
        if (mode == 2 && len) len += fuzz_gzip(body, n, buf + len, cap);
    }
    uint8_t *exact = malloc(len ? len : 1);   /* exact size: ASan sees a read past the end */
    if (exact) {
        memcpy(exact, buf, len);
        fuzz_idx_one(exact, len);
        /* decompressed or not, the same content must parse the same way */
        if (mode == 0 && len) {
            em__array a, b;
            em_status sa = em__idx_parse("fuzz.idx", exact, len, &a);
            em_status sb = em__idx_parse("fuzz.idx", body, n, &b);
            if ((sa == EM_OK) != (sb == EM_OK)) FUZZ_FAIL("gzip and plain idx disagree");
            if (sa == EM_OK && sb == EM_OK && (a.nbytes != b.nbytes || memcmp(a.data, b.data, a.nbytes)))
                FUZZ_FAIL("gzip and plain idx give different data");
            em__array_free(&a);
            em__array_free(&b);
            em_clear_error();
        }
    }
    free(exact);
    free(buf);
}

/* ---- JSON ---- */
static inline void fuzz_json_walk(const em__json *j, int depth) {
    if (depth > EM__JSON_MAX_DEPTH + 1) FUZZ_FAIL("JSON nested deeper than its limit");
    switch (j->type) {
    case EM__JSON_STRING:
        if (!j->str || strlen(j->str) != j->len) FUZZ_FAIL("JSON string length");
        else fuzz_touch(j->str, j->len);
        break;
    case EM__JSON_NUMBER:
        if (j->is_uint && (double)j->u != j->num && fabs((double)j->u - j->num) > 1e-6 * j->num)
            FUZZ_FAIL("JSON integer and number disagree");
        break;
    case EM__JSON_ARRAY:
    case EM__JSON_OBJECT:
        if (j->count < 0 || (j->count && !j->items)) FUZZ_FAIL("JSON container without items");
        for (int i = 0; i < j->count; i++) {
            if (j->type == EM__JSON_OBJECT) {
                fuzz_touch(j->keys[i], strlen(j->keys[i]));
                if (em__json_get(j, j->keys[i]) != &j->items[i]) FUZZ_FAIL("JSON key lookup");
            }
            fuzz_json_walk(&j->items[i], depth + 1);
        }
        break;
    default:
        break;
    }
}

static inline void fuzz_json_one(const uint8_t *data, size_t size) {
    em__json j;
    memset(&j, 0, sizeof j);
    em_status s = em__json_parse("fuzz.json", (const char *)data, size, 0, &j);
    if (s == EM_OK) fuzz_json_walk(&j, 0);
    em__json_free(&j);
    fuzz_check_status(s, "fuzz.json");
}

/* ---- strings: NUL-terminated copies, so the parsers see C strings ---- */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (s) {
        memcpy(s, data, size);
        s[size] = 0;
    }
    return s;
}

/* Device strings: what parses prints back to itself. */
static inline void fuzz_device_one(const uint8_t *data, size_t size) {
    char *s = fuzz_cstr(data, size);
    if (!s) return;
    em_device d;
    em_status st = em_device_parse(s, &d);
    if (st == EM_OK) {
        em_device back;
        if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT || d.index < -1) FUZZ_FAIL("device out of range");
        else if (em_device_parse(em_device_str(d).s, &back) != EM_OK || back.type != d.type || back.index != d.index)
            FUZZ_FAIL("device does not print back to itself");
    } else if (!em_failed() || !em_last_error()[0]) {
        FUZZ_FAIL("bad device string without a message");
    }
    em_clear_error();
    free(s);
}

/* EMBER_MEMORY_CAP and sizes: a cap is a byte count, a fraction in (0, 1], or an error that
 * says what was expected; never anything else. The first byte picks the device. */
static inline void fuzz_memcap_one(const uint8_t *data, size_t size) {
    if (size < 1) return;
    static const em_device devs[] = {{EM_CPU, 0}, {EM_OPENCL, 0}, {EM_OPENCL, 3}, {EM_CUDA, 1}};
    char *s = fuzz_cstr(data + 1, size - 1);
    if (!s) return;
    int64_t bytes;
    em_status ps = em_memory_parse_size(s, &bytes);
    if (ps == EM_OK && bytes < 0) FUZZ_FAIL("negative size");
    em_clear_error();
    /* putenv of one static buffer: setenv would keep every value ever set (glibc does) */
    static char env[24 + 65536];
    snprintf(env, sizeof env, "EMBER_MEMORY_CAP=%s", s);
    putenv(env);
    unsetenv("EMBER_MEMORY_POLICY");
    mem_state st;
    memset(&st, 0, sizeof st);
    st.dev = devs[data[0] & 3];
    st.cap = -1;
    em__mem_config_from_env(&st);
    if (st.config_error[0]) {
        if (!strstr(st.config_error, "EMBER_MEMORY_CAP")) FUZZ_FAIL("cap error does not name the variable");
    } else if (st.cap_fraction != 0) {
        if (!(st.cap_fraction > 0 && st.cap_fraction <= 1) || st.cap != -1) FUZZ_FAIL("bad cap fraction");
    } else if (st.cap < -1) {
        FUZZ_FAIL("negative cap");
    }
    unsetenv("EMBER_MEMORY_CAP");   /* later allocations of this process must not see it */
    free(s);
}

/* ---- checkpoints ----
 * The input is written to a file and loaded into Linear(4, 3), ReLU, Linear(3, 2) and its
 * Adam optimizer. A failed load must leave both as they were; a successful one must leave
 * them usable: a training step then succeeds. */
#define FUZZ_CKPT_PARAMS 4
static inline void fuzz_ckpt_snapshot(em_module *m, float *out, int64_t cap, int64_t *n) {
    em_named_tensor p[FUZZ_CKPT_PARAMS];
    int k = em_module_parameters(m, p, FUZZ_CKPT_PARAMS);
    *n = 0;
    for (int i = 0; i < k && i < FUZZ_CKPT_PARAMS; i++) {
        const float *d = em_data_ptr(p[i].tensor);
        int64_t c = em_numel(p[i].tensor);
        for (int64_t j = 0; j < c && *n < cap; j++) out[(*n)++] = d ? d[j] : NAN;
    }
}

static inline void fuzz_checkpoint_one(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/ember-fuzz-%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, size, f);
    fclose(f);
    em_manual_seed(3);
    em_module *m = em_nn_sequential(em_nn_linear(4, 3), em_nn_relu(), em_nn_linear(3, 2));
    em_optimizer *o = em_adam(m, 0.01);
    if (!m || !o) {
        FUZZ_FAIL("cannot build the model and optimizer");
        em_clear_error();
        em_optim_free(o);
        em_module_free(m);
        return;
    }
    float before[64], after[64];
    int64_t nb, na;
    fuzz_ckpt_snapshot(m, before, 64, &nb);
    em_safetensors *meta = NULL;
    em_status s = em_checkpoint_load(path, m, o, &meta);
    if (s != EM_OK) {
        if (!em_failed() || !em_last_error()[0]) FUZZ_FAIL("failed load without a message");
        em_clear_error();
        fuzz_ckpt_snapshot(m, after, 64, &na);
        if (na != nb || memcmp(before, after, (size_t)nb * sizeof(float)) || em_optim_steps(o) != 0)
            FUZZ_FAIL("a failed load changed the model or optimizer");
    } else {
        const char *v = em_safetensors_metadata(meta, "step");
        if (v) fuzz_touch(v, strlen(v));
        em_clear_error();
        em_scope sc = em_scope_begin();
        em_tensor *x = em_ones(EM_SHAPE(2, 4), EM_OPTS(0));
        em_tensor *y = em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_I64));
        em_zero_grad(o);
        em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
        if (!loss || em_backward(loss) != EM_OK || em_step(o) != EM_OK)
            FUZZ_FAIL("the model or optimizer is unusable after a successful load");
        em_scope_end(sc);
        em_clear_error();
    }
    em_safetensors_free(meta);
    em_optim_free(o);
    em_module_free(m);
    remove(path);
}

#endif
