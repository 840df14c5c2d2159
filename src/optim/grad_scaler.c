/* The gradient scaler (include/ember/amp.h), PyTorch's GradScaler: scale the loss, unscale
 * the gradients in place, skip a step whose gradients have inf/NaN, grow or back off the
 * scale. Its state lives on the device (src/core/ops_amp.c runs the kernels); the skip
 * happens inside the fused optimizer kernels, which read the found-inf flag, so that no
 * call here waits for the device except the getters. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <ember/amp.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "optim_internal.h"

#define MAX_OPTIMIZERS 8 /* optimizers stepped with one scaler in one iteration */

struct em_grad_scaler {
    em_grad_scaler_opts o;
    em_tensor *state;        /* float32 {scale, tracker, found_inf, skipped}; made by the first scale */
    double init_tracker, init_skipped; /* the state's start beyond init_scale (a loaded state dict) */
    const em_optimizer *unscaled[MAX_OPTIMIZERS], *stepped[MAX_OPTIMIZERS];
    int nunscaled, nstepped; /* since the last update */
};

em_grad_scaler_opts em_grad_scaler_defaults(void) {
    return (em_grad_scaler_opts){.init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5,
                                 .growth_interval = 2000, .enabled = true};
}

em_grad_scaler *em_grad_scaler_new(em_grad_scaler_opts o) {
    if (!(o.init_scale > 0) || !(o.growth_factor > 1.0) || !(o.backoff_factor > 0 && o.backoff_factor < 1.0) ||
        o.growth_interval < 1) {
        em_error(EM_ERR_ARGUMENT, "em_grad_scaler_new: expected init_scale > 0, growth_factor > 1, 0 < "
                 "backoff_factor < 1 and growth_interval >= 1; got %g, %g, %g, %lld", o.init_scale,
                 o.growth_factor, o.backoff_factor, (long long)o.growth_interval);
        return NULL;
    }
    em_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_grad_scaler_new: out of host memory");
        return NULL;
    }
    s->o = o;
    return s;
}

void em_grad_scaler_free(em_grad_scaler *s) {
    if (!s) return;
    em_release(s->state);
    free(s);
}

static bool listed(const em_optimizer *const *list, int n, const em_optimizer *o) {
    for (int i = 0; i < n; i++)
        if (list[i] == o) return true;
    return false;
}

em_tensor *em_grad_scaler_scale(em_grad_scaler *s, em_tensor *loss) {
    if (!s || !loss) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_grad_scaler_scale: %s is NULL", s ? "loss" : "scaler");
        return NULL;
    }
    if (!s->o.enabled) return em__scoped(em_retain(loss));
    em_device d = em_device_of(loss);
    if (!s->state) { /* on the loss's device, as PyTorch's lazy init */
        float init[EM_AMP_NSTATE] = {(float)s->o.init_scale, (float)s->init_tracker, 0, (float)s->init_skipped};
        em_scope sc = em_scope_begin();
        em_tensor *st = em_from_data(init, EM_F32, EM_SHAPE(EM_AMP_NSTATE), EM_OPTS(.device = d));
        s->state = st ? em_keep(st) : NULL;
        em_scope_end(sc);
        if (!s->state) return NULL;
    }
    em_device sd = em_device_of(s->state);
    if (sd.type != d.type || sd.index != d.index) {
        em_error(EM_ERR_DEVICE, "em_grad_scaler_scale: the loss is on %s but this scaler's state is on %s: use one "
                 "scaler per device", em_device_str(d).s, em_device_str(sd).s);
        return NULL;
    }
    em_scope sc = em_scope_begin();
    em_tensor *r = em_mul(loss, em_select(s->state, 0, 0));
    if (r) r = em_keep(r);
    em_scope_end(sc);
    return em__scoped(r);
}

em_status em_grad_scaler_unscale(em_grad_scaler *s, em_optimizer *opt) {
    if (!s || !opt) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_grad_scaler_unscale: %s is NULL", s ? "optimizer" : "scaler");
    if (!s->o.enabled) return EM_OK;
    if (!s->state)
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_unscale: nothing was scaled yet (call "
                        "em_grad_scaler_scale on the loss and run backward first)");
    if (listed(s->unscaled, s->nunscaled, opt))
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_unscale: already called on this optimizer since the last "
                        "em_grad_scaler_update");
    if (listed(s->stepped, s->nstepped, opt))
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_unscale: called after em_grad_scaler_step on this "
                        "optimizer (unscale before stepping)");
    if (s->nunscaled == MAX_OPTIMIZERS)
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_unscale: at most %d optimizers per iteration", MAX_OPTIMIZERS);
    em_status st = EM_OK;
    for (int i = 0; i < em__optim_nparams(opt) && st == EM_OK; i++) {
        em_tensor *g = em__grad_borrowed(em__optim_param(opt, i));
        if (g) st = em__amp_unscale_(g, s->state);
    }
    if (st == EM_OK) s->unscaled[s->nunscaled++] = opt;
    return st;
}

em_status em_grad_scaler_step(em_grad_scaler *s, em_optimizer *opt) {
    if (!s || !opt) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_grad_scaler_step: %s is NULL", s ? "optimizer" : "scaler");
    if (!s->o.enabled) return em_step(opt);
    if (listed(s->stepped, s->nstepped, opt))
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_step: already called on this optimizer since the last "
                        "em_grad_scaler_update");
    if (!listed(s->unscaled, s->nunscaled, opt)) {
        em_status st = em_grad_scaler_unscale(s, opt);
        if (st != EM_OK) return st;
    }
    em__optim_set_amp(opt, s->state);
    em_status st = em_step(opt);
    em__optim_set_amp(opt, NULL);
    if (st == EM_OK) s->stepped[s->nstepped++] = opt;
    return st;
}

em_status em_grad_scaler_update(em_grad_scaler *s) {
    if (!s) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_grad_scaler_update: scaler is NULL");
    if (!s->o.enabled) return EM_OK;
    if (s->nunscaled == 0)
        return em_error(EM_ERR_ARGUMENT, "em_grad_scaler_update: no inf checks were recorded since the last update "
                        "(call em_grad_scaler_step or em_grad_scaler_unscale first)");
    em_status st = em__amp_update_(s->state, s->o.growth_factor, s->o.backoff_factor, s->o.growth_interval);
    s->nunscaled = s->nstepped = 0;
    return st;
}

/* One slot of the state, read back (waits for the device). */
static double read_slot(em_grad_scaler *s, int k, const char *fn) {
    if (!s) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "%s: scaler is NULL", fn);
        return NAN;
    }
    float st[EM_AMP_NSTATE] = {(float)s->o.init_scale, (float)s->init_tracker, 0, (float)s->init_skipped};
    if (s->state && em_copy_to_host(s->state, st, sizeof st) != EM_OK) return NAN;
    return st[k];
}

double em_grad_scaler_get_scale(em_grad_scaler *s) {
    if (s && !s->o.enabled) return 1.0;
    return read_slot(s, EM_AMP_SCALE, "em_grad_scaler_get_scale");
}

int64_t em_grad_scaler_growth_tracker(em_grad_scaler *s) {
    double v = read_slot(s, EM_AMP_TRACKER, "em_grad_scaler_growth_tracker");
    return v == v ? (int64_t)v : -1;
}

int64_t em_grad_scaler_skipped_steps(em_grad_scaler *s) {
    double v = read_slot(s, EM_AMP_SKIPPED, "em_grad_scaler_skipped_steps");
    return v == v ? (int64_t)v : -1;
}

/* ---- state dict ---- */

em_status em_grad_scaler_state_dict(em_grad_scaler *s, em_grad_scaler_state *out) {
    if (!s || !out)
        return em__error_unless_pending(EM_ERR_ARGUMENT, "em_grad_scaler_state_dict: %s is NULL", s ? "out" : "scaler");
    em_grad_scaler_state r = {.scale = 1.0, .growth_factor = s->o.growth_factor, .backoff_factor = s->o.backoff_factor,
                              .growth_interval = s->o.growth_interval, .enabled = s->o.enabled};
    if (s->o.enabled) {
        float st[EM_AMP_NSTATE] = {(float)s->o.init_scale, (float)s->init_tracker, 0, (float)s->init_skipped};
        if (s->state && em_copy_to_host(s->state, st, sizeof st) != EM_OK) return em_last_status();
        r.scale = st[EM_AMP_SCALE];
        r.growth_tracker = (int64_t)st[EM_AMP_TRACKER];
        r.skipped_steps = (int64_t)st[EM_AMP_SKIPPED];
    }
    *out = r;
    return EM_OK;
}

#define MAX_EXACT_COUNT 16777216 /* 2^24: the counts are kept in float32 */

em_status em_grad_scaler_load_state_dict(em_grad_scaler *s, const em_grad_scaler_state *st) {
    const char *fn = "em_grad_scaler_load_state_dict";
    if (!s || !st) return em__error_unless_pending(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, s ? "the state" : "scaler");
    if (!s->o.enabled)
        return em_error(EM_ERR_ARGUMENT, "%s: this scaler is disabled (enabled = false): it has no state to load", fn);
    if (!st->enabled)
        return em_error(EM_ERR_ARGUMENT, "%s: the state is a disabled scaler's (enabled = false): it holds no scale", fn);
    if (s->nunscaled || s->nstepped)
        return em_error(EM_ERR_ARGUMENT, "%s: called between em_grad_scaler_unscale/step and em_grad_scaler_update "
                        "(load before the iteration or after its update)", fn);
    if (!(st->scale <= FLT_MAX && (float)st->scale > 0))   /* NaN fails too; kept in float32 */
        return em_error(EM_ERR_ARGUMENT, "%s: expected a finite scale > 0 (within float32's range), got %g", fn,
                        st->scale);
    if (!(st->growth_factor > 1.0) || !(st->backoff_factor > 0 && st->backoff_factor < 1.0) ||
        st->growth_interval < 1 || st->growth_interval > MAX_EXACT_COUNT)
        return em_error(EM_ERR_ARGUMENT, "%s: expected growth_factor > 1, 0 < backoff_factor < 1 and growth_interval "
                        "from 1 to %d; got %g, %g, %lld", fn, MAX_EXACT_COUNT, st->growth_factor, st->backoff_factor,
                        (long long)st->growth_interval);
    if (st->growth_tracker < 0 || st->growth_tracker >= st->growth_interval)
        return em_error(EM_ERR_ARGUMENT, "%s: expected a growth tracker from 0 to growth_interval - 1 = %lld, got %lld",
                        fn, (long long)(st->growth_interval - 1), (long long)st->growth_tracker);
    if (st->skipped_steps < 0 || st->skipped_steps > MAX_EXACT_COUNT)
        return em_error(EM_ERR_ARGUMENT, "%s: expected skipped_steps from 0 to %d, got %lld", fn, MAX_EXACT_COUNT,
                        (long long)st->skipped_steps);
    s->o.init_scale = st->scale;
    s->o.growth_factor = st->growth_factor;
    s->o.backoff_factor = st->backoff_factor;
    s->o.growth_interval = st->growth_interval;
    s->init_tracker = (double)st->growth_tracker;
    s->init_skipped = (double)st->skipped_steps;
    em_release(s->state);   /* made again, from these, by the next scale */
    s->state = NULL;
    return EM_OK;
}
