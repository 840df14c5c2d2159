/* Creation of tensors on any device, and the global counter-based random generator. */
#include "core_internal.h"
#include "../util/errors.h"
#include "../kernels/philox.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* Validate creation options; the backend of the device, or NULL with an error. */
static const em_backend *check_opts(const char *op, int ndim, const int64_t *shape, em_opts o) {
    if (em__check_shape(op, ndim, shape, o.dtype, NULL) != EM_OK) return NULL;
    if (o.requires_grad && !em_dtype_is_floating(o.dtype)) {
        em_error(EM_ERR_DTYPE, "%s: Only Tensors of floating point dtype can require gradients (got %s)", op,
                 em_dtype_name(o.dtype));
        return NULL;
    }
    if (o.pin_memory && o.device.type != EM_CPU) {
        em_error(EM_ERR_ARGUMENT, "%s: pin_memory is only for CPU tensors, got device %s", op,
                 em_device_str(o.device).s);
        return NULL;
    }
    return em__backend_checked(o.device, op);
}

/* A new uninitialised tensor with the options' dtype, device, pinning and grad flag (unscoped). */
static em_tensor *create(const char *op, int ndim, const int64_t *shape, em_opts o) {
    const em_backend *be = check_opts(op, ndim, shape, o);
    if (!be) return NULL;
    em_device d = em_device_resolve(o.device);
    em_tensor *t;
    if (o.pin_memory) {
        int64_t strides[EM_MAX_DIMS];
        int64_t numel = em__contiguous_strides(ndim, shape, strides);
        em_storage *s = em__storage_new(be, d, (size_t)numel * em_dtype_size(o.dtype), true);
        if (!s) return NULL;
        t = em__tensor_alloc(s, o.dtype, ndim, shape, strides, 0);
        em__storage_release(s);
    } else {
        t = em__tensor_new_on(be, d, ndim, shape, o.dtype);
    }
    if (t) t->requires_grad = o.requires_grad;
    return t;
}

static em_status fill(const char *op, em_tensor *t, double v) {
    if (em__numel_raw(t->ndim, t->shape) == 0) return EM_OK;
    return em__run_fill(t, v, op);
}

static em_tensor *filled_raw(const char *op, int ndim, const int64_t *shape, double v, em_opts o) {
    em_tensor *t = create(op, ndim, shape, o);
    if (t && fill(op, t, v) != EM_OK) {
        em_release(t);
        return NULL;
    }
    return t;
}

static em_tensor *filled(const char *op, int ndim, const int64_t *shape, double v, em_opts o) {
    return em__scoped(filled_raw(op, ndim, shape, v, o));
}

em_tensor *em_empty(em_shape shape, em_opts o) { return em__scoped(create("em_empty", shape.ndim, shape.d, o)); }
em_tensor *em_zeros(em_shape shape, em_opts o) { return filled("em_zeros", shape.ndim, shape.d, 0.0, o); }
em_tensor *em_ones(em_shape shape, em_opts o) { return filled("em_ones", shape.ndim, shape.d, 1.0, o); }
em_tensor *em_full(em_shape shape, double value, em_opts o) {
    return filled("em_full", shape.ndim, shape.d, value, o);
}
em_tensor *em_scalar(double value, em_opts o) { return filled("em_scalar", 0, NULL, value, o); }

static em_opts like(const em_tensor *t) {
    return (em_opts){.dtype = t->dtype, .device = t->storage->device};
}
em_tensor *em_zeros_like(const em_tensor *t) {
    EM_CHECK_ARG(t, "em_zeros_like", "t");
    return filled("em_zeros_like", t->ndim, t->shape, 0.0, like(t));
}
em_tensor *em_ones_like(const em_tensor *t) {
    EM_CHECK_ARG(t, "em_ones_like", "t");
    return filled("em_ones_like", t->ndim, t->shape, 1.0, like(t));
}
em_tensor *em_empty_like(const em_tensor *t) {
    EM_CHECK_ARG(t, "em_empty_like", "t");
    return em__scoped(create("em_empty_like", t->ndim, t->shape, like(t)));
}

/* out[i] = start + i * step, through the backend's fill_affine. */
static em_status affine(const char *op, em_tensor *t, double start, double step) {
    return em__op_run(&(em_op_call){.op = EM_OP_FILL_AFFINE, .dtype = t->dtype, .dst = {t}, .f = {start, step}}, op);
}

em_tensor *em_arange(double start, double end, double step, em_opts o) {
    if (!isfinite(start) || !isfinite(end) || !isfinite(step)) {
        em_error(EM_ERR_ARGUMENT, "em_arange: unsupported range: %g -> %g (step %g)", start, end, step);
        return NULL;
    }
    if (step == 0) {
        em_error(EM_ERR_ARGUMENT, "em_arange: step must be nonzero");
        return NULL;
    }
    if ((step > 0 && end < start) || (step < 0 && end > start)) {
        em_error(EM_ERR_ARGUMENT, "em_arange: upper bound and larger bound inconsistent with step sign");
        return NULL;
    }
    double n = ceil((end - start) / step);
    if (n > 9e15) {
        em_error(EM_ERR_ARGUMENT, "em_arange: the range %g -> %g with step %g is too long", start, end, step);
        return NULL;
    }
    int64_t len = (int64_t)n;
    em_tensor *t = create("em_arange", 1, &len, o);
    if (t && len > 0 && affine("em_arange", t, start, step) != EM_OK) {
        em_release(t);
        return NULL;
    }
    return em__scoped(t);
}

em_tensor *em_linspace(double start, double end, int64_t steps, em_opts o) {
    if (steps < 0) {
        em_error(EM_ERR_ARGUMENT, "em_linspace: number of steps must be non-negative, got %lld", (long long)steps);
        return NULL;
    }
    em_tensor *t = create("em_linspace", 1, &steps, o);
    if (!t || steps == 0) return em__scoped(t);
    em_status st;
    if (steps == 1) {
        st = em__run_fill(t, start, "em_linspace");
    } else {
        st = affine("em_linspace", t, start, (end - start) / (double)(steps - 1));
        if (st == EM_OK) { /* make the last element exactly `end`, as PyTorch does */
            em_tensor last;
            int64_t one = 1;
            em__stack_view(&last, t, 1, &one, t->strides, t->offset + (steps - 1));
            st = em__run_fill(&last, end, "em_linspace");
        }
    }
    if (st != EM_OK) {
        em_release(t);
        return NULL;
    }
    return em__scoped(t);
}

em_tensor *em_eye(int64_t n, int64_t m, em_opts o) {
    if (m == -1) m = n; /* em_eye(n, -1, o): square */
    if (n < 0 || m < 0) {
        em_error(EM_ERR_ARGUMENT, "em_eye: n and m must be non-negative, got n = %lld, m = %lld", (long long)n,
                 (long long)m);
        return NULL;
    }
    int64_t shape[2] = {n, m};
    em_tensor *t = filled_raw("em_eye", 2, shape, 0.0, o);
    if (t && n > 0 && m > 0) {
        /* The diagonal is a strided view: stride m + 1, min(n, m) elements. */
        em_tensor diag;
        int64_t len = n < m ? n : m, stride = m + 1;
        em__stack_view(&diag, t, 1, &len, &stride, t->offset);
        if (fill("em_eye", &diag, 1.0) != EM_OK) {
            em_release(t);
            return NULL;
        }
    }
    return em__scoped(t);
}

em_tensor *em_from_data(const void *data, em_dtype src_dtype, em_shape shape, em_opts o) {
    int64_t numel;
    if (em__check_shape("em_from_data", shape.ndim, shape.d, src_dtype, &numel) != EM_OK) return NULL;
    if (!data && numel > 0) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_from_data: argument 'data' is NULL");
        return NULL;
    }
    if (!check_opts("em_from_data", shape.ndim, shape.d, o)) return NULL;
    em_tensor src;
    em_storage src_storage;
    em__wrap_host(&src, &src_storage, (void *)data, src_dtype, shape.ndim, shape.d);
    /* Wrapping the caller's memory makes this a move from the host: on the CPU a cast
     * into new memory, elsewhere a cast on the host then one host-to-device copy. */
    em_tensor *t = o.device.type == EM_CPU ? create("em_from_data", shape.ndim, shape.d, o)
                                           : em__to_raw(&src, o.device, o.dtype, false);
    if (!t) return NULL;
    if (t->storage->device.type == EM_CPU && numel > 0) {
        em_status st = em__run_copy(t, &src, "em_from_data");
        if (st != EM_OK) {
            em_release(t);
            return NULL;
        }
    }
    t->requires_grad = o.requires_grad;
    return em__scoped(t);
}

/* ---- random numbers ---- */

#define DEFAULT_SEED 67280421310721ull /* PyTorch's default_rng_seed_val */

static pthread_mutex_t rng_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rng_seed = DEFAULT_SEED, rng_offset;

void em_manual_seed(uint64_t seed) {
    pthread_mutex_lock(&rng_lock);
    rng_seed = seed;
    rng_offset = 0;
    pthread_mutex_unlock(&rng_lock);
}

void em__rng_reserve(int64_t numel, uint64_t *seed, uint64_t *offset) {
    pthread_mutex_lock(&rng_lock);
    *seed = rng_seed;
    *offset = rng_offset;
    rng_offset += ((uint64_t)numel + 3) & ~(uint64_t)3;
    pthread_mutex_unlock(&rng_lock);
}

/* For activation checkpointing's replay of random ops (src/nn/checkpoint.c). */
void em__rng_get_state(uint64_t *seed, uint64_t *offset) {
    pthread_mutex_lock(&rng_lock);
    *seed = rng_seed;
    *offset = rng_offset;
    pthread_mutex_unlock(&rng_lock);
}

void em__rng_set_state(uint64_t seed, uint64_t offset) {
    pthread_mutex_lock(&rng_lock);
    rng_seed = seed;
    rng_offset = offset;
    pthread_mutex_unlock(&rng_lock);
}

double em__philox_uniform_f64(uint64_t seed, uint64_t c) {
    uint32_t w[4];
    em__philox_element(seed, c, w);
    uint64_t bits = ((uint64_t)w[1] << 21) ^ (uint64_t)(w[0] >> 11);
    return (double)(bits & ((UINT64_C(1) << 53) - 1)) * 0x1p-53;
}

static em_tensor *random_tensor(const char *op, em_shape shape, em_opts o, em_rng_kind kind, double p0, double p1) {
    em_tensor *t = create(op, shape.ndim, shape.d, o);
    int64_t numel = t ? em__numel_raw(shape.ndim, shape.d) : 0;
    if (!t || numel == 0) return em__scoped(t);
    uint64_t seed, offset;
    em__rng_reserve(numel, &seed, &offset);
    em_op_call c = {.op = EM_OP_RNG, .dtype = t->dtype, .dst = {t}, .i = {kind, (int64_t)seed, (int64_t)offset},
                    .f = {p0, p1}};
    if (em__op_run(&c, op) != EM_OK) {
        em_release(t);
        return NULL;
    }
    return em__scoped(t);
}

em_tensor *em_rand(em_shape shape, em_opts o) {
    if (!em_dtype_is_floating(o.dtype)) {
        em_error(EM_ERR_DTYPE, "em_rand: expected a floating point dtype, got %s", em_dtype_name(o.dtype));
        return NULL;
    }
    return random_tensor("em_rand", shape, o, EM_RNG_UNIFORM, 0.0, 1.0);
}

em_tensor *em_randn(em_shape shape, em_opts o) {
    if (!em_dtype_is_floating(o.dtype)) {
        em_error(EM_ERR_DTYPE, "em_randn: expected a floating point dtype, got %s", em_dtype_name(o.dtype));
        return NULL;
    }
    return random_tensor("em_randn", shape, o, EM_RNG_NORMAL, 0.0, 1.0);
}

em_tensor *em_randint(int64_t low, int64_t high, em_shape shape, em_opts o) {
    if ((unsigned)o.dtype >= EM_DTYPE_COUNT || o.dtype == EM_BOOL) {
        em_error(EM_ERR_DTYPE, "em_randint: expected a numeric dtype, got %s", em_dtype_name(o.dtype));
        return NULL;
    }
    if (low >= high) {
        em_error(EM_ERR_ARGUMENT, "em_randint: random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                 (long long)low, (long long)high);
        return NULL;
    }
    return random_tensor("em_randint", shape, o, EM_RNG_RANDINT, (double)low, (double)high);
}
