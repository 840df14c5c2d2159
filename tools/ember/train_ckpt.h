/* `ember train --checkpoint-activations` and `--accumulate N`: the logic lives in
 * train_ckpt.c; cmd_train.c only parses the options and calls in. */
#ifndef EMBER_TOOL_TRAIN_CKPT_H
#define EMBER_TOOL_TRAIN_CKPT_H

#include <ember/ember.h>

/* A module whose forward runs model (a Sequential, borrowed: it must outlive the wrapper)
 * through em_checkpoint_sequential with about sqrt(children) segments, following model's
 * train/eval mode. Only for the training forward: parameters, saving and evaluation stay
 * with model. NULL after printing why (tool names the program). *segments receives the
 * count for the banner. */
em_module *train_ckpt_wrap(const char *tool, em_module *model, int *segments);

/* --accumulate n: one micro-batch's backward of loss / n (gradients add up in .grad); the
 * optimizer steps and zeroes the gradients after every n-th (*micro counts micro-batches
 * since the last step). train_accum_flush steps on what a short last group left. */
em_status train_accum_step(em_optimizer *opt, em_tensor *loss, int64_t n, int64_t *micro);
em_status train_accum_flush(em_optimizer *opt, int64_t *micro);

#endif
