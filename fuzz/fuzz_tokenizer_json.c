/* libFuzzer target: a tokenizer.json's text (fuzz_tokenizer_json_one in fuzz_tokenizer.h,
 * shared with tests/test_fuzz_corpus_more.c). */
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tokenizer_json_one(data, size);
    return 0;
}
