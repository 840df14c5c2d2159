/* `--plot FILE` of `ember bench` and `ember train`: a small line-chart library on cairo
 * (plot.c), the benchmark's figure (plot_bench.c) and the training curves (plot_train.c).
 * A figure is one or more panels side by side; a panel has axes with ticks and labels,
 * linear or log scales, named series each in its own fixed colour, and a legend. The file's
 * extension picks the format, .png or .svg; the file is replaced atomically (a temporary
 * file in the same folder, then rename), so a reader never sees half a picture. Built
 * without cairo (EMBER_HAVE_CAIRO unset), --plot is refused before any work. */
#ifndef EMBER_TOOL_PLOT_H
#define EMBER_TOOL_PLOT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The fixed colours (0xRRGGBB): a series keeps its colour in every picture, and the tests
 * look for these exact values among the pixels of a PNG and the strokes of an SVG. */
#define PLOT_RGB_CPU 0x1f77b4          /* bench crossover: the CPU */
#define PLOT_RGB_DEVICE 0xd62728       /* the device, inputs already on it */
#define PLOT_RGB_DEVICE_COPIES 0xff7f0e /* the device, inputs copied there and the result back */
#define PLOT_RGB_F32 0x2ca02c          /* bench matmul GFLOPS by dtype */
#define PLOT_RGB_F16 0x9467bd
#define PLOT_RGB_BF16 0x8c564b
#define PLOT_RGB_F64 0xe377c2
#define PLOT_RGB_STEP_LOSS 0x9edae5    /* train: the loss every --log-every steps */
#define PLOT_RGB_TRAIN_LOSS 0x1f77b4   /* the epoch's mean train loss */
#define PLOT_RGB_TEST_LOSS 0xff7f0e    /* mlp, cnn: the test loss */
#define PLOT_RGB_VAL_LOSS 0xd62728     /* gpt: the validation loss */
#define PLOT_RGB_ACCURACY 0x2ca02c     /* mlp, cnn: the test accuracy */
#define PLOT_RGB_MEM_TAG0 0x1f77b4     /* memory-timeline: the tags with the highest peaks, stacked */
#define PLOT_RGB_MEM_TAG1 0xff7f0e
#define PLOT_RGB_MEM_TAG2 0x2ca02c
#define PLOT_RGB_MEM_TAG3 0x9467bd
#define PLOT_RGB_MEM_TOTAL 0x7f7f7f    /* memory-timeline: all allocated bytes (the other tags on top) */
#define PLOT_RGB_MEM_RESERVED 0xd62728 /* memory-timeline: reserved bytes */

/* Picture sizes (pixels for PNG, points for SVG). */
#define PLOT_PANEL_W 520
#define PLOT_FIG_H 460
#define PLOT_BENCH_W (3 * PLOT_PANEL_W) /* crossover matmul, crossover add, GFLOPS by dtype */
#define PLOT_TRAIN_W (2 * PLOT_PANEL_W) /* loss; accuracy (mlp, cnn) */
#define PLOT_GPT_W PLOT_PANEL_W         /* loss only */
#define PLOT_MEMORY_W (2 * PLOT_PANEL_W) /* memory-timeline: one wide panel */

typedef enum plot_format { PLOT_NONE, PLOT_PNG, PLOT_SVG } plot_format;
/* From the path's extension (.png or .svg, any case); PLOT_NONE for anything else. */
plot_format plot_format_of(const char *path);

/* Checks an output path given as option opt before any work: a known extension, a build
 * with cairo, an existing folder where a file can be made, not a folder itself. Prints
 * "tool: opt ...: why" on err and returns false when not. */
bool plot_check_output(FILE *err, const char *tool, const char *opt, const char *path);

/* How an axis writes its tick labels. */
typedef enum plot_unit { PLOT_NUMBER, PLOT_SECONDS, PLOT_COUNT } plot_unit;

typedef struct plot_series {
    char name[96];
    uint32_t rgb;
    bool thin;                 /* a thin line without markers (dense series) */
    int n, cap;
    double *x, *y;             /* non-finite values (and <= 0 on a log axis) break the line */
} plot_series;

#define PLOT_MAX_SERIES 6
typedef struct plot_panel {
    char title[96], xlabel[64], ylabel[64];
    char note[256];            /* written over an empty plot area (why nothing was measured) */
    bool xlog, ylog;
    bool xzero;                /* the x range starts at 0 (steps: panels side by side align) */
    plot_unit xunit, yunit;
    int nseries;
    plot_series series[PLOT_MAX_SERIES];
} plot_panel;

#define PLOT_MAX_PANELS 3
typedef struct plot_figure {
    char title[160], subtitle[240];
    int width, height, npanels;
    plot_panel panels[PLOT_MAX_PANELS];
} plot_figure;

/* A new series on p (NULL when p has PLOT_MAX_SERIES already). */
plot_series *plot_add_series(plot_panel *p, const char *name, uint32_t rgb, bool thin);
/* Appends (x, y); false when out of memory. */
bool plot_point(plot_series *s, double x, double y);
/* Frees the series' points (the figure itself is the caller's). */
void plot_figure_free(plot_figure *f);
/* Draws f into path (format from its extension), replacing it atomically. false and the
 * reason in why when not. Series without a point get no legend entry. */
bool plot_write(const plot_figure *f, const char *path, char *why, size_t why_size);

/* ---- ember train --plot (plot_train.c) ---- */
typedef struct plot_train plot_train;
/* classifier: mlp and cnn (test loss, test accuracy); otherwise gpt (validation loss). NULL
 * when out of memory. */
plot_train *plot_train_new(const char *path, bool classifier);
/* The run's description, under the title. */
void plot_train_describe(plot_train *p, const char *text);
/* The loss at an optimizer step (the caller decides how often); the series is thinned
 * past 4096 points so that a long run stays small. */
bool plot_train_step(plot_train *p, int64_t step, double loss);
/* An epoch's end at step: mean train loss, test (or validation) loss, test accuracy as a
 * fraction (NAN for gpt). */
bool plot_train_epoch(plot_train *p, int64_t step, double train_loss, double eval_loss, double accuracy);
/* Writes the picture (nothing for NULL); false and the reason in why on failure. */
bool plot_train_write(plot_train *p, char *why, size_t why_size);
void plot_train_free(plot_train *p);

/* ---- ember memory-timeline (plot_memory.c) ---- */
#define PLOT_MEMORY_MAX_TAGS 4
struct mh_history;
/* The timeline of one device's events of h (memory_history.h): allocated bytes over time,
 * stacked by tag (the `top` tags, 1..PLOT_MEMORY_MAX_TAGS, with the highest peaks, each line
 * the top of its band; a free counts against the tag its block was allocated with), all
 * allocated bytes (the other tags, and what was allocated before the recording, on top), and
 * reserved bytes. Drawn into path; false with the reason in why (also when the device has no
 * event). */
bool plot_memory_timeline(const struct mh_history *h, const char *device, int top, const char *path,
                          const char *subtitle, char *why, size_t why_size);

#endif
