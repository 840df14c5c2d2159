/* The OpenCL backend's failure paths, on PoCL made to fail (tests/ocl_fault.h): each
 * injected error gives a clean Ember error (status, and a message naming the operation and
 * the OpenCL error), leaks no device memory, and the next operation works. Out-of-memory
 * errors from clCreateBuffer reach the caching allocator as EM_ERR_OUT_OF_MEMORY, so it
 * frees its cache and retries as PyTorch does. Failures during initialization (no
 * platform, no device, failing queries) run in child processes, since the device table is
 * built once per process. */
#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/opencl/opencl_internal.h"
#include "ocl_fault.h"
#include "test.h"

static const em_device D0 = {EM_OPENCL, 0}, D1 = {EM_OPENCL, 1};
static int g_ndev; /* OpenCL devices a child finds with a working driver */

/* ---- initialization, each in a fresh child process ---- */

static void child_no_platform(void) {
    fault_arm("clGetPlatformIDs", 0, -1, -1001);
    CHECK(!em_device_available(EM_OPENCL));
    CHECK(em_device_count(EM_OPENCL) == 0);
    const char *r = em_device_unavailable_reason(EM_OPENCL);
    CHECK(r && strstr(r, "no OpenCL platform") && strstr(r, "CL_PLATFORM_NOT_FOUND_KHR (-1001)"));
    /* an OpenCL tensor is refused with that reason, nothing aborts */
    CHECK(em_zeros(EM_SHAPE(2), EM_OPTS(.device = D0)) == NULL);
    CHECK(em_failed());
    em_clear_error();
}
static void child_platform_list_fails(void) {
    fault_arm("clGetPlatformIDs", 1, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_device_count(EM_OPENCL) == 0);
    const char *r = em_device_unavailable_reason(EM_OPENCL);
    CHECK(r && strstr(r, "clGetPlatformIDs failed"));
    em_clear_error();
}
static void child_no_device(void) {
    fault_arm("clGetDeviceIDs", 0, -1, CL_DEVICE_NOT_FOUND);
    CHECK(em_device_count(EM_OPENCL) == 0);
    const char *r = em_device_unavailable_reason(EM_OPENCL);
    CHECK(r && strstr(r, "no usable OpenCL device"));
    em_clear_error();
}
static void child_device_list_fails(void) {
    fault_arm("clGetDeviceIDs", 1, -1, CL_OUT_OF_RESOURCES);
    CHECK(em_device_count(EM_OPENCL) == 0);
    em_clear_error();
}
static void child_no_context(void) {
    fault_arm("clCreateContext", 0, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_device_count(EM_OPENCL) == 0);
    const char *r = em_device_unavailable_reason(EM_OPENCL);
    CHECK(r && strstr(r, "no usable OpenCL device"));
    em_clear_error();
}
static void child_no_queue(void) {
    /* the first device gets no queue: it is left out, the second (if any) is kept */
    fault_arm("clCreateCommandQueue", 0, 1, CL_OUT_OF_RESOURCES);
    int n = em_device_count(EM_OPENCL);
    CHECK(fault_clear() == 1);
    CHECK(n == g_ndev - 1);
    em_clear_error();
}
static void child_no_queues(void) {
    /* no device gets a queue: none is usable (and the context is given back) */
    fault_arm("clCreateCommandQueue", 0, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_device_count(EM_OPENCL) == 0);
    const char *r = em_device_unavailable_reason(EM_OPENCL);
    CHECK(r && strstr(r, "no usable OpenCL device on"));
    em_clear_error();
}
static void child_queries_fail(void) {
    /* every device query fails: the device is listed with unknown properties, not used
     * with garbage; an allocation is refused (the size limit is unknown, 0) */
    fault_arm("clGetDeviceInfo", 0, -1, CL_INVALID_DEVICE);
    CHECK(em_device_count(EM_OPENCL) >= 1);
    em_device_props p;
    CHECK_OK(em_device_get_props(D0, &p));
    CHECK(strcmp(p.name, "?") == 0 && strcmp(p.vendor, "?") == 0);
    CHECK(p.total_memory == 0 && !p.is_gpu);
    ocl_device *d = em__ocl_device(0);
    CHECK(d && !d->has_f64 && d->max_alloc == 0);
    CHECK(em_zeros(EM_SHAPE(4), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "out of memory");
    fault_clear();
}
static void child_library_build_fails(void) {
    /* Ember's own program does not build: the op fails naming the build and the error,
     * and the failure is kept (later ops report it without rebuilding) */
    CHECK(em_device_count(EM_OPENCL) >= 1);
    const float host[8] = {0};
    em_tensor *a = em_from_data(host, EM_F32, EM_SHAPE(8), EM_OPTS(.device = D0)); /* no kernel */
    CHECK(a != NULL);
    fault_arm("clBuildProgram", 0, -1, CL_BUILD_PROGRAM_FAILURE);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "building Ember's kernels for opencl:0 failed (CL_BUILD_PROGRAM_FAILURE");
    int builds = fault_clear();
    CHECK(builds >= 1);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "CL_BUILD_PROGRAM_FAILURE");
    em_release(a);
}
static void child_library_build_out_of_memory(void) {
    /* the driver runs out of memory while building: that op fails, the next one builds */
    CHECK(em_device_count(EM_OPENCL) >= 1);
    const float host[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    em_tensor *a = em_from_data(host, EM_F32, EM_SHAPE(8), EM_OPTS(.device = D0));
    fault_arm("clBuildProgram", 0, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "building Ember's kernels for opencl:0 failed (CL_OUT_OF_HOST_MEMORY");
    fault_clear();
    em_scope s = em_scope_begin();
    em_tensor *b = em_add_scalar(a, 1.0);
    CHECK(b && em_item(em_sum(b, EM_ALL_DIMS, false)) == 16.0);
    em_clear_error();
    em_scope_end(s);
    em_release(a);
}
static void child_library_source_fails(void) {
    CHECK(em_device_count(EM_OPENCL) >= 1);
    const float host[8] = {0};
    em_tensor *a = em_from_data(host, EM_F32, EM_SHAPE(8), EM_OPTS(.device = D0));
    fault_arm("clCreateProgramWithSource", 0, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "clCreateProgramWithSource for Ember's kernels");
    fault_clear();
    /* not kept: the next op builds the program and runs */
    em_scope s = em_scope_begin();
    em_tensor *b = em_add_scalar(a, 1.0);
    CHECK(b && em_item(em_sum(b, EM_ALL_DIMS, false)) == 8.0);
    em_clear_error();
    em_scope_end(s);
    em_release(a);
}

static void in_child(void (*fn)(void)) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        exit(test__checks_failed_in_case ? 1 : 0); /* exit, not _exit: coverage data is written */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_init_failures(void) {
    in_child(child_no_platform);
    in_child(child_platform_list_fails);
    in_child(child_no_device);
    in_child(child_device_list_fails);
    in_child(child_no_context);
    in_child(child_no_queue);
    in_child(child_no_queues);
    in_child(child_queries_fail);
    in_child(child_library_build_fails);
    in_child(child_library_source_fails);
    in_child(child_library_build_out_of_memory);
}

/* ---- operations on a working device ---- */

static float sum_of(em_tensor *t) { return (float)em_item(em_sum(t, EM_ALL_DIMS, false)); }

static void test_error_names(void) {
    const cl_int codes[] = {CL_SUCCESS, CL_DEVICE_NOT_FOUND, CL_DEVICE_NOT_AVAILABLE,
        CL_COMPILER_NOT_AVAILABLE, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES,
        CL_OUT_OF_HOST_MEMORY, CL_MEM_COPY_OVERLAP, CL_BUILD_PROGRAM_FAILURE, CL_INVALID_VALUE,
        CL_INVALID_DEVICE, CL_INVALID_CONTEXT, CL_INVALID_COMMAND_QUEUE, CL_INVALID_MEM_OBJECT,
        CL_INVALID_BINARY, CL_INVALID_BUILD_OPTIONS, CL_INVALID_PROGRAM,
        CL_INVALID_PROGRAM_EXECUTABLE, CL_INVALID_KERNEL_NAME, CL_INVALID_KERNEL,
        CL_INVALID_ARG_INDEX, CL_INVALID_ARG_VALUE, CL_INVALID_ARG_SIZE, CL_INVALID_KERNEL_ARGS,
        CL_INVALID_WORK_DIMENSION, CL_INVALID_WORK_GROUP_SIZE, CL_INVALID_WORK_ITEM_SIZE,
        CL_INVALID_GLOBAL_OFFSET, CL_INVALID_EVENT_WAIT_LIST, CL_INVALID_OPERATION,
        CL_INVALID_BUFFER_SIZE, CL_INVALID_GLOBAL_WORK_SIZE,
        CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, CL_MISALIGNED_SUB_BUFFER_OFFSET};
    /* each code has its own name, with its number */
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        char want[16];
        snprintf(want, sizeof want, "(%d)", (int)codes[i]);
        const char *n = em__ocl_err_name(codes[i]);
        CHECK(strncmp(n, "CL_", 3) == 0 && strstr(n, want));
    }
    CHECK(strcmp(em__ocl_err_name(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES (-5)") == 0);
    CHECK(strcmp(em__ocl_err_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR (-1001)") == 0);
    CHECK(strcmp(em__ocl_err_name(-9999), "unknown OpenCL error (-9999)") == 0);
}

static void test_alloc_failures(void) {
    em_scope s = em_scope_begin();
    CHECK_OK(em_memory_empty_cache(D0));
    int64_t before = em_memory_allocated(D0);
    /* the device is out of memory for good: an out-of-memory error (after the allocator's
     * retry), no allocation left behind */
    em_memory_stats st0, st1;
    CHECK_OK(em_memory_get_stats(D0, &st0));
    fault_arm("clCreateBuffer", 0, -1, CL_MEM_OBJECT_ALLOCATION_FAILURE);
    CHECK(em_zeros(EM_SHAPE(1 << 20), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK(fault_clear() >= 2);
    CHECK_OK(em_memory_get_stats(D0, &st1));
    CHECK(st1.num_ooms == st0.num_ooms + 1);
    CHECK(st1.num_alloc_retries == st0.num_alloc_retries + 1);
    CHECK(em_memory_allocated(D0) == before);
    /* CL_OUT_OF_RESOURCES is out of memory too */
    fault_arm("clCreateBuffer", 0, -1, CL_OUT_OF_RESOURCES);
    CHECK(em_zeros(EM_SHAPE(1 << 20), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "out of memory");
    fault_clear();
    /* a transient failure: the allocator frees its cache and retries, and succeeds with no
     * error left pending; a cached segment is what the retry gives back */
    em_scope inner = em_scope_begin();
    CHECK(em_zeros(EM_SHAPE(3 << 20), EM_OPTS(.device = D0)) != NULL);
    em_scope_end(inner);
    CHECK_OK(em_memory_get_stats(D0, &st0));
    CHECK(st0.cached_segments >= 1);
    fault_arm("clCreateBuffer", 0, 1, CL_MEM_OBJECT_ALLOCATION_FAILURE);
    em_tensor *t = em_full(EM_SHAPE(5 << 20), 2.0, EM_OPTS(.device = D0));
    CHECK(fault_clear() == 1);
    CHECK(t != NULL && !em_failed());
    CHECK_OK(em_memory_get_stats(D0, &st1));
    CHECK(st1.num_alloc_retries == st0.num_alloc_retries + 1);
    CHECK(st1.num_ooms == st0.num_ooms);
    if (t) CHECK_NEAR(sum_of(t), 2.0 * (5 << 20), 1e3);
    /* an error that is not about memory is a backend error naming the call and the code */
    CHECK_OK(em_memory_empty_cache(D0));
    fault_arm("clCreateBuffer", 0, -1, CL_INVALID_CONTEXT);
    CHECK(em_zeros(EM_SHAPE(1 << 20), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "clCreateBuffer of");
    fault_clear();
    fault_arm("clCreateBuffer", 0, -1, CL_INVALID_VALUE);
    CHECK(em_zeros(EM_SHAPE(1 << 20), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "CL_INVALID_VALUE (-30)");
    fault_clear();
    /* and the device works afterwards */
    em_tensor *ok = em_full(EM_SHAPE(1 << 20), 1.0, EM_OPTS(.device = D0));
    CHECK(ok && sum_of(ok) == (float)(1 << 20));
    em_scope_end(s);
    CHECK(em_memory_allocated(D0) == before);
}

static void test_copy_failures(void) {
    em_scope s = em_scope_begin();
    int64_t before = em_memory_allocated(D0);
    float host[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    fault_arm("clEnqueueWriteBuffer", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(em_from_data(host, EM_F32, EM_SHAPE(64), EM_OPTS(.device = D0)) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "copy host to device failed: CL_OUT_OF_RESOURCES (-5)");
    fault_clear();
    CHECK(em_memory_allocated(D0) == before); /* the half-made tensor's memory came back */
    em_tensor *t = em_from_data(host, EM_F32, EM_SHAPE(64), EM_OPTS(.device = D0));
    CHECK(t != NULL);
    float back[64] = {0};
    fault_arm("clEnqueueReadBuffer", 0, 1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_copy_to_host(t, back, sizeof back) != EM_OK);
    CHECK_ERROR(EM_ERR_BACKEND, "copy device to host failed: CL_OUT_OF_HOST_MEMORY");
    fault_clear();
    CHECK_OK(em_copy_to_host(t, back, sizeof back));
    CHECK(memcmp(host, back, sizeof back) == 0);
    /* a copy on the device (the backend's entry: Ember's ops copy with kernels) */
    const em_backend *be = &em__opencl_backend;
    void *h1 = NULL, *h2 = NULL;
    CHECK_OK(be->raw_alloc(0, 256, &h1));
    CHECK_OK(be->raw_alloc(0, 256, &h2));
    CHECK_OK(be->copy_h2d(0, h1, 0, host, 256, false));
    fault_arm("clEnqueueCopyBuffer", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(be->copy_d2d(0, h2, 0, 0, h1, 0, 256) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "copy on device failed: CL_OUT_OF_RESOURCES");
    fault_clear();
    CHECK_OK(be->copy_d2d(0, h2, 0, 0, h1, 0, 256));
    memset(back, 0, sizeof back);
    CHECK_OK(be->copy_d2h(0, back, h2, 0, 256));
    CHECK(memcmp(host, back, 256) == 0);
    CHECK(be->copy_d2d(0, h2, 0, 9, h1, 0, 256) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl:9 does not exist");
    be->raw_free(0, h1);
    be->raw_free(0, h2);
    em_scope_end(s);
}

static void test_two_device_copies(void) {
    if (em_device_count(EM_OPENCL) < 2) SKIP("one OpenCL device (POCL_DEVICES gives two)");
    em_scope s = em_scope_begin();
    em_tensor *a = em_full(EM_SHAPE(1000), 3.0, EM_OPTS(.device = D0));
    const char *calls[] = {"clEnqueueMarkerWithWaitList", "clEnqueueCopyBuffer",
                           "clEnqueueBarrierWithWaitList"};
    for (int i = 0; i < 3; i++) {
        fault_arm(calls[i], 0, 1, CL_OUT_OF_RESOURCES);
        CHECK(em_to(a, D1) == NULL);
        CHECK_ERROR(EM_ERR_BACKEND, "copy between devices failed: CL_OUT_OF_RESOURCES");
        CHECK(fault_clear() == 1);
    }
    em_tensor *b = em_to(a, D1);
    CHECK(b && sum_of(b) == 3000.0f);
    /* devices of two platforms copy through host memory: device 1 is made to look like
     * another platform's (its buffers still belong to the one context, so the staged copy
     * is valid) */
    ocl_device *d1 = em__ocl_device(1);
    int group = d1->ctx_group;
    d1->ctx_group = group + 100;
    em_tensor *c = em_to(a, D1);
    CHECK(c && sum_of(c) == 3000.0f);
    fault_arm("clEnqueueWriteBuffer", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(em_to(a, D1) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "copy between platforms failed: CL_OUT_OF_RESOURCES");
    fault_clear();
    d1->ctx_group = group;
    em_scope_end(s);
}

static void test_launch_failures(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_full(EM_SHAPE(256), 1.0, EM_OPTS(.device = D0));
    CHECK(sum_of(a) == 256.0f); /* the library is built */
    fault_arm("clEnqueueNDRangeKernel", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "launching kernel");
    fault_clear();
    fault_arm("clSetKernelArg", 0, 1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "clSetKernelArg failed: CL_OUT_OF_HOST_MEMORY");
    fault_clear();
    fault_arm("clSetKernelArg", 0, 1, CL_INVALID_ARG_SIZE);
    CHECK(em_add_scalar(a, 1.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "another type or size");
    fault_clear();
    /* through the launcher: a kernel the program does not have is not supported, naming
     * it; a float64 one on a device without float64 says so; too many threads per block */
    const size_t one[3] = {1, 1, 1};
    CHECK(em__ocl_gpu.launch(0, "no_such_kernel", one, one, 0, NULL, "test op") == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "Ember has no kernel 'no_such_kernel' (CL_INVALID_KERNEL_NAME");
    ocl_device *d = em__ocl_device(0);
    bool had = d->has_f64;
    d->has_f64 = false;
    CHECK(em__ocl_gpu.launch(0, "no_such_kernel_f64", one, one, 0, NULL, "test op") == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "no double precision");
    d->has_f64 = had;
    const size_t big[3] = {d->max_block + 1, 1, 1};
    CHECK(em__ocl_gpu.launch(0, "no_such_kernel", one, big, 0, NULL, "test op") == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "threads per block");
    CHECK(em__ocl_gpu.launch(7, "no_such_kernel", one, one, 0, NULL, "test op") == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl:7 does not exist");
    /* a queue that reports failed work names the ops queued last */
    em_tensor *b = em_add_scalar(a, 2.0);
    CHECK(b != NULL);
    fault_arm("clFinish", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(em_device_synchronize(D0) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "queued work failed: CL_OUT_OF_RESOURCES (-5); last ops queued");
    fault_clear();
    /* everything still works */
    CHECK_OK(em_device_synchronize(D0));
    CHECK(sum_of(em_exp(a)) > 695.0f && sum_of(b) == 768.0f);
    em_scope_end(s);
}

static void test_events(void) {
    const em_backend *be = &em__opencl_backend;
    void *ev = NULL;
    fault_arm("clEnqueueMarkerWithWaitList", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(be->event_record(0, &ev) == EM_ERR_BACKEND && ev == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "queueing an event: CL_OUT_OF_RESOURCES");
    fault_clear();
    fault_arm("clFlush", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(be->event_record(0, &ev) == EM_ERR_BACKEND && ev == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "queueing an event");
    fault_clear();
    CHECK(be->event_record(5, &ev) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl:5 does not exist");
    CHECK_OK(be->event_record(0, &ev));
    bool done = true;
    fault_arm("clGetEventInfo", 0, 1, CL_INVALID_EVENT);
    CHECK(be->event_query(ev, &done) == EM_ERR_BACKEND && !done);
    CHECK_ERROR(EM_ERR_BACKEND, "queued work failed");
    fault_clear();
    fault_arm("clWaitForEvents", 0, 1, CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    CHECK(be->event_synchronize(ev) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST");
    fault_clear();
    CHECK_OK(be->event_synchronize(ev));
    CHECK_OK(be->event_query(ev, &done));
    CHECK(done);
    be->event_destroy(ev);
    be->event_destroy(NULL);
}

static const char *SCALE =
    "KERNEL scale(GLOBAL float *x, float f, int n) {\n"
    "    i64 i = GLOBAL_ID(0);\n"
    "    if (i < n) x[i] *= f;\n"
    "}\n";

/* Files named *.bin in the private cache (EMBER_CACHE_DIR). */
static int cached_binaries(void) {
    DIR *d = opendir(getenv("EMBER_CACHE_DIR"));
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        n += len > 4 && !strcmp(e->d_name + len - 4, ".bin");
    }
    closedir(d);
    return n;
}

/* A user's kernel is cached as the driver's binary; a cached binary the driver refuses, or
 * that does not build, is rebuilt from source. */
static void test_user_kernel_cache(void) {
    static const char *CUBE =
        "KERNEL cube(GLOBAL float *x, int n) {\n"
        "    i64 i = GLOBAL_ID(0);\n"
        "    if (i < n) x[i] = x[i] * x[i] * x[i];\n"
        "}\n";
    int before = cached_binaries();
    em_kernel *k = em_kernel_compile(CUBE, "cube", D0); /* built and cached */
    CHECK(k != NULL);
    em_kernel_free(k);
    if (cached_binaries() == before) {
        em_device_props props = {0};
        em_device_get_props(D0, &props);
        SKIP("%s exported no program binary (CL_PROGRAM_BINARIES), so there is no cached binary to refuse",
             props.name);
    }
    fault_arm("clCreateProgramWithBinary", 0, 1, CL_INVALID_BINARY);
    k = em_kernel_compile(CUBE, "cube", D0);
    CHECK(k != NULL && fault_clear() == 1);
    em_kernel_free(k);
    fault_arm("clBuildProgram", 0, 1, CL_INVALID_BINARY);
    k = em_kernel_compile(CUBE, "cube", D0);
    CHECK(k != NULL && fault_clear() == 1);
    em_kernel_free(k);
}

static void test_user_kernels(void) {
    em_scope s = em_scope_begin();
    /* building fails: the error names the kernel and the OpenCL error; nothing cached */
    fault_arm("clBuildProgram", 0, -1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_kernel_compile(SCALE, "scale", D0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "building kernel 'scale' for opencl:0 failed (CL_OUT_OF_HOST_MEMORY");
    fault_clear();
    fault_arm("clCreateProgramWithSource", 0, 1, CL_OUT_OF_HOST_MEMORY);
    CHECK(em_kernel_compile(SCALE, "scale", D0) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "clCreateProgramWithSource for kernel 'scale'");
    fault_clear();
    /* the binary cannot be exported: it works, uncached */
    fault_arm("clGetProgramInfo", 0, 1, CL_OUT_OF_HOST_MEMORY);
    em_kernel *k = em_kernel_compile(SCALE, "scale", D0);
    CHECK(k != NULL && fault_clear() == 1);
    em_kernel_free(k);
    k = em_kernel_compile(SCALE, "scale", D0);
    CHECK(k != NULL);
    if (!k) {
        em_scope_end(s);
        return;
    }
    /* launches: the sub-buffer for a view, the enqueue */
    em_tensor *x = em_full(EM_SHAPE(1024), 1.0, EM_OPTS(.device = D0));
    em_tensor *tail = em_narrow(x, 0, 512, 512); /* 2048 bytes in: aligned */
    fault_arm("clCreateSubBuffer", 0, 1, CL_MISALIGNED_SUB_BUFFER_OFFSET);
    CHECK(em_kernel_launch(k, EM_DIM3(2), EM_DIM3(256),
                           EM_KARGS(em_arg_tensor(tail), em_arg_f32(2.0f), em_arg_i32(512))) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "clCreateSubBuffer failed: CL_MISALIGNED_SUB_BUFFER_OFFSET");
    fault_clear();
    fault_arm("clEnqueueNDRangeKernel", 0, 1, CL_OUT_OF_RESOURCES);
    CHECK(em_kernel_launch(k, EM_DIM3(2), EM_DIM3(256),
                           EM_KARGS(em_arg_tensor(tail), em_arg_f32(2.0f), em_arg_i32(512))) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "em_kernel_launch(scale) on opencl:0 failed: CL_OUT_OF_RESOURCES");
    fault_clear();
    fault_arm("clEnqueueNDRangeKernel", 0, 1, CL_INVALID_KERNEL_ARGS);
    CHECK(em_kernel_launch(k, EM_DIM3(4), EM_DIM3(256),
                           EM_KARGS(em_arg_tensor(x), em_arg_f32(2.0f), em_arg_i32(1024))) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "fewer arguments");
    fault_clear();
    /* none of the failed launches ran; this one does */
    CHECK_OK(em_kernel_launch(k, EM_DIM3(2), EM_DIM3(256),
                              EM_KARGS(em_arg_tensor(tail), em_arg_f32(2.0f), em_arg_i32(512))));
    CHECK(sum_of(x) == 1536.0f);
    em_kernel_free(k);
    em_scope_end(s);
}

/* `test_opencl_fault <case names>` runs only the named cases (while debugging one) */
static const char *g_only;
#define RUN_SEL(t) do { if (!g_only || strstr(g_only, #t)) RUN(t); } while (0)
int main(int argc, char **argv) {
    g_only = argc > 1 ? argv[1] : NULL;
    /* two PoCL devices unless the environment says otherwise; a private program cache */
    setenv("POCL_DEVICES", "pthread pthread", 0);
    char cache[64] = "/tmp/ember-test-fault-XXXXXX";
    if (!mkdtemp(cache)) return 1;
    setenv("EMBER_CACHE_DIR", cache, 1);
    /* the children first: this process has not started OpenCL yet; a child looks for a
     * device, since the ones that break initialization expect a working driver */
    fflush(stdout);
    pid_t probe = fork();
    if (probe == 0) exit(em_device_count(EM_OPENCL) < 100 ? em_device_count(EM_OPENCL) : 100);
    int status = 0;
    bool have = probe > 0 && waitpid(probe, &status, 0) == probe && WIFEXITED(status) &&
                WEXITSTATUS(status) > 0;
    g_ndev = have ? WEXITSTATUS(status) : 0;
    if (have) RUN_SEL(test_init_failures);
    if (!have || em_device_count(EM_OPENCL) == 0) {
        test_skip_case("OpenCL fault tests", "no OpenCL device: %s",
                       em_device_unavailable_reason(EM_OPENCL));
        em_clear_error();
    } else {
        RUN_SEL(test_error_names);
        RUN_SEL(test_alloc_failures);
        RUN_SEL(test_copy_failures);
        RUN_SEL(test_two_device_copies);
        RUN_SEL(test_launch_failures);
        RUN_SEL(test_events);
        RUN_SEL(test_user_kernels);
        RUN_SEL(test_user_kernel_cache);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
    return test_summary();
}
