/* Layout helpers for the GPU op layer: element offsets and dim collapsing (gpu.h). */
#include "gpu.h"

#include <string.h>
#include "../../util/errors.h"

em_status em__gpu_elem_offset(const em_tensor *t, int64_t *out) {
    size_t es = em_dtype_size(t->dtype);
    size_t bo = t->storage->block.offset;
    if (bo % es)
        return em_error(EM_ERR_INTERNAL,
                        "%s: block offset %zu is not a multiple of the %s element size %zu",
                        em_device_str(t->storage->device).s, bo, em_dtype_name(t->dtype), es);
    *out = (int64_t)(bo / es) + t->offset;
    return EM_OK;
}

void em__gpu_collapse(int ndim, const int64_t *shape, int n, const int64_t *const *strides,
                      const int64_t *offs, emk_shape *sh, emk_strides *st) {
    int64_t size[EMK_MAX_DIMS], s[4][EMK_MAX_DIMS], numel = 1;
    int k = 0;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    /* walk from the innermost dim; k-1 is the outermost group collected so far */
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] == 1) continue;
        if (k > 0) {
            bool merge = true;
            for (int i = 0; i < n; i++)
                if (strides[i][d] != s[i][k - 1] * size[k - 1]) merge = false;
            if (merge) {
                size[k - 1] *= shape[d];
                continue;
            }
        }
        size[k] = shape[d];
        for (int i = 0; i < n; i++) s[i][k] = strides[i][d];
        k++;
    }
    if (k == 0) {
        size[0] = 1;
        for (int i = 0; i < n; i++) s[i][0] = 0;
        k = 1;
    }
    memset(sh, 0, sizeof *sh);
    sh->ndim = k;
    sh->numel = numel;
    for (int j = 0; j < k; j++) sh->size[j] = size[k - 1 - j];
    for (int i = 0; i < n; i++) {
        memset(&st[i], 0, sizeof st[i]);
        st[i].offset = offs[i];
        for (int j = 0; j < k; j++) st[i].s[j] = s[i][k - 1 - j];
    }
}

void em__gpu_layout(const em_tensor *t, int64_t off, emk_shape *sh, emk_strides *st) {
    memset(sh, 0, sizeof *sh);
    memset(st, 0, sizeof *st);
    sh->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        sh->size[d] = t->shape[d];
        st->s[d] = t->strides[d];
        sh->numel *= t->shape[d];
    }
    sh->ndim = t->ndim;
    if (t->ndim == 0) {
        sh->ndim = 1;
        sh->size[0] = 1;
    }
    st->offset = off;
}
