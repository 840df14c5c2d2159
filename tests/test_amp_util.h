/* Shared by the mixed-precision tests: scripts/golden_amp.py's archive (EMTD records, the
 * format of scripts/golden_training.py) and element access. */
#ifndef EMBER_TEST_AMP_UTIL_H
#define EMBER_TEST_AMP_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include "test.h"

#define AMP_MAX_RECORDS 96

typedef struct amp_record {
    char name[64];
    em_tensor *t;
} amp_record;

typedef struct amp_archive {
    amp_record r[AMP_MAX_RECORDS];
    int n;
} amp_archive;

static inline bool amp_load(amp_archive *a) {
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/golden_amp.bin", dir ? dir : "tests/data");
    FILE *f = fopen(path, "rb");
    a->n = 0;
    if (!f) {
        fprintf(stderr, "  cannot open %s\n", path);
        return false;
    }
    char magic[4];
    uint32_t version, count;
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "EMTD", 4) && fread(&version, 4, 1, f) == 1 &&
              version == 1 && fread(&count, 4, 1, f) == 1 && count <= AMP_MAX_RECORDS;
    for (uint32_t i = 0; ok && i < count; i++) {
        amp_record *r = &a->r[a->n];
        uint32_t len, dt, ndim;
        ok = fread(&len, 4, 1, f) == 1 && len < sizeof r->name && fread(r->name, 1, len, f) == len;
        if (!ok) break;
        r->name[len] = '\0';
        em_shape shape = {0};
        ok = fread(&dt, 4, 1, f) == 1 && fread(&ndim, 4, 1, f) == 1 && ndim <= EM_MAX_DIMS && dt < EM_DTYPE_COUNT &&
             fread(shape.d, 8, ndim, f) == ndim;
        if (!ok) break;
        shape.ndim = (int)ndim;
        int64_t numel = 1;
        for (uint32_t k = 0; k < ndim; k++) numel *= shape.d[k];
        size_t bytes = (size_t)numel * em_dtype_size((em_dtype)dt);
        void *buf = malloc(bytes ? bytes : 1);
        ok = buf && fread(buf, 1, bytes, f) == bytes;
        if (ok) {
            em_scope s = em_scope_begin();
            r->t = em_keep(em_from_data(buf, (em_dtype)dt, shape, EM_OPTS(.dtype = (em_dtype)dt)));
            em_scope_end(s);
            ok = r->t != NULL;
            a->n += ok;
        }
        free(buf);
    }
    fclose(f);
    if (!ok) fprintf(stderr, "  %s: corrupt or truncated\n", path);
    return ok;
}

static inline em_tensor *amp_get(const amp_archive *a, const char *name) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->r[i].name, name)) return a->r[i].t;
    fprintf(stderr, "  missing record %s\n", name);
    return NULL;
}

static inline void amp_unload(amp_archive *a) {
    for (int i = 0; i < a->n; i++) em_release(a->r[i].t);
    a->n = 0;
}

/* Element i of t (any device and dtype) as a double, row-major; NaN on failure. */
static inline double amp_at(em_tensor *t, int64_t i) {
    if (!t) return NAN;
    em_scope s = em_scope_begin();
    double v = em_item(em_select(em_reshape(em_cpu(t), EM_SHAPE(-1)), 0, i));
    em_scope_end(s);
    return v;
}

/* max |a - b| / (atol + rtol |b|) over the elements (<= 1 passes); a large value when the
 * shapes differ or a read fails. */
static inline double amp_err(em_tensor *a, em_tensor *b, double atol, double rtol) {
    if (!a || !b || em_numel(a) != em_numel(b)) return 1e30;
    em_scope s = em_scope_begin();
    em_tensor *x = em_to_dtype(em_reshape(em_cpu(a), EM_SHAPE(-1)), EM_F64);
    em_tensor *y = em_to_dtype(em_reshape(em_cpu(b), EM_SHAPE(-1)), EM_F64);
    double *px = em_data_ptr(em_contiguous(x)), *py = em_data_ptr(em_contiguous(y)), worst = 0;
    for (int64_t i = 0; px && py && i < em_numel(a); i++) {
        double e = fabs(px[i] - py[i]) / (atol + rtol * fabs(py[i]));
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    if (!px || !py) worst = 1e30;
    em_scope_end(s);
    return worst;
}

#endif
