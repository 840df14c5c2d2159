/* Ember errors: every fallible call returns a status or NULL and records a
 * thread-local message. Errors are sticky: the first one is kept until
 * em_clear_error(), and an op handed NULL returns NULL without overwriting it,
 * so a chain of calls needs one check at the end (the cairo / ArrayFire model). */
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

/* The status of the first error recorded on this thread since the last clear (EM_OK if none). */
EM_API em_status em_last_status(void);
/* The message of that error ("" if none). Valid until the next em_clear_error() on this thread. */
EM_API const char *em_last_error(void);
/* True when an error is pending on this thread. */
EM_API bool em_failed(void);
/* Forget the pending error so that the next one is recorded. */
EM_API void em_clear_error(void);
/* Record an error (printf-style message) unless one is already pending on this thread, as
 * Ember's own calls do, so that a program's or an extension's own checks read and stick like
 * the library's; returns code, so `return em_error(EM_ERR_SHAPE, "...")` reads well. */
EM_API em_status em_error(em_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A short constant name for a status ("out of memory"). */
EM_API const char *em_status_name(em_status s);

#ifdef __cplusplus
}
#endif
#endif
