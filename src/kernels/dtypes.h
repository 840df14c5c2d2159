/* Element types in kernels: storage type, compute type, load, store and conversion for
 * each of Ember's dtypes, named by the suffix used in kernel names:
 *   f32 f64 f16 bf16 i64 i32 u8 b8   (the order of enum em_dtype)
 * Half types are stored as u16 bits and computed in float; bool is stored as u8 0/1.
 * A kernel family is written once as a macro of the suffix X and instantiated with
 * EMK_FOR_EACH_DTYPE; ST_X, CT_X, LD_X(p, i), SV_X(p, i, v), TO_X(v) are the traits. */
#ifndef EMK_DTYPES_H
#define EMK_DTYPES_H

/* bfloat16 <-> float, round to nearest even, NaN kept quiet */
INLINE float emk_bf16_to_f32(u16 h) { return AS_F32(((u32)h) << 16); }
INLINE u16 emk_f32_to_bf16(float f) {
    u32 u = AS_U32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

#ifdef EMK_HAS_F64
#define EMK_IF_F64(x) x
typedef double emk_acc; /* wide accumulator for affine fills and float sums */
#else
#define EMK_IF_F64(x)
typedef float emk_acc;
#endif

#define EMK_FOR_EACH_DTYPE(M) M(f32) EMK_IF_F64(M(f64)) M(f16) M(bf16) M(i64) M(i32) M(u8) M(b8)
#define EMK_FOR_EACH_DTYPE_ARG(M, a) \
    M(a, f32) EMK_IF_F64(M(a, f64)) M(a, f16) M(a, bf16) M(a, i64) M(a, i32) M(a, u8) M(a, b8)
/* floating dtypes, and dtypes with arithmetic (everything but bool) */
#define EMK_FOR_EACH_FLOAT(M) M(f32) EMK_IF_F64(M(f64)) M(f16) M(bf16)
#define EMK_FOR_EACH_NUMERIC(M) EMK_FOR_EACH_FLOAT(M) M(i64) M(i32) M(u8)

#define ST_f32 float
#define CT_f32 float
#define LD_f32(p, i) ((p)[i])
#define SV_f32(p, i, v) ((p)[i] = (float)(v))
#define TO_f32(v) ((float)(v))

#define ST_f64 double
#define CT_f64 double
#define LD_f64(p, i) ((p)[i])
#define SV_f64(p, i, v) ((p)[i] = (double)(v))
#define TO_f64(v) ((double)(v))

#define ST_f16 u16
#define CT_f16 float
#define LD_f16(p, i) LOAD_F16(p, i)
#define SV_f16(p, i, v) STORE_F16(p, i, (float)(v))
#define TO_f16(v) ((float)(v))

#define ST_bf16 u16
#define CT_bf16 float
#define LD_bf16(p, i) emk_bf16_to_f32((p)[i])
#define SV_bf16(p, i, v) ((p)[i] = emk_f32_to_bf16((float)(v)))
#define TO_bf16(v) ((float)(v))

#define ST_i64 i64
#define CT_i64 i64
#define LD_i64(p, i) ((p)[i])
#define SV_i64(p, i, v) ((p)[i] = (i64)(v))
#define TO_i64(v) ((i64)(v))

#define ST_i32 i32
#define CT_i32 i64
#define LD_i32(p, i) ((i64)(p)[i])
#define SV_i32(p, i, v) ((p)[i] = (i32)(v))
#define TO_i32(v) ((i64)(v))

#define ST_u8 u8
#define CT_u8 i64
#define LD_u8(p, i) ((i64)(p)[i])
#define SV_u8(p, i, v) ((p)[i] = (u8)(i64)(v))
#define TO_u8(v) ((i64)(v))

#define ST_b8 u8
#define CT_b8 i64
#define LD_b8(p, i) ((i64)((p)[i] != 0))
#define SV_b8(p, i, v) ((p)[i] = (u8)((v) != 0))
#define TO_b8(v) ((i64)((v) != 0))

/* is the dtype floating (1) or integer/bool (0), as a constant expression */
#define ISF_f32 1
#define ISF_f64 1
#define ISF_f16 1
#define ISF_bf16 1
#define ISF_i64 0
#define ISF_i32 0
#define ISF_u8 0
#define ISF_b8 0

/* unsigned types with the byte sizes 1, 2, 4, 8 (for bit copies) */
#define BITS_1 u8
#define BITS_2 u16
#define BITS_4 u32
#define BITS_8 u64

#endif
