/* What a GPU's driver reports about it right now, as nvidia-smi shows it: utilization,
 * temperature, power, and memory as the driver counts it (every process's, not only
 * Ember's). Each field answers on its own: -1 (or "") where the driver, its management
 * library or the device cannot tell, so a caller prints "N/A" field by field.
 * The CUDA backend answers through NVML (loaded at run time); other devices answer -1. */
#ifndef EMBER_TELEMETRY_H
#define EMBER_TELEMETRY_H

#include <stdint.h>
#include <ember/export.h>
#include <ember/device.h>
#include <ember/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One GPU as the driver sees it (nvidia-smi's fields); -1 or "" where it cannot tell. */
typedef struct em_device_telemetry {
    int driver_index;            /* the driver's own number for the GPU (nvidia-smi's index), or -1 */
    em_device device;            /* the Ember device; index -1 when Ember cannot see it
                                    (hidden by CUDA_VISIBLE_DEVICES, say) */
    char name[256];              /* "" when unknown */
    int64_t memory_total, memory_used, memory_free; /* bytes */
    int utilization_gpu;         /* percent of the last sample period a kernel ran */
    int utilization_memory;      /* percent of the period memory was read or written */
    int temperature;             /* degrees C */
    double power_w, power_limit_w; /* drawn now, and the enforced limit */
    int compute_capability;      /* CUDA: major*10+minor */
} em_device_telemetry;

/* The driver's versions. */
typedef struct em_driver_info {
    char driver_version[80];     /* "550.54.15"; "" when unknown */
    int runtime_version;         /* the CUDA version the driver supports, 12040 for 12.4; 0 when unknown */
} em_driver_info;

/* One line naming the run-time libraries the backend of type t chose, and why (CUDA: "nvrtc
 * 12.8, cublas 12.9 (driver supports 12.4)"); "" when it has nothing to say. The string is
 * this thread's until its next call. */
EM_API const char *em_device_type_libraries(em_device_type t);

/* The telemetry of one Ember device (the CPU and OpenCL devices: name only, every other field
 * -1). EM_ERR_DEVICE if the device does not exist; EM_ERR_ARGUMENT for a NULL out. */
EM_API em_status em_device_telemetry_get(em_device d, em_device_telemetry *out);
/* Every GPU of type t that its driver reports, those Ember cannot see included, in the
 * driver's order: fills up to max entries and returns how many there are (may exceed max).
 * Returns -1, with *reason (if reason is not NULL) saying why, when the type has no such
 * source or it cannot be used ("libnvidia-ml.so.1 not found (looked in ...)"). info (may be
 * NULL) receives the driver's versions, zeroed when unknown. Records no error. */
EM_API int em_device_telemetry_list(em_device_type t, em_device_telemetry *out, int max, em_driver_info *info,
                             const char **reason);

#ifdef __cplusplus
}
#endif
#endif
