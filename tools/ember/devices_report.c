/* `ember devices` report: gather (Ember's device API) and render (text, JSON). */
#include "devices_report.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const em_device_type all_types[] = {EM_CPU, EM_CUDA, EM_MPS, EM_OPENCL};
#define NTYPES ((int)(sizeof all_types / sizeof all_types[0]))

/* ---- gathering ---- */

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

static void gather_type(devrep_type *t, em_device_type type) {
    memset(t, 0, sizeof *t);
    t->type = type;
    t->count = em_device_count(type);
    t->available = em_device_available(type);
    t->current = -1;
    if (!t->available) {
        const char *why = em_device_unavailable_reason(type);
        copy_str(t->reason, sizeof t->reason, why && *why ? why : "no devices found");
    } else {
        t->current = em_device_resolve(em_device_current(type)).index;
    }
    t->ndevices = t->count < DEVREP_MAX_DEVICES ? t->count : DEVREP_MAX_DEVICES;
    for (int i = 0; i < t->ndevices; i++) {
        devrep_device *d = &t->devices[i];
        d->device = EM_DEVICE(type, i);
        if (em_device_get_props(d->device, &d->props) == EM_OK) {
            d->ok = true;
        } else {
            copy_str(d->error, sizeof d->error, em_last_error());
            memset(&d->props, 0, sizeof d->props);
        }
        em_clear_error(); /* one device failing to describe itself is part of the report */
    }
}

void devrep_gather(devrep_report *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < NTYPES; i++) gather_type(&r->types[all_types[i]], all_types[i]);
    r->auto_device = em_device_auto();
    copy_str(r->auto_reason, sizeof r->auto_reason, em_device_auto_reason());
    const char *env = getenv("EMBER_DEVICE");
    r->env_set = env && *env;
    copy_str(r->env, sizeof r->env, r->env_set ? env : "");
    copy_str(r->cpu_features, sizeof r->cpu_features, em_cpu_features());
    copy_str(r->cpu_bf16, sizeof r->cpu_bf16, em_cpu_matmul_impl(EM_BF16));
    copy_str(r->cpu_f16, sizeof r->cpu_f16, em_cpu_matmul_impl(EM_F16));
    em_clear_error();
}

/* ---- text ---- */

/* "7.76 GiB", "512 MiB", or "unknown" for a negative (unknown) size. */
static void fmt_bytes(char *buf, size_t size, int64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 0) {
        snprintf(buf, size, "unknown");
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, size, "%lld B", (long long)bytes);
    else snprintf(buf, size, "%.2f %s", v, units[u]);
}

static void write_device_text(FILE *f, const devrep_type *t, const devrep_device *d) {
    em_device_string ds = em_device_str(d->device);
    if (!d->ok) {
        fprintf(f, "  %-10s (properties unavailable: %s)\n", ds.s, d->error);
        return;
    }
    const em_device_props *p = &d->props;
    fprintf(f, "  %-10s %s%s\n", ds.s, p->name[0] ? p->name : "(unnamed)",
            t->type == EM_CPU || p->is_gpu ? "" : "  [not a GPU]");
    if (p->vendor[0] || p->driver[0])
        fprintf(f, "  %-10s vendor: %s%s%s\n", "", p->vendor[0] ? p->vendor : "unknown",
                !p->driver[0] ? "" : t->type == EM_CPU ? ", gemm: " : ", driver: ", p->driver);
    char total[32], free_[32];
    fmt_bytes(total, sizeof total, p->total_memory);
    fmt_bytes(free_, sizeof free_, p->free_memory);
    fprintf(f, "  %-10s memory: %s total, %s free\n", "", total, free_);
    fprintf(f, "  %-10s compute units: %d%s", "", p->compute_units,
            t->type == EM_CPU ? " (cores)" : t->type == EM_CUDA ? " (SMs)" : "");
    if (t->type == EM_CUDA)
        fprintf(f, ", compute capability %d.%d", p->compute_capability / 10, p->compute_capability % 10);
    fputc('\n', f);
}

int devrep_write_text(FILE *f, const devrep_report *r) {
    fprintf(f, "Ember %d.%d.%d devices\n\n", EMBER_VERSION_MAJOR, EMBER_VERSION_MINOR,
            EMBER_VERSION_PATCH);
    for (int i = 0; i < NTYPES; i++) {
        const devrep_type *t = &r->types[all_types[i]];
        const char *name = em_device_type_name(t->type);
        if (t->available) {
            fprintf(f, "%-7s available, %d device%s (current: %s)\n", name, t->count,
                    t->count == 1 ? "" : "s", em_device_str(EM_DEVICE(t->type, t->current)).s);
        } else {
            fprintf(f, "%-7s not available: %s\n", name, t->reason);
        }
        if (t->available) { /* e.g. which NVRTC/cuBLAS CUDA chose for the driver */
            const char *libs = em_device_type_libraries(t->type);
            if (libs[0]) fprintf(f, "  libraries: %s\n", libs);
        }
        if (t->type == EM_CPU && r->cpu_features[0]) /* what the FP32 peak and the kernels rest on */
            fprintf(f, "  features: %s\n", r->cpu_features);
        if (t->type == EM_CPU && r->cpu_bf16[0]) /* Ember's AMX kernel, oneDNN's ISA (AMX, AVX512-BF16) or float32 */
            fprintf(f, "  bf16 matmul: %s\n  f16 matmul: %s\n", r->cpu_bf16, r->cpu_f16);
        for (int j = 0; j < t->ndevices; j++) write_device_text(f, t, &t->devices[j]);
        if (t->count > t->ndevices)
            fprintf(f, "  ... and %d more\n", t->count - t->ndevices);
    }
    fprintf(f, "\nauto-selection (CUDA, then MPS, then an OpenCL GPU, then the CPU): %s\n",
            em_device_str(r->auto_device).s);
    fprintf(f, "  why: %s\n", r->auto_reason);
    if (r->env_set)
        fprintf(f, "  EMBER_DEVICE=%s is set (unset it to let Ember choose)\n", r->env);
    else
        fprintf(f, "  set EMBER_DEVICE to choose another, e.g. EMBER_DEVICE=cpu or EMBER_DEVICE=opencl:0\n");
    return ferror(f) ? -1 : 0;
}

/* ---- JSON ---- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if the bytes there are not one. */
static int utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    int n;
    unsigned min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) n = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, min = 0x10000;
    else return 0;
    unsigned cp = c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0; /* also stops at the terminating NUL */
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* A JSON string: quotes, backslashes and control characters escaped; bytes that are not
 * UTF-8 (a driver's Latin-1 name) become U+FFFD so the output stays valid JSON. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            p++;
        } else if (c == '\n') fputs("\\n", f), p++;
        else if (c == '\t') fputs("\\t", f), p++;
        else if (c == '\r') fputs("\\r", f), p++;
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c), p++;
        else {
            int n = utf8_len(p);
            if (n == 0) {
                fputs("\\ufffd", f);
                p++;
            } else {
                fwrite(p, 1, (size_t)n, f);
                p += n;
            }
        }
    }
    fputc('"', f);
}

static void json_bytes(FILE *f, int64_t v) {
    if (v < 0) fputs("null", f);
    else fprintf(f, "%lld", (long long)v);
}

static void write_device_json(FILE *f, const devrep_type *t, const devrep_device *d) {
    fputs("{\"device\": ", f);
    json_str(f, em_device_str(d->device).s);
    fprintf(f, ", \"index\": %d", d->device.index);
    if (!d->ok) {
        fputs(", \"error\": ", f);
        json_str(f, d->error);
        fputc('}', f);
        return;
    }
    const em_device_props *p = &d->props;
    fputs(", \"name\": ", f);
    json_str(f, p->name);
    fputs(", \"vendor\": ", f);
    json_str(f, p->vendor);
    fputs(", \"driver\": ", f);
    json_str(f, p->driver);
    fputs(", \"total_memory\": ", f);
    json_bytes(f, p->total_memory);
    fputs(", \"free_memory\": ", f);
    json_bytes(f, p->free_memory);
    fprintf(f, ", \"compute_units\": %d", p->compute_units);
    if (t->type == EM_CUDA)
        fprintf(f, ", \"compute_capability\": \"%d.%d\"", p->compute_capability / 10,
                p->compute_capability % 10);
    else
        fputs(", \"compute_capability\": null", f);
    fprintf(f, ", \"is_gpu\": %s}", p->is_gpu ? "true" : "false");
}

int devrep_write_json(FILE *f, const devrep_report *r) {
    fprintf(f, "{\"ember_version\": \"%d.%d.%d\",\n \"types\": [", EMBER_VERSION_MAJOR,
            EMBER_VERSION_MINOR, EMBER_VERSION_PATCH);
    for (int i = 0; i < NTYPES; i++) {
        const devrep_type *t = &r->types[all_types[i]];
        fputs(i ? ",\n  {" : "\n  {", f);
        fputs("\"type\": ", f);
        json_str(f, em_device_type_name(t->type));
        fprintf(f, ", \"available\": %s, \"reason\": ", t->available ? "true" : "false");
        if (t->available) fputs("null", f);
        else json_str(f, t->reason);
        fprintf(f, ", \"device_count\": %d, \"current\": ", t->count);
        if (t->current >= 0) json_str(f, em_device_str(EM_DEVICE(t->type, t->current)).s);
        else fputs("null", f);
        if (t->type == EM_CPU && r->cpu_features[0]) {
            fputs(", \"features\": ", f);
            json_str(f, r->cpu_features);
        }
        if (t->type == EM_CPU && r->cpu_bf16[0]) {
            fputs(", \"bf16_matmul\": ", f);
            json_str(f, r->cpu_bf16);
            fputs(", \"f16_matmul\": ", f);
            json_str(f, r->cpu_f16);
        }
        fputs(", \"devices\": [", f);
        for (int j = 0; j < t->ndevices; j++) {
            fputs(j ? ",\n    " : "\n    ", f);
            write_device_json(f, t, &t->devices[j]);
        }
        fputs("]}", f);
    }
    fputs("],\n \"auto\": {\"device\": ", f);
    json_str(f, em_device_str(r->auto_device).s);
    fputs(", \"reason\": ", f);
    json_str(f, r->auto_reason);
    fputs(", \"EMBER_DEVICE\": ", f);
    if (r->env_set) json_str(f, r->env);
    else fputs("null", f);
    fputs("}}\n", f);
    return ferror(f) ? -1 : 0;
}
