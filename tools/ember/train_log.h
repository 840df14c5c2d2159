/* `ember train --logdir DIR [--log-every N]`: TensorBoard curves of a run (the logic lives in
 * train_log.c; cmd_train.c only parses the options and calls in). */
#ifndef EMBER_TOOL_TRAIN_LOG_H
#define EMBER_TOOL_TRAIN_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

typedef struct train_log {
    const char *dir;            /* --logdir; NULL: no log */
    int64_t every;              /* --log-every: the loss every N steps (default 10) */
    em_summary_writer *w;       /* open on the main rank only */
    /* --plot FILE: loss and accuracy curves, rewritten every epoch (plot_train.c) */
    const char *plot;
    struct plot_train *pt;      /* on the main rank only */
    bool loss_only;             /* a picture without the accuracy panel (the GPT's) */
    /* A write of the log or the picture that fails (a full disk) never ends training by
     * itself: it is a warning, once, and that output stops; with --strict-logs (strict)
     * training stops at the next step boundary, after the checkpoint is saved. */
    bool strict;
    bool failed;                /* a write failed (the warning was printed) */
} train_log;

/* Opens the event file in l->dir when set, and starts the --plot curves when l->plot is set
 * (main: this process writes; other ranks log nothing). A failure is a warning (see
 * train_log_stop); false only when training cannot go on. */
bool train_log_open(train_log *l, const char *tool, bool main);
/* The run's description as a text summary ("config"), and under the plot's title. */
void train_log_text(train_log *l, const char *tool, const char *text);
/* train/loss at step when step is a multiple of --log-every, to the log and the plot (reads
 * the loss: one wait on the device then). false only when the loss cannot be read (a device
 * error, left pending for the caller: it ends training). */
bool train_log_step(train_log *l, const char *tool, int64_t step, em_tensor *loss);
/* What an epoch ends with, at the step reached. */
typedef struct train_log_epoch {
    int64_t epoch, step;
    double train_loss, test_accuracy, test_loss, lr, samples_per_s;
    em_device device;           /* its memory: allocated, peak and reserved bytes */
    em_module *model;           /* a histogram of each parameter */
} train_log_epoch;
/* Logs them, and adds them to the plot and rewrites its file (call it after the epoch's
 * checkpoint is saved: the checkpoint comes first). */
void train_log_epoch_end(train_log *l, const char *tool, const train_log_epoch *e);
/* Whether training must stop now: a write failed under --strict-logs. */
bool train_log_stop(const train_log *l);
/* Closes the file (flushing it) and frees the plot; a failure is the warning above. */
void train_log_close(train_log *l, const char *tool);

#endif
