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
} train_log;

/* Opens the event file in l->dir when set, and starts the --plot curves when l->plot is set
 * (main: this process writes; other ranks log nothing). Prints why not and returns false. */
bool train_log_open(train_log *l, const char *tool, bool main);
/* The run's description as a text summary ("config"), and under the plot's title. */
bool train_log_text(train_log *l, const char *tool, const char *text);
/* train/loss at step when step is a multiple of --log-every, to the log and the plot (reads
 * the loss: one wait on the device then). */
bool train_log_step(const train_log *l, const char *tool, int64_t step, em_tensor *loss);
/* What an epoch ends with, at the step reached. */
typedef struct train_log_epoch {
    int64_t epoch, step;
    double train_loss, test_accuracy, test_loss, lr, samples_per_s;
    em_device device;           /* its memory: allocated, peak and reserved bytes */
    em_module *model;           /* a histogram of each parameter */
} train_log_epoch;
/* Logs them, and adds them to the plot and rewrites its file. */
bool train_log_epoch_end(const train_log *l, const char *tool, const train_log_epoch *e);
/* Closes the file (flushing it) and frees the plot; false and a message if that failed. */
bool train_log_close(train_log *l, const char *tool);

#endif
