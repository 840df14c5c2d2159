/* Text before the model: UTF-8, the regular expressions (PCRE2), the normalizers, the added
 * tokens' split and the pre-tokenizers, each step as `tokenizers` does it (its
 * NormalizedString, PreTokenizedString and AddedVocabulary), without the offset tracking
 * Ember does not expose. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef EMBER_HAVE_ICU
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#endif

#include "tokenizer_internal.h"

/* ---- UTF-8 ------------------------------------------------------------------------------------ */
int em__utf8_char(const unsigned char *s, size_t n, uint32_t *cp, size_t *bad, bool *incomplete) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xBF;   /* the second byte's range (Unicode's table 3-7) */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;        /* no overlong forms */
        if (c == 0xED) hi = 0x9F;        /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;        /* nothing past U+10FFFF */
    } else {
        *bad = 1;
        *incomplete = false;
        return 0;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) {
            *bad = (size_t)k;
            *incomplete = true;
            return 0;
        }
        unsigned b = s[k];
        if (b < lo || b > hi) {
            *bad = (size_t)k;
            *incomplete = false;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
        v = v << 6 | (b & 0x3F);
    }
    *cp = v;
    return need + 1;
}

int em__utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool em__is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* The code point at s[i..n) of valid UTF-8, and its length. */
static uint32_t char_at(const char *s, size_t n, size_t i, size_t *len) {
    uint32_t cp;
    size_t bad;
    bool inc;
    int k = em__utf8_char((const unsigned char *)s + i, n - i, &cp, &bad, &inc);
    if (k <= 0) {   /* not reached on valid text: one byte, so that callers still advance */
        *len = 1;
        return 0xFFFD;
    }
    *len = (size_t)k;
    return cp;
}

/* The start of the character that ends at s[end] (valid UTF-8, end > 0). */
static size_t char_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

void em__tk_put(tk_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    if (n && s) memcpy(b->s + b->len, s, n);
    else if (n) memset(b->s + b->len, 0, n);   /* room the caller fills */
    b->len += n;
    b->s[b->len] = 0;
}

void em__tk_free(tk_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}

void em__tk_put_lossy(tk_buf *b, const char *s, size_t n) {
    static const char replacement[] = "\xEF\xBF\xBD";
    size_t run = 0;   /* the start of the valid bytes not yet copied */
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t bad;
        bool inc;
        int k = em__utf8_char((const unsigned char *)s + i, n - i, &cp, &bad, &inc);
        if (k) {
            i += (size_t)k;
            continue;
        }
        em__tk_put(b, s + run, i - run);
        em__tk_put(b, replacement, 3);
        i += bad;
        run = i;
    }
    em__tk_put(b, s + run, n - run);
}

/* ---- regular expressions ------------------------------------------------------------------------- */
static em_status compile_pcre2(tk_regex *re, const char *pattern, size_t len, uint32_t options, const char *where,
                               const char *shown, size_t shown_len) {
    int code;
    PCRE2_SIZE at;
    /* plain text: PCRE2_LITERAL, which takes no Unicode classes (it has none) */
    uint32_t classes = options & PCRE2_LITERAL ? 0 : PCRE2_UCP;
    re->code = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | classes | options, &code, &at, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return em_error(EM_ERR_FORMAT, "%s: cannot compile the pattern \"%.*s\": %s", where,
                        (int)(shown_len > 200 ? 200 : shown_len), shown, (const char *)msg);
    }
    /* JIT where the library has it; the interpreter otherwise (same matches) */
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return EM_OK;
}

em_status em__tk_regex_compile_pcre2(tk_regex *re, const char *pattern, const char *where) {
    return compile_pcre2(re, pattern, strlen(pattern), 0, where, pattern, strlen(pattern));
}

/* Oniguruma's \s, \w and \h (for Unicode text) in PCRE2's terms, inside a class and outside. */
static const char *onig_class(char c, bool in_class) {
    switch (c) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'w': return in_class ? "\\p{L}\\p{M}\\p{N}\\p{Pc}" : "[\\p{L}\\p{M}\\p{N}\\p{Pc}]";
    case 'W': return in_class ? NULL : "[^\\p{L}\\p{M}\\p{N}\\p{Pc}]";   /* in a class: PCRE2's own */
    case 'h': return in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
    case 'H': return in_class ? NULL : "[^0-9a-fA-F]";
    default: return NULL;
    }
}

em_status em__tk_regex_compile(tk_regex *re, const char *pattern, size_t len, bool literal, const char *where) {
    memset(re, 0, sizeof *re);
    if (literal) return compile_pcre2(re, pattern, len, PCRE2_LITERAL, where, pattern, len);
    tk_buf b = {0};
    bool in_class = false;
    size_t class_start = 0;   /* where the class's items begin (a ']' there is literal) */
    for (size_t i = 0; i < len; i++) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < len) {
            char e = pattern[i + 1];
            if (e == 'Q') {   /* \Q...\E: quoted, copied as it is */
                size_t j = i + 2;
                while (j + 1 < len && !(pattern[j] == '\\' && pattern[j + 1] == 'E')) j++;
                size_t end = j + 1 < len ? j + 2 : len;
                em__tk_put(&b, pattern + i, end - i);
                i = end - 1;
                continue;
            }
            const char *rep = onig_class(e, in_class);
            if (rep) em__tk_put(&b, rep, strlen(rep));
            else em__tk_put(&b, pattern + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i + 1;
            if (class_start < len && pattern[class_start] == '^') class_start++;
        } else if (in_class && c == ']' && i > class_start) {
            in_class = false;
        }
        em__tk_put(&b, &c, 1);
    }
    if (b.oom) {
        em__tk_free(&b);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory compiling a pattern", where);
    }
    em_status s = compile_pcre2(re, b.s ? b.s : "", b.len, 0, where, pattern, len);
    em__tk_free(&b);
    return s;
}

void em__tk_regex_free(tk_regex *re) {
    if (re->code) pcre2_code_free(re->code);
    memset(re, 0, sizeof *re);
}

static int match_once(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, size_t from,
                      uint32_t options) {
    int rc;
    if (re->jit && !(options & PCRE2_ANCHORED)) {
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, from, options, md, NULL);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
        /* the JIT's stack (32 KiB) is too small for this text: the interpreter keeps its
         * backtracking on the heap */
    }
    return pcre2_match(re->code, (PCRE2_SPTR)s, n, from, options | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
}

int em__tk_regex_next(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, tk_regex_iter *it,
                      size_t *start, size_t *end) {
    for (;;) {
        if (it->from > n) return 0;
        int rc = match_once(re, md, s, n, it->from, 0);
        if (rc == PCRE2_ERROR_NOMATCH) {
            it->from = n + 1;
            return 0;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            em_error(EM_ERR_NOT_SUPPORTED, "tokenizer: a split pattern failed on a text of %zu bytes: %s", n,
                     (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s0 = ov[0], e0 = ov[1];
        if (s0 == e0) {   /* empty: search again one character on */
            size_t cl = 1;
            if (e0 < n) char_at(s, n, e0, &cl);
            it->from = e0 + cl;
            if (it->has_last && it->last_end == e0) continue;
        } else {
            it->from = e0;
        }
        it->last_end = e0;
        it->has_last = true;
        *start = s0;
        *end = e0;
        return 1;
    }
}

bool em__tk_regex_at(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, size_t at) {
    return match_once(re, md, s, n, at, PCRE2_ANCHORED) >= 0;
}

/* ---- pieces --------------------------------------------------------------------------------------- */
void em__tk_pieces_free(tk_pieces *p) {
    free(p->v);
    em__tk_free(&p->text);
    memset(p, 0, sizeof *p);
}

static em_status oom(void) { return em_error(EM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory"); }

static em_status piece_slot(tk_pieces *p) {
    if (p->n < p->cap) return EM_OK;
    size_t cap = p->cap ? p->cap * 2 : 16;
    tk_piece *v = realloc(p->v, cap * sizeof *v);
    if (!v) return oom();
    p->v = v;
    p->cap = cap;
    return EM_OK;
}

em_status em__tk_pieces_push(tk_pieces *p, const char *s, size_t n, int32_t token, bool at_start) {
    if (token < 0 && n == 0) return EM_OK;   /* empty text is dropped, as tokenizers' split does */
    if (piece_slot(p) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
    size_t off = p->text.len;
    em__tk_put(&p->text, s, n);
    if (p->text.oom) return oom();
    p->v[p->n++] = (tk_piece){.off = off, .len = n, .token = token, .at_start = at_start};
    return EM_OK;
}

static void put_byte_level(tk_buf *out, const char *s, size_t n);

/* A text piece of s[0..n) written in the byte-level alphabet. */
static em_status push_byte_level(tk_pieces *p, const char *s, size_t n, bool at_start) {
    if (n == 0) return EM_OK;
    if (piece_slot(p) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
    size_t off = p->text.len;
    put_byte_level(&p->text, s, n);
    if (p->text.oom) return oom();
    p->v[p->n++] = (tk_piece){.off = off, .len = p->text.len - off, .token = -1, .at_start = at_start};
    return EM_OK;
}

/* ---- normalizers ------------------------------------------------------------------------------------ */
static void replace_all(const tk_norm *nm, pcre2_match_data *md, const char *s, size_t n, tk_buf *out, int *err) {
    tk_regex_iter it = {0};
    size_t a, e, prev = 0;
    int r;
    while ((r = em__tk_regex_next(&nm->re, md, s, n, &it, &a, &e)) == 1) {
        em__tk_put(out, s + prev, a - prev);
        em__tk_put(out, nm->text, nm->text_len);
        prev = e;
    }
    if (r < 0) *err = 1;
    em__tk_put(out, s + prev, n - prev);
}

#ifdef EMBER_HAVE_ICU
static em_status icu_normalize(tk_norm_kind kind, const char *s, size_t n, tk_buf *out) {
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    if (ascii) {   /* every normalization form leaves ASCII as it is */
        em__tk_put(out, s, n);
        return EM_OK;
    }
    if (n > (size_t)INT32_MAX / 4) return em_error(EM_ERR_ARGUMENT, "tokenizer: a text of %zu bytes is too long to normalize", n);
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *nz = kind == TK_NORM_NFC ? unorm2_getNFCInstance(&e)
                             : kind == TK_NORM_NFD ? unorm2_getNFDInstance(&e)
                             : kind == TK_NORM_NFKC ? unorm2_getNFKCInstance(&e) : unorm2_getNFKDInstance(&e);
    if (U_FAILURE(e)) return em_error(EM_ERR_UNAVAILABLE, "tokenizer: ICU's normalizer is not available: %s", u_errorName(e));
    int32_t cap16 = (int32_t)n + 1, len16 = 0;   /* UTF-16 never takes more units than UTF-8 bytes */
    UChar *u = malloc((size_t)cap16 * sizeof *u);
    if (!u) return oom();
    u_strFromUTF8(u, cap16, &len16, s, (int32_t)n, &e);
    /* decompositions grow the text: ask for the size first */
    int32_t norm_len = U_SUCCESS(e) ? unorm2_normalize(nz, u, len16, NULL, 0, &e) : 0;
    if (e == U_BUFFER_OVERFLOW_ERROR) e = U_ZERO_ERROR;
    UChar *nu = U_SUCCESS(e) ? malloc(((size_t)norm_len + 1) * sizeof *nu) : NULL;
    if (U_SUCCESS(e) && !nu) {
        free(u);
        return oom();
    }
    if (U_SUCCESS(e)) unorm2_normalize(nz, u, len16, nu, norm_len + 1, &e);
    free(u);
    int32_t len8 = 0;
    if (U_SUCCESS(e)) {
        u_strToUTF8(NULL, 0, &len8, nu, norm_len, &e);
        if (e == U_BUFFER_OVERFLOW_ERROR) e = U_ZERO_ERROR;
    }
    if (U_SUCCESS(e)) {
        size_t at = out->len;
        em__tk_put(out, NULL, (size_t)len8);
        if (!out->oom) {
            u_strToUTF8(out->s + at, len8 + 1, NULL, nu, norm_len, &e);
            out->s[out->len] = 0;
        }
    }
    free(nu);
    if (U_FAILURE(e)) return em_error(EM_ERR_INTERNAL, "tokenizer: ICU could not normalize the text: %s", u_errorName(e));
    return out->oom ? oom() : EM_OK;
}
#endif

/* The byte-level alphabet of GPT-2: printable bytes stand for themselves, the others for
 * U+0100 and up, in byte order. */
static uint32_t byte_char(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    unsigned n = 0;
    for (unsigned k = 0; k < b; k++)
        if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE))) n++;
    return 0x100 + n;
}

static char byte_map[256][3];
static unsigned char byte_map_len[256];
static pthread_once_t byte_map_once = PTHREAD_ONCE_INIT;

static void byte_map_init(void) {
    for (unsigned b = 0; b < 256; b++) {
        char t[4];
        int k = em__utf8_put(byte_char(b), t);
        memcpy(byte_map[b], t, (size_t)k);
        byte_map_len[b] = (unsigned char)k;
    }
}

static void put_byte_level(tk_buf *out, const char *s, size_t n) {
    pthread_once(&byte_map_once, byte_map_init);
    size_t at = out->len;
    em__tk_put(out, NULL, 2 * n);   /* room: each byte becomes one or two */
    if (out->oom) return;
    char *w = out->s + at;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        w[0] = byte_map[b][0];
        w[1] = byte_map[b][1];
        w += byte_map_len[b];
    }
    out->len = (size_t)(w - out->s);
    out->s[out->len] = 0;
}

em_status em__tk_normalize(const em_tokenizer *tok, const char *s, size_t n, tk_buf *out) {
    out->len = 0;
    em__tk_put(out, s, n);
    if (!tok->n_norm) return out->oom ? oom() : EM_OK;
    tk_buf tmp = {0};
    pcre2_match_data *md = NULL;
    em_status st = EM_OK;
    for (size_t k = 0; k < tok->n_norm && st == EM_OK; k++) {
        const tk_norm *nm = &tok->norm[k];
        tmp.len = 0;
        em__tk_put(&tmp, NULL, 0);
        const char *t = out->s;
        size_t tn = out->len;
        switch (nm->kind) {
        case TK_NORM_PREPEND:
            if (tn) em__tk_put(&tmp, nm->text, nm->text_len);
            em__tk_put(&tmp, t, tn);
            break;
        case TK_NORM_REPLACE: {
            if (!md && !(md = pcre2_match_data_create(8, NULL))) {
                st = oom();
                break;
            }
            int err = 0;
            replace_all(nm, md, t, tn, &tmp, &err);
            if (err) st = EM_ERR_NOT_SUPPORTED;
            break;
        }
        case TK_NORM_STRIP: {
            size_t a = 0, e = tn, cl;
            if (nm->left)
                while (a < e && em__is_white_space(char_at(t, tn, a, &cl))) a += cl;
            if (nm->right)
                while (e > a) {
                    size_t c0 = char_before(t, e);
                    if (!em__is_white_space(char_at(t, tn, c0, &cl))) break;
                    e = c0;
                }
            em__tk_put(&tmp, t + a, e - a);
            break;
        }
        case TK_NORM_BYTE_LEVEL: put_byte_level(&tmp, t, tn); break;
        case TK_NORM_NFC: case TK_NORM_NFD: case TK_NORM_NFKC: case TK_NORM_NFKD:
#ifdef EMBER_HAVE_ICU
            st = icu_normalize(nm->kind, t, tn, &tmp);
#else
            st = em_error(EM_ERR_NOT_SUPPORTED, "tokenizer: Unicode normalization needs ICU, which this build lacks");
#endif
            break;
        }
        if (st == EM_OK && tmp.oom) st = oom();
        if (st == EM_OK) {   /* the result becomes the next step's input */
            tk_buf swap = *out;
            *out = tmp;
            tmp = swap;
        }
    }
    em__tk_free(&tmp);
    if (md) pcre2_match_data_free(md);
    return st;
}

/* ---- added tokens ------------------------------------------------------------------------------------- */
em_status em__tk_trie_build(tk_trie *t, const tk_added *added, size_t n, bool want_normalized) {
    memset(t, 0, sizeof *t);
    for (int b = 0; b < 256; b++) t->root_child[b] = -1;
    for (size_t k = 0; k < n; k++) {
        const tk_added *a = &added[k];
        if (a->normalized != want_normalized || a->match_len == 0) continue;
        int32_t node = -1;   /* -1: the root */
        for (size_t i = 0; i < a->match_len; i++) {
            unsigned char byte = (unsigned char)a->match[i];
            int32_t *link = node < 0 ? &t->root_child[byte] : &t->v[node].child;
            int32_t c = *link;
            if (node >= 0)
                while (c >= 0 && t->v[c].byte != byte) c = t->v[c].sibling;
            if (c < 0) {
                if (t->n == t->cap) {
                    size_t cap = t->cap ? t->cap * 2 : 64;
                    tk_trie_node *v = realloc(t->v, cap * sizeof *v);
                    if (!v) return oom();
                    t->v = v;
                    t->cap = cap;
                    link = node < 0 ? &t->root_child[byte] : &t->v[node].child;   /* t->v moved */
                }
                c = (int32_t)t->n++;
                t->v[c] = (tk_trie_node){.child = -1, .sibling = node < 0 ? -1 : *link, .token = -1, .byte = byte};
                *link = c;
            }
            node = c;
        }
        /* two tokens with one text: the later one, as a map built in order keeps it */
        t->v[node].token = (int32_t)k;
    }
    return EM_OK;
}

void em__tk_trie_free(tk_trie *t) {
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* The longest token of the trie that starts at s[i], or -1; *end its end. */
static int32_t trie_longest(const tk_trie *t, const char *s, size_t n, size_t i, size_t *end) {
    int32_t node = t->root_child[(unsigned char)s[i]], best = -1;
    size_t j = i;
    while (node >= 0) {
        j++;
        if (t->v[node].token >= 0) {
            best = t->v[node].token;
            *end = j;
        }
        if (j >= n) break;
        unsigned char byte = (unsigned char)s[j];
        int32_t c = t->v[node].child;
        while (c >= 0 && t->v[c].byte != byte) c = t->v[c].sibling;
        node = c;
    }
    return best;
}

static bool is_word_char(const em_tokenizer *tok, pcre2_match_data *md, const char *s, size_t n, size_t at) {
    return em__tk_regex_at(&tok->word_char, md, s, n, at);
}

em_status em__tk_split_added(const em_tokenizer *tok, const tk_trie *trie, pcre2_match_data *md, const char *s,
                             size_t n, bool at_start, bool special_as_text, tk_pieces *out) {
    size_t pos = 0, done = 0;   /* done: the text up to here is in out */
    em_status st = EM_OK;
    while (pos < n && st == EM_OK) {
        size_t i = pos, end = 0;
        int32_t k = -1;
        for (; i < n; i++)
            if (trie->root_child[(unsigned char)s[i]] >= 0 && (k = trie_longest(trie, s, n, i, &end)) >= 0) break;
        if (k < 0) break;
        pos = end;   /* the search goes on after this match, whether it is used or not */
        const tk_added *a = &tok->added[k];
        if (special_as_text && a->special) continue;
        size_t start = i, stop = end, cl;
        if (a->single_word) {
            bool word_before = start > 0 && is_word_char(tok, md, s, start, char_before(s, start));
            bool word_after = stop < n && is_word_char(tok, md, s, n, stop);
            if (word_before || word_after) continue;
        }
        if (a->lstrip) {   /* the spaces before it become part of it */
            while (start > done) {
                size_t c0 = char_before(s, start);
                if (!em__is_white_space(char_at(s, n, c0, &cl))) break;
                start = c0;
            }
        }
        if (a->rstrip)
            while (stop < n && em__is_white_space(char_at(s, n, stop, &cl))) stop += cl;
        if (start < done) start = done;
        if (done < start) st = em__tk_pieces_push(out, s + done, start - done, -1, at_start && done == 0);
        if (st == EM_OK) st = em__tk_pieces_push(out, s + start, stop - start, a->id, false);
        done = stop;
    }
    if (st == EM_OK && done < n) st = em__tk_pieces_push(out, s + done, n - done, -1, at_start && done == 0);
    return st;
}

/* ---- pre-tokenizers --------------------------------------------------------------------------------------- */
typedef struct tk_span {
    size_t a, e;
    bool flag;   /* a match (before the behavior), removed (after) */
} tk_span;

typedef struct tk_spans {
    tk_span *v;
    size_t n, cap;
} tk_spans;

static em_status span_push(tk_spans *sp, size_t a, size_t e, bool flag) {
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 32;
        tk_span *v = realloc(sp->v, cap * sizeof *v);
        if (!v) return oom();
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = (tk_span){a, e, flag};
    return EM_OK;
}

/* tokenizers' Pattern::find_matches: the text cut into matches and what lies between them. */
static em_status find_regex(const tk_regex *re, pcre2_match_data *md, const char *s, size_t n, bool invert,
                            tk_spans *sp) {
    sp->n = 0;
    if (n == 0) return span_push(sp, 0, 0, invert);
    tk_regex_iter it = {0};
    size_t a, e, prev = 0;
    int r;
    em_status st = EM_OK;
    while (st == EM_OK && (r = em__tk_regex_next(re, md, s, n, &it, &a, &e)) == 1) {
        if (prev != a) st = span_push(sp, prev, a, invert);
        if (st == EM_OK) st = span_push(sp, a, e, !invert);
        prev = e;
    }
    if (st != EM_OK) return st;
    if (r < 0) return EM_ERR_NOT_SUPPORTED;   /* recorded by em__tk_regex_next */
    return prev != n ? span_push(sp, prev, n, invert) : EM_OK;
}

/* Each occurrence of one character (its UTF-8 c[0..cn)) is a match. */
static em_status find_char(const char *c, size_t cn, const char *s, size_t n, tk_spans *sp) {
    sp->n = 0;
    if (n == 0) return span_push(sp, 0, 0, false);
    size_t prev = 0;
    em_status st = EM_OK;
    for (size_t i = 0; i + cn <= n && st == EM_OK;) {
        if (memcmp(s + i, c, cn) == 0) {
            if (prev < i) st = span_push(sp, prev, i, false);
            if (st == EM_OK) st = span_push(sp, i, i + cn, true);
            i += cn;
            prev = i;
        } else {
            i++;
        }
    }
    if (st == EM_OK && prev < n) st = span_push(sp, prev, n, false);
    return st;
}

/* tokenizers' NormalizedString::split: the behavior turns the matches into the spans kept
 * (flag false) and removed (flag true), in place. */
static void apply_behavior(tk_spans *sp, tk_split_behavior b) {
    size_t w = 0;
    bool previous_match = false;
    switch (b) {
    case TK_SPLIT_ISOLATED:
        for (size_t i = 0; i < sp->n; i++) sp->v[i].flag = false;
        return;
    case TK_SPLIT_REMOVED:
        return;
    case TK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].flag;
            if (m == previous_match && w > 0) sp->v[w - 1].e = sp->v[i].e;
            else sp->v[w++] = (tk_span){sp->v[i].a, sp->v[i].e, false};
            previous_match = m;
        }
        sp->n = w;
        return;
    case TK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].flag;
            if (m && !previous_match && w > 0) sp->v[w - 1].e = sp->v[i].e;
            else sp->v[w++] = (tk_span){sp->v[i].a, sp->v[i].e, false};
            previous_match = m;
        }
        sp->n = w;
        return;
    case TK_SPLIT_MERGED_WITH_NEXT: {
        /* from the end: a match joins the span after it; written backwards, then reversed */
        size_t n = sp->n;
        for (size_t r = n; r-- > 0;) {
            tk_span x = sp->v[r];
            if (x.flag && !previous_match && w > 0) sp->v[n - w].a = x.a;
            else sp->v[n - 1 - w++] = (tk_span){x.a, x.e, false};
            previous_match = x.flag;
        }
        memmove(sp->v, sp->v + (n - w), w * sizeof *sp->v);
        sp->n = w;
        return;
    }
    }
}

/* Pushes the kept spans of t as pieces; the first keeps at_start when it starts at 0. */
static em_status push_spans(tk_pieces *out, const tk_spans *sp, const char *t, bool at_start, bool byte_level) {
    em_status st = EM_OK;
    for (size_t i = 0; i < sp->n && st == EM_OK; i++) {
        if (sp->v[i].flag || sp->v[i].e == sp->v[i].a) continue;
        bool first = at_start && sp->v[i].a == 0;
        size_t a = sp->v[i].a, len = sp->v[i].e - a;
        st = byte_level ? push_byte_level(out, t + a, len, first) : em__tk_pieces_push(out, t + a, len, -1, first);
    }
    return st;
}

em_status em__tk_pre_tokenize(const em_tokenizer *tok, pcre2_match_data *md, tk_pieces *p, tk_pieces *spare) {
    tk_spans sp = {0};
    tk_buf t = {0};
    em_status st = EM_OK;
    for (size_t k = 0; k < tok->n_pre && st == EM_OK; k++) {
        const tk_pre *pre = &tok->pre[k];
        spare->n = 0;
        spare->text.len = 0;
        for (size_t i = 0; i < p->n && st == EM_OK; i++) {
            const tk_piece *pc = &p->v[i];
            if (pc->token >= 0) {
                st = em__tk_pieces_push(spare, NULL, 0, pc->token, false);
                continue;
            }
            const char *s = p->text.s + pc->off;
            size_t n = pc->len;
            switch (pre->kind) {
            case TK_PRE_SPLIT:
                st = find_regex(&pre->re, md, s, n, pre->invert, &sp);
                if (st == EM_OK) apply_behavior(&sp, pre->behavior);
                if (st == EM_OK) st = push_spans(spare, &sp, s, pc->at_start, false);
                break;
            case TK_PRE_BYTE_LEVEL:
                t.len = 0;
                if (pre->add_prefix_space && n && s[0] != ' ') em__tk_put(&t, " ", 1);
                em__tk_put(&t, s, n);
                if (t.oom) {
                    st = oom();
                    break;
                }
                if (pre->has_re) {
                    st = find_regex(&pre->re, md, t.s, t.len, false, &sp);
                    if (st == EM_OK) apply_behavior(&sp, TK_SPLIT_ISOLATED);
                } else {
                    sp.n = 0;
                    st = span_push(&sp, 0, t.len, false);
                }
                if (st == EM_OK) st = push_spans(spare, &sp, t.s, pc->at_start, true);
                break;
            case TK_PRE_METASPACE: {
                t.len = 0;
                bool starts = n >= pre->replacement_len && !memcmp(s, pre->replacement, pre->replacement_len);
                bool prepend = !(n && s[0] == ' ') && !starts &&   /* a leading space becomes the replacement */
                               (pre->prepend == TK_PREPEND_ALWAYS || (pre->prepend == TK_PREPEND_FIRST && pc->at_start));
                if (prepend && n) em__tk_put(&t, pre->replacement, pre->replacement_len);
                for (size_t j = 0; j < n;) {   /* each space becomes the replacement */
                    const char *sp = memchr(s + j, ' ', n - j);
                    size_t run = sp ? (size_t)(sp - (s + j)) : n - j;
                    em__tk_put(&t, s + j, run);
                    j += run;
                    if (sp) {
                        em__tk_put(&t, pre->replacement, pre->replacement_len);
                        j++;
                    }
                }
                if (t.oom) {
                    st = oom();
                    break;
                }
                if (pre->split) {
                    st = find_char(pre->replacement, pre->replacement_len, t.s, t.len, &sp);
                    if (st == EM_OK) apply_behavior(&sp, TK_SPLIT_MERGED_WITH_NEXT);
                } else {
                    sp.n = 0;
                    st = span_push(&sp, 0, t.len, false);
                }
                if (st == EM_OK) st = push_spans(spare, &sp, t.s, pc->at_start, false);
                break;
            }
            }
        }
        if (st == EM_OK) {
            tk_pieces swap = *p;
            *p = *spare;
            *spare = swap;
        }
    }
    free(sp.v);
    em__tk_free(&t);
    return st;
}

void em__tk_norm_free(tk_norm *n) {
    free(n->text);
    em__tk_regex_free(&n->re);
}

void em__tk_pre_free(tk_pre *p) { em__tk_regex_free(&p->re); }

void em__tk_dec_free(tk_dec *d) {
    em__tk_regex_free(&d->re);
    free(d->literal);
    free(d->text);
}
