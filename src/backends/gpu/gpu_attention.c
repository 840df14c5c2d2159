/* GPU op layer, fused attention (attention.k): SDPA and SDPA_BACKWARD of the op list, written
 * once for every GPU backend. The kernels keep whole rows of q and k (E) and of v (Ev) in
 * local memory, so heads wider than EMK_ATT_DMAX are declined (core composes them).
 *
 * Forward: one work-group per EMK_ATT_ROWS rows of a key/value head's query group (and, when
 * core gives a workspace and i[2] key parts, per part: the split decode, then a merge).
 * Backward: one work-group per key block for dk and dv, one per query block for dq. */
#include "gpu.h"

#include <stdio.h>
#include "../../util/errors.h"
#include "gpu_internal.h"

#define ATT_KV_KEYS 32 /* attention.k's ATT_KV_BC: keys per dk/dv work-group */
#define ATT_Q_ROWS 16  /* attention.k's ATT_Q_BR: query rows per dq work-group */

static bool att_dtype(em_dtype dt) { return dt == EM_F32 || dt == EM_F16 || dt == EM_BF16; }

bool em__gpu_sdpa_takes(const em_op_call *c) {
    if (!att_dtype(c->dtype)) return false;
    bool fwd = c->op == EM_OP_SDPA;
    const em_tensor *q = c->src[fwd ? 0 : 1], *v = c->src[fwd ? 2 : 3];
    if (!q || !v) return true; /* asked about the dtype only */
    return q->ndim >= 2 && v->ndim >= 2 && q->shape[q->ndim - 1] <= EMK_ATT_DMAX &&
           v->shape[v->ndim - 1] <= EMK_ATT_DMAX;
}

/* {element offset, batch, head, row strides} of a [B, H, rows, cols] operand */
static em_status operand(const em_tensor *t, int64_t *o) {
    if (em__gpu_elem_offset(t, &o[0])) return em_last_status();
    o[1] = t->strides[0];
    o[2] = t->strides[1];
    o[3] = t->strides[2];
    return EM_OK;
}

static em_status sizes(emk_attn *a, const em_op_call *c, const em_tensor *q, const em_tensor *k,
                       const em_tensor *v, const char *op) {
    a->B = q->shape[0];
    a->Hq = q->shape[1];
    a->L = q->shape[2];
    a->E = q->shape[3];
    a->Hkv = k->shape[1];
    a->S = k->shape[2];
    a->Ev = v->shape[3];
    a->causal = c->i[0] != 0;
    a->past = c->i[1];
    a->scale = (float)c->f[0];
    a->splits = 1;
    a->split_keys = a->S;
    if (a->Hkv <= 0 || a->Hq % a->Hkv != 0 || a->E > EMK_ATT_DMAX || a->Ev > EMK_ATT_DMAX)
        return em_error(EM_ERR_INTERNAL, "%s: the GPU kernels take Hq a multiple of Hkv and head dims up to %d, "
                        "got Hq %lld, Hkv %lld, E %lld, Ev %lld", op, EMK_ATT_DMAX, (long long)a->Hq,
                        (long long)a->Hkv, (long long)a->E, (long long)a->Ev);
    return EM_OK;
}

static const char *kname(char *buf, size_t cap, const char *family, em_dtype dt) {
    snprintf(buf, cap, "%s_%s", family, em__kernel_dtype_suffix(dt));
    return buf;
}

em_status em__gpu_sdpa(const em_op_call *c) {
    const char *op = "scaled_dot_product_attention";
    em_tensor *out = c->dst[0], *lse = c->dst[1], *part = c->dst[2];
    const em_tensor *q = c->src[0], *k = c->src[1], *v = c->src[2], *mask = c->src[3];
    const em_gpu *g = em__gpu_of(out);
    int dev = EM__DEV(out);
    emk_attn a = {0};
    if (sizes(&a, c, q, k, v, op) || operand(q, a.q) || operand(k, a.k) || operand(v, a.v) || operand(out, a.o))
        return em_last_status();
    a.has_mask = mask != NULL;
    a.lse_off = -1;
    if ((lse && em__gpu_elem_offset(lse, &a.lse_off)) || (mask && em__gpu_elem_offset(mask, &a.mask_off)))
        return em_last_status();
    /* the key parts: causal rows never read past the last query's position */
    int64_t keys = a.causal && a.past + a.L < a.S ? a.past + a.L : a.S;
    if (part && c->i[2] > 1) {
        if (em__gpu_elem_offset(part, &a.part_off)) return em_last_status();
        a.split_keys = (keys + c->i[2] - 1) / c->i[2];
        a.splits = (keys + a.split_keys - 1) / a.split_keys;
    }
    int64_t blocks = (a.Hq / a.Hkv * a.L + EMK_ATT_ROWS - 1) / EMK_ATT_ROWS;
    size_t grid[3] = {(size_t)(a.B * a.Hkv * a.splits * blocks), 1, 1}, block[3] = {EMK_ATT_THREADS, 1, 1};
    void *ob = out->storage->block.handle;
    em_karg args[] = {EM_KBUF(ob), EM_KBUF(lse ? lse->storage->block.handle : ob),
                      EM_KBUF(a.splits > 1 ? part->storage->block.handle : ob), EM_KBUF(q->storage->block.handle),
                      EM_KBUF(k->storage->block.handle), EM_KBUF(v->storage->block.handle),
                      EM_KBUF(mask ? mask->storage->block.handle : q->storage->block.handle), EM_KSTRUCT(a)};
    char name[32];
    em_status st = g->launch(dev, kname(name, sizeof name, "sdpa_fwd", c->dtype), grid, block,
                             (int)(sizeof args / sizeof args[0]), args, op);
    if (st != EM_OK || a.splits == 1) return st;
    em_karg margs[] = {args[0], args[1], args[2], EM_KSTRUCT(a)};
    return em__gpu_launch_1d(g, dev, kname(name, sizeof name, "sdpa_merge", c->dtype), a.B * a.Hq * a.L * a.Ev,
                             (int)(sizeof margs / sizeof margs[0]), margs, op);
}

em_status em__gpu_sdpa_backward(const em_op_call *c) {
    const char *op = "ScaledDotProductAttentionBackward";
    em_tensor *dq = c->dst[0], *dk = c->dst[1], *dv = c->dst[2];
    const em_tensor *gout = c->src[0], *q = c->src[1], *k = c->src[2], *v = c->src[3], *out = c->src[4],
                    *lse = c->src[5];
    const em_gpu *g = em__gpu_of(dq);
    int dev = EM__DEV(dq);
    emk_attn a = {0};
    if (sizes(&a, c, q, k, v, op) || operand(q, a.q) || operand(k, a.k) || operand(v, a.v) || operand(out, a.o) ||
        operand(gout, a.g) || operand(dq, a.dq) || operand(dk, a.dk) || operand(dv, a.dv) ||
        em__gpu_elem_offset(lse, &a.lse_off))
        return em_last_status();
    size_t block[3] = {EMK_ATT_THREADS, 1, 1};
    char name[32];
    void *gb = gout->storage->block.handle, *qb = q->storage->block.handle, *kb = k->storage->block.handle,
         *vb = v->storage->block.handle, *obuf = out->storage->block.handle, *lb = lse->storage->block.handle;
    size_t kv_grid[3] = {(size_t)(a.B * a.Hkv * ((a.S + ATT_KV_KEYS - 1) / ATT_KV_KEYS)), 1, 1};
    em_karg kv_args[] = {EM_KBUF(dk->storage->block.handle), EM_KBUF(dv->storage->block.handle), EM_KBUF(gb),
                         EM_KBUF(qb), EM_KBUF(kb), EM_KBUF(vb), EM_KBUF(obuf), EM_KBUF(lb), EM_KSTRUCT(a)};
    em_status st = g->launch(dev, kname(name, sizeof name, "sdpa_bwd_kv", c->dtype), kv_grid, block,
                             (int)(sizeof kv_args / sizeof kv_args[0]), kv_args, op);
    if (st != EM_OK) return st;
    size_t q_grid[3] = {(size_t)(a.B * a.Hkv * ((a.Hq / a.Hkv * a.L + ATT_Q_ROWS - 1) / ATT_Q_ROWS)), 1, 1};
    em_karg q_args[] = {EM_KBUF(dq->storage->block.handle), EM_KBUF(gb), EM_KBUF(qb), EM_KBUF(kb), EM_KBUF(vb),
                        EM_KBUF(obuf), EM_KBUF(lb), EM_KSTRUCT(a)};
    return g->launch(dev, kname(name, sizeof name, "sdpa_bwd_q", c->dtype), q_grid, block,
                     (int)(sizeof q_args / sizeof q_args[0]), q_args, op);
}
