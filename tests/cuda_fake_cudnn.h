/* A fake cuDNN for tests without a GPU: the legacy convolution API of cuda_cudnn.h, served to
 * Ember's loader by symbol name (em__cuda_loader_set_hooks), over the fake CUDA driver whose
 * "device memory" is host memory. Every call is counted and logged; descriptors are real
 * objects whose contents a test can read back and whose leaks it can count; the three
 * convolution calls check their arguments (handle, stream, context, descriptors that agree
 * with each other, workspace, alpha 1 and beta 0) and then really convolve, from what the
 * descriptors say, so a test can compare the result with its own reference. Included by
 * tests/test_cuda_cudnn.c after cuda_fake_driver.h (every function is static). */
#ifndef EMBER_TESTS_CUDA_FAKE_CUDNN_H
#define EMBER_TESTS_CUDA_FAKE_CUDNN_H

#include <stdarg.h>
#include <stdio.h>
#include "backends/cuda/cuda_cudnn.h"

#define K_NOT_SUPPORTED 3000 /* cuDNN 9's CUDNN_STATUS_NOT_SUPPORTED */
#define K_BAD_PARAM 2000     /* cuDNN 9's CUDNN_STATUS_BAD_PARAM */

struct em_cudnn_tensor_st { int dt, dims[4], strides[4]; bool set; };
struct em_cudnn_filter_st { int dt, format, dims[4]; bool set; };
struct em_cudnn_conv_st { int ph, pw, u, v, dh, dw, mode, compute, groups, math; bool set; };

static struct {
    /* what the library says of itself */
    size_t version, cudart;
    /* what cudnnGet*Algorithm_v7 answers, and each algorithm's workspace */
    em_cudnn_algo_perf perf[8];
    int nperf;
    size_t ws_of_algo[8];
    /* the one call that fails, with this status */
    const char *fail_fn;
    em_cudnn_status fail_status;
    bool outdim_lies;                 /* cudnnGetConvolution2dForwardOutputDim answers one row more */
    /* what happened */
    int calls, handles_created, handles_destroyed, live_descs;
    void *stream;
    char log[4096];                   /* algorithm / workspace / run calls, with their arguments */
    char bad[256];                    /* the first argument a convolution call found wrong */
    int runs;
    /* the last convolution call's descriptors (copies) and workspace */
    struct em_cudnn_tensor_st x, y;
    struct em_cudnn_filter_st w;
    struct em_cudnn_conv_st c;
    int pass, algo;
    void *ws;
    size_t ws_bytes;
} K;
static char k_handle_tag;

static void k_log(const char *fmt, ...) {
    size_t len = strlen(K.log);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(K.log + len, sizeof K.log - len, fmt, ap);
    va_end(ap);
}
static void k_bad(const char *what) {
    if (!K.bad[0]) snprintf(K.bad, sizeof K.bad, "%s", what);
}
/* Count the call; true when the test made this one fail. */
static bool k_fails(const char *fn) {
    K.calls++;
    return K.fail_fn && !strcmp(K.fail_fn, fn);
}
#define K_ENTER(name) \
    if (k_fails(name)) return K.fail_status

static size_t k_version(void) { K.calls++; return K.version; }
static size_t k_cudart(void) { K.calls++; return K.cudart; }
static const char *k_error_string(em_cudnn_status s) {
    return s == K_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED" : s == K_BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM" : "CUDNN_STATUS_?";
}
static em_cudnn_status k_create(em_cudnn_handle *h) {
    K_ENTER("cudnnCreate");
    if (t_ctx < 0) return K_BAD_PARAM; /* cuDNN works in the current context */
    K.handles_created++;
    *h = (em_cudnn_handle)&k_handle_tag;
    return 0;
}
static em_cudnn_status k_destroy(em_cudnn_handle h) {
    K.calls++;
    if (h == (em_cudnn_handle)&k_handle_tag) K.handles_destroyed++;
    return 0;
}
static em_cudnn_status k_set_stream(em_cudnn_handle h, void *s) {
    K_ENTER("cudnnSetStream");
    (void)h;
    K.stream = s;
    return 0;
}
static em_cudnn_status k_create_tensor(em_cudnn_tensor *t) {
    K_ENTER("cudnnCreateTensorDescriptor");
    *t = calloc(1, sizeof **t);
    K.live_descs++;
    return 0;
}
static em_cudnn_status k_set_tensor(em_cudnn_tensor t, int dt, int n, int c, int h, int w, int ns, int cs, int hs,
                                    int ws) {
    K_ENTER("cudnnSetTensor4dDescriptorEx");
    *t = (struct em_cudnn_tensor_st){.dt = dt, .dims = {n, c, h, w}, .strides = {ns, cs, hs, ws}, .set = true};
    return 0;
}
static em_cudnn_status k_destroy_tensor(em_cudnn_tensor t) { K.calls++; free(t); K.live_descs--; return 0; }
static em_cudnn_status k_create_filter(em_cudnn_filter *f) {
    K_ENTER("cudnnCreateFilterDescriptor");
    *f = calloc(1, sizeof **f);
    K.live_descs++;
    return 0;
}
static em_cudnn_status k_set_filter(em_cudnn_filter f, int dt, int format, int k, int c, int h, int w) {
    K_ENTER("cudnnSetFilter4dDescriptor");
    *f = (struct em_cudnn_filter_st){.dt = dt, .format = format, .dims = {k, c, h, w}, .set = true};
    return 0;
}
static em_cudnn_status k_destroy_filter(em_cudnn_filter f) { K.calls++; free(f); K.live_descs--; return 0; }
static em_cudnn_status k_create_conv(em_cudnn_conv *c) {
    K_ENTER("cudnnCreateConvolutionDescriptor");
    *c = calloc(1, sizeof **c);
    (*c)->groups = 1; /* cuDNN's default */
    K.live_descs++;
    return 0;
}
static em_cudnn_status k_set_conv(em_cudnn_conv c, int ph, int pw, int u, int v, int dh, int dw, int mode,
                                  int compute) {
    K_ENTER("cudnnSetConvolution2dDescriptor");
    c->ph = ph, c->pw = pw, c->u = u, c->v = v, c->dh = dh, c->dw = dw, c->mode = mode, c->compute = compute;
    c->set = true;
    return 0;
}
static em_cudnn_status k_groups(em_cudnn_conv c, int g) { K_ENTER("cudnnSetConvolutionGroupCount"); c->groups = g; return 0; }
static em_cudnn_status k_math(em_cudnn_conv c, int m) { K_ENTER("cudnnSetConvolutionMathType"); c->math = m; return 0; }
static em_cudnn_status k_destroy_conv(em_cudnn_conv c) { K.calls++; free(c); K.live_descs--; return 0; }

/* cuDNN's output size: (in + 2 pad - (dil (k - 1) + 1)) / stride + 1 */
static int k_out(int in, int pad, int dil, int k, int stride) { return (in + 2 * pad - (dil * (k - 1) + 1)) / stride + 1; }
static em_cudnn_status k_outdim(em_cudnn_conv c, em_cudnn_tensor x, em_cudnn_filter w, int *n, int *ch, int *h, int *wd) {
    K_ENTER("cudnnGetConvolution2dForwardOutputDim");
    if (!c->set || !x->set || !w->set || x->dims[1] != w->dims[1] * c->groups) return K_BAD_PARAM;
    *n = x->dims[0];
    *ch = w->dims[0];
    *h = k_out(x->dims[2], c->ph, c->dh, w->dims[2], c->u) + (K.outdim_lies ? 1 : 0);
    *wd = k_out(x->dims[3], c->pw, c->dw, w->dims[3], c->v);
    return 0;
}

static const char *const k_pass_name[] = {"fwd", "bwd_data", "bwd_filter"};
static em_cudnn_status k_algos(int pass, em_cudnn_handle h, int requested, int *returned, em_cudnn_algo_perf *perf) {
    if (h != (em_cudnn_handle)&k_handle_tag) return K_BAD_PARAM;
    k_log("%s_algos(%d) ", k_pass_name[pass], requested);
    int n = K.nperf < requested ? K.nperf : requested;
    for (int i = 0; i < n; i++) perf[i] = K.perf[i];
    *returned = n;
    return 0;
}
static em_cudnn_status k_fwd_algos(em_cudnn_handle h, em_cudnn_tensor x, em_cudnn_filter w, em_cudnn_conv c,
                                   em_cudnn_tensor y, int req, int *ret, em_cudnn_algo_perf *perf) {
    K_ENTER("cudnnGetConvolutionForwardAlgorithm_v7");
    (void)x, (void)w, (void)c, (void)y;
    return k_algos(0, h, req, ret, perf);
}
static em_cudnn_status k_data_algos(em_cudnn_handle h, em_cudnn_filter w, em_cudnn_tensor dy, em_cudnn_conv c,
                                    em_cudnn_tensor dx, int req, int *ret, em_cudnn_algo_perf *perf) {
    K_ENTER("cudnnGetConvolutionBackwardDataAlgorithm_v7");
    (void)w, (void)dy, (void)c, (void)dx;
    return k_algos(1, h, req, ret, perf);
}
static em_cudnn_status k_filter_algos(em_cudnn_handle h, em_cudnn_tensor x, em_cudnn_tensor dy, em_cudnn_conv c,
                                      em_cudnn_filter dw, int req, int *ret, em_cudnn_algo_perf *perf) {
    K_ENTER("cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    (void)x, (void)dy, (void)c, (void)dw;
    return k_algos(2, h, req, ret, perf);
}
static em_cudnn_status k_ws(int pass, int algo, size_t *bytes) {
    if (algo < 0 || algo >= 8) return K_BAD_PARAM;
    k_log("%s_ws(%d) ", k_pass_name[pass], algo);
    *bytes = K.ws_of_algo[algo];
    return 0;
}
static em_cudnn_status k_fwd_ws(em_cudnn_handle h, em_cudnn_tensor x, em_cudnn_filter w, em_cudnn_conv c,
                                em_cudnn_tensor y, int algo, size_t *bytes) {
    K_ENTER("cudnnGetConvolutionForwardWorkspaceSize");
    (void)h, (void)x, (void)w, (void)c, (void)y;
    return k_ws(0, algo, bytes);
}
static em_cudnn_status k_data_ws(em_cudnn_handle h, em_cudnn_filter w, em_cudnn_tensor dy, em_cudnn_conv c,
                                 em_cudnn_tensor dx, int algo, size_t *bytes) {
    K_ENTER("cudnnGetConvolutionBackwardDataWorkspaceSize");
    (void)h, (void)w, (void)dy, (void)c, (void)dx;
    return k_ws(1, algo, bytes);
}
static em_cudnn_status k_filter_ws(em_cudnn_handle h, em_cudnn_tensor x, em_cudnn_tensor dy, em_cudnn_conv c,
                                   em_cudnn_filter dw, int algo, size_t *bytes) {
    K_ENTER("cudnnGetConvolutionBackwardFilterWorkspaceSize");
    (void)h, (void)x, (void)dy, (void)c, (void)dw;
    return k_ws(2, algo, bytes);
}

/* ---- the arithmetic, shared with the tests' references: one loop over every product ---- */
typedef struct k_geo {
    int N, C, H, W, O, G, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw;
    int xs[4], ys[4]; /* x's and y's element strides; w is contiguous */
} k_geo;

static float k_bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t k_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float k_ld(const void *p, int64_t i, int dt) {
    if (dt == EM_CUDNN_DATA_FLOAT) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == EM_CUDNN_DATA_HALF ? (float)em_f16_to_f32(h) : k_bf2f(h);
}
static void k_st(void *p, int64_t i, int dt, float v) {
    if (dt == EM_CUDNN_DATA_FLOAT) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = dt == EM_CUDNN_DATA_HALF ? em_f32_to_f16(v) : k_f2bf(v);
}

/* pass 0: y = x * w; 1: x = dy (*) w; 2: w = x (*) dy; the written operand is overwritten */
static void k_convolve(int pass, const k_geo *g, int dt, void *x, void *w, void *y) {
    int Cg = g->C / g->G, Og = g->O / g->G;
    int64_t nx = (int64_t)g->N * g->C * g->H * g->W, nw = (int64_t)g->O * Cg * g->kh * g->kw,
            ny = (int64_t)g->N * g->O * g->oh * g->ow;
    int64_t n_acc = pass == 0 ? ny : pass == 1 ? nx : nw;
    double *acc = calloc((size_t)n_acc, sizeof *acc);
    for (int n = 0; n < g->N; n++)
        for (int o = 0; o < g->O; o++)
            for (int oy = 0; oy < g->oh; oy++)
                for (int ox = 0; ox < g->ow; ox++)
                    for (int ci = 0; ci < Cg; ci++)
                        for (int ky = 0; ky < g->kh; ky++)
                            for (int kx = 0; kx < g->kw; kx++) {
                                int iy = oy * g->sh - g->ph + ky * g->dh, ix = ox * g->sw - g->pw + kx * g->dw;
                                if (iy < 0 || iy >= g->H || ix < 0 || ix >= g->W) continue;
                                int c = o / Og * Cg + ci;
                                int64_t xi = (int64_t)n * g->xs[0] + (int64_t)c * g->xs[1] + (int64_t)iy * g->xs[2] + (int64_t)ix * g->xs[3];
                                int64_t wi = (((int64_t)o * Cg + ci) * g->kh + ky) * g->kw + kx;
                                int64_t yi = (int64_t)n * g->ys[0] + (int64_t)o * g->ys[1] + (int64_t)oy * g->ys[2] + (int64_t)ox * g->ys[3];
                                /* accumulators are indexed contiguously */
                                int64_t xa = (((int64_t)n * g->C + c) * g->H + iy) * g->W + ix;
                                int64_t ya = (((int64_t)n * g->O + o) * g->oh + oy) * g->ow + ox;
                                if (pass == 0) acc[ya] += (double)k_ld(x, xi, dt) * k_ld(w, wi, dt);
                                else if (pass == 1) acc[xa] += (double)k_ld(y, yi, dt) * k_ld(w, wi, dt);
                                else acc[wi] += (double)k_ld(x, xi, dt) * k_ld(y, yi, dt);
                            }
    for (int64_t i = 0; i < n_acc; i++) {
        if (pass == 2) { k_st(w, i, dt, (float)acc[i]); continue; }
        /* back to the written tensor's strides */
        int dims[4] = {g->N, pass == 0 ? g->O : g->C, pass == 0 ? g->oh : g->H, pass == 0 ? g->ow : g->W};
        const int *st = pass == 0 ? g->ys : g->xs;
        int64_t r = i, off = 0;
        for (int d = 3; d >= 0; d--) { off += (r % dims[d]) * st[d]; r /= dims[d]; }
        k_st(pass == 0 ? y : x, off, dt, (float)acc[i]);
    }
    free(acc);
}

/* Check one convolution call's arguments, then convolve as its descriptors say. */
static em_cudnn_status k_run(int pass, em_cudnn_handle h, const void *alpha, em_cudnn_tensor xd, void *x,
                             em_cudnn_filter wd, void *w, em_cudnn_conv c, int algo, void *ws, size_t ws_bytes,
                             const void *beta, em_cudnn_tensor yd, void *y) {
    k_log("%s(algo %d, ws %zu) ", k_pass_name[pass], algo, ws_bytes);
    if (h != (em_cudnn_handle)&k_handle_tag) k_bad("handle");
    if (t_ctx != 0) k_bad("no context current (or another device's)");
    if (K.stream != (void *)&stream_tag[0]) k_bad("the handle is not bound to cuda:0's stream");
    if (!xd->set || !yd->set || !wd->set || !c->set) k_bad("a descriptor was never set");
    if (xd->dt != wd->dt || yd->dt != wd->dt) k_bad("descriptors of different dtypes");
    if (wd->format != EM_CUDNN_TENSOR_NCHW) k_bad("filter format");
    if (c->mode != EM_CUDNN_CROSS_CORRELATION || c->compute != EM_CUDNN_DATA_FLOAT) k_bad("mode or compute type");
    if (xd->dims[1] != wd->dims[1] * c->groups || wd->dims[0] % c->groups || yd->dims[1] != wd->dims[0] ||
        yd->dims[0] != xd->dims[0] || yd->dims[2] != k_out(xd->dims[2], c->ph, c->dh, wd->dims[2], c->u) ||
        yd->dims[3] != k_out(xd->dims[3], c->pw, c->dw, wd->dims[3], c->v))
        k_bad("descriptors that do not agree");
    if (algo < 0 || algo >= 8 || ws_bytes < K.ws_of_algo[algo] || (ws_bytes && !ws)) k_bad("workspace");
    if (*(const float *)alpha != 1.0f || *(const float *)beta != 0.0f) k_bad("alpha/beta");
    if (!x || !w || !y) k_bad("a NULL pointer");
    if (K.bad[0]) return K_BAD_PARAM;
    K.x = *xd, K.y = *yd, K.w = *wd, K.c = *c;
    K.pass = pass, K.algo = algo, K.ws = ws, K.ws_bytes = ws_bytes;
    k_geo g = {.N = xd->dims[0], .C = xd->dims[1], .H = xd->dims[2], .W = xd->dims[3], .O = wd->dims[0],
               .G = c->groups, .kh = wd->dims[2], .kw = wd->dims[3], .oh = yd->dims[2], .ow = yd->dims[3],
               .sh = c->u, .sw = c->v, .ph = c->ph, .pw = c->pw, .dh = c->dh, .dw = c->dw};
    memcpy(g.xs, xd->strides, sizeof g.xs);
    memcpy(g.ys, yd->strides, sizeof g.ys);
    k_convolve(pass, &g, xd->dt, x, w, y);
    if (ws_bytes) memset(ws, 0xab, ws_bytes); /* the workspace is really written: ASan sees its bounds */
    K.runs++;
    return 0;
}
static em_cudnn_status k_forward(em_cudnn_handle h, const void *alpha, em_cudnn_tensor xd, const void *x,
                                 em_cudnn_filter wd, const void *w, em_cudnn_conv c, int algo, void *ws, size_t wsb,
                                 const void *beta, em_cudnn_tensor yd, void *y) {
    K_ENTER("cudnnConvolutionForward");
    return k_run(0, h, alpha, xd, (void *)x, wd, (void *)w, c, algo, ws, wsb, beta, yd, y);
}
static em_cudnn_status k_backward_data(em_cudnn_handle h, const void *alpha, em_cudnn_filter wd, const void *w,
                                       em_cudnn_tensor dyd, const void *dy, em_cudnn_conv c, int algo, void *ws,
                                       size_t wsb, const void *beta, em_cudnn_tensor dxd, void *dx) {
    K_ENTER("cudnnConvolutionBackwardData");
    return k_run(1, h, alpha, dxd, dx, wd, (void *)w, c, algo, ws, wsb, beta, dyd, (void *)dy);
}
static em_cudnn_status k_backward_filter(em_cudnn_handle h, const void *alpha, em_cudnn_tensor xd, const void *x,
                                         em_cudnn_tensor dyd, const void *dy, em_cudnn_conv c, int algo, void *ws,
                                         size_t wsb, const void *beta, em_cudnn_filter dwd, void *dw) {
    K_ENTER("cudnnConvolutionBackwardFilter");
    return k_run(2, h, alpha, xd, (void *)x, dwd, dw, c, algo, ws, wsb, beta, dyd, (void *)dy);
}

/* The library's symbols, by name, as dlsym would find them. */
static const struct { const char *name; void *fn; } k_symbols[] = {
    {"cudnnGetVersion", (void *)k_version}, {"cudnnGetCudartVersion", (void *)k_cudart},
    {"cudnnGetErrorString", (void *)k_error_string}, {"cudnnCreate", (void *)k_create},
    {"cudnnDestroy", (void *)k_destroy}, {"cudnnSetStream", (void *)k_set_stream},
    {"cudnnCreateTensorDescriptor", (void *)k_create_tensor}, {"cudnnSetTensor4dDescriptorEx", (void *)k_set_tensor},
    {"cudnnDestroyTensorDescriptor", (void *)k_destroy_tensor}, {"cudnnCreateFilterDescriptor", (void *)k_create_filter},
    {"cudnnSetFilter4dDescriptor", (void *)k_set_filter}, {"cudnnDestroyFilterDescriptor", (void *)k_destroy_filter},
    {"cudnnCreateConvolutionDescriptor", (void *)k_create_conv}, {"cudnnSetConvolution2dDescriptor", (void *)k_set_conv},
    {"cudnnSetConvolutionGroupCount", (void *)k_groups}, {"cudnnSetConvolutionMathType", (void *)k_math},
    {"cudnnDestroyConvolutionDescriptor", (void *)k_destroy_conv},
    {"cudnnGetConvolution2dForwardOutputDim", (void *)k_outdim},
    {"cudnnGetConvolutionForwardAlgorithm_v7", (void *)k_fwd_algos},
    {"cudnnGetConvolutionForwardWorkspaceSize", (void *)k_fwd_ws}, {"cudnnConvolutionForward", (void *)k_forward},
    {"cudnnGetConvolutionBackwardDataAlgorithm_v7", (void *)k_data_algos},
    {"cudnnGetConvolutionBackwardDataWorkspaceSize", (void *)k_data_ws},
    {"cudnnConvolutionBackwardData", (void *)k_backward_data},
    {"cudnnGetConvolutionBackwardFilterAlgorithm_v7", (void *)k_filter_algos},
    {"cudnnGetConvolutionBackwardFilterWorkspaceSize", (void *)k_filter_ws},
    {"cudnnConvolutionBackwardFilter", (void *)k_backward_filter},
};
static const char *k_missing; /* a symbol the fake library pretends not to have */
static void *k_sym(const char *name) {
    if (k_missing && !strcmp(name, k_missing)) return NULL;
    for (size_t i = 0; i < sizeof k_symbols / sizeof k_symbols[0]; i++)
        if (!strcmp(k_symbols[i].name, name)) return k_symbols[i].fn;
    return NULL;
}

/* A fresh fake: cuDNN 9.6.0 for CUDA 12.4, one algorithm (1) without workspace. */
static void k_reset(void) {
    memset(&K, 0, sizeof K);
    K.version = 90600;
    K.cudart = 12040;
    K.nperf = 1;
    K.perf[0] = (em_cudnn_algo_perf){.algo = 1, .status = 0};
    k_missing = NULL;
}

#endif
