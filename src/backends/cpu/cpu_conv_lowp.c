/* Convolution and pooling in bfloat16 / float16 on the CPU, float32 accumulation throughout
 * (cpu_conv_lowp.h). The portable path's im2col moves 16-bit values as they are; col2im
 * sums each input position in float32 and rounds once. The pools run their float32 kernels
 * on float32 copies (max picks one of the inputs, so it is exact; avg rounds once).
 * The library path: bf16 through oneDNN's bf16 convolution (AVX512-BF16 / AMX kernels, float32
 * accumulation inside) where cpu_dnnl.c's probe found a fast bf16 kernel; f16 (oneDNN 2.6
 * has no f16 convolution on the CPU) and bf16 elsewhere through float32 copies and the
 * float32 oneDNN convolution, as the lowp matmul does. oneDNN's bf16 primitives are built
 * once per shape and kept (a small cache), like cpu_conv_dnnl.c's float32 ones. */
#include "cpu_conv_lowp.h"
#include <stdlib.h>
#include "cpu_dnnl.h"

static bool is_lowp(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16; }

/* ---- scratch tensors: contiguous, on the host, freed by tmp_free ---- */
typedef struct tmp_tensor { em_storage s; em_tensor t; } tmp_tensor;

static em_status tmp_make(tmp_tensor *x, em_dtype dt, int nd, const int64_t *shape) {
    memset(x, 0, sizeof *x);
    x->t.dtype = dt;
    x->t.ndim = nd;
    int64_t n = 1;
    for (int d = nd - 1; d >= 0; d--) {
        x->t.shape[d] = shape[d];
        x->t.strides[d] = n;
        n *= shape[d];
    }
    size_t bytes = (size_t)(n > 0 ? n : 1) * em_dtype_size(dt);
    x->s.block.handle = malloc(bytes);
    if (!x->s.block.handle)
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: conv2d: failed to allocate %zu bytes of scratch", bytes);
    x->s.device = EM_DEVICE_CPU;
    x->s.nbytes = bytes;
    x->t.storage = &x->s;
    return EM_OK;
}

static void tmp_free(tmp_tensor *x) {
    if (x) free(x->s.block.handle);
}

/* a float32 copy of t (any dtype) in x */
static em_status tmp_f32_of(tmp_tensor *x, const em_tensor *t) {
    em_status st = tmp_make(x, EM_F32, t->ndim, t->shape);
    if (st == EM_OK && (st = em__cpu_copy(&x->t, t)) != EM_OK) tmp_free(x);
    return st;
}

/* ---- im2col / col2im in 16 bits ---- */
typedef struct lowp_job {
    const em_window2d *g;
    em_dtype dt;
    char *out;
    const char *in;
    atomic_bool oom; /* a worker found no memory for its float32 plane */
} lowp_job;

static int64_t grain_for(int64_t per_item) {
    int64_t g = EM_CPU_MIN_GRAIN / (per_item > 0 ? per_item : 1);
    return g < 1 ? 1 : g;
}

/* one row (n, c, ki, kj) of cols per item; a 16-bit zero is 0.0 in both dtypes */
static void im2col_u16(void *ctx, int64_t begin, int64_t end) {
    const lowp_job *j = ctx;
    const em_window2d *g = j->g;
    int64_t L = g->oh * g->ow, kk = g->kh * g->kw;
    for (int64_t r = begin; r < end; r++) {
        int64_t plane = r / kk, ki = (r % kk) / g->kw, kj = r % g->kw;
        const uint16_t *x = (const uint16_t *)j->in + plane * g->h * g->w;
        uint16_t *c = (uint16_t *)j->out + r * L;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
            uint16_t *crow = c + oy * g->ow;
            if (iy < 0 || iy >= g->h) {
                memset(crow, 0, (size_t)g->ow * sizeof *crow);
                continue;
            }
            const uint16_t *xrow = x + iy * g->w;
            int64_t ix0 = kj * g->dw - g->pw;
            if (g->sw == 1 && ix0 >= 0 && ix0 + g->ow <= g->w) {
                memcpy(crow, xrow + ix0, (size_t)g->ow * sizeof *crow);
                continue;
            }
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t ix = ox * g->sw + ix0;
                crow[ox] = ix >= 0 && ix < g->w ? xrow[ix] : 0;
            }
        }
    }
}

/* one (n, c) plane per item: summed in float32 (a plane and a row of scratch), rounded once */
static void col2im_u16(void *ctx, int64_t begin, int64_t end) {
    const lowp_job *j = ctx;
    const em_window2d *g = j->g;
    int64_t L = g->oh * g->ow, kk = g->kh * g->kw, hw = g->h * g->w;
    float *acc = malloc((size_t)(hw + L) * sizeof(float));
    if (!acc) {
        atomic_store(&((lowp_job *)ctx)->oom, true);
        return;
    }
    float *row = acc + hw;
    for (int64_t p = begin; p < end; p++) {
        for (int64_t i = 0; i < hw; i++) acc[i] = 0;
        for (int64_t k = 0; k < kk; k++) {
            int64_t ki = k / g->kw, kj = k % g->kw;
            em__cpu_load_block(row, j->in + (p * kk + k) * L * 2, 2, L, j->dt);
            for (int64_t oy = 0; oy < g->oh; oy++) {
                int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                if (iy < 0 || iy >= g->h) continue;
                float *xrow = acc + iy * g->w;
                const float *crow = row + oy * g->ow;
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t ix = ox * g->sw - g->pw + kj * g->dw;
                    if (ix >= 0 && ix < g->w) xrow[ix] += crow[ox];
                }
            }
        }
        em__cpu_store_block(j->out + p * hw * 2, 2, hw, j->dt, acc);
    }
    free(acc);
}

em_status em__cpu_im2col_any(em_tensor *cols, const em_tensor *in, const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_im2col(cols, in, g);
    lowp_job j = {.g = g, .dt = in->dtype, .out = em__host_ptr(cols), .in = em__host_ptr(in)};
    int64_t rows = g->n * g->c * g->kh * g->kw;
    em__cpu_parallel_for(rows, grain_for(g->oh * g->ow), im2col_u16, &j);
    return EM_OK;
}

em_status em__cpu_col2im_any(em_tensor *in, const em_tensor *cols, const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_col2im(in, cols, g);
    lowp_job j = {.g = g, .dt = in->dtype, .out = em__host_ptr(in), .in = em__host_ptr(cols)};
    em__cpu_parallel_for(g->n * g->c, grain_for(g->h * g->w * g->kh * g->kw), col2im_u16, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: conv2d backward: no memory for a float32 plane of %lld elements",
                        (long long)(g->h * g->w + g->oh * g->ow));
    return EM_OK;
}

/* ---- pools: the float32 kernels on float32 copies ---- */
em_status em__cpu_pool2d_any(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                             const em_window2d *g) {
    if (!is_lowp(in->dtype)) return em__cpu_pool2d(kind, out, indices, in, g);
    tmp_tensor x, y;
    em_status st = tmp_f32_of(&x, in);
    if (st) return st;
    if ((st = tmp_make(&y, EM_F32, out->ndim, out->shape))) {
        tmp_free(&x);
        return st;
    }
    st = em__cpu_pool2d(kind, &y.t, indices, &x.t, g);
    if (st == EM_OK) st = em__cpu_copy(out, &y.t);
    tmp_free(&x);
    tmp_free(&y);
    return st;
}

em_status em__cpu_pool2d_backward_any(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                      const em_tensor *indices, const em_window2d *g) {
    if (!is_lowp(gin->dtype)) return em__cpu_pool2d_backward(kind, gin, gout, indices, g);
    tmp_tensor gy, gx;
    em_status st = tmp_f32_of(&gy, gout);
    if (st) return st;
    if ((st = tmp_make(&gx, EM_F32, gin->ndim, gin->shape))) {
        tmp_free(&gy);
        return st;
    }
    st = em__cpu_pool2d_backward(kind, &gx.t, &gy.t, indices, g);
    if (st == EM_OK) st = em__cpu_copy(gin, &gx.t);
    tmp_free(&gy);
    tmp_free(&gx);
    return st;
}

#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <dnnl.h>

/* ---- oneDNN's bf16 convolution ---- */
enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_WEIGHTS };
enum { MAX_ARGS = 4, CACHE_SIZE = 16 };

typedef struct prim_arg {
    int arg;
    bool output;
    dnnl_memory_desc_t plain, chosen;
    dnnl_primitive_t reorder; /* plain -> chosen (inputs) or chosen -> plain (outputs); NULL: same */
} prim_arg;

typedef struct conv_prim {
    int pass;
    em_window2d g;
    int64_t O, G;
    bool bias;
    dnnl_primitive_t conv;
    int nargs;
    prim_arg a[MAX_ARGS];
    size_t scratch;
    char *buf;
} conv_prim;

static dnnl_engine_t g_engine;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void (*g_omp_set_threads)(int);
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static conv_prim *g_cache[CACHE_SIZE];
static int g_next;
static char g_desc[160] = "not probed yet";

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
    *(void **)&g_omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    atexit(cache_free);
}

typedef struct conv_mds {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dil, pad_l, pad_r;
} conv_mds;

/* bf16 descriptors in plain layouts, or "any" ones; false when oneDNN cannot express it */
static bool describe(conv_mds *c, const em_window2d *g, int64_t O, int64_t G, bool any) {
    dnnl_dims_t src = {g->n, g->c, g->h, g->w}, dst = {g->n, O, g->oh, g->ow};
    dnnl_dims_t wei = {G, O / G, g->c / G, g->kh, g->kw}, wei4 = {O, g->c / G, g->kh, g->kw}, b = {O};
    dnnl_format_tag_t act = any ? dnnl_format_tag_any : dnnl_nchw;
    if (dnnl_memory_desc_init_by_tag(&c->src, 4, src, dnnl_bf16, act) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c->dst, 4, dst, dnnl_bf16, act) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c->bias, 1, b, dnnl_bf16, dnnl_x) != dnnl_success)
        return false;
    dnnl_status_t s = G == 1 ? dnnl_memory_desc_init_by_tag(&c->wei, 4, wei4, dnnl_bf16, any ? dnnl_format_tag_any : dnnl_oihw)
                             : dnnl_memory_desc_init_by_tag(&c->wei, 5, wei, dnnl_bf16, any ? dnnl_format_tag_any : dnnl_goihw);
    if (s != dnnl_success) return false;
    c->strides[0] = g->sh, c->strides[1] = g->sw;
    c->dil[0] = g->dh - 1, c->dil[1] = g->dw - 1; /* oneDNN counts dilation from 0 */
    c->pad_l[0] = g->ph, c->pad_l[1] = g->pw;
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

static dnnl_primitive_desc_t pass_pd(int pass, const conv_mds *c, bool bias) {
    dnnl_primitive_desc_t fwd = forward_pd(c, bias && pass == PASS_FWD);
    if (pass == PASS_FWD || !fwd) return fwd;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = pass == PASS_BWD_DATA
                          ? dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &c->src,
                                                                             &c->wei, &c->dst, c->strides, c->dil,
                                                                             c->pad_l, c->pad_r)
                          : dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &c->src,
                                                                                &c->wei, NULL, &c->dst, c->strides,
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

/* a new bf16 pass; NULL when oneDNN has no kernel for it other than its reference one
 * (slower than float32 copies through the float32 kernels) */
static conv_prim *prim_new(int pass, const em_window2d *g, int64_t O, int64_t G, bool bias) {
    conv_mds plain, any;
    if (!describe(&plain, g, O, G, false) || !describe(&any, g, O, G, true)) return NULL;
    dnnl_primitive_desc_t pd = pass_pd(pass, &any, bias);
    if (!pd) return NULL;
    const char *impl = impl_of(pd);
    snprintf(g_desc, sizeof g_desc, "oneDNN %s, float32 accumulation", impl);
    if (strncmp(impl, "ref", 3) == 0) {
        snprintf(g_desc, sizeof g_desc, "float32 copies (oneDNN has only its reference bf16 convolution here)");
        dnnl_primitive_desc_destroy(pd);
        return NULL;
    }
    conv_prim *p = calloc(1, sizeof *p);
    bool ok = p != NULL;
    if (ok) {
        *p = (conv_prim){.pass = pass, .g = *g, .O = O, .G = G, .bias = bias};
        if (pass == PASS_FWD) {
            ok = add_arg(p, pd, DNNL_ARG_SRC, false, &plain.src, dnnl_query_src_md) &&
                 add_arg(p, pd, DNNL_ARG_WEIGHTS, false, &plain.wei, dnnl_query_weights_md) &&
                 add_arg(p, pd, DNNL_ARG_DST, true, &plain.dst, dnnl_query_dst_md);
            if (ok && bias) /* given as plain bf16 "x": no reorder */
                p->a[p->nargs++] = (prim_arg){.arg = DNNL_ARG_BIAS, .plain = plain.bias, .chosen = plain.bias};
        } else if (pass == PASS_BWD_DATA) {
            ok = add_arg(p, pd, DNNL_ARG_DIFF_DST, false, &plain.dst, dnnl_query_diff_dst_md) &&
                 add_arg(p, pd, DNNL_ARG_WEIGHTS, false, &plain.wei, dnnl_query_weights_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_SRC, true, &plain.src, dnnl_query_diff_src_md);
        } else {
            ok = add_arg(p, pd, DNNL_ARG_SRC, false, &plain.src, dnnl_query_src_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_DST, false, &plain.dst, dnnl_query_diff_dst_md) &&
                 add_arg(p, pd, DNNL_ARG_DIFF_WEIGHTS, true, &plain.wei, dnnl_query_diff_weights_md);
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
static conv_prim *prim_get(int pass, const em_window2d *g, int64_t O, int64_t G, bool bias) {
    for (int i = 0; i < CACHE_SIZE; i++) {
        conv_prim *p = g_cache[i];
        if (p && p->pass == pass && p->O == O && p->G == G && p->bias == bias && same_window(&p->g, g)) return p;
    }
    conv_prim *p = prim_new(pass, g, O, G, bias);
    if (!p) return NULL;
    prim_free(g_cache[g_next]);
    g_cache[g_next] = p;
    g_next = (g_next + 1) % CACHE_SIZE;
    return p;
}

/* run p on Ember's buffers ptr[i] (in p->a's order): inputs reordered into scratch, the
 * convolution, outputs reordered back */
static em_status execute(const char *op, conv_prim *p, void *const *ptr) {
    dnnl_stream_t stream = NULL;
    dnnl_memory_t user[MAX_ARGS] = {NULL}, mine[MAX_ARGS] = {NULL};
    dnnl_exec_arg_t args[MAX_ARGS];
    bool ok = dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags) == dnnl_success;
    size_t off = 0;
    for (int i = 0; ok && i < p->nargs; i++) {
        prim_arg *a = &p->a[i];
        ok = dnnl_memory_create(&user[i], &a->plain, g_engine, ptr[i]) == dnnl_success;
        if (ok && a->reorder) {
            ok = dnnl_memory_create(&mine[i], &a->chosen, g_engine, p->buf + off) == dnnl_success;
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

/* EM_ERR_NOT_SUPPORTED (nothing recorded) when oneDNN has no fast bf16 kernel for the pass */
static em_status run_bf16(const char *op, int pass, const em_window2d *g, int64_t O, int64_t G, bool bias,
                          void *const *ptr) {
    if (!em__cpu_dnnl_runs(EM_BF16)) return EM_ERR_NOT_SUPPORTED; /* no AVX512-BF16/AMX, or switched off */
    pthread_once(&g_once, engine_init);
    if (!g_engine) return EM_ERR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    /* as cpu_conv_dnnl.c: Ember's thread count, the weights' gradient on one thread */
    if (g_omp_set_threads) g_omp_set_threads(pass == PASS_BWD_WEIGHTS ? 1 : em__cpu_num_threads());
    conv_prim *p = prim_get(pass, g, O, G, bias);
    em_status st = p ? execute(op, p, ptr) : EM_ERR_NOT_SUPPORTED;
    pthread_mutex_unlock(&g_mu);
    return st;
}

const char *em__cpu_conv_lowp_describe(void) {
    if (!em__cpu_dnnl_runs(EM_BF16)) return "float32 copies (no fast oneDNN bf16 kernel here, or EMBER_CPU_LOWP_GEMM=portable)";
    pthread_mutex_lock(&g_mu);
    static char copy[sizeof g_desc];
    memcpy(copy, g_desc, sizeof copy);
    pthread_mutex_unlock(&g_mu);
    return copy;
}

/* ---- the entries: f32 on to cpu_conv_dnnl.c, bf16 to oneDNN's bf16 kernels, else float32
 * copies through the float32 ones ---- */
typedef struct f32_args { tmp_tensor t[4]; int n; } f32_args;

static em_status f32_add(f32_args *a, const em_tensor *t, bool copy) {
    tmp_tensor *x = &a->t[a->n];
    em_status st = copy ? tmp_f32_of(x, t) : tmp_make(x, EM_F32, t->ndim, t->shape);
    if (st == EM_OK) a->n++;
    return st;
}

static void f32_free(f32_args *a) {
    for (int i = 0; i < a->n; i++) tmp_free(&a->t[i]);
}

em_status em__cpu_conv2d_any(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                             const em_window2d *g, int64_t groups) {
    if (!is_lowp(in->dtype)) return em__cpu_conv2d_dnnl(out, in, w, bias, g, groups);
    if (in->dtype == EM_BF16) {
        void *ptr[4] = {em__host_ptr(in), em__host_ptr(w), em__host_ptr(out), bias ? em__host_ptr(bias) : NULL};
        em_status st = run_bf16("conv2d", PASS_FWD, g, w->shape[0], groups, bias != NULL, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, in, true);
    if (st == EM_OK) st = f32_add(&a, w, true);
    if (st == EM_OK) st = f32_add(&a, out, false);
    if (st == EM_OK && bias) st = f32_add(&a, bias, true);
    if (st == EM_OK) st = em__cpu_conv2d_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, bias ? &a.t[3].t : NULL, g, groups);
    if (st == EM_OK) st = em__cpu_copy(out, &a.t[2].t);
    f32_free(&a);
    return st;
}

em_status em__cpu_conv2d_backward_input_any(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                            const em_window2d *g, int64_t groups) {
    if (!is_lowp(gin->dtype)) return em__cpu_conv2d_backward_input_dnnl(gin, gout, w, g, groups);
    if (gin->dtype == EM_BF16) {
        void *ptr[3] = {em__host_ptr(gout), em__host_ptr(w), em__host_ptr(gin)};
        em_status st = run_bf16("conv2d backward (input)", PASS_BWD_DATA, g, w->shape[0], groups, false, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, gout, true);
    if (st == EM_OK) st = f32_add(&a, w, true);
    if (st == EM_OK) st = f32_add(&a, gin, false);
    if (st == EM_OK) st = em__cpu_conv2d_backward_input_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, g, groups);
    if (st == EM_OK) st = em__cpu_copy(gin, &a.t[2].t);
    f32_free(&a);
    return st;
}

em_status em__cpu_conv2d_backward_weight_any(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                             const em_window2d *g, int64_t groups) {
    if (!is_lowp(gw->dtype)) return em__cpu_conv2d_backward_weight_dnnl(gw, gout, in, g, groups);
    if (gw->dtype == EM_BF16) {
        void *ptr[3] = {em__host_ptr(in), em__host_ptr(gout), em__host_ptr(gw)};
        em_status st = run_bf16("conv2d backward (weight)", PASS_BWD_WEIGHTS, g, gw->shape[0], groups, false, ptr);
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    f32_args a = {.n = 0};
    em_status st = f32_add(&a, gout, true);
    if (st == EM_OK) st = f32_add(&a, in, true);
    if (st == EM_OK) st = f32_add(&a, gw, false);
    if (st == EM_OK) st = em__cpu_conv2d_backward_weight_dnnl(&a.t[2].t, &a.t[0].t, &a.t[1].t, g, groups);
    if (st == EM_OK) st = em__cpu_copy(gw, &a.t[2].t);
    f32_free(&a);
    return st;
}
#endif
