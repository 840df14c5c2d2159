/* Shared between the CUDA backend's files (devices, errors, kernels, matmul). */
#ifndef EM_BACKENDS_CUDA_INTERNAL_H
#define EM_BACKENDS_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../backend.h"
#include "../../core/tensor_impl.h" /* the tensors of an op call */
#include "cuda_loader.h"

/* ---- reason strings: pure functions, unit-tested without a GPU ---- */

/* Why the backend is unavailable after cuInit returned r (name/desc as the driver spells
 * them): "no device: cuInit returned CUDA_ERROR_NO_DEVICE (...)", "no driver: ...". */
void em__cuda_init_reason(int r, const char *name, const char *desc, char *buf, size_t size);

/* The cache directory shared with the OpenCL backend: EMBER_CACHE_DIR, else
 * $XDG_CACHE_HOME/ember, else $HOME/.cache/ember. Writes "" when none can be named. */
void em__cuda_cache_dir(char *buf, size_t size);

/* The on-disk cache key: a 128-bit hash (hex, 32 chars + NUL) of everything that changes
 * the compiled output: the sources, the target architecture, NVRTC's version, options. */
typedef struct em_cuda_cache_key { char hex[33]; } em_cuda_cache_key;
em_cuda_cache_key em__cuda_cache_key(const char *const *parts, size_t nparts);
/* Look up / store a blob under key in dir (file "cuda-<key>.<ext>"). Load returns a malloc'ed
 * copy with a NUL appended, or NULL; a file whose header line does not match `label` is
 * ignored. Store writes atomically (temp file + rename) and returns false when it could not. */
char *em__cuda_cache_load(const char *dir, em_cuda_cache_key key, const char *ext,
                          const char *label, size_t *size);
bool em__cuda_cache_store(const char *dir, em_cuda_cache_key key, const char *ext,
                          const char *label, const char *data, size_t size);

#ifdef EMBER_HAVE_CUDA_HEADERS

/* ---- errors ---- */
/* "CUDA_ERROR_OUT_OF_MEMORY" and "out of memory", from the driver when it is loaded,
 * else from Ember's own table (never NULL). */
const char *em__cu_name(CUresult r);
const char *em__cu_desc(CUresult r);
/* The Ember status for a driver result (OOM, device, not supported, backend). */
em_status em__cu_status(CUresult r);
/* Record "<what>: CUDA_ERROR_X (description)[; hint]" and return its status. */
em_status em__cu_fail(CUresult r, const char *what);
/* True for the results after which the context is unusable (illegal address, ...). */
bool em__cu_is_sticky(CUresult r);
const char *em__cublas_status_name(cublasStatus_t s);

/* ---- devices ---- */
#define EM_CUDA_MAX_DEVICES 64
#define EM_CUDA_MAX_MODULES 16

typedef struct em_cuda_module { CUmodule module; } em_cuda_module;

typedef struct em_cuda_device {
    CUdevice dev;
    char name[256];
    char pci_bus_id[32];
    int cc_major, cc_minor;
    int sm_count;
    size_t total_mem;
    /* created lazily, on first use of this device only */
    bool active;
    CUcontext ctx;
    CUstream stream;
    CUevent done;                  /* for ordering across devices */
    uint64_t peer_tried;           /* bit i: peer access to cuda:i was tried */
    int index;                     /* its N in cuda:N */
    void *cublas;                  /* cublasHandle_t, created on first matmul */
    em_block cublas_ws;            /* cuBLAS's workspace, from the caching allocator */
    void *cudnn;                   /* cudnnHandle_t, created on first convolution */
    em_cuda_module modules[EM_CUDA_MAX_MODULES]; /* one per kernel program, loaded on use */
    void *funcs;                   /* kernel name -> CUfunction (cuda_kernels.c) */
    char last_op[64];              /* the op queued last, named when sync fails (a copy: a
                                      user kernel's name may be freed before the sync) */
    char last_kernel[96];
    /* graph capture (cuda_graph.c): the stream records instead of running; a call that
     * cannot be recorded (a host wait, a copy from or to the host) is refused and noted in
     * capture_broken, and the capture's end then drops the recording with that reason */
    bool capturing;
    char capture_broken[192];
} em_cuda_device;

/* The driver table once the backend is initialised (NULL before or when unavailable). */
const em_cu_api *em__cuda_api(void);
int em__cuda_count(void);
/* Device record without activating it (NULL and an error if index is out of range). */
em_cuda_device *em__cuda_device(int index);
/* The device with its context current on this thread and its stream ready (creating
 * them the first time); NULL with an error recorded on failure. */
em_cuda_device *em__cuda_activate(int index, const char *op);
/* The calling thread's current context, and giving it back: every backend entry point
 * that makes a device's context current restores the caller's on return, so that a
 * user's thread (or one also using the CUDA runtime) is never left on another context. */
CUcontext em__cuda_ctx_save(void);
void em__cuda_ctx_restore(CUcontext prev);
/* return call's status with the caller's context restored */
#define EM_CUDA_CTX_SCOPED(call)                      \
    do {                                              \
        CUcontext em_prev_ = em__cuda_ctx_save();     \
        em_status em_s_ = (call);                     \
        em__cuda_ctx_restore(em_prev_);               \
        return em_s_;                                 \
    } while (0)
/* Note the op queued last on d; with EMBER_CUDA_LAUNCH_BLOCKING=1 also wait for it, so an
 * error in queued work is reported by the op that caused it. */
em_status em__cuda_after_launch(em_cuda_device *d, const char *op, const char *kernel);
/* During a graph capture on d: refuse `what` (it cannot be recorded), note it so that the
 * capture's end names it, and return the error. EM_OK when d is not capturing. */
em_status em__cuda_refuse_in_capture(em_cuda_device *d, const char *what);
/* The graph entries of the backend table (cuda_graph.c). */
bool em__cuda_graph_available(int index, const char **reason);
em_status em__cuda_graph_begin(int index);
em_status em__cuda_graph_end(int index, void **graph);
em_status em__cuda_graph_launch(int index, void *graph);
void em__cuda_graph_destroy(int index, void *graph);

/* The virtual-memory entries of the backend table (cuda_vmm.c; backend.h says what each does). */
size_t em__cuda_vm_granularity(int index);
em_status em__cuda_vm_reserve(int index, size_t size, void **base);
em_status em__cuda_vm_map(int index, void *base, size_t offset, size_t size);
void em__cuda_vm_unmap(int index, void *base, size_t offset, size_t size);
void em__cuda_vm_release(int index, void *base, size_t size);

/* Wait for d's stream; a failure names the last op queued. */
em_status em__cuda_sync_device(em_cuda_device *d, const char *why);

/* ---- the device pointer of a tensor's first element ---- */
static inline CUdeviceptr em__cuda_ptr(const em_tensor *t) {
    return (CUdeviceptr)(uintptr_t)t->storage->block.handle + t->storage->block.offset +
           (CUdeviceptr)t->offset * em_dtype_size(t->dtype);
}

/* ---- NVRTC (cuda_nvrtc.c); usable without a GPU ---- */
typedef struct em_cuda_source {
    const char *name;       /* "elementwise.k": names the program in messages */
    const char *text;
} em_cuda_source;

/* Compile `main` with the given headers (included by name) and extra options, for
 * compute_<arch> as PTX or, with cubin, for sm_<arch> as a CUBIN (arch 80 is 8.0).
 * Always defines EMK_CUDA and EMK_HAS_F64 and passes -default-device, and --fmad=false
 * unless extra_opts has a --fmad= of its own. Returns malloc'ed
 * code (NUL appended) and its size, or NULL with an error naming the program and
 * quoting NVRTC's log. */
char *em__cuda_compile(const em_cuda_source *main, const em_cuda_source *headers, int nheaders,
                       int arch, bool cubin, const char *const *extra_opts, int nextra,
                       size_t *out_size);
/* The same through the disk cache (key: sources, arch, NVRTC version, options). */
char *em__cuda_compile_cached(const em_cuda_source *main, const em_cuda_source *headers,
                              int nheaders, int arch, bool cubin, const char *const *extra_opts,
                              int nextra, size_t *out_size, bool *from_cache);

/* ---- cuDNN convolutions (cuda_cudnn.c): the backend table's conv2d entries ----
 * EM_ERR_NOT_SUPPORTED with nothing recorded (core then runs im2col + matmul on Ember's
 * kernels) when cuDNN is off or absent, the dtype is not f32/f16/bf16, a size passes int, or
 * cuDNN refuses or fails the call (traced with EMBER_CUDA_TRACE=1). */
em_status em__cuda_conv2d(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                          const em_window2d *g, int64_t groups);
em_status em__cuda_conv2d_backward_input(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                         const em_window2d *g, int64_t groups);
em_status em__cuda_conv2d_backward_weight(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                          const em_window2d *g, int64_t groups);
/* Destroy d's cuDNN handle (its context current). */
void em__cuda_cudnn_release(em_cuda_device *d);

/* Unload d's modules and forget its functions (its context current). */
void em__cuda_release_device_resources(em_cuda_device *d);

/* Tests: forget every device and loaded table so a fake driver can be installed. */
void em__cuda_backend_reset(void);

#endif /* EMBER_HAVE_CUDA_HEADERS */
#endif
