/* `ember train --devices`: the device list and the DataParallel step (train_parallel.h). */
#include <stdio.h>
#include <string.h>
#include "train_parallel.h"

bool train_parse_devices(const char *tool, const char *v, em_device *devs, int *n) {
    *n = 0;
    size_t len = strlen(v);
    if (!len || v[0] == ',' || v[len - 1] == ',' || strstr(v, ",,")) {
        fprintf(stderr, "%s: --devices expects devices separated by commas (opencl:0,opencl:1), got '%s'\n", tool, v);
        return false;
    }
    const char *p = v;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        char one[64];
        if (k >= sizeof one) {
            fprintf(stderr, "%s: --devices: '%.*s' is not a device\n", tool, (int)k, p);
            return false;
        }
        memcpy(one, p, k);
        one[k] = '\0';
        em_device d;
        if (em_device_parse(one, &d) != EM_OK) {
            fprintf(stderr, "%s: --devices: %s\n", tool, em_last_error());
            em_clear_error();
            return false;
        }
        d = em_device_resolve(d);
        em_device_props props;
        if (em_device_get_props(d, &props) != EM_OK) {
            em_clear_error();
            const char *why = em_device_available(d.type) ? NULL : em_device_unavailable_reason(d.type);
            fprintf(stderr, "%s: --devices: %s does not exist here (%d %s device%s%s%s)\n", tool, one,
                    em_device_count(d.type), em_device_type_name(d.type), em_device_count(d.type) == 1 ? "" : "s",
                    why ? ": " : "", why ? why : "");
            return false;
        }
        for (int i = 0; i < *n; i++)
            if (em_device_equal(devs[i], d)) {
                fprintf(stderr, "%s: --devices: %s is listed twice: each device holds one replica\n", tool,
                        em_device_str(d).s);
                return false;
            }
        if (*n == TRAIN_MAX_DEVICES) {
            fprintf(stderr, "%s: --devices: more than %d devices\n", tool, TRAIN_MAX_DEVICES);
            return false;
        }
        devs[(*n)++] = d;
        p += k + (comma ? 1 : 0);
    }
    if (*n < 2) {
        fprintf(stderr, "%s: --devices expects two devices or more (for one, use --device %s)\n", tool, v);
        return false;
    }
    return true;
}

void train_devices_str(const em_device *devs, int n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? "," : "", em_device_str(devs[i]).s);
        if (w < 0) break;
        used += (size_t)w;
    }
}
