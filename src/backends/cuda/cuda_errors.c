/* CUresult -> Ember status and a message that says what happened and what to do. */
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"

/* Numbers from cuda.h; kept here so the reason works even when built without headers. */
enum {
    R_NO_DEVICE = 100, R_STUB = 34, R_NEWER_DRIVER = 36, R_SYSTEM_NOT_READY = 802,
    R_DRIVER_MISMATCH = 803, R_COMPAT = 804, R_DEVICE_UNAVAILABLE = 46, R_OPERATING_SYSTEM = 304
};

void em__cuda_init_reason(int r, const char *name, const char *desc, char *buf, size_t size) {
    const char *kind;
    const char *hint = "";
    switch (r) {
    case R_NO_DEVICE:
        kind = "no device";
        if (getenv("CUDA_VISIBLE_DEVICES"))
            hint = "; CUDA_VISIBLE_DEVICES is set and may hide every device";
        break;
    case R_DEVICE_UNAVAILABLE:
        kind = "no device";
        hint = "; every device is busy or in exclusive-process mode";
        break;
    case R_STUB:
        kind = "no driver";
        hint = "; the loaded libcuda.so.1 is a stub for linking, not a driver";
        break;
    case R_NEWER_DRIVER: case R_DRIVER_MISMATCH: case R_COMPAT:
        kind = "no driver";
        hint = "; the kernel module and libcuda.so.1 do not match or are too old";
        break;
    case R_OPERATING_SYSTEM: case R_SYSTEM_NOT_READY:
        kind = "no driver";
        hint = "; is the nvidia kernel module loaded (and, on NVSwitch systems, fabric manager running)?";
        break;
    default:
        kind = "driver failed";
        break;
    }
    snprintf(buf, size, "%s: cuInit returned %s (%s)%s", kind, name ? name : "an unknown error",
             desc ? desc : "no description", hint);
}

#ifdef EMBER_HAVE_CUDA_HEADERS

_Static_assert((int)R_NO_DEVICE == (int)CUDA_ERROR_NO_DEVICE && (int)R_STUB == (int)CUDA_ERROR_STUB_LIBRARY &&
               (int)R_NEWER_DRIVER == (int)CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER &&
               (int)R_SYSTEM_NOT_READY == (int)CUDA_ERROR_SYSTEM_NOT_READY &&
               (int)R_DRIVER_MISMATCH == (int)CUDA_ERROR_SYSTEM_DRIVER_MISMATCH &&
               (int)R_COMPAT == (int)CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE &&
               (int)R_DEVICE_UNAVAILABLE == (int)CUDA_ERROR_DEVICE_UNAVAILABLE &&
               (int)R_OPERATING_SYSTEM == (int)CUDA_ERROR_OPERATING_SYSTEM,
               "cuInit result numbers differ from cuda.h");

/* Used when the driver cannot name a result itself (not loaded, or a fake in tests). */
static const struct { CUresult r; const char *name, *desc; } own[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
     "API call is not supported in the installed CUDA driver"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int own_index(CUresult r) {
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i].r == r) return (int)i;
    return -1;
}

const char *em__cu_name(CUresult r) {
    const em_cu_api *cu = em__cuda_api();
    const char *s = NULL;
    if (cu && cu->cuGetErrorName && cu->cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    int i = own_index(r);
    return i >= 0 ? own[i].name : "CUDA_ERROR (unknown code)";
}

const char *em__cu_desc(CUresult r) {
    const em_cu_api *cu = em__cuda_api();
    const char *s = NULL;
    if (cu && cu->cuGetErrorString && cu->cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
    int i = own_index(r);
    return i >= 0 ? own[i].desc : "unrecognized error code";
}

em_status em__cu_status(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return EM_OK;
    case CUDA_ERROR_OUT_OF_MEMORY: return EM_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_NO_DEVICE: case CUDA_ERROR_INVALID_DEVICE: case CUDA_ERROR_DEVICE_UNAVAILABLE:
        return EM_ERR_DEVICE;
    case CUDA_ERROR_NOT_SUPPORTED: case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    case CUDA_ERROR_NO_BINARY_FOR_GPU: case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        return EM_ERR_NOT_SUPPORTED;
    case CUDA_ERROR_STUB_LIBRARY: case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        return EM_ERR_UNAVAILABLE;
    case CUDA_ERROR_INVALID_VALUE:
        return EM_ERR_INTERNAL; /* Ember checks arguments before calling the driver */
    default: return EM_ERR_BACKEND;
    }
}

bool em__cu_is_sticky(CUresult r) {
    switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS: case CUDA_ERROR_LAUNCH_FAILED: case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS: case CUDA_ERROR_HARDWARE_STACK_ERROR: case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_INVALID_PC: case CUDA_ERROR_ECC_UNCORRECTABLE: case CUDA_ERROR_LAUNCH_TIMEOUT:
        return true;
    default:
        return false;
    }
}

static const char *hint_for(CUresult r) {
    if (em__cu_is_sticky(r))
        return "; the device's context is now unusable, restart the process "
               "(EMBER_CUDA_LAUNCH_BLOCKING=1 reports the op that caused it)";
    switch (r) {
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        return "; NVRTC is newer than the driver: update the driver, or point EMBER_CUDA_PATH "
               "at an NVRTC no newer than the driver's CUDA version";
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
        return "; this device's architecture is not supported by the loaded NVRTC";
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "; free tensors or call em_empty_cache()";
    default:
        return "";
    }
}

em_status em__cu_fail(CUresult r, const char *what) {
    em_status s = em__cu_status(r);
    return em_error(s, "%s: %s (%s)%s", what, em__cu_name(r), em__cu_desc(r), hint_for(r));
}

const char *em__cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS (unknown)";
    }
}

#endif
