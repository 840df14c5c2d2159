/* The CPU's GEMM: OpenBLAS when the build found it, else Ember's built-in one (cpu_gemm.c).
 * One call is single-threaded; cpu_matmul.c splits big problems over the thread pool. */
#ifndef EM_BACKENDS_CPU_GEMM_H
#define EM_BACKENDS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

/* C (m x n, row-major, row stride ldc) = A (m x k) * B (k x n). Element (i, p) of A is at
 * a[i * rsa + p * csa], element (p, j) of B at b[p * rsb + j * csb]: any transpose or
 * stride. Never fails: without memory for its packing buffers it computes unpacked. */
void em__cpu_gemm_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                      const float *b, int64_t rsb, int64_t csb, float *c, int64_t ldc);
void em__cpu_gemm_f64(int64_t m, int64_t n, int64_t k, const double *a, int64_t rsa, int64_t csa,
                      const double *b, int64_t rsb, int64_t csb, double *c, int64_t ldc);

/* Which GEMM f32/f64 matmul uses, for `ember devices`: "OpenBLAS 0.3.21 (Haswell)" or
 * "built-in (avx512)". */
const char *em__cpu_gemm_name(void);

/* The built-in GEMM's instruction set: "avx512", "avx2" or "generic" (chosen at first use:
 * the best this CPU runs, or EMBER_CPU_GEMM=generic|avx2|avx512 when the CPU has it).
 * em__cpu_gemm_use switches it (tests and benchmarks compare them) and returns false, keeping
 * the current one, when this CPU or build lacks that set. */
const char *em__cpu_gemm_isa(void);
bool em__cpu_gemm_use(const char *isa);

#endif
