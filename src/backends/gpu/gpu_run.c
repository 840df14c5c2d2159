/* The GPU op layer's one switch: what the library kernels run (supports) and each op call
 * unpacked into its family's host code (run), written once for every GPU backend. Fused
 * ops (op_list.h's GPU_ELEMS and GPU_ROWS) need no host code of their own: one generic
 * launch passes their buffers and an emk_call to kernel <name>_<dtype>. */
#include "gpu.h"

#include <stdio.h>
#include <string.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

bool em__gpu_dtype_ok(em_op op, em_dtype dt) {
    if (em__op_dtypes(op) == EM_OPDT_TRUEDIV) return em_dtype_is_floating(dt);
    return em__op_dtype_ok(op, dt);
}

/* How the GPU column of the op list runs each op. */
typedef enum { GPU_RUN_NONE, GPU_RUN_OWN, GPU_RUN_ELEMS, GPU_RUN_ROWS } gpu_run_kind;
typedef struct { gpu_run_kind kind; int ndst, nsrc; } gpu_launch;
#define GPU_OWN {GPU_RUN_OWN, 0, 0}
#define GPU_NONE {GPU_RUN_NONE, 0, 0}
#define GPU_ELEMS(nd, ns) {GPU_RUN_ELEMS, nd, ns}
#define GPU_ROWS(nd, ns) {GPU_RUN_ROWS, nd, ns}
#define GPU_LAUNCH_(NAME, name, dtypes, gpu) [EM_OP_##NAME] = gpu,
static const gpu_launch g_launch[EM_OP_COUNT] = {EMK_OPS_ALL(GPU_LAUNCH_)};
#define GPU_NAME_(NAME, name, dtypes, gpu) [EM_OP_##NAME] = #name,
static const char *const g_name[EM_OP_COUNT] = {EMK_OPS_ALL(GPU_NAME_)};
_Static_assert(EM_OP_MAX_DST + EM_OP_MAX_SRC <= EMK_CALL_TENSORS, "emk_call holds every tensor's offset");
_Static_assert(EM_OP_MAX_PARAMS <= EMK_CALL_PARAMS, "emk_call holds every param");

bool em__gpu_supports(const em_gpu *g, const em_op_call *c) {
    if ((int)c->op < 0 || c->op >= EM_OP_COUNT || g_launch[c->op].kind == GPU_RUN_NONE) return false;
    if (!em__gpu_dtype_ok(c->op, c->dtype)) return false;
    /* the mixed-precision weight copy is written by the CPU's Adam step only */
    if (c->op == EM_OP_ADAM_STEP && c->arg && ((const em_optim_args *)c->arg)->lowp_out) return false;
    if (c->op == EM_OP_SDPA || c->op == EM_OP_SDPA_BACKWARD) return em__gpu_sdpa_takes(c);
    if (c->op == EM_OP_ADAM_STEP_MULTI) {   /* its step schedule (adam_schedule) is float64 */
        const em_adam_multi *mt = c->arg;
        em_gpu_info info = {0};
        if (mt && mt->sched && c->dst[0]) g->info(EM__DEV(c->dst[0]), &info);
        return c->dtype == EM_F32 && (!mt || !mt->sched || info.has_f64);
    }
    if (c->op == EM_OP_CE_ROWS) return c->dtype == EM_F32;
    return true;
}

/* A fused op: its outputs' and inputs' buffers, then one emk_call, one work item per
 * element of dst[0] or per row of c->i[0] of them. */
static em_status run_fused(const em_gpu *g, const em_op_call *c) {
    const gpu_launch *l = &g_launch[c->op];
    const char *name = g_name[c->op];
    em_tensor *out = c->dst[0];
    em_gpu_info info = {0};
    g->info(EM__DEV(out), &info);
    if (c->dtype == EM_F64 && !info.has_f64)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: float64 is not supported on %s (no double precision)", name,
                        EM__DEVSTR(out));
    emk_call k = {0};
    em_karg args[EM_OP_MAX_DST + EM_OP_MAX_SRC + 1];
    int nargs = 0;
    for (int j = 0; j < l->ndst + l->nsrc; j++) {
        const em_tensor *t = j < l->ndst ? c->dst[j] : c->src[j - l->ndst];
        if (!t) t = out; /* an absent optional operand: any buffer, never read */
        else if (em__gpu_elem_offset(t, &k.off[j])) return em_last_status();
        args[nargs++] = EM_KBUF(t->storage->block.handle);
    }
    int64_t numel = 1;
    for (int d = 0; d < out->ndim; d++) numel *= out->shape[d];
    k.items = l->kind == GPU_RUN_ROWS ? (c->i[0] > 0 ? numel / c->i[0] : 0) : numel;
    if (k.items == 0) return EM_OK;
    for (int j = 0; j < EM_OP_MAX_PARAMS; j++) {
        k.i[j] = c->i[j];
        k.f[j] = (float)c->f[j];
        memcpy(&k.fd[j], &c->f[j], sizeof(double));
    }
    args[nargs++] = EM_KSTRUCT(k);
    char kernel[64];
    snprintf(kernel, sizeof kernel, "%s_%s", name, em__kernel_dtype_suffix(c->dtype));
    return em__gpu_launch_1d(g, EM__DEV(out), kernel, k.items, nargs, args, name);
}

#define GPU_CASE_(NAME, name, dtypes, gpu) case EM_OP_##NAME:

em_status em__gpu_run(const em_gpu *g, const em_op_call *c) {
    em_tensor *const *d = c->dst;
    const em_tensor *const *s = c->src;
    const em_window2d *win = c->arg;
    switch (c->op) {
    EMK_OPS_UNARY(GPU_CASE_) return em__gpu_unary(c->op, d[0], s[0], c->f);
    EMK_OPS_BINARY(GPU_CASE_) EMK_OPS_COMPARE(GPU_CASE_) return em__gpu_binary(c->op, d[0], s[0], s[1]);
    EMK_OPS_REDUCE(GPU_CASE_) {
        bool reduce[EM_MAX_DIMS];
        for (int k = 0; k < EM_MAX_DIMS; k++) reduce[k] = em__op_reduces(c, k);
        return em__gpu_reduce(c->op, d[0], s[0], reduce);
    }
    case EM_OP_FILL: return em__gpu_fill(d[0], c->f[0]);
    case EM_OP_FILL_AFFINE: return em__gpu_fill_affine(d[0], c->f[0], c->f[1]);
    case EM_OP_COPY: return em__gpu_copy(d[0], s[0]);
    case EM_OP_WHERE: return em__gpu_where(d[0], s[0], s[1], s[2]);
    case EM_OP_MATMUL: return em__gpu_matmul(d[0], s[0], s[1]);
    case EM_OP_MATMUL_ACC: return em__gpu_matmul_acc(d[0], s[0], s[1]);
    case EM_OP_SOFTMAX: return em__gpu_softmax(d[0], s[0], (int)c->i[0], c->i[1] != 0);
    case EM_OP_INDEX_SELECT: return em__gpu_index_select(d[0], s[0], (int)c->i[0], s[1]);
    case EM_OP_INDEX_ADD: return em__gpu_index_add(d[0], (int)c->i[0], s[0], s[1]);
    case EM_OP_GATHER: return em__gpu_gather(d[0], s[0], (int)c->i[0], s[1]);
    case EM_OP_SCATTER_ADD: return em__gpu_scatter_add(d[0], (int)c->i[0], s[0], s[1]);
    case EM_OP_RNG:
        return em__gpu_rng(d[0], (em_rng_kind)c->i[0], (uint64_t)c->i[1], (uint64_t)c->i[2], c->f[0], c->f[1]);
    case EM_OP_SDPA: return em__gpu_sdpa(c);
    case EM_OP_SDPA_BACKWARD: return em__gpu_sdpa_backward(c);
    case EM_OP_IM2COL: return em__gpu_im2col(d[0], s[0], win);
    case EM_OP_COL2IM: return em__gpu_col2im(d[0], s[0], win);
    case EM_OP_POOL2D: return em__gpu_pool2d((em_pool_kind)c->i[0], d[0], d[1], s[0], win);
    case EM_OP_POOL2D_BACKWARD: return em__gpu_pool2d_backward((em_pool_kind)c->i[0], d[0], s[0], s[1], win);
    case EM_OP_SGD_STEP: return em__gpu_fused_sgd(c->arg, d[0], s[0], d[1]);
    case EM_OP_ADAM_STEP: return em__gpu_fused_adam(c->arg, d[0], s[0], d[1], d[2], d[3]);
    case EM_OP_ADAM_STEP_MULTI: return em__gpu_adam_multi(c->arg);
    case EM_OP_CE_ROWS: return em__gpu_ce_rows(d[0], d[1], s[0], s[1], s[2], s[3], c->f[0]);
    case EM_OP_AMP_UNSCALE: return em__gpu_amp_unscale(d[0], d[1]);
    case EM_OP_AMP_UPDATE: return em__gpu_amp_update(d[0], c->f[0], c->f[1], c->i[0]);
    default:
        if ((int)c->op >= 0 && c->op < EM_OP_COUNT &&
            (g_launch[c->op].kind == GPU_RUN_ELEMS || g_launch[c->op].kind == GPU_RUN_ROWS))
            return run_fused(g, c);
        break;
    }
    return em_error(EM_ERR_NOT_SUPPORTED, "%s: not run by the GPU kernels", (int)c->op >= 0 && c->op < EM_OP_COUNT ? g_name[c->op] : "?");
}
