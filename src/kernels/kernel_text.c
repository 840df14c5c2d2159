/* Assembling kernel program text for a dialect (see kernel_text.h). */
#include "kernel_text.h"

#include <stdlib.h>
#include <string.h>

/* head + f64 + prelude + parts..., malloc'd */
static char *assemble(em_kernel_dialect d, bool has_f64, const char *const *parts, int nparts) {
    const char *head = d == EM_DIALECT_OPENCL ? "#define EMK_OPENCL 1\n" : "#define EMK_CUDA 1\n";
    const char *f64 = has_f64 ? "#define EMK_HAS_F64 1\n" : "";
    size_t n = strlen(head) + strlen(f64) + strlen(em__kernel_prelude_text) + 1;
    for (int i = 0; i < nparts; i++) n += strlen(parts[i]);
    char *text = malloc(n), *at = text;
    if (!text) return NULL;
    const char *fixed[3] = {head, f64, em__kernel_prelude_text};
    for (int i = 0; i < 3 + nparts; i++) {
        const char *p = i < 3 ? fixed[i] : parts[i - 3];
        size_t len = strlen(p);
        memcpy(at, p, len);
        at += len;
    }
    *at = '\0';
    return text;
}

char *em__kernel_program(em_kernel_dialect d, bool has_f64, const char *user_source) {
    if (user_source) {
        const char *parts[2] = {"#line 1 \"user kernel\"\n", user_source};
        return assemble(d, has_f64, parts, 2);
    }
    const char **parts = malloc(sizeof *parts * (size_t)(em__kernel_source_count + 1));
    if (!parts) return NULL;
    parts[0] = em__kernel_shared_text;
    for (int i = 0; i < em__kernel_source_count; i++) parts[i + 1] = em__kernel_sources[i].text;
    char *text = assemble(d, has_f64, parts, em__kernel_source_count + 1);
    free(parts);
    return text;
}

char *em__kernel_library_program(em_kernel_dialect d, bool has_f64, int source) {
    if (source < 0 || source >= em__kernel_source_count) return NULL;
    const char *parts[2] = {em__kernel_shared_text, em__kernel_sources[source].text};
    return assemble(d, has_f64, parts, 2);
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
