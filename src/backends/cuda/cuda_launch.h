/* The CUDA backend's ops: the shared GPU op layer (src/kernels/gpu.h) over the CUDA
 * launcher (NVRTC-compiled library kernels) and cuBLAS for GEMM. */
#ifndef EM_BACKENDS_CUDA_OPS_H
#define EM_BACKENDS_CUDA_OPS_H

#include "../../kernels/gpu.h"

extern const em_gpu em__cuda_gpu;

/* cuBLAS GEMM for the op layer; EM_ERR_NOT_SUPPORTED (nothing recorded) when cuBLAS is
 * missing or the dtype/sizes are not its, so the library kernel runs instead. */
em_status em__cuda_gemm(int dev, const em_gemm_args *g);
/* Destroy d's cuBLAS handle (its context current). */
struct em_cuda_device;
void em__cuda_gemm_release(struct em_cuda_device *d);

em_status em__cuda_op_fill(em_tensor *o, double v);
em_status em__cuda_op_affine(em_tensor *o, double start, double step);
em_status em__cuda_op_copy(em_tensor *o, const em_tensor *i);
em_status em__cuda_op_unary(em_op op, em_tensor *o, const em_tensor *i, const double *p);
em_status em__cuda_op_binary(em_op op, em_tensor *o, const em_tensor *a, const em_tensor *b);
em_status em__cuda_op_where(em_tensor *o, const em_tensor *c, const em_tensor *a, const em_tensor *b);
em_status em__cuda_op_reduce(em_op op, em_tensor *o, const em_tensor *i, const bool *r);
em_status em__cuda_op_matmul(em_tensor *o, const em_tensor *a, const em_tensor *b);
em_status em__cuda_op_softmax(em_tensor *o, const em_tensor *i, int dim, bool log);
em_status em__cuda_op_index_select(em_tensor *o, const em_tensor *i, int dim, const em_tensor *x);
em_status em__cuda_op_index_add(em_tensor *o, int dim, const em_tensor *x, const em_tensor *s);
em_status em__cuda_op_gather(em_tensor *o, const em_tensor *i, int dim, const em_tensor *x);
em_status em__cuda_op_scatter_add(em_tensor *o, int dim, const em_tensor *x, const em_tensor *s);
em_status em__cuda_op_rng(em_tensor *o, em_rng_kind k, uint64_t seed, uint64_t offset, double p0,
                          double p1);
em_status em__cuda_op_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *b);
em_status em__cuda_op_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                                 em_tensor *v, em_tensor *vmax);

/* Users' kernels (cuda_custom.c), for em__cuda_kernel_backend (src/kernels/custom.h). */
void *em__cuda_uk_compile(int dev, const char *source, const char *name);
em_status em__cuda_uk_launch(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                             const em_karg *args, const char *name);
void em__cuda_uk_release(void *handle);

#define EM_CUDA_OPS_ENTRIES                                                                \
    .supports_op = em__gpu_supports_op, .fill = em__cuda_op_fill,                          \
    .fill_affine = em__cuda_op_affine, .copy = em__cuda_op_copy, .unary = em__cuda_op_unary, \
    .binary = em__cuda_op_binary, .where = em__cuda_op_where, .reduce = em__cuda_op_reduce, \
    .matmul = em__cuda_op_matmul, .softmax = em__cuda_op_softmax,                          \
    .index_select = em__cuda_op_index_select, .index_add = em__cuda_op_index_add,          \
    .gather = em__cuda_op_gather, .scatter_add = em__cuda_op_scatter_add, .rng = em__cuda_op_rng,   \
    .fused_sgd = em__cuda_op_fused_sgd, .fused_adam = em__cuda_op_fused_adam,

#endif
