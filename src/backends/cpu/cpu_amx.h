/* Ember's own bf16 GEMM on Intel AMX tiles (float32 accumulation), for CPUs with AMX-BF16.
 * Written because Debian's oneDNN (2.6) runs these products at 0.65-0.8x of the oneDNN 3.x
 * that PyTorch 2.x bundles, and repacks its operands on every call; this kernel packs each
 * operand once per call into the tiles' layout (docs/BENCHMARKS.md has the side-by-side).
 * EMBER_CPU_LOWP_GEMM (read on every call) chooses: unset, this kernel where the CPU has it
 * except for products under 32 rows or columns where oneDNN runs bf16 (mostly padding here);
 * "amx" this kernel for every shape; "onednn" oneDNN only; "portable" the float32 path. */
#ifndef EM_BACKENDS_CPU_AMX_H
#define EM_BACKENDS_CPU_AMX_H

#include <stdbool.h>
#include "cpu_dnnl.h"

/* Whether em__cpu_amx_gemm runs dt here now: bf16, a CPU with AMX-BF16 and AVX512-BF16, the
 * tile state granted by Linux, and EMBER_CPU_LOWP_GEMM unset or "amx". */
bool em__cpu_amx_runs(em_dtype dt);

/* g (bf16; g->bias, when set, Q bf16 values added to every row before the one rounding; g->acc
 * adds to z, also before it) on Ember's threads. EM_ERR_NOT_SUPPORTED, z untouched and nothing
 * recorded, where em__cpu_amx_runs is false, K is 0, a dimension is over INT_MAX, or the
 * product is narrow (above); out of memory for its packing buffers is recorded as
 * EM_ERR_OUT_OF_MEMORY, z untouched. */
em_status em__cpu_amx_gemm(const em_lowp_gemm *g);

/* What em_cpu_matmul_impl says for bf16 when this kernel runs, else NULL. */
const char *em__cpu_amx_name(void);

#endif
