/* `ember train --amp bf16|f16` and `ember mem --amp`: mixed precision for the tools (the
 * logic lives in train_amp.c; cmd_train.c and cmd_mem.c only parse the option and call in). */
#ifndef EMBER_TOOL_TRAIN_AMP_H
#define EMBER_TOOL_TRAIN_AMP_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

typedef struct train_amp {
    bool on;
    em_dtype dtype;            /* EM_BF16 or EM_F16 */
    em_grad_scaler *scaler;    /* f16 only (bf16 has float32's range) */
    int64_t skipped_before;    /* skipped steps before the current epoch */
} train_amp;

/* "bf16"/"bfloat16" or "f16"/"fp16"/"float16" (opt names the option in messages); prints why
 * not and returns false otherwise. */
bool train_amp_parse(const char *tool, const char *opt, const char *v, em_dtype *out);
/* Starts mixed precision in dtype (the scaler for f16); a.on stays false without --amp. */
bool train_amp_start(train_amp *a, bool on, em_dtype dtype);
void train_amp_free(train_amp *a);
/* The loss of model on (x, y), computed under an autocast region for device when on. */
em_tensor *train_amp_loss(const train_amp *a, em_device device, em_module *model, em_tensor *x, em_tensor *y);
/* backward and the optimizer step, through the scaler when there is one. */
em_status train_amp_step(const train_amp *a, em_optimizer *opt, em_tensor *loss);
/* Region for evaluation in the same precision (a failed-begin handle when off). */
em_autocast train_amp_begin(const train_amp *a, em_device device);
/* "amp bfloat16: no loss scaling" or "amp float16: scale 32768, 3 skipped steps (1 this epoch)";
 * reading the scale waits for the device once. */
void train_amp_epoch_line(train_amp *a, char *buf, size_t size);

#endif
