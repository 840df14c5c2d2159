/* Helpers shared by the data tests (tests/test_data_*.c, tests/test_safetensors.c). */
#ifndef EMBER_TEST_DATA_UTIL_H
#define EMBER_TEST_DATA_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
