/* Memory estimates for a model from its parameter count: inference, full fine-tuning and
 * LoRA (what `ember mem` prints). Bytes are plain numbers; GB in the text means 1e9 bytes.
 *
 * Conventions. Inference holds the weights. Full fine-tuning also holds a gradient per
 * parameter and the optimizer's states (SGD none, SGD with momentum one, Adam/AdamW two).
 * Without master weights everything stays in the weights' dtype: 7B in float16 is 14 GB of
 * weights + 14 GB of gradients + 28 GB of Adam states = 56 GB (the "weights 14 GB +
 * optimizer states 42 GB" count). With master weights (mixed precision) the optimizer updates
 * a float32 copy and keeps its states in float32: 2 + 2 + 4 + 8 = 16 bytes per parameter,
 * 112 GB for 7B, the same total as torch.cuda.amp's float32 weights, gradients and Adam.
 * LoRA freezes the base weights and trains rank-r adapters (float32) on `lora_targets`
 * hidden x hidden matrices per layer. Activations need a batch and a sequence length. */
#ifndef EMBER_ESTIMATE_H
#define EMBER_ESTIMATE_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/error.h>
#include <ember/dtype.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum em_estimate_mode { EM_ESTIMATE_INFERENCE, EM_ESTIMATE_FULL, EM_ESTIMATE_LORA } em_estimate_mode;

typedef enum em_estimate_optimizer {
    EM_ESTIMATE_SGD,            /* no state */
    EM_ESTIMATE_SGD_MOMENTUM,   /* one momentum buffer per parameter */
    EM_ESTIMATE_ADAM,           /* exp_avg and exp_avg_sq */
    EM_ESTIMATE_ADAMW
} em_estimate_optimizer;

typedef struct em_estimate_opts {
    double params;                       /* total parameter count, > 0 */
    em_dtype dtype;                      /* weights: EM_F32 (zeroed), EM_F16 or EM_BF16 */
    em_estimate_mode mode;
    em_estimate_optimizer optimizer;
    bool master_weights;                 /* float32 master weights and optimizer states */
    int lora_rank;                       /* 0 means 8 */
    int lora_targets;                    /* adapted hidden x hidden matrices per layer; 0 means 2 (q, v) */
    int64_t hidden, layers;              /* the model's shape; 0: inferred as a transformer */
    int64_t batch, seq;                  /* activations for this batch (0: not counted) */
    double activation_bytes_per_sample;  /* > 0: use this instead of the transformer formula */
} em_estimate_opts;

/* The lines of an estimate, in print order. */
typedef enum em_estimate_line {
    EM_ESTIMATE_WEIGHTS, EM_ESTIMATE_GRADIENTS, EM_ESTIMATE_OPTIMIZER_STATES,
    EM_ESTIMATE_MASTER_WEIGHTS, EM_ESTIMATE_ACTIVATIONS, EM_ESTIMATE_TOTAL, EM_ESTIMATE_LINES
} em_estimate_line;

typedef struct em_estimate {
    double bytes[EM_ESTIMATE_LINES];
    char why[EM_ESTIMATE_LINES][256];    /* one line each: how the number was counted */
    double trainable_params;
    int64_t hidden, layers;              /* the shape used (given or inferred) */
    bool shape_inferred;
} em_estimate;

/* Estimate memory for o. EM_ERR_ARGUMENT / EM_ERR_DTYPE with a clear message on bad input. */
em_status em_estimate_memory(const em_estimate_opts *o, em_estimate *out);
/* Parse a parameter count: "7B", "125M", "350k", "1.3e9", "1.5T" (K/M/B or G/T = 1e3/1e6/1e9/1e12). */
em_status em_estimate_parse_params(const char *s, double *out);
/* "sgd", "sgd-momentum", "adam", "adamw". */
em_status em_estimate_parse_optimizer(const char *s, em_estimate_optimizer *out);
const char *em_estimate_optimizer_name(em_estimate_optimizer o);
/* "inference", "full", "lora". */
const char *em_estimate_mode_name(em_estimate_mode m);
/* "weights", "gradients", "optimizer states", "master weights", "activations", "total". */
const char *em_estimate_line_name(em_estimate_line l);

#ifdef __cplusplus
}
#endif
#endif
