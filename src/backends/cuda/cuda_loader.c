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

/* Try one candidate: dlopen, refuse stubs, trace. Returns the handle or NULL. */
static void *try_open(const char *what, const char *candidate, char *found, size_t found_size) {
    bool trace = em__cuda_trace_enabled();
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
    *slot = dlsym(h, sym);
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
    X(nvmlDeviceGetName, 1) X(nvmlDeviceGetMemoryInfo, 1) X(nvmlDeviceGetUtilizationRates, 1) \
    X(nvmlDeviceGetTemperature, 1) X(nvmlDeviceGetPowerUsage, 1)                        \
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

static void load_nvrtc(void) {
    /* Newest first; the unversioned name is the developer symlink, tried last. */
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                        "libnvrtc.so", NULL};
    char found[512], looked[1024];
    void *h = em__cuda_dlopen("nvrtc", names, found, sizeof found, looked, sizeof looked);
    if (!h) { not_found(&g_nvrtc, "", "libnvrtc", looked); return; }
    em_nvrtc_api api;
#define X(fn, req) \
    if (!resolve(h, EM__STR(fn), (void **)&api.fn, req, "libnvrtc", found, &g_nvrtc)) return;
    EM_NVRTC_FUNCS(X)
#undef X
    if (api.nvrtcVersion(&g_nvrtc_major, &g_nvrtc_minor) != NVRTC_SUCCESS) {
        snprintf(g_nvrtc.reason, sizeof g_nvrtc.reason, "nvrtcVersion failed in %s", found);
        return;
    }
    g_nvrtc_api = api;
    g_nvrtc.ok = true;
}

static void load_cublas(void) {
    static const char *const lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                                           "libcublasLt.so.11", "libcublasLt.so", NULL};
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                                        "libcublas.so", NULL};
    char found[512], looked[1024];
    /* cuBLAS needs cuBLASLt by soname: loading it first from our search order makes
     * the dynamic linker reuse this copy when libcublas asks for it. */
    void *lt = em__cuda_dlopen("cublasLt", lt_names, found, sizeof found, looked, sizeof looked);
    if (!lt) { not_found(&g_cublas, "", "libcublasLt", looked); return; }
    void *h = em__cuda_dlopen("cublas", names, found, sizeof found, looked, sizeof looked);
    if (!h) { not_found(&g_cublas, "", "libcublas", looked); return; }
    em_cublas_api api;
#define X(fn, req) \
    if (!resolve(h, EM__STR(fn), (void **)&api.fn, req, "libcublas", found, &g_cublas)) return;
    EM_CUBLAS_FUNCS(X)
#undef X
    g_cublas_api = api;
    g_cublas.ok = true;
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

void em__cuda_loader_reset(void) {
    pthread_mutex_lock(&g_lock);
    memset(&g_cu, 0, sizeof g_cu);
    memset(&g_nvrtc, 0, sizeof g_nvrtc);
    memset(&g_cublas, 0, sizeof g_cublas);
    memset(&g_nvml, 0, sizeof g_nvml);
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
