/* Ember's shared kernels (src/kernels/NAME.k) on CUDA devices.
 *
 * Each .k file is embedded at build time as a program of its own (em__kernel_sources,
 * src/kernels/embed.cmake). Compiling them all at once costs tens of seconds of NVRTC +
 * ptxas time, so each is compiled the first time one of its kernels runs: the prelude, the
 * shared headers and that file.
 *
 * A program is compiled to a CUBIN for the device's own architecture when NVRTC knows it
 * (no JIT at load, and no PTX-version trouble with older drivers), else to PTX for the
 * newest architecture NVRTC knows below the device's, which the driver JIT-compiles.
 * Either is cached on disk (cuda_nvrtc.c). Modules are loaded per device; functions are
 * looked up once per device and kept. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"
#include "../../kernels/kernel_text.h"
#include "cuda_kernels.h"

#define FUNC_SLOTS 512 /* per device; there are about 300 library kernels */

typedef struct func_slot {
    char name[48];
    CUfunction f;
    bool checked; /* argument sizes compared with the kernel's parameters */
    int resident; /* blocks of resident_block threads per SM (occupancy), 0: not asked */
    size_t resident_block;
} func_slot;

static pthread_mutex_t g_klock = PTHREAD_MUTEX_INITIALIZER; /* modules and function caches */
/* One per program: its compile and load happen once, under this lock and not g_klock, so
 * that launches of kernels already loaded never wait seconds behind NVRTC. */
static pthread_mutex_t g_prog_lock[EM_CUDA_MAX_MODULES] = {
    [0 ... EM_CUDA_MAX_MODULES - 1] = PTHREAD_MUTEX_INITIALIZER};

int em__cuda_program_count(void) { return em__kernel_source_count; }

char *em__cuda_program_text(int i, const char **name) {
    char *text = em__kernel_library_program(EM_DIALECT_CUDA, true, i);
    if (text && name) *name = em__kernel_sources[i].name;
    return text;
}

/* Which program defines `kernel`: library kernels are stamped out by macros, so look for
 * "KERNEL <family>##" with family = the name cut at one of its underscores, longest first
 * ("copy_f32_i64" -> "copy_f32_##"? no -> "copy_##" yes), then for a kernel written out
 * in full ("KERNEL name("). */
int em__cuda_program_of(const char *kernel) {
    char pat[96];
    size_t n = strlen(kernel);
    for (size_t cut = n + 1; cut-- > 0;) {
        if (cut == n) snprintf(pat, sizeof pat, "KERNEL %s(", kernel);
        else if (kernel[cut] == '_') snprintf(pat, sizeof pat, "KERNEL %.*s##", (int)(cut + 1), kernel);
        else continue;
        for (int i = 0; i < em__kernel_source_count; i++)
            if (strstr(em__kernel_sources[i].text, pat)) return i;
    }
    return -1;
}

/* ---- compile target per device ---- */

void em__cuda_pick_target(int cc, const int *archs, int narchs, int *arch, bool *cubin) {
    int best = 0;
    *cubin = false;
    for (int i = 0; i < narchs; i++) {
        if (archs[i] == cc) { *arch = cc; *cubin = true; return; }
        if (archs[i] < cc && archs[i] > best) best = archs[i];
    }
    /* unknown to this NVRTC: PTX for the newest older architecture, JIT-compiled by the
     * driver; with no list at all, PTX for the device's own architecture */
    *arch = narchs ? best : cc;
}

static em_status device_target(const em_cuda_device *d, int *arch, bool *cubin) {
    int major = 0, minor = 0;
    const char *reason = NULL;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (!nv)
        return em_error(EM_ERR_UNAVAILABLE, "cuda: kernels cannot be compiled: %s", reason);
    int archs[64], n = 0;
    if (nv->nvrtcGetNumSupportedArchs && nv->nvrtcGetSupportedArchs &&
        nv->nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= 64)
        nv->nvrtcGetSupportedArchs(archs);
    else
        n = 0;
    int cc = d->cc_major * 10 + d->cc_minor;
    em__cuda_pick_target(cc, archs, n, arch, cubin);
    if (*arch == 0)
        return em_error(EM_ERR_NOT_SUPPORTED,
                        "cuda: %s has compute capability %d.%d, older than every architecture "
                        "NVRTC %d.%d can compile for (oldest: %d.%d)",
                        d->name, d->cc_major, d->cc_minor, major, minor, archs[0] / 10, archs[0] % 10);
    return EM_OK;
}

/* ---- modules and functions ---- */

char *em__cuda_program_image(const char *name, const char *text, int arch, bool cubin, size_t *size) {
    em_cuda_source src = {name, text};
    /* Matmul may contract multiply-adds, as the CPU's BLAS does; everything else rounds
     * each operation like the CPU (cuda_nvrtc.c). */
    static const char *const contract[] = {"--fmad=true"};
    bool fmad = !strcmp(name, "matmul.k");
    return em__cuda_compile_cached(&src, NULL, 0, arch, cubin, fmad ? contract : NULL, fmad ? 1 : 0, size, NULL);
}

em_status em__cuda_load_module(em_cuda_device *d, const char *name, const char *text,
                               CUmodule *out) {
    int arch = 0;
    bool cubin = false;
    em_status s = device_target(d, &arch, &cubin);
    if (s != EM_OK) return s;
    size_t size = 0;
    char *image = em__cuda_program_image(name, text, arch, cubin, &size);
    if (!image) return em_last_status();
    char log[4096] = "";
    CUjit_option opt[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *val[2] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = em__cuda_api()->cuModuleLoadDataEx(out, image, 2, opt, val);
    free(image);
    if (r != CUDA_SUCCESS) {
        char what[4400];
        snprintf(what, sizeof what, "cuda: loading kernels %s (%s_%d) on %s%s%s", name,
                 cubin ? "sm" : "compute", arch, d->name, log[0] ? ": " : "", log);
        return em__cu_fail(r, what);
    }
    return EM_OK;
}

static em_status load_module(em_cuda_device *d, int prog, CUmodule *out) {
    const char *name = NULL;
    char *text = em__cuda_program_text(prog, &name);
    if (!text) return em_error(EM_ERR_OUT_OF_MEMORY, "cuda: no memory for kernel program text");
    em_status s = em__cuda_load_module(d, name, text, out);
    free(text);
    return s;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Program prog's module on d, compiled and loaded by the first thread that needs it;
 * others needing the same program wait for it, nobody else does. */
static em_status ensure_module(em_cuda_device *d, int prog) {
    if (prog >= EM_CUDA_MAX_MODULES)
        return em_error(EM_ERR_INTERNAL, "cuda: kernel program %d, at most %d", prog, EM_CUDA_MAX_MODULES);
    pthread_mutex_lock(&g_prog_lock[prog]);
    em_status s = EM_OK;
    if (!d->modules[prog].module) { /* written only under this lock (and g_klock) */
        CUmodule m = NULL;
        s = load_module(d, prog, &m);
        if (s == EM_OK) {
            pthread_mutex_lock(&g_klock);
            d->modules[prog].module = m;
            pthread_mutex_unlock(&g_klock);
        }
    }
    pthread_mutex_unlock(&g_prog_lock[prog]);
    return s;
}

/* The function's slot for kernel on d, compiling and loading its program the first time;
 * NULL with an error recorded. */
static func_slot *get_function(em_cuda_device *d, const char *kernel) {
    if (strlen(kernel) >= sizeof ((func_slot *)0)->name) {
        em_error(EM_ERR_INTERNAL, "cuda: kernel name '%s' is too long", kernel);
        return NULL;
    }
    pthread_mutex_lock(&g_klock);
    CUfunction f = NULL;
    func_slot *found = NULL;
    func_slot *slots = d->funcs;
    if (!slots && !(slots = d->funcs = calloc(FUNC_SLOTS, sizeof *slots))) {
        em_error(EM_ERR_OUT_OF_MEMORY, "cuda: no memory for the kernel table");
        goto out;
    }
    size_t i = name_hash(kernel) % FUNC_SLOTS;
    for (size_t probes = 0; probes < FUNC_SLOTS; probes++, i = (i + 1) % FUNC_SLOTS) {
        if (!slots[i].name[0]) break;
        if (!strcmp(slots[i].name, kernel)) { found = &slots[i]; goto out; }
    }
    if (slots[i].name[0]) { em_error(EM_ERR_INTERNAL, "cuda: kernel table full"); goto out; }
    int prog = em__cuda_program_of(kernel);
    if (prog < 0) {
        em_error(EM_ERR_INTERNAL, "cuda: no kernel program defines '%s'", kernel);
        goto out;
    }
    if (prog >= EM_CUDA_MAX_MODULES) {
        em_error(EM_ERR_INTERNAL, "cuda: kernel program %d (%s) exceeds EM_CUDA_MAX_MODULES (%d)",
                 prog, em__kernel_sources[prog].name, EM_CUDA_MAX_MODULES);
        goto out;
    }
    if (!d->modules[prog].module) {
        pthread_mutex_unlock(&g_klock);
        em_status s = ensure_module(d, prog);
        pthread_mutex_lock(&g_klock);
        if (s != EM_OK) goto out;
        /* another thread may have added this kernel meanwhile: look again */
        i = name_hash(kernel) % FUNC_SLOTS;
        for (size_t probes = 0; probes < FUNC_SLOTS; probes++, i = (i + 1) % FUNC_SLOTS) {
            if (!slots[i].name[0]) break;
            if (!strcmp(slots[i].name, kernel)) { found = &slots[i]; goto out; }
        }
        if (slots[i].name[0]) { em_error(EM_ERR_INTERNAL, "cuda: kernel table full"); goto out; }
    }
    CUresult r = em__cuda_api()->cuModuleGetFunction(&f, d->modules[prog].module, kernel);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "cuda: kernel '%s'", kernel);
        em__cu_fail(r, what);
        f = NULL;
        goto out;
    }
    snprintf(slots[i].name, sizeof slots[i].name, "%s", kernel);
    slots[i].f = f;
    slots[i].checked = false;
    slots[i].resident = 0;
    found = &slots[i];
out:
    pthread_mutex_unlock(&g_klock);
    return found;
}

/* Compare the sizes the op layer passes with the kernel's parameters, once per kernel.
 * Only the n parameters passed are asked for: asking for one past the last is an API error
 * (CUDA_ERROR_INVALID_VALUE), which compute-sanitizer reports as such; test_cuda_marshal
 * checks every op's argument count against the compiled PTX without a GPU. */
static em_status check_params(func_slot *slot, const char *kernel, const size_t *sizes, int n) {
    const em_cu_api *cu = em__cuda_api();
    if (!sizes || !cu->cuFuncGetParamInfo || __atomic_load_n(&slot->checked, __ATOMIC_ACQUIRE))
        return EM_OK;
    char want[256] = "", got[256] = "";
    bool ok = true;
    int count = 0;
    for (; count < n; count++) {
        size_t offset = 0, size = 0;
        CUresult r = cu->cuFuncGetParamInfo(slot->f, (size_t)count, &offset, &size);
        if (r != CUDA_SUCCESS && count == 0 && r != CUDA_ERROR_INVALID_VALUE) {
            /* the driver cannot tell (not "no such parameter"): nothing to compare with */
            __atomic_store_n(&slot->checked, true, __ATOMIC_RELEASE);
            return EM_OK;
        }
        if (r != CUDA_SUCCESS) break; /* the kernel takes fewer */
        if (sizes[count] != size) ok = false;
        size_t len = strlen(want);
        snprintf(want + len, sizeof want - len, "%s%zu", count ? "," : "", size);
    }
    if (count != n) ok = false;
    if (!ok) {
        for (int i = 0; i < n; i++) {
            size_t len = strlen(got);
            snprintf(got + len, sizeof got - len, "%s%zu", i ? "," : "", sizes[i]);
        }
        return em_error(EM_ERR_INTERNAL, "cuda: kernel %s takes %d arguments of sizes %s, but was "
                        "given %d of sizes %s (a bug in Ember: the op layer and the kernel disagree)",
                        kernel, count, want, n, got);
    }
    __atomic_store_n(&slot->checked, true, __ATOMIC_RELEASE);
    return EM_OK;
}

static em_status launch_in(int dev, const char *kernel, const size_t grid[3], const size_t block[3],
                           void **params, const size_t *sizes, int nparams, const char *op) {
    em_cuda_device *d = em__cuda_activate(dev, op);
    if (!d) return em_last_status();
    /* The driver's limits; library kernels loop over any excess themselves only in x. */
    if (grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535 ||
        block[0] * block[1] * block[2] > 1024)
        return em_error(EM_ERR_NOT_SUPPORTED,
                        "cuda:%d: %s: launch of %s with grid %zux%zux%zu and block %zux%zux%zu "
                        "exceeds the device's limits", dev, op, kernel, grid[0], grid[1], grid[2],
                        block[0], block[1], block[2]);
    func_slot *slot = get_function(d, kernel);
    if (!slot || check_params(slot, kernel, sizes, nparams) != EM_OK) return em_last_status();
    CUresult r = em__cuda_api()->cuLaunchKernel(slot->f, (unsigned)grid[0], (unsigned)grid[1],
                                                (unsigned)grid[2], (unsigned)block[0],
                                                (unsigned)block[1], (unsigned)block[2], 0,
                                                d->stream, params, NULL);
    if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuda:%d: %s: launching kernel %s", dev, op, kernel);
        return em__cu_fail(r, what);
    }
    return em__cuda_after_launch(d, op, kernel);
}

em_status em__cuda_launch(int dev, const char *kernel, const size_t grid[3], const size_t block[3],
                          void **params, const size_t *sizes, int nparams, const char *op) {
    EM_CUDA_CTX_SCOPED(launch_in(dev, kernel, grid, block, params, sizes, nparams, op));
}

static int resident_blocks_in(int dev, const char *kernel, size_t block) {
    const em_cu_api *cu = em__cuda_api();
    if (!cu || !cu->cuOccupancyMaxActiveBlocksPerMultiprocessor) return 0;
    /* a failure here (say, the program does not compile) is the launch's to report */
    em_error_state saved;
    em__error_save(&saved);
    em_cuda_device *d = em__cuda_activate(dev, "launch");
    func_slot *slot = d ? get_function(d, kernel) : NULL;
    int n = 0;
    if (slot) {
        pthread_mutex_lock(&g_klock);
        if (slot->resident > 0 && slot->resident_block == block) {
            n = slot->resident;
        } else if (cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, slot->f, (int)block, 0) ==
                       CUDA_SUCCESS && n > 0) {
            slot->resident = n;
            slot->resident_block = block;
        } else {
            n = 0;
        }
        pthread_mutex_unlock(&g_klock);
    }
    em__error_restore(&saved);
    return n;
}

int em__cuda_resident_blocks(int dev, const char *kernel, size_t block) {
    CUcontext prev = em__cuda_ctx_save();   /* a user's thread keeps its own context */
    int n = resident_blocks_in(dev, kernel, block);
    em__cuda_ctx_restore(prev);
    return n;
}

void em__cuda_release_device_resources(em_cuda_device *d) {
    pthread_mutex_lock(&g_klock);
    for (int i = 0; i < EM_CUDA_MAX_MODULES; i++)
        if (d->modules[i].module) em__cuda_api()->cuModuleUnload(d->modules[i].module);
    memset(d->modules, 0, sizeof d->modules);
    free(d->funcs);
    d->funcs = NULL;
    pthread_mutex_unlock(&g_klock);
}

#endif
