/* The op entries of the CUDA backend's table (filled in by cuda_ops.c). */
#ifndef EM_BACKENDS_CUDA_OPS_H
#define EM_BACKENDS_CUDA_OPS_H

#define EM_CUDA_OPS_ENTRIES

#endif
