/* `ember memory-timeline`'s picture (plot.h): a device's allocated memory over time, stacked
 * by tag, with its reserved memory. Each event moves one band, so every series gets a point
 * before and after each event at the event's time: the lines are steps, as the memory is. */
#include <stdlib.h>
#include <string.h>
#include "memory_history.h"
#include "plot.h"

#define MAX_TAGS 4096          /* distinct tags told apart; past it they count as "other" */
#define MIB (1024.0 * 1024.0)

/* Live blocks: address -> (tag, size), open addressing with tombstones. */
typedef struct live_map {
    uint64_t *key;
    int32_t *tag;
    int64_t *size;
    uint8_t *state;            /* 0 empty, 1 used, 2 deleted */
    size_t cap, used;
} live_map;

static size_t slot_of(uint64_t k, size_t cap) { return (size_t)((k >> 9) * 0x9e3779b97f4a7c15ull) & (cap - 1); }

static bool map_grow(live_map *m) {
    live_map g = {.cap = m->cap ? 2 * m->cap : 1024};
    g.key = calloc(g.cap, sizeof *g.key);
    g.tag = calloc(g.cap, sizeof *g.tag);
    g.size = calloc(g.cap, sizeof *g.size);
    g.state = calloc(g.cap, 1);
    if (!g.key || !g.tag || !g.size || !g.state) {
        free(g.key), free(g.tag), free(g.size), free(g.state);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->state[i] != 1) continue;
        size_t j = slot_of(m->key[i], g.cap);
        while (g.state[j]) j = (j + 1) & (g.cap - 1);
        g.key[j] = m->key[i], g.tag[j] = m->tag[i], g.size[j] = m->size[i], g.state[j] = 1;
        g.used++;
    }
    free(m->key), free(m->tag), free(m->size), free(m->state);
    *m = g;
    return true;
}

static bool map_put(live_map *m, uint64_t k, int32_t tag, int64_t size) {
    if ((m->used + 1) * 2 > m->cap && !map_grow(m)) return false;
    size_t j = slot_of(k, m->cap);
    while (m->state[j] == 1 && m->key[j] != k) j = (j + 1) & (m->cap - 1);
    if (m->state[j] != 1) m->used++;
    m->key[j] = k, m->tag[j] = tag, m->size[j] = size, m->state[j] = 1;
    return true;
}

/* Remove k; its tag and size, or false when it was allocated before the recording. */
static bool map_take(live_map *m, uint64_t k, int32_t *tag, int64_t *size) {
    if (!m->cap) return false;
    for (size_t j = slot_of(k, m->cap), n = 0; m->state[j] && n < m->cap; j = (j + 1) & (m->cap - 1), n++)
        if (m->state[j] == 1 && m->key[j] == k) {
            *tag = m->tag[j], *size = m->size[j];
            m->state[j] = 2;
            return true;
        }
    return false;
}

static void map_free(live_map *m) { free(m->key), free(m->tag), free(m->size), free(m->state); }

typedef struct tags {
    char (*name)[48];
    int64_t *cur, *peak;
    int n;
} tags;

static int32_t tag_index(tags *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->name[i], name)) return i;
    if (t->n == MAX_TAGS) return MAX_TAGS - 1;   /* the last slot gathers the rest */
    snprintf(t->name[t->n], sizeof t->name[0], "%s", name);
    return t->n++;
}

/* One event applied to the tags' current bytes. */
static bool apply(const mh_event *e, tags *t, live_map *m) {
    if (e->alloc) {
        int32_t k = tag_index(t, e->tag);
        t->cur[k] += e->size;
        if (t->cur[k] > t->peak[k]) t->peak[k] = t->cur[k];
        return map_put(m, e->address, k, e->size);
    }
    int32_t k;
    int64_t size;
    if (map_take(m, e->address, &k, &size)) t->cur[k] -= size;
    return true;
}

bool plot_memory_timeline(const mh_history *h, const char *device, int top, const char *path, const char *subtitle,
                          char *why, size_t why_size) {
    if (top < 1) top = 1;
    if (top > PLOT_MEMORY_MAX_TAGS) top = PLOT_MEMORY_MAX_TAGS;
    tags t = {.name = calloc(MAX_TAGS, sizeof *t.name), .cur = calloc(MAX_TAGS, sizeof(int64_t)),
              .peak = calloc(MAX_TAGS, sizeof(int64_t))};
    live_map m = {0};
    plot_figure f = {0};
    bool ok = false;
    if (!t.name || !t.cur || !t.peak) {
        snprintf(why, why_size, "out of memory");
        goto done;
    }
    size_t count = 0;
    double t0 = 0;
    for (size_t i = 0; i < h->n; i++) {   /* first pass: every tag's peak */
        const mh_event *e = &h->events[i];
        if (strcmp(e->device, device)) continue;
        if (!count++) t0 = e->t_ns;
        if (!apply(e, &t, &m)) {
            snprintf(why, why_size, "out of memory");
            goto done;
        }
    }
    if (!count) {
        snprintf(why, why_size, "no event of %s in the history", device);
        goto done;
    }
    /* the bands: the tags with the highest peaks */
    int band[PLOT_MEMORY_MAX_TAGS], nb = 0;
    for (; nb < top && nb < t.n; nb++) {
        int best = -1;
        for (int k = 0; k < t.n; k++) {
            bool taken = false;
            for (int b = 0; b < nb; b++) taken |= band[b] == k;
            if (!taken && (best < 0 || t.peak[k] > t.peak[best])) best = k;
        }
        band[nb] = best;
    }
    snprintf(f.title, sizeof f.title, "ember memory-timeline: %s", device);
    snprintf(f.subtitle, sizeof f.subtitle, "%s", subtitle);
    f.width = PLOT_MEMORY_W;
    f.height = PLOT_FIG_H;
    f.npanels = 1;
    plot_panel *p = &f.panels[0];
    snprintf(p->title, sizeof p->title, "allocated memory, stacked by tag");
    snprintf(p->xlabel, sizeof p->xlabel, "time since the recording began (s)");
    snprintf(p->ylabel, sizeof p->ylabel, "MiB");
    p->xzero = true;
    static const uint32_t colours[PLOT_MEMORY_MAX_TAGS] = {PLOT_RGB_MEM_TAG0, PLOT_RGB_MEM_TAG1, PLOT_RGB_MEM_TAG2,
                                                          PLOT_RGB_MEM_TAG3};
    plot_series *s[PLOT_MEMORY_MAX_TAGS + 2];
    for (int b = 0; b < nb; b++) {
        char name[96];
        snprintf(name, sizeof name, "%s", t.name[band[b]][0] ? t.name[band[b]] : "(untagged)");
        s[b] = plot_add_series(p, name, colours[b], true);
    }
    s[nb] = plot_add_series(p, "all allocated (other tags on top)", PLOT_RGB_MEM_TOTAL, true);
    s[nb + 1] = plot_add_series(p, "reserved", PLOT_RGB_MEM_RESERVED, true);
    /* second pass: the points */
    memset(t.cur, 0, MAX_TAGS * sizeof(int64_t));
    map_free(&m);
    memset(&m, 0, sizeof m);
    int64_t total = 0, reserved = 0;
    bool first = true;
    for (size_t i = 0; i < h->n; i++) {
        const mh_event *e = &h->events[i];
        if (strcmp(e->device, device)) continue;
        double x = (e->t_ns - t0) / 1e9;
        for (int pass = 0; pass < 2; pass++) {   /* before the event, then after it */
            if (pass == 1 && !apply(e, &t, &m)) {
                snprintf(why, why_size, "out of memory");
                goto done;
            }
            if (pass == 1) total = e->allocated, reserved = e->reserved;
            if (pass == 0 && first) {   /* the state before the first event, from its own numbers */
                total = e->allocated - (e->alloc ? e->size : -e->size);
                reserved = e->reserved;
            }
            double cum = 0;
            bool okp = true;
            for (int b = 0; b < nb; b++) {
                cum += (double)t.cur[band[b]];
                okp &= plot_point(s[b], x, cum / MIB);
            }
            okp &= plot_point(s[nb], x, (double)total / MIB) && plot_point(s[nb + 1], x, (double)reserved / MIB);
            if (!okp) {
                snprintf(why, why_size, "out of memory");
                goto done;
            }
        }
        first = false;
    }
    ok = plot_write(&f, path, why, why_size);
done:
    plot_figure_free(&f);
    map_free(&m);
    free(t.name), free(t.cur), free(t.peak);
    return ok;
}
