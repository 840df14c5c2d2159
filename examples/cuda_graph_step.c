/* The seed MLP's training step (784-256-10, cross-entropy on class indices, Adam) captured as a
 * CUDA graph after warm-up and replayed (include/ember/graph.h), next to the same steps run
 * eagerly from the same seed: the two must end with the same parameters and the same losses.
 *
 * How a step becomes replayable: the batch goes into two tensors that outlive the graph (x, y),
 * copied in before every step; the step's results stay in tensors the step owns (the loss sum
 * here, the parameters and their gradients); and nothing in the step reads a value to the host.
 * On CUDA, em_cross_entropy checks its class indices on the device (a bad one is reported by the
 * next read, em_item here), and Adam keeps its step count and learning rate in device memory,
 * so each replay takes the next step; em_optim_step_replayed keeps the optimizer's host counts
 * in step with the replays. On a machine without CUDA, or with EMBER_CUDA_GRAPHS=0, the step
 * runs eagerly: the comparison still holds. */
#include <ember/ember.h>
#include "seed_common.h"

enum { BATCH = 64, BATCHES = 10, STEPS = 30 };

typedef struct step_ctx {
    em_module *model;
    em_optimizer *opt;
    em_tensor *x, *y;          /* this step's batch (y: class indices): copied in before the step */
    em_tensor *loss_sum;       /* the losses so far, summed on the device */
} step_ctx;

/* zero_grad, forward, loss, backward, step: device work only */
static em_status train_step(void *p) {
    step_ctx *c = p;
    em_scope s = em_scope_begin();
    em_status st = em_zero_grad(c->opt);
    em_tensor *loss = em_cross_entropy(em_forward(c->model, c->x), c->y, 0.0);
    if (st == EM_OK) st = loss ? em_backward(loss) : em_last_status();
    if (st == EM_OK) st = em_step(c->opt);
    if (st == EM_OK) st = em_add_(c->loss_sum, em_detach(loss), 1.0);
    em_scope_end(s);
    return st;
}

/* STEPS steps over the data from seed 7, with graphs or without; the final loss sum and the
 * model (the caller frees it). */
static em_module *train(em_device dev, em_tensor *data_x, em_tensor *data_y, bool graphs, double *loss_sum,
                        em_graph_step_stats *stats) {
    em_scope scope = em_scope_begin();   /* the step's tensors go at the end */
    em_manual_seed(7);
    em_module *model = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    SEED_CHECK(model && em_module_to(model, dev) == EM_OK);
    step_ctx c = {.model = model, .opt = em_adam(model, 1e-3),
                  .x = em_empty(EM_SHAPE(BATCH, 784), EM_OPTS(.device = dev)),
                  .y = em_empty(EM_SHAPE(BATCH), EM_OPTS(.device = dev, .dtype = EM_I64)),
                  .loss_sum = em_zeros(EM_SHAPE(1), EM_OPTS(.device = dev))};
    SEED_CHECK(c.opt && c.x && c.y && c.loss_sum);
    em_graph_step *step = graphs ? em_graph_step_new(dev, 3) : NULL;   /* capture after 3 warm-up steps */
    SEED_CHECK(!graphs || step);
    for (int i = 0; i < STEPS; i++) {
        int64_t at = (int64_t)(i % BATCHES) * BATCH;
        SEED_CHECK(em_copy_(c.x, em_narrow(data_x, 0, at, BATCH)) == EM_OK);   /* the batch, in place */
        SEED_CHECK(em_copy_(c.y, em_narrow(data_y, 0, at, BATCH)) == EM_OK);
        em_tensor *inputs[2] = {c.x, c.y};
        em_graph_step_stats before = {0}, after = {0};
        if (graphs) SEED_CHECK(em_graph_step_get_stats(step, &before) == EM_OK);
        SEED_CHECK((graphs ? em_graph_step_run(step, inputs, 2, 0, train_step, &c) : train_step(&c)) == EM_OK);
        if (graphs) SEED_CHECK(em_graph_step_get_stats(step, &after) == EM_OK);
        /* a replay that did not capture ran no em_step on the host: count its step there */
        if (after.replays > before.replays && after.captures == before.captures)
            SEED_CHECK(em_optim_step_replayed(c.opt) == EM_OK);
    }
    SEED_CHECK(em_optim_steps(c.opt) == STEPS);
    *loss_sum = em_item(c.loss_sum);   /* the one read to the host */
    if (step) SEED_CHECK(em_graph_step_get_stats(step, stats) == EM_OK);
    em_graph_step_free(step);
    em_optim_free(c.opt);
    em_scope_end(scope);
    return model;
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_device dev = em_device_available(EM_CUDA) ? EM_DEVICE(EM_CUDA, 0) : EM_DEVICE_CPU;
    const char *why = NULL;
    bool can = em_graph_available(dev, &why);
    printf("device %s; graphs: %s%s\n", em_device_str(dev).s, can ? "yes" : "no: ", can ? "" : why);
    em_manual_seed(1);
    em_tensor *data_x = em_to(em_randn(EM_SHAPE(BATCH * BATCHES, 784), EM_OPTS(0)), dev);
    em_tensor *data_y = em_to(em_randint(0, 10, EM_SHAPE(BATCH * BATCHES), EM_OPTS(.dtype = EM_I64)), dev);
    SEED_CHECK(data_x && data_y);
    double eager_loss, graph_loss;
    em_graph_step_stats st = {0};
    em_module *eager = train(dev, data_x, data_y, false, &eager_loss, &st);
    em_module *graphed = train(dev, data_x, data_y, true, &graph_loss, &st);
    printf("eager: mean loss %.6f; graphs: mean loss %.6f (%lld eager steps, %lld captures, %lld replays%s%s)\n",
           eager_loss / STEPS, graph_loss / STEPS, (long long)st.eager_runs, (long long)st.captures,
           (long long)st.replays, st.last_failure[0] ? "; capture failed: " : "", st.last_failure);
    /* the same kernels in the same order: the same numbers */
    em_named_tensor pe[8], pg[8];
    int n = em_module_parameters(eager, pe, 8);
    SEED_CHECK(n == 4 && em_module_parameters(graphed, pg, 8) == n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = em_item(em_max(em_abs(em_sub(pe[i].tensor, pg[i].tensor)), EM_ALL_DIMS, false));
        if (d > worst) worst = d;
    }
    printf("largest parameter difference: %g\n", worst);
    SEED_CHECK(worst == 0 && eager_loss == graph_loss);
    SEED_CHECK(st.eager_runs + st.replays == STEPS);
    if (can) SEED_CHECK(st.captures == 1 && st.replays == STEPS - 3);
    em_module_free(eager);
    em_module_free(graphed);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
