/* DLPack export and import (include/ember/dlpack.h has the contract). Both directions
 * share memory: an export holds a reference to the tensor's storage until the consumer's
 * call of the deleter; an import wraps the producer's memory in an external storage whose
 * last release calls the producer's deleter, once. */
#include "core_internal.h"
#include "../util/errors.h"
#include <ember/dlpack.h>
#include <pthread.h>
#include <stdlib.h>

_Static_assert(sizeof(DLDeviceType) == 4, "DLDeviceType is an int32_t in DLPack's ABI");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType is {uint8, uint8, uint16}");
_Static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensorVersioned) == 80 && sizeof(DLManagedTensor) == 64,
               "DLPack's structs have a fixed layout on 64-bit targets");

/* ---- dtypes and devices -------------------------------------------------------------------- */

static DLDataType to_dl_dtype(em_dtype dt) {
    switch (dt) {
    case EM_F32: return (DLDataType){kDLFloat, 32, 1};
    case EM_F64: return (DLDataType){kDLFloat, 64, 1};
    case EM_F16: return (DLDataType){kDLFloat, 16, 1};
    case EM_BF16: return (DLDataType){kDLBfloat, 16, 1};
    case EM_I64: return (DLDataType){kDLInt, 64, 1};
    case EM_I32: return (DLDataType){kDLInt, 32, 1};
    case EM_U8: return (DLDataType){kDLUInt, 8, 1};
    case EM_BOOL: return (DLDataType){kDLBool, 8, 1};
    default: return (DLDataType){0, 0, 0};
    }
}

static bool from_dl_dtype(DLDataType d, em_dtype *out) {
    if (d.lanes != 1) return false;
    for (int i = 0; i < EM_DTYPE_COUNT; i++) {
        DLDataType e = to_dl_dtype((em_dtype)i);
        if (e.code == d.code && e.bits == d.bits) {
            *out = (em_dtype)i;
            return true;
        }
    }
    return false;
}

static const char *dl_code_name(uint8_t code) {
    static const char *names[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex", "bool"};
    return code < sizeof names / sizeof names[0] ? names[code] : code <= kDLFloat4_e2m1fn ? "float8/6/4" : "unknown";
}

static const char *dl_device_name(int32_t t) {
    switch (t) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLVPI: return "kDLVPI";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLExtDev: return "kDLExtDev";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    case kDLOneAPI: return "kDLOneAPI";
    case kDLWebGPU: return "kDLWebGPU";
    case kDLHexagon: return "kDLHexagon";
    case kDLMAIA: return "kDLMAIA";
    default: return "an unknown device type";
    }
}

/* ---- export ------------------------------------------------------------------------------ */

typedef struct export_ctx {
    DLManagedTensorVersioned v;
    DLManagedTensor legacy;
    int64_t shape[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS];
    em_storage *storage; /* the reference that keeps the memory alive until the deleter */
} export_ctx;

static void export_free(export_ctx *c) {
    em__storage_release(c->storage);
    free(c);
}
static void export_delete(DLManagedTensorVersioned *self) {
    if (self) export_free(self->manager_ctx);
}
static void export_delete_legacy(DLManagedTensor *self) {
    if (self) export_free(self->manager_ctx);
}

static export_ctx *export_tensor(em_tensor *t, const char *op) {
    EM_CHECK_ARG(t, op, "t");
    if (t->requires_grad) {
        em_error(EM_ERR_ARGUMENT, "%s: Can't export tensors that require gradient, use em_detach(t) first", op);
        return NULL;
    }
    em_storage *s = t->storage;
    DLDevice dev;
    switch (s->device.type) {
    case EM_CPU: dev = (DLDevice){kDLCPU, 0}; break;
    case EM_CUDA: dev = (DLDevice){kDLCUDA, s->device.index}; break;
    case EM_OPENCL: dev = (DLDevice){kDLOpenCL, s->device.index}; break;
    default:
        em_error(EM_ERR_NOT_SUPPORTED, "%s: a tensor on %s cannot be exported: DLPack names CPU, CUDA and OpenCL "
                 "devices here", op, em_device_str(s->device).s);
        return NULL;
    }
    /* the consumer reads the memory directly: the work queued on it must be finished */
    if (em_device_synchronize(s->device) != EM_OK) return NULL;
    export_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    for (int i = 0; i < t->ndim; i++) {
        c->shape[i] = t->shape[i];
        c->strides[i] = t->strides[i];
    }
    size_t elem_offset = (size_t)t->offset * em_dtype_size(t->dtype);
    DLTensor *dl = &c->v.dl_tensor;
    dl->device = dev;
    dl->ndim = t->ndim;
    dl->dtype = to_dl_dtype(t->dtype);
    dl->shape = c->shape;
    dl->strides = c->strides;
    if (dev.device_type == kDLOpenCL) { /* a cl_mem cannot be offset: byte_offset says where */
        dl->data = s->block.handle;
        dl->byte_offset = s->block.offset + elem_offset;
    } else if (s->block.handle) { /* host or device address of the first element, as PyTorch gives it */
        dl->data = (char *)s->block.handle + s->block.offset + elem_offset;
        dl->byte_offset = 0;
    }
    c->v.version = (DLPackVersion){DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    c->v.manager_ctx = c;
    c->v.deleter = export_delete;
    c->v.flags = s->read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    c->legacy.dl_tensor = *dl;
    c->legacy.manager_ctx = c;
    c->legacy.deleter = export_delete_legacy;
    atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
    c->storage = s;
    return c;
}

DLManagedTensorVersioned *em_to_dlpack(em_tensor *t) {
    export_ctx *c = export_tensor(t, "em_to_dlpack");
    return c ? &c->v : NULL;
}

DLManagedTensor *em_to_dlpack_legacy(em_tensor *t) {
    export_ctx *c = export_tensor(t, "em_to_dlpack_legacy");
    return c ? &c->legacy : NULL;
}

/* ---- import ------------------------------------------------------------------------------ */

/* The managed tensors Ember holds now: handing one in again is "already consumed". */
typedef struct import_ctx {
    void *manager;  /* DLManagedTensorVersioned * or DLManagedTensor * */
    bool versioned;
    struct import_ctx *next;
} import_ctx;
static pthread_mutex_t g_imports_lock = PTHREAD_MUTEX_INITIALIZER;
static import_ctx *g_imports;

static bool imports_find_locked(const void *manager) {
    for (import_ctx *c = g_imports; c; c = c->next)
        if (c->manager == manager) return true;
    return false;
}

/* The storage is gone: forget the manager and hand it back to its producer, once. */
static void import_release(void *ctx) {
    import_ctx *c = ctx;
    pthread_mutex_lock(&g_imports_lock);
    for (import_ctx **p = &g_imports; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&g_imports_lock);
    if (c->versioned) {
        DLManagedTensorVersioned *m = c->manager;
        if (m->deleter) m->deleter(m);
    } else {
        DLManagedTensor *m = c->manager;
        if (m->deleter) m->deleter(m);
    }
    free(c);
}

static em_tensor *import_tensor(const char *op, void *manager, bool versioned, const DLTensor *dl, uint64_t flags) {
    /* ---- what the tensor is: every check before anything is taken ---- */
    if (dl->ndim < 0 || dl->ndim > EM_MAX_DIMS) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: the DLPack tensor has %d dims; Ember takes 0 to %d", op, (int)dl->ndim,
                 EM_MAX_DIMS);
        return NULL;
    }
    em_dtype dt;
    if (!from_dl_dtype(dl->dtype, &dt)) {
        em_error(EM_ERR_DTYPE, "%s: DLPack dtype (code %u: %s, %u bits, %u lanes) is not supported; Ember takes "
                 "float16/32/64, bfloat16, int32/64, uint8 and bool, one lane", op, dl->dtype.code,
                 dl_code_name(dl->dtype.code), dl->dtype.bits, dl->dtype.lanes);
        return NULL;
    }
    em_device dev;
    switch ((int32_t)dl->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: /* page-locked host memory: the CPU reads it like any other */
        dev = EM_DEVICE_CPU;
        break;
    case kDLCUDA: dev = EM_DEVICE(EM_CUDA, dl->device.device_id); break;
    case kDLOpenCL: dev = EM_DEVICE(EM_OPENCL, dl->device.device_id); break;
    default:
        em_error(EM_ERR_NOT_SUPPORTED, "%s: DLPack device type %d (%s) is not supported; Ember takes kDLCPU, "
                 "kDLCUDAHost, kDLCUDA and kDLOpenCL", op, (int)dl->device.device_type,
                 dl_device_name((int32_t)dl->device.device_type));
        return NULL;
    }
    if (dev.type != EM_CPU && dl->device.device_id < 0) {
        em_error(EM_ERR_DEVICE, "%s: DLPack device id %d is negative", op, (int)dl->device.device_id);
        return NULL;
    }
    const em_backend *be = em__backend_checked(dev, op);
    if (!be) return NULL;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS], numel = 1, last = 0;
    if (dl->ndim > 0 && !dl->shape) {
        em_error(EM_ERR_ARGUMENT, "%s: the DLPack tensor has %d dims but no shape", op, (int)dl->ndim);
        return NULL;
    }
    for (int i = 0; i < dl->ndim; i++) shape[i] = dl->shape[i];
    if (em__check_shape(op, dl->ndim, shape, dt, &numel) != EM_OK) return NULL;
    if (dl->strides) {
        for (int i = 0; i < dl->ndim; i++) {
            strides[i] = dl->strides[i];
            if (shape[i] <= 1 && strides[i] < 0) strides[i] = 0; /* never stepped: harmless */
            if (strides[i] < 0) {
                em_error(EM_ERR_NOT_SUPPORTED, "%s: stride %lld of dim %d is negative; Ember's tensors take strides "
                         ">= 0 (flip a copy instead)", op, (long long)strides[i], i);
                return NULL;
            }
        }
    } else {
        em__contiguous_strides(dl->ndim, shape, strides);
    }
    for (int i = 0; i < dl->ndim && numel > 0; i++) { /* the last element's index, overflow-checked */
        int64_t reach;
        if (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) || __builtin_add_overflow(last, reach, &last) ||
            last > INT64_MAX / 16) {
            em_error(EM_ERR_ARGUMENT, "%s: the DLPack tensor's strides reach past any addressable memory", op);
            return NULL;
        }
    }
    size_t esize = em_dtype_size(dt);
    size_t nbytes = numel > 0 ? ((size_t)last + 1) * esize : 0;
    if (numel > 0 && !dl->data) {
        em_error(EM_ERR_ARGUMENT, "%s: the DLPack tensor has %lld elements but its data pointer is NULL", op,
                 (long long)numel);
        return NULL;
    }
    void *handle = dl->data;
    int64_t offset = 0;
    if (dev.type == EM_CPU) {
        if (dl->data) handle = (char *)dl->data + dl->byte_offset; /* (an empty tensor may have none) */
    } else if (dl->byte_offset % esize) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: byte_offset %llu is not a multiple of the element size %zu", op,
                 (unsigned long long)dl->byte_offset, esize);
        return NULL;
    } else {
        offset = (int64_t)(dl->byte_offset / esize);
        nbytes += dl->byte_offset;
    }

    /* ---- take it: storage, tensor, registry (the last step that can fail) ---- */
    import_ctx *ctx = calloc(1, sizeof *ctx);
    em_storage *s = calloc(1, sizeof *s);
    if (!ctx || !s) {
        free(ctx);
        free(s);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    ctx->manager = manager;
    ctx->versioned = versioned;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->device = em_device_resolve(dev);
    s->backend = be;
    s->block = (em_block){.handle = handle, .offset = 0, .size = nbytes};
    s->nbytes = nbytes;
    s->external = true;
    s->read_only = (flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    em_tensor *t = em__tensor_alloc(s, dt, dl->ndim, shape, strides, offset);
    em__storage_release(s); /* the tensor holds it now, or nothing does (no deleter set yet) */
    if (!t) {
        free(ctx);
        return NULL;
    }
    pthread_mutex_lock(&g_imports_lock);
    bool consumed = imports_find_locked(manager);
    if (!consumed) {
        ctx->next = g_imports;
        g_imports = ctx;
        s->external_release = import_release;
        s->external_ctx = ctx;
    }
    pthread_mutex_unlock(&g_imports_lock);
    if (consumed) {
        em_release(t);
        free(ctx);
        em_error(EM_ERR_ARGUMENT, "%s: this DLPack tensor was already consumed: Ember holds it for a tensor that "
                 "is still alive; a managed tensor is imported once (export it again for another)", op);
        return NULL;
    }
    return em__scoped(t);
}

em_tensor *em_from_dlpack(DLManagedTensorVersioned *m) {
    const char *op = "em_from_dlpack";
    EM_CHECK_ARG(m, op, "m");
    if (m->version.major != DLPACK_MAJOR_VERSION) {
        em_error(EM_ERR_NOT_SUPPORTED, "%s: DLPack version %u.%u; Ember reads major version %d (for 0.x use "
                 "em_from_dlpack_legacy)", op, m->version.major, m->version.minor, DLPACK_MAJOR_VERSION);
        return NULL;
    }
    return import_tensor(op, m, true, &m->dl_tensor, m->flags);
}

em_tensor *em_from_dlpack_legacy(DLManagedTensor *m) {
    const char *op = "em_from_dlpack_legacy";
    EM_CHECK_ARG(m, op, "m");
    return import_tensor(op, m, false, &m->dl_tensor, 0);
}

bool em_is_read_only(const em_tensor *t) {
    if (!t) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_is_read_only: argument 't' is NULL");
        return false;
    }
    return t->storage->read_only;
}
