/* Ember's shared kernels on CUDA devices: programs, compile targets, launches. */
#ifndef EM_BACKENDS_CUDA_KERNELS_H
#define EM_BACKENDS_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <ember/error.h>

/* The kernel programs: one per src/kernels/NAME.k file (em__kernel_sources). */
int em__cuda_program_count(void);
/* Program i's complete CUDA text (malloc'ed; NULL if i is out of range) and its name. */
char *em__cuda_program_text(int i, const char **name);
/* The program that defines library kernel `kernel` ("unary_f32"), or -1. */
int em__cuda_program_of(const char *kernel);
/* Compile target for a device of compute capability cc (86 for 8.6), given the
 * architectures NVRTC supports: a CUBIN for cc itself when listed, else PTX for the newest
 * listed architecture below cc (arch 0 when there is none). */
void em__cuda_pick_target(int cc, const int *archs, int narchs, int *arch, bool *cubin);
/* Program name's compiled image for arch (a CUBIN when cubin, else PTX), through the disk
 * cache, with the options the backend loads it with (malloc'ed; NULL and an error when NVRTC
 * is missing or fails). em__cuda_load_module uses it, and so does a cache made in advance
 * for a GPU this machine lacks (test_cuda_kernels_compile with EMBER_CUDA_PREWARM_SM). */
char *em__cuda_program_image(const char *name, const char *text, int arch, bool cubin, size_t *size);
/* Compile program text (cached on disk) for device d's target and load it; the device's
 * context must be current. */
struct em_cuda_device;
#ifdef EMBER_HAVE_CUDA_HEADERS
#include <cuda.h>
em_status em__cuda_load_module(struct em_cuda_device *d, const char *name, const char *text,
                               CUmodule *out);
#endif
/* Launch library kernel `kernel` on cuda:dev with grid[i] blocks of block[i] threads and
 * cuLaunchKernel-style params (pointers to each argument's value). sizes[i] is the byte
 * size of argument i (NULL: unchecked): the first launch of each kernel compares them with
 * the compiled kernel's parameters (cuFuncGetParamInfo, where the driver has it), since
 * CUDA, unlike OpenCL, would otherwise read a wrongly sized argument silently. */
em_status em__cuda_launch(int dev, const char *kernel, const size_t grid[3], const size_t block[3],
                          void **params, const size_t *sizes, int nparams, const char *op);
/* Blocks of `block` threads of library kernel `kernel` that one SM of cuda:dev holds at once
 * (cuOccupancyMaxActiveBlocksPerMultiprocessor, asked once per kernel); 0 when the driver
 * cannot tell or the kernel cannot be loaded (the launch then reports why). */
int em__cuda_resident_blocks(int dev, const char *kernel, size_t block);

#endif
