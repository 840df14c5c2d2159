/* The real Fashion-MNIST files (installed by scripts/setup.sh from Debian's
 * dataset-fashion-mnist): shapes, the first labels, the class balance, and every pixel
 * against an independent read of the .gz file with zlib's gzread. A missing file is a
 * failure with a clear message, never a skip. Also the EMBER_DATA_DIR override. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include "test.h"
#include "test_data_util.h"

static char dir[512];

/* The decompressed bytes of a .gz file, read with zlib's own gz* API. */
static unsigned char *gunzip(const char *path, size_t *len) {
    gzFile g = gzopen(path, "rb");
    if (!g) return NULL;
    size_t cap = 1 << 20, n = 0;
    unsigned char *b = malloc(cap);
    for (;;) {
        if (n == cap) b = realloc(b, cap *= 2);
        int r = gzread(g, b + n, (unsigned)(cap - n > (1u << 30) ? (1u << 30) : cap - n));
        if (r <= 0) break;
        n += (size_t)r;
    }
    gzclose(g);
    *len = n;
    return b;
}

static void check_split(bool train) {
    const int64_t n = train ? 60000 : 10000;
    const char *img = train ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz";
    const char *lbl = train ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz";
    char ip[700], lp[700];
    snprintf(ip, sizeof ip, "%s/%s", dir, img);
    snprintf(lp, sizeof lp, "%s/%s", dir, lbl);
    if (access(ip, R_OK) != 0 || access(lp, R_OK) != 0) {
        fprintf(stderr, "  Fashion-MNIST files missing: %s, %s. Run scripts/setup.sh (it installs the Debian "
                        "package dataset-fashion-mnist) or set EMBER_DATA_DIR.\n", ip, lp);
        CHECK(false);
        return;
    }
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_fashion_mnist(dir, train);
    CHECK(ds != NULL);
    if (!ds) {
        em_scope_end(s);
        return;
    }
    em_tensor *x = em_dataset_x(ds), *y = em_dataset_y(ds);
    CHECK(em_dataset_len(ds) == n);
    CHECK(em_dtype_of(x) == EM_F32 && em_ndim(x) == 4 && em_size(x, 0) == n && em_size(x, 1) == 1 && em_size(x, 2) == 28 &&
          em_size(x, 3) == 28); /* [N, C, H, W], as torchvision's */
    CHECK(em_dtype_of(y) == EM_I64 && em_ndim(y) == 1 && em_size(y, 0) == n);
    int64_t *labels = malloc((size_t)n * sizeof *labels);
    float *px = malloc((size_t)n * 784 * sizeof *px);
    CHECK_OK(em_copy_to_host(y, labels, (size_t)n * sizeof *labels));
    CHECK_OK(em_copy_to_host(x, px, (size_t)n * 784 * sizeof *px));
    /* the first labels of each split, as published with the dataset */
    const int64_t first_train[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    const int64_t first_test[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    for (int i = 0; i < 10; i++) CHECK(labels[i] == (train ? first_train : first_test)[i]);
    /* ten balanced classes: 6000 (train) or 1000 (test) of each */
    int64_t count[10] = {0}, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] < 0 || labels[i] > 9) bad++;
        else count[labels[i]]++;
    }
    CHECK(bad == 0);
    for (int c = 0; c < 10; c++) CHECK(count[c] == n / 10);
    /* every pixel equals byte / 255 of an independent gunzip (16-byte IDX header) */
    size_t glen;
    unsigned char *raw = gunzip(ip, &glen);
    CHECK(raw && glen == 16 + (size_t)n * 784);
    if (raw && glen == 16 + (size_t)n * 784) {
        int64_t wrong = 0;
        for (size_t i = 0; i < (size_t)n * 784; i++) wrong += px[i] != (float)(raw[16 + i] * (1.0 / 255.0));
        CHECK(wrong == 0);
    }
    free(raw);
    raw = gunzip(lp, &glen);
    CHECK(raw && glen == 8 + (size_t)n);
    if (raw && glen == 8 + (size_t)n) {
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; i++) wrong += labels[i] != raw[8 + i];
        CHECK(wrong == 0);
    }
    free(raw);
    free(labels);
    free(px);
    em_dataset_free(ds);
    em_scope_end(s);
}

static void test_train_split(void) { check_split(true); }
static void test_test_split(void) { check_split(false); }

/* EMBER_DATA_DIR is used when dir is NULL; a directory without the files is a clear error. */
static void test_data_dir_override(void) {
    char *d = test_tmpdir();
    CHECK(d != NULL);
    if (!d) return;
    char tmpd[512];
    snprintf(tmpd, sizeof tmpd, "%s", d);
    const char *old = getenv("EMBER_DATA_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("EMBER_DATA_DIR", tmpd, 1);
    CHECK(em_dataset_fashion_mnist(NULL, false) == NULL);
    CHECK_ERROR(EM_ERR_IO, "dataset-fashion-mnist");
    /* the tiny test files under the Fashion-MNIST names: found through the variable, and
     * refused because they are not 28x28 */
    char src[1100], dst[1100];
    snprintf(src, sizeof src, "%s", test_data_path("tiny-images-idx3-ubyte.gz"));
    if (src[0] != '/') {
        char cwd[512];
        CHECK(getcwd(cwd, sizeof cwd) != NULL);
        snprintf(src, sizeof src, "%s/%s", cwd, test_data_path("tiny-images-idx3-ubyte.gz"));
    }
    snprintf(dst, sizeof dst, "%s/t10k-images-idx3-ubyte.gz", tmpd);
    CHECK(symlink(src, dst) == 0);
    char lsrc[1100];
    snprintf(lsrc, sizeof lsrc, "%.*s/tiny-labels-idx1-ubyte", (int)(strrchr(src, '/') - src), src);
    snprintf(dst, sizeof dst, "%s/t10k-labels-idx1-ubyte", tmpd);
    CHECK(symlink(lsrc, dst) == 0);
    CHECK(em_dataset_fashion_mnist(NULL, false) == NULL);
    CHECK_ERROR(EM_ERR_FORMAT, "t10k-images-idx3-ubyte.gz: expected 28x28 Fashion-MNIST images");
    if (saved) setenv("EMBER_DATA_DIR", saved, 1);
    else unsetenv("EMBER_DATA_DIR");
    free(saved);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpd);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpd);
}

int main(void) {
    const char *env = getenv("EMBER_DATA_DIR");
    snprintf(dir, sizeof dir, "%s", env && *env ? env : EM_FASHION_MNIST_DIR);
    RUN(test_train_split);
    RUN(test_test_split);
    RUN(test_data_dir_override);
    return test_summary();
}
