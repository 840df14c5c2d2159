/* Loss scaling's device ops (the scaler is src/optim/grad_scaler.c): the checks, then the
 * backend's kernel. Nothing here waits for the device. */
#include "internal_api.h"
#include "ops_internal.h"
#include <ember/autograd.h>

bool em__amp_state_fits(const em_tensor *state, const em_tensor *t) {
    return state && t && state->dtype == EM_F32 && state->ndim == 1 && state->shape[0] == EM_AMP_NSTATE &&
           (state->strides[0] == 1) && state->storage->backend == t->storage->backend && em__same_device(state, t);
}

em_status em__amp_unscale_(em_tensor *g, em_tensor *state) {
    EM_CHECK_ARG_STATUS(g, "grad scaler unscale", "grad");
    EM_CHECK_ARG_STATUS(state, "grad scaler unscale", "state");
    if (!em__amp_state_fits(state, g)) {
        em_device_string a = em_device_str(g->storage->device), b = em_device_str(state->storage->device);
        return em_error(EM_ERR_DEVICE, "grad scaler unscale: the gradient is on %s and the scaler's state on %s: "
                        "use one scaler per device", a.s, b.s);
    }
    if (!em_dtype_is_floating(g->dtype))
        return em_error(EM_ERR_DTYPE, "grad scaler unscale: expected a floating gradient, got %s",
                        em_dtype_name(g->dtype));
    if (em__is_contiguous_raw(g->ndim, g->shape, g->strides) &&
        em__op_supported(g->storage->backend, EM_OP_AMP_UNSCALE, g->dtype)) {
        em_status st = em__op_run(&(em_op_call){.op = EM_OP_AMP_UNSCALE, .dtype = g->dtype, .dst = {g, state}},
                                  "grad scaler unscale");
        if (st == EM_OK) em__bump_version(g);
        return st;
    }
    /* Other layouts and backends without the kernel, with ops and still on the device:
     * sum(g * 0) is NaN exactly when g has an inf or NaN. */
    em_scope s = em_scope_begin();
    em_grad_mode gm = em_no_grad_begin();
    em_tensor *sum = em_sum(em_mul_scalar(em_to_dtype(g, EM_F32), 0.0), EM_ALL_DIMS, false);
    em_tensor *flag = em_narrow(state, 0, EM_AMP_FOUND_INF, 1);
    em_tensor *one = em_ones_like(flag);
    em_status st = em_copy_(flag, em_where(em_ne(sum, sum), one, flag));
    em_tensor *inv = em_div(one, em_narrow(state, 0, EM_AMP_SCALE, 1));
    if (st == EM_OK) st = em_copy_(g, em_mul(g, inv));
    em_no_grad_end(gm);
    em_scope_end(s);
    return st;
}

em_status em__amp_update_(em_tensor *state, double growth, double backoff, int64_t interval) {
    EM_CHECK_ARG_STATUS(state, "grad scaler update", "state");
    if (!em__amp_state_fits(state, state))
        return em_error(EM_ERR_INTERNAL, "grad scaler update: the state must be a contiguous float32 [%d]",
                        EM_AMP_NSTATE);
    return em__op_run(&(em_op_call){.op = EM_OP_AMP_UPDATE, .dtype = EM_F32, .dst = {state}, .f = {growth, backoff},
                                    .i = {interval}}, "grad scaler update");
}
