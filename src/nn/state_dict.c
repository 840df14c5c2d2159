/* State dicts in safetensors files (through include/ember/io.h): the keys are PyTorch's
 * state_dict keys, so files move between Ember and PyTorch (safetensors.torch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/io.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

/* Parameters then buffers, with their dotted names (names copied: listing twice reuses the
 * module's cache). */
typedef struct entries {
    char **names;
    em_tensor **ts;
    int n;
} entries;

static void entries_free(entries *e) {
    for (int i = 0; i < e->n; i++) free(e->names[i]);
    free(e->names);
    free(e->ts);
}

static bool collect(em_module *m, entries *e) {
    int np = em_module_parameters(m, NULL, 0), nb = em_module_buffers(m, NULL, 0);
    e->n = 0;
    e->names = calloc((size_t)(np + nb) + 1, sizeof *e->names);
    e->ts = calloc((size_t)(np + nb) + 1, sizeof *e->ts);
    em_named_tensor *list = calloc((size_t)(np > nb ? np : nb) + 1, sizeof *list);
    bool ok = e->names && e->ts && list;
    for (int k = 0; k < 2 && ok; k++) {
        int n = k ? em_module_buffers(m, list, nb) : em_module_parameters(m, list, np);
        for (int i = 0; i < n && ok; i++) {
            size_t len = strlen(list[i].name) + 1;
            char *nm = malloc(len);
            ok = nm != NULL;
            if (ok) {
                memcpy(nm, list[i].name, len);
                e->names[e->n] = nm;
                e->ts[e->n++] = list[i].tensor;
            }
        }
    }
    free(list);
    if (!ok) em_error(EM_ERR_OUT_OF_MEMORY, "state dict: out of host memory");
    return ok;
}

em_status em_module_save(em_module *m, const char *path) {
    if (!m || !path)
        return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_module_save: NULL argument");
    entries e = {0};
    em_status st = collect(m, &e) ? em_safetensors_save(path, (const char *const *)e.names, e.ts, e.n)
                                  : em_last_status();
    entries_free(&e);
    return st;
}

static size_t put_shape(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "torch.Size([");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) len += (size_t)snprintf(buf + len, size - len, "])");
    return len;
}

/* Appends to a message buffer, keeping it NUL-terminated. */
static void append(char *buf, size_t size, const char *fmt, const char *a, const char *b) {
    size_t len = strlen(buf);
    if (len < size) snprintf(buf + len, size - len, fmt, a, b);
}

em_status em_module_load(em_module *m, const char *path) {
    if (!m || !path)
        return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_module_load: NULL argument");
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!file) return em_last_status();
    em_status st = em__module_load_file(m, file, path);
    em_safetensors_free(file);
    return st;
}

em_status em_module_load_safetensors(em_module *m, const em_safetensors *file) {
    if (!m || !file)
        return em_failed() ? em_last_status()
                           : em_error(EM_ERR_ARGUMENT, "em_module_load_safetensors: argument '%s' is NULL",
                                      m ? "file" : "m");
    return em__module_load_file(m, file, em_safetensors_path(file));
}

/* A training checkpoint (optim/checkpoint.c) also holds the optimizer's state under
 * "optimizer."; loading the model from it ignores those keys. */
static bool ignored_key(const em_safetensors *file, const char *name) {
    const char *format = em_safetensors_metadata(file, "format");
    return format && !strcmp(format, EM__CHECKPOINT_FORMAT) && !strncmp(name, "optimizer.", 10);
}

em_status em__module_load_file(em_module *m, const em_safetensors *file, const char *path) {
    entries e = {0};
    if (!collect(m, &e)) {
        entries_free(&e);
        return em_last_status();
    }
    em_scope s = em_scope_begin();
    em_tensor **src = calloc((size_t)e.n + 1, sizeof *src);
    char missing[1024] = "", unexpected[1024] = "", sizes[1024] = "";
    em_status st = src ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "em_module_load: out of host memory");
    /* check everything before changing anything, as load_state_dict(strict=True) */
    int count = em_safetensors_count(file);
    for (int i = 0; i < e.n && st == EM_OK; i++) {
        bool present = false;
        for (int k = 0; k < count && !present; k++) present = !strcmp(em_safetensors_name(file, k), e.names[i]);
        if (!present) {
            append(missing, sizeof missing, "%s\"%s\"", *missing ? ", " : "", e.names[i]);
            continue;
        }
        src[i] = em_safetensors_get(file, e.names[i]);
        if (!src[i]) {
            st = em_last_status();
            break;
        }
        em_shape a = em_shape_of(src[i]), b = em_shape_of(e.ts[i]);
        bool same = a.ndim == b.ndim;
        for (int d = 0; same && d < a.ndim; d++) same = a.d[d] == b.d[d];
        if (!same) {
            char sa[160], sb[160], line[400];
            put_shape(sa, sizeof sa, a);
            put_shape(sb, sizeof sb, b);
            snprintf(line, sizeof line, "copying a param with shape %s from checkpoint, the shape in current model is %s.", sa, sb);
            append(sizes, sizeof sizes, "\n\tsize mismatch for %s: %s", e.names[i], line);
        }
    }
    for (int k = 0; k < count && st == EM_OK; k++) {
        const char *name = em_safetensors_name(file, k);
        bool known = ignored_key(file, name);
        for (int i = 0; i < e.n && !known; i++) known = !strcmp(name, e.names[i]);
        if (!known) append(unexpected, sizeof unexpected, "%s\"%s\"", *unexpected ? ", " : "", name);
    }
    if (st == EM_OK && (*missing || *unexpected || *sizes))
        st = em_error(EM_ERR_FORMAT, "Error(s) in loading state_dict for %s from %s:%s%s%s%s%s%s",
                      m->ops->name, path, *missing ? "\n\tMissing key(s) in state_dict: " : "", missing,
                      *unexpected ? "\n\tUnexpected key(s) in state_dict: " : "", unexpected, sizes, "");
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < e.n && st == EM_OK; i++) st = em_copy_(e.ts[i], src[i]);
    em_no_grad_end(g);
    free(src);
    em_scope_end(s);
    entries_free(&e);
    return st;
}
