/* Runs the fuzz targets' checks (fuzz/fuzz_common.h) over every file of the seed corpus
 * (fuzz/corpus/<parser>/) and over deterministic mutations of each: every prefix, and
 * every byte set to 0x00, 0xFF, '9', '"', '[', a flipped bit and +1. So the normal build
 * (and its ASan run in CI) checks the parsers without libFuzzer. */
#include <dirent.h>
#include <stdlib.h>

#include "test.h"
#include "test_data_util.h"

static int fuzz_failures;
static const char *fuzz_current;
#define FUZZ_FAIL(what)                                                                   \
    do {                                                                                  \
        if (fuzz_failures++ < 10) fprintf(stderr, "  %s: %s\n", fuzz_current, (what));    \
    } while (0)
#include "../fuzz/fuzz_common.h"

typedef void (*fuzz_fn)(const uint8_t *, size_t);

/* Run fn on an exact-size heap copy, so a read past the end is caught under ASan. */
static void run_copy(fuzz_fn fn, const uint8_t *data, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, data, n);
    fn(c, n);
    free(c);
}

static long run_mutations(fuzz_fn fn, const uint8_t *data, size_t len) {
    long runs = 0;
    run_copy(fn, data, len), runs++;
    for (size_t n = 0; n < len; n++) run_copy(fn, data, n), runs++;
    uint8_t *m = malloc(len ? len : 1);
    static const int subst[] = {0x00, 0xFF, '9', '"', '['};
    for (size_t i = 0; i < len; i++) {
        for (size_t k = 0; k < sizeof subst / sizeof subst[0] + 2; k++) {
            memcpy(m, data, len);
            if (k < sizeof subst / sizeof subst[0]) m[i] = (uint8_t)subst[k];
            else if (k == sizeof subst / sizeof subst[0]) m[i] ^= (uint8_t)(1u << (i % 8));
            else m[i] = (uint8_t)(m[i] + 1);
            fn(m, len);
            runs++;
        }
    }
    free(m);
    return runs;
}

static void run_dir(const char *kind, fuzz_fn fn) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../../fuzz/corpus/%s", test_data_dir(), kind);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "  cannot open the seed corpus %s\n", dir);
        return;
    }
    int files = 0;
    long runs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        uint8_t *buf = test_read_file(path, &len);
        if (!buf) continue;
        fuzz_current = e->d_name;
        runs += run_mutations(fn, buf, len);
        free(buf);
        files++;
    }
    closedir(d);
    printf("  %s: %d corpus files, %ld parses\n", kind, files, runs);
    CHECK(files >= 3);
    CHECK(fuzz_failures == 0);
    fuzz_failures = 0;
}

static void test_corpus_idx(void) { run_dir("idx", fuzz_idx_one); }
static void test_corpus_npy(void) { run_dir("npy", fuzz_npy_one); }
static void test_corpus_csv(void) { run_dir("csv", fuzz_csv_one); }
static void test_corpus_safetensors(void) { run_dir("safetensors", fuzz_safetensors_one); }

int main(void) {
    RUN(test_corpus_idx);
    RUN(test_corpus_npy);
    RUN(test_corpus_csv);
    RUN(test_corpus_safetensors);
    return test_summary();
}
