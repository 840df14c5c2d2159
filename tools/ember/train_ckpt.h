/* `ember train --checkpoint-activations`: the logic lives in
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

#endif
