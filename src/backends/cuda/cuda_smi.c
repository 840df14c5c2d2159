/* NVML queries for `ember smi`. See cuda_smi.h. */
#include "cuda_smi.h"

#include <stdio.h>
#include <string.h>
#include "cuda_internal.h"

/* Which cuda:N is NVML's device h? Matched through the PCI bus id CUDA reports, because
 * CUDA orders devices fastest first (and CUDA_VISIBLE_DEVICES hides some) while NVML
 * orders them by bus. Never creates a context. */
static int cuda_index_of(const em_nvml_api *nv, em_nvml_device h) {
#ifdef EMBER_HAVE_CUDA_HEADERS
    if (em__cuda_backend.init() != EM_OK) return -1;
    int n = em__cuda_count();
    for (int i = 0; i < n; i++) {
        em_cuda_device *d = em__cuda_device(i);
        em_nvml_device other = NULL;
        if (d && d->pci_bus_id[0] &&
            nv->nvmlDeviceGetHandleByPciBusId_v2(d->pci_bus_id, &other) == EM_NVML_SUCCESS && other == h)
            return i;
    }
#else
    (void)nv;
    (void)h;
#endif
    return -1;
}

int em__cuda_smi_query(em_cuda_smi_gpu *out, int max, em_cuda_smi_system *sys, const char **reason) {
    const em_nvml_api *nv = em__cuda_nvml(reason);
    if (sys) memset(sys, 0, sizeof *sys);
    if (!nv) return -1;
    if (sys) {
        if (nv->nvmlSystemGetDriverVersion(sys->driver_version, sizeof sys->driver_version) != EM_NVML_SUCCESS)
            sys->driver_version[0] = '\0';
        if (!nv->nvmlSystemGetCudaDriverVersion_v2 ||
            nv->nvmlSystemGetCudaDriverVersion_v2(&sys->cuda_version) != EM_NVML_SUCCESS)
            sys->cuda_version = 0;
    }
    unsigned int count = 0;
    em_nvml_return r = nv->nvmlDeviceGetCount_v2(&count);
    if (r != EM_NVML_SUCCESS) {
        static char buf[160];
        snprintf(buf, sizeof buf, "nvmlDeviceGetCount failed: %s", nv->nvmlErrorString(r));
        if (reason) *reason = buf;
        return -1;
    }
    for (unsigned int i = 0; i < count && (int)i < max; i++) {
        em_cuda_smi_gpu *g = &out[i];
        memset(g, 0, sizeof *g);
        g->index = (int)i;
        g->mem_total = g->mem_used = g->mem_free = -1;
        g->util_gpu = g->util_mem = g->temperature = g->compute_capability = -1;
        g->power_w = g->power_limit_w = -1;
        em_nvml_device h = NULL;
        if (nv->nvmlDeviceGetHandleByIndex_v2(i, &h) != EM_NVML_SUCCESS) {
            snprintf(g->name, sizeof g->name, "(NVML cannot open GPU %u)", i);
            g->cuda_index = -1;
            continue;
        }
        if (nv->nvmlDeviceGetName(h, g->name, sizeof g->name) != EM_NVML_SUCCESS)
            snprintf(g->name, sizeof g->name, "NVIDIA GPU %u", i);
        em_nvml_memory_v2 m2 = {.version = EM_NVML_MEMORY_V2};
        em_nvml_memory m;
        if (nv->nvmlDeviceGetMemoryInfo_v2 && nv->nvmlDeviceGetMemoryInfo_v2(h, &m2) == EM_NVML_SUCCESS) {
            /* as nvidia-smi: used without the driver's reservation */
            g->mem_total = (int64_t)m2.total;
            g->mem_used = (int64_t)m2.used;
            g->mem_free = (int64_t)m2.free;
        } else if (nv->nvmlDeviceGetMemoryInfo(h, &m) == EM_NVML_SUCCESS) {
            g->mem_total = (int64_t)m.total;
            g->mem_used = (int64_t)m.used;
            g->mem_free = (int64_t)m.free;
        }
        em_nvml_utilization u;
        if (nv->nvmlDeviceGetUtilizationRates(h, &u) == EM_NVML_SUCCESS) {
            g->util_gpu = (int)u.gpu;
            g->util_mem = (int)u.memory;
        }
        unsigned int v = 0;
        em_nvml_temperature tv = {.version = EM_NVML_TEMPERATURE_V1, .sensor_type = EM_NVML_TEMPERATURE_GPU};
        if (nv->nvmlDeviceGetTemperatureV && nv->nvmlDeviceGetTemperatureV(h, &tv) == EM_NVML_SUCCESS)
            g->temperature = tv.temperature;
        else if (nv->nvmlDeviceGetTemperature &&
                 nv->nvmlDeviceGetTemperature(h, EM_NVML_TEMPERATURE_GPU, &v) == EM_NVML_SUCCESS)
            g->temperature = (int)v;
        if (nv->nvmlDeviceGetPowerUsage(h, &v) == EM_NVML_SUCCESS) g->power_w = v / 1000.0;
        if (nv->nvmlDeviceGetEnforcedPowerLimit(h, &v) == EM_NVML_SUCCESS) g->power_limit_w = v / 1000.0;
        int major = 0, minor = 0;
        if (nv->nvmlDeviceGetCudaComputeCapability(h, &major, &minor) == EM_NVML_SUCCESS)
            g->compute_capability = major * 10 + minor;
        g->cuda_index = cuda_index_of(nv, h);
    }
    return (int)count;
}
