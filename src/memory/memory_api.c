/* The public face of the allocator (include/ember/memory.h): statistics, summary, caps. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "../util/errors.h"
#include "../util/strbuf.h"

static em_device resolve(em_device d) {
    return d.index < 0 ? em_device_resolve(d) : d;
}

/* A device value no allocator can belong to (an unknown type, an index below -1, which
 * alone means the current device, or past the allocator's table, cpu:N with N > 0): false
 * with EM_ERR_DEVICE, so that a statistic of it is not a silent 0. */
static bool well_formed(em_device d, const char *op) {
    if ((unsigned)d.type < EM_DEVICE_TYPE_COUNT && d.index >= -1 && d.index < MEM_MAX_DEVICES &&
        !(d.type == EM_CPU && d.index > 0))
        return true;
    em_error(EM_ERR_DEVICE, "%s: no such device (type %d, index %d): expected a device type of em_device_type and an "
             "index from 0 (-1: the current device)", op, (int)d.type, d.index);
    return false;
}

/* One int64 read under the device's lock (0 for a device that never allocated). */
#define STAT_GETTER(fn, expr)                                  \
    int64_t fn(em_device d) {                                  \
        if (!well_formed(d, #fn)) return 0;                    \
        mem_state *st = em__mem_state_peek(resolve(d));           \
        if (!st) return 0;                                     \
        pthread_mutex_lock(&st->lock);                         \
        int64_t v = (expr);                                    \
        pthread_mutex_unlock(&st->lock);                       \
        return v;                                              \
    }

STAT_GETTER(em_memory_allocated, st->stats.allocated_bytes[EM_MEMORY_ALL].current)
STAT_GETTER(em_memory_max_allocated, st->stats.allocated_bytes[EM_MEMORY_ALL].peak)
STAT_GETTER(em_memory_reserved, st->stats.reserved_bytes[EM_MEMORY_ALL].current)
STAT_GETTER(em_memory_max_reserved, st->stats.reserved_bytes[EM_MEMORY_ALL].peak)

/* Every em_memory_stat field of the stats struct, in order. */
static em_memory_stat *stat_arrays(em_memory_stats *s, int *count) {
    *count = (int)(offsetof(em_memory_stats, num_raw_allocs) / sizeof(em_memory_stat));
    return s->allocated_bytes;
}

void em_memory_reset_peak_stats(em_device d) {
    mem_state *st = em__mem_state_peek(resolve(d));
    if (!st) return;
    pthread_mutex_lock(&st->lock);
    int n;
    em_memory_stat *s = stat_arrays(&st->stats, &n);
    for (int i = 0; i < n; i++) s[i].peak = s[i].current;
    pthread_mutex_unlock(&st->lock);
}

void em_memory_reset_accumulated_stats(em_device d) {
    mem_state *st = em__mem_state_peek(resolve(d));
    if (!st) return;
    pthread_mutex_lock(&st->lock);
    int n;
    em_memory_stat *s = stat_arrays(&st->stats, &n);
    for (int i = 0; i < n; i++) s[i].allocated = s[i].freed = 0;
    st->stats.num_raw_allocs = st->stats.num_raw_frees = 0;
    st->stats.num_alloc_retries = st->stats.num_ooms = st->stats.num_stream_waits = 0;
    pthread_mutex_unlock(&st->lock);
}

em_status em_memory_empty_cache(em_device d) {
    d = resolve(d);
    if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT || d.index < 0 || d.index >= MEM_MAX_DEVICES)
        return em_error(EM_ERR_DEVICE, "em_memory_empty_cache: no such device (type %d, index %d)",
                        (int)d.type, d.index);
    mem_state *st = em__mem_state_peek(d);
    if (!st) return EM_OK;
    pthread_mutex_lock(&st->lock);
    if (st->be) em__mem_release_cached(st);
    pthread_mutex_unlock(&st->lock);
    return EM_OK;
}

em_status em_memory_get_stats(em_device d, em_memory_stats *out) {
    if (!out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_memory_get_stats: argument 'out' is NULL");
    mem_state *st = em__mem_state(resolve(d));
    if (!st) return em_last_status();
    pthread_mutex_lock(&st->lock);
    em__mem_refresh_derived(st);
    *out = st->stats;
    pthread_mutex_unlock(&st->lock);
    return EM_OK;
}

em_status em_memory_set_cap(em_device d, int64_t bytes) {
    mem_state *st = em__mem_state(resolve(d));
    if (!st) return em_last_status();
    pthread_mutex_lock(&st->lock);
    st->cap = bytes < 0 ? -1 : bytes;
    st->cap_fraction = 0;
    st->cap_source = "em_memory_set_cap";
    st->config_error[0] = '\0';
    st->stats.cap = st->cap;
    pthread_mutex_unlock(&st->lock);
    return EM_OK;
}

em_status em_memory_set_cap_fraction(em_device d, double fraction) {
    if (!(fraction > 0 && fraction <= 1))
        return em_error(EM_ERR_ARGUMENT, "em_memory_set_cap_fraction: fraction must be in (0, 1], got %g",
                        fraction);
    d = resolve(d);
    mem_state *st = em__mem_state(d);
    if (!st) return em_last_status();
    pthread_mutex_lock(&st->lock);
    const em_backend *be = st->be;
    pthread_mutex_unlock(&st->lock);
    if (!be && !(be = em__backend_checked(d, "em_memory_set_cap_fraction"))) return em_last_status();
    pthread_mutex_lock(&st->lock);
    const em_backend *own = st->be;
    st->be = be;                /* only to ask for the total memory */
    st->cap_fraction = fraction;
    st->cap_source = "em_memory_set_cap_fraction";
    st->config_error[0] = '\0';
    em__mem_cap_resolve(st);
    st->be = own;
    em_status s = EM_OK;
    if (st->config_error[0]) {
        s = em_error(EM_ERR_DEVICE, "%s", st->config_error);
        st->config_error[0] = '\0';
        st->cap_fraction = 0;
    }
    pthread_mutex_unlock(&st->lock);
    return s;
}

em_status em_memory_check_env(em_device d) {
    if (!well_formed(d, "em_memory_check_env")) return em_last_status();
    mem_state *st = em__mem_state(resolve(d));   /* reads EMBER_MEMORY_CAP and EMBER_MEMORY_POLICY */
    if (!st) return em_last_status();
    pthread_mutex_lock(&st->lock);
    em_status s = st->config_error[0] ? em_error(EM_ERR_ARGUMENT, "%s", st->config_error) : EM_OK;
    pthread_mutex_unlock(&st->lock);
    return s;
}

int64_t em_memory_get_cap(em_device d) {
    mem_state *st = em__mem_state_peek(resolve(d));
    if (!st) {
        st = em__mem_state(resolve(d));   /* reads EMBER_MEMORY_CAP */
        if (!st) return -1;
    }
    pthread_mutex_lock(&st->lock);
    int64_t v = st->cap;
    pthread_mutex_unlock(&st->lock);
    return v;
}

/* ---------------------------------------------------------------- summary */

/* torch.cuda.memory_summary's formats: the unit is chosen by the first column's value. */
static void fmt_size(char *out, int64_t sz, int64_t pref) {
    static const char *prefixes[] = {"B ", "KB", "MB", "GB", "TB", "PB"};
    int i = 0;
    double p = (double)pref;
    while (i < 5 && p >= 768 * 1024) {
        i++;
        sz /= 1024;
        p /= 1024;
    }
    snprintf(out, 16, "%7lld %s", (long long)sz, prefixes[i]);
}

static void fmt_count(char *out, int64_t c, int64_t pref) {
    static const char *prefixes[] = {" ", "K", "M"};
    int i = 0;
    double p = (double)pref;
    while (i < 2 && p >= 750 * 1000) {
        i++;
        c /= 1000;
        p /= 1000;
    }
    snprintf(out, 16, "%7lld %s ", (long long)c, prefixes[i]);
}

static void line(em_strbuf *b, char c) {
    char l[76];
    memset(l, c, 75);
    l[75] = '\0';
    em__sb_printf(b, "|%s|\n", l);
}

size_t em_memory_summary(em_device d, char *buf, size_t size) {
    em_memory_stats s;
    if (em_memory_get_stats(d, &s) != EM_OK) {
        if (buf && size) buf[0] = '\0';
        return 0;
    }
    d = resolve(d);
    em_strbuf b = em__sb_fixed(buf, size);
    char dev[32], title[80], cell[4][16], cap[32], largest[32];
    em__mem_device_name(d, dev, sizeof dev);
    line(&b, '=');
    snprintf(title, sizeof title, "Ember memory summary, device %s", dev);
    em__sb_printf(&b, "|%*s%*s|\n", (int)(75 + strlen(title)) / 2, title, (int)(75 - (75 + strlen(title)) / 2), "");
    line(&b, '-');
    em__sb_printf(&b, "|            OOMs: %-12lld       |       raw alloc retries: %-10lld |\n",
        (long long)s.num_ooms, (long long)s.num_alloc_retries);
    line(&b, '=');
    em__sb_printf(&b, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");
    static const struct { size_t off; const char *name; bool bytes; } rows[] = {
        {offsetof(em_memory_stats, allocated_bytes), "Allocated memory", true},
        {offsetof(em_memory_stats, active_bytes), "Active memory", true},
        {offsetof(em_memory_stats, requested_bytes), "Requested memory", true},
        {offsetof(em_memory_stats, reserved_bytes), "GPU reserved memory", true},
        {offsetof(em_memory_stats, inactive_split_bytes), "Non-releasable memory", true},
        {offsetof(em_memory_stats, allocation), "Allocations", false},
        {offsetof(em_memory_stats, active), "Active allocs", false},
        {offsetof(em_memory_stats, segment), "GPU reserved segments", false},
        {offsetof(em_memory_stats, inactive_split), "Non-releasable allocs", false},
    };
    static const struct { int pool; const char *name; } sub[] = {
        {EM_MEMORY_ALL, NULL}, {EM_MEMORY_LARGE_POOL, "      from large pool"},
        {EM_MEMORY_SMALL_POOL, "      from small pool"}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const em_memory_stat *st = (const em_memory_stat *)((const char *)&s + rows[r].off);
        const em_memory_stat *all = &st[EM_MEMORY_ALL];
        line(&b, '-');
        for (int k = 0; k < 3; k++) {
            const em_memory_stat *x = &st[sub[k].pool];
            int64_t v[4] = {x->current, x->peak, x->allocated, x->freed};
            int64_t pref[4] = {all->current, all->peak, all->allocated, all->freed};
            for (int c = 0; c < 4; c++) {
                if (rows[r].bytes) fmt_size(cell[c], v[c], pref[c]);
                else fmt_count(cell[c], v[c], pref[c]);
            }
            em__sb_printf(&b, "| %-21s | %s | %s | %s | %s |\n", sub[k].name ? sub[k].name : rows[r].name,
                cell[0], cell[1], cell[2], cell[3]);
        }
    }
    line(&b, '=');
    em_memory_format_size(s.largest_free_block, largest, sizeof largest);
    if (s.cap >= 0) em_memory_format_size(s.cap, cap, sizeof cap);
    else snprintf(cap, sizeof cap, "none");
    char row[128];
    snprintf(row, sizeof row, " Largest free block: %s   Cached segments: %lld   Cap: %s", largest,
             (long long)s.cached_segments, cap);
    em__sb_printf(&b, "|%-75.75s|\n", row);
    snprintf(row, sizeof row, " Raw allocs: %lld   Raw frees: %lld   Stream waits: %lld   Caching: %s",
             (long long)s.num_raw_allocs, (long long)s.num_raw_frees, (long long)s.num_stream_waits,
             s.caching ? "on" : "off (EMBER_NO_CACHE)");
    em__sb_printf(&b, "|%-75.75s|\n", row);
    line(&b, '=');
    if (buf && size && b.len >= size) buf[size - 1] = '\0';
    return b.len;
}
