/* Generation's one-token decode step captured as a CUDA graph over the fake driver
 * (tests/cuda_fake_driver.h) with the REAL NVRTC compiling Ember's kernels and a cuBLAS that
 * records its calls. On CUDA, em_generate takes the static decode form (the cache's write
 * position, the attention's length and the rotary rows in device memory) and replays it from
 * a graph: the capture must see no call a capture cannot record (a host wait, a copy to or
 * from the host), the graph is captured once and replayed for every later token, its
 * recording does not depend on the tokens or positions (the same node count for another
 * prompt of the same length), a new batch or cache length captures anew, and
 * EMBER_CUDA_GRAPHS=0 keeps the steps eager. The fake runs no kernel, so the tokens are not
 * checked here: tests/test_generate_static.c proves the static form's tokens on the CPU and
 * OpenCL. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <stdlib.h>
#include <ember/graph.h>
#include "cuda_fake_driver.h"
#include "core/internal_api.h" /* em__device_checks_reset */

static em_cu_api g_cu;
static em_nvrtc_api g_nvrtc;
static em_cublas_api g_cublas;
static bool g_have_nvrtc;
static const char *g_data;
static const em_device CUDA0 = {EM_CUDA, 0};

#define NEW_TOKENS 6

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

/* What one generation did to the fake's counts. */
typedef struct run_counts {
    int captures, nodes, launches, illegal;
    em_generation g;
} run_counts;

/* rows prompts of `len` ids each (id base + i), NEW_TOKENS greedy tokens each. */
static run_counts generate(em_model *m, int64_t rows, int64_t len, int64_t base) {
    run_counts c = {0};
    int begins = F.capture_begins, nodes = F.captured_nodes, launches = F.graph_launches,
        illegal = F.illegal_in_capture;
    int64_t *buf = malloc(sizeof *buf * (size_t)(rows * len));
    const int64_t *prompts[4];
    int64_t lengths[4];
    for (int64_t r = 0; buf && r < rows; r++) {
        for (int64_t i = 0; i < len; i++) buf[r * len + i] = base + r + i;
        prompts[r] = buf + r * len;
        lengths[r] = len;
    }
    em_generate_opts o = {.max_new_tokens = NEW_TOKENS, .ignore_eos = true};
    CHECK(buf && rows <= 4);
    if (buf && rows <= 4) CHECK_OK(em_generate(m, NULL, prompts, lengths, rows, &o, &c.g));
    free(buf);
    c.captures = F.capture_begins - begins;
    c.nodes = F.captured_nodes - nodes;
    c.launches = F.graph_launches - launches;
    c.illegal = F.illegal_in_capture - illegal;
    return c;
}

static void decode_replays(const char *family) {
    if (!g_have_nvrtc) SKIP("NVRTC is not installed: the real kernels cannot be compiled");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", g_data, family);
    em_model *m = em_model_load(dir, &(em_model_opts){.device = CUDA0, .dtype = EM_F32});
    if (!m) fprintf(stderr, "  load %s: %s\n", dir, em_last_error());
    CHECK(m != NULL);
    if (!m) return;
    /* the steps after the prefill: one eager warm-up, then one capture replayed for the rest */
    run_counts a = generate(m, 1, 5, 3);
    if (a.g.decode_graph[0]) printf("  %s: cuda graph: %s; %d nodes recorded\n", family, a.g.decode_graph, a.nodes);
    CHECK(a.captures == 1 && a.illegal == 0 && a.nodes > 0);
    CHECK(a.g.steps == NEW_TOKENS - 1 && a.g.graph_replays == NEW_TOKENS - 2 && a.launches == a.g.graph_replays);
    CHECK(strncmp(a.g.decode_graph, "decode replayed", 15) == 0);
    /* another prompt of the same shape records the same graph: positions and tokens are data */
    run_counts b = generate(m, 1, 5, 11);
    CHECK(b.captures == 1 && b.illegal == 0 && b.nodes == a.nodes && b.g.graph_replays == NEW_TOKENS - 2);
    /* a batch of two padded to one length, and a longer cache: each captures its own graph */
    run_counts c = generate(m, 2, 5, 3), d = generate(m, 1, 9, 3);
    CHECK(c.captures == 1 && c.illegal == 0 && c.g.graph_replays == NEW_TOKENS - 2);
    CHECK(d.captures == 1 && d.illegal == 0 && d.g.graph_replays == NEW_TOKENS - 2);
    /* graphs off: the dynamic form, eagerly */
    setenv("EMBER_CUDA_GRAPHS", "0", 1);
    run_counts e = generate(m, 1, 5, 3);
    unsetenv("EMBER_CUDA_GRAPHS");
    CHECK(e.captures == 0 && e.launches == 0 && e.g.graph_replays == 0 && strncmp(e.g.decode_graph, "off (", 5) == 0);
    CHECK(e.g.steps == NEW_TOKENS - 1);
    em_generation_free(&a.g);
    em_generation_free(&b.g);
    em_generation_free(&c.g);
    em_generation_free(&d.g);
    em_generation_free(&e.g);
    em_model_free(m);
    CHECK(!em_failed());
    em_clear_error();
}

static void test_llama_decode_replays(void) { decode_replays("llama"); }
static void test_gpt2_decode_replays(void) { decode_replays("gpt2"); }

int main(void) {
    g_data = getenv("EMBER_TEST_DATA");
    if (!g_data) g_data = "tests/data";
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
    RUN(test_llama_decode_replays);
    RUN(test_gpt2_decode_replays);
    em__device_checks_reset();
    em_memory_empty_cache(CUDA0);
    em__cuda_backend_reset();
    fake_capture_reset();
    return test_summary();
}

#else
int main(void) {
    test_skip_case("graph capture of a decode step", "built without the CUDA headers (cuda.h): no CUDA backend");
    return test_summary();
}
#endif
