/* Low-precision shadows of float32 parameters (core_internal.h).
 *
 * A bf16 step casts every float32 master weight to bf16 (by hand or in an autocast region),
 * a pass that reads 4 and writes 2 bytes per parameter right after the optimizer has read
 * and written the same weights. The fused Adam step writes the bf16 value of each new weight
 * in its own pass instead (the element is still in a register), and the next cast hands
 * that copy out rather than casting: measured on the 4096-wide MLP's step, see
 * docs/BENCHMARKS.md.
 *
 * The copy (the storage's "shadow") is kept in a record attached to the parameter's storage
 * (tensor_impl.h's em_storage_attachment), so the storage carries nothing of mixed precision
 * itself: this file owns it. It is used only while it is exactly what a cast would give:
 * the parameter's storage version is the one it was made from (every in-place write bumps
 * it, as for autocast's cast cache), the copy's own version is unchanged, and nobody else
 * holds it: so two casts never alias, and a cast output that was written in place never
 * comes back. The kernel rounds with the cast's own routine: bit for bit the same values. For
 * a dense non-contiguous view (a Linear weight's transpose) the copy keeps the view's strides,
 * and em__cast_keeping_layout gives the cast the same layout where no copy serves, so the
 * products that read either round alike (docs/ARCHITECTURE.md, "Mixed precision").
 * Cost: 2 bytes per such parameter kept between steps, and a small record per storage a cast
 * asked about. EMBER_LOWP_SHADOW=0 turns it off; an optimizer declines it with
 * em_adam_opts.no_lowp_copy (em_optim_args.no_lowp_copy, read by ops_optim.c). */
#include "core_internal.h"
#include "../util/errors.h"
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* every record's fields */

/* What a parameter's storage has of this file: `dtype` is what casts asked for (EM_F32:
 * nothing yet); `copy` (retained, or NULL) was made from the storage's version `made_from`
 * and had its own version `copy_version` then. */
typedef struct shadow_record {
    em_storage_attachment base;
    em_storage *copy;
    em_dtype dtype;
    unsigned made_from, copy_version;
} shadow_record;

static const char shadow_key; /* tells our records from other attachments */

static void record_release(em_storage_attachment *a) {
    shadow_record *r = (shadow_record *)a;
    em__storage_release(r->copy); /* a copy has no copy: one level deep */
    free(r);
}

/* s's record (g_lock held), made when `make` (NULL when there is none, or no memory). */
static shadow_record *record_of(em_storage *s, bool make) {
    shadow_record *r = (shadow_record *)em__storage_attachment(s, &shadow_key);
    if (r || !make) return r;
    if (!(r = calloc(1, sizeof *r))) return NULL;
    r->base.key = &shadow_key;
    r->base.release = record_release;
    r->dtype = EM_F32;
    em__storage_attach(s, &r->base);
    return r;
}

static bool enabled(void) {
    static atomic_int on = -1; /* threads racing on first use all compute the same */
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("EMBER_LOWP_SHADOW");
        v = !(e && strcmp(e, "0") == 0);
        atomic_store_explicit(&on, v, memory_order_relaxed);
    }
    return v;
}

/* t is float32 and all of its storage, densely (any order of dims: a Linear weight's
 * transpose too), from offset 0: the copy, read with t's strides, is t's cast. */
static bool whole_storage(const em_tensor *t) {
    const em_storage *s = t->storage;
    if (t->dtype != EM_F32 || t->offset != 0 || s->external || s->read_only || s->pinned || s->nbytes == 0 ||
        (size_t)em__numel_raw(t->ndim, t->shape) * sizeof(float) != s->nbytes)
        return false;
    bool used[EM_MAX_DIMS] = {false};
    int64_t expect = 1;
    for (int k = 0; k < t->ndim; k++) { /* the dims by increasing stride must tile the storage */
        int best = -1;
        for (int d = 0; d < t->ndim; d++)
            if (!used[d] && t->shape[d] > 1 && (best < 0 || t->strides[d] < t->strides[best])) best = d;
        if (best < 0) break;
        used[best] = true;
        if (t->strides[best] != expect) return false;
        expect *= t->shape[best];
    }
    return true;
}

/* A cast source: a parameter or a view of one (what requires grad; only parameters' storages
 * ever get a copy: the optimizer makes them). */
static bool eligible(const em_tensor *t) { return t->requires_grad && whole_storage(t); }

em_tensor *em__shadow_take(em_tensor *t, em_dtype dt) {
    if ((dt != EM_BF16 && dt != EM_F16) || !enabled() || !eligible(t)) return NULL;
    em_storage *s = t->storage, *stale = NULL;
    em_tensor *out = NULL;
    em_error_state saved;
    em__error_save(&saved);
    pthread_mutex_lock(&g_lock);
    shadow_record *r = record_of(s, true); /* NULL only without host memory: no note, no copy */
    em_storage *sh = r ? r->copy : NULL;
    bool current = sh && r->dtype == dt && r->made_from == atomic_load(&s->version) &&
                   r->copy_version == atomic_load(&sh->version);
    if (current && atomic_load(&sh->refcount) == 1)
        out = em__tensor_alloc(sh, dt, t->ndim, t->shape, t->strides, 0); /* holds it: refcount 2 */
    if (sh && !current) { /* the parameter (or the copy) changed since: free it now */
        stale = sh;
        r->copy = NULL;
    }
    if (r) r->dtype = dt;
    pthread_mutex_unlock(&g_lock);
    em__storage_release(stale);
    if (!out) em__error_restore(&saved); /* no header: the caller casts as usual */
    return out;
}

em_tensor *em__cast_keeping_layout(em_tensor *t, em_dtype dt) {
    if ((dt != EM_BF16 && dt != EM_F16) || !eligible(t) || em__is_contiguous_raw(t->ndim, t->shape, t->strides))
        return NULL;
    /* the storage cast as one flat run, then viewed with t's strides: element for element
     * the values of a contiguous cast, in the parameter's own order */
    int64_t n = em__numel_raw(t->ndim, t->shape), one = 1;
    em_tensor *flat = em__tensor_alloc(t->storage, t->dtype, 1, &n, &one, 0);
    em_tensor *cast = flat ? em__copy_raw(flat, dt) : NULL;
    em_tensor *out = cast ? em__tensor_alloc(cast->storage, dt, t->ndim, t->shape, t->strides, 0) : NULL;
    em_release(cast);
    em_release(flat);
    return out;
}

em_tensor *em__shadow_target(em_tensor *p) {
    if (!enabled() || !p->is_leaf || !p->requires_grad || !whole_storage(p) ||
        !em__is_contiguous_raw(p->ndim, p->shape, p->strides))
        return NULL;
    em_storage *s = p->storage, *reuse = NULL;
    em_dtype dt = EM_F32;
    pthread_mutex_lock(&g_lock);
    shadow_record *r = record_of(s, false);
    if (r) dt = r->dtype;
    if (dt != EM_F32 && r->copy && atomic_load(&r->copy->refcount) == 1) {
        reuse = r->copy; /* nobody else sees it: overwrite it, detached meanwhile */
        r->copy = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (dt == EM_F32) return NULL; /* no cast asked for one */
    em_error_state saved;
    em__error_save(&saved);
    em_tensor *out = reuse ? em__tensor_alloc(reuse, dt, p->ndim, p->shape, p->strides, 0)
                           : em__tensor_new_on(s->backend, s->device, p->ndim, p->shape, dt);
    em__storage_release(reuse);
    if (!out) em__error_restore(&saved); /* out of memory: the step runs without a copy */
    return out;
}

void em__shadow_install(em_tensor *p, em_tensor *target) {
    em_storage *s = p->storage, *sh = target->storage, *old = NULL;
    pthread_mutex_lock(&g_lock);
    shadow_record *r = record_of(s, false); /* there: em__shadow_target found a wanted dtype */
    if (r) {
        atomic_fetch_add(&sh->refcount, 1);
        old = r->copy;
        r->copy = sh;
        r->dtype = target->dtype;
        r->made_from = atomic_load(&s->version);
        r->copy_version = atomic_load(&sh->version);
    }
    pthread_mutex_unlock(&g_lock);
    em__storage_release(old);
    em_release(target);
}

em_storage *em__shadow_of(const em_tensor *t, em_dtype *asked) {
    pthread_mutex_lock(&g_lock);
    shadow_record *r = record_of(t->storage, false);
    em_storage *copy = r ? r->copy : NULL;
    if (asked) *asked = r ? r->dtype : EM_F32;
    pthread_mutex_unlock(&g_lock);
    return copy;
}
