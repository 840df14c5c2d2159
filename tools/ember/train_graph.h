/* `ember train`'s step as a CUDA graph (include/ember/graph.h): on a CUDA device that records
 * graphs, the plain step (zero_grad, forward, em_cross_entropy on class indices, backward,
 * em_step) runs eagerly for a few warm-up batches, is captured once and replayed for every
 * full batch after; EMBER_CUDA_GRAPHS=0 turns it off. The logic lives in train_graph.c;
 * cmd_train.c decides whether the run's step can be captured and calls in. */
#ifndef EMBER_TOOL_TRAIN_GRAPH_H
#define EMBER_TOOL_TRAIN_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/ember.h>

typedef struct train_graph {
    bool on;                   /* the step goes through the graph */
    char why_off[256];         /* why not (for the summary) */
    em_graph_step *step;
    em_module *model;          /* borrowed */
    em_optimizer *opt;         /* borrowed */
    em_tensor *x, *y;          /* the step's inputs: each batch is copied into them */
    em_tensor *loss;           /* the step's output: the batch's loss, written by each replay */
    int64_t eager_batches;     /* batches that did not fit the inputs (a short last batch) */
} train_graph;

/* Starts the graph for a step on device with model and opt, unless why_eager is not NULL
 * (the run's step cannot be captured safely: the reason, kept for the summary) or the device
 * records no graphs. Never fails: a graph that cannot be made leaves the step eager. */
void train_graph_start(train_graph *g, em_device device, em_module *model, em_optimizer *opt, const char *why_eager);
/* One batch through the graph: its loss (valid until the next batch), or NULL on error. A
 * batch whose shape is not the inputs' (the short last batch) runs eagerly outside the
 * graph; when g is off the caller runs its own step instead. */
em_tensor *train_graph_batch(train_graph *g, em_tensor *x, em_tensor *y);
/* "cuda graph: step replayed (1 capture, 930 replays, 3 warm-up and 1 other eager steps)" or
 * "cuda graph: off (why)". */
void train_graph_summary(const train_graph *g, char *buf, size_t size);
void train_graph_free(train_graph *g);

#endif
