/* ember smi: nvidia-smi's summary and its --query-gpu CSV, for Ember's devices.
 *
 *   ember smi                      a table of every device: NVIDIA GPUs (from NVML),
 *                                  OpenCL devices (what OpenCL knows) and the CPU
 *   ember smi -L                   one line per device
 *   ember smi --query-gpu=name,memory.used,... --format=csv[,noheader][,nounits]
 *                                  nvidia-smi's CSV: headers "memory.used [MiB]", values
 *                                  "1234 MiB", "[N/A]" for what cannot be known
 *
 * --query-gpu answers for the NVIDIA GPUs, with nvidia-smi's indices, like nvidia-smi.
 * On a machine without NVIDIA GPUs it answers for the devices Ember has instead (OpenCL
 * devices, then the CPU) and exits 0, so scripts written for nvidia-smi still run; their
 * `index` is then the Ember device ("opencl:0", "cpu"), which EMBER_DEVICE accepts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>
#include "commands.h"
#include "options.h"

#define MAX_ROWS 64

typedef struct row {
    char device[32]; /* "cuda:0", "opencl:1", "cpu" */
    char index[32];  /* nvidia-smi's index for NVIDIA GPUs, else the Ember device */
    char name[256];
    char driver[128];
    int64_t mem_total, mem_used, mem_free;
    int util_gpu, util_mem, temperature, cc;
    double power_w, power_limit_w;
    bool nvidia;
} row;

static void unknown(row *r) {
    r->mem_total = r->mem_used = r->mem_free = -1;
    r->util_gpu = r->util_mem = r->temperature = r->cc = -1;
    r->power_w = r->power_limit_w = -1;
}

static int nvidia_rows(row *rows, int max, em_driver_info *sys, const char **reason) {
    em_device_telemetry gpus[MAX_ROWS];
    int n = em_device_telemetry_list(EM_CUDA, gpus, MAX_ROWS, sys, reason);
    if (n > MAX_ROWS) n = MAX_ROWS;
    int k = 0;
    for (int i = 0; i < n && k < max; i++, k++) {
        row *r = &rows[k];
        memset(r, 0, sizeof *r);
        const em_device_telemetry *g = &gpus[i];
        if (g->device.index >= 0) snprintf(r->device, sizeof r->device, "cuda:%d", g->device.index);
        else snprintf(r->device, sizeof r->device, "(not visible)");
        snprintf(r->index, sizeof r->index, "%d", g->driver_index);
        snprintf(r->name, sizeof r->name, "%s", g->name);
        snprintf(r->driver, sizeof r->driver, "%s", sys->driver_version);
        r->mem_total = g->memory_total; r->mem_used = g->memory_used; r->mem_free = g->memory_free;
        r->util_gpu = g->utilization_gpu; r->util_mem = g->utilization_memory; r->temperature = g->temperature;
        r->power_w = g->power_w; r->power_limit_w = g->power_limit_w;
        r->cc = g->compute_capability;
        r->nvidia = true;
    }
    return k;
}

/* Rows for the devices of one type, from em_device_get_props. */
static int ember_rows(em_device_type t, row *rows, int max) {
    int n = t == EM_CPU ? 1 : em_device_count(t), k = 0;
    for (int i = 0; i < n && k < max; i++) {
        em_device d = EM_DEVICE(t, i);
        em_device_props p;
        if (em_device_get_props(d, &p) != EM_OK) { em_clear_error(); continue; }
        row *r = &rows[k++];
        memset(r, 0, sizeof *r);
        unknown(r);
        snprintf(r->device, sizeof r->device, "%s", em_device_str(d).s);
        snprintf(r->index, sizeof r->index, "%s", r->device);
        snprintf(r->name, sizeof r->name, "%s", p.name);
        snprintf(r->driver, sizeof r->driver, "%s", p.driver);
        if (p.total_memory > 0) r->mem_total = p.total_memory;
        if (p.free_memory >= 0) r->mem_free = p.free_memory;
        if (p.total_memory > 0 && p.free_memory >= 0) r->mem_used = p.total_memory - p.free_memory;
        if (p.compute_capability > 0) r->cc = p.compute_capability;
    }
    return k;
}

/* ---- --query-gpu ---- */

typedef enum { F_NAME, F_INDEX, F_COUNT, F_DRIVER, F_MEM_TOTAL, F_MEM_USED, F_MEM_FREE, F_UTIL_GPU,
               F_UTIL_MEM, F_TEMP, F_POWER, F_POWER_LIMIT, F_CC } field_id;
static const struct { const char *name, *unit, *help; } fields[] = {
    [F_NAME] = {"name", NULL, "the device's name"},
    [F_INDEX] = {"index", NULL, "nvidia-smi's index of an NVIDIA GPU; the Ember device otherwise"},
    [F_COUNT] = {"count", NULL, "how many rows the query answers"},
    [F_DRIVER] = {"driver_version", NULL, "the driver's version"},
    [F_MEM_TOTAL] = {"memory.total", "MiB", "total memory"},
    [F_MEM_USED] = {"memory.used", "MiB", "memory in use by every process"},
    [F_MEM_FREE] = {"memory.free", "MiB", "memory free"},
    [F_UTIL_GPU] = {"utilization.gpu", "%", "percent of the last sample period a kernel ran"},
    [F_UTIL_MEM] = {"utilization.memory", "%", "percent of the period memory was read or written"},
    [F_TEMP] = {"temperature.gpu", NULL, "core temperature in degrees C"},
    [F_POWER] = {"power.draw", "W", "power drawn by the board"},
    [F_POWER_LIMIT] = {"power.limit", "W", "the enforced power limit"},
    [F_CC] = {"compute_cap", NULL, "CUDA compute capability"},
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

static void value(const row *r, field_id f, int count, bool units, char *out, size_t size) {
    const char *u = units && fields[f].unit ? fields[f].unit : NULL;
    int64_t mem = f == F_MEM_TOTAL ? r->mem_total : f == F_MEM_USED ? r->mem_used : r->mem_free;
    switch (f) {
    case F_NAME: snprintf(out, size, "%s", r->name); return;
    case F_INDEX: snprintf(out, size, "%s", r->index); return;
    case F_COUNT: snprintf(out, size, "%d", count); return;
    case F_DRIVER: snprintf(out, size, "%s", r->driver[0] ? r->driver : "[N/A]"); return;
    case F_MEM_TOTAL: case F_MEM_USED: case F_MEM_FREE:
        if (mem < 0) break;
        snprintf(out, size, "%lld%s%s", (long long)(mem >> 20), u ? " " : "", u ? u : "");
        return;
    case F_UTIL_GPU: case F_UTIL_MEM: {
        int v = f == F_UTIL_GPU ? r->util_gpu : r->util_mem;
        if (v < 0) break;
        snprintf(out, size, "%d%s%s", v, u ? " " : "", u ? u : "");
        return;
    }
    case F_TEMP:
        if (r->temperature < 0) break;
        snprintf(out, size, "%d", r->temperature);
        return;
    case F_POWER: case F_POWER_LIMIT: {
        double w = f == F_POWER ? r->power_w : r->power_limit_w;
        if (w < 0) break;
        snprintf(out, size, "%.2f%s%s", w, u ? " " : "", u ? u : "");
        return;
    }
    case F_CC:
        if (r->cc < 0) break;
        snprintf(out, size, "%d.%d", r->cc / 10, r->cc % 10);
        return;
    }
    snprintf(out, size, "[N/A]");
}

/* Which fields --query-gpu lists, in order (repeats allowed, as nvidia-smi allows them);
 * false after printing why. The whole list is read, however long. */
static bool parse_fields(const char *list, field_id **want, int *nwant) {
    char *buf = strdup(list);
    size_t cap = 1;
    for (const char *c = list; *c; c++) cap += *c == ',';
    *want = malloc(cap * sizeof **want);
    *nwant = 0;
    bool ok = buf && *want;
    if (!ok) fprintf(stderr, "ember smi: out of memory reading --query-gpu\n");
    char *save = NULL;
    for (char *t = ok ? strtok_r(buf, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        size_t n = strlen(t);
        while (n && t[n - 1] == ' ') t[--n] = '\0';
        int f = 0;
        while (f < NFIELDS && strcmp(fields[f].name, t)) f++;
        if (f == NFIELDS) {
            fprintf(stderr, "Field \"%s\" is not a valid field to query.\n\n"
                            "See 'ember smi --help-query-gpu' for the fields.\n", t);
            ok = false;
            break;
        }
        (*want)[(*nwant)++] = (field_id)f;
    }
    free(buf);
    if (ok && *nwant == 0) {
        fprintf(stderr, "ember smi: --query-gpu lists no fields\n");
        ok = false;
    }
    return ok;
}

static int query(const char *list, const char *format) {
    if (!format) {
        fprintf(stderr, "ember smi: --query-gpu needs --format=csv[,noheader][,nounits]\n");
        return 2;
    }
    bool csv = false, header = true, units = true;
    char *fmt = strdup(format);   /* the whole value: nothing cut */
    if (!fmt) {
        fprintf(stderr, "ember smi: out of memory reading --format\n");
        return 1;
    }
    char *save = NULL;
    for (char *t = strtok_r(fmt, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "csv")) csv = true;
        else if (!strcmp(t, "noheader")) header = false;
        else if (!strcmp(t, "nounits")) units = false;
        else {
            fprintf(stderr, "ember smi: unknown --format option \"%s\" (csv, noheader, nounits)\n", t);
            free(fmt);
            return 2;
        }
    }
    free(fmt);
    if (!csv) { fprintf(stderr, "ember smi: --format must include csv\n"); return 2; }
    field_id *want;
    int nwant;
    if (!parse_fields(list, &want, &nwant)) {
        free(want);
        return 2;
    }

    row rows[MAX_ROWS];
    em_driver_info sys;
    const char *reason = NULL;
    int n = nvidia_rows(rows, MAX_ROWS, &sys, &reason);
    if (n <= 0) { /* no NVIDIA GPU: answer for the devices Ember has */
        n = ember_rows(EM_OPENCL, rows, MAX_ROWS);
        n += ember_rows(EM_CPU, rows + n, MAX_ROWS - n);
    }
    if (header)
        for (int i = 0; i < nwant; i++) {
            const char *unit = fields[want[i]].unit;
            printf("%s%s%s%s%s", i ? ", " : "", fields[want[i]].name, unit ? " [" : "",
                   unit ? unit : "", unit ? "]" : "");
            if (i == nwant - 1) printf("\n");
        }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < nwant; i++) {
            char v[300];
            value(&rows[r], want[i], n, units, v, sizeof v);
            printf("%s%s%s", i ? ", " : "", v, i == nwant - 1 ? "\n" : "");
        }
    free(want);
    return 0;
}

/* ---- the table ---- */

static void mem_cell(const row *r, char *out, size_t size) {
    char used[32] = "N/A", total[32] = "N/A";
    if (r->mem_used >= 0) snprintf(used, sizeof used, "%lldMiB", (long long)(r->mem_used >> 20));
    if (r->mem_total >= 0) snprintf(total, sizeof total, "%lldMiB", (long long)(r->mem_total >> 20));
    snprintf(out, size, "%9s / %-9s", used, total);
}

static void table(void) {
    row rows[MAX_ROWS];
    em_driver_info sys;
    const char *nvml_reason = NULL;
    int n = nvidia_rows(rows, MAX_ROWS, &sys, &nvml_reason);
    if (n < 0) n = 0;
    n += ember_rows(EM_OPENCL, rows + n, MAX_ROWS - n);
    n += ember_rows(EM_CPU, rows + n, MAX_ROWS - n);

    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%a %b %e %H:%M:%S %Y", localtime(&now));
    static const char *rule = "+------------------------------------------+-----------------------+------------------------+";
    char cuda[16] = "N/A";
    if (sys.runtime_version) snprintf(cuda, sizeof cuda, "%d.%d", sys.runtime_version / 1000, (sys.runtime_version % 1000) / 10);
    printf("%s\n%s\n", when, rule);
    char head[192];
    snprintf(head, sizeof head, "EMBER-SMI %d.%d.%d       Driver Version: %-16s CUDA Version: %s",
             EMBER_VERSION_MAJOR, EMBER_VERSION_MINOR, EMBER_VERSION_PATCH,
             sys.driver_version[0] ? sys.driver_version : "N/A", cuda);
    printf("| %-89s |\n", head);
    printf("|------------------------------------------+-----------------------+------------------------|\n");
    printf("| Device        Name                       |          Memory-Usage | Util  Temp  Power      |\n");
    printf("|==========================================+=======================+========================|\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        char mem[48], util[16] = "N/A", temp[16] = "N/A", power[16] = "N/A";
        mem_cell(r, mem, sizeof mem);
        if (r->util_gpu >= 0) snprintf(util, sizeof util, "%d%%", r->util_gpu);
        if (r->temperature >= 0) snprintf(temp, sizeof temp, "%dC", r->temperature);
        if (r->power_w >= 0) snprintf(power, sizeof power, "%.0fW", r->power_w);
        printf("| %-13s %-26.26s | %21s | %4s  %4s  %-10s |\n", r->device, r->name, mem, util, temp, power);
    }
    printf("%s\n", rule);
    /* why some kinds of device are missing */
    const char *cuda_reason = em_device_unavailable_reason(EM_CUDA);
    if (cuda_reason) printf("cuda: %s\n", cuda_reason);
    else if (nvml_reason) printf("nvml: %s (memory use, utilization and temperature unknown)\n", nvml_reason);
    const char *ocl_reason = em_device_unavailable_reason(EM_OPENCL);
    if (ocl_reason) printf("opencl: %s\n", ocl_reason);
}

static void list_devices(void) {
    row rows[MAX_ROWS];
    em_driver_info sys;
    const char *reason = NULL;
    int n = nvidia_rows(rows, MAX_ROWS, &sys, &reason);
    if (n < 0) n = 0;
    for (int i = 0; i < n; i++) printf("GPU %s: %s (%s)\n", rows[i].index, rows[i].name, rows[i].device);
    int m = ember_rows(EM_OPENCL, rows, MAX_ROWS);
    m += ember_rows(EM_CPU, rows + m, MAX_ROWS - m);
    for (int i = 0; i < m; i++) printf("%s: %s\n", rows[i].device, rows[i].name);
}

enum { S_LIST, S_QUERY, S_FORMAT, S_FIELDS };
static const opt_spec smi_table[] = {
    [S_LIST] = {.name = "--list-gpus", .alias = "-L", .kind = OPT_FLAG, .help = "one line per device"},
    [S_QUERY] = OPTION_LIST("--query-gpu", "FIELD,...",
                            "nvidia-smi's CSV query: the fields of each device, in this order (repeats allowed; "
                            "ember smi --help-query-gpu lists them); needs --format"),
    [S_FORMAT] = OPTION_LIST("--format", "csv[,noheader][,nounits]",
                             "--query-gpu's output: csv, without the header line (noheader), without units in "
                             "the values (nounits)"),
    [S_FIELDS] = OPTION_FLAG("--help-query-gpu", "the fields --query-gpu knows, with their units"),
};
OPT_TABLE_FITS(smi_table);

const opt_command smi_options = {
    .name = "ember smi",
    .usage = "ember smi [-L] [--query-gpu=FIELD,... --format=csv[,noheader][,nounits]]\n"
             "ember smi --help-query-gpu",
    .about = "With no options: a table of every device (NVIDIA GPUs from NVML, OpenCL devices, the CPU). Without "
             "NVIDIA GPUs, --query-gpu answers for the OpenCL devices and the CPU (index is then the Ember device).",
    .options = smi_table,
    .count = OPT_COUNT(smi_table),
    .exit_status = "0 done; 2 bad arguments",
};

int cmd_smi(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&smi_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    if (opts.v[S_FIELDS].given) {
        for (int f = 0; f < NFIELDS; f++)
            printf("\"%s\"%s%s%s\n    %s\n", fields[f].name, fields[f].unit ? " [" : "",
                   fields[f].unit ? fields[f].unit : "", fields[f].unit ? "]" : "", fields[f].help);
        return 0;
    }
    const char *q = opts.v[S_QUERY].text, *format = opts.v[S_FORMAT].text;
    /* what one option would silently leave unused is a usage error */
    if (format && !q)
        return opt_usage_error(&smi_options, stderr, "--format formats --query-gpu's output: it needs --query-gpu");
    if (q && opts.v[S_LIST].given)
        return opt_usage_error(&smi_options, stderr, "%s and --query-gpu cannot go together: give one",
                               opts.v[S_LIST].as);
    if (q) return query(q, format);
    if (opts.v[S_LIST].given) list_devices();
    else table();
    return 0;
}
