/* The ops each backend must support (tests/required_ops.txt). A decline of a listed op
 * fails the current case; any other decline is counted per (backend, op) and reported as
 * skipped by declines_report(), which main calls before test_summary(). */
#ifndef EMBER_REQUIRED_OPS_H
#define EMBER_REQUIRED_OPS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

#define REQUIRED_OPS_FILE "tests/required_ops.txt"

static char required__pairs[512][2][24]; /* backend, op */
static int required__n = -1;             /* -1: not read yet; -2: unreadable */

static void required__load(void) {
    if (required__n != -1) return;
    FILE *f = fopen(REQUIRED_OPS_FILE, "r");
    if (!f) {
        fprintf(stderr, "  cannot read %s (run from the source root): every op counts as required\n",
                REQUIRED_OPS_FILE);
        required__n = -2;
        return;
    }
    required__n = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *save = NULL, *backend = strtok_r(line, " \t\r\n", &save);
        for (char *op; backend && (op = strtok_r(NULL, " \t\r\n", &save));) {
            if (required__n >= 512) break;
            snprintf(required__pairs[required__n][0], 24, "%.23s", backend);
            snprintf(required__pairs[required__n][1], 24, "%.23s", op);
            required__n++;
        }
    }
    fclose(f);
}

static bool op_required(const char *backend, const char *op) {
    required__load();
    if (required__n == -2) return true; /* strict when the list is missing */
    for (int i = 0; i < required__n; i++)
        if (!strcmp(required__pairs[i][0], backend) && !strcmp(required__pairs[i][1], op)) return true;
    return false;
}

/* declines of ops off the list, per (backend, op), for declines_report() */
typedef struct declined__entry {
    char backend[24], op[24], first[200];
    int count;
} declined__entry;
static declined__entry declined__list[128];
static int declined__n;

/* `backend` declined `op` in the case described by ctx, saying why. When `required`, that is
 * a failure: the current case fails, and this returns true. */
static bool op_declined_as(const char *backend, const char *op, bool required, const char *ctx, const char *why) {
    if (required) {
        fprintf(stderr, "  %s: %s declined %s, which %s requires of it: %s\n", ctx, backend, op,
                REQUIRED_OPS_FILE, why ? why : "");
        test__checks_failed_in_case++;
        return true;
    }
    for (int i = 0; i < declined__n; i++)
        if (!strcmp(declined__list[i].backend, backend) && !strcmp(declined__list[i].op, op)) {
            declined__list[i].count++;
            return false;
        }
    if (declined__n < 128) {
        declined__entry *e = &declined__list[declined__n++];
        snprintf(e->backend, sizeof e->backend, "%.23s", backend);
        snprintf(e->op, sizeof e->op, "%.23s", op);
        snprintf(e->first, sizeof e->first, "%.100s: %.95s", ctx, why ? why : "");
        e->count = 1;
    }
    return false;
}

/* As op_declined_as, required when tests/required_ops.txt lists the op for the backend. */
static bool op_declined(const char *backend, const char *op, const char *ctx, const char *why) {
    return op_declined_as(backend, op, op_required(backend, op), ctx, why);
}

/* One skipped case per (backend, op) declined off the list. */
static void declines_report(void) {
    for (int i = 0; i < declined__n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.23s %.23s", declined__list[i].backend, declined__list[i].op);
        test_skip_case(name, "declined in %d case(s), not required by %s (first: %s)", declined__list[i].count,
                       REQUIRED_OPS_FILE, declined__list[i].first);
    }
    declined__n = 0;
}

#endif
