/* Convolution on the CPU through oneDNN (what PyTorch uses): forward, backward to the data
 * and backward to the weights in f32, on plain NCHW / (G)OIHW memory, so no reorders. A
 * configuration oneDNN cannot run answers EM_ERR_NOT_SUPPORTED without recording an error
 * and core takes the portable im2col path instead. oneDNN keeps its own cache of compiled
 * primitives, so building the descriptors on every call costs microseconds. */
#include "cpu_internal.h"
#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <dnnl.h>

static dnnl_engine_t g_engine;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void (*g_omp_set_threads)(int);

static void engine_init(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
    /* oneDNN here runs on OpenMP: follow em_set_num_threads through libgomp, already loaded
     * by libdnnl (looked up, so Ember need not link OpenMP itself) */
    *(void **)&g_omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
}

typedef struct dnnl_conv {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dil, pad_l, pad_r;
} dnnl_conv;

/* descriptors of the convolution; false when oneDNN's shape rules cannot express it */
static bool describe(dnnl_conv *c, const em_window2d *g, int64_t O, int64_t G, bool bias) {
    dnnl_dims_t src = {g->n, g->c, g->h, g->w}, dst = {g->n, O, g->oh, g->ow};
    dnnl_dims_t wei = {G, O / G, g->c / G, g->kh, g->kw}, wei4 = {O, g->c / G, g->kh, g->kw}, b = {O};
    if (dnnl_memory_desc_init_by_tag(&c->src, 4, src, dnnl_f32, dnnl_nchw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c->dst, 4, dst, dnnl_f32, dnnl_nchw) != dnnl_success)
        return false;
    dnnl_status_t s = G == 1 ? dnnl_memory_desc_init_by_tag(&c->wei, 4, wei4, dnnl_f32, dnnl_oihw)
                             : dnnl_memory_desc_init_by_tag(&c->wei, 5, wei, dnnl_f32, dnnl_goihw);
    if (s != dnnl_success) return false;
    if (bias && dnnl_memory_desc_init_by_tag(&c->bias, 1, b, dnnl_f32, dnnl_x) != dnnl_success) return false;
    c->strides[0] = g->sh, c->strides[1] = g->sw;
    c->dil[0] = g->dh - 1, c->dil[1] = g->dw - 1; /* oneDNN counts dilation from 0 */
    c->pad_l[0] = g->ph, c->pad_l[1] = g->pw;
    /* the right padding that makes oneDNN's output size equal floor division's */
    c->pad_r[0] = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1 - g->h - g->ph;
    c->pad_r[1] = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1 - g->w - g->pw;
    return c->pad_r[0] >= 0 && c->pad_r[1] >= 0;
}

static dnnl_primitive_desc_t forward_pd(const dnnl_conv *c, bool bias) {
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &c->src,
                                                   &c->wei, bias ? &c->bias : NULL, &c->dst, c->strides, c->dil,
                                                   c->pad_l, c->pad_r) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, NULL) != dnnl_success)
        return NULL;
    return pd;
}

typedef struct exec_arg {
    int arg;
    void *ptr;
    const dnnl_memory_desc_t *md;
} exec_arg;

/* create the primitive of pd, wrap the buffers, run and wait; pd is destroyed */
static em_status run(const char *op, dnnl_primitive_desc_t pd, int n, const exec_arg *a) {
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[4] = {NULL};
    dnnl_exec_arg_t args[4];
    bool ok = dnnl_primitive_create(&prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok) return EM_ERR_NOT_SUPPORTED;
    ok = dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags) == dnnl_success;
    for (int i = 0; ok && i < n; i++) {
        ok = dnnl_memory_create(&mem[i], a[i].md, g_engine, a[i].ptr) == dnnl_success;
        args[i].arg = a[i].arg;
        args[i].memory = mem[i];
    }
    if (ok && g_omp_set_threads) g_omp_set_threads(em__cpu_num_threads());
    dnnl_status_t s = ok ? dnnl_primitive_execute(prim, stream, n, args) : dnnl_out_of_memory;
    if (s == dnnl_success) s = dnnl_stream_wait(stream);
    for (int i = 0; i < n; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (stream) dnnl_stream_destroy(stream);
    dnnl_primitive_destroy(prim);
    if (s == dnnl_out_of_memory) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: oneDNN ran out of memory", op);
    if (s != dnnl_success) return em_error(EM_ERR_INTERNAL, "%s: oneDNN failed (status %d)", op, (int)s);
    return EM_OK;
}

static bool ready(const em_tensor *t) {
    pthread_once(&g_once, engine_init);
    return g_engine && t->dtype == EM_F32;
}

em_status em__cpu_conv2d_dnnl(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                              const em_window2d *g, int64_t groups) {
    dnnl_conv c;
    if (!ready(in) || !describe(&c, g, w->shape[0], groups, bias != NULL)) return EM_ERR_NOT_SUPPORTED;
    dnnl_primitive_desc_t pd = forward_pd(&c, bias != NULL);
    if (!pd) return EM_ERR_NOT_SUPPORTED;
    exec_arg a[4] = {{DNNL_ARG_SRC, em__host_ptr(in), &c.src},
                     {DNNL_ARG_WEIGHTS, em__host_ptr(w), &c.wei},
                     {DNNL_ARG_DST, em__host_ptr(out), &c.dst},
                     {DNNL_ARG_BIAS, bias ? em__host_ptr(bias) : NULL, &c.bias}};
    return run("conv2d", pd, bias ? 4 : 3, a);
}

em_status em__cpu_conv2d_backward_input_dnnl(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                             const em_window2d *g, int64_t groups) {
    dnnl_conv c;
    if (!ready(gin) || !describe(&c, g, w->shape[0], groups, false)) return EM_ERR_NOT_SUPPORTED;
    dnnl_primitive_desc_t hint = forward_pd(&c, false), pd = NULL;
    dnnl_convolution_desc_t cd;
    bool ok = hint &&
              dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &c.src, &c.wei, &c.dst,
                                                               c.strides, c.dil, c.pad_l, c.pad_r) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, hint) == dnnl_success;
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!ok) return EM_ERR_NOT_SUPPORTED;
    exec_arg a[3] = {{DNNL_ARG_DIFF_DST, em__host_ptr(gout), &c.dst},
                     {DNNL_ARG_WEIGHTS, em__host_ptr(w), &c.wei},
                     {DNNL_ARG_DIFF_SRC, em__host_ptr(gin), &c.src}};
    return run("conv2d backward (input)", pd, 3, a);
}

em_status em__cpu_conv2d_backward_weight_dnnl(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                              const em_window2d *g, int64_t groups) {
    dnnl_conv c;
    if (!ready(gw) || !describe(&c, g, gw->shape[0], groups, false)) return EM_ERR_NOT_SUPPORTED;
    dnnl_primitive_desc_t hint = forward_pd(&c, false), pd = NULL;
    dnnl_convolution_desc_t cd;
    bool ok = hint &&
              dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &c.src, &c.wei, NULL,
                                                                  &c.dst, c.strides, c.dil, c.pad_l,
                                                                  c.pad_r) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, hint) == dnnl_success;
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!ok) return EM_ERR_NOT_SUPPORTED;
    exec_arg a[3] = {{DNNL_ARG_SRC, em__host_ptr(in), &c.src},
                     {DNNL_ARG_DIFF_DST, em__host_ptr(gout), &c.dst},
                     {DNNL_ARG_DIFF_WEIGHTS, em__host_ptr(gw), &c.wei}};
    return run("conv2d backward (weight)", pd, 3, a);
}
#endif
