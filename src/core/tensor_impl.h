/* The inside of tensors and storages: core's, read by the backends (the tensors of an op
 * call) and by autograd. Upper layers (nn, optim, data, dist) use only the public API. */
#ifndef EM_CORE_TENSOR_IMPL_H
#define EM_CORE_TENSOR_IMPL_H

#include <stdatomic.h>
#include <ember/tensor.h>
#include "../memory/block.h"   /* em_block: the memory a storage holds */

struct em_backend;

/* The autograd node that produced a tensor. Autograd (src/autograd/) embeds this header as
 * the first member of its own node struct; core only counts references to it. */
typedef struct em_grad_node {
    atomic_int refcount;
    void (*destroy)(struct em_grad_node *self); /* frees the node and releases what it holds */
} em_grad_node;

static inline struct em_grad_node *em__grad_node_retain(struct em_grad_node *n) {
    if (n) atomic_fetch_add(&n->refcount, 1);
    return n;
}
static inline void em__grad_node_release(struct em_grad_node *n) {
    if (n && atomic_fetch_sub(&n->refcount, 1) == 1) n->destroy(n);
}

/* Something another part of core keeps about one storage, freed with it (a float32
 * parameter's low-precision copy: src/core/lowp_shadow.c). The owner embeds this as the
 * first member of its own record, sets key (the address of a static of its own, telling
 * owners apart) and release, and attaches it (em__storage_attach, core_internal.h); the
 * storage calls release when it goes. */
typedef struct em_storage_attachment {
    const void *key;
    struct em_storage_attachment *next;
    void (*release)(struct em_storage_attachment *self);
} em_storage_attachment;

typedef struct em_storage {
    atomic_int refcount;
    em_device device;                 /* resolved: index >= 0 */
    const struct em_backend *backend;
    em_block block;
    size_t nbytes;                    /* bytes requested */
    atomic_uint version;              /* bumped by every in-place write (autograd checks it) */
    bool pinned;                      /* CPU storage in page-locked memory */
    bool external;                    /* memory not owned by Ember (never freed) */
    /* imported memory (DLPack, src/core/dlpack.c): read_only refuses in-place writes;
     * external_release(external_ctx) runs once when the storage goes (hands it back) */
    bool read_only;
    void (*external_release)(void *ctx);
    void *external_ctx;
    /* what other parts of core keep about this storage (a list, pushed atomically) */
    _Atomic(em_storage_attachment *) attached;
    /* Every element is an index in [0, index_bound) while version is index_bound_version
     * (em__index_mark_in_range: made so on the device, e.g. by a where; 0: not known). The
     * index ops then skip their host read of the values, which waits for the device and
     * cannot be recorded in a graph. */
    int64_t index_bound;
    unsigned index_bound_version;
} em_storage;

struct em_tensor {
    atomic_int refcount;
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS];     /* in elements; 0 for broadcast dims */
    int64_t offset;                   /* in elements, from the start of the storage block */
    em_storage *storage;
    /* autograd */
    bool requires_grad;
    bool is_leaf;                     /* created by the user, not by a differentiable op */
    em_tensor *grad;                  /* accumulated gradient (leaf tensors) */
    struct em_grad_node *grad_fn;     /* the node that produced this tensor, retained */
    unsigned saved_version;           /* storage version when saved for backward */
};

/* Row-major and dense: its elements are one block from its offset on (dims of size 1 may
 * have any stride). What a backend checks before a flat copy or a library call. */
static inline bool em__tensor_dense(const em_tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want) return false;
        want *= t->shape[d];
    }
    return true;
}

/* Host address of element 0 of a CPU (or pinned) tensor. Only for CPU storages. */
static inline void *em__host_ptr(const em_tensor *t) {
    return (char *)t->storage->block.handle + t->storage->block.offset +
           (size_t)t->offset * em_dtype_size(t->dtype);
}

/* ---- internal constructors used across layers (src/core/tensor.c) ---- */
/* A new tensor struct with refcount 1 that retains `storage` (not registered in any scope). */
em_tensor *em__tensor_alloc(em_storage *storage, em_dtype dt, int ndim, const int64_t *shape,
                            const int64_t *strides, int64_t offset);
/* New contiguous tensor with fresh storage on d (not registered in a scope; no error on NULL d). */
em_tensor *em__tensor_new(em_shape shape, em_dtype dt, em_device d);
/* Register a freshly made tensor with the innermost scope (if any) and return it. */
em_tensor *em__scoped(em_tensor *t);
void em__storage_release(em_storage *s);
/* Contiguous row-major strides for shape; returns numel. */
int64_t em__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Normalise a possibly negative dim against ndim; EM_ERR_ARGUMENT message names op. */
em_status em__wrap_dim(int *dim, int ndim, const char *op);
/* All tensors on one device? Otherwise records PyTorch's message:
 * "<op>: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!" */
em_status em__check_same_device(const char *op, int n, const em_tensor *const *ts);

#endif
