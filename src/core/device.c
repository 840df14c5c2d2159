/* The backend registry and devices: parsing and printing PyTorch's device strings,
 * availability, auto-selection, the per-thread current device, and the thread count. */
#include "core_internal.h"
#include "internal_api.h"
#include "../util/errors.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char mps_reason[] = "MPS needs Apple Silicon and macOS; this build runs on Linux";

/* ---- the registry: one entry per device type, in em_device_type order. Adding a backend
 * is its folder plus one line here. Each backend's init() runs once, on first use, from
 * any thread. ---- */

typedef struct registered {
    em_device_type type;
    const char *name;           /* as in device strings: "cuda" */
    const em_backend *backend;  /* NULL: not built into this library */
    const char *absent_reason;  /* why, when backend is NULL (NULL: a generic reason) */
    pthread_mutex_t lock;       /* serializes the first init */
    atomic_bool ready;          /* init ran; status holds its result */
    em_status status;
} registered;

#define EM__REGISTER(t, n, be, why) \
    [t] = {.type = t, .name = n, .backend = be, .absent_reason = why, .lock = PTHREAD_MUTEX_INITIALIZER}

static registered g_registry[EM_DEVICE_TYPE_COUNT] = {
    EM__REGISTER(EM_CPU, "cpu", &em__cpu_backend, NULL),
    EM__REGISTER(EM_CUDA, "cuda", &em__cuda_backend, NULL), /* always built: dlopens CUDA */
    EM__REGISTER(EM_MPS, "mps", NULL, mps_reason),
#ifdef EMBER_HAVE_OPENCL
    EM__REGISTER(EM_OPENCL, "opencl", &em__opencl_backend, NULL),
#else
    EM__REGISTER(EM_OPENCL, "opencl", NULL, NULL),
#endif
};

/* t's entry after its backend's init ran (NULL for an invalid type). */
static registered *entry_ready(em_device_type t) {
    if ((unsigned)t >= EM_DEVICE_TYPE_COUNT) return NULL;
    registered *r = &g_registry[t];
    if (atomic_load_explicit(&r->ready, memory_order_acquire)) return r;
    pthread_mutex_lock(&r->lock);
    if (!atomic_load_explicit(&r->ready, memory_order_relaxed)) {
        /* A backend's init reports unavailability by status, but keep any message it
         * records from leaking into the caller's error state. */
        em_error_state saved;
        em__error_save(&saved);
        em_clear_error();
        r->status = !r->backend ? EM_ERR_UNAVAILABLE : r->backend->init ? r->backend->init() : EM_OK;
        em__error_restore(&saved);
        atomic_store_explicit(&r->ready, true, memory_order_release);
    }
    pthread_mutex_unlock(&r->lock);
    return r;
}

static const char *type_name(em_device_type t) { return g_registry[t].name; }

/* The backend of t after its init ran, or NULL when it is not built or failed to start. */
static const em_backend *ready_backend(em_device_type t) {
    registered *r = entry_ready(t);
    return r && r->status == EM_OK ? r->backend : NULL;
}

static atomic_long host_waits;
void em__count_host_wait(void) { atomic_fetch_add_explicit(&host_waits, 1, memory_order_relaxed); }
long em__host_wait_count(void) { return atomic_load_explicit(&host_waits, memory_order_relaxed); }

const em_backend *em__backend_for(em_device_type t) {
    registered *r = entry_ready(t);
    return r ? r->backend : NULL;
}

/* ---- the current device of each type, per thread (as CUDA's current device is) ---- */

static _Thread_local int tl_current[EM_DEVICE_TYPE_COUNT];

em_device em_device_resolve(em_device d) {
    if (d.type == EM_CPU) d.index = 0;
    else if (d.index < 0 && (unsigned)d.type < EM_DEVICE_TYPE_COUNT) d.index = tl_current[d.type];
    return d;
}

const em_backend *em__backend_checked(em_device d, const char *op) {
    if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT) {
        em_error(EM_ERR_DEVICE, "%s: invalid device type %d", op, (int)d.type);
        return NULL;
    }
    if (d.index < -1) {   /* -1 alone means the current device */
        em_error(EM_ERR_DEVICE, "%s: invalid device index %d for %s: expected 0 or more (-1: the current device)", op,
                 d.index, type_name(d.type));
        return NULL;
    }
    if (d.type == EM_CPU && d.index > 0) {
        em_error(EM_ERR_DEVICE, "%s: device cpu:%d does not exist (the CPU is always cpu:0)", op,
                 d.index);
        return NULL;
    }
    const em_backend *be = ready_backend(d.type);
    if (!be) {
        em_error(EM_ERR_UNAVAILABLE, "%s: %s is not available: %s", op, type_name(d.type),
                 em_device_unavailable_reason(d.type));
        return NULL;
    }
    d = em_device_resolve(d);
    int count = be->device_count ? be->device_count() : 0;
    if (d.index >= count) {
        em_error(EM_ERR_DEVICE, "%s: device %s:%d does not exist (%d %s device%s available)", op,
                 type_name(d.type), d.index, count, type_name(d.type), count == 1 ? "" : "s");
        return NULL;
    }
    return be;
}

em_device em_device_current(em_device_type t) {
    if ((unsigned)t >= EM_DEVICE_TYPE_COUNT) return EM_DEVICE_CPU;
    return (em_device){t, t == EM_CPU ? 0 : tl_current[t]};
}

em_status em_device_set_current(em_device d) {
    if (!em__backend_checked(d, "em_device_set_current")) return em_last_status();
    d = em_device_resolve(d);
    tl_current[d.type] = d.index;
    return EM_OK;
}

em_device_guard em_device_guard_begin(em_device d) {
    em_device_guard g = {.previous = em_device_current(d.type), .active = false};
    if (em_device_set_current(d) == EM_OK) g.active = true;
    return g;
}

void em_device_guard_end(em_device_guard g) {
    if (g.active && (unsigned)g.previous.type < EM_DEVICE_TYPE_COUNT)
        tl_current[g.previous.type] = g.previous.type == EM_CPU ? 0 : g.previous.index;
}

/* ---- strings ---- */

const char *em_device_type_name(em_device_type t) {
    return (unsigned)t < EM_DEVICE_TYPE_COUNT ? type_name(t) : "invalid";
}

em_device_string em_device_str(em_device d) {
    em_device_string s;
    if ((unsigned)d.type >= EM_DEVICE_TYPE_COUNT) snprintf(s.s, sizeof s.s, "invalid:%d", (int)d.type);
    else if (d.type == EM_CPU || d.index < 0) snprintf(s.s, sizeof s.s, "%s", type_name(d.type));
    else snprintf(s.s, sizeof s.s, "%s:%d", type_name(d.type), d.index);
    return s;
}

em_status em_device_parse(const char *s, em_device *out) {
    static const char accepted[] =
        "expected one of cpu, cuda, cuda:N, mps, mps:0, opencl, opencl:N (N a device index >= 0)";
    if (!s || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_device_parse: NULL argument");
    const char *colon = strchr(s, ':');
    size_t type_len = colon ? (size_t)(colon - s) : strlen(s);
    int type = -1;
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        const registered *r = &g_registry[t];
        if (strlen(r->name) == type_len && strncmp(s, r->name, type_len) == 0) type = (int)r->type;
    }
    if (type < 0) return em_error(EM_ERR_ARGUMENT, "invalid device string '%s': %s", s, accepted);
    int index = -1;
    if (colon) {
        const char *p = colon + 1;
        /* Digits only, no sign and no leading zeros (as PyTorch's parser). */
        if (!*p || (p[0] == '0' && p[1]) || strspn(p, "0123456789") != strlen(p) || strlen(p) > 9)
            return em_error(EM_ERR_ARGUMENT, "invalid device string '%s': %s", s, accepted);
        index = atoi(p);
        if (type == EM_CPU && index != 0)
            return em_error(EM_ERR_ARGUMENT, "invalid device string '%s': the CPU is cpu or cpu:0", s);
    }
    *out = (em_device){(em_device_type)type, type == EM_CPU ? 0 : index};
    return EM_OK;
}

bool em_device_equal(em_device a, em_device b) {
    a = em_device_resolve(a);
    b = em_device_resolve(b);
    return a.type == b.type && a.index == b.index;
}

/* ---- availability ---- */

bool em_device_available(em_device_type t) { return em_device_count(t) > 0; }

int em_device_count(em_device_type t) {
    const em_backend *be = ready_backend(t);
    return be && be->device_count ? be->device_count() : 0;
}

const char *em_device_unavailable_reason(em_device_type t) {
    if ((unsigned)t >= EM_DEVICE_TYPE_COUNT) return "not a device type";
    const registered *r = entry_ready(t);
    const em_backend *be = r->backend;
    if (!be)
        return r->absent_reason ? r->absent_reason
                                : "this build of Ember has no backend for it (built without its headers)";
    if (r->status != EM_OK) {
        const char *r = be->unavailable_reason ? be->unavailable_reason() : NULL;
        return r && *r ? r : "its backend failed to start";
    }
    if (em_device_count(t) == 0) {
        const char *r = be->unavailable_reason ? be->unavailable_reason() : NULL;
        return r && *r ? r : "no devices found";
    }
    return NULL;
}

em_status em_device_get_props(em_device d, em_device_props *out) {
    if (!out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_device_get_props: argument 'out' is NULL");
    const em_backend *be = em__backend_checked(d, "em_device_get_props");
    if (!be) return em_last_status();
    memset(out, 0, sizeof *out);
    if (!be->device_props)
        return em_error(EM_ERR_NOT_SUPPORTED, "em_device_get_props: the %s backend cannot describe its devices",
                        be->name);
    return be->device_props(em_device_resolve(d).index, out);
}

em_status em_device_synchronize(em_device d) {
    const em_backend *be = em__backend_checked(d, "em_device_synchronize");
    if (!be) return em_last_status();
    em_status st = be->synchronize ? be->synchronize(em_device_resolve(d).index) : EM_OK;
    /* the wait is done: what device work found wrong in the user's input (device_checks.c) */
    return st == EM_OK && d.type != EM_CPU ? em__device_checks_read(d) : st;
}

/* ---- auto-selection ---- */

static _Thread_local char tl_auto_reason[1024];

/* The first OpenCL device that is a GPU, or -1; counts OpenCL devices in *n. */
static int first_opencl_gpu(int *n) {
    *n = em_device_count(EM_OPENCL);
    const em_backend *be = ready_backend(EM_OPENCL);
    for (int i = 0; be && be->device_props && i < *n; i++) {
        em_device_props p;
        memset(&p, 0, sizeof p);
        em_error_state saved;
        em__error_save(&saved);
        em_status s = be->device_props(i, &p);
        em__error_restore(&saved);
        if (s == EM_OK && p.is_gpu) return i;
    }
    return -1;
}

/* Auto choice without the environment override; writes why into buf. */
static em_device auto_choice(char *buf, size_t size) {
    if (em_device_available(EM_CUDA)) {
        em_device d = em_device_current(EM_CUDA);
        snprintf(buf, size, "%s: CUDA is available (%d device%s)", em_device_str(d).s,
                 em_device_count(EM_CUDA), em_device_count(EM_CUDA) == 1 ? "" : "s");
        return d;
    }
    if (em_device_available(EM_MPS)) {
        snprintf(buf, size, "mps: MPS is available and CUDA is not");
        return EM_DEVICE(EM_MPS, 0);
    }
    int n_ocl = 0, gpu = first_opencl_gpu(&n_ocl);
    if (gpu >= 0) {
        snprintf(buf, size, "opencl:%d: the first OpenCL GPU (CUDA unavailable: %s; MPS unavailable)",
                 gpu, em_device_unavailable_reason(EM_CUDA));
        return EM_DEVICE(EM_OPENCL, gpu);
    }
    const char *ocl = n_ocl > 0 ? "OpenCL has no GPU" : em_device_unavailable_reason(EM_OPENCL);
    char ocl_buf[160];
    if (n_ocl > 0)
        snprintf(ocl_buf, sizeof ocl_buf, "%s (%d OpenCL device%s, none is a GPU)", ocl, n_ocl,
                 n_ocl == 1 ? "" : "s");
    else snprintf(ocl_buf, sizeof ocl_buf, "OpenCL unavailable: %s", ocl ? ocl : "no devices");
    snprintf(buf, size, "cpu: no GPU found (CUDA unavailable: %s; MPS unavailable: %s; %s)",
             em_device_unavailable_reason(EM_CUDA), mps_reason, ocl_buf);
    return EM_DEVICE_CPU;
}

em_device em_device_auto(void) {
    const char *env = getenv("EMBER_DEVICE");
    if (env && *env) {
        em_error_state saved;
        em__error_save(&saved);
        em_clear_error();
        em_device d;
        bool ok = em_device_parse(env, &d) == EM_OK && em__backend_checked(d, "EMBER_DEVICE") != NULL;
        char why[300];
        snprintf(why, sizeof why, "%s", em_last_error());
        em__error_restore(&saved);
        if (ok) {
            d = em_device_resolve(d);
            snprintf(tl_auto_reason, sizeof tl_auto_reason, "%s: chosen by EMBER_DEVICE=%s",
                     em_device_str(d).s, env);
            return d;
        }
        char rest[400];
        em_device a = auto_choice(rest, sizeof rest);
        snprintf(tl_auto_reason, sizeof tl_auto_reason, "EMBER_DEVICE=%s ignored (%s); auto: %s", env, why,
                 rest);
        return a;
    }
    return auto_choice(tl_auto_reason, sizeof tl_auto_reason);
}

const char *em_device_auto_reason(void) {
    em_device_auto();
    return tl_auto_reason;
}

/* ---- CPU threads ---- */

static atomic_int g_num_threads; /* 0: not set yet, use the number of online CPUs */

void em_set_num_threads(int n) {
    if (n < 1) {
        em_error(EM_ERR_ARGUMENT, "em_set_num_threads: the number of threads must be positive, got %d", n);
        return;
    }
    atomic_store(&g_num_threads, n);
}

int em_get_num_threads(void) {
    int n = atomic_load_explicit(&g_num_threads, memory_order_relaxed);
    if (n > 0) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n = c > 0 ? (int)c : 1;
    int expected = 0;
    atomic_compare_exchange_strong(&g_num_threads, &expected, n);
    return atomic_load(&g_num_threads);
}
