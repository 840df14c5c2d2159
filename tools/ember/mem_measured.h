/* `ember mem`: the CPU allocator's measured peak over real training steps, printed next to an
 * estimate in one format for every model (--model mlp, cnn, gpt). */
#ifndef EMBER_TOOL_MEM_MEASURED_H
#define EMBER_TOOL_MEM_MEASURED_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>
#include <ember/estimate.h>

/* An estimate answers from its formula at once; the steps beside it are measured only when
 * they are small: at most MEM_MEASURE_MAX_BYTES at their estimated peak and
 * MEM_MEASURE_MAX_FLOPS for the two steps (about a second of this machine's CPU). A larger
 * model is "not measured", as building and training it could take the machine's memory
 * and minutes. */
#define MEM_MEASURE_MAX_MB 256
#define MEM_MEASURE_MAX_GFLOP 30
#define MEM_MEASURE_MAX_BYTES (MEM_MEASURE_MAX_MB * 1e6)
#define MEM_MEASURE_MAX_FLOPS (MEM_MEASURE_MAX_GFLOP * 1e9)
/* Whether two steps of `bytes` at their peak and `flops` floating-point operations in all
 * are measured; when not, why_not (size bytes) says why. */
bool mem_measure_fits(double bytes, double flops, char *why_not, size_t size);

/* "  measured peak  X MB  the CPU allocator's peak over <what> ...: the estimate is +N% of it",
 * or when peak is NAN "not measured: " why_not (not NULL), or a line saying the steps failed. */
void mem_print_measured(double estimate, double peak, const char *what, const char *why_not);

/* The floating-point operations of one training step of ember train's classifier `model`
 * ("mlp" or "cnn") on batch samples: forward, and backward at twice the forward's. */
double mem_classifier_step_flops(const char *model, int64_t batch);

/* ember train's classifier `model` ("mlp" or "cnn", model_new) trained as ember train does:
 * optimizer, LoRA of lora_rank on every Linear (0: none; the rest frozen) and
 * --checkpoint-activations (train_ckpt_wrap's segments). */
typedef struct mem_classifier {
    const char *model;
    em_estimate_optimizer optimizer;
    int lora_rank;
    bool ckpt;
} mem_classifier;
/* The peak (em_memory_max_allocated, reset first) above what was allocated before the model
 * was built, over two steps (forward, cross-entropy, zero_grad, backward, step; the second
 * has the optimizer's states) on a random batch of rows of 784 values and labels 0-9. NAN
 * on failure (the error is cleared). */
double mem_measure_classifier(const mem_classifier *c, int64_t batch);

/* ember mem --model mlp: o's params, dtype and shape from the MLP (em_estimate_module with
 * o's mode, optimizer, batch and LoRA rank); with ckpt, train_ckpt_wrap's segments (see
 * mem_classifier_ckpt_why). e (may be NULL) receives the estimate. false with an error. */
bool classifier_estimate(const char *model, em_estimate_opts *o, bool ckpt, em_estimate *e);
/* How --checkpoint-activations splits ember train's model and what it keeps, in words. */
const char *mem_classifier_ckpt_why(const char *model);

#endif
