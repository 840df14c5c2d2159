/* The CUDA backend's telemetry slot: NVML's view of every NVIDIA GPU (cuda_smi.c), in the
 * public em_device_telemetry form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_smi.h"

int em__cuda_telemetry(em_device_telemetry *out, int max, em_driver_info *info, const char **reason) {
    if (max < 0) max = 0;
    em_cuda_smi_gpu *gpus = max > 0 ? malloc(sizeof *gpus * (size_t)max) : NULL;
    if (max > 0 && !gpus) {
        if (reason) *reason = "out of host memory";
        return -1;
    }
    em_cuda_smi_system sys;
    int n = em__cuda_smi_query(gpus, max, &sys, reason);
    if (info) {
        memset(info, 0, sizeof *info);
        if (n >= 0) {
            snprintf(info->driver_version, sizeof info->driver_version, "%s", sys.driver_version);
            info->runtime_version = sys.cuda_version;
        }
    }
    for (int i = 0; i < n && i < max; i++) {
        const em_cuda_smi_gpu *g = &gpus[i];
        em_device_telemetry *t = &out[i];
        memset(t, 0, sizeof *t);
        t->driver_index = g->index;
        t->device = EM_DEVICE(EM_CUDA, g->cuda_index);
        snprintf(t->name, sizeof t->name, "%s", g->name);
        t->memory_total = g->mem_total;
        t->memory_used = g->mem_used;
        t->memory_free = g->mem_free;
        t->utilization_gpu = g->util_gpu;
        t->utilization_memory = g->util_mem;
        t->temperature = g->temperature;
        t->power_w = g->power_w;
        t->power_limit_w = g->power_limit_w;
        t->compute_capability = g->compute_capability;
    }
    free(gpus);
    return n;
}
