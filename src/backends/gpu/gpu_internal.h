/* Helpers shared by the GPU op layer's files, and the op families that gpu_run.c's switch
 * runs (each finds its launcher through its output's backend, em__gpu_of). */
#ifndef EM_BACKENDS_GPU_GPU_INTERNAL_H
#define EM_BACKENDS_GPU_GPU_INTERNAL_H

#include "gpu.h"
#include "../../kernels/kernel_text.h"

/* the device index of a tensor, and its name for messages (valid within one expression) */
#define EM__DEV(t) ((t)->storage->device.index)
#define EM__DEVSTR(t) (em_device_str((t)->storage->device).s)

/* Launch a grid-stride kernel over n elements: EMK_BLOCK threads per block, at most as
 * many blocks per compute unit as are resident at once (launcher's resident_blocks, else 8). */
em_status em__gpu_launch_1d(const em_gpu *g, int dev, const char *kernel, int64_t n, int nargs,
                            const em_karg *args, const char *op);
/* A kernel argument of type emk_acc (double, or float on devices without fp64). */
em_karg em__gpu_acc_arg(const em_gpu *g, int dev, double v);
/* double -> int64 saturating, NaN -> 0 */
int64_t em__gpu_to_i64(double v);

/* The library kernels' dtypes for op (the op list's DTYPES column, with no integer
 * division kernel: core divides integers as floats). */
bool em__gpu_dtype_ok(em_op op, em_dtype dt);

/* the op families (gpu_ops.c: elementwise and rng; gpu_ops_nd.c: reductions, matmul,
 * softmax, index ops; gpu_optim.c: optimizer steps and loss scaling; gpu_conv.c) */
em_status em__gpu_fill(em_tensor *out, double value);
em_status em__gpu_fill_affine(em_tensor *out, double start, double step);
em_status em__gpu_copy(em_tensor *out, const em_tensor *in);
em_status em__gpu_unary(em_op op, em_tensor *out, const em_tensor *in, const double *params);
em_status em__gpu_binary(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_where(em_tensor *out, const em_tensor *cond, const em_tensor *a,
                        const em_tensor *b);
em_status em__gpu_rng(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset,
                      double p0, double p1);
em_status em__gpu_reduce(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce);
em_status em__gpu_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__gpu_softmax(em_tensor *out, const em_tensor *in, int dim, bool log);
/* CE_ROWS (softmax.k's ce_rows_f32): one block per row */
em_status em__gpu_ce_rows(em_tensor *loss, em_tensor *dz, const em_tensor *z, const em_tensor *target,
                          const em_tensor *valid, const em_tensor *rowscale, double smoothing);
em_status em__gpu_index_select(em_tensor *out, const em_tensor *in, int dim,
                               const em_tensor *index);
em_status em__gpu_index_add(em_tensor *out, int dim, const em_tensor *index,
                            const em_tensor *src);
em_status em__gpu_gather(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index);
em_status em__gpu_scatter_add(em_tensor *out, int dim, const em_tensor *index,
                              const em_tensor *src);
em_status em__gpu_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                            em_tensor *buf);
em_status em__gpu_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                             em_tensor *m, em_tensor *v, em_tensor *vmax);
/* fused attention (gpu_attention.c): whether the kernels take the call (f32/f16/bf16, head
 * dims up to EMK_ATT_DMAX; tensors absent: the dtype alone), and the two ops */
bool em__gpu_sdpa_takes(const em_op_call *c);
em_status em__gpu_sdpa(const em_op_call *c);
em_status em__gpu_sdpa_backward(const em_op_call *c);
/* ADAM_STEP_MULTI: EMK_MT_SLOTS parameters per launch */
em_status em__gpu_adam_multi(const em_adam_multi *mt);
em_status em__gpu_amp_unscale(em_tensor *grad, em_tensor *state);
em_status em__gpu_amp_update(em_tensor *state, double growth, double backoff, int64_t interval);
em_status em__gpu_im2col(em_tensor *cols, const em_tensor *in, const em_window2d *g);
em_status em__gpu_col2im(em_tensor *in, const em_tensor *cols, const em_window2d *g);
em_status em__gpu_pool2d(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                         const em_window2d *g);
em_status em__gpu_pool2d_backward(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                  const em_tensor *indices, const em_window2d *g);

#endif
