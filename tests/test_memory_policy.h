/* A plain reimplementation of PyTorch's CUDACachingAllocator policy (one stream, no
 * max_split_size), written as simply as possible: arrays and linear scans. Tests compare
 * Ember's allocator with it operation by operation; bench/alloc.c replays patterns on it.
 * A block is named by (segment id, offset); segment ids count up in creation order.
 * release_on_grow = true adds Ember's first change: before taking a new segment, give back
 * the pool's fully free segments. nested = true adds its second: a small request that no
 * small block fits first takes the smallest free large block of at least 2 MiB (split when
 * more than 1 MiB would be left) as a new small segment, which goes back into its large
 * segment when its last block is freed. Ember's default policy is both. */
#ifndef EMBER_TEST_MEMORY_POLICY_H
#define EMBER_TEST_MEMORY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct ptp_blk { size_t off, size; bool used; } ptp_blk;
typedef struct ptp_seg {
    bool live, small;
    size_t size;
    int n, cap;
    ptp_blk *blk;
    int parent;          /* a nested segment's large segment, else -1 */
    size_t parent_off;   /* and the offset of its block there */
} ptp_seg;
typedef struct ptp {
    ptp_seg *seg;
    int nseg, segcap;
    int64_t reserved, allocated, peak_reserved, peak_allocated;
    int64_t raw_allocs, raw_frees, carves;
    bool release_on_grow, nested;
} ptp;

static inline size_t ptp_round(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

static inline size_t ptp_segment_size(size_t size) {
    if (size <= ((size_t)1 << 20)) return (size_t)2 << 20;
    if (size < ((size_t)10 << 20)) return (size_t)20 << 20;
    return (size + ((size_t)2 << 20) - 1) / ((size_t)2 << 20) * ((size_t)2 << 20);
}

static inline void ptp_insert(ptp_seg *s, int at, ptp_blk b) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->blk = realloc(s->blk, (size_t)s->cap * sizeof *s->blk);
    }
    memmove(&s->blk[at + 1], &s->blk[at], (size_t)(s->n - at) * sizeof *s->blk);
    s->blk[at] = b;
    s->n++;
}

static inline void ptp_erase(ptp_seg *s, int at) {
    memmove(&s->blk[at], &s->blk[at + 1], (size_t)(s->n - at - 1) * sizeof *s->blk);
    s->n--;
}

/* Allocate bytes; always succeeds (no device limit). */
static inline void ptp_alloc(ptp *m, size_t bytes, int *seg_out, size_t *off_out) {
    size_t size = ptp_round(bytes);
    bool small = size <= ((size_t)1 << 20);
    int bs = -1, bi = -1;
    for (int s = 0; s < m->nseg; s++) {   /* best fit: smallest size, then oldest segment, lowest offset */
        ptp_seg *g = &m->seg[s];
        if (!g->live || g->small != small) continue;
        for (int i = 0; i < g->n; i++)
            if (!g->blk[i].used && g->blk[i].size >= size && (bs < 0 || g->blk[i].size < m->seg[bs].blk[bi].size))
                bs = s, bi = i;
    }
    int ps = -1, pi = -1;   /* the large block a nested segment would be carved from */
    for (int s = 0; bs < 0 && small && m->nested && s < m->nseg; s++) {
        ptp_seg *g = &m->seg[s];
        if (!g->live || g->small) continue;
        for (int i = 0; i < g->n; i++)
            if (!g->blk[i].used && g->blk[i].size >= ((size_t)2 << 20) &&
                (ps < 0 || g->blk[i].size < m->seg[ps].blk[pi].size))
                ps = s, pi = i;
    }
    if (bs < 0) {
        for (int s = 0; ps < 0 && m->release_on_grow && s < m->nseg; s++) {
            ptp_seg *g = &m->seg[s];
            if (g->live && g->parent < 0 && g->small == small && g->n == 1 && !g->blk[0].used) {
                g->live = false;
                m->reserved -= (int64_t)g->size;
                m->raw_frees++;
            }
        }
        if (m->nseg == m->segcap) {
            m->segcap = m->segcap ? 2 * m->segcap : 16;
            m->seg = realloc(m->seg, (size_t)m->segcap * sizeof *m->seg);
        }
        bs = m->nseg++;
        ptp_seg *g = &m->seg[bs];
        if (ps >= 0) {   /* carved: the block becomes a used block of its large segment */
            ptp_seg *pg = &m->seg[ps];
            ptp_blk *pb = &pg->blk[pi];
            size_t rest = pb->size - ((size_t)2 << 20);
            if (rest > ((size_t)1 << 20)) {
                pb->size = (size_t)2 << 20;
                ptp_insert(pg, pi + 1, (ptp_blk){pb->off + pb->size, rest, false});
                pb = &pg->blk[pi];
            }
            pb->used = true;
            m->carves++;
            *g = (ptp_seg){.live = true, .small = true, .size = pb->size, .parent = ps, .parent_off = pb->off};
        } else {
            *g = (ptp_seg){.live = true, .small = small, .size = ptp_segment_size(size), .parent = -1};
            m->reserved += (int64_t)g->size;
            m->raw_allocs++;
            if (m->reserved > m->peak_reserved) m->peak_reserved = m->reserved;
        }
        ptp_insert(g, 0, (ptp_blk){0, g->size, false});
        bi = 0;
    }
    ptp_seg *g = &m->seg[bs];
    ptp_blk *b = &g->blk[bi];
    size_t rest = b->size - size;
    if (small ? rest >= 512 : rest > ((size_t)1 << 20)) {
        b->size = size;
        ptp_insert(g, bi + 1, (ptp_blk){b->off + size, rest, false});
        b = &g->blk[bi];
    }
    b->used = true;
    m->allocated += (int64_t)b->size;
    if (m->allocated > m->peak_allocated) m->peak_allocated = m->allocated;
    *seg_out = bs;
    *off_out = b->off;
}

/* Mark block `off` of segment s free and merge it with free neighbours; returns the block's
 * size before the merge. */
static inline size_t ptp_release(ptp *m, int s, size_t off) {
    ptp_seg *g = &m->seg[s];
    int i = 0;
    while (g->blk[i].off != off) i++;
    size_t size = g->blk[i].size;
    g->blk[i].used = false;
    if (i + 1 < g->n && !g->blk[i + 1].used) {
        g->blk[i].size += g->blk[i + 1].size;
        ptp_erase(g, i + 1);
    }
    if (i > 0 && !g->blk[i - 1].used) {
        g->blk[i - 1].size += g->blk[i].size;
        ptp_erase(g, i);
    }
    if (g->parent >= 0 && g->n == 1) {   /* a nested segment, whole again: back to its block */
        g->live = false;
        ptp_release(m, g->parent, g->parent_off);
    }
    return size;
}

static inline void ptp_free(ptp *m, int s, size_t off) {
    m->allocated -= (int64_t)ptp_release(m, s, off);
}

static inline void ptp_empty_cache(ptp *m) {
    for (int s = 0; s < m->nseg; s++) {
        ptp_seg *g = &m->seg[s];
        if (g->live && g->parent < 0 && g->n == 1 && !g->blk[0].used) {
            g->live = false;
            m->reserved -= (int64_t)g->size;
            m->raw_frees++;
        }
    }
}

/* Free bytes inside segments that also hold live blocks, and the biggest free block. */
static inline void ptp_free_info(const ptp *m, int64_t *inactive_split, int64_t *largest) {
    *inactive_split = *largest = 0;
    for (int s = 0; s < m->nseg; s++) {
        const ptp_seg *g = &m->seg[s];
        if (!g->live) continue;
        for (int i = 0; i < g->n; i++) {
            if (g->blk[i].used) continue;
            if (g->n > 1) *inactive_split += (int64_t)g->blk[i].size;
            if ((int64_t)g->blk[i].size > *largest) *largest = (int64_t)g->blk[i].size;
        }
    }
}

static inline void ptp_destroy(ptp *m) {
    for (int s = 0; s < m->nseg; s++) free(m->seg[s].blk);
    free(m->seg);
    memset(m, 0, sizeof *m);
}

#endif
