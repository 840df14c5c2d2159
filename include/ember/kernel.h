/* Custom GPU kernels: write a kernel once in Ember's kernel dialect, compile it at run time
 * for a GPU-type device (OpenCL now, CUDA through the same call), and launch it CUDA-style
 * with a grid of blocks of threads, the seed's VecAdd<<<blocks, threads>>>(A, B, C):
 *
 *   static const char *src =
 *       "KERNEL vecadd(GLOBAL const float *a, GLOBAL const float *b, GLOBAL float *c, int n) {\n"
 *       "    i64 i = GLOBAL_ID(0);\n"
 *       "    if (i < n) c[i] = a[i] + b[i];\n"
 *       "}\n";
 *   em_kernel *k = em_kernel_compile(src, "vecadd", dev);
 *   em_kernel_launch(k, EM_DIM3((n + 255) / 256), EM_DIM3(256),
 *                    EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(n)));
 *   em_kernel_free(k);
 *
 * The dialect (src/kernels/compat.h) is a C subset with: KERNEL, GLOBAL (buffer pointers),
 * LOCAL / LOCAL_MEM (block-shared memory), INLINE (helpers), GLOBAL_ID(d), LOCAL_ID(d),
 * GROUP_ID(d), LOCAL_SIZE(d), NUM_GROUPS(d), GLOBAL_SIZE(d), BARRIER(), atomics
 * (ATOMIC_ADD_I32, ATOMIC_CAS_U32, ...), and the types i8..i64, u8..u64, float, double
 * (when the device has it). Kernel parameters are pointers (for tensors), int, long long
 * (i64), float or double, in the order of the launch's arguments.
 * A launch is queued like any op: it returns before the kernel finishes; reading a tensor
 * to the host or em_device_synchronize() waits. Ember cannot see what a kernel writes, so
 * tensors it modifies are not version-checked by autograd. */
#ifndef EMBER_KERNEL_H
#define EMBER_KERNEL_H

#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_kernel em_kernel; /* a compiled user kernel for one device */

/* Launch geometry: EM_DIM3(64) is {64, 1, 1}, EM_DIM3(8, 8) is {8, 8, 1}; a 0 means 1. */
typedef struct em_dim3 { uint32_t x, y, z; /* extent along x, y and z */ } em_dim3;
#define EM_DIM3(...) EM__DIM3_(EM__NARGS(__VA_ARGS__), __VA_ARGS__) /* 1 to 3 extents */
#define EM__DIM3_(n, ...) EM__DIM3__(n, __VA_ARGS__)
#define EM__DIM3__(n, ...) EM__DIM3_##n(__VA_ARGS__)
#define EM__DIM3_1(x) ((em_dim3){(uint32_t)(x), 1, 1})
#define EM__DIM3_2(x, y) ((em_dim3){(uint32_t)(x), (uint32_t)(y), 1})
#define EM__DIM3_3(x, y, z) ((em_dim3){(uint32_t)(x), (uint32_t)(y), (uint32_t)(z)})

/* The kind of one kernel argument. */
typedef enum em_kernel_arg_kind {
    EM_ARG_TENSOR, /* a contiguous tensor on the kernel's device: a GLOBAL T * parameter */
    EM_ARG_I32,    /* int */
    EM_ARG_I64,    /* long */
    EM_ARG_F32,    /* float */
    EM_ARG_F64     /* double (devices without doubles refuse it) */
} em_kernel_arg_kind;

/* One kernel argument: make it with em_arg_tensor, em_arg_i32... */
typedef struct em_kernel_arg {
    em_kernel_arg_kind kind; /* which member of v */
    union { em_tensor *tensor; int32_t i32; int64_t i64; float f32; double f64; } v; /* the value */
} em_kernel_arg;

/* A tensor argument (borrowed for the launch). */
static inline em_kernel_arg em_arg_tensor(em_tensor *t) {
    em_kernel_arg a = {EM_ARG_TENSOR, {.tensor = t}};
    return a;
}
static inline em_kernel_arg em_arg_i32(int32_t x) { em_kernel_arg a = {EM_ARG_I32, {.i32 = x}}; return a; } /* an int */
static inline em_kernel_arg em_arg_i64(int64_t x) { em_kernel_arg a = {EM_ARG_I64, {.i64 = x}}; return a; } /* a long */
static inline em_kernel_arg em_arg_f32(float x) { em_kernel_arg a = {EM_ARG_F32, {.f32 = x}}; return a; } /* a float */
static inline em_kernel_arg em_arg_f64(double x) { em_kernel_arg a = {EM_ARG_F64, {.f64 = x}}; return a; } /* a double */

/* The count and array of a literal argument list: EM_KARGS(em_arg_tensor(a), em_arg_i32(n)). */
#define EM_KARGS(...)                                                        \
    (int)(sizeof((em_kernel_arg[]){__VA_ARGS__}) / sizeof(em_kernel_arg)),   \
        ((const em_kernel_arg[]){__VA_ARGS__})

/* Compile kernel `name` from source for device (a GPU-type device: opencl:N, cuda:N).
 * A compile error is EM_ERR_BACKEND with the compiler's log in the message; the CPU is
 * EM_ERR_NOT_SUPPORTED. Compiled programs are cached on disk like Ember's own kernels. */
EM_API em_kernel *em_kernel_compile(const char *source, const char *name, em_device device);
/* Queue the kernel on its device with grid blocks of block threads each. Tensor arguments
 * must be contiguous and on the kernel's device. */
EM_API em_status em_kernel_launch(em_kernel *k, em_dim3 grid, em_dim3 block, int nargs,
                           const em_kernel_arg *args);
/* The device a kernel was compiled for. */
EM_API em_device em_kernel_device(const em_kernel *k);
/* Release a kernel (NULL is ignored). Launches already queued still run. */
EM_API void em_kernel_free(em_kernel *k);

#ifdef __cplusplus
}
#endif
#endif
