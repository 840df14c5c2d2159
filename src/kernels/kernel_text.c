/* Assembling kernel program text for a dialect (see kernel_text.h). */
#include "kernel_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char em__kernel_prelude_text[];
extern const char em__kernel_library_text[];

char *em__kernel_program(em_kernel_dialect d, bool has_f64, const char *user_source) {
    const char *head = d == EM_DIALECT_OPENCL ? "#define EMK_OPENCL 1\n" : "#define EMK_CUDA 1\n";
    const char *f64 = has_f64 ? "#define EMK_HAS_F64 1\n" : "";
    const char *body = user_source ? user_source : em__kernel_library_text;
    const char *line = user_source ? "#line 1 \"user kernel\"\n" : "";
    size_t n = strlen(head) + strlen(f64) + strlen(em__kernel_prelude_text) + strlen(line) +
               strlen(body) + 1;
    char *text = malloc(n);
    if (!text) return NULL;
    snprintf(text, n, "%s%s%s%s%s", head, f64, em__kernel_prelude_text, line, body);
    return text;
}

uint64_t em__fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

const char *em__kernel_dtype_suffix(int dtype) {
    static const char *const names[] = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "b8"};
    return dtype >= 0 && dtype < (int)(sizeof names / sizeof names[0]) ? names[dtype] : "?";
}
