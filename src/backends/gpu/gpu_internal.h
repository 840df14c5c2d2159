/* Helpers shared by the GPU op layer's files (gpu_ops.c, gpu_ops_nd.c, gpu_optim.c). */
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

#endif
