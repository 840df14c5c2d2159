/* libFuzzer target: .npy files. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em__array a;
    em_status s = em__npy_parse("fuzz.npy", data, size, &a);
    if (s == EM_OK) {
        fuzz_check_array(&a);
        /* a parsed header must be reproducible by the writer */
        char hdr[1024];
        em__npy_header(a.dtype, a.ndim, a.shape, hdr, sizeof hdr);
        em_clear_error();
    }
    em__array_free(&a);
    fuzz_check_status(s);
    return 0;
}
