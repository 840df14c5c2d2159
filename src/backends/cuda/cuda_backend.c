/* Placeholder until the cuda backend lands: reports itself unavailable. */
#include "../backend.h"

static em_status cuda_init(void) { return EM_ERR_UNAVAILABLE; }
static const char *cuda_reason(void) { return "the cuda backend is not built yet"; }
static int cuda_count(void) { return 0; }

const em_backend em_cuda_backend = {
    .name = "cuda",
    .type = EM_CUDA,
    .init = cuda_init,
    .unavailable_reason = cuda_reason,
    .device_count = cuda_count,
};
