/* TensorBoard logging of `ember train` (train_log.h) through em_summary_writer: the loss
 * every --log-every steps; per epoch the losses, accuracy, learning rate, throughput, device
 * memory and a histogram of every parameter. Every record reaches the file when written, so
 * a run stopped by any signal leaves readable curves.
 *
 * The log and the picture are side outputs: a write that fails (a full disk, a folder
 * removed) is reported once as a warning and that output stops (a failed event-file write
 * may have left half a record, which nothing may follow), while training and its checkpoints
 * go on; --strict-logs makes the caller stop after saving instead. */
#include <stdio.h>

#include "plot.h"
#include "train_log.h"

/* The first failure of either output: the warning, and the output stops. */
static void failed(train_log *l, const char *tool, const char *opt, const char *why) {
    if (!l->failed)
        fprintf(stderr, "%s: warning: %s: %s; %s\n", tool, opt, why,
                l->strict ? "training stops after the checkpoint is saved (--strict-logs)"
                          : "training goes on without it (--strict-logs would stop instead)");
    l->failed = true;
    em_summary_writer *w = l->w;
    l->w = NULL;
    em_summary_writer_close(w);
    plot_train_free(l->pt);
    l->pt = NULL;
    em_clear_error();
}

static void log_failed(train_log *l, const char *tool, const char *what) {
    char why[1200];
    snprintf(why, sizeof why, "%s: %s", what, em_failed() ? em_last_error() : "unknown error");
    failed(l, tool, "--logdir", why);
}

bool train_log_open(train_log *l, const char *tool, bool main) {
    l->w = NULL;
    l->pt = NULL;
    l->failed = false;
    if (l->plot && main) {
        if (!(l->pt = plot_train_new(l->plot, !l->loss_only))) failed(l, tool, "--plot", "out of memory");
        else printf("plot: %s (rewritten after every epoch)\n", l->plot);
    }
    if (l->dir && main && !l->failed) {
        l->w = em_summary_writer_open(l->dir);
        if (l->w) printf("TensorBoard log: %s\n", em_summary_writer_path(l->w));
        else log_failed(l, tool, "cannot start the TensorBoard log");
    }
    return !train_log_stop(l);
}

void train_log_text(train_log *l, const char *tool, const char *text) {
    plot_train_describe(l->pt, text);
    if (l->w && em_summary_add_text(l->w, "config", text, 0) != EM_OK) log_failed(l, tool, "cannot write the log");
}

bool train_log_step(train_log *l, const char *tool, int64_t step, em_tensor *loss) {
    if ((!l->w && !l->pt) || step % l->every) return true;
    double v = em_item(loss);
    if (em_failed()) return false;   /* the device's error, not the log's: the caller reports it */
    if (!plot_train_step(l->pt, step, v)) failed(l, tool, "--plot", "out of memory");
    if (l->w && em_summary_add_scalar(l->w, "train/loss", v, step) != EM_OK) log_failed(l, tool, "cannot write the log");
    return true;
}

void train_log_epoch_end(train_log *l, const char *tool, const train_log_epoch *e) {
    if (l->pt) {   /* the picture first: a failing log still leaves it */
        char why[4096 + 256];
        if (!plot_train_epoch(l->pt, e->step, e->train_loss, e->test_loss, e->test_accuracy))
            failed(l, tool, "--plot", "out of memory");
        else if (!plot_train_write(l->pt, why, sizeof why))
            failed(l, tool, "--plot", why);
    }
    if (!l->w) return;
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
        if (em_summary_add_scalar(l->w, s[i].tag, s[i].v, e->step) != EM_OK) {
            log_failed(l, tool, "cannot write the log");
            return;
        }
    em_named_tensor p[64];
    int n = e->model ? em_module_parameters(e->model, p, 64) : 0;
    for (int i = 0; i < n && i < 64; i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "parameters/%s", p[i].name);
        if (em_summary_add_histogram(l->w, tag, p[i].tensor, e->step) != EM_OK) {
            log_failed(l, tool, "cannot write a parameter histogram");
            return;
        }
    }
}

bool train_log_stop(const train_log *l) { return l->strict && l->failed; }

void train_log_close(train_log *l, const char *tool) {
    plot_train_free(l->pt);
    l->pt = NULL;
    em_summary_writer *w = l->w;
    l->w = NULL;
    if (w && em_summary_writer_close(w) != EM_OK) log_failed(l, tool, "cannot close the log");
}
