/* Devices: small values {type, index}, parsed from and printed as PyTorch's
 * strings ("cpu", "cuda", "cuda:1", "opencl:0", "mps"). */
#ifndef EMBER_DEVICE_H
#define EMBER_DEVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/dtype.h>
#include <ember/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds of device, numbered as Ember's registry knows them. */
typedef enum em_device_type {
    EM_CPU = 0,
    EM_CUDA = 1,
    EM_MPS = 2,
    EM_OPENCL = 3,
    EM_DEVICE_TYPE_COUNT
} em_device_type;

/* index -1 means "the current device of that type" (as torch.device('cuda') does);
 * CPU is always index 0. A zeroed em_device is the CPU. */
typedef struct em_device {
    em_device_type type; /* cpu, cuda, mps or opencl */
    int index;           /* which device of that type; -1: the current one */
} em_device;

#define EM_DEVICE_CPU ((em_device){EM_CPU, 0}) /* the CPU */
#define EM_DEVICE(type_, index_) ((em_device){(type_), (index_)}) /* EM_DEVICE(EM_CUDA, 1) is cuda:1 */

/* A device printed into a value, so it can be used inside printf: em_device_str(d).s */
typedef struct em_device_string { char s[32]; /* "cuda:1" */ } em_device_string;

/* Parse "cpu", "cuda", "cuda:N", "opencl", "opencl:N", "mps", "mps:0".
 * A bad string is EM_ERR_ARGUMENT with a message listing the accepted forms. */
EM_API em_status em_device_parse(const char *s, em_device *out);
EM_API em_device_string em_device_str(em_device d); /* "cpu", "cuda:1", "opencl:0" */
/* The lowercase type name: "cpu", "cuda", "mps", "opencl". */
EM_API const char *em_device_type_name(em_device_type t);
/* Equal after resolving index -1 to the current device of the type. */
EM_API bool em_device_equal(em_device a, em_device b);
/* Replace index -1 by the current device of the type (CPU gives index 0). */
EM_API em_device em_device_resolve(em_device d);

/* torch.cuda.is_available() and friends, for any type. */
EM_API bool em_device_available(em_device_type t);
EM_API int em_device_count(em_device_type t); /* devices of type t (0 when unavailable) */
/* Why a type is not available ("no driver: libcuda.so.1 not found"), or NULL if it is. */
EM_API const char *em_device_unavailable_reason(em_device_type t);

/* What a device is (em_device_get_props). */
typedef struct em_device_props {
    char name[256];          /* the hardware's name, e.g. "NVIDIA H100 80GB HBM3" */
    char vendor[128];        /* the maker, as the driver names it */
    char driver[128];        /* driver / runtime version, where known */
    int64_t total_memory;    /* bytes */
    int64_t free_memory;     /* bytes, or -1 when the device cannot tell */
    int compute_units;       /* SMs, OpenCL compute units, or CPU cores */
    int compute_capability;  /* CUDA: major*10+minor; 0 elsewhere */
    bool is_gpu;             /* a GPU (not a CPU behind OpenCL) */
} em_device_props;

/* Properties of one existing device; EM_ERR_DEVICE if it does not exist. */
EM_API em_status em_device_get_props(em_device d, em_device_props *out);

/* Auto-selection: CUDA, then MPS, then an OpenCL GPU, then the CPU.
 * The environment variable EMBER_DEVICE (e.g. "cpu", "opencl:1") overrides it. */
EM_API em_device em_device_auto(void);
/* One line that says why em_device_auto() chose what it chose. */
EM_API const char *em_device_auto_reason(void);

/* The current device of a type (the one "cuda" without an index means). */
EM_API em_device em_device_current(em_device_type t);
EM_API em_status em_device_set_current(em_device d); /* on this thread; EM_ERR_DEVICE if d does not exist */

/* A current-device guard: set a device current, then restore the previous one.
 *   em_device_guard g = em_device_guard_begin(EM_DEVICE(EM_CUDA, 1)); ... em_device_guard_end(g); */
typedef struct em_device_guard { em_device previous; /* the device to restore */ bool active; /* whether begin changed it */ } em_device_guard;
EM_API em_device_guard em_device_guard_begin(em_device d); /* make d current (an error if it does not exist) */
EM_API void em_device_guard_end(em_device_guard g);        /* restore what begin replaced */

/* Wait for all work queued on a device. Errors from queued work surface here. */
EM_API em_status em_device_synchronize(em_device d);

/* CPU threads used by Ember's kernels (default: the number of cores). */
EM_API void em_set_num_threads(int n);
EM_API int em_get_num_threads(void); /* the threads em_set_num_threads set */

/* Like torch.set_flush_denormal: with `on`, subnormal floats are flushed to zero (results,
 * FTZ) and read as zero (inputs, DAZ) on the calling thread and on Ember's CPU worker
 * threads (each applies it before its next job); `false` turns both off again. Faster
 * arithmetic where values underflow, at the cost of IEEE gradual underflow. Returns true
 * when the CPU supports it (x86-64); elsewhere returns false and changes nothing. Off by
 * default: Ember never changes the floating-point environment unless asked. (Ember's fused
 * optimizer steps store subnormal state as zero either way.) */
EM_API bool em_set_flush_denormal(bool on);
/* Whether em_set_flush_denormal(true) is in effect. */
EM_API bool em_get_flush_denormal(void);

/* The CPU's vector features Ember can use, as one line of names, e.g.
 * "sse4.2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 amx_tile amx_bf16", or "none"
 * (not x86-64). Static storage; never NULL. */
EM_API const char *em_cpu_features(void);
/* The widest FMA the CPU runs, for the FP32 peak: 16 (AVX-512F), 8 (AVX2 + FMA), or 0 (no
 * FMA: SSE multiply and add, 4 lanes). */
EM_API int em_cpu_fma_lanes(void);
/* How the CPU backend multiplies matrices of dt (matmul, addmm, linear), as one line: for
 * f32/f64 the GEMM library ("OpenBLAS 0.3.21 (...)"), for bf16/f16 the oneDNN kernel and
 * its ISA ("oneDNN 2.6.3 brg:avx512_core_amx_bf16 (ISA avx512_core_amx), float32
 * accumulation") or why it converts to float32 instead (no AVX512-BF16/AMX, no oneDNN, or
 * EMBER_CPU_LOWP_GEMM=portable). NULL for integer and bool dtypes. Static storage. */
EM_API const char *em_cpu_matmul_impl(em_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
