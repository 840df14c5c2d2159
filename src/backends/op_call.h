/* Ops as data: one description of an op call, which core fills and every backend runs
 * with one `supports` and one `run` (src/backends/backend.h), each a single switch over the
 * op (ggml's compute-forward switch and tinygrad's op values are the models). The ops and
 * each call's layout are listed once, in src/kernels/op_list.h.
 *
 * Contract (core guarantees these before calling run):
 *  - every tensor is on the backend's device, the index of dst[0]'s storage;
 *  - inputs already have out's shape (broadcast dims have stride 0), unless the op's entry
 *    in the list says otherwise, and the call's dtype (core casts first);
 *  - out does not overlap inputs unless it is exactly the same view (in-place ops);
 *  - numel may be 0 (do nothing); strides may be anything, including 0, unless the op says.
 * Ops are queued on the device's current stream and may return before they finish. run
 * returns EM_OK, or records an error with em_error() and returns its code; the ops the list
 * marks as such may also answer EM_ERR_NOT_SUPPORTED without recording anything, and core
 * takes another path. */
#ifndef EM_BACKENDS_OP_CALL_H
#define EM_BACKENDS_OP_CALL_H

#include <stdbool.h>
#include <stdint.h>
#include <math.h>
#include <ember/tensor.h>
#include "optim_args.h"
#include "../kernels/op_list.h"

/* Every op, from the op list: unary ops, binary ops (comparisons last: they write EM_BOOL),
 * reductions, tensor ops, fused ops. */
#define EM_OP_ENUM_(NAME, name, dtypes, gpu) EM_OP_##NAME,
typedef enum em_op {
    EMK_OPS_ALL(EM_OP_ENUM_)
    EM_OP_COUNT
} em_op;
/* Backends bound their family checks by each list's first and last op (EM_OP_NEG..EM_OP_CLAMP,
 * EM_OP_ADD..EM_OP_LOGICAL_AND with the comparisons from EM_OP_EQ, EM_OP_SUM..EM_OP_ARGMIN),
 * and the unary ops from EM_OP_ADD_SCALAR on take params: a new op goes inside its list. */
#define EM_OP_ONE_(NAME, name, dtypes, gpu) +1
_Static_assert(EM_OP_NEG == 0 && EM_OP_CLAMP == -1 EMK_OPS_UNARY(EM_OP_ONE_),
               "op_list.h: NEG and CLAMP must stay the first and last unary ops");
_Static_assert(EM_OP_ADD == EM_OP_CLAMP + 1 && EM_OP_EQ == EM_OP_ADD EMK_OPS_BINARY(EM_OP_ONE_),
               "op_list.h: ADD must stay the first binary op, EQ the first comparison");
_Static_assert(EM_OP_LOGICAL_AND == EM_OP_EQ - 1 EMK_OPS_COMPARE(EM_OP_ONE_) &&
               EM_OP_SUM == EM_OP_LOGICAL_AND + 1 && EM_OP_ARGMIN == EM_OP_SUM - 1 EMK_OPS_REDUCE(EM_OP_ONE_),
               "op_list.h: LOGICAL_AND must stay the last comparison, SUM and ARGMIN the first "
               "and last reductions");

static inline bool em__op_is_unary(em_op op) { return op >= EM_OP_NEG && op <= EM_OP_CLAMP; }
static inline bool em__op_is_binary(em_op op) { return op >= EM_OP_ADD && op <= EM_OP_LOGICAL_AND; }
static inline bool em__op_is_compare(em_op op) { return op >= EM_OP_EQ && op <= EM_OP_LOGICAL_AND; }
static inline bool em__op_is_reduce(em_op op) { return op >= EM_OP_SUM && op <= EM_OP_ARGMIN; }

/* The dtypes a backend computes an op in (op_list.h's DTYPES column). */
typedef enum em_op_dtypes {
    EM_OPDT_FLOAT, EM_OPDT_F32_F64, EM_OPDT_NUMERIC, EM_OPDT_ANY, EM_OPDT_TRUEDIV
} em_op_dtypes;
#define EM_OP_DTYPES_(NAME, name, dtypes, gpu) case EM_OP_##NAME: return EM_OPDT_##dtypes;
static inline em_op_dtypes em__op_dtypes(em_op op) {
    switch (op) {
    EMK_OPS_ALL(EM_OP_DTYPES_)
    default: return EM_OPDT_ANY;
    }
}
/* The CPU reference's reading of the DTYPES column: float-only math stays float-only (core
 * casts integers first, as PyTorch promotes them); bool gets only what PyTorch allows on
 * bool without promotion; integer division divides. */
static inline bool em__op_dtype_ok(em_op op, em_dtype dt) {
    if ((int)op < 0 || op >= EM_OP_COUNT || (int)dt < 0 || dt >= EM_DTYPE_COUNT) return false;
    switch (em__op_dtypes(op)) {
    case EM_OPDT_FLOAT: return em_dtype_is_floating(dt);
    case EM_OPDT_F32_F64: return dt == EM_F32 || dt == EM_F64;
    case EM_OPDT_NUMERIC: case EM_OPDT_TRUEDIV: return dt != EM_BOOL;
    default: return true;
    }
}

/* ---- the params of particular ops ---- */

typedef enum em_rng_kind {
    EM_RNG_UNIFORM,   /* [p0, p1) */
    EM_RNG_NORMAL,    /* mean p0, std p1 */
    EM_RNG_RANDINT,   /* integers in [p0, p1) */
    EM_RNG_BERNOULLI  /* 1 with probability p0, else 0 */
} em_rng_kind;

/* Convolution and pooling: one 2-d window geometry for im2col, col2im, the pools and the
 * convolution libraries. Every field is int64 so GPU kernels take it by value with the same
 * layout (emk_win2d in src/kernels/conv.k). Input [n, c, h, w], output [n, c or out
 * channels, oh, ow]. */
typedef struct em_window2d {
    int64_t n, c, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t count_include_pad; /* avg pool: padded positions count in the divisor */
    int64_t divisor;           /* avg pool: divisor_override, or 0 */
} em_window2d;
typedef enum em_pool_kind { EM_POOL_MAX, EM_POOL_AVG, EM_POOL_ADAPTIVE_AVG } em_pool_kind;

/* The scalar operands of the fused optimizer kernels, each later rounded to the compute
 * type like the op-by-op path's scalar arguments. */
enum {
    EM_OPT_WD,        /* weight decay added to the gradient (Adam, SGD) */
    EM_OPT_DECAY,     /* AdamW: 1 - lr * wd (1: none) */
    EM_OPT_B1, EM_OPT_OMB1, EM_OPT_B2, EM_OPT_OMB2, /* beta, 1 - beta */
    EM_OPT_SQRT_BC2,  /* sqrt(bias_correction2) */
    EM_OPT_EPS,
    EM_OPT_STEP,      /* Adam: -(lr / bias_correction1); SGD: -lr */
    EM_OPT_MOMENTUM,
    EM_OPT_OMD,       /* SGD: 1 - dampening */
    EM_OPT_NCONST
};
static inline void em__optim_consts(const em_optim_args *a, bool adam, double c[EM_OPT_NCONST]) {
    c[EM_OPT_WD] = adam && a->decoupled ? 0 : a->weight_decay;
    c[EM_OPT_DECAY] = adam && a->decoupled && a->weight_decay != 0 ? 1.0 - a->lr * a->weight_decay : 1;
    c[EM_OPT_B1] = a->beta1;
    c[EM_OPT_OMB1] = 1.0 - a->beta1;
    c[EM_OPT_B2] = a->beta2;
    c[EM_OPT_OMB2] = 1.0 - a->beta2;
    c[EM_OPT_SQRT_BC2] = adam ? sqrt(a->bias_correction2) : 1;
    c[EM_OPT_EPS] = a->eps;
    c[EM_OPT_STEP] = adam ? -(a->lr / a->bias_correction1) : -a->lr;
    c[EM_OPT_MOMENTUM] = a->momentum;
    c[EM_OPT_OMD] = 1.0 - a->dampening;
}

/* ---- the call ---- */

#define EM_OP_MAX_DST 4
#define EM_OP_MAX_SRC 6
#define EM_OP_MAX_PARAMS 8

typedef struct em_op_call {
    em_op op;
    /* The dtype the op computes in: its inputs' (after core's casts); what `supports`
     * decides on. */
    em_dtype dtype;
    em_tensor *dst[EM_OP_MAX_DST];       /* written, in the op's order; unused: NULL */
    const em_tensor *src[EM_OP_MAX_SRC]; /* read, in the op's order; unused: NULL */
    int64_t i[EM_OP_MAX_PARAMS];         /* integer params (dims, flags, kinds, counts) */
    double f[EM_OP_MAX_PARAMS];          /* float params (scalars, eps, scale) */
    const void *arg;                     /* the struct an op's entry names (em_window2d,
                                            em_optim_args), or NULL */
} em_op_call;

/* The reduced dims of a reduction as the bits of i[0]. */
static inline bool em__op_reduces(const em_op_call *c, int dim) { return (c->i[0] >> dim) & 1; }

#endif
