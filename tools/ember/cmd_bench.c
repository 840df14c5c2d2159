/* ember bench: the seed's GPU benchmark done properly on any device. Matmul throughput by
 * dtype and size, host <-> device bandwidth from pageable and pinned memory, kernel launch
 * latency, and the size from which the device beats the CPU (the seed's claim that small
 * work is faster on the CPU, measured). Measuring is in bench_run.c, output in bench_report.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench.h"
#include "commands.h"
#include "options.h"
#include "plot.h"   /* --plot */
#include <ember/parse.h>

enum { B_DEVICE, B_DTYPE, B_SIZES, B_ONLY, B_QUICK, B_MIN_TIME, B_JSON, B_PLOT };
static const opt_spec bench_table[] = {
    [B_DEVICE] = OPTION_DEVICE("--device", "auto (default: CUDA, then MPS, then an OpenCL GPU, then the CPU; "
                                           "EMBER_DEVICE overrides), cpu, cuda:N, opencl:N"),
    [B_DTYPE] = OPTION_LIST("--dtype", "LIST", "matmul dtypes, up to 4 of f32,f16,bf16,f64 (default f32,f16,bf16)"),
    [B_SIZES] = OPTION_LIST("--sizes", "LIST",
                            "matmul sizes n, up to 32 of 1 to 32768, e.g. 64,256,1024 (default: by device, up to "
                            "8192 on a GPU)"),
    [B_ONLY] = OPTION_LIST("--only", "LIST", "sections, from matmul,copy,launch,crossover (default all)"),
    [B_QUICK] = OPTION_FLAG("--quick", "shorter: 0.05 s per number, fewer sizes (default 0.2 s)"),
    [B_MIN_TIME] = OPTION_DOUBLE("--min-time", "S", 0.001, 60, "seconds of repeats per number"),
    [B_JSON] = OPTION_FLAG("--json", "one JSON object instead of text"),
    [B_PLOT] = OPTION_STRING("--plot", "FILE",
                             "also draw the crossover (time per op against size: cpu, device, device with copies) "
                             "and matmul GFLOPS by dtype into FILE, a .png or .svg picture; its folder is checked "
                             "before measuring"),
};
OPT_TABLE_FITS(bench_table);

const opt_command bench_options = {
    .name = "ember bench",
    .usage = "ember bench [options]",
    .about = "Measure a device: matmul throughput, host <-> device copies, launch latency, and the size from which "
             "it beats the CPU. Each number is a median over repeats after warm-up, with the device synchronized "
             "before every clock read.",
    .options = bench_table,
    .count = OPT_COUNT(bench_table),
    .exit_status = "0 done; 1 a measurement failed (the report says why) or the report or picture could not be "
                   "written; 2 bad arguments; 130 interrupted",
};

static int bad(FILE *err, const char *what, const char *arg, const char *expected) {
    fprintf(err, "ember bench: %s '%s'%s%s\n(ember bench --help for the options)\n", what, arg,
            expected ? ": " : "", expected ? expected : "");
    return 2;
}

/* Split a comma list into at most max items of at most 31 characters; false if malformed. */
static bool split(const char *s, char items[][32], int max, int *n) {
    *n = 0;
    if (!*s) return false;
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len > 31 || *n == max) return false;
        memcpy(items[*n], p, len);
        items[(*n)++][len] = '\0';
        if (!e) return true;
        p = e + 1;
    }
}

static bool parse_device(const char *s, bench_opts *o, FILE *err, const char *src) {
    char what[3][64];   /* "unknown device", or "EMBER_DEVICE: unknown device" when it came from there */
    snprintf(what[0], sizeof what[0], "%sunknown device", src);
    snprintf(what[1], sizeof what[1], "%sdevice not available", src);
    snprintf(what[2], sizeof what[2], "%sno such device", src);
    if (!strcmp(s, "auto")) {
        /* em_device_auto() passes over a bad EMBER_DEVICE; a benchmark of another device
         * than the one asked for would mislead, so it is checked as --device is */
        const char *env = getenv("EMBER_DEVICE");
        if (env && *env && strcmp(env, "auto")) {
            if (!parse_device(env, o, err, "EMBER_DEVICE: ")) return false;
        }
        o->device = em_device_auto();
        o->device_auto = true;
        return true;
    }
    em_device d;
    if (em_device_parse(s, &d) != EM_OK) {
        bad(err, what[0], s, em_last_error());
        em_clear_error();
        return false;
    }
    if (!em_device_available(d.type)) {
        const char *why = em_device_unavailable_reason(d.type);
        bad(err, what[1], s, why ? why : "no such device");
        em_clear_error();
        return false;
    }
    d = em_device_resolve(d);
    int count = em_device_count(d.type);
    if (d.index < 0 || d.index >= count) {
        char msg[96];
        snprintf(msg, sizeof msg, "there %s %d %s device%s", count == 1 ? "is" : "are", count,
                 em_device_type_name(d.type), count == 1 ? "" : "s");
        bad(err, what[2], s, msg);
        em_clear_error();
        return false;
    }
    o->device = d;
    o->device_auto = false;
    return true;
}

int bench_parse(int argc, char **argv, bench_opts *o, FILE *out, FILE *err) {
    *o = (bench_opts){.dtypes = {EM_F32, EM_F16, EM_BF16}, .ndtypes = 3, .sections = BENCH_ALL};
    opt_result opts;
    int status = opt_parse(&bench_options, argc, argv, &opts, out, err);
    if (status >= 0) return status == 0 ? 1 : status;   /* 1: the help was printed */
    const opt_value *v = opts.v;
    char items[BENCH_MAX_SIZES][32];
    int n;
    o->json = v[B_JSON].given;
    o->quick = v[B_QUICK].given;
    if (v[B_PLOT].given) {
        if (!plot_check_output(err, "ember bench", "--plot", v[B_PLOT].text)) return 2;   /* before a minute of measuring */
        o->plot = v[B_PLOT].text;
    }
    if (v[B_DTYPE].given) {
        const char *list = v[B_DTYPE].text;
        if (!split(list, items, BENCH_MAX_DTYPES, &n))
            return bad(err, "bad dtype list", list, "expected up to 4 of f32,f16,bf16,f64 separated by commas");
        o->ndtypes = n;
        for (int k = 0; k < n; k++)
            if (em_dtype_parse(items[k], &o->dtypes[k]) != EM_OK || !em_dtype_is_floating(o->dtypes[k])) {
                em_clear_error();
                return bad(err, "unknown dtype", items[k], "expected f32, f16, bf16 or f64");
            }
    }
    if (v[B_SIZES].given) {
        const char *list = v[B_SIZES].text;
        if (!split(list, items, BENCH_MAX_SIZES, &n))
            return bad(err, "bad size list", list, "expected up to 32 whole numbers separated by commas, e.g. 64,256,1024");
        o->nsizes = n;
        for (int k = 0; k < n; k++) {
            uint64_t s;
            if (em_parse_u64(items[k], 32768, &s) != EM_NUM_OK || s < 1)
                return bad(err, "bad size", items[k], "expected a whole number from 1 to 32768");
            o->sizes[k] = (int64_t)s;
        }
    }
    if (v[B_ONLY].given) {
        const char *list = v[B_ONLY].text;
        if (!split(list, items, BENCH_MAX_SIZES, &n))
            return bad(err, "bad section list", list, "expected some of matmul,copy,launch,crossover separated by commas");
        o->sections = 0;
        for (int k = 0; k < n; k++) {
            static const char *names[] = {"matmul", "copy", "launch", "crossover"};
            int bit = -1;
            for (int s = 0; s < 4; s++)
                if (!strcmp(items[k], names[s])) bit = s;
            if (bit < 0) return bad(err, "unknown section", items[k], "expected matmul, copy, launch or crossover");
            o->sections |= 1u << bit;
        }
    }
    if (!parse_device(v[B_DEVICE].given ? v[B_DEVICE].text : "auto", o, err, "")) return 2;
    o->min_time = v[B_MIN_TIME].given ? v[B_MIN_TIME].d : o->quick ? 0.05 : 0.2;
    return 0;
}

int bench_main(int argc, char **argv, FILE *out, FILE *err) {
    bench_results *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(err, "ember bench: out of memory\n");
        return 1;
    }
    int rc = bench_parse(argc, argv, &r->o, out, err);
    if (rc) {
        free(r);
        return rc == 1 ? 0 : rc;
    }
    /* a full run takes a minute: say what is being measured, when someone is watching */
    bench_run(r, err == stderr && isatty(STDERR_FILENO) ? err : NULL);
    rc = r->o.json ? bench_write_json(out, r) : bench_write_text(out, r);
    int failures = bench_failures(r);
    bool plotted = !r->o.plot || bench_plot(r, r->o.plot, err);
    free(r);
    if (fflush(out) != 0 || rc != 0) {
        fprintf(err, "ember bench: could not write the report\n");
        return 1;
    }
    if (!plotted) return 1;
    if (failures) {   /* a report with holes is not a success: scripts must see it */
        fprintf(err, "ember bench: %d measurement%s failed (the report says why)\n", failures, failures == 1 ? "" : "s");
        return 1;
    }
    return 0;
}

int cmd_bench(int argc, char **argv) { return bench_main(argc, argv, stdout, stderr); }
