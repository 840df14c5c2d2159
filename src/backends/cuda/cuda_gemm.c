/* Matmul on cuBLAS: cublasGemmStridedBatchedEx, row-major through the transpose trick.
 *
 * cuBLAS is column-major. A row-major M x N matrix with leading dimension ld is, read
 * column-major, its N x M transpose with the same ld; so C = A B (row-major) is computed
 * as C^T = B^T A^T (column-major): swap the operands and M with N, keep every ld.
 * Dtypes: f32 (FP32, or TF32 tensor cores when EMBER_CUDA_ALLOW_TF32=1, as PyTorch's
 * allow_tf32), f64, f16 and bf16 (tensor cores, FP32 accumulation; C float32 instead for
 * matmul_widen, a master weight's gradient, stored unrounded). Everything else, sizes
 * beyond int, a missing libcublas, or cuBLAS refusing the call (not supported, built for
 * another architecture, out of memory after the cache was emptied): EM_ERR_NOT_SUPPORTED,
 * nothing recorded, and the op layer runs Ember's own matmul kernel. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "cuda_launch.h"
#include "../../memory/allocator.h"
#include <ember/memory.h>

static pthread_mutex_t g_glock = PTHREAD_MUTEX_INITIALIZER;

static bool allow_tf32(void) {
    const char *e = getenv("EMBER_CUDA_ALLOW_TF32");
    return e && *e && strcmp(e, "0") != 0;
}

/* cuBLAS's workspace, as PyTorch gives it one: from the caching allocator, so that its
 * memory is counted and an out-of-memory is met by the allocator's own retry (freeing
 * its cache) instead of cuBLAS failing inside a matmul. Hopper wants 32 MiB. */
static size_t workspace_bytes(const em_cuda_device *d) {
    return (size_t)(d->cc_major >= 9 ? 32 : 8) << 20;
}

/* The handle of d, created on first use and bound to d's stream and workspace. */
static cublasHandle_t handle_for(em_cuda_device *d, const em_cublas_api *cb, int dev) {
    pthread_mutex_lock(&g_glock);
    cublasHandle_t h = d->cublas;
    if (!h) {
        cublasStatus_t s = cb->cublasCreate(&h);
        if (s == CUBLAS_STATUS_SUCCESS) s = cb->cublasSetStream(h, d->stream);
        if (s != CUBLAS_STATUS_SUCCESS) {
            em_error(EM_ERR_BACKEND, "cuda:%d: matmul: creating the cuBLAS handle failed: %s", dev,
                     em__cublas_status_name(s));
            if (h) cb->cublasDestroy(h);
            h = NULL;
        } else {
            d->cublas = h;
            /* After cublasSetStream, which resets the workspace to cuBLAS's own pool. Without
             * a block (no memory now) cuBLAS keeps that pool: slower, never wrong. */
            em_error_state saved;
            em__error_save(&saved);
            if (cb->cublasSetWorkspace &&
                em__mem_alloc(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), workspace_bytes(d), &d->cublas_ws) == EM_OK &&
                cb->cublasSetWorkspace(h, (char *)d->cublas_ws.handle + d->cublas_ws.offset,
                                       d->cublas_ws.size) != CUBLAS_STATUS_SUCCESS)
                em__mem_free(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), &d->cublas_ws);
            em__error_restore(&saved);
        }
    }
    pthread_mutex_unlock(&g_glock);
    return h;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static cublasStatus_t call_gemm(const em_cublas_api *cb, cublasHandle_t h, const em_gemm_args *g,
                                cudaDataType type, cublasComputeType_t compute, size_t elem) {
    cudaDataType ctype = g->c_f32 ? CUDA_R_32F : type;
    size_t celem = g->c_f32 ? 4 : elem;
    /* alpha = 1, beta = 0 (1 to add into C: addmm's bias) in the compute type's scalar type,
     * float for f16/bf16 (CUBLAS_COMPUTE_32F): C is read, summed and rounded once */
    double one64 = 1.0, beta64 = g->accumulate ? 1.0 : 0.0;
    float one32 = 1.0f, beta32 = g->accumulate ? 1.0f : 0.0f;
    const void *alpha = g->dtype == EM_F64 ? (const void *)&one64 : (const void *)&one32;
    const void *beta = g->dtype == EM_F64 ? (const void *)&beta64 : (const void *)&beta32;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)g->a + (CUdeviceptr)g->a_off * elem;
    CUdeviceptr b = (CUdeviceptr)(uintptr_t)g->b + (CUdeviceptr)g->b_off * elem;
    CUdeviceptr c = (CUdeviceptr)(uintptr_t)g->c + (CUdeviceptr)g->c_off * celem;
    /* C^T (N x M) = op(B)^T-side first: B's row-major K x N is column-major N x K */
    cublasOperation_t op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    pthread_mutex_lock(&g_glock); /* a handle is not for two threads at once */
    cublasStatus_t s = cb->cublasGemmStridedBatchedEx(
        h, op_b, op_a, (int)g->n, (int)g->m, (int)g->k, alpha, (const void *)(uintptr_t)b, type,
        (int)g->ldb, g->stride_b, (const void *)(uintptr_t)a, type, (int)g->lda, g->stride_a, beta,
        (void *)(uintptr_t)c, ctype, (int)g->ldc, g->stride_c, (int)g->batch, compute,
        CUBLAS_GEMM_DEFAULT);
    pthread_mutex_unlock(&g_glock);
    return s;
}

static em_status gemm_in(int dev, const em_gemm_args *g) {
    cudaDataType type;
    cublasComputeType_t compute;
    size_t elem;
    switch (g->dtype) {
    case EM_F32:
        type = CUDA_R_32F;
        compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        elem = 4;
        break;
    case EM_F64: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; elem = 8; break;
    case EM_F16: type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; elem = 2; break;
    case EM_BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; elem = 2; break;
    default: return EM_ERR_NOT_SUPPORTED;
    }
    if (g->c_f32 && g->dtype != EM_F16 && g->dtype != EM_BF16) return EM_ERR_NOT_SUPPORTED;
    if (!fits_int(g->m) || !fits_int(g->n) || !fits_int(g->k) || !fits_int(g->batch) ||
        !fits_int(g->lda) || !fits_int(g->ldb) || !fits_int(g->ldc))
        return EM_ERR_NOT_SUPPORTED;
    const char *reason = NULL;
    const em_cublas_api *cb = em__cuda_cublas(&reason);
    if (!cb) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true) && em__cuda_trace_enabled())
            fprintf(stderr, "ember: cuda: %s; matmul uses Ember's kernel\n", reason);
        return EM_ERR_NOT_SUPPORTED;
    }
    em_cuda_device *d = em__cuda_activate(dev, "matmul");
    if (!d) return em_last_status();
    cublasHandle_t h = handle_for(d, cb, dev);
    if (!h) return em_last_status();

    cublasStatus_t s = call_gemm(cb, h, g, type, compute, elem);
    if (s == CUBLAS_STATUS_ALLOC_FAILED) {
        /* cuBLAS could not get device memory: what Ember caches is free for it, once */
        em_error_state saved;
        em__error_save(&saved);
        em_memory_empty_cache(EM_DEVICE(EM_CUDA, dev));
        em__error_restore(&saved);
        s = call_gemm(cb, h, g, type, compute, elem);
    }
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH || s == CUBLAS_STATUS_ALLOC_FAILED) {
        /* cuBLAS cannot do it here (this GPU, these sizes, no memory): Ember's kernel can */
        if (em__cuda_trace_enabled())
            fprintf(stderr, "ember: cuda:%d: cublasGemmStridedBatchedEx (%s) gave %s; matmul uses Ember's kernel\n",
                    dev, em_dtype_name(g->dtype), em__cublas_status_name(s));
        return EM_ERR_NOT_SUPPORTED;
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return em_error(EM_ERR_BACKEND, "cuda:%d: matmul: cublasGemmStridedBatchedEx (%s, %lldx%lldx%lld, "
                        "batch %lld) failed: %s", dev, em_dtype_name(g->dtype), (long long)g->m,
                        (long long)g->k, (long long)g->n, (long long)g->batch,
                        cb->cublasGetStatusString ? cb->cublasGetStatusString(s) : em__cublas_status_name(s));
    return em__cuda_after_launch(d, "matmul", "cublasGemmStridedBatchedEx");
}

em_status em__cuda_gemm(int dev, const em_gemm_args *g) { EM_CUDA_CTX_SCOPED(gemm_in(dev, g)); }

void em__cuda_gemm_release(struct em_cuda_device *d) {
    const em_cublas_api *cb = d->cublas ? em__cuda_cublas(NULL) : NULL;
    if (cb) cb->cublasDestroy(d->cublas);
    d->cublas = NULL;
    if (d->cublas_ws.alloc_ctx) em__mem_free(&em__cuda_backend, EM_DEVICE(EM_CUDA, d->index), &d->cublas_ws);
}

#endif
