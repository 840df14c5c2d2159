/* Tokenizers (include/ember/tokenizer.h) against Hugging Face's `tokenizers`: the goldens of
 * scripts/golden_tokenizer.py (tests/data/tokenizer/<name>/golden.txt) replayed for five
 * styles (GPT-2, Llama 3, Qwen2, Llama 2 / Mistral, SentencePiece with Metaspace): the ids of
 * every string with and without the template's special tokens and with special tokens read
 * as text; decoding, whole and token by token (every piece valid UTF-8, all of them together
 * the whole decode); decode(encode(x)) == x where tokenizers gives that back; the tokens of
 * ids. Then the model folder's special ids, the API's checks and bad tokenizer.json files. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ember/ember.h>
#include <ember/tokenizer.h>
#include "models/tokenizer_internal.h"   /* the pattern rewriting, checked directly */
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
static void test_golden_misc(void) { replay_named("misc"); }
static void test_golden_misc2(void) { replay_named("misc2"); }

/* ---- a model folder's special ids ---------------------------------------------------------------- */
static em_tokenizer *load_named(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizer/%s", data_dir(), name);
    return em_tokenizer_load(dir);
}

static int64_t id_of(const em_tokenizer *tok, const char *token) {
    return em_tokenizer_token_to_id(tok, token, strlen(token));
}

static void test_special_ids(void) {
    /* llama3: bos from the configs, both end ids of generation_config.json's list */
    em_tokenizer *tok = load_named("llama3");
    CHECK(tok != NULL);
    if (tok) {
        int64_t eos[4] = {-1, -1, -1, -1};
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == id_of(tok, "<|begin_of_text|>"));
        CHECK(em_tokenizer_eos_ids(tok, eos, 4) == 2);
        CHECK(eos[0] == id_of(tok, "<|end_of_text|>") && eos[1] == id_of(tok, "<|eot_id|>"));
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_EOS) == eos[0]);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_PAD) == -1);
        CHECK(em_tokenizer_eos_ids(tok, NULL, 0) == 2);
        CHECK(em_tokenizer_is_special(tok, eos[1]) && !em_tokenizer_is_special(tok, id_of(tok, "a")));
        em_tokenizer_free(tok);
    }
    /* llama2: the names of tokenizer_config.json */
    tok = load_named("llama2");
    CHECK(tok != NULL);
    if (tok) {
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == 1);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_EOS) == 2);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_UNK) == 0);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_PAD) == -1);
        em_tokenizer_free(tok);
    }
    /* qwen2: no BOS, a pad token written as an added token's object */
    tok = load_named("qwen2");
    if (tok) {
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == -1);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_EOS) == id_of(tok, "<|im_end|>"));
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_PAD) == id_of(tok, "<|endoftext|>"));
        em_tokenizer_free(tok);
    } else {
        em_clear_error();   /* built without ICU: the golden case says so */
    }
    /* metaspace: no configs, BOS and EOS from the template "<s> $A </s>" */
    tok = load_named("metaspace");
    if (tok) {
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == 1);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_EOS) == 2);
        em_tokenizer_free(tok);
    } else {
        em_clear_error();
    }
    /* gpt2 has neither configs nor a template */
    tok = load_named("gpt2");
    CHECK(tok != NULL);
    if (tok) {
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == -1 && em_tokenizer_special_id(tok, EM_TOKEN_EOS) == -1);
        CHECK(em_tokenizer_eos_ids(tok, NULL, 0) == 0);
        em_tokenizer_free(tok);
    }
    /* the file itself, not its folder: the configs are not read */
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/llama3/tokenizer.json", data_dir());
    tok = em_tokenizer_load(path);
    CHECK(tok != NULL);
    if (tok) {
        CHECK(em_tokenizer_eos_ids(tok, NULL, 0) == 0);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == id_of(tok, "<|begin_of_text|>"));   /* the template's */
        em_tokenizer_free(tok);
    }
}

/* ---- the API's checks -------------------------------------------------------------------------------- */
static const char tiny_json[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"ab\": 3, \"\\u00e9\": 4},"
    " \"merges\": [[\"a\", \"b\"]]},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"},"
    " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 2}]}}";

static void test_api_checks(void) {
    em_tokenizer *tok = em_tokenizer_from_json(tiny_json, strlen(tiny_json), NULL);
    CHECK(tok != NULL);
    if (!tok) return;
    int32_t ids[8];
    size_t n = 99;
    CHECK(em_tokenizer_encode(NULL, "ab", 2, 0, ids, 8, &n) == EM_ERR_ARGUMENT && n == 0);
    CHECK_ERROR(EM_ERR_ARGUMENT, "tokenizer is NULL");
    CHECK(em_tokenizer_encode(tok, NULL, 3, 0, ids, 8, &n) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "text is NULL");
    CHECK(em_tokenizer_encode(tok, "ab", 2, 1u << 7, ids, 8, &n) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "unknown flags");
    CHECK(em_tokenizer_encode(tok, "ab", 2, 0, NULL, 8, &n) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "ids is NULL");
    CHECK_OK(em_tokenizer_encode(tok, NULL, 0, 0, NULL, 0, &n));
    CHECK(n == 0);
    /* a buffer too small: the count, and nothing written past it */
    CHECK_OK(em_tokenizer_encode(tok, "ab abb", 6, 0, NULL, 0, &n));
    CHECK(n == 4);   /* ab, " ", ab, b */
    for (int i = 0; i < 8; i++) ids[i] = -7;
    CHECK(em_tokenizer_encode(tok, "ab abb", 6, 0, ids, 3, &n) == EM_ERR_ARGUMENT && n == 4);
    CHECK_ERROR(EM_ERR_ARGUMENT, "encodes to 4 ids, the buffer has room for 3");
    CHECK(ids[3] == -7);
    CHECK_OK(em_tokenizer_encode(tok, "ab abb", 6, 0, ids, 4, &n));
    CHECK(n == 4 && ids[0] == 3 && ids[1] == 2 && ids[2] == 3 && ids[3] == 1);
    /* a character the vocabulary lacks, with neither byte fallback nor unk: left out (and
     * its neighbours then merge, as in tokenizers) */
    CHECK_OK(em_tokenizer_encode(tok, "a\xe2\x82\xac" "b", 5, 0, ids, 8, &n));
    CHECK(n == 1 && ids[0] == 3);

    /* decode: Strip takes one leading space and up to two trailing ones */
    int32_t text_ids[] = {2, 2, 0, 2, 1, 2, 2, 2};
    char out[32];
    size_t len = 0;
    CHECK_OK(em_tokenizer_decode(tok, text_ids, 8, 0, out, sizeof out, &len));
    CHECK(len == 5 && !strcmp(out, " a b "));
    CHECK(em_tokenizer_decode(tok, text_ids, 8, 0, out, 5, &len) == EM_ERR_ARGUMENT && len == 5);
    CHECK_ERROR(EM_ERR_ARGUMENT, "5 bytes and a NUL");
    int32_t bad_ids[] = {0, 5};
    CHECK(em_tokenizer_decode(tok, bad_ids, 2, 0, out, sizeof out, &len) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "id 5 is out of the vocabulary");
    int64_t neg[] = {-1};
    CHECK(em_tokenizer_decode_i64(tok, neg, 1, 0, out, sizeof out, &len) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "id -1");
    CHECK(em_tokenizer_decode(tok, NULL, 2, 0, out, sizeof out, &len) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "ids is NULL");
    CHECK_OK(em_tokenizer_decode(tok, NULL, 0, 0, out, sizeof out, &len));
    CHECK(len == 0 && out[0] == 0);

    /* the stream: a bad id changes nothing; the held spaces come out when text follows */
    em_decode_stream *st = em_decode_stream_new(tok, 0);
    CHECK(st != NULL);
    if (st) {
        const char *piece;
        size_t pn, total = 0;
        char joined[32] = "";
        for (int i = 0; i < 8; i++) {
            CHECK_OK(em_decode_stream_step(st, text_ids[i], &piece, &pn));
            CHECK(strlen(piece) == pn);
            memcpy(joined + total, piece, pn);
            total += pn;
            if (i == 3) {
                CHECK(em_decode_stream_step(st, 42, &piece, &pn) == EM_ERR_ARGUMENT && pn == 0 && !strcmp(piece, ""));
                CHECK_ERROR(EM_ERR_ARGUMENT, "id 42");
            }
        }
        CHECK_OK(em_decode_stream_finish(st, &piece, &pn));
        memcpy(joined + total, piece, pn);
        total += pn;
        joined[total] = 0;
        CHECK(!strcmp(joined, " a b "));
        /* after finish, a new text: its first space is stripped again */
        CHECK_OK(em_decode_stream_step(st, 2, &piece, &pn));
        CHECK(pn == 0);
        CHECK_OK(em_decode_stream_step(st, 0, &piece, &pn));
        CHECK(pn == 1 && !strcmp(piece, "a"));
        em_decode_stream_free(st);
    }
    CHECK(em_decode_stream_new(NULL, 0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "tokenizer is NULL");
    CHECK(em_decode_stream_step(NULL, 0, NULL, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "stream is NULL");

    /* lookups */
    size_t tl;
    const char *t = em_tokenizer_id_to_token(tok, 4, &tl);
    CHECK(t && tl == 2 && !strcmp(t, "\xc3\xa9"));
    CHECK(em_tokenizer_id_to_token(tok, 5, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "out of the vocabulary's range");
    CHECK(em_tokenizer_token_to_id(tok, "zz", 2) == -1 && !em_failed());
    CHECK(em_tokenizer_token_to_id(tok, "ab", 2) == 3);
    CHECK(em_tokenizer_vocab_size(tok) == 5);
    CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == -1 && em_tokenizer_special_id(tok, EM_TOKEN_UNK) == -1);
    em_tokenizer_free(tok);
    em_tokenizer_free(NULL);
    em_decode_stream_free(NULL);
}

/* The pattern rewriting: \s and \w as Oniguruma (and so tokenizers) read them, not PCRE2. */
static void test_pattern_classes(void) {
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    tk_regex re;
    CHECK_OK(em__tk_regex_compile(&re, "\\s", 2, false, "test"));
    CHECK(em__tk_regex_at(&re, md, "\xc2\x85", 2, 0));            /* NEL: White_Space */
    CHECK(em__tk_regex_at(&re, md, "\xe3\x80\x80", 3, 0));        /* ideographic space */
    CHECK(!em__tk_regex_at(&re, md, "\xe1\xa0\x8e", 3, 0));       /* Mongolian vowel separator: PCRE2's \s has it */
    em__tk_regex_free(&re);
    CHECK_OK(em__tk_regex_compile(&re, "[^\\s\\p{L}]", 10, false, "test"));
    CHECK(em__tk_regex_at(&re, md, "\xe1\xa0\x8e", 3, 0));
    CHECK(!em__tk_regex_at(&re, md, " ", 1, 0) && !em__tk_regex_at(&re, md, "a", 1, 0));
    em__tk_regex_free(&re);
    CHECK_OK(em__tk_regex_compile(&re, "\\w", 2, false, "test"));
    CHECK(em__tk_regex_at(&re, md, "\xcc\x81", 2, 0));            /* a combining mark */
    CHECK(em__tk_regex_at(&re, md, "\xc2\xb2", 2, 0));            /* superscript two (No) */
    CHECK(!em__tk_regex_at(&re, md, "-", 1, 0));
    em__tk_regex_free(&re);
    CHECK_OK(em__tk_regex_compile(&re, "a.b(", 4, true, "test"));   /* plain text */
    CHECK(em__tk_regex_at(&re, md, "a.b(", 4, 0) && !em__tk_regex_at(&re, md, "axb(", 4, 0));
    em__tk_regex_free(&re);
    CHECK(em__tk_regex_compile(&re, "(", 1, false, "where") == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "where: cannot compile the pattern \"(\"");
    pcre2_match_data_free(md);
}

/* ---- bad files ------------------------------------------------------------------------------------------ */
static void expect_bad(const char *json, em_status code, const char *msg) {
    em_tokenizer *tok = em_tokenizer_from_json(json, strlen(json), "bad.json");
    if (tok) {
        fprintf(stderr, "  loaded, expected \"%s\": %s\n", msg, json);
        em_tokenizer_free(tok);
    }
    CHECK(tok == NULL);
    CHECK_ERROR(code, msg);
}

#define MODEL(vocab, merges) "{\"model\": {\"type\": \"BPE\", \"vocab\": " vocab ", \"merges\": " merges
#define BASE MODEL("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[[\"a\", \"b\"]]")

static void test_bad_files(void) {
    expect_bad("", EM_ERR_FORMAT, "bad.json: bad JSON at byte 0");
    expect_bad(MODEL("{\"a\xff\": 0}", "[]") "}}", EM_ERR_FORMAT, "bad.json: not UTF-8 at byte 38");
    expect_bad("[1, 2]", EM_ERR_FORMAT, "the top level: expected an object, found an array");
    expect_bad("{\"version\": \"1.0\"}", EM_ERR_FORMAT, "no \"model\"");
    expect_bad("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", EM_ERR_NOT_SUPPORTED,
               "model.type: \"Unigram\" is not supported");
    expect_bad("{\"model\": {\"type\": 3}}", EM_ERR_FORMAT, "model.type: expected a string, found a number");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", EM_ERR_FORMAT, "model.merges: missing");
    expect_bad(MODEL("[\"a\"]", "[]") "}}", EM_ERR_FORMAT, "model.vocab: expected an object of token -> id, found an array");
    expect_bad(MODEL("{\"a\": -1}", "[]") "}}", EM_ERR_FORMAT, "model.vocab[\"a\"]: expected a whole number");
    expect_bad(MODEL("{\"a\": \"0\"}", "[]") "}}", EM_ERR_FORMAT, "found a string");
    expect_bad(MODEL("{\"a\": 99999999}", "[]") "}}", EM_ERR_FORMAT, "past the largest allowed");
    expect_bad(MODEL("{}", "[]") "}}", EM_ERR_FORMAT, "the vocabulary is empty");
    expect_bad(MODEL("{\"a\": 0}", "{}") "}}", EM_ERR_FORMAT, "model.merges: expected an array, found an object");
    expect_bad(MODEL("{\"a\": 0, \"b\": 1}", "[[\"a\", \"c\"]]") "}}", EM_ERR_FORMAT,
               "model.merges[0]: \"c\" is not in the vocabulary");
    expect_bad(MODEL("{\"a\": 0, \"b\": 1}", "[[\"a\", \"b\"]]") "}}", EM_ERR_FORMAT,
               "\"a\" + \"b\" gives \"ab\", which is not in the vocabulary");
    expect_bad(MODEL("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[\"ab\"]") "}}", EM_ERR_FORMAT,
               "model.merges[0]: expected two tokens separated by one space, found \"ab\"");
    expect_bad(MODEL("{\"a\": 0}", "[7]") "}}", EM_ERR_FORMAT, "model.merges[0]: expected a pair");
    expect_bad(BASE ", \"dropout\": 0.1}}", EM_ERR_NOT_SUPPORTED, "model.dropout: 0.1 is not supported");
    expect_bad(BASE ", \"unk_token\": \"<unk>\"}}", EM_ERR_FORMAT, "model.unk_token: \"<unk>\" is not in the vocabulary");
    expect_bad(BASE ", \"byte_fallback\": \"yes\"}}", EM_ERR_FORMAT, "model.byte_fallback: expected true or false");
    expect_bad(BASE "}, \"normalizer\": {\"type\": \"Lowercase\"}}", EM_ERR_NOT_SUPPORTED,
               "normalizer: type \"Lowercase\" is not supported");
    expect_bad(BASE "}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\"}]}}",
               EM_ERR_FORMAT, "normalizer.normalizers[0].prepend: expected a string, found nothing");
    expect_bad(BASE "}, \"pre_tokenizer\": \"ByteLevel\"}", EM_ERR_FORMAT, "pre_tokenizer: expected an object, found a string");
    expect_bad(BASE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
               "\"Isolated\", \"invert\": false}}", EM_ERR_FORMAT, "pre_tokenizer.pattern.Regex: cannot compile the pattern");
    expect_bad(BASE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
               "\"Sideways\"}}", EM_ERR_FORMAT, "pre_tokenizer.behavior: expected Removed, Isolated");
    expect_bad(BASE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Glob\": \"a\"}, \"behavior\": "
               "\"Isolated\"}}", EM_ERR_FORMAT, "pre_tokenizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}");
    expect_bad(BASE "}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}}", EM_ERR_FORMAT,
               "pre_tokenizer.replacement: expected one character");
    expect_bad(BASE "}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}", EM_ERR_NOT_SUPPORTED,
               "pre_tokenizer: type \"BertPreTokenizer\" is not supported");
    expect_bad(BASE "}, \"added_tokens\": [{\"id\": 3}]}", EM_ERR_FORMAT, "added_tokens[0].content: expected a string");
    expect_bad(BASE "}, \"added_tokens\": {}}", EM_ERR_FORMAT, "added_tokens: expected an array");
    expect_bad(BASE "}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
               "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
               "\"special_tokens\": {}}}", EM_ERR_FORMAT, "the special token \"<s>\" is not in post_processor.special_tokens");
    expect_bad(BASE "}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [], \"special_tokens\": {}}}",
               EM_ERR_FORMAT, "the single template has no sequence");
    expect_bad(BASE "}, \"post_processor\": {\"type\": \"RobertaProcessing\", \"cls\": \"<s>\"}}", EM_ERR_FORMAT,
               "post_processor.cls: expected [\"token\", id]");
    expect_bad(BASE "}, \"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}}",
               EM_ERR_FORMAT, "decoder.start: expected a whole number");

    /* a decoder Ember cannot run: the tokenizer loads and encodes; decoding says why not */
    const char *wordpiece = BASE "}, \"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\"}}";
    em_tokenizer *tok = em_tokenizer_from_json(wordpiece, strlen(wordpiece), "wp.json");
    CHECK(tok != NULL);
    if (tok) {
        int32_t ids[4];
        size_t n, len;
        CHECK_OK(em_tokenizer_encode(tok, "ab", 2, 0, ids, 4, &n));
        CHECK(n == 1 && ids[0] == 2);
        CHECK(em_tokenizer_decode(tok, ids, n, 0, NULL, 0, &len) == EM_ERR_NOT_SUPPORTED);
        CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "wp.json: decoder: the decoder \"WordPiece\" is not supported");
        CHECK(em_decode_stream_new(tok, 0) == NULL);
        CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "WordPiece");
        em_tokenizer_free(tok);
    }

    /* a real file cut short anywhere: bad JSON, nothing leaked */
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/gpt2/tokenizer.json", data_dir());
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size);
    CHECK(fread(text, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    for (int k = 0; k < 24; k++) {
        size_t cut = (size_t)size * (size_t)k / 24 + (size_t)k;   /* not on a round boundary */
        tok = em_tokenizer_from_json(text, cut, "cut.json");
        CHECK(tok == NULL);
        CHECK_ERROR(EM_ERR_FORMAT, "cut.json: bad JSON at byte");
    }
    tok = em_tokenizer_from_json(text, (size_t)size, "whole.json");
    CHECK(tok != NULL);
    em_tokenizer_free(tok);
    free(text);
}

/* A model folder with one bad file among good ones. */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void remove_file(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void test_bad_folders(void) {
    CHECK(em_tokenizer_load(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "a NULL path");
    CHECK(em_tokenizer_load("/nonexistent/model") == NULL);
    CHECK_ERROR(EM_ERR_IO, "/nonexistent/model: cannot open");
    char dir[] = "/tmp/ember-tokenizer-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(em_tokenizer_load(dir) == NULL);   /* a folder without tokenizer.json */
    CHECK_ERROR(EM_ERR_IO, "tokenizer.json: cannot open");
    write_file(dir, "tokenizer.json", BASE "}}");
    em_tokenizer *tok = em_tokenizer_load(dir);
    CHECK(tok != NULL);
    em_tokenizer_free(tok);
    static const struct { const char *file, *text, *msg; } cases[] = {
        {"tokenizer_config.json", "{\"bos_token\": \"<s>\"}", "tokenizer_config.json: bos_token: \"<s>\" is not a token"},
        {"tokenizer_config.json", "{\"eos_token\": 3}", "eos_token: expected a token"},
        {"tokenizer_config.json", "[]", "tokenizer_config.json: expected an object at the top level"},
        {"tokenizer_config.json", "{\"bos_token\": ", "tokenizer_config.json: bad JSON at byte"},
        {"generation_config.json", "{\"eos_token_id\": [0, 7]}", "generation_config.json: eos_token_id[1]: 7 is past"},
        {"generation_config.json", "{\"bos_token_id\": \"a\"}", "generation_config.json: bos_token_id: expected a whole"},
        {"config.json", "{\"pad_token_id\": -2}", "config.json: pad_token_id: expected a whole number"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_file(dir, cases[k].file, cases[k].text);
        CHECK(em_tokenizer_load(dir) == NULL);
        CHECK_ERROR(EM_ERR_FORMAT, cases[k].msg);
        remove_file(dir, cases[k].file);
    }
    write_file(dir, "generation_config.json", "{\"eos_token_id\": [2, 1], \"pad_token_id\": 0}");
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"a\"}, \"bos_token\": \"b\"}");
    tok = em_tokenizer_load(dir);
    CHECK(tok != NULL);
    if (tok) {   /* generation_config.json's ids win over tokenizer_config.json's names */
        int64_t eos[2];
        CHECK(em_tokenizer_eos_ids(tok, eos, 2) == 2 && eos[0] == 2 && eos[1] == 1);
        CHECK(em_tokenizer_special_id(tok, EM_TOKEN_BOS) == 1 && em_tokenizer_special_id(tok, EM_TOKEN_PAD) == 0);
        em_tokenizer_free(tok);
    }
    remove_file(dir, "generation_config.json");
    remove_file(dir, "tokenizer_config.json");
    remove_file(dir, "tokenizer.json");
    rmdir(dir);
}

/* ---- threads: one tokenizer, several encodes at once --------------------------------------------------- */
typedef struct enc_job {
    const em_tokenizer *tok;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int failures;
} enc_job;

static void *encode_many(void *arg) {
    enc_job *j = arg;
    int32_t *ids = malloc((j->n_want + 1) * sizeof *ids);
    for (int r = 0; r < 10; r++) {
        size_t n = 0;
        if (em_tokenizer_encode(j->tok, j->text, j->len, EM_TOKENIZE_ADD_SPECIAL, ids, j->n_want, &n) != EM_OK ||
            n != j->n_want || memcmp(ids, j->want, n * sizeof *ids))
            j->failures++;
    }
    free(ids);
    return NULL;
}

static void test_threads(void) {
    em_tokenizer *tok = load_named("llama3");
    CHECK(tok != NULL);
    if (!tok) return;
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/seeds_ko.txt", data_dir());
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) {
        em_tokenizer_free(tok);
        return;
    }
    char *text = malloc(1 << 16);
    size_t len = fread(text, 1, 1 << 16, f);
    fclose(f);
    size_t n = 0;
    CHECK_OK(em_tokenizer_encode(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, NULL, 0, &n));
    int32_t *want = malloc((n + 1) * sizeof *want);
    CHECK_OK(em_tokenizer_encode(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, want, n, &n));
    enc_job jobs[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (enc_job){tok, text, len, want, n, 0};
        CHECK(pthread_create(&th[t], NULL, encode_many, &jobs[t]) == 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].failures == 0);
    }
    CHECK(n > 1000);
    free(want);
    free(text);
    em_tokenizer_free(tok);
}

int main(void) {
    RUN(test_golden_gpt2);
    RUN(test_golden_llama3);
    RUN(test_golden_qwen2);
    RUN(test_golden_llama2);
    RUN(test_golden_metaspace);
    RUN(test_golden_misc);
    RUN(test_golden_misc2);
    RUN(test_special_ids);
    RUN(test_api_checks);
    RUN(test_pattern_classes);
    RUN(test_bad_files);
    RUN(test_bad_folders);
    RUN(test_threads);
    return test_summary();
}
