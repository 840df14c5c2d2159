/* Ember's kernel dialect: one spelling for OpenCL C 1.2 and CUDA C (NVRTC).
 *
 * Kernels (the .k files here, and users' kernels: include/ember/kernel.h) are written
 * in a C subset with these macros; the program text starts with "#define EMK_OPENCL 1"
 * or "#define EMK_CUDA 1" and then this header (Blender Cycles' kernel/device/x/compat.h
 * and hashcat's inc_vendor.h work the same way). Rules that keep a kernel valid in both:
 *  - qualify buffer pointers with GLOBAL and local-memory pointers with LOCAL; declare
 *    local arrays at kernel scope with LOCAL_MEM;
 *  - helper functions are INLINE; kernels are KERNEL name(...);
 *  - use the fixed-width types below, casts between pointer types written out, no
 *    designated initializers, no C++-only or OpenCL-only syntax, overloaded math
 *    (exp, log, sqrt, ...) on float or double;
 *  - f16/bf16 live in memory as u16 bits and are computed in float (PoCL has no
 *    cl_khr_fp16): use LOAD_F16/STORE_F16 and the bf16 helpers in dtypes.h.
 * EMK_HAS_F64 is defined when the device has double precision. */
#ifndef EMK_COMPAT_H
#define EMK_COMPAT_H

#if defined(EMK_OPENCL)
/* ------------------------------------------------------------------ OpenCL C 1.2 */
#ifdef EMK_HAS_F64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable

#define KERNEL __kernel void
#define GLOBAL __global
#define LOCAL __local
#define LOCAL_MEM __local
#define CONSTANT __constant
#define INLINE static inline
#define RESTRICT restrict

typedef char i8;
typedef uchar u8;
typedef short i16;
typedef ushort u16;
typedef int i32;
typedef uint u32;
typedef long i64;
typedef ulong u64;
/* so that plain-C headers shared with the host (src/kernels/philox.h) compile unchanged */
typedef uchar uint8_t;
typedef ushort uint16_t;
typedef uint uint32_t;
typedef ulong uint64_t;
typedef int int32_t;
typedef long int64_t;

/* C99's float math names, so that plain-C code shared with the host compiles */
#define sqrtf sqrt
#define logf log
#define expf exp
#define sinf sin
#define cosf cos
#define tanhf tanh
#define fabsf fabs
#define powf pow
#define erff erf

/* thread and block indices; d is 0, 1 or 2 */
#define GLOBAL_ID(d) ((i64)get_global_id(d))
#define GLOBAL_SIZE(d) ((i64)get_global_size(d))
#define LOCAL_ID(d) ((i32)get_local_id(d))
#define LOCAL_SIZE(d) ((i32)get_local_size(d))
#define GROUP_ID(d) ((i64)get_group_id(d))
#define NUM_GROUPS(d) ((i64)get_num_groups(d))

/* wait for every thread of the block; local memory writes become visible */
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
/* the same, also ordering global memory written by the block */
#define BARRIER_GLOBAL() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)

/* bit casts */
#define AS_F32(u) as_float((u32)(u))
#define AS_U32(f) as_uint((float)(f))
#define AS_F64(u) as_double((u64)(u))
#define AS_U64(d) as_ulong((double)(d))
#define MULHI_U32(a, b) mul_hi((u32)(a), (u32)(b))

/* atomics on global memory; each returns the old value */
#define ATOMIC_ADD_I32(p, v) atomic_add((volatile GLOBAL i32 *)(p), (i32)(v))
#define ATOMIC_ADD_U32(p, v) atomic_add((volatile GLOBAL u32 *)(p), (u32)(v))
#define ATOMIC_CAS_U32(p, cmp, v) atomic_cmpxchg((volatile GLOBAL u32 *)(p), (u32)(cmp), (u32)(v))
#define ATOMIC_CAS_U64(p, cmp, v) atom_cmpxchg((volatile GLOBAL u64 *)(p), (u64)(cmp), (u64)(v))
#define ATOMIC_ADD_I64(p, v) atom_add((volatile GLOBAL i64 *)(p), (i64)(v))

/* IEEE half in memory <-> float (round to nearest even), without cl_khr_fp16 */
#define LOAD_F16(p, i) vload_half(0, (GLOBAL const half *)((p) + (i)))
#define STORE_F16(p, i, f) vstore_half_rte((float)(f), 0, (GLOBAL half *)((p) + (i)))

#elif defined(EMK_CUDA)
/* ------------------------------------------------------------------ CUDA C (NVRTC) */
#define KERNEL extern "C" __global__ void
#define GLOBAL
#define LOCAL
#define LOCAL_MEM __shared__
#define CONSTANT const
#define INLINE static __device__ __forceinline__
#define RESTRICT __restrict__

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;

INLINE u32 emk__dim_pick(uint3 v, int d) { return d == 0 ? v.x : (d == 1 ? v.y : v.z); }
INLINE u32 emk__dim_pick3(dim3 v, int d) { return d == 0 ? v.x : (d == 1 ? v.y : v.z); }
#define LOCAL_ID(d) ((i32)emk__dim_pick(threadIdx, (d)))
#define LOCAL_SIZE(d) ((i32)emk__dim_pick3(blockDim, (d)))
#define GROUP_ID(d) ((i64)emk__dim_pick(blockIdx, (d)))
#define NUM_GROUPS(d) ((i64)emk__dim_pick3(gridDim, (d)))
#define GLOBAL_ID(d) (GROUP_ID(d) * LOCAL_SIZE(d) + LOCAL_ID(d))
#define GLOBAL_SIZE(d) (NUM_GROUPS(d) * LOCAL_SIZE(d))

#define BARRIER() __syncthreads()
#define BARRIER_GLOBAL() __syncthreads()

#define AS_F32(u) __uint_as_float((u32)(u))
#define AS_U32(f) __float_as_uint((float)(f))
#define AS_F64(u) __longlong_as_double((long long)(u64)(u))
#define AS_U64(d) ((u64)__double_as_longlong((double)(d)))
#define MULHI_U32(a, b) __umulhi((u32)(a), (u32)(b))

#define ATOMIC_ADD_I32(p, v) atomicAdd((int *)(p), (int)(v))
#define ATOMIC_ADD_U32(p, v) atomicAdd((unsigned int *)(p), (unsigned int)(v))
#define ATOMIC_CAS_U32(p, cmp, v) atomicCAS((unsigned int *)(p), (unsigned int)(cmp), (unsigned int)(v))
#define ATOMIC_CAS_U64(p, cmp, v) \
    atomicCAS((unsigned long long *)(p), (unsigned long long)(cmp), (unsigned long long)(v))
#define ATOMIC_ADD_I64(p, v) \
    ((i64)atomicAdd((unsigned long long *)(p), (unsigned long long)(i64)(v)))

INLINE float emk__h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
INLINE u16 emk__f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#define LOAD_F16(p, i) emk__h2f((p)[i])
#define STORE_F16(p, i, f) ((p)[i] = emk__f2h((float)(f)))

#else
#error "define EMK_OPENCL or EMK_CUDA before including compat.h"
#endif

/* ------------------------------------------------------------------ both dialects */
#ifdef EMK_OPENCL
#define EMK_U64C(x) ((u64)x##ul)
#else
#define EMK_U64C(x) ((u64)x##ull)
#endif
/* src/kernels/philox.h's functions become device functions */
#define EM_PHILOX_FN INLINE

/* a multiply or add that is never fused into an FMA (results bit-equal to the host's):
 * OpenCL's clang fuses only within one expression, CUDA fuses across statements */
#ifdef EMK_CUDA
#define emk_mulf(a, b) __fmul_rn((a), (b))
#define emk_addf(a, b) __fadd_rn((a), (b))
#define emk_muld(a, b) __dmul_rn((a), (b))
#define emk_addd(a, b) __dadd_rn((a), (b))
#else
INLINE float emk_mulf(float a, float b) { return a * b; }
INLINE float emk_addf(float a, float b) { return a + b; }
#ifdef EMK_HAS_F64
INLINE double emk_muld(double a, double b) { return a * b; }
INLINE double emk_addd(double a, double b) { return a + b; }
#endif
#endif

/* unroll the next loop (a fixed trip count): per-thread arrays it indexes then live in
 * registers, not in a stack frame; usable inside macros */
#ifdef EMK_CUDA
#define EMK_UNROLL _Pragma("unroll")
#else
#define EMK_UNROLL
#endif

#define EMK_I64_MAX ((i64)EMK_U64C(0x7fffffffffffffff))
#define EMK_I64_MIN (-EMK_I64_MAX - 1)
#define EMK_F32_INF AS_F32(0x7f800000u)

/* float atomic add by compare-and-swap (returns the old value) */
INLINE float emk_atomic_add_f32(GLOBAL float *p, float v) {
    u32 old = AS_U32(*p), assumed;
    do {
        assumed = old;
        old = ATOMIC_CAS_U32(p, assumed, AS_U32(AS_F32(assumed) + v));
    } while (old != assumed);
    return AS_F32(old);
}
#ifdef EMK_HAS_F64
INLINE double emk_atomic_add_f64(GLOBAL double *p, double v) {
    u64 old = AS_U64(*p), assumed;
    do {
        assumed = old;
        old = ATOMIC_CAS_U64(p, assumed, AS_U64(AS_F64(assumed) + v));
    } while (old != assumed);
    return AS_F64(old);
}
#endif

#endif
