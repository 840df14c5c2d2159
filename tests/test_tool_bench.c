/* `ember bench`: runs the subcommand (its sources are included: the tool is an executable)
 * on the CPU and on OpenCL device 0, parses the JSON with Ember's own parser and checks that
 * every number is there and positive; bad arguments fail with exit code 2 and a message.
 * One test runs the built `ember` binary too. No timing is asserted beyond "positive". */
#include <stdlib.h>
#include "test.h"
#include "data/json.h"
#include "tool_run.h"
#include "../tools/ember/bench_run.c"
#include "../tools/ember/bench_report.c"
#include "../tools/ember/cmd_bench.c"
#include "../tools/ember/options.c"       /* the option parser cmd_bench.c uses */
#include "../tools/ember/plot.c"         /* --plot (tests/test_tool_plot.c checks the pictures) */
#include "../tools/ember/plot_bench.c"

typedef struct run_out { int rc; char *out, *err; } run_out;

/* ember bench ARGS... (NULL-terminated), stdout and stderr captured. */
static run_out run(const char *first, ...) {
    char *argv[32] = {"bench"};
    int argc = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 31; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    run_out r = {0};
    size_t no, ne;
    FILE *out = open_memstream(&r.out, &no), *err = open_memstream(&r.err, &ne);
    r.rc = bench_main(argc, argv, out, err);
    fclose(out);
    fclose(err);
    return r;
}

static void run_free(run_out *r) {
    free(r->out);
    free(r->err);
}

static double num(const em__json *o, const char *key) {
    const em__json *v = o ? em__json_get(o, key) : NULL;
    return v && v->type == EM__JSON_NUMBER ? v->num : NAN;
}

/* o[key] is an object with a positive median_s and a positive rate (when rate is given). */
static bool timed(const em__json *o, const char *key, const char *rate) {
    const em__json *t = o ? em__json_get(o, key) : NULL;
    if (!t || t->type != EM__JSON_OBJECT) return false;
    if (!(num(t, "median_s") > 0) || !(num(t, "samples") >= 1) || !(num(t, "calls") >= 1)) {
        const em__json *e = em__json_get(t, "error");
        fprintf(stderr, "  %s: not measured: %s\n", key, e && e->type == EM__JSON_STRING ? e->str : "?");
        return false;
    }
    return !rate || num(t, rate) > 0;
}

static bool parse(const char *s, em__json *j) {
    if (!s || em__json_parse("ember bench --json", s, strlen(s), 0, j) != EM_OK) {
        fprintf(stderr, "  %s\n  output:\n%s\n", em_last_error(), s ? s : "(none)");
        em_clear_error();
        return false;
    }
    return j->type == EM__JSON_OBJECT;
}

static void check_memory(const em__json *section) {
    const em__json *m = section ? em__json_get(section, "memory") : NULL;
    CHECK(m && m->type == EM__JSON_OBJECT);
    CHECK(num(m, "allocated_bytes") >= 0);
    CHECK(num(m, "peak_allocated_bytes") > 0); /* the section allocated its inputs */
    CHECK(num(m, "reserved_bytes") >= num(m, "allocated_bytes"));
}

/* The matmul results: one per dtype and size, in order, all measured. */
static void check_matmul(const em__json *root) {
    const em__json *mm = em__json_get(root, "matmul");
    const em__json *res = mm ? em__json_get(mm, "results") : NULL;
    CHECK(res && res->type == EM__JSON_ARRAY && res->count == 6);
    static const char *dtypes[] = {"f32", "f16", "bf16"};
    for (int i = 0; res && i < res->count && i < 6; i++) {
        const em__json *r = &res->items[i], *dt = em__json_get(r, "dtype");
        CHECK(dt && dt->type == EM__JSON_STRING && !strcmp(dt->str, dtypes[i / 2]));
        CHECK(num(r, "n") == (i % 2 ? 64 : 32));
        CHECK(num(r, "flop") == 2.0 * pow(num(r, "n"), 3));
        CHECK(num(r, "tflops") > 0 && num(r, "median_s") > 0);
        CHECK_NEAR(num(r, "gflops"), num(r, "flop") / num(r, "median_s") / 1e9, 1e-4 * num(r, "gflops"));
        CHECK_NEAR(num(r, "tflops") * 1e3, num(r, "gflops"), 1e-4 * num(r, "gflops"));
    }
    check_memory(mm);
}

static void check_launch(const em__json *root) {
    const em__json *l = em__json_get(root, "launch");
    CHECK(timed(l, "queued", "us_per_op"));
    CHECK(timed(l, "synced", "us_per_op"));
    CHECK(timed(l, "cpu_queued", "us_per_op"));
}

static void test_cpu_json(void) {
    run_out r = run("--quick", "--device", "cpu", "--sizes", "32,64", "--json", NULL);
    CHECK(r.rc == 0);
    CHECK(r.err && r.err[0] == '\0');
    em__json j = {0};
    CHECK(parse(r.out, &j));
    const em__json *d = em__json_get(&j, "device");
    CHECK(d && d->type == EM__JSON_STRING && !strcmp(d->str, "cpu"));
    CHECK(num(&j, "min_time_s") == 0.05);
    check_matmul(&j);
    const em__json *copy = em__json_get(&j, "copy");
    const em__json *hd = copy ? em__json_get(copy, "host_device") : NULL;
    CHECK(hd && hd->type == EM__JSON_BOOL && !hd->b);
    const em__json *res = copy ? em__json_get(copy, "results") : NULL;
    CHECK(res && res->type == EM__JSON_ARRAY && res->count >= 1);
    for (int i = 0; res && i < res->count; i++) {
        CHECK(num(&res->items[i], "bytes") > 0);
        CHECK(timed(&res->items[i], "memcpy", "gb_per_s"));
        CHECK(!em__json_get(&res->items[i], "h2d_pageable")); /* nothing to copy to */
    }
    check_launch(&j);
    const em__json *xo = em__json_get(&j, "crossover"), *sk = xo ? em__json_get(xo, "skipped") : NULL;
    const em__json *why = xo ? em__json_get(xo, "reason") : NULL;
    CHECK(sk && sk->type == EM__JSON_BOOL && sk->b);
    CHECK(why && why->type == EM__JSON_STRING && strstr(why->str, "CPU"));
    em__json_free(&j);
    run_free(&r);
}

/* A crossover series: every size measured three ways; faster_from is null or a size tried. */
static void check_xo(const em__json *xo, const char *name, int64_t first) {
    const em__json *s = xo ? em__json_get(xo, name) : NULL, *res = s ? em__json_get(s, "results") : NULL;
    CHECK(res && res->type == EM__JSON_ARRAY && res->count >= 4);
    for (int i = 0; res && i < res->count; i++) {
        const em__json *r = &res->items[i];
        CHECK(num(r, "size") == (double)first * pow(name[0] == 'm' ? 2 : 4, i));
        CHECK(timed(r, "cpu", NULL) && timed(r, "device", NULL) && timed(r, "device_with_copies", NULL));
    }
    static const char *keys[] = {"device_faster_from", "device_with_copies_faster_from"};
    for (int k = 0; k < 2 && res; k++) {
        const em__json *f = em__json_get(s, keys[k]);
        CHECK(f && (f->type == EM__JSON_NULL || f->type == EM__JSON_NUMBER));
        bool among = f && f->type == EM__JSON_NULL;
        for (int i = 0; f && f->type == EM__JSON_NUMBER && i < res->count; i++)
            among |= num(&res->items[i], "size") == f->num;
        CHECK(among);
    }
}

static void test_opencl_json(void) {
    if (em_device_count(EM_OPENCL) < 1) {
        const char *why = em_device_unavailable_reason(EM_OPENCL);
        em_clear_error();
        SKIP("no OpenCL device (%s)", why ? why : "none found");
    }
    run_out r = run("--quick", "--device", "opencl:0", "--sizes", "32,64", "--json", NULL);
    CHECK(r.rc == 0);
    CHECK(r.err && r.err[0] == '\0');
    em__json j = {0};
    CHECK(parse(r.out, &j));
    const em__json *d = em__json_get(&j, "device"), *name = em__json_get(&j, "name");
    CHECK(d && d->type == EM__JSON_STRING && !strcmp(d->str, "opencl:0"));
    CHECK(name && name->type == EM__JSON_STRING && name->str[0]);
    CHECK(num(&j, "compute_units") >= 1);
    check_matmul(&j);
    const em__json *copy = em__json_get(&j, "copy");
    const em__json *hd = copy ? em__json_get(copy, "host_device") : NULL;
    CHECK(hd && hd->type == EM__JSON_BOOL && hd->b);
    const em__json *res = copy ? em__json_get(copy, "results") : NULL;
    CHECK(res && res->type == EM__JSON_ARRAY && res->count >= 1);
    static const char *dirs[] = {"h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "memcpy"};
    for (int i = 0; res && i < res->count; i++)
        for (int k = 0; k < 5; k++) CHECK(timed(&res->items[i], dirs[k], "gb_per_s"));
    check_memory(copy);
    check_launch(&j);
    const em__json *xo = em__json_get(&j, "crossover"), *sk = xo ? em__json_get(xo, "skipped") : NULL;
    CHECK(sk && sk->type == EM__JSON_BOOL && !sk->b);
    check_xo(xo, "matmul", 16);
    check_xo(xo, "add", 1024);
    em__json_free(&j);
    run_free(&r);
}

static void test_text(void) {
    run_out r = run("--quick", "--device", "cpu", "--only", "launch,crossover", NULL);
    CHECK(r.rc == 0);
    CHECK(r.out && strstr(r.out, "ember bench on cpu"));
    CHECK(r.out && strstr(r.out, "launch latency") && strstr(r.out, "us per op"));
    CHECK(r.out && strstr(r.out, "crossover") && strstr(r.out, "skipped"));
    CHECK(r.out && !strstr(r.out, "matmul [n x n]") && !strstr(r.out, "\ncopy")); /* --only */
    run_free(&r);
    r = run("--help", NULL);
    CHECK(r.rc == 0 && r.out && strstr(r.out, "usage: ember bench"));
    run_free(&r);
}

/* Exit code 2, nothing on stdout, and a message on stderr that contains `msg`. */
static void check_bad(run_out r, const char *msg) {
    CHECK(r.rc == 2);
    CHECK(r.out && r.out[0] == '\0');
    CHECK(r.err && strstr(r.err, msg));
    if (!r.err || !strstr(r.err, msg)) fprintf(stderr, "  stderr: %s\n", r.err ? r.err : "(none)");
    CHECK(!em_failed());
    run_free(&r);
}

static void test_bad_arguments(void) {
    check_bad(run("--device", "tpu:3", NULL), "unknown device 'tpu:3'");
    check_bad(run("--device", NULL), "needs a value");
    check_bad(run("--sizes", "32,abc", NULL), "bad size 'abc'");
    check_bad(run("--sizes", "", NULL), "bad size list");
    check_bad(run("--sizes", "32,,64", NULL), "bad size list");
    check_bad(run("--sizes", "0", NULL), "bad size '0'");
    check_bad(run("--sizes", "-5", NULL), "bad size '-5'");
    check_bad(run("--sizes", "99999999999999999999", NULL), "bad size");
    check_bad(run("--dtype", "i32", NULL), "unknown dtype 'i32'");
    check_bad(run("--dtype", "f32,f16,bf16,f64,f32", NULL), "bad dtype list");
    check_bad(run("--only", "matmul,gemm", NULL), "unknown section 'gemm'");
    check_bad(run("--min-time", "-1", NULL), "--min-time expects a number >= 0.001 and <= 60, got '-1' (out of range)");
    check_bad(run("--min-time", "nan", NULL), "--min-time expects a number >= 0.001 and <= 60, got 'nan' (not a number)");
    check_bad(run("--frobnicate", NULL), "unknown option '--frobnicate'");
    check_bad(run("extra", NULL), "unexpected argument 'extra'");
    if (!em_device_available(EM_CUDA)) check_bad(run("--device", "cuda:0", NULL), "not available");
    if (em_device_available(EM_OPENCL)) check_bad(run("--device", "opencl:99", NULL), "no such device 'opencl:99'");
    em_clear_error();
}

/* faster_from: the smallest size from which the device wins at every larger size. */
static void test_faster_from(void) {
    bench_xo x = {.n = 4, .sizes = {16, 32, 64, 128}};
    double cpu[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; i++) x.cpu[i] = (bench_time){.ok = true, .median_s = cpu[i]};
    double dev[][4] = {{2, 0.5, 2, 0.5}, {0.5, 0.5, 0.5, 0.5}, {0.5, 0.5, 0.5, 2}, {2, 2, 0.5, 0.5}};
    int64_t want[] = {128, 16, 0, 64};
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < 4; i++) x.dev[i] = (bench_time){.ok = true, .median_s = dev[c][i]};
        CHECK(bench_faster_from(&x, x.dev) == want[c]);
    }
    x.dev[3].ok = false; /* a failed measurement is not a win */
    CHECK(bench_faster_from(&x, x.dev) == 0);
}

/* Made-up results: odd strings are escaped, failed measurements give null and an error. */
static void test_json_of_made_up_results(void) {
    bench_results *r = calloc(1, sizeof *r);
    r->o = (bench_opts){.device = EM_DEVICE(EM_OPENCL, 0), .dtypes = {EM_F32}, .ndtypes = 1, .sizes = {8},
                        .nsizes = 1, .sections = BENCH_ALL, .min_time = 0.2};
    r->props_ok = true;
    snprintf(r->props.name, sizeof r->props.name, "quote\" back\\ nl\n bad\xff caf\xc3\xa9");
    snprintf(r->matmul[0][0].error, sizeof r->matmul[0][0].error, "matmul: \"bf16\"\tnot supported");
    r->host_device = true;
    r->ncopies = 1;
    r->copy_bytes[0] = 1024;
    r->memcpy_ref[0] = (bench_time){.ok = true, .median_s = 1e-6, .samples = 3, .calls = 30};
    r->launch_queued = (bench_time){.ok = true, .median_s = INFINITY, .samples = 1, .calls = 1};
    r->xo_matmul.n = 1;
    r->xo_matmul.sizes[0] = 16;
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    CHECK(bench_write_json(f, r) == 0);
    fclose(f);
    em__json j = {0};
    CHECK(parse(s, &j));
    const em__json *name = em__json_get(&j, "name");
    CHECK(name && name->type == EM__JSON_STRING && !strcmp(name->str, "quote\" back\\ nl\n bad\xef\xbf\xbd caf\xc3\xa9"));
    const em__json *mm = em__json_get(&j, "matmul"), *res = mm ? em__json_get(mm, "results") : NULL;
    const em__json *e = res && res->count == 1 ? em__json_get(&res->items[0], "error") : NULL;
    CHECK(e && e->type == EM__JSON_STRING && !strcmp(e->str, "matmul: \"bf16\"\tnot supported"));
    const em__json *tf = res && res->count == 1 ? em__json_get(&res->items[0], "tflops") : NULL;
    CHECK(tf && tf->type == EM__JSON_NULL);
    const em__json *l = em__json_get(&j, "launch"), *q = l ? em__json_get(l, "queued") : NULL;
    const em__json *us = q ? em__json_get(q, "us_per_op") : NULL;
    CHECK(us && us->type == EM__JSON_NULL); /* not a finite number: null, never "inf" */
    em__json_free(&j);
    free(s);
    /* and the text rendering names the error */
    s = NULL;
    f = open_memstream(&s, &len);
    CHECK(bench_write_text(f, r) == 0);
    fclose(f);
    CHECK(s && strstr(s, "error: matmul: \"bf16\""));
    free(s);
    free(r);
}

/* The real command: main.c dispatches to bench, exit codes reach the shell. */
static void test_the_command(void) {
    static char out[1 << 16];
    CHECK(tool_path() != NULL); /* build the `ember_cli` target */
    if (!tool_path()) return;
    CHECK(tool_run("bench --device tpu:3", out, sizeof out) == 2);
    CHECK(strstr(out, "ember bench: unknown device 'tpu:3'") != NULL);
    CHECK(tool_run("bench --quick --device cpu --only launch --json", out, sizeof out) == 0);
    em__json j = {0};
    CHECK(parse(out, &j));
    check_launch(&j);
    em__json_free(&j);
}

int main(void) {
    RUN(test_bad_arguments);
    RUN(test_faster_from);
    RUN(test_json_of_made_up_results);
    RUN(test_text);
    RUN(test_cpu_json);
    RUN(test_opencl_json);
    RUN(test_the_command);
    return test_summary();
}
