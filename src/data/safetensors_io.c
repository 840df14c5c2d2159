/* safetensors at the tensor level: save a named list of tensors (any device) atomically,
 * and load a file into an object that owns one tensor per name. */
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "../core/internal_api.h"
#include "../util/utf8.h"

struct em_safetensors {
    int count;
    char **names;           /* file order (by data offset) */
    em_tensor **tensors;    /* owned references */
    em__st_file header;     /* keeps the metadata */
    char *path;             /* the path it was read from, for messages */
};

typedef struct named { const char *name; em_tensor *t; } named;

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* Records an error naming the bad byte unless text is valid UTF-8. */
static bool utf8_text(const char *op, const char *what, int i, const char *text) {
    size_t bad;
    if (em__utf8_valid(text, strlen(text), &bad)) return true;
    em_error(EM_ERR_ARGUMENT, "%s: %s %d is not valid UTF-8 (byte 0x%02x at offset %zu): safetensors names and "
             "metadata are UTF-8 text", op, what, i, (unsigned char)text[bad], bad);
    return false;
}

em_status em_safetensors_save(const char *path, const char *const *names,
                              em_tensor *const *tensors, int n) {
    return em_safetensors_save_meta(path, names, tensors, n, NULL, NULL, 0);
}

em_status em_safetensors_save_meta(const char *path, const char *const *names, em_tensor *const *tensors,
                                   int n, const char *const *keys, const char *const *values, int nmeta) {
    const char *op = "em_safetensors_save";
    if (nmeta < 0 || (nmeta > 0 && (!keys || !values)))
        return em_error(EM_ERR_ARGUMENT, "%s: expected nmeta >= 0 keys and values, got nmeta = %d", op, nmeta);
    for (int i = 0; i < nmeta; i++)
        if (!keys[i] || !values[i]) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: metadata entry %d is NULL", op, i);
    /* the header is UTF-8 JSON: Python's safetensors refuses a file with any other byte in it */
    for (int i = 0; i < nmeta; i++)
        if (!utf8_text(op, "metadata key", i, keys[i]) || !utf8_text(op, "metadata value", i, values[i]))
            return EM_ERR_ARGUMENT;
    if (!path) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: argument 'path' is NULL", op);
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return em_error(EM_ERR_ARGUMENT, "%s: expected n >= 0 names and tensors, got n = %d%s", op, n,
                        n > 0 ? " with a NULL array" : "");
    for (int i = 0; i < n; i++) {
        if (!tensors[i])
            return em_failed() ? em_last_status()
                               : em_error(EM_ERR_ARGUMENT, "%s: tensor %d ('%s') is NULL", op, i, names[i] ? names[i] : "?");
        if (!names[i]) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: name %d is NULL", op, i);
        if (strcmp(names[i], "__metadata__") == 0)
            return em_error(EM_ERR_ARGUMENT, "%s: '__metadata__' is reserved and cannot name a tensor", op);
        if (!utf8_text(op, "tensor name", i, names[i])) return EM_ERR_ARGUMENT;
    }
    named *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    em_dtype *dts = malloc((size_t)(n ? n : 1) * sizeof *dts);
    em_shape *shapes = malloc((size_t)(n ? n : 1) * sizeof *shapes);
    const char **sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    em_status s = EM_OK;
    char *hdr = NULL;
    if (!order || !dts || !shapes || !sorted) {
        s = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        goto done;
    }
    for (int i = 0; i < n; i++) order[i] = (named){names[i], tensors[i]};
    qsort(order, (size_t)n, sizeof *order, cmp_named);
    for (int i = 0; i < n; i++) {
        if (i && strcmp(order[i - 1].name, order[i].name) == 0) {
            s = em_error(EM_ERR_ARGUMENT, "%s: the name '%s' is given twice", op, order[i].name);
            goto done;
        }
        sorted[i] = order[i].name;
        dts[i] = em_dtype_of(order[i].t);
        shapes[i] = em_shape_of(order[i].t);
    }
    size_t hl;
    hdr = em__st_header_meta(n, sorted, dts, shapes, nmeta, keys, values, &hl);
    if (!hdr) {
        s = em_last_status();
        goto done;
    }
    em__atomic_file f;
    s = em__atomic_open(&f, path);
    if (s == EM_OK) s = em__atomic_write(&f, hdr, hl);
    for (int i = 0; i < n && s == EM_OK; i++) {
        void *data;
        size_t nbytes;
        s = em__host_bytes(order[i].t, &data, &nbytes, op);
        if (s == EM_OK) s = em__atomic_write(&f, data, nbytes);
        free(data);
    }
    if (s == EM_OK) s = em__atomic_commit(&f);
    em__atomic_abort(&f);
done:
    free(hdr);
    free(order);
    free(dts);
    free(shapes);
    free(sorted);
    return s;
}

/* Tensor t of the file: read straight into a new CPU tensor (its values checked), then moved
 * to device. Scoped, like an op's result. */
static em_tensor *read_tensor(em__file_in *in, const em__st_file *h, const em__st_tensor *t, em_device device) {
    em_shape shape = {.ndim = t->ndim};
    memcpy(shape.d, t->shape, sizeof t->shape);
    em_tensor *cpu = em_empty(shape, EM_OPTS(.dtype = t->dtype));
    size_t n = (size_t)(t->end - t->begin);
    uint8_t *p = cpu && n ? em_data_ptr(cpu) : NULL;
    if (!cpu || (n && !p)) return NULL;
    uint64_t at = h->data_start + t->begin;
    if (n && (em__file_in_read(in, at, p, n) != EM_OK || em__st_check_values(in->path, t, p, at) != EM_OK))
        return NULL;
    return device.type == EM_CPU ? cpu : em_to(cpu, device);
}

em_safetensors *em_safetensors_load(const char *path, em_device device) {
    if (!path) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_safetensors_load: argument 'path' is NULL");
        return NULL;
    }
    /* read, never mapped: a file truncated by someone else during the load is an error, not
     * SIGBUS (see parsers.h); each tensor goes straight into its memory */
    em__file_in in;
    if (em__file_in_open(path, &in, em__safetensors_size) != EM_OK) return NULL;
    em_safetensors *st = calloc(1, sizeof *st);
    uint8_t *head = NULL;
    uint8_t first[8];
    uint64_t hl = 0;
    if (!st) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_safetensors_load: out of host memory");
        goto fail;
    }
    size_t path_len = strlen(path) + 1;
    if (!(st->path = malloc(path_len))) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_safetensors_load: out of host memory");
        goto fail;
    }
    memcpy(st->path, path, path_len);
    size_t n0 = in.size < 8 ? (size_t)in.size : 8;
    if (em__file_in_read(&in, 0, first, n0) != EM_OK ||
        em__safetensors_header_length(path, first, n0, in.size, &hl) != EM_OK)
        goto fail;
    if (!(head = malloc(8 + (size_t)hl))) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_safetensors_load: out of host memory for the %llu-byte header",
                 (unsigned long long)hl);
        goto fail;
    }
    memcpy(head, first, 8);
    if (em__file_in_read(&in, 8, head + 8, (size_t)hl) != EM_OK ||
        em__safetensors_parse_header(path, head, 8 + (size_t)hl, in.size, &st->header) != EM_OK)
        goto fail;
    int n = st->header.count;
    st->names = calloc((size_t)n + 1, sizeof *st->names);
    st->tensors = calloc((size_t)n + 1, sizeof *st->tensors);
    if (!st->names || !st->tensors) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_safetensors_load: out of host memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        const em__st_tensor *h = &st->header.tensors[i];
        EM__UNSCOPED(st->tensors[i], read_tensor(&in, &st->header, h, device));
        if (!st->tensors[i]) goto fail;
        st->names[i] = h->name;  /* owned by the header */
        st->count++;
    }
    free(head);
    em__file_in_close(&in);
    return st;
fail:
    free(head);
    em__file_in_close(&in);
    em_safetensors_free(st);
    return NULL;
}

int em_safetensors_count(const em_safetensors *st) { return st ? st->count : 0; }

const char *em_safetensors_path(const em_safetensors *st) { return st ? st->path : NULL; }

const char *em_safetensors_name(const em_safetensors *st, int i) {
    if (!st || i < 0 || i >= st->count) return NULL;
    return st->names[i];
}

em_tensor *em_safetensors_get(const em_safetensors *st, const char *name) {
    if (!st || !name) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_safetensors_get: argument '%s' is NULL", st ? "name" : "st");
        return NULL;
    }
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->names[i], name) == 0) return em__scoped(em_retain(st->tensors[i]));
    em_error(EM_ERR_ARGUMENT, "em_safetensors_get: no tensor named '%s' in the file (%d tensors%s%s%s)", name,
             st->count, st->count ? ", e.g. '" : "", st->count ? st->names[0] : "", st->count ? "'" : "");
    return NULL;
}

const char *em_safetensors_metadata(const em_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->header.meta_count; i++)
        if (strcmp(st->header.meta_keys[i], key) == 0) return st->header.meta_values[i];
    return NULL;
}

void em_safetensors_free(em_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->count; i++) em_release(st->tensors[i]);
    free(st->tensors);
    free(st->names);
    em__st_file_free(&st->header);
    free(st->path);
    free(st);
}
