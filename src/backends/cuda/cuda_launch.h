/* The CUDA launcher (cuda_launch.c) under the shared GPU op layer (src/backends/gpu/gpu.h):
 * NVRTC-compiled library kernels, cuBLAS for GEMM, users' kernels. The backend's supports
 * and run pass the ops it does not run itself to em__gpu_supports / em__gpu_run on it. */
#ifndef EM_BACKENDS_CUDA_LAUNCH_H
#define EM_BACKENDS_CUDA_LAUNCH_H

#include "../gpu/gpu.h"

extern const em_gpu em__cuda_gpu;

/* cuBLAS GEMM for the op layer; EM_ERR_NOT_SUPPORTED (nothing recorded) when cuBLAS is
 * missing or the dtype/sizes are not its, so the library kernel runs instead. */
em_status em__cuda_gemm(int dev, const em_gemm_args *g);
/* Destroy d's cuBLAS handle (its context current). */
struct em_cuda_device;
void em__cuda_gemm_release(struct em_cuda_device *d);

/* Users' kernels (cuda_custom.c): the launcher's compile / launch_compiled / release. */
void *em__cuda_uk_compile(int dev, const char *source, const char *name);
em_status em__cuda_uk_launch(void *handle, const size_t grid[3], const size_t block[3], int nargs,
                             const em_karg *args, const char *name);
void em__cuda_uk_release(void *handle);

#endif
