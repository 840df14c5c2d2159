/* Datasets: x [N, ...] float32 and y [N] int64 (or float [N, ...]) on the CPU, from tensors, IDX, .npy, CSV
 * and Fashion-MNIST. */
#include <stdio.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_internal.h"
#include "dataset.h"
#include "../core/internal_api.h"

/* Takes over x (float32, CPU, contiguous) and y (int64 [N], or NULL). */
static em_dataset *wrap(em_tensor *x, em_tensor *y) {
    em_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        em_release(x);
        em_release(y);
        em_error(EM_ERR_OUT_OF_MEMORY, "dataset: out of host memory");
        return NULL;
    }
    ds->x = x;
    ds->y = y;
    ds->n = em_size(x, 0);
    return ds;
}

static em_dataset *check_and_wrap(em_tensor *x, em_tensor *y, const char *what) {
    if (!x) {
        em_release(x);
        em_release(y);
        return NULL;
    }
    if (em_ndim(x) < 1) {
        em_error(EM_ERR_SHAPE, "%s: features must have a sample dimension, got a 0-d tensor", what);
    } else if (y && !em_dtype_is_floating(em_dtype_of(y)) && em_ndim(y) != 1) {
        em_error(EM_ERR_SHAPE, "%s: labels must be 1-d [N], got %d dimensions", what, em_ndim(y));
    } else if (y && em_ndim(y) < 1) {
        em_error(EM_ERR_SHAPE, "%s: targets must have a sample dimension [N, ...], got a 0-d tensor", what);
    } else if (y && em_size(y, 0) != em_size(x, 0)) {
        em_error(EM_ERR_SHAPE, "%s: %lld samples but %lld labels", what, (long long)em_size(x, 0),
                 (long long)em_size(y, 0));
    } else {
        return wrap(x, y);
    }
    em_release(x);
    em_release(y);
    return NULL;
}

/* A contiguous CPU copy (or t itself) in dtype dt: an unscoped reference. */
static em_tensor *to_cpu(em_tensor *t, em_dtype dt) {
    em_tensor *r;
    EM__UNSCOPED(r, em_contiguous(em_to_device_dtype(t, EM_DEVICE_CPU, dt, false)));
    return r;
}

em_dataset *em_dataset_new(em_tensor *x, em_tensor *y) {
    if (!x) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_dataset_new: argument 'x' is NULL");
        return NULL;
    }
    /* float targets (regression) keep float64, other floats become float32; the rest int64 */
    em_dtype ydt = EM_I64;
    if (y && em_dtype_is_floating(em_dtype_of(y))) ydt = em_dtype_of(y) == EM_F64 ? EM_F64 : EM_F32;
    em_tensor *cx = to_cpu(x, EM_F32);
    em_tensor *cy = y ? to_cpu(y, ydt) : NULL;
    return check_and_wrap(cx, cy, "em_dataset_new");
}

/* float32 features (x * scale) from any parsed array: an unscoped reference. */
static em_tensor *features(const em__array *a, double scale) {
    em__array f = *a;
    f.dtype = EM_F32;
    f.data = NULL;
    f.nbytes = 0;
    f.owned = false;
    em_tensor *t = em__array_to_tensor(&f, EM_DEVICE_CPU);  /* no data: uninitialised, filled below */
    if (!t || a->numel == 0) return t;
    float *dst = em_data_ptr(t);
    if (!dst) {
        em_release(t);
        return NULL;
    }
    const unsigned char *src = a->data;
    for (int64_t i = 0; i < a->numel; i++) {
        double v;
        switch (a->dtype) {
        case EM_U8: v = src[i]; break;
        case EM_BOOL: v = src[i] != 0; break;
        case EM_I32: { int32_t x; memcpy(&x, src + 4 * i, 4); v = x; break; }
        case EM_I64: { int64_t x; memcpy(&x, src + 8 * i, 8); v = (double)x; break; }
        case EM_F32: { float x; memcpy(&x, src + 4 * i, 4); v = x; break; }
        case EM_F64: { memcpy(&v, src + 8 * i, 8); break; }
        case EM_F16: { uint16_t h; memcpy(&h, src + 2 * i, 2); v = em_f16_to_f32(h); break; }
        case EM_BF16: { uint16_t h; memcpy(&h, src + 2 * i, 2); v = em_bf16_to_f32(h); break; }
        default: v = 0; break;
        }
        dst[i] = (float)(v * scale);
    }
    return t;
}

/* int64 labels from an integer array: an unscoped reference. */
static em_tensor *labels_of(const em__array *a, const char *path) {
    if (em_dtype_is_floating(a->dtype)) {
        em_error(EM_ERR_DTYPE, "%s: labels must be integers, the file holds %s", path, em_dtype_name(a->dtype));
        return NULL;
    }
    if (a->ndim != 1) {
        em_error(EM_ERR_SHAPE, "%s: labels must be 1-d, the file holds %d dimensions", path, a->ndim);
        return NULL;
    }
    em__array l = {.dtype = EM_I64, .ndim = 1, .shape = {a->shape[0]}};
    em_tensor *t = em__array_to_tensor(&l, EM_DEVICE_CPU);
    if (!t || a->numel == 0) return t;
    int64_t *dst = em_data_ptr(t);
    if (!dst) {
        em_release(t);
        return NULL;
    }
    const unsigned char *src = a->data;
    for (int64_t i = 0; i < a->numel; i++) {
        switch (a->dtype) {
        case EM_I32: { int32_t x; memcpy(&x, src + 4 * i, 4); dst[i] = x; break; }
        case EM_I64: memcpy(&dst[i], src + 8 * i, 8); break;
        default: dst[i] = src[i]; break;  /* u8, bool */
        }
    }
    return t;
}

typedef em_status (*parse_fn)(const char *name, const void *buf, size_t len, em__array *out);

/* Parse a file and convert it: features (scale) or labels. Unscoped reference. */
static em_tensor *load_part(const char *path, parse_fn parse, bool is_labels, double scale) {
    em__file_map m;
    if (em__file_map_open_sized(path, &m, parse == em__idx_parse ? em__idx_size : NULL) != EM_OK) return NULL;
    em__array a;
    em_tensor *t = NULL;
    if (parse(path, m.data, m.len, &a) == EM_OK) t = is_labels ? labels_of(&a, path) : features(&a, scale);
    em__array_free(&a);
    em__file_map_close(&m);
    return t;
}

static em_dataset *load_pair(const char *xp, const char *yp, parse_fn parse, double scale, const char *op) {
    if (!xp) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "%s: the features path is NULL", op);
        return NULL;
    }
    em_tensor *x = load_part(xp, parse, false, scale);
    if (x && parse == em__idx_parse && em_ndim(x) == 3) {
        /* IDX's images (count, rows, columns) as torchvision gives them: one channel,
         * [N, 1, H, W], ready for a Conv2d */
        em_tensor *images;
        EM__UNSCOPED(images, em_unsqueeze(x, 1));
        em_release(x);
        x = images;
    }
    em_tensor *y = x && yp ? load_part(yp, parse, true, 1.0) : NULL;
    if (yp && !y) {
        em_release(x);
        return NULL;
    }
    char what[600];
    snprintf(what, sizeof what, "%s('%s', '%s')", op, xp, yp ? yp : "");
    return check_and_wrap(x, y, what);
}

em_dataset *em_dataset_idx(const char *images, const char *labels, double scale) {
    if (!labels) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_dataset_idx: argument 'labels' is NULL");
        return NULL;
    }
    return load_pair(images, labels, em__idx_parse, scale, "em_dataset_idx");
}

em_dataset *em_dataset_npy(const char *x_path, const char *y_path, double scale) {
    return load_pair(x_path, y_path, em__npy_parse, scale, "em_dataset_npy");
}

em_dataset *em_dataset_csv(const char *path, em_csv_opts opts, double scale) {
    if (!path) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_dataset_csv: argument 'path' is NULL");
        return NULL;
    }
    em__file_map m;
    if (em__file_map_open(path, &m) != EM_OK) return NULL;
    em__array x, y;
    em_tensor *tx = NULL, *ty = NULL;
    bool ok = em__csv_parse(path, m.data, m.len, &opts, &x, &y) == EM_OK;
    if (ok) {
        tx = features(&x, scale);
        if (tx && y.data) ty = em__array_to_tensor(&y, EM_DEVICE_CPU);
        em__array_free(&x);
        em__array_free(&y);
    }
    em__file_map_close(&m);
    if (ok && y.ndim && !ty) {
        em_release(tx);
        return NULL;
    }
    return check_and_wrap(tx, ty, path);
}

/* dir/name(.gz), or dir/fashion-mnist/name(.gz) when dir is a general data directory. */
static bool find_file(const char *dir, const char *name, char *out, size_t cap, char *tried, size_t tcap) {
    const char *forms[4] = {"%s/%s.gz", "%s/%s", "%s/fashion-mnist/%s.gz", "%s/fashion-mnist/%s"};
    for (int k = 0; k < 4; k++) {
        snprintf(out, cap, forms[k], dir, name);
        if (access(out, R_OK) == 0) return true;
        size_t tl = strlen(tried);
        snprintf(tried + tl, tcap - tl, "%s%s", tl ? ", " : "", out);
    }
    return false;
}

em_dataset *em_dataset_fashion_mnist(const char *dir, bool train) {
    const char *env = getenv("EMBER_DATA_DIR");
    if (!dir) dir = env && *env ? env : EM_FASHION_MNIST_DIR;
    const char *img = train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte";
    const char *lbl = train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte";
    /* the longest name tried is dir + "/fashion-mnist/" + a 23-byte name + ".gz" */
    if (strlen(dir) + 48 >= PATH_MAX) {
        em_error(EM_ERR_ARGUMENT, "Fashion-MNIST directory '%.80s...' is %zu bytes long: paths are limited to %d "
                 "bytes (PATH_MAX)", dir, strlen(dir), PATH_MAX);
        return NULL;
    }
    char ip[PATH_MAX], lp[PATH_MAX], tried[4096] = "";
    if (!find_file(dir, img, ip, sizeof ip, tried, sizeof tried) ||
        !find_file(dir, lbl, lp, sizeof lp, tried, sizeof tried)) {
        em_error(EM_ERR_IO,
                 "Fashion-MNIST (%s split) not found in %s: tried %s. Install the Debian package "
                 "dataset-fashion-mnist (scripts/setup.sh does) or set EMBER_DATA_DIR to a directory holding the IDX files",
                 train ? "train" : "test", dir, tried);
        return NULL;
    }
    em_dataset *ds = em_dataset_idx(ip, lp, 1.0 / 255.0);
    /* em_dataset_idx gave the images (count, rows, columns) a channel: [N, 1, rows, columns] */
    if (ds && (em_ndim(ds->x) != 4 || em_size(ds->x, 2) != 28 || em_size(ds->x, 3) != 28)) {
        if (em_ndim(ds->x) == 4)
            em_error(EM_ERR_FORMAT, "%s: expected 28x28 Fashion-MNIST images, found %lldx%lld", ip,
                     (long long)em_size(ds->x, 2), (long long)em_size(ds->x, 3));
        else
            em_error(EM_ERR_FORMAT, "%s: expected 28x28 Fashion-MNIST images (3 dimensions: count, rows, columns), "
                     "found %d dimension%s", ip, em_ndim(ds->x) > 2 ? em_ndim(ds->x) - 1 : em_ndim(ds->x),
                     em_ndim(ds->x) == 1 ? "" : "s");
        em_dataset_free(ds);
        return NULL;
    }
    /* the classes are 0 to 9: a label outside them is found now, naming where, not by the
     * loss in the batch that holds it (or by the evaluation after a whole epoch) */
    int64_t n = ds ? em_numel(ds->y) : 0;
    const int64_t *label = ds && n ? em_data_ptr(ds->y) : NULL;
    for (int64_t i = 0; label && i < n; i++)
        if (label[i] < 0 || label[i] > 9) {
            em_error(EM_ERR_FORMAT, "%s: the label of sample %lld is %lld: Fashion-MNIST's classes are 0 to 9", lp,
                     (long long)i, (long long)label[i]);
            em_dataset_free(ds);
            return NULL;
        }
    if (ds && n && !label) {
        em_dataset_free(ds);
        return NULL;
    }
    return ds;
}

em_status em_dataset_normalize(em_dataset *ds, double mean, double std) {
    if (!ds) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_dataset_normalize: argument 'ds' is NULL");
    if (!isfinite(mean) || !isfinite(std) || std == 0)
        return em_error(EM_ERR_ARGUMENT, "em_dataset_normalize: expected a finite mean and a finite, non-zero std, "
                        "got mean %g, std %g", mean, std);
    int64_t n = em_numel(ds->x);
    if (n == 0) return EM_OK;
    float *p = em_data_ptr(ds->x);
    if (!p) return em_last_status();
    for (int64_t i = 0; i < n; i++) p[i] = (float)((p[i] - mean) / std);
    return EM_OK;
}

int64_t em_dataset_len(const em_dataset *ds) { return ds ? ds->n : 0; }

em_tensor *em_dataset_x(const em_dataset *ds) {
    EM_CHECK_ARG(ds, "em_dataset_x", "ds");
    return em__scoped(em_retain(ds->x));
}

em_tensor *em_dataset_y(const em_dataset *ds) {
    EM_CHECK_ARG(ds, "em_dataset_y", "ds");
    return ds->y ? em__scoped(em_retain(ds->y)) : NULL;
}

void em_dataset_free(em_dataset *ds) {
    if (!ds) return;
    em_release(ds->x);
    em_release(ds->y);
    free(ds);
}
