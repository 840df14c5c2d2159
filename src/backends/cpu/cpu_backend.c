/* The CPU backend's table: device properties, host memory, copies, and the one switch that
 * runs every op call on the kernel families. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "cpu_gemm.h"
#include "cpu_internal.h"
#include "cpu_conv_lowp.h"

static em_status cpu_init(void) {
    em__cpu_blas_init();
    return EM_OK;
}
static const char *cpu_unavailable_reason(void) { return NULL; }
static int cpu_device_count(void) { return 1; }

/* The value of the first "key<spaces>: value" line of a /proc file, trimmed; false if absent. */
static bool proc_field(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    size_t klen = strlen(key);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        const char *p = line + klen;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != ':') continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "\n");
        if (n >= cap) n = cap - 1;
        memcpy(out, p, n);
        out[n] = '\0';
        found = true;
    }
    fclose(f);
    return found;
}

static int64_t meminfo_bytes(const char *key) {
    char v[64];
    if (!proc_field("/proc/meminfo", key, v, sizeof v)) return -1;
    return strtoll(v, NULL, 10) * 1024; /* the file counts kB */
}

static em_status cpu_device_props(int index, em_device_props *out) {
    if (index != 0) return em_error(EM_ERR_DEVICE, "cpu: device index %d does not exist (only cpu:0)", index);
    memset(out, 0, sizeof *out);
    if (!proc_field("/proc/cpuinfo", "model name", out->name, sizeof out->name))
        snprintf(out->name, sizeof out->name, "CPU");
    char vendor[64];
    if (proc_field("/proc/cpuinfo", "vendor_id", vendor, sizeof vendor)) {
        const char *v = strcmp(vendor, "GenuineIntel") == 0 ? "Intel"
                        : strcmp(vendor, "AuthenticAMD") == 0 ? "AMD" : vendor;
        snprintf(out->vendor, sizeof out->vendor, "%s", v);
    }
    snprintf(out->driver, sizeof out->driver, "%s", em__cpu_gemm_name()); /* what runs matmul */
    out->total_memory = meminfo_bytes("MemTotal");
    out->free_memory = meminfo_bytes("MemAvailable");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->compute_units = n > 0 ? (int)n : 1;
    out->compute_capability = 0;
    out->is_gpu = false;
    return EM_OK;
}

/* ---- memory ---- */
#define CPU_ALIGN 64

/* Blocks from BIG_MIN up (the caching allocator's large segments, 2 MiB multiples):
 * - aligned to 2 MiB and advised as transparent huge pages, unless EMBER_CPU_HUGE_PAGES=0.
 *   With 4 KiB pages a training step's streams over weights, gradients and Adam's moments
 *   (hundreds of MB) miss the TLB at every page and the prefetchers restart at every page
 *   (the 4096-wide MLP's steps, docs/benchmarks-history.md). Smaller blocks keep 4 KiB pages: a huge page would
 *   commit 2 MiB for a few touched bytes. PyTorch has this behind THP_MEM_ALLOC_ENABLE.
 * - started 256 B x (1..16) into their first page, in turn (jemalloc's cache-oblivious
 *   offset). Page-aligned buffers put Adam's p, g, m and v at the same address modulo 4 KiB,
 *   so a load from one looks like it may depend on an earlier store to another ("4K
 *   aliasing") and waits: a loop with Adam's streams ran slower aligned than staggered
 *   (bench_optim big).
 * Blocks from MAP_MIN up are mappings of their own, unmapped when freed: what the caching
 * allocator gives back (before it grows, under EMBER_MEMORY_POLICY=peak to stay within its
 * tensors' peak; src/memory/caching.c) should leave the process, and malloc would keep a
 * freed block of these sizes in its heap (glibc raises its mmap threshold to the largest
 * mapped block freed, up to 32 MiB), so the process's resident memory would not fall. A
 * mapping ends at the block's last page, not at a 2 MiB boundary: a huge page there would
 * commit 2 MiB for the block's last bytes.
 * Under AddressSanitizer every block comes from malloc, whose redzones catch overruns.
 * Every block has a header in the 64 bytes before it holding what free() takes: the malloc'd
 * base, or the mapping's start with its low bit set and its length. */
#define CPU_HEADER 64
#if defined(__SANITIZE_ADDRESS__)
#define MAP_MIN SIZE_MAX
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MAP_MIN SIZE_MAX
#endif
#endif
#ifndef MAP_MIN
#define MAP_MIN ((size_t)1 << 20)
#endif
#define BIG_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)
#define STAGGER_STEP 256
#define STAGGER_SLOTS 16

bool em__cpu_huge_pages(void) {
    const char *e = getenv("EMBER_CPU_HUGE_PAGES");
    return !e || strcmp(e, "0") != 0;
}

/* A mapping of `size` bytes after `lead` (the header's room and the stagger); from 2 MiB up
 * (the allocator's small-pool segments and every large one: a huge page then commits nothing
 * the block does not use) 2 MiB-aligned and advised as huge pages; NULL if the system
 * refuses. */
static char *map_block(size_t size, size_t lead) {
    bool big = size >= HUGE_PAGE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), slack = big ? HUGE_PAGE : 0;
    if (size > SIZE_MAX - lead - page - slack) return NULL;
    size_t len = (size + lead + page - 1) / page * page;
    char *m = mmap(NULL, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *a = big ? (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1)) : m;
    if (a > m) munmap(m, (size_t)(a - m));
    if (m + len + slack > a + len) munmap(a + len, (size_t)(m + len + slack - (a + len)));
    if (big && em__cpu_huge_pages()) (void)madvise(a, len, MADV_HUGEPAGE);
    char *p = a + lead;
    uintptr_t header[2] = {(uintptr_t)a | 1u, (uintptr_t)len};
    memcpy(p - CPU_HEADER, header, sizeof header);
    return p;
}

static em_status cpu_raw_alloc(int index, size_t bytes, void **handle) {
    static atomic_uint turn;
    size_t size = bytes ? (bytes + CPU_ALIGN - 1) & ~(size_t)(CPU_ALIGN - 1) : CPU_ALIGN;
    bool big = size >= BIG_MIN;
    size_t lead = big ? STAGGER_STEP * (1 + atomic_fetch_add(&turn, 1) % STAGGER_SLOTS) : CPU_HEADER;
    void *base = NULL;
    if (size >= MAP_MIN && size >= bytes) {
        char *p = map_block(size, lead);
        *handle = p;
        return p ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "cpu: failed to map %zu bytes of host memory", bytes);
    }
    if (size < bytes || size + lead < size || posix_memalign(&base, big ? HUGE_PAGE : CPU_ALIGN, size + lead) != 0) {
        *handle = NULL;
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: failed to allocate %zu bytes of host memory", bytes);
    }
    /* advice only: a kernel without transparent huge pages says EINVAL and 4 KiB pages serve */
    if (big && em__cpu_huge_pages()) (void)madvise(base, size + lead, MADV_HUGEPAGE);
    char *p = (char *)base + lead;
    memcpy(p - CPU_HEADER, &base, sizeof base);
    *handle = p;
    return EM_OK;
}

static void cpu_raw_free(int index, void *handle) {
    if (!handle) return;
    uintptr_t header[2];
    memcpy(header, (char *)handle - CPU_HEADER, sizeof header);
    if (header[0] & 1u) munmap((void *)(header[0] & ~(uintptr_t)1), (size_t)header[1]);
    else free((void *)header[0]);
}

/* A new block whose huge pages are taken from the freed blocks' (mremap moves them, page
 * table entries and all): the caching allocator's peak policy gives segments back and maps
 * others of another size as a training step goes from its forward to its backward, and
 * fresh pages would each fault and be cleared, gigabytes a step. Only 2 MiB-aligned runs of
 * mapped blocks move; the rest of the new block is fresh, the rest of the old ones freed. */
static em_status cpu_raw_recycle(int index, size_t bytes, void *const *old, int n, void **handle) {
    em_status s = cpu_raw_alloc(index, bytes, handle);
    uintptr_t header[2] = {0, 0};
    if (s == EM_OK) memcpy(header, (char *)*handle - CPU_HEADER, sizeof header);
    char *a = (char *)(header[0] & ~(uintptr_t)1);
    size_t room = (header[0] & 1u) && ((uintptr_t)a & (HUGE_PAGE - 1)) == 0 ? (size_t)header[1] / HUGE_PAGE * HUGE_PAGE : 0;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        uintptr_t h[2];
        memcpy(h, (char *)old[i] - CPU_HEADER, sizeof h);
        char *b = (char *)(h[0] & ~(uintptr_t)1);
        bool mapped = (h[0] & 1u) != 0;   /* else h[1] is the block's own bytes */
        size_t len = mapped ? (size_t)h[1] : 0, take = len / HUGE_PAGE * HUGE_PAGE;
        if (take > room - at) take = room - at;
        if (!mapped || ((uintptr_t)b & (HUGE_PAGE - 1)) != 0 || take == 0 ||
            mremap(b, take, take, MREMAP_MAYMOVE | MREMAP_FIXED, a + at) == MAP_FAILED) {
            cpu_raw_free(index, old[i]);
            continue;
        }
        at += take;
        if (len > take) munmap(b + take, len - take);
    }
    if (at) memcpy((char *)*handle - CPU_HEADER, header, sizeof header);   /* its first page was replaced */
    return s;
}

/* Pinned blocks own whole pages (so munlock cannot unlock a neighbour); the size is kept
 * in a header just before the pointer handed out. */
#define PIN_HEADER CPU_ALIGN

static em_status cpu_host_alloc_pinned(size_t bytes, void **ptr) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t total = (bytes + PIN_HEADER + page - 1) / page * page;
    void *base = NULL;
    if (total < bytes || posix_memalign(&base, page, total) != 0) {
        *ptr = NULL;
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: failed to allocate %zu bytes of pinned host memory", bytes);
    }
    memcpy(base, &total, sizeof total);
    (void)mlock(base, total); /* best effort: without the privilege the memory is still usable */
    *ptr = (char *)base + PIN_HEADER;
    return EM_OK;
}

static void cpu_host_free_pinned(void *ptr) {
    if (!ptr) return;
    char *base = (char *)ptr - PIN_HEADER;
    size_t total;
    memcpy(&total, base, sizeof total);
    munlock(base, total);
    free(base);
}

static em_status cpu_copy_h2d(int index, void *dst_handle, size_t dst_offset, const void *src,
                              size_t bytes, bool non_blocking) {
    if (bytes) memmove((char *)dst_handle + dst_offset, src, bytes);
    return EM_OK;
}

static em_status cpu_copy_d2h(int index, void *dst, const void *src_handle, size_t src_offset, size_t bytes) {
    if (bytes) memmove(dst, (const char *)src_handle + src_offset, bytes);
    return EM_OK;
}

static em_status cpu_copy_d2d(int dst_index, void *dst_handle, size_t dst_offset, int src_index,
                              const void *src_handle, size_t src_offset, size_t bytes) {
    if (bytes) memmove((char *)dst_handle + dst_offset, (const char *)src_handle + src_offset, bytes);
    return EM_OK;
}

static em_status cpu_synchronize(int index) {
    (void)index;
    em__count_host_wait();
    return EM_OK;
}

/* What the CPU runs: every op of the list in the dtypes its DTYPES column gives, except the
 * convolution library's passes where Ember is built without oneDNN, the fused attention's
 * float64 (forward: f32, f16, bf16; backward: f32) and the rotary embedding's f16/bf16. */
static bool cpu_supports(const em_op_call *c) {
    if (!em__op_dtype_ok(c->op, c->dtype)) return false;
    switch (c->op) {
    case EM_OP_SDPA: return c->dtype != EM_F64;
    case EM_OP_ROPE: return c->dtype == EM_F32 || c->dtype == EM_F64; /* 16-bit: composed (cpu_lm.c) */
    case EM_OP_SDPA_BACKWARD: return c->dtype != EM_F64;
    case EM_OP_ADAM_STEP_MULTI: return false; /* a loop over the parameters gains nothing here */
    case EM_OP_CE_ROWS: return false; /* the composition runs on the CPU's vector kernels */
    case EM_OP_CONV2D:
    case EM_OP_CONV2D_BACKWARD_INPUT:
    case EM_OP_CONV2D_BACKWARD_WEIGHT:
    case EM_OP_CONV2D_BACKWARD_WEIGHT_BIAS:
#ifdef EMBER_HAVE_DNNL
        return true;
#else
        return false;
#endif
    default: return true;
    }
}

#define CPU_CASE_(NAME, name, dtypes, gpu) case EM_OP_##NAME:
#define CPU_FUSED_CASE_(NAME, name, dtypes, gpu) case EM_OP_##NAME: return em__cpu_##name(c);

/* The one switch: each op's call unpacked into its kernel family's entry. The _any entries
 * of convolution and pooling (cpu_conv_lowp.c) run f16/bf16 and pass f32/f64 on to
 * cpu_conv.c and cpu_conv_dnnl.c. */
static em_status cpu_run(const em_op_call *c) {
    em_tensor *const *d = c->dst;
    const em_tensor *const *s = c->src;
    const em_window2d *win = c->arg;
    switch (c->op) {
    EMK_OPS_UNARY(CPU_CASE_) return em__cpu_unary(c->op, d[0], s[0], c->f);
    EMK_OPS_BINARY(CPU_CASE_) EMK_OPS_COMPARE(CPU_CASE_) return em__cpu_binary(c->op, d[0], s[0], s[1]);
    EMK_OPS_REDUCE(CPU_CASE_) {
        bool reduce[EM_MAX_DIMS];
        for (int k = 0; k < EM_MAX_DIMS; k++) reduce[k] = em__op_reduces(c, k);
        return em__cpu_reduce(c->op, d[0], s[0], reduce);
    }
    case EM_OP_FILL: return em__cpu_fill(d[0], c->f[0]);
    case EM_OP_FILL_AFFINE: return em__cpu_fill_affine(d[0], c->f[0], c->f[1]);
    case EM_OP_COPY: return em__cpu_copy(d[0], s[0]);
    case EM_OP_WHERE: return em__cpu_where(d[0], s[0], s[1], s[2]);
    case EM_OP_MATMUL: return em__cpu_matmul(d[0], s[0], s[1]);
    case EM_OP_MATMUL_ACC: return em__cpu_matmul_acc(d[0], s[0], s[1]);
    case EM_OP_ADDMM_BIAS: return em__cpu_addmm_bias(d[0], s[0], s[1], s[2]);
    case EM_OP_MATMUL_WIDEN: return em__cpu_matmul_widen(d[0], s[0], s[1]);
    case EM_OP_SOFTMAX: return em__cpu_softmax(d[0], s[0], (int)c->i[0], c->i[1] != 0);
    case EM_OP_INDEX_SELECT: return em__cpu_index_select(d[0], s[0], (int)c->i[0], s[1]);
    case EM_OP_INDEX_ADD: return em__cpu_index_add(d[0], (int)c->i[0], s[0], s[1]);
    case EM_OP_GATHER: return em__cpu_gather(d[0], s[0], (int)c->i[0], s[1]);
    case EM_OP_SCATTER_ADD: return em__cpu_scatter_add(d[0], (int)c->i[0], s[0], s[1]);
    case EM_OP_RNG:
        return em__cpu_rng(d[0], (em_rng_kind)c->i[0], (uint64_t)c->i[1], (uint64_t)c->i[2], c->f[0], c->f[1]);
    case EM_OP_SDPA: return em__cpu_sdpa(c);
    case EM_OP_SDPA_BACKWARD: return em__cpu_sdpa_backward(c);
    case EM_OP_IM2COL: return em__cpu_im2col_any(d[0], s[0], win);
    case EM_OP_COL2IM: return em__cpu_col2im_any(d[0], s[0], win);
    case EM_OP_POOL2D: return em__cpu_pool2d_any((em_pool_kind)c->i[0], d[0], d[1], s[0], win);
    case EM_OP_POOL2D_BACKWARD: return em__cpu_pool2d_backward_any((em_pool_kind)c->i[0], d[0], s[0], s[1], win);
#ifdef EMBER_HAVE_DNNL
    case EM_OP_CONV2D: return em__cpu_conv2d_any(d[0], s[0], s[1], s[2], win, c->i[0]);
    case EM_OP_CONV2D_BACKWARD_INPUT: return em__cpu_conv2d_backward_input_any(d[0], s[0], s[1], win, c->i[0]);
    case EM_OP_CONV2D_BACKWARD_WEIGHT: return em__cpu_conv2d_backward_weight_any(d[0], s[0], s[1], win, c->i[0]);
    /* f32 only: EM_ERR_NOT_SUPPORTED, nothing recorded, for f16/bf16 (core then asks for the
     * weight's gradient alone and sums the bias's itself) */
    case EM_OP_CONV2D_BACKWARD_WEIGHT_BIAS:
        return em__cpu_conv2d_backward_weight_bias_dnnl(d[0], d[1], s[0], s[1], win, c->i[0]);
#else
    case EM_OP_CONV2D: case EM_OP_CONV2D_BACKWARD_INPUT: case EM_OP_CONV2D_BACKWARD_WEIGHT:
    case EM_OP_CONV2D_BACKWARD_WEIGHT_BIAS:
        return EM_ERR_NOT_SUPPORTED;
#endif
    case EM_OP_SGD_STEP: return em__cpu_fused_sgd(c->arg, d[0], s[0], d[1]);
    /* the optimizer args' lowp_out (the mixed-precision weight copy) is honoured here */
    case EM_OP_ADAM_STEP: return em__cpu_fused_adam(c->arg, d[0], s[0], d[1], d[2], d[3]);
    case EM_OP_ADAM_STEP_MULTI:
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: the multi-tensor Adam step is a GPU kernel (step each parameter)");
    case EM_OP_CE_ROWS:
        return em_error(EM_ERR_NOT_SUPPORTED, "cpu: the cross-entropy rows are a GPU kernel (composed here)");
    case EM_OP_AMP_UNSCALE: return em__cpu_amp_unscale(d[0], d[1]);
    case EM_OP_AMP_UPDATE: return em__cpu_amp_update(d[0], c->f[0], c->f[1], c->i[0]);
    EMK_OPS_FUSED(CPU_FUSED_CASE_)
    case EM_OP_COUNT: break;
    }
    return em_error(EM_ERR_INTERNAL, "cpu: no op %d", (int)c->op);
}

const em_backend em__cpu_backend = {
    .name = "cpu",
    .type = EM_CPU,
    .init = cpu_init,
    .unavailable_reason = cpu_unavailable_reason,
    .device_count = cpu_device_count,
    .device_props = cpu_device_props,
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .raw_recycle = cpu_raw_recycle,
    .host_alloc_pinned = cpu_host_alloc_pinned,
    .host_free_pinned = cpu_host_free_pinned,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .copy_d2d = cpu_copy_d2d,
    .synchronize = cpu_synchronize,
    .supports = cpu_supports,
    .run = cpu_run,
};
