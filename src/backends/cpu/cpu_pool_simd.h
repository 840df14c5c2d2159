/* MaxPool2d(2) (kernel 2, stride 2, no padding, no dilation) on one f32 plane with AVX-512
 * (forward and backward) or AVX2 (forward), chosen at run time; cpu_conv.c falls back to its
 * scalar loops where these answer false. */
#ifndef EM_BACKENDS_CPU_POOL_SIMD_H
#define EM_BACKENDS_CPU_POOL_SIMD_H

#include <stdbool.h>
#include <stdint.h>

/* y (oh x ow) and ix (flat indices into the h x w plane x, PyTorch's: the first maximum of
 * each window in row-major order, NaN wins) from the windows of rows 0 .. 2 oh - 1 and
 * columns 0 .. 2 ow - 1 of x (row length w); false: not run (no AVX2, or turned off) */
bool em__cpu_max2x2_f32(const float *x, float *y, int64_t *ix, int64_t h, int64_t w, int64_t oh, int64_t ow);

/* gx (h x w, every element written) from gy (oh x ow) and the forward's indices ix; false:
 * not run (no AVX-512 or turned off, rows of under 8 outputs, or an index outside its own window: the caller
 * scatters instead) */
bool em__cpu_max2x2_backward_f32(float *gx, const float *gy, const int64_t *ix, int64_t h, int64_t w, int64_t oh,
                                 int64_t ow);

/* the instruction sets, in order */
enum { EM_POOL_SCALAR, EM_POOL_AVX2, EM_POOL_AVX512 };
/* tests: the highest set the kernels may use (EM_POOL_SCALAR: the scalar loops run); returns the
 * previous setting; the default is EM_POOL_AVX512 */
int em__cpu_pool_simd(int level);
/* the set the forward uses now: the setting, lowered to what this CPU has */
int em__cpu_pool_simd_active(void);

#endif
