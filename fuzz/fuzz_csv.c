/* libFuzzer target for the csv parser (the work is in fuzz_common.h, shared with
 * tests/test_data_fuzz_corpus.c). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_csv_one(data, size);
    return 0;
}
