/* libFuzzer target: text through two fixed tokenizers, byte-level and SentencePiece-style
 * (fuzz_tokenizer_encode_one in fuzz_tokenizer.h, shared with tests/test_fuzz_corpus_more.c). */
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tokenizer_encode_one(data, size);
    return 0;
}
