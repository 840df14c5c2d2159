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
 * hidden x hidden matrices per layer. Activations need a batch and a sequence length.
 *
 * Workspace (shown when the largest trainable tensor is known, as for an Ember model): none.
 * Ember's optimizers update each parameter with one fused kernel and no temporaries, and a
 * gradient computed by backward becomes .grad without a copy; measured on the CPU allocator,
 * the peak is weights + gradients + states + activations. (The op-by-op fallback for
 * non-contiguous parameters holds up to 6 parameter-sized temporaries for Adam; PoCL's
 * matmul copies Linear's transposed weight, one weight-sized temporary.) */
#ifndef EMBER_ESTIMATE_H
#define EMBER_ESTIMATE_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/dtype.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the memory is for: running the model, full fine-tuning, or LoRA fine-tuning. */
typedef enum em_estimate_mode { EM_ESTIMATE_INFERENCE, EM_ESTIMATE_FULL, EM_ESTIMATE_LORA } em_estimate_mode;

/* The optimizer whose states fine-tuning keeps. */
typedef enum em_estimate_optimizer {
    EM_ESTIMATE_SGD,            /* no state */
    EM_ESTIMATE_SGD_MOMENTUM,   /* one momentum buffer per parameter */
    EM_ESTIMATE_ADAM,           /* exp_avg and exp_avg_sq */
    EM_ESTIMATE_ADAMW
} em_estimate_optimizer;

/* What to estimate: the model, the mode, the optimizer, and optionally a batch. */
typedef struct em_estimate_opts {
    double params;                       /* total parameter count, > 0 */
    em_dtype dtype;                      /* weights: EM_F32 (zeroed), EM_F16 or EM_BF16 */
    em_estimate_mode mode;               /* inference, full or LoRA fine-tuning */
    em_estimate_optimizer optimizer;     /* fine-tuning's optimizer */
    bool master_weights;                 /* float32 master weights and optimizer states */
    int lora_rank;                       /* 0 means 8 */
    int lora_targets;                    /* adapted hidden x hidden matrices per layer; 0 means 2 (q, v) */
    int64_t hidden, layers;              /* the model's shape; 0: inferred as a transformer */
    int64_t batch, seq;                  /* activations for this batch (0: not counted) */
    double activation_bytes_per_sample;  /* > 0: use this instead of the transformer formula */
    double input_bytes_per_sample;       /* > 0: the input batch, held through the step (with a batch) */
    double largest_param;                /* elements of the largest trainable tensor; 0: no workspace line */
    double lora_params;                  /* > 0: LoRA's adapter parameter count instead of the formula */
    /* ---- mixed precision (include/ember/amp.h) ----
     * EM_F16 / EM_BF16: training under an autocast region of that dtype (float32 weights):
     * activations are counted in it, plus the weights' casts that backward keeps; EM_F32
     * (zeroed): no autocast, activations in the weights' dtype. */
    em_dtype autocast_dtype;
} em_estimate_opts;

/* The lines of an estimate, in print order. */
typedef enum em_estimate_line {
    EM_ESTIMATE_WEIGHTS, EM_ESTIMATE_GRADIENTS, EM_ESTIMATE_OPTIMIZER_STATES,
    EM_ESTIMATE_MASTER_WEIGHTS, EM_ESTIMATE_ACTIVATIONS, EM_ESTIMATE_WORKSPACE, EM_ESTIMATE_TOTAL,
    EM_ESTIMATE_LINES
} em_estimate_line;

/* An estimate: bytes per line (weights, gradients, ...) and how each was counted. */
typedef struct em_estimate {
    double bytes[EM_ESTIMATE_LINES];     /* bytes of each em_estimate_line */
    char why[EM_ESTIMATE_LINES][256];    /* one line each: how the number was counted */
    double params, trainable_params;     /* params: the count used (given, or the model's) */
    em_dtype dtype;                      /* the weights' dtype used */
    int64_t hidden, layers;              /* the shape used (given or inferred) */
    bool shape_inferred;                 /* hidden and layers were assumed for a transformer */
} em_estimate;

/* Estimate memory for o. EM_ERR_ARGUMENT / EM_ERR_DTYPE with a clear message on bad input. */
EM_API em_status em_estimate_memory(const em_estimate_opts *o, em_estimate *out);

/* ---- estimates for an Ember model ----
 * The parameter count, dtype (every parameter must share one of f32/f16/bf16) and the largest
 * tensor come from the model; o gives the rest (its params, dtype, hidden, layers,
 * input_bytes_per_sample, largest_param and lora_params are ignored). The shape reported is
 * hidden = the widest Linear, layers = the number of Linear layers.
 * With o->batch > 0 (and no activation_bytes_per_sample) activations are counted per sample
 * from the Linear layers' widths, in the parameters' dtype, for training:
 *   the input (in_features of the first Linear; held by the caller through the step), then
 *   what autograd keeps for backward: each Linear's output (an elementwise activation after it
 *   keeps its own output instead and the Linear's is freed: ReLU, Sigmoid, Tanh), GELU one
 *   more (it saves its input), Dropout two more (output and mask), cross-entropy's
 *   log-softmax of the last layer's output, and, while backward passes the widest Linear, the
 *   gradients of its output and of its activation (2 x the widest output; the input needs none).
 * Not counted: integer targets, the loss's small temporaries, the forward's transient second
 * copy of a layer's output (matmul result before the bias is added; freed by the next layer),
 * allocator rounding (512 B per block). Measured against the CPU and OpenCL allocators on
 * ReLU MLPs (tests/test_estimate_measured.c) the total is within 5% of the peak of two Adam
 * steps from batch 1 to 8192. For inference: the input plus the widest output twice (matmul
 * result and bias sum). LoRA counts rank x (in + out) adapter parameters per Linear and
 * one more widest output (an adapted layer's base output lives next to the sum).
 * A module kind it does not know (a custom forward) counts as one output of the current
 * width, and the explanation says so. EM_ERR_ARGUMENT for a model without parameters. */
typedef struct em_module em_module; /* include/ember/nn.h */
EM_API em_status em_estimate_module(em_module *m, const em_estimate_opts *o, em_estimate *out); /* m's estimate, as above */
/* The same from a checkpoint written by em_module_save (loaded whole on the CPU): Linear
 * layers are the 2-D "NAME.weight" tensors in numeric name order ("2.weight" before
 * "10.weight"); an elementwise activation like ReLU is assumed between consecutive Linears
 * (the file holds no layers without parameters). */
EM_API em_status em_estimate_checkpoint(const char *path, const em_estimate_opts *o, em_estimate *out);
typedef struct em_safetensors em_safetensors; /* a loaded safetensors file: include/ember/io.h */
/* The same from a file already loaded with em_safetensors_load (several estimates from one
 * read of the file). */
EM_API em_status em_estimate_safetensors(const em_safetensors *file, const em_estimate_opts *o, em_estimate *out);
/* Parse a parameter count: "7B", "125M", "350k", "1.3e9", "1.5T" (K/M/B or G/T = 1e3/1e6/1e9/1e12). */
EM_API em_status em_estimate_parse_params(const char *s, double *out);
/* "sgd", "sgd-momentum", "adam", "adamw". */
EM_API em_status em_estimate_parse_optimizer(const char *s, em_estimate_optimizer *out);
EM_API const char *em_estimate_optimizer_name(em_estimate_optimizer o); /* the names the parser takes */
/* "inference", "full", "lora". */
EM_API const char *em_estimate_mode_name(em_estimate_mode m);
/* "weights", "gradients", "optimizer states", "master weights", "activations", "workspace", "total". */
EM_API const char *em_estimate_line_name(em_estimate_line l);

#ifdef __cplusplus
}
#endif
#endif
