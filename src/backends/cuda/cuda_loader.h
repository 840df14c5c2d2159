/* Finding CUDA at run time (Blender's cuew and PyTorch's lazy init are the models).
 *
 * Nothing CUDA is linked: the driver (libcuda.so.1), NVRTC, cuBLAS/cuBLASLt, NVML and
 * NCCL are dlopen'ed on first use, each once. Function pointers are typed from the real
 * headers (EMBER_HAVE_CUDA_HEADERS) and resolved by the symbol the headers select, so
 * cuMemAlloc resolves "cuMemAlloc_v2" exactly as a linked program would.
 *
 * Search order for every library: each directory in EMBER_CUDA_PATH (colon-separated;
 * DIR and DIR/lib64), then the dynamic linker's default paths, then /usr/local/cuda/lib64.
 * EMBER_CUDA_TRACE=1 prints every place looked in to stderr. Stub libraries (a path
 * containing "/stubs/") are refused: they exist for linking, never for running. */
#ifndef EM_BACKENDS_CUDA_LOADER_H
#define EM_BACKENDS_CUDA_LOADER_H

#include <stdbool.h>
#include <stddef.h>

/* ---- the search, usable without CUDA headers ---- */

/* dlopen the first of `names` found in the search order. On success returns the handle
 * and writes the file's full path to found; on failure returns NULL and writes the places
 * looked in ("EMBER_CUDA_PATH=/x, the default library path, /usr/local/cuda/lib64") to
 * looked. `what` names the library in trace lines. */
void *em__cuda_dlopen(const char *what, const char *const *names, char *found,
                      size_t found_size, char *looked, size_t looked_size);

/* True when EMBER_CUDA_TRACE is set to a non-zero value. */
bool em__cuda_trace_enabled(void);

/* ---- NVML: the toolkit ships no nvml.h, so the stable subset Ember uses is declared
 * here from NVIDIA's NVML reference (these signatures have not changed since NVML 5). ---- */
typedef int em_nvml_return;                 /* nvmlReturn_t; 0 is NVML_SUCCESS */
typedef struct em_nvml_device_st *em_nvml_device;
typedef struct em_nvml_memory { unsigned long long total, free, used; } em_nvml_memory;
typedef struct em_nvml_utilization { unsigned int gpu, memory; } em_nvml_utilization;
/* nvmlMemory_v2_t: `used` excludes the memory the driver reserves, as nvidia-smi shows it
 * (v1's used counts it); version = sizeof | 2 << 24 (NVML_STRUCT_VERSION). */
typedef struct em_nvml_memory_v2 {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} em_nvml_memory_v2;
#define EM_NVML_MEMORY_V2 ((unsigned int)(sizeof(em_nvml_memory_v2) | (2u << 24)))
/* nvmlTemperature_v1_t, for nvmlDeviceGetTemperatureV (nvmlDeviceGetTemperature is deprecated). */
typedef struct em_nvml_temperature {
    unsigned int version;
    int sensor_type;
    int temperature;
} em_nvml_temperature;
#define EM_NVML_TEMPERATURE_V1 ((unsigned int)(sizeof(em_nvml_temperature) | (1u << 24)))
#define EM_NVML_SUCCESS 0
#define EM_NVML_TEMPERATURE_GPU 0

typedef struct em_nvml_api {
    em_nvml_return (*nvmlInit_v2)(void);
    em_nvml_return (*nvmlShutdown)(void);
    const char *(*nvmlErrorString)(em_nvml_return r);
    em_nvml_return (*nvmlSystemGetDriverVersion)(char *version, unsigned int length);
    em_nvml_return (*nvmlSystemGetCudaDriverVersion_v2)(int *version);      /* optional */
    em_nvml_return (*nvmlDeviceGetCount_v2)(unsigned int *count);
    em_nvml_return (*nvmlDeviceGetHandleByIndex_v2)(unsigned int index, em_nvml_device *dev);
    em_nvml_return (*nvmlDeviceGetHandleByPciBusId_v2)(const char *bus_id, em_nvml_device *dev);
    em_nvml_return (*nvmlDeviceGetName)(em_nvml_device dev, char *name, unsigned int length);
    em_nvml_return (*nvmlDeviceGetMemoryInfo)(em_nvml_device dev, em_nvml_memory *mem);
    em_nvml_return (*nvmlDeviceGetMemoryInfo_v2)(em_nvml_device dev, em_nvml_memory_v2 *mem); /* optional */
    em_nvml_return (*nvmlDeviceGetUtilizationRates)(em_nvml_device dev, em_nvml_utilization *u);
    em_nvml_return (*nvmlDeviceGetTemperature)(em_nvml_device dev, int sensor, unsigned int *temp); /* optional */
    em_nvml_return (*nvmlDeviceGetTemperatureV)(em_nvml_device dev, em_nvml_temperature *temp); /* optional */
    em_nvml_return (*nvmlDeviceGetPowerUsage)(em_nvml_device dev, unsigned int *milliwatts);
    em_nvml_return (*nvmlDeviceGetEnforcedPowerLimit)(em_nvml_device dev, unsigned int *milliwatts);
    em_nvml_return (*nvmlDeviceGetCudaComputeCapability)(em_nvml_device dev, int *major, int *minor);
    em_nvml_return (*nvmlDeviceGetMultiGpuBoard)(em_nvml_device dev, unsigned int *multi); /* optional */
} em_nvml_api;

/* NVML, initialised once (nvmlInit_v2), or NULL with *reason set. */
const em_nvml_api *em__cuda_nvml(const char **reason);

/* ---- cuDNN: declared in cuda_cudnn.h from NVIDIA's headers, which the toolkit lacks ---- */
#include "cuda_cudnn.h"

/* NCCL for the dist layer: the library handle (use dlsym) and its version (e.g. 22703),
 * or NULL with *reason set. */
void *em__cuda_nccl(int *version, const char **reason);

#ifdef EMBER_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <nvrtc.h>
#include <cublas_v2.h>

/* X(function, required). The struct member and the dlsym'ed symbol are the names the
 * header's macros select (cuMemAlloc -> cuMemAlloc_v2). */
#define EM_CU_FUNCS(X)                                                               \
    X(cuInit, 1) X(cuDriverGetVersion, 1) X(cuGetErrorName, 1) X(cuGetErrorString, 1) \
    X(cuDeviceGetCount, 1) X(cuDeviceGet, 1) X(cuDeviceGetName, 1)                   \
    X(cuDeviceGetAttribute, 1) X(cuDeviceTotalMem, 1) X(cuDeviceGetPCIBusId, 1)      \
    X(cuDeviceCanAccessPeer, 1) X(cuDevicePrimaryCtxRetain, 1)                       \
    X(cuDevicePrimaryCtxRelease, 1) X(cuCtxSetCurrent, 1) X(cuCtxGetCurrent, 1)     \
    X(cuCtxEnablePeerAccess, 1) X(cuEventQuery, 1)                                    \
    X(cuMemGetInfo, 1) X(cuMemAlloc, 1) X(cuMemFree, 1) X(cuMemHostAlloc, 1)         \
    X(cuMemFreeHost, 1) X(cuMemcpyHtoDAsync, 1) X(cuMemcpyDtoHAsync, 1)              \
    X(cuMemcpyDtoDAsync, 1) X(cuMemcpyPeerAsync, 1) X(cuMemsetD8Async, 1)            \
    X(cuStreamCreate, 1) X(cuStreamDestroy, 1) X(cuStreamSynchronize, 1)             \
    X(cuStreamWaitEvent, 1) X(cuEventCreate, 1) X(cuEventRecord, 1)                  \
    X(cuEventSynchronize, 1) X(cuEventDestroy, 1) X(cuModuleLoadDataEx, 1)           \
    X(cuModuleUnload, 1) X(cuModuleGetFunction, 1) X(cuLaunchKernel, 1)             \
    X(cuFuncGetParamInfo, 0) /* driver 12.4+: argument sizes are checked when present */ \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 0) /* sizes 1-D grids when present */ \
    /* graphs (cuda_graph.c): all of them, or no graphs */                          \
    X(cuStreamBeginCapture, 0) X(cuStreamEndCapture, 0) X(cuGraphInstantiateWithFlags, 0) \
    X(cuGraphLaunch, 0) X(cuGraphExecDestroy, 0) X(cuGraphDestroy, 0)              \
    X(cuThreadExchangeStreamCaptureMode, 0)                                        \
    /* virtual memory, for expandable segments: all of them, or none */            \
    X(cuMemGetAllocationGranularity, 0) X(cuMemAddressReserve, 0) X(cuMemAddressFree, 0) \
    X(cuMemCreate, 0) X(cuMemRelease, 0) X(cuMemMap, 0) X(cuMemUnmap, 0) X(cuMemSetAccess, 0)

#define EM_NVRTC_FUNCS(X)                                                            \
    X(nvrtcVersion, 1) X(nvrtcGetErrorString, 1) X(nvrtcCreateProgram, 1)            \
    X(nvrtcDestroyProgram, 1) X(nvrtcCompileProgram, 1) X(nvrtcGetPTXSize, 1)        \
    X(nvrtcGetPTX, 1) X(nvrtcGetProgramLogSize, 1) X(nvrtcGetProgramLog, 1)          \
    X(nvrtcGetCUBINSize, 0) X(nvrtcGetCUBIN, 0) X(nvrtcGetNumSupportedArchs, 0)      \
    X(nvrtcGetSupportedArchs, 0)

#define EM_CUBLAS_FUNCS(X)                                                           \
    X(cublasCreate, 1) X(cublasDestroy, 1) X(cublasSetStream, 1)                     \
    X(cublasSetMathMode, 1) X(cublasGetVersion, 1) X(cublasGemmStridedBatchedEx, 1)  \
    X(cublasGetStatusString, 0) X(cublasSetWorkspace, 0) X(cublasGetProperty, 0)

#define EM__CUDA_MEMBER(fn, req) __typeof__(fn) *fn;
typedef struct em_cu_api { EM_CU_FUNCS(EM__CUDA_MEMBER) } em_cu_api;
typedef struct em_nvrtc_api { EM_NVRTC_FUNCS(EM__CUDA_MEMBER) } em_nvrtc_api;
typedef struct em_cublas_api { EM_CUBLAS_FUNCS(EM__CUDA_MEMBER) } em_cublas_api;

/* The driver, loaded once: its table, or NULL with *reason set to
 * "no driver: libcuda.so.1 not found (looked in ...)" or "... lacks cuX". cuInit is the
 * backend's job, not the loader's. */
const em_cu_api *em__cuda_driver(const char **reason);
/* NVRTC and cuBLAS are chosen newest first among the versions the driver can run
 * (cuDriverGetVersion: a CUDA 13 library needs a CUDA 13 driver); without a driver,
 * newest first. */
/* NVRTC, loaded once, or NULL with *reason ("libnvrtc not found (looked in ...)"). */
const em_nvrtc_api *em__cuda_nvrtc(int *major, int *minor, const char **reason);
/* cuBLAS (with its cuBLASLt preloaded from the same place), or NULL with *reason. */
const em_cublas_api *em__cuda_cublas(const char **reason);

/* cuDNN (libcudnn.so.9, then .8), loaded once, on the first convolution (or `ember devices`):
 * its table and cudnnGetVersion, or NULL with *reason: "off (EMBER_CUDNN=0)" (then nothing is
 * loaded), "libcudnn.so.9/.8 not found (looked in ...)", too old, or built for a newer CUDA
 * than the driver's. */
const em_cudnn_api *em__cuda_cudnn(size_t *version, const char **reason);

/* The symbols each table resolves (for tests that check them against real libraries). */
const char *const *em__cuda_driver_symbols(int *n);
const char *const *em__cuda_nvrtc_symbols(int *n);
const char *const *em__cuda_cublas_symbols(int *n);

/* "nvrtc 12.8, cublas 12.9, cudnn 9.6.0 (driver supports 12.9)" for `ember devices` (loads
 * all three; a library not found is named with its reason). */
void em__cuda_libraries_line(char *buf, size_t size);

/* Tests: dlopen and dlsym replaced by these (NULL, NULL: the real ones), so that a test
 * can say which sonames exist. */
void em__cuda_loader_set_hooks(void *(*open)(const char *candidate), void *(*sym)(void *h, const char *sym));

/* Tests: use these tables instead of loading anything (a NULL entry means "not found",
 * with reason as given; with no reason either, that library is loaded for real when
 * asked, through the hooks if set). Call before the first use; em__cuda_loader_reset()
 * forgets them. */
typedef struct em_cuda_fake_libs {
    const em_cu_api *cu;         const char *cu_reason;
    const em_nvrtc_api *nvrtc;   const char *nvrtc_reason;
    const em_cublas_api *cublas; const char *cublas_reason;
    const em_nvml_api *nvml;     const char *nvml_reason;
    const em_cudnn_api *cudnn;   const char *cudnn_reason;
} em_cuda_fake_libs;
void em__cuda_loader_use_fakes(const em_cuda_fake_libs *fakes);
#endif

/* Forget every loaded table (tests only; libraries stay mapped). */
void em__cuda_loader_reset(void);

#endif
