/* Tokenizers (include/ember/tokenizer.h) against Hugging Face's `tokenizers`: the goldens of
 * scripts/golden_tokenizer.py (tests/data/tokenizer/<name>/golden.txt) replayed for five
 * styles (GPT-2, Llama 3, Qwen2, Llama 2 / Mistral, SentencePiece with Metaspace): the ids of
 * every string with and without the template's special tokens and with special tokens read
 * as text; decoding, whole and token by token (every piece valid UTF-8, all of them together
 * the whole decode); decode(encode(x)) == x where tokenizers gives that back; the tokens of
 * ids. Then the model folder's special ids, the API's checks and bad tokenizer.json files. */
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include <ember/tokenizer.h>
#include "test.h"

static const char *data_dir(void) {
    const char *d = getenv("EMBER_TEST_DATA");
    return d ? d : "tests/data";
}

/* ---- golden records -------------------------------------------------------------------------- */
typedef struct bytes {
    char *s;
    size_t n;
} bytes;

typedef struct ids {
    int32_t *v;
    size_t n;
} ids;

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bytes parse_hex(const char *f) {
    bytes b = {calloc(strlen(f) / 2 + 1, 1), 0};
    if (!strcmp(f, "-")) return b;
    for (size_t i = 0; f[i] && f[i + 1]; i += 2) b.s[b.n++] = (char)(hexval(f[i]) * 16 + hexval(f[i + 1]));
    return b;
}

static ids parse_ids(const char *f) {
    ids r = {calloc(strlen(f) + 1, sizeof(int32_t)), 0};
    if (!strcmp(f, "-")) return r;
    for (const char *p = f; *p;) {
        char *end;
        r.v[r.n++] = (int32_t)strtol(p, &end, 10);
        p = *end ? end + 1 : end;
    }
    return r;
}

/* Splits line at tabs into at most max fields (the line is modified). */
static int fields(char *line, char **f, int max) {
    int n = 0;
    line[strcspn(line, "\r\n")] = 0;
    for (char *p = line; n < max;) {
        f[n++] = p;
        char *t = strchr(p, '\t');
        if (!t) break;
        *t = 0;
        p = t + 1;
    }
    return n;
}

/* Text as tokenizers reads bytes: each maximal invalid UTF-8 subpart a U+FFFD. Written here
 * apart from the library's own conversion. */
static bytes lossy(const bytes *in) {
    bytes o = {malloc(in->n * 3 + 1), 0};
    const unsigned char *s = (const unsigned char *)in->s;
    for (size_t i = 0; i < in->n;) {
        unsigned c = s[i];
        size_t need = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (need == 0) {
            o.s[o.n++] = (char)c;
            i++;
            continue;
        }
        size_t k = 1;
        if (need != 9)
            for (; k <= need && i + k < in->n; k++) {
                unsigned lo = 0x80, hi = 0xBF, b = s[i + k];
                if (k == 1 && c == 0xE0) lo = 0xA0;
                if (k == 1 && c == 0xED) hi = 0x9F;
                if (k == 1 && c == 0xF0) lo = 0x90;
                if (k == 1 && c == 0xF4) hi = 0x8F;
                if (b < lo || b > hi) break;
            }
        if (need != 9 && k == need + 1) {
            memcpy(o.s + o.n, s + i, k);
            o.n += k;
            i += k;
        } else {
            memcpy(o.s + o.n, "\xEF\xBF\xBD", 3);
            o.n += 3;
            i += need == 9 ? 1 : k;
        }
    }
    return o;
}

static bool utf8_ok(const char *s, size_t n) {
    bytes in = {(char *)s, n};
    bytes l = lossy(&in);
    bool same = l.n == n && !memcmp(l.s, s, n);
    free(l.s);
    return same;
}

/* ---- replay -------------------------------------------------------------------------------------- */
typedef struct replay {
    const char *name;
    em_tokenizer *tok;
    int mismatches;   /* printed in detail up to a few */
    int records;
} replay;

static void report(replay *r, int line, const char *what) {
    if (r->mismatches++ < 8) fprintf(stderr, "  %s golden.txt:%d: %s\n", r->name, line, what);
}

static bool same_ids(const int32_t *a, size_t na, const ids *b) {
    return na == b->n && (na == 0 || !memcmp(a, b->v, na * sizeof *a));
}

static void print_ids(const char *label, const int32_t *v, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static bool check_encode(replay *r, int line, const bytes *in, unsigned flags, const ids *want) {
    size_t n = 0;
    if (em_tokenizer_encode(r->tok, in->s, in->n, flags, NULL, 0, &n) != EM_OK) {
        report(r, line, em_last_error());
        em_clear_error();
        return false;
    }
    int32_t *got = malloc((n + 1) * sizeof *got);
    int64_t *wide = malloc((n + 1) * sizeof *wide);
    size_t n2 = 0, n3 = 0;
    bool ok = em_tokenizer_encode(r->tok, in->s, in->n, flags, got, n, &n2) == EM_OK &&
              em_tokenizer_encode_i64(r->tok, in->s, in->n, flags, wide, n, &n3) == EM_OK && n2 == n && n3 == n;
    if (!ok) {
        report(r, line, em_last_error());
        em_clear_error();
    } else if (!same_ids(got, n, want)) {
        char what[64];
        snprintf(what, sizeof what, "encode (flags %u) differs", flags);
        report(r, line, what);
        if (r->mismatches <= 8) {
            print_ids("ember", got, n);
            print_ids("tokenizers", want->v, want->n);
        }
        ok = false;
    } else {
        for (size_t i = 0; i < n; i++) ok &= wide[i] == got[i];
        if (!ok) report(r, line, "encode_i64 differs from encode");
    }
    free(got);
    free(wide);
    return ok;
}

/* Whole decode, and the stream: every step's text valid UTF-8, all of them the whole. */
static bool check_decode(replay *r, int line, const int32_t *v, size_t n, unsigned flags, const bytes *want) {
    size_t len = 0;
    if (em_tokenizer_decode(r->tok, v, n, flags, NULL, 0, &len) != EM_OK) {
        report(r, line, em_last_error());
        em_clear_error();
        return false;
    }
    char *out = malloc(len + 1);
    size_t len2 = 0;
    bool ok = em_tokenizer_decode(r->tok, v, n, flags, out, len + 1, &len2) == EM_OK && len2 == len;
    if (!ok) {
        report(r, line, em_last_error());
        em_clear_error();
    } else if (len != want->n || memcmp(out, want->s, len)) {
        char what[64];
        snprintf(what, sizeof what, "decode (flags %u) differs", flags);
        report(r, line, what);
        if (r->mismatches <= 8)
            fprintf(stderr, "    ember \"%.*s\"\n    tokenizers \"%.*s\"\n", (int)(len < 200 ? len : 200), out,
                    (int)(want->n < 200 ? want->n : 200), want->s);
        ok = false;
    }
    free(out);
    em_decode_stream *s = em_decode_stream_new(r->tok, flags);
    if (!s) {
        report(r, line, em_last_error());
        em_clear_error();
        return false;
    }
    char *joined = malloc(want->n + 64);
    size_t at = 0;
    bool stream_ok = true;
    for (size_t i = 0; i <= n && stream_ok; i++) {
        const char *piece;
        size_t pn;
        em_status st = i < n ? em_decode_stream_step(s, v[i], &piece, &pn) : em_decode_stream_finish(s, &piece, &pn);
        if (st != EM_OK || at + pn > want->n + 32 || !utf8_ok(piece, pn) || piece[pn] != 0) {
            stream_ok = false;
            report(r, line, st != EM_OK ? em_last_error() : "a stream step gave broken UTF-8 or too much text");
            em_clear_error();
            break;
        }
        memcpy(joined + at, piece, pn);
        at += pn;
    }
    if (stream_ok && (at != want->n || memcmp(joined, want->s, at))) {
        report(r, line, "the stream's pieces differ from the whole decode");
        stream_ok = false;
    }
    free(joined);
    em_decode_stream_free(s);
    return ok && stream_ok;
}

static void replay_file(replay *r) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/%s/golden.txt", data_dir(), r->name);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        char *fl[8];
        int nf = fields(line, fl, 8);
        if (!strcmp(fl[0], "vocab") && nf == 2) {
            CHECK(em_tokenizer_vocab_size(r->tok) == atoll(fl[1]));
        } else if (!strcmp(fl[0], "E") && nf == 7) {
            r->records++;
            bytes raw = parse_hex(fl[1]), text = lossy(&raw);
            ids with = parse_ids(fl[2]), plain = parse_ids(fl[3]);
            bytes dec = strcmp(fl[4], "=") ? parse_hex(fl[4]) : (bytes){NULL, 0};
            bytes dec_skip = strcmp(fl[5], "=") ? parse_hex(fl[5]) : (bytes){NULL, 0};
            check_encode(r, lineno, &raw, EM_TOKENIZE_ADD_SPECIAL, &with);
            check_encode(r, lineno, &raw, 0, &plain);
            check_decode(r, lineno, with.v, with.n, 0, dec.s ? &dec : &text);
            check_decode(r, lineno, with.v, with.n, EM_DECODE_SKIP_SPECIAL, dec_skip.s ? &dec_skip : &text);
            if (!strcmp(fl[6], "1")) check_decode(r, lineno, plain.v, plain.n, 0, &text);   /* the round trip */
            free(raw.s), free(text.s), free(with.v), free(plain.v), free(dec.s), free(dec_skip.s);
        } else if (!strcmp(fl[0], "S") && nf == 3) {
            r->records++;
            bytes raw = parse_hex(fl[1]);
            ids want = parse_ids(fl[2]);
            check_encode(r, lineno, &raw, EM_TOKENIZE_SPECIAL_AS_TEXT, &want);
            free(raw.s), free(want.v);
        } else if (!strcmp(fl[0], "D") && nf == 4) {
            r->records++;
            ids v = parse_ids(fl[1]);
            bytes dec = parse_hex(fl[2]), dec_skip = parse_hex(fl[3]);
            check_decode(r, lineno, v.v, v.n, 0, &dec);
            check_decode(r, lineno, v.v, v.n, EM_DECODE_SKIP_SPECIAL, &dec_skip);
            free(v.v), free(dec.s), free(dec_skip.s);
        } else if (!strcmp(fl[0], "K") && nf == 3) {
            r->records++;
            long long id = atoll(fl[1]);
            bytes want = parse_hex(fl[2]);
            size_t n = 0;
            const char *t = em_tokenizer_id_to_token(r->tok, id, &n);
            if (!t || n != want.n || memcmp(t, want.s, n)) {
                report(r, lineno, "id_to_token differs");
                em_clear_error();
            } else if (!em_tokenizer_is_special(r->tok, id) && em_tokenizer_token_to_id(r->tok, t, n) != id &&
                       em_tokenizer_token_to_id(r->tok, t, n) < 0) {
                report(r, lineno, "token_to_id does not find the token back");
            }
            free(want.s);
        } else if (strcmp(fl[0], "version")) {
            report(r, lineno, "unreadable record");
        }
    }
    free(line);
    fclose(f);
    CHECK(r->records > 100);
    if (r->mismatches) fprintf(stderr, "  %s: %d mismatches in %d records\n", r->name, r->mismatches, r->records);
    CHECK(r->mismatches == 0);
}

static void replay_named(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizer/%s", data_dir(), name);
    replay r = {.name = name, .tok = em_tokenizer_load(dir)};
    if (!r.tok && em_last_status() == EM_ERR_NOT_SUPPORTED && strstr(em_last_error(), "ICU")) {
        char why[300];
        snprintf(why, sizeof why, "%s", em_last_error());
        em_clear_error();
        SKIP("%s", why);
    }
    CHECK(r.tok != NULL);
    if (!r.tok) {
        fprintf(stderr, "  %s\n", em_last_error());
        em_clear_error();
        return;
    }
    replay_file(&r);
    em_tokenizer_free(r.tok);
}

static void test_golden_gpt2(void) { replay_named("gpt2"); }
static void test_golden_llama3(void) { replay_named("llama3"); }
static void test_golden_qwen2(void) { replay_named("qwen2"); }
static void test_golden_llama2(void) { replay_named("llama2"); }
static void test_golden_metaspace(void) { replay_named("metaspace"); }

int main(void) {
    RUN(test_golden_gpt2);
    RUN(test_golden_llama3);
    RUN(test_golden_qwen2);
    RUN(test_golden_llama2);
    RUN(test_golden_metaspace);
    return test_summary();
}
