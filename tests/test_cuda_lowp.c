/* bf16/f16 matmul and addmm on CUDA, checked without a GPU over the fake driver (with the
 * REAL NVRTC compiling the real kernels, so every launch's arguments are checked against the
 * compiled PTX) and a fake cuBLAS that really multiplies bf16/f16 on host memory with a
 * float32 accumulator: the calls carry CUDA_R_16BF / CUDA_R_16F operands, CUBLAS_COMPUTE_32F
 * and float alpha/beta (beta 1 for addmm into the bias), transposed operands included; when
 * cuBLAS refuses, Ember's own matmul kernel runs (its accum argument marshalled too).
 * matmul_widen (a master weight's gradient) asks cuBLAS for a CUDA_R_32F C, unrounded, and
 * declines without a kernel or an error where cuBLAS refuses. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "cuda_fake_driver.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.h"
#include "memory/allocator.h"
#include "backend_calls.h"

static em_cu_api g_cu;
static em_nvrtc_api g_nvrtc;
static em_cublas_api g_cublas;
static bool g_have_nvrtc;

/* what the last GEMM call carried */
static int gemm_calls;
static cudaDataType last_type, last_ctype;
static cublasComputeType_t last_compute;
static float last_beta;
static bool refuse_next;

static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float h2f(uint16_t h) { return (float)em_f16_to_f32(h); }
static uint16_t f2h(float f) { return em_f32_to_f16(f); }

static float ld(const void *p, long long i, cudaDataType t) {
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? bf2f(h) : h2f(h);
}

static cublasStatus_t b_create(cublasHandle_t *h) { *h = (cublasHandle_t)&g_cublas; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_destroy(cublasHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_stream(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                             int k, const void *alpha, const void *A, cudaDataType at, int lda,
                             long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                             const void *beta, void *C, cudaDataType ct, int ldc, long long sc,
                             int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h; (void)algo;
    if (refuse_next) {
        refuse_next = false;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (at != bt || (ct != at && ct != CUDA_R_32F) || (at != CUDA_R_16BF && at != CUDA_R_16F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm_calls++;
    last_type = at;
    last_ctype = ct;
    last_compute = compute;
    float al = *(const float *)alpha, be = *(const float *)beta; /* float scalars for COMPUTE_32F */
    last_beta = be;
    for (int bi = 0; bi < batch; bi++)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float acc = 0;
                for (int l = 0; l < k; l++)
                    acc += ld(A, bi * sa + (ta == CUBLAS_OP_N ? i + l * lda : l + i * lda), at) *
                           ld(B, bi * sb + (tb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb), bt);
                long long ci = bi * sc + i + (long long)j * ldc;
                if (ct == CUDA_R_32F) {
                    ((float *)C)[ci] = al * acc + (be != 0 ? be * ((float *)C)[ci] : 0);
                    continue;
                }
                float v = al * acc + (be != 0 ? be * ld(C, ci, ct) : 0);
                ((uint16_t *)C)[ci] = ct == CUDA_R_16BF ? f2bf(v) : f2h(v);
            }
    return CUBLAS_STATUS_SUCCESS;
}

static void install(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    F.cc_major = 9;
    F.cc_minor = 0;
    g_cu = fake_cu();
    memset(&g_cublas, 0, sizeof g_cublas);
    g_cublas.cublasCreate = b_create;
    g_cublas.cublasDestroy = b_destroy;
    g_cublas.cublasSetStream = b_stream;
    g_cublas.cublasGemmStridedBatchedEx = b_gemm;
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc = &g_nvrtc, .cublas = &g_cublas, .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

/* a tensor on "cuda:0" over host memory, strides given or contiguous */
static em_tensor *tensor(em_dtype dt, int ndim, const int64_t *shape, const int64_t *strides, size_t elems) {
    em_storage *s = calloc(1, sizeof *s);
    em_tensor *t = calloc(1, sizeof *t);
    size_t bytes = (elems ? elems : 1) * em_dtype_size(dt);
    atomic_init(&s->refcount, 1);
    s->device = EM_DEVICE(EM_CUDA, 0);
    s->backend = &em__cuda_backend;
    s->block.handle = calloc(1, bytes);
    s->block.size = s->nbytes = bytes;
    atomic_init(&t->refcount, 1);
    t->dtype = dt;
    t->ndim = ndim;
    t->storage = s;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = strides ? strides[d] : st;
        st *= shape[d];
    }
    return t;
}
static void drop(em_tensor *t) {
    free(t->storage->block.handle);
    free(t->storage);
    free(t);
}
static uint16_t *u16(em_tensor *t) { return (uint16_t *)t->storage->block.handle; }
static float get(em_tensor *t, int64_t i) { return t->dtype == EM_BF16 ? bf2f(u16(t)[i]) : h2f(u16(t)[i]); }
static void set(em_tensor *t, int64_t i, float v) { u16(t)[i] = t->dtype == EM_BF16 ? f2bf(v) : f2h(v); }

static const em_backend *B = &em__cuda_backend;

/* out [M, N] (contiguous) = bias + a @ b, a [M, K] and b [K, N] with their strides */
static void check(em_dtype dt, int64_t M, int64_t K, int64_t N, bool a_t, bool b_t, bool acc) {
    em_tensor *a = a_t ? tensor(dt, 2, (int64_t[]){M, K}, (int64_t[]){1, M}, (size_t)(M * K))
                       : tensor(dt, 2, (int64_t[]){M, K}, NULL, (size_t)(M * K));
    em_tensor *b = b_t ? tensor(dt, 2, (int64_t[]){K, N}, (int64_t[]){1, K}, (size_t)(K * N))
                       : tensor(dt, 2, (int64_t[]){K, N}, NULL, (size_t)(K * N));
    em_tensor *o = tensor(dt, 2, (int64_t[]){M, N}, NULL, (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) set(a, i, (float)((i * 7) % 11 - 5) * 0.375f);
    for (int64_t i = 0; i < K * N; i++) set(b, i, (float)((i * 5) % 13 - 6) * 0.625f);
    for (int64_t i = 0; i < M * N; i++) set(o, i, acc ? (float)(i % 3) + 0.5f : 99.0f);
    float *want = calloc((size_t)(M * N), sizeof *want);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = acc ? get(o, i * N + j) : 0;
            for (int64_t l = 0; l < K; l++)
                s += (double)get(a, a_t ? i + l * M : i * K + l) * get(b, b_t ? l + j * K : l * N + j);
            want[i * N + j] = (float)s;
        }
    int calls = gemm_calls;
    CHECK_OK(acc ? be_matmul_acc(B, o, a, b) : be_matmul(B, o, a, b));
    CHECK(gemm_calls == calls + 1);
    CHECK(last_type == (dt == EM_BF16 ? CUDA_R_16BF : CUDA_R_16F));
    CHECK(last_compute == CUBLAS_COMPUTE_32F); /* tensor cores, float32 accumulation */
    CHECK(last_beta == (acc ? 1.0f : 0.0f));
    double ulp = dt == EM_BF16 ? 1.0 / 128 : 1.0 / 1024;
    for (int64_t i = 0; i < M * N; i++) CHECK_NEAR(get(o, i), want[i], fabs(want[i]) * ulp);
    free(want);
    drop(a);
    drop(b);
    drop(o);
}

static void test_cublas_bf16_f16(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the real kernels");
    install();
    em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++)
        for (int acc = 0; acc < 2; acc++) {
            check(dts[d], 5, 7, 3, false, false, acc);
            check(dts[d], 4, 9, 6, true, false, acc);  /* a^T: the weight gradient's g^T */
            check(dts[d], 1, 16, 8, false, true, acc); /* b^T: linear's x @ W^T, batch 1 */
        }
}

/* 4096 ones: float32 accumulation gives 4096 exactly (a bf16 accumulator stalls at 256) */
static void test_float32_accumulation(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the real kernels");
    install();
    em_tensor *a = tensor(EM_BF16, 2, (int64_t[]){1, 4096}, NULL, 4096);
    em_tensor *b = tensor(EM_BF16, 2, (int64_t[]){4096, 1}, NULL, 4096);
    em_tensor *o = tensor(EM_BF16, 2, (int64_t[]){1, 1}, NULL, 1);
    for (int i = 0; i < 4096; i++) { set(a, i, 1); set(b, i, 1); }
    CHECK_OK(be_matmul(B, o, a, b));
    CHECK_NEAR(get(o, 0), 4096.0, 0.0);
    drop(a);
    drop(b);
    drop(o);
}

/* cuBLAS refusing: Ember's tiled kernel (float accumulators), whose arguments, the accum
 * flag included, the fake driver checks against the PTX NVRTC compiled */
static void test_refusal_runs_the_kernel(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the real kernels");
    install();
    em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++)
        for (int acc = 0; acc < 2; acc++) {
            em_tensor *a = tensor(dts[d], 2, (int64_t[]){3, 4}, NULL, 12);
            em_tensor *b = tensor(dts[d], 2, (int64_t[]){4, 5}, NULL, 20);
            em_tensor *o = tensor(dts[d], 2, (int64_t[]){3, 5}, NULL, 15);
            refuse_next = true;
            int launches = F.launches, calls = gemm_calls;
            CHECK_OK(acc ? be_matmul_acc(B, o, a, b) : be_matmul(B, o, a, b));
            CHECK(F.launches == launches + 1 && gemm_calls == calls);
            CHECK(!strcmp(fake_func_name(F.last_func), dts[d] == EM_BF16 ? "matmul_bf16" : "matmul_f16"));
            em_clear_error();
            drop(a);
            drop(b);
            drop(o);
        }
}

/* matmul_widen: a float32 C from bf16/f16 operands, the weight gradient's layout (a^T), not
 * rounded: sums past bf16's 8 bits come out exact; refused, it declines (no kernel, no
 * error) and core multiplies in the low dtype instead */
static void test_widen(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the real kernels");
    install();
    em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        int64_t M = 6, K = 40, N = 5;
        em_tensor *a = tensor(dts[d], 2, (int64_t[]){M, K}, (int64_t[]){1, M}, (size_t)(M * K));
        em_tensor *b = tensor(dts[d], 2, (int64_t[]){K, N}, NULL, (size_t)(K * N));
        em_tensor *o = tensor(EM_F32, 2, (int64_t[]){M, N}, NULL, (size_t)(M * N));
        for (int64_t i = 0; i < M * K; i++) set(a, i, (float)(i % 7) + 1.0f);
        for (int64_t i = 0; i < K * N; i++) set(b, i, (float)(i % 5) + 3.0f);
        int calls = gemm_calls, launches = F.launches;
        CHECK_OK(be_matmul_widen(B, o, a, b));
        CHECK(gemm_calls == calls + 1 && F.launches == launches);
        CHECK(last_type == (dts[d] == EM_BF16 ? CUDA_R_16BF : CUDA_R_16F) && last_ctype == CUDA_R_32F);
        CHECK(last_compute == CUBLAS_COMPUTE_32F && last_beta == 0.0f);
        float *of = (float *)o->storage->block.handle;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double want = 0;
                for (int64_t l = 0; l < K; l++) want += (double)get(a, i + l * M) * get(b, l * N + j);
                CHECK_NEAR(of[i * N + j], want, 0.0); /* integers below 2^24: exact, never rounded */
            }
        refuse_next = true;
        CHECK(be_matmul_widen(B, o, a, b) == EM_ERR_NOT_SUPPORTED && F.launches == launches && !em_failed());
        drop(a);
        drop(b);
        drop(o);
    }
    CHECK(!be_has(&em__opencl_backend, EM_OP_MATMUL_WIDEN, EM_BF16)); /* its GEMM has no f16/bf16: not offered */
}

/* the elementwise ops a Linear layer's forward and backward run, in bf16 and f16 */
static void test_linear_elementwise(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the real kernels");
    install();
    em_dtype dts[2] = {EM_BF16, EM_F16};
    double p[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        em_tensor *x = tensor(dts[d], 2, (int64_t[]){4, 8}, NULL, 32), *y = tensor(dts[d], 2, (int64_t[]){4, 8}, NULL, 32);
        em_tensor *bias = tensor(dts[d], 2, (int64_t[]){4, 8}, (int64_t[]){0, 1}, 8);
        em_tensor *sum = tensor(dts[d], 2, (int64_t[]){1, 8}, NULL, 8);
        int launches = F.launches;
        CHECK_OK(be_copy(B, y, bias));                              /* addmm's bias broadcast */
        CHECK_OK(be_binary(B, EM_OP_ADD, y, y, x));
        CHECK_OK(be_unary(B, EM_OP_RELU, y, y, p));
        CHECK_OK(be_binary(B, EM_OP_MUL, y, y, x));
        CHECK_OK(be_reduce(B, EM_OP_SUM, sum, y, (bool[]){true, false})); /* the bias gradient */
        CHECK(F.launches >= launches + 5);
        drop(x);
        drop(y);
        drop(bias);
        drop(sum);
    }
}

int main(void) {
    const char *reason = NULL;
    int major = 0, minor = 0;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (nv) {
        g_nvrtc = *nv;
        g_have_nvrtc = true;
    }
    install();
    RUN(test_cublas_bf16_f16);
    RUN(test_float32_accumulation);
    RUN(test_refusal_runs_the_kernel);
    RUN(test_widen);
    RUN(test_linear_elementwise);
    em__cuda_backend_reset();
    for (int i = 0; i < MAX_FAKE_MODULES; i++) free(module_images[i]);
    if (!g_have_nvrtc) printf("NVRTC missing (%s): nothing here could run\n", reason ? reason : "?");
    return test_summary();
}

#else
int main(void) {
    test_skip_case("cuda lowp", "built without CUDA headers: there is no cuBLAS call to check");
    return test_summary();
}
#endif
