/* torch.nn.utils.clip_grad_norm_ (2-norm over all gradients, one host read). */
#include <math.h>
#include <stdlib.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include <ember/optim.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"

/* g's sum of squares as a float32 0-d tensor (a reference of the caller's own), a slice of
 * SQUARES_SLICE elements at a time: g * g whole would be one more gradient-sized buffer at
 * the step's peak, where every gradient exists (a 32000 x 1024 float32 embedding's is
 * 125 MiB). */
#define SQUARES_SLICE ((int64_t)1 << 18)
static em_tensor *sum_of_squares(em_tensor *g) {
    int64_t n = em_numel(g);
    bool sliced = n > SQUARES_SLICE && em_is_contiguous(g);
    em_tensor *total = NULL; /* kept */
    for (int64_t at = 0; at < n || at == 0; at += SQUARES_SLICE) {
        em_scope s = em_scope_begin();
        int64_t len = n - at < SQUARES_SLICE ? n - at : SQUARES_SLICE;
        em_tensor *piece = sliced ? em_narrow(em_view(g, EM_SHAPE(n)), 0, at, len) : g;
        em_tensor *part = em_to_dtype(em_sum(em_mul(piece, piece), EM_ALL_DIMS, false), EM_F32);
        em_tensor *next = part && total ? em_add(total, part) : part;
        if (next) em_keep(next);
        em_scope_end(s);
        em_release(total);
        total = next;
        if (!total || !sliced) break;
    }
    return total;
}

double em_clip_grad_norm(em_module *m, double max_norm) {
    if (!m) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_clip_grad_norm: module is NULL");
        return NAN;
    }
    int n = em_module_parameters(m, NULL, 0);
    em_named_tensor *ps = calloc((size_t)n + 1, sizeof *ps);
    if (!ps) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_clip_grad_norm: out of host memory");
        return NAN;
    }
    em_module_parameters(m, ps, n);
    em_grad_mode mode = em_no_grad_begin();
    em_scope s = em_scope_begin();
    /* Sum of squares per gradient, accumulated as one f32 tensor on the first grad's device.
     * Each gradient's squares are freed before the next are made: held to the end, they
     * would cost as much memory as every gradient once more. */
    em_tensor *total = NULL; /* kept: ours to release */
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        em_tensor *g = em_grad(ps[i].tensor);
        if (!g) continue;
        em_tensor *sq = sum_of_squares(g); /* kept */
        if (!total) {
            total = sq;
        } else {
            em_scope one = em_scope_begin();
            em_tensor *next = sq ? em_add(total, em_to(sq, em_device_of(total))) : NULL;
            if (next) em_keep(next);
            em_scope_end(one);
            em_release(sq);
            em_release(total);
            total = next;
        }
        ok = total != NULL;
    }
    double norm = 0.0;
    if (ok && total) {
        norm = sqrt(em_item(total));
        double coef = max_norm / (norm + 1e-6);
        for (int i = 0; i < n && ok && coef < 1.0; i++) {
            em_tensor *g = em_grad(ps[i].tensor);
            if (g) ok = em_mul_scalar_(g, coef) == EM_OK;
        }
    }
    em_scope_end(s);
    em_release(total);
    em_no_grad_end(mode);
    free(ps);
    return ok ? norm : NAN;
}
