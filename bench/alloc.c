/* Allocator benchmark.
 * 1. Latency: a cached alloc+free through em__mem_alloc on the CPU backend against malloc/free,
 *    posix_memalign/free (what the CPU backend's raw_alloc does) and, where OpenCL is built,
 *    clCreateBuffer/clReleaseMemObject on the first OpenCL device (PoCL here).
 * 2. Fragmentation: a training-like allocation pattern (a transformer with a different
 *    sequence length every step) replayed through Ember's allocator, through the plain
 *    allocator under EMBER_MEMORY_POLICY=pytorch, through the plain reimplementation of
 *    PyTorch's policy in tests/test_memory_policy.h, and through a naive power-of-two caching
 *    policy; peak reserved / peak allocated for each.
 * Usage: bench_alloc [--quick] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>
#include "backends/backend.h"
#include "memory/allocator.h"
#include "../tests/test_memory_policy.h"
#ifdef EMBER_HAVE_OPENCL
#include <CL/cl.h>
#endif

/* Thread CPU time: on a shared machine, time spent descheduled is not the allocator's. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile uintptr_t sink;

/* ---------------------------------------------------------------- latency */

static double ns_cached(size_t bytes, int n) {
    const em_backend *be = &em__cpu_backend;
    em_block b;
    em__mem_alloc(be, EM_DEVICE_CPU, bytes, &b);   /* warm: the segment exists */
    em__mem_free(be, EM_DEVICE_CPU, &b);
    double t = now();
    for (int i = 0; i < n; i++) {
        em__mem_alloc(be, EM_DEVICE_CPU, bytes, &b);
        sink += (uintptr_t)b.handle + b.offset;
        em__mem_free(be, EM_DEVICE_CPU, &b);
    }
    return (now() - t) / n * 1e9;
}

/* 64 live blocks of mixed sizes; each step frees one and allocates another. */
static double ns_cached_mixed(int n) {
    const em_backend *be = &em__cpu_backend;
    em_block live[64];
    uint64_t rng = 1;
    size_t sizes[64];
    for (int i = 0; i < 64; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        sizes[i] = (size_t)(rng >> 40) % (256 * 1024) + 1;
        em__mem_alloc(be, EM_DEVICE_CPU, sizes[i], &live[i]);
    }
    double t = now();
    for (int i = 0; i < n; i++) {
        int k = i & 63;
        em__mem_free(be, EM_DEVICE_CPU, &live[k]);
        em__mem_alloc(be, EM_DEVICE_CPU, sizes[(k * 7 + i) & 63], &live[k]);
    }
    double ns = (now() - t) / n * 1e9;
    for (int i = 0; i < 64; i++) em__mem_free(be, EM_DEVICE_CPU, &live[i]);
    return ns;
}

static double ns_malloc(size_t bytes, int n) {
    double t = now();
    for (int i = 0; i < n; i++) {
        void *p = malloc(bytes);
        sink += (uintptr_t)p;
        free(p);
    }
    return (now() - t) / n * 1e9;
}

static double ns_memalign(size_t bytes, int n) {
    double t = now();
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) == 0) sink += (uintptr_t)p;
        free(p);
    }
    return (now() - t) / n * 1e9;
}

#ifdef EMBER_HAVE_OPENCL
static double ns_cl_buffer(size_t bytes, int n) {
    cl_platform_id plat;
    cl_device_id dev;
    cl_uint np = 0, nd = 0;
    if (clGetPlatformIDs(1, &plat, &np) != CL_SUCCESS || !np) return -1;
    if (clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, &nd) != CL_SUCCESS || !nd) return -1;
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (err != CL_SUCCESS) return -1;
    double t = now();
    for (int i = 0; i < n; i++) {
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        sink += (uintptr_t)m;
        if (m) clReleaseMemObject(m);
    }
    double ns = (now() - t) / n * 1e9;
    clReleaseContext(ctx);
    return ns;
}
#endif

/* ---------------------------------------------------------------- training-like pattern */

/* A backend that hands out address-free tokens: the pattern can reserve gigabytes. */
static em_status token_alloc(int index, size_t bytes, void **handle) {
    (void)index;
    (void)bytes;
    *handle = malloc(1);
    return *handle ? EM_OK : EM_ERR_OUT_OF_MEMORY;
}
static void token_free(int index, void *handle) {
    (void)index;
    free(handle);
}
static const em_backend token_be = {.name = "token", .type = EM_OPENCL, .raw_alloc = token_alloc,
                                    .raw_free = token_free};
static const em_device token_dev = {EM_OPENCL, 63};      /* Ember's policy */
static const em_device token_dev_pt = {EM_OPENCL, 62};   /* EMBER_MEMORY_POLICY=pytorch */

/* The three policies side by side; an allocation is an index into a handle table. */
enum { MAX_LIVE = 1 << 16 };
typedef struct replay {
    em_block ember[MAX_LIVE], ember_pt[MAX_LIVE];
    int ref_seg[MAX_LIVE];
    size_t ref_off[MAX_LIVE], bytes[MAX_LIVE];
    int free_ids[MAX_LIVE], nfree;
    ptp ref;
    int64_t naive_cached[64], naive_reserved, naive_allocated, naive_peak_reserved, naive_peak_allocated;
    int64_t requested, peak_requested;
} replay;

static int bin_of(size_t n) {
    int k = 9;
    while (((size_t)1 << k) < n) k++;
    return k;
}

static int r_alloc(replay *r, size_t bytes) {
    int id = r->free_ids[--r->nfree];
    r->bytes[id] = bytes;
    if (em__mem_alloc(&token_be, token_dev, bytes, &r->ember[id]) != EM_OK ||
        em__mem_alloc(&token_be, token_dev_pt, bytes, &r->ember_pt[id]) != EM_OK) {
        fprintf(stderr, "bench_alloc: %s\n", em_last_error());
        exit(1);
    }
    ptp_alloc(&r->ref, bytes, &r->ref_seg[id], &r->ref_off[id]);
    int k = bin_of(bytes);
    if (r->naive_cached[k]) r->naive_cached[k]--;
    else r->naive_reserved += (int64_t)1 << k;
    r->naive_allocated += (int64_t)1 << k;
    if (r->naive_reserved > r->naive_peak_reserved) r->naive_peak_reserved = r->naive_reserved;
    if (r->naive_allocated > r->naive_peak_allocated) r->naive_peak_allocated = r->naive_allocated;
    r->requested += (int64_t)bytes;
    if (r->requested > r->peak_requested) r->peak_requested = r->requested;
    return id;
}

static void r_free(replay *r, int id) {
    em__mem_free(&token_be, token_dev, &r->ember[id]);
    em__mem_free(&token_be, token_dev_pt, &r->ember_pt[id]);
    ptp_free(&r->ref, r->ref_seg[id], r->ref_off[id]);
    int k = bin_of(r->bytes[id]);
    r->naive_cached[k]++;
    r->naive_allocated -= (int64_t)1 << k;
    r->requested -= (int64_t)r->bytes[id];
    r->free_ids[r->nfree++] = id;
}

/* GPT-2-small-like training in float32: 12 layers, hidden 768, 12 heads, vocabulary 50257,
 * batch 8, a random sequence length in [64, 512] each step (dynamic padding), Adam. */
static void training_pattern(replay *r, int steps) {
    const size_t L = 12, h = 768, heads = 12, vocab = 50257, batch = 8, f = 4;
    int params[64], grads[64], m[64], v[64], np = 0;
    size_t psize[64];
    psize[np++] = vocab * h * f;                       /* embedding */
    for (size_t l = 0; l < L; l++) {
        psize[np++] = 3 * h * h * f;                   /* qkv */
        psize[np++] = h * h * f;                       /* attention out */
        psize[np++] = 4 * h * h * f;                   /* mlp in */
        psize[np++] = 4 * h * h * f;                   /* mlp out */
    }
    for (int i = 0; i < np; i++) params[i] = r_alloc(r, psize[i]);
    bool have_state = false;
    uint64_t rng = 12345;
    for (int step = 0; step < steps; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t s = 64 + (size_t)((rng >> 33) % 449);
        size_t tok = batch * s, act = tok * h * f, scores = batch * heads * s * s * f;
        int saved[12][6];
        int x = r_alloc(r, act);                       /* embeddings */
        for (size_t l = 0; l < L; l++) {
            int ln = r_alloc(r, act);
            int qkv = r_alloc(r, 3 * act);
            int sc = r_alloc(r, scores);
            int probs = r_alloc(r, scores);
            r_free(r, sc);
            int att = r_alloc(r, act);
            int proj = r_alloc(r, act);
            int res = r_alloc(r, act);
            r_free(r, proj);
            int hid = r_alloc(r, 4 * act);
            int gelu = r_alloc(r, 4 * act);
            int out = r_alloc(r, act);
            r_free(r, out);
            saved[l][0] = ln, saved[l][1] = qkv, saved[l][2] = probs, saved[l][3] = att;
            saved[l][4] = hid, saved[l][5] = gelu;
            r_free(r, x);
            x = res;
        }
        int logits = r_alloc(r, tok * vocab * f);
        int loss_tmp = r_alloc(r, tok * vocab * f);    /* log-softmax */
        r_free(r, x);
        int g = r_alloc(r, tok * vocab * f);           /* d logits */
        r_free(r, loss_tmp);
        r_free(r, logits);
        int gx = r_alloc(r, act);
        r_free(r, g);
        if (!have_state)
            for (int i = 0; i < np; i++) grads[i] = r_alloc(r, psize[i]);
        for (size_t l = L; l-- > 0;) {
            int g_hid = r_alloc(r, 4 * act);
            int g_pre = r_alloc(r, 4 * act);
            r_free(r, g_hid);
            int g_ln = r_alloc(r, act);
            r_free(r, g_pre);
            int g_sc = r_alloc(r, scores);
            int g_qkv = r_alloc(r, 3 * act);
            r_free(r, g_sc);
            int g_in = r_alloc(r, act);
            r_free(r, g_qkv);
            r_free(r, g_ln);
            for (int k = 0; k < 6; k++) r_free(r, saved[l][k]);
            r_free(r, gx);
            gx = g_in;
        }
        r_free(r, gx);
        for (int i = 0; i < np; i++) {                 /* Adam: states, then per-parameter temporaries */
            if (!have_state) {
                m[i] = r_alloc(r, psize[i]);
                v[i] = r_alloc(r, psize[i]);
            }
            int t1 = r_alloc(r, psize[i]);
            int t2 = r_alloc(r, psize[i]);
            r_free(r, t1);
            r_free(r, t2);
        }
        have_state = true;
    }
    for (int i = 0; i < np; i++) {
        r_free(r, params[i]);
        if (have_state) {
            r_free(r, grads[i]);
            r_free(r, m[i]);
            r_free(r, v[i]);
        }
    }
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    int n = quick ? 200000 : 2000000;
    printf("## alloc + free latency (ns per pair, best of 10 runs of %d pairs, one thread, thread CPU time)\n", n / 10);
    printf("%-10s %12s %12s %16s %14s\n", "size", "ember cached", "malloc", "posix_memalign", "clCreateBuffer");
    size_t sizes[] = {512, 4096, 256 * 1024, 8 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int k = sizes[i] >= (1 << 20) ? n / 20 : n;
        double cl = -1;
#ifdef EMBER_HAVE_OPENCL
        cl = ns_cl_buffer(sizes[i], k / 10);
#endif
        char clbuf[32];
        if (cl < 0) snprintf(clbuf, sizeof clbuf, "n/a");
        else snprintf(clbuf, sizeof clbuf, "%.0f", cl);
        double c = 1e30, m = 1e30, a = 1e30;   /* best of 10: the machine is shared */
        for (int rep = 0; rep < 10; rep++) {
            c = fmin(c, ns_cached(sizes[i], k / 10));
            m = fmin(m, ns_malloc(sizes[i], k / 10));
            a = fmin(a, ns_memalign(sizes[i], k / 10));
        }
        printf("%-10zu %12.1f %12.1f %16.1f %14s\n", sizes[i], c, m, a, clbuf);
    }
    double mixed = 1e30;
    for (int rep = 0; rep < 10; rep++) mixed = fmin(mixed, ns_cached_mixed(n / 10));
    printf("mixed sizes, 64 live blocks: ember cached %.1f ns per free+alloc\n", mixed);
    em_memory_empty_cache(EM_DEVICE_CPU);

    int steps = quick ? 10 : 50;
    replay *r = calloc(1, sizeof *r);
    if (!r) return 1;
    for (int i = 0; i < MAX_LIVE; i++) r->free_ids[r->nfree++] = MAX_LIVE - 1 - i;
    setenv("EMBER_MEMORY_POLICY", "pytorch", 1);
    em_memory_stats s, spt;
    em_memory_get_stats(token_dev_pt, &spt);   /* creates the state: reads the policy */
    unsetenv("EMBER_MEMORY_POLICY");
    double t = now();
    training_pattern(r, steps);
    double secs = now() - t;
    em_memory_get_stats(token_dev, &s);
    em_memory_get_stats(token_dev_pt, &spt);
    double peak_req = (double)r->peak_requested;
    printf("\n## training-like pattern: GPT-2 small, f32, batch 8, seq 64..512 random, Adam, %d steps\n", steps);
    printf("(%lld allocations, replayed in %.2f s through all four)\n", (long long)s.allocation[0].allocated, secs);
    printf("%-34s %13s %13s %19s %17s %10s\n", "policy", "peak alloc MB", "peak resv MB", "resv/alloc (peak)",
           "resv/requested", "raw allocs");
    const em_memory_stats *E[2] = {&s, &spt};
    const char *names[2] = {"ember (the default policy)", "ember, EMBER_MEMORY_POLICY=pytorch"};
    for (int i = 0; i < 2; i++)
        printf("%-34s %13.1f %13.1f %19.3f %17.3f %10lld\n", names[i], E[i]->allocated_bytes[0].peak / 1e6,
               E[i]->reserved_bytes[0].peak / 1e6,
               (double)E[i]->reserved_bytes[0].peak / (double)E[i]->allocated_bytes[0].peak,
               (double)E[i]->reserved_bytes[0].peak / peak_req, (long long)E[i]->num_raw_allocs);
    printf("%-34s %13.1f %13.1f %19.3f %17.3f %10lld\n", "pytorch policy (reference model)",
           r->ref.peak_allocated / 1e6, r->ref.peak_reserved / 1e6,
           (double)r->ref.peak_reserved / (double)r->ref.peak_allocated, (double)r->ref.peak_reserved / peak_req,
           (long long)r->ref.raw_allocs);
    printf("%-34s %13.1f %13.1f %19.3f %17.3f %10s\n", "naive power-of-two cache", r->naive_peak_allocated / 1e6,
           r->naive_peak_reserved / 1e6, (double)r->naive_peak_reserved / (double)r->naive_peak_allocated,
           (double)r->naive_peak_reserved / peak_req, "-");
    printf("peak requested (live tensors, unrounded): %.1f MB\n", peak_req / 1e6);
    em_memory_empty_cache(token_dev);
    em_memory_empty_cache(token_dev_pt);
    ptp_destroy(&r->ref);
    free(r);
    return 0;
}
