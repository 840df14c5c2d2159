/* f32 GEMM through oneDNN's dnnl_sgemm (builds with EMBER_HAVE_DNNL), beside OpenBLAS: on
 * AVX-512 it runs the training MLP's large products faster (docs/BENCHMARKS.md,
 * bench_sgemm_shapes); small ones stay on OpenBLAS, whose per-call cost is lower. */
#ifndef EM_BACKENDS_CPU_SGEMM_DNNL_H
#define EM_BACKENDS_CPU_SGEMM_DNNL_H

#include <stdbool.h>
#include <stdint.h>

/* Row-major C (m x n, ldc) = A (m x k) * B (k x n) + beta * C, A stored transposed when ta
 * (lda its leading dimension), B when tb; single-threaded (cpu_matmul.c splits over the pool).
 * Runs it through oneDNN and returns true when the policy picks oneDNN for this shape (below);
 * returns false, having done nothing, when it does not or oneDNN is missing or fails: the
 * caller then runs its own GEMM. */
bool em__cpu_sgemm_dnnl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The policy: "auto" (oneDNN for products of at least EM_SGEMM_DNNL_MIN_MACS multiply-adds
 * and a depth k of at least EM_SGEMM_DNNL_MIN_K on CPUs with AVX-512, where it was measured
 * faster; a 64 x 10 x 256 product or a k = 10 one ran slower than on OpenBLAS), "dnnl" (every f32 product) or
 * "openblas" (none). The first use reads EMBER_CPU_SGEMM; em__cpu_sgemm_policy switches it
 * (tests and benchmarks) and returns false, keeping the current one, for an unknown name
 * or "dnnl" in a build without oneDNN. */
bool em__cpu_sgemm_policy(const char *name);
const char *em__cpu_sgemm_policy_name(void);

#define EM_SGEMM_DNNL_MIN_MACS (1 << 18)
#define EM_SGEMM_DNNL_MIN_K 32

#endif
