/* The one backend interface. Each backend (cpu/, opencl/, cuda/) fills one em_backend
 * table; core dispatches every op to the table of its tensors' device. GPU backends give a
 * launcher and take their op entries from the shared GPU op layer (gpu/). Adding a backend
 * touches one folder and the registry in src/core/device.c.
 *
 * Contract for op entry points (core guarantees these before calling):
 *  - every tensor is on this backend, on device index `out->storage->device.index`;
 *  - inputs already have out's shape (broadcast dims have stride 0), unless stated;
 *  - inputs of arithmetic ops already have the compute dtype (core casts first);
 *  - out does not overlap inputs unless it is exactly the same view (in-place ops);
 *  - numel may be 0 (do nothing); strides may be anything, including negative-free
 *    permutations and 0.
 * Ops are queued on the device's current stream and may return before they finish.
 * Return EM_OK, or record an error with em_error() and return its code. */
#ifndef EM_BACKENDS_BACKEND_H
#define EM_BACKENDS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <ember/device.h>
#include <ember/telemetry.h>
#include "../core/tensor_impl.h"
#include "../core/optim_args.h"
#include "../kernels/op_list.h"

/* The ops of the unary, binary and reduce entries, generated from the op list
 * (src/kernels/op_list.h, which also gives each op's params and dtypes): unary ops, then
 * binary (comparisons last: they write EM_BOOL), then reductions. */
#define EM_OP_ENUM_(NAME, name, dtypes) EM_OP_##NAME,
typedef enum em_op {
    EMK_OPS_ALL(EM_OP_ENUM_)
    EM_OP_COUNT
} em_op;
/* Backends bound their range checks by each list's first and last op (EM_OP_NEG..EM_OP_CLAMP,
 * EM_OP_ADD..EM_OP_LOGICAL_AND with the comparisons from EM_OP_EQ, EM_OP_SUM..EM_OP_ARGMIN),
 * and the unary ops from EM_OP_ADD_SCALAR on take params: a new op goes inside its list. */
#define EM_OP_ONE_(NAME, name, dtypes) +1
_Static_assert(EM_OP_NEG == 0 && EM_OP_CLAMP == -1 EMK_OPS_UNARY(EM_OP_ONE_),
               "op_list.h: NEG and CLAMP must stay the first and last unary ops");
_Static_assert(EM_OP_ADD == EM_OP_CLAMP + 1 && EM_OP_EQ == EM_OP_ADD EMK_OPS_BINARY(EM_OP_ONE_),
               "op_list.h: ADD must stay the first binary op, EQ the first comparison");
_Static_assert(EM_OP_LOGICAL_AND == EM_OP_EQ - 1 EMK_OPS_COMPARE(EM_OP_ONE_) &&
               EM_OP_SUM == EM_OP_LOGICAL_AND + 1 && EM_OP_ARGMIN == EM_OP_COUNT - 1,
               "op_list.h: LOGICAL_AND must stay the last comparison, SUM and ARGMIN the first "
               "and last reductions");

/* The dtypes a backend computes an op in (op_list.h's DTYPES column). */
typedef enum em_op_dtypes {
    EM_OPDT_FLOAT, EM_OPDT_NUMERIC, EM_OPDT_ANY, EM_OPDT_TRUEDIV
} em_op_dtypes;
#define EM_OP_DTYPES_(NAME, name, dtypes) case EM_OP_##NAME: return EM_OPDT_##dtypes;
static inline em_op_dtypes em__op_dtypes(em_op op) {
    switch (op) {
    EMK_OPS_ALL(EM_OP_DTYPES_)
    default: return EM_OPDT_ANY;
    }
}

typedef enum em_rng_kind {
    EM_RNG_UNIFORM,   /* [p0, p1) */
    EM_RNG_NORMAL,    /* mean p0, std p1 */
    EM_RNG_RANDINT,   /* integers in [p0, p1) */
    EM_RNG_BERNOULLI  /* 1 with probability p0, else 0 */
} em_rng_kind;

/* The scalar operands of the fused kernels, each later rounded to the compute type like
 * the op-by-op path's scalar arguments. */
enum {
    EM_OPT_WD,        /* weight decay added to the gradient (Adam, SGD) */
    EM_OPT_DECAY,     /* AdamW: 1 - lr * wd (1: none) */
    EM_OPT_B1, EM_OPT_OMB1, EM_OPT_B2, EM_OPT_OMB2, /* beta, 1 - beta */
    EM_OPT_SQRT_BC2,  /* sqrt(bias_correction2) */
    EM_OPT_EPS,
    EM_OPT_STEP,      /* Adam: -(lr / bias_correction1); SGD: -lr */
    EM_OPT_MOMENTUM,
    EM_OPT_OMD,       /* SGD: 1 - dampening */
    EM_OPT_NCONST
};
static inline void em__optim_consts(const em_optim_args *a, bool adam, double c[EM_OPT_NCONST]) {
    c[EM_OPT_WD] = adam && a->decoupled ? 0 : a->weight_decay;
    c[EM_OPT_DECAY] = adam && a->decoupled && a->weight_decay != 0 ? 1.0 - a->lr * a->weight_decay : 1;
    c[EM_OPT_B1] = a->beta1;
    c[EM_OPT_OMB1] = 1.0 - a->beta1;
    c[EM_OPT_B2] = a->beta2;
    c[EM_OPT_OMB2] = 1.0 - a->beta2;
    c[EM_OPT_SQRT_BC2] = adam ? sqrt(a->bias_correction2) : 1;
    c[EM_OPT_EPS] = a->eps;
    c[EM_OPT_STEP] = adam ? -(a->lr / a->bias_correction1) : -a->lr;
    c[EM_OPT_MOMENTUM] = a->momentum;
    c[EM_OPT_OMD] = 1.0 - a->dampening;
}

/* ---- convolution and pooling: one 2-d window geometry for im2col, col2im and the pools.
 * Every field is int64 so GPU kernels take it by value with the same layout (emk_win2d in
 * src/kernels/conv.k). Input [n, c, h, w], output [n, c or out channels, oh, ow]. */
typedef struct em_window2d {
    int64_t n, c, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t count_include_pad; /* avg pool: padded positions count in the divisor */
    int64_t divisor;           /* avg pool: divisor_override, or 0 */
} em_window2d;
typedef enum em_pool_kind { EM_POOL_MAX, EM_POOL_AVG, EM_POOL_ADAPTIVE_AVG } em_pool_kind;

typedef struct em_backend {
    const char *name;          /* "cpu", "opencl", "cuda" */
    em_device_type type;

    /* ---- devices ---- */
    /* Load libraries / enumerate once; later calls are cheap. Returns EM_ERR_UNAVAILABLE
     * (without recording an error) when the backend cannot run here; reason says why. */
    em_status (*init)(void);
    const char *(*unavailable_reason)(void);
    int (*device_count)(void);
    em_status (*device_props)(int index, em_device_props *out);
    /* Optional: every GPU the driver reports (em_device_telemetry_list's contract: fields it
     * cannot tell at -1, out[i].device.index -1 for a GPU Ember does not see). NULL: none. */
    int (*telemetry)(em_device_telemetry *out, int max, em_driver_info *info, const char **reason);
    /* Optional: one line naming the run-time libraries this backend chose and why
     * (em_device_type_libraries). NULL: nothing to say. */
    void (*libraries)(char *buf, size_t size);

    /* ---- raw memory (the caching allocator sits on top) ---- */
    em_status (*raw_alloc)(int index, size_t bytes, void **handle);
    void (*raw_free)(int index, void *handle);
    /* Optional: page-locked host memory for fast copies (NULL: plain malloc). */
    em_status (*host_alloc_pinned)(size_t bytes, void **ptr);
    void (*host_free_pinned)(void *ptr);

    /* ---- copies between host memory and a block (handle + byte offset) ---- */
    em_status (*copy_h2d)(int index, void *dst_handle, size_t dst_offset, const void *src,
                          size_t bytes, bool non_blocking);
    em_status (*copy_d2h)(int index, void *dst, const void *src_handle, size_t src_offset,
                          size_t bytes);
    /* Optional: same-backend copy, possibly across two devices (NULL: staged via host). */
    em_status (*copy_d2d)(int dst_index, void *dst_handle, size_t dst_offset, int src_index,
                          const void *src_handle, size_t src_offset, size_t bytes);
    em_status (*synchronize)(int index);

    /* ---- events (optional: NULL, and a waiter synchronizes the whole device) ----
     * event_record: a new event on device index's queue, after the work queued so far;
     * event_query: *done = whether that work has finished (an error in it is returned);
     * event_synchronize: wait for that work only; event_destroy: free the event (done
     * or not). An event may be waited on or destroyed from any thread. */
    em_status (*event_record)(int index, void **event);
    em_status (*event_query)(void *event, bool *done);
    em_status (*event_synchronize)(void *event);
    void (*event_destroy)(void *event);

    /* ---- ops ---- */
    /* GPU backends: the launcher under the shared GPU op layer (src/backends/gpu/gpu.h),
     * whose EM_GPU_OPS fills the op entries below; users' kernels use it too. NULL: none. */
    const struct em_gpu *gpu;
    /* Can this backend run op on dtype? Core gives a clear "not supported" error otherwise. */
    bool (*supports_op)(em_op op, em_dtype dt);
    em_status (*fill)(em_tensor *out, double value);
    /* out[i] = start + i * step, over out's elements in row-major order (arange, linspace). */
    em_status (*fill_affine)(em_tensor *out, double start, double step);
    /* out = in, any dtypes (a cast), same shape, any strides. */
    em_status (*copy)(em_tensor *out, const em_tensor *in);
    em_status (*unary)(em_op op, em_tensor *out, const em_tensor *in, const double *params);
    /* a and b have out's shape and the same dtype; out's dtype is that or EM_BOOL. */
    em_status (*binary)(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b);
    /* cond (EM_BOOL), a, b all have out's shape; a, b have out's dtype. */
    em_status (*where)(em_tensor *out, const em_tensor *cond, const em_tensor *a,
                       const em_tensor *b);
    /* out has in's ndim with size 1 on reduced dims (keepdim shape); reduce[d] says which.
     * SUM/MEAN/MAX/MIN: out dtype == in dtype. ARGMAX/ARGMIN: exactly one reduced dim, out EM_I64. */
    em_status (*reduce)(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce);
    /* Batched matmul: a [..., M, K], b [..., K, N], out [..., M, N]; the batch dims of all
     * three are equal (core expands them; batch strides may be 0); one dtype. */
    em_status (*matmul)(em_tensor *out, const em_tensor *a, const em_tensor *b);
    /* Optional: out += a @ b for 2-d floating (f32, f64, f16, bf16: the low ones accumulate
     * in f32 and round once) a [M, K], b [K, N] and a contiguous out [M, N] of their dtype (addmm: core fills out with the broadcast bias first). NULL: core runs
     * matmul and then add. */
    em_status (*matmul_acc)(em_tensor *out, const em_tensor *a, const em_tensor *b);
    /* Optional: out = a @ b + bias, bias contiguous [N] added to every row, the bias in the
     * GEMM's epilogue (no pass writing the bias rows for the GEMM to read back); a, b, out as
     * for matmul_acc. EM_ERR_NOT_SUPPORTED with nothing written or recorded: not for this
     * one (core fills out with the bias and calls matmul_acc). */
    em_status (*addmm_bias)(em_tensor *out, const em_tensor *bias, const em_tensor *a, const em_tensor *b);
    /* Optional: out (float32, 2-d, contiguous) = a @ b for 2-d bf16/f16 a, b, accumulated in
     * float32 and stored without rounding to the inputs' dtype (a float32 master weight's
     * gradient). NULL: core runs matmul in the low dtype and autograd casts the result. */
    em_status (*matmul_widen)(em_tensor *out, const em_tensor *a, const em_tensor *b);
    /* Softmax (or log-softmax) of in along dim; out has in's shape and dtype. */
    em_status (*softmax)(em_tensor *out, const em_tensor *in, int dim, bool log);
    /* out = in.index_select(dim, index): index is 1-d EM_I64 with values already checked
     * in range; out's shape is in's with shape[dim] = numel(index). */
    em_status (*index_select)(em_tensor *out, const em_tensor *in, int dim,
                              const em_tensor *index);
    /* out.index_add_(dim, index, src): out[..., index[i], ...] += src[..., i, ...]. */
    em_status (*index_add)(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src);
    /* out = in.gather(dim, index): index EM_I64 with out's shape, values checked in range. */
    em_status (*gather)(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index);
    /* out.scatter_add_(dim, index, src): index and src have the same shape. */
    em_status (*scatter_add)(em_tensor *out, int dim, const em_tensor *index,
                             const em_tensor *src);
    /* ---- norms, embedding, attention (optional: NULL, and core composes LayerNorm from ops) ----
     * LayerNorm over rows of n elements: x and out contiguous [rows, n], f32 or f64; w, b
     * contiguous [n] of x's dtype; mean and rstd contiguous [rows] of x's dtype receive each
     * row's mean and 1 / sqrt(var + eps) (var biased). */
    em_status (*layer_norm)(em_tensor *out, em_tensor *mean, em_tensor *rstd, const em_tensor *x,
                            const em_tensor *w, const em_tensor *b, int64_t n, double eps);
    /* Its backward from the same x, w and the output's gradient g (contiguous [rows, n]):
     * dx, and gxhat = g * xhat (for the weight's gradient), both contiguous [rows, n]. */
    em_status (*layer_norm_backward)(em_tensor *dx, em_tensor *gxhat, const em_tensor *g, const em_tensor *x,
                                     const em_tensor *w, int64_t n, double eps);
    /* GELU's (exact, erf) backward in one pass: dx = g * (Phi(x) + x * phi(x)); dx, g, x
     * contiguous, one shape, f32 or f64. */
    em_status (*gelu_backward)(em_tensor *dx, const em_tensor *g, const em_tensor *x);
    /* ---- ReLU's backward in one pass (the CNN's speed, issue 16; optional: NULL, and
     * autograd composes gt and where) ----
     * dx = g where y > 0, else 0 (y: ReLU's output; NaN gives 0); dx, g, y contiguous, one
     * shape, f32 or f64. */
    em_status (*relu_backward)(em_tensor *dx, const em_tensor *g, const em_tensor *y);

    /* ---- softmax's backward in one pass (optional: NULL, and autograd composes it) ----
     * Rows of n elements along the last dim; dx, g, y contiguous, one shape, f32 or f64; y is
     * the forward's output. softmax: dx = y * (g - sum(g * y)); log: dx = g - exp(y) * sum(g). */
    em_status (*softmax_backward)(em_tensor *dx, const em_tensor *g, const em_tensor *y, int64_t n, bool log);

    /* ---- fused attention (optional: NULL, and src/nn/attention.c composes matmul, softmax
     * and matmul) ----
     * out = softmax(scale q k^T) v per (batch, head), query i seeing only keys j <= i when
     * causal; q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev], out
     * [B, H, L, Ev]: f32, any strides with the last one 1, every size > 0; lse contiguous
     * [B, H, L] receives each query row's log-sum-exp of its visible scaled scores. */
    em_status (*sdpa)(em_tensor *out, em_tensor *lse, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                      double scale, bool causal);
    /* Its backward from the output's gradient g (out's shape, any strides with the last one 1),
     * the forward's operands, out and lse: dq, dk, dv of q's, k's and v's shapes (any strides,
     * the last one 1). */
    em_status (*sdpa_backward)(em_tensor *dq, em_tensor *dk, em_tensor *dv, const em_tensor *g, const em_tensor *q,
                               const em_tensor *k, const em_tensor *v, const em_tensor *out, const em_tensor *lse,
                               double scale, bool causal);
    /* Counter-based Philox 4x32-10: element i (row-major) of out uses counter offset + i
     * and key seed, so every backend produces the same numbers. See src/core/philox.h. */
    em_status (*rng)(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset,
                     double p0, double p1);

    /* ---- fused optimizer steps (optional: NULL, and optim falls back to the ops) ----
     * One pass over the elements; every tensor is contiguous, on this device, with p's
     * dtype (floating) and shape; g is only read. Tensors that a configuration does not
     * use are NULL (buf without momentum, vmax without amsgrad). Adam/AdamW: m = exp_avg,
     * v = exp_avg_sq, vmax = max_exp_avg_sq. */
    em_status (*fused_sgd)(const em_optim_args *a, em_tensor *p, const em_tensor *g,
                           em_tensor *buf);
    em_status (*fused_adam)(const em_optim_args *a, em_tensor *p, const em_tensor *g,
                            em_tensor *m, em_tensor *v, em_tensor *vmax);
    /* fused_adam honours a->lowp_out (float32 p): the mixed-precision weight copy (issue 14) */
    bool fused_adam_lowp;

    /* ---- loss scaling (optional: NULL, core unscales with ops; update needs it) ----
     * state: a contiguous float32 [4] {scale, growth tracker, found_inf, skipped steps}
     * (EM_AMP_*) on this device. Neither waits for the device.
     * amp_unscale: g (contiguous, floating) *= 1 / scale; found_inf = 1 if an element of g
     * was inf or NaN (torch._amp_foreach_non_finite_check_and_unscale_).
     * amp_update: torch._amp_update_scale_ plus the skipped count: on found_inf, scale *=
     * backoff, tracker = 0, skipped += 1; else tracker += 1 and, at interval, scale *= growth
     * (when finite) and tracker = 0; found_inf = 0 for the next iteration. */
    em_status (*amp_unscale)(em_tensor *g, em_tensor *state);
    em_status (*amp_update)(em_tensor *state, double growth, double backoff, int64_t interval);

    /* ---- convolution and pooling (src/core/ops_conv.c) ----
     * Tensors are contiguous NCHW with the window's shapes; f32, f64, f16 or bf16, one dtype
     * (f16/bf16 summed in float32).
     * im2col: cols [n, c * kh * kw, oh * ow] from in [n, c, h, w] (zero padding).
     * col2im: in [n, c, h, w] = the sum of cols' entries at each input position (written,
     * not accumulated). */
    em_status (*im2col)(em_tensor *cols, const em_tensor *in, const em_window2d *g);
    em_status (*col2im)(em_tensor *in, const em_tensor *cols, const em_window2d *g);
    /* Pools: out [n, c, oh, ow]; indices (EM_POOL_MAX only) int64 h * w + w in the plane.
     * pool2d_backward writes gin [n, c, h, w] from gout (and indices for max). */
    em_status (*pool2d)(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                        const em_window2d *g);
    em_status (*pool2d_backward)(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                 const em_tensor *indices, const em_window2d *g);
    /* Optional (NULL: core runs im2col + matmul): a convolution library's f32/f16/bf16 conv with
     * groups; bias may be NULL. Forward, backward to the input, backward to the weight.
     * EM_ERR_NOT_SUPPORTED with no error recorded: the library cannot run this one, and
     * core takes the portable path. */
    em_status (*conv2d)(em_tensor *out, const em_tensor *in, const em_tensor *w,
                        const em_tensor *bias, const em_window2d *g, int64_t groups);
    em_status (*conv2d_backward_input)(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                       const em_window2d *g, int64_t groups);
    em_status (*conv2d_backward_weight)(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                        const em_window2d *g, int64_t groups);
    /* Optional (the CNN's speed, issue 16; NULL: core sums the bias's gradient itself): the
     * backward to the weight that also gives the bias's gradient gbias [O] (gout summed over
     * N, H and W) from the same read of gout; otherwise as conv2d_backward_weight. */
    em_status (*conv2d_backward_weight_bias)(em_tensor *gw, em_tensor *gbias, const em_tensor *gout,
                                             const em_tensor *in, const em_window2d *g, int64_t groups);
} em_backend;

/* Host waits (src/core/device.c): every backend's synchronize, event_synchronize and copy to
 * the host counts one, so tests can prove that a loop never waits for its device (the
 * gradient scaler's step). A statistic only: nothing depends on it. */
void em__count_host_wait(void);
long em__host_wait_count(void);

/* The registry (src/core/device.c): the backend for a type, or NULL if not built in. */
const em_backend *em__backend_for(em_device_type t);
/* The backend for a device after checking it is available and the index exists;
 * records a clear error otherwise. */
const em_backend *em__backend_checked(em_device d, const char *op);

extern const em_backend em_cpu_backend;
extern const em_backend em_cuda_backend;   /* always built: it dlopens CUDA at run time */
#ifdef EMBER_HAVE_OPENCL
extern const em_backend em_opencl_backend;
#endif

#endif
