/* Helpers for the core tests: build tensors from literals, read them back as doubles. */
#ifndef EMBER_TEST_CORE_UTIL_H
#define EMBER_TEST_CORE_UTIL_H

#include <stdlib.h>
#include "test.h"
#include "util/errors.h"
#include "core/tensor_impl.h"

/* A float32 / int64 CPU tensor from a literal array. */
#define TF32(shape, ...) em_from_data((const float[]){__VA_ARGS__}, EM_F32, (shape), (em_opts){0})
#define TI64(shape, ...) em_from_data((const int64_t[]){__VA_ARGS__}, EM_I64, (shape), EM_OPTS(.dtype = EM_I64))

/* Element i (row-major) of t as a double; NaN if reading failed. */
static inline double tval(const em_tensor *t, int64_t i) {
    int64_t n = em_numel(t);
    if (!t || i < 0 || i >= n) return NAN;
    size_t es = em_dtype_size(em_dtype_of(t));
    unsigned char *buf = malloc((size_t)n * es);
    if (!buf || em_copy_to_host(t, buf, (size_t)n * es) != EM_OK) {
        free(buf);
        return NAN;
    }
    double v;
    switch (em_dtype_of(t)) {
    case EM_F32: v = ((float *)buf)[i]; break;
    case EM_F64: v = ((double *)buf)[i]; break;
    case EM_F16: v = em_f16_to_f32(((uint16_t *)buf)[i]); break;
    case EM_BF16: v = em_bf16_to_f32(((uint16_t *)buf)[i]); break;
    case EM_I64: v = (double)((int64_t *)buf)[i]; break;
    case EM_I32: v = ((int32_t *)buf)[i]; break;
    default: v = buf[i]; break;
    }
    free(buf);
    return v;
}

/* True when t has exactly n elements equal (within tol) to expect, row-major. */
static inline bool tvals(const em_tensor *t, int n, const double *expect, double tol) {
    if (!t || em_numel(t) != n) {
        fprintf(stderr, "    tvals: tensor %p has %lld elements, expected %d\n", (void *)t,
                t ? (long long)em_numel(t) : -1LL, n);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < n; i++) {
        double v = tval(t, i);
        bool same = (isnan(v) && isnan(expect[i])) || v == expect[i] || fabs(v - expect[i]) <= tol;
        if (!same) {
            fprintf(stderr, "    element %d is %.9g, expected %.9g\n", i, v, expect[i]);
            ok = false;
        }
    }
    return ok;
}
#define CHECK_VALUES(t, tol, ...)                                                     \
    CHECK(tvals((t), (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)),        \
                (const double[]){__VA_ARGS__}, (tol)))

static inline bool tshape(const em_tensor *t, em_shape s) {
    if (!t || em_ndim(t) != s.ndim) return false;
    for (int i = 0; i < s.ndim; i++)
        if (em_size(t, i) != s.d[i]) return false;
    return true;
}
#define CHECK_SHAPE(t, ...) CHECK(tshape((t), EM_SHAPE(__VA_ARGS__)))
#define CHECK_SHAPE0(t) CHECK(tshape((t), EM_SHAPE0))

#endif
