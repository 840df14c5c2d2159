/* `ember bench` output: plain text for people, one JSON object for scripts, both read
 * from a filled bench_results. */
#include <math.h>
#include <string.h>
#include "bench.h"

const char *bench_dtype_short(em_dtype dt) {
    switch (dt) {
    case EM_F32: return "f32";
    case EM_F64: return "f64";
    case EM_F16: return "f16";
    case EM_BF16: return "bf16";
    default: return em_dtype_name(dt);
    }
}

static double matmul_flop(int64_t n) { return 2.0 * (double)n * (double)n * (double)n; }

/* ---- text ---- */

static const char *fmt_time(double s, char *buf, size_t size) {
    if (s < 1e-3) snprintf(buf, size, "%.1f us", s * 1e6);
    else if (s < 1) snprintf(buf, size, "%.2f ms", s * 1e3);
    else snprintf(buf, size, "%.2f s", s);
    return buf;
}

static const char *fmt_cell_time(const bench_time *t, char *buf, size_t size) {
    return t->ok ? fmt_time(t->median_s, buf, size) : (snprintf(buf, size, "error"), buf);
}

static void text_memory(FILE *f, em_device d, const bench_mem *m) {
    char a[32], p[32], r[32];
    em_memory_format_size(m->allocated, a, sizeof a);
    em_memory_format_size(m->peak, p, sizeof p);
    em_memory_format_size(m->reserved, r, sizeof r);
    fprintf(f, "  memory on %s: allocated %s, peak allocated %s during this section, reserved %s\n",
            em_device_str(d).s, a, p, r);
}

/* Each distinct error once, under the table it belongs to. */
static void text_errors(FILE *f, const bench_time *const *ts, int n) {
    for (int i = 0; i < n; i++) {
        if (ts[i]->ok || !ts[i]->error[0]) continue;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !ts[j]->ok && !strcmp(ts[j]->error, ts[i]->error);
        if (!seen) fprintf(f, "  error: %s\n", ts[i]->error);
    }
}

static void text_matmul(FILE *f, const bench_results *r) {
    double best = 0;
    for (int i = 0; i < r->o.ndtypes; i++)
        for (int j = 0; j < r->o.nsizes; j++)
            if (r->matmul[i][j].ok) best = fmax(best, matmul_flop(r->o.sizes[j]) / r->matmul[i][j].median_s);
    bool tera = best >= 1e12;
    fprintf(f, "\nmatmul [n x n] @ [n x n]: %s = 2 n^3 / median time\n  %-6s", tera ? "TFLOPS" : "GFLOPS", "n");
    for (int j = 0; j < r->o.nsizes; j++) fprintf(f, " %10lld", (long long)r->o.sizes[j]);
    fprintf(f, "\n");
    const bench_time *errs[BENCH_MAX_DTYPES * BENCH_MAX_SIZES];
    int nerr = 0;
    for (int i = 0; i < r->o.ndtypes; i++) {
        fprintf(f, "  %-6s", bench_dtype_short(r->o.dtypes[i]));
        for (int j = 0; j < r->o.nsizes; j++) {
            const bench_time *t = &r->matmul[i][j];
            if (t->ok) fprintf(f, " %10.*f", tera ? 2 : 1, matmul_flop(r->o.sizes[j]) / t->median_s / (tera ? 1e12 : 1e9));
            else fprintf(f, " %10s", "error");
            errs[nerr++] = t;
        }
        fprintf(f, "\n");
    }
    text_errors(f, errs, nerr);
    text_memory(f, r->o.device, &r->matmul_mem);
}

static void text_gbs(FILE *f, const bench_time *t, int64_t bytes) {
    if (t->ok) fprintf(f, " %13.2f", (double)bytes / t->median_s / 1e9);
    else fprintf(f, " %13s", "error");
}

static void text_copy(FILE *f, const bench_results *r) {
    const bench_time *errs[5 * BENCH_MAX_COPIES];
    int nerr = 0;
    if (!r->host_device) {
        fprintf(f, "\ncopy: the cpu device has no host-device copy; host memcpy (em_clone) as the reference, GB/s\n"
                   "  %-10s %13s\n", "size", "memcpy");
    } else {
        fprintf(f, "\ncopy host <-> %s (em_to), GB/s = 1e9 bytes / median time\n"
                   "  %-10s %13s %13s %13s %13s %13s\n", em_device_str(r->o.device).s, "size", "h2d pageable",
                "h2d pinned", "d2h pageable", "d2h pinned", "host memcpy");
    }
    for (int i = 0; i < r->ncopies; i++) {
        char sz[32];
        em_memory_format_size(r->copy_bytes[i], sz, sizeof sz);
        fprintf(f, "  %-10s", sz);
        if (r->host_device) {
            const bench_time *row[4] = {&r->h2d_pageable[i], &r->h2d_pinned[i], &r->d2h_pageable[i], &r->d2h_pinned[i]};
            for (int k = 0; k < 4; k++) {
                text_gbs(f, row[k], r->copy_bytes[i]);
                errs[nerr++] = row[k];
            }
        }
        text_gbs(f, &r->memcpy_ref[i], r->copy_bytes[i]);
        errs[nerr++] = &r->memcpy_ref[i];
        fprintf(f, "\n");
    }
    text_errors(f, errs, nerr);
    if (r->host_device)
        fprintf(f, "  h2d pinned: em_to_device_dtype(non_blocking) from pin_memory; d2h pageable: em_to(cpu);\n"
                   "  d2h pinned: em_copy_ into a pinned tensor\n");
    text_memory(f, r->o.device, &r->copy_mem);
}

static void text_launch_line(FILE *f, const char *what, const bench_time *t) {
    if (t->ok) fprintf(f, "  %-36s %8.2f us per op\n", what, t->median_s * 1e6);
    else fprintf(f, "  %-36s error: %s\n", what, t->error);
}

static void text_launch(FILE *f, const bench_results *r) {
    fprintf(f, "\nlaunch latency (em_add_ on one element of %s)\n", em_device_str(r->o.device).s);
    text_launch_line(f, "queued, one sync after many ops:", &r->launch_queued);
    text_launch_line(f, "with a sync after each op:", &r->launch_synced);
    if (r->o.device.type != EM_CPU) text_launch_line(f, "the cpu, queued, for reference:", &r->launch_cpu);
}

static void text_faster(FILE *f, const bench_xo *x, int64_t from, const char *unit) {
    if (from) fprintf(f, "from %s = %lld", unit, (long long)from);
    else if (x->n == 0) fprintf(f, "not measured");
    else fprintf(f, "never within %s = %lld..%lld", unit, (long long)x->sizes[0], (long long)x->sizes[x->n - 1]);
}

static void text_xo(FILE *f, const bench_results *r, const bench_xo *x, bool matmul) {
    const char *unit = matmul ? "n" : "elements";
    fprintf(f, "  %-10s %12s %12s %15s\n", matmul ? "matmul n" : "add elems", "cpu", "device", "device+copies");
    const bench_time *errs[3 * BENCH_MAX_XO];
    int nerr = 0;
    for (int i = 0; i < x->n; i++) {
        char a[32], b[32], c[32];
        fprintf(f, "  %-10lld %12s %12s %15s\n", (long long)x->sizes[i], fmt_cell_time(&x->cpu[i], a, sizeof a),
                fmt_cell_time(&x->dev[i], b, sizeof b), fmt_cell_time(&x->dev_copies[i], c, sizeof c));
        errs[nerr++] = &x->cpu[i];
        errs[nerr++] = &x->dev[i];
        errs[nerr++] = &x->dev_copies[i];
    }
    text_errors(f, errs, nerr);
    fprintf(f, "  %s beats the cpu: with inputs on it ", em_device_str(r->o.device).s);
    text_faster(f, x, x->faster_from, unit);
    fprintf(f, "; with the copies there and back ");
    text_faster(f, x, x->faster_from_copies, unit);
    fprintf(f, "\n");
}

static void text_crossover(FILE *f, const bench_results *r) {
    fprintf(f, "\ncrossover: cpu vs %s, f32, median time per op", em_device_str(r->o.device).s);
    if (r->xo_skipped) {
        fprintf(f, ": skipped, %s\n", r->xo_reason);
        return;
    }
    fprintf(f, "\n  (device: inputs already there; device+copies: inputs moved there and the result back,\n"
               "  the seed's scenario. \"beats from\": the smallest size from which it wins at every larger size)\n");
    text_xo(f, r, &r->xo_matmul, true);
    text_xo(f, r, &r->xo_add, false);
}

int bench_write_text(FILE *f, const bench_results *r) {
    fprintf(f, "ember bench on %s", em_device_str(r->o.device).s);
    if (r->props_ok) {
        char mem[32];
        em_memory_format_size(r->props.total_memory, mem, sizeof mem);
        fprintf(f, ": %s (%d compute units, %s%s)", r->props.name, r->props.compute_units, mem,
                r->props.is_gpu ? ", GPU" : ", not a GPU");
    }
    fprintf(f, "\n");
    if (r->o.device_auto) fprintf(f, "chosen by auto-selection: %s\n", r->auto_reason);
    fprintf(f, "each number: warm-up, then repeated for at least %.2f s, device synchronized before every clock "
               "read; median\n", r->o.min_time);
    if (r->o.sections & BENCH_MATMUL) text_matmul(f, r);
    if (r->o.sections & BENCH_COPY) text_copy(f, r);
    if (r->o.sections & BENCH_LAUNCH) text_launch(f, r);
    if (r->o.sections & BENCH_CROSSOVER) text_crossover(f, r);
    return ferror(f) ? -1 : 0;
}

/* ---- JSON ---- */

/* Length of the valid UTF-8 sequence at s, or 0. */
static int utf8_seq(const unsigned char *s) {
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 && s[0] >= 0xC2 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
            : (s[0] & 0xF8) == 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return n;
}

static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_seq(p);
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else if (n == 0) fputs("\\ufffd", f);
        else fwrite(p, 1, (size_t)n, f);
        p += n ? n : 1;
    }
    fputc('"', f);
}

static void jnum(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

/* "median_s": t, "samples": n, "calls": k  or  "median_s": null, "error": "..." */
static void jtime_fields(FILE *f, const bench_time *t) {
    if (!t->ok) {
        fputs("\"median_s\": null, \"error\": ", f);
        jstr(f, t->error[0] ? t->error : "not measured");
        return;
    }
    fputs("\"median_s\": ", f);
    jnum(f, t->median_s);
    fprintf(f, ", \"samples\": %d, \"calls\": %lld", t->samples, (long long)t->calls);
}

/* ", <rate>: scale / t" (null without a time) */
static void jrate(FILE *f, const bench_time *t, const char *rate, double scale) {
    fprintf(f, "\"%s\": ", rate);
    if (t->ok) jnum(f, scale / t->median_s);
    else fputs("null", f);
    fputs(", ", f);
}

/* {[rate,] median_s, samples, calls} or {[rate: null,] median_s: null, error} */
static void jtime(FILE *f, const bench_time *t, const char *rate, double scale) {
    fputc('{', f);
    if (rate) jrate(f, t, rate, scale);
    jtime_fields(f, t);
    fputc('}', f);
}

static void jmem(FILE *f, const bench_mem *m) {
    fprintf(f, "{\"allocated_bytes\": %lld, \"peak_allocated_bytes\": %lld, \"reserved_bytes\": %lld}",
            (long long)m->allocated, (long long)m->peak, (long long)m->reserved);
}

static void json_matmul(FILE *f, const bench_results *r) {
    fputs(",\n  \"matmul\": {\"results\": [", f);
    for (int i = 0, k = 0; i < r->o.ndtypes; i++)
        for (int j = 0; j < r->o.nsizes; j++, k++) {
            const bench_time *t = &r->matmul[i][j];
            double flop = matmul_flop(r->o.sizes[j]);
            fprintf(f, "%s\n    {\"dtype\": \"%s\", \"n\": %lld, \"flop\": %.0f, ", k ? "," : "",
                    bench_dtype_short(r->o.dtypes[i]), (long long)r->o.sizes[j], flop);
            jrate(f, t, "tflops", flop / 1e12);
            jrate(f, t, "gflops", flop / 1e9);
            jtime_fields(f, t);
            fputc('}', f);
        }
    fputs("],\n    \"memory\": ", f);
    jmem(f, &r->matmul_mem);
    fputc('}', f);
}

static void json_copy(FILE *f, const bench_results *r) {
    fprintf(f, ",\n  \"copy\": {\"host_device\": %s, \"note\": ", r->host_device ? "true" : "false");
    jstr(f, r->host_device ? "h2d_pinned: em_to_device_dtype(non_blocking) from pin_memory; d2h_pageable: em_to(cpu); "
                             "d2h_pinned: em_copy_ into a pinned tensor; memcpy: em_clone on the cpu"
                           : "the cpu device has no host-device copy; memcpy (em_clone on the cpu) is the reference");
    fputs(", \"results\": [", f);
    for (int i = 0; i < r->ncopies; i++) {
        double gb = (double)r->copy_bytes[i] / 1e9;
        fprintf(f, "%s\n    {\"bytes\": %lld", i ? "," : "", (long long)r->copy_bytes[i]);
        if (r->host_device) {
            static const char *names[4] = {"h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned"};
            const bench_time *row[4] = {&r->h2d_pageable[i], &r->h2d_pinned[i], &r->d2h_pageable[i], &r->d2h_pinned[i]};
            for (int k = 0; k < 4; k++) {
                fprintf(f, ", \"%s\": ", names[k]);
                jtime(f, row[k], "gb_per_s", gb);
            }
        }
        fputs(", \"memcpy\": ", f);
        jtime(f, &r->memcpy_ref[i], "gb_per_s", gb);
        fputc('}', f);
    }
    fputs("],\n    \"memory\": ", f);
    jmem(f, &r->copy_mem);
    fprintf(f, ", \"pinned_reserved_bytes\": %lld}", (long long)r->pinned_reserved);
}

static void json_launch_one(FILE *f, const char *name, const bench_time *t) {
    fprintf(f, ", \"%s\": {", name);
    fputs("\"us_per_op\": ", f);
    if (t->ok) jnum(f, t->median_s * 1e6);
    else fputs("null", f);
    fputs(", ", f);
    jtime_fields(f, t);
    fputc('}', f);
}

static void json_launch(FILE *f, const bench_results *r) {
    fputs(",\n  \"launch\": {\"op\": \"em_add_ on one element\"", f);
    json_launch_one(f, "queued", &r->launch_queued);
    json_launch_one(f, "synced", &r->launch_synced);
    json_launch_one(f, "cpu_queued", &r->launch_cpu);
    fputc('}', f);
}

static void json_from(FILE *f, int64_t from) {
    if (from) fprintf(f, "%lld", (long long)from);
    else fputs("null", f);
}

static void json_xo(FILE *f, const bench_xo *x, const char *name) {
    fprintf(f, ",\n    \"%s\": {\"results\": [", name);
    for (int i = 0; i < x->n; i++) {
        fprintf(f, "%s\n      {\"size\": %lld, \"cpu\": ", i ? "," : "", (long long)x->sizes[i]);
        jtime(f, &x->cpu[i], NULL, 0);
        fputs(", \"device\": ", f);
        jtime(f, &x->dev[i], NULL, 0);
        fputs(", \"device_with_copies\": ", f);
        jtime(f, &x->dev_copies[i], NULL, 0);
        fputc('}', f);
    }
    fputs("],\n      \"device_faster_from\": ", f);
    json_from(f, x->faster_from);
    fputs(", \"device_with_copies_faster_from\": ", f);
    json_from(f, x->faster_from_copies);
    fputc('}', f);
}

static void json_crossover(FILE *f, const bench_results *r) {
    fprintf(f, ",\n  \"crossover\": {\"skipped\": %s", r->xo_skipped ? "true" : "false");
    if (r->xo_skipped) {
        fputs(", \"reason\": ", f);
        jstr(f, r->xo_reason);
        fputc('}', f);
        return;
    }
    fputs(", \"dtype\": \"f32\", \"note\": ", f);
    jstr(f, "sizes are matmul n (n x n @ n x n) and add elements; *_faster_from: the smallest size from which the "
            "device wins at every larger size tried, null: never");
    json_xo(f, &r->xo_matmul, "matmul");
    json_xo(f, &r->xo_add, "add");
    fputc('}', f);
}

int bench_write_json(FILE *f, const bench_results *r) {
    fputs("{\n  \"device\": ", f);
    jstr(f, em_device_str(r->o.device).s);
    fprintf(f, ", \"device_auto\": %s, \"auto_reason\": ", r->o.device_auto ? "true" : "false");
    if (r->o.device_auto) jstr(f, r->auto_reason);
    else fputs("null", f);
    if (r->props_ok) {
        fputs(",\n  \"name\": ", f);
        jstr(f, r->props.name);
        fprintf(f, ", \"is_gpu\": %s, \"compute_units\": %d, \"total_memory\": %lld", r->props.is_gpu ? "true" : "false",
                r->props.compute_units, (long long)r->props.total_memory);
    }
    fprintf(f, ",\n  \"quick\": %s, \"min_time_s\": ", r->o.quick ? "true" : "false");
    jnum(f, r->o.min_time);
    fputs(", \"statistic\": \"median\"", f);
    if (r->o.sections & BENCH_MATMUL) json_matmul(f, r);
    if (r->o.sections & BENCH_COPY) json_copy(f, r);
    if (r->o.sections & BENCH_LAUNCH) json_launch(f, r);
    if (r->o.sections & BENCH_CROSSOVER) json_crossover(f, r);
    fputs("\n}\n", f);
    return ferror(f) ? -1 : 0;
}
