/* Copies between dtypes and devices, and reading tensors back to the host. Cross-device
 * moves go through a contiguous source; casts happen on the CPU when the CPU is the
 * source, otherwise on whichever side moves fewer bytes. */
#include "core_internal.h"
#include "../util/errors.h"
#include "internal_api.h"
#include "../memory/allocator.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const em_grad_args no_args;

static size_t block_offset(const em_tensor *t) {
    return t->storage->block.offset + (size_t)t->offset * em_dtype_size(t->dtype);
}

static size_t tensor_bytes(const em_tensor *t) {
    return (size_t)em__numel_raw(t->ndim, t->shape) * em_dtype_size(t->dtype);
}

static em_status backend_copy(em_tensor *out, const em_tensor *in) { return em__run_copy(out, in, "copy"); }

em_tensor *em__copy_raw(const em_tensor *t, em_dtype dt) {
    const em_backend *be = t->storage->backend;
    em_tensor *out = em__tensor_new_on(be, t->storage->device, t->ndim, t->shape, dt);
    if (!out) return NULL;
    if (em__numel_raw(t->ndim, t->shape) > 0 && backend_copy(out, t) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

/* t itself (a new reference) when contiguous in dtype dt, else a contiguous copy in dt. */
static em_tensor *contiguous_as(em_tensor *t, em_dtype dt) {
    if (t->dtype == dt && em__is_contiguous_raw(t->ndim, t->shape, t->strides)) return em_retain(t);
    return em__copy_raw(t, dt);
}

static em_status sync_cpu(void) {
    const em_backend *cpu = em__backend_for(EM_CPU);
    return cpu->synchronize ? cpu->synchronize(0) : EM_OK;
}

/* CPU -> device: cast on the CPU, then one host-to-device copy. */
static em_tensor *host_to_device(em_tensor *t, const em_backend *be, em_device d, em_dtype dt,
                                 bool non_blocking) {
    em_tensor *src = contiguous_as(t, dt);
    if (!src) return NULL;
    em_tensor *out = em__tensor_new_on(be, d, t->ndim, t->shape, dt);
    em_status st = out ? EM_OK : EM_ERR_OUT_OF_MEMORY;
    size_t bytes = tensor_bytes(src);
    /* Non-blocking only from the caller's own pinned memory, which outlives the copy. */
    bool async = non_blocking && src == t && t->storage->pinned;
    if (out && bytes > 0) {
        st = sync_cpu(); /* the CPU may still be writing t */
        if (st == EM_OK)
            st = be->copy_h2d ? be->copy_h2d(d.index, out->storage->block.handle, block_offset(out),
                                             em__host_ptr(src), bytes, async)
                              : em_error(EM_ERR_NOT_SUPPORTED, "em_to: the %s backend cannot copy from the host",
                                         be->name);
        /* the queued copy still reads t's pinned block: the pinned cache must not hand it
         * out again (to the loader's next batch, say) until the device has finished */
        if (st == EM_OK && async) em__mem_pinned_record_use(&t->storage->block, be, d.index);
    }
    em_release(src);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

/* A contiguous tensor with t's elements in dtype `keep`, read into new host memory. */
static em_tensor *device_to_host_raw(em_tensor *t, em_dtype keep) {
    const em_backend *be = t->storage->backend;
    em_tensor *src = contiguous_as(t, keep);
    if (!src) return NULL;
    em_tensor *host = em__tensor_new_on(em__backend_for(EM_CPU), EM_DEVICE_CPU, t->ndim, t->shape, keep);
    em_status st = host ? EM_OK : EM_ERR_OUT_OF_MEMORY;
    size_t bytes = tensor_bytes(src);
    if (host && bytes > 0)
        st = be->copy_d2h ? be->copy_d2h(src->storage->device.index, em__host_ptr(host),
                                         src->storage->block.handle, block_offset(src), bytes)
                          : em_error(EM_ERR_NOT_SUPPORTED, "em_to: the %s backend cannot copy to the host",
                                     be->name);
    em_release(src);
    if (st != EM_OK) {
        em_release(host);
        return NULL;
    }
    return host;
}

bool em__copy_host_device(em_tensor *dst, const em_tensor *src, em_status *st) {
    em_device dd = dst->storage->device, sd = src->storage->device;
    if ((dd.type == EM_CPU) == (sd.type == EM_CPU) || dst->dtype != src->dtype || dst->ndim != src->ndim ||
        memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim) ||
        !em__is_contiguous_raw(dst->ndim, dst->shape, dst->strides) ||
        !em__is_contiguous_raw(src->ndim, src->shape, src->strides))
        return false;
    size_t bytes = tensor_bytes(src);
    if (dd.type == EM_CPU) {
        const em_backend *be = src->storage->backend;
        if (!be->copy_d2h) return false;
        *st = sync_cpu(); /* the CPU may still be reading or writing dst */
        if (*st == EM_OK && bytes > 0)
            *st = be->copy_d2h(sd.index, em__host_ptr(dst), src->storage->block.handle, block_offset(src), bytes);
    } else {
        const em_backend *be = dst->storage->backend;
        if (!be->copy_h2d) return false;
        *st = sync_cpu(); /* the CPU may still be writing src */
        if (*st == EM_OK && bytes > 0)
            *st = be->copy_h2d(dd.index, dst->storage->block.handle, block_offset(dst), em__host_ptr(src), bytes,
                               false);
    }
    return true;
}

/* Cast on the device when that shrinks the transfer, otherwise after it. */
static em_dtype transfer_dtype(em_dtype from, em_dtype to) {
    return em_dtype_size(to) < em_dtype_size(from) ? to : from;
}

static em_tensor *device_to_host(em_tensor *t, em_dtype dt) {
    em_tensor *host = device_to_host_raw(t, transfer_dtype(t->dtype, dt));
    if (!host || host->dtype == dt) return host;
    em_tensor *out = em__copy_raw(host, dt);
    em_release(host);
    return out;
}

/* Device -> device: the backend's own copy when both are its devices, else via the host. */
static em_tensor *device_to_device(em_tensor *t, const em_backend *be, em_device d, em_dtype dt) {
    em_dtype mid = transfer_dtype(t->dtype, dt);
    em_tensor *out = NULL;
    if (be == t->storage->backend && be->copy_d2d) {
        em_tensor *src = contiguous_as(t, mid);
        if (!src) return NULL;
        out = em__tensor_new_on(be, d, t->ndim, t->shape, mid);
        size_t bytes = tensor_bytes(src);
        if (out && bytes > 0 &&
            be->copy_d2d(d.index, out->storage->block.handle, block_offset(out), src->storage->device.index,
                         src->storage->block.handle, block_offset(src), bytes) != EM_OK) {
            em_release(out);
            out = NULL;
        }
        em_release(src);
    } else {
        em_tensor *host = device_to_host_raw(t, mid);
        if (!host) return NULL;
        out = host_to_device(host, be, d, mid, false);
        em_release(host);
    }
    if (!out || out->dtype == dt) return out;
    em_tensor *cast = em__copy_raw(out, dt);
    em_release(out);
    return cast;
}

em_tensor *em__to_raw(em_tensor *t, em_device d, em_dtype dt, bool non_blocking) {
    if ((unsigned)dt >= EM_DTYPE_COUNT) {
        em_error(EM_ERR_DTYPE, "em_to: invalid dtype %d", (int)dt);
        return NULL;
    }
    const em_backend *be = em__backend_checked(d, "em_to");
    if (!be) return NULL;
    d = em_device_resolve(d);
    em_device from = t->storage->device;
    bool same_device = from.type == d.type && from.index == d.index;
    if (same_device && t->dtype == dt) return em_retain(t);
    if (same_device) { /* a parameter's low-precision copy from the last fused Adam step */
        em_tensor *shadow = em__shadow_take(t, dt);
        if (shadow) return shadow;
        unsigned long seq = em__error_seq();
        em_tensor *kept = em__cast_keeping_layout(t, dt);
        if (kept || em__error_seq() != seq) return kept; /* made, or no memory for it */
        return em__copy_raw(t, dt);
    }
    if (from.type == EM_CPU) return host_to_device(t, be, d, dt, non_blocking);
    if (d.type == EM_CPU) return device_to_host(t, dt);
    return device_to_device(t, be, d, dt);
}

em_tensor *em_to_device_dtype(em_tensor *t, em_device d, em_dtype dt, bool non_blocking) {
    EM_CHECK_ARG(t, "em_to", "t");
    em_tensor *out = em__to_raw(t, d, dt, non_blocking);
    if (out == t) return em__scoped(out);
    return em__finish(out, EM_GRAD_COPY, 1, &t, &no_args);
}

em_tensor *em_to(em_tensor *t, em_device d) {
    EM_CHECK_ARG(t, "em_to", "t");
    return em_to_device_dtype(t, d, t->dtype, false);
}

em_tensor *em_to_dtype(em_tensor *t, em_dtype dt) {
    EM_CHECK_ARG(t, "em_to_dtype", "t");
    return em_to_device_dtype(t, t->storage->device, dt, false);
}

em_tensor *em_cpu(em_tensor *t) {
    EM_CHECK_ARG(t, "em_cpu", "t");
    return em_to_device_dtype(t, EM_DEVICE_CPU, t->dtype, false);
}

em_tensor *em_clone(const em_tensor *t) {
    EM_CHECK_ARG(t, "em_clone", "t");
    em_tensor *in = (em_tensor *)t; /* the graph holds inputs mutably; clone does not write t */
    return em__finish(em__copy_raw(t, t->dtype), EM_GRAD_COPY, 1, &in, &no_args);
}

/* ---- host access ---- */

em_status em__to_host(const em_tensor *t, em_dtype dt, void *dst) {
    em_tensor wrap;
    em_storage wrap_storage;
    if (em__numel_raw(t->ndim, t->shape) == 0) return EM_OK;
    if (t->storage->device.type == EM_CPU) {
        em__wrap_host(&wrap, &wrap_storage, dst, dt, t->ndim, t->shape);
        em_status st = backend_copy(&wrap, t);
        return st == EM_OK ? sync_cpu() : st;
    }
    em_tensor *host = device_to_host((em_tensor *)t, dt);
    if (!host) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INTERNAL;
    em_status st = sync_cpu();
    if (st == EM_OK) memcpy(dst, em__host_ptr(host), tensor_bytes(host));
    em_release(host);
    return st;
}

void *em_data_ptr(em_tensor *t) {
    EM_CHECK_ARG(t, "em_data_ptr", "t");
    if (t->storage->device.type != EM_CPU) {
        em_device_string ds = em_device_str(t->storage->device);
        em_error(EM_ERR_DEVICE,
                 "em_data_ptr: tensor is on %s; host pointers exist only for CPU tensors. Move it first: "
                 "em_to(t, EM_DEVICE_CPU)",
                 ds.s);
        return NULL;
    }
    if (sync_cpu() != EM_OK) return NULL;
    return em__host_ptr(t);
}

em_status em_copy_to_host(const em_tensor *t, void *dst, size_t dst_bytes) {
    if (!t) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_copy_to_host: argument 't' is NULL");
    size_t need = tensor_bytes(t);
    if (need > 0 && !dst) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_copy_to_host: argument 'dst' is NULL");
    if (dst_bytes < need)
        return em_error(EM_ERR_ARGUMENT, "em_copy_to_host: destination has %zu bytes, the tensor needs %zu (%lld x %s)",
                        dst_bytes, need, (long long)em__numel_raw(t->ndim, t->shape), em_dtype_name(t->dtype));
    em_status st = em__to_host(t, t->dtype, dst);
    /* the wait is done: what device work found wrong in the user's input (device_checks.c) */
    return st == EM_OK && t->storage->device.type != EM_CPU ? em__device_checks_read(t->storage->device) : st;
}

double em_item(const em_tensor *t) {
    if (!t) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_item: argument 't' is NULL");
        return NAN;
    }
    int64_t n = em__numel_raw(t->ndim, t->shape);
    if (n != 1) {
        em_error(EM_ERR_ARGUMENT, "em_item: a Tensor with %lld elements cannot be converted to Scalar", (long long)n);
        return NAN;
    }
    double buf[1];
    if (em__to_host(t, t->dtype, buf) != EM_OK) return NAN;
    if (t->storage->device.type != EM_CPU && em__device_checks_read(t->storage->device) != EM_OK) return NAN;
    return em__load_f64(buf, t->dtype);
}

/* ---- moving a tensor in place (for nn's parameters and optim's state) ---- */

em_status em__tensor_set_data_(em_tensor *t, em_tensor *src) {
    if (!t || !src) return em__error_unless_pending(EM_ERR_ARGUMENT, "set_data: tensor is NULL");
    if (t->ndim != src->ndim || memcmp(t->shape, src->shape, (size_t)t->ndim * sizeof t->shape[0]) != 0 ||
        t->dtype != src->dtype || !em_device_equal(t->storage->device, src->storage->device))
        return em_error(EM_ERR_ARGUMENT, "set_data: expected a tensor of the same shape, dtype and device");
    if (t == src || t->storage == src->storage) {
        memcpy(t->strides, src->strides, sizeof t->strides);
        t->offset = src->offset;
        return EM_OK;
    }
    atomic_fetch_add(&src->storage->refcount, 1);
    em_storage *old = t->storage;
    t->storage = src->storage;
    memcpy(t->strides, src->strides, sizeof t->strides);
    t->offset = src->offset;
    em__storage_release(old);
    return EM_OK;
}

em_status em__tensor_move_(em_tensor *t, em_device d, em_dtype dt) {
    if (!t) return em__error_unless_pending(EM_ERR_ARGUMENT, "move: tensor is NULL");
    if (t->grad) {
        em_status st = em__tensor_move_(t->grad, d, dt);
        if (st != EM_OK) return st;
    }
    em_tensor *n = em__to_raw(t, d, dt, false);   /* no autograd: nothing records the move */
    if (!n) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INTERNAL;
    if (n != t) {
        /* n is a fresh contiguous copy: t takes its storage and layout, n takes t's old
         * storage and frees it with itself. */
        em_storage *old = t->storage;
        t->storage = n->storage;
        n->storage = old;
        em_dtype old_dt = t->dtype;
        t->dtype = n->dtype;
        n->dtype = old_dt;
        int64_t strides[EM_MAX_DIMS];
        memcpy(strides, t->strides, sizeof strides);
        memcpy(t->strides, n->strides, sizeof strides);
        memcpy(n->strides, strides, sizeof strides);
        int64_t off = t->offset;
        t->offset = n->offset;
        n->offset = off;
    }
    em_release(n);
    return EM_OK;
}
