/* Ember: PyTorch's device model in C. Include this one header.
 *
 * Threads (checked by tests/test_threads_stress.c under ThreadSanitizer, scripts/tsan.sh):
 *   - Per thread: the error state (em_last_error...), scopes, grad mode, the current-device
 *     guard. An error raised on one thread is never seen by another.
 *   - Safe from any thread at once: creating, computing on and releasing distinct tensors,
 *     on any device; em_retain/em_release (atomic counts); the device registry and the
 *     backends (initialized once, lazily); the memory allocator and its statistics and caps;
 *     the global random generator (em_manual_seed, em_randn... each draw takes its own range);
 *     em_set_num_threads / em_get_num_threads.
 *   - Shared read-only: several threads may read one tensor at once (use it as an op's input,
 *     copy it, move it with em_to) while no thread writes it. Writing means an in-place op
 *     (em_add_, em_copy_...), em_set_grad, a backward that accumulates into its .grad,
 *     em_module_to / em_module_load on its module, or an optimizer step that updates it.
 *   - One thread at a time: a module (forward with grad, backward, moving, loading), an
 *     optimizer, a data loader (its prefetch thread is internal), a safetensors handle, an
 *     autograd graph (two threads must not run backward through the same graph at once).
 *     Ember does not lock these objects: the caller does if it shares them. */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H

#include <ember/version.h>
#include <ember/error.h>
#include <ember/dtype.h>
#include <ember/device.h>
#include <ember/telemetry.h>
#include <ember/tensor.h>
#include <ember/ops.h>
#include <ember/autograd.h>
#include <ember/nn.h>
#include <ember/optim.h>
#include <ember/amp.h>
#include <ember/io.h>
#include <ember/data.h>
#include <ember/kernel.h>
#include <ember/memory.h>
#include <ember/graph.h>
#include <ember/estimate.h>
#include <ember/parse.h>
/* DataParallel over devices */
#include <ember/parallel.h>

#include <ember/dist.h>
/* TensorBoard event files */
#include <ember/summary.h>
/* language models: Hugging Face model folders, the forward pass with a KV cache, perplexity,
 * and tokenizers from tokenizer.json */
#include <ember/models.h>
#include <ember/tokenizer.h>
/* generation: prefill and decode with a KV cache, sampling, a model folder with its tokenizer */
#include <ember/generate.h>
/* fine-tuning: LoRA adapters on a loaded model, the causal LM loss, PEFT's adapter folders */
#include <ember/finetune.h>
#include <ember/zero.h>

#endif
