/* `ember train --plot FILE`: the loss and accuracy curves of a run (plot.h), against the
 * optimizer step. The picture is rewritten after every epoch, so an interrupted run still
 * leaves one. A resumed run plots from where it resumed (the curves are not in the
 * checkpoint). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "plot.h"

/* Past this many per-step points, every other one is dropped and the stride doubled. */
#define MAX_STEP_POINTS 4096

struct plot_train {
    char path[4096];
    plot_figure fig;
    plot_series *step, *train, *eval, *acc;
    int64_t stride, seen;      /* per-step losses: one kept out of stride */
};

plot_train *plot_train_new(const char *path, bool classifier) {
    plot_train *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    snprintf(p->path, sizeof p->path, "%s", path);
    plot_figure *f = &p->fig;
    snprintf(f->title, sizeof f->title, "ember train: %s", classifier ? "loss and test accuracy" : "loss");
    f->width = classifier ? PLOT_TRAIN_W : PLOT_GPT_W;
    f->height = PLOT_FIG_H;
    f->npanels = classifier ? 2 : 1;
    plot_panel *loss = &f->panels[0];
    snprintf(loss->title, sizeof loss->title, "loss (cross-entropy)");
    snprintf(loss->xlabel, sizeof loss->xlabel, "optimizer step");
    loss->xzero = true;
    snprintf(loss->ylabel, sizeof loss->ylabel, "loss");
    p->step = plot_add_series(loss, "train loss, single steps", PLOT_RGB_STEP_LOSS, true);
    p->train = plot_add_series(loss, "train loss, epoch mean", PLOT_RGB_TRAIN_LOSS, false);
    p->eval = classifier ? plot_add_series(loss, "test loss", PLOT_RGB_TEST_LOSS, false)
                         : plot_add_series(loss, "validation loss", PLOT_RGB_VAL_LOSS, false);
    if (classifier) {
        plot_panel *acc = &f->panels[1];
        snprintf(acc->title, sizeof acc->title, "test accuracy");
        snprintf(acc->xlabel, sizeof acc->xlabel, "optimizer step");
        acc->xzero = true;
        snprintf(acc->ylabel, sizeof acc->ylabel, "accuracy (%%)");
        p->acc = plot_add_series(acc, "test accuracy", PLOT_RGB_ACCURACY, false);
    }
    p->stride = 1;
    return p;
}

void plot_train_describe(plot_train *p, const char *text) {
    if (p) snprintf(p->fig.subtitle, sizeof p->fig.subtitle, "%s", text);
}

bool plot_train_step(plot_train *p, int64_t step, double loss) {
    if (!p || p->seen++ % p->stride) return true;
    plot_series *s = p->step;
    if (s->n == MAX_STEP_POINTS) {
        for (int i = 0; i < s->n / 2; i++) s->x[i] = s->x[2 * i], s->y[i] = s->y[2 * i];
        s->n /= 2;
        p->stride *= 2;
        p->seen = 1;
    }
    return plot_point(s, (double)step, loss);
}

bool plot_train_epoch(plot_train *p, int64_t step, double train_loss, double eval_loss, double accuracy) {
    if (!p) return true;
    double x = (double)step;
    return plot_point(p->train, x, train_loss) && plot_point(p->eval, x, eval_loss) &&
           (!p->acc || plot_point(p->acc, x, 100.0 * accuracy));
}

bool plot_train_write(plot_train *p, char *why, size_t why_size) {
    return !p || plot_write(&p->fig, p->path, why, why_size);
}

void plot_train_free(plot_train *p) {
    if (!p) return;
    plot_figure_free(&p->fig);
    free(p);
}
