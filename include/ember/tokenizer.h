/* Tokenizers: text to token ids and back, read from a Hugging Face `tokenizer.json`.
 *
 * The ids are those of Hugging Face's `tokenizers` library for the same file (checked
 * against it: tests/test_tokenizer.c). Supported: BPE models, byte-level (GPT-2, Llama 3,
 * Qwen2) and SentencePiece-style with `▁` and byte fallback (Llama 2, Mistral); normalizers
 * Sequence, Prepend, Replace, Strip, ByteLevel and, where Ember was built with ICU,
 * NFC/NFD/NFKC/NFKD; pre-tokenizers Sequence, ByteLevel, Split, Metaspace, Digits and
 * WhitespaceSplit (split patterns are PCRE2 regular expressions with Unicode properties);
 * added and special tokens (split out of the text before the model runs); the
 * post-processors TemplateProcessing (its single-sequence template), ByteLevel, Roberta,
 * Bert and Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
 * Sequence. Another kind of component is an error when the file is loaded, naming it;
 * a decoder Ember cannot run leaves encoding usable and makes decoding the error.
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 are read as U+FFFD, one for each maximal
 * invalid subpart (as Python's bytes.decode("utf-8", "replace") and Rust's
 * String::from_utf8_lossy read them), so that such input gives what `tokenizers` gives
 * for that string.
 *
 * Errors follow Ember's model: a NULL or a status, and em_last_error() says what was
 * expected and what was found. A tokenizer is read-only once loaded: several threads may
 * encode and decode with one tokenizer at once; a decode stream belongs to one thread. */
#ifndef EMBER_TOKENIZER_H
#define EMBER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/error.h>
#include <ember/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded tokenizer (opaque): read-only once loaded. */
typedef struct em_tokenizer em_tokenizer;

/* Loads a tokenizer from a `tokenizer.json` file or from a model folder holding one. From a
 * folder, the special ids also come from `tokenizer_config.json` (bos_token, eos_token,
 * pad_token, unk_token) and `generation_config.json` (bos_token_id, eos_token_id (one id or
 * a list), pad_token_id; these win) when present. NULL and an error naming the file and
 * what is wrong in it otherwise. */
EM_API em_tokenizer *em_tokenizer_load(const char *path);
/* The same from the text of a tokenizer.json in memory (len bytes; name is used in
 * messages, NULL for "tokenizer.json"). No special ids beyond the file's own. */
EM_API em_tokenizer *em_tokenizer_from_json(const char *json, size_t len, const char *name);
/* Frees the tokenizer; NULL is ignored. Decode streams over it must be freed first. */
EM_API void em_tokenizer_free(em_tokenizer *tok);

/* Flags of em_tokenizer_encode. */
enum {
    /* add the special tokens of the file's post-processor (a BOS, <s> ... </s>), as
     * tokenizers' add_special_tokens=True */
    EM_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* read special tokens in the text as plain text (tokenizers' encode_special_tokens):
     * for text from users, who should not be able to write an end-of-sequence */
    EM_TOKENIZE_SPECIAL_AS_TEXT = 1u << 1,
};

/* Encodes text[0..len) into ids[0..cap). *n_ids receives the number of ids the text encodes
 * to. ids == NULL with cap == 0 only counts. When cap is smaller than that number, nothing is
 * written past cap and the call answers EM_ERR_ARGUMENT, saying how many are needed. */
EM_API em_status em_tokenizer_encode(const em_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t *ids, size_t cap, size_t *n_ids);
/* The same with int64 ids (Ember's index dtype: em_tensor_from_data(..., EM_INT64, ...)). */
EM_API em_status em_tokenizer_encode_i64(const em_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                         int64_t *ids, size_t cap, size_t *n_ids);

/* Flags of em_tokenizer_decode and em_decode_stream_new. */
enum {
    EM_DECODE_SKIP_SPECIAL = 1u << 0, /* leave special tokens out (skip_special_tokens=True) */
};

/* Decodes ids[0..n) into text, as tokenizers' decode: out[0..cap) receives the text and a
 * terminating NUL; *len the text's length in bytes (without the NUL). out == NULL with cap == 0
 * only measures; a cap of *len or less is EM_ERR_ARGUMENT with nothing written past cap.
 * An id outside [0, em_tokenizer_vocab_size) is EM_ERR_ARGUMENT. */
EM_API em_status em_tokenizer_decode(const em_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                     char *out, size_t cap, size_t *len);
/* The same with int64 ids. */
EM_API em_status em_tokenizer_decode_i64(const em_tokenizer *tok, const int64_t *ids, size_t n, unsigned flags,
                                         char *out, size_t cap, size_t *len);

/* Decoding token by token, for printing a generation as it comes: each step gives the text
 * that the new id adds, never a broken UTF-8 sequence; what cannot be printed yet (the
 * first bytes of a character split over tokens, a run of byte-fallback tokens) is held
 * back until it can. The pieces of all steps and of the finish, put together, are exactly
 * em_tokenizer_decode of all the ids. */
typedef struct em_decode_stream em_decode_stream;
/* A stream over tok (which must outlive it), flags as em_tokenizer_decode's; NULL and an error
 * when the tokenizer's decoder is one Ember does not run. */
EM_API em_decode_stream *em_decode_stream_new(const em_tokenizer *tok, unsigned flags);
/* Adds one id. *text (valid until the stream's next call) and *len receive the new text,
 * often empty. On error (an id out of range) the stream is unchanged. */
EM_API em_status em_decode_stream_step(em_decode_stream *s, int64_t id, const char **text, size_t *len);
/* Ends the sequence: what was held back, completed or as U+FFFD. The stream starts over. */
EM_API em_status em_decode_stream_finish(em_decode_stream *s, const char **text, size_t *len);
/* Frees the stream; NULL is ignored. */
EM_API void em_decode_stream_free(em_decode_stream *s);

/* One past the largest id: ids are in [0, vocab_size) (there may be holes). */
EM_API int64_t em_tokenizer_vocab_size(const em_tokenizer *tok);
/* The id of a token as the vocabulary spells it (byte-level vocabularies write a space as
 * "Ġ"), added tokens included; -1 when there is none (no error is recorded). */
EM_API int64_t em_tokenizer_token_to_id(const em_tokenizer *tok, const char *token, size_t len);
/* The token of an id, NUL-terminated, owned by the tokenizer; *len (may be NULL) its length.
 * NULL and EM_ERR_ARGUMENT when the id is out of range or a hole. */
EM_API const char *em_tokenizer_id_to_token(const em_tokenizer *tok, int64_t id, size_t *len);
/* Whether id is an added token marked special. */
EM_API bool em_tokenizer_is_special(const em_tokenizer *tok, int64_t id);

/* The special tokens em_tokenizer_special_id answers for. */
typedef enum em_special_token {
    EM_TOKEN_BOS, /* beginning of sequence */
    EM_TOKEN_EOS, /* end of sequence: the first of em_tokenizer_eos_ids */
    EM_TOKEN_PAD,
    EM_TOKEN_UNK, /* the model's unknown token */
} em_special_token;
/* A special id from the folder's configs (see em_tokenizer_load), else, for BOS and EOS, from
 * the file's template; -1 when there is none (no error recorded). */
EM_API int64_t em_tokenizer_special_id(const em_tokenizer *tok, em_special_token which);
/* Every end-of-sequence id (generation_config.json may list several: Llama 3's <|eot_id|>
 * and <|end_of_text|>): writes up to cap of them to ids, returns how many there are. */
EM_API size_t em_tokenizer_eos_ids(const em_tokenizer *tok, int64_t *ids, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
