/* Conv2d on cuDNN (legacy API), when libcudnn is found at run time.
 *
 * The backend table's conv2d, conv2d_backward_input and conv2d_backward_weight: NCHW tensor
 * descriptors with the tensors' own strides, a filter descriptor, a convolution descriptor
 * (padding, stride, dilation, cross-correlation, float32 compute, groups, math type), then
 * cudnnGetConvolution*Algorithm_v7's candidates in its order of preference: the first whose
 * workspace the caching allocator can give runs. f16/bf16 use tensor cores with float32
 * accumulation (CUDNN_TENSOR_OP_MATH); f32 uses plain FMA unless EMBER_CUDA_ALLOW_TF32=1
 * allows TF32 (CUDNN_DEFAULT_MATH), as matmul does. The bias is added afterwards by Ember's
 * own broadcast add.
 *
 * Anything cuDNN cannot or will not do (cuDNN off or absent, f64, a size past int, a status
 * other than success) returns EM_ERR_NOT_SUPPORTED with nothing recorded: core then runs the
 * same call as im2col + matmul on Ember's kernels. EMBER_CUDA_TRACE=1 says why. Shapes are
 * checked by core before it gets here, so what the kernels would reject never arrives. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "../../memory/allocator.h"
#include "cuda_launch.h"

typedef enum conv_pass { PASS_FWD, PASS_BWD_DATA, PASS_BWD_FILTER } conv_pass;
static const char *const k_op[] = {"conv2d", "conv2d backward (input)", "conv2d backward (weight)"};
#define MAX_ALGOS 8 /* more than any pass has (forward: 8) */

/* A cuDNN handle is not for two threads at once: one lock for every device's. */
static pthread_mutex_t g_dlock = PTHREAD_MUTEX_INITIALIZER;

static bool allow_tf32(void) {
    const char *e = getenv("EMBER_CUDA_ALLOW_TF32");
    return e && *e && strcmp(e, "0") != 0;
}

static void algos_forget(void);

/* d's handle, created on first use and bound to d's stream (g_dlock held). */
static em_cudnn_handle handle_for(em_cuda_device *d, const em_cudnn_api *a, em_cudnn_status *s,
                                  const char **fn) {
    if (d->cudnn) return d->cudnn;
    em_cudnn_handle h = NULL;
    *fn = "cudnnCreate";
    *s = a->cudnnCreate(&h);
    if (*s != EM_CUDNN_STATUS_SUCCESS) return NULL;
    *fn = "cudnnSetStream";
    *s = a->cudnnSetStream(h, d->stream);
    if (*s != EM_CUDNN_STATUS_SUCCESS) {
        a->cudnnDestroy(h);
        return NULL;
    }
    *fn = NULL;
    d->cudnn = h;
    return h;
}

void em__cuda_cudnn_release(em_cuda_device *d) {
    const em_cudnn_api *a = d->cudnn ? em__cuda_cudnn(NULL, NULL) : NULL;
    if (a) a->cudnnDestroy(d->cudnn);
    d->cudnn = NULL;
    algos_forget(); /* remembered for handles that are gone */
}

/* One call's descriptors; x [N, C, H, W], w [O, C / G, kh, kw], y [N, O, oh, ow]. */
typedef struct conv_descs {
    em_cudnn_tensor x, y;
    em_cudnn_filter w;
    em_cudnn_conv c;
} conv_descs;

static void free_descs(const em_cudnn_api *a, conv_descs *D) {
    if (D->x) a->cudnnDestroyTensorDescriptor(D->x);
    if (D->y) a->cudnnDestroyTensorDescriptor(D->y);
    if (D->w) a->cudnnDestroyFilterDescriptor(D->w);
    if (D->c) a->cudnnDestroyConvolutionDescriptor(D->c);
}

/* What failed: the function and cuDNN's status, for the trace. */
typedef struct conv_fail {
    const char *fn;
    em_cudnn_status status;
    char detail[128];
} conv_fail;

#define TRY(call, name)                                  \
    do {                                                 \
        em_cudnn_status s_ = (call);                     \
        if (s_ != EM_CUDNN_STATUS_SUCCESS) {             \
            f->fn = (name);                              \
            f->status = s_;                              \
            return false;                                \
        }                                                \
    } while (0)

static bool tensor_desc(const em_cudnn_api *a, em_cudnn_tensor *out, int dt, const em_tensor *t, conv_fail *f) {
    TRY(a->cudnnCreateTensorDescriptor(out), "cudnnCreateTensorDescriptor");
    TRY(a->cudnnSetTensor4dDescriptorEx(*out, dt, (int)t->shape[0], (int)t->shape[1], (int)t->shape[2],
                                        (int)t->shape[3], (int)t->strides[0], (int)t->strides[1],
                                        (int)t->strides[2], (int)t->strides[3]),
        "cudnnSetTensor4dDescriptorEx");
    return true;
}

static bool make_descs(const em_cudnn_api *a, conv_descs *D, int dt, const em_tensor *x, const em_tensor *w,
                       const em_tensor *y, const em_window2d *g, int groups, conv_fail *f) {
    if (!tensor_desc(a, &D->x, dt, x, f) || !tensor_desc(a, &D->y, dt, y, f)) return false;
    TRY(a->cudnnCreateFilterDescriptor(&D->w), "cudnnCreateFilterDescriptor");
    TRY(a->cudnnSetFilter4dDescriptor(D->w, dt, EM_CUDNN_TENSOR_NCHW, (int)w->shape[0], (int)w->shape[1],
                                      (int)w->shape[2], (int)w->shape[3]),
        "cudnnSetFilter4dDescriptor");
    TRY(a->cudnnCreateConvolutionDescriptor(&D->c), "cudnnCreateConvolutionDescriptor");
    /* float32 compute for every dtype: f16/bf16 accumulate in float, as matmul does */
    TRY(a->cudnnSetConvolution2dDescriptor(D->c, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw, (int)g->dh,
                                           (int)g->dw, EM_CUDNN_CROSS_CORRELATION, EM_CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
    TRY(a->cudnnSetConvolutionGroupCount(D->c, groups), "cudnnSetConvolutionGroupCount");
    int math = dt != EM_CUDNN_DATA_FLOAT ? EM_CUDNN_TENSOR_OP_MATH
             : allow_tf32()              ? EM_CUDNN_DEFAULT_MATH /* TF32 allowed on Ampere and newer */
                                         : EM_CUDNN_FMA_MATH;
    TRY(a->cudnnSetConvolutionMathType(D->c, math), "cudnnSetConvolutionMathType");
    /* cuDNN's view of the geometry must give the output core allocated */
    int n = 0, c = 0, h = 0, wd = 0;
    TRY(a->cudnnGetConvolution2dForwardOutputDim(D->c, D->x, D->w, &n, &c, &h, &wd),
        "cudnnGetConvolution2dForwardOutputDim");
    if (n != y->shape[0] || c != y->shape[1] || h != y->shape[2] || wd != y->shape[3]) {
        f->fn = "cudnnGetConvolution2dForwardOutputDim";
        snprintf(f->detail, sizeof f->detail, "an output of [%d, %d, %d, %d], not [%lld, %lld, %lld, %lld]", n, c,
                 h, wd, (long long)y->shape[0], (long long)y->shape[1], (long long)y->shape[2],
                 (long long)y->shape[3]);
        return false;
    }
    return true;
}

static void *dptr(const em_tensor *t) { return (void *)(uintptr_t)em__cuda_ptr(t); }

/* The pass's three calls, by algorithm (g_dlock held). */
static em_cudnn_status get_algos(conv_pass p, const em_cudnn_api *a, em_cudnn_handle h, const conv_descs *D,
                                 int *n, em_cudnn_algo_perf *perf) {
    switch (p) {
    case PASS_FWD:
        return a->cudnnGetConvolutionForwardAlgorithm_v7(h, D->x, D->w, D->c, D->y, MAX_ALGOS, n, perf);
    case PASS_BWD_DATA:
        return a->cudnnGetConvolutionBackwardDataAlgorithm_v7(h, D->w, D->y, D->c, D->x, MAX_ALGOS, n, perf);
    default:
        return a->cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, D->x, D->y, D->c, D->w, MAX_ALGOS, n, perf);
    }
}
static em_cudnn_status workspace_size(conv_pass p, const em_cudnn_api *a, em_cudnn_handle h, const conv_descs *D,
                                      int algo, size_t *bytes) {
    switch (p) {
    case PASS_FWD: return a->cudnnGetConvolutionForwardWorkspaceSize(h, D->x, D->w, D->c, D->y, algo, bytes);
    case PASS_BWD_DATA:
        return a->cudnnGetConvolutionBackwardDataWorkspaceSize(h, D->w, D->y, D->c, D->x, algo, bytes);
    default: return a->cudnnGetConvolutionBackwardFilterWorkspaceSize(h, D->x, D->y, D->c, D->w, algo, bytes);
    }
}
static const char *const k_run_fn[] = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                       "cudnnConvolutionBackwardFilter"};
static em_cudnn_status run_algo(conv_pass p, const em_cudnn_api *a, em_cudnn_handle h, const conv_descs *D,
                                int algo, void *ws, size_t ws_bytes, const em_tensor *x, const em_tensor *w,
                                const em_tensor *y) {
    /* the written operand is overwritten (beta 0), never accumulated into */
    const float one = 1.0f, zero = 0.0f;
    switch (p) {
    case PASS_FWD:
        return a->cudnnConvolutionForward(h, &one, D->x, dptr(x), D->w, dptr(w), D->c, algo, ws, ws_bytes, &zero,
                                          D->y, dptr(y));
    case PASS_BWD_DATA:
        return a->cudnnConvolutionBackwardData(h, &one, D->w, dptr(w), D->y, dptr(y), D->c, algo, ws, ws_bytes,
                                               &zero, D->x, dptr(x));
    default:
        return a->cudnnConvolutionBackwardFilter(h, &one, D->x, dptr(x), D->y, dptr(y), D->c, algo, ws, ws_bytes,
                                                 &zero, D->w, dptr(w));
    }
}

/* The algorithm each convolution ran with, by everything its descriptors hold (PyTorch keeps
 * the same per ConvolutionParams): asking cuDNN's heuristics and workspace sizes again on
 * every call cost the CNN's training step on an H200 more than its convolutions (4.0 s per
 * epoch against PyTorch's 1.9). Under g_dlock; emptied when a cuDNN handle is destroyed. */
#define ALGO_KEY_WORDS 40 /* 5 + 3 tensors x 8 + 6 used */
#define ALGO_CACHE 64
typedef struct algo_entry {
    int64_t key[ALGO_KEY_WORDS];
    int algo;
    size_t ws_bytes;
    bool used;
} algo_entry;
static algo_entry g_algos[ALGO_CACHE];
static unsigned g_algo_next; /* the entry the next miss replaces, round robin */

static void algos_forget(void) {
    pthread_mutex_lock(&g_dlock);
    memset(g_algos, 0, sizeof g_algos);
    pthread_mutex_unlock(&g_dlock);
}

static void algo_key(int64_t *k, conv_pass p, int dev, int dt, const em_tensor *x, const em_tensor *w,
                     const em_tensor *y, const em_window2d *g, int groups) {
    memset(k, 0, sizeof(int64_t) * ALGO_KEY_WORDS);
    int n = 0;
    k[n++] = p, k[n++] = dev, k[n++] = dt, k[n++] = groups, k[n++] = allow_tf32();
    const em_tensor *t[3] = {x, w, y};
    for (int i = 0; i < 3; i++)
        for (int d = 0; d < 4; d++) k[n++] = t[i]->shape[d], k[n++] = i == 1 ? 0 : t[i]->strides[d];
    k[n++] = g->ph, k[n++] = g->pw, k[n++] = g->sh, k[n++] = g->sw, k[n++] = g->dh, k[n++] = g->dw;
}

static algo_entry *algo_find(const int64_t *key) {
    for (int i = 0; i < ALGO_CACHE; i++)
        if (g_algos[i].used && !memcmp(g_algos[i].key, key, sizeof g_algos[i].key)) return &g_algos[i];
    return NULL;
}

static void algo_remember(const int64_t *key, int algo, size_t ws_bytes) {
    algo_entry *e = algo_find(key);
    if (!e) e = &g_algos[g_algo_next++ % ALGO_CACHE];
    memcpy(e->key, key, sizeof e->key);
    e->algo = algo;
    e->ws_bytes = ws_bytes;
    e->used = true;
}

/* Run a remembered algorithm. False, with nothing run, when its workspace cannot be had
 * (the caller then asks cuDNN again); a failed run is reported in *f. */
static bool run_remembered(conv_pass p, const em_cudnn_api *a, em_cudnn_handle h, const conv_descs *D, int dev,
                           const algo_entry *e, const em_tensor *x, const em_tensor *w, const em_tensor *y,
                           bool *ran, conv_fail *f) {
    em_block ws;
    memset(&ws, 0, sizeof ws);
    *ran = false;
    if (e->ws_bytes) {
        em_error_state saved;
        em__error_save(&saved);
        em_status st = em__mem_alloc(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), e->ws_bytes, &ws);
        em__error_restore(&saved);
        if (st != EM_OK) return false;
    }
    *ran = true;
    em_cudnn_status s = run_algo(p, a, h, D, e->algo, e->ws_bytes ? (char *)ws.handle + ws.offset : NULL,
                                 e->ws_bytes, x, w, y);
    if (e->ws_bytes) em__mem_free(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), &ws);
    if (s != EM_CUDNN_STATUS_SUCCESS) {
        f->fn = k_run_fn[p];
        f->status = s;
        snprintf(f->detail, sizeof f->detail, "algorithm %d", e->algo);
        return false;
    }
    return true;
}

/* Run pass p with the first candidate algorithm whose workspace can be had; remember it under key. */
static bool run_pass(conv_pass p, const em_cudnn_api *a, em_cudnn_handle h, const conv_descs *D, int dev,
                     const int64_t *key, const em_tensor *x, const em_tensor *w, const em_tensor *y,
                     conv_fail *f) {
    static const char *const algo_fn[] = {"cudnnGetConvolutionForwardAlgorithm_v7",
                                          "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                                          "cudnnGetConvolutionBackwardFilterAlgorithm_v7"};
    static const char *const ws_fn[] = {"cudnnGetConvolutionForwardWorkspaceSize",
                                        "cudnnGetConvolutionBackwardDataWorkspaceSize",
                                        "cudnnGetConvolutionBackwardFilterWorkspaceSize"};
    em_cudnn_algo_perf perf[MAX_ALGOS];
    memset(perf, 0, sizeof perf);
    int n = 0;
    TRY(get_algos(p, a, h, D, &n, perf), algo_fn[p]);
    if (n > MAX_ALGOS) n = MAX_ALGOS;
    for (int i = 0; i < n; i++) {
        if (perf[i].status != EM_CUDNN_STATUS_SUCCESS) continue; /* cannot run this one here */
        size_t bytes = 0;
        TRY(workspace_size(p, a, h, D, perf[i].algo, &bytes), ws_fn[p]);
        em_block ws;
        memset(&ws, 0, sizeof ws);
        if (bytes) {
            /* from the caching allocator: counted, and an out-of-memory frees its cache first */
            em_error_state saved;
            em__error_save(&saved);
            em_status st = em__mem_alloc(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), bytes, &ws);
            em__error_restore(&saved);
            if (st != EM_OK) {
                if (em__cuda_trace_enabled())
                    fprintf(stderr, "ember: cuda:%d: %s: no memory for algorithm %d's %zu-byte workspace; "
                            "trying the next\n", dev, k_op[p], perf[i].algo, bytes);
                continue;
            }
        }
        void *wsp = bytes ? (char *)ws.handle + ws.offset : NULL;
        em_cudnn_status s = run_algo(p, a, h, D, perf[i].algo, wsp, bytes, x, w, y);
        /* queued on d's stream, like every later op: the block is reused only after it */
        if (bytes) em__mem_free(&em__cuda_backend, EM_DEVICE(EM_CUDA, dev), &ws);
        if (s != EM_CUDNN_STATUS_SUCCESS) {
            f->fn = k_run_fn[p];
            f->status = s;
            snprintf(f->detail, sizeof f->detail, "algorithm %d", perf[i].algo);
            return false;
        }
        algo_remember(key, perf[i].algo, bytes);
        return true;
    }
    f->fn = algo_fn[p];
    snprintf(f->detail, sizeof f->detail, "no algorithm it offered (%d) could run", n);
    return false;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static bool sizes_fit(const em_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        if (!fits_int(t->shape[i]) || !fits_int(t->strides[i])) return false;
        n *= t->shape[i];
        if (!fits_int(n)) return false;
    }
    return true;
}

/* out [N, O, oh, ow] += bias [O] broadcast, on Ember's elementwise kernel */
static em_status add_bias(em_tensor *out, const em_tensor *bias) {
    em_tensor bv;
    memset(&bv, 0, sizeof bv);
    bv.dtype = bias->dtype;
    bv.ndim = 4;
    bv.storage = bias->storage;
    bv.offset = bias->offset;
    bv.is_leaf = true;
    for (int i = 0; i < 4; i++) bv.shape[i] = out->shape[i];
    bv.strides[1] = bias->strides[0];
    em_op_call add = {.op = EM_OP_ADD, .dtype = out->dtype, .dst = {out}, .src = {out, &bv}};
    return em__gpu_run(&em__cuda_gpu, &add);
}

/* Pass p of the convolution x * w = y; the operand p writes is y, x or w. */
static em_status conv_in(conv_pass p, const em_tensor *x, const em_tensor *w, const em_tensor *y,
                         const em_window2d *g, int64_t groups) {
    const char *op = k_op[p];
    int dt;
    switch (x->dtype) {
    case EM_F32: dt = EM_CUDNN_DATA_FLOAT; break;
    case EM_F16: dt = EM_CUDNN_DATA_HALF; break;
    case EM_BF16: dt = EM_CUDNN_DATA_BFLOAT16; break;
    default: return EM_ERR_NOT_SUPPORTED; /* f64: Ember's kernels, which keep double precision */
    }
    if (w->dtype != x->dtype || y->dtype != x->dtype || x->ndim != 4 || w->ndim != 4 || y->ndim != 4)
        return EM_ERR_NOT_SUPPORTED;
    int dev = x->storage->device.index;
    bool trace = em__cuda_trace_enabled();
    int64_t geo[] = {g->ph, g->pw, g->sh, g->sw, g->dh, g->dw, groups};
    bool fit = sizes_fit(x) && sizes_fit(w) && sizes_fit(y);
    for (size_t i = 0; i < sizeof geo / sizeof geo[0]; i++) fit = fit && fits_int(geo[i]);
    if (!fit || !em__tensor_dense(w)) { /* cuDNN's legacy descriptors take int; a filter has no strides */
        if (trace)
            fprintf(stderr, "ember: cuda:%d: %s: %s; Ember's kernels run it\n", dev, op,
                    fit ? "the weight is not contiguous" : "a size is past cuDNN's int");
        return EM_ERR_NOT_SUPPORTED;
    }
    const char *reason = NULL;
    const em_cudnn_api *a = em__cuda_cudnn(NULL, &reason);
    if (!a) {
        static atomic_bool said;
        if (trace && !atomic_exchange(&said, true))
            fprintf(stderr, "ember: cuda: cudnn: %s; convolutions use Ember's kernels\n", reason);
        return EM_ERR_NOT_SUPPORTED;
    }
    em_cuda_device *d = em__cuda_activate(dev, op);
    if (!d) return em_last_status();

    conv_fail f = {.fn = NULL, .status = EM_CUDNN_STATUS_SUCCESS, .detail = ""};
    conv_descs D = {NULL, NULL, NULL, NULL};
    pthread_mutex_lock(&g_dlock);
    em_cudnn_handle h = handle_for(d, a, &f.status, &f.fn);
    bool ok = false;
    if (h && make_descs(a, &D, dt, x, w, y, g, (int)groups, &f)) {
        int64_t key[ALGO_KEY_WORDS];
        algo_key(key, p, dev, dt, x, w, y, g, (int)groups);
        const algo_entry *e = algo_find(key);
        bool ran = false;
        if (e) ok = run_remembered(p, a, h, &D, dev, e, x, w, y, &ran, &f);
        if (!ran) ok = run_pass(p, a, h, &D, dev, key, x, w, y, &f);
    }
    free_descs(a, &D);
    pthread_mutex_unlock(&g_dlock);
    if (!ok) {
        /* cuDNN cannot run this one here (this GPU, this shape, no memory): the kernels can */
        if (trace)
            fprintf(stderr, "ember: cuda:%d: %s (%s, groups %lld): %s gave %s%s%s; Ember's kernels run it\n", dev,
                    op, em_dtype_name(x->dtype), (long long)groups, f.fn,
                    f.status != EM_CUDNN_STATUS_SUCCESS ? a->cudnnGetErrorString(f.status) : "",
                    f.status != EM_CUDNN_STATUS_SUCCESS && f.detail[0] ? ", " : "", f.detail);
        return EM_ERR_NOT_SUPPORTED;
    }
    return em__cuda_after_launch(d, op, k_run_fn[p]);
}

static em_status forward_in(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                            const em_window2d *g, int64_t groups) {
    em_status st = conv_in(PASS_FWD, in, w, out, g, groups);
    return st == EM_OK && bias ? add_bias(out, bias) : st;
}

em_status em__cuda_conv2d(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                          const em_window2d *g, int64_t groups) {
    EM_CUDA_CTX_SCOPED(forward_in(out, in, w, bias, g, groups));
}

em_status em__cuda_conv2d_backward_input(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                         const em_window2d *g, int64_t groups) {
    EM_CUDA_CTX_SCOPED(conv_in(PASS_BWD_DATA, gin, w, gout, g, groups));
}

em_status em__cuda_conv2d_backward_weight(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                          const em_window2d *g, int64_t groups) {
    EM_CUDA_CTX_SCOPED(conv_in(PASS_BWD_FILTER, in, gw, gout, g, groups));
}

#endif
