/* Matmul through CLBlast (loaded with dlopen when present). Placeholder: always falls back. */
#include "opencl_internal.h"

em_status em__ocl_clblast_gemm(int dev, const em_gemm_args *g) {
    (void)dev;
    (void)g;
    return EM_ERR_NOT_SUPPORTED;
}

bool em__ocl_clblast_enabled(void) { return false; }
