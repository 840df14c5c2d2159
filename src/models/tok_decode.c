/* Decoding, whole and token by token. `tokenizers` decodes a list of token strings through
 * its decoders one after the other (decode_chain), then joins what is left. Ember runs the
 * same chain on one token at a time: each decoder before the fuse (Replace, Strip,
 * Metaspace, ByteFallback) is a stage that passes tokens on, holding back only what it
 * cannot decide yet (ByteFallback: a run of <0xNN> tokens is valid UTF-8 or one U+FFFD per
 * byte, known when the run ends); the fuse (Fuse, ByteLevel, or the end of the chain) joins
 * them into bytes; those become text character by character, an incomplete UTF-8 sequence
 * waiting for its last bytes (ByteLevel's from_utf8_lossy); the Strip decoders after the
 * fuse work on that text, holding back the characters they might strip at its end. So the
 * pieces a stream gives are exactly the whole decode, and em_tokenizer_decode is a stream
 * run over all the ids. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

struct em_decode_stream {
    const em_tokenizer *tok;
    bool skip_special;
    pcre2_match_data *md;
    size_t *seen;          /* per stage before the fuse: tokens it has taken (Metaspace's first) */
    tk_buf *run;           /* per ByteFallback stage: the bytes of its run of <0xNN> tokens */
    size_t fused;          /* tokens joined (without a decoder: a space before all but the first) */
    tk_buf partial;        /* joined bytes that do not form a whole character yet */
    size_t *lead;          /* per Strip after the fuse: leading contents removed; SIZE_MAX: past them */
    size_t *held;          /* per Strip after the fuse: trailing contents held back */
    tk_buf out;            /* what the current call gives */
    em_status err;         /* a failure inside a stage (out of memory, a pattern that failed) */
};

static const char replacement_char[] = "\xEF\xBF\xBD";

static em_status oom(void) { return em_error(EM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory decoding"); }

/* ---- after the fuse: text ------------------------------------------------------------------------- */
static void text_push(em_decode_stream *d, size_t k, const char *s, size_t n);

/* A Strip decoder on the growing text: the first `start` contents go, the last `stop` wait. */
static void strip_push(em_decode_stream *d, size_t k, const char *s, size_t n) {
    const tk_dec *st = &d->tok->dec[k];
    size_t i = 0;
    while (d->lead[k] != SIZE_MAX && i < n) {
        if (d->lead[k] < st->start && n - i >= st->content_len && !memcmp(s + i, st->content, st->content_len)) {
            d->lead[k]++;
            i += st->content_len;
        } else {
            d->lead[k] = SIZE_MAX;
        }
    }
    if (st->stop == 0) {
        text_push(d, k + 1, s + i, n - i);
        return;
    }
    size_t from = i;   /* the text since the last held content */
    while (i < n) {
        if (n - i >= st->content_len && !memcmp(s + i, st->content, st->content_len)) {
            text_push(d, k + 1, s + from, i - from);
            i += st->content_len;
            from = i;
            if (++d->held[k] > st->stop) {   /* more than stop of them: the oldest cannot be at the end */
                d->held[k]--;
                text_push(d, k + 1, st->content, st->content_len);
            }
            continue;
        }
        /* another character: the held contents were not at the end */
        for (; d->held[k]; d->held[k]--) text_push(d, k + 1, st->content, st->content_len);
        size_t cl = 1;
        while (i + cl < n && ((unsigned char)s[i + cl] & 0xC0) == 0x80) cl++;
        i += cl;
    }
    text_push(d, k + 1, s + from, n - from);
}

static void text_push(em_decode_stream *d, size_t k, const char *s, size_t n) {
    if (n == 0) return;
    const em_tokenizer *tok = d->tok;
    while (k < tok->n_dec && tok->dec[k].kind != TK_DEC_STRIP) k++;   /* a Fuse after the fuse changes nothing */
    if (k >= tok->n_dec) {
        em__tk_put(&d->out, s, n);
        return;
    }
    strip_push(d, k, s, n);
}

/* Joined bytes: the whole characters go on as text; an invalid sequence as U+FFFD (one per
 * maximal invalid subpart, as from_utf8_lossy); an incomplete one at the end waits. */
static void bytes_push(em_decode_stream *d, const char *s, size_t n, bool last) {
    size_t first = d->tok->n_dec_tokens + 1;
    if (d->partial.len) {
        em__tk_put(&d->partial, s, n);
        if (d->partial.oom) return;
        s = d->partial.s;
        n = d->partial.len;
    }
    size_t i = 0, run = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t bad;
        bool incomplete;
        int k = em__utf8_char((const unsigned char *)s + i, n - i, &cp, &bad, &incomplete);
        if (k) {
            i += (size_t)k;
            continue;
        }
        if (incomplete && !last) break;
        text_push(d, first, s + run, i - run);
        text_push(d, first, replacement_char, 3);
        i += bad;
        run = i;
    }
    text_push(d, first, s + run, i - run);
    /* keep what waits for its last bytes (at most 3) */
    char rest[4];
    size_t left = n - i;
    memcpy(rest, s + i, left);
    d->partial.len = 0;
    if (left) em__tk_put(&d->partial, rest, left);
}

/* ---- the fuse -------------------------------------------------------------------------------------- */
/* GPT-2's byte-level alphabet backwards: a code point below 0x144 -> its byte, or -1. */
static short char_byte[0x144];
static pthread_once_t char_byte_once = PTHREAD_ONCE_INIT;

static void char_byte_init(void) {
    for (int c = 0; c < 0x144; c++) char_byte[c] = -1;
    unsigned n = 0;
    for (unsigned b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        char_byte[printable ? b : 0x100 + n++] = (short)b;
    }
}

static int byte_of_char(uint32_t cp) {
    pthread_once(&char_byte_once, char_byte_init);
    return cp < 0x144 ? char_byte[cp] : -1;
}

static void fuse_push(em_decode_stream *d, const char *t, size_t n) {
    const em_tokenizer *tok = d->tok;
    if (tok->no_decoder && d->fused) bytes_push(d, " ", 1, false);
    d->fused++;
    if (!tok->byte_level_fuse) {
        bytes_push(d, t, n, false);
        return;
    }
    /* ByteLevel: each character back to its byte; a token with any other character (an added
     * token such as "<|endoftext|>" is plain text) stays as it is */
    char small[256], *b = n <= sizeof small ? small : malloc(n);
    if (!b) {
        d->out.oom = true;
        return;
    }
    size_t m = 0;
    bool all = true;
    for (size_t i = 0; i < n && all;) {
        uint32_t cp;
        size_t bad;
        bool inc;
        int k = em__utf8_char((const unsigned char *)t + i, n - i, &cp, &bad, &inc);
        int byte = k > 0 ? byte_of_char(cp) : -1;
        if (byte < 0) all = false;
        else b[m++] = (char)byte;
        i += k > 0 ? (size_t)k : 1;
    }
    if (all) bytes_push(d, b, m, false);
    else bytes_push(d, t, n, false);
    if (b != small) free(b);
}

/* ---- before the fuse: tokens ------------------------------------------------------------------------ */
static void token_push(em_decode_stream *d, size_t k, const char *t, size_t n);

/* ByteFallback's test: "<0xHH>" (Rust's from_str_radix also takes "+H"). */
static int byte_token(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = t[k];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0 && !(k == 3 && c == '+')) return -1;
        if (h >= 0) v = v * 16 + h;
    }
    return v;
}

/* The end of a run of byte tokens: valid UTF-8 is one token, anything else one U+FFFD per byte. */
static void run_flush(em_decode_stream *d, size_t k) {
    tk_buf *r = &d->run[k];
    if (!r->len) return;
    size_t n = r->len;
    r->len = 0;   /* the stages after this one never touch this run */
    if (em__utf8_valid(r->s, n, NULL)) {
        token_push(d, k + 1, r->s, n);
    } else {
        for (size_t i = 0; i < n; i++) token_push(d, k + 1, replacement_char, 3);
    }
}

static void replace_push(em_decode_stream *d, size_t k, const char *t, size_t n) {
    const tk_dec *st = &d->tok->dec[k];
    tk_buf b = {0};
    tk_regex_iter it = {0};
    size_t a, e, prev = 0;
    int r;
    while ((r = em__tk_regex_next(&st->re, d->md, t, n, &it, &a, &e)) == 1) {
        em__tk_put(&b, t + prev, a - prev);
        em__tk_put(&b, st->text, st->text_len);
        prev = e;
    }
    em__tk_put(&b, t + prev, n - prev);
    if (r < 0) d->err = EM_ERR_NOT_SUPPORTED;   /* recorded by em__tk_regex_next */
    else if (b.oom) d->out.oom = true;
    else token_push(d, k + 1, b.s ? b.s : "", b.len);
    em__tk_free(&b);
}

static void token_push(em_decode_stream *d, size_t k, const char *t, size_t n) {
    const em_tokenizer *tok = d->tok;
    if (k >= tok->n_dec_tokens) {
        fuse_push(d, t, n);
        return;
    }
    const tk_dec *st = &tok->dec[k];
    size_t index = d->seen[k]++;
    switch (st->kind) {
    case TK_DEC_REPLACE: replace_push(d, k, t, n); return;
    case TK_DEC_BYTE_FALLBACK: {
        int byte = byte_token(t, n);
        if (byte >= 0) {
            char c = (char)byte;
            em__tk_put(&d->run[k], &c, 1);
            return;
        }
        run_flush(d, k);
        token_push(d, k + 1, t, n);
        return;
    }
    case TK_DEC_STRIP: {   /* each token: up to start contents at its beginning, stop at its end */
        size_t a = 0, e = n, cl = st->content_len;
        for (size_t c = 0; c < st->start && e - a >= cl && !memcmp(t + a, st->content, cl); c++) a += cl;
        for (size_t c = 0; c < st->stop && e - a >= cl && !memcmp(t + e - cl, st->content, cl); c++) e -= cl;
        token_push(d, k + 1, t + a, e - a);
        return;
    }
    case TK_DEC_METASPACE: {   /* the replacement is a space; in the first token, with a prepend scheme, nothing */
        bool drop = index == 0 && st->prepend != TK_PREPEND_NEVER;
        tk_buf b = {0};
        size_t from = 0;
        for (size_t i = 0; i + st->content_len <= n;) {
            if (!memcmp(t + i, st->content, st->content_len)) {
                em__tk_put(&b, t + from, i - from);
                if (!drop) em__tk_put(&b, " ", 1);
                i += st->content_len;
                from = i;
            } else {
                i++;
            }
        }
        em__tk_put(&b, t + from, n - from);
        if (b.oom) d->out.oom = true;
        else token_push(d, k + 1, b.s ? b.s : "", b.len);
        em__tk_free(&b);
        return;
    }
    case TK_DEC_FUSE: case TK_DEC_BYTE_LEVEL: break;   /* not before the fuse */
    }
}

/* ---- the stream ---------------------------------------------------------------------------------------- */
static void stream_reset(em_decode_stream *d) {
    const em_tokenizer *tok = d->tok;
    for (size_t k = 0; k < tok->n_dec; k++) {
        d->seen[k] = 0;
        d->run[k].len = 0;
        d->lead[k] = 0;
        d->held[k] = 0;
    }
    d->fused = 0;
    d->partial.len = 0;
    d->err = EM_OK;
}

static void stream_release(em_decode_stream *d) {
    if (d->run)
        for (size_t k = 0; k < d->tok->n_dec; k++) em__tk_free(&d->run[k]);
    free(d->seen);
    free(d->run);
    free(d->lead);
    free(d->held);
    em__tk_free(&d->partial);
    em__tk_free(&d->out);
    if (d->md) pcre2_match_data_free(d->md);
}

static em_status stream_init(em_decode_stream *d, const em_tokenizer *tok, unsigned flags, const char *fn) {
    memset(d, 0, sizeof *d);
    if (!tok) return em_error(EM_ERR_ARGUMENT, "%s: the tokenizer is NULL", fn);
    if (flags & ~(unsigned)EM_DECODE_SKIP_SPECIAL) return em_error(EM_ERR_ARGUMENT, "%s: unknown flags 0x%x", fn, flags);
    if (tok->decoder_error) return em_error(EM_ERR_NOT_SUPPORTED, "%s", tok->decoder_error);
    d->tok = tok;
    d->skip_special = flags & EM_DECODE_SKIP_SPECIAL;
    size_t n = tok->n_dec ? tok->n_dec : 1;
    d->seen = calloc(n, sizeof *d->seen);
    d->run = calloc(n, sizeof *d->run);
    d->lead = calloc(n, sizeof *d->lead);
    d->held = calloc(n, sizeof *d->held);
    d->md = pcre2_match_data_create(8, NULL);
    if (!d->seen || !d->run || !d->lead || !d->held || !d->md) {
        stream_release(d);
        return oom();
    }
    return EM_OK;
}

static em_status stream_step(em_decode_stream *d, int64_t id, const char *fn) {
    const em_tokenizer *tok = d->tok;
    if (id < 0 || id >= tok->n_ids)
        return em_error(EM_ERR_ARGUMENT, "%s: id %lld is out of the vocabulary (ids 0 to %d)", fn, (long long)id,
                        tok->n_ids - 1);
    size_t n;
    const char *t = em__tk_token_text(tok, (int32_t)id, &n);
    if (!t) return EM_OK;   /* an id no token has: left out, as tokenizers does */
    if (d->skip_special && em_tokenizer_is_special(tok, id)) return EM_OK;
    token_push(d, 0, t, n);
    if (d->err) return d->err;
    return d->out.oom ? oom() : EM_OK;
}

static em_status stream_finish(em_decode_stream *d) {
    const em_tokenizer *tok = d->tok;
    for (size_t k = 0; k < tok->n_dec_tokens; k++)
        if (tok->dec[k].kind == TK_DEC_BYTE_FALLBACK) run_flush(d, k);
    bytes_push(d, "", 0, true);
    em_status err = d->err;
    /* the contents each Strip held back are the end of the text: stripped */
    stream_reset(d);
    if (err) return err;
    return d->out.oom ? oom() : EM_OK;
}

em_decode_stream *em_decode_stream_new(const em_tokenizer *tok, unsigned flags) {
    em_decode_stream *d = malloc(sizeof *d);
    if (!d) {
        oom();
        return NULL;
    }
    if (stream_init(d, tok, flags, "em_decode_stream_new") != EM_OK) {
        free(d);
        return NULL;
    }
    return d;
}

static void give(em_decode_stream *d, const char **text, size_t *len) {
    if (d->out.s) d->out.s[d->out.len] = 0;   /* a step that added nothing still ends the text */
    if (text) *text = d->out.s ? d->out.s : "";
    if (len) *len = d->out.len;
}

em_status em_decode_stream_step(em_decode_stream *d, int64_t id, const char **text, size_t *len) {
    if (text) *text = "";
    if (len) *len = 0;
    if (!d) return em_error(EM_ERR_ARGUMENT, "em_decode_stream_step: the stream is NULL");
    d->out.len = 0;
    em_status st = stream_step(d, id, "em_decode_stream_step");
    if (st == EM_OK) give(d, text, len);
    return st;
}

em_status em_decode_stream_finish(em_decode_stream *d, const char **text, size_t *len) {
    if (text) *text = "";
    if (len) *len = 0;
    if (!d) return em_error(EM_ERR_ARGUMENT, "em_decode_stream_finish: the stream is NULL");
    d->out.len = 0;
    em_status st = stream_finish(d);
    if (st == EM_OK) give(d, text, len);
    return st;
}

void em_decode_stream_free(em_decode_stream *d) {
    if (!d) return;
    stream_release(d);
    free(d);
}

static em_status decode(const em_tokenizer *tok, const void *ids, size_t n, bool wide, unsigned flags, char *out,
                        size_t cap, size_t *len, const char *fn) {
    if (len) *len = 0;
    if (!len) return em_error(EM_ERR_ARGUMENT, "%s: len is NULL", fn);
    if (!ids && n) return em_error(EM_ERR_ARGUMENT, "%s: ids is NULL with %zu ids", fn, n);
    if (!out && cap) return em_error(EM_ERR_ARGUMENT, "%s: out is NULL with room for %zu bytes", fn, cap);
    em_decode_stream d;
    em_status st = stream_init(&d, tok, flags, fn);
    if (st != EM_OK) return st;
    for (size_t i = 0; i < n && st == EM_OK; i++)
        st = stream_step(&d, wide ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i], fn);
    if (st == EM_OK) st = stream_finish(&d);
    if (st == EM_OK) {
        *len = d.out.len;
        if (out || cap) {
            if (d.out.len >= cap)
                st = em_error(EM_ERR_ARGUMENT, "%s: the text takes %zu bytes and a NUL, the buffer has room for %zu", fn,
                              d.out.len, cap);
            else {
                if (d.out.len) memcpy(out, d.out.s, d.out.len);
                out[d.out.len] = 0;
            }
        }
    }
    stream_release(&d);
    return st;
}

em_status em_tokenizer_decode(const em_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char *out,
                              size_t cap, size_t *len) {
    return decode(tok, ids, n, false, flags, out, cap, len, "em_tokenizer_decode");
}

em_status em_tokenizer_decode_i64(const em_tokenizer *tok, const int64_t *ids, size_t n, unsigned flags, char *out,
                                  size_t cap, size_t *len) {
    return decode(tok, ids, n, true, flags, out, cap, len, "em_tokenizer_decode_i64");
}
