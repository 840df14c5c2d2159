/* Pinned memory and contexts on CUDA, through the public API over the fake driver
 * (tests/cuda_fake_driver.h): once CUDA is in use, pinned tensors are cuMemHostAlloc'ed
 * and a non-blocking copy from one is a cuMemcpyHtoDAsync of that very memory, followed
 * by an event; reusing the block waits for that event, never for the whole device; and
 * every call gives the calling thread its own context back. Core's registry initialises
 * CUDA once per process, so the fake is installed before anything asks for it. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <pthread.h>
#include <ember/memory.h>
#include "cuda_fake_driver.h"

static em_cu_api g_cu;

static void install(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    F.cc_major = 9; /* an H100/H200 */
    F.cc_minor = 0;
    g_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc_reason = "none (fake)", .cublas_reason = "none (fake)",
                              .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static const em_device CUDA0 = {EM_CUDA, 0};

/* Before CUDA is used, pinned memory is the CPU backend's; afterwards the driver's. */
static void test_pinned_memory_comes_from_the_driver(void) {
    em_tensor *early = em_empty(EM_SHAPE(1000), EM_OPTS(.pin_memory = true));
    CHECK(early != NULL && F.host_allocs == 0); /* no device in use yet: no context made for it */
    em_tensor *dev = em_empty(EM_SHAPE(4), EM_OPTS(.device = CUDA0));
    CHECK(dev != NULL && F.retains[0] == 1);
    em_tensor *x = em_empty(EM_SHAPE(3000), EM_OPTS(.pin_memory = true)); /* a new size: a new block */
    CHECK(x != NULL);
    CHECK(F.host_allocs == 1 && F.live_host_allocs == 1); /* cuMemHostAlloc: page-locked */
    em_release(early);
    em_release(dev);
    em_release(x);
}

/* A non-blocking copy from pinned memory reads that memory itself, queued, then an event. */
static void test_non_blocking_copy_is_async_and_unstaged(void) {
    em_tensor *x = em_empty(EM_SHAPE(3000), EM_OPTS(.pin_memory = true));
    float *p = em_data_ptr(x);
    for (int i = 0; i < 3000; i++) p[i] = (float)i;
    int syncs = F.stream_syncs, copies = F.h2d_async, records = F.records;
    em_tensor *y = em_to_device_dtype(x, CUDA0, EM_F32, true);
    CHECK(y != NULL);
    CHECK(F.h2d_async == copies + 1);
    CHECK(F.last_h2d_src == (const void *)p); /* the pinned memory, not a staging copy */
    CHECK(F.stream_syncs == syncs);           /* nothing waited */
    CHECK(F.records == records + 1);          /* the event the pinned cache waits on */
    CHECK(!memcmp((const void *)(uintptr_t)F.last_h2d_dst, p, 3000 * sizeof(float)));
    /* a blocking copy from pageable memory waits for the stream */
    em_tensor *z = em_empty(EM_SHAPE(8), EM_OPTS(0));
    em_tensor *zd = em_to(z, CUDA0);
    CHECK(zd != NULL && F.stream_syncs == syncs + 1);
    em_release(x);
    em_release(y);
    em_release(z);
    em_release(zd);
    CHECK(!em_failed());
}

/* Reusing a block whose copy is still queued waits on that copy's event; one whose copy
 * has finished is reused without waiting; the device is never synchronized for it. */
static void test_reuse_waits_on_the_event_not_the_device(void) {
    em_memory_empty_pinned_cache();
    em_memory_stats before, after;
    em_tensor *x = em_empty(EM_SHAPE(5000), EM_OPTS(.pin_memory = true));
    em_tensor *y = em_to_device_dtype(x, CUDA0, EM_F32, true);
    void *block = em_data_ptr(x);
    em_release(x); /* to the cache, its copy still queued */
    F.events_incomplete = true;
    int syncs = F.stream_syncs, event_syncs = F.event_syncs;
    em_memory_get_pinned_stats(&before);
    em_tensor *x2 = em_empty(EM_SHAPE(5000), EM_OPTS(.pin_memory = true));
    em_memory_get_pinned_stats(&after);
    CHECK(em_data_ptr(x2) == block);             /* the same block, reused */
    CHECK(F.event_syncs == event_syncs + 1);     /* after waiting for the copy's event */
    CHECK(F.stream_syncs == syncs);              /* and not for the whole device */
    CHECK(after.num_stream_waits == before.num_stream_waits + 1);

    /* the copy has finished: reuse costs no wait */
    em_tensor *y2 = em_to_device_dtype(x2, CUDA0, EM_F32, true);
    em_release(x2);
    F.events_incomplete = false;
    em_memory_get_pinned_stats(&before);
    em_tensor *x3 = em_empty(EM_SHAPE(5000), EM_OPTS(.pin_memory = true));
    em_memory_get_pinned_stats(&after);
    CHECK(em_data_ptr(x3) == block);
    CHECK(after.num_stream_waits == before.num_stream_waits);
    CHECK(F.stream_syncs == syncs);
    em_release(x3);
    em_release(y);
    em_release(y2);
    em_memory_empty_pinned_cache();
    CHECK(F.live_events == 1); /* only the device's own ordering event is left */
}

/* ---- contexts: a thread with none (the loader's), and a user's own context ---- */
static void *copy_on_thread(void *arg) {
    em_tensor *x = arg;
    em_tensor *y = em_to_device_dtype(x, CUDA0, EM_F32, true);
    bool ok = y != NULL && t_ctx == -1; /* given back: no context, as before */
    em_release(y);
    return ok ? arg : NULL;
}

static void test_contexts_switched_and_restored(void) {
    em_tensor *x = em_empty(EM_SHAPE(256), EM_OPTS(.pin_memory = true));
    int wrong = F.wrong_ctx;
    pthread_t th;
    void *res = NULL;
    CHECK(pthread_create(&th, NULL, copy_on_thread, x) == 0);
    pthread_join(th, &res);
    CHECK(res == x);
    CHECK(F.wrong_ctx == wrong); /* the thread got cuda:0's context before each call */
    /* the caller's context (a program's own, on cuda:1) survives a call on cuda:0 */
    t_ctx = 1;
    em_tensor *y = em_to_device_dtype(x, CUDA0, EM_F32, false);
    CHECK(y != NULL && t_ctx == 1);
    t_ctx = -1;
    em_release(y);
    CHECK(t_ctx == -1);
    em_release(x);
    CHECK(F.wrong_ctx == wrong);
}

int main(void) {
    install(); /* before core's registry asks: it remembers the answer */
    RUN(test_pinned_memory_comes_from_the_driver);
    RUN(test_non_blocking_copy_is_async_and_unstaged);
    RUN(test_reuse_waits_on_the_event_not_the_device);
    RUN(test_contexts_switched_and_restored);
    em_memory_empty_cache(CUDA0);
    em_memory_empty_pinned_cache();
    CHECK(F.live_allocs == 0 && F.live_host_allocs == 0);
    em__cuda_backend_reset();
    return test_summary();
}

#else
/* Built without the CUDA headers: pinned memory stays the CPU backend's. */
#include "backends/backend.h"
static void test_unavailable_without_headers(void) {
    CHECK(em__cuda_backend.init() == EM_ERR_UNAVAILABLE && em__cuda_backend.event_record == NULL);
}
int main(void) {
    printf("built without CUDA headers: skipped the pinned-memory tests (no CUDA backend)\n");
    RUN(test_unavailable_without_headers);
    return test_summary();
}
#endif
