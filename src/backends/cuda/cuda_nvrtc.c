/* Shared kernel sources -> PTX with NVRTC (needs no GPU), through the disk cache. */
#include "cuda_internal.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"

#define MAX_HEADERS 16
#define MAX_OPTS 24

/* The options every kernel is compiled with, then the caller's. */
static int build_options(int arch, bool cubin, const char *const *extra, int nextra,
                         char *arch_opt, size_t arch_size, const char **opts) {
    snprintf(arch_opt, arch_size, "--gpu-architecture=%s_%d", cubin ? "sm" : "compute", arch);
    int n = 0;
    opts[n++] = arch_opt;
    opts[n++] = "-default-device";  /* helpers need no __device__: the dialects stay alike */
    opts[n++] = "-DEMK_CUDA=1";    /* compat.h spells the kernel dialect for CUDA */
    opts[n++] = "-DEMK_HAS_F64=1"; /* every CUDA device has double precision */
    /* No contraction of a * b + c into one fused multiply-add, unless the caller asks:
     * the CPU (built without -mfma) rounds both, and arange/linspace/elementwise results
     * must match it to the last bit. */
    bool fmad_given = false;
    for (int i = 0; i < nextra; i++) fmad_given |= !strncmp(extra[i], "--fmad=", 7);
    if (!fmad_given) opts[n++] = "--fmad=false";
    for (int i = 0; i < nextra && n < MAX_OPTS; i++) opts[n++] = extra[i];
    return n;
}

char *em__cuda_compile(const em_cuda_source *main, const em_cuda_source *headers, int nheaders,
                       int arch, bool cubin, const char *const *extra_opts, int nextra,
                       size_t *out_size) {
    int major = 0, minor = 0;
    const char *reason = NULL;
    const em_nvrtc_api *nv = em__cuda_nvrtc(&major, &minor, &reason);
    if (!nv) {
        em_error(EM_ERR_UNAVAILABLE, "cuda: cannot compile kernels from %s: %s", main->name, reason);
        return NULL;
    }
    if (nheaders > MAX_HEADERS) {
        em_error(EM_ERR_INTERNAL, "cuda: %d kernel headers given, at most %d", nheaders, MAX_HEADERS);
        return NULL;
    }
    const char *hsrc[MAX_HEADERS], *hname[MAX_HEADERS];
    for (int i = 0; i < nheaders; i++) { hsrc[i] = headers[i].text; hname[i] = headers[i].name; }

    nvrtcProgram prog;
    nvrtcResult r = nv->nvrtcCreateProgram(&prog, main->text, main->name, nheaders, hsrc, hname);
    if (r != NVRTC_SUCCESS) {
        em_error(EM_ERR_BACKEND, "cuda: nvrtcCreateProgram(%s) failed: %s", main->name,
                 nv->nvrtcGetErrorString(r));
        return NULL;
    }
    const char *opts[MAX_OPTS + 1];
    char arch_opt[64];
    int nopts = build_options(arch, cubin, extra_opts, nextra, arch_opt, sizeof arch_opt, opts);
    /* NVRTC's optimizer and code generator work on the program's kernels in parallel, on
     * every core (--split-compile=0; the code is the same, so the cache key leaves it out),
     * which shortens a cold cache's first compile (docs/BENCHMARKS.md).
     * An NVRTC that does not know the option is asked again without it, on a new program. */
    opts[nopts] = "--split-compile=0";
    r = nv->nvrtcCompileProgram(prog, nopts + 1, opts);
    if (r == NVRTC_ERROR_INVALID_OPTION) {
        nv->nvrtcDestroyProgram(&prog);
        r = nv->nvrtcCreateProgram(&prog, main->text, main->name, nheaders, hsrc, hname);
        if (r != NVRTC_SUCCESS) {
            em_error(EM_ERR_BACKEND, "cuda: nvrtcCreateProgram(%s) failed: %s", main->name,
                     nv->nvrtcGetErrorString(r));
            return NULL;
        }
        r = nv->nvrtcCompileProgram(prog, nopts, opts);
    }
    char *ptx = NULL;
    if (r != NVRTC_SUCCESS) {
        size_t log_size = 0;
        char *log = NULL;
        if (nv->nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1 &&
            (log = malloc(log_size)) && nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
            log[0] = '\0';
        /* The first lines of the log name the file, line and error; keep the message short. */
        em_error(EM_ERR_BACKEND, "cuda: NVRTC %d.%d could not compile %s for %s (%s):\n%.1500s",
                 major, minor, main->name, arch_opt + strlen("--gpu-architecture="), nv->nvrtcGetErrorString(r),
                 log ? log : "(no log)");
        free(log);
        goto done;
    }
    size_t n = 0;
    nvrtcResult (*get_size)(nvrtcProgram, size_t *) = cubin ? nv->nvrtcGetCUBINSize : nv->nvrtcGetPTXSize;
    nvrtcResult (*get)(nvrtcProgram, char *) = cubin ? nv->nvrtcGetCUBIN : nv->nvrtcGetPTX;
    if (!get_size || !get || get_size(prog, &n) != NVRTC_SUCCESS || n == 0 || !(ptx = malloc(n + 1))) {
        em_error(EM_ERR_BACKEND, "cuda: NVRTC gave no %s for %s", cubin ? "CUBIN" : "PTX", main->name);
        goto done;
    }
    if (get(prog, ptx) != NVRTC_SUCCESS) {
        em_error(EM_ERR_BACKEND, "cuda: NVRTC could not hand over the code of %s", main->name);
        free(ptx);
        ptx = NULL;
        goto done;
    }
    ptx[n] = '\0';
    /* NVRTC counts PTX's terminating NUL; a CUBIN is binary and sized exactly */
    if (out_size) *out_size = cubin ? n : strlen(ptx);
done:
    nv->nvrtcDestroyProgram(&prog);
    return ptx;
}

char *em__cuda_compile_cached(const em_cuda_source *main, const em_cuda_source *headers,
                              int nheaders, int arch, bool cubin, const char *const *extra_opts,
                              int nextra, size_t *out_size, bool *from_cache) {
    if (from_cache) *from_cache = false;
    int major = 0, minor = 0;
    const char *reason = NULL;
    if (!em__cuda_nvrtc(&major, &minor, &reason) || nheaders > MAX_HEADERS)
        return em__cuda_compile(main, headers, nheaders, arch, cubin, extra_opts, nextra, out_size);

    /* Everything that changes the PTX goes into the key. */
    const char *opts[MAX_OPTS];
    char arch_opt[64], version[32];
    int nopts = build_options(arch, cubin, extra_opts, nextra, arch_opt, sizeof arch_opt, opts);
    snprintf(version, sizeof version, "nvrtc %d.%d", major, minor);
    const char *parts[2 + 2 * MAX_HEADERS + MAX_OPTS + 1];
    size_t np = 0;
    parts[np++] = version;
    parts[np++] = main->text;
    for (int i = 0; i < nheaders; i++) { parts[np++] = headers[i].name; parts[np++] = headers[i].text; }
    for (int i = 0; i < nopts; i++) parts[np++] = opts[i];
    em_cuda_cache_key key = em__cuda_cache_key(parts, np);

    char dir[1024], label[256];
    em__cuda_cache_dir(dir, sizeof dir);
    snprintf(label, sizeof label, "%s %s %s %s", main->name, arch_opt + strlen("--gpu-architecture="), version, key.hex);
    char *ptx = em__cuda_cache_load(dir, key, cubin ? "cubin" : "ptx", label, out_size);
    if (ptx) {
        if (from_cache) *from_cache = true;
        return ptx;
    }
    size_t n = 0;
    ptx = em__cuda_compile(main, headers, nheaders, arch, cubin, extra_opts, nextra, &n);
    if (ptx) {
        if (out_size) *out_size = n;
        /* A cache that cannot be written only costs time: no error. */
        if (!em__cuda_cache_store(dir, key, cubin ? "cubin" : "ptx", label, ptx, n) && em__cuda_trace_enabled())
            fprintf(stderr, "ember: cuda: could not write the kernel cache in %s\n", dir);
    }
    return ptx;
}

#endif
