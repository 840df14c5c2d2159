/* Expandable segments (EMBER_CUDA_ALLOC_CONF=expandable_segments:True) over the fake driver
 * (tests/cuda_fake_driver.h), whose reserved ranges are inaccessible host address space and
 * whose mapped chunks are readable and writable: growth maps new chunks at the end of the same
 * range, memory freed inside the range is reused in place, empty_cache unmaps the free end and
 * releases a wholly free range, and the data of live blocks survives all of it. cuda:1 keeps
 * ordinary segments (the variable is read when a device first allocates), for the
 * out-of-memory message that suggests expandable segments. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <stdlib.h>
#include <ember/memory.h>
#include "cuda_fake_driver.h"

static em_cu_api g_cu;
static const em_device CUDA0 = {EM_CUDA, 0}, CUDA1 = {EM_CUDA, 1};
#define MiB ((size_t)1 << 20)

static void install(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    g_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc_reason = "none (fake)", .cublas_reason = "none (fake)",
                              .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static uintptr_t base_of(const em_tensor *t) { return (uintptr_t)t->storage->block.handle; }
static size_t offset_of(const em_tensor *t) { return t->storage->block.offset; }

/* A float tensor of `mib` MiB on dev holding first, first + 1, ... */
static em_tensor *filled(em_device dev, size_t mib, float first) {
    size_t n = mib * MiB / sizeof(float);
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = first + (float)(i % 1000);
    em_tensor *t = em_from_data(h, EM_F32, EM_SHAPE((int64_t)n), EM_OPTS(.device = dev));
    free(h);
    return t;
}

static bool holds(const em_tensor *t, float first) {
    size_t n = (size_t)em_numel(t);
    float *h = malloc(n * sizeof(float));
    bool ok = em_copy_to_host(t, h, n * sizeof(float)) == EM_OK;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] == first + (float)(i % 1000);
    free(h);
    return ok;
}

static void test_growth_maps_at_the_end_of_one_range(void) {
    em_tensor *a = filled(CUDA0, 3, 1);                /* 3 MiB: two 2 MiB chunks */
    CHECK(a != NULL && F.va_reserves == 1 && F.maps == 2);
    CHECK(F.map_offsets[0] == 0 && F.map_offsets[1] == 2 * MiB);
    CHECK(base_of(a) == F.last_va && offset_of(a) == 0);
    em_tensor *b = filled(CUDA0, 5, 2);                /* the 1 MiB left, then three more chunks */
    CHECK(b != NULL && F.va_reserves == 1 && F.maps == 4);
    CHECK(F.map_offsets[2] == 4 * MiB && F.map_offsets[3] == 6 * MiB);
    CHECK(base_of(b) == base_of(a) && offset_of(b) == 3 * MiB);
    CHECK(F.live_allocs == 0);                         /* no cuMemAlloc segment at all */
    CHECK(em_memory_reserved(CUDA0) == (int64_t)(8 * MiB));
    em_memory_stats st;
    CHECK_OK(em_memory_get_stats(CUDA0, &st));
    CHECK(st.segment[EM_MEMORY_ALL].current == 1 && st.num_raw_allocs == 2);
    CHECK(holds(a, 1) && holds(b, 2));

    /* freed memory inside the range is reused in place, without mapping */
    em_release(a);
    em_tensor *c = filled(CUDA0, 2, 3);
    CHECK(c != NULL && base_of(c) == base_of(b) && offset_of(c) == 0 && F.maps == 4);
    CHECK(holds(b, 2) && holds(c, 3));

    /* empty_cache unmaps the free end, whole chunks only, and keeps live data */
    em_tensor *d = filled(CUDA0, 12, 4);
    CHECK(d != NULL && offset_of(d) == 8 * MiB && F.mapped_bytes == 20 * MiB);
    em_release(d);
    CHECK_OK(em_memory_empty_cache(CUDA0));
    CHECK(F.mapped_bytes == 8 * MiB && F.unmaps == 6 && F.va_frees == 0);
    CHECK(em_memory_reserved(CUDA0) == (int64_t)(8 * MiB));
    CHECK(holds(b, 2) && holds(c, 3));

    /* a wholly free range is unmapped and its address space released */
    em_release(b);
    em_release(c);
    CHECK_OK(em_memory_empty_cache(CUDA0));
    CHECK(F.mapped_bytes == 0 && F.unmaps == F.maps && F.va_frees == 1);
    CHECK(em_memory_reserved(CUDA0) == 0);
    CHECK_OK(em_memory_get_stats(CUDA0, &st));
    CHECK(st.segment[EM_MEMORY_ALL].current == 0 && st.inactive_split_bytes[EM_MEMORY_ALL].current == 0);
    CHECK(!em_failed());
}

/* Shapes that change every step leave no holes between segments: the range grows by what the
 * largest step needs, and reserved memory stays within one chunk per pool of it. */
static void test_varying_shapes_do_not_fragment(void) {
    int reserves = F.va_reserves;
    em_tensor *keep = filled(CUDA0, 1, 0);             /* a live block pins the range's start */
    size_t peak = 0;
    for (int step = 1; step <= 20; step++) {
        size_t mib = 2 + (size_t)(step * 7 % 13);
        em_tensor *x = filled(CUDA0, mib, (float)step);
        em_tensor *y = filled(CUDA0, mib / 2 + 1, (float)step);
        CHECK(x && y && holds(x, (float)step));
        if (mib + mib / 2 + 1 > peak) peak = mib + mib / 2 + 1;
        em_release(x);
        em_release(y);
    }
    CHECK(F.va_reserves == reserves + 2);               /* the small pool's and the large pool's ranges */
    CHECK(em_memory_max_reserved(CUDA0) <= (int64_t)((peak + 1 + 4) * MiB));
    CHECK(F.live_allocs == 0);
    em_release(keep);
    CHECK_OK(em_memory_empty_cache(CUDA0));
    CHECK(F.mapped_bytes == 0 && F.va_frees == F.va_reserves);
    CHECK(!em_failed());
}

/* A failed mapping unmaps what the growth mapped and reports out of memory. */
static void test_failed_mapping_is_out_of_memory(void) {
    F.map_fail_at = F.creates + 3;                      /* the third chunk of six fails, also on the retry */
    em_tensor *x = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0)); /* 12 MiB */
    CHECK(x == NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "CUDA out of memory. Tried to allocate 12.00 MiB");
    CHECK(F.mapped_bytes == 0 && F.live_phys == 0);
    F.map_fail_at = 0;
    x = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0));
    CHECK(x != NULL && F.mapped_bytes == 12 * MiB);
    em_release(x);
    em_memory_empty_cache(CUDA0);
    CHECK(F.mapped_bytes == 0);
    CHECK(!em_failed());
}

/* cuda:1 has ordinary segments: an out-of-memory error caused by gaps between live blocks
 * says that expandable segments would avoid it. */
static void test_oom_message_suggests_expandable_segments(void) {
    unsetenv("EMBER_CUDA_ALLOC_CONF");
    int reserves = F.va_reserves;
    CHECK_OK(em_memory_set_cap(CUDA1, (int64_t)(20 * MiB)));
    em_tensor *t[4];
    for (int i = 0; i < 4; i++) t[i] = em_empty(EM_SHAPE((int64_t)(5 * MiB / 4)), EM_OPTS(.device = CUDA1));
    CHECK(t[0] && t[1] && t[2] && t[3] && F.live_allocs == 1 && F.va_reserves == reserves);
    em_release(t[0]);
    em_release(t[2]);                                   /* 10 MiB free, in two 5 MiB gaps */
    em_tensor *x = em_empty(EM_SHAPE((int64_t)(8 * MiB / 4)), EM_OPTS(.device = CUDA1));
    CHECK(x == NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "not in one piece; EMBER_CUDA_ALLOC_CONF=expandable_segments:True avoids");
    em_release(t[1]);
    em_release(t[3]);
    em_memory_set_cap(CUDA1, -1);
    em_memory_empty_cache(CUDA1);
    CHECK(F.live_allocs == 0);
}

static void test_bad_setting_is_reported(void) {
    /* read when a device's allocator starts: check it the way a program would */
    setenv("EMBER_CUDA_ALLOC_CONF", "expandable_segments:maybe", 1);
    em_memory_stats st;
    (void)st;
    CHECK(em_memory_check_env(EM_DEVICE(EM_CUDA, 7)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "EMBER_CUDA_ALLOC_CONF: cannot read 'expandable_segments:maybe'");
    setenv("EMBER_CUDA_ALLOC_CONF", "max_split_size_mb:128", 1);
    CHECK(em_memory_check_env(EM_DEVICE(EM_CUDA, 8)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected expandable_segments:True or expandable_segments:False");
    CHECK_OK(em_memory_check_env(EM_DEVICE(EM_CPU, 0)));   /* CUDA's variable: not the CPU's */
    unsetenv("EMBER_CUDA_ALLOC_CONF");
}

int main(void) {
    setenv("EMBER_CUDA_ALLOC_CONF", "expandable_segments:True", 1);
    install(); /* before core's registry asks: it remembers the answer */
    RUN(test_growth_maps_at_the_end_of_one_range);
    RUN(test_varying_shapes_do_not_fragment);
    RUN(test_failed_mapping_is_out_of_memory);
    RUN(test_oom_message_suggests_expandable_segments);
    RUN(test_bad_setting_is_reported);
    em_memory_empty_cache(CUDA0);
    CHECK(F.live_allocs == 0 && F.mapped_bytes == 0);
    em__cuda_backend_reset();
    return test_summary();
}

#else
int main(void) {
    test_skip_case("expandable segments", "built without the CUDA headers (cuda.h): no CUDA backend");
    return test_summary();
}
#endif
