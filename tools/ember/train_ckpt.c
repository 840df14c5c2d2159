/* `ember train --checkpoint-activations`: the training forward goes through
 * em_checkpoint_sequential, so the activations inside each segment but the last are
 * recomputed in backward instead of kept (nn.h, "activation checkpointing").
 * `ember train --accumulate N`: gradient accumulation, the other memory remedy that trades
 * steps for batch size: N micro-batches of B give the gradient of one batch of N * B. */
#include <stdio.h>
#include <stdlib.h>
#include "train_ckpt.h"

typedef struct ckpt_wrap {
    em_module *inner;   /* borrowed */
    int segments;
} ckpt_wrap;

static em_tensor *wrap_forward(em_module *m, em_tensor *x) {
    ckpt_wrap *w = em_module_ctx(m);
    /* the wrapper is not the model's parent: carry its mode over (dropout, batch norm) */
    if (em_module_is_training(m) != em_module_is_training(w->inner)) {
        if (em_module_is_training(m)) em_module_train(w->inner);
        else em_module_eval(w->inner);
    }
    return em_checkpoint_sequential(w->inner, w->segments, x);
}

static void wrap_describe(const em_module *m, char *buf, size_t size) {
    snprintf(buf, size, "segments=%d", ((ckpt_wrap *)em_module_ctx(m))->segments);
}

static const em_module_ops wrap_ops = {
    .name = "CheckpointSequential", .forward = wrap_forward, .describe = wrap_describe, .free_ctx = free};

em_module *train_ckpt_wrap(const char *tool, em_module *model, int *segments) {
    if (em_module_kind_of(model) != EM_MODULE_SEQUENTIAL) {
        fprintf(stderr, "%s: --checkpoint-activations needs a Sequential model, got %s\n", tool,
                em_module_name(model));
        return NULL;
    }
    int layers = 0;
    while (em_module_child(model, layers)) layers++;
    /* sqrt(L) segments balance kept segment inputs against one segment's activations; at
     * least 2, since the last segment is never checkpointed */
    int seg = 1;
    while ((seg + 1) * (seg + 1) <= layers) seg++;
    if (seg < 2) seg = 2;
    if (seg > layers) seg = layers;
    ckpt_wrap *w = malloc(sizeof *w);
    if (!w) {
        fprintf(stderr, "%s: out of host memory\n", tool);
        return NULL;
    }
    *w = (ckpt_wrap){model, seg};
    em_module *m = em_module_new(&wrap_ops, w);
    if (!m) {   /* em_module_new freed w */
        fprintf(stderr, "%s: cannot wrap the model for checkpointing: %s\n", tool, em_last_error());
        em_clear_error();
        return NULL;
    }
    *segments = seg;
    return m;
}

/* ---- --accumulate N ---- */

em_status train_accum_step(em_optimizer *opt, em_tensor *loss, int64_t n, int64_t *micro) {
    /* mean over n micro-batches of equal size = the mean loss of their union */
    em_status st = em_backward(em_div_scalar(loss, (double)n));
    if (st != EM_OK) return st;
    if (++*micro < n) return EM_OK;
    return train_accum_flush(opt, micro);
}

em_status train_accum_flush(em_optimizer *opt, int64_t *micro) {
    if (*micro == 0) return EM_OK;
    *micro = 0;
    em_status st = em_step(opt);
    return st == EM_OK ? em_zero_grad(opt) : st;
}
