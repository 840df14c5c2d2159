/* Data parallelism in one process over several devices, as torch.nn.DataParallel.
 *
 *   em_device devs[] = {EM_DEVICE(EM_OPENCL, 0), EM_DEVICE(EM_OPENCL, 1)};
 *   em_dp *dp = em_data_parallel(model, devs, 2);        // model already on devs[0]
 *   em_optimizer *opt = em_adam(model, 1e-3);            // on the model itself (the primary)
 *   for (...) {
 *       em_zero_grad(opt);
 *       em_tensor *loss = em_cross_entropy(em_dp_forward(dp, x), y, 0.0);
 *       em_dp_backward(dp, loss);                         // instead of em_backward(loss)
 *       em_dp_step(dp, opt);                              // instead of em_step(opt)
 *   }
 *   em_dp_free(dp);                                       // the model stays the caller's
 *
 * Unlike PyTorch, which copies the model to every device at every forward, the replicas are
 * made once and stay on their devices; em_dp_step keeps them identical to the model. The
 * model itself is the replica on devices[0]; it runs on the caller's thread, every other
 * replica on a thread of its own, all at once. The forward splits the batch along dim 0 in
 * chunks as torch.chunk does (a batch smaller than the device count uses the first devices
 * only, as PyTorch), runs the replicas' forwards and gathers their outputs on devices[0]. em_dp_backward runs the replicas' backwards
 * at once and sums their gradients into the model's .grad, as PyTorch's DataParallel does.
 *
 * Autocast (amp.h): the replicas' forwards run under the caller's autocast state at the
 * call of em_dp_forward (each worker thread enters the same regions, as PyTorch's
 * DataParallel does). With a gradient scaler, scale the loss, call em_dp_backward (the
 * gradients are summed into the model's .grad), then em_grad_scaler_step and _update on the
 * model's optimizer and em_dp_sync: one inf/NaN check over the summed gradients decides
 * for every replica, and a skipped step leaves them all as they were.
 *
 * A replica shares its module's ctx (the module kinds' private data) with the model, read
 * from several threads at once; its parameters and buffers are its own. A custom module's
 * forward must therefore reach its tensors through the module (em_module_parameters), not
 * through pointers kept in ctx.
 *
 * Errors: a replica's failure (on its own thread) becomes an error on the caller's thread
 * naming the replica and its device; nothing it made is kept. The model must not be moved,
 * or gain parameters, while the em_dp exists; after loading weights into it call em_dp_sync.
 * An em_dp is used from one thread at a time, like a module. */
#ifndef EMBER_PARALLEL_H
#define EMBER_PARALLEL_H

#include <ember/export.h>
#include <ember/nn.h>
#include <ember/optim.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_dp em_dp; /* a model replicated over several devices (nn.DataParallel) */

/* DataParallel over devices[0..n-1] (1 <= n <= EM_DP_MAX_DEVICES, no device twice, each one
 * existing). Every parameter and buffer of model must be on devices[0] (PyTorch's rule);
 * the model is borrowed and must outlive the em_dp. NULL and an error otherwise. */
#define EM_DP_MAX_DEVICES 64 /* the most devices one em_dp spans */
/* torch.nn.DataParallel(model, device_ids): see above. */
EM_API em_dp *em_data_parallel(em_module *model, const em_device *devices, int n);
/* Frees the replicas and threads (not the model). NULL is ignored. */
EM_API void em_dp_free(em_dp *dp);

/* model(x) over the devices: x split along dim 0 (x may be on any device), the outputs
 * gathered on devices[0] along dim 0. A new reference (scoped like any op result). With
 * grad mode on, the graph of each replica is kept for em_dp_backward; gradients do not flow
 * back into x. */
EM_API em_tensor *em_dp_forward(em_dp *dp, em_tensor *x);
/* loss.backward() for a loss computed from the last em_dp_forward's output: the replicas'
 * backwards run concurrently, then each replica's gradients are summed into the model's
 * .grad (accumulating, as backward does) and the replicas' own are cleared. */
EM_API em_status em_dp_backward(em_dp *dp, em_tensor *loss);
/* em_step(opt) on the model (opt made on it), then every replica takes the model's
 * parameters and buffers (em_dp_sync). */
EM_API em_status em_dp_step(em_dp *dp, em_optimizer *opt);
/* Copy the model's parameters and buffers into every replica (after em_module_load,
 * em_checkpoint_load or any change made to the model's values outside em_dp_step). */
EM_API em_status em_dp_sync(em_dp *dp);

/* The model (replica 0), the replica on devices[i] (borrowed), the device count. */
EM_API em_module *em_dp_module(const em_dp *dp);
EM_API em_module *em_dp_replica(const em_dp *dp, int i); /* the replica on devices[i] */
EM_API int em_dp_device_count(const em_dp *dp);         /* n */
EM_API em_device em_dp_device(const em_dp *dp, int i);  /* devices[i] */

#ifdef __cplusplus
}
#endif
#endif
