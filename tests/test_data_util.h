/* Helpers shared by the data tests (tests/test_data_*.c, tests/test_safetensors.c). */
#ifndef EMBER_TEST_DATA_UTIL_H
#define EMBER_TEST_DATA_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <ember/ember.h>

/* tests/data, from $EMBER_TEST_DATA (set by ctest) or relative to the source root. */
static inline const char *test_data_dir(void) {
    const char *d = getenv("EMBER_TEST_DATA");
    return d && *d ? d : "tests/data";
}

static inline char *test_data_path(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", test_data_dir(), name);
    return buf[k];
}

/* A whole file in a malloc'ed buffer (NULL when missing); *len gets its size. */
static inline unsigned char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *b = malloc(cap);
    for (;;) {
        if (n == cap) b = realloc(b, cap *= 2);
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    *len = n;
    return b;
}

static inline int test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* A fresh empty directory under $TMPDIR (or /tmp) for files a test writes. */
static inline char *test_tmpdir(void) {
    static char buf[512];
    const char *t = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/ember-test-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(buf);
}

/* The tensor's bytes, row-major (malloc'ed). */
static inline unsigned char *bytes_of(em_tensor *t, size_t *n) {
    *n = em_nbytes(t);
    unsigned char *b = malloc(*n ? *n : 1);
    if (em_copy_to_host(t, b, *n) != EM_OK) {
        free(b);
        return NULL;
    }
    return b;
}

static inline bool same_tensor(em_tensor *a, em_tensor *b) {
    if (!a || !b || em_dtype_of(a) != em_dtype_of(b) || em_ndim(a) != em_ndim(b)) return false;
    for (int i = 0; i < em_ndim(a); i++)
        if (em_size(a, i) != em_size(b, i)) return false;
    size_t na, nb;
    unsigned char *ba = bytes_of(a, &na), *bb = bytes_of(b, &nb);
    bool same = ba && bb && na == nb && memcmp(ba, bb, na) == 0;
    free(ba);
    free(bb);
    return same;
}

/* Deterministic bit patterns, valid for the dtype (bool 0/1), including NaN payloads,
 * infinities, -0 and subnormals for the floating types. */
static unsigned char *last_pattern __attribute__((unused));  /* the bytes of the last pattern() tensor */
static size_t last_pattern_len __attribute__((unused));

static inline em_tensor *pattern(em_dtype dt, em_shape shape) {
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++) n *= shape.d[i];
    size_t es = em_dtype_size(dt);
    unsigned char *b = malloc((size_t)n * es + 1);
    uint64_t s = 0x1234567u + dt;
    for (size_t i = 0; i < (size_t)n * es; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (unsigned char)(s >> 56);
    }
    if (dt == EM_BOOL)
        for (int64_t i = 0; i < n; i++) b[i] &= 1;
    if (dt == EM_F32 && n >= 4) {
        const uint32_t special[4] = {0x7FC00123u, 0xFF800000u, 0x80000000u, 0x00000001u};
        memcpy(b, special, sizeof special);
    }
    em_tensor *t = em_from_data(b, dt, shape, (em_opts){.dtype = dt});
    free(last_pattern);
    last_pattern = b;
    last_pattern_len = (size_t)n * es;
    return t;
}

#endif
