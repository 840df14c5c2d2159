/* The thread-local error: what the most recent failing call recorded of its own. A call
 * that fails because of an earlier failure (a NULL argument, a sub-call that failed) keeps
 * the earlier error instead of covering it (em__error_unless_pending). */
#include "errors.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local em_error_state tl_error;
static _Thread_local unsigned long tl_error_seq; /* errors recorded on this thread so far */

static void record(em_status code, const char *fmt, va_list ap) {
    tl_error.status = code;
    vsnprintf(tl_error.message, sizeof tl_error.message, fmt, ap);
    tl_error_seq++;
}

em_status em_error(em_status code, const char *fmt, ...) {
    if (code == EM_OK) return code;
    va_list ap;
    va_start(ap, fmt);
    record(code, fmt, ap);
    va_end(ap);
    return code;
}

em_status em__error_unless_pending(em_status code, const char *fmt, ...) {
    if (tl_error.status != EM_OK) return tl_error.status;
    if (code == EM_OK) return code;
    va_list ap;
    va_start(ap, fmt);
    record(code, fmt, ap);
    va_end(ap);
    return code;
}

unsigned long em__error_seq(void) { return tl_error_seq; }

em_status em_last_status(void) { return tl_error.status; }

const char *em_last_error(void) { return tl_error.status == EM_OK ? "" : tl_error.message; }

bool em_failed(void) { return tl_error.status != EM_OK; }

void em_clear_error(void) {
    tl_error.status = EM_OK;
    tl_error.message[0] = '\0';
}

void em__error_save(em_error_state *s) {
    s->status = tl_error.status;
    memcpy(s->message, tl_error.message, sizeof s->message);
}

void em__error_restore(const em_error_state *s) {
    tl_error.status = s->status;
    memcpy(tl_error.message, s->message, sizeof tl_error.message);
}

const char *em_status_name(em_status s) {
    switch (s) {
    case EM_OK: return "ok";
    case EM_ERR_ARGUMENT: return "invalid argument";
    case EM_ERR_SHAPE: return "shape mismatch";
    case EM_ERR_DTYPE: return "unsupported dtype";
    case EM_ERR_DEVICE: return "device error";
    case EM_ERR_OUT_OF_MEMORY: return "out of memory";
    case EM_ERR_IO: return "i/o error";
    case EM_ERR_FORMAT: return "bad file format";
    case EM_ERR_NOT_SUPPORTED: return "not supported";
    case EM_ERR_UNAVAILABLE: return "unavailable";
    case EM_ERR_BACKEND: return "backend failure";
    case EM_ERR_AUTOGRAD: return "autograd error";
    case EM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
