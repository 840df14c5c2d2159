/* The inside of em_module (src/nn only). */
#ifndef EM_NN_MODULE_IMPL_H
#define EM_NN_MODULE_IMPL_H

#include "nn_internal.h"

typedef struct nn_slot { char *name; em_tensor *t; } nn_slot;
typedef struct nn_child { char *name; em_module *m; } nn_child;
/* A flattened listing with dotted names, kept until the module tree changes so that the
 * names handed out stay valid. */
typedef struct nn_listing { em_named_tensor *items; int n, cap; bool valid; } nn_listing;
typedef struct nn_listener { const em_module_listener *l; void *ctx; } nn_listener;

struct em_module {
    const em_module_ops *ops;
    void *ctx;
    bool training;
    em_module *parent;          /* the module that owns this one, or NULL */
    nn_slot *params;
    int nparams, cparams;
    nn_slot *bufs;
    int nbufs, cbufs;
    nn_child *kids;
    int nkids, ckids;
    nn_listener *listeners;     /* told of moves and of the free (optimizers); not owned */
    int nlisteners, clisteners;
    nn_listing lists[2];        /* cached listings: [0] parameters, [1] buffers */
};

#endif
