/* `ember bench`: options, measurements and the two renderings (text, JSON). Measuring fills
 * a plain struct; rendering only reads it, so the report can be tested apart from timing. */
#ifndef EMBER_TOOL_BENCH_H
#define EMBER_TOOL_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <ember/ember.h>

#define BENCH_MAX_DTYPES 4
#define BENCH_MAX_SIZES 32
#define BENCH_MAX_COPIES 4
#define BENCH_MAX_XO 20

enum { BENCH_MATMUL = 1, BENCH_COPY = 2, BENCH_LAUNCH = 4, BENCH_CROSSOVER = 8, BENCH_ALL = 15 };

typedef struct bench_opts {
    em_device device;
    bool device_auto;              /* chosen by em_device_auto() */
    em_dtype dtypes[BENCH_MAX_DTYPES];
    int ndtypes;
    int64_t sizes[BENCH_MAX_SIZES]; /* matmul n; 0 entries: a default that suits the device */
    int nsizes;
    unsigned sections;             /* BENCH_* bits */
    bool quick, json;
    double min_time;               /* seconds of repeats per measurement, after warm-up */
    const char *plot;              /* --plot FILE (.png or .svg): the picture (plot_bench.c); NULL: none */
} bench_opts;

/* One measurement: the median seconds per call, or why there is none. */
typedef struct bench_time {
    bool ok;
    double median_s;
    int samples;                   /* timed batches */
    int64_t calls;                 /* calls in all timed batches */
    char error[240];
} bench_time;

/* The device's caching allocator after a section: live, peak during it, held. */
typedef struct bench_mem { int64_t allocated, peak, reserved; } bench_mem;

/* CPU against the device over a range of sizes. faster_from: the smallest size from which
 * the device wins at every larger size tried; 0 when it does not win at the largest. */
typedef struct bench_xo {
    int n;
    int64_t sizes[BENCH_MAX_XO];
    bench_time cpu[BENCH_MAX_XO], dev[BENCH_MAX_XO], dev_copies[BENCH_MAX_XO];
    int64_t faster_from, faster_from_copies;
} bench_xo;

typedef struct bench_results {
    bench_opts o;
    em_device_props props;
    bool props_ok;
    char auto_reason[256];

    bench_time matmul[BENCH_MAX_DTYPES][BENCH_MAX_SIZES];
    bench_mem matmul_mem;

    bool host_device;              /* false on the CPU: there is no host-device copy */
    int ncopies;
    int64_t copy_bytes[BENCH_MAX_COPIES];
    bench_time h2d_pageable[BENCH_MAX_COPIES], h2d_pinned[BENCH_MAX_COPIES];
    bench_time d2h_pageable[BENCH_MAX_COPIES], d2h_pinned[BENCH_MAX_COPIES];
    bench_time memcpy_ref[BENCH_MAX_COPIES];
    bench_mem copy_mem;
    int64_t pinned_reserved;

    bench_time launch_queued, launch_synced, launch_cpu;

    bool xo_skipped;
    char xo_reason[200];
    bench_xo xo_matmul, xo_add;
} bench_results;

/* Parse the options after "bench". 0: run; 1: --help was printed to out; 2: bad arguments
 * (the message is on err). */
int bench_parse(int argc, char **argv, bench_opts *o, FILE *out, FILE *err);
/* Fill r by measuring (r->o must be set). progress, when not NULL, gets one line per step. */
void bench_run(bench_results *r, FILE *progress);
/* How many measurements of the sections run failed (each says why in the report). */
int bench_failures(const bench_results *r);
int bench_write_text(FILE *f, const bench_results *r);
int bench_write_json(FILE *f, const bench_results *r);
/* The whole subcommand, writing to out and err: 0, or 2 for bad arguments. */
int bench_main(int argc, char **argv, FILE *out, FILE *err);

/* --plot: draws r into path (plot_bench.c); prints why not on err and returns false. */
bool bench_plot(const bench_results *r, const char *path, FILE *err);

/* The size-independent helpers the renderings share. */
const char *bench_dtype_short(em_dtype dt);
int64_t bench_faster_from(const bench_xo *x, const bench_time *dev);

#endif
