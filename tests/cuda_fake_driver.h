/* A fake CUDA driver for tests that run without a GPU: "device memory" is host memory,
 * so copies can be checked byte for byte; launches are recorded, not run; modules keep
 * their image so that parameter sizes come from the real compiled PTX. Included by
 * tests/test_cuda_*.c (each gets its own copy: every function is static).
 * As the real driver, it keeps the current context per thread, and calls that need one
 * fail with CUDA_ERROR_INVALID_CONTEXT without it (or, for a stream, with another
 * device's): a thread Ember forgets to switch fails a test. Events are real objects that
 * complete when F.events_complete says so. */
#ifndef EMBER_TESTS_CUDA_FAKE_DRIVER_H
#define EMBER_TESTS_CUDA_FAKE_DRIVER_H

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include "backends/cuda/cuda_internal.h"

/* ---- the fake driver ---- */
#define NDEV 2
static struct {
    CUresult init_result, sync_result, alloc_result;
    int retains[NDEV], releases[NDEV];
    int wrong_ctx;                   /* calls refused: no or another context current */
    int live_allocs;
    int launches;
    CUfunction last_func;
    unsigned last_grid[3], last_block[3];
    CUstream last_stream;
    void **last_params;
    int modules_loaded;
    char last_image[128];
    int peer_copies, waits, records;
    int d2d_copies;                  /* cuMemcpyDtoDAsync calls */
    size_t free_mem;
    int cc_major, cc_minor;          /* 8.6 unless a test says otherwise */
    int driver_version;              /* cuDriverGetVersion: 12040 unless a test says otherwise */
    int stream_syncs, event_syncs, event_queries, live_events;
    bool events_incomplete;          /* cuEventQuery answers NOT_READY */
    int host_allocs, live_host_allocs;
    int h2d_async;                   /* cuMemcpyHtoDAsync calls */
    const void *last_h2d_src;
    CUdeviceptr last_h2d_dst;
    int ctx_restores_seen;           /* cuCtxSetCurrent(NULL) calls: a thread given back "none" */
    /* launch arguments copied at launch (the caller's arrays are gone afterwards): the
     * 8-byte values of the parameters whose bit is set in capture_u64 */
    unsigned capture_u64;
    uint64_t last_u64[32];
    /* graphs: captures begun and ended, graphs instantiated and launched, what was recorded,
     * and the calls refused because they cannot be captured (each invalidates the capture) */
    int capture_begins, capture_ends, instantiates, graph_launches, live_graphs, live_execs;
    int captured_nodes;              /* nodes recorded by all captures */
    const char *captured_kernels[1024]; /* the kernels recorded, in order (the first 1024) */
    int ncaptured_kernels;
    int illegal_in_capture;
    int allocs_in_capture;           /* cuMemAlloc calls made (in relaxed mode) during a capture */
    int frees;                       /* cuMemFree calls */
    /* virtual memory: address ranges reserved and freed, chunks mapped and unmapped (each
     * mapping's offset from its range's start, in order), and the bytes mapped now */
    bool no_vmm;                     /* the device says it has no virtual memory management */
    int va_reserves, va_frees, maps, unmaps, live_phys;
    size_t mapped_bytes;
    CUdeviceptr last_va;
    size_t map_offsets[64];
    int creates;                     /* cuMemCreate calls */
    int map_fail_at;                 /* > 0: cuMemCreate number N (counting from 1) and later fail */
} F;
static char ctx_tag[NDEV], stream_tag[NDEV];
/* the context current on this thread: the device whose primary context it is, -1 none */
static _Thread_local int t_ctx = -1;
static pthread_mutex_t f_lock = PTHREAD_MUTEX_INITIALIZER; /* counters touched by threads */

/* ---- stream capture: a capture records copies, memsets and launches as nodes instead of
 * running them; cuGraphLaunch runs the copies and memsets again and counts the launches ---- */
typedef struct fake_node { int kind; CUdeviceptr dst; const void *src; size_t n; unsigned char v; } fake_node;
enum { NODE_KERNEL, NODE_COPY, NODE_MEMSET };
typedef struct fake_graph { int n, cap; fake_node *nodes; } fake_graph;
static struct { bool active, invalidated; fake_graph *g; } capture[NDEV];
/* the capturing thread's interaction mode (cuThreadExchangeStreamCaptureMode) */
static _Thread_local int t_capturing = -1; /* the device this thread captures on, -1 none */
static _Thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* An unsafe call (one that waits, allocates or frees) on a capturing thread outside relaxed
 * mode: refused, and the capture is invalidated, as the driver does. */
static bool unsafe_in_capture(void) {
    if (t_capturing < 0 || t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
    pthread_mutex_lock(&f_lock);
    F.illegal_in_capture++;
    capture[t_capturing].invalidated = true;
    pthread_mutex_unlock(&f_lock);
    return true;
}
static int capturing_dev(CUstream s);
/* Record a node when s is capturing; true if recorded (then the call does not run). */
static bool record_node(CUstream s, fake_node node) {
    int d = capturing_dev(s);
    if (d < 0) return false;
    fake_graph *g = capture[d].g;
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 16;
        g->nodes = realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    g->nodes[g->n++] = node;
    F.captured_nodes++;
    return true;
}

static int dev_of_ctx(CUcontext c) { return (int)((char *)c - ctx_tag); }
static int dev_of_stream(CUstream s) { return (int)((char *)s - stream_tag); }
static int capturing_dev(CUstream s) {
    if (!s) return -1;
    int d = dev_of_stream(s);
    return d >= 0 && d < NDEV && capture[d].active ? d : -1;
}
/* A call that needs a current context (and, given a stream, that stream's context). */
static bool ctx_ok(CUstream s) {
    bool ok = t_ctx >= 0 && (!s || dev_of_stream(s) == t_ctx);
    if (!ok) {
        pthread_mutex_lock(&f_lock);
        F.wrong_ctx++;
        pthread_mutex_unlock(&f_lock);
    }
    return ok;
}

static CUresult f_init(unsigned int flags) { (void)flags; return F.init_result; }
static CUresult f_version(int *v) { *v = F.driver_version ? F.driver_version : 12040; return CUDA_SUCCESS; }
static CUresult f_count(int *n) { *n = NDEV; return CUDA_SUCCESS; }
static CUresult f_get(CUdevice *d, int i) { *d = i; return CUDA_SUCCESS; }
static CUresult f_name(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? (F.cc_major ? F.cc_major : 8)
       : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ? (F.cc_major ? F.cc_minor : 6)
       : a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 84
       : a == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? !F.no_vmm : 0;
    return CUDA_SUCCESS;
}
static CUresult f_total(size_t *b, CUdevice d) { (void)d; *b = (size_t)16 << 30; return CUDA_SUCCESS; }
static CUresult f_bus(char *s, int len, CUdevice d) {
    snprintf(s, (size_t)len, "0000:0%d:00.0", d);
    return CUDA_SUCCESS;
}
static CUresult f_can_peer(int *can, CUdevice a, CUdevice b) { *can = a != b; return CUDA_SUCCESS; }
static CUresult f_retain(CUcontext *c, CUdevice d) {
    F.retains[d]++;
    *c = (CUcontext)&ctx_tag[d];
    return CUDA_SUCCESS;
}
static CUresult f_release(CUdevice d) { F.releases[d]++; return CUDA_SUCCESS; }
static CUresult f_set_current(CUcontext c) {
    t_ctx = c ? dev_of_ctx(c) : -1;
    if (!c) {
        pthread_mutex_lock(&f_lock);
        F.ctx_restores_seen++;
        pthread_mutex_unlock(&f_lock);
    }
    return CUDA_SUCCESS;
}
static CUresult f_get_current(CUcontext *c) {
    *c = t_ctx >= 0 ? (CUcontext)&ctx_tag[t_ctx] : NULL;
    return CUDA_SUCCESS;
}
static CUresult f_enable_peer(CUcontext c, unsigned int flags) { (void)c; (void)flags; return CUDA_SUCCESS; }
static CUresult f_mem_info(size_t *free_b, size_t *total) {
    *free_b = F.free_mem;
    *total = (size_t)16 << 30;
    return CUDA_SUCCESS;
}
static CUresult f_alloc(CUdeviceptr *p, size_t n) {
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (t_capturing >= 0) F.allocs_in_capture++;
    if (F.alloc_result != CUDA_SUCCESS) return F.alloc_result;
    void *m = malloc(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    F.live_allocs++;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}
static CUresult f_free(CUdeviceptr p) {
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    free((void *)(uintptr_t)p);
    F.live_allocs--;
    F.frees++;
    return CUDA_SUCCESS;
}
static CUresult f_host_alloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    *p = malloc(n);
    if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&f_lock);
    F.host_allocs++;
    F.live_host_allocs++;
    pthread_mutex_unlock(&f_lock);
    return CUDA_SUCCESS;
}
static CUresult f_host_free(void *p) {
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    free(p);
    pthread_mutex_lock(&f_lock);
    F.live_host_allocs--;
    pthread_mutex_unlock(&f_lock);
    return CUDA_SUCCESS;
}
static CUresult f_h2d(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    if (!ctx_ok(st)) return CUDA_ERROR_INVALID_CONTEXT;
    if (record_node(st, (fake_node){NODE_COPY, d, s, n, 0})) return CUDA_SUCCESS;
    memcpy((void *)(uintptr_t)d, s, n);
    pthread_mutex_lock(&f_lock);
    F.h2d_async++;
    F.last_h2d_src = s;
    F.last_h2d_dst = d;
    pthread_mutex_unlock(&f_lock);
    return CUDA_SUCCESS;
}
static CUresult f_d2h(void *d, CUdeviceptr s, size_t n, CUstream st) {
    if (!ctx_ok(st)) return CUDA_ERROR_INVALID_CONTEXT;
    memcpy(d, (void *)(uintptr_t)s, n);
    return CUDA_SUCCESS;
}
static CUresult f_d2d(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    if (!ctx_ok(st)) return CUDA_ERROR_INVALID_CONTEXT;
    if (record_node(st, (fake_node){NODE_COPY, d, (const void *)(uintptr_t)s, n, 0})) return CUDA_SUCCESS;
    F.d2d_copies++;
    memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return CUDA_SUCCESS;
}
static CUresult f_peer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    (void)dc; (void)sc; (void)st;
    F.peer_copies++;
    memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return CUDA_SUCCESS;
}
static CUresult f_memset(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    if (record_node(st, (fake_node){NODE_MEMSET, d, NULL, n, v})) return CUDA_SUCCESS;
    memset((void *)(uintptr_t)d, v, n);
    return CUDA_SUCCESS;
}
static CUresult f_stream_create(CUstream *s, unsigned int flags) {
    (void)flags;
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    *s = (CUstream)&stream_tag[t_ctx];
    return CUDA_SUCCESS;
}
static CUresult f_stream_destroy(CUstream s) { (void)s; return CUDA_SUCCESS; }
static CUresult f_stream_sync(CUstream s) {
    int cap = capturing_dev(s);
    if (cap >= 0) {   /* waiting for a capturing stream: nothing runs, so nothing to wait for */
        pthread_mutex_lock(&f_lock);
        F.illegal_in_capture++;
        capture[cap].invalidated = true;
        pthread_mutex_unlock(&f_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&f_lock);
    F.stream_syncs++;
    pthread_mutex_unlock(&f_lock);
    return F.sync_result;
}
static CUresult f_wait(CUstream s, CUevent e, unsigned int f) { (void)s; (void)e; (void)f; F.waits++; return CUDA_SUCCESS; }
typedef struct fake_event { int device; unsigned flags; } fake_event;
static CUresult f_event_create(CUevent *e, unsigned int flags) {
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    fake_event *fe = malloc(sizeof *fe);
    if (!fe) return CUDA_ERROR_OUT_OF_MEMORY;
    fe->device = t_ctx;
    fe->flags = flags;
    pthread_mutex_lock(&f_lock);
    F.live_events++;
    pthread_mutex_unlock(&f_lock);
    *e = (CUevent)fe;
    return CUDA_SUCCESS;
}
static CUresult f_record(CUevent e, CUstream s) {
    if (((fake_event *)e)->device != dev_of_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&f_lock);
    F.records++;
    pthread_mutex_unlock(&f_lock);
    return CUDA_SUCCESS;
}
static CUresult f_event_query(CUevent e) {
    (void)e;
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&f_lock);
    F.event_queries++;
    pthread_mutex_unlock(&f_lock);
    return F.events_incomplete ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult f_event_sync(CUevent e) {
    (void)e;
    if (unsafe_in_capture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&f_lock);
    F.event_syncs++;
    pthread_mutex_unlock(&f_lock);
    return F.sync_result;
}
static CUresult f_event_destroy(CUevent e) {
    free(e);
    pthread_mutex_lock(&f_lock);
    F.live_events--;
    pthread_mutex_unlock(&f_lock);
    return CUDA_SUCCESS;
}
/* Modules keep their image (PTX when the target is PTX), so that cuFuncGetParamInfo can
 * answer from the real compiled signature. */
#define MAX_FAKE_MODULES 16
static char *module_images[MAX_FAKE_MODULES];
static int nmodules;
typedef struct fake_func { int module; char name[48]; } fake_func;
static fake_func funcs[512];
static int nfuncs;

static CUresult f_load(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v;
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    /* a CUBIN (ELF) is kept as its magic: only PTX text is read back */
    if (!memcmp(image, "\177ELF", 4)) image = "\177ELF cubin";
    snprintf(F.last_image, sizeof F.last_image, "%s", (const char *)image);
    int slot = 0; /* the first free one: unloaded modules give theirs back */
    while (slot < nmodules && module_images[slot]) slot++;
    if (slot == MAX_FAKE_MODULES) return CUDA_ERROR_OUT_OF_MEMORY;
    module_images[slot] = strdup((const char *)image);
    F.modules_loaded++;
    if (slot == nmodules) nmodules++;
    *m = (CUmodule)(uintptr_t)(slot + 1);
    return CUDA_SUCCESS;
}
static CUresult f_unload(CUmodule m) {
    int i = (int)(uintptr_t)m - 1;
    free(module_images[i]);
    module_images[i] = NULL;
    F.modules_loaded--;
    return CUDA_SUCCESS;
}
static CUresult f_get_function(CUfunction *f, CUmodule m, const char *name) {
    if (nfuncs == 512) return CUDA_ERROR_NOT_FOUND;
    const char *image = module_images[(int)(uintptr_t)m - 1];
    char pat[80];
    snprintf(pat, sizeof pat, ".entry %s(", name);
    if (!strncmp(image, "//", 2) && !strstr(image, pat)) return CUDA_ERROR_NOT_FOUND; /* PTX */
    funcs[nfuncs].module = (int)(uintptr_t)m - 1;
    snprintf(funcs[nfuncs].name, sizeof funcs[0].name, "%s", name);
    *f = (CUfunction)&funcs[nfuncs++];
    return CUDA_SUCCESS;
}
static const char *fake_func_name(CUfunction f) { return ((fake_func *)f)->name; }

/* Parameter i of the kernel, read from the .entry of its PTX: ".param .u64 x_param_0",
 * ".param .align 8 .b8 x_param_2[80]". */
static CUresult f_param_info(CUfunction f, size_t index, size_t *offset, size_t *size) {
    fake_func *ff = (fake_func *)f;
    const char *ptx = module_images[ff->module];
    char pat[80];
    snprintf(pat, sizeof pat, ".entry %s(", ff->name);
    const char *p = ptx ? strstr(ptx, pat) : NULL;
    if (!p || strncmp(ptx, "//", 2) != 0) return CUDA_ERROR_NOT_SUPPORTED; /* not PTX */
    const char *end = strchr(p, ')');
    size_t off = 0;
    p = strchr(p, '(') + 1;
    for (size_t i = 0; (p = strstr(p, ".param")) && p < end; i++, p += 6) {
        /* ".param [.ptr .global] [.align N] .TYPE name[[N]]": the type token is the last
         * one before the name, its digits the size in bits; an array gives bytes */
        const char *line_end = strchr(p, '\n');
        size_t sz = 0, align = 0;
        const char *q = p + 6, *type = NULL;
        while (q < line_end) {
            while (*q == ' ' || *q == '\t') q++;
            if (*q != '.') break;
            if (!strncmp(q, ".align ", 7)) {
                align = (size_t)atoi(q + 7);
                q += 7;
                while (*q >= '0' && *q <= '9') q++;
                continue;
            }
            type = q;
            while (*q && *q != ' ' && *q != '\t') q++;
        }
        if (!type) return CUDA_ERROR_INVALID_IMAGE;
        const char *br = memchr(q, '[', (size_t)(line_end - q));
        size_t bits = (size_t)atoi(type + 2); /* ".u64" -> 64 */
        sz = br ? (size_t)atoi(br + 1) * (bits / 8) : bits / 8;
        if (!align) align = bits / 8;
        off = (off + align - 1) / align * align;
        if (i == index) { *offset = off; *size = sz; return CUDA_SUCCESS; }
        off += sz;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    (void)shmem; (void)extra;
    if (!ctx_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (record_node(s, (fake_node){NODE_KERNEL, 0, NULL, 0, 0})) {
        if (F.ncaptured_kernels < 1024) F.captured_kernels[F.ncaptured_kernels++] = fake_func_name(f);
        return CUDA_SUCCESS;
    }
    F.launches++;
    F.last_func = f;
    F.last_grid[0] = gx; F.last_grid[1] = gy; F.last_grid[2] = gz;
    F.last_block[0] = bx; F.last_block[1] = by; F.last_block[2] = bz;
    F.last_stream = s;
    F.last_params = params;
    for (int i = 0; i < 32; i++)
        if (F.capture_u64 & (1u << i)) memcpy(&F.last_u64[i], params[i], 8);
    return CUDA_SUCCESS;
}

static CUresult f_begin_capture(CUstream s, CUstreamCaptureMode mode) {
    if (!ctx_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    int d = dev_of_stream(s);
    if (capture[d].active) return CUDA_ERROR_ILLEGAL_STATE;
    capture[d].active = true;
    capture[d].invalidated = false;
    capture[d].g = calloc(1, sizeof(fake_graph));
    t_capturing = d;
    t_mode = mode;
    F.capture_begins++;
    F.live_graphs++;
    return CUDA_SUCCESS;
}
static CUresult f_end_capture(CUstream s, CUgraph *graph) {
    int d = dev_of_stream(s);
    *graph = NULL;
    if (!capture[d].active || t_capturing != d) return CUDA_ERROR_ILLEGAL_STATE;
    capture[d].active = false;
    t_capturing = -1;
    t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    F.capture_ends++;
    fake_graph *g = capture[d].g;
    capture[d].g = NULL;
    if (capture[d].invalidated) {
        free(g->nodes);
        free(g);
        F.live_graphs--;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = (CUgraph)g;
    return CUDA_SUCCESS;
}
static CUresult f_exchange_mode(CUstreamCaptureMode *mode) {
    CUstreamCaptureMode old = t_mode;
    t_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
static CUresult f_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    (void)flags;
    const fake_graph *g = (const fake_graph *)graph;
    fake_graph *e = calloc(1, sizeof *e);
    e->n = e->cap = g->n;
    e->nodes = malloc((size_t)(g->n ? g->n : 1) * sizeof *e->nodes);
    if (g->n) memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
    F.instantiates++;
    F.live_execs++;
    *exec = (CUgraphExec)e;
    return CUDA_SUCCESS;
}
static CUresult f_graph_launch(CUgraphExec exec, CUstream s) {
    if (!ctx_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (capturing_dev(s) >= 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const fake_graph *e = (const fake_graph *)exec;
    for (int i = 0; i < e->n; i++) {
        const fake_node *nd = &e->nodes[i];
        if (nd->kind == NODE_KERNEL) F.launches++;
        else if (nd->kind == NODE_COPY) memcpy((void *)(uintptr_t)nd->dst, nd->src, nd->n);
        else memset((void *)(uintptr_t)nd->dst, nd->v, nd->n);
    }
    F.graph_launches++;
    return CUDA_SUCCESS;
}
static CUresult f_exec_destroy(CUgraphExec exec) {
    fake_graph *e = (fake_graph *)exec;
    free(e->nodes);
    free(e);
    F.live_execs--;
    return CUDA_SUCCESS;
}
static CUresult f_graph_destroy(CUgraph graph) {
    fake_graph *g = (fake_graph *)graph;
    free(g->nodes);
    free(g);
    F.live_graphs--;
    return CUDA_SUCCESS;
}
/* ---- virtual memory: a reserved range is an inaccessible mapping of host address space,
 * and mapping a chunk makes that part readable and writable, so copies into it work and a
 * stray access to an unmapped chunk faults ---- */
#define FAKE_GRANULARITY ((size_t)2 << 20)
typedef struct fake_phys { size_t size; } fake_phys;
static CUresult f_granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o) {
    (void)o;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    *g = FAKE_GRANULARITY;
    return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long fl) {
    (void)align; (void)addr; (void)fl;
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    if (size % FAKE_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    F.va_reserves++;
    *p = F.last_va = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}
static CUresult f_address_free(CUdeviceptr p, size_t size) {
    munmap((void *)(uintptr_t)p, size);
    F.va_frees++;
    return CUDA_SUCCESS;
}
static CUresult f_mem_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long fl) {
    (void)prop; (void)fl;
    if (!ctx_ok(NULL)) return CUDA_ERROR_INVALID_CONTEXT;
    if (F.map_fail_at > 0 && ++F.creates >= F.map_fail_at) return CUDA_ERROR_OUT_OF_MEMORY;
    if (F.map_fail_at <= 0) F.creates++;
    if (size % FAKE_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    fake_phys *ph = malloc(sizeof *ph);
    ph->size = size;
    F.live_phys++;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
    free((void *)(uintptr_t)h);
    F.live_phys--;
    return CUDA_SUCCESS;
}
static CUresult f_mem_map(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                          unsigned long long fl) {
    (void)off; (void)fl;
    if (((fake_phys *)(uintptr_t)h)->size != size) return CUDA_ERROR_INVALID_VALUE;
    if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE)) return CUDA_ERROR_INVALID_VALUE;
    if (F.maps < 64) F.map_offsets[F.maps] = (size_t)(p - F.last_va);
    F.maps++;
    F.mapped_bytes += size;
    return CUDA_SUCCESS;
}
static CUresult f_mem_unmap(CUdeviceptr p, size_t size) {
    madvise((void *)(uintptr_t)p, size, MADV_DONTNEED);
    mprotect((void *)(uintptr_t)p, size, PROT_NONE);
    F.unmaps++;
    F.mapped_bytes -= size;
    return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t count) {
    (void)p; (void)size;
    return count == 1 && d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Forget captures a test left open (a fresh driver). */
static void fake_capture_reset(void) {
    for (int d = 0; d < NDEV; d++) {
        if (capture[d].g) {
            free(capture[d].g->nodes);
            free(capture[d].g);
        }
        capture[d].g = NULL;
        capture[d].active = capture[d].invalidated = false;
    }
    t_capturing = -1;
    t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
}

static em_cu_api fake_cu(void) {
    em_cu_api a;
    memset(&a, 0, sizeof a); /* cuGetErrorName/String stay NULL: Ember's own names are used */
    a.cuInit = f_init; a.cuDriverGetVersion = f_version; a.cuDeviceGetCount = f_count;
    a.cuDeviceGet = f_get; a.cuDeviceGetName = f_name; a.cuDeviceGetAttribute = f_attr;
    a.cuDeviceTotalMem = f_total; a.cuDeviceGetPCIBusId = f_bus; a.cuDeviceCanAccessPeer = f_can_peer;
    a.cuDevicePrimaryCtxRetain = f_retain; a.cuDevicePrimaryCtxRelease = f_release;
    a.cuCtxSetCurrent = f_set_current; a.cuCtxGetCurrent = f_get_current;
    a.cuCtxEnablePeerAccess = f_enable_peer; a.cuEventQuery = f_event_query;
    a.cuMemGetInfo = f_mem_info; a.cuMemAlloc = f_alloc; a.cuMemFree = f_free;
    a.cuMemHostAlloc = f_host_alloc; a.cuMemFreeHost = f_host_free;
    a.cuMemcpyHtoDAsync = f_h2d; a.cuMemcpyDtoHAsync = f_d2h; a.cuMemcpyDtoDAsync = f_d2d;
    a.cuMemcpyPeerAsync = f_peer; a.cuMemsetD8Async = f_memset;
    a.cuStreamCreate = f_stream_create; a.cuStreamDestroy = f_stream_destroy;
    a.cuStreamSynchronize = f_stream_sync; a.cuStreamWaitEvent = f_wait;
    a.cuEventCreate = f_event_create; a.cuEventRecord = f_record; a.cuEventSynchronize = f_event_sync;
    a.cuEventDestroy = f_event_destroy; a.cuModuleLoadDataEx = f_load; a.cuModuleUnload = f_unload;
    a.cuModuleGetFunction = f_get_function; a.cuLaunchKernel = f_launch;
    a.cuFuncGetParamInfo = f_param_info;
    a.cuStreamBeginCapture = f_begin_capture; a.cuStreamEndCapture = f_end_capture;
    a.cuGraphInstantiateWithFlags = f_instantiate; a.cuGraphLaunch = f_graph_launch;
    a.cuGraphExecDestroy = f_exec_destroy; a.cuGraphDestroy = f_graph_destroy;
    a.cuThreadExchangeStreamCaptureMode = f_exchange_mode;
    a.cuMemGetAllocationGranularity = f_granularity; a.cuMemAddressReserve = f_reserve;
    a.cuMemAddressFree = f_address_free; a.cuMemCreate = f_mem_create; a.cuMemRelease = f_mem_release;
    a.cuMemMap = f_mem_map; a.cuMemUnmap = f_mem_unmap; a.cuMemSetAccess = f_set_access;
    return a;
}

#endif
