/* Placeholder until the opencl backend lands: reports itself unavailable. */
#include "../backend.h"

static em_status opencl_init(void) { return EM_ERR_UNAVAILABLE; }
static const char *opencl_reason(void) { return "the opencl backend is not built yet"; }
static int opencl_count(void) { return 0; }

const em_backend em_opencl_backend = {
    .name = "opencl",
    .type = EM_OPENCL,
    .init = opencl_init,
    .unavailable_reason = opencl_reason,
    .device_count = opencl_count,
};
