/* Convolution on the CPU through oneDNN (what PyTorch uses): forward, backward to the data
 * and backward to the weights in f32, and in bf16 for cpu_conv_lowp.c (which decides when
 * bf16 runs here: the CPU-feature choice and the float32 copies stay there). Ember's tensors
 * are plain NCHW / (G)OIHW; oneDNN runs fastest in the blocked layouts it picks itself
 * (format "any": its jit:avx512 kernels, several times faster than its gemm path on plain
 * layouts for the CNN's shapes), so each pass reorders its operands into those layouts and
 * its result back. The primitives (the convolution and its reorders) and their buffers are
 * built once per shape and dtype and kept in a small cache (48 entries; the oldest goes). A
 * configuration oneDNN cannot run answers EM_ERR_NOT_SUPPORTED without recording an error,
 * and core takes the portable im2col path instead. */
#include "cpu_internal.h"
#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <dnnl.h>

/* as many shapes as the f32 (32) and bf16 (16) caches held when they were apart */
enum { MAX_ARGS = 4, CACHE_SIZE = 48 };

/* one operand of a pass: its oneDNN argument, Ember's plain layout and the pass's own */
typedef struct prim_arg {
    int arg;
    bool output;
    dnnl_memory_desc_t plain, chosen;
    dnnl_primitive_t reorder; /* plain -> chosen (inputs) or chosen -> plain (outputs); NULL: same */
} prim_arg;

typedef struct conv_prim {
    int pass;
    dnnl_data_type_t dt;
    em_window2d g;
    int64_t O, G;
    bool bias;
    dnnl_primitive_t conv;
    int nargs;
    prim_arg a[MAX_ARGS];
    size_t scratch; /* bytes for the reordered operands, together */
    char *buf;      /* that many bytes, kept: fresh memory each call costs page faults */
} conv_prim;

static dnnl_engine_t g_engine;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void (*g_omp_set_threads)(int);
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the cache, and one execution at a time */
static conv_prim *g_cache[CACHE_SIZE];
static int g_next;
static char g_bf16_desc[160] = "not probed yet"; /* the kernel the last new bf16 pass got (g_mu) */

static void prim_free(conv_prim *p) {
    if (!p) return;
    if (p->conv) dnnl_primitive_destroy(p->conv);
    free(p->buf);
    for (int i = 0; i < p->nargs; i++)
        if (p->a[i].reorder) dnnl_primitive_destroy(p->a[i].reorder);
    free(p);
}

static void cache_free(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < CACHE_SIZE; i++) prim_free(g_cache[i]), g_cache[i] = NULL;
    pthread_mutex_unlock(&g_mu);
    if (g_engine) dnnl_engine_destroy(g_engine), g_engine = NULL;
}

static void engine_init(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
    /* oneDNN here runs on OpenMP: follow em_set_num_threads through libgomp, already loaded
     * by libdnnl (looked up, so Ember need not link OpenMP itself) */
    *(void **)&g_omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    atexit(cache_free);
}

typedef struct conv_mds {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dil, pad_l, pad_r;
} conv_mds;

/* descriptors of the convolution in dtype dt in plain layouts, or "any" ones; false when
 * oneDNN's shape rules cannot express it */
static bool describe(conv_mds *c, dnnl_data_type_t dt, const em_window2d *g, int64_t O, int64_t G, bool any) {
    dnnl_dims_t src = {g->n, g->c, g->h, g->w}, dst = {g->n, O, g->oh, g->ow};
    dnnl_dims_t wei = {G, O / G, g->c / G, g->kh, g->kw}, wei4 = {O, g->c / G, g->kh, g->kw}, b = {O};
    dnnl_format_tag_t act = any ? dnnl_format_tag_any : dnnl_nchw;
    if (dnnl_memory_desc_init_by_tag(&c->src, 4, src, dt, act) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c->dst, 4, dst, dt, act) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c->bias, 1, b, dt, dnnl_x) != dnnl_success)
        return false;
    dnnl_status_t s = G == 1 ? dnnl_memory_desc_init_by_tag(&c->wei, 4, wei4, dt, any ? dnnl_format_tag_any : dnnl_oihw)
                             : dnnl_memory_desc_init_by_tag(&c->wei, 5, wei, dt, any ? dnnl_format_tag_any : dnnl_goihw);
    if (s != dnnl_success) return false;
    c->strides[0] = g->sh, c->strides[1] = g->sw;
    c->dil[0] = g->dh - 1, c->dil[1] = g->dw - 1; /* oneDNN counts dilation from 0 */
    c->pad_l[0] = g->ph, c->pad_l[1] = g->pw;
    /* the right padding that makes oneDNN's output size equal floor division's */
    c->pad_r[0] = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1 - g->h - g->ph;
    c->pad_r[1] = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1 - g->w - g->pw;
    return c->pad_r[0] >= 0 && c->pad_r[1] >= 0;
}

static dnnl_primitive_desc_t forward_pd(const conv_mds *c, bool bias) {
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &c->src,
                                                   &c->wei, bias ? &c->bias : NULL, &c->dst, c->strides, c->dil,
                                                   c->pad_l, c->pad_r) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, NULL) != dnnl_success)
        return NULL;
    return pd;
}

/* the pass's primitive descriptor over descriptors c */
static dnnl_primitive_desc_t pass_pd(int pass, const conv_mds *c, bool bias) {
    dnnl_primitive_desc_t fwd = forward_pd(c, bias && pass != EM_CONV_BWD_DATA);
    if (pass == EM_CONV_FWD || !fwd) return fwd;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = pass == EM_CONV_BWD_DATA
                          ? dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &c->src,
                                                                             &c->wei, &c->dst, c->strides, c->dil,
                                                                             c->pad_l, c->pad_r)
                          : dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &c->src,
                                                                                &c->wei, bias ? &c->bias : NULL,
                                                                                &c->dst, c->strides,
                                                                                c->dil, c->pad_l, c->pad_r);
    if (s != dnnl_success || dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, fwd) != dnnl_success) pd = NULL;
    dnnl_primitive_desc_destroy(fwd);
    return pd;
}

static const char *impl_of(dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return "unknown";
    return impl;
}

static bool add_arg(conv_prim *p, dnnl_primitive_desc_t pd, int arg, bool output, const dnnl_memory_desc_t *plain,
                    dnnl_query_t q) {
    prim_arg *a = &p->a[p->nargs++];
    a->arg = arg;
    a->output = output;
    a->plain = *plain;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q, 0);
    if (!md) return false;
    a->chosen = *md;
    a->reorder = NULL;
    if (dnnl_memory_desc_equal(&a->plain, &a->chosen)) return true;
    dnnl_primitive_desc_t rpd;
    const dnnl_memory_desc_t *from = output ? &a->chosen : &a->plain, *to = output ? &a->plain : &a->chosen;
    if (dnnl_reorder_primitive_desc_create(&rpd, from, g_engine, to, g_engine, NULL) != dnnl_success) return false;
    bool ok = dnnl_primitive_create(&a->reorder, rpd) == dnnl_success;
    dnnl_primitive_desc_destroy(rpd);
    if (!ok) a->reorder = NULL;
    p->scratch += (dnnl_memory_desc_get_size(&a->chosen) + 63) / 64 * 64;
    return ok;
}

/* a new pass for this shape and dtype; NULL when oneDNN cannot run it, or for bf16 has no
 * kernel for it other than its reference one (slower than float32 copies through the
 * float32 kernels) */
static conv_prim *prim_new(int pass, dnnl_data_type_t dt, const em_window2d *g, int64_t O, int64_t G, bool bias) {
    conv_mds plain, any;
    if (!describe(&plain, dt, g, O, G, false) || !describe(&any, dt, g, O, G, true)) return NULL;
    /* oneDNN's f32 blocked kernels for the data gradient are slow with few input channels
     * (an order of magnitude under its gemm path for one channel): plain layouts below four */
    bool use_any = dt != dnnl_f32 || !(pass == EM_CONV_BWD_DATA && g->c / G < 4);
    dnnl_primitive_desc_t pd = pass_pd(pass, use_any ? &any : &plain, bias);
    if (!pd) return NULL;
    if (dt == dnnl_bf16) {
        const char *impl = impl_of(pd);
        snprintf(g_bf16_desc, sizeof g_bf16_desc, "oneDNN %s, float32 accumulation", impl);
        if (strncmp(impl, "ref", 3) == 0) {
            snprintf(g_bf16_desc, sizeof g_bf16_desc, "float32 copies (oneDNN has only its reference bf16 convolution here)");
            dnnl_primitive_desc_destroy(pd);
            return NULL;
        }
    }
    conv_prim *p = calloc(1, sizeof *p);
    bool ok = p != NULL;
    if (ok) {
        *p = (conv_prim){.pass = pass, .dt = dt, .g = *g, .O = O, .G = G, .bias = bias};
        if (pass == EM_CONV_FWD) {
            ok = add_arg(p, pd, DNNL_ARG_SRC, false, &plain.src, dnnl_query_src_md) &&
                 add_arg(p, pd, DNNL_ARG_WEIGHTS, false, &plain.wei, dnnl_query_weights_md) &&
                 add_arg(p, pd, DNNL_ARG_DST, true, &plain.dst, dnnl_query_dst_md);
            if (ok && bias) {
                prim_arg *a = &p->a[p->nargs++];
                *a = (prim_arg){.arg = DNNL_ARG_BIAS, .plain = plain.bias, .chosen = plain.bias};
            }
        } else if (pass == EM_CONV_BWD_DATA) {
            ok = add_arg(p, pd, DNNL_ARG_DIFF_DST, false, &plain.dst, dnnl_query_diff_dst_md) &&
                 add_arg(p, pd, DNNL_ARG_WEIGHTS, false, &plain.wei, dnnl_query_weights_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_SRC, true, &plain.src, dnnl_query_diff_src_md);
        } else {
            ok = add_arg(p, pd, DNNL_ARG_SRC, false, &plain.src, dnnl_query_src_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_DST, false, &plain.dst, dnnl_query_diff_dst_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_WEIGHTS, true, &plain.wei, dnnl_query_diff_weights_md);
            if (ok && bias) { /* the bias's gradient in the same pass over diff_dst; plain (x) in both */
                prim_arg *a = &p->a[p->nargs++];
                *a = (prim_arg){.arg = DNNL_ARG_DIFF_BIAS, .output = true, .plain = plain.bias, .chosen = plain.bias};
            }
        }
        ok = ok && dnnl_primitive_create(&p->conv, pd) == dnnl_success;
        if (ok && p->scratch) ok = (p->buf = aligned_alloc(64, p->scratch)) != NULL;
    }
    dnnl_primitive_desc_destroy(pd);
    if (!ok) prim_free(p), p = NULL;
    return p;
}

static bool same_window(const em_window2d *a, const em_window2d *b) { return !memcmp(a, b, sizeof *a); }

/* the cached pass (g_mu held) */
static conv_prim *prim_get(int pass, dnnl_data_type_t dt, const em_window2d *g, int64_t O, int64_t G, bool bias) {
    for (int i = 0; i < CACHE_SIZE; i++) {
        conv_prim *p = g_cache[i];
        if (p && p->pass == pass && p->dt == dt && p->O == O && p->G == G && p->bias == bias && same_window(&p->g, g))
            return p;
    }
    conv_prim *p = prim_new(pass, dt, g, O, G, bias);
    if (!p) return NULL;
    prim_free(g_cache[g_next]);
    g_cache[g_next] = p;
    g_next = (g_next + 1) % CACHE_SIZE;
    return p;
}

/* run pass p on Ember's buffers ptr[i] (in p->a's order): inputs reordered into scratch,
 * the convolution, outputs reordered back */
static em_status execute(const char *op, conv_prim *p, void *const *ptr) {
    dnnl_stream_t stream = NULL;
    dnnl_memory_t user[MAX_ARGS] = {NULL}, mine[MAX_ARGS] = {NULL};
    dnnl_exec_arg_t args[MAX_ARGS];
    char *scratch = p->buf;
    bool ok = dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags) == dnnl_success;
    size_t off = 0;
    for (int i = 0; ok && i < p->nargs; i++) {
        prim_arg *a = &p->a[i];
        ok = dnnl_memory_create(&user[i], &a->plain, g_engine, ptr[i]) == dnnl_success;
        if (ok && a->reorder) {
            ok = dnnl_memory_create(&mine[i], &a->chosen, g_engine, scratch + off) == dnnl_success;
            off += (dnnl_memory_desc_get_size(&a->chosen) + 63) / 64 * 64;
        }
        args[i].arg = a->arg;
        args[i].memory = mine[i] ? mine[i] : user[i];
    }
    dnnl_status_t s = ok ? dnnl_success : dnnl_out_of_memory;
    for (int i = 0; s == dnnl_success && i < p->nargs; i++) {
        if (!p->a[i].reorder || p->a[i].output) continue;
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, user[i]}, {DNNL_ARG_TO, mine[i]}};
        s = dnnl_primitive_execute(p->a[i].reorder, stream, 2, r);
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(p->conv, stream, p->nargs, args);
    for (int i = 0; s == dnnl_success && i < p->nargs; i++) {
        if (!p->a[i].reorder || !p->a[i].output) continue;
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, mine[i]}, {DNNL_ARG_TO, user[i]}};
        s = dnnl_primitive_execute(p->a[i].reorder, stream, 2, r);
    }
    if (s == dnnl_success) s = dnnl_stream_wait(stream);
    for (int i = 0; i < p->nargs; i++) {
        if (user[i]) dnnl_memory_destroy(user[i]);
        if (mine[i]) dnnl_memory_destroy(mine[i]);
    }
    if (stream) dnnl_stream_destroy(stream);
    if (s == dnnl_out_of_memory) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: oneDNN ran out of memory", op);
    if (s != dnnl_success) return em_error(EM_ERR_INTERNAL, "%s: oneDNN failed (status %d)", op, (int)s);
    return EM_OK;
}

em_status em__cpu_conv_dnnl_run(const char *op, em_conv_pass pass, em_dtype dtype, const em_window2d *g, int64_t O,
                                int64_t G, bool bias, void *const *ptr) {
    if (dtype != EM_F32 && dtype != EM_BF16) return EM_ERR_NOT_SUPPORTED;
    dnnl_data_type_t dt = dtype == EM_F32 ? dnnl_f32 : dnnl_bf16;
    pthread_once(&g_once, engine_init);
    if (!g_engine) return EM_ERR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    /* before oneDNN builds anything: its JIT and reorders run OpenMP regions too, and a team
     * larger than em_set_num_threads asked for would spin on cores others need */
    /* the weights' gradient runs on one thread: oneDNN's parallel version reduces over the
     * batch with barriers, measured at 0.5 ms on one thread and 7 ms on two for the CNN's
     * convolutions on a 2-vCPU machine (forward and data gradient scale fine) */
    if (g_omp_set_threads) g_omp_set_threads(pass == EM_CONV_BWD_WEIGHTS ? 1 : em__cpu_num_threads());
    conv_prim *p = prim_get(pass, dt, g, O, G, bias);
    em_status st = p ? execute(op, p, ptr) : EM_ERR_NOT_SUPPORTED;
    pthread_mutex_unlock(&g_mu);
    return st;
}

void em__cpu_conv_dnnl_bf16_kernel(char *out, size_t n) {
    pthread_mutex_lock(&g_mu);
    snprintf(out, n, "%s", g_bf16_desc);
    pthread_mutex_unlock(&g_mu);
}

em_status em__cpu_conv2d_dnnl(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                              const em_window2d *g, int64_t groups) {
    if (in->dtype != EM_F32) return EM_ERR_NOT_SUPPORTED;
    void *ptr[4] = {em__host_ptr(in), em__host_ptr(w), em__host_ptr(out), bias ? em__host_ptr(bias) : NULL};
    return em__cpu_conv_dnnl_run("conv2d", EM_CONV_FWD, EM_F32, g, w->shape[0], groups, bias != NULL, ptr);
}

em_status em__cpu_conv2d_backward_input_dnnl(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                             const em_window2d *g, int64_t groups) {
    if (gin->dtype != EM_F32) return EM_ERR_NOT_SUPPORTED;
    void *ptr[3] = {em__host_ptr(gout), em__host_ptr(w), em__host_ptr(gin)};
    return em__cpu_conv_dnnl_run("conv2d backward (input)", EM_CONV_BWD_DATA, EM_F32, g, w->shape[0], groups, false, ptr);
}

em_status em__cpu_conv2d_backward_weight_dnnl(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                              const em_window2d *g, int64_t groups) {
    return em__cpu_conv2d_backward_weight_bias_dnnl(gw, NULL, gout, in, g, groups);
}

em_status em__cpu_conv2d_backward_weight_bias_dnnl(em_tensor *gw, em_tensor *gbias, const em_tensor *gout,
                                                   const em_tensor *in, const em_window2d *g, int64_t groups) {
    if (gw->dtype != EM_F32 || (gbias && gbias->dtype != EM_F32)) return EM_ERR_NOT_SUPPORTED;
    void *ptr[4] = {em__host_ptr(in), em__host_ptr(gout), em__host_ptr(gw), gbias ? em__host_ptr(gbias) : NULL};
    return em__cpu_conv_dnnl_run("conv2d backward (weight)", EM_CONV_BWD_WEIGHTS, EM_F32, g, gw->shape[0], groups, gbias != NULL, ptr);
}
#endif
