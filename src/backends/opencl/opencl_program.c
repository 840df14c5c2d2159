/* OpenCL programs: built once per device, cached on disk, and the launcher that the
 * shared GPU op layer calls.
 *
 * The disk cache keeps clGetProgramInfo(CL_PROGRAM_BINARIES) under
 * $EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember, in a file named by
 * a 128-bit hash of (program text, build options, device name, driver version). A
 * binary the driver rejects is rebuilt from source and rewritten; a cache that cannot be
 * written is skipped silently (it only costs time).
 *
 * PoCL is the exception for Ember's own (large) program: PoCL compiles kernels lazily at
 * their first launch and keeps them in its own cache (~40 ms rebuilds), but exporting
 * CL_PROGRAM_BINARIES makes it compile all ~220 kernels at once (minutes, against seconds
 * for a lazy first use). So on PoCL the library binary is read from the cache but
 * not written; users' kernels (small) are cached everywhere. EMBER_OPENCL_CACHE=on forces
 * writing, EMBER_OPENCL_CACHE=off disables the cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../../util/errors.h"
#include "../../kernels/kernel_text.h"
#include "opencl_internal.h"

#define OCL_BUILD_OPTIONS "-cl-std=CL1.2"
#define OCL_CACHE_VERSION "ember-opencl-cache-1"

/* ---- the disk cache ---- */

static bool cache_dir(char *out, size_t n) {
    const char *e = getenv("EMBER_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e && *e) snprintf(out, n, "%s", e);
    else if (x && *x) snprintf(out, n, "%s/ember", x);
    else if (h && *h) snprintf(out, n, "%s/.cache/ember", h);
    else return false;
    /* mkdir -p */
    for (char *p = out + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(out, 0755) != 0 && errno != EEXIST) return false;
            *p = c;
            if (!c) break;
        }
    }
    return true;
}

static bool cache_path(const ocl_device *d, const char *source, char *out, size_t n) {
    char dir[512];
    if (!cache_dir(dir, sizeof dir)) return false;
    const char *parts[] = {source, OCL_BUILD_OPTIONS, d->props.name, d->props.driver,
                           OCL_CACHE_VERSION};
    uint64_t h1 = EM_FNV_START, h2 = EM_FNV_START ^ 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t len = strlen(parts[i]) + 1; /* the NUL separates the parts */
        h1 = em__fnv1a(h1, parts[i], len);
        h2 = em__fnv1a(h2 * 31 + 7, parts[i], len);
    }
    snprintf(out, n, "%s/opencl-%016llx%016llx.bin", dir, (unsigned long long)h1,
             (unsigned long long)h2);
    return true;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

static void write_cache(const ocl_device *d, cl_program p, const char *path) {
    size_t len = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) != CL_SUCCESS || !len)
        return;
    unsigned char *bin = malloc(len);
    if (!bin) return;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) {
        char tmp[640];
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(bin, 1, len, f) == len;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, path) != 0) remove(tmp);
        }
    }
    (void)d;
    free(bin);
}

static cl_program from_cache(ocl_device *d, const char *path) {
    size_t len = 0;
    unsigned char *bin = read_file(path, &len);
    if (!bin) return NULL;
    cl_int e, bs = CL_SUCCESS;
    const unsigned char *bp = bin;
    cl_program p = clCreateProgramWithBinary(d->ctx, 1, &d->id, &len, &bp, &bs, &e);
    free(bin);
    if (e != CL_SUCCESS || bs != CL_SUCCESS) {
        if (p) clReleaseProgram(p);
        return NULL;
    }
    if (clBuildProgram(p, 1, &d->id, OCL_BUILD_OPTIONS, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(p);
        return NULL;
    }
    return p;
}

cl_program em__ocl_build(ocl_device *d, const char *source, const char *what, bool write,
                         cl_int *cl_err) {
    char path[600];
    const char *env = getenv("EMBER_OPENCL_CACHE");
    bool off = env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0);
    bool on = env && (strcmp(env, "1") == 0 || strcmp(env, "on") == 0);
    write = !off && (on || write);
    bool cacheable = !off && cache_path(d, source, path, sizeof path);
    cl_program p = cacheable ? from_cache(d, path) : NULL;
    if (p) return p;
    cl_int e;
    p = clCreateProgramWithSource(d->ctx, 1, &source, NULL, &e);
    if (cl_err) *cl_err = e;
    if (e != CL_SUCCESS) {
        em_error(EM_ERR_BACKEND, "%s: clCreateProgramWithSource for %s failed: %s", d->props.name,
                 what, em__ocl_err_name(e));
        return NULL;
    }
    e = clBuildProgram(p, 1, &d->id, OCL_BUILD_OPTIONS, NULL, NULL);
    if (cl_err) *cl_err = e;
    if (e != CL_SUCCESS) {
        size_t n = 0;
        clGetProgramBuildInfo(p, d->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
        char *log = malloc(n + 1);
        if (log) {
            log[0] = 0;
            clGetProgramBuildInfo(p, d->id, CL_PROGRAM_BUILD_LOG, n, log, NULL);
            log[n] = 0;
        }
        em_error(EM_ERR_BACKEND, "%s: building %s failed (%s); compiler log:\n%s", d->props.name,
                 what, em__ocl_err_name(e), log ? log : "(no log)");
        free(log);
        clReleaseProgram(p);
        return NULL;
    }
    if (cacheable && write) write_cache(d, p, path);
    return p;
}

/* ---- Ember's own program and its kernels, per device ---- */

static em_status ensure_program(ocl_device *d, int index) {
    if (d->program) return EM_OK;
    if (d->build_status != EM_OK) return em_error(d->build_status, "%s", d->build_error);
    char *lib = em__kernel_program(EM_DIALECT_OPENCL, d->has_f64, NULL);
    /* CPU devices: contiguous chunks per thread instead of GPU-style striding (layout.h) */
    const char *cpu = d->is_cpu ? "#define EMK_CPU 1\n" : "";
    size_t n = lib ? strlen(cpu) + strlen(lib) + 1 : 0;
    char *text = lib ? malloc(n) : NULL;
    if (text) snprintf(text, n, "%s%s", cpu, lib);
    free(lib);
    if (!text) return em_error(EM_ERR_OUT_OF_MEMORY, "no host memory for the kernel source");
    char what[64];
    snprintf(what, sizeof what, "Ember's kernels for opencl:%d", index);
    cl_int err = CL_SUCCESS;
    d->program = em__ocl_build(d, text, what, !d->is_pocl, &err);
    free(text);
    if (d->program) return EM_OK;
    /* a driver short of memory or resources may build it next time: not kept */
    if (err != CL_BUILD_PROGRAM_FAILURE) return em_last_status();
    /* a compile error is: keep it (and its log) so later ops report it without rebuilding */
    d->build_status = em_last_status();
    d->build_error = strdup(em_last_error());
    return d->build_status;
}

static size_t hash_name(const char *s) { return (size_t)em__fnv1a(EM_FNV_START, s, strlen(s)); }

static cl_kernel find_kernel(ocl_device *d, int index, const char *name) {
    if (d->nslots) {
        for (size_t i = hash_name(name) & (d->nslots - 1);; i = (i + 1) & (d->nslots - 1)) {
            if (!d->slots[i].name) break;
            if (strcmp(d->slots[i].name, name) == 0) return d->slots[i].kernel;
        }
    }
    cl_int e;
    cl_kernel k = clCreateKernel(d->program, name, &e);
    if (e != CL_SUCCESS) {
        size_t n = strlen(name);
        if (!d->has_f64 && n > 4 && strcmp(name + n - 4, "_f64") == 0)
            em_error(EM_ERR_NOT_SUPPORTED, "opencl:%d (%s) has no double precision "
                     "(cl_khr_fp64): float64 ops cannot run there", index, d->props.name);
        else
            em_error(EM_ERR_NOT_SUPPORTED, "opencl:%d: Ember has no kernel '%s' (%s)", index, name,
                     em__ocl_err_name(e));
        return NULL;
    }
    /* grow at half load; the table only ever gains entries */
    size_t used = 0;
    for (size_t i = 0; i < d->nslots; i++) used += d->slots[i].name != NULL;
    if (2 * (used + 1) > d->nslots) {
        size_t nn = d->nslots ? d->nslots * 2 : 64;
        ocl_kernel_slot *ns = calloc(nn, sizeof *ns);
        if (!ns) {
            clReleaseKernel(k);
            em_error(EM_ERR_OUT_OF_MEMORY, "no host memory for the kernel table");
            return NULL;
        }
        for (size_t i = 0; i < d->nslots; i++) {
            if (!d->slots[i].name) continue;
            size_t j = hash_name(d->slots[i].name) & (nn - 1);
            while (ns[j].name) j = (j + 1) & (nn - 1);
            ns[j] = d->slots[i];
        }
        free(d->slots);
        d->slots = ns;
        d->nslots = nn;
    }
    char *copy = strdup(name);
    if (!copy) {
        clReleaseKernel(k);
        em_error(EM_ERR_OUT_OF_MEMORY, "no host memory for the kernel table");
        return NULL;
    }
    size_t j = hash_name(name) & (d->nslots - 1);
    while (d->slots[j].name) j = (j + 1) & (d->nslots - 1);
    d->slots[j].name = copy;
    d->slots[j].kernel = k;
    return k;
}

em_status em__ocl_set_args(cl_kernel k, int nargs, const em_karg *args, const char *what) {
    for (int i = 0; i < nargs; i++) {
        const em_karg *a = &args[i];
        cl_int e;
        switch (a->kind) {
        case EM_KARG_BUF: { cl_mem m = (cl_mem)a->v.buf; e = clSetKernelArg(k, (cl_uint)i, sizeof m, &m); break; }
        case EM_KARG_I32: e = clSetKernelArg(k, (cl_uint)i, sizeof(cl_int), &a->v.i32); break;
        case EM_KARG_I64: e = clSetKernelArg(k, (cl_uint)i, sizeof(cl_long), &a->v.i64); break;
        case EM_KARG_F32: e = clSetKernelArg(k, (cl_uint)i, sizeof(cl_float), &a->v.f32); break;
        case EM_KARG_F64: e = clSetKernelArg(k, (cl_uint)i, sizeof(cl_double), &a->v.f64); break;
        case EM_KARG_BYTES: e = clSetKernelArg(k, (cl_uint)i, a->v.bytes.size, a->v.bytes.p); break;
        default: e = CL_INVALID_ARG_VALUE; break;
        }
        if (e != CL_SUCCESS) {
            bool user = e == CL_INVALID_ARG_SIZE || e == CL_INVALID_ARG_VALUE ||
                        e == CL_INVALID_MEM_OBJECT;
            return em_error(user ? EM_ERR_ARGUMENT : EM_ERR_BACKEND,
                            "%s: argument %d: clSetKernelArg failed: %s%s", what, i,
                            em__ocl_err_name(e),
                            user ? " (the kernel's parameter has another type or size)" : "");
        }
    }
    return EM_OK;
}

static em_status ocl_launch(int index, const char *kernel, const size_t grid[3],
                            const size_t block[3], int nargs, const em_karg *args, const char *op) {
    ocl_device *d = em__ocl_device(index);
    if (!d) return em_error(EM_ERR_DEVICE, "%s: opencl:%d does not exist", op, index);
    if (block[0] * block[1] * block[2] > d->max_block)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: opencl:%d (%s) allows %zu threads per block, "
                        "the kernel needs %zu", op, index, d->props.name, d->max_block,
                        block[0] * block[1] * block[2]);
    pthread_mutex_lock(&d->lock);
    em_status s = ensure_program(d, index);
    cl_kernel k = s == EM_OK ? find_kernel(d, index, kernel) : NULL;
    if (k) s = em__ocl_set_args(k, nargs, args, op);
    else if (s == EM_OK) s = em_last_status();
    if (s == EM_OK) {
        size_t global[3] = {grid[0] * block[0], grid[1] * block[1], grid[2] * block[2]};
        cl_uint dims = (grid[2] > 1 || block[2] > 1) ? 3 : (grid[1] > 1 || block[1] > 1) ? 2 : 1;
        cl_int e = clEnqueueNDRangeKernel(d->queue, k, dims, NULL, global, block, 0, NULL, NULL);
        if (e != CL_SUCCESS)
            s = em_error(EM_ERR_BACKEND, "%s on opencl:%d: launching kernel %s failed: %s", op,
                         index, kernel, em__ocl_err_name(e));
        else
            em__ocl_note_op(d, op);
    }
    pthread_mutex_unlock(&d->lock);
    return s;
}

static void ocl_info(int index, em_gpu_info *out) {
    ocl_device *d = em__ocl_device(index);
    out->compute_units = d ? d->props.compute_units : 1;
    out->has_f64 = d ? d->has_f64 : false;
    out->max_block = d ? d->max_block : 0;
    out->is_cpu = d ? d->is_cpu : false;
}

static em_status ocl_gemm(int dev, const em_gemm_args *g) { return em__ocl_clblast_gemm(dev, g); }

const em_gpu em__ocl_gpu = {
    .name = "opencl",
    .launch = ocl_launch,
    .info = ocl_info,
    .gemm = ocl_gemm,
    .compile = em__ocl_uk_compile,
    .launch_compiled = em__ocl_uk_launch,
    .release = em__ocl_uk_release,
};
