/* ZeRO stages 1-3 (include/ember/zero.h): a model's trainable parameters laid out unit by
 * unit in flat spaces, each rank owning a contiguous 1/N of every unit, with an ordinary
 * optimizer (any em_optimizer_ops) over this rank's float32 master shards, one parameter per
 * unit. Everything goes through the public API except core's em__tensor_set_data_, which
 * points a parameter's handle at a view of a flat buffer (or a placeholder) so that the
 * model's layers keep reading the tensors they hold. Checkpoints are in zero_checkpoint.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/autograd.h>
#include <ember/dist.h>
#include <ember/nn.h>
#include <ember/ops.h>
#include <ember/optim.h>
#include <ember/zero.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"
#include "zero_internal.h"

static em_tensor *shards_forward(em_module *m, em_tensor *x) {
    (void)m;
    (void)x;
    em_error(EM_ERR_ARGUMENT, "ZeroShards: the module of a ZeRO optimizer's shards has no forward");
    return NULL;
}
static const em_module_ops SHARDS_OPS = {.name = "ZeroShards", .forward = shards_forward};

em_tensor *em__zero_view(em_tensor *flat, const zero_param *q) {
    return em_reshape(em_narrow(flat, 0, q->offset, q->numel), em_shape_of(q->p));
}

/* A parameter's value between uses at stage 3: one NaN, expanded to the parameter's shape,
 * so that a stray read sees NaN rather than stale numbers and nothing is allocated. */
static em_status point_at_placeholder(em_zero *z, zero_param *q) {
    em_shape ones = em_shape_of(q->p);
    for (int d = 0; d < ones.ndim; d++) ones.d[d] = 1;
    em_tensor *v = em_expand(em_reshape(z->placeholder, ones), em_shape_of(q->p));
    return v ? em__tensor_set_data_(q->p, v) : em_last_status();
}

/* Stage 3: the unit's full parameters, all-gathered into a new flat buffer that its
 * parameters point into. */
em_status em__zero_gather(em_zero *z, zero_unit *u) {
    if (u->gathered) return EM_OK;
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    em_status st = EM_OK;
    em_tensor *flat = em_empty(EM_SHAPE(u->shard * z->world), EM_OPTS(.dtype = z->dtype, .device = z->device));
    em_tensor *mine = u->compute_shard ? u->compute_shard : u->master;
    if (!flat) st = em_last_status();
    if (st == EM_OK) st = em_dist_all_gather(z->g, flat, mine);
    for (int i = 0; st == EM_OK && i < u->nparams; i++) {
        em_tensor *v = em__zero_view(flat, &u->params[i]);
        st = v ? em__tensor_set_data_(u->params[i].p, v) : em_last_status();
    }
    if (st == EM_OK) {
        u->flat = em_retain(flat);
        u->gathered = true;
    }
    em_no_grad_end(mode);
    em_scope_end(s);
    return st;
}

/* Stage 3: back to placeholders; the flat buffer goes when the last view of it does. */
em_status em__zero_release(em_zero *z, zero_unit *u) {
    if (!u->gathered) return EM_OK;
    em_scope s = em_scope_begin();
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < u->nparams; i++) st = point_at_placeholder(z, &u->params[i]);
    em_scope_end(s);
    em_release(u->flat);
    u->flat = NULL;
    u->gathered = false;
    return st;
}

/* The reduce-scatter's input is at most this many elements at once: a unit's gradients go
 * through it a slice of every rank's shard at a time, so that reducing a unit needs its
 * gradients plus this much, not plus a second copy of them (a 7B's decoder layer is 0.8 GB
 * of float32). */
#define REDUCE_CHUNK_ELEMENTS ((int64_t)1 << 24)

/* Elements [at, at + len) of every rank's shard of u's gradients, laid out rank after rank
 * into flat [len * world] (zeroed: a parameter without a gradient, and the padding, count as
 * zeros). */
static em_status gather_grad_slices(em_zero *z, zero_unit *u, em_tensor *flat, int64_t at, int64_t len) {
    em_status st = EM_OK;
    for (int r = 0; st == EM_OK && r < z->world; r++) {
        int64_t lo = (int64_t)r * u->shard + at, hi = lo + len;
        for (int i = 0; st == EM_OK && i < u->nparams; i++) {
            zero_param *q = &u->params[i];
            int64_t a = q->offset > lo ? q->offset : lo, b = q->offset + q->numel < hi ? q->offset + q->numel : hi;
            em_tensor *g = a < b ? em_grad(q->p) : NULL;
            if (g)
                st = em_copy_(em_narrow(flat, 0, (int64_t)r * len + (a - lo), b - a),
                              em_narrow(em_reshape(g, EM_SHAPE(-1)), 0, a - q->offset, b - a));
        }
    }
    return st;
}

/* Stages 2-3: the unit's gradients reduce-scattered (averaged) into this rank's gradient
 * shard, a slice at a time, then freed; a parameter without one counts as zeros. */
static em_status reduce_unit(em_zero *z, zero_unit *u) {
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    em_status st = EM_OK;
    int64_t slice = u->shard;
    if (slice * z->world > REDUCE_CHUNK_ELEMENTS) slice = REDUCE_CHUNK_ELEMENTS / z->world > 0 ? REDUCE_CHUNK_ELEMENTS / z->world : 1;
    em_tensor *part = em_empty(EM_SHAPE(u->shard), EM_OPTS(.dtype = z->dtype, .device = z->device));
    if (!part) st = em_last_status();
    for (int64_t at = 0; st == EM_OK && at < u->shard; at += slice) {
        em_scope cs = em_scope_begin();
        int64_t len = u->shard - at < slice ? u->shard - at : slice;
        em_tensor *flat = em_zeros(EM_SHAPE(len * z->world), EM_OPTS(.dtype = z->dtype, .device = z->device));
        em_tensor *mine = len == u->shard ? part : em_empty(EM_SHAPE(len), EM_OPTS(.dtype = z->dtype, .device = z->device));
        st = flat && mine ? gather_grad_slices(z, u, flat, at, len) : em_last_status();
        if (st == EM_OK) st = em_dist_reduce_scatter(z->g, mine, flat, EM_REDUCE_AVG);
        if (st == EM_OK && mine != part) st = em_copy_(em_narrow(part, 0, at, len), mine);
        em_scope_end(cs);
    }
    for (int i = 0; i < u->nparams; i++) {
        zero_param *q = &u->params[i];
        if (st == EM_OK) st = em_set_grad(q->p, NULL);
        q->seen = false;
    }
    u->seen = 0;
    if (st == EM_OK) {
        if (u->grad_shard) st = em_add_(u->grad_shard, part, 1.0);
        else u->grad_shard = em_retain(part);
    }
    em_no_grad_end(mode);
    em_scope_end(s);
    if (st == EM_OK && z->stage == 3) st = em__zero_release(z, u);
    return st;
}

static zero_param *find_param(em_zero *z, const em_tensor *leaf, zero_unit **unit) {
    for (int k = 0; k < z->nunits; k++)
        for (int i = 0; i < z->units[k].nparams; i++)
            if (z->units[k].params[i].p == leaf) {
                *unit = &z->units[k];
                return &z->units[k].params[i];
            }
    return NULL;
}

/* Stages 2-3, from autograd (every backward, every leaf): a unit is reduced as soon as each
 * of its parameters has a gradient; at the end of a backward, any unit with gradients left
 * (a parameter used twice after its unit was reduced, or one that got none) is reduced too,
 * last unit first on every rank, the order backward meets them. */
static em_status grad_ready(void *ctx, em_tensor *leaf) {
    em_zero *z = ctx;
    if (!leaf) {
        em_status st = EM_OK;
        for (int k = z->nunits - 1; st == EM_OK && k >= 0; k--) {
            zero_unit *u = &z->units[k];
            bool pending = u->seen > 0;
            for (int i = 0; i < u->nparams && !pending; i++) pending = em__grad_borrowed(u->params[i].p) != NULL;
            if (pending) st = reduce_unit(z, u);
            else if (z->stage == 3) st = em__zero_release(z, u);
        }
        return st;
    }
    zero_unit *u = NULL;
    zero_param *q = find_param(z, leaf, &u);
    if (!q) return EM_OK;
    if (!q->seen) {
        q->seen = true;
        u->seen++;
    }
    return u->seen == u->nparams ? reduce_unit(z, u) : EM_OK;
}

/* ---- making one ---- */

static void free_units(em_zero *z) {
    for (int k = 0; k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        for (int i = 0; i < u->nparams; i++) {
            em_release(u->params[i].p);
            free(u->params[i].name);
        }
        free(u->params);
        em_release(u->flat);
        em_release(u->compute_shard);
        em_release(u->master);
        em_release(u->grad_shard);
        free(u->decay_at);
    }
    free(z->units);
    z->units = NULL;
    z->nunits = 0;
}

/* The next unit: the trainable ones of the n parameters ps (none: no unit); block is what
 * em_zero_forward runs for it (NULL: units of the caller's). */
static em_status add_unit_params(em_zero *z, em_module *block, const em_named_tensor *ps, int n, const char *prefix) {
    zero_param *qs = calloc((size_t)(n > 0 ? n : 1), sizeof *qs);
    if (!qs) return em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
    int used = 0;
    int64_t offset = 0;
    em_status st = EM_OK;
    for (int i = 0; i < n && st == EM_OK; i++) {
        em_tensor *p = ps[i].tensor;
        if (!em_requires_grad(p)) continue;
        zero_unit *other = NULL;
        if (find_param(z, p, &other))
            st = em_error(EM_ERR_ARGUMENT, "em_zero_new: parameter '%s%s' is shared with another unit (a child of the "
                          "Sequential): ZeRO shards each unit on its own and cannot share it", prefix, ps[i].name);
        if (st != EM_OK) break;
        if (!z->have_dtype) {
            z->dtype = em_dtype_of(p);
            z->device = em_device_of(p);
            z->have_dtype = true;
        }
        if (em_dtype_of(p) != z->dtype || !em_device_equal(em_device_of(p), z->device)) {
            em_device_string want = em_device_str(z->device), got = em_device_str(em_device_of(p));
            st = em_error(EM_ERR_ARGUMENT, "em_zero_new: every trainable parameter must share one dtype and device: "
                          "'%s%s' is %s on %s, the first was %s on %s", prefix, ps[i].name,
                          em_dtype_name(em_dtype_of(p)), got.s, em_dtype_name(z->dtype), want.s);
            break;
        }
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, ps[i].name);
        qs[used] = (zero_param){.p = em_retain(p), .name = strdup(name), .offset = offset, .numel = em_numel(p)};
        if (!qs[used].name) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
        offset += em_numel(p);
        used++;
    }
    if (st == EM_OK && used > 0) {
        zero_unit *grown = realloc(z->units, (size_t)(z->nunits + 1) * sizeof *grown);
        if (!grown) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
        else {
            z->units = grown;
            z->units[z->nunits++] = (zero_unit){.block = block, .params = qs, .nparams = used, .numel = offset,
                                                .shard = (offset + z->world - 1) / z->world};
            return EM_OK;
        }
    }
    for (int i = 0; i < used; i++) {
        em_release(qs[i].p);
        free(qs[i].name);
    }
    free(qs);
    return st;
}

/* The model's parameters, malloc'ed into *out (*n of them). */
static em_status list_parameters(em_module *m, em_named_tensor **out, int *n) {
    *n = em_module_parameters(m, NULL, 0);
    *out = malloc((size_t)(*n > 0 ? *n : 1) * sizeof **out);
    if (!*out) return em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
    *n = em_module_parameters(m, *out, *n);
    return EM_OK;
}

/* The next unit: block's trainable parameters (none: no unit). */
static em_status add_unit(em_zero *z, em_module *block, const char *prefix) {
    em_named_tensor *ps;
    int n;
    em_status st = list_parameters(block, &ps, &n);
    if (st == EM_OK && n > 0) st = add_unit_params(z, block, ps, n, prefix);
    free(ps);
    return st;
}

/* The units the caller's unit_of gives the model's trainable parameters. */
static em_status add_caller_units(em_zero *z, em_module *model, const em_zero_opts *opts) {
    em_named_tensor *ps, *mine = NULL;
    int n, *unit_of = NULL, units = 0;
    em_status st = list_parameters(model, &ps, &n);
    if (st == EM_OK) {
        unit_of = malloc((size_t)(n > 0 ? n : 1) * sizeof *unit_of);
        mine = malloc((size_t)(n > 0 ? n : 1) * sizeof *mine);
        if (!unit_of || !mine) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
    }
    for (int i = 0; st == EM_OK && i < n; i++) {
        unit_of[i] = em_requires_grad(ps[i].tensor) ? opts->unit_of(opts->unit_ctx, ps[i].name) : -1;
        if (em_requires_grad(ps[i].tensor) && unit_of[i] < 0)
            st = em_error(EM_ERR_ARGUMENT, "em_zero_new: unit_of gave parameter '%s' no unit (%d)", ps[i].name,
                          unit_of[i]);
        else if (unit_of[i] + 1 > units) units = unit_of[i] + 1;
    }
    for (int k = 0; st == EM_OK && k < units; k++) {
        int count = 0;
        for (int i = 0; i < n; i++)
            if (unit_of[i] == k) mine[count++] = ps[i];
        if (count == 0)
            st = em_error(EM_ERR_ARGUMENT, "em_zero_new: unit_of gave unit %d no parameter (units 0 to %d were named)",
                          k, units - 1);
        else st = add_unit_params(z, NULL, mine, count, "");
        if (st == EM_OK && z->nunits != k + 1)
            st = em_error(EM_ERR_ARGUMENT, "em_zero_new: unit %d has no trainable parameter", k);
    }
    free(ps);
    free(mine);
    free(unit_of);
    z->caller_units = true;
    return st;
}

/* Adam's or AdamW's decay_matrices_only: ZeRO decays the matrices' elements itself, since the
 * flat shards have no shape to tell them by; *hyper gets the options without decay. */
static void take_matrix_decay(em_zero *z, em_optimizer *like, em_adam_opts *hyper) {
    const char *name = em_optim_name(like);
    if (!name || (strcmp(name, "adam") && strcmp(name, "adamw"))) return;
    *hyper = *(const em_adam_opts *)em_optim_hyper(like);
    if (!hyper->decay_matrices_only || hyper->weight_decay == 0) return;
    z->matrix_decay = hyper->weight_decay;
    z->decay_decoupled = !strcmp(name, "adamw");
    hyper->weight_decay = 0;
    hyper->decay_matrices_only = false;
}

/* Which elements of this rank's shard of u belong to a matrix (u->decay_at). */
static em_status find_decayed(em_zero *z, zero_unit *u) {
    int64_t lo = (int64_t)z->rank * u->shard, hi = lo + u->shard;
    u->decay_at = malloc((size_t)(2 * u->nparams) * sizeof *u->decay_at);
    if (!u->decay_at) return em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
    for (int i = 0; i < u->nparams; i++) {
        zero_param *q = &u->params[i];
        int64_t a = q->offset > lo ? q->offset : lo, b = q->offset + q->numel < hi ? q->offset + q->numel : hi;
        if (em_ndim(q->p) < 2 || a >= b) continue;
        u->decay_at[2 * u->ndecay] = a - lo;
        u->decay_at[2 * u->ndecay + 1] = b - a;
        u->ndecay++;
    }
    return EM_OK;
}

/* Every rank has the same units of the same sizes (else the collectives would mix data). */
static em_status check_same_layout(em_zero *z) {
    em_scope s = em_scope_begin();
    double sig[3] = {(double)z->nunits, 0, 0};
    for (int k = 0; k < z->nunits; k++) {
        sig[1] += (double)z->units[k].numel;
        sig[2] += (double)z->units[k].numel * (k + 1) + z->units[k].nparams;
    }
    em_tensor *hi = em_from_data(sig, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F64));
    em_tensor *lo = hi ? em_neg(hi) : NULL;
    em_status st = hi && lo ? EM_OK : em_last_status();
    if (st == EM_OK) st = em_dist_all_reduce(z->g, hi, EM_REDUCE_MAX);
    if (st == EM_OK) st = em_dist_all_reduce(z->g, lo, EM_REDUCE_MAX);
    if (st == EM_OK) {
        const double *h = em_data_ptr(hi), *l = em_data_ptr(lo);
        for (int i = 0; i < 3 && st == EM_OK; i++)
            if (h[i] != -l[i])
                st = em_error(EM_ERR_ARGUMENT, "em_zero_new: the ranks' models differ (this rank, %d, has %d units of "
                              "%.0f elements in all): every rank must build the same model", z->rank, z->nunits, sig[1]);
    }
    em_scope_end(s);
    return st;
}

/* Unit u's flat values from rank 0, then this rank's pieces: stages 1-2 keep the flat
 * buffer (the parameters become views of it), stage 3 only the shard. */
static em_status shard_unit(em_zero *z, zero_unit *u, int k) {
    em_scope s = em_scope_begin();
    em_status st = EM_OK;
    em_tensor *flat = em_zeros(EM_SHAPE(u->shard * z->world), EM_OPTS(.dtype = z->dtype, .device = z->device));
    if (!flat) st = em_last_status();
    for (int i = 0; st == EM_OK && i < u->nparams; i++)
        st = em_copy_(em_narrow(flat, 0, u->params[i].offset, u->params[i].numel),
                      em_reshape(u->params[i].p, EM_SHAPE(-1)));
    if (st == EM_OK) st = em_dist_broadcast(z->g, flat, 0);
    em_tensor *mine = st == EM_OK ? em_narrow(flat, 0, (int64_t)z->rank * u->shard, u->shard) : NULL;
    if (st == EM_OK && !mine) st = em_last_status();
    if (st == EM_OK && z->stage < 3) {
        for (int i = 0; st == EM_OK && i < u->nparams; i++) {
            em_tensor *v = em__zero_view(flat, &u->params[i]);
            st = v ? em__tensor_set_data_(u->params[i].p, v) : em_last_status();
        }
        if (st == EM_OK) u->flat = em_retain(flat);
        /* float32: the optimizer steps this rank's part of the flat buffer itself */
        em_tensor *master = st != EM_OK ? NULL : z->dtype == EM_F32 ? mine : em_to_dtype(mine, EM_F32);
        if (st == EM_OK && !master) st = em_last_status();
        if (st == EM_OK) u->master = em_retain(master);
    } else if (st == EM_OK) {
        /* float32: the master is the shard that is gathered; 16-bit: a float32 master and
         * the compute shard that is gathered */
        em_tensor *own = em_clone(mine);
        em_tensor *master = !own ? NULL : z->dtype == EM_F32 ? own : em_to_dtype(own, EM_F32);
        if (!master) st = em_last_status();
        if (st == EM_OK) {
            u->master = em_retain(master);
            if (z->dtype != EM_F32) u->compute_shard = em_retain(own);
            for (int i = 0; st == EM_OK && i < u->nparams; i++) st = point_at_placeholder(z, &u->params[i]);
        }
    }
    if (st == EM_OK) {
        char name[32];
        snprintf(name, sizeof name, "unit%d", k);
        st = em_module_add_parameter(z->shards, name, u->master);
    }
    em_scope_end(s);
    return st;
}

em_zero *em_zero_new(em_module *model, em_dist_group *g, em_optimizer *like, const em_zero_opts *opts) {
    if (!model || !like || !opts) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_new: %s is NULL", !model ? "the model" : !like ? "the optimizer" : "opts");
        return NULL;
    }
    if (opts->stage < 1 || opts->stage > 3) {
        em_error(EM_ERR_ARGUMENT, "em_zero_new: expected stage 1, 2 or 3, got %d", opts->stage);
        return NULL;
    }
    if (!em_dist_is_initialized()) {
        em_error(EM_ERR_ARGUMENT, "em_zero_new: the process group is not initialized (call em_dist_init first)");
        return NULL;
    }
    em_zero *z = calloc(1, sizeof *z);
    if (!z) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_new: out of host memory");
        return NULL;
    }
    *z = (em_zero){.model = model, .g = g, .stage = opts->stage, .rank = em_dist_rank(g),
                   .world = em_dist_world_size(g), .hook = -1, .dtype = EM_F32};
    em_grad_mode mode = em_no_grad_begin();
    em_status st = EM_OK;
    if (opts->unit_of) {
        st = add_caller_units(z, model, opts);
    } else if (em_module_kind_of(model) == EM_MODULE_SEQUENTIAL) {
        for (int i = 0; st == EM_OK && em_module_child(model, i); i++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "%s.", em_module_child_name(model, i));
            st = add_unit(z, em_module_child(model, i), prefix);
        }
    } else {
        st = add_unit(z, model, "");
    }
    if (st == EM_OK && z->nunits == 0) st = em_error(EM_ERR_ARGUMENT, "em_zero_new: the model has no trainable parameters");
    if (st == EM_OK && z->dtype != EM_F32 && z->dtype != EM_BF16 && z->dtype != EM_F16)
        st = em_error(EM_ERR_DTYPE, "em_zero_new: expected float32, bfloat16 or float16 parameters, got %s",
                      em_dtype_name(z->dtype));
    if (st == EM_OK) st = check_same_layout(z);
    if (st == EM_OK) {
        z->shards = em_module_new(&SHARDS_OPS, NULL);
        em_scope s = em_scope_begin();
        em_tensor *ph = em_full(EM_SHAPE(1), NAN, EM_OPTS(.dtype = z->dtype, .device = z->device));
        if (ph) z->placeholder = em_retain(ph);
        em_scope_end(s);
        if (!z->shards || !z->placeholder) st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_OUT_OF_MEMORY;
    }
    em_adam_opts adam;
    take_matrix_decay(z, like, &adam);
    for (int k = 0; st == EM_OK && k < z->nunits; k++) {
        z->units[k].z = z;
        st = shard_unit(z, &z->units[k], k);
        if (st == EM_OK && z->matrix_decay != 0) st = find_decayed(z, &z->units[k]);
    }
    em_no_grad_end(mode);
    if (st == EM_OK) {
        const void *hyper = z->matrix_decay != 0 ? (const void *)&adam : em_optim_hyper(like);
        z->opt = em_optimizer_new(z->shards, em_optim_ops(like), hyper, em_optim_lr(like));
        if (!z->opt) st = em_last_status();
    }
    if (st == EM_OK && z->stage >= 2 && (z->hook = em_autograd_add_grad_hook(grad_ready, z)) < 0) st = em_last_status();
    if (st != EM_OK) {
        em_zero_free(z);
        return NULL;
    }
    return z;
}

/* ---- training ---- */

/* One unit's forward at stage 3, as em_checkpoint's function: the forward (grad mode off)
 * gathers and frees; the recomputation in backward (grad mode on) gathers and leaves the
 * parameters for the backward, after which reduce_unit frees them. */
static em_tensor *unit_forward(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    zero_unit *u = ctx;
    if (em__zero_gather(u->z, u) != EM_OK) return NULL;
    em_tensor *y = em_forward(u->block, in[0]);
    if (!em_is_grad_enabled()) {
        em_status st = em__zero_release(u->z, u);
        if (st != EM_OK) return NULL;
    }
    return y;
}

static zero_unit *unit_of_block(em_zero *z, em_module *block) {
    for (int k = 0; k < z->nunits; k++)
        if (z->units[k].block == block) return &z->units[k];
    return NULL;
}

em_tensor *em_zero_forward(em_zero *z, em_tensor *x) {
    if (!z || !x) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_forward: %s is NULL", !z ? "z" : "the input");
        return NULL;
    }
    if (z->caller_units && z->stage == 3) {
        em_error(EM_ERR_ARGUMENT, "em_zero_forward: the units were given by em_zero_opts.unit_of, so ZeRO does not "
                 "know the model's forward: run each unit's part through em_zero_run_unit");
        return NULL;
    }
    if (z->stage < 3) return em_forward(z->model, x);
    em_scope s = em_scope_begin();
    em_tensor *y = x;
    bool seq = em_module_kind_of(z->model) == EM_MODULE_SEQUENTIAL;
    for (int i = 0; y && (seq ? em_module_child(z->model, i) != NULL : i == 0); i++) {
        em_module *block = seq ? em_module_child(z->model, i) : z->model;
        zero_unit *u = unit_of_block(z, block);
        if (!u) {
            y = em_forward(block, y);
            continue;
        }
        y = em_checkpoint(unit_forward, u, &y, 1);   /* u outlives the graph: z owns it */
    }
    return em__scope_return(s, y);
}

/* A caller's function run as one unit at stage 3 (em_zero_run_unit): em_checkpoint's context. */
typedef struct unit_call {
    zero_unit *u;
    em_checkpoint_fn fn;
    void *ctx;
    void (*free_ctx)(void *);
} unit_call;

static void unit_call_free(void *c) {
    unit_call *k = c;
    if (k->free_ctx) k->free_ctx(k->ctx);
    free(k);
}

/* As unit_forward, around the caller's function. */
static em_tensor *unit_call_run(void *c, em_tensor *const *in, int n) {
    unit_call *k = c;
    if (em__zero_gather(k->u->z, k->u) != EM_OK) return NULL;
    em_tensor *y = k->fn(k->ctx, in, n);
    if (!em_is_grad_enabled()) {
        em_status st = em__zero_release(k->u->z, k->u);
        if (st != EM_OK) return NULL;
    }
    return y;
}

em_tensor *em_zero_run_unit(em_zero *z, int unit, em_checkpoint_fn fn, void *ctx, void (*free_ctx)(void *),
                            em_tensor *const *in, int n) {
    if (!z || !fn || unit < 0 || unit >= z->nunits) {
        if (free_ctx) free_ctx(ctx);
        if (!z || !fn) em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_run_unit: %s is NULL", !z ? "z" : "fn");
        else em_error(EM_ERR_ARGUMENT, "em_zero_run_unit: unit %d out of range (%d units)", unit, z->nunits);
        return NULL;
    }
    if (z->stage < 3) {   /* the parameters are always there */
        em_tensor *y = fn(ctx, in, n);
        if (free_ctx) free_ctx(ctx);
        return y;
    }
    unit_call *k = malloc(sizeof *k);
    if (!k) {
        if (free_ctx) free_ctx(ctx);
        em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_run_unit: out of host memory");
        return NULL;
    }
    *k = (unit_call){.u = &z->units[unit], .fn = fn, .ctx = ctx, .free_ctx = free_ctx};
    return em__checkpoint_owned(unit_call_run, k, unit_call_free, in, n);   /* owns k */
}

em_status em_zero_clear_grads(em_zero *z) {
    if (!z) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_clear_grads: z is NULL");
    for (int k = 0; k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        for (int i = 0; i < u->nparams; i++) {
            em_set_grad(u->params[i].p, NULL);
            u->params[i].seen = false;
        }
        u->seen = 0;
        em_release(u->grad_shard);
        u->grad_shard = NULL;
        em_set_grad(u->master, NULL);
    }
    z->grads_reduced = false;
    return EM_OK;
}

/* Stage 1: the unit's gradients averaged over the ranks (each in place), and this rank's
 * part of them, flat, in float32. */
static em_tensor *stage1_grad_shard(em_zero *z, zero_unit *u) {
    em_tensor *shard = em_zeros(EM_SHAPE(u->shard), EM_OPTS(.dtype = EM_F32, .device = z->device));
    int64_t lo = (int64_t)z->rank * u->shard, hi = lo + u->shard;
    for (int i = 0; shard && i < u->nparams; i++) {
        zero_param *q = &u->params[i];
        em_tensor *g = em_grad(q->p);
        if (!g) {   /* every rank reduces every parameter: a missing gradient counts as zeros */
            if (!(g = em_zeros_like(q->p)) || em_set_grad(q->p, g) != EM_OK) return NULL;
        }
        if (em_dist_all_reduce(z->g, g, EM_REDUCE_AVG) != EM_OK) return NULL;
        int64_t a = q->offset > lo ? q->offset : lo, b = q->offset + q->numel < hi ? q->offset + q->numel : hi;
        if (a < b && em_copy_(em_narrow(shard, 0, a - lo, b - a), em_narrow(em_reshape(g, EM_SHAPE(-1)), 0, a - q->offset, b - a)) != EM_OK)
            return NULL;
    }
    return shard;
}

/* After the step: the compute copies from the masters (copied, not cast: a cast of an
 * optimizer's parameter would make core keep a low-precision shadow of it, lowp_shadow.c).
 * Stages 1-2 all-gather this rank's part into the flat buffer (from a copy: MPI may not
 * read and write one buffer), then write the own part once more, which bumps the buffer's
 * version so that casts of the parameters made before (autocast's cache) are not reused. */
static em_status refresh_compute(em_zero *z, zero_unit *u) {
    if (z->stage == 3)   /* float32: the master is the shard that is gathered */
        return u->compute_shard ? em_copy_(u->compute_shard, u->master) : EM_OK;
    em_tensor *mine = em_empty(EM_SHAPE(u->shard), EM_OPTS(.dtype = z->dtype, .device = z->device));
    em_status st = mine ? em_copy_(mine, u->master) : em_last_status();
    if (st == EM_OK) st = em_dist_all_gather(z->g, u->flat, mine);
    if (st == EM_OK) st = em_copy_(em_narrow(u->flat, 0, (int64_t)z->rank * u->shard, u->shard), mine);
    return st;
}

em_status em__zero_refresh_all(em_zero *z) {
    em_status st = EM_OK;
    for (int k = 0; st == EM_OK && k < z->nunits; k++) {
        em_scope s = em_scope_begin();
        em_grad_mode mode = em_no_grad_begin();
        st = refresh_compute(z, &z->units[k]);
        em_no_grad_end(mode);
        em_scope_end(s);
    }
    return st;
}

/* decay_matrices_only's decay of the matrices' elements of u's master shard, before the
 * optimizer steps it without decay: AdamW's p *= 1 - lr * wd (independent of the update
 * that follows it), Adam's g += wd * p. */
static em_status decay_matrices(em_zero *z, zero_unit *u, em_tensor *g) {
    em_status st = EM_OK;
    double lr = em_optim_lr(z->opt);
    for (int i = 0; st == EM_OK && i < u->ndecay; i++) {
        int64_t at = u->decay_at[2 * i], len = u->decay_at[2 * i + 1];
        em_tensor *p = em_narrow(u->master, 0, at, len);
        if (z->decay_decoupled) st = p ? em_mul_scalar_(p, 1.0 - lr * z->matrix_decay) : em_last_status();
        else st = p ? em_add_(em_narrow(g, 0, at, len), p, z->matrix_decay) : em_last_status();
    }
    return st;
}

double em_zero_clip_grad_norm(em_zero *z, double max_norm) {
    if (!z) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_clip_grad_norm: z is NULL");
        return NAN;
    }
    em_grad_mode mode = em_no_grad_begin();
    em_status st = EM_OK;
    double squares = 0;
    for (int k = 0; st == EM_OK && k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        em_scope s = em_scope_begin();
        if (z->stage == 1 && !z->grads_reduced) {
            em_tensor *g = stage1_grad_shard(z, u);
            if (g) u->grad_shard = em_retain(g);
            else st = em_last_status();
        }
        if (st == EM_OK && u->grad_shard) {
            em_tensor *g = em_to_dtype(u->grad_shard, EM_F32);
            em_tensor *sq = g ? em_sum(em_mul(g, g), EM_ALL_DIMS, false) : NULL;
            if (sq) squares += em_item(sq);
            else st = em_last_status();
        }
        em_scope_end(s);
    }
    if (z->stage == 1 && st == EM_OK) z->grads_reduced = true;
    double norm = NAN;
    em_scope s = em_scope_begin();
    em_tensor *total = st == EM_OK ? em_scalar(squares, EM_OPTS(.dtype = EM_F64)) : NULL;
    if (st == EM_OK && !total) st = em_last_status();
    if (st == EM_OK) st = em_dist_all_reduce(z->g, total, EM_REDUCE_SUM);
    if (st == EM_OK) norm = sqrt(em_item(total));
    em_scope_end(s);
    double coef = max_norm / (norm + 1e-6);
    for (int k = 0; st == EM_OK && max_norm > 0 && coef < 1.0 && k < z->nunits; k++)
        if (z->units[k].grad_shard) st = em_mul_scalar_(z->units[k].grad_shard, coef);
    em_no_grad_end(mode);
    return st == EM_OK ? norm : NAN;
}

/* One unit at a time, so that only one unit's float32 gradient shard exists at once (the
 * optimizer steps the parameters that have a gradient: here that unit's master); the
 * optimizer's step count then says one step, as for one em_step. */
em_status em_zero_step(em_zero *z) {
    if (!z) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_step: z is NULL");
    if (!z->opt) return em_error(EM_ERR_ARGUMENT, "em_zero_step: the model was unsharded (em_zero_unshard): z cannot train");
    int64_t steps = em_optim_steps(z->opt);
    em_status st = EM_OK;
    for (int k = 0; st == EM_OK && k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        em_scope s = em_scope_begin();
        em_grad_mode mode = em_no_grad_begin();
        em_tensor *g = NULL;
        if (z->stage == 1 && !z->grads_reduced) g = stage1_grad_shard(z, u);
        else if (!u->grad_shard) g = em_zeros(EM_SHAPE(u->shard), EM_OPTS(.dtype = EM_F32, .device = z->device));
        else g = z->dtype == EM_F32 || z->stage == 1 ? u->grad_shard : em_to_dtype(u->grad_shard, EM_F32);
        st = g ? em_set_grad(u->master, g) : em_last_status();
        if (st == EM_OK) st = decay_matrices(z, u, g);
        if (st == EM_OK) st = em_step(z->opt);
        em_set_grad(u->master, NULL);
        if (st == EM_OK) st = refresh_compute(z, u);
        em_no_grad_end(mode);
        em_scope_end(s);
    }
    if (st == EM_OK) st = em_optim_set_steps(z->opt, steps + 1);
    return st;
}

em_optimizer *em_zero_optimizer(em_zero *z) { return z ? z->opt : NULL; }
int em_zero_stage(const em_zero *z) { return z ? z->stage : 0; }
int em_zero_num_units(const em_zero *z) { return z ? z->nunits : 0; }

em_status em_zero_unit_info(const em_zero *z, int u, int64_t *numel, int64_t *shard, em_module **block) {
    if (!z) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_unit_info: z is NULL");
    if (u < 0 || u >= z->nunits)
        return em_error(EM_ERR_ARGUMENT, "em_zero_unit_info: unit %d out of range (%d units)", u, z->nunits);
    if (numel) *numel = z->units[u].numel;
    if (shard) *shard = z->units[u].shard;
    if (block) *block = z->units[u].block;
    return EM_OK;
}

em_tensor *em_zero_full_parameters(em_zero *z) {
    if (!z) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_full_parameters: z is NULL");
        return NULL;
    }
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    em_tensor *parts[z->nunits];
    bool ok = true;
    for (int k = 0; ok && k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        em_tensor *flat = u->flat;
        if (z->stage == 3) {   /* the masters, gathered: float32 whatever the compute dtype */
            flat = em_empty(EM_SHAPE(u->shard * z->world), EM_OPTS(.device = z->device));
            ok = flat && em_dist_all_gather(z->g, flat, u->master) == EM_OK;
        }
        parts[k] = ok ? em_cpu(em_to_dtype(em_narrow(flat, 0, 0, u->numel), EM_F32)) : NULL;
        ok = parts[k] != NULL;
    }
    em_tensor *all = ok ? em_cat(parts, z->nunits, 0) : NULL;
    em_no_grad_end(mode);
    return em__scope_return(s, all);
}

em_status em_zero_unshard_to(em_zero *z, int root) {
    if (!z) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_unshard: z is NULL");
    if (root < -1 || root >= z->world)
        return em_error(EM_ERR_ARGUMENT, "em_zero_unshard_to: root %d is not a rank of the %d (or -1: every rank)", root,
                        z->world);
    if (z->stage < 3) return EM_OK;   /* the parameters are views of flat buffers they keep alive */
    /* z trains no more: its optimizer's states (8 bytes a parameter over the ranks) make room
     * for the full weights (4 on root) */
    em_optim_free(z->opt);
    z->opt = NULL;
    bool keep = root < 0 || root == z->rank;
    em_status st = EM_OK;
    for (int k = 0; st == EM_OK && k < z->nunits; k++) {
        zero_unit *u = &z->units[k];
        em_scope s = em_scope_begin();
        em_grad_mode mode = em_no_grad_begin();
        st = em__zero_gather(z, u);
        if (!keep) {
            if (st == EM_OK) st = em__zero_release(z, u);
            em_no_grad_end(mode);
            em_scope_end(s);
            continue;
        }
        for (int i = 0; st == EM_OK && i < u->nparams; i++) {
            em_tensor *own = em_clone(u->params[i].p);
            st = own ? em__tensor_set_data_(u->params[i].p, own) : em_last_status();
        }
        em_release(u->flat);   /* the parameters hold copies of their own now */
        u->flat = NULL;
        u->gathered = false;
        em_no_grad_end(mode);
        em_scope_end(s);
    }
    if (st == EM_OK && keep) z->unsharded = true;
    return st;
}

em_status em_zero_unshard(em_zero *z) { return em_zero_unshard_to(z, -1); }

void em_zero_free(em_zero *z) {
    if (!z) return;
    if (z->hook >= 0) em_autograd_remove_grad_hook(z->hook);
    for (int k = 0; z->stage == 3 && !z->unsharded && k < z->nunits; k++) {
        em_scope s = em_scope_begin();
        em__zero_release(z, &z->units[k]);   /* a unit left gathered by a failed backward */
        em_scope_end(s);
    }
    em_optim_free(z->opt);
    em_module_free(z->shards);
    em_release(z->placeholder);
    free_units(z);
    free(z);
}

/* ---- the paper's memory formulas ---- */

em_status em_zero_estimate(double params, int stage, int ranks, bool mixed, em_zero_memory *out) {
    if (!out) return em_error(EM_ERR_ARGUMENT, "em_zero_estimate: out is NULL");
    if (!(params > 0) || !isfinite(params))
        return em_error(EM_ERR_ARGUMENT, "em_zero_estimate: expected a parameter count > 0, got %g", params);
    if (stage < 0 || stage > 3) return em_error(EM_ERR_ARGUMENT, "em_zero_estimate: expected stage 0 to 3, got %d", stage);
    if (ranks < 1) return em_error(EM_ERR_ARGUMENT, "em_zero_estimate: expected ranks >= 1, got %d", ranks);
    double p = params, n = ranks, w = mixed ? 2 : 4; /* bytes of a compute parameter or gradient */
    *out = (em_zero_memory){0};
    out->parameters = stage >= 3 ? w * p / n : w * p;
    out->gradients = stage >= 2 ? w * p / n : w * p;
    out->master_weights = mixed ? (stage >= 1 ? 4 * p / n : 4 * p) : 0;
    out->optimizer = stage >= 1 ? 8 * p / n : 8 * p;
    out->total = out->parameters + out->gradients + out->master_weights + out->optimizer;
    return EM_OK;
}
