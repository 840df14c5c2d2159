/* Conv2d on cuDNN, checked without a GPU or cuDNN: the fake CUDA driver (device memory is
 * host memory) and a fake cuDNN (tests/cuda_fake_cudnn.h) that Ember's loader finds through
 * EMBER_CUDA_PATH, by soname, with its symbols looked up by name. The fake checks and records
 * every descriptor and really convolves, so each pass's result is compared with a reference:
 * dims, strides, padding, stride, dilation, groups and dtypes for several shapes (groups,
 * stride 2, dilation 2, batch 1, asymmetric windows), the algorithm / workspace sequence
 * (refused algorithms skipped, the workspace from the caching allocator, the next algorithm
 * when there is no memory for one), and that every failure (a status, a lying output size,
 * no usable algorithm), EMBER_CUDNN=0 and a missing library leave the call to Ember's
 * kernels. Those kernels are compiled by the REAL NVRTC (skipped without it). */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include "cuda_fake_driver.h"
#include "cuda_fake_cudnn.h"
#include "kernels/layout.h"
#include "memory/allocator.h"
#include <ember/memory.h>
#include "backend_calls.h"

static em_cu_api g_cu;
static em_nvrtc_api g_nvrtc; /* the real one, for the kernels' path */
static bool g_have_nvrtc;
static const em_backend *B = &em__cuda_backend;

/* ---- the library "on disk": the loader's dlopen/dlsym answered by the test ---- */
#define FAKE_DIR "/ember-fake-cuda-libs"
static const char *g_present;      /* the one path that opens; NULL: none */
static char g_first_try[256];      /* the first libcudnn path the loader asked for */
static int g_cudnn_opens;
static char g_order[64];           /* which library was looked for first */
static bool g_real_cublas;         /* install: cuBLAS is loaded (through the hooks), not faked */
static void *h_open(const char *cand) {
    const char *lib = strstr(cand, "libcublasLt") ? "cublasLt " : strstr(cand, "libcudnn") ? "cudnn " : NULL;
    if (lib && !strstr(g_order, lib)) strncat(g_order, lib, sizeof g_order - strlen(g_order) - 1);
    if (strstr(cand, "libcudnn")) {
        if (!g_cudnn_opens++) snprintf(g_first_try, sizeof g_first_try, "%s", cand);
        if (g_present && !strcmp(cand, g_present)) return (void *)g_present;
    }
    return NULL;
}
static void *h_sym(void *h, const char *sym) { return h == (void *)g_present ? k_sym(sym) : NULL; }

/* the kernels launched, by name, in order */
static char g_launched[2048];
/* the last binary_f32 launch's arguments (out, a, b; the index space; each one's strides) */
static struct { CUdeviceptr buf[3]; emk_shape sh; emk_strides st[3]; int op; bool seen; } g_bin;
static CUresult f_launch_named(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    size_t len = strlen(g_launched);
    snprintf(g_launched + len, sizeof g_launched - len, "%s ", fake_func_name(f));
    if (!strcmp(fake_func_name(f), "binary_f32")) {
        for (int i = 0; i < 3; i++) {
            memcpy(&g_bin.buf[i], params[i], sizeof(CUdeviceptr));
            memcpy(&g_bin.st[i], params[4 + i], sizeof(emk_strides));
        }
        memcpy(&g_bin.sh, params[3], sizeof g_bin.sh);
        memcpy(&g_bin.op, params[7], sizeof g_bin.op);
        g_bin.seen = true;
    }
    return f_launch(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
/* Run the recorded binary_f32 add on the host as the kernel indexes (layout.h's emk_off:
 * row-major over the index space, each operand at its own strides). */
static int64_t bin_off(int64_t i, const emk_strides *st) {
    int64_t o = st->offset;
    for (int d = (int)g_bin.sh.ndim - 1; d >= 0; d--) {
        o += i % g_bin.sh.size[d] * st->s[d];
        i /= g_bin.sh.size[d];
    }
    return o;
}
static void run_recorded_add(void) {
    float *out = (float *)(uintptr_t)g_bin.buf[0];
    const float *a = (const float *)(uintptr_t)g_bin.buf[1], *b = (const float *)(uintptr_t)g_bin.buf[2];
    for (int64_t i = 0; i < g_bin.sh.numel; i++)
        out[bin_off(i, &g_bin.st[0])] = a[bin_off(i, &g_bin.st[1])] + b[bin_off(i, &g_bin.st[2])];
}

/* A fresh backend over the fakes; cuDNN is at `present` (NULL: nowhere). */
static void install(const char *present) {
    em__cuda_backend_reset();
    em__cuda_loader_set_hooks(NULL, NULL);
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    k_reset();
    g_present = present;
    g_cudnn_opens = 0;
    g_first_try[0] = g_launched[0] = g_order[0] = '\0';
    memset(&g_bin, 0, sizeof g_bin);
    g_cu = fake_cu();
    g_cu.cuLaunchKernel = f_launch_named;
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc = g_have_nvrtc ? &g_nvrtc : NULL,
                              .nvrtc_reason = "libnvrtc not found (fake)",
                              .cublas_reason = g_real_cublas ? NULL : "libcublas not found (fake)",
                              .nvml_reason = "none (fake)"}; /* cuDNN: loaded, through the hooks */
    em__cuda_loader_use_fakes(&libs);
    em__cuda_loader_set_hooks(h_open, h_sym);
    setenv("EMBER_CUDA_PATH", FAKE_DIR, 1);
}

/* ---- tensors on "cuda:0" over host memory ---- */
static em_tensor *tensor(em_dtype dt, const int *shape) {
    em_storage *s = calloc(1, sizeof *s);
    em_tensor *t = calloc(1, sizeof *t);
    size_t n = (size_t)shape[0] * shape[1] * shape[2] * shape[3];
    atomic_init(&s->refcount, 1);
    s->device = EM_DEVICE(EM_CUDA, 0);
    s->backend = &em__cuda_backend;
    s->block.handle = calloc(n ? n : 1, em_dtype_size(dt));
    s->block.size = s->nbytes = (n ? n : 1) * em_dtype_size(dt);
    atomic_init(&t->refcount, 1);
    t->dtype = dt;
    t->ndim = 4;
    t->storage = s;
    int64_t st = 1;
    for (int d = 3; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = st;
        st *= shape[d];
    }
    return t;
}
static void drop(em_tensor *t) {
    free(t->storage->block.handle);
    free(t->storage);
    free(t);
}
static int kdt(em_dtype dt) { return dt == EM_F32 ? EM_CUDNN_DATA_FLOAT : dt == EM_F16 ? EM_CUDNN_DATA_HALF : EM_CUDNN_DATA_BFLOAT16; }
static void fill(em_tensor *t, int seed) {
    for (int64_t i = 0; i < em_numel(t); i++)
        k_st(t->storage->block.handle, i, kdt(t->dtype), (float)((i * 7 + seed * 3) % 11 - 5) * 0.25f);
}

/* one convolution shape */
typedef struct shape_case {
    const char *what;
    int N, C, H, W, O, G, kh, kw, sh, sw, ph, pw, dh, dw;
} shape_case;
static const shape_case k_cases[] = {
    {"plain 3x3, padding 1", 2, 3, 7, 6, 4, 1, 3, 3, 1, 1, 1, 1, 1, 1},
    {"groups 2, 3x2 window, padding (1, 0)", 2, 4, 5, 5, 6, 2, 3, 2, 1, 1, 1, 0, 1, 1},
    {"stride (2, 1), padding (1, 2)", 2, 2, 9, 8, 3, 1, 3, 3, 2, 1, 1, 2, 1, 1},
    {"dilation 2, padding 2", 3, 2, 8, 8, 2, 1, 3, 3, 1, 1, 2, 2, 2, 2},
    {"batch 1, depthwise (groups 3), stride 2, dilation 2", 1, 3, 9, 7, 3, 3, 3, 3, 2, 2, 1, 1, 2, 2},
};

static k_geo geo_of(const shape_case *c) {
    k_geo g = {.N = c->N, .C = c->C, .H = c->H, .W = c->W, .O = c->O, .G = c->G, .kh = c->kh, .kw = c->kw,
               .sh = c->sh, .sw = c->sw, .ph = c->ph, .pw = c->pw, .dh = c->dh, .dw = c->dw};
    g.oh = (c->H + 2 * c->ph - c->dh * (c->kh - 1) - 1) / c->sh + 1;
    g.ow = (c->W + 2 * c->pw - c->dw * (c->kw - 1) - 1) / c->sw + 1;
    int xs[4] = {c->C * c->H * c->W, c->H * c->W, c->W, 1}, ys[4] = {c->O * g.oh * g.ow, g.oh * g.ow, g.ow, 1};
    memcpy(g.xs, xs, sizeof xs);
    memcpy(g.ys, ys, sizeof ys);
    return g;
}
static em_window2d win_of(const shape_case *c, const k_geo *g) {
    return (em_window2d){.n = c->N, .c = c->C, .h = c->H, .w = c->W, .oh = g->oh, .ow = g->ow, .kh = c->kh,
                         .kw = c->kw, .sh = c->sh, .sw = c->sw, .ph = c->ph, .pw = c->pw, .dh = c->dh, .dw = c->dw};
}

typedef struct operands { em_tensor *x, *w, *y; k_geo g; em_window2d win; } operands;
static operands make(const shape_case *c, em_dtype dt) {
    operands o;
    o.g = geo_of(c);
    o.win = win_of(c, &o.g);
    o.x = tensor(dt, (int[]){c->N, c->C, c->H, c->W});
    o.w = tensor(dt, (int[]){c->O, c->C / c->G, c->kh, c->kw});
    o.y = tensor(dt, (int[]){c->N, c->O, o.g.oh, o.g.ow});
    fill(o.x, 1);
    fill(o.w, 2);
    fill(o.y, 3);
    return o;
}
static void drop_all(operands *o) { drop(o->x); drop(o->w); drop(o->y); }

/* Run pass p through the backend's entry and compare the written operand with the reference. */
static void check_pass(int p, const shape_case *c, em_dtype dt) {
    operands o = make(c, dt);
    em_tensor *out = p == 0 ? o.y : p == 1 ? o.x : o.w;
    /* the reference, from the test's own geometry, into a copy */
    size_t bytes = out->storage->nbytes;
    void *want = malloc(bytes);
    void *xs = o.x->storage->block.handle, *ws = o.w->storage->block.handle, *ys = o.y->storage->block.handle;
    void *saved = malloc(bytes);
    memcpy(saved, out->storage->block.handle, bytes);
    k_convolve(p, &o.g, kdt(dt), xs, ws, ys);
    memcpy(want, out->storage->block.handle, bytes);
    memcpy(out->storage->block.handle, saved, bytes); /* Ember's call starts from the old contents */
    int runs = K.runs;
    em_status st = p == 0 ? be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, c->G)
                 : p == 1 ? be_conv2d_backward_input(B, o.x, o.y, o.w, &o.win, c->G)
                          : be_conv2d_backward_weight(B, o.w, o.y, o.x, &o.win, c->G);
    if (st != EM_OK || K.bad[0]) printf("     %s, pass %d: %s %s\n", c->what, p, em_last_error(), K.bad);
    CHECK_OK(st);
    CHECK(K.runs == runs + 1 && K.pass == p && !K.bad[0]);
    /* the descriptors Ember built */
    int cg = c->C / c->G;
    CHECK(K.x.dt == kdt(dt) && K.w.dt == kdt(dt) && K.y.dt == kdt(dt));
    CHECK(K.x.dims[0] == c->N && K.x.dims[1] == c->C && K.x.dims[2] == c->H && K.x.dims[3] == c->W);
    CHECK(K.x.strides[0] == c->C * c->H * c->W && K.x.strides[1] == c->H * c->W && K.x.strides[2] == c->W &&
          K.x.strides[3] == 1);
    CHECK(K.y.dims[0] == c->N && K.y.dims[1] == c->O && K.y.dims[2] == o.g.oh && K.y.dims[3] == o.g.ow);
    CHECK(K.y.strides[0] == c->O * o.g.oh * o.g.ow && K.y.strides[1] == o.g.oh * o.g.ow && K.y.strides[3] == 1);
    CHECK(K.w.format == EM_CUDNN_TENSOR_NCHW && K.w.dims[0] == c->O && K.w.dims[1] == cg && K.w.dims[2] == c->kh &&
          K.w.dims[3] == c->kw);
    CHECK(K.c.ph == c->ph && K.c.pw == c->pw && K.c.u == c->sh && K.c.v == c->sw && K.c.dh == c->dh &&
          K.c.dw == c->dw && K.c.groups == c->G);
    CHECK(K.c.mode == EM_CUDNN_CROSS_CORRELATION && K.c.compute == EM_CUDNN_DATA_FLOAT);
    CHECK(K.c.math == (dt == EM_F32 ? EM_CUDNN_FMA_MATH : EM_CUDNN_TENSOR_OP_MATH));
    CHECK(K.live_descs == 0); /* every descriptor destroyed */
    /* the values: the same sums, so exact in f32; one rounding apart at most in f16/bf16 */
    int64_t n = em_numel(out);
    double tol = dt == EM_F32 ? 1e-6 : dt == EM_F16 ? 1.0 / 512 : 1.0 / 64;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float got = k_ld(out->storage->block.handle, i, kdt(dt)), exp = k_ld(want, i, kdt(dt));
        if (fabs(got - exp) > tol * (1 + fabs(exp))) bad++;
    }
    CHECK(bad == 0);
    free(want);
    free(saved);
    drop_all(&o);
}

static void test_library_found_through_ember_cuda_path(void) {
    install(FAKE_DIR "/libcudnn.so.9");
    size_t v = 0;
    const char *reason = NULL;
    CHECK(em__cuda_cudnn(&v, &reason) != NULL && v == 90600 && reason == NULL);
    CHECK(!strcmp(g_first_try, FAKE_DIR "/libcudnn.so.9")); /* EMBER_CUDA_PATH first, .9 first */
    char line[1400];
    em__cuda_libraries_line(line, sizeof line);
    CHECK(strstr(line, ", cudnn 9.6.0 (driver supports 12.4)") != NULL);
    CHECK(em__cuda_cudnn(NULL, NULL) != NULL && g_cudnn_opens == 1); /* loaded once */

    /* cuBLAS(Lt), which cuDNN's engines need by soname, is looked for first (then reused) */
    g_real_cublas = true;
    install(FAKE_DIR "/libcudnn.so.9");
    CHECK(em__cuda_cudnn(NULL, NULL) != NULL);
    CHECK(!strcmp(g_order, "cublasLt cudnn "));
    g_real_cublas = false;

    /* cuDNN 8, in DIR/lib64: found after every .9 was looked for */
    install(FAKE_DIR "/lib64/libcudnn.so.8");
    K.version = 8907;
    CHECK(em__cuda_cudnn(&v, NULL) != NULL && v == 8907);
    em__cuda_libraries_line(line, sizeof line);
    CHECK(strstr(line, ", cudnn 8.9.7 (") != NULL);

    /* absent: the reason lists the places, EMBER_CUDA_PATH first */
    install(NULL);
    CHECK(em__cuda_cudnn(&v, &reason) == NULL && v == 0);
    CHECK(reason && strstr(reason, "libcudnn.so.9/.8 not found (looked in EMBER_CUDA_PATH entry " FAKE_DIR));
    CHECK(strstr(reason, "/usr/local/cuda/lib64") != NULL);
    em__cuda_libraries_line(line, sizeof line);
    CHECK(strstr(line, ", cudnn: libcudnn.so.9/.8 not found") != NULL);

    /* refused: too old, built for a newer CUDA than the driver's, a symbol missing */
    install(FAKE_DIR "/libcudnn.so.8");
    K.version = 7605;
    CHECK(em__cuda_cudnn(NULL, &reason) == NULL && strstr(reason, "is cuDNN 7.6.5; Ember uses cuDNN 8 or 9"));
    install(FAKE_DIR "/libcudnn.so.9");
    K.cudart = 13000;
    CHECK(em__cuda_cudnn(NULL, &reason) == NULL &&
          strstr(reason, "built for CUDA 13.0, newer than the driver's CUDA 12.4"));
    install(FAKE_DIR "/libcudnn.so.9");
    k_missing = "cudnnConvolutionBackwardFilter";
    CHECK(em__cuda_cudnn(NULL, &reason) == NULL && strstr(reason, "lacks cudnnConvolutionBackwardFilter"));
}

static void test_descriptors_and_results(void) {
    em_dtype dts[3] = {EM_F32, EM_F16, EM_BF16};
    for (int d = 0; d < 3; d++) {
        install(FAKE_DIR "/libcudnn.so.9");
        for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
            for (int p = 0; p < 3; p++) check_pass(p, &k_cases[i], dts[d]);
        /* one handle for all 15 calls, bound to cuda:0's stream, never two */
        CHECK(K.handles_created == 1 && K.stream == (void *)&stream_tag[0]);
        em__cuda_backend_reset();
        CHECK(K.handles_destroyed == 1);
    }
    /* f32 with TF32 allowed: cuDNN's default math (TF32 on Ampere and newer) */
    install(FAKE_DIR "/libcudnn.so.9");
    setenv("EMBER_CUDA_ALLOW_TF32", "1", 1);
    operands o = make(&k_cases[0], EM_F32);
    CHECK_OK(be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 1));
    CHECK(K.c.math == EM_CUDNN_DEFAULT_MATH);
    unsetenv("EMBER_CUDA_ALLOW_TF32");
    drop_all(&o);
    /* f64 stays on Ember's kernels (double precision): cuDNN is not even loaded */
    operands d64 = make(&k_cases[0], EM_F32);
    d64.x->dtype = d64.w->dtype = d64.y->dtype = EM_F64; /* only the dtype is read before refusing */
    install(FAKE_DIR "/libcudnn.so.9");
    CHECK(be_conv2d(B, d64.y, d64.x, d64.w, NULL, &d64.win, 1) == EM_ERR_NOT_SUPPORTED);
    CHECK(K.calls == 0 && g_cudnn_opens == 0 && !em_failed());
    drop_all(&d64);
}

static void test_algorithm_and_workspace_sequence(void) {
    install(FAKE_DIR "/libcudnn.so.9");
    /* cuDNN's preference: 6 (cannot run here), then 1 (4 KiB of workspace), then 0 */
    K.nperf = 3;
    K.perf[0] = (em_cudnn_algo_perf){.algo = 6, .status = K_NOT_SUPPORTED};
    K.perf[1] = (em_cudnn_algo_perf){.algo = 1, .status = 0, .memory = 4096};
    K.perf[2] = (em_cudnn_algo_perf){.algo = 0, .status = 0};
    K.ws_of_algo[1] = 4096;
    em_device cuda0 = EM_DEVICE(EM_CUDA, 0);
    int64_t allocated = em_memory_allocated(cuda0);
    for (int p = 0; p < 3; p++) {
        operands o = make(&k_cases[1], EM_F32);
        K.log[0] = '\0';
        em_status st = p == 0 ? be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 2)
                     : p == 1 ? be_conv2d_backward_input(B, o.x, o.y, o.w, &o.win, 2)
                              : be_conv2d_backward_weight(B, o.w, o.y, o.x, &o.win, 2);
        CHECK_OK(st);
        char want[160];
        snprintf(want, sizeof want, "%1$s_algos(8) %1$s_ws(1) %1$s(algo 1, ws 4096) ", k_pass_name[p]);
        if (strcmp(K.log, want)) printf("     got '%s'\n     want '%s'\n", K.log, want);
        CHECK(!strcmp(K.log, want)); /* 6 skipped without asking its workspace */
        CHECK(K.ws != NULL && K.ws_bytes == 4096);
        drop_all(&o);
    }
    /* the workspace came from the caching allocator (counted) and went back to it */
    CHECK(em_memory_max_allocated(cuda0) >= allocated + 4096);
    CHECK(em_memory_allocated(cuda0) == allocated);

    /* the same convolution again: the algorithm and its workspace size are remembered, cuDNN
     * is not asked again (as PyTorch keeps them per ConvolutionParams) */
    operands again = make(&k_cases[1], EM_F32);
    K.log[0] = '\0';
    CHECK_OK(be_conv2d(B, again.y, again.x, again.w, NULL, &again.win, 2));
    CHECK(!strcmp(K.log, "fwd(algo 1, ws 4096) "));
    drop_all(&again);

    /* no memory for algorithm 1's workspace (the allocator's cache emptied): cuDNN is asked
     * again, and the next one, which needs none, runs */
    em_memory_empty_cache(cuda0);
    K.ws_of_algo[1] = (size_t)1 << 40;
    F.alloc_result = CUDA_ERROR_OUT_OF_MEMORY;
    operands o = make(&k_cases[1], EM_F32);
    K.log[0] = '\0';
    CHECK_OK(be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 2));
    CHECK(!strcmp(K.log, "fwd_algos(8) fwd_ws(1) fwd_ws(0) fwd(algo 0, ws 0) "));
    CHECK(!em_failed()); /* the allocator's out-of-memory was not left recorded */
    F.alloc_result = CUDA_SUCCESS;
    drop_all(&o);
}

/* Every failure: EM_ERR_NOT_SUPPORTED with nothing recorded and nothing leaked (core then
 * runs the kernels), and the next call still works. */
static void test_failures_fall_back(void) {
    static const char *const fns[] = {"cudnnCreate", "cudnnSetStream", "cudnnCreateTensorDescriptor",
                                      "cudnnSetFilter4dDescriptor", "cudnnSetConvolutionGroupCount",
                                      "cudnnSetConvolutionMathType", "cudnnGetConvolutionForwardAlgorithm_v7",
                                      "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        install(FAKE_DIR "/libcudnn.so.9");
        operands o = make(&k_cases[2], EM_F32);
        K.fail_fn = fns[i];
        K.fail_status = K_NOT_SUPPORTED;
        CHECK(be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 1) == EM_ERR_NOT_SUPPORTED);
        CHECK(!em_failed() && K.live_descs == 0 && K.runs == 0);
        /* a handle is kept only once it is bound to the stream; a half-made one is destroyed */
        bool made = strcmp(fns[i], "cudnnCreate") && strcmp(fns[i], "cudnnSetStream");
        CHECK(K.handles_created - K.handles_destroyed == (made ? 1 : 0));
        K.fail_fn = NULL;
        CHECK_OK(be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 1));
        CHECK(K.runs == 1 && K.handles_created - K.handles_destroyed == 1);
        drop_all(&o);
    }
    /* a geometry cuDNN reads differently from core's */
    install(FAKE_DIR "/libcudnn.so.9");
    operands o = make(&k_cases[3], EM_F32);
    K.outdim_lies = true;
    CHECK(be_conv2d(B, o.y, o.x, o.w, NULL, &o.win, 1) == EM_ERR_NOT_SUPPORTED);
    CHECK(K.runs == 0 && K.live_descs == 0 && !em_failed());
    K.outdim_lies = false;
    /* no algorithm it offers can run */
    K.perf[0].status = K_NOT_SUPPORTED;
    CHECK(be_conv2d_backward_weight(B, o.w, o.y, o.x, &o.win, 1) == EM_ERR_NOT_SUPPORTED);
    CHECK(K.runs == 0 && !em_failed());
    drop_all(&o);
}

/* ---- through the public API: em_conv2d on "cuda:0" ---- */
static em_tensor *on_cuda(const float *v, em_shape s) {
    return em_from_data(v, EM_F32, s, EM_OPTS(.device = EM_DEVICE(EM_CUDA, 0)));
}

/* em_conv2d with a bias; returns the output (released by the caller) */
static em_tensor *public_conv(const shape_case *c, float *xs, float *ws, float *bs) {
    int64_t nx = (int64_t)c->N * c->C * c->H * c->W, nw = (int64_t)c->O * (c->C / c->G) * c->kh * c->kw;
    for (int64_t i = 0; i < nx; i++) xs[i] = (float)(i % 7) - 3;
    for (int64_t i = 0; i < nw; i++) ws[i] = (float)(i % 5) * 0.5f - 1;
    for (int i = 0; i < c->O; i++) bs[i] = (float)i;
    em_tensor *x = on_cuda(xs, EM_SHAPE(c->N, c->C, c->H, c->W));
    em_tensor *w = on_cuda(ws, EM_SHAPE(c->O, c->C / c->G, c->kh, c->kw));
    em_tensor *b = on_cuda(bs, EM_SHAPE(c->O));
    em_tensor *y = x && w && b ? em_conv2d(x, w, b, EM_HW(c->sh, c->sw), EM_HW(c->ph, c->pw), EM_HW(c->dh, c->dw), c->G)
                               : NULL;
    em_release(x);
    em_release(w);
    em_release(b);
    return y;
}

static void test_public_conv2d_uses_cudnn(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the bias add's kernel");
    const shape_case *c = &k_cases[4];
    install(FAKE_DIR "/libcudnn.so.9");
    float xs[1 * 3 * 9 * 7], ws[3 * 1 * 3 * 3], bs[3];
    em_tensor *y = public_conv(c, xs, ws, bs);
    CHECK(y != NULL);
    CHECK(K.runs == 1 && K.pass == 0 && K.c.groups == 3 && K.c.u == 2 && K.c.dh == 2);
    /* the bias is Ember's broadcast add, after cuDNN; no im2col ran */
    CHECK(strstr(g_launched, "im2col") == NULL && strstr(g_launched, "binary_f32") != NULL);
    CHECK(g_bin.seen && g_bin.op == EM_OP_ADD - EM_OP_ADD);
    if (y && g_bin.seen) {
        /* the add's kernel, recorded by the fake driver, run here as the GPU would */
        run_recorded_add();
        k_geo g = geo_of(c);
        float got[3 * 4 * 3], want[3 * 4 * 3];
        CHECK(em_numel(y) == c->O * g.oh * g.ow);
        CHECK_OK(em_copy_to_host(y, got, sizeof got));
        k_convolve(0, &g, EM_CUDNN_DATA_FLOAT, xs, ws, want);
        for (int i = 0; i < c->O * g.oh * g.ow; i++) CHECK_NEAR(got[i], want[i] + bs[i / (g.oh * g.ow)], 1e-6);
    }
    em_release(y);
}

/* Autograd's ConvolutionBackward0 reaches cuDNN's two backward passes through core (values
 * are not read: the gradient's seed is a kernel the fake driver only records). */
static void test_backward_through_autograd_uses_cudnn(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the sum and the gradient's seed");
    const shape_case *c = &k_cases[1];
    install(FAKE_DIR "/libcudnn.so.9");
    float xs[2 * 4 * 5 * 5] = {0}, ws[6 * 2 * 3 * 2] = {0};
    em_opts o = EM_OPTS(.device = EM_DEVICE(EM_CUDA, 0), .requires_grad = true);
    em_tensor *x = em_from_data(xs, EM_F32, EM_SHAPE(c->N, c->C, c->H, c->W), o);
    em_tensor *w = em_from_data(ws, EM_F32, EM_SHAPE(c->O, c->C / c->G, c->kh, c->kw), o);
    em_tensor *y = x && w ? em_conv2d(x, w, NULL, EM_HW(c->sh, c->sw), EM_HW(c->ph, c->pw), EM_HW(c->dh, c->dw), c->G)
                          : NULL;
    em_tensor *loss = y ? em_sum(y, EM_ALL_DIMS, false) : NULL;
    CHECK(loss != NULL);
    K.log[0] = '\0';
    CHECK_OK(loss ? em_backward(loss) : em_last_status());
    CHECK(strstr(K.log, "bwd_data(algo 1, ws 0)") && strstr(K.log, "bwd_filter(algo 1, ws 0)"));
    CHECK(K.runs == 3 && K.c.groups == 2 && K.c.pw == 0 && !K.bad[0]);
    CHECK(strstr(g_launched, "im2col") == NULL && strstr(g_launched, "col2im") == NULL);
    em_release(loss);
    em_release(y);
    em_release(x);
    em_release(w);
}

/* What Ember's kernels path launches for a forward conv: im2col, then the matmul. */
static void check_kernels_ran(const char *why) {
    const shape_case *c = &k_cases[0];
    float xs[2 * 3 * 7 * 6], ws[4 * 3 * 3 * 3], bs[4];
    int calls = K.calls;
    em_tensor *y = public_conv(c, xs, ws, bs);
    if (!y) printf("     %s: %s\n", why, em_last_error());
    CHECK(y != NULL);
    CHECK(strstr(g_launched, "im2col") != NULL && strstr(g_launched, "matmul") != NULL);
    CHECK(K.runs == 0);
    CHECK(K.calls == calls);
    em_release(y);
    em_clear_error();
}

static void test_failing_cudnn_runs_the_kernels(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the kernels");
    install(FAKE_DIR "/libcudnn.so.9");
    K.fail_fn = "cudnnConvolutionForward";
    K.fail_status = K_BAD_PARAM;
    const shape_case *c = &k_cases[0];
    float xs[2 * 3 * 7 * 6], ws[4 * 3 * 3 * 3], bs[4];
    em_tensor *y = public_conv(c, xs, ws, bs);
    CHECK(y != NULL && K.calls > 0 && K.runs == 0); /* cuDNN was asked, and failed */
    CHECK(strstr(g_launched, "im2col") != NULL && strstr(g_launched, "matmul") != NULL);
    CHECK(!em_failed());
    em_release(y);
}

static void test_cudnn_off_makes_no_call(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the kernels");
    setenv("EMBER_CUDNN", "0", 1);
    install(FAKE_DIR "/libcudnn.so.9");
    check_kernels_ran("EMBER_CUDNN=0");
    CHECK(K.calls == 0 && g_cudnn_opens == 0); /* not even dlopen'ed */
    const char *reason = NULL;
    CHECK(em__cuda_cudnn(NULL, &reason) == NULL && !strcmp(reason, "off (EMBER_CUDNN=0)"));
    char line[1400];
    em__cuda_libraries_line(line, sizeof line);
    CHECK(strstr(line, ", cudnn: off (EMBER_CUDNN=0)") != NULL);
    unsetenv("EMBER_CUDNN");
}

static void test_without_the_library_the_kernels_run(void) {
    if (!g_have_nvrtc) SKIP("no NVRTC to compile the kernels");
    install(NULL);
    check_kernels_ran("no libcudnn");
    CHECK(g_cudnn_opens > 0 && K.calls == 0); /* looked for, once */
    int opens = g_cudnn_opens;
    check_kernels_ran("no libcudnn, again");
    CHECK(g_cudnn_opens == opens);
}

int main(void) {
    const char *reason = NULL;
    int major = 0, minor = 0;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (nv) {
        g_nvrtc = *nv;
        g_have_nvrtc = true;
    } else {
        printf("NVRTC missing (%s): the kernels' path is skipped\n", reason ? reason : "?");
    }
    RUN(test_library_found_through_ember_cuda_path);
    RUN(test_descriptors_and_results);
    RUN(test_algorithm_and_workspace_sequence);
    RUN(test_failures_fall_back);
    RUN(test_public_conv2d_uses_cudnn);
    RUN(test_backward_through_autograd_uses_cudnn);
    RUN(test_failing_cudnn_runs_the_kernels);
    RUN(test_cudnn_off_makes_no_call);
    RUN(test_without_the_library_the_kernels_run);
    em__cuda_backend_reset();
    em__cuda_loader_set_hooks(NULL, NULL);
    unsetenv("EMBER_CUDA_PATH");
    for (int i = 0; i < MAX_FAKE_MODULES; i++) free(module_images[i]);
    return test_summary();
}

#else
int main(void) {
    test_skip_case("cuda cudnn", "built without CUDA headers: there is no cuDNN path to check");
    return test_summary();
}
#endif
