/* Tensor layouts as kernels receive them, shared by host code (plain C) and kernels.
 *
 * A kernel gets a buffer pointer per tensor plus an emk_strides whose `offset` is the
 * element offset of the view's first element from that pointer (block offset + tensor
 * offset), and one emk_shape for the index space. The host drops size-1 dims and merges
 * dims that are contiguous for every tensor, so a contiguous op arrives as ndim == 1 and
 * stride 1 and costs no division per element. Every field is 64-bit so that the struct
 * layout is the same on the host, in OpenCL C and in CUDA C.
 *
 * Kernel op codes (EMK_U_*, EMK_B_*, EMK_R_*) are also defined here, from the op list
 * (op_list.h, which the embedding puts before this file): the host maps em_op onto them,
 * so kernels do not depend on the backend interface. */
#ifndef EMK_LAYOUT_H
#define EMK_LAYOUT_H

#include "op_list.h"

#if !defined(EMK_OPENCL) && !defined(EMK_CUDA)
#include <stdint.h>
#define EMK_I64 int64_t
#else
#define EMK_I64 i64
#endif

#define EMK_MAX_DIMS 8
/* threads per block used by library kernels (fixed, so PoCL compiles each kernel once) */
#define EMK_BLOCK 256
/* matmul tile: EMK_MM_TILE x EMK_MM_TILE outputs per block, EMK_MM_WPT per thread */
#define EMK_MM_TILE 32
#define EMK_MM_WPT 4
#define EMK_MM_TK 16

typedef struct emk_shape {
    EMK_I64 ndim;
    EMK_I64 numel;
    EMK_I64 size[EMK_MAX_DIMS];
} emk_shape;

typedef struct emk_strides {
    EMK_I64 offset; /* elements from the buffer pointer to the view's first element */
    EMK_I64 s[EMK_MAX_DIMS];
} emk_strides;

/* The params of a fused op's kernel (op_list.h's GPU_ELEMS and GPU_ROWS ops), after its
 * buffers: the work items, each tensor's element offset from its buffer (the outputs', then
 * the inputs'), and the call's integer and float params. A float param arrives rounded to
 * float32 in f and whole, as float64 bits, in fd: read it with EMK_PF_<dtype>(c, k). */
#define EMK_CALL_TENSORS 10
#define EMK_CALL_PARAMS 8
typedef struct emk_call {
    EMK_I64 items;
    EMK_I64 off[EMK_CALL_TENSORS];
    EMK_I64 i[EMK_CALL_PARAMS];
    EMK_I64 fd[EMK_CALL_PARAMS];
    float f[EMK_CALL_PARAMS];
} emk_call;
#define EMK_PF_f32(c, k) ((c).f[k])
#define EMK_PF_f16(c, k) ((c).f[k])
#define EMK_PF_bf16(c, k) ((c).f[k])
#define EMK_PF_f64(c, k) AS_F64((c).fd[k])

/* The fused attention's kernels (attention.k, launched by src/backends/gpu/gpu_attention.c):
 * the problem's sizes, and each operand's element offset from its buffer and its batch, head
 * and row strides (the last stride is 1). Query heads h of one key/value head hk = h / G
 * (G = Hq / Hkv) are taken together: the group's G * L query rows, row rho being query
 * i = rho % L of head hk * G + rho / L, so a key/value tile read into local memory serves
 * every head that shares it. */
#define EMK_ATT_THREADS 128 /* threads per work-group of every attention kernel */
#define EMK_ATT_DMAX 128    /* the largest head dim (E and Ev) the kernels take */
#define EMK_ATT_ROWS 16     /* query rows per forward work-group (and per split decode) */
typedef struct emk_attn {
    EMK_I64 B, Hq, Hkv, L, S, E, Ev;
    EMK_I64 past, causal, has_mask;
    EMK_I64 splits, split_keys; /* split decode: key parts, keys per part (splits > 1) */
    EMK_I64 q[4], k[4], v[4], o[4], g[4]; /* {offset, batch, head, row} strides */
    EMK_I64 dq[4], dk[4], dv[4];
    EMK_I64 lse_off, mask_off, part_off; /* lse [B, Hq, L]; mask [B, S]; partials */
    float scale, pad_;
} emk_attn;

/* The multi-tensor Adam/AdamW step (optim.k's adam_multi_f32, src/backends/gpu/gpu_optim.c):
 * up to EMK_MT_SLOTS float32 parameters per launch, the slot's buffers passed as kernel
 * arguments (OpenCL 1.2 has no table of buffers), their element ranges laid end to end:
 * element x of the launch is element x - start[s] of slot s where start[s] <= x < start[s + 1].
 * Per slot: the element offsets of p, g, m, v and the low-precision copy, the flags (EMK_MT_*)
 * and the scalars (EMK_MT_C_*, rounded to float32 as the per-tensor kernel's arguments). */
#define EMK_MT_SLOTS 6 /* 5 buffers each, the schedule and the table: CUDA's launcher's 32 arguments */
enum { EMK_MT_P, EMK_MT_G, EMK_MT_M, EMK_MT_V, EMK_MT_LOW, EMK_MT_NOFF };
enum { EMK_MT_C_WD, EMK_MT_C_DECAY, EMK_MT_C_B1, EMK_MT_C_OMB1, EMK_MT_C_B2, EMK_MT_C_OMB2, EMK_MT_C_SBC2,
       EMK_MT_C_EPS, EMK_MT_C_STEP, EMK_MT_NC };
/* the flags: optim.k's EMK_OPT_WD, _DECAY and _MAXIMIZE, the low copy's dtype, and SCHED: the
 * step constant, sqrt of the second bias correction and the decay read from the device's
 * schedule (the sched argument at element sched_off: EMK_MT_S_*) instead of c */
enum { EMK_MT_LOW_BF16 = 256, EMK_MT_LOW_F16 = 512, EMK_MT_SCHED = 1024 };
enum { EMK_MT_S_STEP, EMK_MT_S_SBC2, EMK_MT_S_DECAY, EMK_MT_S_COUNT };
typedef struct emk_adam_multi {
    EMK_I64 start[EMK_MT_SLOTS + 1];
    EMK_I64 off[EMK_MT_SLOTS * EMK_MT_NOFF];
    EMK_I64 flags[EMK_MT_SLOTS];
    EMK_I64 sched_off;
    float c[EMK_MT_SLOTS * EMK_MT_NC];
} emk_adam_multi;

/* op codes, generated from op_list.h in em_op's order: unary, binary (arithmetic, then the
 * comparisons that write bool), reductions */
#define EMK_U_CODE_(NAME, name, dtypes, gpu) EMK_U_##NAME,
#define EMK_B_CODE_(NAME, name, dtypes, gpu) EMK_B_##NAME,
#define EMK_R_CODE_(NAME, name, dtypes, gpu) EMK_R_##NAME,
enum { EMK_OPS_UNARY(EMK_U_CODE_) EMK_U_COUNT_ };
enum { EMK_OPS_BINARY(EMK_B_CODE_) EMK_OPS_COMPARE(EMK_B_CODE_) EMK_B_COUNT_ };
enum { EMK_OPS_REDUCE(EMK_R_CODE_) EMK_R_COUNT_ };
/* The flags (i[0]) of the fused optimizer steps of the op list (ADADELTA_STEP ... RADAM_STEP),
 * set by src/optim/adaptive.c and read by the CPU's and the GPUs' kernels. */
enum {
    EMK_OPTF_WD = 1,          /* weight decay: g += wd * p, or with DECOUPLED p *= 1 - lr * wd */
    EMK_OPTF_DECOUPLED = 2,   /* AdamW-style decay (NAdam, RAdam) */
    EMK_OPTF_MAXIMIZE = 4,    /* g = -g first */
    EMK_OPTF_CENTERED = 8,    /* RMSprop: grad_avg, and the variance's root */
    EMK_OPTF_MOMENTUM = 16,   /* RMSprop: momentum_buffer */
    EMK_OPTF_LERP_BIG = 32,   /* lerp(x, g, w) with |w| >= 0.5: g - (g - x) c, c = 1 - w; else x + c (g - x), c = w */
    EMK_OPTF_RECTIFIED = 64   /* RAdam: rho_t > 5, the adaptive term applies */
};
/* random distributions (same order as em_rng_kind) */
enum { EMK_RNG_UNIFORM, EMK_RNG_NORMAL, EMK_RNG_RANDINT, EMK_RNG_BERNOULLI };

#if defined(EMK_OPENCL) || defined(EMK_CUDA)
/* Loop over n items with all threads of the launch (the host may launch fewer threads than
 * items), and over n items with the EMK_BLOCK threads of one block. GPUs stride, so that
 * neighbouring threads touch neighbouring elements (coalescing); CPU devices (EMK_CPU, set by
 * the OpenCL backend for PoCL and the like) give each thread a contiguous chunk, which runs
 * sequentially through the caches and lets the compiler vectorize (an order of magnitude
 * faster on PoCL than striding). */
#ifdef EMK_CPU
#define EMK_LOOP(i, n)                                                                    \
    for (i64 emk_c_ = ((n) + GLOBAL_SIZE(0) - 1) / GLOBAL_SIZE(0), i = GLOBAL_ID(0) * emk_c_, \
             emk_e_ = i + emk_c_ < (n) ? i + emk_c_ : (n);                                \
         i < emk_e_; ++i)
#define EMK_BLOCK_LOOP(i, t, n)                                                           \
    for (i64 emk_c_ = ((n) + EMK_BLOCK - 1) / EMK_BLOCK, i = (i64)(t) * emk_c_,           \
             emk_e_ = i + emk_c_ < (n) ? i + emk_c_ : (n);                                \
         i < emk_e_; ++i)
#else
#define EMK_LOOP(i, n) for (i64 i = GLOBAL_ID(0); i < (n); i += GLOBAL_SIZE(0))
#define EMK_BLOCK_LOOP(i, t, n) for (i64 i = (t); i < (n); i += EMK_BLOCK)
#endif

/* Layouts as kernel parameters: EMK_SHAPE sh, EMK_STRIDES so. CUDA copies a struct
 * parameter into per-thread local memory (the stack: 150-450 bytes per thread) once it is
 * indexed by a variable (size[d], s[d]); __grid_constant__ (CUDA 11.7+, sm_70+) lets the
 * kernel read it in place, and the helpers below take it by reference (EMK_CREF). OpenCL
 * passes them by value. */
#if defined(EMK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700 &&                 \
    (__CUDACC_VER_MAJOR__ > 11 || (__CUDACC_VER_MAJOR__ == 11 && __CUDACC_VER_MINOR__ >= 7))
#define EMK_SHAPE const __grid_constant__ emk_shape
#define EMK_STRIDES const __grid_constant__ emk_strides
#define EMK_PARAM(T) const __grid_constant__ T
#else
#define EMK_SHAPE emk_shape
#define EMK_STRIDES emk_strides
#define EMK_PARAM(T) T /* any struct parameter indexed by a variable (see above) */
#endif
#ifdef EMK_CUDA
#define EMK_CREF(T) const T &
#else
#define EMK_CREF(T) T
#endif

/* Index spaces below 2^31 elements divide in 32 bits (each coordinate and every size fits):
 * GPUs emulate 64-bit division in dozens of instructions, 32-bit in a few. The branch is
 * the same for every thread of a launch. */
#define EMK_IDX32(sh) ((sh).numel <= 0x7fffffff)

/* element offset of linear (row-major) index i of the index space */
INLINE i64 emk_off(i64 i, EMK_CREF(emk_shape) sh, EMK_CREF(emk_strides) a) {
    if (sh.ndim <= 1) return a.offset + i * a.s[0];
    i64 o = a.offset;
    if (EMK_IDX32(sh)) {
        u32 r = (u32)i;
        for (int d = (int)sh.ndim - 1; d >= 0; --d) {
            u32 n = (u32)sh.size[d], c = r % n;
            r /= n;
            o += (i64)c * a.s[d];
        }
        return o;
    }
    for (int d = (int)sh.ndim - 1; d >= 0; --d) {
        i64 n = sh.size[d], c = i % n;
        i /= n;
        o += c * a.s[d];
    }
    return o;
}
/* The same for two and three tensors sharing one index space (one division chain), as
 * macros that assign to the variables oa, ob (oc): a helper taking pointers to them kept
 * PoCL from vectorizing the loops around it (copies an order of magnitude slower). T is the type of
 * the division chain (u32 or i64). */
#define EMK_OFF2_T(T, i, sh, a, b, oa, ob)                                                \
    do {                                                                                  \
        T emk_r_ = (T)(i);                                                                \
        oa = (a).offset;                                                                  \
        ob = (b).offset;                                                                  \
        for (int emk_d_ = (int)(sh).ndim - 1; emk_d_ >= 0; --emk_d_) {                    \
            T emk_n_ = (T)(sh).size[emk_d_], emk_x_ = emk_r_ % emk_n_;                    \
            emk_r_ /= emk_n_;                                                             \
            oa += (i64)emk_x_ * (a).s[emk_d_];                                            \
            ob += (i64)emk_x_ * (b).s[emk_d_];                                            \
        }                                                                                 \
    } while (0)
#define EMK_OFF2(i, sh, a, b, oa, ob)                                                     \
    do {                                                                                  \
        if ((sh).ndim <= 1) {                                                             \
            oa = (a).offset + (i) * (a).s[0];                                             \
            ob = (b).offset + (i) * (b).s[0];                                             \
        } else if (EMK_IDX32(sh)) {                                                       \
            EMK_OFF2_T(u32, i, sh, a, b, oa, ob);                                         \
        } else {                                                                          \
            EMK_OFF2_T(i64, i, sh, a, b, oa, ob);                                         \
        }                                                                                 \
    } while (0)
#define EMK_OFF3_T(T, i, sh, a, b, c, oa, ob, oc)                                         \
    do {                                                                                  \
        T emk_r_ = (T)(i);                                                                \
        oa = (a).offset;                                                                  \
        ob = (b).offset;                                                                  \
        oc = (c).offset;                                                                  \
        for (int emk_d_ = (int)(sh).ndim - 1; emk_d_ >= 0; --emk_d_) {                    \
            T emk_n_ = (T)(sh).size[emk_d_], emk_x_ = emk_r_ % emk_n_;                    \
            emk_r_ /= emk_n_;                                                             \
            oa += (i64)emk_x_ * (a).s[emk_d_];                                            \
            ob += (i64)emk_x_ * (b).s[emk_d_];                                            \
            oc += (i64)emk_x_ * (c).s[emk_d_];                                            \
        }                                                                                 \
    } while (0)
#define EMK_OFF3(i, sh, a, b, c, oa, ob, oc)                                              \
    do {                                                                                  \
        if ((sh).ndim <= 1) {                                                             \
            oa = (a).offset + (i) * (a).s[0];                                             \
            ob = (b).offset + (i) * (b).s[0];                                             \
            oc = (c).offset + (i) * (c).s[0];                                             \
        } else if (EMK_IDX32(sh)) {                                                       \
            EMK_OFF3_T(u32, i, sh, a, b, c, oa, ob, oc);                                  \
        } else {                                                                          \
            EMK_OFF3_T(i64, i, sh, a, b, c, oa, ob, oc);                                  \
        }                                                                                 \
    } while (0)
#endif

#endif
