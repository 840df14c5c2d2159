/* The line charts of `--plot` (plot.h), drawn with cairo: one library writes both formats,
 * in-process (no gnuplot to find and run), and it is in Debian (libcairo2). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include "plot.h"
#ifdef EMBER_HAVE_CAIRO
#include <cairo.h>
#include <cairo-svg.h>
#include <fontconfig/fontconfig.h>
#endif

plot_format plot_format_of(const char *path) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash)) return PLOT_NONE;
    return !strcasecmp(dot, ".png") ? PLOT_PNG : !strcasecmp(dot, ".svg") ? PLOT_SVG : PLOT_NONE;
}

#ifdef EMBER_HAVE_CAIRO
/* The folder of path, into dir. */
static void folder_of(const char *path, char *dir, size_t size) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, size, ".");
    else if (slash == path) snprintf(dir, size, "/");
    else snprintf(dir, size, "%.*s", (int)(slash - path), path);
}
#endif

bool plot_check_output(FILE *err, const char *tool, const char *opt, const char *path) {
    size_t n = strlen(path);
    if (n == 0 || n >= PATH_MAX) {
        fprintf(err, "%s: %s: expected a file path ending in .png or .svg, got %s\n", tool, opt,
                n ? "a path longer than PATH_MAX" : "an empty string");
        return false;
    }
    if (plot_format_of(path) == PLOT_NONE) {
        fprintf(err, "%s: %s '%s': unknown picture format: expected a file name ending in .png or .svg\n", tool, opt,
                path);
        return false;
    }
#ifndef EMBER_HAVE_CAIRO
    fprintf(err, "%s: %s: this ember was built without cairo, which draws the plots (install libcairo2-dev "
                 "and rebuild)\n", tool, opt);
    return false;
#else
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(err, "%s: %s '%s' is %s: expected a regular file (it is replaced)\n", tool, opt, path,
                S_ISDIR(st.st_mode) ? "a folder" : "not a regular file");
        return false;
    }
    char dir[PATH_MAX];
    folder_of(path, dir, sizeof dir);
    int sr = stat(dir, &st), e = errno;
    if (sr != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(err, "%s: %s '%s': the folder '%s' %s\n", tool, opt, path, dir,
                sr == 0 ? "is not a folder" : e == ENOENT ? "does not exist" : strerror(e));
        return false;
    }
    /* the picture is written to a temporary file next to it, then renamed */
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.ember-plot-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(err, "%s: %s '%s': cannot create a file in the folder '%s': %s\n", tool, opt, path, dir,
                strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
#endif
}

plot_series *plot_add_series(plot_panel *p, const char *name, uint32_t rgb, bool thin) {
    if (p->nseries == PLOT_MAX_SERIES) return NULL;
    plot_series *s = &p->series[p->nseries++];
    *s = (plot_series){.rgb = rgb, .thin = thin};
    snprintf(s->name, sizeof s->name, "%.95s", name);   /* names longer than 95 bytes are cut */
    return s;
}

bool plot_point(plot_series *s, double x, double y) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        double *nx = realloc(s->x, sizeof(double) * (size_t)cap);
        if (!nx) return false;
        s->x = nx;
        double *ny = realloc(s->y, sizeof(double) * (size_t)cap);
        if (!ny) return false;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return true;
}

void plot_figure_free(plot_figure *f) {
    for (int i = 0; i < f->npanels; i++)
        for (int k = 0; k < f->panels[i].nseries; k++) {
            plot_series *s = &f->panels[i].series[k];
            free(s->x);
            free(s->y);
            s->x = s->y = NULL;
            s->n = s->cap = 0;
        }
}

#ifndef EMBER_HAVE_CAIRO

bool plot_write(const plot_figure *f, const char *path, char *why, size_t why_size) {
    (void)f;
    (void)path;
    snprintf(why, why_size, "this ember was built without cairo, which draws the plots");
    return false;
}

#else

#define PI 3.14159265358979323846

/* ---- axes ---- */

typedef struct axis {
    bool log;
    plot_unit unit;
    double lo, hi;             /* the range shown (log10 of it on a log axis) */
    double ticks[64];          /* tick values (not log10) */
    int nticks;
} axis;

static bool usable(const axis *a, double v) { return isfinite(v) && (!a->log || v > 0); }
static double coord(const axis *a, double v) { return a->log ? log10(v) : v; }

/* 1, 2 or 5 times a power of ten, about range / 5 (at least range / 8). */
static double nice_step(double range) {
    double raw = range / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

/* The range over the usable values of the panel's series on one axis, widened to ticks. */
static void axis_fit(axis *a, const plot_panel *p, bool x) {
    double lo = x && p->xzero && !a->log ? 0 : INFINITY, hi = -INFINITY;
    for (int k = 0; k < p->nseries; k++)
        for (int i = 0; i < p->series[k].n; i++) {
            double v = x ? p->series[k].x[i] : p->series[k].y[i];
            if (usable(a, v)) lo = fmin(lo, coord(a, v)), hi = fmax(hi, coord(a, v));
        }
    a->nticks = 0;
    if (!isfinite(lo) || !isfinite(hi)) {   /* nothing to show: an empty frame, no ticks */
        a->lo = 0, a->hi = 1;
        return;
    }
    if (hi - lo < 1e-12 * fmax(1, fabs(hi))) {   /* one value: a range around it */
        double d = a->log ? 0.5 : fabs(lo) > 0 ? fabs(lo) * 0.1 : 1;
        lo -= d, hi += d;
    }
    /* a margin, so that a marker on the range's edge is not cut in half */
    double pad = (hi - lo) * 0.03;
    if (!(x && p->xzero && lo == 0)) lo -= pad;
    hi += pad;
    if (a->log) {
        /* ticks at 1, 2, 5 per decade over at most two decades, else at powers of ten */
        static const double every[] = {1, 2, 5};
        int per = hi - lo <= 2.2 ? 3 : 1;
        double step = hi - lo > 12 ? ceil((hi - lo) / 8) : 1;
        a->lo = floor(lo / step) * step, a->hi = ceil(hi / step) * step;
        if (per == 3) {   /* hug the data: the 1-2-5 tick just outside it */
            double l = a->lo, h = a->hi;
            for (double d = a->lo; d < a->hi; d++)
                for (int m = 0; m < 3; m++) {
                    double t = d + log10(every[m]);
                    if (t <= lo + 1e-9) l = t;
                    if (t >= hi - 1e-9 && h == a->hi) h = t;
                }
            a->lo = l, a->hi = h;
        }
        for (double d = floor(a->lo); d <= a->hi + 1e-9 && a->nticks < 64; d += step)
            for (int m = 0; m < per && a->nticks < 64; m++) {
                double t = d + log10(every[m]);
                if (t >= a->lo - 1e-9 && t <= a->hi + 1e-9) a->ticks[a->nticks++] = pow(10, t);
            }
    } else {
        double step = nice_step(hi - lo);
        a->lo = floor(lo / step) * step, a->hi = ceil(hi / step) * step;
        for (double t = a->lo; t <= a->hi + step * 1e-6 && a->nticks < 64; t += step)
            a->ticks[a->nticks++] = fabs(t) < step * 1e-9 ? 0 : t;
    }
}

static void tick_label(const axis *a, double v, char *buf, size_t size) {
    if (a->unit == PLOT_SECONDS) {
        static const struct { double scale; const char *unit; } u[] = {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}};
        int k = 0;
        while (k < 3 && v < u[k].scale * 0.999) k++;
        snprintf(buf, size, "%g %s", v / u[k].scale, u[k].unit);
    } else if (a->unit == PLOT_COUNT && fabs(v) >= 1000) {
        static const char *suffix[] = {"k", "M", "G", "T"};
        int k = -1;
        while (k < 3 && fabs(v) >= 999.5) v /= 1000, k++;
        snprintf(buf, size, "%g%s", v, suffix[k]);
    } else {
        snprintf(buf, size, "%g", v);
    }
}

/* ---- drawing ---- */

static void set_rgb(cairo_t *cr, uint32_t rgb) {
    cairo_set_source_rgb(cr, ((rgb >> 16) & 255) / 255.0, ((rgb >> 8) & 255) / 255.0, (rgb & 255) / 255.0);
}

/* Text with its anchor at (x, y): ax 0 left, 0.5 centre, 1 right; baseline at y. */
static void text_at(cairo_t *cr, double x, double y, double ax, const char *s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - ax * e.x_advance, y);
    cairo_show_text(cr, s);
}

static void font(cairo_t *cr, double size, bool bold) {
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}

/* Writes text over width w from (x, y), breaking at spaces; returns the lines used. */
static int text_wrapped(cairo_t *cr, double x, double y, double w, double line, const char *s) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    int lines = 0;
    char *p = buf;
    while (*p) {
        /* the longest prefix ending at a space that fits (a whole word when none does) */
        char *cut = NULL;
        for (char *q = p;; q++) {
            if (*q != ' ' && *q != '\0') continue;
            char c = *q;
            *q = '\0';
            cairo_text_extents_t e;
            cairo_text_extents(cr, p, &e);
            *q = c;
            if (e.x_advance > w && cut) break;
            cut = q;
            if (!c || e.x_advance > w) break;
        }
        char c = *cut;
        *cut = '\0';
        text_at(cr, x, y + line * lines++, 0.5, p);
        p = c ? cut + 1 : cut;
    }
    return lines;
}

static int series_shown(const plot_panel *p) {
    int k = 0;
    for (int i = 0; i < p->nseries; i++) k += p->series[i].n > 0;
    return k;
}

/* rows: legend lines reserved under every panel (the most any panel has), so that panels
 * side by side share one plot height */
static void draw_panel(cairo_t *cr, const plot_panel *p, double x0, double y0, double w, double h, int rows) {
    axis ax = {.log = p->xlog, .unit = p->xunit}, ay = {.log = p->ylog, .unit = p->yunit};
    axis_fit(&ax, p, true);
    axis_fit(&ay, p, false);
    int legend = series_shown(p);
    /* the plot area: room for the title, tick labels, axis labels and the legend below */
    double left = x0 + 78, right = x0 + w - 20, top = y0 + 34, bottom = y0 + h - 52 - 17.0 * rows;
    font(cr, 14, true);
    set_rgb(cr, 0x222222);
    text_at(cr, (left + right) / 2, y0 + 20, 0.5, p->title);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_rectangle(cr, left, top, right - left, bottom - top);
    cairo_fill(cr);
#define PX(v) (left + (coord(&ax, (v)) - ax.lo) / (ax.hi - ax.lo) * (right - left))
#define PY(v) (bottom - (coord(&ay, (v)) - ay.lo) / (ay.hi - ay.lo) * (bottom - top))
    /* grid and tick labels */
    font(cr, 11, false);
    cairo_set_line_width(cr, 1);
    char label[48];
    for (int i = 0; i < ax.nticks; i++) {
        double x = floor(PX(ax.ticks[i])) + 0.5;
        set_rgb(cr, 0xe0e0e0);
        cairo_move_to(cr, x, top);
        cairo_line_to(cr, x, bottom);
        cairo_stroke(cr);
        set_rgb(cr, 0x444444);
        tick_label(&ax, ax.ticks[i], label, sizeof label);
        text_at(cr, x, bottom + 16, 0.5, label);
    }
    for (int i = 0; i < ay.nticks; i++) {
        double y = floor(PY(ay.ticks[i])) + 0.5;
        set_rgb(cr, 0xe0e0e0);
        cairo_move_to(cr, left, y);
        cairo_line_to(cr, right, y);
        cairo_stroke(cr);
        set_rgb(cr, 0x444444);
        tick_label(&ay, ay.ticks[i], label, sizeof label);
        text_at(cr, left - 6, y + 4, 1, label);
    }
    set_rgb(cr, 0x444444);
    cairo_rectangle(cr, floor(left) + 0.5, floor(top) + 0.5, floor(right - left), floor(bottom - top));
    cairo_stroke(cr);
    /* axis labels: x under the tick labels, y turned along the left edge */
    font(cr, 12, false);
    set_rgb(cr, 0x222222);
    text_at(cr, (left + right) / 2, bottom + 34, 0.5, p->xlabel);
    cairo_save(cr);
    cairo_translate(cr, x0 + 16, (top + bottom) / 2);
    cairo_rotate(cr, -PI / 2);
    text_at(cr, 0, 0, 0.5, p->ylabel);
    cairo_restore(cr);
    if (!legend && p->note[0]) {
        set_rgb(cr, 0x666666);
        text_wrapped(cr, (left + right) / 2, (top + bottom) / 2 - 20, right - left - 30, 16, p->note);
    }
    /* the series, clipped to the plot area */
    cairo_save(cr);
    cairo_rectangle(cr, left, top, right - left, bottom - top);
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    for (int k = 0; k < p->nseries; k++) {
        const plot_series *s = &p->series[k];
        set_rgb(cr, s->rgb);
        cairo_set_line_width(cr, s->thin ? 2 : 2.5);
        bool pen = false;
        for (int i = 0; i < s->n; i++) {
            if (!usable(&ax, s->x[i]) || !usable(&ay, s->y[i])) {
                pen = false;
                continue;
            }
            if (pen) cairo_line_to(cr, PX(s->x[i]), PY(s->y[i]));
            else cairo_move_to(cr, PX(s->x[i]), PY(s->y[i]));
            pen = true;
        }
        cairo_stroke(cr);
        if (s->thin) continue;
        for (int i = 0; i < s->n; i++)
            if (usable(&ax, s->x[i]) && usable(&ay, s->y[i])) {
                cairo_new_sub_path(cr);
                cairo_arc(cr, PX(s->x[i]), PY(s->y[i]), 3.5, 0, 2 * PI);
            }
        cairo_fill(cr);
    }
    cairo_restore(cr);
#undef PX
#undef PY
    /* the legend, under the x label: a short line in the series' colour and its name */
    font(cr, 12, false);
    double ly = bottom + 56;
    for (int k = 0; k < p->nseries; k++) {
        const plot_series *s = &p->series[k];
        if (!s->n) continue;
        set_rgb(cr, s->rgb);
        cairo_set_line_width(cr, s->thin ? 2 : 2.5);
        cairo_move_to(cr, left + 4, ly - 4);
        cairo_line_to(cr, left + 22, ly - 4);
        cairo_stroke(cr);
        set_rgb(cr, 0x222222);
        text_at(cr, left + 30, ly, 0, s->name);
        ly += 17;
    }
}

static void draw(cairo_t *cr, const plot_figure *f) {
    cairo_set_source_rgb(cr, 0.97, 0.97, 0.97);
    cairo_paint(cr);
    font(cr, 16, true);
    set_rgb(cr, 0x111111);
    text_at(cr, f->width / 2.0, 24, 0.5, f->title);
    font(cr, 12, false);
    set_rgb(cr, 0x555555);
    text_at(cr, f->width / 2.0, 44, 0.5, f->subtitle);
    double pw = (double)f->width / (f->npanels ? f->npanels : 1);
    int rows = 0;
    for (int i = 0; i < f->npanels; i++) rows = series_shown(&f->panels[i]) > rows ? series_shown(&f->panels[i]) : rows;
    for (int i = 0; i < f->npanels; i++) draw_panel(cr, &f->panels[i], pw * i, 54, pw, f->height - 54, rows);
}

/* cairo's stream callback: into the temporary file. */
static cairo_status_t to_file(void *closure, const unsigned char *data, unsigned int length) {
    return fwrite(data, 1, length, closure) == length ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

bool plot_write(const plot_figure *f, const char *path, char *why, size_t why_size) {
    plot_format fmt = plot_format_of(path);
    if (fmt == PLOT_NONE) {
        snprintf(why, why_size, "'%s': expected a file name ending in .png or .svg", path);
        return false;
    }
    char dir[PATH_MAX], tmp[PATH_MAX + 64];
    folder_of(path, dir, sizeof dir);
    static unsigned serial;
    snprintf(tmp, sizeof tmp, "%s/.ember-plot.%ld.%u.tmp", dir, (long)getpid(), serial++);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    FILE *out = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!out) {
        snprintf(why, why_size, "cannot create a file in the folder '%s': %s", dir, strerror(errno));
        if (fd >= 0) close(fd), unlink(tmp);
        return false;
    }
    cairo_surface_t *s = fmt == PLOT_SVG ? cairo_svg_surface_create_for_stream(to_file, out, f->width, f->height)
                                         : cairo_image_surface_create(CAIRO_FORMAT_RGB24, f->width, f->height);
    cairo_t *cr = cairo_create(s);
    draw(cr, f);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS && fmt == PLOT_PNG) st = cairo_surface_write_to_png_stream(s, to_file, out);
    cairo_surface_finish(s);   /* an SVG is written out here */
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    /* no cairo object is alive now: hand back cairo's and fontconfig's font caches, so that
     * nothing a picture needed outlives it (the next picture loads them again, a few ms) */
    cairo_debug_reset_static_data();
    FcFini();
    bool ok = st == CAIRO_STATUS_SUCCESS;
    int e = ok ? 0 : EIO;
    if (fflush(out) != 0 && ok) ok = false, e = errno;
    if (ok && fsync(fileno(out)) != 0) ok = false, e = errno;
    if (fclose(out) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) {
        snprintf(why, why_size, "cannot write '%s': %s", path,
                 st != CAIRO_STATUS_SUCCESS ? cairo_status_to_string(st) : strerror(e));
        unlink(tmp);
    }
    return ok;
}

#endif
