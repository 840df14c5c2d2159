/* Reading the memory history that em_memory_dump_history writes (include/ember/memory.h:
 * format "ember-memory-history", version 1): its rows, found by the names in "columns". */
#ifndef EMBER_TOOL_MEMORY_HISTORY_H
#define EMBER_TOOL_MEMORY_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mh_event {
    double t_ns;
    bool alloc;                /* false: a free */
    char device[24];
    int stream;
    uint64_t address;
    int64_t size;
    int64_t allocated, reserved; /* the device's bytes after the event */
    char tag[48];
} mh_event;

typedef struct mh_history {
    mh_event *events;
    size_t n;
    int64_t dropped;
} mh_history;

/* Parse text (the whole file) into h. false with the reason ("at byte N: expected ...") in
 * why; nothing to free then. */
bool mh_parse(const char *text, size_t len, mh_history *h, char *why, size_t why_size);
void mh_free(mh_history *h);

#endif
