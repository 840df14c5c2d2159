/* The tokenizer's checks (include/ember/tokenizer.h), shared by the libFuzzer targets
 * fuzz/fuzz_tokenizer_json.c (a tokenizer.json's text) and fuzz/fuzz_tokenizer_encode.c (text
 * to encode) and by tests/test_fuzz_corpus_more.c over their seed corpora. Include
 * fuzz_common.h first (FUZZ_FAIL). */
#ifndef EMBER_FUZZ_TOKENIZER_H
#define EMBER_FUZZ_TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>
#include <ember/tokenizer.h>
#include "fuzz_common.h"

/* Is s[0..n) valid UTF-8? (written apart from the library's own check) */
static inline bool fuzz_utf8_ok(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (need == 9 || (need && i + need >= n)) return false;
        for (size_t k = 1; k <= need; k++) {
            unsigned lo = 0x80, hi = 0xBF, b = u[i + k];
            if (k == 1 && c == 0xE0) lo = 0xA0;
            if (k == 1 && c == 0xED) hi = 0x9F;
            if (k == 1 && c == 0xF0) lo = 0x90;
            if (k == 1 && c == 0xF4) hi = 0x8F;
            if (b < lo || b > hi) return false;
        }
        i += need + 1;
    }
    return true;
}

/* Encode text with tok, then decode the ids whole and streamed: the ids are in range, the
 * text valid UTF-8, the stream's pieces valid one by one and together the whole decode.
 * Returns the decoded text (malloc'ed; NULL when encoding or decoding failed: that must have
 * been reported). */
static inline char *fuzz_tokenizer_roundtrip(const em_tokenizer *tok, const char *text, size_t n, unsigned flags,
                                             size_t *out_len) {
    size_t count = 0;
    em_status st = em_tokenizer_encode(tok, text, n, flags, NULL, 0, &count);
    if (st != EM_OK) {
        if (!em_failed() || !em_last_error()[0]) FUZZ_FAIL("encode failed without a message");
        em_clear_error();
        return NULL;
    }
    int32_t *ids = malloc((count + 1) * sizeof *ids);
    size_t again = 0;
    if (!ids || em_tokenizer_encode(tok, text, n, flags, ids, count, &again) != EM_OK || again != count) {
        FUZZ_FAIL("the second encode differs from the first");
        free(ids);
        em_clear_error();
        return NULL;
    }
    int64_t size = em_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= size) FUZZ_FAIL("an id out of the vocabulary");
    size_t len = 0;
    st = em_tokenizer_decode(tok, ids, count, 0, NULL, 0, &len);
    char *whole = st == EM_OK ? malloc(len + 1) : NULL;
    if (st == EM_OK && (!whole || em_tokenizer_decode(tok, ids, count, 0, whole, len + 1, &len) != EM_OK))
        FUZZ_FAIL("decode failed after measuring");
    if (st != EM_OK) {   /* a decoder Ember does not run: said so */
        if (em_last_status() != EM_ERR_NOT_SUPPORTED) FUZZ_FAIL("decode failed other than unsupported");
        em_clear_error();
        free(ids);
        return NULL;
    }
    if (whole && !fuzz_utf8_ok(whole, len)) FUZZ_FAIL("decode gave broken UTF-8");
    em_decode_stream *s = em_decode_stream_new(tok, 0);
    if (!s) FUZZ_FAIL("no stream where decode works");
    size_t at = 0;
    for (size_t i = 0; s && whole && i <= count; i++) {
        const char *piece;
        size_t pn;
        st = i < count ? em_decode_stream_step(s, ids[i], &piece, &pn) : em_decode_stream_finish(s, &piece, &pn);
        if (st != EM_OK) {
            FUZZ_FAIL("a stream step failed");
            em_clear_error();
            break;
        }
        if (!fuzz_utf8_ok(piece, pn)) FUZZ_FAIL("a stream step gave broken UTF-8");
        if (at + pn > len || memcmp(whole + at, piece, pn)) FUZZ_FAIL("the stream differs from the whole decode");
        at += pn;
    }
    if (s && whole && at != len) FUZZ_FAIL("the stream gave less than the whole decode");
    em_decode_stream_free(s);
    free(ids);
    *out_len = len;
    return whole;
}

/* A tokenizer.json's text: it loads, or fails with a message naming it; what loads encodes
 * and decodes a few texts, and looks its ids up. */
static inline void fuzz_tokenizer_json_one(const uint8_t *data, size_t size) {
    em_tokenizer *tok = em_tokenizer_from_json((const char *)data, size, "fuzz.json");
    if (!tok) {
        if (!em_failed() || !strstr(em_last_error(), "fuzz.json")) FUZZ_FAIL("a failed load without a message naming it");
        em_clear_error();
        return;
    }
    if (em_failed()) FUZZ_FAIL("a load that worked left an error");
    static const char *const texts[] = {"", "Hello world", "  a\tb\n\nc  ", "한국어 text 123 <s></s>",
                                        "x\xff\xfey \xf0\x9f\x99\x82"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        for (unsigned flags = 0; flags < 4; flags++) {
            size_t len;
            free(fuzz_tokenizer_roundtrip(tok, texts[k], strlen(texts[k]), flags, &len));
        }
    int64_t vocab = em_tokenizer_vocab_size(tok);
    for (int64_t id = 0; id < vocab && id < 4096; id++) {
        size_t n = 0;
        const char *t = em_tokenizer_id_to_token(tok, id, &n);
        if (!t) {
            em_clear_error();   /* a hole */
            continue;
        }
        fuzz_touch(t, n);
        if (em_tokenizer_token_to_id(tok, t, n) < -1) FUZZ_FAIL("token_to_id below -1");
    }
    for (int w = EM_TOKEN_BOS; w <= EM_TOKEN_UNK; w++) {
        int64_t id = em_tokenizer_special_id(tok, (em_special_token)w);
        if (id < -1 || id >= vocab) FUZZ_FAIL("a special id out of range");
    }
    em_tokenizer_free(tok);
}

/* ---- text: two fixed tokenizers ---- */
/* Byte-level: every byte has a token (GPT-2's alphabet) and a few merges; added tokens, one of
 * them special. decode(encode(x)) gives x back, as tokenizers' does, for any UTF-8 x. */
static inline char *fuzz_byte_level_json(void) {
    static const char head[] =
        "{\"added_tokens\": [{\"id\": 256, \"content\": \"<|end|>\", \"special\": true, \"normalized\": false},"
        " {\"id\": 257, \"content\": \"word\", \"special\": false, \"normalized\": false, \"single_word\": true}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
        " \"decoder\": {\"type\": \"ByteLevel\"},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\":"
        " 0}}, {\"SpecialToken\": {\"id\": \"<|end|>\", \"type_id\": 0}}], \"special_tokens\": {\"<|end|>\": {\"id\":"
        " \"<|end|>\", \"ids\": [256], \"tokens\": [\"<|end|>\"]}}},"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {";
    static const char tail[] =
        "\"\\u0120t\": 258, \"he\": 259, \"\\u0120the\": 260, \"\\u0120a\": 261, \"\\u00ec\\u0137\": 262},"
        " \"merges\": [[\"\\u0120\", \"t\"], [\"h\", \"e\"], [\"\\u0120t\", \"he\"], [\"\\u0120\", \"a\"],"
        " [\"\\u00ec\", \"\\u0137\"]]}}";
    char *s = malloc(sizeof head + sizeof tail + 256 * 24);
    if (!s) return NULL;
    size_t n = 0;
    memcpy(s, head, sizeof head - 1);
    n = sizeof head - 1;
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {   /* GPT-2's byte -> character table */
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        unsigned cp = printable ? b : 0x100 + extra++;
        if (cp == '"' || cp == '\\') n += (size_t)sprintf(s + n, "\"\\%c\": %u, ", (char)cp, b);
        else n += (size_t)sprintf(s + n, "\"\\u%04x\": %u, ", cp, b);
    }
    memcpy(s + n, tail, sizeof tail);
    return s;
}

/* SentencePiece-style: a Prepend/Replace normalizer, byte fallback, a BOS template. */
static const char fuzz_sentencepiece_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 9, \"content\": \"xyz\", \"special\": false, \"normalized\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\","
    "   \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\":"
    "   \"<s>\", \"ids\": [0], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"},"
    "   \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    "   {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"fuse_unk\": true, \"unk_token\": \"<unk>\", \"vocab\": {"
    "   \"<s>\": 0, \"<unk>\": 1, \"\\u2581\": 2, \"a\": 3, \"b\": 4, \"\\u2581a\": 5, \"ab\": 6, \"<0xC3>\": 7,"
    "   \"<0xA9>\": 8, \"<0xED>\": 10, \"<0x95>\": 11, \"<0x9C>\": 12, \"\\ud55c\": 13},"
    "   \"merges\": [[\"\\u2581\", \"a\"], [\"a\", \"b\"]]}}";

static inline em_tokenizer *fuzz_fixed_tokenizer(int which) {
    static em_tokenizer *toks[2];
    if (!toks[which]) {
        char *json = which == 0 ? fuzz_byte_level_json() : NULL;
        const char *text = which == 0 ? json : fuzz_sentencepiece_json;
        toks[which] = text ? em_tokenizer_from_json(text, strlen(text), which ? "sentencepiece" : "byte-level") : NULL;
        free(json);
        if (!toks[which]) {
            fprintf(stderr, "fuzz: the fixed tokenizer %d does not load: %s\n", which, em_last_error());
            FUZZ_FAIL("a fixed tokenizer does not load");
        }
    }
    return toks[which];
}

/* The first byte picks the tokenizer (bit 0) and the flags (bits 1-2); the rest is the text. */
static inline void fuzz_tokenizer_encode_one(const uint8_t *data, size_t size) {
    if (size < 1) return;
    int which = data[0] & 1;
    unsigned flags = (data[0] >> 1) & 3;
    em_tokenizer *tok = fuzz_fixed_tokenizer(which);
    if (!tok) return;
    const char *text = (const char *)data + 1;
    size_t n = size - 1, len = 0;
    char *back = fuzz_tokenizer_roundtrip(tok, text, n, flags, &len);
    if (!back) FUZZ_FAIL("a fixed tokenizer could not encode and decode");
    /* byte-level without the template's token: the text comes back, as tokenizers reads it */
    if (back && which == 0 && !(flags & EM_TOKENIZE_ADD_SPECIAL) && fuzz_utf8_ok(text, n) &&
        (len != n || memcmp(back, text, n)))
        FUZZ_FAIL("byte-level decode(encode(x)) != x");
    free(back);
}

#endif
