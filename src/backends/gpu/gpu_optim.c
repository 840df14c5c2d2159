/* GPU op layer, fused optimizer steps (optim.k): one launch per parameter for SGD and
 * Adam/AdamW, written once for every GPU backend (see gpu.h). */
#include "gpu.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

/* the flags of optim.k */
enum { F_WD = 1, F_DECAY = 2, F_AMSGRAD = 4, F_MOMENTUM = 8, F_NESTEROV = 16, F_FIRST = 32, F_AMP = 64, F_MAXIMIZE = 128 };

/* Element offsets of the used operands (unused ones stay 0), and the kernel name. */
static em_status prepare(const em_gpu *g, const char *family, em_tensor *const *ts, int n,
                         int64_t *offs, char *name, size_t cap, bool *f64) {
    em_dtype dt = ts[0]->dtype;
    em_gpu_info info = {0};
    g->info(EM__DEV(ts[0]), &info);
    if (!em_dtype_is_floating(dt) || (dt == EM_F64 && !info.has_f64))
        return em_error(EM_ERR_NOT_SUPPORTED, "fused %s step: %s parameters are not supported on %s",
                        family, em_dtype_name(dt), EM__DEVSTR(ts[0]));
    for (int k = 0; k < n; k++) {
        offs[k] = 0;
        if (ts[k] && em__gpu_elem_offset(ts[k], &offs[k])) return em_last_status();
    }
    snprintf(name, cap, "%s_%s", family, em__kernel_dtype_suffix(dt));
    *f64 = dt == EM_F64;
    return EM_OK;
}

static int64_t numel_of(const em_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* a buffer argument: the tensor's block, or (unused operand) p's */
static em_karg buf_arg(const em_tensor *t, const em_tensor *p) {
    return EM_KBUF((t ? t : p)->storage->block.handle);
}

static em_karg scalar_arg(bool f64, double v) { return f64 ? EM_KF64(v) : EM_KF32(v); }

em_status em__gpu_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                            em_tensor *buf) {
    const em_gpu *g = em__gpu_of(p);
    if (a->momentum == 0) buf = NULL;
    em_tensor *ts[3] = {p, (em_tensor *)grad, buf};
    int64_t offs[3];
    char name[32];
    bool f64;
    if (prepare(g, "sgd", ts, 3, offs, name, sizeof name, &f64)) return em_last_status();
    int64_t n = numel_of(p);
    if (n == 0) return EM_OK;
    double c[EM_OPT_NCONST];
    em__optim_consts(a, false, c);
    int f = (a->weight_decay != 0 ? F_WD : 0) | (a->momentum != 0 ? F_MOMENTUM : 0) |
            (a->nesterov ? F_NESTEROV : 0) | (a->first_step ? F_FIRST : 0) | (a->amp ? F_AMP : 0) |
            (a->maximize ? F_MAXIMIZE : 0);
    int64_t oamp = 0;
    if (a->amp && em__gpu_elem_offset(a->amp, &oamp)) return em_last_status();
    em_karg args[] = {buf_arg(p, p), buf_arg(grad, p), buf_arg(buf, p), EM_KI64(n),
                      EM_KI64(offs[0]), EM_KI64(offs[1]), EM_KI64(offs[2]),
                      scalar_arg(f64, c[EM_OPT_WD]), scalar_arg(f64, c[EM_OPT_MOMENTUM]),
                      scalar_arg(f64, c[EM_OPT_OMD]), scalar_arg(f64, c[EM_OPT_STEP]), EM_KI32(f),
                      buf_arg(a->amp, p), EM_KI64(oamp)};
    return em__gpu_launch_1d(g, EM__DEV(p), name, n, (int)(sizeof args / sizeof args[0]), args,
                             "fused sgd step");
}

em_status em__gpu_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *grad,
                             em_tensor *m, em_tensor *v, em_tensor *vmax) {
    const em_gpu *g = em__gpu_of(p);
    if (!a->amsgrad) vmax = NULL;
    em_tensor *ts[5] = {p, (em_tensor *)grad, m, v, vmax};
    int64_t offs[5];
    char name[32];
    bool f64;
    if (prepare(g, "adam", ts, 5, offs, name, sizeof name, &f64)) return em_last_status();
    int64_t n = numel_of(p);
    if (n == 0) return EM_OK;
    double c[EM_OPT_NCONST];
    em__optim_consts(a, true, c);
    int f = (a->amsgrad ? F_AMSGRAD : 0);
    if (a->weight_decay != 0) f |= a->decoupled ? F_DECAY : F_WD;
    if (a->amp) f |= F_AMP;
    if (a->maximize) f |= F_MAXIMIZE;
    int64_t oamp = 0;
    if (a->amp && em__gpu_elem_offset(a->amp, &oamp)) return em_last_status();
    em_karg args[] = {buf_arg(p, p), buf_arg(grad, p), buf_arg(m, p), buf_arg(v, p), buf_arg(vmax, p),
                      EM_KI64(n), EM_KI64(offs[0]), EM_KI64(offs[1]), EM_KI64(offs[2]),
                      EM_KI64(offs[3]), EM_KI64(offs[4]),
                      scalar_arg(f64, c[EM_OPT_WD]), scalar_arg(f64, c[EM_OPT_DECAY]),
                      scalar_arg(f64, c[EM_OPT_B1]), scalar_arg(f64, c[EM_OPT_OMB1]),
                      scalar_arg(f64, c[EM_OPT_B2]), scalar_arg(f64, c[EM_OPT_OMB2]),
                      scalar_arg(f64, c[EM_OPT_SQRT_BC2]), scalar_arg(f64, c[EM_OPT_EPS]),
                      scalar_arg(f64, c[EM_OPT_STEP]), EM_KI32(f), buf_arg(a->amp, p), EM_KI64(oamp),
                      scalar_arg(f64, a->lr), scalar_arg(f64, (double)a->step)};
    return em__gpu_launch_1d(g, EM__DEV(p), name, n, (int)(sizeof args / sizeof args[0]), args,
                             "fused adam step");
}

/* ---- multi-tensor Adam/AdamW (optim.k's adam_multi_f32) ---- */

em_status em__gpu_adam_multi(const em_adam_multi *mt) {
    if (!mt || mt->n <= 0) return EM_OK;
    em_tensor *first = mt->items[0].p;
    const em_gpu *g = em__gpu_of(first);
    int dev = EM__DEV(first);
    int64_t sched_off = 0;
    if (mt->sched) {   /* the step count and learning rate on the device: advance them first */
        int64_t st_off = 0;
        if (em__gpu_elem_offset(mt->sched, &st_off) || em__gpu_elem_offset(mt->consts, &sched_off))
            return em_last_status();
        em_karg sa[] = {EM_KBUF(mt->sched->storage->block.handle), EM_KI64(st_off),
                        EM_KBUF(mt->consts->storage->block.handle), EM_KI64(sched_off), EM_KF64(mt->beta1),
                        EM_KF64(mt->beta2), EM_KF64(mt->weight_decay)};
        em_status st = em__gpu_launch_1d(g, dev, "adam_schedule", 1, (int)(sizeof sa / sizeof sa[0]), sa,
                                         "Adam's step count on the device");
        if (st != EM_OK) return st;
    }
    for (int at = 0; at < mt->n; at += EMK_MT_SLOTS) {
        int n = mt->n - at < EMK_MT_SLOTS ? mt->n - at : EMK_MT_SLOTS;
        emk_adam_multi t;
        memset(&t, 0, sizeof t);
        t.sched_off = sched_off;
        em_karg args[5 * EMK_MT_SLOTS + 2];
        for (int s = 0; s < EMK_MT_SLOTS; s++) {
            const em_adam_multi_item *it = &mt->items[at + (s < n ? s : 0)]; /* unused slots: any buffers */
            const em_tensor *ts[EMK_MT_NOFF] = {it->p, it->g, it->m, it->v, it->low ? it->low : it->p};
            for (int k = 0; k < EMK_MT_NOFF; k++) {
                args[k * EMK_MT_SLOTS + s] = EM_KBUF(ts[k]->storage->block.handle);
                if (s < n && em__gpu_elem_offset(ts[k], &t.off[s * EMK_MT_NOFF + k])) return em_last_status();
            }
            t.start[s + 1] = t.start[s] + (s < n ? numel_of(it->p) : 0);
            if (s >= n) continue;
            const em_optim_args *a = &it->args;
            double c[EM_OPT_NCONST];
            em__optim_consts(a, true, c);
            float *tc = &t.c[s * EMK_MT_NC];
            tc[EMK_MT_C_WD] = (float)c[EM_OPT_WD];
            tc[EMK_MT_C_DECAY] = (float)c[EM_OPT_DECAY];
            tc[EMK_MT_C_B1] = (float)c[EM_OPT_B1];
            tc[EMK_MT_C_OMB1] = (float)c[EM_OPT_OMB1];
            tc[EMK_MT_C_B2] = (float)c[EM_OPT_B2];
            tc[EMK_MT_C_OMB2] = (float)c[EM_OPT_OMB2];
            tc[EMK_MT_C_SBC2] = (float)c[EM_OPT_SQRT_BC2];
            tc[EMK_MT_C_EPS] = (float)c[EM_OPT_EPS];
            tc[EMK_MT_C_STEP] = (float)c[EM_OPT_STEP];
            int64_t f = 0;
            if (a->weight_decay != 0) f |= a->decoupled ? F_DECAY : F_WD;
            if (a->maximize) f |= F_MAXIMIZE;
            if (it->low) f |= it->low->dtype == EM_BF16 ? EMK_MT_LOW_BF16 : EMK_MT_LOW_F16;
            if (mt->sched) f |= EMK_MT_SCHED;
            t.flags[s] = f;
        }
        /* without a schedule any buffer: never read */
        args[5 * EMK_MT_SLOTS] = EM_KBUF((mt->sched ? mt->consts : first)->storage->block.handle);
        args[5 * EMK_MT_SLOTS + 1] = EM_KSTRUCT(t);
        if (t.start[EMK_MT_SLOTS] == 0) continue;
        em_status st = em__gpu_launch_1d(g, dev, "adam_multi_f32", t.start[EMK_MT_SLOTS],
                                         (int)(sizeof args / sizeof args[0]), args, "fused adam step (multi-tensor)");
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* ---- loss scaling (backend.h's amp_unscale / amp_update; kernels in optim.k) ---- */

em_status em__gpu_amp_unscale(em_tensor *grad, em_tensor *state) {
    const em_gpu *g = em__gpu_of(grad);
    em_tensor *ts[2] = {grad, state};
    int64_t offs[2];
    char name[32];
    bool f64;
    if (prepare(g, "amp_unscale", ts, 2, offs, name, sizeof name, &f64)) return em_last_status();
    int64_t n = numel_of(grad);
    if (n == 0) return EM_OK;
    em_karg args[] = {buf_arg(grad, grad), EM_KI64(n), EM_KI64(offs[0]), buf_arg(state, grad), EM_KI64(offs[1])};
    return em__gpu_launch_1d(g, EM__DEV(grad), name, n, (int)(sizeof args / sizeof args[0]), args,
                             "grad scaler unscale");
}

em_status em__gpu_amp_update(em_tensor *state, double growth, double backoff, int64_t interval) {
    const em_gpu *g = em__gpu_of(state);
    int64_t off = 0;
    if (em__gpu_elem_offset(state, &off)) return em_last_status();
    int32_t every = interval > INT32_MAX ? INT32_MAX : (int32_t)interval;
    em_karg args[] = {buf_arg(state, state), EM_KI64(off), EM_KF32(growth), EM_KF32(backoff), EM_KI32(every)};
    return em__gpu_launch_1d(g, EM__DEV(state), "amp_update", 1, (int)(sizeof args / sizeof args[0]), args,
                             "grad scaler update");
}
