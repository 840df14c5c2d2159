/* Autocast regions (include/ember/amp.h): the per-thread region stack, the op policy
 * table and the cast cache. The ops call in through EM_AUTOCASTn (autocast.h). */
#include "autocast.h"
#include "ops_internal.h"
#include <ember/amp.h>
#include <ember/autograd.h>
#include <stdlib.h>

/* ---- the policy: PyTorch's autocast op lists (torch/csrc/autograd/autocast_mode.cpp),
 * the CPU's for CPU tensors and CUDA's for every GPU type. LOW runs the op in the
 * region's dtype (float64 inputs stay float64, as PyTorch); F32 runs it in float32.
 * Ops that promote mixed inputs to the widest (add, sub, mul, div, where, cat, stack,
 * maximum...) already do so by their own type promotion, so they need no row: under a
 * region they see a low-precision and a float32 input and give float32, as PyTorch's
 * "promote" list does. Everything else runs in its input's dtype. */
typedef enum { P_NONE, P_LOW, P_F32 } policy;

static const struct {
    const char *name;
    policy cpu, gpu;
} table[EM_AC_COUNT] = {
    [EM_AC_MATMUL] = {"matmul", P_LOW, P_LOW},
    [EM_AC_ADDMM] = {"addmm", P_LOW, P_LOW},           /* nn's Linear */
    [EM_AC_CONV2D] = {"conv2d", P_LOW, P_LOW},         /* on both of PyTorch's lists */
    [EM_AC_EXP] = {"exp", P_NONE, P_F32},
    [EM_AC_LOG] = {"log", P_NONE, P_F32},
    [EM_AC_POW] = {"pow", P_NONE, P_F32},
    [EM_AC_SOFTMAX] = {"softmax", P_NONE, P_F32},
    [EM_AC_LOG_SOFTMAX] = {"log_softmax", P_NONE, P_F32},
    [EM_AC_SUM] = {"sum", P_NONE, P_F32},
    [EM_AC_MEAN] = {"mean", P_NONE, P_F32},            /* Ember's addition: a low-precision mean */
    [EM_AC_CROSS_ENTROPY] = {"cross_entropy", P_F32, P_F32},
    [EM_AC_NLL_LOSS] = {"nll_loss", P_F32, P_F32},
    [EM_AC_MSE_LOSS] = {"mse_loss", P_F32, P_F32},
    /* the language models' ops: rms_norm is on CUDA's float32 list (the CPU falls through),
     * scaled_dot_product_attention on both lower-precision lists */
    [EM_AC_RMS_NORM] = {"rms_norm", P_NONE, P_F32},
    [EM_AC_ATTENTION] = {"scaled_dot_product_attention", P_LOW, P_LOW},
    [EM_AC_NONE] = {"", P_NONE, P_NONE},
};

/* ---- regions ---- */
#define MAX_DEPTH 32

typedef struct region {
    em_device_type type;
    em_dtype dtype;
    bool enabled;
} region;

/* A parameter's cast, valid while the parameter keeps its storage and version. */
typedef struct cache_entry {
    em_tensor *src, *cast;     /* retained */
    em_storage *storage;       /* retained, so that its address is not reused meanwhile */
    unsigned version;
    struct cache_entry *next;
} cache_entry;

_Thread_local int em__autocast_on;
static _Thread_local region tl_stack[MAX_DEPTH];
static _Thread_local int tl_depth;
static _Thread_local char tl_owner; /* its address names the thread in handles */
static _Thread_local cache_entry *tl_cache;

static void entry_free(cache_entry *e) {
    em_release(e->cast);
    em_release(e->src);
    em__storage_release(e->storage);
    free(e);
}

static void cache_clear(void) {
    while (tl_cache) {
        cache_entry *e = tl_cache;
        tl_cache = e->next;
        entry_free(e);
    }
}

em_autocast em_autocast_begin_ex(em_device_type type, em_dtype dtype, bool enabled) {
    em_autocast failed = {.depth = -1, .owner = &tl_owner};
    if ((unsigned)type >= EM_DEVICE_TYPE_COUNT) {
        em_error(EM_ERR_ARGUMENT, "em_autocast_begin: invalid device type %d", (int)type);
        return failed;
    }
    if (enabled && dtype != EM_F16 && dtype != EM_BF16) {
        em_error(EM_ERR_DTYPE, "em_autocast_begin: autocast runs ops in a low-precision float dtype: expected "
                 "float16 or bfloat16, got %s",
                 (unsigned)dtype < EM_DTYPE_COUNT ? em_dtype_name(dtype) : "an invalid dtype");
        return failed;
    }
    if (tl_depth == MAX_DEPTH) {
        em_error(EM_ERR_ARGUMENT, "em_autocast_begin: at most %d regions can be open at once on a thread", MAX_DEPTH);
        return failed;
    }
    tl_stack[tl_depth++] = (region){type, dtype, enabled};
    if (enabled) em__autocast_on++;
    return (em_autocast){.depth = tl_depth, .owner = &tl_owner};
}

em_autocast em_autocast_begin(em_device_type type, em_dtype dtype) {
    return em_autocast_begin_ex(type, dtype, true);
}

em_status em_autocast_end(em_autocast r) {
    if (r.depth < 0) return EM_OK; /* its begin failed (and said why): nothing is open */
    if (r.depth == 0)
        return em_error(EM_ERR_ARGUMENT, "em_autocast_end: no region was begun with this handle (expected one "
                        "returned by em_autocast_begin)");
    if (r.owner != &tl_owner)
        return em_error(EM_ERR_ARGUMENT, "em_autocast_end: the region was begun on another thread; autocast "
                        "regions are per thread, end it on the thread that began it");
    if (r.depth > tl_depth)
        return em_error(EM_ERR_ARGUMENT, "em_autocast_end: the region (depth %d) has already ended; %d region(s) "
                        "open on this thread", r.depth, tl_depth);
    if (r.depth < tl_depth)
        return em_error(EM_ERR_ARGUMENT, "em_autocast_end: the region (depth %d) is not the innermost (depth %d): "
                        "end the regions begun inside it first", r.depth, tl_depth);
    if (tl_stack[--tl_depth].enabled) em__autocast_on--;
    if (tl_depth == 0) cache_clear();
    return EM_OK;
}

/* The innermost region for device type t, or NULL. */
static const region *region_for(em_device_type t) {
    for (int i = tl_depth - 1; i >= 0; i--)
        if (tl_stack[i].type == t) return &tl_stack[i];
    return NULL;
}

bool em_autocast_enabled(em_device_type type) {
    const region *r = region_for(type);
    return r && r->enabled;
}

em_dtype em_autocast_dtype(em_device_type type) {
    const region *r = region_for(type);
    if (r && r->enabled) return r->dtype;
    return type == EM_CPU ? EM_BF16 : EM_F16; /* PyTorch's defaults */
}

/* ---- casts ---- */

/* t in dtype dt, recorded by autograd (a float32 leaf gets a float32 gradient). */
static em_tensor *cast(em_tensor *t, em_dtype dt) {
    em_tensor *out = em__to_raw(t, t->storage->device, dt, false);
    if (!out || out == t) return out;
    if (em__grad_needed(1, &t) && em__grad_record(EM_GRAD_COPY, out, 1, &t, &em__no_args) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

/* PyTorch caches the low-precision casts of float32 leaves that require grad (the
 * parameters), in grad mode, until the outermost region ends. */
static em_tensor *cached_cast(em_tensor *t, em_dtype dt, bool low) {
    bool cacheable = low && t->dtype == EM_F32 && t->requires_grad && t->is_leaf && em_is_grad_enabled();
    if (!cacheable) return cast(t, dt);
    unsigned version = atomic_load(&t->storage->version);
    for (cache_entry **p = &tl_cache; *p; p = &(*p)->next) {
        cache_entry *e = *p;
        if (e->src != t || e->cast->dtype != dt) continue;
        if (e->storage == t->storage && e->version == version) return em_retain(e->cast);
        *p = e->next; /* the parameter changed since: drop the stale cast */
        entry_free(e);
        break;
    }
    em_tensor *c = cast(t, dt);
    if (!c) return NULL;
    cache_entry *e = malloc(sizeof *e);
    if (!e) return c; /* no room to cache: the cast is still right */
    atomic_fetch_add(&t->storage->refcount, 1);
    *e = (cache_entry){em_retain(t), em_retain(c), t->storage, version, tl_cache};
    tl_cache = e;
    return c;
}

int em__autocast_apply(em_ac_op op, int n, em_tensor **const *in, em_ac_held *held) {
    held->n = 0;
    if ((unsigned)op >= EM_AC_COUNT || n > EM_AC_MAX_IN) return 0;
    const em_tensor *first = NULL;
    for (int i = 0; i < n && !first; i++) first = *in[i];
    if (!first) return 0;
    em_device dev = first->storage->device;
    const region *r = region_for(dev.type);
    if (!r || !r->enabled) return 0;
    policy p = dev.type == EM_CPU ? table[op].cpu : table[op].gpu;
    if (p == P_NONE) return 0;
    em_dtype want = p == P_LOW ? r->dtype : EM_F32;
    bool todo[EM_AC_MAX_IN] = {false}, any = false;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = *in[i];
        /* floating, not float64, on the same device (a mismatch is the op's error to report) */
        todo[i] = t && em_dtype_is_floating(t->dtype) && t->dtype != EM_F64 && t->dtype != want &&
                  em__same_device(t, first);
        any |= todo[i];
    }
    if (!any) return 0;
    for (int i = 0; i < n; i++) {
        if (!todo[i]) continue;
        em_tensor *c = cached_cast(*in[i], want, p == P_LOW);
        if (!c) {
            em__autocast_done(held, NULL);
            return -1;
        }
        *in[i] = held->t[held->n++] = c;
    }
    return 1;
}

em_tensor *em__autocast_done(em_ac_held *held, em_tensor *r) {
    for (int i = 0; i < held->n; i++) em_release(held->t[i]);
    held->n = 0;
    return r;
}
