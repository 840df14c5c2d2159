/* Embedding: rows of a weight table picked by integer indices (index_select, whose gradient
 * is an index_add of the output's gradient), with padding_idx's row getting no gradient. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "module_impl.h"

static void shape_text(char *buf, size_t size, em_shape s) {
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

em_tensor *em_embedding(em_tensor *input, em_tensor *weight, int64_t padding_idx) {
    const char *fn = "embedding";
    if (!input || !weight) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, input ? "weight" : "input");
        return NULL;
    }
    em_dtype it = em_dtype_of(input);
    em_shape is = em_shape_of(input), ws = em_shape_of(weight);
    char a[160], b[160];
    if (it != EM_I64 && it != EM_I32) {
        em_error(EM_ERR_DTYPE, "%s: expected an int64 or int32 input of indices, got %s", fn, em_dtype_name(it));
        return NULL;
    }
    if (ws.ndim != 2) {
        shape_text(b, sizeof b, ws);
        em_error(EM_ERR_SHAPE, "%s: weight must be 2-D [num_embeddings, embedding_dim], got %s", fn, b);
        return NULL;
    }
    if (is.ndim >= EM_MAX_DIMS) {
        shape_text(a, sizeof a, is);
        em_error(EM_ERR_SHAPE, "%s: input %s has too many dims (at most %d)", fn, a, EM_MAX_DIMS - 1);
        return NULL;
    }
    int64_t rows = ws.d[0];
    if (padding_idx != EM_NO_PADDING_IDX) {
        if (padding_idx < -rows || padding_idx >= rows) {
            em_error(EM_ERR_ARGUMENT, "%s: padding_idx %lld must be within num_embeddings (%lld)", fn,
                     (long long)padding_idx, (long long)rows);
            return NULL;
        }
        if (padding_idx < 0) padding_idx += rows;
    }
    em_scope s = em_scope_begin();
    unsigned long seq = em__error_seq();
    /* one clear message naming the layer and both shapes; an input marked in range (ids a
     * caller wrote and checked itself, e.g. generation's tokens) is not read back, so that a
     * graph can record the lookup */
    if (em_numel(input) > 0 && !em__index_known_in_range(input, rows)) {
        double lo = em_item(em_min(input, EM_ALL_DIMS, false)), hi = em_item(em_max(input, EM_ALL_DIMS, false));
        if (em__error_seq() == seq && (lo < 0 || hi >= (double)rows)) {
            shape_text(a, sizeof a, is);
            shape_text(b, sizeof b, ws);
            em_error(EM_ERR_ARGUMENT, "%s: index %lld is out of range for %lld embeddings (input %s, weight %s): "
                     "indices must be in [0, %lld)", fn, (long long)(lo < 0 ? lo : hi), (long long)rows, a, b,
                     (long long)rows);
        }
    }
    em_tensor *w = weight;
    if (padding_idx != EM_NO_PADDING_IDX && em_requires_grad(weight)) {
        /* the padding row is read from a detached copy: same values, no gradient */
        em_tensor *row = em_eq(em_arange(0, (double)rows, 1, EM_OPTS(.dtype = EM_I64, .device = em_device_of(weight))),
                               em_scalar((double)padding_idx, EM_OPTS(.dtype = EM_I64, .device = em_device_of(weight))));
        w = em_where(em_unsqueeze(row, 1), em_detach(weight), weight);
    }
    em_shape out = is;
    out.d[out.ndim++] = ws.d[1];
    em_tensor *y = em__error_seq() != seq ? NULL : em_reshape(em_index_select(w, 0, em_reshape(input, EM_SHAPE(-1))), out);
    return em__scope_return(s, y);
}

typedef struct emb_ctx { int64_t num, dim, padding_idx; } emb_ctx;

static em_tensor *emb_forward(em_module *m, em_tensor *x) {
    return em_embedding(x, m->params[0].t, ((emb_ctx *)m->ctx)->padding_idx);
}

static void emb_describe(const em_module *m, char *buf, size_t size) {
    const emb_ctx *c = m->ctx;
    int n = snprintf(buf, size, "%lld, %lld", (long long)c->num, (long long)c->dim);
    if (c->padding_idx != EM_NO_PADDING_IDX && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ", padding_idx=%lld", (long long)c->padding_idx);
}

static const em_module_ops emb_ops = {.name = "Embedding", .forward = emb_forward, .describe = emb_describe,
                                      .free_ctx = free};

em_module *em_nn_embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx) {
    const char *fn = "em_nn_embedding";
    if (num_embeddings <= 0 || embedding_dim <= 0) {
        em_error(EM_ERR_ARGUMENT, "%s: num_embeddings and embedding_dim must be > 0, got %lld and %lld",
                                   fn, (long long)num_embeddings, (long long)embedding_dim);
        return NULL;
    }
    if (padding_idx != EM_NO_PADDING_IDX) {
        if (padding_idx < -num_embeddings || padding_idx >= num_embeddings) {
            em_error(EM_ERR_ARGUMENT, "%s: Padding_idx %lld must be within num_embeddings (%lld)", fn,
                                       (long long)padding_idx, (long long)num_embeddings);
            return NULL;
        }
        if (padding_idx < 0) padding_idx += num_embeddings;
    }
    emb_ctx *c = malloc(sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        return NULL;
    }
    *c = (emb_ctx){num_embeddings, embedding_dim, padding_idx};
    em_module *m = em_module_new(&emb_ops, c);
    if (!m) return NULL;
    em_scope s = em_scope_begin();
    em_tensor *w = em_randn(EM_SHAPE(num_embeddings, embedding_dim), (em_opts){0}); /* normal(0, 1), as PyTorch */
    if (w && padding_idx != EM_NO_PADDING_IDX) em_zero_(em_select(w, 0, padding_idx));
    em_status st = em_module_add_parameter(m, "weight", w);
    em_scope_end(s);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}
