/* Private helpers shared by the files of src/core (not used by other layers). */
#ifndef EM_CORE_INTERNAL_H
#define EM_CORE_INTERNAL_H

#include <string.h>
#include "tensor_impl.h"
#include "../backends/backend.h"
#include "../autograd/record.h"

/* c10's ScalarType name ("Float", "Long"), for messages that copy PyTorch's. */
const char *em__dtype_torch_name(em_dtype dt);

/* ---- tensors (tensor.c) ---- */
/* New storage of nbytes on a resolved device of backend be (pinned: CPU page-locked). */
em_storage *em__storage_new(const em_backend *be, em_device d, size_t nbytes, bool pinned);
/* Attach a to s (tensor_impl.h's em_storage_attachment; any thread), and find the attachment
 * with a key (NULL: none). An owner attaches one record per storage: it looks first, under a
 * lock of its own. */
void em__storage_attach(em_storage *s, em_storage_attachment *a);
em_storage_attachment *em__storage_attachment(em_storage *s, const void *key);
/* A new contiguous tensor on the device of an existing storage's backend: the op fast path
 * (no registry lookup). Not scoped. */
em_tensor *em__tensor_new_on(const em_backend *be, em_device d, int ndim, const int64_t *shape,
                             em_dtype dt);
/* A new tensor struct viewing t's storage (same dtype), not scoped, no autograd. */
em_tensor *em__view_of(const em_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                       int64_t offset);
/* Shape validation for creation: ndim in [0, 8], sizes >= 0, bytes fit; numel in *numel. */
em_status em__check_shape(const char *op, int ndim, const int64_t *shape, em_dtype dt, int64_t *numel);
bool em__is_contiguous_raw(int ndim, const int64_t *shape, const int64_t *strides);
/* "[2, 3]" into buf; returns buf. */
char *em__shape_str(char *buf, size_t size, int ndim, const int64_t *shape);
int64_t em__numel_raw(int ndim, const int64_t *shape);

/* ---- low-precision shadows of float32 parameters (lowp_shadow.c) ---- */
/* The cast of t to dt from its storage's shadow (a new tensor header over it with t's
 * strides, not scoped), when t is a float32 parameter, or a dense view of all of one, whose
 * shadow in dt is current and held by nobody else; else NULL, noting that casts of t's
 * storage to dt are wanted (the next fused Adam step writes one). */
em_tensor *em__shadow_take(em_tensor *t, em_dtype dt);
/* Where no shadow serves: the cast of such a parameter view when it is not contiguous (a
 * Linear's weight.t()), made over its storage's layout as PyTorch's .to() preserves strides,
 * so that the result is laid out, and rounds in later products, as the shadow would; a new
 * header, not scoped. NULL with the error state untouched for anything else: the caller then
 * casts as usual. NULL with the error set when out of memory: a contiguous cast instead would
 * round differently in those products, so the cast fails. */
em_tensor *em__cast_keeping_layout(em_tensor *t, em_dtype dt);
/* For a fused step that can emit: a contiguous tensor of p's shape in the wanted dtype to
 * write p's new value into, or NULL (none wanted, or no memory: the step runs without).
 * Give it to em__shadow_install after the step (p's version bumped) or em_release it. */
em_tensor *em__shadow_target(em_tensor *p);
void em__shadow_install(em_tensor *p, em_tensor *target);
/* For tests: t's storage's copy (borrowed; NULL if none) and the dtype casts asked for
 * (EM_F32: none). */
em_storage *em__shadow_of(const em_tensor *t, em_dtype *asked);

/* Fill a struct as a non-owning view of t's storage (no reference taken: only for
 * temporaries that never leave the calling function). */
static inline void em__stack_view(em_tensor *dst, const em_tensor *t, int ndim, const int64_t *shape,
                                  const int64_t *strides, int64_t offset) {
    memset(dst, 0, sizeof *dst);
    dst->dtype = t->dtype;
    dst->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        dst->shape[i] = shape[i];
        dst->strides[i] = strides[i];
    }
    dst->offset = offset;
    dst->storage = t->storage;
    dst->is_leaf = true;
}

/* Wrap host memory as a contiguous CPU tensor living on the stack (external storage). */
void em__wrap_host(em_tensor *t, em_storage *st, void *data, em_dtype dt, int ndim,
                   const int64_t *shape);

/* ---- host element access ---- */
double em__load_f64(const void *p, em_dtype dt);
void em__store_f64(void *p, em_dtype dt, double v);

/* ---- copies and moves (move.c); all return unscoped new references ---- */
/* A new contiguous copy of t in dtype dt on t's device (no autograd). */
em_tensor *em__copy_raw(const em_tensor *t, em_dtype dt);
/* t moved to device d and dtype dt; a new reference to t itself when nothing changes. */
em_tensor *em__to_raw(em_tensor *t, em_device d, em_dtype dt, bool non_blocking);
/* em_copy_ between the CPU and a device straight into dst (PyTorch's copy_ into pinned or
 * pageable host memory): same dtype, both contiguous, one shape, one side the CPU. Returns
 * false, with nothing done and no error, when that does not apply; else true with *st. */
bool em__copy_host_device(em_tensor *dst, const em_tensor *src, em_status *st);
/* Copy t's elements (row-major, dtype dt) into host memory dst; waits for the device. */
em_status em__to_host(const em_tensor *t, em_dtype dt, void *dst);

/* ---- random numbers (create.c) ---- */
/* Reserve numel words of the global generator: the seed and the first word. */
void em__rng_reserve(int64_t numel, uint64_t *seed, uint64_t *offset);

/* The common tail of a differentiable op: record the autograd node when an input needs
 * it (releasing out if that fails), then register out with the scope. */
static inline em_tensor *em__finish(em_tensor *out, em_grad_op op, int n, em_tensor *const *inputs,
                                    const em_grad_args *args) {
    if (!out) return NULL;
    if (em__grad_needed(n, inputs) && em__grad_record(op, out, n, inputs, args) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return em__scoped(out);
}

/* ---- scopes (scope.c) ---- */
bool em__scope_active(void);

/* ---- the one dispatch path: every op reaches its backend as an em_op_call ---- */
/* Run c on the backend of its tensors' device (dst[0]'s), after the op's own checks of
 * devices, dtypes and shapes. em__op_run is for the ops every backend runs: the backend's run
 * reports an op or dtype it cannot run (an error naming it), as core asked em__check_support
 * first where dtypes vary. em__op_try is for ops core can compose otherwise: a decline (the
 * backend's supports, or its run answering EM_ERR_NOT_SUPPORTED) returns EM_ERR_NOT_SUPPORTED
 * with nothing recorded. */
em_status em__op_run(const em_op_call *c, const char *op);
em_status em__op_try(const em_op_call *c);
/* A unary op's f[] from its params (NULL: none): one scalar, two for clamp. */
#define EM_UNARY_PARAMS(kop, params)                                                              \
    {(params) ? (params)[0] : 0.0, (params) && (kop) == EM_OP_CLAMP ? (params)[1] : 0.0}
/* Would be run (op, dtype) at all? Asked before outputs are allocated. */
bool em__op_supported(const em_backend *be, em_op op, em_dtype dt);
/* A reduction's dims (reduce[d] for d < ndim) as the bits of its call's i[0]. */
static inline int64_t em__reduce_bits(int ndim, const bool *reduce) {
    int64_t bits = 0;
    for (int d = 0; d < ndim; d++)
        if (reduce[d]) bits |= (int64_t)1 << d;
    return bits;
}
/* The calls core makes most: out = in (any dtypes: a cast), out filled with v. */
static inline em_status em__run_copy(em_tensor *out, const em_tensor *in, const char *op) {
    return em__op_run(&(em_op_call){.op = EM_OP_COPY, .dtype = out->dtype, .dst = {out}, .src = {in}}, op);
}
static inline em_status em__run_fill(em_tensor *out, double v, const char *op) {
    return em__op_run(&(em_op_call){.op = EM_OP_FILL, .dtype = out->dtype, .dst = {out}, .f = {v}}, op);
}
/* EM_ERR_NOT_SUPPORTED "op: not supported for dtype X on device D" unless be runs (kop, dt). */
em_status em__check_support(const char *op, const em_backend *be, em_op kop, em_dtype dt, em_device d);

#endif
