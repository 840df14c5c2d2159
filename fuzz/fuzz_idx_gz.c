/* libFuzzer target: the work is fuzz_idx_gz_one in fuzz_more.h, shared with
 * tests/test_fuzz_corpus_more.c. */
#include "fuzz_more.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_idx_gz_one(data, size);
    return 0;
}
