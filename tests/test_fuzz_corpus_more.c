/* The checks of the newer fuzz targets (fuzz/fuzz_more.h: idx's gzip path, checkpoints,
 * JSON, device strings, EMBER_MEMORY_CAP; fuzz/fuzz_views.h: chains of view ops;
 * fuzz/fuzz_tokenizer.h: tokenizer.json and text to encode) over their seed corpora
 * (fuzz/corpus/<target>/) and deterministic mutations of each file: every prefix, and bytes
 * set to 0x00, 0xFF, '9', '"', ':', a flipped bit and +1 (every byte; every `stride`-th for
 * the slow checkpoint loads). So the normal suite and its ASan run check these readers
 * without libFuzzer. */
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
#include "../fuzz/fuzz_more.h"
#include "../fuzz/fuzz_views.h"
#include "../fuzz/fuzz_tokenizer.h"

typedef void (*fuzz_fn)(const uint8_t *, size_t);

/* fn on an exact-size heap copy: a read past the end is caught under ASan */
static void run_copy(fuzz_fn fn, const uint8_t *data, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, data, n);
    fn(c, n);
    free(c);
}

static long run_mutations(fuzz_fn fn, const uint8_t *data, size_t len, size_t stride) {
    static const int subst[] = {0x00, 0xFF, '9', '"', ':'};
    enum { NSUB = sizeof subst / sizeof subst[0] };
    long runs = 0;
    run_copy(fn, data, len), runs++;
    for (size_t n = 0; n < len; n += stride) run_copy(fn, data, n), runs++;
    uint8_t *m = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i += stride) {
        for (int k = 0; k < NSUB + 2; k++) {
            memcpy(m, data, len);
            if (k < NSUB) m[i] = (uint8_t)subst[k];
            else if (k == NSUB) m[i] ^= (uint8_t)(1u << (i % 8));
            else m[i] = (uint8_t)(m[i] + 1);
            run_copy(fn, m, len);
            runs++;
        }
    }
    free(m);
    return runs;
}

static void run_dir(const char *kind, fuzz_fn fn, size_t stride) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../../fuzz/corpus/%s", test_data_dir(), kind);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    int files = 0;
    long runs = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        uint8_t *buf = test_read_file(path, &len);
        if (!buf) continue;
        fuzz_current = e->d_name;
        runs += run_mutations(fn, buf, len, stride);
        free(buf);
        files++;
    }
    closedir(d);
    printf("  %s: %d corpus files, %ld runs\n", kind, files, runs);
    CHECK(files >= 3);
    CHECK(fuzz_failures == 0);
    fuzz_failures = 0;
}

static void test_corpus_idx_gz(void) { run_dir("idx_gz", fuzz_idx_gz_one, 1); }
static void test_corpus_json(void) { run_dir("json", fuzz_json_one, 1); }
static void test_corpus_device(void) { run_dir("device", fuzz_device_one, 1); }
static void test_corpus_memcap(void) { run_dir("memcap", fuzz_memcap_one, 1); }
static void test_corpus_checkpoint(void) { run_dir("checkpoint", fuzz_checkpoint_one, 5); }
static void test_corpus_views(void) { run_dir("views", fuzz_views_one, 1); }
static void test_corpus_tokenizer_json(void) { run_dir("tokenizer_json", fuzz_tokenizer_json_one, 3); }
static void test_corpus_tokenizer_encode(void) { run_dir("tokenizer_encode", fuzz_tokenizer_encode_one, 1); }

int main(void) {
    RUN(test_corpus_idx_gz);
    RUN(test_corpus_json);
    RUN(test_corpus_device);
    RUN(test_corpus_memcap);
    RUN(test_corpus_checkpoint);
    RUN(test_corpus_views);
    RUN(test_corpus_tokenizer_json);
    RUN(test_corpus_tokenizer_encode);
    return test_summary();
}
