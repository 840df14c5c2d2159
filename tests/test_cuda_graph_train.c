/* A whole training step (zero_grad, the MLP's forward, the loss, backward, an SGD step, a loss
 * sum on the device) captured as a CUDA graph over the fake driver
 * (tests/cuda_fake_driver.h) with the REAL NVRTC compiling Ember's kernels, and a cuBLAS that
 * records its calls: the capture must see no call that a capture cannot record (a host wait, a
 * copy to or from the host, a cuMemAlloc outside relaxed mode), which on a GPU would fail it.
 * em_cross_entropy with class indices reads its targets to the host (to check them and to weigh
 * them), so a step with it fails the capture cleanly and runs eagerly; the same loss written
 * with one-hot targets (log_softmax, times the one-hot rows, summed, negated, averaged) is
 * device work only and captures.
 * The fake runs no kernel, so values are not checked here (examples/cuda_graph_step.c compares
 * a replayed training run with an eager one where a GPU runs it). */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <ember/graph.h>
#include "cuda_fake_driver.h"

static em_cu_api g_cu;
static em_nvrtc_api g_nvrtc;
static em_cublas_api g_cublas;
static bool g_have_nvrtc;
static int gemm_calls;
static const em_device CUDA0 = {EM_CUDA, 0};

static cublasStatus_t b_create(cublasHandle_t *h) { *h = (cublasHandle_t)&g_cublas; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_destroy(cublasHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_stream(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_workspace(cublasHandle_t h, void *p, size_t n) { (void)h; (void)p; (void)n; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t b_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                             const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
                             cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct,
                             int ldc, long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h; (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)A; (void)at; (void)lda; (void)sa;
    (void)B; (void)bt; (void)ldb; (void)sb; (void)beta; (void)C; (void)ct; (void)ldc; (void)sc; (void)batch;
    (void)compute; (void)algo;
    gemm_calls++;   /* cuBLAS's kernels are captured like any launch on the stream */
    return CUBLAS_STATUS_SUCCESS;
}

static void install(void) {
    em__cuda_backend_reset();
    fake_capture_reset();
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
    g_cublas.cublasSetWorkspace = b_workspace;
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc = g_have_nvrtc ? &g_nvrtc : NULL,
                              .nvrtc_reason = "none (fake)", .cublas = &g_cublas, .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

typedef struct step_ctx {
    em_module *model;
    em_optimizer *opt;
    em_tensor *x, *y, *loss_sum;
    bool one_hot;              /* y is [batch, classes] float one-hot rows, not class indices */
} step_ctx;

static em_status train_step(void *p) {
    step_ctx *c = p;
    em_scope s = em_scope_begin();
    em_status st = em_zero_grad(c->opt);
    em_tensor *logits = em_forward(c->model, c->x);
    em_tensor *loss = c->one_hot ? em_neg(em_mean(em_sum(em_mul(em_log_softmax(logits, 1), c->y), EM_DIMS(1), false),
                                                  EM_ALL_DIMS, false))
                                 : em_cross_entropy(logits, c->y, 0.0);
    if (st == EM_OK) st = loss ? em_backward(loss) : em_last_status();
    if (st == EM_OK) st = em_step(c->opt);
    if (st == EM_OK) st = em_add_(c->loss_sum, em_detach(loss), 1.0);
    em_scope_end(s);
    return st;
}

/* The step with one loss or the other, four calls with one warm-up; its statistics. */
static em_graph_step_stats run_steps(bool one_hot) {
    int begins = F.capture_begins, launches = F.graph_launches, illegal = F.illegal_in_capture;
    int nodes = F.captured_nodes;
    em_module *model = em_nn_sequential(em_nn_linear(784, 32), em_nn_relu(), em_nn_linear(32, 10));
    CHECK(model && em_module_to(model, CUDA0) == EM_OK);
    step_ctx c = {.model = model, .opt = em_sgd(model, 0.05), .one_hot = one_hot,
                  .x = em_zeros(EM_SHAPE(16, 784), EM_OPTS(.device = CUDA0)),
                  .y = one_hot ? em_zeros(EM_SHAPE(16, 10), EM_OPTS(.device = CUDA0))
                               : em_zeros(EM_SHAPE(16), EM_OPTS(.device = CUDA0, .dtype = EM_I64)),
                  .loss_sum = em_zeros(EM_SHAPE(1), EM_OPTS(.device = CUDA0))};
    CHECK(c.opt && c.x && c.y && c.loss_sum);
    em_graph_step *step = em_graph_step_new(CUDA0, 1);
    em_tensor *inputs[2] = {c.x, c.y};
    for (int i = 0; i < 4; i++) CHECK_OK(em_graph_step_run(step, inputs, 2, 0, train_step, &c));
    em_graph_step_stats st;
    CHECK_OK(em_graph_step_get_stats(step, &st));
    CHECK(F.capture_begins == begins + 1 && F.capture_ends == F.capture_begins);
    if (st.captures) {
        CHECK(F.illegal_in_capture == illegal && F.graph_launches == launches + 3);
        printf("  one step: %d nodes recorded\n", F.captured_nodes - nodes);
    }
    em_graph_step_free(step);
    em_optim_free(c.opt);
    em_release(c.x);
    em_release(c.y);
    em_release(c.loss_sum);
    em_module_free(model);
    CHECK(!em_failed());
    return st;
}

static void test_step_with_one_hot_loss_captures(void) {
    if (!g_have_nvrtc) SKIP("NVRTC is not installed: the real kernels cannot be compiled");
    em_graph_step_stats st = run_steps(true);
    if (st.last_failure[0]) fprintf(stderr, "  capture failed: %s\n", st.last_failure);
    CHECK(st.failed_captures == 0 && st.captures == 1 && st.replays == 3 && st.eager_runs == 1);
    CHECK(F.captured_nodes >= 10);   /* the step's kernels and copies */
    CHECK(gemm_calls > 0);
}

/* em_cross_entropy's host read of the targets fails the capture with its reason; the step goes
 * on eagerly, every call. */
static void test_step_with_class_index_loss_falls_back(void) {
    if (!g_have_nvrtc) SKIP("NVRTC is not installed: the real kernels cannot be compiled");
    em_graph_step_stats st = run_steps(false);
    CHECK(st.failed_captures == 1 && st.captures == 0 && st.replays == 0 && st.eager_runs == 4);
    CHECK(strstr(st.last_failure, "graph capture failed: a copy to host memory during the capture") != NULL);
}

int main(void) {
    int major = 0, minor = 0;
    const char *reason = NULL;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (nv) {
        g_nvrtc = *nv; /* the library stays loaded across the reset below */
        g_have_nvrtc = true;
    } else {
        fprintf(stderr, "NVRTC not found: %s\n", reason);
    }
    install(); /* before core's registry asks: it remembers the answer */
    RUN(test_step_with_one_hot_loss_captures);
    RUN(test_step_with_class_index_loss_falls_back);
    em_memory_empty_cache(CUDA0);
    em__cuda_backend_reset();
    fake_capture_reset();
    return test_summary();
}

#else
int main(void) {
    test_skip_case("graph capture of a training step", "built without the CUDA headers (cuda.h): no CUDA backend");
    return test_summary();
}
#endif
