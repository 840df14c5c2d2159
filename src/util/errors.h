/* Internal error helpers over the thread-local error state (errors.c); the public face is
 * include/ember/error.h. At the bottom with util: every layer reports through it. */
#ifndef EM_UTIL_ERRORS_H
#define EM_UTIL_ERRORS_H

#include <ember/error.h>

/* For code that tries something that may fail and then recovers (an out-of-memory
 * retry): save the pending state, try, and restore it so no stale error leaks out. */
typedef struct em_error_state { em_status status; char message[1024]; } em_error_state;
void em__error_save(em_error_state *s);
void em__error_restore(const em_error_state *s);

/* Record an error only when none is pending: for a failure that follows from an earlier one
 * (an argument that is NULL because the call that made it failed, or a sub-call that failed
 * and recorded why), so that the cause stays the error shown. Returns the pending status,
 * or code when it recorded. em_error itself always records: a call's own failure replaces
 * an older error. */
em_status em__error_unless_pending(em_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* How many errors this thread has recorded: a call that compares it before and after a
 * sub-call knows whether that sub-call recorded a failure of its own. */
unsigned long em__error_seq(void);

/* Guard for op entry points: if t is NULL, return NULL, recording "argument 'name' of
 * op is NULL" only when no error is pending (so the error that made the NULL survives). */
#define EM_CHECK_ARG(t, op, name)                                                     \
    do {                                                                              \
        if (!(t)) {                                                                   \
            em__error_unless_pending(EM_ERR_ARGUMENT, "%s: argument '%s' is NULL", (op), (name)); \
            return NULL;                                                              \
        }                                                                             \
    } while (0)

#endif
