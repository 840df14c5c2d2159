/* Matmul through CLBlast, loaded with dlopen so that Ember builds and runs without it.
 *
 * EMBER_OPENCL_GEMM selects: "clblast" (CLBlast for f32/f64 when it loads), "ember"
 * (always Ember's tiled kernel, src/kernels/matmul.k; any other value makes every OpenCL
 * matmul fail with an error that names it), or unset: the default below, chosen by
 * measurement on PoCL (docs/BENCHMARKS.md, "OpenCL (PoCL)"). CLBlast enqueues on Ember's
 * in-order queue, so it is ordered with every other op and never synchronizes. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "opencl_internal.h"

/* CLBlast's C API (clblast_c.h), the two entry points used */
enum { CLBLAST_ROW_MAJOR = 101, CLBLAST_TRANS_NO = 111, CLBLAST_TRANS_YES = 112 };
typedef int (*sgemm_batched_fn)(int, int, int, size_t, size_t, size_t, float, cl_mem, size_t,
                                size_t, size_t, cl_mem, size_t, size_t, size_t, float, cl_mem,
                                size_t, size_t, size_t, size_t, cl_command_queue *, cl_event *);
typedef int (*dgemm_batched_fn)(int, int, int, size_t, size_t, size_t, double, cl_mem, size_t,
                                size_t, size_t, cl_mem, size_t, size_t, size_t, double, cl_mem,
                                size_t, size_t, size_t, size_t, cl_command_queue *, cl_event *);
typedef int (*sgemm_fn)(int, int, int, size_t, size_t, size_t, float, cl_mem, size_t, size_t,
                        cl_mem, size_t, size_t, float, cl_mem, size_t, size_t, cl_command_queue *,
                        cl_event *);
typedef int (*dgemm_fn)(int, int, int, size_t, size_t, size_t, double, cl_mem, size_t, size_t,
                        cl_mem, size_t, size_t, double, cl_mem, size_t, size_t, cl_command_queue *,
                        cl_event *);

/* Measured on PoCL 3.1 (bench/opencl.c): Ember's kernel is the default; see BENCHMARKS.md. */
#define CLBLAST_BY_DEFAULT false

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_enabled;
static sgemm_batched_fn g_sgemm_b;
static dgemm_batched_fn g_dgemm_b;
static sgemm_fn g_sgemm;
static dgemm_fn g_dgemm;

static char g_bad_mode[64];   /* an EMBER_OPENCL_GEMM value that is neither: every matmul reports it */

static void load(void) {
    const char *mode = getenv("EMBER_OPENCL_GEMM");
    if (mode && *mode && strcmp(mode, "clblast") && strcmp(mode, "ember")) {
        snprintf(g_bad_mode, sizeof g_bad_mode, "%s", mode);
        return;
    }
    bool want = mode && strcmp(mode, "clblast") == 0 ? true
                : mode && strcmp(mode, "ember") == 0 ? false
                                                      : CLBLAST_BY_DEFAULT;
    if (!want) return;
    void *lib = dlopen("libclblast.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libclblast.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer */
    *(void **)&g_sgemm_b = dlsym(lib, "CLBlastSgemmStridedBatched");
    *(void **)&g_dgemm_b = dlsym(lib, "CLBlastDgemmStridedBatched");
    *(void **)&g_sgemm = dlsym(lib, "CLBlastSgemm");
    *(void **)&g_dgemm = dlsym(lib, "CLBlastDgemm");
    g_enabled = g_sgemm_b && g_dgemm_b && g_sgemm && g_dgemm;
}

bool em__ocl_clblast_enabled(void) {
    pthread_once(&g_once, load);
    return g_enabled;
}

em_status em__ocl_clblast_gemm(int dev, const em_gemm_args *g) {
    if (!em__ocl_clblast_enabled() && g_bad_mode[0])
        return em_error(EM_ERR_ARGUMENT, "EMBER_OPENCL_GEMM='%s' is not understood: expected 'clblast', 'ember' "
                        "or unset (the default)", g_bad_mode);
    if (!em__ocl_clblast_enabled() || (g->dtype != EM_F32 && g->dtype != EM_F64) || g->c_f32)
        return EM_ERR_NOT_SUPPORTED;
    ocl_device *d = em__ocl_device(dev);
    if (!d || (g->dtype == EM_F64 && !d->has_f64)) return EM_ERR_NOT_SUPPORTED;
    int ta = g->trans_a ? CLBLAST_TRANS_YES : CLBLAST_TRANS_NO;
    int tb = g->trans_b ? CLBLAST_TRANS_YES : CLBLAST_TRANS_NO;
    size_t m = (size_t)g->m, n = (size_t)g->n, k = (size_t)g->k;
    cl_mem a = (cl_mem)g->a, b = (cl_mem)g->b, c = (cl_mem)g->c;
    size_t ao = (size_t)g->a_off, bo = (size_t)g->b_off, co = (size_t)g->c_off;
    size_t lda = (size_t)g->lda, ldb = (size_t)g->ldb, ldc = (size_t)g->ldc;
    cl_command_queue q = d->queue;
    float beta = g->accumulate ? 1.0f : 0.0f; /* 1: addmm adds into the bias in C */
    int st;
    if (g->batch == 1) {
        st = g->dtype == EM_F32
                 ? g_sgemm(CLBLAST_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, ao, lda, b, bo, ldb, beta, c,
                           co, ldc, &q, NULL)
                 : g_dgemm(CLBLAST_ROW_MAJOR, ta, tb, m, n, k, 1.0, a, ao, lda, b, bo, ldb, beta, c,
                           co, ldc, &q, NULL);
    } else {
        size_t sa = (size_t)g->stride_a, sb = (size_t)g->stride_b, sc = (size_t)g->stride_c;
        size_t nb = (size_t)g->batch;
        st = g->dtype == EM_F32
                 ? g_sgemm_b(CLBLAST_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, ao, lda, sa, b, bo, ldb,
                             sb, beta, c, co, ldc, sc, nb, &q, NULL)
                 : g_dgemm_b(CLBLAST_ROW_MAJOR, ta, tb, m, n, k, 1.0, a, ao, lda, sa, b, bo, ldb,
                             sb, beta, c, co, ldc, sc, nb, &q, NULL);
    }
    if (st == 0) {
        pthread_mutex_lock(&d->lock);
        em__ocl_note_op(d, "matmul (CLBlast)");
        pthread_mutex_unlock(&d->lock);
        return EM_OK;
    }
    /* CLBlast's own argument codes (<= -1000, e.g. a zero batch stride it refuses) fall
     * back to Ember's kernel; OpenCL errors are real failures */
    if (st <= -1000) return EM_ERR_NOT_SUPPORTED;
    return em_error(EM_ERR_BACKEND, "matmul on opencl:%d: CLBlast failed with status %d", dev, st);
}
