/* Scopes: a per-thread stack of the tensors returned while a scope is open. Ending a
 * scope releases (in reverse order) every handle registered since it began. */
#include "core_internal.h"
#include "internal_api.h"
#include "../util/errors.h"
#include <stdlib.h>
#include <string.h>

/* Where each of the innermost scopes begins, for em_rebind; deeper nesting than this is
 * legal, em_rebind just releases nothing early there. */
#define SCOPE_MARKS 64

typedef struct scope_stack {
    em_tensor **items;
    size_t len, cap;
    int depth;
    size_t marks[SCOPE_MARKS]; /* marks[d - 1]: where the scope at depth d begins */
} scope_stack;

static _Thread_local scope_stack tl_scope;

bool em__scope_active(void) { return tl_scope.depth > 0; }

em_scope em_scope_begin(void) {
    tl_scope.depth++;
    if (tl_scope.depth <= SCOPE_MARKS) tl_scope.marks[tl_scope.depth - 1] = tl_scope.len;
    return (em_scope){.mark = tl_scope.len, .depth = tl_scope.depth};
}

void em_scope_end(em_scope s) {
    if (s.depth <= 0 || s.depth > tl_scope.depth) return; /* already ended (an outer end covered it) */
    /* Release from the top down; len shrinks first so a destructor that registers
     * something (it should not) cannot see released slots. */
    while (tl_scope.len > s.mark) {
        em_tensor *t = tl_scope.items[--tl_scope.len];
        em_release(t);
    }
    tl_scope.depth = s.depth - 1;
    if (tl_scope.depth == 0) { /* nothing is open: give the memory back (no leak at thread exit) */
        free(tl_scope.items);
        tl_scope.items = NULL;
        tl_scope.cap = tl_scope.len = 0;
    }
}

em_tensor *em__scoped(em_tensor *t) {
    if (!t || tl_scope.depth == 0) return t;
    if (tl_scope.len == tl_scope.cap) {
        size_t cap = tl_scope.cap ? tl_scope.cap * 2 : 64;
        em_tensor **items = realloc(tl_scope.items, cap * sizeof *items);
        if (!items) {
            em_release(t);
            em_error(EM_ERR_OUT_OF_MEMORY, "out of host memory registering a tensor with its scope");
            return NULL;
        }
        tl_scope.items = items;
        tl_scope.cap = cap;
    }
    tl_scope.items[tl_scope.len++] = t;
    return t;
}

em_tensor *em__scope_return(em_scope s, em_tensor *t) {
    if (t) em_retain(t);
    em_scope_end(s);
    return em__scoped(t);
}

em_tensor *em_keep(em_tensor *t) {
    EM_CHECK_ARG(t, "em_keep", "t");
    return em_retain(t);
}

em_tensor *em_rebind(em_tensor *old, em_tensor *t) {
    if (!old || old == t || tl_scope.depth == 0 || tl_scope.depth > SCOPE_MARKS) return t;
    /* only a reference the innermost scope holds: the caller's input, a parameter or a
     * tensor from an outer scope belongs to someone else. The newest first: that is where
     * the previous value of a variable being rebound usually is. */
    size_t mark = tl_scope.marks[tl_scope.depth - 1];
    for (size_t i = tl_scope.len; i > mark; i--) {
        if (tl_scope.items[i - 1] != old) continue;
        memmove(&tl_scope.items[i - 1], &tl_scope.items[i], (tl_scope.len - i) * sizeof *tl_scope.items);
        tl_scope.len--;
        em_release(old);
        break;
    }
    return t;
}
