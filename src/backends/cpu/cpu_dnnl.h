/* bf16/f16 GEMM on the CPU: oneDNN's matmul (float32 accumulation; AMX tiles or
 * AVX512-BF16 as oneDNN finds them) where this CPU and build have a fast kernel for the
 * dtype, else cpu_matmul.c converts to float32 and runs the float32 GEMM (the portable path).
 * Where the CPU has AMX, bf16 goes to Ember's own kernel first (cpu_amx.h).
 * EMBER_CPU_LOWP_GEMM=portable forces the portable path; =onednn, =amx or unset allow oneDNN;
 * it is read on every call, so a test can run every path in one process. */
#ifndef EM_BACKENDS_CPU_DNNL_H
#define EM_BACKENDS_CPU_DNNL_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/dtype.h>
#include <ember/error.h>

/* Z (P x Q, row-major, row stride ldz) = X (P x K) * Y (K x Q), or Z += X * Y with acc, all
 * of one dtype (Z float32 with z_f32); X and Y each row-major (xt/yt false) or column-major,
 * leading dims ldx, ldy. */
typedef struct em_lowp_gemm {
    em_dtype dtype;
    int64_t P, Q, K;
    const void *x, *y;
    void *z;
    bool xt, yt;
    int64_t ldx, ldy, ldz;
    bool acc;
    const void *bias;   /* em__cpu_dnnl_gemm_bias: [Q] of dtype added to every row; else NULL */
    bool z_f32;         /* Z is float32, never rounded (a weight's gradient for float32 master
                         * weights: em__cpu_matmul_widen); the AMX kernel and em__cpu_dnnl_gemm */
} em_lowp_gemm;

/* Runs g on Ember's threads through oneDNN. EM_ERR_NOT_SUPPORTED, nothing recorded: oneDNN
 * is not built in, switched off, or has no fast kernel for the dtype here (use float32).
 * Other failures are recorded. */
em_status em__cpu_dnnl_gemm(const em_lowp_gemm *g);

/* Whether em__cpu_dnnl_gemm runs dt here now: oneDNN built in, a fast kernel for dt on this
 * CPU, and EMBER_CPU_LOWP_GEMM not "portable". */
bool em__cpu_dnnl_runs(em_dtype dt);

/* Z = X Y + bias (g->bias: Q values of g->dtype added to every row), the bias in the GEMM's
 * epilogue (oneDNN's matmul primitive), where a separate pass would write the bias rows and
 * the GEMM read them back (Linear's forward: 5-13% of its time at the GPT's sizes). float32
 * on AVX-512, and bf16/f16 where em__cpu_dnnl_runs (float32 accumulation, the bias added
 * before the one rounding, as the sum post-op did). Runs on Ember's threads.
 * EM_ERR_NOT_SUPPORTED, z untouched and nothing recorded: not built with oneDNN,
 * EMBER_CPU_SGEMM=openblas (float32), no such kernel here, a product under
 * EM_SGEMM_BIAS_MIN_MACS multiply-adds or EM_SGEMM_BIAS_MIN_ROWS rows, or a layout oneDNN
 * refuses; the caller then writes the bias rows and accumulates the product. It pays on the
 * GPT's step (2048 rows) and not on the seed MLP at batch 64 (the primitive's per-call cost),
 * hence the rows' floor. */
#define EM_SGEMM_BIAS_MIN_MACS (1 << 22)
#define EM_SGEMM_BIAS_MIN_ROWS 256
em_status em__cpu_dnnl_gemm_bias(const em_lowp_gemm *g);

/* ---- batched float32 products as one oneDNN matmul primitive (the attention's) ---- */
#define EM_DNNL_MAX_BATCH 4
/* Batch dims (outermost first) and each operand's element strides over them; a stride 0
 * broadcasts x or y over that dim (never z). */
typedef struct em_dnnl_batch {
    int nb;
    int64_t bshape[EM_DNNL_MAX_BATCH], bsx[EM_DNNL_MAX_BATCH], bsy[EM_DNNL_MAX_BATCH], bsz[EM_DNNL_MAX_BATCH];
} em_dnnl_batch;

/* Every matrix of the batch: Z_i = X_i * Y_i, g (dtype EM_F32, acc false) describing batch
 * element 0. The outermost batch dim is split over Ember's threads, one primitive (cached)
 * per chunk. Returns EM_ERR_NOT_SUPPORTED, nothing recorded and z possibly part-written,
 * when oneDNN is not built in, refuses the layout, fails, or is not chosen: the caller then
 * runs its own GEMMs. EMBER_CPU_BATCHED_GEMM (read on every call) chooses: "blas" never,
 * "dnnl" always, unset or anything else where it was measured faster (g->Q >= g->K, and
 * 1M multiply-adds or more in all). */
em_status em__cpu_dnnl_sgemm_batch(const em_lowp_gemm *g, const em_dnnl_batch *b);

#endif
