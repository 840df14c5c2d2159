/* `ember mem`: the CPU allocator's measured peak over real training steps, printed next to an
 * estimate in one format for every model (--model mlp, cnn, gpt). */
#ifndef EMBER_TOOL_MEM_MEASURED_H
#define EMBER_TOOL_MEM_MEASURED_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>
#include <ember/estimate.h>

/* "  measured peak  X MB  the CPU allocator's peak over <what> ...: the estimate is +N% of it",
 * or a line saying the steps failed when peak is NAN. */
void mem_print_measured(double estimate, double peak, const char *what);

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
