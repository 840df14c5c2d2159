/* dlopen'ing CUDA's libraries: one search order, a trace, and a reason for every failure.
 * See cuda_loader.h. */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EM_CUDA_DEFAULT_DIR "/usr/local/cuda/lib64"

bool em__cuda_trace_enabled(void) {
    const char *t = getenv("EMBER_CUDA_TRACE");
    return t && *t && strcmp(t, "0") != 0;
}

/* Append printf-style text to buf (always NUL-terminated, silently truncated). */
static void appendf(char *buf, size_t size, const char *fmt, const char *a, const char *b) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    snprintf(buf + len, size - len, fmt, a, b);
}

/* The file a handle was loaded from (dlopen by bare name goes through the linker's path). */
static void handle_path(void *h, const char *fallback, char *out, size_t size) {
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(out, size, "%s", lm->l_name);
    else
        snprintf(out, size, "%s", fallback);
}

/* Tests: dlopen/dlsym replaced (em__cuda_loader_set_hooks). */
static void *(*g_open_hook)(const char *candidate);
static void *(*g_sym_hook)(void *h, const char *sym);

void em__cuda_loader_set_hooks(void *(*open)(const char *), void *(*sym)(void *, const char *)) {
    g_open_hook = open;
    g_sym_hook = sym;
}

static void *lib_sym(void *h, const char *sym) { return g_sym_hook ? g_sym_hook(h, sym) : dlsym(h, sym); }

/* Try one candidate: dlopen, refuse stubs, trace. Returns the handle or NULL. */
static void *try_open(const char *what, const char *candidate, char *found, size_t found_size) {
    bool trace = em__cuda_trace_enabled();
    if (g_open_hook) {
        void *h = g_open_hook(candidate);
        if (h) snprintf(found, found_size, "%s", candidate);
        if (trace) fprintf(stderr, "ember: cuda: %s: tried %s (test hook): %s\n", what, candidate, h ? "loaded" : "absent");
        return h;
    }
    void *h = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (trace) fprintf(stderr, "ember: cuda: %s: tried %s: %s\n", what, candidate, dlerror());
        return NULL;
    }
    char path[512];
    handle_path(h, candidate, path, sizeof path);
    if (strstr(path, "/stubs/")) {
        /* A stub exists to link against; loaded, it answers CUDA_ERROR_STUB_LIBRARY. */
        if (trace) fprintf(stderr, "ember: cuda: %s: refused stub library %s\n", what, path);
        dlclose(h);
        return NULL;
    }
    if (trace) fprintf(stderr, "ember: cuda: %s: loaded %s\n", what, path);
    snprintf(found, found_size, "%s", path);
    return h;
}

void *em__cuda_dlopen(const char *what, const char *const *names, char *found,
                      size_t found_size, char *looked, size_t looked_size) {
    char cand[1024];
    looked[0] = '\0';
    found[0] = '\0';
    const char *env = getenv("EMBER_CUDA_PATH");
    if (env && *env) {
        char *dirs = strdup(env);
        if (!dirs) return NULL;
        char *save = NULL;
        for (char *dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
            static const char *const subs[] = {"", "/lib64"};
            for (size_t s = 0; s < 2; s++)
                for (size_t i = 0; names[i]; i++) {
                    snprintf(cand, sizeof cand, "%s%s/%s", dir, subs[s], names[i]);
                    void *h = try_open(what, cand, found, found_size);
                    if (h) { free(dirs); return h; }
                }
            appendf(looked, looked_size, "%sEMBER_CUDA_PATH entry %s", looked[0] ? ", " : "", dir);
        }
        free(dirs);
    }
    for (size_t i = 0; names[i]; i++) {
        void *h = try_open(what, names[i], found, found_size);
        if (h) return h;
    }
    appendf(looked, looked_size, "%s%s", looked[0] ? ", " : "",
            "the default library path (LD_LIBRARY_PATH, ld.so.cache, /lib, /usr/lib)");
    for (size_t i = 0; names[i]; i++) {
        snprintf(cand, sizeof cand, "%s/%s", EM_CUDA_DEFAULT_DIR, names[i]);
        void *h = try_open(what, cand, found, found_size);
        if (h) return h;
    }
    appendf(looked, looked_size, "%s%s", ", ", EM_CUDA_DEFAULT_DIR);
    return NULL;
}

/* ---- one record per library: loaded once under a lock, forgettable by tests ---- */

typedef struct lib_state {
    bool tried;
    bool ok;
    char reason[1536];
} lib_state;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static lib_state g_nvml, g_nccl;
static em_nvml_api g_nvml_api;
static void *g_nccl_handle;
static int g_nccl_version;

/* Resolve `sym` from h into *slot; a missing required symbol fails the library. */
static bool resolve(void *h, const char *sym, void **slot, bool required, const char *lib,
                    const char *path, lib_state *st) {
    *slot = lib_sym(h, sym);
    if (!*slot && required) {
        snprintf(st->reason, sizeof st->reason, "%s at %s lacks %s (too old for this build of Ember)",
                 lib, path, sym);
        return false;
    }
    return true;
}

static void not_found(lib_state *st, const char *prefix, const char *lib, const char *looked) {
    snprintf(st->reason, sizeof st->reason, "%s%s not found (looked in %s)", prefix, lib, looked);
}

#define NVML_FUNCS(X)                                                                     \
    X(nvmlInit_v2, 1) X(nvmlShutdown, 1) X(nvmlErrorString, 1) X(nvmlSystemGetDriverVersion, 1) \
    X(nvmlSystemGetCudaDriverVersion_v2, 0) X(nvmlDeviceGetCount_v2, 1)                 \
    X(nvmlDeviceGetHandleByIndex_v2, 1) X(nvmlDeviceGetHandleByPciBusId_v2, 1)          \
    X(nvmlDeviceGetName, 1) X(nvmlDeviceGetMemoryInfo, 1) X(nvmlDeviceGetMemoryInfo_v2, 0) \
    X(nvmlDeviceGetUtilizationRates, 1) X(nvmlDeviceGetTemperature, 0)                  \
    X(nvmlDeviceGetTemperatureV, 0) X(nvmlDeviceGetPowerUsage, 1)                       \
    X(nvmlDeviceGetEnforcedPowerLimit, 1) X(nvmlDeviceGetCudaComputeCapability, 1)       \
    X(nvmlDeviceGetMultiGpuBoard, 0)

static void load_nvml(void) {
    static const char *const names[] = {"libnvidia-ml.so.1", NULL};
    char found[512], looked[1024];
    void *h = em__cuda_dlopen("nvml", names, found, sizeof found, looked, sizeof looked);
    if (!h) { not_found(&g_nvml, "", "libnvidia-ml.so.1", looked); return; }
    em_nvml_api api;
#define X(fn, req) \
    if (!resolve(h, #fn, (void **)&api.fn, req, "libnvidia-ml.so.1", found, &g_nvml)) return;
    NVML_FUNCS(X)
#undef X
    em_nvml_return r = api.nvmlInit_v2();
    if (r != EM_NVML_SUCCESS) {
        snprintf(g_nvml.reason, sizeof g_nvml.reason, "nvmlInit failed: %s", api.nvmlErrorString(r));
        return;
    }
    g_nvml_api = api;
    g_nvml.ok = true;
}

void *em__cuda_nccl(int *version, const char **reason) {
    pthread_mutex_lock(&g_lock);
    if (!g_nccl.tried) {
        g_nccl.tried = true;
        static const char *const names[] = {"libnccl.so.2", NULL};
        char found[512], looked[1024];
        void *h = em__cuda_dlopen("nccl", names, found, sizeof found, looked, sizeof looked);
        if (!h) {
            not_found(&g_nccl, "", "libnccl.so.2", looked);
        } else {
            int (*get_version)(int *) = NULL;
            if (resolve(h, "ncclGetVersion", (void **)&get_version, true, "libnccl.so.2", found, &g_nccl) &&
                get_version(&g_nccl_version) == 0) {
                g_nccl_handle = h;
                g_nccl.ok = true;
            } else if (!g_nccl.reason[0]) {
                snprintf(g_nccl.reason, sizeof g_nccl.reason, "ncclGetVersion failed in %s", found);
            }
        }
    }
    void *h = g_nccl.ok ? g_nccl_handle : NULL;
    if (version) *version = g_nccl.ok ? g_nccl_version : 0;
    if (reason) *reason = g_nccl.ok ? NULL : g_nccl.reason;
    pthread_mutex_unlock(&g_lock);
    return h;
}

#ifdef EMBER_HAVE_CUDA_HEADERS

#define EM__STR_(x) #x
#define EM__STR(x) EM__STR_(x) /* expands header macros first: "cuMemAlloc_v2" */

static lib_state g_cu, g_nvrtc, g_cublas;
static em_cu_api g_cu_api;
static em_nvrtc_api g_nvrtc_api;
static em_cublas_api g_cublas_api;
static int g_nvrtc_major, g_nvrtc_minor;
static int g_cublas_version[2]; /* major, minor; 0 when unknown */

static void load_driver(void) {
    static const char *const names[] = {"libcuda.so.1", NULL};
    char found[512], looked[1024];
    void *h = em__cuda_dlopen("driver", names, found, sizeof found, looked, sizeof looked);
    if (!h) { not_found(&g_cu, "no driver: ", "libcuda.so.1", looked); return; }
    em_cu_api api;
#define X(fn, req)                                                                           \
    if (!resolve(h, EM__STR(fn), (void **)&api.fn, req, "no driver: libcuda.so.1", found, &g_cu)) \
        return;
    EM_CU_FUNCS(X)
#undef X
    g_cu_api = api;
    g_cu.ok = true;
}

/* The driver's CUDA version (12040 for 12.4), loading the driver if needed (g_lock held);
 * 0 without a driver: NVRTC and cuBLAS are then chosen newest first (compiling only). */
static int g_driver_cuda;
static int driver_cuda_version(void) {
    if (!g_cu.tried) {
        g_cu.tried = true;
        load_driver();
    }
    int v = 0;
    if (!g_cu.ok || g_cu_api.cuDriverGetVersion(&v) != CUDA_SUCCESS) v = 0;
    return v;
}

/* A library's sonames, newest first, with the CUDA major each needs (0: the unversioned
 * developer link, whose version is checked once loaded). */
typedef struct soname { const char *name; int major; } soname;
static const soname k_nvrtc[] = {{"libnvrtc.so.13", 13}, {"libnvrtc.so.12", 12}, {"libnvrtc.so.11.2", 11},
                                 {"libnvrtc.so", 0}, {NULL, 0}};
static const soname k_cublas[] = {{"libcublas.so.13", 13}, {"libcublas.so.12", 12}, {"libcublas.so.11", 11},
                                  {"libcublas.so", 0}, {NULL, 0}};
static const soname k_cublas_lt[] = {{"libcublasLt.so.13", 13}, {"libcublasLt.so.12", 12},
                                     {"libcublasLt.so.11", 11}, {"libcublasLt.so", 0}, {NULL, 0}};

/* The names the driver can run (major <= its major; all when it is unknown); with
 * `too_new`, the others instead. */
static void runnable(const soname *libs, int driver, bool too_new, const char **out) {
    int n = 0;
    for (const soname *l = libs; l->name; l++) {
        bool ok = !driver || l->major <= driver / 1000;
        if (ok != too_new) out[n++] = l->name;
    }
    out[n] = NULL;
}

/* A library was not found among those the driver can run: is a newer one there? Then say
 * so (a CUDA 13 library on a CUDA 12 driver fails to load its kernels). */
static void explain_too_new(lib_state *st, const char *what, const soname *libs, int driver) {
    const char *names[8];
    char found[512], looked[1024];
    runnable(libs, driver, true, names);
    if (!driver || !names[0]) return;
    void *h = em__cuda_dlopen(what, names, found, sizeof found, looked, sizeof looked);
    if (!h) return;
    if (!g_open_hook) dlclose(h);
    snprintf(st->reason, sizeof st->reason, "%s needs a newer driver: this one supports CUDA %d.%d "
             "(install %s for CUDA %d, or a newer NVIDIA driver)", found, driver / 1000, (driver % 1000) / 10,
             what, driver / 1000);
}

static void load_nvrtc(void) {
    /* Newest first among those the driver supports; the unversioned name is the developer
     * symlink, tried last. */
    int driver = g_driver_cuda = driver_cuda_version();
    const char *names[8];
    runnable(k_nvrtc, driver, false, names);
    char found[512], looked[1024];
    void *h = em__cuda_dlopen("nvrtc", names, found, sizeof found, looked, sizeof looked);
    if (!h) {
        not_found(&g_nvrtc, "", "libnvrtc", looked);
        explain_too_new(&g_nvrtc, "libnvrtc", k_nvrtc, driver);
        return;
    }
    em_nvrtc_api api;
#define X(fn, req) \
    if (!resolve(h, EM__STR(fn), (void **)&api.fn, req, "libnvrtc", found, &g_nvrtc)) return;
    EM_NVRTC_FUNCS(X)
#undef X
    if (api.nvrtcVersion(&g_nvrtc_major, &g_nvrtc_minor) != NVRTC_SUCCESS) {
        snprintf(g_nvrtc.reason, sizeof g_nvrtc.reason, "nvrtcVersion failed in %s", found);
        return;
    }
    if (driver && g_nvrtc_major > driver / 1000) { /* the unversioned link to a newer one */
        snprintf(g_nvrtc.reason, sizeof g_nvrtc.reason, "%s is NVRTC %d.%d, newer than the driver's CUDA "
                 "%d.%d (install NVRTC %d, or a newer NVIDIA driver)", found, g_nvrtc_major, g_nvrtc_minor,
                 driver / 1000, (driver % 1000) / 10, driver / 1000);
        return;
    }
    g_nvrtc_api = api;
    g_nvrtc.ok = true;
}

static void load_cublas(void) {
    int driver = g_driver_cuda = driver_cuda_version();
    char found[512], looked[1024], lt_looked[1024] = "";
    void *h = NULL;
    /* cuBLAS needs cuBLASLt of its own version by soname: loading it first from our search
     * order makes the dynamic linker reuse this copy when libcublas asks for it. */
    for (size_t i = 0; k_cublas[i].name && !h; i++) {
        if (driver && k_cublas[i].major > driver / 1000) continue;
        const char *lt_names[] = {k_cublas_lt[i].name, NULL}, *names[] = {k_cublas[i].name, NULL};
        if (!em__cuda_dlopen("cublasLt", lt_names, found, sizeof found, lt_looked, sizeof lt_looked)) continue;
        h = em__cuda_dlopen("cublas", names, found, sizeof found, looked, sizeof looked);
    }
    if (!h) {
        not_found(&g_cublas, "", "libcublas", lt_looked[0] ? lt_looked : looked);
        explain_too_new(&g_cublas, "libcublas", k_cublas, driver);
        return;
    }
    em_cublas_api api;
#define X(fn, req) \
    if (!resolve(h, EM__STR(fn), (void **)&api.fn, req, "libcublas", found, &g_cublas)) return;
    EM_CUBLAS_FUNCS(X)
#undef X
    g_cublas_version[0] = g_cublas_version[1] = 0;
    if (api.cublasGetProperty && (api.cublasGetProperty(MAJOR_VERSION, &g_cublas_version[0]) != CUBLAS_STATUS_SUCCESS ||
                                  api.cublasGetProperty(MINOR_VERSION, &g_cublas_version[1]) != CUBLAS_STATUS_SUCCESS))
        g_cublas_version[0] = g_cublas_version[1] = 0;
    if (driver && g_cublas_version[0] > driver / 1000) {
        snprintf(g_cublas.reason, sizeof g_cublas.reason, "%s is cuBLAS %d.%d, newer than the driver's CUDA "
                 "%d.%d", found, g_cublas_version[0], g_cublas_version[1], driver / 1000, (driver % 1000) / 10);
        return;
    }
    g_cublas_api = api;
    g_cublas.ok = true;
}

/* ---- cuDNN ---- */
static lib_state g_cudnn;
static em_cudnn_api g_cudnn_api;
static size_t g_cudnn_version;

static void load_cudnn(void) {
    g_cudnn_version = 0;
    const char *off = getenv("EMBER_CUDNN");
    if (off && strcmp(off, "0") == 0) { /* the kernels only: not even dlopen'ed */
        snprintf(g_cudnn.reason, sizeof g_cudnn.reason, "off (EMBER_CUDNN=0)");
        if (em__cuda_trace_enabled()) fprintf(stderr, "ember: cuda: cudnn: EMBER_CUDNN=0, not loaded\n");
        return;
    }
    int driver = g_driver_cuda = driver_cuda_version();
    /* cuDNN's convolution engines need cuBLAS(Lt) of their CUDA major by soname (cuDNN 8 as
     * DT_NEEDED): loaded first from our search order, the dynamic linker reuses that copy.
     * Absent, cuDNN still loads; what it cannot run then falls back to Ember's kernels. */
    if (!g_cublas.tried) {
        g_cublas.tried = true;
        load_cublas();
    }
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so.8", NULL};
    char found[512], looked[1024];
    void *h = em__cuda_dlopen("cudnn", names, found, sizeof found, looked, sizeof looked);
    if (!h) { not_found(&g_cudnn, "", "libcudnn.so.9/.8", looked); return; }
    em_cudnn_api api;
#define X(fn, req) \
    if (!resolve(h, #fn, (void **)&api.fn, req, "libcudnn", found, &g_cudnn)) return;
    EM_CUDNN_FUNCS(X)
#undef X
    size_t v = api.cudnnGetVersion();
    char vs[32];
    em__cudnn_version_str(v, vs, sizeof vs);
    if (v < 8000) {
        snprintf(g_cudnn.reason, sizeof g_cudnn.reason, "%s is cuDNN %s; Ember uses cuDNN 8 or 9", found, vs);
        return;
    }
    /* cuDNN is built for one CUDA major (cudnnGetCudartVersion 12020 for 12.2): a newer one
     * than the driver's cannot run its kernels */
    int rt = api.cudnnGetCudartVersion ? (int)api.cudnnGetCudartVersion() : 0;
    if (driver && rt / 1000 > driver / 1000) {
        snprintf(g_cudnn.reason, sizeof g_cudnn.reason, "%s (cuDNN %s) is built for CUDA %d.%d, newer than the "
                 "driver's CUDA %d.%d (install cuDNN for CUDA %d, or a newer NVIDIA driver)", found, vs, rt / 1000,
                 (rt % 1000) / 10, driver / 1000, (driver % 1000) / 10, driver / 1000);
        return;
    }
    g_cudnn_api = api;
    g_cudnn_version = v;
    g_cudnn.ok = true;
}

void em__cuda_libraries_line(char *buf, size_t size) {
    int nv_major = 0, nv_minor = 0;
    const char *nv_reason = NULL, *cb_reason = NULL;
    bool nv = em__cuda_nvrtc(&nv_major, &nv_minor, &nv_reason) != NULL;
    bool cb = em__cuda_cublas(&cb_reason) != NULL;
    size_t dnn_v = 0;
    const char *dnn_reason = NULL;
    bool dnn = em__cuda_cudnn(&dnn_v, &dnn_reason) != NULL;
    pthread_mutex_lock(&g_lock);
    int driver = g_driver_cuda, cbv0 = g_cublas_version[0], cbv1 = g_cublas_version[1];
    pthread_mutex_unlock(&g_lock);
    char nvs[600], cbs[600], drv[64] = "";
    if (nv) snprintf(nvs, sizeof nvs, "nvrtc %d.%d", nv_major, nv_minor);
    else snprintf(nvs, sizeof nvs, "nvrtc: %.500s", nv_reason);
    if (cb && cbv0) snprintf(cbs, sizeof cbs, "cublas %d.%d", cbv0, cbv1);
    else if (cb) snprintf(cbs, sizeof cbs, "cublas (version unknown)");
    else snprintf(cbs, sizeof cbs, "cublas: %.500s", cb_reason);
    char dnns[340], dv[32];
    em__cudnn_version_str(dnn_v, dv, sizeof dv);
    if (dnn) snprintf(dnns, sizeof dnns, "cudnn %s", dv);
    else snprintf(dnns, sizeof dnns, "cudnn: %.300s", dnn_reason);
    if (driver) snprintf(drv, sizeof drv, " (driver supports %d.%d)", driver / 1000, (driver % 1000) / 10);
    snprintf(buf, size, "%s, %s, %s%s", nvs, cbs, dnns, drv);
}

#define EM__NAME(fn, req) EM__STR(fn),
static const char *const g_cu_names[] = {EM_CU_FUNCS(EM__NAME)};
static const char *const g_nvrtc_names[] = {EM_NVRTC_FUNCS(EM__NAME)};
static const char *const g_cublas_names[] = {EM_CUBLAS_FUNCS(EM__NAME)};
#undef EM__NAME
const char *const *em__cuda_driver_symbols(int *n) {
    *n = (int)(sizeof g_cu_names / sizeof g_cu_names[0]);
    return g_cu_names;
}
const char *const *em__cuda_nvrtc_symbols(int *n) {
    *n = (int)(sizeof g_nvrtc_names / sizeof g_nvrtc_names[0]);
    return g_nvrtc_names;
}
const char *const *em__cuda_cublas_symbols(int *n) {
    *n = (int)(sizeof g_cublas_names / sizeof g_cublas_names[0]);
    return g_cublas_names;
}

/* Fakes replace loading: a NULL table is "not found" with the given reason. */
static void use_fake(lib_state *st, const void *table, const char *reason, void *dst, size_t size) {
    if (!table && !reason) return; /* loaded for real when asked (through the hooks, if set) */
    st->tried = true;
    st->ok = table != NULL;
    if (table) memcpy(dst, table, size);
    else snprintf(st->reason, sizeof st->reason, "%s", reason ? reason : "not found (fake)");
}

void em__cuda_loader_use_fakes(const em_cuda_fake_libs *f) {
    pthread_mutex_lock(&g_lock);
    use_fake(&g_cu, f->cu, f->cu_reason, &g_cu_api, sizeof g_cu_api);
    use_fake(&g_nvrtc, f->nvrtc, f->nvrtc_reason, &g_nvrtc_api, sizeof g_nvrtc_api);
    use_fake(&g_cublas, f->cublas, f->cublas_reason, &g_cublas_api, sizeof g_cublas_api);
    use_fake(&g_nvml, f->nvml, f->nvml_reason, &g_nvml_api, sizeof g_nvml_api);
    use_fake(&g_cudnn, f->cudnn, f->cudnn_reason, &g_cudnn_api, sizeof g_cudnn_api);
    g_cudnn_version = f->cudnn ? g_cudnn_api.cudnnGetVersion() : 0;
    if (f->nvrtc && g_nvrtc_api.nvrtcVersion(&g_nvrtc_major, &g_nvrtc_minor) != NVRTC_SUCCESS)
        g_nvrtc_major = g_nvrtc_minor = 0;
    pthread_mutex_unlock(&g_lock);
}

/* Load once; return the table or NULL with the reason. */
static const void *get(lib_state *st, void (*load)(void), const void *table, const char **reason) {
    pthread_mutex_lock(&g_lock);
    if (!st->tried) {
        st->tried = true;
        load();
    }
    const void *t = st->ok ? table : NULL;
    if (reason) *reason = st->ok ? NULL : st->reason;
    pthread_mutex_unlock(&g_lock);
    return t;
}

const em_cu_api *em__cuda_driver(const char **reason) {
    return get(&g_cu, load_driver, &g_cu_api, reason);
}

const em_nvrtc_api *em__cuda_nvrtc(int *major, int *minor, const char **reason) {
    const em_nvrtc_api *api = get(&g_nvrtc, load_nvrtc, &g_nvrtc_api, reason);
    if (major) *major = api ? g_nvrtc_major : 0;
    if (minor) *minor = api ? g_nvrtc_minor : 0;
    return api;
}

const em_cublas_api *em__cuda_cublas(const char **reason) {
    return get(&g_cublas, load_cublas, &g_cublas_api, reason);
}

const em_nvml_api *em__cuda_nvml(const char **reason) {
    return get(&g_nvml, load_nvml, &g_nvml_api, reason);
}

const em_cudnn_api *em__cuda_cudnn(size_t *version, const char **reason) {
    const em_cudnn_api *api = get(&g_cudnn, load_cudnn, &g_cudnn_api, reason);
    if (version) *version = api ? g_cudnn_version : 0;
    return api;
}

void em__cuda_loader_reset(void) {
    pthread_mutex_lock(&g_lock);
    memset(&g_cu, 0, sizeof g_cu);
    memset(&g_nvrtc, 0, sizeof g_nvrtc);
    memset(&g_cublas, 0, sizeof g_cublas);
    memset(&g_nvml, 0, sizeof g_nvml);
    memset(&g_cudnn, 0, sizeof g_cudnn);
    g_cudnn_version = 0;
    g_driver_cuda = 0;
    g_cublas_version[0] = g_cublas_version[1] = 0;
    pthread_mutex_unlock(&g_lock);
}

#else /* no CUDA headers: only NVML and NCCL, which need none */

const em_nvml_api *em__cuda_nvml(const char **reason) {
    pthread_mutex_lock(&g_lock);
    if (!g_nvml.tried) {
        g_nvml.tried = true;
        load_nvml();
    }
    const em_nvml_api *t = g_nvml.ok ? &g_nvml_api : NULL;
    if (reason) *reason = g_nvml.ok ? NULL : g_nvml.reason;
    pthread_mutex_unlock(&g_lock);
    return t;
}

void em__cuda_loader_reset(void) {
    pthread_mutex_lock(&g_lock);
    memset(&g_nvml, 0, sizeof g_nvml);
    pthread_mutex_unlock(&g_lock);
}

#endif
