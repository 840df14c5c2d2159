/* Tensor-level loaders and writers for IDX, .npy and CSV (include/ember/io.h), on top of
 * the memory parsers. Loaders return scoped CPU tensors; writers copy any tensor to the
 * host and write atomically. */
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "../core/internal_api.h"

static em_tensor *array_to_tensor_scoped(const em__array *a, em_device device) {
    em_shape shape = {.ndim = a->ndim};
    for (int i = 0; i < a->ndim; i++) shape.d[i] = a->shape[i];
    em_tensor *t = em_empty(shape, (em_opts){.dtype = a->dtype});
    if (!t) return NULL;
    if (a->nbytes) {
        void *p = em_data_ptr(t);
        if (!p) return NULL;  /* t belongs to the private scope around this call */
        memcpy(p, a->data, a->nbytes);
    }
    return device.type == EM_CPU ? t : em_to(t, device);
}

em_tensor *em__array_to_tensor(const em__array *a, em_device device) {
    em_tensor *t;
    EM__UNSCOPED(t, array_to_tensor_scoped(a, device));
    return t;
}

typedef em_status (*parse_fn)(const char *name, const void *buf, size_t len, em__array *out);

static em_tensor *load_with(const char *path, parse_fn parse, const char *op) {
    if (!path) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: argument 'path' is NULL", op);
        return NULL;
    }
    em__file_map m;
    if (em__file_map_open(path, &m) != EM_OK) return NULL;
    em__array a;
    em_tensor *t = NULL;
    if (parse(path, m.data, m.len, &a) == EM_OK) t = em__array_to_tensor(&a, EM_DEVICE_CPU);
    em__array_free(&a);
    em__file_map_close(&m);
    return em__scoped(t);
}

em_tensor *em_load_idx(const char *path) { return load_with(path, em__idx_parse, "em_load_idx"); }
em_tensor *em_load_npy(const char *path) { return load_with(path, em__npy_parse, "em_load_npy"); }

em_status em__host_bytes(em_tensor *t, void **out, size_t *nbytes, const char *op) {
    *out = NULL;
    *nbytes = em_nbytes(t);
    void *buf = malloc(*nbytes ? *nbytes : 1);
    if (!buf) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu bytes", op, *nbytes);
    em_status s = em_copy_to_host(t, buf, *nbytes);
    if (s != EM_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return EM_OK;
}

em_status em_save_npy(const char *path, em_tensor *t) {
    if (!t) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_save_npy: argument 't' is NULL");
    if (!path) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_save_npy: argument 'path' is NULL");
    em_shape shape = em_shape_of(t);
    char hdr[1024];
    size_t hl = em__npy_header(em_dtype_of(t), shape.ndim, shape.d, hdr, sizeof hdr);
    if (hl == 0) return em_last_status();
    void *data;
    size_t nbytes;
    em_status s = em__host_bytes(t, &data, &nbytes, "em_save_npy");
    if (s != EM_OK) return s;
    em__atomic_file f;
    s = em__atomic_open(&f, path);
    if (s == EM_OK) s = em__atomic_write(&f, hdr, hl);
    if (s == EM_OK) s = em__atomic_write(&f, data, nbytes);
    if (s == EM_OK) s = em__atomic_commit(&f);
    em__atomic_abort(&f);
    free(data);
    return s;
}

em_tensor *em_load_csv(const char *path, em_csv_opts opts, em_tensor **labels) {
    if (labels) *labels = NULL;
    if (!path) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_load_csv: argument 'path' is NULL");
        return NULL;
    }
    em__file_map m;
    if (em__file_map_open(path, &m) != EM_OK) return NULL;
    em__array x, y;
    em_tensor *tx = NULL, *ty = NULL;
    if (em__csv_parse(path, m.data, m.len, &opts, &x, labels ? &y : NULL) == EM_OK) {
        tx = em__array_to_tensor(&x, EM_DEVICE_CPU);
        if (tx && labels && y.data) {
            ty = em__array_to_tensor(&y, EM_DEVICE_CPU);
            if (!ty) {
                em_release(tx);
                tx = NULL;
            }
        }
        em__array_free(&x);
        if (labels) em__array_free(&y);
    }
    em__file_map_close(&m);
    if (labels) *labels = em__scoped(ty);
    return em__scoped(tx);
}
