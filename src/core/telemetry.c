/* Device telemetry (include/ember/telemetry.h): the backend's optional slot answers; a
 * device whose backend has none answers with its name and -1 everywhere else. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core_internal.h"
#include "../util/errors.h"

static void unknown(em_device_telemetry *t, em_device d) {
    memset(t, 0, sizeof *t);
    t->driver_index = -1;
    t->device = d;
    t->memory_total = t->memory_used = t->memory_free = -1;
    t->utilization_gpu = t->utilization_memory = t->temperature = t->compute_capability = -1;
    t->power_w = t->power_limit_w = -1;
}

int em_device_telemetry_list(em_device_type t, em_device_telemetry *out, int max, em_driver_info *info,
                             const char **reason) {
    if (info) memset(info, 0, sizeof *info);
    if (max < 0 || (max > 0 && !out)) {
        if (reason) *reason = "em_device_telemetry_list: out is NULL or max is negative";
        return -1;
    }
    const em_backend *be = em__backend_for(t);
    if (!be || !be->telemetry) {
        if (reason) *reason = "this kind of device reports no telemetry";
        return -1;
    }
    return be->telemetry(out, max, info, reason);
}

const char *em_device_type_libraries(em_device_type t) {
    static _Thread_local char line[1400];
    const em_backend *be = em__backend_for(t);
    line[0] = '\0';
    if (be && be->libraries) be->libraries(line, sizeof line);
    return line;
}

em_status em_device_telemetry_get(em_device d, em_device_telemetry *out) {
    if (!out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_device_telemetry_get: out is NULL");
    em_device_props props;
    em_status st = em_device_get_props(d, &props);
    if (st != EM_OK) return st;
    d = em_device_resolve(d);
    unknown(out, d);
    snprintf(out->name, sizeof out->name, "%s", props.name);
    int n = em_device_telemetry_list(d.type, NULL, 0, NULL, NULL);
    if (n <= 0) return EM_OK;
    em_device_telemetry *all = malloc(sizeof *all * (size_t)n);
    if (!all) return em_error(EM_ERR_OUT_OF_MEMORY, "em_device_telemetry_get: out of host memory");
    int got = em_device_telemetry_list(d.type, all, n, NULL, NULL);
    for (int i = 0; i < got && i < n; i++)
        if (all[i].device.index == d.index) {
            *out = all[i];
            break;
        }
    free(all);
    return EM_OK;
}
