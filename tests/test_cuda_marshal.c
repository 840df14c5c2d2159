/* Argument marshalling of every CUDA op, checked without a GPU: the ops run through the
 * CUDA backend over a fake driver, with the REAL NVRTC compiling the real kernels to PTX;
 * the fake driver answers cuFuncGetParamInfo from that PTX, so the backend's first-launch
 * check compares what the op layer passes with what each compiled kernel takes. (OpenCL
 * checks argument sizes itself; CUDA would read a wrongly sized argument silently.)
 * Matmul goes through a fake cuBLAS that really multiplies, column-major, on host memory:
 * that proves the row-major transpose trick, transposed and broadcast operands included.
 * Compiled PTX is shared with test_cuda_kernels_compile through the kernel disk cache. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "cuda_fake_driver.h"
#include "backends/cuda/cuda_kernels.h"
#include "kernels/layout.h"
#include "memory/allocator.h"
#include "backends/cuda/cuda_launch.h"
#include "backend_calls.h"
#include <ember/memory.h>
#include <ember/kernel.h>

static em_cu_api g_cu;
static em_nvrtc_api g_nvrtc; /* the real one */
static em_cublas_api g_cublas;
static bool g_have_nvrtc;

/* ---- a fake cuBLAS that computes (f32 only), column-major like the real one ---- */
static int gemm_calls;
/* statuses the fake cuBLAS answers before it computes again, first one first */
static cublasStatus_t gemm_fail[4];
static int gemm_nfail, gemm_attempts;
static void *ws_ptr;
static size_t ws_size;
static cublasStatus_t b_workspace(cublasHandle_t h, void *p, size_t n) {
    (void)h;
    ws_ptr = p;
    ws_size = n;
    return CUBLAS_STATUS_SUCCESS;
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
    gemm_attempts++;
    if (gemm_nfail > 0) {
        cublasStatus_t st = gemm_fail[0];
        memmove(gemm_fail, gemm_fail + 1, sizeof gemm_fail - sizeof gemm_fail[0]);
        gemm_nfail--;
        return st;
    }
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* cuBLAS's own argument rules */
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm_calls++;
    float al = *(const float *)alpha, be = *(const float *)beta;
    for (int bi = 0; bi < batch; bi++) {
        const float *a = (const float *)A + bi * sa, *b = (const float *)B + bi * sb;
        float *c = (float *)C + bi * sc;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float acc = 0;
                for (int l = 0; l < k; l++)
                    acc += (ta == CUBLAS_OP_N ? a[i + l * lda] : a[l + i * lda]) *
                           (tb == CUBLAS_OP_N ? b[l + j * ldb] : b[j + l * ldb]);
                c[i + j * ldc] = al * acc + (be != 0 ? be * c[i + j * ldc] : 0);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- a fake occupancy calculator: g_resident blocks of 256 threads per SM (0: the
 * driver lacks cuOccupancyMaxActiveBlocksPerMultiprocessor) ---- */
static int g_resident, g_occupancy_calls;
static CUresult f_occupancy(int *n, CUfunction f, int block, size_t smem) {
    (void)f; (void)smem;
    g_occupancy_calls++;
    *n = block == 256 ? g_resident : 1;
    return CUDA_SUCCESS;
}

static void install(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    F.cc_major = 9; /* compute capability 9.9: unknown to NVRTC, so PTX for compute_90 */
    F.cc_minor = 9;
    g_cu = fake_cu();
    if (g_resident) g_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor = f_occupancy;
    memset(&g_cublas, 0, sizeof g_cublas);
    g_cublas.cublasCreate = b_create;
    g_cublas.cublasDestroy = b_destroy;
    g_cublas.cublasSetStream = b_stream;
    g_cublas.cublasGemmStridedBatchedEx = b_gemm;
    g_cublas.cublasSetWorkspace = b_workspace;
    gemm_nfail = 0;
    ws_ptr = NULL;
    ws_size = 0;
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc = &g_nvrtc, .cublas = &g_cublas,
                              .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

/* ---- tensors on "cuda:0" whose memory is host memory ---- */
static em_tensor *tensor(em_dtype dt, int ndim, const int64_t *shape, const int64_t *strides,
                         size_t elems) {
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
#define T(dt, ...) tensor((dt), EM__NARGS(__VA_ARGS__), (int64_t[]){__VA_ARGS__}, NULL, contiguous_elems(EM__NARGS(__VA_ARGS__), (int64_t[]){__VA_ARGS__}))
static size_t contiguous_elems(int n, const int64_t *s) {
    size_t e = 1;
    for (int i = 0; i < n; i++) e *= (size_t)s[i];
    return e;
}
static void drop(em_tensor *t) {
    if (!t) return;
    free(t->storage->block.handle);
    free(t->storage);
    free(t);
}
static float *f32(em_tensor *t) { return (float *)t->storage->block.handle; }

/* An op that must marshal cleanly: status OK and at least one launch (or cuBLAS call). */
#define OP(expr)                                                                         \
    do {                                                                                 \
        int before = F.launches + gemm_calls;                                            \
        em_status s_ = (expr);                                                           \
        if (s_ != EM_OK) fprintf(stderr, "  %s: %s\n", #expr, em_last_error());         \
        CHECK(s_ == EM_OK);                                                              \
        CHECK(F.launches + gemm_calls > before);                                         \
        em_clear_error();                                                                \
    } while (0)

static const em_backend *B = &em__cuda_backend;

static void test_elementwise_ops(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *a = T(EM_F32, 3, 4), *b = T(EM_F32, 3, 4), *o = T(EM_F32, 3, 4);
    em_tensor *h = T(EM_F16, 3, 4), *bf = T(EM_BF16, 3, 4), *d = T(EM_F64, 3, 4);
    em_tensor *i64 = T(EM_I64, 3, 4), *i32 = T(EM_I32, 3, 4), *u8 = T(EM_U8, 3, 4);
    em_tensor *m = T(EM_BOOL, 3, 4), *m2 = T(EM_BOOL, 3, 4);
    double p[2] = {-1, 2};
    OP(be_fill(B, a, 1.5));
    OP(be_fill(B, bf, -2));
    OP(be_fill(B, i64, 7));
    OP(be_fill_affine(B, a, 0, 0.5));
    OP(be_fill_affine(B, i32, 3, 2));
    OP(be_fill_affine(B, d, 0, 0.25));
    /* same dtype, both dense: the driver's device copy, not a kernel */
    int launches = F.launches, d2d = F.d2d_copies;
    CHECK_OK(be_copy(B, o, a));
    CHECK(F.launches == launches && F.d2d_copies == d2d + 1);
    em_tensor *a_t = tensor(EM_F32, 2, (int64_t[]){4, 3}, (int64_t[]){1, 4}, 12), *ot = T(EM_F32, 4, 3);
    OP(be_copy(B, ot, a_t)); /* a transposed source: the copy kernel */
    CHECK(!strcmp(fake_func_name(F.last_func), "copy_4"));
    drop(a_t); drop(ot);
    OP(be_copy(B, h, a));
    OP(be_copy(B, i64, d));
    OP(be_copy(B, m, u8));
    OP(be_unary(B, EM_OP_NEG, o, a, p));
    OP(be_unary(B, EM_OP_EXP, d, d, p));
    OP(be_unary(B, EM_OP_GELU, h, h, p));
    OP(be_unary(B, EM_OP_CLAMP, bf, bf, p));
    OP(be_unary(B, EM_OP_POW_SCALAR, i32, i32, p));
    OP(be_unary(B, EM_OP_RELU, u8, u8, p));
    OP(be_binary(B, EM_OP_ADD, o, a, b));
    OP(be_binary(B, EM_OP_MAXIMUM, d, d, d));
    OP(be_binary(B, EM_OP_MUL, i64, i64, i64));
    OP(be_binary(B, EM_OP_LT, m, i32, i32));
    OP(be_binary(B, EM_OP_EQ, m, h, h));
    OP(be_binary(B, EM_OP_LOGICAL_AND, m, m2, m));
    OP(be_where(B, o, m, a, b));
    OP(be_where(B, h, m, h, h));
    /* a transposed view: the layout does not collapse to one dim */
    em_tensor *at = tensor(EM_F32, 2, (int64_t[]){4, 3}, (int64_t[]){1, 4}, 12);
    em_tensor *o43 = T(EM_F32, 4, 3);
    OP(be_copy(B, o43, at));
    OP(be_binary(B, EM_OP_SUB, o43, at, o43));
    em_tensor *all[] = {a, b, o, h, bf, d, i64, i32, u8, m, m2, at, o43};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

static void test_reduce_softmax_index_rng(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *x = T(EM_F32, 4, 300), *rowsum = T(EM_F32, 4, 1), *colmax = T(EM_F32, 1, 300);
    em_tensor *arg = T(EM_I64, 4, 1), *h = T(EM_F16, 4, 300), *hs = T(EM_F16, 1, 1);
    em_tensor *big = T(EM_BF16, 2, 8192), *bigmean = T(EM_BF16, 2, 1), *bm = T(EM_BOOL, 4, 300);
    em_tensor *bmax = T(EM_BOOL, 4, 1);
    bool last[2] = {false, true}, first[2] = {true, false}, both[2] = {true, true};
    OP(be_reduce(B, EM_OP_SUM, rowsum, x, last));
    OP(be_reduce(B, EM_OP_MAX, colmax, x, first));
    OP(be_reduce(B, EM_OP_ARGMAX, arg, x, last));
    OP(be_reduce(B, EM_OP_MEAN, hs, h, both));
    OP(be_reduce(B, EM_OP_MEAN, bigmean, big, last));
    OP(be_reduce(B, EM_OP_MAX, bmax, bm, last));
    OP(be_softmax(B, x, x, 1, false));
    OP(be_softmax(B, h, h, 0, true));
    /* the fused linear cross-entropy's rows */
    em_tensor *ct = T(EM_I64, 4), *cv = T(EM_F32, 4), *crs = T(EM_F32, 4), *cl = T(EM_F32, 4), *cdz = T(EM_F32, 4, 300);
    OP(be_call(B, (em_op_call){.op = EM_OP_CE_ROWS, .dtype = EM_F32, .dst = {cl, cdz}, .src = {x, ct, cv, crs},
                               .f = {0.1}}));
    em_tensor *ce[] = {ct, cv, crs, cl, cdz};
    for (size_t i = 0; i < sizeof ce / sizeof ce[0]; i++) drop(ce[i]);

    em_tensor *idx = T(EM_I64, 3), *sel = T(EM_F32, 4, 3), *src = T(EM_F32, 4, 3);
    em_tensor *gidx = T(EM_I64, 4, 2), *gout = T(EM_F32, 4, 2), *gi64 = T(EM_I64, 4, 2);
    em_tensor *xi = T(EM_I64, 4, 300);
    OP(be_index_select(B, sel, x, 1, idx));
    OP(be_index_add(B, x, 1, idx, src));
    OP(be_gather(B, gout, x, 1, gidx));
    OP(be_gather(B, gi64, xi, 1, gidx));
    OP(be_scatter_add(B, x, 1, gidx, gout));
    OP(be_rng(B, x, EM_RNG_NORMAL, 42, 0, 0, 1));
    OP(be_rng(B, h, EM_RNG_UNIFORM, 42, 1200, -1, 1));
    OP(be_rng(B, xi, EM_RNG_RANDINT, 7, 0, 0, 10));
    OP(be_rng(B, bm, EM_RNG_BERNOULLI, 7, 0, 0.5, 0));
    em_tensor *all[] = {x, rowsum, colmax, arg, h, hs, big, bigmean, bm, bmax, idx, sel, src,
                        gidx, gout, gi64, xi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

/* The fused optimizer steps (optim.k): float scalars for f32/f16/bf16, double for f64. */
static void test_fused_optimizer_steps(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *p = T(EM_F32, 300), *g = T(EM_F32, 300), *m = T(EM_F32, 300), *v = T(EM_F32, 300);
    em_tensor *vm = T(EM_F32, 300), *d = T(EM_F64, 300), *dg = T(EM_F64, 300), *h = T(EM_BF16, 300);
    em_tensor *hg = T(EM_BF16, 300);
    em_optim_args adam = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                          .bias_correction1 = 0.1, .bias_correction2 = 0.001, .decoupled = true,
                          .amsgrad = true};
    em_optim_args sgd = {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true};
    OP(be_fused_adam(B, &adam, p, g, m, v, vm));
    OP(be_fused_adam(B, &adam, d, dg, d, d, NULL));
    OP(be_fused_sgd(B, &sgd, p, g, m));
    OP(be_fused_sgd(B, &sgd, d, dg, d));
    OP(be_fused_sgd(B, &sgd, h, hg, h));
    /* the multi-tensor step: nine parameters (two launches of EMK_MT_SLOTS), one with a bf16 copy */
    em_adam_multi_item items[9];
    adam.amsgrad = false;
    for (int i = 0; i < 9; i++) items[i] = (em_adam_multi_item){.p = p, .g = g, .m = m, .v = v, .args = adam};
    items[3].low = h;
    em_adam_multi mt = {.n = 9, .items = items};
    int before = F.launches;
    OP(be_call(B, (em_op_call){.op = EM_OP_ADAM_STEP_MULTI, .dtype = EM_F32, .dst = {p}, .arg = &mt}));
    CHECK(F.launches == before + 2);
    em_tensor *all[] = {p, g, m, v, vm, d, dg, h, hg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

/* The fused attention (attention.k): forward, the split decode with its merge, backward, in
 * f32 and bf16. */
static void test_attention_kernels(void) {
    if (!g_have_nvrtc) return;
    install();
    em_dtype dts[2] = {EM_F32, EM_BF16};
    for (int i = 0; i < 2; i++) {
        em_dtype dt = dts[i];
        em_tensor *q = T(dt, 2, 4, 5, 64), *k = T(dt, 2, 2, 40, 64), *v = T(dt, 2, 2, 40, 64), *o = T(dt, 2, 4, 5, 64);
        em_tensor *g = T(dt, 2, 4, 5, 64), *dq = T(dt, 2, 4, 5, 64), *dk = T(dt, 2, 2, 40, 64), *dv = T(dt, 2, 2, 40, 64);
        em_tensor *lse = T(EM_F32, 40), *work = T(EM_F32, 4 * 40 * 66), *mask = T(EM_BOOL, 2, 40);
        OP(be_call(B, (em_op_call){.op = EM_OP_SDPA, .dtype = dt, .dst = {o, lse}, .src = {q, k, v, mask},
                                   .f = {0.125}, .i = {1, 35, 1}}));
        int before = F.launches;
        OP(be_call(B, (em_op_call){.op = EM_OP_SDPA, .dtype = dt, .dst = {o, lse, work}, .src = {q, k, v},
                                   .f = {0.125}, .i = {1, 35, 4}}));
        CHECK(F.launches == before + 2); /* the parts, then the merge */
        before = F.launches;
        OP(be_call(B, (em_op_call){.op = EM_OP_SDPA_BACKWARD, .dtype = dt, .dst = {dq, dk, dv},
                                   .src = {g, q, k, v, o, lse}, .f = {0.125}, .i = {1, 35}}));
        CHECK(F.launches == before + 2); /* dk and dv, then dq */
        em_tensor *all[] = {q, k, v, o, g, dq, dk, dv, lse, work, mask};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) drop(all[j]);
    }
}

static void test_integer_matmul_uses_the_kernel(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *a = T(EM_I64, 2, 3, 4), *b = T(EM_I64, 2, 4, 5), *o = T(EM_I64, 2, 3, 5);
    int before = gemm_calls;
    OP(be_matmul(B, o, a, b));
    CHECK(gemm_calls == before); /* cuBLAS has no int64 GEMM */
    drop(a); drop(b); drop(o);
}

/* A grid-stride kernel gets as many blocks as the SMs hold at once (the occupancy its
 * registers allow), asked once per kernel; without the driver's calculator, 8 per SM. */
static void test_1d_grid_from_occupancy(void) {
    if (!g_have_nvrtc) return;
    em_tensor *a = T(EM_F32, 1 << 20), *o = T(EM_F32, 1 << 20); /* 4096 blocks of work */
    g_resident = 0;
    install();
    OP(be_unary(B, EM_OP_NEG, o, a, NULL));
    CHECK(F.last_grid[0] == 84 * 8); /* the fake has 84 SMs */
    g_resident = 3;
    install();
    int calls = g_occupancy_calls;
    OP(be_unary(B, EM_OP_NEG, o, a, NULL));
    CHECK(F.last_grid[0] == 84 * 3 && F.last_block[0] == 256);
    OP(be_unary(B, EM_OP_EXP, o, a, NULL));
    CHECK(F.last_grid[0] == 84 * 3);
    CHECK(g_occupancy_calls == calls + 1); /* the same kernel: asked once */
    /* fewer elements than that: one block per 256 */
    em_tensor *s = T(EM_F32, 1000), *so = T(EM_F32, 1000);
    OP(be_unary(B, EM_OP_NEG, so, s, NULL));
    CHECK(F.last_grid[0] == 4);
    g_resident = 0;
    drop(a); drop(o); drop(s); drop(so);
}

/* More than 65535 tiles of M (CUDA's grid y limit, M > 2,097,120): the grid stays within
 * the limit and the kernel loops over the remaining tiles. */
static void test_tall_matmul_fits_the_grid(void) {
    if (!g_have_nvrtc) return;
    install();
    int64_t M = 2100000;
    em_tensor *a = T(EM_I64, M, 2), *b = T(EM_I64, 2, 3), *o = T(EM_I64, M, 3);
    OP(be_matmul(B, o, a, b));
    CHECK(!strcmp(fake_func_name(F.last_func), "matmul_i64"));
    CHECK(F.last_grid[1] == 65535 && F.last_grid[0] == 1 && F.last_grid[2] == 1);
    CHECK((int64_t)F.last_grid[1] * EMK_MM_TILE < M); /* so the kernel must loop */
    drop(a); drop(b); drop(o);
}

static void test_wrong_argument_sizes_are_caught(void) {
    if (!g_have_nvrtc) return;
    install();
    size_t grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    char storage[8][128] = {{0}};
    void *params[8];
    for (int i = 0; i < 8; i++) params[i] = storage[i];
    /* unary_f32's p0, p1 are float: passing doubles must be refused before launching */
    size_t sizes[8] = {8, 8, sizeof(emk_shape), sizeof(emk_strides), sizeof(emk_strides), 4, 8, 8};
    int before = F.launches;
    CHECK(em__cuda_launch(0, "unary_f32", grid, block, params, sizes, 8, "test") == EM_ERR_INTERNAL);
    CHECK_ERROR(EM_ERR_INTERNAL, "kernel unary_f32 takes 8 arguments of sizes 8,8,80,72,72,4,4,4");
    CHECK(F.launches == before);
    sizes[6] = sizes[7] = 4;
    CHECK_OK(em__cuda_launch(0, "unary_f32", grid, block, params, sizes, 8, "test"));
}

/* ---- matmul through the fake cuBLAS, against a plain row-major reference ---- */

static void reference(const em_tensor *a, const em_tensor *b, float *out) {
    int nd = a->ndim;
    int64_t batch = nd == 3 ? a->shape[0] : 1, M = a->shape[nd - 2], K = a->shape[nd - 1],
            N = b->shape[nd - 1];
    const float *A = f32((em_tensor *)a), *Bm = f32((em_tensor *)b);
    for (int64_t q = 0; q < batch; q++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                float acc = 0;
                for (int64_t l = 0; l < K; l++)
                    acc += A[a->offset + (nd == 3 ? q * a->strides[0] : 0) + i * a->strides[nd - 2] +
                             l * a->strides[nd - 1]] *
                           Bm[b->offset + (nd == 3 ? q * b->strides[0] : 0) + l * b->strides[nd - 2] +
                              j * b->strides[nd - 1]];
                out[(q * M + i) * N + j] = acc;
            }
}

static void check_matmul(em_tensor *a, em_tensor *b, em_tensor *o, size_t na, size_t nb) {
    for (size_t i = 0; i < na; i++) f32(a)[i] = (float)((i * 7) % 11) - 5;
    for (size_t i = 0; i < nb; i++) f32(b)[i] = (float)((i * 5) % 13) - 6;
    size_t no = (size_t)o->storage->nbytes / 4;
    float *want = calloc(no, sizeof *want);
    reference(a, b, want);
    int before = gemm_calls;
    OP(be_matmul(B, o, a, b));
    CHECK(gemm_calls == before + 1);
    for (size_t i = 0; i < no; i++) CHECK_NEAR(f32(o)[i], want[i], 1e-4);
    free(want);
}

static void test_matmul_transpose_trick(void) {
    if (!g_have_nvrtc) return;
    install();
    /* plain row-major, batched */
    em_tensor *a = T(EM_F32, 2, 3, 4), *b = T(EM_F32, 2, 4, 5), *o = T(EM_F32, 2, 3, 5);
    check_matmul(a, b, o, 24, 40);
    drop(a); drop(b); drop(o);
    /* b broadcast over the batch (stride 0) and transposed (a [5, 4] buffer read as [4, 5]) */
    a = T(EM_F32, 2, 3, 4);
    b = tensor(EM_F32, 3, (int64_t[]){2, 4, 5}, (int64_t[]){0, 1, 4}, 20);
    o = T(EM_F32, 2, 3, 5);
    check_matmul(a, b, o, 24, 20);
    drop(a); drop(b); drop(o);
    /* a transposed, one row (M = 1), odd sizes */
    a = tensor(EM_F32, 2, (int64_t[]){1, 7}, (int64_t[]){1, 1}, 7);
    b = T(EM_F32, 7, 3);
    o = T(EM_F32, 1, 3);
    check_matmul(a, b, o, 7, 21);
    drop(a); drop(b); drop(o);
    a = tensor(EM_F32, 2, (int64_t[]){6, 5}, (int64_t[]){1, 6}, 30);
    b = T(EM_F32, 5, 2);
    o = T(EM_F32, 6, 2);
    check_matmul(a, b, o, 30, 10);
    drop(a); drop(b); drop(o);
}

/* cuBLAS refusing a GEMM is not a failed matmul: NOT_SUPPORTED or ARCH_MISMATCH run Ember's
 * kernel; ALLOC_FAILED first empties Ember's cache and retries, then runs the kernel; any
 * other failure is reported. cuBLAS's workspace comes from the caching allocator. */
static void test_cublas_failures_fall_back_or_retry(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *a = T(EM_F32, 3, 4), *b = T(EM_F32, 4, 5), *o = T(EM_F32, 3, 5);
    check_matmul(a, b, o, 12, 20);
    CHECK(ws_size == (size_t)32 << 20 && ws_ptr != NULL); /* Hopper's size */
    CHECK(em_memory_allocated(EM_DEVICE(EM_CUDA, 0)) >= (int64_t)32 << 20); /* counted as Ember's */

    static const cublasStatus_t refusals[] = {CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_ARCH_MISMATCH};
    for (int i = 0; i < 2; i++) {
        gemm_fail[0] = refusals[i];
        gemm_nfail = 1;
        int calls = gemm_calls, launches = F.launches;
        CHECK_OK(be_matmul(B, o, a, b));
        CHECK(gemm_calls == calls && F.launches == launches + 1);
        CHECK(!strcmp(fake_func_name(F.last_func), "matmul_f32")); /* Ember's kernel instead */
        CHECK(!em_failed());
    }

    /* out of memory: a cached, unused segment is given back to the driver, and the retry works */
    em_block cached;
    CHECK_OK(em__mem_alloc(B, EM_DEVICE(EM_CUDA, 0), (size_t)64 << 20, &cached));
    em__mem_free(B, EM_DEVICE(EM_CUDA, 0), &cached);
    int live = F.live_allocs, attempts = gemm_attempts;
    gemm_fail[0] = CUBLAS_STATUS_ALLOC_FAILED;
    gemm_nfail = 1;
    check_matmul(a, b, o, 12, 20); /* right, from the second attempt */
    CHECK(gemm_attempts == attempts + 2);
    CHECK(F.live_allocs == live - 1); /* the cache was emptied in between */
    /* still out of memory after that: Ember's kernel */
    gemm_fail[0] = gemm_fail[1] = CUBLAS_STATUS_ALLOC_FAILED;
    gemm_nfail = 2;
    int launches = F.launches;
    CHECK_OK(be_matmul(B, o, a, b));
    CHECK(F.launches == launches + 1 && !strcmp(fake_func_name(F.last_func), "matmul_f32"));
    /* a real failure is an error that says what failed */
    gemm_fail[0] = CUBLAS_STATUS_EXECUTION_FAILED;
    gemm_nfail = 1;
    CHECK(be_matmul(B, o, a, b) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "cuda:0: matmul: cublasGemmStridedBatchedEx (float32, 3x4x5, batch 1) failed");
    drop(a); drop(b); drop(o);
}

/* A buffer argument at a byte offset (a tensor whose storage offset is not zero) reaches
 * the kernel as base + offset, through the op launcher and through users' kernels. */
static void test_pointer_offsets_reach_the_kernel(void) {
    if (!g_have_nvrtc) return;
    install();
    em_tensor *in = T(EM_F32, 4, 8), *out = T(EM_F32, 4, 8);
    emk_shape sh = {0};
    emk_strides st = {0};
    em_karg args[] = {{.kind = EM_KARG_PTR, .v.ptr = {out->storage->block.handle, 24}},
                      EM_KBUF(in->storage->block.handle), EM_KSTRUCT(sh), EM_KSTRUCT(st), EM_KSTRUCT(st),
                      EM_KI32(0), EM_KF32(0), EM_KF32(0)};
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    F.capture_u64 = 3;
    CHECK_OK(em__cuda_gpu.launch(0, "unary_f32", grid, block, 8, args, "test"));
    CHECK(F.last_u64[0] == (uint64_t)(uintptr_t)out->storage->block.handle + 24);
    CHECK(F.last_u64[1] == (uint64_t)(uintptr_t)in->storage->block.handle);

    /* a user's kernel given a narrowed view: rows 1.. of a [4, 8] tensor start 32 bytes in */
    static const char *src = "KERNEL scale(GLOBAL float *x, int n) { i64 i = GLOBAL_ID(0); if (i < n) x[i] *= 2; }\n";
    em_kernel *k = em_kernel_compile(src, "scale", EM_DEVICE(EM_CUDA, 0));
    CHECK(k != NULL);
    em_tensor *rows = em_narrow(in, 0, 1, 3);
    CHECK(rows != NULL && rows->offset == 8);
    if (k && rows) {
        F.capture_u64 = 1;
        CHECK_OK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(32), EM_KARGS(em_arg_tensor(rows), em_arg_i32(24))));
        CHECK(F.last_u64[0] == (uint64_t)(uintptr_t)in->storage->block.handle + 32);
    }
    F.capture_u64 = 0;
    em_release(rows);
    em_kernel_free(k);
    em_clear_error();
    drop(in); drop(out);
}

/* Compute capability 9.0 is one NVRTC knows: the program is a CUBIN for sm_90 (no JIT at
 * load), which the driver gets as an ELF image. */
static void test_cubin_for_a_known_architecture(void) {
    if (!g_have_nvrtc) return;
    install();
    F.cc_major = 9;
    F.cc_minor = 0;
    em_tensor *x = T(EM_F32, 4, 300);
    OP(be_softmax(B, x, x, 1, false));
    CHECK(!strncmp(F.last_image, "\177ELF", 4));
    drop(x);
}

/* EMBER_CUDA_LAUNCH_BLOCKING=1: every launch is waited for, and a failure names its op. */
static void test_launch_blocking(void) {
    if (!g_have_nvrtc) return;
    setenv("EMBER_CUDA_LAUNCH_BLOCKING", "1", 1);
    install();
    em_tensor *x = T(EM_F32, 4, 300), *y = T(EM_F32, 4, 300);
    int syncs = F.stream_syncs;
    OP(be_unary(B, EM_OP_EXP, y, x, NULL));
    CHECK(F.stream_syncs == syncs + 1);
    F.sync_result = CUDA_ERROR_ILLEGAL_ADDRESS;
    CHECK(be_softmax(B, y, x, 1, false) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "cuda:0: softmax: queued work failed; the last op queued on this device was 'softmax'");
    F.sync_result = CUDA_SUCCESS;
    unsetenv("EMBER_CUDA_LAUNCH_BLOCKING");
    install();
    syncs = F.stream_syncs;
    OP(be_unary(B, EM_OP_EXP, y, x, NULL));
    CHECK(F.stream_syncs == syncs); /* without it, launches are not waited for */
    drop(x); drop(y);
}

/* Users' kernels (ember/kernel.h) through the public API on the fake cuda:0. */
static void test_custom_kernels(void) {
    if (!g_have_nvrtc) return;
    install();
    static const char *src =
        "KERNEL vecadd(GLOBAL const float *a, GLOBAL const float *b, GLOBAL float *c, int n) {\n"
        "    i64 i = GLOBAL_ID(0);\n"
        "    if (i < n) c[i] = a[i] + b[i];\n"
        "}\n";
    em_kernel *k = em_kernel_compile(src, "vecadd", EM_DEVICE(EM_CUDA, 0));
    CHECK(k != NULL);
    if (!k) { fprintf(stderr, "  %s\n", em_last_error()); em_clear_error(); return; }
    em_tensor *a = T(EM_F32, 1000), *b = T(EM_F32, 1000), *c = T(EM_F32, 1000);
    int before = F.launches;
    CHECK_OK(em_kernel_launch(k, EM_DIM3(4), EM_DIM3(256),
                              EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(1000))));
    CHECK(F.launches == before + 1 && F.last_grid[0] == 4 && F.last_block[0] == 256);
    CHECK(!strcmp(fake_func_name(F.last_func), "vecadd"));
    /* an int64 where the kernel takes an int: CUDA would misread it; Ember refuses */
    CHECK(em_kernel_launch(k, EM_DIM3(4), EM_DIM3(256),
                           EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i64(1000))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 3 is 8 bytes but the kernel's parameter 3 is 4 bytes");
    CHECK(em_kernel_launch(k, EM_DIM3(4), EM_DIM3(256), EM_KARGS(em_arg_tensor(a), em_arg_tensor(b))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the kernel has 4 parameters, the launch passed 2 arguments");
    CHECK(em_kernel_launch(k, EM_DIM3(4), EM_DIM3(2048),
                           EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(1))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "at most 1024 threads per block");
    CHECK(F.launches == before + 1);
    em_kernel_free(k);

    CHECK(em_kernel_compile(src, "vecmul", EM_DEVICE(EM_CUDA, 0)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the source has no kernel named 'vecmul'");
    CHECK(em_kernel_compile("KERNEL broken(GLOBAL float *x) { x[0] = nope; }\n", "broken",
                            EM_DEVICE(EM_CUDA, 0)) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "nope");
    drop(a); drop(b); drop(c);
}

int main(void) {
    int major = 0, minor = 0;
    const char *reason = NULL;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (nv) {
        g_nvrtc = *nv; /* the library stays loaded across the resets below */
        g_have_nvrtc = true;
    } else {
        fprintf(stderr, "test_cuda_marshal needs NVRTC to compile the real kernels: %s\n", reason);
    }
    install(); /* before anything asks core's registry about CUDA: it remembers the answer */
    RUN(test_wrong_argument_sizes_are_caught);
    RUN(test_elementwise_ops);
    RUN(test_reduce_softmax_index_rng);
    RUN(test_fused_optimizer_steps);
    RUN(test_attention_kernels);
    RUN(test_integer_matmul_uses_the_kernel);
    RUN(test_tall_matmul_fits_the_grid);
    RUN(test_1d_grid_from_occupancy);
    RUN(test_matmul_transpose_trick);
    RUN(test_custom_kernels);
    RUN(test_cublas_failures_fall_back_or_retry);
    RUN(test_pointer_offsets_reach_the_kernel);
    RUN(test_cubin_for_a_known_architecture);
    RUN(test_launch_blocking);
    em__cuda_backend_reset();
    for (int i = 0; i < MAX_FAKE_MODULES; i++) free(module_images[i]);
    if (!g_have_nvrtc) {
        printf("0 passed, 1 failed (no NVRTC)\n");
        return 1;
    }
    return test_summary();
}

#else
/* Built without the CUDA headers: the backend is the fixed "unavailable" table. */
#include "backends/backend.h"
static void test_unavailable_without_headers(void) {
    CHECK(em__cuda_backend.init() == EM_ERR_UNAVAILABLE);
    CHECK(em__cuda_backend.supports == NULL && em__cuda_backend.run == NULL);
}
int main(void) {
    printf("built without CUDA headers: there are no CUDA ops to marshal\n");
    RUN(test_unavailable_without_headers);
    return test_summary();
}
#endif
