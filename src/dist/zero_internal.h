/* ZeRO's state, shared by src/dist/zero.c (training) and zero_checkpoint.c (sharded
 * checkpoints). Not public: include/ember/zero.h is the API. */
#ifndef EM_DIST_ZERO_INTERNAL_H
#define EM_DIST_ZERO_INTERNAL_H

#include <ember/zero.h>

/* A trainable parameter of the model and its place in its unit's flat space. */
typedef struct zero_param {
    em_tensor *p;          /* the model's parameter (retained; its handle never changes) */
    char *name;            /* its name in the model ("0.weight"), owned */
    int64_t offset, numel; /* its elements in the unit's flat space */
    bool seen;             /* stages 2-3: its gradient arrived in this backward */
} zero_param;

/* A unit: a block's parameters, flat, each rank owning [rank * shard, (rank + 1) * shard). */
typedef struct zero_unit {
    struct em_zero *z;        /* its owner: the unit is em_checkpoint's context at stage 3 */
    em_module *block;         /* what em_zero_forward runs for it at stage 3 (borrowed) */
    zero_param *params;
    int nparams;
    int64_t numel;            /* the parameters' elements, end to end */
    int64_t shard;            /* ceil(numel / world): this rank's part, padding included */
    em_tensor *flat;          /* [shard * world] in the compute dtype: stages 1-2 always (the
                                 parameters are views of it), stage 3 while gathered */
    em_tensor *compute_shard; /* stage 3 with 16-bit parameters: this rank's part in that dtype */
    em_tensor *master;        /* [shard] float32, the optimizer's parameter (stages 1-2 with
                                 float32 parameters: a view of flat) */
    em_tensor *grad_shard;    /* stages 2-3: this rank's reduced gradient, compute dtype, or NULL;
                                 stage 1 after em_zero_clip_grad_norm: the averaged one, float32 */
    int seen;                 /* stages 2-3: parameters whose gradient arrived in this backward */
    bool gathered;            /* stage 3: the parameters point into flat */
    int64_t *decay_at;        /* with decay_matrices_only: pairs (start, length) of this rank's
                                 shard that are elements of a matrix (ndecay pairs) */
    int ndecay;
} zero_unit;

struct em_zero {
    em_module *model;         /* borrowed */
    em_dist_group *g;
    int rank, world, stage;
    em_dtype dtype;           /* the parameters' (compute) dtype */
    em_device device;
    bool have_dtype;          /* dtype and device were taken from the first parameter */
    zero_unit *units;
    int nunits;
    em_module *shards;        /* one parameter per unit: the masters ("unit0", ...) */
    em_optimizer *opt;        /* over shards */
    em_tensor *placeholder;   /* stage 3: one NaN, what a parameter points at between uses */
    int hook;                 /* the gradient hook's id (stages 2-3), or -1 */
    bool unsharded;           /* em_zero_unshard gave the parameters full storage again */
    bool caller_units;        /* the units came from em_zero_opts.unit_of (no blocks to run) */
    bool grads_reduced;       /* stage 1: em_zero_clip_grad_norm averaged the gradients into
                                 the units' grad_shard already */
    /* Adam's and AdamW's decay_matrices_only, applied by ZeRO (the optimizer steps without
     * decay): the decay (0: none) and whether it is decoupled (AdamW) */
    double matrix_decay;
    bool decay_decoupled;
};

/* A parameter's view of a flat buffer, in its shape. */
em_tensor *em__zero_view(em_tensor *flat, const zero_param *q);
/* Stage 3: all-gather a unit's parameters / point them back at the placeholder. */
em_status em__zero_gather(em_zero *z, zero_unit *u);
em_status em__zero_release(em_zero *z, zero_unit *u);
/* The compute copies (flat buffers, compute shards) from the masters, every unit. */
em_status em__zero_refresh_all(em_zero *z);

#endif
