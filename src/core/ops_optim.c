/* Fused optimizer steps: the checks and dispatch that every op gets (devices, dtypes,
 * shapes, then the backend's kernel and the version counters), for src/optim. */
#include "internal_api.h"
#include "ops_internal.h"

/* Contiguous, with p's dtype and shape, on p's device (so never p itself: the caller's
 * gradient and states are distinct tensors). */
static bool matches(const em_tensor *p, const em_tensor *t) {
    return t && t->dtype == p->dtype && t->storage->backend == p->storage->backend && em__same_device(t, p) &&
           em__same_shape(t, p) && em__is_contiguous_raw(t->ndim, t->shape, t->strides);
}

static bool operands_fit(const em_tensor *p, int n, const em_tensor *const *ts) {
    if (!p || !em_dtype_is_floating(p->dtype) || !em__is_contiguous_raw(p->ndim, p->shape, p->strides)) return false;
    if (p->storage->read_only) return false; /* the op-by-op path refuses it with its message */
    for (int i = 0; i < n; i++)
        if (!matches(p, ts[i]) || ts[i]->storage->read_only) return false;
    return true;
}

bool em__fused_sgd_applies(const em_tensor *p, const em_tensor *g, const em_tensor *buf) {
    const em_tensor *ts[] = {g, buf};
    return operands_fit(p, buf ? 2 : 1, ts) && em__op_supported(p->storage->backend, EM_OP_SGD_STEP, p->dtype);
}

bool em__fused_adam_applies(const em_tensor *p, const em_tensor *g, const em_tensor *m, const em_tensor *v,
                            const em_tensor *vmax) {
    const em_tensor *ts[] = {g, m, v, vmax};
    return operands_fit(p, vmax ? 4 : 3, ts) && em__op_supported(p->storage->backend, EM_OP_ADAM_STEP, p->dtype);
}

static em_status not_fused(const char *op) {
    return em_error(EM_ERR_ARGUMENT, "%s: the fused step needs p floating and contiguous, and the gradient and "
                    "every state contiguous with p's dtype, shape and device, on a backend with the kernel", op);
}

em_status em__fused_sgd_step(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *buf) {
    if (!a || (a->momentum != 0 && !buf)) return em__error_unless_pending(EM_ERR_ARGUMENT, "fused SGD step: NULL argument");
    if (!em__fused_sgd_applies(p, g, buf)) return not_fused("fused SGD step");
    if (a->amp && !em__amp_state_fits(a->amp, p)) return not_fused("fused SGD step (scaler state)");
    em_status st =
        em__op_run(&(em_op_call){.op = EM_OP_SGD_STEP, .dtype = p->dtype, .dst = {p, buf}, .src = {g}, .arg = a},
                   "fused SGD step");
    if (st != EM_OK) return st;
    em__bump_version(p);
    if (buf) em__bump_version(buf);
    return EM_OK;
}

em_status em__fused_adam_step(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                              em_tensor *v, em_tensor *vmax) {
    if (!a || (a->amsgrad && !vmax)) return em__error_unless_pending(EM_ERR_ARGUMENT, "fused Adam step: NULL argument");
    if (!em__fused_adam_applies(p, g, m, v, a->amsgrad ? vmax : NULL)) return not_fused("fused Adam step");
    if (a->amp && !em__amp_state_fits(a->amp, p)) return not_fused("fused Adam step (scaler state)");
    /* p's low-precision copy for the next cast, written in the same pass (lowp_shadow.c);
     * not under a scaler, whose skipped steps would leave it unwritten */
    em_optim_args with_copy;
    em_tensor *copy = NULL;
    if (!a->amp) {
        with_copy = *a;
        with_copy.lowp_out = p; /* asks whether the backend writes the copy; any tensor will do */
        em_op_call ask = {.op = EM_OP_ADAM_STEP, .dtype = p->dtype, .arg = &with_copy};
        if (p->storage->backend->supports && p->storage->backend->supports(&ask) && (copy = em__shadow_target(p)) != NULL) {
            with_copy.lowp_out = copy;
            a = &with_copy;
        }
    }
    em_op_call c = {.op = EM_OP_ADAM_STEP, .dtype = p->dtype, .dst = {p, m, v, a->amsgrad ? vmax : NULL},
                    .src = {g}, .arg = a};
    em_status st = em__op_run(&c, "fused Adam step");
    if (st != EM_OK) {
        em_release(copy);
        return st;
    }
    em__bump_version(m);
    em__bump_version(v);
    if (a->amsgrad) em__bump_version(vmax);
    em__bump_version(p);
    if (copy) em__shadow_install(p, copy);
    return EM_OK;
}
