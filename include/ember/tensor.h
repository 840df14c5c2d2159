/* Tensors: n-dimensional, strided views over reference-counted storage on one device.
 *
 * Ownership: every function that returns an em_tensor* returns a new reference.
 * Outside a scope the caller releases it with em_release(). Inside a scope
 * (em_scope_begin/em_scope_end) the scope owns it and releases it at the end;
 * em_keep() hands the caller a reference of its own that outlives the scope.
 *
 * Threads: distinct tensors may be used from different threads at once, and one tensor may
 * be read by several threads while none writes it (in-place ops, em_set_grad, a backward
 * into its .grad). Scopes are per thread. The whole contract is in ember.h. */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/dtype.h>
#include <ember/device.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EM_MAX_DIMS 8 /* the most dims a tensor has */

typedef struct em_tensor em_tensor; /* a tensor (opaque; reference-counted) */

/* A shape by value. EM_SHAPE(3, 4) is a 3x4 shape; EM_SHAPE0 is a 0-d (scalar) shape. */
typedef struct em_shape { int ndim; /* dims used */ int64_t d[EM_MAX_DIMS]; /* their sizes */ } em_shape;
#define EM__NARGS(...) EM__NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define EM__NARGS_(a, b, c, d, e, f, g, h, n, ...) n
#define EM_SHAPE(...) ((em_shape){EM__NARGS(__VA_ARGS__), {__VA_ARGS__}}) /* a shape from 1 to 8 sizes */
#define EM_SHAPE0 ((em_shape){0, {0}}) /* the shape of a 0-d tensor */

/* A list of dims. EM_DIMS(0, 1); EM_ALL_DIMS (n = 0) means every dim. Negative dims count from the end. */
typedef struct em_dims { int n; /* dims listed (0: all) */ int d[EM_MAX_DIMS]; /* the dims */ } em_dims;
#define EM_DIMS(...) ((em_dims){EM__NARGS(__VA_ARGS__), {__VA_ARGS__}}) /* a list of 1 to 8 dims */
#define EM_ALL_DIMS ((em_dims){0, {0}}) /* every dim */

/* Creation options; zeroed means float32 on the CPU without grad.
 *   em_zeros(EM_SHAPE(3, 4), EM_OPTS(.device = dev, .dtype = EM_F16)) */
typedef struct em_opts {
    em_dtype dtype;      /* element type (zeroed: float32) */
    em_device device;    /* where the tensor lives (zeroed: the CPU) */
    bool requires_grad;  /* a leaf that autograd tracks (floating dtypes) */
    bool pin_memory; /* CPU tensors only: page-locked memory for fast, non-blocking copies */
} em_opts;
#define EM_OPTS(...) ((em_opts){__VA_ARGS__}) /* EM_OPTS(.dtype = EM_F16, .device = dev) */

/* ---- lifetime ---- */
EM_API em_tensor *em_retain(em_tensor *t);  /* another reference to t; returns t */
EM_API void em_release(em_tensor *t);       /* drop one reference; NULL is ignored */

/* What em_scope_begin returns, for em_scope_end. */
typedef struct em_scope { size_t mark; /* where the scope's tensors start */ int depth; /* its nesting level */ } em_scope;
/* Begin a scope: tensors returned on this thread until its end are released then. Scopes nest. */
EM_API em_scope em_scope_begin(void);
EM_API void em_scope_end(em_scope s); /* release what the scope holds (and end inner ones left open) */
/* A reference owned by the caller that survives the current scope(s); returns t. */
EM_API em_tensor *em_keep(em_tensor *t);
/* x = em_rebind(x, em_relu(x)): Python's `x = F.relu(x)`, where the old x is freed as soon
 * as nothing refers to it. Returns t; when old is held by the innermost open scope, that
 * scope's reference to it is dropped now instead of at em_scope_end, so a forward written
 * as a chain of rebinds peaks at two activations, not at all of them. What else refers to
 * old keeps it: the autograd graph (what backward needs), an em_keep reference. Nothing is
 * released when old belongs to someone else: the forward's input, a parameter, a batch, a
 * tensor of an outer scope. The one rule: do not use old afterwards unless it is kept
 * (`identity = em_keep(x)` before rebinding x, for a residual). old NULL or equal to t:
 * returns t; t NULL (the op failed): old is dropped all the same and NULL returned. */
EM_API em_tensor *em_rebind(em_tensor *old, em_tensor *t);

/* ---- creation (on any device) ---- */
EM_API em_tensor *em_empty(em_shape shape, em_opts o);             /* uninitialized */
EM_API em_tensor *em_zeros(em_shape shape, em_opts o);             /* filled with 0 */
EM_API em_tensor *em_ones(em_shape shape, em_opts o);              /* filled with 1 */
EM_API em_tensor *em_full(em_shape shape, double value, em_opts o); /* filled with value */
EM_API em_tensor *em_scalar(double value, em_opts o);                       /* 0-d */
EM_API em_tensor *em_arange(double start, double end, double step, em_opts o);   /* start, start + step, ... < end */
EM_API em_tensor *em_linspace(double start, double end, int64_t steps, em_opts o); /* steps values from start to end */
EM_API em_tensor *em_eye(int64_t n, int64_t m, em_opts o);  /* n x m, ones on the diagonal */
EM_API em_tensor *em_zeros_like(const em_tensor *t); /* zeros with t's shape, dtype and device */
EM_API em_tensor *em_ones_like(const em_tensor *t);  /* ones with t's shape, dtype and device */
EM_API em_tensor *em_empty_like(const em_tensor *t); /* uninitialized, with t's shape, dtype and device */
/* Copy numel elements of src_dtype from host memory (contiguous, row-major) into a new tensor. */
EM_API em_tensor *em_from_data(const void *data, em_dtype src_dtype, em_shape shape, em_opts o);

/* Random numbers from a counter-based Philox 4x32-10 generator: the same seed gives
 * the same tensor on every device. em_manual_seed() resets the global generator. */
EM_API void em_manual_seed(uint64_t seed);
EM_API em_tensor *em_rand(em_shape shape, em_opts o);                       /* uniform [0, 1) */
EM_API em_tensor *em_randn(em_shape shape, em_opts o);                      /* normal(0, 1) */
EM_API em_tensor *em_randint(int64_t low, int64_t high, em_shape shape, em_opts o); /* [low, high) */

/* ---- properties ---- */
EM_API int em_ndim(const em_tensor *t);                  /* number of dims (0 for a scalar) */
EM_API int64_t em_size(const em_tensor *t, int dim);     /* negative dims count from the end */
EM_API int64_t em_stride(const em_tensor *t, int dim);   /* in elements */
EM_API em_shape em_shape_of(const em_tensor *t);          /* every size */
EM_API int64_t em_numel(const em_tensor *t);              /* number of elements */
EM_API size_t em_nbytes(const em_tensor *t);              /* numel * element size */
EM_API em_dtype em_dtype_of(const em_tensor *t);          /* element type */
EM_API em_device em_device_of(const em_tensor *t);        /* where t lives */
EM_API bool em_is_contiguous(const em_tensor *t);        /* row-major without gaps */
EM_API bool em_shares_storage(const em_tensor *a, const em_tensor *b); /* views of the same memory */

/* ---- host access ---- */
/* Address of the first element of a CPU tensor (mind the strides). For any other
 * device: NULL and an error that says to move the tensor to the CPU first. */
EM_API void *em_data_ptr(em_tensor *t);
/* Copy the elements (row-major, in t's dtype) into host memory; waits for queued work. */
EM_API em_status em_copy_to_host(const em_tensor *t, void *dst, size_t dst_bytes);
/* The value of a one-element tensor as a double (NaN and an error otherwise). */
EM_API double em_item(const em_tensor *t);
/* Print like PyTorch: tensor([[...]], device='cuda:0', dtype=torch.float16). */
EM_API em_status em_print(const em_tensor *t);
/* The same text into buf (truncated to size); returns t's full length as snprintf does. */
EM_API int em_format(const em_tensor *t, char *buf, size_t size);

/* ---- moving ---- */
/* The same tensor (a new reference) when nothing changes; otherwise a new tensor
 * that shares nothing with t. */
EM_API em_tensor *em_to(em_tensor *t, em_device d);
EM_API em_tensor *em_to_dtype(em_tensor *t, em_dtype dt); /* the same for a dtype (a cast) */
/* Both at once. non_blocking: from pinned CPU memory, return before the copy is done. */
EM_API em_tensor *em_to_device_dtype(em_tensor *t, em_device d, em_dtype dt, bool non_blocking);
EM_API em_tensor *em_cpu(em_tensor *t); /* em_to(t, cpu) */
EM_API em_tensor *em_clone(const em_tensor *t);  /* a new contiguous copy on the same device */

/* ---- views (share storage with t) ---- */
EM_API em_tensor *em_view(em_tensor *t, em_shape shape);     /* one dim may be -1; strides must allow it */
EM_API em_tensor *em_reshape(em_tensor *t, em_shape shape);  /* a view when possible, else a copy */
EM_API em_tensor *em_transpose(em_tensor *t, int d0, int d1);        /* dims d0 and d1 swapped */
EM_API em_tensor *em_permute(em_tensor *t, em_dims order);           /* dims in a new order */
EM_API em_tensor *em_narrow(em_tensor *t, int dim, int64_t start, int64_t length); /* length elements of dim from start */
EM_API em_tensor *em_slice(em_tensor *t, int dim, int64_t start, int64_t end, int64_t step); /* t[..., start:end:step] */
EM_API em_tensor *em_select(em_tensor *t, int dim, int64_t index);  /* removes dim */
EM_API em_tensor *em_expand(em_tensor *t, em_shape shape);   /* -1 keeps a dim; size-1 dims broadcast */
EM_API em_tensor *em_squeeze(em_tensor *t, int dim);     /* dim removed if its size is 1 */
EM_API em_tensor *em_unsqueeze(em_tensor *t, int dim);   /* a size-1 dim inserted at dim */
EM_API em_tensor *em_flatten(em_tensor *t, int start_dim, int end_dim); /* dims start..end merged */
EM_API em_tensor *em_contiguous(em_tensor *t);               /* t itself (new reference) if already contiguous */
EM_API em_tensor *em_detach(em_tensor *t);                   /* same storage, no autograd history */

#ifdef __cplusplus
}
#endif
#endif
