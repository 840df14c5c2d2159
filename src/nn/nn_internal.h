/* Shared between src/nn and src/optim (not public). */
#ifndef EM_NN_INTERNAL_H
#define EM_NN_INTERNAL_H

#include <ember/nn.h>
#include <ember/optim.h>
#include "../core/internal_api.h"

/* Return t (a reference owned by the current code) from a function that opened scope s:
 * ends s and hands t to the caller's scope, like any op result. */
em_tensor *em__scope_return(em_scope s, em_tensor *t);

/* Optimizers created on a module register with it so that em_module_to moves their state. */
em_status em__module_attach_optimizer(em_module *m, em_optimizer *opt);
void em__module_detach_optimizer(em_module *m, em_optimizer *opt);
/* Move every state tensor of opt to its parameter's device and dtype (optim/optimizer.c). */
em_status em__optim_sync_state(em_optimizer *opt);
/* The module opt was created on is being freed. */
void em__optim_forget_module(em_optimizer *opt);

/* The "format" metadata value of a training checkpoint (optim/checkpoint.c). */
#define EM__CHECKPOINT_FORMAT "ember.checkpoint.v1"
/* em_module_load from a file already read (path only names it in messages). */
struct em_safetensors;
em_status em__module_load_file(em_module *m, const struct em_safetensors *file, const char *path);

/* convolution and pooling: the kind of a layer from src/nn/conv.c, else EM_MODULE_CUSTOM */
em_module_kind em__nn_conv_kind(const em_module *m);

#endif
