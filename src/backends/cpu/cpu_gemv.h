/* bf16 products of a few rows with an nn.Linear weight: decoding's matrix-vector products.
 *
 * A decoder reads each weight once per token to multiply it by one row (or a few: a batch of
 * prompts), so these products are bound by memory bandwidth, not arithmetic. A GEMM library
 * packs (copies) the weight before multiplying, which costs a second pass over it for a single
 * row (docs/BENCHMARKS.md compares the two with bench_gemv);
 * this kernel streams each weight row once straight from memory and multiplies it into every
 * input row while it is in registers: VDPBF16PS on CPUs with AVX512-BF16, else AVX2 + FMA
 * with bf16 widened to float32 by a shift. Accumulation is float32; the bias and the old z
 * (acc) are added before the one rounding, as in the AMX kernel and oneDNN.
 *
 * It applies to Z (P x Q) = X (P x K) Y with P <= EM_GEMV_MAX_ROWS, X row-major and Y
 * column-major (Y = W^T with W [Q, K] row-major: what nn.Linear's transposed weight is), bf16,
 * and runs on Ember's threads split over the output columns (the weight's rows).
 * EMBER_CPU_LOWP_GEMM (read on every call): unset or "gemv", this kernel where it applies;
 * "gemv_avx2" its AVX2 form even where AVX512-BF16 is there (for tests); any other value
 * ("amx", "onednn", "portable") leaves these products to that path. */
#ifndef EM_BACKENDS_CPU_GEMV_H
#define EM_BACKENDS_CPU_GEMV_H

#include <stdbool.h>
#include "cpu_dnnl.h"

/* The most rows of X this kernel takes; more go to the GEMMs, which reuse each weight
 * element over enough rows to be bound by arithmetic instead. */
#define EM_GEMV_MAX_ROWS 8

/* Whether em__cpu_gemv would run g: bf16, P <= EM_GEMV_MAX_ROWS, K >= 1, X row-major and
 * Y column-major, an instruction set it has (AVX2 + FMA at least), and EMBER_CPU_LOWP_GEMM
 * unset, "gemv" or "gemv_avx2". */
bool em__cpu_gemv_applies(const em_lowp_gemm *g);

/* Runs g (g->bias: Q bf16 values added to every row, or NULL; g->acc adds to z; g->z_f32
 * stores the float32 sums) where em__cpu_gemv_applies, returning EM_OK; otherwise
 * EM_ERR_NOT_SUPPORTED, z untouched and nothing recorded. Never fails otherwise. */
em_status em__cpu_gemv(const em_lowp_gemm *g);

/* The instruction set this kernel uses here now ("avx512_bf16", "avx2"), or NULL where it
 * does not run (no AVX2 + FMA, or EMBER_CPU_LOWP_GEMM set to another path). */
const char *em__cpu_gemv_isa(void);

#endif
