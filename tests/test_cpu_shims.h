/* TEMPORARY: weak stand-ins for core functions (errors, dtype helpers, thread count) so the
 * CPU backend tests link before the core branch lands. Core's real (strong) definitions
 * replace them automatically; delete this file once core is merged. */
#ifndef EMBER_TEST_CPU_SHIMS_H
#define EMBER_TEST_CPU_SHIMS_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <ember/ember.h>
#include "core/errors.h"

#define SHIM __attribute__((weak))

static _Thread_local em_status shim_status;
static _Thread_local char shim_msg[1024];
static int shim_threads = 2;

SHIM em_status em_error(em_status code, const char *fmt, ...) {
    if (shim_status == EM_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(shim_msg, sizeof shim_msg, fmt, ap);
        va_end(ap);
        shim_status = code;
    }
    return code;
}
SHIM em_status em_last_status(void) { return shim_status; }
SHIM const char *em_last_error(void) { return shim_msg; }
SHIM bool em_failed(void) { return shim_status != EM_OK; }
SHIM void em_clear_error(void) { shim_status = EM_OK; shim_msg[0] = '\0'; }
SHIM const char *em_status_name(em_status s) { return s == EM_OK ? "ok" : "error"; }
SHIM size_t em_dtype_size(em_dtype dt) {
    static const size_t s[] = {4, 8, 2, 2, 8, 4, 1, 1};
    return s[dt];
}
SHIM const char *em_dtype_name(em_dtype dt) {
    static const char *const n[] = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool"};
    return (unsigned)dt < 8 ? n[dt] : "?";
}
SHIM bool em_dtype_is_floating(em_dtype dt) { return dt <= EM_BF16; }
SHIM uint16_t em_f32_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
SHIM float em_f16_to_f32(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}
SHIM uint16_t em_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
SHIM float em_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
SHIM int em_get_num_threads(void) { return shim_threads; }
SHIM void em_set_num_threads(int n) { shim_threads = n; }

#endif
