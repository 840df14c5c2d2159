/* libFuzzer target: IDX files, raw and gzip-compressed. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em__array a;
    em_status s = em__idx_parse("fuzz.idx", data, size, &a);
    if (s == EM_OK) fuzz_check_array(&a);
    em__array_free(&a);
    fuzz_check_status(s);
    return 0;
}
