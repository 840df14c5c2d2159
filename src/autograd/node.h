/* Autograd's graph node (private to src/autograd/). */
#ifndef EM_AUTOGRAD_NODE_H
#define EM_AUTOGRAD_NODE_H

#include <stdbool.h>
#include "record.h"
#include "../core/internal_api.h"   /* em_custom_grad */

#define AG_MAX_SAVED 3

/* A tensor saved for backward: a detached alias (shares storage, no history) and the
 * storage version when it was saved. */
typedef struct ag_saved {
    em_tensor *t;
    unsigned version;
} ag_saved;

/* What a node knows about one input: where its gradient goes and what it must look like. */
typedef struct ag_input {
    struct ag_node *node;  /* the input's grad_fn (retained), or NULL */
    em_tensor *leaf;       /* a leaf requiring grad (retained), or NULL */
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    em_dtype dtype;
    em_device device;
} ag_input;

typedef struct ag_node {
    em_grad_node base;       /* first member: core counts references through it */
    em_grad_op op;
    em_grad_args args;
    /* the output's metadata (for checks and error messages) */
    int out_ndim;
    int64_t out_shape[EM_MAX_DIMS];
    em_dtype out_dtype;
    ag_saved saved[AG_MAX_SAVED];
    int nsaved;
    /* a custom node (em__grad_record_custom): the caller's backward instead of op's */
    const em_custom_grad *custom;
    void *custom_ctx;
    bool released;           /* saved tensors were freed by a backward without retain_graph */
    /* engine scratch, valid only during one backward */
    int deps;                /* gradients still to arrive */
    unsigned mark;           /* traversal epoch */
    em_tensor *grad;         /* gradient of the output, summed so far */
    bool grad_fresh;         /* grad was made by this backward (a formula or a sum), not the
                              * caller's tensor passed along: a leaf may take it (engine.c) */
    struct ag_node *free_next;
    int n;
    ag_input in[];           /* n inputs */
} ag_node;

/* Does input i need a gradient? */
static inline bool ag_input_needs(const ag_input *in) { return in->node || in->leaf; }

/* Compute the gradients of the node's inputs from g (the output's gradient): out[i] is a
 * new reference or NULL where input i needs none. Runs in no-grad mode inside a scope opened
 * by the caller. Returns EM_OK or the recorded error. */
em_status em__ag_node_backward(ag_node *n, em_tensor *g, em_tensor **out);
/* PyTorch's name of the node type ("MulBackward0"). */
const char *em__ag_op_name(em_grad_op op);
/* "[torch.FloatTensor [3, 4]]": PyTorch's description of a tensor type in error messages. */
void em__ag_describe(char *buf, size_t size, em_dtype dt, em_device d, int ndim, const int64_t *shape);

#endif
