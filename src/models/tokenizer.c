/* Loading a tokenizer.json (and a model folder's configs) into em_tokenizer, and the
 * lookups of include/ember/tokenizer.h. Every part of the file is checked as it is read:
 * a wrong type, an unknown component or a token that the vocabulary lacks is an error that
 * names the file and the place in it ("tokenizer.json: model.merges[12]: ..."), and a
 * tokenizer that fails to load frees whatever it had built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../data/json.h"
#include "../data/parsers.h"
#include "tokenizer_internal.h"

typedef struct ld {
    const char *file;
    em_tokenizer *tok;
} ld;

static em_status oom(const ld *l) { return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", l->file); }

static const char *type_name(const em__json *v) {
    if (!v) return "nothing";
    switch (v->type) {
    case EM__JSON_NULL: return "null";
    case EM__JSON_BOOL: return "a boolean";
    case EM__JSON_NUMBER: return "a number";
    case EM__JSON_STRING: return "a string";
    case EM__JSON_ARRAY: return "an array";
    case EM__JSON_OBJECT: return "an object";
    }
    return "a value";
}

static em_status want(const ld *l, const em__json *v, em__json_type t, const char *path, const char *what) {
    if (v && v->type == t) return EM_OK;
    return em_error(EM_ERR_FORMAT, "%s: %s: expected %s, found %s", l->file, path, what, type_name(v));
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* obj[key] as a boolean; absent or null: dflt. */
static em_status get_bool(const ld *l, const em__json *obj, const char *key, const char *path, bool dflt, bool *out) {
    const em__json *v = em__json_get(obj, key);
    *out = dflt;
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    char p[256];
    snprintf(p, sizeof p, "%.200s.%.40s", path, key);
    if (want(l, v, EM__JSON_BOOL, p, "true or false") != EM_OK) return EM_ERR_FORMAT;
    *out = v->b;
    return EM_OK;
}

/* obj[key] as a string (NULL when absent or null and optional). */
static em_status get_string(const ld *l, const em__json *obj, const char *key, const char *path, bool required,
                            const em__json **out) {
    const em__json *v = em__json_get(obj, key);
    *out = NULL;
    if ((!v || v->type == EM__JSON_NULL) && !required) return EM_OK;
    char p[256];
    snprintf(p, sizeof p, "%.200s.%.40s", path, key);
    if (want(l, v, EM__JSON_STRING, p, "a string") != EM_OK) return EM_ERR_FORMAT;
    *out = v;
    return EM_OK;
}

/* A whole number in [0, max] from v. */
static em_status get_index(const ld *l, const em__json *v, const char *path, uint64_t max, uint64_t *out) {
    if (!v || v->type != EM__JSON_NUMBER || !v->is_uint)
        return em_error(EM_ERR_FORMAT, "%s: %s: expected a whole number from 0 to %llu, found %s", l->file, path,
                        (unsigned long long)max, v && v->type == EM__JSON_NUMBER ? "another number" : type_name(v));
    if (v->u > max)
        return em_error(EM_ERR_FORMAT, "%s: %s: %llu is past the largest allowed, %llu", l->file, path,
                        (unsigned long long)v->u, (unsigned long long)max);
    *out = v->u;
    return EM_OK;
}

/* One character as a string (Metaspace's replacement, Strip's content). */
static em_status get_char(const ld *l, const em__json *obj, const char *key, const char *path, char out[5],
                          size_t *len) {
    const em__json *v;
    if (get_string(l, obj, key, path, true, &v) != EM_OK) return EM_ERR_FORMAT;
    uint32_t cp;
    size_t bad;
    bool inc;
    int k = v->len ? em__utf8_char((const unsigned char *)v->str, v->len, &cp, &bad, &inc) : 0;
    if (k <= 0 || (size_t)k != v->len)
        return em_error(EM_ERR_FORMAT, "%s: %s.%s: expected one character, found \"%.40s\"", l->file, path, key, v->str);
    memcpy(out, v->str, v->len);
    out[v->len] = 0;
    *len = v->len;
    return EM_OK;
}

/* A component's "type" (components are objects with one). */
static em_status get_type(const ld *l, const em__json *v, const char *path, const char **type) {
    if (want(l, v, EM__JSON_OBJECT, path, "an object") != EM_OK) return EM_ERR_FORMAT;
    const em__json *t;
    if (get_string(l, v, "type", path, true, &t) != EM_OK) return EM_ERR_FORMAT;
    *type = t->str;
    return EM_OK;
}

static em_status unsupported(const ld *l, const char *path, const char *type, const char *supported) {
    return em_error(EM_ERR_NOT_SUPPORTED, "%s: %s: type \"%.60s\" is not supported (Ember reads %s)", l->file, path,
                    type, supported);
}

/* A pattern {"String": s} or {"Regex": r}. */
static em_status get_pattern(const ld *l, const em__json *obj, const char *path, tk_regex *re) {
    const em__json *v = em__json_get(obj, "pattern");
    char p[256];
    snprintf(p, sizeof p, "%.200s.pattern", path);
    if (want(l, v, EM__JSON_OBJECT, p, "an object {\"String\": ...} or {\"Regex\": ...}") != EM_OK) return EM_ERR_FORMAT;
    const em__json *s = em__json_get(v, "String"), *r = em__json_get(v, "Regex");
    if (v->count != 1 || (!s && !r))
        return em_error(EM_ERR_FORMAT, "%s: %s: expected {\"String\": ...} or {\"Regex\": ...}", l->file, p);
    const em__json *text = s ? s : r;
    char where[300];
    snprintf(where, sizeof where, "%s: %s.%s", l->file, p, s ? "String" : "Regex");
    if (want(l, text, EM__JSON_STRING, where + strlen(l->file) + 2, "a string") != EM_OK) return EM_ERR_FORMAT;
    return em__tk_regex_compile(re, text->str, text->len, s != NULL, where);
}

/* ---- the model ------------------------------------------------------------------------------ */
static em_status load_model(ld *l, const em__json *m) {
    em_tokenizer *tok = l->tok;
    tk_bpe *bpe = &tok->bpe;
    bpe->unk_id = -1;
    const char *type = NULL;
    if (want(l, m, EM__JSON_OBJECT, "model", "an object") != EM_OK) return EM_ERR_FORMAT;
    const em__json *t = em__json_get(m, "type");
    if (t && t->type != EM__JSON_NULL) {
        if (want(l, t, EM__JSON_STRING, "model.type", "a string") != EM_OK) return EM_ERR_FORMAT;
        type = t->str;
    } else if (em__json_get(m, "merges")) {
        type = "BPE";   /* files from before models were tagged: a BPE has merges */
    }
    if (!type) return em_error(EM_ERR_FORMAT, "%s: model: no \"type\" (expected \"BPE\")", l->file);
    if (strcmp(type, "BPE"))
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: model.type: \"%.60s\" is not supported (Ember reads BPE models; "
                        "WordPiece, Unigram and WordLevel are not implemented)", l->file, type);
    const em__json *vocab = em__json_get(m, "vocab"), *merges = em__json_get(m, "merges");
    if (want(l, vocab, EM__JSON_OBJECT, "model.vocab", "an object of token -> id") != EM_OK) return EM_ERR_FORMAT;
    if (!merges) return em_error(EM_ERR_FORMAT, "%s: model.merges: missing (a BPE model needs its merges)", l->file);
    if (want(l, merges, EM__JSON_ARRAY, "model.merges", "an array") != EM_OK) return EM_ERR_FORMAT;

    const em__json *dropout = em__json_get(m, "dropout");
    if (dropout && dropout->type != EM__JSON_NULL) {
        if (want(l, dropout, EM__JSON_NUMBER, "model.dropout", "null or a number") != EM_OK) return EM_ERR_FORMAT;
        if (dropout->num != 0)
            return em_error(EM_ERR_NOT_SUPPORTED, "%s: model.dropout: %g is not supported (BPE dropout draws at random; "
                            "Ember encodes deterministically: expected null or 0)", l->file, dropout->num);
    }
    const em__json *prefix, *suffix, *unk;
    if (get_string(l, m, "continuing_subword_prefix", "model", false, &prefix) != EM_OK ||
        get_string(l, m, "end_of_word_suffix", "model", false, &suffix) != EM_OK ||
        get_string(l, m, "unk_token", "model", false, &unk) != EM_OK ||
        get_bool(l, m, "fuse_unk", "model", false, &bpe->fuse_unk) != EM_OK ||
        get_bool(l, m, "byte_fallback", "model", false, &bpe->byte_fallback) != EM_OK ||
        get_bool(l, m, "ignore_merges", "model", false, &bpe->ignore_merges) != EM_OK)
        return EM_ERR_FORMAT;
    if (prefix && prefix->len) {
        if (!(bpe->prefix = dup_bytes(prefix->str, prefix->len))) return oom(l);
        bpe->prefix_len = prefix->len;
    }
    if (suffix && suffix->len) {
        if (!(bpe->suffix = dup_bytes(suffix->str, suffix->len))) return oom(l);
        bpe->suffix_len = suffix->len;
    }

    size_t pool = 0;
    for (int k = 0; k < vocab->count; k++) pool += strlen(vocab->keys[k]) + 1;
    if (em__tk_strmap_init(&bpe->vocab, (size_t)vocab->count, pool) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < vocab->count; k++) {
        const em__json *v = &vocab->items[k];
        uint64_t id = v->u;
        if (v->type != EM__JSON_NUMBER || !v->is_uint || v->u >= TK_MAX_IDS) {   /* the message's path only when needed */
            char p[80];
            snprintf(p, sizeof p, "model.vocab[\"%.40s\"]", vocab->keys[k]);
            if (get_index(l, v, p, TK_MAX_IDS - 1, &id) != EM_OK) return EM_ERR_FORMAT;
        }
        if (em__tk_strmap_add(&bpe->vocab, vocab->keys[k], strlen(vocab->keys[k]), (int32_t)id, NULL, NULL) != EM_OK)
            return EM_ERR_OUT_OF_MEMORY;
        if ((int32_t)id >= tok->n_ids) tok->n_ids = (int32_t)id + 1;
    }
    if (unk) {
        bpe->unk_id = em__tk_strmap_get(&bpe->vocab, unk->str, unk->len);
        if (bpe->unk_id < 0)
            return em_error(EM_ERR_FORMAT, "%s: model.unk_token: \"%.60s\" is not in the vocabulary", l->file, unk->str);
    }

    for (int k = 0; k < merges->count; k++) {
        const em__json *e = &merges->items[k];
        const char *a, *b;
        size_t na, nb;
        if (e->type == EM__JSON_STRING) {   /* "a b", the older form: exactly one space */
            const char *sp = memchr(e->str, ' ', e->len);
            if (!sp || memchr(sp + 1, ' ', e->len - (size_t)(sp + 1 - e->str)))
                return em_error(EM_ERR_FORMAT, "%s: model.merges[%d]: expected two tokens separated by one space, found "
                                "\"%.60s\"", l->file, k, e->str);
            a = e->str;
            na = (size_t)(sp - e->str);
            b = sp + 1;
            nb = e->len - na - 1;
        } else if (e->type == EM__JSON_ARRAY && e->count == 2 && e->items[0].type == EM__JSON_STRING &&
                   e->items[1].type == EM__JSON_STRING) {
            a = e->items[0].str;
            na = e->items[0].len;
            b = e->items[1].str;
            nb = e->items[1].len;
        } else {
            return em_error(EM_ERR_FORMAT, "%s: model.merges[%d]: expected a pair [\"a\", \"b\"] or a string \"a b\", "
                            "found %s", l->file, k, type_name(e));
        }
        if (em__tk_bpe_add_merge(bpe, a, na, b, nb, k, l->file, (size_t)k) != EM_OK) return em_last_status();
    }
    return em__tk_bpe_finish(bpe, (size_t)merges->count);
}

/* ---- added tokens ------------------------------------------------------------------------------ */
static em_status load_added(ld *l, const em__json *arr) {
    em_tokenizer *tok = l->tok;
    if (!arr || arr->type == EM__JSON_NULL) return EM_OK;
    if (want(l, arr, EM__JSON_ARRAY, "added_tokens", "an array") != EM_OK) return EM_ERR_FORMAT;
    tok->added = calloc((size_t)arr->count + 1, sizeof *tok->added);
    if (!tok->added) return oom(l);
    for (int k = 0; k < arr->count; k++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", k);
        const em__json *e = &arr->items[k], *content;
        if (want(l, e, EM__JSON_OBJECT, path, "an object") != EM_OK) return EM_ERR_FORMAT;
        tk_added a = {0};
        uint64_t id;
        char p[80];
        snprintf(p, sizeof p, "%.200s.id", path);
        if (get_index(l, em__json_get(e, "id"), p, TK_MAX_IDS - 1, &id) != EM_OK ||
            get_string(l, e, "content", path, true, &content) != EM_OK ||
            get_bool(l, e, "special", path, false, &a.special) != EM_OK ||
            get_bool(l, e, "single_word", path, false, &a.single_word) != EM_OK ||
            get_bool(l, e, "lstrip", path, false, &a.lstrip) != EM_OK ||
            get_bool(l, e, "rstrip", path, false, &a.rstrip) != EM_OK ||
            get_bool(l, e, "normalized", path, !a.special, &a.normalized) != EM_OK)
            return EM_ERR_FORMAT;
        if (!content->len) continue;   /* tokenizers ignores an empty token */
        a.id = (int32_t)id;
        a.content = dup_bytes(content->str, content->len);
        if (!a.content) return oom(l);
        a.content_len = content->len;
        tok->added[tok->n_added++] = a;
        if (a.id >= tok->n_ids) tok->n_ids = a.id + 1;
    }
    return EM_OK;
}

/* The normalized form of each normalized added token (what is searched for in normalized
 * text, and what decoding starts from), once the normalizer is known. */
static em_status normalize_added(ld *l) {
    em_tokenizer *tok = l->tok;
    tk_buf b = {0};
    em_status st = EM_OK;
    for (size_t k = 0; k < tok->n_added && st == EM_OK; k++) {
        tk_added *a = &tok->added[k];
        const char *m = a->content;
        size_t n = a->content_len;
        if (a->normalized && tok->n_norm) {
            st = em__tk_normalize(tok, a->content, a->content_len, &b);
            m = b.s;
            n = b.len;
        }
        if (st == EM_OK && !(a->match = dup_bytes(m ? m : "", n))) st = oom(l);
        a->match_len = n;
    }
    em__tk_free(&b);
    return st;
}

/* ---- normalizers ------------------------------------------------------------------------------- */
static em_status add_norm(ld *l, tk_norm n) {
    em_tokenizer *tok = l->tok;
    tk_norm *v = realloc(tok->norm, (tok->n_norm + 1) * sizeof *v);
    if (!v) {
        em__tk_norm_free(&n);
        return oom(l);
    }
    tok->norm = v;
    tok->norm[tok->n_norm++] = n;
    return EM_OK;
}

static em_status load_normalizer(ld *l, const em__json *v, const char *path) {
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    const char *type;
    if (get_type(l, v, path, &type) != EM_OK) return EM_ERR_FORMAT;
    tk_norm n = {0};
    if (!strcmp(type, "Sequence")) {
        const em__json *list = em__json_get(v, "normalizers");
        char p[256];
        snprintf(p, sizeof p, "%.200s.normalizers", path);
        if (want(l, list, EM__JSON_ARRAY, p, "an array") != EM_OK) return EM_ERR_FORMAT;
        for (int k = 0; k < list->count; k++) {
            char pk[256];
            snprintf(pk, sizeof pk, "%.200s[%d]", p, k);
            if (load_normalizer(l, &list->items[k], pk) != EM_OK) return em_last_status();
        }
        return EM_OK;
    }
    if (!strcmp(type, "Prepend")) {
        const em__json *s;
        if (get_string(l, v, "prepend", path, true, &s) != EM_OK) return EM_ERR_FORMAT;
        n.kind = TK_NORM_PREPEND;
        if (!(n.text = dup_bytes(s->str, s->len))) return oom(l);
        n.text_len = s->len;
    } else if (!strcmp(type, "Replace")) {
        const em__json *s;
        if (get_string(l, v, "content", path, true, &s) != EM_OK) return EM_ERR_FORMAT;
        n.kind = TK_NORM_REPLACE;
        if (!(n.text = dup_bytes(s->str, s->len))) return oom(l);
        n.text_len = s->len;
        if (get_pattern(l, v, path, &n.re) != EM_OK) {
            em__tk_norm_free(&n);
            return em_last_status();
        }
    } else if (!strcmp(type, "Strip")) {
        n.kind = TK_NORM_STRIP;
        if (get_bool(l, v, "strip_left", path, true, &n.left) != EM_OK ||
            get_bool(l, v, "strip_right", path, true, &n.right) != EM_OK)
            return EM_ERR_FORMAT;
    } else if (!strcmp(type, "ByteLevel")) {
        n.kind = TK_NORM_BYTE_LEVEL;
    } else if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
#ifdef EMBER_HAVE_ICU
        n.kind = !strcmp(type, "NFC") ? TK_NORM_NFC : !strcmp(type, "NFD") ? TK_NORM_NFD
                 : !strcmp(type, "NFKC") ? TK_NORM_NFKC : TK_NORM_NFKD;
#else
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: %s: the %s normalizer needs Unicode normalization, and this build of "
                        "Ember has none (it was built without ICU: install libicu-dev and rebuild)", l->file, path, type);
#endif
    } else {
        return unsupported(l, path, type, "the normalizers Sequence, Prepend, Replace, Strip, ByteLevel, NFC, NFD, "
                           "NFKC and NFKD");
    }
    return add_norm(l, n);
}

/* ---- pre-tokenizers ------------------------------------------------------------------------------- */
static em_status add_pre(ld *l, tk_pre p) {
    em_tokenizer *tok = l->tok;
    tk_pre *v = realloc(tok->pre, (tok->n_pre + 1) * sizeof *v);
    if (!v) {
        em__tk_pre_free(&p);
        return oom(l);
    }
    tok->pre = v;
    tok->pre[tok->n_pre++] = p;
    return EM_OK;
}

static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static em_status get_prepend(const ld *l, const em__json *v, const char *path, tk_prepend *out) {
    const em__json *scheme;
    bool legacy_prefix = true;
    if (get_string(l, v, "prepend_scheme", path, false, &scheme) != EM_OK ||
        get_bool(l, v, "add_prefix_space", path, true, &legacy_prefix) != EM_OK)
        return EM_ERR_FORMAT;
    *out = TK_PREPEND_ALWAYS;
    if (scheme) {
        if (!strcmp(scheme->str, "always")) *out = TK_PREPEND_ALWAYS;
        else if (!strcmp(scheme->str, "first")) *out = TK_PREPEND_FIRST;
        else if (!strcmp(scheme->str, "never")) *out = TK_PREPEND_NEVER;
        else return em_error(EM_ERR_FORMAT, "%s: %s.prepend_scheme: expected \"always\", \"first\" or \"never\", found "
                             "\"%.40s\"", l->file, path, scheme->str);
    }
    if (!legacy_prefix) {   /* the older add_prefix_space: false means never */
        if (scheme && *out != TK_PREPEND_NEVER)
            return em_error(EM_ERR_FORMAT, "%s: %s: add_prefix_space false does not match prepend_scheme \"%s\"", l->file,
                            path, scheme->str);
        *out = TK_PREPEND_NEVER;
    }
    return EM_OK;
}

static em_status load_pre(ld *l, const em__json *v, const char *path) {
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    const char *type;
    if (get_type(l, v, path, &type) != EM_OK) return EM_ERR_FORMAT;
    tk_pre p = {0};
    char where[300];
    snprintf(where, sizeof where, "%s: %s", l->file, path);
    if (!strcmp(type, "Sequence")) {
        const em__json *list = em__json_get(v, "pretokenizers");
        char pl[256];
        snprintf(pl, sizeof pl, "%.200s.pretokenizers", path);
        if (want(l, list, EM__JSON_ARRAY, pl, "an array") != EM_OK) return EM_ERR_FORMAT;
        for (int k = 0; k < list->count; k++) {
            char pk[256];
            snprintf(pk, sizeof pk, "%.200s[%d]", pl, k);
            if (load_pre(l, &list->items[k], pk) != EM_OK) return em_last_status();
        }
        return EM_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex;
        p.kind = TK_PRE_BYTE_LEVEL;
        if (get_bool(l, v, "add_prefix_space", path, true, &p.add_prefix_space) != EM_OK ||
            get_bool(l, v, "use_regex", path, true, &use_regex) != EM_OK)
            return EM_ERR_FORMAT;
        if (use_regex) {
            if (em__tk_regex_compile(&p.re, gpt2_pattern, strlen(gpt2_pattern), false, where) != EM_OK)
                return em_last_status();
            p.has_re = true;
        }
    } else if (!strcmp(type, "Split")) {
        const em__json *behavior;
        p.kind = TK_PRE_SPLIT;
        if (get_string(l, v, "behavior", path, true, &behavior) != EM_OK ||
            get_bool(l, v, "invert", path, false, &p.invert) != EM_OK)
            return EM_ERR_FORMAT;
        static const struct { const char *name; tk_split_behavior b; } behaviors[] = {
            {"Removed", TK_SPLIT_REMOVED}, {"Isolated", TK_SPLIT_ISOLATED},
            {"MergedWithPrevious", TK_SPLIT_MERGED_WITH_PREVIOUS}, {"MergedWithNext", TK_SPLIT_MERGED_WITH_NEXT},
            {"Contiguous", TK_SPLIT_CONTIGUOUS}};
        size_t k = 0;
        while (k < sizeof behaviors / sizeof behaviors[0] && strcmp(behaviors[k].name, behavior->str)) k++;
        if (k == sizeof behaviors / sizeof behaviors[0])
            return em_error(EM_ERR_FORMAT, "%s: %s.behavior: expected Removed, Isolated, MergedWithPrevious, "
                            "MergedWithNext or Contiguous, found \"%.40s\"", l->file, path, behavior->str);
        p.behavior = behaviors[k].b;
        if (get_pattern(l, v, path, &p.re) != EM_OK) return em_last_status();
        p.has_re = true;
    } else if (!strcmp(type, "Metaspace")) {
        p.kind = TK_PRE_METASPACE;
        if (get_char(l, v, "replacement", path, p.replacement, &p.replacement_len) != EM_OK ||
            get_prepend(l, v, path, &p.prepend) != EM_OK || get_bool(l, v, "split", path, true, &p.split) != EM_OK)
            return EM_ERR_FORMAT;
    } else if (!strcmp(type, "Digits")) {   /* each number character, alone or in runs */
        bool individual;
        if (get_bool(l, v, "individual_digits", path, false, &individual) != EM_OK) return EM_ERR_FORMAT;
        p.kind = TK_PRE_SPLIT;
        p.behavior = individual ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS;
        if (em__tk_regex_compile_pcre2(&p.re, "\\p{N}", where) != EM_OK) return em_last_status();
        p.has_re = true;
    } else if (!strcmp(type, "WhitespaceSplit")) {   /* on each white-space character, which is removed */
        p.kind = TK_PRE_SPLIT;
        p.behavior = TK_SPLIT_REMOVED;
        if (em__tk_regex_compile_pcre2(&p.re, "\\p{White_Space}", where) != EM_OK) return em_last_status();
        p.has_re = true;
    } else {
        return unsupported(l, path, type, "the pre-tokenizers Sequence, ByteLevel, Split, Metaspace, Digits and "
                           "WhitespaceSplit");
    }
    return add_pre(l, p);
}

/* ---- the post-processor ------------------------------------------------------------------------ */
/* The ids a post-processor puts around the sequence, composed with those of the ones before
 * it (a Sequence runs them in order: each wraps what the previous gave). */
typedef struct tk_ids {
    int32_t *v;
    size_t n;
} tk_ids;

static em_status ids_append(tk_ids *a, const int32_t *v, size_t n) {
    int32_t *nv = realloc(a->v, (a->n + n + 1) * sizeof *nv);
    if (!nv) return EM_ERR_OUT_OF_MEMORY;
    if (n) memcpy(nv + a->n, v, n * sizeof *v);
    a->v = nv;
    a->n += n;
    return EM_OK;
}

static em_status wrap(ld *l, const tk_ids *before, const tk_ids *after) {
    em_tokenizer *tok = l->tok;
    tk_ids b = {0}, a = {.v = tok->post_after, .n = tok->n_post_after};
    if (ids_append(&b, before->v, before->n) != EM_OK || ids_append(&b, tok->post_before, tok->n_post_before) != EM_OK) {
        free(b.v);
        return oom(l);
    }
    free(tok->post_before);
    tok->post_before = b.v;
    tok->n_post_before = b.n;
    if (ids_append(&a, after->v, after->n) != EM_OK) return oom(l);
    tok->post_after = a.v;
    tok->n_post_after = a.n;
    return EM_OK;
}

/* A ["token", id] pair (Roberta's and Bert's cls and sep). */
static em_status get_token_pair(const ld *l, const em__json *v, const char *key, const char *path, int32_t *id) {
    const em__json *e = em__json_get(v, key);
    char p[256];
    snprintf(p, sizeof p, "%.200s.%.40s", path, key);
    if (!e || e->type != EM__JSON_ARRAY || e->count != 2 || e->items[0].type != EM__JSON_STRING)
        return em_error(EM_ERR_FORMAT, "%s: %s: expected [\"token\", id], found %s", l->file, p, type_name(e));
    uint64_t u;
    if (get_index(l, &e->items[1], p, TK_MAX_IDS - 1, &u) != EM_OK) return EM_ERR_FORMAT;
    *id = (int32_t)u;
    return EM_OK;
}

static em_status load_template(ld *l, const em__json *v, const char *path, tk_ids *before, tk_ids *after) {
    const em__json *single = em__json_get(v, "single"), *specials = em__json_get(v, "special_tokens");
    char p[256];
    snprintf(p, sizeof p, "%.200s.single", path);
    if (want(l, single, EM__JSON_ARRAY, p, "an array of pieces") != EM_OK) return EM_ERR_FORMAT;
    bool seen_sequence = false;
    for (int k = 0; k < single->count; k++) {
        const em__json *piece = &single->items[k];
        char pk[300];
        snprintf(pk, sizeof pk, "%.200s[%d]", p, k);
        const em__json *sp = em__json_get(piece, "SpecialToken"), *seq = em__json_get(piece, "Sequence");
        if (piece->type != EM__JSON_OBJECT || piece->count != 1 || (!sp && !seq))
            return em_error(EM_ERR_FORMAT, "%s: %s: expected {\"SpecialToken\": ...} or {\"Sequence\": ...}", l->file, pk);
        if (seq) {
            if (seen_sequence)
                return em_error(EM_ERR_FORMAT, "%s: %s: the single template has a second sequence", l->file, pk);
            seen_sequence = true;
            continue;
        }
        const em__json *name;
        if (want(l, sp, EM__JSON_OBJECT, pk, "an object") != EM_OK ||
            get_string(l, sp, "id", pk, true, &name) != EM_OK)
            return EM_ERR_FORMAT;
        const em__json *def = specials && specials->type == EM__JSON_OBJECT ? em__json_get(specials, name->str) : NULL;
        if (!def)
            return em_error(EM_ERR_FORMAT, "%s: %s: the special token \"%.60s\" is not in %s.special_tokens", l->file,
                            pk, name->str, path);
        const em__json *ids = em__json_get(def, "ids");
        char pi[300];
        snprintf(pi, sizeof pi, "%s.special_tokens[\"%.40s\"].ids", path, name->str);
        if (want(l, ids, EM__JSON_ARRAY, pi, "an array of ids") != EM_OK) return EM_ERR_FORMAT;
        for (int i = 0; i < ids->count; i++) {
            uint64_t u;
            if (get_index(l, &ids->items[i], pi, TK_MAX_IDS - 1, &u) != EM_OK) return EM_ERR_FORMAT;
            int32_t id = (int32_t)u;
            if (ids_append(seen_sequence ? after : before, &id, 1) != EM_OK) return oom(l);
            if (id >= l->tok->n_ids) l->tok->n_ids = id + 1;
        }
    }
    if (!seen_sequence)
        return em_error(EM_ERR_FORMAT, "%s: %s: the single template has no sequence ($A)", l->file, p);
    return EM_OK;
}

static em_status load_post(ld *l, const em__json *v, const char *path) {
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    const char *type;
    if (get_type(l, v, path, &type) != EM_OK) return EM_ERR_FORMAT;
    tk_ids before = {0}, after = {0};
    em_status st = EM_OK;
    if (!strcmp(type, "Sequence")) {
        const em__json *list = em__json_get(v, "processors");
        char pl[256];
        snprintf(pl, sizeof pl, "%.200s.processors", path);
        if (want(l, list, EM__JSON_ARRAY, pl, "an array") != EM_OK) return EM_ERR_FORMAT;
        for (int k = 0; k < list->count; k++) {
            char pk[256];
            snprintf(pk, sizeof pk, "%.200s[%d]", pl, k);
            if (load_post(l, &list->items[k], pk) != EM_OK) return em_last_status();
        }
        return EM_OK;
    }
    if (!strcmp(type, "ByteLevel")) return EM_OK;   /* it only moves offsets */
    if (!strcmp(type, "TemplateProcessing")) {
        st = load_template(l, v, path, &before, &after);
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        st = get_token_pair(l, v, "cls", path, &cls);
        if (st == EM_OK) st = get_token_pair(l, v, "sep", path, &sep);
        if (st == EM_OK && (ids_append(&before, &cls, 1) != EM_OK || ids_append(&after, &sep, 1) != EM_OK)) st = oom(l);
        if (st == EM_OK && (cls >= l->tok->n_ids || sep >= l->tok->n_ids))
            l->tok->n_ids = (cls > sep ? cls : sep) + 1;
    } else {
        st = unsupported(l, path, type, "the post-processors TemplateProcessing, ByteLevel, RobertaProcessing, "
                         "BertProcessing and Sequence");
    }
    if (st == EM_OK) st = wrap(l, &before, &after);
    free(before.v);
    free(after.v);
    return st;
}

/* ---- the decoder ----------------------------------------------------------------------------------- */
static em_status add_dec(ld *l, tk_dec d) {
    em_tokenizer *tok = l->tok;
    tk_dec *v = realloc(tok->dec, (tok->n_dec + 1) * sizeof *v);
    if (!v) {
        em__tk_dec_free(&d);
        return oom(l);
    }
    tok->dec = v;
    tok->dec[tok->n_dec++] = d;
    return EM_OK;
}

/* Decoders Ember cannot run are not an error here: they are noted in *unsupported (the first
 * one) and decoding reports it, so that the tokenizer still encodes. */
static em_status load_decoder(ld *l, const em__json *v, const char *path, char **unsupported_note) {
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    const char *type;
    if (get_type(l, v, path, &type) != EM_OK) return EM_ERR_FORMAT;
    tk_dec d = {0};
    char where[300];
    snprintf(where, sizeof where, "%s: %s", l->file, path);
    if (!strcmp(type, "Sequence")) {
        const em__json *list = em__json_get(v, "decoders");
        char pl[256];
        snprintf(pl, sizeof pl, "%.200s.decoders", path);
        if (want(l, list, EM__JSON_ARRAY, pl, "an array") != EM_OK) return EM_ERR_FORMAT;
        for (int k = 0; k < list->count; k++) {
            char pk[256];
            snprintf(pk, sizeof pk, "%.200s[%d]", pl, k);
            if (load_decoder(l, &list->items[k], pk, unsupported_note) != EM_OK) return em_last_status();
        }
        return EM_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        d.kind = TK_DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = TK_DEC_FUSE;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = TK_DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = TK_DEC_METASPACE;
        if (get_char(l, v, "replacement", path, d.content, &d.content_len) != EM_OK ||
            get_prepend(l, v, path, &d.prepend) != EM_OK)
            return EM_ERR_FORMAT;
    } else if (!strcmp(type, "Strip")) {
        uint64_t start, stop;
        d.kind = TK_DEC_STRIP;
        char ps[280];
        snprintf(ps, sizeof ps, "%.200s.start", path);
        if (get_char(l, v, "content", path, d.content, &d.content_len) != EM_OK ||
            get_index(l, em__json_get(v, "start"), ps, 1u << 20, &start) != EM_OK)
            return EM_ERR_FORMAT;
        snprintf(ps, sizeof ps, "%.200s.stop", path);
        if (get_index(l, em__json_get(v, "stop"), ps, 1u << 20, &stop) != EM_OK) return EM_ERR_FORMAT;
        d.start = (size_t)start;
        d.stop = (size_t)stop;
    } else if (!strcmp(type, "Replace")) {
        const em__json *s;
        d.kind = TK_DEC_REPLACE;
        if (get_string(l, v, "content", path, true, &s) != EM_OK) return EM_ERR_FORMAT;
        if (!(d.text = dup_bytes(s->str, s->len))) return oom(l);
        d.text_len = s->len;
        if (get_pattern(l, v, path, &d.re) != EM_OK) {
            em__tk_dec_free(&d);
            return em_last_status();
        }
    } else {
        if (!*unsupported_note) {
            size_t n = strlen(where) + strlen(type) + 200;
            if ((*unsupported_note = malloc(n)))
                snprintf(*unsupported_note, n, "%s: the decoder \"%s\" is not supported (Ember decodes with ByteLevel, "
                         "Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence)", where, type);
        }
        return EM_OK;
    }
    return add_dec(l, d);
}

/* Where the tokens become one text (the first Fuse or ByteLevel) and what may follow it. */
static em_status place_fuse(ld *l, char **note) {
    em_tokenizer *tok = l->tok;
    tok->n_dec_tokens = tok->n_dec;
    for (size_t k = 0; k < tok->n_dec; k++)
        if (tok->dec[k].kind == TK_DEC_FUSE || tok->dec[k].kind == TK_DEC_BYTE_LEVEL) {
            tok->n_dec_tokens = k;
            tok->byte_level_fuse = tok->dec[k].kind == TK_DEC_BYTE_LEVEL;
            break;
        }
    /* after the fuse the text is one token: Strip works on it as it grows; another Fuse
     * changes nothing; the others would need the whole text */
    for (size_t k = tok->n_dec_tokens + 1; k < tok->n_dec && !*note; k++) {
        tk_dec_kind kind = tok->dec[k].kind;
        if (kind == TK_DEC_STRIP || kind == TK_DEC_FUSE) continue;
        size_t n = strlen(l->file) + 200;
        if ((*note = malloc(n)))
            snprintf(*note, n, "%s: decoder: a %s after the tokens are fused is not supported (only Strip)", l->file,
                     kind == TK_DEC_REPLACE ? "Replace" : kind == TK_DEC_METASPACE ? "Metaspace"
                     : kind == TK_DEC_BYTE_LEVEL ? "ByteLevel" : "ByteFallback");
    }
    return EM_OK;
}

/* ---- the whole file ---------------------------------------------------------------------------------- */
static em_status build_ids(ld *l) {
    em_tokenizer *tok = l->tok;
    if (tok->n_ids <= 0) return em_error(EM_ERR_FORMAT, "%s: the vocabulary is empty", l->file);
    tok->ids = malloc((size_t)tok->n_ids * sizeof *tok->ids);
    if (!tok->ids) return oom(l);
    for (int32_t i = 0; i < tok->n_ids; i++) tok->ids[i] = (struct tk_id){0, UINT32_MAX, -1};
    const tk_strmap *v = &tok->bpe.vocab;
    for (size_t e = v->n; e-- > 0;)   /* an id given to two strings: the first, as written */
        tok->ids[v->val[e]] = (struct tk_id){v->off[e], v->len[e], -1};
    for (size_t k = 0; k < tok->n_added; k++) tok->ids[tok->added[k].id].added = (int32_t)k;
    return EM_OK;
}

static em_status load_document(ld *l, const em__json *root) {
    em_tokenizer *tok = l->tok;
    if (want(l, root, EM__JSON_OBJECT, "the top level", "an object") != EM_OK) return EM_ERR_FORMAT;
    const em__json *model = em__json_get(root, "model");
    if (!model) return em_error(EM_ERR_FORMAT, "%s: no \"model\": not a tokenizer.json", l->file);
    char *note = NULL;
    em_status st = load_model(l, model);
    if (st == EM_OK) st = load_added(l, em__json_get(root, "added_tokens"));
    if (st == EM_OK) st = load_normalizer(l, em__json_get(root, "normalizer"), "normalizer");
    if (st == EM_OK) st = load_pre(l, em__json_get(root, "pre_tokenizer"), "pre_tokenizer");
    if (st == EM_OK) st = load_post(l, em__json_get(root, "post_processor"), "post_processor");
    const em__json *dec = em__json_get(root, "decoder");
    tok->no_decoder = !dec || dec->type == EM__JSON_NULL;
    if (st == EM_OK) st = load_decoder(l, dec, "decoder", &note);
    if (st == EM_OK) st = place_fuse(l, &note);
    tok->decoder_error = note;
    if (st == EM_OK) st = normalize_added(l);
    if (st == EM_OK) st = build_ids(l);
    if (st == EM_OK) {
        for (size_t k = 0; k < tok->n_added; k++) {
            tok->has_raw_trie |= !tok->added[k].normalized;
            tok->has_norm_trie |= tok->added[k].normalized;
            tok->has_word_char |= tok->added[k].single_word;
        }
        if (tok->has_raw_trie) st = em__tk_trie_build(&tok->raw_trie, tok->added, tok->n_added, false);
        if (st == EM_OK && tok->has_norm_trie) st = em__tk_trie_build(&tok->norm_trie, tok->added, tok->n_added, true);
        if (st == EM_OK && tok->has_word_char)   /* Rust's regex \w, which single_word tests with */
            st = em__tk_regex_compile_pcre2(&tok->word_char, "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                                            "single_word");
    }
    /* BOS and EOS from the template: the ids it puts before and after the sequence */
    tok->bos = tok->n_post_before ? tok->post_before[0] : -1;
    if (st == EM_OK && tok->n_post_after) {
        if (!(tok->eos = malloc(sizeof *tok->eos))) return oom(l);
        tok->eos[0] = tok->post_after[tok->n_post_after - 1];
        tok->n_eos = 1;
    }
    return st;
}

void em_tokenizer_free(em_tokenizer *tok) {
    if (!tok) return;
    em__tk_bpe_free(&tok->bpe);
    free(tok->ids);
    for (size_t k = 0; k < tok->n_added; k++) {
        free(tok->added[k].content);
        free(tok->added[k].match);
    }
    free(tok->added);
    em__tk_trie_free(&tok->raw_trie);
    em__tk_trie_free(&tok->norm_trie);
    em__tk_regex_free(&tok->word_char);
    for (size_t k = 0; k < tok->n_norm; k++) em__tk_norm_free(&tok->norm[k]);
    free(tok->norm);
    for (size_t k = 0; k < tok->n_pre; k++) em__tk_pre_free(&tok->pre[k]);
    free(tok->pre);
    free(tok->post_before);
    free(tok->post_after);
    for (size_t k = 0; k < tok->n_dec; k++) em__tk_dec_free(&tok->dec[k]);
    free(tok->dec);
    free(tok->decoder_error);
    free(tok->eos);
    free(tok->name);
    free(tok);
}

static em_tokenizer *from_json(const char *text, size_t len, const char *name) {
    em_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->name = dup_bytes(name, strlen(name)))) {
        free(tok);
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        return NULL;
    }
    tok->bos = tok->pad = tok->unk = -1;
    ld l = {.file = tok->name, .tok = tok};
    /* UTF-8 throughout, as tokenizers reads the file (a string): every token, pattern and
     * replacement is then valid text */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t bad;
        bool incomplete;
        int k = (unsigned char)text[i] < 0x80 ? 1 : em__utf8_char((const unsigned char *)text + i, len - i, &cp, &bad,
                                                                  &incomplete);
        if (!k) {
            em_error(EM_ERR_FORMAT, "%s: not UTF-8 at byte %zu (a tokenizer.json is UTF-8 text)", tok->name, i);
            em_tokenizer_free(tok);
            return NULL;
        }
        i += (size_t)k;
    }
    em__json root;
    if (em__json_parse_file(tok->name, text, len, &root) != EM_OK) {
        em_tokenizer_free(tok);
        return NULL;
    }
    em_status st = load_document(&l, &root);
    em__json_free(&root);
    if (st != EM_OK) {
        em_tokenizer_free(tok);
        return NULL;
    }
    tok->unk = tok->bpe.unk_id;
    return tok;
}

em_tokenizer *em_tokenizer_from_json(const char *json, size_t len, const char *name) {
    if (!json && len) {
        em_error(EM_ERR_ARGUMENT, "em_tokenizer_from_json: json is NULL");
        return NULL;
    }
    return from_json(json ? json : "", len, name ? name : "tokenizer.json");
}

/* ---- a model folder's configs ------------------------------------------------------------------------- */
static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static char *join_path(const char *dir, const char *file) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", file);
    return p;
}

/* Parses path when it exists: *root filled and *found true; an unreadable or bad file is an error. */
static em_status read_config(const char *path, em__json *root, bool *found) {
    *found = false;
    struct stat st;
    if (stat(path, &st) != 0) return EM_OK;
    em__file_map m;
    if (em__file_map_open(path, &m) != EM_OK) return em_last_status();
    em_status s = em__json_parse_file(path, (const char *)m.data, m.len, root);
    em__file_map_close(&m);
    if (s != EM_OK) return s;
    *found = true;
    if (root->type != EM__JSON_OBJECT) {
        em__json_free(root);
        return em_error(EM_ERR_FORMAT, "%s: expected an object at the top level, found %s", path, type_name(root));
    }
    return EM_OK;
}

/* tokenizer_config.json's bos_token (a string, or an added token's object with "content"). */
static em_status config_token(em_tokenizer *tok, const char *file, const em__json *cfg, const char *key, int64_t *id) {
    const em__json *v = em__json_get(cfg, key);
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    if (v->type == EM__JSON_OBJECT) v = em__json_get(v, "content");
    if (!v || v->type != EM__JSON_STRING)
        return em_error(EM_ERR_FORMAT, "%s: %s: expected a token (a string or an object with \"content\"), found %s",
                        file, key, type_name(v));
    int64_t found = em_tokenizer_token_to_id(tok, v->str, v->len);
    if (found < 0)
        return em_error(EM_ERR_FORMAT, "%s: %s: \"%.60s\" is not a token of the tokenizer", file, key, v->str);
    *id = found;
    return EM_OK;
}

/* generation_config.json's or config.json's *_token_id: an id, or for eos a list of ids. */
static em_status config_ids(em_tokenizer *tok, const char *file, const em__json *cfg, const char *key, bool list,
                            int64_t *one) {
    const em__json *v = em__json_get(cfg, key);
    if (!v || v->type == EM__JSON_NULL) return EM_OK;
    ld l = {.file = file, .tok = tok};
    uint64_t u;
    if (v->type == EM__JSON_ARRAY && list) {
        if (v->count == 0) return EM_OK;
        int64_t *ids = malloc((size_t)v->count * sizeof *ids);
        if (!ids) return oom(&l);
        for (int k = 0; k < v->count; k++) {
            char p[64];
            snprintf(p, sizeof p, "%.40s[%d]", key, k);
            if (get_index(&l, &v->items[k], p, (uint64_t)tok->n_ids - 1, &u) != EM_OK) {
                free(ids);
                return EM_ERR_FORMAT;
            }
            ids[k] = (int64_t)u;
        }
        free(tok->eos);
        tok->eos = ids;
        tok->n_eos = (size_t)v->count;
        return EM_OK;
    }
    if (get_index(&l, v, key, (uint64_t)tok->n_ids - 1, &u) != EM_OK) return EM_ERR_FORMAT;
    if (!list) {
        *one = (int64_t)u;
        return EM_OK;
    }
    int64_t *ids = realloc(tok->eos, sizeof *ids);
    if (!ids) return oom(&l);
    ids[0] = (int64_t)u;
    tok->eos = ids;
    tok->n_eos = 1;
    return EM_OK;
}

static em_status set_eos(em_tokenizer *tok, int64_t id) {
    int64_t *ids = realloc(tok->eos, sizeof *ids);
    if (!ids) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", tok->name);
    ids[0] = id;
    tok->eos = ids;
    tok->n_eos = 1;
    return EM_OK;
}

/* The special ids of a folder: tokenizer_config.json's token names, then config.json's and
 * generation_config.json's ids (the last wins: it is what generation uses). */
static em_status load_configs(em_tokenizer *tok, const char *dir) {
    const char *files[] = {"tokenizer_config.json", "config.json", "generation_config.json"};
    em_status st = EM_OK;
    for (size_t f = 0; f < 3 && st == EM_OK; f++) {
        char *path = join_path(dir, files[f]);
        if (!path) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        em__json cfg;
        bool found;
        st = read_config(path, &cfg, &found);
        if (st == EM_OK && found) {
            if (f == 0) {
                int64_t eos = -1;
                st = config_token(tok, path, &cfg, "bos_token", &tok->bos);
                if (st == EM_OK) st = config_token(tok, path, &cfg, "eos_token", &eos);
                if (st == EM_OK) st = config_token(tok, path, &cfg, "pad_token", &tok->pad);
                if (st == EM_OK) st = config_token(tok, path, &cfg, "unk_token", &tok->unk);
                if (st == EM_OK && eos >= 0) st = set_eos(tok, eos);
            } else {
                st = config_ids(tok, path, &cfg, "bos_token_id", false, &tok->bos);
                if (st == EM_OK) st = config_ids(tok, path, &cfg, "eos_token_id", true, NULL);
                if (st == EM_OK) st = config_ids(tok, path, &cfg, "pad_token_id", false, &tok->pad);
            }
            em__json_free(&cfg);
        }
        free(path);
    }
    return st;
}

em_tokenizer *em_tokenizer_load(const char *path) {
    if (!path || !*path) {
        em_error(EM_ERR_ARGUMENT, "em_tokenizer_load: %s path", path ? "an empty" : "a NULL");
        return NULL;
    }
    bool dir = is_dir(path);
    char *file = dir ? join_path(path, "tokenizer.json") : NULL;
    if (dir && !file) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    const char *json_path = dir ? file : path;
    em__file_map m;
    if (em__file_map_open(json_path, &m) != EM_OK) {
        free(file);
        return NULL;
    }
    em_tokenizer *tok = from_json((const char *)m.data, m.len, json_path);
    em__file_map_close(&m);
    free(file);
    if (tok && dir && load_configs(tok, path) != EM_OK) {
        em_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

/* ---- lookups --------------------------------------------------------------------------------------------- */
static bool check_tok(const em_tokenizer *tok, const char *fn) {
    if (tok) return true;
    em_error(EM_ERR_ARGUMENT, "%s: the tokenizer is NULL", fn);
    return false;
}

int64_t em_tokenizer_vocab_size(const em_tokenizer *tok) {
    return check_tok(tok, "em_tokenizer_vocab_size") ? tok->n_ids : -1;
}

int64_t em_tokenizer_token_to_id(const em_tokenizer *tok, const char *token, size_t len) {
    if (!check_tok(tok, "em_tokenizer_token_to_id")) return -1;
    if (!token) return -1;
    for (size_t k = 0; k < tok->n_added; k++)   /* added tokens first, as tokenizers looks them up */
        if (tok->added[k].content_len == len && !memcmp(tok->added[k].content, token, len)) return tok->added[k].id;
    return em__tk_strmap_get(&tok->bpe.vocab, token, len);
}

const char *em__tk_token_text(const em_tokenizer *tok, int32_t id, size_t *len) {
    const struct tk_id *t = &tok->ids[id];
    if (t->added >= 0) {
        *len = tok->added[t->added].match_len;
        return tok->added[t->added].match;
    }
    if (t->len == UINT32_MAX) return NULL;
    *len = t->len;
    return tok->bpe.vocab.pool + t->off;
}

const char *em_tokenizer_id_to_token(const em_tokenizer *tok, int64_t id, size_t *len) {
    if (!check_tok(tok, "em_tokenizer_id_to_token")) return NULL;
    size_t n = 0;
    const char *s = id >= 0 && id < tok->n_ids ? em__tk_token_text(tok, (int32_t)id, &n) : NULL;
    if (!s) {
        em_error(EM_ERR_ARGUMENT, "em_tokenizer_id_to_token: id %lld is %s", (long long)id,
                 id >= 0 && id < tok->n_ids ? "not given to any token" : "out of the vocabulary's range");
        return NULL;
    }
    if (len) *len = n;
    return s;
}

bool em_tokenizer_is_special(const em_tokenizer *tok, int64_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return false;
    int32_t a = tok->ids[id].added;
    return a >= 0 && tok->added[a].special;
}

int64_t em_tokenizer_special_id(const em_tokenizer *tok, em_special_token which) {
    if (!check_tok(tok, "em_tokenizer_special_id")) return -1;
    switch (which) {
    case EM_TOKEN_BOS: return tok->bos;
    case EM_TOKEN_EOS: return tok->n_eos ? tok->eos[0] : -1;
    case EM_TOKEN_PAD: return tok->pad;
    case EM_TOKEN_UNK: return tok->unk;
    }
    em_error(EM_ERR_ARGUMENT, "em_tokenizer_special_id: unknown kind %d", (int)which);
    return -1;
}

size_t em_tokenizer_eos_ids(const em_tokenizer *tok, int64_t *ids, size_t cap) {
    if (!check_tok(tok, "em_tokenizer_eos_ids")) return 0;
    for (size_t k = 0; k < tok->n_eos && k < cap && ids; k++) ids[k] = tok->eos[k];
    return tok->n_eos;
}
