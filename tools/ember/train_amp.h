/* `ember train --amp bf16|f16` and `ember mem --amp`: mixed precision for the tools (the
 * logic lives in train_amp.c; cmd_train.c and cmd_mem.c only read the option and call in). */
#ifndef EMBER_TOOL_TRAIN_AMP_H
#define EMBER_TOOL_TRAIN_AMP_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>
#include "options.h"

typedef struct train_amp {
    bool on;
    em_dtype dtype;            /* EM_BF16 or EM_F16 */
    em_grad_scaler *scaler;    /* f16 only (bf16 has float32's range) */
    int64_t skipped_before;    /* skipped steps before the current epoch */
} train_amp;

/* The checkpoint's metadata for the scaler: TRAIN_AMP_META (key, value) pairs at most. */
#define TRAIN_AMP_META 7
typedef struct train_amp_meta {
    const char *keys[TRAIN_AMP_META];
    char vals[TRAIN_AMP_META][40];
    int n;
} train_amp_meta;

/* --amp's words (options.h): "bf16"/"bfloat16" (EM_BF16) or "f16"/"fp16"/"float16"/"half"
 * (EM_F16), without regard to case; the choice's id is the em_dtype. */
extern const opt_choice train_amp_choices[];
/* --loss-scale X, in range as parsed: false (after saying why) when float32 rounds it to 0. */
bool train_amp_check_scale(const char *tool, const char *opt, const char *text, double scale);
/* Starts mixed precision in dtype (the scaler for f16, from init_scale when > 0, else
 * PyTorch's 65536); a.on stays false without --amp. */
bool train_amp_start(train_amp *a, bool on, em_dtype dtype, double init_scale);
void train_amp_free(train_amp *a);
/* Region for evaluation in the same precision (a failed-begin handle when off). */
em_autocast train_amp_begin(const train_amp *a, em_device device);
/* "amp bfloat16: no loss scaling" or "amp float16: scale 32768, 3 skipped steps (1 this epoch)";
 * reading the scale waits for the device once. */
void train_amp_epoch_line(train_amp *a, char *buf, size_t size);

/* One training batch, every combination of --amp, --devices and --accumulate n: zero the
 * gradients at the start of a group, the forward (over dp's replicas when dp is not NULL)
 * under autocast regions for each device type it runs on, the cross-entropy, backward of
 * loss / n (scaled by the f16 scaler); after the n-th micro-batch of a group the step
 * (train_amp_flush). Returns the batch's loss (scoped) or NULL on error. *micro counts the
 * micro-batches since the last step. */
em_tensor *train_amp_batch(const train_amp *a, em_device device, em_module *model, em_dp *dp, em_optimizer *opt,
                           em_tensor *x, em_tensor *y, int64_t accumulate, int64_t *micro);
/* The step on the group so far (none when *micro is 0): through the scaler (unscale, inf
 * check, step, update) or em_step, then em_dp_sync so that every replica takes the model's
 * parameters. */
em_status train_amp_flush(const train_amp *a, em_dp *dp, em_optimizer *opt, int64_t *micro);

/* The scaler's state (em_grad_scaler_state_dict) as "amp.scaler.*" metadata for the
 * checkpoint; m->n = 0 without a scaler. An error status (em_last_error says why) if the
 * state cannot be read. */
em_status train_amp_meta_of(const train_amp *a, train_amp_meta *m);
/* --resume: the scaler takes the checkpoint's "amp.scaler.*" state; a checkpoint without it
 * starts from the initial scale and says so; a scaler state without a scaler (no --amp f16)
 * is left, with a note. False after printing why the state cannot be used. */
bool train_amp_resume(const char *tool, train_amp *a, const em_safetensors *meta, const char *path);

#endif
