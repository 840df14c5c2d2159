/* `ember mem`: the CPU allocator's measured peak over real training steps, printed next to an
 * estimate in one format for every model (--model mlp, cnn, gpt). */
#ifndef EMBER_TOOL_MEM_MEASURED_H
#define EMBER_TOOL_MEM_MEASURED_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

/* "  measured peak  X MB  the CPU allocator's peak over <what> ...: the estimate is +N% of it",
 * or a line saying the steps failed when peak is NAN. */
void mem_print_measured(double estimate, double peak, const char *what);

/* The peak (em_memory_max_allocated, reset first) above what was allocated before, over two
 * steps (forward, cross-entropy, backward, step; the second has the optimizer's states) of
 * the classifier m on random rows of 784 inputs and labels 0-9, the optimizer made by
 * make_opt from m. fwd runs the forward (m itself, or a checkpointing wrapper of it). The
 * model and the optimizer are built inside make: it returns false on failure. NAN on failure. */
typedef struct mem_classifier {
    em_module *model, *fwd;   /* fwd: NULL means model */
    em_optimizer *opt;
} mem_classifier;
double mem_measure_classifier(bool (*make)(void *ctx, mem_classifier *out), void *ctx, int64_t batch);

#endif
