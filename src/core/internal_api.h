/* The core's interface for the layers above it (src/nn, src/optim, src/data): the few
 * entries they need that are not for users. Those layers include this header and public
 * ones, never another header of src/core, src/backends or src/memory
 * (scripts/check_layers.sh fails the build otherwise). Everything here takes and returns
 * opaque em_tensor handles: the layers above never see a tensor's or a storage's inside. */
#ifndef EM_CORE_INTERNAL_API_H
#define EM_CORE_INTERNAL_API_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/tensor.h>
#include "../util/errors.h"
#include "../backends/optim_args.h" /* the fused steps' scalars */
#include "autocast.h"   /* the autocast hook of the losses (src/nn/loss.c) */
#include "../memory/estimate_arith.h" /* the memory estimate's arithmetic (src/optim/estimate.c) */

/* Register a reference the caller owns with the innermost scope (if any) and return it: how
 * a function hands out a result like any op does (src/core/tensor.c). */
em_tensor *em__scoped(em_tensor *t);
/* Return t (a reference owned by the current code) from a function that opened scope s:
 * ends s and hands t to the caller's scope, like any op result (src/core/scope.c). */
em_tensor *em__scope_return(em_scope s, em_tensor *t);

/* t's .grad, borrowed (no new reference, no scope entry, so it cannot fail), or NULL: for
 * the optimizer step, which must not allocate before it has made its state
 * (src/core/tensor.c). */
em_tensor *em__grad_borrowed(const em_tensor *t);

/* Move t to device d and dtype dt in place: t's handle stays valid and points at new
 * storage (its .grad moves too). Views of t made before keep the old storage. Used to move
 * parameters and optimizer state without stranding the handles users and optimizers hold
 * (src/core/move.c). */
em_status em__tensor_move_(em_tensor *t, em_device d, em_dtype dt);

/* t takes src's storage and layout (PyTorch's `t.data = src`): t's handle, .grad and
 * requires_grad stay; src must have t's shape, dtype and device (it may be a view, an
 * expanded one included). Views of t made before keep the old storage. ZeRO stage 3
 * (src/dist/zero.c) points a parameter into its block's gathered flat buffer for a forward
 * and at a one-element placeholder after, so the full values exist only while in use
 * (src/core/move.c). */
em_status em__tensor_set_data_(em_tensor *t, em_tensor *src);

/* ---- fused optimizer steps (src/core/ops_optim.c) ----
 * The fused step applies when p is floating and contiguous and every other operand is
 * present, contiguous, with p's dtype and shape, on p's device, and p's backend has the
 * kernel. The _applies queries record nothing: without them the optimizer takes its
 * op-by-op path. The steps check the same (EM_ERR_ARGUMENT when called where they do not
 * apply), run the kernel (g is only read) and bump the version counters of what they
 * wrote, as an in-place op does. */
/* buf: the momentum buffer (NULL without momentum, or before it is made: the query then
 * checks p and g only); with a->first_step the step writes it without reading it. */
bool em__fused_sgd_applies(const em_tensor *p, const em_tensor *g, const em_tensor *buf);
em_status em__fused_sgd_step(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *buf);
/* vmax only with a->amsgrad. */
bool em__fused_adam_applies(const em_tensor *p, const em_tensor *g, const em_tensor *m, const em_tensor *v,
                            const em_tensor *vmax);
em_status em__fused_adam_step(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                              em_tensor *v, em_tensor *vmax);
/* Adam/AdamW over several parameters in one call (ADAM_STEP_MULTI: the GPUs' multi-tensor
 * kernel). Whether item's operands fit it (float32, contiguous, on a backend with the op;
 * no amsgrad, no scaler); then the step on mt's items (all on one device: the caller groups
 * them), each item's low copy made here where one is wanted. EM_ERR_NOT_SUPPORTED with
 * nothing recorded and nothing written where the backend declines (step each instead). */
bool em__fused_adam_multi_applies(const em_adam_multi_item *item);
em_status em__fused_adam_multi_step(em_adam_multi *mt);
/* The other optimizers' fused steps (src/optim/adaptive.c): one op of the op list each
 * (ADADELTA_STEP ... RADAM_STEP, whose entries give the layouts), dst {p, states}, src {g}.
 * states has n entries, NULL where the options keep none (RMSprop's momentum_buffer and
 * grad_avg); flags are the EMK_OPTF_* (src/kernels/layout.h), f the op's scalars. */
typedef enum em_fused_optim {
    EM_FUSED_ADADELTA, EM_FUSED_ADAGRAD, EM_FUSED_RMSPROP, EM_FUSED_ADAMAX, EM_FUSED_NADAM, EM_FUSED_RADAM,
    EM_FUSED_OPTIM_COUNT
} em_fused_optim;
#define EM_FUSED_OPTIM_PARAMS 8 /* the op call's f[] */
bool em__fused_optim_applies(em_fused_optim kind, const em_tensor *p, const em_tensor *g, em_tensor *const *states,
                             int n);
em_status em__fused_optim_step(em_fused_optim kind, em_tensor *p, const em_tensor *g, em_tensor *const *states, int n,
                               int64_t flags, const double f[EM_FUSED_OPTIM_PARAMS]);

/* ---- loss scaling (src/core/ops_amp.c; the scaler is src/optim/grad_scaler.c) ----
 * state: the scaler's contiguous float32 [4] {scale, growth tracker, found_inf, skipped}.
 * Neither call waits for the device. */
/* Is state a scaler state on t's device (so that t's kernels can read it)? */
bool em__amp_state_fits(const em_tensor *state, const em_tensor *t);
/* g *= 1 / scale in place; found_inf = 1 when g had an inf or NaN. */
em_status em__amp_unscale_(em_tensor *g, em_tensor *state);
/* PyTorch's scale update (backoff on found_inf, growth every interval clean steps), counts a
 * skipped step and clears found_inf. */
em_status em__amp_update_(em_tensor *state, double growth, double backoff, int64_t interval);

/* ---- convolution and pooling (src/core/ops_conv.c) ----
 * The backward passes autograd's formulas call (no autograd recorded; results scoped).
 * win is em_grad_args.win; input_shape / weight_shape are 4-d. kind: em_pool_kind
 * (0 max, which needs the forward's indices; 1 avg; 2 adaptive avg). */
em_tensor *em__conv2d_backward_input(em_tensor *g, em_tensor *weight, const int64_t *input_shape, const int64_t *win);
em_tensor *em__conv2d_backward_weight(em_tensor *g, em_tensor *input, const int64_t *weight_shape, const int64_t *win);
/* the same and, when gbias is not NULL, the bias's gradient [O] into *gbias (g summed over N, H
 * and W; oneDNN reads g once for both); both NULL on failure */
em_tensor *em__conv2d_backward_weight_bias(em_tensor *g, em_tensor *input, const int64_t *weight_shape,
                                           const int64_t *win, em_tensor **gbias);
em_tensor *em__pool2d_backward(int kind, em_tensor *g, em_tensor *indices, const int64_t *input_shape,
                               const int64_t *win);
/* Force the portable im2col + matmul convolution instead of the backend's library (oneDNN),
 * so tests cover both; returns the previous setting. EMBER_CONV=portable sets it at start. */
bool em__conv_force_portable(bool on);
/* ---- norms, embedding, attention: the fused LayerNorm (src/core/ops_norm.c) ----
 * Applies for f32/f64 x whose numel is a multiple of n, with contiguous w and b of n
 * elements (x's dtype and device) on a backend with the kernels; records nothing. */
bool em__layer_norm_applies(const em_tensor *x, const em_tensor *w, const em_tensor *b, int64_t n);
/* y = (x - mean) / sqrt(var + eps) * w + b over each run of n trailing elements, one
 * kernel, autograd node NativeLayerNormBackward0 (inputs {x, w, b}). */
em_tensor *em__layer_norm(em_tensor *x, int64_t n, em_tensor *w, em_tensor *b, double eps);
/* Its backward (autograd's formula): dx, and gxhat = g * xhat for the weight's gradient,
 * both scoped, of x's shape. */
em_status em__layer_norm_backward(em_tensor *g, em_tensor *x, em_tensor *w, int64_t n, double eps, em_tensor **dx,
                                  em_tensor **gxhat);
/* GELU's backward g * (Phi(x) + x phi(x)) in one kernel (scoped result), or NULL without an
 * error where the backend lacks it or the operands do not fit (f32/f64, one shape): the
 * caller then composes it. */
em_tensor *em__gelu_backward(em_tensor *g, em_tensor *x);
/* ReLU's backward in one pass from its output y (ops_fused.c; one pass matters to the CNN):
 * g where y > 0, else 0; NULL without an error where the backend has no such kernel (or
 * dtypes, shapes or devices differ): the caller composes. */
em_tensor *em__relu_backward(em_tensor *g, em_tensor *y);

/* a @ b for 2-d bf16/f16 a, b into a new float32 tensor (scoped), the float32 accumulators
 * not rounded to the inputs' dtype (ops_linalg.c): autograd's gradient of a float32 tensor's
 * low-precision cast (a master weight's), which matmul would round and the cast's backward
 * widen again. NULL without an error where it does not apply (other dtypes or ranks, devices
 * differ, the backend has no such kernel): the caller runs matmul. Records no history
 * (autograd's formulas run without grad). */
em_tensor *em__matmul_widen(em_tensor *a, em_tensor *b);

/* out += a @ b in place for 2-d a [M, K], b [K, N] (any strides) and a contiguous out [M, N],
 * all of one floating dtype: one accumulating GEMM where the backend has matmul_acc, else a
 * matmul and an add. Records no history. For a gradient summed over chunks without a second
 * [M, N] buffer (src/nn/linear_ce.c). (ops_linalg.c) */
em_status em__addmm_acc_(em_tensor *out, em_tensor *a, em_tensor *b);

/* dst[index[i]] += src[i] along dim, in place, repeats in the order of i, for a contiguous dst
 * outside autograd (no history, no requires_grad); records nothing and bumps dst's version.
 * Autograd's index_select gradient into its zeros (ops_index.c). */
em_status em__index_add_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src);

/* dst[i][index[i][j]] += src[i][j] (dim 1 shown), in place, for a contiguous dst outside
 * autograd, as em__index_add_: torch.Tensor.scatter_add_. The fused loss's gradient, where an
 * out-of-place scatter would copy a [rows, vocabulary] chunk (src/nn/linear_ce.c). */
em_status em__scatter_add_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src);

/* dst += index_add(zeros like dst, dim, index, src), bit for bit, in place: the repeats of
 * each index are summed first (in a buffer of one slice per distinct index), then added into
 * dst once. Autograd's accumulation of an embedding's gradient into a .grad that exists
 * already (a tied head's), without a dst-sized temporary. dst as for em__index_add_. */
em_status em__index_add_summed_(em_tensor *dst, int dim, em_tensor *index, em_tensor *src);

/* Softmax's (log: log-softmax's) backward from its output y along the last dim in one kernel
 * (scoped result), or NULL without an error where the backend lacks it or the operands do
 * not fit (f32/f64, one shape, dim the last): the caller then composes it. */
em_tensor *em__softmax_backward(em_tensor *g, em_tensor *y, int dim, bool log);

/* ---- for src/dist's NCCL path (src/core/dist_seam.c, over the backend interface's native
 * handles and events): what NCCL needs of a CUDA tensor without dist seeing a storage or a
 * backend ---- */
typedef struct em_cuda_buffer {
    uint64_t ptr;      /* CUdeviceptr of the tensor's first element */
    void *stream;      /* CUstream its device's work is queued on */
    int device;        /* its N in cuda:N */
} em_cuda_buffer;
/* t on a CUDA device: its buffer, with that device's context made current on this thread
 * (*prev: the caller's, for em__cuda_leave). EM_ERR_DEVICE for other devices. */
em_status em__cuda_enter(const em_tensor *t, em_cuda_buffer *out, void **prev);
void em__cuda_leave(void *prev);
/* An event recorded now on cuda:device's stream (NULL and an error on failure); whether it
 * has completed (1), not yet (0) or failed (-1, error recorded); freeing it. */
void *em__cuda_mark(int device);
int em__cuda_mark_done(void *mark);
void em__cuda_mark_free(void *mark);
/* libnccl.so.2 (dlsym it), found as the other CUDA libraries are, or NULL with *reason. */
void *em__nccl_library(int *version, const char **reason);

/* ---- the language models' fused ops (src/core/ops_fused.c): autograd's backward passes ----
 * SwiGLU's backward in one kernel (scoped results), or EM_ERR_NOT_SUPPORTED with nothing
 * recorded where the backend lacks it or the operands do not fit: the caller composes. */
em_status em__swiglu_backward(em_tensor *g, em_tensor *gate, em_tensor *up, em_tensor **dgate, em_tensor **dup);
/* RMSNorm's backward kernel: dx and, when want_gxhat, g * xhat in the compute dtype (float32
 * for f16/bf16 x), both scoped; w may be NULL. */
em_status em__rms_norm_backward(em_tensor *g, em_tensor *x, em_tensor *w, int64_t n, double eps, bool want_gxhat,
                                em_tensor **dx, em_tensor **gxhat);
/* The rotary embedding's backward (rotation by -theta) of g [B, H, T, D] with the forward's
 * [T, D] or [B, T, D] tables: one kernel where the backend has it, else composed (scoped). */
em_tensor *em__rope_backward(em_tensor *g, em_tensor *cos, em_tensor *sin);

/* ---- fused scaled-dot-product attention (src/core/ops_attention.c) ----
 * Does the fused kernel apply to q [..., L, E], k [..., S, E], v [..., S, Ev] (2 to 4 dims,
 * f32, one device whose backend has it, no autocast region there, EMBER_ATTENTION not
 * "composed")? Records nothing. em__sdpa: softmax(scale q k^T, causal: query i sees keys
 * j <= i) v with its autograd node; EM_ERR_INTERNAL where it does not apply. */
bool em__sdpa_applies(const em_tensor *q, const em_tensor *k, const em_tensor *v);
/* The fused linear cross-entropy's rows (op_list.h's CE_ROWS) where the backend has them (the
 * GPUs): from a chunk's logits z [c, V] (the loss's dtype), its targets, valid [c] and
 * rowscale [c] (NULL: no gradient), writes each row's loss into loss [c] (NULL: none) and sets
 * *dz to rowscale (softmax(z) - q), scoped. EM_ERR_NOT_SUPPORTED with nothing recorded or
 * written where the backend declines (nn/linear_ce.c composes then). Not differentiable. */
em_status em__ce_rows(em_tensor *z, em_tensor *target, em_tensor *valid, em_tensor *rowscale, double smoothing,
                      em_tensor *loss, em_tensor **dz);
em_tensor *em__sdpa(em_tensor *q, em_tensor *k, em_tensor *v, double scale, bool causal);

/* ---- device work that a graph can record (src/core/ops_index.c, device_checks.c, graph.c) ----
 * An index whose every element the caller made lie in [0, bound) on the device (a where over
 * a check): gather, scatter_add and index_select skip their host read of its values while
 * its storage is not written again. */
void em__index_mark_in_range(em_tensor *index, int64_t bound);
/* Whether index is marked (above) to lie in [0, bound) and not written since: a caller that
 * would read it to the host to check its range (em_embedding) can skip that read. */
bool em__index_known_in_range(const em_tensor *index, int64_t bound);
/* Whether this thread is recording a graph on device d (em_graph_capture_begin .. _end). */
bool em__graph_capturing(em_device d);
/* During a capture, host state changed by the work being recorded (an optimizer's step
 * counts) that must be put back if the capture fails, since the recorded work then never
 * runs: undo(ctx) is called once at a failed end (registering the pair again is a no-op).
 * Nothing happens outside a capture. ctx must outlive the capture. */
em_status em__graph_on_abort(void (*undo)(void *ctx), void *ctx);
/* A user's mistake found by device work (PyTorch's device-side assert, without the abort):
 * `found` (int64 [3] on the device: a count, then two numbers for the message, say a flat
 * position and a value) is queued into d's flag, which keeps the first nonzero count; the
 * host reads the flag at its next wait for d (em_item, em_copy_to_host, em_device_synchronize),
 * and there, when a count was set, describe(numbers, ctx) (ctx: a copy of ctx_size bytes, at
 * most 256, kept per distinct ctx) writes the error, which that call returns; the flag is then
 * cleared. Queuing records no host work, so it may run inside a capture. */
typedef void (*em_device_check_describe)(const int64_t numbers[2], const void *ctx, char *buf, size_t size);
em_status em__device_check_queue(em_tensor *found, em_device_check_describe describe, const void *ctx,
                                 size_t ctx_size);
/* Read d's flag if checks were queued on it: EM_OK, or the first queued check's error. */
em_status em__device_checks_read(em_device d);
/* Release every device's flag (tests, before a backend is reset under them). */
void em__device_checks_reset(void);

/* ---- custom autograd functions and the RNG state (activation checkpointing,
 * src/nn/checkpoint.c) ----
 * A graph node whose backward is the caller's (torch.autograd.Function). backward(ctx, g,
 * n, grads) runs in no-grad mode inside a scope, with g the output's gradient; it sets
 * grads[i] (scoped or borrowed, as autograd's formulas do) for each input i that requires
 * grad, and may run a backward of its own through another graph. release(ctx) drops what
 * backward needs after a backward without retain_graph (may be NULL); destroy(ctx) runs
 * when the node dies. (src/autograd/record.c) */
typedef struct em_custom_grad {
    const char *name;  /* the node's name, as em_grad_fn_name reports it */
    em_status (*backward)(void *ctx, em_tensor *g, int n, em_tensor **grads);
    void (*release)(void *ctx);
    void (*destroy)(void *ctx);
} em_custom_grad;
/* Make out (computed by the caller, without history) the output of a custom node over
 * inputs[0..n). ctx is handed over whatever happens: destroy(ctx) runs at once when no node
 * is made (grad mode off, no input requiring grad, or an error) or when the node dies. */
em_status em__grad_record_custom(const em_custom_grad *fn, void *ctx, em_tensor *out, int n,
                                 em_tensor *const *inputs);
/* The global generator's state (seed, offset), and setting it back: what
 * torch.utils.checkpoint saves to replay dropout masks (src/core/create.c). */
void em__rng_get_state(uint64_t *seed, uint64_t *offset);
void em__rng_set_state(uint64_t seed, uint64_t offset);
/* A uniform double in [0, 1) with 53 random bits from Philox 4x32-10's block for counter c under
 * seed (src/kernels/philox.h): words 0 and 1 of the block, (w1 << 21 ^ w0 >> 11) * 2^-53. No
 * global state: the same (seed, c) gives the same number everywhere (generation's sampling
 * draws on the host with it, src/models/sampling.c). */
double em__philox_uniform_f64(uint64_t seed, uint64_t c);

#endif
