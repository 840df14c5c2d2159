/* The GPU op layer: the host side of Ember's GPU kernels (src/kernels/NAME.k), written once
 * for every GPU backend.
 *
 * gpu_run.c's switch runs every op call (layouts, kernel choice, launch geometry; the op
 * families in gpu_ops.c, gpu_ops_nd.c, gpu_optim.c, gpu_conv.c and gpu_attention.c, the fused ops by one
 * generic launch) on top of a small launcher (em_gpu below) that each GPU backend provides:
 * OpenCL in src/backends/opencl/, CUDA (NVRTC + driver API) in src/backends/cuda/. A
 * backend's supports and run pass their calls to em__gpu_supports / em__gpu_run; the
 * families find the launcher again through the tensors' backend (em__gpu_of). The same
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
#include "../../core/tensor_impl.h" /* the tensors of an op call */
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

/* The GPU op layer's two op entries, for a backend's `supports` and `run` (backend.h):
 * every op of the list whose GPU column is not GPU_NONE, on launcher g. A backend with ops
 * of its own (CUDA's cuDNN convolution, cuBLAS's float32-output GEMM) handles those in its
 * own switch and passes the rest here. f64 also needs a device with double precision;
 * without it the op fails with a clear error when launched. */
bool em__gpu_supports(const em_gpu *g, const em_op_call *call);
em_status em__gpu_run(const em_gpu *g, const em_op_call *call);

/* backend.h's MATMUL_WIDEN through the launcher's vendor GEMM only (CUDA: cuBLAS with a
 * float32 C); EM_ERR_NOT_SUPPORTED, nothing recorded, where it has none or it declines. */
em_status em__gpu_matmul_widen(em_tensor *out, const em_tensor *a, const em_tensor *b);
/* Matmul with a given launcher (benchmarks compare Ember's kernel with the vendor GEMM by
 * passing a copy whose gemm is NULL). */
em_status em__gpu_matmul_with(const em_gpu *g, em_tensor *out, const em_tensor *a,
                              const em_tensor *b);

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
