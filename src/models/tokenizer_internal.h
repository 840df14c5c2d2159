/* The inside of em_tokenizer (include/ember/tokenizer.h), shared by src/models/tok_*.c.
 *
 * A tokenizer.json is read once (tokenizer.c) into flat tables: the model's vocabulary as a
 * hash of strings, the merges as a hash of id pairs, the added tokens as byte tries, and
 * each pipeline stage (normalizers, pre-tokenizers, post-processor, decoder) as an array of
 * plain descriptions with their regular expressions compiled. Encoding (tok_encode.c) and
 * decoding (tok_decode.c) only read these, so one tokenizer serves many threads; every
 * buffer an encode needs is its own. The steps are those of Hugging Face's `tokenizers`, in
 * its order: split out the added tokens that match the raw text, normalize each remaining
 * part, split out the added tokens that match normalized text, pre-tokenize, run the model
 * on each piece, then the post-processor's special tokens. */
#ifndef EM_MODELS_TOKENIZER_INTERNAL_H
#define EM_MODELS_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/tokenizer.h>
#include "../util/utf8.h" /* em__utf8_valid */

/* The most ids a tokenizer may have (the largest vocabularies in use hold about 260k). */
#define TK_MAX_IDS (1 << 24)

/* ---- UTF-8 (tok_text.c) ---------------------------------------------------------------------- */
/* How the bytes at s[0..n) begin, by the Unicode standard's well-formed sequences: returns the
 * length of the character there (1-4) and its code point in *cp; or 0 when they are not a
 * character: *bad then says how many bytes form the maximal invalid subpart (1-3) and
 * *incomplete whether that subpart runs to the end of s (more bytes could complete it). */
int em__utf8_char(const unsigned char *s, size_t n, uint32_t *cp, size_t *bad, bool *incomplete);
/* Appends the UTF-8 of cp (at most 4 bytes) to out; returns the count. */
int em__utf8_put(uint32_t cp, char *out);
/* Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s answer). */
bool em__is_white_space(uint32_t cp);

/* A growing byte buffer (encode's and decode's scratch). */
typedef struct tk_buf {
    char *s;
    size_t len, cap;
    bool oom;
} tk_buf;
/* Appends s[0..n), or n zero bytes when s is NULL (room to fill); keeps a NUL after the text.
 * A failed allocation sets oom and later appends do nothing. */
void em__tk_put(tk_buf *b, const void *s, size_t n);
void em__tk_free(tk_buf *b);
/* Appends s[0..n) with each maximal invalid UTF-8 subpart replaced by U+FFFD. */
void em__tk_put_lossy(tk_buf *b, const char *s, size_t n);

/* ---- regular expressions (PCRE2, tok_text.c) ------------------------------------------------ */
typedef struct tk_regex {
    pcre2_code *code;
    bool jit;
} tk_regex;
/* Compiles a tokenizer.json pattern (Oniguruma syntax, as `tokenizers` runs it) with UTF and
 * Unicode properties. \s \S \w \W are rewritten to the Unicode properties Oniguruma gives them
 * (\s: White_Space; \w: letters, marks, numbers, connector punctuation), which PCRE2's own
 * differ from. literal: the pattern is plain text. where: for messages. */
em_status em__tk_regex_compile(tk_regex *re, const char *pattern, size_t len, bool literal, const char *where);
/* The same for a pattern in PCRE2's own syntax (Ember's, not a file's). */
em_status em__tk_regex_compile_pcre2(tk_regex *re, const char *pattern, const char *where);
void em__tk_regex_free(tk_regex *re);
/* The matches of re in s[0..n), one per call, as Oniguruma's find_iter gives them to
 * `tokenizers`: 1 with [*start, *end), 0 when there are no more, or -1 with an error recorded.
 * An empty match is given too, except right where the previous match ended; after one the
 * search goes on a character later. it starts zeroed; md is the caller's match data. */
typedef struct tk_regex_iter {
    size_t from;               /* where the next search starts (n + 1: done) */
    size_t last_end;           /* the end of the last match, when has_last */
    bool has_last;
} tk_regex_iter;
int em__tk_regex_next(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, tk_regex_iter *it,
                      size_t *start, size_t *end);
/* Whether the character at s[at..n) matches re (anchored there). */
bool em__tk_regex_at(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, size_t at);

/* ---- the model: BPE (tok_bpe.c) ------------------------------------------------------------- */
/* A string -> id hash over an arena of NUL-terminated strings. */
typedef struct tk_strmap {
    char *pool;
    size_t pool_len, pool_cap;
    uint32_t *off;       /* entry -> its string's offset in pool */
    uint32_t *len;       /* entry -> its length */
    int32_t *val;        /* entry -> value */
    size_t n, cap;
    uint32_t *slots;     /* hash slot -> entry + 1, 0 empty */
    size_t mask;
} tk_strmap;
em_status em__tk_strmap_init(tk_strmap *m, size_t expected, size_t pool_bytes);
/* Adds s -> val; a string already there keeps its first value (*added false). */
em_status em__tk_strmap_add(tk_strmap *m, const char *s, size_t n, int32_t val, bool *added, uint32_t *entry);
/* The value of s, or -1. */
int32_t em__tk_strmap_get(const tk_strmap *m, const char *s, size_t n);
void em__tk_strmap_free(tk_strmap *m);

typedef struct tk_bpe {
    tk_strmap vocab;           /* token -> id */
    /* the merges: (left id, right id) -> (rank, merged id), open addressing */
    uint64_t *merge_keys;      /* left << 32 | right, UINT64_MAX empty */
    int32_t *merge_rank, *merge_id;
    size_t merge_mask, n_merges;
    int32_t unk_id;            /* -1: no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;     /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256];     /* ids of <0x00>..<0xFF> for byte fallback (-1 missing) */
    int32_t *char_ids;         /* code point < 0x10000 -> the id of that one character, -1 (no prefix/suffix) */
} tk_bpe;

/* Scratch of one encode (each call has its own). */
typedef struct tk_work {
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_len;
    size_t sym_cap;
    uint64_t *heap;            /* rank << 32 | position */
    size_t heap_n, heap_cap;
    tk_buf key;
    /* the word cache: piece -> ids, within one call */
    uint32_t *cache_slots;     /* entry + 1 */
    size_t cache_mask, cache_n;
    tk_buf cache_text;         /* the pieces' bytes */
    struct tk_cache_entry { uint32_t text_off, text_len, ids_off, ids_len; uint64_t hash; } *cache;
    size_t cache_cap;
    int32_t *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
    bool use_cache;
} tk_work;
void em__tk_work_free(tk_work *w);

/* Appends the ids of one piece (a pre-token) to out. */
em_status em__tk_bpe_encode(const tk_bpe *m, tk_work *w, const char *s, size_t n, int32_t **out, size_t *n_out,
                            size_t *cap_out);
/* Adds the merges (pairs of token strings, in rank order) and builds the lookup tables. */
em_status em__tk_bpe_add_merge(tk_bpe *m, const char *a, size_t na, const char *b, size_t nb, int32_t rank,
                               const char *file, size_t index);
em_status em__tk_bpe_finish(tk_bpe *m, size_t n_merges_expected);
void em__tk_bpe_free(tk_bpe *m);

/* ---- added tokens ---------------------------------------------------------------------------- */
typedef struct tk_added {
    char *content;             /* as the file writes it (token_to_id's key) */
    size_t content_len;
    char *match;               /* what is searched for and what decoding starts from: content, or
                                * for a normalized token its normalized form, as `tokenizers` does */
    size_t match_len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
} tk_added;

/* A byte trie of token strings: leftmost-longest matching, as the Aho-Corasick automaton of
 * `tokenizers` finds them. */
typedef struct tk_trie_node {
    int32_t child, sibling;    /* first child, next sibling (-1 none) */
    int32_t token;             /* index in tk_tokenizer.added of the token ending here, -1 */
    unsigned char byte;
} tk_trie_node;
typedef struct tk_trie {
    tk_trie_node *v;
    size_t n, cap;
    int32_t root_child[256];   /* the root's children by byte */
} tk_trie;

/* ---- pipeline stages -------------------------------------------------------------------------- */
typedef enum tk_norm_kind {
    TK_NORM_PREPEND, TK_NORM_REPLACE, TK_NORM_STRIP, TK_NORM_BYTE_LEVEL,
    TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD,
} tk_norm_kind;
typedef struct tk_norm {
    tk_norm_kind kind;
    char *text;                /* PREPEND: the prefix; REPLACE: the content */
    size_t text_len;
    tk_regex re;               /* REPLACE */
    bool left, right;          /* STRIP */
} tk_norm;

typedef enum tk_split_behavior {
    TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_WITH_PREVIOUS, TK_SPLIT_MERGED_WITH_NEXT,
    TK_SPLIT_CONTIGUOUS,
} tk_split_behavior;
typedef enum tk_pre_kind { TK_PRE_BYTE_LEVEL, TK_PRE_SPLIT, TK_PRE_METASPACE } tk_pre_kind;
typedef enum tk_prepend { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER } tk_prepend;
typedef struct tk_pre {
    tk_pre_kind kind;
    tk_regex re;               /* SPLIT (Digits and WhitespaceSplit are splits too); BYTE_LEVEL with use_regex */
    bool has_re;
    tk_split_behavior behavior;
    bool invert;
    bool add_prefix_space;     /* BYTE_LEVEL */
    char replacement[5];       /* METASPACE: the replacement character's UTF-8 */
    size_t replacement_len;
    tk_prepend prepend;
    bool split;
} tk_pre;

typedef enum tk_dec_kind {
    TK_DEC_REPLACE, TK_DEC_BYTE_FALLBACK, TK_DEC_STRIP, TK_DEC_METASPACE, TK_DEC_FUSE, TK_DEC_BYTE_LEVEL,
} tk_dec_kind;
typedef struct tk_dec {
    tk_dec_kind kind;
    tk_regex re;               /* REPLACE */
    char *literal;             /* REPLACE with a plain-text pattern: the pattern (after the fuse) */
    size_t literal_len;
    char *text;                /* REPLACE: the content */
    size_t text_len;
    char content[5];           /* STRIP: the character; METASPACE: the replacement */
    size_t content_len;
    size_t start, stop;        /* STRIP */
    tk_prepend prepend;        /* METASPACE */
} tk_dec;

struct em_tokenizer {
    char *name;                /* the file, for messages */
    tk_bpe bpe;
    /* every id: its model token (off/len in bpe.vocab.pool; len UINT32_MAX: none) and its
     * added token (index in added, -1) */
    struct tk_id { uint32_t off, len; int32_t added; } *ids;
    int32_t n_ids;
    tk_added *added;
    size_t n_added;
    tk_trie raw_trie, norm_trie; /* added tokens matched in the raw / in normalized text */
    bool has_raw_trie, has_norm_trie;
    bool has_word_char;        /* some added token is single_word: word_char exists */
    tk_regex word_char;        /* one word character, as Rust's regex \w (single_word's test) */
    tk_norm *norm;
    size_t n_norm;
    tk_pre *pre;
    size_t n_pre;
    /* the post-processor, as the ids it puts before and after the sequence */
    int32_t *post_before, *post_after;
    size_t n_post_before, n_post_after;
    /* the decoder: stages before the fuse (each token), then those after it (the text);
     * no_decoder: tokens joined by spaces, as `tokenizers` does without one */
    tk_dec *dec;
    size_t n_dec, n_dec_tokens;   /* dec[0..n_dec_tokens) per token, the rest on the fused text */
    bool no_decoder;
    bool byte_level_fuse;      /* the fuse is a ByteLevel decoder: tokens become bytes */
    char *decoder_error;       /* why this decoder cannot run (decode answers it), or NULL */
    /* special ids */
    int64_t bos, pad, unk;
    int64_t *eos;
    size_t n_eos;
};

/* ---- tok_text.c: normalizers, pre-tokenizers, added tokens ------------------------------------ */
typedef struct tk_piece {
    size_t off, len;           /* the text, in the list's arena */
    int32_t token;             /* an added token's id, or -1: text for the model */
    bool at_start;             /* starts at the input's first byte (Metaspace "first") */
} tk_piece;
typedef struct tk_pieces {
    tk_piece *v;
    size_t n, cap;
    tk_buf text;
} tk_pieces;
void em__tk_pieces_free(tk_pieces *p);
/* Appends a piece: text s[0..n) (dropped when empty) or, with token >= 0, an added token. */
em_status em__tk_pieces_push(tk_pieces *p, const char *s, size_t n, int32_t token, bool at_start);

/* Normalizes s[0..n) into out (cleared first). */
em_status em__tk_normalize(const em_tokenizer *tok, const char *s, size_t n, tk_buf *out);
/* Splits the text s[0..n) on the added tokens of trie into pieces appended to out (empty
 * pieces dropped). at_start: s begins the input. special_as_text: special tokens are not
 * matched. */
em_status em__tk_split_added(const em_tokenizer *tok, const tk_trie *trie, pcre2_match_data *md, const char *s,
                             size_t n, bool at_start, bool special_as_text, tk_pieces *out);
/* Runs the pre-tokenizers over the text pieces of *p (token pieces pass through); *p is
 * replaced by the result, spare is scratch. */
em_status em__tk_pre_tokenize(const em_tokenizer *tok, pcre2_match_data *md, tk_pieces *p, tk_pieces *spare);
/* Builds a trie of the added tokens with normalized == want_normalized. */
em_status em__tk_trie_build(tk_trie *t, const tk_added *added, size_t n, bool want_normalized);
void em__tk_trie_free(tk_trie *t);
/* Frees what a stage owns. */
void em__tk_norm_free(tk_norm *n);
void em__tk_pre_free(tk_pre *p);
void em__tk_dec_free(tk_dec *d);

/* ---- tok_decode.c ------------------------------------------------------------------------------ */
/* The token string decode starts from for id (an added token's content, else the model's). */
const char *em__tk_token_text(const em_tokenizer *tok, int32_t id, size_t *len);

#endif
