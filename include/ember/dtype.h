/* Element types. EM_F32 is zero so that a zeroed em_opts means float32, as in PyTorch. */
#ifndef EMBER_DTYPE_H
#define EMBER_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The element types, in PyTorch's names: torch.float32 is EM_F32. */
typedef enum em_dtype {
    EM_F32 = 0,
    EM_F64,
    EM_F16,
    EM_BF16,
    EM_I64,
    EM_I32,
    EM_U8,
    EM_BOOL,
    EM_DTYPE_COUNT
} em_dtype;

/* PyTorch's spelling: "float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool". */
EM_API const char *em_dtype_name(em_dtype dt);
/* Parse a dtype name; also accepts "f32", "half", "float", "double", "long", "int". */
EM_API em_status em_dtype_parse(const char *s, em_dtype *out);
/* Bytes per element. */
EM_API size_t em_dtype_size(em_dtype dt);
EM_API bool em_dtype_is_floating(em_dtype dt); /* float16/32/64 or bfloat16 */
/* The result dtype of a binary op on a and b, by PyTorch's promotion rules. */
EM_API em_dtype em_promote_types(em_dtype a, em_dtype b);

/* IEEE half and bfloat16 conversions (round to nearest even). */
EM_API uint16_t em_f32_to_f16(float f);
EM_API float em_f16_to_f32(uint16_t h);      /* IEEE half bits to float (exact) */
EM_API uint16_t em_f32_to_bf16(float f);     /* float to bfloat16 bits */
EM_API float em_bf16_to_f32(uint16_t h);     /* bfloat16 bits to float (exact) */

#ifdef __cplusplus
}
#endif
#endif
