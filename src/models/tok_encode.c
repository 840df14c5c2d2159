/* em_tokenizer_encode: the steps of `tokenizers`' encode (TokenizerImpl::encode_single_sequence
 * and post_process), on buffers of this call only. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* Long texts repeat their words: above this size each distinct piece is merged once per call. */
#define TK_CACHE_FROM_BYTES 2048

typedef struct tk_ids_out {
    int32_t *v;
    size_t n, cap;
} tk_ids_out;

static em_status oom(void) { return em_error(EM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory"); }

static em_status push_ids(tk_ids_out *o, const int32_t *ids, size_t n) {
    if (n == 0) return EM_OK;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 64;
        while (cap < o->n + n) cap *= 2;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) return oom();
        o->v = v;
        o->cap = cap;
    }
    memcpy(o->v + o->n, ids, n * sizeof *ids);
    o->n += n;
    return EM_OK;
}

static em_status encode(const em_tokenizer *tok, const char *text, size_t len, unsigned flags, tk_ids_out *out) {
    bool special_as_text = flags & EM_TOKENIZE_SPECIAL_AS_TEXT;
    tk_buf clean = {0}, normalized = {0};
    tk_pieces raw = {0}, pieces = {0}, spare = {0};
    tk_work w = {.use_cache = len >= TK_CACHE_FROM_BYTES};
    em_status st = EM_OK;
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    if (!md) return oom();

    /* bytes that are not UTF-8 are read as U+FFFD, as bytes.decode("utf-8", "replace") does */
    const char *s = text;
    if (!em__utf8_valid(text, len, NULL)) {
        em__tk_put_lossy(&clean, text, len);
        if (clean.oom) st = oom();
        s = clean.s;
        len = clean.len;
    }
    /* 1. the added tokens that match the raw text (special tokens, as a rule) */
    if (st == EM_OK && tok->has_raw_trie)
        st = em__tk_split_added(tok, &tok->raw_trie, md, s, len, true, special_as_text, &raw);
    else if (st == EM_OK)
        st = em__tk_pieces_push(&raw, s, len, -1, true);   /* one text piece: the whole input */
    /* 2. normalize each text piece, then split out the added tokens of normalized text */
    for (size_t i = 0; i < raw.n && st == EM_OK; i++) {
        const tk_piece *pc = &raw.v[i];
        if (pc->token >= 0) {
            st = em__tk_pieces_push(&pieces, NULL, 0, pc->token, false);
            continue;
        }
        st = em__tk_normalize(tok, raw.text.s + pc->off, pc->len, &normalized);
        if (st == EM_OK && tok->has_norm_trie)
            st = em__tk_split_added(tok, &tok->norm_trie, md, normalized.s, normalized.len, pc->at_start,
                                    special_as_text, &pieces);
        else if (st == EM_OK)
            st = em__tk_pieces_push(&pieces, normalized.s, normalized.len, -1, pc->at_start);
    }
    /* 3. pre-tokenize; 4. the model on each piece */
    if (st == EM_OK) st = em__tk_pre_tokenize(tok, md, &pieces, &spare);
    if (st == EM_OK && (flags & EM_TOKENIZE_ADD_SPECIAL)) st = push_ids(out, tok->post_before, tok->n_post_before);
    for (size_t i = 0; i < pieces.n && st == EM_OK; i++) {
        const tk_piece *pc = &pieces.v[i];
        if (pc->token >= 0) st = push_ids(out, &pc->token, 1);
        else st = em__tk_bpe_encode(&tok->bpe, &w, pieces.text.s + pc->off, pc->len, &out->v, &out->n, &out->cap);
    }
    /* 5. the post-processor's special tokens */
    if (st == EM_OK && (flags & EM_TOKENIZE_ADD_SPECIAL)) st = push_ids(out, tok->post_after, tok->n_post_after);

    pcre2_match_data_free(md);
    em__tk_free(&clean);
    em__tk_free(&normalized);
    em__tk_pieces_free(&raw);
    em__tk_pieces_free(&pieces);
    em__tk_pieces_free(&spare);
    em__tk_work_free(&w);
    return st;
}

static em_status encode_checked(const em_tokenizer *tok, const char *text, size_t len, unsigned flags, void *ids,
                                size_t cap, size_t *n_ids, bool wide, const char *fn) {
    if (n_ids) *n_ids = 0;
    if (!tok) return em_error(EM_ERR_ARGUMENT, "%s: the tokenizer is NULL", fn);
    if (!text && len) return em_error(EM_ERR_ARGUMENT, "%s: text is NULL with a length of %zu", fn, len);
    if (!ids && cap) return em_error(EM_ERR_ARGUMENT, "%s: ids is NULL with room for %zu", fn, cap);
    if (!n_ids) return em_error(EM_ERR_ARGUMENT, "%s: n_ids is NULL", fn);
    if (flags & ~(unsigned)(EM_TOKENIZE_ADD_SPECIAL | EM_TOKENIZE_SPECIAL_AS_TEXT))
        return em_error(EM_ERR_ARGUMENT, "%s: unknown flags 0x%x", fn, flags);
    tk_ids_out out = {0};
    em_status st = encode(tok, text ? text : "", len, flags, &out);
    if (st == EM_OK) {
        *n_ids = out.n;
        if (ids || cap) {
            if (out.n > cap) {
                st = em_error(EM_ERR_ARGUMENT, "%s: the text encodes to %zu ids, the buffer has room for %zu", fn, out.n,
                              cap);
            } else if (wide) {
                for (size_t i = 0; i < out.n; i++) ((int64_t *)ids)[i] = out.v[i];
            } else if (out.n) {
                memcpy(ids, out.v, out.n * sizeof *out.v);
            }
        }
    }
    free(out.v);
    return st;
}

em_status em_tokenizer_encode(const em_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t *ids,
                              size_t cap, size_t *n_ids) {
    return encode_checked(tok, text, len, flags, ids, cap, n_ids, false, "em_tokenizer_encode");
}

em_status em_tokenizer_encode_i64(const em_tokenizer *tok, const char *text, size_t len, unsigned flags, int64_t *ids,
                                  size_t cap, size_t *n_ids) {
    return encode_checked(tok, text, len, flags, ids, cap, n_ids, true, "em_tokenizer_encode_i64");
}
