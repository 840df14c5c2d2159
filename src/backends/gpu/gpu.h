/* The GPU op layer: the host side of Ember's GPU kernels (src/kernels/NAME.k), written once
 * for every GPU backend.
 *
 * gpu_ops.c, gpu_ops_nd.c and gpu_optim.c implement the backend.h op entry points (layouts,
 * kernel choice, launch geometry) on top of a small launcher (em_gpu below) that each GPU
 * backend provides: OpenCL in src/backends/opencl/, CUDA (NVRTC + driver API) in
 * src/backends/cuda/. A backend fills its table's op entries with EM_GPU_OPS(&launcher);
 * the entries find the launcher again through the tensors' backend (em__gpu_of). The same
 * launcher compiles and runs users' kernels (custom.c, include/ember/kernel.h).
 *
 * Kernel arguments are typed values; a buffer is the block's base handle (cl_mem or
 * CUdeviceptr) and the element offset of a view travels inside its emk_strides. */
#ifndef EM_BACKENDS_GPU_GPU_H
#define EM_BACKENDS_GPU_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../backend.h"
#include "../../kernels/layout.h"

typedef enum em_karg_kind {
    EM_KARG_BUF,   /* a device buffer handle (v.buf) */
    EM_KARG_I32,
    EM_KARG_I64,   /* also u64 */
    EM_KARG_F32,
    EM_KARG_F64,
    EM_KARG_BYTES, /* a struct by value: v.bytes.p, v.bytes.size */
    EM_KARG_PTR    /* a pointer to byte v.ptr.offset of buffer v.ptr.handle (users' kernels) */
} em_karg_kind;

typedef struct em_karg {
    em_karg_kind kind;
    union {
        void *buf;
        int32_t i32;
        int64_t i64;
        float f32;
        double f64;
        struct { const void *p; size_t size; } bytes;
        struct { void *handle; size_t offset; } ptr;
    } v;
} em_karg;

#define EM_KBUF(h) ((em_karg){.kind = EM_KARG_BUF, .v.buf = (h)})
#define EM_KI32(x) ((em_karg){.kind = EM_KARG_I32, .v.i32 = (int32_t)(x)})
#define EM_KI64(x) ((em_karg){.kind = EM_KARG_I64, .v.i64 = (int64_t)(x)})
#define EM_KF32(x) ((em_karg){.kind = EM_KARG_F32, .v.f32 = (float)(x)})
#define EM_KF64(x) ((em_karg){.kind = EM_KARG_F64, .v.f64 = (double)(x)})
#define EM_KSTRUCT(s) ((em_karg){.kind = EM_KARG_BYTES, .v.bytes = {&(s), sizeof(s)}})

typedef struct em_gpu_info {
    int compute_units;
    bool has_f64;
    size_t max_block;   /* most threads per block */
    bool is_cpu;        /* a CPU device (PoCL): kernels written with vector types pay off */
} em_gpu_info;

/* Operands of a GEMM fast path: out[b] = a[b] @ b[b], each 2-d slice row-major with
 * leading dimension ld (or column-major: trans), batches at a fixed element stride. */
typedef struct em_gemm_args {
    em_dtype dtype;
    int64_t m, n, k, batch;
    void *a, *b, *c;               /* buffer handles */
    int64_t a_off, b_off, c_off;   /* elements, first batch */
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c; /* elements between batches */
    bool trans_a, trans_b;
    bool accumulate;               /* C += A B (beta = 1): addmm into the bias */
    bool c_f32;                    /* C is float32 while A, B are dtype (f16/bf16): no rounding */
} em_gemm_args;

typedef struct em_gpu {
    const char *name;  /* "opencl", "cuda" */
    /* Launch library kernel `kernel` (e.g. "unary_f32") on device dev: grid[i] blocks of
     * block[i] threads. `op` names the user-facing op in error messages. */
    em_status (*launch)(int dev, const char *kernel, const size_t grid[3], const size_t block[3],
                        int nargs, const em_karg *args, const char *op);
    void (*info)(int dev, em_gpu_info *out);
    /* Optional: how many blocks of `block` threads of library kernel `kernel` one compute
     * unit holds at once, given the kernel's registers and shared memory (CUDA's occupancy
     * calculator); 0 when unknown. Records no error. */
    int (*resident_blocks)(int dev, const char *kernel, size_t block);
    /* Optional vendor GEMM (CLBlast, cuBLAS); EM_ERR_NOT_SUPPORTED (no error recorded) falls
     * back to Ember's kernel. */
    em_status (*gemm)(int dev, const em_gemm_args *g);

    /* ---- users' kernels (custom.c) ---- */
    /* Compile kernel `name` of the program text (prelude + user source, see
     * em__kernel_program) for device index dev: an opaque handle, or NULL with an error. */
    void *(*compile)(int dev, const char *source, const char *name);
    /* Queue it: grid[i] blocks of block[i] threads. Tensor arguments arrive as EM_KARG_PTR. */
    em_status (*launch_compiled)(void *handle, const size_t grid[3], const size_t block[3],
                                 int nargs, const em_karg *args, const char *name);
    void (*release)(void *handle);
} em_gpu;

/* The launcher of the backend that holds t's storage (NULL for a backend without one). */
static inline const em_gpu *em__gpu_of(const em_tensor *t) {
    return t->storage->backend->gpu;
}

/* Which ops the library kernels implement (backend supports_op). f64 also needs a device
 * with double precision; without it the op fails with a clear error when launched. */
bool em__gpu_supports_op(em_op op, em_dtype dt);

/* The backend.h op entry points, shared by every backend whose table names a launcher: each
 * finds the launcher through its output tensor's backend (em__gpu_of). */
em_status em__gpu_fill(em_tensor *out, double value);
em_status em__gpu_fill_affine(em_tensor *out, double start, double step);
em_status em__gpu_copy(em_tensor *out, const em_tensor *in);
em_status em__gpu_unary(em_op op, em_tensor *out, const em_tensor *in, const double *params);
em_status em__gpu_binary(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_where(em_tensor *out, const em_tensor *cond, const em_tensor *a,
                        const em_tensor *b);
em_status em__gpu_reduce(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce);
em_status em__gpu_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b);
/* backend.h's matmul_widen through the launcher's vendor GEMM only (CUDA: cuBLAS with a
 * float32 C); EM_ERR_NOT_SUPPORTED, nothing recorded, where it has none or it declines. */
em_status em__gpu_matmul_widen(em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_softmax(em_tensor *out, const em_tensor *in, int dim, bool log);
em_status em__gpu_index_select(em_tensor *out, const em_tensor *in, int dim,
                               const em_tensor *index);
em_status em__gpu_index_add(em_tensor *out, int dim, const em_tensor *index,
                            const em_tensor *src);
em_status em__gpu_gather(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index);
em_status em__gpu_scatter_add(em_tensor *out, int dim, const em_tensor *index,
                              const em_tensor *src);
em_status em__gpu_rng(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset,
                      double p0, double p1);
/* Fused optimizer steps (gpu_optim.c, kernels in optim.k). */
em_status em__gpu_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                            em_tensor *buf);
em_status em__gpu_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                             em_tensor *m, em_tensor *v, em_tensor *vmax);
/* Loss scaling (gpu_optim.c, kernels in optim.k). */
em_status em__gpu_amp_unscale(em_tensor *grad, em_tensor *state);
em_status em__gpu_amp_update(em_tensor *state, double growth, double backoff, int64_t interval);

/* Convolution and pooling (gpu_conv.c, kernels in conv.k). */
em_status em__gpu_im2col(em_tensor *cols, const em_tensor *in, const em_window2d *g);
em_status em__gpu_col2im(em_tensor *in, const em_tensor *cols, const em_window2d *g);
em_status em__gpu_pool2d(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                         const em_window2d *g);
em_status em__gpu_pool2d_backward(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                  const em_tensor *indices, const em_window2d *g);

/* norms, embedding, attention: LayerNorm (gpu_norm.c, kernels in norm.k). */
em_status em__gpu_layer_norm(em_tensor *out, em_tensor *mean, em_tensor *rstd, const em_tensor *x,
                             const em_tensor *w, const em_tensor *b, int64_t n, double eps);
em_status em__gpu_layer_norm_backward(em_tensor *dx, em_tensor *gxhat, const em_tensor *g, const em_tensor *x,
                                      const em_tensor *w, int64_t n, double eps);
em_status em__gpu_gelu_backward(em_tensor *dx, const em_tensor *g, const em_tensor *x);

/* Matmul with a given launcher (benchmarks compare Ember's kernel with the vendor GEMM by
 * passing a copy whose gemm is NULL). */
em_status em__gpu_matmul_with(const em_gpu *g, em_tensor *out, const em_tensor *a,
                              const em_tensor *b);

/* The op entries of a backend table, written once for every GPU backend: a backend's table
 * is its device plumbing plus EM_GPU_OPS(&its_launcher). A new op slot in backend.h gets
 * its one line here. */
#define EM_GPU_OPS(launcher)                                                                  \
    .gpu = (launcher), .supports_op = em__gpu_supports_op, .fill = em__gpu_fill,              \
    .fill_affine = em__gpu_fill_affine, .copy = em__gpu_copy, .unary = em__gpu_unary,         \
    .binary = em__gpu_binary, .where = em__gpu_where, .reduce = em__gpu_reduce,               \
    .matmul = em__gpu_matmul, .matmul_acc = em__gpu_matmul_acc, .softmax = em__gpu_softmax,  \
    .index_select = em__gpu_index_select,                                                     \
    .index_add = em__gpu_index_add, .gather = em__gpu_gather, .scatter_add = em__gpu_scatter_add, \
    .rng = em__gpu_rng, .fused_sgd = em__gpu_fused_sgd, .fused_adam = em__gpu_fused_adam,      \
    .amp_unscale = em__gpu_amp_unscale, .amp_update = em__gpu_amp_update,                      \
    /* convolution and pooling */                                                            \
    .im2col = em__gpu_im2col, .col2im = em__gpu_col2im, .pool2d = em__gpu_pool2d,             \
    .pool2d_backward = em__gpu_pool2d_backward,                     \
    /* norms, embedding, attention */                                                        \
    .layer_norm = em__gpu_layer_norm, .layer_norm_backward = em__gpu_layer_norm_backward,    \
    .gelu_backward = em__gpu_gelu_backward

/* ---- layout helpers (gpu_layout.c), also used by backends' own fast paths ---- */
/* Element offset of t's first element from its block's buffer handle; EM_ERR_INTERNAL
 * (recorded) if the block offset is not a multiple of the element size. */
em_status em__gpu_elem_offset(const em_tensor *t, int64_t *out);
/* Collapse n tensors sharing `shape` (ndim dims) into the fewest dims: size-1 dims dropped,
 * neighbours merged where every tensor is contiguous across them. strides[i] are the
 * tensors' element strides, offs[i] their element offsets. */
void em__gpu_collapse(int ndim, const int64_t *shape, int n, const int64_t *const *strides,
                      const int64_t *offs, emk_shape *sh, emk_strides *st);
/* Uncollapsed layout of one tensor (for kernels that need a particular dim). */
void em__gpu_layout(const em_tensor *t, int64_t off, emk_shape *sh, emk_strides *st);

#endif /* EM_BACKENDS_GPU_GPU_H */
