/* Ember errors: every fallible call returns a status or NULL and records a
 * thread-local message. Which error is shown:
 *  - a call that fails by itself (a bad value, a shape mismatch, out of memory, a bad file)
 *    records its own error, replacing any older one: em_last_error() names the most recent
 *    call that failed, never a stale failure from earlier;
 *  - a call handed NULL (the result of an earlier failure) returns NULL or a status and keeps
 *    the error that made the NULL, so a chain such as em_relu(em_matmul(a, b)) reports the
 *    matmul's failure, and a chain of calls needs one check at the end (the cairo /
 *    ArrayFire model).
 * An error stays pending (em_failed() is true) until em_clear_error(); calls with valid
 * arguments still run while one is pending. */
#ifndef EMBER_ERROR_H
#define EMBER_ERROR_H

#include <stdbool.h>
#include <ember/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What went wrong: every fallible call returns one (EM_OK: nothing). */
typedef enum em_status {
    EM_OK = 0,
    EM_ERR_ARGUMENT,      /* a bad value: NULL, out-of-range dim, bad string */
    EM_ERR_SHAPE,         /* shapes that do not fit together */
    EM_ERR_DTYPE,         /* a dtype the op does not accept */
    EM_ERR_DEVICE,        /* tensors on different devices, or a device that does not exist */
    EM_ERR_OUT_OF_MEMORY, /* host or device allocation failed (after freeing the cache and retrying) */
    EM_ERR_IO,            /* a file could not be opened, read or written */
    EM_ERR_FORMAT,        /* a file's contents are corrupt or truncated */
    EM_ERR_NOT_SUPPORTED, /* valid request that this build or backend cannot do */
    EM_ERR_UNAVAILABLE,   /* a backend or library is missing (no driver, no device, lib not found) */
    EM_ERR_BACKEND,       /* a device runtime reported a failure */
    EM_ERR_AUTOGRAD,      /* backward through something that cannot be differentiated */
    EM_ERR_INTERNAL       /* a bug in Ember: please report it */
} em_status;

/* The status of the pending error on this thread (EM_OK if none): see above for which it is. */
EM_API em_status em_last_status(void);
/* The message of that error ("" if none). Valid until the next error or em_clear_error() on
 * this thread. */
EM_API const char *em_last_error(void);
/* True when an error has been recorded on this thread since the last em_clear_error(). */
EM_API bool em_failed(void);
/* Forget the pending error. */
EM_API void em_clear_error(void);
/* Record an error (printf-style message) as Ember's own calls record theirs: it replaces any
 * pending error, so a program's or an extension's own checks read like the library's. For a
 * failure that follows from an earlier one (an argument that is NULL because the call that
 * made it failed), keep that one instead: `if (!em_failed()) em_error(...)`. Returns code, so
 * `return em_error(EM_ERR_SHAPE, "...")` reads well. */
EM_API em_status em_error(em_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A short constant name for a status ("out of memory"). */
EM_API const char *em_status_name(em_status s);

#ifdef __cplusplus
}
#endif
#endif
