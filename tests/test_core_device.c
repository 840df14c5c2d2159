/* Device strings, the registry, availability, auto-selection, current devices, threads. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "test_core_util.h"
#include "backends/backend.h"
#include "backends/gpu/gpu.h"

static void test_parse(void) {
    struct { const char *s; em_device_type t; int index; } ok[] = {
        {"cpu", EM_CPU, 0},     {"cpu:0", EM_CPU, 0},      {"cuda", EM_CUDA, -1}, {"cuda:1", EM_CUDA, 1},
        {"cuda:10", EM_CUDA, 10}, {"opencl", EM_OPENCL, -1}, {"opencl:0", EM_OPENCL, 0}, {"mps", EM_MPS, -1},
        {"mps:0", EM_MPS, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        em_device d = {EM_MPS, 99};
        CHECK_OK(em_device_parse(ok[i].s, &d));
        CHECK(d.type == ok[i].t && d.index == ok[i].index);
    }
    const char *bad[] = {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:01", "cuda:1x", " cpu", "cpu:1", "cuda:1:2",
                         "opencl:+1", "cuda:99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        em_device d = EM_DEVICE(EM_CUDA, 7);
        CHECK(em_device_parse(bad[i], &d) == EM_ERR_ARGUMENT);
        CHECK(d.type == EM_CUDA && d.index == 7);
        CHECK(em_last_status() == EM_ERR_ARGUMENT);
        CHECK(strstr(em_last_error(), bad[i]) != NULL);
        em_clear_error();
    }
    em_device d;
    CHECK(em_device_parse("tpu:0", &d) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "invalid device string 'tpu:0': expected one of cpu, cuda, cuda:N, mps, mps:0, "
                                 "opencl, opencl:N");
}

static void test_print(void) {
    CHECK(strcmp(em_device_str(EM_DEVICE_CPU).s, "cpu") == 0);
    CHECK(strcmp(em_device_str(EM_DEVICE(EM_CUDA, 1)).s, "cuda:1") == 0);
    CHECK(strcmp(em_device_str(EM_DEVICE(EM_CUDA, -1)).s, "cuda") == 0);
    CHECK(strcmp(em_device_str(EM_DEVICE(EM_OPENCL, 0)).s, "opencl:0") == 0);
    CHECK(strcmp(em_device_str(EM_DEVICE(EM_MPS, 0)).s, "mps:0") == 0);
    CHECK(strcmp(em_device_type_name(EM_OPENCL), "opencl") == 0);
    CHECK(strcmp(em_device_type_name(EM_MPS), "mps") == 0);
    /* Round trip. */
    const char *s[] = {"cpu", "cuda:3", "opencl:1", "mps"};
    for (int i = 0; i < 4; i++) {
        em_device d;
        CHECK_OK(em_device_parse(s[i], &d));
        CHECK(strcmp(em_device_str(d).s, s[i]) == 0);
    }
}

static void test_equal_resolve(void) {
    CHECK(em_device_equal(EM_DEVICE_CPU, EM_DEVICE(EM_CPU, 0)));
    CHECK(em_device_equal(EM_DEVICE(EM_CPU, -1), EM_DEVICE_CPU));
    CHECK(em_device_equal(EM_DEVICE(EM_CUDA, -1), EM_DEVICE(EM_CUDA, 0))); /* current cuda device is 0 */
    CHECK(!em_device_equal(EM_DEVICE(EM_CUDA, 1), EM_DEVICE(EM_CUDA, 0)));
    CHECK(!em_device_equal(EM_DEVICE(EM_CUDA, 0), EM_DEVICE(EM_OPENCL, 0)));
    CHECK(em_device_resolve(EM_DEVICE(EM_OPENCL, -1)).index == 0);
    CHECK(em_device_resolve(EM_DEVICE(EM_CPU, -1)).index == 0);
    em_device zero = {0};
    CHECK(zero.type == EM_CPU && em_device_equal(zero, EM_DEVICE_CPU));
}

static void test_availability(void) {
    CHECK(em_device_available(EM_CPU));
    CHECK(em_device_count(EM_CPU) == 1);
    CHECK(em_device_unavailable_reason(EM_CPU) == NULL);
    CHECK(!em_device_available(EM_MPS));
    CHECK(em_device_count(EM_MPS) == 0);
    CHECK(strcmp(em_device_unavailable_reason(EM_MPS), "MPS needs Apple Silicon and macOS; this build runs on Linux") == 0);
    /* No GPU on this machine: CUDA says why. */
    if (!em_device_available(EM_CUDA)) {
        const char *r = em_device_unavailable_reason(EM_CUDA);
        CHECK(r && *r);
        CHECK(em_device_count(EM_CUDA) == 0);
    }
    CHECK(em__backend_for(EM_CPU) == &em__cpu_backend);
    CHECK(em__backend_for(EM_CUDA) == &em__cuda_backend);
    CHECK(em__backend_for(EM_MPS) == NULL);
    CHECK(em__backend_for((em_device_type)42) == NULL);
    CHECK(!em_failed());
}

/* The registry: each built backend under its own type and name; GPU backends run every op
 * of the shared GPU op layer and name their launcher, which users' kernels use. */
static void test_registry(void) {
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        const em_backend *be = em__backend_for((em_device_type)t);
        if (!be) continue;
        CHECK(be->type == (em_device_type)t);
        CHECK(!strcmp(be->name, em_device_type_name((em_device_type)t)));
        if (!be->gpu) continue;
        /* every (op, dtype) the shared layer runs, the backend runs */
        for (int op = 0; op < EM_OP_COUNT; op++)
            for (int dt = 0; dt < EM_DTYPE_COUNT; dt++) {
                em_op_call c = {.op = (em_op)op, .dtype = (em_dtype)dt};
                if (em__gpu_supports(be->gpu, &c)) CHECK(be->supports(&c));
            }
        CHECK(be->run != NULL);
        CHECK(be->gpu->launch && be->gpu->info && be->gpu->compile && be->gpu->launch_compiled &&
              be->gpu->release);
        CHECK(!strcmp(be->gpu->name, be->name));
    }
    CHECK(em__cpu_backend.gpu == NULL);
#ifdef EMBER_HAVE_CUDA_HEADERS
    CHECK(em__cuda_backend.gpu != NULL);
#else
    CHECK(em__cuda_backend.gpu == NULL && em__cuda_backend.run == NULL);
#endif
#ifdef EMBER_HAVE_OPENCL
    CHECK(em__backend_for(EM_OPENCL) == &em__opencl_backend && em__opencl_backend.gpu != NULL);
#endif
    /* no launcher, no users' kernels: a clear error, not a crash */
    CHECK(em_kernel_compile("KERNEL k(GLOBAL float *x) {}\n", "k", EM_DEVICE_CPU) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "cpu has no kernel compiler");
}

static void test_backend_checked(void) {
    CHECK(em__backend_checked(EM_DEVICE_CPU, "op") == &em__cpu_backend);
    CHECK(em__backend_checked(EM_DEVICE(EM_CPU, 1), "op") == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "op: device cpu:1 does not exist");
    CHECK(em__backend_checked(EM_DEVICE(EM_MPS, 0), "em_zeros") == NULL);
    CHECK_ERROR(EM_ERR_UNAVAILABLE, "em_zeros: mps is not available: MPS needs Apple Silicon and macOS");
    if (!em_device_available(EM_CUDA)) {
        CHECK(em__backend_checked(EM_DEVICE(EM_CUDA, 0), "em_ones") == NULL);
        CHECK_ERROR(EM_ERR_UNAVAILABLE, "em_ones: cuda is not available: ");
        CHECK(em_zeros(EM_SHAPE(2), EM_OPTS(.device = EM_DEVICE(EM_CUDA, 0))) == NULL);
        CHECK_ERROR(EM_ERR_UNAVAILABLE, "cuda is not available");
    }
    int n = em_device_count(EM_OPENCL);
    if (n > 0) {
        CHECK(em__backend_checked(EM_DEVICE(EM_OPENCL, n), "op") == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "does not exist");
    }
    /* -1 is the current device; an index below it names none (em_to moved tensors there) */
    CHECK(em__backend_checked(EM_DEVICE(EM_OPENCL, -5), "em_to") == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "em_to: invalid device index -5 for opencl");
    CHECK(em__backend_checked(EM_DEVICE(EM_CPU, -2), "op") == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "invalid device index -2 for cpu");
    em_tensor *t = em_ones(EM_SHAPE(2), EM_OPTS(0));
    CHECK(em_to(t, EM_DEVICE(EM_OPENCL, -5)) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "invalid device index -5");
    if (n > 0) {
        em_tensor *u = em_to(t, EM_DEVICE(EM_OPENCL, -1));   /* the current one */
        CHECK(u && em_device_of(u).index >= 0);
        em_release(u);
    }
    em_release(t);
    em_clear_error();
}

static void test_props(void) {
    em_device_props p;
    CHECK_OK(em_device_get_props(EM_DEVICE_CPU, &p));
    CHECK(!p.is_gpu);
    CHECK(p.compute_units >= 1);
    CHECK(p.name[0] != '\0');
    CHECK(em_device_get_props(EM_DEVICE(EM_MPS, 0), &p) == EM_ERR_UNAVAILABLE);
    em_clear_error();
    CHECK(em_device_get_props(EM_DEVICE_CPU, NULL) == EM_ERR_ARGUMENT);
    em_clear_error();
}

static void test_auto(void) {
    unsetenv("EMBER_DEVICE");
    em_device d = em_device_auto();
    const char *why = em_device_auto_reason();
    CHECK(why && *why);
    CHECK(strstr(why, em_device_str(d).s) == why); /* the reason starts with the choice */
    if (!em_device_available(EM_CUDA)) {
        CHECK(d.type != EM_CUDA && d.type != EM_MPS);
        if (d.type == EM_CPU) CHECK(strstr(why, "MPS needs Apple Silicon") != NULL);
    }
    if (d.type == EM_OPENCL) {
        em_device_props p;
        CHECK_OK(em_device_get_props(d, &p));
        CHECK(p.is_gpu);
    }
    CHECK(!em_failed());
}

static void test_auto_env(void) {
    setenv("EMBER_DEVICE", "cpu", 1);
    CHECK(em_device_auto().type == EM_CPU);
    CHECK(strstr(em_device_auto_reason(), "chosen by EMBER_DEVICE=cpu") != NULL);
    setenv("EMBER_DEVICE", "mps", 1);
    em_device d = em_device_auto();
    CHECK(d.type != EM_MPS);
    CHECK(strstr(em_device_auto_reason(), "EMBER_DEVICE=mps ignored") != NULL);
    CHECK(strstr(em_device_auto_reason(), "MPS needs Apple Silicon") != NULL);
    setenv("EMBER_DEVICE", "cuda:7", 1);
    d = em_device_auto();
    CHECK(!(d.type == EM_CUDA && d.index == 7));
    CHECK(strstr(em_device_auto_reason(), "EMBER_DEVICE=cuda:7 ignored") != NULL);
    setenv("EMBER_DEVICE", "banana", 1);
    em_device_auto();
    CHECK(strstr(em_device_auto_reason(), "invalid device string 'banana'") != NULL);
    CHECK(!em_failed()); /* the fallback leaves no error behind */
    /* A pending error is preserved through auto-selection. */
    em_error(EM_ERR_IO, "pending");
    em_device_auto();
    CHECK_ERROR(EM_ERR_IO, "pending");
    unsetenv("EMBER_DEVICE");
}

static void test_current_and_guard(void) {
    CHECK(em_device_current(EM_CPU).index == 0);
    CHECK_OK(em_device_set_current(EM_DEVICE_CPU));
    CHECK(em_device_set_current(EM_DEVICE(EM_MPS, 0)) == EM_ERR_UNAVAILABLE);
    em_clear_error();
    em_device_guard g = em_device_guard_begin(EM_DEVICE_CPU);
    CHECK(g.active);
    em_device_guard_end(g);
    g = em_device_guard_begin(EM_DEVICE(EM_MPS, 0)); /* fails: the guard is inactive and restores nothing */
    CHECK(!g.active);
    em_clear_error();
    em_device_guard_end(g);
    CHECK(em_device_current(EM_MPS).index == 0);
}

static void *read_current_opencl(void *arg) {
    (void)arg;
    return (void *)(intptr_t)em_device_current(EM_OPENCL).index;
}

/* Needs two devices of one type: ctest runs this program with POCL_DEVICES="pthread pthread"
 * (CMakeLists.txt, EMBER_TWO_POCL_TESTS). */
static void test_current_is_per_thread(void) {
    int n = em_device_count(EM_OPENCL);
    em_clear_error();
    if (n < 2) SKIP("needs two OpenCL devices, found %d (PoCL: POCL_DEVICES=\"pthread pthread\")", n);
    CHECK_OK(em_device_set_current(EM_DEVICE(EM_OPENCL, 1)));
    CHECK(em_device_current(EM_OPENCL).index == 1);
    CHECK(em_device_equal(EM_DEVICE(EM_OPENCL, -1), EM_DEVICE(EM_OPENCL, 1)));
    pthread_t th;
    void *idx = (void *)(intptr_t)-5;
    pthread_create(&th, NULL, read_current_opencl, NULL);
    pthread_join(th, &idx);
    CHECK((intptr_t)idx == 0);
    em_device_guard g = em_device_guard_begin(EM_DEVICE(EM_OPENCL, 0));
    CHECK(em_device_current(EM_OPENCL).index == 0);
    em_device_guard_end(g);
    CHECK(em_device_current(EM_OPENCL).index == 1);
    CHECK_OK(em_device_set_current(EM_DEVICE(EM_OPENCL, 0)));
}

static void test_synchronize(void) {
    CHECK_OK(em_device_synchronize(EM_DEVICE_CPU));
    CHECK(em_device_synchronize(EM_DEVICE(EM_MPS, 0)) == EM_ERR_UNAVAILABLE);
    em_clear_error();
}

static void test_threads(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(em_get_num_threads() == (cpus > 0 ? cpus : 1));
    em_set_num_threads(3);
    CHECK(em_get_num_threads() == 3);
    em_set_num_threads(0);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must be positive");
    CHECK(em_get_num_threads() == 3);
    em_set_num_threads((int)(cpus > 0 ? cpus : 1));
}

static void *count_devices(void *arg) {
    (void)arg;
    int n = em_device_count(EM_CPU) + em_device_count(EM_CUDA) * 0 + (em_device_available(EM_MPS) ? 100 : 0);
    return (void *)(intptr_t)n;
}

static void test_concurrent_first_use(void) {
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, count_devices, NULL);
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK((intptr_t)r == 1);
    }
}

int main(void) {
    RUN(test_concurrent_first_use); /* first: the backends' lazy init races here */
    RUN(test_parse);
    RUN(test_print);
    RUN(test_equal_resolve);
    RUN(test_availability);
    RUN(test_registry);
    RUN(test_backend_checked);
    RUN(test_props);
    RUN(test_auto);
    RUN(test_auto_env);
    RUN(test_current_and_guard);
    /* where ctest promised two OpenCL devices, having fewer is a failure, not a skip */
    const char *want = getenv("EMBER_TEST_OPENCL_DEVICES");
    if (want && em_device_available(EM_OPENCL)) CHECK(em_device_count(EM_OPENCL) == atoi(want));
    em_clear_error();
    RUN(test_current_is_per_thread);
    RUN(test_synchronize);
    RUN(test_threads);
    return test_summary();
}
