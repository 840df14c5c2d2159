/* nn's internal interface, for src/nn and the layers that may build on nn (src/optim,
 * src/dist: docs/ARCHITECTURE.md); not public. nn itself calls nothing of theirs. */
#ifndef EM_NN_INTERNAL_H
#define EM_NN_INTERNAL_H

#include <ember/nn.h>
#include "../core/internal_api.h"

/* ---- listeners: what keeps state about a module's tensors (an optimizer, src/optim) hears
 * what happens to the module, so that nn never calls the layers above it ----
 * moved(ctx): em_module_to / em_module_to_dtype moved tensors of the module's tree (the
 *   module listened to, a descendant of it, or an ancestor); move what you keep to match.
 *   A failure is returned by the move (the listeners after it are not told).
 * freed(ctx): the module is being freed: forget it, and do not unlisten (it is going). */
typedef struct em_module_listener {
    em_status (*moved)(void *ctx);
    void (*freed)(void *ctx);
} em_module_listener;
/* Listen to m (EM_ERR_OUT_OF_MEMORY, recorded, if the list cannot grow), and stop. */
em_status em__module_listen(em_module *m, const em_module_listener *l, void *ctx);
void em__module_unlisten(em_module *m, const em_module_listener *l, void *ctx);

/* em_checkpoint that owns ctx: free_ctx(ctx) runs when the function is no longer needed
 * (with the graph, after the call when nothing is recorded, or on failure). For contexts
 * made per call (ZeRO's units, em_zero_run_unit). */
em_tensor *em__checkpoint_owned(em_checkpoint_fn fn, void *ctx, void (*free_ctx)(void *), em_tensor *const *inputs,
                                int n);
/* The "format" metadata value of a training checkpoint (optim/checkpoint.c). */
#define EM__CHECKPOINT_FORMAT "ember.checkpoint.v1"
/* em_module_load from a file already read (path only names it in messages). */
struct em_safetensors;
em_status em__module_load_file(em_module *m, const struct em_safetensors *file, const char *path);

/* Class-index losses (loss.c): where their targets are checked and weighed. -1 (the default):
 * on the device for CUDA tensors (no host read: the step neither waits nor stops a graph's
 * capture; an out-of-range target is reported at the next wait, em__device_check_queue), on
 * the host elsewhere; 1: on the device for every device but the CPU (tests prove the device
 * path on OpenCL); 0: on the host everywhere. Returns the previous mode. */
int em__loss_device_targets(int mode);

/* convolution and pooling: the kind of a layer from src/nn/conv.c, else EM_MODULE_CUSTOM */
em_module_kind em__nn_conv_kind(const em_module *m);

#endif
