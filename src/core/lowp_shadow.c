/* Low-precision shadows of float32 parameters (core_internal.h).
 *
 * A bf16 step casts every float32 master weight to bf16 (by hand or in an autocast region),
 * a pass that reads 4 and writes 2 bytes per parameter right after the optimizer has read
 * and written the same weights. The fused Adam step writes the bf16 value of each new weight
 * in its own pass instead (the element is still in a register), and the next cast hands
 * that copy out rather than casting: measured on the 4096-wide MLP's step, see
 * docs/BENCHMARKS.md (issue 14).
 *
 * The copy (the storage's "shadow") is used only while it is exactly what a cast would give:
 * the parameter's storage version is the one it was made from (every in-place write bumps
 * it, as for autocast's cast cache), the copy's own version is unchanged, and nobody else
 * holds it: so two casts never alias, and a cast output that was written in place never
 * comes back. The kernel rounds with the cast's own routine: bit for bit the same values.
 * Cost: 2 bytes per such parameter kept between steps. EMBER_LOWP_SHADOW=0 turns it off. */
#include "core_internal.h"
#include "errors.h"
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* every shadow field */

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
    em_error_save(&saved);
    pthread_mutex_lock(&g_lock);
    em_storage *sh = s->shadow;
    bool current = sh && s->shadow_dtype == dt && s->shadow_of == atomic_load(&s->version) &&
                   s->shadow_version == atomic_load(&sh->version);
    if (current && atomic_load(&sh->refcount) == 1)
        out = em__tensor_alloc(sh, dt, t->ndim, t->shape, t->strides, 0); /* holds it: refcount 2 */
    if (sh && !current) { /* the parameter (or the copy) changed since: free it now */
        stale = sh;
        s->shadow = NULL;
    }
    s->shadow_dtype = dt;
    pthread_mutex_unlock(&g_lock);
    em__storage_release(stale);
    if (!out) em_error_restore(&saved); /* no header: the caller casts as usual */
    return out;
}

em_tensor *em__shadow_target(em_tensor *p) {
    if (!enabled() || !p->is_leaf || !p->requires_grad || !whole_storage(p) ||
        !em__is_contiguous_raw(p->ndim, p->shape, p->strides))
        return NULL;
    em_storage *s = p->storage, *reuse = NULL;
    pthread_mutex_lock(&g_lock);
    em_dtype dt = s->shadow_dtype;
    if (dt != EM_F32 && s->shadow && atomic_load(&s->shadow->refcount) == 1) {
        reuse = s->shadow; /* nobody else sees it: overwrite it, detached meanwhile */
        s->shadow = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (dt == EM_F32) return NULL; /* no cast asked for one */
    em_error_state saved;
    em_error_save(&saved);
    em_tensor *out = reuse ? em__tensor_alloc(reuse, dt, p->ndim, p->shape, p->strides, 0)
                           : em__tensor_new_on(s->backend, s->device, p->ndim, p->shape, dt);
    em__storage_release(reuse);
    if (!out) em_error_restore(&saved); /* out of memory: the step runs without a copy */
    return out;
}

void em__shadow_install(em_tensor *p, em_tensor *target) {
    em_storage *s = p->storage, *sh = target->storage;
    atomic_fetch_add(&sh->refcount, 1);
    pthread_mutex_lock(&g_lock);
    em_storage *old = s->shadow;
    s->shadow = sh;
    s->shadow_dtype = target->dtype;
    s->shadow_of = atomic_load(&s->version);
    s->shadow_version = atomic_load(&sh->version);
    pthread_mutex_unlock(&g_lock);
    em__storage_release(old);
    em_release(target);
}
