/* The report behind `ember devices`: first gathered into a plain struct, then rendered
 * as text or JSON. Gathering and rendering are apart so that tests can render made-up
 * devices (odd names, unknown memory) as well as this machine's. */
#ifndef EMBER_TOOL_DEVICES_REPORT_H
#define EMBER_TOOL_DEVICES_REPORT_H

#include <stdbool.h>
#include <stdio.h>
#include <ember/ember.h>

#define DEVREP_MAX_DEVICES 16 /* per type; more are counted but not described */

typedef struct devrep_device {
    em_device device;
    bool ok;              /* props were read; otherwise `error` says why */
    char error[256];
    em_device_props props;
} devrep_device;

typedef struct devrep_type {
    em_device_type type;
    bool available;
    char reason[512];     /* why it is not available ("" when it is) */
    int count;            /* em_device_count */
    int current;          /* the index "cuda" without an index means; -1 when unavailable */
    int ndevices;         /* entries in devices: min(count, DEVREP_MAX_DEVICES) */
    devrep_device devices[DEVREP_MAX_DEVICES];
} devrep_type;

typedef struct devrep_report {
    devrep_type types[EM_DEVICE_TYPE_COUNT];
    em_device auto_device;
    char auto_reason[512];
    bool env_set;         /* EMBER_DEVICE is set (and non-empty) */
    char env[128];
    char cpu_features[256]; /* em_cpu_features(); "" prints no features line */
    char cpu_bf16[192], cpu_f16[192]; /* em_cpu_matmul_impl: what runs bf16/f16 matmul */
} devrep_report;

/* Ask Ember about every device type and the auto-selection. Leaves no error pending. */
void devrep_gather(devrep_report *r);
/* Human-readable report; returns 0, or -1 if writing failed. */
int devrep_write_text(FILE *f, const devrep_report *r);
/* The same as one JSON object (strings escaped, invalid UTF-8 replaced); 0 or -1. */
int devrep_write_json(FILE *f, const devrep_report *r);

#endif
