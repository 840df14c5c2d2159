/* Allocator configuration: byte sizes with units, EMBER_MEMORY_CAP, and fault injection. */
#include <ctype.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "internal.h"
#include "../util/errors.h"

/* ---------------------------------------------------------------- sizes */

/* Parse a number with an optional unit into bytes; *has_unit says whether a unit was given.
 * Returns false on anything malformed. */
static bool parse_size(const char *s, double *out, bool *has_unit) {
    static const struct { const char *name; double mult; } units[] = {
        {"b", 1},         {"kb", 1e3},           {"mb", 1e6},           {"gb", 1e9},
        {"tb", 1e12},     {"kib", 1024.0},       {"mib", 1048576.0},    {"gib", 1073741824.0},
        {"tib", 1099511627776.0}, {"k", 1024.0}, {"m", 1048576.0},      {"g", 1073741824.0},
        {"t", 1099511627776.0},
    };
    while (isspace((unsigned char)*s)) s++;
    if (!*s || *s == '-' || *s == '+') return false;
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0) return false;
    while (isspace((unsigned char)*end)) end++;
    size_t n = strlen(end);
    while (n && isspace((unsigned char)end[n - 1])) n--;
    *has_unit = n > 0;
    if (n) {
        double mult = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strlen(units[i].name) == n && !strncasecmp(end, units[i].name, n)) mult = units[i].mult;
        if (mult == 0) return false;
        v *= mult;
    }
    if (v > 9.2e18) return false;
    *out = v;
    return true;
}

em_status em_memory_parse_size(const char *s, int64_t *out) {
    double v;
    bool unit;
    if (!s || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_memory_parse_size: NULL argument");
    if (!parse_size(s, &v, &unit))
        return em_error(EM_ERR_ARGUMENT, "cannot read the size '%s': expected a non-negative number with an "
                        "optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 512MiB", s);
    *out = (int64_t)llround(v);
    return EM_OK;
}

void em_memory_format_size(int64_t bytes, char *buf, size_t size) {
    const char *sign = bytes < 0 ? "-" : "";
    double v = fabs((double)bytes);
    if (v < 1024) snprintf(buf, size, "%s%.0f bytes", sign, v);
    else if (v < 1048576.0) snprintf(buf, size, "%s%.2f KiB", sign, v / 1024);
    else if (v < 1073741824.0) snprintf(buf, size, "%s%.2f MiB", sign, v / 1048576.0);
    else snprintf(buf, size, "%s%.2f GiB", sign, v / 1073741824.0);
}

/* ---------------------------------------------------------------- EMBER_MEMORY_CAP */

/* Does key ("cpu", "opencl", "opencl:1") name device d? Returns 2 for an exact index, 1 for
 * the whole type, 0 for another device, -1 for a malformed key. */
static int key_matches(const char *key, size_t n, em_device d) {
    static const char *names[] = {"cpu", "cuda", "mps", "opencl"};
    for (int t = 0; t < 4; t++) {
        size_t len = strlen(names[t]);
        if (n < len || strncasecmp(key, names[t], len)) continue;
        if (n == len) return t == (int)d.type ? 1 : 0;
        if (key[len] != ':' || n == len + 1) continue;
        int idx = 0;
        for (size_t i = len + 1; i < n; i++) {
            if (!isdigit((unsigned char)key[i]) || idx > 100000) return -1;
            idx = idx * 10 + (key[i] - '0');
        }
        return t == (int)d.type && idx == d.index ? 2 : 0;
    }
    return -1;
}

static void cap_from_env(mem_state *st) {
    const char *env = getenv("EMBER_MEMORY_CAP");
    if (!env || !*env) return;
    char *buf = strdup(env);   /* the whole value: a long list is not cut */
    if (!buf) {
        snprintf(st->config_error, sizeof st->config_error, "EMBER_MEMORY_CAP: out of host memory reading it");
        return;
    }
    int best = 0;
    for (char *item = buf, *next; item; item = next) {
        char *comma = strchr(item, ',');
        next = comma ? comma + 1 : NULL;
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*item)) item++;
        if (!*item) {   /* "cpu=5MiB,," or a leading comma: a missing entry, not nothing */
            snprintf(st->config_error, sizeof st->config_error,
                     "EMBER_MEMORY_CAP: an empty entry in '%.80s': expected entries like cpu=512MiB, opencl:0=0.5 "
                     "(a fraction of total memory) or cuda=8GB, separated by single commas", env);
            break;
        }
        char *eq = strchr(item, '=');
        const char *value = eq ? eq + 1 : item;
        /* precedence: a bare value (every device) 1, a device type 2, one device 3 */
        int m = 1;
        if (eq) {
            size_t n = (size_t)(eq - item);
            while (n && isspace((unsigned char)item[n - 1])) n--;
            m = key_matches(item, n, st->dev);
            if (m > 0) m++;
        }
        double v;
        bool unit;
        if (m < 0 || !parse_size(value, &v, &unit)) {
            snprintf(st->config_error, sizeof st->config_error,
                     "EMBER_MEMORY_CAP: cannot read '%.80s': expected entries like cpu=512MiB, "
                     "opencl:0=0.5 (a fraction of total memory) or cuda=8GB, separated by commas", item);
            break;
        }
        if (m == 0) continue;   /* another device's cap */
        if (m == best) {        /* "cpu=1G,cpu=2G": which one was meant? */
            snprintf(st->config_error, sizeof st->config_error,
                     "EMBER_MEMORY_CAP: two entries give the cap of the same device (the second is '%.80s'): "
                     "give each device once", item);
            break;
        }
        if (m < best) continue;  /* "opencl:0=1G" beats "opencl=2G" beats "4G", whatever the order */
        best = m;
        st->cap_source = "EMBER_MEMORY_CAP";
        if (!unit && v > 0 && v <= 1.0) {
            st->cap_fraction = v;
            st->cap = -1;
        } else {
            st->cap_fraction = 0;
            st->cap = (int64_t)llround(v);
        }
    }
    free(buf);
    if (st->config_error[0]) {   /* a bad value gives no cap at all, not half of one */
        st->cap = -1;
        st->cap_fraction = 0;
        st->cap_source = NULL;
    }
}

/* EMBER_CUDA_ALLOC_CONF, PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value"):
 * expandable_segments:True|False. CUDA devices only. */
static void cuda_conf_from_env(mem_state *st) {
    const char *env = getenv("EMBER_CUDA_ALLOC_CONF");
    if (st->dev.type != EM_CUDA || !env || !*env) return;
    char *buf = strdup(env);
    if (!buf) {
        snprintf(st->config_error, sizeof st->config_error, "EMBER_CUDA_ALLOC_CONF: out of host memory reading it");
        return;
    }
    for (char *item = buf, *next; item; item = next) {
        char *comma = strchr(item, ',');
        next = comma ? comma + 1 : NULL;
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*item)) item++;
        size_t n = strlen(item);
        while (n && isspace((unsigned char)item[n - 1])) item[--n] = '\0';
        char *colon = strchr(item, ':');
        const char *value = colon ? colon + 1 : "";
        if (colon) *colon = '\0';
        bool on = !strcasecmp(value, "true") || !strcmp(value, "1");
        bool off = !strcasecmp(value, "false") || !strcmp(value, "0");
        if (strcmp(item, "expandable_segments") != 0 || (!on && !off)) {
            snprintf(st->config_error, sizeof st->config_error,
                     "EMBER_CUDA_ALLOC_CONF: cannot read '%.40s%s%.40s' in '%.80s': expected "
                     "expandable_segments:True or expandable_segments:False", item, colon ? ":" : "", value, env);
            break;
        }
        st->expandable = on;
    }
    free(buf);
}

void em__mem_config_from_env(mem_state *st) {
    cuda_conf_from_env(st);
    if (st->config_error[0]) return;
    const char *policy = getenv("EMBER_MEMORY_POLICY");
    /* 'peak' is for the CPU when memory is what runs out: it holds a training step's resident
     * memory lower but runs its steps slower on two threads (docs/BENCHMARKS.md), so every
     * device keeps Ember's policy unless asked */
    st->policy = MEM_POLICY_EMBER;
    if (policy && *policy) {
        if (!strcasecmp(policy, "ember")) st->policy = MEM_POLICY_EMBER;
        else if (!strcasecmp(policy, "pytorch")) st->policy = MEM_POLICY_PYTORCH;
        else if (!strcasecmp(policy, "peak")) st->policy = MEM_POLICY_PEAK;
        else snprintf(st->config_error, sizeof st->config_error,
                      "EMBER_MEMORY_POLICY: unknown policy '%s': expected 'ember' (the default), 'peak' or "
                      "'pytorch'", policy);
    }
    if (!st->config_error[0]) cap_from_env(st);
}

void em__mem_cap_resolve(mem_state *st) {
    if (st->cap_fraction <= 0 || !st->be) return;
    em_device_props p;
    em_error_state saved;
    em__error_save(&saved);
    bool ok = st->be->device_props && st->be->device_props(st->dev.index, &p) == EM_OK && p.total_memory > 0;
    em__error_restore(&saved);
    if (!ok) {
        char dev[32];
        em__mem_device_name(st->dev, dev, sizeof dev);
        snprintf(st->config_error, sizeof st->config_error,
                 "%s: the memory cap of %s is a fraction (%g) of total memory, but %s does not report "
                 "its total memory; give the cap in bytes instead (e.g. 512MiB)",
                 st->cap_source ? st->cap_source : "memory cap", dev, st->cap_fraction, dev);
        return;
    }
    st->cap = (int64_t)(st->cap_fraction * (double)p.total_memory);
    st->cap_fraction = 0;
    st->stats.cap = st->cap;
}

/* ---------------------------------------------------------------- fault injection */

static atomic_llong debug_skip;   /* raw allocations still allowed before the failures */
static atomic_llong debug_fails;  /* failures left to inject */

void em__mem_debug_fail_raw(int64_t nth, int64_t count) {
    atomic_store(&debug_fails, 0);
    atomic_store(&debug_skip, nth > 0 ? nth - 1 : 0);
    atomic_store(&debug_fails, nth > 0 && count > 0 ? count : 0);
}

void em__mem_debug_fail_after(int64_t n) {
    em__mem_debug_fail_raw(n, 1);
}

bool em__mem_debug_should_fail(void) {
    if (atomic_load_explicit(&debug_fails, memory_order_relaxed) <= 0) return false;
    if (atomic_fetch_sub(&debug_skip, 1) > 0) return false;
    return atomic_fetch_sub(&debug_fails, 1) > 0;
}
