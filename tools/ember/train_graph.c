/* `ember train`'s step replayed from a CUDA graph (train_graph.h). The seed MLP's step is
 * launch-bound on a GPU: a few dozen small kernels whose launches cost more than their work.
 * Recorded once, the step is one graph launch per batch. What makes it recordable lives in
 * the library: em_cross_entropy checks and weighs its class-index targets on a CUDA device
 * (src/nn/loss.c, no host read), and Adam/AdamW read their step count and learning rate from
 * device memory there (src/optim/sgd_adam.c), so a replay takes the next step, not the
 * recorded one. Here: the step's inputs are tensors that outlive the graph, each batch copied
 * into them on the device; its output is the loss tensor the step writes; after each replay
 * the optimizer's host counts advance (em_optim_step_replayed), so checkpoints hold the steps
 * taken. A capture that fails leaves the step eager, with the reason in the summary. */
#include "train_graph.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* PyTorch's make_graphed_callables warms up for 3 iterations: the optimizer's states, the
 * device's check flag, Adam's device step count and the compiled kernels exist before the
 * capture. */
#define WARMUP 3

void train_graph_start(train_graph *g, em_device device, em_module *model, em_optimizer *opt, const char *why_eager) {
    memset(g, 0, sizeof *g);
    g->model = model;
    g->opt = opt;
    const char *why = NULL;
    if (why_eager) {
        snprintf(g->why_off, sizeof g->why_off, "%s", why_eager);
        return;
    }
    if (!em_graph_available(device, &why)) {
        snprintf(g->why_off, sizeof g->why_off, "%s", why);
        return;
    }
    if (!(g->step = em_graph_step_new(device, WARMUP))) {
        snprintf(g->why_off, sizeof g->why_off, "%s", em_last_error());
        em_clear_error();
        return;
    }
    g->on = true;
}

/* The step that is recorded: what train_amp_batch does without autocast, scaler or
 * accumulation, on the static inputs, writing the loss into the static output. */
static em_status graph_step(void *ctx) {
    train_graph *g = ctx;
    em_scope s = em_scope_begin();
    em_status st = em_zero_grad(g->opt);
    em_tensor *loss = st == EM_OK ? em_cross_entropy(em_forward(g->model, g->x), g->y, 0.0) : NULL;
    if (st == EM_OK) st = loss ? em_backward(loss) : em_last_status();
    if (st == EM_OK) st = em_step(g->opt);
    if (st == EM_OK) st = em_copy_(g->loss, em_detach(loss));
    em_scope_end(s);
    return st;
}

static bool same_layout(const em_tensor *a, const em_tensor *b) {
    if (em_dtype_of(a) != em_dtype_of(b) || em_ndim(a) != em_ndim(b)) return false;
    for (int d = 0; d < em_ndim(a); d++)
        if (em_size(a, d) != em_size(b, d)) return false;
    return true;
}

/* The batch outside the graph (same work, the batch's own tensors). */
static em_tensor *eager_batch(train_graph *g, em_tensor *x, em_tensor *y) {
    g->eager_batches++;
    if (em_zero_grad(g->opt) != EM_OK) return NULL;
    em_tensor *loss = em_cross_entropy(em_forward(g->model, x), y, 0.0);
    if (!loss || em_backward(loss) != EM_OK || em_step(g->opt) != EM_OK) return NULL;
    return loss;
}

em_tensor *train_graph_batch(train_graph *g, em_tensor *x, em_tensor *y) {
    if (!g->on) return NULL;
    if (!g->x) {   /* the first batch fixes the inputs' shapes: the full batch */
        em_scope s = em_scope_begin();
        em_tensor *sx = em_empty_like(x), *sy = em_empty_like(y);
        em_tensor *loss = em_zeros(EM_SHAPE0, EM_OPTS(.device = em_device_of(x)));
        if (sx && sy && loss) g->x = em_retain(sx), g->y = em_retain(sy), g->loss = em_retain(loss);
        em_scope_end(s);
        if (!g->loss) return NULL;
    }
    if (!same_layout(x, g->x) || !same_layout(y, g->y)) return eager_batch(g, x, y);
    if (em_copy_(g->x, x) != EM_OK || em_copy_(g->y, y) != EM_OK) return NULL;
    em_graph_step_stats before, after;
    em_graph_step_get_stats(g->step, &before);
    em_tensor *inputs[2] = {g->x, g->y};
    if (em_graph_step_run(g->step, inputs, 2, 0, graph_step, g) != EM_OK) return NULL;
    em_graph_step_get_stats(g->step, &after);
    /* a replay that did not capture ran no em_step on the host: count its step there */
    if (after.replays > before.replays && after.captures == before.captures && em_optim_step_replayed(g->opt) != EM_OK)
        return NULL;
    return g->loss;
}

void train_graph_summary(const train_graph *g, char *buf, size_t size) {
    em_graph_step_stats st = {0};
    if (!g->on || em_graph_step_get_stats(g->step, &st) != EM_OK) {
        snprintf(buf, size, "cuda graph: off (%s)", g->why_off[0] ? g->why_off : "no step ran");
        return;
    }
    if (st.captures == 0) {
        snprintf(buf, size, "cuda graph: step eager (%" PRId64 " steps%s%s)", st.eager_runs + g->eager_batches,
                 st.failed_captures ? "; the capture failed: " : ", no capture yet",
                 st.failed_captures ? st.last_failure : "");
        return;
    }
    snprintf(buf, size, "cuda graph: step replayed (%" PRId64 " capture%s, %" PRId64 " replays, %" PRId64
             " eager steps: warm-up and short batches)", st.captures, st.captures == 1 ? "" : "s", st.replays,
             st.eager_runs + g->eager_batches);
}

void train_graph_free(train_graph *g) {
    em_graph_step_free(g->step);
    em_release(g->x);
    em_release(g->y);
    em_release(g->loss);
    memset(g, 0, sizeof *g);
}
