/* ember memory-timeline: draws a memory history (em_memory_dump_history's JSON) as a picture:
 * one device's allocated memory over time, stacked by tag, and its reserved memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "commands.h"
#include "memory_history.h"
#include "options.h"
#include "plot.h"
#include "text_io.h"

static const char *const tool = "ember memory-timeline";

enum { M_OUTPUT, M_DEVICE, M_TOP };
static const opt_spec timeline_table[] = {
    [M_OUTPUT] = {.name = "--output", .alias = "-o", .kind = OPT_STRING, .metavar = "PATH",
                  .help = "the picture to write: .svg or .png (required)"},
    [M_DEVICE] = OPTION_STRING("--device", "D", "the device whose events to draw, as the file names it (cpu, "
                                                "cuda:0, ...; default: the one with the most events)"),
    [M_TOP] = OPTION_INT("--top", "N", 1, PLOT_MEMORY_MAX_TAGS,
                         "how many tags get a band of their own, those with the highest peaks (default 4)"),
};
OPT_TABLE_FITS(timeline_table);

const opt_command memory_timeline_options = {
    .name = "ember memory-timeline",
    .usage = "ember memory-timeline FILE.json -o OUT.svg|OUT.png [options]",
    .about = "Draws a memory history, the JSON that em_memory_dump_history writes after em_memory_record_history "
             "(torch.cuda.memory._record_memory_history's counterpart): a device's allocated memory over time, "
             "stacked by tag (the tags with the highest peaks; a free counts against the tag its block was "
             "allocated with), the device's total allocated memory, and its reserved memory.",
    .positional = "FILE",
    .positional_help = "the history (- for standard input)",
    .extra = "one FILE",
    .options = timeline_table,
    .count = OPT_COUNT(timeline_table),
    .epilogue = "Allocations are tagged with em_memory_set_tag, and nn's layers tag theirs with their name where "
                "the program set no tag. Memory allocated before the recording began, and the tags past --top, "
                "are in the band between the stacked tags and the total.",
    .exit_status = "0 done; 1 the file cannot be read or is not a memory history, or the picture cannot be "
                   "written; 2 bad arguments",
};

/* The device with the most events. */
static const char *busiest(const mh_history *h) {
    const char *best = NULL;
    size_t best_n = 0;
    for (size_t i = 0; i < h->n; i++) {
        const char *d = h->events[i].device;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(h->events[j].device, d);
        if (seen) continue;
        size_t n = 0;
        for (size_t j = i; j < h->n; j++) n += !strcmp(h->events[j].device, d);
        if (n > best_n) best = d, best_n = n;
        if (n == h->n) break;   /* one device: no more counting */
    }
    return best;
}

int cmd_memory_timeline(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&memory_timeline_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    if (opts.nargs != 1)
        return opt_usage_error(&memory_timeline_options, stderr, "expected one FILE, got %d arguments", opts.nargs);
    if (!v[M_OUTPUT].given) return opt_usage_error(&memory_timeline_options, stderr, "-o/--output PATH is required");
    const char *out = v[M_OUTPUT].text;
    if (!plot_check_output(stderr, tool, "--output", out)) return 2;
    size_t len;
    char *text = tool_read_all(tool, opts.args[0], &len);
    if (!text) return 1;
    mh_history h;
    char why[512];
    bool parsed = mh_parse(text, len, &h, why, sizeof why);
    free(text);
    if (!parsed) {
        fprintf(stderr, "%s: %s: %s\n", tool, opts.args[0], why);
        return 1;
    }
    const char *device = v[M_DEVICE].given ? v[M_DEVICE].text : busiest(&h);
    if (!device) {
        fprintf(stderr, "%s: %s: the history holds no event (was em_memory_record_history on while memory was "
                "allocated?)\n", tool, opts.args[0]);
        mh_free(&h);
        return 1;
    }
    char subtitle[240];
    snprintf(subtitle, sizeof subtitle, "%s: %zu events%s", opts.args[0], h.n,
             h.dropped ? " (the oldest were dropped: the ring was full)" : "");
    bool ok = plot_memory_timeline(&h, device, v[M_TOP].given ? (int)v[M_TOP].i : PLOT_MEMORY_MAX_TAGS, out, subtitle,
                                   why, sizeof why);
    mh_free(&h);
    if (!ok) {
        fprintf(stderr, "%s: %s\n", tool, why);
        return 1;
    }
    printf("wrote %s\n", out);
    return 0;
}
