/* Promotion, broadcasting and input preparation shared by every op. */
#include "ops_internal.h"
#include <math.h>
#include <stdio.h>

static int category(em_dtype dt) { return dt == EM_BOOL ? 0 : em_dtype_is_floating(dt) ? 2 : 1; }

em_dtype em__result_type(int n, em_tensor *const *ts) {
    int dim_dt = -1, zero_dt = -1;
    for (int i = 0; i < n; i++) {
        int *slot = ts[i]->ndim > 0 ? &dim_dt : &zero_dt;
        *slot = *slot < 0 ? (int)ts[i]->dtype : (int)em_promote_types((em_dtype)*slot, ts[i]->dtype);
    }
    if (dim_dt < 0) return (em_dtype)zero_dt;
    if (zero_dt < 0) return (em_dtype)dim_dt;
    /* c10's combine_categories(higher = dimensioned, lower = zero-dim). */
    if (category((em_dtype)zero_dt) > category((em_dtype)dim_dt))
        return em_promote_types((em_dtype)dim_dt, (em_dtype)zero_dt);
    return (em_dtype)dim_dt;
}

em_dtype em__scalar_result_type(em_dtype t, double s) {
    if (em_dtype_is_floating(t)) return t;
    bool integral = isfinite(s) && s == floor(s);
    if (!integral) return EM_F32;
    return t == EM_BOOL ? EM_I64 : t;
}

bool em__can_cast(em_dtype from, em_dtype to) {
    if (em_dtype_is_floating(from) && !em_dtype_is_floating(to)) return false;
    if (from != EM_BOOL && to == EM_BOOL) return false;
    return true;
}

em_status em__broadcast(const char *op, int n, em_tensor *const *ts, int *ndim, int64_t *shape) {
    int nd = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->ndim > nd) nd = ts[i]->ndim;
    for (int k = 0; k < nd; k++) shape[k] = 1;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = ts[i];
        for (int j = 0; j < t->ndim; j++) {
            int k = nd - t->ndim + j;
            int64_t s = t->shape[j];
            if (s == shape[k] || s == 1) continue;
            if (shape[k] == 1) {
                shape[k] = s;
                continue;
            }
            /* Find which earlier tensor fixed this size, for the message. */
            int first = 0;
            for (int p = 0; p < i; p++) {
                int jp = ts[p]->ndim - (nd - k);
                if (jp >= 0 && ts[p]->shape[jp] == shape[k]) {
                    first = p;
                    break;
                }
            }
            char sa[128], sb[128];
            return em_error(EM_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast: dim %d is %lld vs %lld", op,
                            em__shape_str(sa, sizeof sa, ts[first]->ndim, ts[first]->shape),
                            em__shape_str(sb, sizeof sb, t->ndim, t->shape), k - nd, (long long)shape[k],
                            (long long)s);
        }
    }
    *ndim = nd;
    return EM_OK;
}

const em_tensor *em__prepare(const em_tensor *t, em_dtype dt, int ndim, const int64_t *shape,
                             em_tensor *view, em_tensor **tmp) {
    *tmp = NULL;
    const em_tensor *src = t;
    if (t->dtype != dt) {
        *tmp = em__copy_raw(t, dt); /* cast at t's own size: cheaper than after expanding */
        if (!*tmp) return NULL;
        src = *tmp;
    }
    bool same = src->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = src->shape[i] == shape[i];
    if (same) return src;
    int64_t strides[EM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int j = i - (ndim - src->ndim);
        strides[i] = (j < 0 || (src->shape[j] == 1 && shape[i] != 1)) ? 0 : src->strides[j];
    }
    em__stack_view(view, src, ndim, shape, strides, src->offset);
    return view;
}

bool em__op_supported(const em_backend *be, em_op op, em_dtype dt) {
    em_op_call c = {.op = op, .dtype = dt};
    return be->supports && be->supports(&c);
}

em_status em__check_support(const char *op, const em_backend *be, em_op kop, em_dtype dt, em_device d) {
    if (em__op_supported(be, kop, dt)) return EM_OK;
    return em_error(EM_ERR_NOT_SUPPORTED, "%s: not supported for dtype %s on device %s", op, em_dtype_name(dt),
                    em_device_str(d).s);
}

/* The backend of dst[0]'s device. Core's ops check devices once, with PyTorch's messages,
 * before they build a call; builds with assertions (Debug: the sanitizer runs) also check
 * here that every tensor of the call is on that device, to catch a core path that did not. */
#ifdef NDEBUG
static inline const em_backend *call_backend(const em_op_call *c) { return c->dst[0]->storage->backend; }
#else
static const em_backend *call_backend(const em_op_call *c) {
    const em_storage *s0 = c->dst[0]->storage;
    for (int k = 1; k < EM_OP_MAX_DST + EM_OP_MAX_SRC; k++) {
        const em_tensor *t = k < EM_OP_MAX_DST ? c->dst[k] : c->src[k - EM_OP_MAX_DST];
        if (t && (t->storage->backend != s0->backend || t->storage->device.index != s0->device.index)) {
            em_error(EM_ERR_INTERNAL, "op %d: operands on %s and %s reached the backend", (int)c->op,
                     em_device_str(s0->device).s, em_device_str(t->storage->device).s);
            return NULL;
        }
    }
    return s0->backend;
}
#endif

em_status em__op_try(const em_op_call *c) {
    const em_backend *be = call_backend(c);
    if (!be) return em_last_status();
    if (!be->supports || !be->supports(c)) return EM_ERR_NOT_SUPPORTED;
    return be->run(c);
}

em_status em__op_run(const em_op_call *c, const char *op) {
    const em_backend *be = call_backend(c);
    if (!be) return em_last_status();
    if (!be->run) /* a backend that is not built in (CUDA without its headers) */
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: the %s backend is not built in", op, be->name);
    return be->run(c); /* a backend reports an op or dtype it cannot run itself, naming it */
}
