/* Mixed precision for `ember train --amp` and `ember mem --amp`: the forward pass under an
 * autocast region (matmul and Linear in the low dtype, the loss in float32), float32 master
 * weights and optimizer, and for f16 a gradient scaler whose skips and scale updates stay on
 * the device (include/ember/amp.h). */
#include "train_amp.h"

#include <inttypes.h>
#include <stdio.h>
#include <strings.h>

bool train_amp_parse(const char *tool, const char *opt, const char *v, em_dtype *out) {
    if (v && (!strcasecmp(v, "bf16") || !strcasecmp(v, "bfloat16"))) {
        *out = EM_BF16;
        return true;
    }
    if (v && (!strcasecmp(v, "f16") || !strcasecmp(v, "fp16") || !strcasecmp(v, "float16") || !strcasecmp(v, "half"))) {
        *out = EM_F16;
        return true;
    }
    fprintf(stderr, "%s: %s expects bf16 or f16, got '%s'\n", tool, opt, v ? v : "");
    return false;
}

bool train_amp_start(train_amp *a, bool on, em_dtype dtype) {
    *a = (train_amp){.on = on, .dtype = dtype};
    if (!on || dtype != EM_F16) return true;
    a->scaler = em_grad_scaler_new(em_grad_scaler_defaults());
    return a->scaler != NULL;
}

void train_amp_free(train_amp *a) {
    em_grad_scaler_free(a->scaler);
    a->scaler = NULL;
}

em_autocast train_amp_begin(const train_amp *a, em_device device) {
    if (!a->on) return (em_autocast){.depth = -1};   /* its end does nothing */
    return em_autocast_begin(device.type, a->dtype);
}

em_tensor *train_amp_loss(const train_amp *a, em_device device, em_module *model, em_tensor *x, em_tensor *y) {
    em_autocast ac = train_amp_begin(a, device);
    em_tensor *loss = em_cross_entropy(em_forward(model, x), y, 0.0);
    if (em_autocast_end(ac) != EM_OK) return NULL;
    return loss;
}

em_status train_amp_step(const train_amp *a, em_optimizer *opt, em_tensor *loss) {
    if (!a->scaler) {
        em_status st = em_backward(loss);
        return st == EM_OK ? em_step(opt) : st;
    }
    em_status st = em_backward(em_grad_scaler_scale(a->scaler, loss));
    if (st == EM_OK) st = em_grad_scaler_step(a->scaler, opt);
    if (st == EM_OK) st = em_grad_scaler_update(a->scaler);
    return st;
}

void train_amp_epoch_line(train_amp *a, char *buf, size_t size) {
    const char *name = em_dtype_name(a->dtype);
    if (!a->on) {
        snprintf(buf, size, "float32");
    } else if (!a->scaler) {
        snprintf(buf, size, "amp %s: no loss scaling (bfloat16 has float32's range)", name);
    } else {
        int64_t skipped = em_grad_scaler_skipped_steps(a->scaler);
        snprintf(buf, size, "amp %s: loss scale %g, %" PRId64 " skipped steps (%" PRId64 " this epoch)", name,
                 em_grad_scaler_get_scale(a->scaler), skipped, skipped - a->skipped_before);
        a->skipped_before = skipped;
    }
}
