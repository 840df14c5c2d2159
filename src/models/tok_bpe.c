/* The BPE model: the vocabulary as a hash of strings, the merges as a hash of id pairs, and
 * the merge loop of `tokenizers` (models/bpe/word.rs): the symbols of a word start as its
 * characters; the pair of neighbours with the lowest merge rank merges first, the leftmost
 * of equal ranks, until no neighbouring pair has a merge. A binary heap of (rank, position)
 * keeps that O(n log n) for any length: without a pre-tokenizer (Llama 2) a word is a
 * whole text. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static em_status oom(void) { return em_error(EM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory"); }

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* ---- string map ------------------------------------------------------------------------------- */
em_status em__tk_strmap_init(tk_strmap *m, size_t expected, size_t pool_bytes) {
    memset(m, 0, sizeof *m);
    size_t slots = 16;
    while (slots < expected * 2) slots *= 2;
    m->cap = expected ? expected : 1;
    m->off = malloc(m->cap * sizeof *m->off);
    m->len = malloc(m->cap * sizeof *m->len);
    m->val = malloc(m->cap * sizeof *m->val);
    m->slots = calloc(slots, sizeof *m->slots);
    m->pool_cap = pool_bytes ? pool_bytes : 16;
    m->pool = malloc(m->pool_cap);
    m->mask = slots - 1;
    if (!m->off || !m->len || !m->val || !m->slots || !m->pool) {
        em__tk_strmap_free(m);
        return oom();
    }
    return EM_OK;
}

void em__tk_strmap_free(tk_strmap *m) {
    free(m->pool);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static em_status strmap_grow(tk_strmap *m) {
    size_t cap = m->cap * 2;
    uint32_t *off = realloc(m->off, cap * sizeof *off);
    if (off) m->off = off;
    uint32_t *len = off ? realloc(m->len, cap * sizeof *len) : NULL;
    if (len) m->len = len;
    int32_t *val = len ? realloc(m->val, cap * sizeof *val) : NULL;
    if (!val) return oom();
    m->val = val;
    m->cap = cap;
    if (m->n * 2 < m->mask) return EM_OK;
    size_t slots = (m->mask + 1) * 2;   /* rehash at half full */
    uint32_t *ns = calloc(slots, sizeof *ns);
    if (!ns) return oom();
    for (size_t e = 0; e < m->n; e++) {
        size_t h = hash_bytes(m->pool + m->off[e], m->len[e]) & (slots - 1);
        while (ns[h]) h = (h + 1) & (slots - 1);
        ns[h] = (uint32_t)e + 1;
    }
    free(m->slots);
    m->slots = ns;
    m->mask = slots - 1;
    return EM_OK;
}

em_status em__tk_strmap_add(tk_strmap *m, const char *s, size_t n, int32_t val, bool *added, uint32_t *entry) {
    if (n >= UINT32_MAX / 2 || m->pool_len + n + 1 >= UINT32_MAX)
        return em_error(EM_ERR_FORMAT, "tokenizer: the vocabulary's strings pass 4 GiB");
    size_t h = hash_bytes(s, n) & m->mask;
    for (uint32_t e; (e = m->slots[h]); h = (h + 1) & m->mask)
        if (m->len[e - 1] == n && !memcmp(m->pool + m->off[e - 1], s, n)) {
            if (added) *added = false;
            if (entry) *entry = e - 1;
            return EM_OK;
        }
    if (m->n == m->cap || m->n * 2 >= m->mask) {
        if (strmap_grow(m) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
        return em__tk_strmap_add(m, s, n, val, added, entry);   /* the slots moved */
    }
    if (m->pool_len + n + 1 > m->pool_cap) {
        size_t cap = m->pool_cap;
        while (cap < m->pool_len + n + 1) cap *= 2;
        char *p = realloc(m->pool, cap);
        if (!p) return oom();
        m->pool = p;
        m->pool_cap = cap;
    }
    memcpy(m->pool + m->pool_len, s, n);
    m->pool[m->pool_len + n] = 0;
    m->off[m->n] = (uint32_t)m->pool_len;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = val;
    m->pool_len += n + 1;
    m->slots[h] = (uint32_t)m->n + 1;
    if (added) *added = true;
    if (entry) *entry = (uint32_t)m->n;
    m->n++;
    return EM_OK;
}

int32_t em__tk_strmap_get(const tk_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    size_t h = hash_bytes(s, n) & m->mask;
    for (uint32_t e; (e = m->slots[h]); h = (h + 1) & m->mask)
        if (m->len[e - 1] == n && !memcmp(m->pool + m->off[e - 1], s, n)) return m->val[e - 1];
    return -1;
}

/* ---- merges ------------------------------------------------------------------------------------- */
static size_t pair_hash(uint64_t key, size_t mask) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask; }

static em_status merges_reserve(tk_bpe *m, size_t n) {
    size_t slots = 16;
    while (slots < n * 2 + 2) slots *= 2;
    if (m->merge_keys && slots <= m->merge_mask + 1) return EM_OK;
    uint64_t *keys = malloc(slots * sizeof *keys);
    int32_t *rank = malloc(slots * sizeof *rank), *id = malloc(slots * sizeof *id);
    if (!keys || !rank || !id) {
        free(keys);
        free(rank);
        free(id);
        return oom();
    }
    memset(keys, 0xFF, slots * sizeof *keys);
    for (size_t i = 0; m->merge_keys && i <= m->merge_mask; i++) {
        if (m->merge_keys[i] == UINT64_MAX) continue;
        size_t h = pair_hash(m->merge_keys[i], slots - 1);
        while (keys[h] != UINT64_MAX) h = (h + 1) & (slots - 1);
        keys[h] = m->merge_keys[i];
        rank[h] = m->merge_rank[i];
        id[h] = m->merge_id[i];
    }
    free(m->merge_keys);
    free(m->merge_rank);
    free(m->merge_id);
    m->merge_keys = keys;
    m->merge_rank = rank;
    m->merge_id = id;
    m->merge_mask = slots - 1;
    return EM_OK;
}

/* The merge of the pair (a, b): its slot, or -1. */
static inline ptrdiff_t merge_find(const tk_bpe *m, int32_t a, int32_t b) {
    if (!m->merge_keys) return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t h = pair_hash(key, m->merge_mask);; h = (h + 1) & m->merge_mask) {
        if (m->merge_keys[h] == key) return (ptrdiff_t)h;
        if (m->merge_keys[h] == UINT64_MAX) return -1;
    }
}

em_status em__tk_bpe_add_merge(tk_bpe *m, const char *a, size_t na, const char *b, size_t nb, int32_t rank,
                               const char *file, size_t index) {
    int32_t ia = em__tk_strmap_get(&m->vocab, a, na), ib = em__tk_strmap_get(&m->vocab, b, nb);
    if (ia < 0 || ib < 0) {
        const char *which = ia < 0 ? a : b;
        size_t wn = ia < 0 ? na : nb;
        return em_error(EM_ERR_FORMAT, "%s: model.merges[%zu]: \"%.*s\" is not in the vocabulary", file, index,
                        (int)(wn > 100 ? 100 : wn), which);
    }
    if (nb < m->prefix_len)
        return em_error(EM_ERR_FORMAT, "%s: model.merges[%zu]: \"%.*s\" is shorter than the continuing_subword_prefix",
                        file, index, (int)(nb > 100 ? 100 : nb), b);
    /* the merged token: a, then b without the continuing-subword prefix */
    size_t n = na + nb - m->prefix_len;
    char small[256], *joined = n <= sizeof small ? small : malloc(n);
    if (!joined) return oom();
    memcpy(joined, a, na);
    memcpy(joined + na, b + m->prefix_len, nb - m->prefix_len);
    int32_t id = em__tk_strmap_get(&m->vocab, joined, n);
    if (id < 0) {
        em_error(EM_ERR_FORMAT, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\" gives \"%.*s\", which is not in the vocabulary",
                 file, index, (int)(na > 100 ? 100 : na), a, (int)(nb > 100 ? 100 : nb), b, (int)(n > 200 ? 200 : n),
                 joined);
        if (joined != small) free(joined);
        return EM_ERR_FORMAT;
    }
    if (joined != small) free(joined);
    if ((m->n_merges + 1) * 2 > m->merge_mask && merges_reserve(m, (m->n_merges + 1) * 2) != EM_OK)
        return EM_ERR_OUT_OF_MEMORY;
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    size_t h = pair_hash(key, m->merge_mask);
    while (m->merge_keys[h] != UINT64_MAX && m->merge_keys[h] != key) h = (h + 1) & m->merge_mask;
    if (m->merge_keys[h] == UINT64_MAX) m->n_merges++;
    /* a pair listed twice: the later rank, as tokenizers' map built in order keeps it */
    m->merge_keys[h] = key;
    m->merge_rank[h] = rank;
    m->merge_id[h] = id;
    return EM_OK;
}

em_status em__tk_bpe_finish(tk_bpe *m, size_t n_merges_expected) {
    (void)n_merges_expected;
    if (!m->merge_keys && merges_reserve(m, 1) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
    for (int b = 0; b < 256; b++) {
        char name[8];
        static const char hex[] = "0123456789ABCDEF";
        memcpy(name, "<0x", 3);
        name[3] = hex[b >> 4];
        name[4] = hex[b & 15];
        name[5] = '>';
        m->byte_ids[b] = em__tk_strmap_get(&m->vocab, name, 6);
    }
    /* one character's id straight from its code point (most of a word's characters), where no
     * prefix or suffix changes the string looked up */
    if (!m->prefix && !m->suffix) {
        m->char_ids = malloc(0x10000 * sizeof *m->char_ids);
        if (!m->char_ids) return oom();
        for (size_t k = 0; k < 0x10000; k++) m->char_ids[k] = -1;
        for (size_t e = 0; e < m->vocab.n; e++) {
            const unsigned char *s = (const unsigned char *)m->vocab.pool + m->vocab.off[e];
            size_t n = m->vocab.len[e], bad;
            uint32_t cp;
            bool inc;
            if (n && n <= 3 && em__utf8_char(s, n, &cp, &bad, &inc) == (int)n && cp < 0x10000)
                m->char_ids[cp] = m->vocab.val[e];
        }
    }
    return EM_OK;
}

void em__tk_bpe_free(tk_bpe *m) {
    em__tk_strmap_free(&m->vocab);
    free(m->merge_keys);
    free(m->merge_rank);
    free(m->merge_id);
    free(m->prefix);
    free(m->suffix);
    free(m->char_ids);
    memset(m, 0, sizeof *m);
}

/* ---- one word ------------------------------------------------------------------------------------- */
void em__tk_work_free(tk_work *w) {
    free(w->sym_id);
    free(w->sym_prev);
    free(w->sym_next);
    free(w->sym_len);
    free(w->heap);
    em__tk_free(&w->key);
    free(w->cache_slots);
    free(w->cache);
    em__tk_free(&w->cache_text);
    free(w->cache_ids);
    memset(w, 0, sizeof *w);
}

static em_status sym_reserve(tk_work *w, size_t n) {
    if (n <= w->sym_cap) return EM_OK;
    size_t cap = w->sym_cap ? w->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *id = realloc(w->sym_id, cap * sizeof *id);
    if (id) w->sym_id = id;
    int32_t *prev = id ? realloc(w->sym_prev, cap * sizeof *prev) : NULL;
    if (prev) w->sym_prev = prev;
    int32_t *next = prev ? realloc(w->sym_next, cap * sizeof *next) : NULL;
    if (next) w->sym_next = next;
    uint32_t *len = next ? realloc(w->sym_len, cap * sizeof *len) : NULL;
    if (!len) return oom();
    w->sym_len = len;
    w->sym_cap = cap;
    return EM_OK;
}

static em_status out_push(int32_t **out, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        int32_t *v = realloc(*out, nc * sizeof *v);
        if (!v) return oom();
        *out = v;
        *cap = nc;
    }
    (*out)[(*n)++] = id;
    return EM_OK;
}

static em_status heap_push(tk_work *w, uint64_t v) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        uint64_t *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return oom();
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0 && w->heap[(i - 1) / 2] > v) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = v;
    return EM_OK;
}

static uint64_t heap_pop(tk_work *w) {
    uint64_t top = w->heap[0], v = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= v) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = v;
    return top;
}

/* A heap entry: the pair at position pos (with the symbol after it) of merge rank rank. */
static em_status push_pair(const tk_bpe *m, tk_work *w, int32_t pos) {
    int32_t next = w->sym_next[pos];
    if (pos < 0 || next < 0) return EM_OK;
    ptrdiff_t h = merge_find(m, w->sym_id[pos], w->sym_id[next]);
    if (h < 0) return EM_OK;
    return heap_push(w, (uint64_t)(uint32_t)m->merge_rank[h] << 32 | (uint32_t)pos);
}

static em_status add_symbol(tk_work *w, size_t *count, int32_t id, uint32_t len) {
    if (sym_reserve(w, *count + 1) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
    size_t i = (*count)++;
    w->sym_id[i] = id;
    w->sym_len[i] = len;
    w->sym_prev[i] = (int32_t)i - 1;
    w->sym_next[i] = -1;
    if (i) w->sym_next[i - 1] = (int32_t)i;
    return EM_OK;
}

/* The id of one character c[0..cn) of a word (with the prefix when not first, the suffix
 * when last), or -1; key: scratch. */
static int32_t char_id(const tk_bpe *m, tk_work *w, const char *c, size_t cn, uint32_t cp, bool first, bool last,
                       const char **key, size_t *key_len) {
    bool with_prefix = !first && m->prefix, with_suffix = last && m->suffix;
    if (!with_prefix && !with_suffix) {
        *key = c;
        *key_len = cn;
        if (m->char_ids && cp < 0x10000) return m->char_ids[cp];
        return em__tk_strmap_get(&m->vocab, c, cn);
    }
    w->key.len = 0;
    if (with_prefix) em__tk_put(&w->key, m->prefix, m->prefix_len);
    em__tk_put(&w->key, c, cn);
    if (with_suffix) em__tk_put(&w->key, m->suffix, m->suffix_len);
    if (w->key.oom) {
        *key = NULL;
        return -1;
    }
    *key = w->key.s;
    *key_len = w->key.len;
    return em__tk_strmap_get(&m->vocab, w->key.s, w->key.len);
}

static em_status bpe_word(const tk_bpe *m, tk_work *w, const char *s, size_t n, int32_t **out, size_t *n_out,
                          size_t *cap_out) {
    size_t count = 0;
    int32_t unk = -1;   /* a pending unknown: its id, and whether one is open */
    uint32_t unk_len = 0;
    em_status st = EM_OK;
    for (size_t i = 0; i < n && st == EM_OK;) {
        uint32_t cp;
        size_t bad;
        bool inc;
        int cl = em__utf8_char((const unsigned char *)s + i, n - i, &cp, &bad, &inc);
        if (cl <= 0) cl = 1, cp = 0xFFFD;   /* not reached: the text is valid UTF-8 */
        const char *key;
        size_t key_len;
        int32_t id = char_id(m, w, s + i, (size_t)cl, cp, i == 0, i + (size_t)cl == n, &key, &key_len);
        if (!key) return oom();
        i += (size_t)cl;
        if (id >= 0) {
            if (unk >= 0) st = add_symbol(w, &count, unk, unk_len), unk = -1;
            if (st == EM_OK) st = add_symbol(w, &count, id, (uint32_t)cl);
            continue;
        }
        if (m->byte_fallback) {   /* every byte of it as <0xNN>, if the vocabulary has them all */
            bool all = true;
            for (size_t k = 0; k < key_len && all; k++) all = m->byte_ids[(unsigned char)key[k]] >= 0;
            if (all) {
                for (size_t k = 0; k < key_len && st == EM_OK; k++)
                    st = add_symbol(w, &count, m->byte_ids[(unsigned char)key[k]], 1);
                continue;
            }
        }
        if (m->unk_id < 0) continue;   /* no unknown token: the character is dropped */
        if (unk >= 0 && m->fuse_unk) {
            unk_len += (uint32_t)cl;
        } else {
            if (unk >= 0) st = add_symbol(w, &count, unk, unk_len);
            unk = m->unk_id;
            unk_len = (uint32_t)cl;
        }
    }
    if (st == EM_OK && unk >= 0) st = add_symbol(w, &count, unk, unk_len);
    if (st != EM_OK) return st;

    w->heap_n = 0;
    for (size_t i = 0; i + 1 < count && st == EM_OK; i++) st = push_pair(m, w, (int32_t)i);
    while (w->heap_n && st == EM_OK) {
        uint64_t top = heap_pop(w);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32);
        if (w->sym_len[pos] == 0) continue;   /* merged into its left neighbour meanwhile */
        int32_t next = w->sym_next[pos];
        if (next < 0) continue;
        ptrdiff_t h = merge_find(m, w->sym_id[pos], w->sym_id[next]);
        if (h < 0 || m->merge_rank[h] != rank) continue;   /* the pair there has changed */
        w->sym_id[pos] = m->merge_id[h];
        w->sym_len[pos] += w->sym_len[next];
        w->sym_len[next] = 0;
        int32_t after = w->sym_next[next];
        w->sym_next[pos] = after;
        if (after >= 0) w->sym_prev[after] = pos;
        if (w->sym_prev[pos] >= 0) st = push_pair(m, w, w->sym_prev[pos]);
        if (st == EM_OK) st = push_pair(m, w, pos);
    }
    for (int32_t i = count ? 0 : -1; i >= 0 && st == EM_OK; i = w->sym_next[i])
        st = out_push(out, n_out, cap_out, w->sym_id[i]);
    return st;
}

/* ---- the cache of one call: words repeat ------------------------------------------------------------- */
#define TK_CACHE_MAX_WORD 256   /* longer words are not kept (as tokenizers' cache) */

static int32_t cache_find(const tk_work *w, const char *s, size_t n, uint64_t h) {
    if (!w->cache_slots) return -1;
    for (size_t i = (size_t)h & w->cache_mask;; i = (i + 1) & w->cache_mask) {
        uint32_t e = w->cache_slots[i];
        if (!e) return -1;
        const struct tk_cache_entry *c = &w->cache[e - 1];
        if (c->hash == h && c->text_len == n && !memcmp(w->cache_text.s + c->text_off, s, n)) return (int32_t)e - 1;
    }
}

static void cache_add(tk_work *w, const char *s, size_t n, uint64_t h, const int32_t *ids, size_t n_ids) {
    if ((w->cache_n + 1) * 2 > w->cache_mask) {   /* grow (or start) the table: rehash */
        size_t slots = w->cache_slots ? (w->cache_mask + 1) * 2 : 1024;
        uint32_t *ns = calloc(slots, sizeof *ns);
        if (!ns) return;   /* a cache that cannot grow is only slower */
        for (size_t e = 0; e < w->cache_n; e++) {
            size_t i = (size_t)w->cache[e].hash & (slots - 1);
            while (ns[i]) i = (i + 1) & (slots - 1);
            ns[i] = (uint32_t)e + 1;
        }
        free(w->cache_slots);
        w->cache_slots = ns;
        w->cache_mask = slots - 1;
    }
    if (w->cache_n == w->cache_cap) {
        size_t cap = w->cache_cap ? w->cache_cap * 2 : 256;
        struct tk_cache_entry *c = realloc(w->cache, cap * sizeof *c);
        if (!c) return;
        w->cache = c;
        w->cache_cap = cap;
    }
    if (w->cache_ids_n + n_ids > w->cache_ids_cap) {
        size_t cap = w->cache_ids_cap ? w->cache_ids_cap : 1024;
        while (cap < w->cache_ids_n + n_ids) cap *= 2;
        int32_t *v = realloc(w->cache_ids, cap * sizeof *v);
        if (!v) return;
        w->cache_ids = v;
        w->cache_ids_cap = cap;
    }
    size_t text_off = w->cache_text.len;
    em__tk_put(&w->cache_text, s, n);
    if (w->cache_text.oom) return;
    memcpy(w->cache_ids + w->cache_ids_n, ids, n_ids * sizeof *ids);
    w->cache[w->cache_n] = (struct tk_cache_entry){(uint32_t)text_off, (uint32_t)n, (uint32_t)w->cache_ids_n,
                                                    (uint32_t)n_ids, h};
    size_t i = (size_t)h & w->cache_mask;
    while (w->cache_slots[i]) i = (i + 1) & w->cache_mask;
    w->cache_slots[i] = (uint32_t)w->cache_n + 1;
    w->cache_n++;
    w->cache_ids_n += n_ids;
}

em_status em__tk_bpe_encode(const tk_bpe *m, tk_work *w, const char *s, size_t n, int32_t **out, size_t *n_out,
                            size_t *cap_out) {
    if (n == 0) return EM_OK;
    if (n >= (size_t)INT32_MAX)   /* symbol positions are 32-bit */
        return em_error(EM_ERR_ARGUMENT, "tokenizer: a piece of %zu bytes without a split is too long to encode (the "
                        "most is %d)", n, INT32_MAX - 1);
    if (m->ignore_merges) {   /* a word the vocabulary has whole is that token, merges or not */
        int32_t id = em__tk_strmap_get(&m->vocab, s, n);
        if (id >= 0) return out_push(out, n_out, cap_out, id);
    }
    bool cached = w->use_cache && n < TK_CACHE_MAX_WORD && w->cache_text.len < ((size_t)1 << 30);
    uint64_t h = cached ? hash_bytes(s, n) : 0;
    if (cached) {
        int32_t e = cache_find(w, s, n, h);
        if (e >= 0) {
            const struct tk_cache_entry *c = &w->cache[e];
            for (uint32_t k = 0; k < c->ids_len; k++)
                if (out_push(out, n_out, cap_out, w->cache_ids[c->ids_off + k]) != EM_OK) return EM_ERR_OUT_OF_MEMORY;
            return EM_OK;
        }
    }
    size_t first = *n_out;
    em_status st = bpe_word(m, w, s, n, out, n_out, cap_out);
    if (st == EM_OK && cached) cache_add(w, s, n, h, *out + first, *n_out - first);
    return st;
}
