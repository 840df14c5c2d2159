/* TensorBoard logging of `ember train` (train_log.h) through em_summary_writer: the loss
 * every --log-every steps; per epoch the losses, accuracy, learning rate, throughput, device
 * memory and a histogram of every parameter. Every record reaches the file when written, so
 * a run stopped by any signal leaves readable curves. */
#include <stdio.h>

#include "plot.h"
#include "train_log.h"

static bool failed(const char *tool, const char *what) {
    fprintf(stderr, "%s: --logdir: %s: %s\n", tool, what, em_failed() ? em_last_error() : "unknown error");
    em_clear_error();
    return false;
}

bool train_log_open(train_log *l, const char *tool, bool main) {
    l->w = NULL;
    l->pt = NULL;
    if (l->plot && main) {
        if (!(l->pt = plot_train_new(l->plot, true))) {
            fprintf(stderr, "%s: --plot: out of memory\n", tool);
            return false;
        }
        printf("plot: %s (rewritten after every epoch)\n", l->plot);
    }
    if (!l->dir || !main) return true;
    l->w = em_summary_writer_open(l->dir);
    if (!l->w) {
        plot_train_free(l->pt);
        l->pt = NULL;
        return failed(tool, "cannot start the TensorBoard log");
    }
    printf("TensorBoard log: %s\n", em_summary_writer_path(l->w));
    return true;
}

bool train_log_text(train_log *l, const char *tool, const char *text) {
    plot_train_describe(l->pt, text);
    if (!l->w) return true;
    return em_summary_add_text(l->w, "config", text, 0) == EM_OK || failed(tool, "cannot write the log");
}

bool train_log_step(const train_log *l, const char *tool, int64_t step, em_tensor *loss) {
    if ((!l->w && !l->pt) || step % l->every) return true;
    double v = em_item(loss);
    if (em_failed()) return failed(tool, "cannot read the loss");
    if (!plot_train_step(l->pt, step, v)) {
        fprintf(stderr, "%s: --plot: out of memory\n", tool);
        return false;
    }
    return !l->w || em_summary_add_scalar(l->w, "train/loss", v, step) == EM_OK || failed(tool, "cannot write the log");
}

bool train_log_epoch_end(const train_log *l, const char *tool, const train_log_epoch *e) {
    if (l->pt) {   /* the picture first: a failing log still leaves it */
        if (!plot_train_epoch(l->pt, e->step, e->train_loss, e->test_loss, e->test_accuracy)) {
            fprintf(stderr, "%s: --plot: out of memory\n", tool);
            return false;
        }
        if (!plot_train_write(l->pt, stderr, tool)) return false;
    }
    if (!l->w) return true;
    const struct { const char *tag; double v; } s[] = {
        {"epoch/train_loss", e->train_loss},
        {"epoch/test_accuracy", e->test_accuracy},
        {"epoch/test_loss", e->test_loss},
        {"epoch/learning_rate", e->lr},
        {"epoch/samples_per_second", e->samples_per_s},
        {"epoch/epoch", (double)e->epoch},
        {"memory/allocated_bytes", (double)em_memory_allocated(e->device)},
        {"memory/peak_allocated_bytes", (double)em_memory_max_allocated(e->device)},
        {"memory/reserved_bytes", (double)em_memory_reserved(e->device)},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (em_summary_add_scalar(l->w, s[i].tag, s[i].v, e->step) != EM_OK) return failed(tool, "cannot write the log");
    em_named_tensor p[64];
    int n = e->model ? em_module_parameters(e->model, p, 64) : 0;
    for (int i = 0; i < n && i < 64; i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "parameters/%s", p[i].name);
        if (em_summary_add_histogram(l->w, tag, p[i].tensor, e->step) != EM_OK)
            return failed(tool, "cannot write a parameter histogram");
    }
    return true;
}

bool train_log_close(train_log *l, const char *tool) {
    plot_train_free(l->pt);
    l->pt = NULL;
    em_summary_writer *w = l->w;
    l->w = NULL;
    return em_summary_writer_close(w) == EM_OK || failed(tool, "cannot close the log");
}
