/* A whole training step (zero_grad, the MLP's forward, the loss, backward, an optimizer step,
 * a loss sum on the device) captured as a CUDA graph over the fake driver
 * (tests/cuda_fake_driver.h) with the REAL NVRTC compiling Ember's kernels, and a cuBLAS that
 * records its calls: the capture must see no call that a capture cannot record (a host wait, a
 * copy to or from the host, a cuMemAlloc outside relaxed mode), which on a GPU would fail it.
 * The loss is written with one-hot targets (log_softmax, times the one-hot rows, summed,
 * negated, averaged), or is em_cross_entropy on class indices, which on a CUDA device checks
 * and weighs its targets there (src/nn/loss.c); the optimizer is SGD or `ember train`'s Adam,
 * whose multi-tensor step reads its step count from device memory that the recorded
 * adam_schedule kernel advances, so each replay takes the next step; the host's counts
 * follow through em_optim_step_replayed. An Adam update that would bake host scalars into the
 * recording (amsgrad's per-tensor kernel) fails the capture with its reason, the step runs
 * eagerly, and the failed capture's step counts are undone.
 * The fake runs no kernel, so values are not checked here: tests/test_graph_ready_step.c
 * proves the device-side schedule and target check on OpenCL, and examples/cuda_graph_step.c
 * compares a replayed training run with an eager one where a GPU runs it. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <ember/graph.h>
#include "cuda_fake_driver.h"
#include "core/internal_api.h" /* em__device_checks_reset */

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

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAM_AMSGRAD } opt_kind;

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

#define CALLS 5

static em_optimizer *make_opt(em_module *m, opt_kind k) {
    if (k == OPT_SGD) return em_sgd(m, 0.05);
    em_adam_opts o = em_adam_defaults(1e-3);
    o.amsgrad = k == OPT_ADAM_AMSGRAD;
    return em_adam_ex(m, o);
}

/* Whether name is among the kernels recorded since index from, and where (-1: not). */
static int recorded_at(const char *name, int from) {
    for (int i = from; i < F.ncaptured_kernels; i++)
        if (!strcmp(F.captured_kernels[i], name)) return i;
    return -1;
}

/* The step with one loss or the other and an optimizer, CALLS calls with one warm-up (each
 * replay that did not capture counted with em_optim_step_replayed); its statistics. */
static em_graph_step_stats run_steps(bool one_hot, opt_kind kind) {
    int begins = F.capture_begins, launches = F.graph_launches, illegal = F.illegal_in_capture;
    int nodes = F.captured_nodes, kernels = F.ncaptured_kernels;
    em_module *model = em_nn_sequential(em_nn_linear(784, 32), em_nn_relu(), em_nn_linear(32, 10));
    CHECK(model && em_module_to(model, CUDA0) == EM_OK);
    step_ctx c = {.model = model, .opt = make_opt(model, kind), .one_hot = one_hot,
                  .x = em_zeros(EM_SHAPE(16, 784), EM_OPTS(.device = CUDA0)),
                  .y = one_hot ? em_zeros(EM_SHAPE(16, 10), EM_OPTS(.device = CUDA0))
                               : em_zeros(EM_SHAPE(16), EM_OPTS(.device = CUDA0, .dtype = EM_I64)),
                  .loss_sum = em_zeros(EM_SHAPE(1), EM_OPTS(.device = CUDA0))};
    CHECK(c.opt && c.x && c.y && c.loss_sum);
    em_graph_step *step = em_graph_step_new(CUDA0, 1);
    em_tensor *inputs[2] = {c.x, c.y};
    em_named_tensor params[4];
    CHECK(em_module_parameters(model, params, 4) == 4);
    em_tensor *first = params[0].tensor;
    for (int i = 0; i < CALLS; i++) {
        em_graph_step_stats before, after;
        CHECK_OK(em_graph_step_get_stats(step, &before));
        CHECK_OK(em_graph_step_run(step, inputs, 2, 0, train_step, &c));
        CHECK_OK(em_graph_step_get_stats(step, &after));
        if (after.replays > before.replays && after.captures == before.captures)
            CHECK_OK(em_optim_step_replayed(c.opt));
        /* the host's counts: one step per call, replayed or not, a failed capture undone */
        CHECK(em_optim_steps(c.opt) == i + 1);
        CHECK(em_optim_scalar(c.opt, first, "step") == (double)(i + 1));
    }
    em_graph_step_stats st;
    CHECK_OK(em_graph_step_get_stats(step, &st));
    CHECK(F.capture_begins == begins + 1 && F.capture_ends == F.capture_begins);
    if (st.captures) {
        CHECK(F.illegal_in_capture == illegal && F.graph_launches == launches + CALLS - 1);
        printf("  one step: %d nodes recorded, %d of them kernels\n", F.captured_nodes - nodes,
               F.ncaptured_kernels - kernels);
        /* Adam: the schedule advances on the device before the multi-tensor update reads it */
        int sched = recorded_at("adam_schedule", kernels);
        if (kind == OPT_ADAM) CHECK(sched >= 0 && recorded_at("adam_multi_f32", sched) > sched);
        if (kind == OPT_SGD) CHECK(sched < 0);
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

static void captures_and_replays(bool one_hot, opt_kind kind) {
    if (!g_have_nvrtc) SKIP("NVRTC is not installed: the real kernels cannot be compiled");
    em_graph_step_stats st = run_steps(one_hot, kind);
    if (st.last_failure[0]) fprintf(stderr, "  capture failed: %s\n", st.last_failure);
    CHECK(st.failed_captures == 0 && st.captures == 1 && st.replays == CALLS - 1 && st.eager_runs == 1);
    CHECK(F.captured_nodes >= 10);   /* the step's kernels and copies */
    CHECK(gemm_calls > 0);
}

static void test_step_with_one_hot_loss_captures(void) { captures_and_replays(true, OPT_SGD); }

/* em_cross_entropy on class indices: its targets checked and weighed on the device, no host
 * read; the step records. */
static void test_step_with_class_index_loss_captures(void) { captures_and_replays(false, OPT_SGD); }

/* `ember train`'s step: class indices and Adam, whose step count lives on the device. */
static void test_train_step_with_adam_captures(void) { captures_and_replays(false, OPT_ADAM); }

/* amsgrad's per-tensor Adam kernel takes its bias corrections from the host: the capture
 * fails with that reason (a replay would repeat the recorded step), the calls run eagerly,
 * and the counts of the failed capture's em_step are undone. */
static void test_adam_with_host_scalars_refuses_capture(void) {
    if (!g_have_nvrtc) SKIP("NVRTC is not installed: the real kernels cannot be compiled");
    em_graph_step_stats st = run_steps(false, OPT_ADAM_AMSGRAD);
    CHECK(st.failed_captures == 1 && st.captures == 0 && st.replays == 0 && st.eager_runs == CALLS);
    CHECK(strstr(st.last_failure, "Adam's step inside a graph capture must read its step count") != NULL);
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
    RUN(test_step_with_class_index_loss_captures);
    RUN(test_train_step_with_adam_captures);
    RUN(test_adam_with_host_scalars_refuses_capture);
    em__device_checks_reset();   /* the target check's flag, before the backend goes */
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
