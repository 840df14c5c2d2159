/* CUDA's virtual memory management for the caching allocator's expandable segments (the
 * backend table's vm_* entries, backend.h): an address range reserved once
 * (cuMemAddressReserve), grown by mapping new physical chunks at its end (cuMemCreate +
 * cuMemMap + cuMemSetAccess), shrunk by unmapping them (cuMemUnmap), as PyTorch's
 * expandable_segments does. The symbols are optional in the loader: without them (or on a
 * device without virtual memory management) the granularity is 0 and the allocator keeps
 * ordinary segments. Each chunk is its own mapping, so that any chunk can be unmapped alone;
 * its physical handle is released right after mapping (the mapping keeps the memory). */
#include "cuda_internal.h"

#include <stdio.h>
#include <string.h>
#include "../../util/errors.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

static bool vmm_in_driver(const em_cu_api *cu) {
    return cu && cu->cuMemGetAllocationGranularity && cu->cuMemAddressReserve && cu->cuMemAddressFree &&
           cu->cuMemCreate && cu->cuMemRelease && cu->cuMemMap && cu->cuMemUnmap && cu->cuMemSetAccess;
}

static CUmemAllocationProp device_prop(const em_cuda_device *d) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->dev;
    return prop;
}

static size_t granularity_in(int index) {
    em_cuda_device *d = em__cuda_activate(index, "virtual memory");
    const em_cu_api *cu = em__cuda_api();
    if (!d || !vmm_in_driver(cu)) return 0;
    int vmm = 0;
    if (cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d->dev) !=
            CUDA_SUCCESS || !vmm)
        return 0;
    CUmemAllocationProp prop = device_prop(d);
    size_t g = 0;
    if (cu->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS) return 0;
    return g;
}

size_t em__cuda_vm_granularity(int index) {
    em_error_state saved;
    em__error_save(&saved);   /* "none" is an answer, not an error */
    CUcontext prev = em__cuda_ctx_save();
    size_t g = granularity_in(index);
    em__cuda_ctx_restore(prev);
    em__error_restore(&saved);
    return g;
}

static em_status vm_fail(CUresult r, int index, const char *what, size_t size) {
    char buf[128];
    snprintf(buf, sizeof buf, "cuda:%d: %s of %zu bytes", index, what, size);
    return em__cu_fail(r, buf);
}

static em_status reserve_in(int index, size_t size, void **base) {
    if (!em__cuda_activate(index, "virtual memory")) return em_last_status();
    CUdeviceptr p = 0;
    CUresult r = em__cuda_api()->cuMemAddressReserve(&p, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) return vm_fail(r, index, "cuMemAddressReserve", size);
    *base = (void *)(uintptr_t)p;
    return EM_OK;
}

em_status em__cuda_vm_reserve(int index, size_t size, void **base) {
    EM_CUDA_CTX_SCOPED(reserve_in(index, size, base));
}

static em_status map_in(int index, void *base, size_t offset, size_t size) {
    em_cuda_device *d = em__cuda_activate(index, "virtual memory");
    if (!d) return em_last_status();
    const em_cu_api *cu = em__cuda_api();
    CUmemAllocationProp prop = device_prop(d);
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)base + offset;
    CUmemGenericAllocationHandle h;
    CUresult r = cu->cuMemCreate(&h, size, &prop, 0);
    if (r != CUDA_SUCCESS) return vm_fail(r, index, "cuMemCreate", size);
    r = cu->cuMemMap(at, size, 0, h, 0);
    cu->cuMemRelease(h); /* mapped, the memory lives until it is unmapped */
    if (r != CUDA_SUCCESS) return vm_fail(r, index, "cuMemMap", size);
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu->cuMemSetAccess(at, size, &access, 1);
    if (r != CUDA_SUCCESS) {
        cu->cuMemUnmap(at, size);
        return vm_fail(r, index, "cuMemSetAccess", size);
    }
    return EM_OK;
}

em_status em__cuda_vm_map(int index, void *base, size_t offset, size_t size) {
    EM_CUDA_CTX_SCOPED(map_in(index, base, offset, size));
}

void em__cuda_vm_unmap(int index, void *base, size_t offset, size_t size) {
    CUcontext prev = em__cuda_ctx_save();
    em_cuda_device *d = em__cuda_activate(index, "virtual memory");
    /* unlike cuMemFree, cuMemUnmap does not wait for the work queued on the memory */
    if (d && em__cuda_sync_device(d, "unmapping memory") == EM_OK) {
        CUresult r = em__cuda_api()->cuMemUnmap((CUdeviceptr)(uintptr_t)base + offset, size);
        if (r != CUDA_SUCCESS) vm_fail(r, index, "cuMemUnmap", size);
    }
    em__cuda_ctx_restore(prev);
}

void em__cuda_vm_release(int index, void *base, size_t size) {
    CUcontext prev = em__cuda_ctx_save();
    if (em__cuda_activate(index, "virtual memory")) {
        CUresult r = em__cuda_api()->cuMemAddressFree((CUdeviceptr)(uintptr_t)base, size);
        if (r != CUDA_SUCCESS) vm_fail(r, index, "cuMemAddressFree", size);
    }
    em__cuda_ctx_restore(prev);
}

#endif
