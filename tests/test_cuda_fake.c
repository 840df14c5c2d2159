/* The CUDA backend's logic, run without a GPU: a fake driver (and fake NVRTC/NVML)
 * installed in place of the dlopen'ed libraries. "Device memory" is host memory, so
 * copies can be checked byte for byte; launches are recorded, not run.
 * What this proves: lazy contexts, the reason strings, error translation, the names in
 * synchronization errors, copies and peer ordering, props fallbacks, the compile target
 * choice, program lookup, the disk cache. What it cannot: that real kernels run right. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_smi.h"
#include "kernels/kernel_text.h"

static bool starts(const char *s, const char *prefix) {
    return s && !strncmp(s, prefix, strlen(prefix));
}

#include "cuda_fake_driver.h"

/* ---- fake NVRTC: "compiles" to a short text naming the program and target ---- */
typedef struct fake_prog { char name[64]; char arch[64]; } fake_prog;
static int nvrtc_compiles;
static char last_fmad[32]; /* the --fmad= option of the last compile, "" if none */
static nvrtcResult n_version(int *ma, int *mi) { *ma = 13; *mi = 0; return NVRTC_SUCCESS; }
static const char *n_err(nvrtcResult r) { return r == NVRTC_SUCCESS ? "NVRTC_SUCCESS" : "NVRTC_ERROR"; }
static nvrtcResult n_create(nvrtcProgram *p, const char *src, const char *name, int nh,
                            const char *const *h, const char *const *hn) {
    (void)src; (void)nh; (void)h; (void)hn;
    fake_prog *fp = calloc(1, sizeof *fp);
    snprintf(fp->name, sizeof fp->name, "%s", name);
    *p = (nvrtcProgram)fp;
    return NVRTC_SUCCESS;
}
static nvrtcResult n_destroy(nvrtcProgram *p) { free(*p); *p = NULL; return NVRTC_SUCCESS; }
/* A compile can be held (as a long NVRTC run): compile_hold makes it wait for release. */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static bool compile_hold, compile_held;
static nvrtcResult n_compile(nvrtcProgram p, int n, const char *const *opts) {
    fake_prog *fp = (fake_prog *)p;
    pthread_mutex_lock(&hold_lock);
    if (compile_hold) {
        compile_held = true;
        pthread_cond_broadcast(&hold_cond);
        while (compile_hold) pthread_cond_wait(&hold_cond, &hold_lock);
    }
    pthread_mutex_unlock(&hold_lock);
    nvrtc_compiles++;
    last_fmad[0] = '\0';
    for (int i = 0; i < n; i++)
        if (starts(opts[i], "--fmad=")) snprintf(last_fmad, sizeof last_fmad, "%s", opts[i]);
    for (int i = 0; i < n; i++)
        if (starts(opts[i], "--gpu-architecture=")) snprintf(fp->arch, sizeof fp->arch, "%s", opts[i] + 19);
    return NVRTC_SUCCESS;
}
static nvrtcResult n_size(nvrtcProgram p, size_t *n) {
    fake_prog *fp = (fake_prog *)p;
    *n = strlen("fake ") + strlen(fp->name) + 1 + strlen(fp->arch) + 1;
    return NVRTC_SUCCESS;
}
static nvrtcResult n_code(nvrtcProgram p, char *out) {
    fake_prog *fp = (fake_prog *)p;
    sprintf(out, "fake %s %s", fp->name, fp->arch);
    return NVRTC_SUCCESS;
}
static nvrtcResult n_log_size(nvrtcProgram p, size_t *n) { (void)p; *n = 1; return NVRTC_SUCCESS; }
static nvrtcResult n_log(nvrtcProgram p, char *l) { (void)p; l[0] = 0; return NVRTC_SUCCESS; }
static nvrtcResult n_narchs(int *n) { *n = 4; return NVRTC_SUCCESS; }
static nvrtcResult n_archs(int *a) { a[0] = 75; a[1] = 80; a[2] = 86; a[3] = 90; return NVRTC_SUCCESS; }

static em_nvrtc_api fake_nvrtc(void) {
    em_nvrtc_api a;
    memset(&a, 0, sizeof a);
    a.nvrtcVersion = n_version; a.nvrtcGetErrorString = n_err; a.nvrtcCreateProgram = n_create;
    a.nvrtcDestroyProgram = n_destroy; a.nvrtcCompileProgram = n_compile;
    a.nvrtcGetPTXSize = n_size; a.nvrtcGetPTX = n_code; a.nvrtcGetCUBINSize = n_size;
    a.nvrtcGetCUBIN = n_code; a.nvrtcGetProgramLogSize = n_log_size; a.nvrtcGetProgramLog = n_log;
    a.nvrtcGetNumSupportedArchs = n_narchs; a.nvrtcGetSupportedArchs = n_archs;
    return a;
}

/* ---- fake NVML: knows free memory before any context exists ---- */
static em_nvml_return m_ok(void) { return EM_NVML_SUCCESS; }
static const char *m_err(em_nvml_return r) { (void)r; return "fake"; }
static em_nvml_return m_driver(char *v, unsigned int n) { snprintf(v, n, "550.54.15"); return EM_NVML_SUCCESS; }
static em_nvml_return m_by_bus(const char *bus, em_nvml_device *d) {
    *d = (em_nvml_device)(uintptr_t)(bus[6] - '0' + 1); /* "0000:0N:00.0" */
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_mem(em_nvml_device d, em_nvml_memory *m) {
    m->total = (unsigned long long)16 << 30;
    m->free = (unsigned long long)(uintptr_t)d << 30; /* device N has N+1 GiB free */
    m->used = m->total - m->free;
    return EM_NVML_SUCCESS;
}
/* NVML numbers GPUs by bus in reverse of the fake CUDA order: NVML 0 is cuda:1 */
static em_nvml_return m_count(unsigned int *n) { *n = NDEV; return EM_NVML_SUCCESS; }
static em_nvml_return m_by_index(unsigned int i, em_nvml_device *d) {
    *d = (em_nvml_device)(uintptr_t)(NDEV - i);
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_name(em_nvml_device d, char *name, unsigned int n) {
    snprintf(name, n, "Fake GPU %d", (int)(uintptr_t)d - 1);
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_util(em_nvml_device d, em_nvml_utilization *u) {
    u->gpu = 40 + (unsigned)(uintptr_t)d;
    u->memory = 7;
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_temp(em_nvml_device d, int sensor, unsigned int *t) {
    (void)d;
    *t = sensor == EM_NVML_TEMPERATURE_GPU ? 33 : 0;
    return EM_NVML_SUCCESS;
}
/* v2: used leaves out 1 GiB the driver reserves; the struct's version must be v2's */
static em_nvml_return m_mem_v2(em_nvml_device d, em_nvml_memory_v2 *m) {
    if (m->version != ((unsigned)sizeof(em_nvml_memory_v2) | 2u << 24)) return 2; /* INVALID_ARGUMENT */
    m->total = (unsigned long long)16 << 30;
    m->free = (unsigned long long)(uintptr_t)d << 30;
    m->reserved = (unsigned long long)1 << 30;
    m->used = m->total - m->free - m->reserved;
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_temp_v(em_nvml_device d, em_nvml_temperature *t) {
    (void)d;
    if (t->version != ((unsigned)sizeof(em_nvml_temperature) | 1u << 24) || t->sensor_type != 0) return 2;
    t->temperature = 41;
    return EM_NVML_SUCCESS;
}
static em_nvml_return m_power(em_nvml_device d, unsigned int *mw) { (void)d; *mw = 68250; return EM_NVML_SUCCESS; }
static em_nvml_return m_not_supported(em_nvml_device d, unsigned int *mw) { (void)d; (void)mw; return 3; }
static em_nvml_return m_cc(em_nvml_device d, int *ma, int *mi) { (void)d; *ma = 8; *mi = 6; return EM_NVML_SUCCESS; }
static em_nvml_return m_cuda_version(int *v) { *v = 12040; return EM_NVML_SUCCESS; }

static em_nvml_api fake_nvml(void) {
    em_nvml_api a;
    memset(&a, 0, sizeof a);
    a.nvmlInit_v2 = m_ok; a.nvmlShutdown = m_ok; a.nvmlErrorString = m_err;
    a.nvmlSystemGetDriverVersion = m_driver; a.nvmlDeviceGetHandleByPciBusId_v2 = m_by_bus;
    a.nvmlDeviceGetMemoryInfo = m_mem; a.nvmlDeviceGetCount_v2 = m_count;
    a.nvmlDeviceGetHandleByIndex_v2 = m_by_index; a.nvmlDeviceGetName = m_name;
    a.nvmlDeviceGetUtilizationRates = m_util; a.nvmlDeviceGetTemperature = m_temp;
    a.nvmlDeviceGetPowerUsage = m_power; a.nvmlDeviceGetEnforcedPowerLimit = m_not_supported;
    a.nvmlDeviceGetCudaComputeCapability = m_cc; a.nvmlSystemGetCudaDriverVersion_v2 = m_cuda_version;
    return a;
}

static em_cu_api g_fake_cu;
static em_nvrtc_api g_fake_nvrtc;
static em_nvml_api g_fake_nvml;
static char g_cache_dir[] = "/tmp/ember-cuda-fake-XXXXXX";

/* A fresh backend over the fakes; nvml may be left out. */
static void install(bool with_nvml) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)12 << 30;
    g_fake_cu = fake_cu();
    g_fake_nvrtc = fake_nvrtc();
    g_fake_nvml = fake_nvml();
    em_cuda_fake_libs libs = {
        .cu = &g_fake_cu, .nvrtc = &g_fake_nvrtc, .cublas = NULL,
        .cublas_reason = "libcublas not found (fake)", .nvml = with_nvml ? &g_fake_nvml : NULL,
        .nvml_reason = "libnvidia-ml.so.1 not found (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static void test_reason_no_driver(void) {
    em__cuda_backend_reset();
    em_cuda_fake_libs libs = {.cu_reason = "no driver: libcuda.so.1 not found (looked in X)"};
    em__cuda_loader_use_fakes(&libs);
    CHECK(em__cuda_backend.init() == EM_ERR_UNAVAILABLE);
    CHECK(strstr(em__cuda_backend.unavailable_reason(), "no driver: libcuda.so.1 not found"));
    CHECK(em__cuda_backend.device_count() == 0);
    CHECK(!em_failed()); /* unavailability is a status, not a recorded error */
}

static void test_reason_no_device(void) {
    install(true);
    F.init_result = CUDA_ERROR_NO_DEVICE;
    CHECK(em__cuda_backend.init() == EM_ERR_UNAVAILABLE);
    const char *r = em__cuda_backend.unavailable_reason();
    CHECK(starts(r, "no device: cuInit returned CUDA_ERROR_NO_DEVICE (no CUDA-capable device"));
    CHECK(em__cuda_backend.device_count() == 0);
}

static void test_reason_strings(void) {
    char buf[256];
    em__cuda_init_reason(CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "stub", buf, sizeof buf);
    CHECK(starts(buf, "no driver: cuInit returned CUDA_ERROR_STUB_LIBRARY"));
    CHECK(strstr(buf, "stub for linking"));
    em__cuda_init_reason(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "X", "y", buf, sizeof buf);
    CHECK(starts(buf, "no driver:"));
    em__cuda_init_reason(CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error", buf, sizeof buf);
    CHECK(!strcmp(buf, "driver failed: cuInit returned CUDA_ERROR_UNKNOWN (unknown error)"));
}

static void test_error_translation(void) {
    install(true);
    CHECK(!strcmp(em__cu_name(CUDA_ERROR_ILLEGAL_ADDRESS), "CUDA_ERROR_ILLEGAL_ADDRESS"));
    CHECK(!strcmp(em__cu_desc(CUDA_ERROR_OUT_OF_MEMORY), "out of memory"));
    CHECK(strstr(em__cu_name((CUresult)123456), "unknown"));
    CHECK(em__cu_status(CUDA_ERROR_OUT_OF_MEMORY) == EM_ERR_OUT_OF_MEMORY);
    CHECK(em__cu_status(CUDA_ERROR_INVALID_DEVICE) == EM_ERR_DEVICE);
    CHECK(em__cu_status(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) == EM_ERR_NOT_SUPPORTED);
    CHECK(em__cu_status(CUDA_ERROR_LAUNCH_FAILED) == EM_ERR_BACKEND);
    CHECK(em__cu_is_sticky(CUDA_ERROR_ILLEGAL_ADDRESS) && !em__cu_is_sticky(CUDA_ERROR_OUT_OF_MEMORY));
    CHECK(em__cu_fail(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "cuda: loading x") == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "cuda: loading x: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (");
    em__cu_fail(CUDA_ERROR_ILLEGAL_ADDRESS, "op");
    CHECK_ERROR(EM_ERR_BACKEND, "unusable, restart the process");
}

static void test_enumeration_creates_no_context(void) {
    install(true);
    CHECK(em__cuda_backend.init() == EM_OK);
    CHECK(em__cuda_backend.device_count() == NDEV);
    CHECK(em__cuda_backend.unavailable_reason() == NULL);
    em_device_props p;
    CHECK_OK(em__cuda_backend.device_props(1, &p));
    CHECK(!strcmp(p.name, "Fake GPU 1") && !strcmp(p.vendor, "NVIDIA"));
    CHECK(p.compute_capability == 86 && p.compute_units == 84 && p.is_gpu);
    CHECK(p.total_memory == (int64_t)16 << 30);
    CHECK(p.free_memory == (int64_t)2 << 30); /* from NVML: no context yet */
    CHECK(strstr(p.driver, "CUDA 12.4") && strstr(p.driver, "550.54.15"));
    CHECK_OK(em__cuda_backend.synchronize(0)); /* nothing queued: must not create a context */
    CHECK(F.retains[0] == 0 && F.retains[1] == 0);
    CHECK(em__cuda_backend.device_props(2, &p) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "cuda:2 does not exist (this machine has 2 CUDA devices)");
}

static void test_free_memory_without_nvml(void) {
    install(false);
    em_device_props p;
    CHECK_OK(em__cuda_backend.device_props(0, &p));
    CHECK(p.free_memory == -1);
    CHECK(F.retains[0] == 0);
    void *h = NULL;
    CHECK_OK(em__cuda_backend.raw_alloc(0, 64, &h));
    CHECK_OK(em__cuda_backend.device_props(0, &p));
    CHECK(p.free_memory == (int64_t)12 << 30); /* cuMemGetInfo, now that a context exists */
    em__cuda_backend.raw_free(0, h);
    CHECK(F.live_allocs == 0);
}

static void test_lazy_context_only_on_used_device(void) {
    install(true);
    void *h = NULL;
    CHECK_OK(em__cuda_backend.raw_alloc(1, 256, &h));
    CHECK(F.retains[1] == 1 && F.retains[0] == 0);
    void *h2 = NULL;
    CHECK_OK(em__cuda_backend.raw_alloc(1, 0, &h2)); /* empty: still a distinct handle */
    CHECK(h2 != NULL && h2 != h);
    CHECK(F.retains[1] == 1); /* retained once, not per call */
    em__cuda_backend.raw_free(1, h);
    em__cuda_backend.raw_free(1, h2);
    CHECK(F.live_allocs == 0 && F.retains[0] == 0);
    em__cuda_backend_reset();
    CHECK(F.releases[1] == 1 && F.releases[0] == 0);
}

static void test_alloc_oom_is_reported(void) {
    install(true);
    F.alloc_result = CUDA_ERROR_OUT_OF_MEMORY;
    void *h = NULL;
    CHECK(em__cuda_backend.raw_alloc(0, 1000, &h) == EM_ERR_OUT_OF_MEMORY);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "cuda:0: cuMemAlloc of 1000 bytes: CUDA_ERROR_OUT_OF_MEMORY");
}

static void test_copies_round_trip(void) {
    install(true);
    void *a = NULL, *b = NULL;
    CHECK_OK(em__cuda_backend.raw_alloc(0, 64, &a));
    CHECK_OK(em__cuda_backend.raw_alloc(1, 64, &b));
    float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
    CHECK_OK(em__cuda_backend.copy_h2d(0, a, 8, src, sizeof src, false));
    CHECK_OK(em__cuda_backend.copy_d2d(1, b, 0, 0, a, 8, sizeof src)); /* across devices */
    CHECK(F.peer_copies == 1);
    /* dst waits for src's work, then src waits for the copy */
    CHECK(F.records >= 2 && F.waits >= 2);
    CHECK_OK(em__cuda_backend.copy_d2h(1, dst, b, 0, sizeof dst));
    CHECK(!memcmp(src, dst, sizeof src));
    CHECK_OK(em__cuda_backend.copy_d2d(0, a, 40, 0, a, 8, 8)); /* same device */
    CHECK(F.peer_copies == 1);
    float back[2];
    CHECK_OK(em__cuda_backend.copy_d2h(0, back, a, 40, 8));
    CHECK(back[0] == 1 && back[1] == 2);
    em__cuda_backend.raw_free(0, a);
    em__cuda_backend.raw_free(1, b);
    void *pinned = NULL;
    CHECK_OK(em__cuda_backend.host_alloc_pinned(128, &pinned));
    CHECK(pinned != NULL);
    em__cuda_backend.host_free_pinned(pinned);
}

/* What NCCL gets through backend.h: device 1 current with its stream, then the caller's
 * context back; a buffer's address; the library by name. */
static void test_native_handles(void) {
    install(true);
    void *h = NULL, *queue = NULL, *restore = (void *)1;
    CHECK_OK(em__cuda_backend.raw_alloc(1, 64, &h));
    CHECK(t_ctx == -1); /* the backend gave the caller's (no) context back */
    CHECK_OK(em__cuda_backend.native_enter(1, &queue, &restore));
    CHECK(t_ctx == 1 && queue == (void *)&stream_tag[1] && restore == NULL);
    em__cuda_backend.native_leave(restore);
    CHECK(t_ctx == -1);
    CHECK(em__cuda_backend.native_address(1, h, 24) == (uintptr_t)h + 24);
    CHECK(em__cuda_backend.native_enter(NDEV, &queue, &restore) == EM_ERR_DEVICE);
    CHECK(t_ctx == -1);
    em_clear_error();
    const char *why = NULL, *loader_why = NULL;
    int version = -1, loader_version = -1;
    void *lib = em__cuda_backend.native_library("nccl", &version, &why);
    CHECK(lib == em__cuda_nccl(&loader_version, &loader_why) && version == loader_version);
    CHECK(lib ? why == NULL : why && strstr(why, "libnccl.so.2"));
    CHECK(em__cuda_backend.native_library("cudnn", &version, &why) == NULL && version == 0);
    CHECK(why && strstr(why, "no such library"));
    em__cuda_backend.raw_free(1, h);
}

static void test_sync_error_names_last_op(void) {
    install(true);
    char dir[64];
    snprintf(dir, sizeof dir, "%s/a", g_cache_dir);
    setenv("EMBER_CACHE_DIR", dir, 1);
    size_t grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
    int32_t op = 7;
    void *params[1] = {&op};
    CHECK_OK(em__cuda_launch(0, "unary_f32", grid, block, params, NULL, 1, "em_tanh"));
    CHECK(F.launches == 1 && F.last_grid[0] == 4 && F.last_block[0] == 256);
    CHECK(!strcmp(fake_func_name(F.last_func), "unary_f32"));
    CHECK(F.last_params == params);
    CHECK(F.retains[0] == 1 && F.retains[1] == 0);
    /* cc 8.6 is in the fake NVRTC's list: a CUBIN for sm_86 was made and loaded */
    CHECK(starts(F.last_image, "fake elementwise.k sm_86"));
    F.sync_result = CUDA_ERROR_ILLEGAL_ADDRESS;
    CHECK(em__cuda_backend.synchronize(0) == EM_ERR_BACKEND);
    CHECK_ERROR(EM_ERR_BACKEND, "the last op queued on this device was 'em_tanh' (kernel unary_f32)");
    F.sync_result = CUDA_SUCCESS;
    /* the module and function are reused: one compile, one load */
    CHECK_OK(em__cuda_launch(0, "unary_f32", grid, block, params, NULL, 1, "em_tanh"));
    CHECK_OK(em__cuda_launch(0, "unary_f64", grid, block, params, NULL, 1, "em_tanh"));
    CHECK(nvrtc_compiles == 1 && F.modules_loaded == 1);
    size_t huge[3] = {1, 70000, 1};
    CHECK(em__cuda_launch(0, "unary_f32", huge, block, params, NULL, 1, "em_tanh") == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "exceeds the device's limits");
}

/* f64 arange/linspace must round like the CPU: no multiply-add contraction, except in
 * matmul (the CPU's BLAS contracts too). */
/* ---- which NVRTC and cuBLAS: the newest the driver can run (loader hooks say which
 * sonames "exist"; their functions report versions by soname) ---- */
static const char *g_present[8];
static void *h_open(const char *candidate) {
    for (int i = 0; g_present[i]; i++)
        if (!strcmp(candidate, g_present[i])) return (void *)g_present[i];
    return NULL;
}
static nvrtcResult n_version12(int *ma, int *mi) { *ma = 12; *mi = 8; return NVRTC_SUCCESS; }
static cublasStatus_t cb_prop12(libraryPropertyType t, int *v) { *v = t == MAJOR_VERSION ? 12 : 9; return CUBLAS_STATUS_SUCCESS; }
static cublasStatus_t cb_prop13(libraryPropertyType t, int *v) { *v = t == MAJOR_VERSION ? 13 : 1; return CUBLAS_STATUS_SUCCESS; }
static void *h_sym(void *h, const char *sym) {
    const char *lib = h;
    bool v12 = strstr(lib, ".so.12") != NULL;
    if (!strcmp(sym, "nvrtcVersion")) return v12 ? (void *)n_version12 : (void *)n_version;
    if (!strcmp(sym, "cublasGetProperty")) return v12 ? (void *)cb_prop12 : (void *)cb_prop13;
    return (void *)n_err; /* present, never called here */
}
static void install_for_loading(int driver_version, const char *const *present) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    F.driver_version = driver_version;
    int n = 0;
    for (; present[n]; n++) g_present[n] = present[n];
    g_present[n] = NULL;
    g_fake_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_fake_cu, .nvml_reason = "none (fake)", .cudnn_reason = "none (fake)"}; /* NVRTC, cuBLAS: loaded */
    em__cuda_loader_use_fakes(&libs);
    em__cuda_loader_set_hooks(h_open, h_sym);
}

static void test_library_versions_follow_the_driver(void) {
    static const char *const both[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libcublasLt.so.13", "libcublas.so.13",
                                       "libcublasLt.so.12", "libcublas.so.12", NULL};
    char line[512];
    install_for_loading(12040, both); /* a CUDA 12.4 driver: the 13s would not run on it */
    int major = 0, minor = 0;
    CHECK(em__cuda_nvrtc(&major, &minor, NULL) != NULL && major == 12 && minor == 8);
    CHECK(em__cuda_cublas(NULL) != NULL);
    em__cuda_libraries_line(line, sizeof line);
    CHECK(!strcmp(line, "nvrtc 12.8, cublas 12.9, cudnn: none (fake) (driver supports 12.4)"));

    install_for_loading(13000, both);
    CHECK(em__cuda_nvrtc(&major, &minor, NULL) != NULL && major == 13 && minor == 0);
    em__cuda_libraries_line(line, sizeof line);
    CHECK(!strcmp(line, "nvrtc 13.0, cublas 13.1, cudnn: none (fake) (driver supports 13.0)"));

    static const char *const only13[] = {"libnvrtc.so.13", "libcublasLt.so.13", "libcublas.so.13", NULL};
    install_for_loading(12040, only13);
    const char *reason = NULL;
    CHECK(em__cuda_nvrtc(NULL, NULL, &reason) == NULL);
    CHECK(reason && strstr(reason, "libnvrtc.so.13 needs a newer driver: this one supports CUDA 12.4"));
    CHECK(em__cuda_cublas(&reason) == NULL);
    CHECK(reason && strstr(reason, "libcublas.so.13 needs a newer driver"));
    em__cuda_loader_set_hooks(NULL, NULL);
    install(true);
}

static void test_no_fma_contraction_but_in_matmul(void) {
    install(true);
    char dir[64];
    snprintf(dir, sizeof dir, "%s/fmad", g_cache_dir);
    setenv("EMBER_CACHE_DIR", dir, 1);
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *params[1] = {NULL};
    CHECK_OK(em__cuda_launch(0, "affine_f64", grid, block, params, NULL, 1, "arange"));
    CHECK(!strcmp(last_fmad, "--fmad=false"));
    CHECK_OK(em__cuda_launch(0, "matmul_f32", grid, block, params, NULL, 1, "matmul"));
    CHECK(!strcmp(last_fmad, "--fmad=true"));
    CHECK(nvrtc_compiles >= 2);
}

/* A compile (seconds of NVRTC) holds no lock that launches of loaded kernels need. */
static void *launch_softmax(void *arg) {
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *params[1] = {NULL};
    return em__cuda_launch(0, "softmax_f32", grid, block, params, NULL, 1, "softmax") == EM_OK ? arg : NULL;
}
static void *launch_unary(void *arg) {
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *params[1] = {NULL};
    return em__cuda_launch(0, "unary_f32", grid, block, params, NULL, 1, "exp") == EM_OK ? arg : NULL;
}
static void test_compile_does_not_block_launches(void) {
    install(true);
    char dir[64];
    snprintf(dir, sizeof dir, "%s/hold", g_cache_dir);
    setenv("EMBER_CACHE_DIR", dir, 1);
    CHECK(launch_unary(dir) == dir); /* elementwise.k loaded */
    pthread_mutex_lock(&hold_lock);
    compile_hold = true;
    compile_held = false;
    pthread_mutex_unlock(&hold_lock);
    pthread_t compiler, launcher;
    void *r1 = NULL, *r2 = NULL;
    CHECK(pthread_create(&compiler, NULL, launch_softmax, dir) == 0); /* compiles softmax.k, held */
    pthread_mutex_lock(&hold_lock);
    while (!compile_held) pthread_cond_wait(&hold_cond, &hold_lock);
    pthread_mutex_unlock(&hold_lock);
    CHECK(pthread_create(&launcher, NULL, launch_unary, dir) == 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    int joined = pthread_timedjoin_np(launcher, &r2, &until);
    CHECK(joined == 0); /* the launch finished while the compile was still held */
    pthread_mutex_lock(&hold_lock);
    compile_hold = false;
    pthread_cond_broadcast(&hold_cond);
    pthread_mutex_unlock(&hold_lock);
    pthread_join(compiler, &r1);
    if (joined != 0) pthread_join(launcher, &r2);
    CHECK(r1 == dir && r2 == dir);
}

static void test_disk_cache_skips_compile(void) {
    install(true);
    char dir[64];
    snprintf(dir, sizeof dir, "%s/b", g_cache_dir);
    setenv("EMBER_CACHE_DIR", dir, 1);
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *params[1] = {NULL};
    int before = nvrtc_compiles;
    CHECK_OK(em__cuda_launch(1, "reduce_wg_f32", grid, block, params, NULL, 1, "em_sum"));
    CHECK(nvrtc_compiles == before + 1);
    install(true); /* a new process, in effect: the module must come from the disk cache */
    CHECK_OK(em__cuda_launch(1, "reduce_wg_f32", grid, block, params, NULL, 1, "em_sum"));
    CHECK(nvrtc_compiles == before + 1);
    CHECK(starts(F.last_image, "fake reduce.k sm_86"));
}

static void test_missing_nvrtc_lists_devices_but_ops_fail(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    g_fake_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_fake_cu, .nvrtc_reason = "libnvrtc not found (looked in X)",
                              .cublas_reason = "fake", .nvml_reason = "fake"};
    em__cuda_loader_use_fakes(&libs);
    CHECK(em__cuda_backend.init() == EM_OK && em__cuda_backend.device_count() == NDEV);
    em_device_props p;
    CHECK_OK(em__cuda_backend.device_props(0, &p));
    size_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *params[1] = {NULL};
    CHECK(em__cuda_launch(0, "unary_f32", grid, block, params, NULL, 1, "em_exp") == EM_ERR_UNAVAILABLE);
    CHECK_ERROR(EM_ERR_UNAVAILABLE, "cuda: kernels cannot be compiled: libnvrtc not found (looked in X)");
    CHECK(F.launches == 0);
}

static void test_compile_target(void) {
    int archs[] = {75, 80, 86, 89, 90};
    int arch = -1;
    bool cubin = false;
    em__cuda_pick_target(90, archs, 5, &arch, &cubin);
    CHECK(arch == 90 && cubin);
    em__cuda_pick_target(87, archs, 5, &arch, &cubin); /* Orin, unknown here: PTX for 8.6 */
    CHECK(arch == 86 && !cubin);
    em__cuda_pick_target(120, archs, 5, &arch, &cubin); /* newer than NVRTC: PTX, JIT */
    CHECK(arch == 90 && !cubin);
    em__cuda_pick_target(70, archs, 5, &arch, &cubin);
    CHECK(arch == 0);
    em__cuda_pick_target(80, NULL, 0, &arch, &cubin);
    CHECK(arch == 80 && !cubin);
}

static void test_programs(void) {
    int n = em__cuda_program_count();
    CHECK(n >= 5); /* elementwise, index, matmul, reduce, softmax (+ rng) */
    int elementwise = -1;
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        char *text = em__cuda_program_text(i, &name);
        CHECK(text && name);
        if (!text) continue;
        CHECK(starts(text, "#define EMK_CUDA 1\n"));
        CHECK(strstr(text, "#define KERNEL extern \"C\" __global__ void")); /* the prelude */
        if (!strcmp(name, "elementwise.k")) elementwise = i;
        free(text);
    }
    CHECK(em__cuda_program_text(n, NULL) == NULL);
    CHECK(elementwise >= 0);
    CHECK(em__cuda_program_of("unary_f32") == elementwise);
    CHECK(em__cuda_program_of("copy_f32_i64") == elementwise);
    CHECK(em__cuda_program_of("fill_4") == elementwise);
    CHECK(em__cuda_program_of("reduce_wg_bf16") >= 0 && em__cuda_program_of("reduce_wg_bf16") != elementwise);
    CHECK(em__cuda_program_of("matmul_f16") >= 0);
    CHECK(em__cuda_program_of("softmax_f32") >= 0);
    CHECK(em__cuda_program_of("index_select_8") >= 0);
    CHECK(em__cuda_program_of("no_such_kernel") == -1);
    /* one program per embedded .k file, under its name, each within the module slots */
    CHECK(n == em__kernel_source_count && n <= EM_CUDA_MAX_MODULES);
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        char *text = em__cuda_program_text(i, &name);
        CHECK(text && name == em__kernel_sources[i].name && strstr(text, em__kernel_sources[i].text));
        free(text);
    }
    int rng = em__cuda_program_of("rng_f32"), optim = em__cuda_program_of("adam_bf16");
    CHECK(rng >= 0 && !strcmp(em__kernel_sources[rng].name, "rng.k"));
    CHECK(optim >= 0 && !strcmp(em__kernel_sources[optim].name, "optim.k"));
    CHECK(!strcmp(em__kernel_sources[elementwise].name, "elementwise.k"));
}

static void test_cache_key_and_store(void) {
    const char *p1[] = {"ab", "c"}, *p2[] = {"a", "bc"}, *p3[] = {"ab", "c"};
    em_cuda_cache_key k1 = em__cuda_cache_key(p1, 2), k2 = em__cuda_cache_key(p2, 2),
                      k3 = em__cuda_cache_key(p3, 2);
    CHECK(strlen(k1.hex) == 32);
    CHECK(strcmp(k1.hex, k2.hex) != 0); /* part boundaries count */
    CHECK(!strcmp(k1.hex, k3.hex));
    const char *arch90[] = {"src", "compute_90", "nvrtc 13.0"}, *arch80[] = {"src", "compute_80", "nvrtc 13.0"},
               *nv12[] = {"src", "compute_90", "nvrtc 12.4"};
    CHECK(strcmp(em__cuda_cache_key(arch90, 3).hex, em__cuda_cache_key(arch80, 3).hex) != 0);
    CHECK(strcmp(em__cuda_cache_key(arch90, 3).hex, em__cuda_cache_key(nv12, 3).hex) != 0);

    char dir[96];
    snprintf(dir, sizeof dir, "%s/store/nested", g_cache_dir);
    static const char blob[] = "binary\0with NULs";
    CHECK(em__cuda_cache_store(dir, k1, "cubin", "label one", blob, sizeof blob));
    size_t n = 0;
    char *got = em__cuda_cache_load(dir, k1, "cubin", "label one", &n);
    CHECK(got && n == sizeof blob && !memcmp(got, blob, n));
    free(got);
    CHECK(em__cuda_cache_load(dir, k1, "cubin", "label two", &n) == NULL); /* header mismatch */
    CHECK(em__cuda_cache_load(dir, k2, "cubin", "label one", &n) == NULL); /* absent */
    CHECK(!em__cuda_cache_store("/proc/no/such/dir", k1, "ptx", "l", "x", 1));

    setenv("EMBER_CACHE_DIR", "/x/y", 1);
    em__cuda_cache_dir(dir, sizeof dir);
    CHECK(!strcmp(dir, "/x/y"));
    unsetenv("EMBER_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    em__cuda_cache_dir(dir, sizeof dir);
    CHECK(!strcmp(dir, "/xdg/ember"));
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    em__cuda_cache_dir(dir, sizeof dir);
    CHECK(!strcmp(dir, "/home/u/.cache/ember"));
}

static void test_smi_query(void) {
    install(true);
    em_cuda_smi_gpu g[4];
    em_cuda_smi_system sys;
    const char *reason = NULL;
    CHECK(em__cuda_smi_query(g, 4, &sys, &reason) == NDEV);
    CHECK(!strcmp(sys.driver_version, "550.54.15") && sys.cuda_version == 12040);
    CHECK(g[0].index == 0 && !strcmp(g[0].name, "Fake GPU 1"));
    CHECK(g[0].cuda_index == 1 && g[1].cuda_index == 0); /* matched by PCI bus, not by order */
    CHECK(g[0].mem_total == (int64_t)16 << 30 && g[0].mem_free == (int64_t)2 << 30);
    CHECK(g[0].mem_used == g[0].mem_total - g[0].mem_free);
    CHECK(g[0].util_gpu == 42 && g[1].util_gpu == 41 && g[0].util_mem == 7);
    CHECK(g[0].temperature == 33 && g[0].compute_capability == 86);
    CHECK(g[0].power_w == 68.25 && g[0].power_limit_w == -1); /* unsupported stays unknown */
    CHECK(F.retains[0] == 0 && F.retains[1] == 0); /* smi never creates a context */

    /* a newer NVML: memory v2 (what nvidia-smi shows as used) and the versioned temperature,
     * even without the deprecated call */
    g_fake_nvml.nvmlDeviceGetMemoryInfo_v2 = m_mem_v2;
    g_fake_nvml.nvmlDeviceGetTemperatureV = m_temp_v;
    g_fake_nvml.nvmlDeviceGetTemperature = NULL;
    em_cuda_fake_libs libs = {.cu = &g_fake_cu, .nvrtc = &g_fake_nvrtc, .cublas_reason = "fake", .nvml = &g_fake_nvml};
    em__cuda_loader_use_fakes(&libs); /* the loader keeps a copy of the table */
    CHECK(em__cuda_smi_query(g, 4, &sys, &reason) == NDEV);
    CHECK(g[0].mem_used == g[0].mem_total - g[0].mem_free - ((int64_t)1 << 30));
    CHECK(g[0].mem_free == (int64_t)2 << 30 && g[0].temperature == 41);
    g_fake_nvml.nvmlDeviceGetTemperatureV = NULL; /* neither: unknown, not a failure */
    em__cuda_loader_use_fakes(&libs);
    CHECK(em__cuda_smi_query(g, 4, &sys, &reason) == NDEV && g[0].temperature == -1);

    install(false);
    CHECK(em__cuda_smi_query(g, 4, &sys, &reason) == -1);
    CHECK(reason && strstr(reason, "libnvidia-ml.so.1 not found"));
}

/* The versioned names the headers select (cuMemAlloc -> cuMemAlloc_v2) must be real exports.
 * With no driver here, the toolkit's link stub lists the driver's exports: it is opened
 * only to look names up, never called. NVRTC and cuBLAS are the real libraries. */
static void test_symbols_exist(void) {
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    void *h = dlopen(stub, RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        int n = 0;
        const char *const *names = em__cuda_driver_symbols(&n);
        CHECK(n > 30);
        for (int i = 0; i < n; i++) {
            if (!dlsym(h, names[i])) printf("     libcuda lacks %s\n", names[i]);
            CHECK(dlsym(h, names[i]) != NULL);
        }
        bool v2 = false, old = false; /* the header's macro, not the old 32-bit ABI */
        for (int i = 0; i < n; i++) {
            v2 |= !strcmp(names[i], "cuMemAlloc_v2");
            old |= !strcmp(names[i], "cuMemAlloc");
        }
        CHECK(v2 && !old);
        dlclose(h);
    } else {
        printf("     (no %s: driver symbol names not checked)\n", stub);
    }
    em__cuda_backend_reset(); /* real loading from here */
    const char *reason = NULL;
    if (em__cuda_nvrtc(NULL, NULL, &reason)) {
        int n = 0;
        em__cuda_nvrtc_symbols(&n);
        CHECK(n >= 9);
    } else {
        printf("     NVRTC: %s\n", reason);
        CHECK(strstr(reason, "libnvrtc not found (looked in "));
    }
    const em_cublas_api *cb = em__cuda_cublas(&reason);
    if (cb) {
        CHECK(cb->cublasGemmStridedBatchedEx != NULL && cb->cublasGetStatusString != NULL);
    } else {
        printf("     cuBLAS: %s\n", reason);
        CHECK(strstr(reason, "not found (looked in "));
    }
    int nccl_version = 0;
    void *nccl = em__cuda_nccl(&nccl_version, &reason);
    if (nccl) {
        CHECK(nccl_version >= 20000 && dlsym(nccl, "ncclCommInitRank") != NULL);
        printf("     NCCL %d\n", nccl_version);
    } else {
        CHECK(strstr(reason, "libnccl.so.2 not found"));
    }
}

static void test_search_order_and_stubs(void) {
    char empty[] = "/tmp/ember-cuda-empty-XXXXXX";
    CHECK(mkdtemp(empty) != NULL);
    setenv("EMBER_CUDA_PATH", empty, 1);
    static const char *const names[] = {"libember-no-such-lib.so.1", NULL};
    char found[512], looked[1024];
    CHECK(em__cuda_dlopen("test", names, found, sizeof found, looked, sizeof looked) == NULL);
    CHECK(strstr(looked, empty) && strstr(looked, "the default library path") &&
          strstr(looked, "/usr/local/cuda/lib64"));
    CHECK(strstr(looked, empty) < strstr(looked, "/usr/local/cuda/lib64")); /* the order */
    /* a stub driver must never be loaded, even when asked for by path */
    const char *stub_dir = "/usr/local/cuda/lib64/stubs";
    char stub[256];
    snprintf(stub, sizeof stub, "%s/libcuda.so", stub_dir);
    if (access(stub, R_OK) == 0) {
        setenv("EMBER_CUDA_PATH", stub_dir, 1);
        static const char *const stub_names[] = {"libcuda.so", NULL};
        /* where a real driver is installed, the default library path finds it after the
         * stub is refused: a handle is fine then, as long as it is not the stub's */
        found[0] = '\0';
        void *h = em__cuda_dlopen("driver", stub_names, found, sizeof found, looked, sizeof looked);
        if (h) printf("     (a real driver was found after the stub was refused: %s)\n", found);
        CHECK(h == NULL || (found[0] && !strstr(found, "/stubs/")));
        CHECK(strstr(looked, stub_dir) != NULL);
        if (h) dlclose(h);
    } else {
        printf("     (no stub libcuda.so at %s: the stub check has nothing to refuse)\n", stub_dir);
    }
    unsetenv("EMBER_CUDA_PATH");
    rmdir(empty);
}

int main(void) {
    if (!mkdtemp(g_cache_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_reason_no_driver);
    RUN(test_reason_no_device);
    RUN(test_reason_strings);
    RUN(test_error_translation);
    RUN(test_enumeration_creates_no_context);
    RUN(test_free_memory_without_nvml);
    RUN(test_lazy_context_only_on_used_device);
    RUN(test_alloc_oom_is_reported);
    RUN(test_copies_round_trip);
    RUN(test_native_handles);
    RUN(test_sync_error_names_last_op);
    RUN(test_disk_cache_skips_compile);
    RUN(test_compile_does_not_block_launches);
    RUN(test_no_fma_contraction_but_in_matmul);
    RUN(test_library_versions_follow_the_driver);
    RUN(test_missing_nvrtc_lists_devices_but_ops_fail);
    RUN(test_compile_target);
    RUN(test_programs);
    RUN(test_cache_key_and_store);
    RUN(test_smi_query);
    RUN(test_search_order_and_stubs);
    RUN(test_symbols_exist);
    em__cuda_backend_reset();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_cache_dir);
    return test_summary();
}

#else
/* Built without the CUDA headers: the backend is the fixed "unavailable" table. */
#include "backends/backend.h"
static void test_unavailable_without_headers(void) {
    CHECK(em__cuda_backend.init() == EM_ERR_UNAVAILABLE);
    CHECK(strstr(em__cuda_backend.unavailable_reason(), "built without CUDA headers"));
    CHECK(em__cuda_backend.device_count() == 0);
}
int main(void) {
    test_skip_case("fake-driver CUDA tests", "built without the CUDA headers (cuda.h): only the unavailable table is checked");
    RUN(test_unavailable_without_headers);
    return test_summary();
}
#endif
