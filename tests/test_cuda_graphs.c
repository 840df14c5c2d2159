/* CUDA graphs over the fake driver (tests/cuda_fake_driver.h), through the public API
 * (include/ember/graph.h): the call sequences (capture once after the warm-up, replay, capture
 * again when an input's shape changes, nothing captured with EMBER_CUDA_GRAPHS=0 or a driver
 * without the graph functions), the graph's private memory pool, and clean failures when the
 * captured work does what a capture cannot record. The fake records copies during a capture
 * and runs them again at each launch of the graph, so a replay is checked by its data.
 * Core's registry initialises CUDA once per process, so the fake is installed first. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <stdlib.h>
#include <ember/graph.h>
#include <ember/memory.h>
#include "cuda_fake_driver.h"
#include "memory/internal.h"

static em_cu_api g_cu;
static const em_device CUDA0 = {EM_CUDA, 0};

static void install_driver(bool with_graphs) {
    em__cuda_backend_reset();
    fake_capture_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    g_cu = fake_cu();
    if (!with_graphs) g_cu.cuGraphInstantiateWithFlags = NULL;
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc_reason = "none (fake)", .cublas_reason = "none (fake)",
                              .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static void install(void) { install_driver(true); }

/* The device address of a tensor's memory. */
static uintptr_t addr_of(const em_tensor *t) {
    return (uintptr_t)t->storage->block.handle + t->storage->block.offset;
}

/* The private pool a live tensor's memory belongs to (0: the device's shared pool). */
static uint64_t pool_of(const em_tensor *t) {
    const mem_block *b = t->storage->block.alloc_ctx;
    return b ? b->seg->owner->id : (uint64_t)-1;
}

static em_tensor *device_floats(int n, float first) {
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) h[i] = first + (float)i;
    em_tensor *t = em_from_data(h, EM_F32, EM_SHAPE(n), EM_OPTS(.device = CUDA0));
    free(h);
    return t;
}

static void fill_host_to(em_tensor *dst, int n, float first) {
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) h[i] = first + (float)i;
    em_tensor *src = em_from_data(h, EM_F32, EM_SHAPE(n), EM_OPTS(0));
    CHECK_OK(em_copy_(dst, src));
    em_release(src);
    free(h);
}

static bool holds(const em_tensor *t, int n, float first) {
    float *h = malloc(sizeof(float) * (size_t)n);
    bool ok = em_copy_to_host(t, h, sizeof(float) * (size_t)n) == EM_OK;
    for (int i = 0; ok && i < n; i++) ok = h[i] == first + (float)i;
    free(h);
    return ok;
}

/* The step: out = a new tensor holding in (the previous out is released). */
typedef struct copy_step {
    em_tensor *in, *out;
    int calls;                 /* host-side runs of the function */
    bool read_back;            /* also read a value to the host (cannot be captured) */
} copy_step;

static em_status copy_fn(void *p) {
    copy_step *c = p;
    c->calls++;
    em_release(c->out);
    c->out = em_empty(EM_SHAPE(em_numel(c->in)), EM_OPTS(.device = CUDA0));
    if (!c->out) return em_last_status();
    em_status s = em_copy_(c->out, c->in);
    if (s == EM_OK && c->read_back) {
        float x[64];
        s = em_copy_to_host(c->out, x, sizeof x);
    }
    return s;
}

static void test_capture_once_then_replay(void) {
    int begins = F.capture_begins, launches = F.graph_launches, inst = F.instantiates;
    copy_step c = {.in = device_floats(1000, 0)};
    em_graph_step *s = em_graph_step_new(CUDA0, 2);
    CHECK(s != NULL);
    for (int i = 0; i < 7; i++) {
        fill_host_to(c.in, 1000, (float)(100 * i));   /* new data, same tensor */
        CHECK_OK(em_graph_step_run(s, &c.in, 1, 0, copy_fn, &c));
        CHECK(holds(c.out, 1000, (float)(100 * i)));  /* replays copy the new input too */
    }
    em_graph_step_stats st;
    CHECK_OK(em_graph_step_get_stats(s, &st));
    CHECK(st.eager_runs == 2 && st.captures == 1 && st.replays == 5 && st.failed_captures == 0 && st.captured);
    CHECK(c.calls == 3);                              /* two warm-ups and the capture */
    CHECK(F.capture_begins == begins + 1 && F.capture_ends == F.capture_begins);
    CHECK(F.instantiates == inst + 1 && F.graph_launches == launches + 5);
    CHECK(F.illegal_in_capture == 0 && F.live_graphs == 0 && F.live_execs == 1);
    CHECK(pool_of(c.in) == 0 && pool_of(c.out) > 0);  /* the graph's output: its private pool */
    em_graph_step_free(s);
    CHECK(F.live_execs == 0);
    em_release(c.in);
    em_release(c.out);
    CHECK(!em_failed());
}

static void test_recapture_after_shape_change(void) {
    int begins = F.capture_begins;
    copy_step c = {.in = device_floats(64, 0)};
    em_graph_step *s = em_graph_step_new(CUDA0, 1);
    for (int i = 0; i < 3; i++) CHECK_OK(em_graph_step_run(s, &c.in, 1, 7, copy_fn, &c));
    CHECK(F.capture_begins == begins + 1 && F.live_execs == 1);
    em_release(c.in);
    c.in = device_floats(128, 5);                     /* new shape (and address) */
    CHECK_OK(em_graph_step_run(s, &c.in, 1, 7, copy_fn, &c));
    CHECK(F.live_execs == 0);                         /* the old graph is gone; warming up again */
    CHECK(holds(c.out, 128, 5));
    CHECK_OK(em_graph_step_run(s, &c.in, 1, 7, copy_fn, &c));
    CHECK(F.capture_begins == begins + 2 && F.live_execs == 1);
    CHECK(holds(c.out, 128, 5));
    /* the caller's key is part of the key as well */
    CHECK_OK(em_graph_step_run(s, &c.in, 1, 8, copy_fn, &c));
    CHECK(F.live_execs == 0);
    em_graph_step_stats st;
    CHECK_OK(em_graph_step_get_stats(s, &st));
    CHECK(st.captures == 2 && st.eager_runs == 3 && !st.captured);
    em_graph_step_free(s);
    em_release(c.in);
    em_release(c.out);
    CHECK(!em_failed());
}

/* Memory allocated during a capture is the graph's: a block freed inside the capture is reused
 * by the same capture, nothing is freed to the driver during it, the shared pool never hands
 * out the graph's memory, and the memory goes back once the graph and its tensors are gone. */
static void test_capture_allocates_from_a_private_pool(void) {
    em_memory_empty_cache(CUDA0);
    int frees = F.frees, live = F.live_allocs;
    em_tensor *before = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0)); /* 12 MiB, shared pool */
    em_release(before);                                 /* cached: a free 12 MiB block */
    em_graph *g = em_graph_new(CUDA0);
    CHECK_OK(em_graph_capture_begin(g));
    int in_capture = F.allocs_in_capture;
    em_tensor *a = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0));
    CHECK(a != NULL && pool_of(a) > 0);                 /* not the cached shared block */
    CHECK(F.allocs_in_capture == in_capture + 1);       /* a new segment, in relaxed mode */
    uintptr_t addr = addr_of(a);
    em_release(a);                                      /* freed inside the capture ... */
    em_tensor *b = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0));
    CHECK(b != NULL && addr_of(b) == addr);         /* ... and reused by it */
    CHECK_OK(em_memory_empty_cache(CUDA0));             /* nothing goes back during a capture */
    CHECK(F.frees == frees && F.illegal_in_capture == 0);
    CHECK_OK(em_graph_capture_end(g));
    CHECK(em_graph_captured(g));
    em_tensor *other = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0));
    CHECK(other != NULL && pool_of(other) == 0 && addr_of(other) != addr);
    em_release(other);
    em_release(b);                                      /* the graph still lives: memory kept */
    em_tensor *again = em_empty(EM_SHAPE(3 << 20), EM_OPTS(.device = CUDA0));
    CHECK(again != NULL && addr_of(again) != addr && pool_of(again) == 0);
    em_release(again);
    em_memory_empty_cache(CUDA0);
    CHECK(F.live_allocs == live + 1);                   /* the graph's segment */
    em_graph_free(g);
    CHECK(F.live_allocs == live);                       /* its blocks were free: given back */
    CHECK(!em_failed());
}

/* A private pool whose graph is freed first keeps its live tensors until they go. */
static void test_pool_outlives_graph_while_tensors_live(void) {
    em_memory_empty_cache(CUDA0);
    int live = F.live_allocs;
    em_graph *g = em_graph_new(CUDA0);
    CHECK_OK(em_graph_capture_begin(g));
    em_tensor *a = em_empty(EM_SHAPE(1 << 20), EM_OPTS(.device = CUDA0));
    CHECK_OK(em_graph_capture_end(g));
    em_graph_free(g);
    CHECK(a != NULL && F.live_allocs == live + 1);
    em_release(a);
    CHECK(F.live_allocs == live);
    CHECK(!em_failed());
}

/* A read to the host inside the step cannot be recorded: the capture fails with a message,
 * the recording is dropped, the step runs eagerly, and the device is usable afterwards. */
static void test_illegal_call_fails_the_capture_cleanly(void) {
    int begins = F.capture_begins;
    copy_step c = {.in = device_floats(64, 3), .read_back = true};
    em_graph_step *s = em_graph_step_new(CUDA0, 1);
    for (int i = 0; i < 4; i++) {
        CHECK_OK(em_graph_step_run(s, &c.in, 1, 0, copy_fn, &c));
        CHECK(holds(c.out, 64, 3));
    }
    em_graph_step_stats st;
    CHECK_OK(em_graph_step_get_stats(s, &st));
    CHECK(st.failed_captures == 1 && st.captures == 0 && st.eager_runs == 4 && !st.captured);
    CHECK(strstr(st.last_failure, "graph capture failed: a copy to host memory during the capture"));
    CHECK(F.capture_begins == begins + 1 && F.capture_ends == F.capture_begins); /* tried once */
    CHECK(F.live_graphs == 0 && F.live_execs == 0);
    CHECK(c.calls == 5);                              /* warm-up, the capture, then eager */
    CHECK(!em_failed());
    CHECK_OK(em_device_synchronize(CUDA0));                  /* out of capture */
    em_graph_step_free(s);
    em_release(c.in);
    em_release(c.out);

    /* what the driver itself refuses (here a cuMemFree, which waits) invalidates the capture */
    em_graph *g = em_graph_new(CUDA0);
    void *h = NULL;
    CHECK_OK(em__cuda_backend.raw_alloc(0, 256, &h));
    CHECK_OK(em_graph_capture_begin(g));
    em__cuda_backend.raw_free(0, h);
    em_clear_error();
    CHECK(em_graph_capture_end(g) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "graph capture failed (a driver call during the capture waited");
    CHECK(!em_graph_captured(g) && F.live_graphs == 0);
    CHECK(em_graph_replay(g) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds no recording");
    em_graph_free(g);
    CHECK_OK(em__cuda_backend.synchronize(0));
    em__cuda_backend.raw_free(0, h);
    CHECK(!em_failed());
}

static void test_api_misuse(void) {
    em_graph *g = em_graph_new(CUDA0);
    CHECK(em_graph_capture_end(g) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "not capturing");
    CHECK_OK(em_graph_capture_begin(g));
    em_graph *h = em_graph_new(CUDA0);
    CHECK(em_graph_capture_begin(h) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "a capture is already under way");
    em_graph_free(h);
    em_graph_free(g);                                 /* ends the capture it was in */
    CHECK(F.capture_ends == F.capture_begins);
    CHECK(em_graph_step_new(CUDA0, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "warmup must be >= 0");
    CHECK(em_graph_step_run(NULL, NULL, 0, 0, copy_fn, NULL) == EM_ERR_ARGUMENT);
    em_clear_error();
    em_graph_step *s = em_graph_step_new(CUDA0, 0);
    em_tensor *cpu = em_empty(EM_SHAPE(4), EM_OPTS(0));
    CHECK(em_graph_step_run(s, &cpu, 1, 0, copy_fn, NULL) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "input 0 is on cpu, the step on cuda:0");
    em_release(cpu);
    em_graph_step_free(s);
    const char *why = NULL;
    CHECK(!em_graph_available(EM_DEVICE(EM_CPU, 0), &why) && why && strstr(why, "CUDA only"));
}

/* EMBER_CUDA_GRAPHS=0: no capture call reaches the driver; every step runs eagerly. */
static void test_env_turns_graphs_off(void) {
    setenv("EMBER_CUDA_GRAPHS", "0", 1);
    int begins = F.capture_begins;
    const char *why = NULL;
    CHECK(!em_graph_available(CUDA0, &why) && why && strstr(why, "EMBER_CUDA_GRAPHS=0"));
    copy_step c = {.in = device_floats(16, 1)};
    em_graph_step *s = em_graph_step_new(CUDA0, 0);
    for (int i = 0; i < 5; i++) CHECK_OK(em_graph_step_run(s, &c.in, 1, 0, copy_fn, &c));
    CHECK(holds(c.out, 16, 1) && c.calls == 5 && F.capture_begins == begins);
    em_graph *g = em_graph_new(CUDA0);
    CHECK(em_graph_capture_begin(g) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "off (EMBER_CUDA_GRAPHS=0)");
    em_graph_free(g);
    em_graph_step_free(s);
    em_release(c.in);
    em_release(c.out);
    unsetenv("EMBER_CUDA_GRAPHS");
}

/* A driver without the graph functions: no graphs, not an error. */
static void test_driver_without_graphs(void) {
    install_driver(false);
    const char *why = NULL;
    CHECK(!em_graph_available(CUDA0, &why) && why && strstr(why, "lacks the graph functions"));
    copy_step c = {.in = device_floats(16, 2)};
    em_graph_step *s = em_graph_step_new(CUDA0, 0);
    for (int i = 0; i < 3; i++) CHECK_OK(em_graph_step_run(s, &c.in, 1, 0, copy_fn, &c));
    CHECK(holds(c.out, 16, 2) && c.calls == 3 && F.capture_begins == 0);
    em_graph_step_free(s);
    em_release(c.in);
    em_release(c.out);
    CHECK(!em_failed());
}

int main(void) {
    install(); /* before core's registry asks: it remembers the answer */
    RUN(test_capture_once_then_replay);
    RUN(test_recapture_after_shape_change);
    RUN(test_capture_allocates_from_a_private_pool);
    RUN(test_pool_outlives_graph_while_tensors_live);
    RUN(test_illegal_call_fails_the_capture_cleanly);
    RUN(test_api_misuse);
    RUN(test_env_turns_graphs_off);
    RUN(test_driver_without_graphs);
    em_memory_empty_cache(CUDA0);
    CHECK(F.live_allocs == 0);
    em__cuda_backend_reset();
    fake_capture_reset();
    return test_summary();
}

#else
#include <ember/graph.h>
int main(void) {
    test_skip_case("CUDA graph tests", "built without the CUDA headers (cuda.h): no CUDA backend to capture on");
    const char *why = NULL;
    CHECK(!em_graph_available(EM_DEVICE(EM_CPU, 0), &why) && why);
    return test_summary();
}
#endif
