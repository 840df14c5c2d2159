/* libFuzzer target: chains of view ops, checked against their storage. The work is
 * fuzz_views_one in fuzz_views.h, shared with tests/test_fuzz_corpus_more.c. */
#include "fuzz_views.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_views_one(data, size);
    return 0;
}
