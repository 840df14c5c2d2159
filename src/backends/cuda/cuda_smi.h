/* What `ember smi` shows about NVIDIA GPUs, from NVML (nvidia-smi's own source of truth).
 * Works without CUDA headers and without a CUDA context: NVML needs neither. */
#ifndef EM_BACKENDS_CUDA_SMI_H
#define EM_BACKENDS_CUDA_SMI_H

#include <stdint.h>
#include <ember/telemetry.h>

typedef struct em_cuda_smi_gpu {
    int index;                 /* NVML's index, as nvidia-smi numbers GPUs */
    int cuda_index;            /* the same GPU as Ember's cuda:N, or -1 if not visible to CUDA */
    char name[96];
    int64_t mem_total, mem_used, mem_free; /* bytes; -1 when unknown */
    int util_gpu, util_mem;    /* percent; -1 when unknown */
    int temperature;           /* degrees C; -1 when unknown */
    double power_w, power_limit_w; /* watts; -1 when unknown */
    int compute_capability;    /* major*10+minor; -1 when unknown */
} em_cuda_smi_gpu;

typedef struct em_cuda_smi_system {
    char driver_version[80];   /* "550.54.15", or "" */
    int cuda_version;          /* the driver's CUDA version, 12040 for 12.4; 0 when unknown */
} em_cuda_smi_system;

/* Fill up to max GPUs; returns how many NVML reports (may exceed max), or -1 with *reason
 * ("libnvidia-ml.so.1 not found (looked in ...)") when NVML cannot be used. */
int em__cuda_smi_query(em_cuda_smi_gpu *out, int max, em_cuda_smi_system *sys, const char **reason);

/* The backend's telemetry slot: em__cuda_smi_query's answer as em_device_telemetry
 * (cuda_telemetry.c). */
int em__cuda_telemetry(em_device_telemetry *out, int max, em_driver_info *info, const char **reason);

#endif
