/* One function per parser that the libFuzzer targets (fuzz/fuzz_*.c) and the corpus test
 * (tests/test_data_fuzz_corpus.c) both run: parse, touch every byte the parser hands
 * back (so AddressSanitizer sees any bad pointer or length), check the invariants. */
#ifndef EMBER_FUZZ_COMMON_H
#define EMBER_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <ember/ember.h>
#include "data/parsers.h"
#include "util/utf8.h"

/* A broken invariant: the fuzzers crash; the corpus test counts it. */
#ifndef FUZZ_FAIL
#define FUZZ_FAIL(what) __builtin_trap()
#endif

static inline unsigned fuzz_touch(const void *p, size_t n) {
    const volatile uint8_t *b = p;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) sum += b[i];
    return sum;
}

static inline void fuzz_check_array(const em__array *a) {
    int64_t numel = 1;
    for (int i = 0; i < a->ndim; i++) numel *= a->shape[i];
    if (numel != a->numel || (size_t)numel * em_dtype_size(a->dtype) != a->nbytes)
        FUZZ_FAIL("array size does not match its shape");
    if (a->nbytes && !a->data) FUZZ_FAIL("array without data");
    if (a->data) fuzz_touch(a->data, a->nbytes);
}

/* A failed parse must leave a message naming the input; a successful one none. */
static inline void fuzz_check_status(em_status s, const char *name) {
    if ((s != EM_OK) != em_failed()) FUZZ_FAIL("status and pending error disagree");
    if (s != EM_OK && !strstr(em_last_error(), name)) FUZZ_FAIL("error message does not name the file");
    em_clear_error();
}

static inline void fuzz_idx_one(const uint8_t *data, size_t size) {
    em__array a;
    em_status s = em__idx_parse("fuzz.idx", data, size, &a);
    if (s == EM_OK) fuzz_check_array(&a);
    em__array_free(&a);
    fuzz_check_status(s, "fuzz.idx");
}

static inline void fuzz_npy_one(const uint8_t *data, size_t size) {
    em__array a;
    em_status s = em__npy_parse("fuzz.npy", data, size, &a);
    if (s == EM_OK) {
        fuzz_check_array(&a);
        /* whatever was read must be writable again */
        char hdr[1024];
        if (em__npy_header(a.dtype, a.ndim, a.shape, hdr, sizeof hdr) == 0) FUZZ_FAIL("header not writable");
    }
    em__array_free(&a);
    fuzz_check_status(s, "fuzz.npy");
}

/* The first byte picks the options: bit 0 header, bits 1-2 the label column,
 * bit 3 ';' as delimiter, bit 4 no labels output. */
static inline void fuzz_csv_one(const uint8_t *data, size_t size) {
    if (size < 1) return;
    uint8_t sel = data[0];
    static const int labels[] = {0, -1, 2, EM_CSV_NO_LABEL};
    em_csv_opts o = {.header = sel & 1, .label_column = labels[(sel >> 1) & 3],
                     .delimiter = (sel & 8) ? ';' : 0};
    bool want_y = !(sel & 16);
    em__array x, y;
    em_status s = em__csv_parse("fuzz.csv", data + 1, size - 1, &o, &x, want_y ? &y : NULL);
    if (s == EM_OK) {
        fuzz_check_array(&x);
        if (x.ndim != 2) FUZZ_FAIL("csv features are not 2-d");
        if (want_y && y.data) {
            fuzz_check_array(&y);
            if (y.shape[0] != x.shape[0]) FUZZ_FAIL("csv labels and rows differ");
        }
    }
    em__array_free(&x);
    if (want_y) em__array_free(&y);
    fuzz_check_status(s, "fuzz.csv");
}

static inline void fuzz_safetensors_one(const uint8_t *data, size_t size) {
    em__st_file f;
    em_status s = em__safetensors_parse("fuzz.safetensors", data, size, &f);
    if (s == EM_OK) {
        /* the format's rules, as the reference reader applies them: the tensors, in the order
         * of their offsets, fill the data section from 0 to its end without a gap; every name
         * and metadata string is UTF-8 */
        uint64_t end = 0;
        for (int i = 0; i < f.count; i++) {
            const em__st_tensor *t = &f.tensors[i];
            if (t->begin > t->end || f.data_start + t->end > size) FUZZ_FAIL("tensor outside the file");
            fuzz_touch(data + f.data_start + t->begin, t->end - t->begin);
            fuzz_touch(t->name, strlen(t->name));
            if (i && t->begin < f.tensors[i - 1].begin) FUZZ_FAIL("tensors not sorted by offset");
            if (t->begin != end) FUZZ_FAIL("a gap or an overlap between tensors");
            end = t->end;
            if (!em__utf8_valid(t->name, strlen(t->name), NULL)) FUZZ_FAIL("a name that is not UTF-8");
        }
        if (f.data_start + end != size) FUZZ_FAIL("data after the last tensor");
        for (int i = 0; i < f.meta_count; i++) {
            fuzz_touch(f.meta_values[i], strlen(f.meta_values[i]));
            if (!em__utf8_valid(f.meta_keys[i], strlen(f.meta_keys[i]), NULL) ||
                !em__utf8_valid(f.meta_values[i], strlen(f.meta_values[i]), NULL))
                FUZZ_FAIL("metadata that is not UTF-8");
        }
    }
    em__st_file_free(&f);
    fuzz_check_status(s, "fuzz.safetensors");
}

#endif
