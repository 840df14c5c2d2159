/* Device telemetry (include/ember/telemetry.h) through the public calls: the CUDA backend's
 * slot answers from a fake NVML field by field; devices without a source answer -1. */
#include "test.h"

#include <stdint.h>
#include <stdio.h>

#ifdef EMBER_HAVE_CUDA_HEADERS
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_loader.h"

/* Two GPUs; handles are 1 and 2 (NVML index 0 is handle 1). */
static em_nvml_return ok(void) { return EM_NVML_SUCCESS; }
static const char *err_string(em_nvml_return r) { (void)r; return "fake"; }
static em_nvml_return driver(char *v, unsigned int n) { snprintf(v, n, "555.42.06"); return EM_NVML_SUCCESS; }
static em_nvml_return cuda_version(int *v) { *v = 12050; return EM_NVML_SUCCESS; }
static em_nvml_return count(unsigned int *n) { *n = 2; return EM_NVML_SUCCESS; }
static em_nvml_return by_index(unsigned int i, em_nvml_device *d) {
    *d = (em_nvml_device)(uintptr_t)(i + 1);
    return EM_NVML_SUCCESS;
}
static em_nvml_return name(em_nvml_device d, char *s, unsigned int n) {
    snprintf(s, n, "Fake H200 #%d", (int)(uintptr_t)d);
    return EM_NVML_SUCCESS;
}
static em_nvml_return memory(em_nvml_device d, em_nvml_memory *m) {
    m->total = (unsigned long long)141 << 30;
    m->used = (unsigned long long)(uintptr_t)d << 30;
    m->free = m->total - m->used;
    return EM_NVML_SUCCESS;
}
static em_nvml_return util(em_nvml_device d, em_nvml_utilization *u) {
    u->gpu = 90 + (unsigned)(uintptr_t)d;
    u->memory = 40;
    return EM_NVML_SUCCESS;
}
static em_nvml_return temp(em_nvml_device d, int sensor, unsigned int *t) {
    (void)sensor;
    *t = 60 + (unsigned)(uintptr_t)d;
    return EM_NVML_SUCCESS;
}
static em_nvml_return power(em_nvml_device d, unsigned int *mw) { (void)d; *mw = 512500; return EM_NVML_SUCCESS; }
static em_nvml_return unsupported(em_nvml_device d, unsigned int *mw) { (void)d; (void)mw; return 3; }
static em_nvml_return cc(em_nvml_device d, int *ma, int *mi) { (void)d; *ma = 9; *mi = 0; return EM_NVML_SUCCESS; }

static const em_nvml_api fake_nvml = {
    .nvmlInit_v2 = ok, .nvmlShutdown = ok, .nvmlErrorString = err_string,
    .nvmlSystemGetDriverVersion = driver, .nvmlSystemGetCudaDriverVersion_v2 = cuda_version,
    .nvmlDeviceGetCount_v2 = count, .nvmlDeviceGetHandleByIndex_v2 = by_index, .nvmlDeviceGetName = name,
    .nvmlDeviceGetMemoryInfo = memory, .nvmlDeviceGetUtilizationRates = util,
    .nvmlDeviceGetTemperature = temp, .nvmlDeviceGetPowerUsage = power,
    .nvmlDeviceGetEnforcedPowerLimit = unsupported, .nvmlDeviceGetCudaComputeCapability = cc};

/* NVML present, the CUDA driver absent: the GPUs are listed, none visible to Ember. */
static void use(bool with_nvml) {
    em__cuda_backend_reset();
    em_cuda_fake_libs libs = {.cu_reason = "no driver: libcuda.so.1 not found (fake)",
                              .nvml = with_nvml ? &fake_nvml : NULL,
                              .nvml_reason = "libnvidia-ml.so.1 not found (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static void test_cuda_list_field_by_field(void) {
    use(true);
    em_device_telemetry t[4];
    em_driver_info info;
    const char *reason = NULL;
    CHECK(em_device_telemetry_list(EM_CUDA, t, 4, &info, &reason) == 2);
    CHECK(!strcmp(info.driver_version, "555.42.06") && info.runtime_version == 12050);
    for (int i = 0; i < 2; i++) {
        CHECK(t[i].driver_index == i && t[i].device.type == EM_CUDA);
        CHECK(t[i].device.index == -1); /* no CUDA driver: Ember cannot use it */
        CHECK(t[i].memory_total == (int64_t)141 << 30 && t[i].memory_used == (int64_t)(i + 1) << 30);
        CHECK(t[i].memory_free == t[i].memory_total - t[i].memory_used);
        CHECK(t[i].utilization_gpu == 91 + i && t[i].utilization_memory == 40 && t[i].temperature == 61 + i);
        CHECK(t[i].power_w == 512.5 && t[i].power_limit_w == -1); /* unsupported: unknown, alone */
        CHECK(t[i].compute_capability == 90);
    }
    CHECK(!strcmp(t[1].name, "Fake H200 #2"));
    em_device_telemetry one[1];
    CHECK(em_device_telemetry_list(EM_CUDA, one, 1, NULL, NULL) == 2); /* how many there are */
    CHECK(one[0].driver_index == 0);
    CHECK(em_device_telemetry_list(EM_CUDA, NULL, 0, NULL, NULL) == 2); /* counting only */
    CHECK(!em_failed());
}

static void test_cuda_without_nvml(void) {
    use(false);
    em_device_telemetry t[2];
    em_driver_info info;
    const char *reason = NULL;
    CHECK(em_device_telemetry_list(EM_CUDA, t, 2, &info, &reason) == -1);
    CHECK(reason && strstr(reason, "libnvidia-ml.so.1 not found"));
    CHECK(!info.driver_version[0] && info.runtime_version == 0);
    CHECK(!em_failed()); /* unavailability is an answer, not an error */
}
#endif

static void test_devices_without_a_source(void) {
    em_device_telemetry t[2];
    em_driver_info info;
    const char *reason = NULL;
    CHECK(em_device_telemetry_list(EM_CPU, t, 2, &info, &reason) == -1 && reason != NULL);
    CHECK(em_device_telemetry_list(EM_OPENCL, t, 2, &info, NULL) == -1);
    CHECK(em_device_telemetry_list(EM_CUDA, NULL, 2, NULL, &reason) == -1); /* NULL out with room */
    em_device_telemetry cpu;
    CHECK_OK(em_device_telemetry_get(EM_DEVICE_CPU, &cpu));
    em_device_props props;
    CHECK_OK(em_device_get_props(EM_DEVICE_CPU, &props));
    CHECK(cpu.device.type == EM_CPU && cpu.device.index == 0 && !strcmp(cpu.name, props.name));
    CHECK(cpu.driver_index == -1 && cpu.memory_total == -1 && cpu.memory_used == -1 && cpu.memory_free == -1);
    CHECK(cpu.utilization_gpu == -1 && cpu.utilization_memory == -1 && cpu.temperature == -1);
    CHECK(cpu.power_w == -1 && cpu.power_limit_w == -1 && cpu.compute_capability == -1);
    CHECK(em_device_telemetry_get(EM_DEVICE_CPU, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "out is NULL");
    CHECK(em_device_telemetry_get(EM_DEVICE(EM_OPENCL, 99), &cpu) != EM_OK); /* no such device */
    CHECK(em_failed());
    em_clear_error();
}

/* em_device_type_libraries: a line where the backend has one to say, "" elsewhere, and an
 * invalid type is "" too (no error, no crash). On this machine CUDA has no driver, so its
 * backend is not available and `ember devices` does not ask. */
static void test_library_lines(void) {
    CHECK(!strcmp(em_device_type_libraries(EM_CPU), ""));
    CHECK(!strcmp(em_device_type_libraries(EM_MPS), ""));
    CHECK(!strcmp(em_device_type_libraries((em_device_type)99), ""));
    CHECK(!strcmp(em_device_type_libraries((em_device_type)-1), ""));
    CHECK(!em_failed());
}

int main(void) {
    RUN(test_devices_without_a_source);
    RUN(test_library_lines);
#ifdef EMBER_HAVE_CUDA_HEADERS
    RUN(test_cuda_list_field_by_field);
    RUN(test_cuda_without_nvml);
#else
    printf("skip test_cuda_list_field_by_field, test_cuda_without_nvml: built without CUDA headers\n");
#endif
    return test_summary();
}
