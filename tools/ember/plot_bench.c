/* `ember bench --plot FILE`: one picture of three panels from the measured results. The
 * crossover of matmul and of add (time per op against size: the CPU, the device with its
 * inputs already there, and the seed's scenario with the copies there and back), and the
 * matmul throughput by dtype. Only measured points are drawn; a panel with nothing measured
 * (the device is the CPU, or --only left the section out) says why instead. */
#include <string.h>
#include "bench.h"
#include "plot.h"

static bool xo_panel(plot_panel *p, const bench_results *r, const bench_xo *x, bool matmul) {
    snprintf(p->title, sizeof p->title, "crossover: %s (f32)", matmul ? "matmul [n x n] @ [n x n]" : "add");
    snprintf(p->xlabel, sizeof p->xlabel, "%s", matmul ? "n" : "elements");
    snprintf(p->ylabel, sizeof p->ylabel, "median time per op");
    p->xlog = p->ylog = true;
    p->xunit = PLOT_COUNT;
    p->yunit = PLOT_SECONDS;
    if (!(r->o.sections & BENCH_CROSSOVER)) {
        snprintf(p->note, sizeof p->note, "not measured (--only left the crossover out)");
        return true;
    }
    if (r->xo_skipped) {
        snprintf(p->note, sizeof p->note, "not measured: %.200s", r->xo_reason);
        return true;
    }
    const char *dev = em_device_str(r->o.device).s;
    char name[3][96];
    snprintf(name[0], sizeof name[0], "cpu");
    /* the crossover in the legend: from which size the device wins at every larger one */
    char from[2][40];
    for (int k = 0; k < 2; k++) {
        int64_t v = k ? x->faster_from_copies : x->faster_from;
        if (v) snprintf(from[k], sizeof from[k], "faster from %s%lld%s", matmul ? "n = " : "", (long long)v,
                          matmul ? "" : " elements");
        else snprintf(from[k], sizeof from[k], "never faster here");
    }
    snprintf(name[1], sizeof name[1], "%.16s, inputs on it: %s", dev, from[0]);
    snprintf(name[2], sizeof name[2], "%.16s, copies there and back: %s", dev, from[1]);
    const bench_time *t[3] = {x->cpu, x->dev, x->dev_copies};
    static const uint32_t rgb[3] = {PLOT_RGB_CPU, PLOT_RGB_DEVICE, PLOT_RGB_DEVICE_COPIES};
    for (int k = 0; k < 3; k++) {
        plot_series *s = plot_add_series(p, name[k], rgb[k], false);
        for (int i = 0; i < x->n; i++)
            if (t[k][i].ok && !plot_point(s, (double)x->sizes[i], t[k][i].median_s)) return false;
    }
    return true;
}

static uint32_t dtype_rgb(em_dtype dt) {
    return dt == EM_F16 ? PLOT_RGB_F16 : dt == EM_BF16 ? PLOT_RGB_BF16 : dt == EM_F64 ? PLOT_RGB_F64 : PLOT_RGB_F32;
}

static bool matmul_panel(plot_panel *p, const bench_results *r) {
    snprintf(p->title, sizeof p->title, "matmul throughput by dtype");
    snprintf(p->xlabel, sizeof p->xlabel, "n ([n x n] @ [n x n])");
    snprintf(p->ylabel, sizeof p->ylabel, "GFLOPS (2 n^3 / median time)");
    p->xlog = true;
    p->xunit = PLOT_COUNT;
    if (!(r->o.sections & BENCH_MATMUL)) {
        snprintf(p->note, sizeof p->note, "not measured (--only left matmul out)");
        return true;
    }
    for (int i = 0; i < r->o.ndtypes; i++) {
        plot_series *s = plot_add_series(p, bench_dtype_short(r->o.dtypes[i]), dtype_rgb(r->o.dtypes[i]), false);
        for (int j = 0; j < r->o.nsizes; j++) {
            const bench_time *t = &r->matmul[i][j];
            double n = (double)r->o.sizes[j];
            if (t->ok && !plot_point(s, n, 2 * n * n * n / t->median_s / 1e9)) return false;
        }
    }
    snprintf(p->note, sizeof p->note, "every matmul failed (the report says why)");
    return true;
}

bool bench_plot(const bench_results *r, const char *path, FILE *err) {
    plot_figure f = {.width = PLOT_BENCH_W, .height = PLOT_FIG_H, .npanels = 3};
    const char *dev = em_device_str(r->o.device).s;
    snprintf(f.title, sizeof f.title, "ember bench on %.24s%s%.96s%s", dev, r->props_ok ? ": " : "",
             r->props_ok ? r->props.name : "", r->props_ok && !r->props.is_gpu ? " (not a GPU)" : "");
    if (r->o.device.type == EM_CPU)
        snprintf(f.subtitle, sizeof f.subtitle, "the device is the CPU: no other device was measured, so there is "
                                                "no crossover; medians after warm-up, %g s per number", r->o.min_time);
    else
        snprintf(f.subtitle, sizeof f.subtitle, "medians after warm-up, %g s of repeats per number, device "
                                                "synchronized before every clock read", r->o.min_time);
    bool ok = xo_panel(&f.panels[0], r, &r->xo_matmul, true) && xo_panel(&f.panels[1], r, &r->xo_add, false) &&
              matmul_panel(&f.panels[2], r);
    char why[4400] = "out of memory";
    ok = ok && plot_write(&f, path, why, sizeof why);
    plot_figure_free(&f);
    if (!ok) fprintf(err, "ember bench: --plot: %s\n", why);
    return ok;
}
