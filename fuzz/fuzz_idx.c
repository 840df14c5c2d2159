/* libFuzzer target for the idx parser (the work is in fuzz_common.h, shared with
 * tests/test_data_fuzz_corpus.c). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_idx_one(data, size);
    return 0;
}
