/* `ember train --checkpoint-activations`: the training forward goes through
 * em_checkpoint_sequential, so the activations inside each segment but the last are
 * recomputed in backward instead of kept (nn.h, "activation checkpointing").
 * (`--accumulate N`, the other memory remedy, lives in train_amp.c's train_amp_batch, where
 * it combines with --amp and --devices.) */
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
