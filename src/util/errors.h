/* Internal error helpers over the thread-local sticky error (errors.c); the public face is
 * include/ember/error.h. At the bottom with util: every layer reports through it. */
#ifndef EM_UTIL_ERRORS_H
#define EM_UTIL_ERRORS_H

#include <ember/error.h>

/* For code that tries something that may fail and then recovers (an out-of-memory
 * retry): save the pending state, try, and restore it so no stale error leaks out. */
typedef struct em_error_state { em_status status; char message[1024]; } em_error_state;
void em__error_save(em_error_state *s);
void em__error_restore(const em_error_state *s);

/* Guard for op entry points: if t is NULL, return NULL, recording "argument 'name' of
 * op is NULL" only when no error is pending (so the first error of a chain survives). */
#define EM_CHECK_ARG(t, op, name)                                                     \
    do {                                                                              \
        if (!(t)) {                                                                   \
            if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: argument '%s' is NULL", (op), (name)); \
            return NULL;                                                              \
        }                                                                             \
    } while (0)

#endif
