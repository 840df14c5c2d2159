/* A training progress display: a bar redrawn in place with rate and ETA on a terminal, a
 * plain line every quarter of the epoch otherwise (logs, pipes, CI). */
#ifndef EMBER_TOOL_PROGRESS_H
#define EMBER_TOOL_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct progress {
    FILE *out;
    bool tty;
    int64_t total;          /* steps in this epoch */
    int64_t first;          /* the step the epoch (re)started at: rates count from here */
    double t0, last_draw;
    int64_t next_plain;     /* the step of the next plain line */
    char label[32];
} progress;

void progress_begin(progress *p, FILE *out, const char *label, int64_t total, int64_t first);
/* Whether the display is due after step done (1-based): then the caller reads the running
 * loss (which waits for the device, so it is read only when shown) and calls progress_draw. */
bool progress_due(const progress *p, int64_t done);
void progress_draw(progress *p, int64_t done, int64_t samples, double loss);
/* Clears the bar (terminal) so that the epoch's summary line replaces it. */
void progress_end(progress *p);

#endif
