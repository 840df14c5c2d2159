/* The GPU kernel program text embedded at build time (src/kernels/embed.cmake) and the
 * names of the library's kernels. Shared by the OpenCL and CUDA backends. */
#ifndef EM_KERNELS_KERNEL_TEXT_H
#define EM_KERNELS_KERNEL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum em_kernel_dialect { EM_DIALECT_OPENCL, EM_DIALECT_CUDA } em_kernel_dialect;

/* A complete program for a device compiler, malloc'd (caller frees; NULL when out of
 * memory): "#define EMK_OPENCL 1" or "#define EMK_CUDA 1", EMK_HAS_F64 when has_f64,
 * then the prelude (compat.h, dtypes.h, layout.h), then either Ember's kernels
 * (user_source NULL) or user_source. */
char *em__kernel_program(em_kernel_dialect d, bool has_f64, const char *user_source);

/* 64-bit FNV-1a over bytes, continuing from h (start with EM_FNV_START). For cache keys. */
#define EM_FNV_START 0xcbf29ce484222325ull
uint64_t em__fnv1a(uint64_t h, const void *data, size_t n);

/* The element-type suffix used in kernel names ("f32", "bf16", "b8"), by em_dtype. */
const char *em__kernel_dtype_suffix(int dtype);

#endif
