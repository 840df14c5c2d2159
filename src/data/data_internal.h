/* Helpers shared by the tensor-level files of src/data/. Ownership inside src/data: the
 * em__ functions return references owned by the caller and registered in no scope;
 * public functions hand them out with em__scoped(), like every Ember result. */
#ifndef EM_DATA_INTERNAL_H
#define EM_DATA_INTERNAL_H

#include <ember/ember.h>
#include "parsers.h"

/* A contiguous tensor on device holding a copy of a; NULL and an error on failure. */
em_tensor *em__array_to_tensor(const em__array *a, em_device device);
/* Calls made inside a private scope: f's temporaries are freed at its end, and the
 * result it returns (kept with em_keep) is the caller's own reference. */
#define EM__UNSCOPED(result, expr)                     \
    do {                                               \
        em_scope em__s = em_scope_begin();             \
        em_tensor *em__r = (expr);                     \
        (result) = em__r ? em_keep(em__r) : NULL;      \
        em_scope_end(em__s);                           \
    } while (0)
/* t's elements, row-major in its dtype, copied into a new malloc'ed host buffer. */
em_status em__host_bytes(em_tensor *t, void **out, size_t *nbytes, const char *op);

#endif
