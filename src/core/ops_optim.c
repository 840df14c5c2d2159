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
     * not under a scaler, whose skipped steps would leave it unwritten, nor where the
     * optimizer's options ask for none */
    em_optim_args with_copy;
    em_tensor *copy = NULL;
    if (!a->amp && !a->no_lowp_copy) {
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

/* ---- Adam/AdamW over many parameters ---- */

bool em__fused_adam_multi_applies(const em_adam_multi_item *it) {
    if (!it || !it->p || it->p->dtype != EM_F32 || it->args.amsgrad || it->args.amp) return false;
    const em_tensor *ts[] = {it->g, it->m, it->v};
    return operands_fit(it->p, 3, ts) && em__op_supported(it->p->storage->backend, EM_OP_ADAM_STEP_MULTI, EM_F32);
}

em_status em__fused_adam_multi_step(em_adam_multi *mt) {
    if (!mt || mt->n <= 0 || !mt->items) return em__error_unless_pending(EM_ERR_ARGUMENT, "fused Adam step: no parameters");
    for (int i = 0; i < mt->n; i++)
        if (!em__fused_adam_multi_applies(&mt->items[i]) || !em__same_device(mt->items[i].p, mt->items[0].p))
            return not_fused("fused Adam step (multi-tensor)");
    for (int i = 0; i < mt->n; i++)
        mt->items[i].low = mt->items[i].args.no_lowp_copy ? NULL : em__shadow_target(mt->items[i].p);
    em_status st = em__op_try(&(em_op_call){.op = EM_OP_ADAM_STEP_MULTI, .dtype = EM_F32, .dst = {mt->items[0].p},
                                            .arg = mt});
    for (int i = 0; i < mt->n; i++) {
        em_adam_multi_item *it = &mt->items[i];
        if (st != EM_OK) {
            em_release(it->low);
            it->low = NULL;
            continue;
        }
        em__bump_version(it->m);
        em__bump_version(it->v);
        em__bump_version(it->p);
        if (it->low) em__shadow_install(it->p, it->low);
        it->low = NULL;
    }
    return st;
}

/* ---- the other optimizers' steps: fused ops of the op list ---- */

static const em_op fused_optim_op[EM_FUSED_OPTIM_COUNT] = {
    [EM_FUSED_ADADELTA] = EM_OP_ADADELTA_STEP, [EM_FUSED_ADAGRAD] = EM_OP_ADAGRAD_STEP,
    [EM_FUSED_RMSPROP] = EM_OP_RMSPROP_STEP,   [EM_FUSED_ADAMAX] = EM_OP_ADAMAX_STEP,
    [EM_FUSED_NADAM] = EM_OP_NADAM_STEP,       [EM_FUSED_RADAM] = EM_OP_RADAM_STEP,
};
static const char *const fused_optim_name[EM_FUSED_OPTIM_COUNT] = {
    [EM_FUSED_ADADELTA] = "fused Adadelta step", [EM_FUSED_ADAGRAD] = "fused Adagrad step",
    [EM_FUSED_RMSPROP] = "fused RMSprop step",   [EM_FUSED_ADAMAX] = "fused Adamax step",
    [EM_FUSED_NADAM] = "fused NAdam step",       [EM_FUSED_RADAM] = "fused RAdam step",
};
_Static_assert(EM_FUSED_OPTIM_PARAMS == EM_OP_MAX_PARAMS, "a fused step's scalars fill the call's f[]");

bool em__fused_optim_applies(em_fused_optim kind, const em_tensor *p, const em_tensor *g, em_tensor *const *states,
                             int n) {
    if ((unsigned)kind >= EM_FUSED_OPTIM_COUNT || n < 0 || n >= EM_OP_MAX_DST || (n > 0 && !states)) return false;
    const em_tensor *ts[EM_OP_MAX_DST] = {g};
    int m = 1;
    for (int k = 0; k < n; k++)
        if (states[k]) ts[m++] = states[k];
    return operands_fit(p, m, ts) && em__op_supported(p->storage->backend, fused_optim_op[kind], p->dtype);
}

em_status em__fused_optim_step(em_fused_optim kind, em_tensor *p, const em_tensor *g, em_tensor *const *states, int n,
                               int64_t flags, const double f[EM_FUSED_OPTIM_PARAMS]) {
    if ((unsigned)kind >= EM_FUSED_OPTIM_COUNT || !f)
        return em_error(EM_ERR_ARGUMENT, "fused optimizer step: unknown kind %d or no scalars", (int)kind);
    const char *name = fused_optim_name[kind];
    if (!em__fused_optim_applies(kind, p, g, states, n)) return not_fused(name);
    em_op_call c = {.op = fused_optim_op[kind], .dtype = p->dtype, .dst = {p}, .src = {g}, .i = {flags}};
    for (int k = 0; k < n; k++) c.dst[1 + k] = states[k];
    for (int k = 0; k < EM_FUSED_OPTIM_PARAMS; k++) c.f[k] = f[k];
    em_status st = em__op_run(&c, name);
    if (st != EM_OK) return st;
    for (int k = 0; k <= n; k++)
        if (c.dst[k]) em__bump_version(c.dst[k]);
    return EM_OK;
}
