/* CPU backend: device enumeration and properties, raw and pinned memory, copies. */
#include <stdlib.h>
#include <unistd.h>
#include "test_cpu_util.h"

/* Under ASan a huge malloc must return NULL (the default is to abort the process). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static void test_device_props(void) {
    CHECK(em__cpu_backend.init() == EM_OK);
    CHECK(em__cpu_backend.device_count() == 1);
    CHECK(em__cpu_backend.type == EM_CPU && strcmp(em__cpu_backend.name, "cpu") == 0);
    em_device_props p;
    CHECK_OK(em__cpu_backend.device_props(0, &p));
    CHECK(strlen(p.name) > 0);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) { /* the name is the first "model name" line's value */
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                line[strcspn(line, "\n")] = '\0';
                CHECK(strstr(line, p.name) != NULL);
                break;
            }
        fclose(f);
    }
    CHECK(p.total_memory > (int64_t)1 << 24);
    CHECK(p.free_memory > 0 && p.free_memory <= p.total_memory);
    CHECK(p.compute_units == (int)sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(!p.is_gpu);
    CHECK(em__cpu_backend.device_props(1, &p) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "cpu");
}

static void test_raw_memory_and_copies(void) {
    const size_t sizes[] = {0, 1, 63, 64, 1000, 1 << 20};
    for (int i = 0; i < 6; i++) {
        void *h = NULL;
        CHECK_OK(em__cpu_backend.raw_alloc(0, sizes[i], &h));
        CHECK(h != NULL && ((uintptr_t)h & 63) == 0);
        if (sizes[i]) memset(h, 7, sizes[i]);
        em__cpu_backend.raw_free(0, h);
    }
    void *h = NULL;
    CHECK(em__cpu_backend.raw_alloc(0, (size_t)1 << 62, &h) == EM_ERR_OUT_OF_MEMORY);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "4611686018427387904 bytes");
    CHECK(h == NULL);

    unsigned char src[100], back[100];
    for (int i = 0; i < 100; i++) src[i] = (unsigned char)i;
    void *d1, *d2;
    CHECK_OK(em__cpu_backend.raw_alloc(0, 256, &d1));
    CHECK_OK(em__cpu_backend.raw_alloc(0, 256, &d2));
    memset(d1, 0xEE, 256);
    CHECK_OK(em__cpu_backend.copy_h2d(0, d1, 10, src, 100, false));
    CHECK(((unsigned char *)d1)[9] == 0xEE && ((unsigned char *)d1)[110] == 0xEE);
    CHECK_OK(em__cpu_backend.copy_d2d(0, d2, 3, 0, d1, 10, 100));
    CHECK_OK(em__cpu_backend.copy_d2h(0, back, d2, 3, 100));
    CHECK(memcmp(src, back, 100) == 0);
    CHECK_OK(em__cpu_backend.copy_d2d(0, d1, 12, 0, d1, 10, 50)); /* overlapping: memmove semantics */
    CHECK(((unsigned char *)d1)[12] == 0 && ((unsigned char *)d1)[61] == 49);
    CHECK_OK(em__cpu_backend.synchronize(0));
    em__cpu_backend.raw_free(0, d1);
    em__cpu_backend.raw_free(0, d2);
}

static void test_pinned_memory(void) {
    void *p = NULL, *q = NULL;
    CHECK_OK(em__cpu_backend.host_alloc_pinned(100000, &p));
    CHECK_OK(em__cpu_backend.host_alloc_pinned(1, &q));
    CHECK(p && q && ((uintptr_t)p & 63) == 0 && ((uintptr_t)q & 63) == 0);
    memset(p, 1, 100000);
    *(char *)q = 2;
    em__cpu_backend.host_free_pinned(p);
    CHECK(*(char *)q == 2);
    em__cpu_backend.host_free_pinned(q);
    em__cpu_backend.host_free_pinned(NULL);
}

/* The VmFlags of the mapping holding p in /proc/self/smaps ("rd wr mr mw me ac hg"), or ""
 * when none holds it. */
static void vm_flags_of(const void *p, char *out, size_t size) {
    out[0] = '\0';
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    bool inside = false;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            size_t n = strlen(line + 8);
            n = n < size ? n : size - 1;
            memcpy(out, line + 8, n);
            out[n] = '\0';
            break;
        }
    }
    fclose(f);
}

/* Large blocks are advised as transparent huge pages ("hg" in the mapping's flags);
 * EMBER_CPU_HUGE_PAGES=0 leaves them alone; small blocks never get it. */
static void test_huge_pages(void) {
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        SKIP("this kernel has no transparent huge pages (/sys/kernel/mm/transparent_hugepage)");
    char flags[256];
    const size_t big = (size_t)8 << 20;
    void *h = NULL;
    /* first, before anything of this process is advised: the switch */
    CHECK(setenv("EMBER_CPU_HUGE_PAGES", "0", 1) == 0);
    CHECK_OK(em__cpu_backend.raw_alloc(0, big, &h));
    vm_flags_of(h, flags, sizeof flags);
    CHECK(flags[0] != '\0' && strstr(flags, " hg") == NULL);
    em__cpu_backend.raw_free(0, h);
    CHECK(unsetenv("EMBER_CPU_HUGE_PAGES") == 0);

    CHECK_OK(em__cpu_backend.raw_alloc(0, big, &h));
    memset(h, 1, big);
    vm_flags_of(h, flags, sizeof flags);
    CHECK(strstr(flags, " hg") != NULL);
    vm_flags_of((char *)h + big - 1, flags, sizeof flags);
    CHECK(strstr(flags, " hg") != NULL);
    void *small = NULL;
    CHECK_OK(em__cpu_backend.raw_alloc(0, (size_t)1 << 20, &small));
    vm_flags_of(small, flags, sizeof flags);
    CHECK(flags[0] != '\0' && strstr(flags, " hg") == NULL);
    em__cpu_backend.raw_free(0, small);
    em__cpu_backend.raw_free(0, h);
}

/* Large blocks start at different offsets within a page, 256-byte multiples after the
 * page's first 256 bytes (no 4K aliasing between a step's streams); small ones stay 64-byte
 * aligned. Every block is writable to its last byte and freed whole (ASan checks both). */
static void test_big_blocks_staggered(void) {
    enum { N = 16 };
    const size_t big = (size_t)4 << 20;
    void *h[N];
    bool seen[16] = {false};
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        CHECK_OK(em__cpu_backend.raw_alloc(0, big + 100, &h[i]));
        uintptr_t off = (uintptr_t)h[i] & 4095;
        CHECK(off % 256 == 0);
        if (!seen[off / 256]) distinct++;
        seen[off / 256] = true;
        memset(h[i], 0x5A, big + 100);
    }
    CHECK(distinct == N); /* 16 in turn: all 16 offsets */
    for (int i = 0; i < N; i++) em__cpu_backend.raw_free(0, h[i]);
    void *s = NULL;
    CHECK_OK(em__cpu_backend.raw_alloc(0, ((size_t)4 << 20) - 64, &s)); /* just below: not staggered */
    CHECK(((uintptr_t)s & 63) == 0);
    em__cpu_backend.raw_free(0, s);
}

int main(void) {
    RUN(test_device_props);
    RUN(test_raw_memory_and_copies);
    RUN(test_pinned_memory);
    RUN(test_huge_pages);
    RUN(test_big_blocks_staggered);
    return test_summary();
}
