/** @file
 * DLPack: handing tensors to NumPy, PyTorch, JAX, CuPy... and taking theirs, without copying.
 *
 * The first part is DLPack's own ABI (https://dmlc.github.io/dlpack/latest/, version 1.1),
 * written from the specification: the structs are what every DLPack producer and consumer
 * shares, field for field. It uses dlpack.h's own include guard, so including the upstream
 * dlpack.h before or after this header is fine.
 *
 * The contract of Ember's four functions:
 *  - Export (em_to_dlpack, em_to_dlpack_legacy): the result views t's memory (no copy) and
 *    holds a reference to t until its deleter runs; the consumer calls the deleter exactly
 *    once when it is done. Ember waits for the work queued on t's device first, so the
 *    consumer reads finished data (this C API has no stream exchange). A tensor that requires
 *    grad is refused, as in PyTorch (export em_detach(t)). Any strides are exported as they
 *    are. CPU tensors: `data` is the address of the first element. CUDA: `data` is the
 *    device pointer (CUdeviceptr) of the first element. OpenCL (kDLOpenCL): `data` is the
 *    cl_mem buffer and `byte_offset` the first element's offset inside it; the cl_mem
 *    belongs to Ember's OpenCL context for that device.
 *  - Import (em_from_dlpack, em_from_dlpack_legacy): on success Ember owns the managed
 *    tensor: the returned tensor (and every view of it) uses its memory without copying, and
 *    Ember calls its deleter exactly once, when the last of them is released. On failure
 *    nothing is taken: the caller still owns it (and calls its deleter), and the error says
 *    what was expected and what was found. A managed tensor is consumed once: handing
 *    Ember the same one again while it is in use is an error. Accepted: devices kDLCPU,
 *    kDLCUDAHost (as CPU memory), kDLCUDA and kDLOpenCL, of devices Ember sees; dtypes
 *    float16/32/64, bfloat16, int32/64, uint8 and bool, one lane; up to EM_MAX_DIMS dims;
 *    non-negative strides (NULL: compact row-major). A DLManagedTensorVersioned with
 *    DLPACK_FLAG_BITMASK_READ_ONLY gives a read-only tensor: in-place ops on it (or its
 *    views) fail with EM_ERR_ARGUMENT instead of writing; computing from it is fine. */
#ifndef EMBER_DLPACK_H
#define EMBER_DLPACK_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#define DLPACK_MAJOR_VERSION 1 /**< the DLPack ABI major version these structs follow */
#define DLPACK_MINOR_VERSION 1 /**< the DLPack ABI minor version these structs follow */

/** A DLPack ABI version (DLManagedTensorVersioned::version). */
typedef struct {
    uint32_t major; /**< a consumer must not read a tensor of another major version */
    uint32_t minor; /**< compatible additions */
} DLPackVersion;

/** Where the memory is (DLPack's numbering: part of the ABI). */
typedef enum {
    kDLCPU = 1,          /**< host memory */
    kDLCUDA = 2,         /**< CUDA device memory */
    kDLCUDAHost = 3,     /**< page-locked host memory from cudaMallocHost */
    kDLOpenCL = 4,       /**< OpenCL buffer (data is a cl_mem) */
    kDLVulkan = 7,       /**< Vulkan buffer */
    kDLMetal = 8,        /**< Metal (Apple) */
    kDLVPI = 9,          /**< Verilog simulator buffer */
    kDLROCM = 10,        /**< ROCm GPU memory */
    kDLROCMHost = 11,    /**< pinned ROCm host memory */
    kDLExtDev = 12,      /**< reserved for extension devices */
    kDLCUDAManaged = 13, /**< CUDA managed (unified) memory */
    kDLOneAPI = 14,      /**< Unified shared memory of a oneAPI non-partitioned device */
    kDLWebGPU = 15,      /**< WebGPU */
    kDLHexagon = 16,     /**< Qualcomm Hexagon DSP */
    kDLMAIA = 17         /**< Microsoft MAIA */
} DLDeviceType;

/** A device: its type and its index among the devices of that type. */
typedef struct {
    DLDeviceType device_type; /**< kDLCPU, kDLCUDA... */
    int32_t device_id;        /**< 0 for the CPU */
} DLDevice;

/** Kinds of element (DLDataType::code). */
typedef enum {
    kDLInt = 0U,            /**< signed integer */
    kDLUInt = 1U,           /**< unsigned integer */
    kDLFloat = 2U,          /**< IEEE floating point */
    kDLOpaqueHandle = 3U,   /**< opaque handles */
    kDLBfloat = 4U,         /**< bfloat16 */
    kDLComplex = 5U,        /**< complex: two floats */
    kDLBool = 6U,           /**< boolean, one byte per element with bits 8 */
    kDLFloat8_e3m4 = 7U,    /**< float8 formats (DLPack 1.1) ... */
    kDLFloat8_e4m3 = 8U,    /**< float8 e4m3 */
    kDLFloat8_e4m3b11fnuz = 9U, /**< float8 e4m3b11fnuz */
    kDLFloat8_e4m3fn = 10U, /**< float8 e4m3fn */
    kDLFloat8_e4m3fnuz = 11U, /**< float8 e4m3fnuz */
    kDLFloat8_e5m2 = 12U,   /**< float8 e5m2 */
    kDLFloat8_e5m2fnuz = 13U, /**< float8 e5m2fnuz */
    kDLFloat8_e8m0fnu = 14U, /**< float8 e8m0fnu */
    kDLFloat6_e2m3fn = 15U, /**< float6 e2m3fn */
    kDLFloat6_e3m2fn = 16U, /**< float6 e3m2fn */
    kDLFloat4_e2m1fn = 17U  /**< float4 e2m1fn */
} DLDataTypeCode;

/** An element type: float32 is {kDLFloat, 32, 1}. */
typedef struct {
    uint8_t code;   /**< a DLDataTypeCode */
    uint8_t bits;   /**< bits per lane */
    uint16_t lanes; /**< lanes per element (1 for plain tensors) */
} DLDataType;

/** The tensor itself: memory, device, shape, strides. Borrowed by whoever holds the manager. */
typedef struct {
    void *data;            /**< the memory (or a cl_mem / device pointer, by device) */
    DLDevice device;       /**< where data lives */
    int32_t ndim;          /**< number of dims */
    DLDataType dtype;      /**< element type */
    int64_t *shape;        /**< ndim sizes */
    int64_t *strides;      /**< ndim strides in elements, or NULL for compact row-major */
    uint64_t byte_offset;  /**< bytes from data to the first element */
} DLTensor;

/** DLPack 0.x's managed tensor (no version, no flags), for older consumers and producers. */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;  /**< the tensor */
    void *manager_ctx;   /**< the producer's own context */
    void (*deleter)(struct DLManagedTensor *self); /**< the consumer calls it once when done (may be NULL) */
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)  /**< the consumer must not write the memory */
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)  /**< the producer made a copy for this export */
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL) /**< sub-byte elements padded to a byte */

/** DLPack 1.x's managed tensor: a version first, then flags. */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version; /**< the ABI version the producer wrote */
    void *manager_ctx;     /**< the producer's own context */
    void (*deleter)(struct DLManagedTensorVersioned *self); /**< the consumer calls it once when done (may be NULL) */
    uint64_t flags;        /**< DLPACK_FLAG_BITMASK_* */
    DLTensor dl_tensor;    /**< the tensor */
} DLManagedTensorVersioned;

#endif /* DLPACK_DLPACK_H_ */

/** Export t as a DLPack 1.x managed tensor that views its memory (the contract is above).
 * NULL and an error if t is NULL, requires grad or is on a device DLPack cannot name. */
EM_API DLManagedTensorVersioned *em_to_dlpack(em_tensor *t);
/** The same in DLPack 0.x's form, for consumers that read only DLManagedTensor. */
EM_API DLManagedTensor *em_to_dlpack_legacy(em_tensor *t);
/** A tensor over a DLPack 1.x managed tensor's memory; on success Ember owns m (see above).
 * Returns a new reference (registered with the current scope, as every creation is). */
EM_API em_tensor *em_from_dlpack(DLManagedTensorVersioned *m);
/** The same for DLPack 0.x's DLManagedTensor (never read-only: 0.x has no flags). */
EM_API em_tensor *em_from_dlpack_legacy(DLManagedTensor *m);
/** True when t's memory was imported read-only (in-place ops on it fail). */
EM_API bool em_is_read_only(const em_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
