/* `ember bench` measurements. Every number is a median over batches of calls, taken after
 * warm-up (first calls compile kernels and fill the allocator's cache), with the device
 * synchronized before each clock read, so queued work is counted where it runs. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define MAX_SAMPLES 200

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What one call works on. Each call runs in its own scope: its results are freed (back to
 * the cache) at once, as a PyTorch loop frees its temporaries. */
typedef struct call {
    em_status (*fn)(struct call *);
    em_device dev;                 /* the device measured (synchronized with the CPU) */
    em_tensor *a, *b, *c;
} call;

static em_status made(em_tensor *t) { return t ? EM_OK : em_last_status(); }

static em_status op_matmul(call *c) { return made(em_matmul(c->a, c->b)); }
static em_status op_add(call *c) { return made(em_add(c->a, c->b)); }
static em_status op_clone(call *c) { return made(em_clone(c->a)); }
static em_status op_to_dev(call *c) { return made(em_to(c->a, c->dev)); }
static em_status op_to_dev_pinned(call *c) {
    return made(em_to_device_dtype(c->a, c->dev, em_dtype_of(c->a), true));
}
static em_status op_to_cpu(call *c) { return made(em_to(c->a, EM_DEVICE_CPU)); }
static em_status op_copy_into(call *c) { return em_copy_(c->b, c->a); }
static em_status op_add_inplace(call *c) { return em_add_(c->a, c->b, 1.0); }
static em_status op_add_inplace_sync(call *c) {
    em_status st = em_add_(c->a, c->b, 1.0);
    return st == EM_OK ? em_device_synchronize(c->dev) : st;
}

/* The seed's scenario: inputs on the CPU, moved to the device, the op, the result back. */
static em_status with_copies(call *c, em_tensor *(*op)(em_tensor *, em_tensor *)) {
    em_tensor *a = em_to(c->a, c->dev), *b = a ? em_to(c->b, c->dev) : NULL;
    em_tensor *r = b ? op(a, b) : NULL;
    return made(r ? em_to(r, EM_DEVICE_CPU) : NULL);
}
static em_status op_matmul_copies(call *c) { return with_copies(c, em_matmul); }
static em_status op_add_copies(call *c) { return with_copies(c, em_add); }

static em_status sync_all(em_device d) {
    em_status st = em_device_synchronize(d);
    if (st == EM_OK && d.type != EM_CPU) st = em_device_synchronize(EM_DEVICE_CPU);
    return st;
}

static void failed(bench_time *t, const char *what) {
    t->ok = false;
    snprintf(t->error, sizeof t->error, "%s", em_failed() ? em_last_error() : what);
    em_clear_error();
}

/* Run k calls, each in its own scope, then synchronize; seconds, or -1 on failure. */
static double batch(call *c, int64_t k) {
    double t0 = now();
    for (int64_t i = 0; i < k; i++) {
        em_scope s = em_scope_begin();
        em_status st = c->fn(c);
        em_scope_end(s);
        if (st != EM_OK) return -1;
    }
    if (sync_all(c->dev) != EM_OK) return -1;
    return now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call. A warm-up call, then calibration: batches of k calls with k
 * growing until two batches in a row take min_time / 20 (so the clock and the sync are noise; these
 * batches warm up too). Then batches of that k until min_time has passed and at least 3 ran.
 * A single call slower than min_time is timed once, after the warm-up. */
static bench_time measure(call *c, double min_time, int64_t min_batch) {
    bench_time r = {0};
    if (batch(c, 1) < 0) {
        failed(&r, "the warm-up call failed");
        return r;
    }
    double target = min_time / 20;
    int64_t k = min_batch > 1 ? min_batch : 1;
    double t;
    int hits = 0;
    for (;;) {
        t = batch(c, k);
        if (t < 0) {
            failed(&r, "a call failed");
            return r;
        }
        /* twice in a row, so that one slow batch (a preempted thread) does not fix k at 1 */
        if (t >= min_time || k >= 1000000 || (t >= target && ++hits == 2)) break;
        if (t >= target) continue;
        hits = 0;
        double grow = t > 0 ? 1.2 * target / t : 100;
        int64_t next = (int64_t)((double)k * (grow < 2 ? 2 : grow > 100 ? 100 : grow));
        k = next > 1000000 ? 1000000 : next;
    }
    if (t >= min_time) {
        r.ok = true;
        r.median_s = t / (double)k;
        r.samples = 1;
        r.calls = k;
        return r;
    }
    double samples[MAX_SAMPLES], spent = 0;
    int n = 0;
    while (n < MAX_SAMPLES && (n < 3 || spent < min_time)) {
        t = batch(c, k);
        if (t < 0) {
            failed(&r, "a timed call failed");
            return r;
        }
        samples[n++] = t / (double)k;
        spent += t;
    }
    qsort(samples, (size_t)n, sizeof samples[0], cmp_double);
    r.ok = true;
    r.median_s = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
    r.samples = n;
    r.calls = (int64_t)n * k;
    return r;
}

/* Random inputs: a of shape sa and b of shape sb, in dt on d (pinned when asked, on the CPU). */
static bool inputs(call *c, em_shape sa, em_shape sb, em_dtype dt, em_device d, bool pin, bench_time *err) {
    c->a = em_rand(sa, EM_OPTS(.dtype = dt, .device = d, .pin_memory = pin));
    c->b = c->a ? em_rand(sb, EM_OPTS(.dtype = dt, .device = d, .pin_memory = pin)) : NULL;
    if (c->b && sync_all(d) == EM_OK) return true;
    failed(err, "could not create the inputs");
    return false;
}

static void release(call *c) {
    em_release(c->a);
    em_release(c->b);
    em_release(c->c);
    c->a = c->b = c->c = NULL;
}

static bench_mem memory_of(em_device d) {
    return (bench_mem){em_memory_allocated(d), em_memory_max_allocated(d), em_memory_reserved(d)};
}

/* One status line, rewritten in place (progress goes to a terminal only). */
static void progress_line(FILE *p, const char *fmt, ...) {
    if (!p) return;
    char msg[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(p, "\rember bench: measuring %-40s", msg);
    fflush(p);
}

static void run_matmul(bench_results *r, FILE *p) {
    em_device d = r->o.device;
    em_memory_reset_peak_stats(d);
    for (int i = 0; i < r->o.ndtypes; i++)
        for (int j = 0; j < r->o.nsizes; j++) {
            int64_t n = r->o.sizes[j];
            bench_time *t = &r->matmul[i][j];
            progress_line(p, "matmul %s n=%lld", bench_dtype_short(r->o.dtypes[i]), (long long)n);
            call c = {.fn = op_matmul, .dev = d};
            if (inputs(&c, EM_SHAPE(n, n), EM_SHAPE(n, n), r->o.dtypes[i], d, false, t))
                *t = measure(&c, r->o.min_time, 1);
            release(&c);
        }
    r->matmul_mem = memory_of(d);
}

static void run_copy(bench_results *r, FILE *p) {
    em_device d = r->o.device;
    static const int64_t full[] = {64 << 10, 1 << 20, 16 << 20, 64 << 20}, quick[] = {1 << 20, 16 << 20};
    const int64_t *sizes = r->o.quick ? quick : full;
    r->ncopies = r->o.quick ? 2 : 4;
    r->host_device = d.type != EM_CPU;
    em_memory_reset_peak_stats(d);
    for (int i = 0; i < r->ncopies; i++) {
        int64_t bytes = sizes[i], n = bytes / 4;
        r->copy_bytes[i] = bytes;
        progress_line(p, "copy %lld bytes", (long long)bytes);
        call c = {.fn = op_clone, .dev = EM_DEVICE_CPU};
        if (inputs(&c, EM_SHAPE(n), EM_SHAPE(1), EM_F32, EM_DEVICE_CPU, false, &r->memcpy_ref[i]))
            r->memcpy_ref[i] = measure(&c, r->o.min_time, 1);
        if (r->host_device) {
            c.dev = d;
            c.fn = op_to_dev;
            r->h2d_pageable[i] = c.a ? measure(&c, r->o.min_time, 1) : r->memcpy_ref[i];
            release(&c);
            c.fn = op_to_dev_pinned;
            if (inputs(&c, EM_SHAPE(n), EM_SHAPE(n), EM_F32, EM_DEVICE_CPU, true, &r->h2d_pinned[i]))
                r->h2d_pinned[i] = measure(&c, r->o.min_time, 1);
            /* device -> host: into new (pageable) memory as em_to does, and into the pinned b */
            em_tensor *pinned = c.b;
            c.b = NULL;
            release(&c);
            c.a = em_rand(EM_SHAPE(n), EM_OPTS(.device = d));
            c.b = pinned;
            if (!c.a) {
                failed(&r->d2h_pageable[i], "could not create the input");
                r->d2h_pinned[i] = r->d2h_pageable[i];
            } else {
                c.fn = op_to_cpu;
                r->d2h_pageable[i] = measure(&c, r->o.min_time, 1);
                c.fn = op_copy_into;
                if (c.b) r->d2h_pinned[i] = measure(&c, r->o.min_time, 1);
                else failed(&r->d2h_pinned[i], "no pinned host tensor");
            }
        }
        release(&c);
    }
    r->copy_mem = memory_of(d);
    em_memory_stats ps;
    r->pinned_reserved = em_memory_get_pinned_stats(&ps) == EM_OK ? ps.reserved_bytes[EM_MEMORY_ALL].current : -1;
    em_clear_error();
}

static bench_time launch_on(em_device d, em_status (*fn)(call *), double min_time, int64_t min_batch) {
    bench_time t = {0};
    call c = {.fn = fn, .dev = d};
    if (inputs(&c, EM_SHAPE(1), EM_SHAPE(1), EM_F32, d, false, &t)) t = measure(&c, min_time, min_batch);
    release(&c);
    return t;
}

static void run_launch(bench_results *r, FILE *p) {
    em_device d = r->o.device;
    progress_line(p, "launch latency");
    r->launch_queued = launch_on(d, op_add_inplace, r->o.min_time, 100);
    r->launch_synced = launch_on(d, op_add_inplace_sync, r->o.min_time, 10);
    r->launch_cpu = d.type == EM_CPU ? r->launch_queued : launch_on(EM_DEVICE_CPU, op_add_inplace, r->o.min_time, 100);
}

int64_t bench_faster_from(const bench_xo *x, const bench_time *dev) {
    int64_t from = 0;
    for (int i = x->n - 1; i >= 0; i--) {
        if (!dev[i].ok || !x->cpu[i].ok || dev[i].median_s >= x->cpu[i].median_s) break;
        from = x->sizes[i];
    }
    return from;
}

static void run_xo(bench_results *r, bench_xo *x, bool matmul, FILE *p) {
    em_device d = r->o.device;
    int64_t lo = matmul ? 16 : 1 << 10, hi = matmul ? (r->o.quick ? 512 : 2048) : (r->o.quick ? 1 << 22 : 1 << 26);
    int64_t step = matmul ? 2 : 4;
    x->n = 0;
    for (int64_t s = lo; s <= hi && x->n < BENCH_MAX_XO; s *= step) x->sizes[x->n++] = s;
    for (int i = 0; i < x->n; i++) {
        int64_t s = x->sizes[i];
        progress_line(p, "crossover %s n=%lld", matmul ? "matmul" : "add", (long long)s);
        em_shape shape = matmul ? EM_SHAPE(s, s) : EM_SHAPE(s);
        call c = {.fn = matmul ? op_matmul : op_add, .dev = EM_DEVICE_CPU};
        if (inputs(&c, shape, shape, EM_F32, EM_DEVICE_CPU, false, &x->cpu[i])) {
            x->cpu[i] = measure(&c, r->o.min_time, 1);
            c.dev = d;
            c.fn = matmul ? op_matmul_copies : op_add_copies;
            x->dev_copies[i] = measure(&c, r->o.min_time, 1);
        } else {
            x->dev_copies[i] = x->cpu[i];
        }
        release(&c);
        c.fn = matmul ? op_matmul : op_add;
        if (inputs(&c, shape, shape, EM_F32, d, false, &x->dev[i])) x->dev[i] = measure(&c, r->o.min_time, 1);
        release(&c);
    }
    x->faster_from = bench_faster_from(x, x->dev);
    x->faster_from_copies = bench_faster_from(x, x->dev_copies);
}

void bench_run(bench_results *r, FILE *p) {
    em_device d = r->o.device;
    r->props_ok = em_device_get_props(d, &r->props) == EM_OK;
    em_clear_error();
    if (r->o.device_auto) snprintf(r->auto_reason, sizeof r->auto_reason, "%s", em_device_auto_reason());
    if (r->o.nsizes == 0) {
        /* sizes where a GPU gets near its peak; smaller ones for CPUs, which are slow at n = 8192 */
        static const int64_t gpu[] = {256, 1024, 2048, 4096, 8192}, cpu[] = {128, 256, 512, 1024},
                             quick[] = {128, 256, 512};
        bool g = r->props_ok && r->props.is_gpu;
        const int64_t *s = r->o.quick ? quick : g ? gpu : cpu;
        r->o.nsizes = r->o.quick ? 3 : g ? 5 : 4;
        memcpy(r->o.sizes, s, sizeof(int64_t) * (size_t)r->o.nsizes);
    }
    em_manual_seed(0);
    if (r->o.sections & BENCH_MATMUL) run_matmul(r, p);
    if (r->o.sections & BENCH_COPY) run_copy(r, p);
    if (r->o.sections & BENCH_LAUNCH) run_launch(r, p);
    if (r->o.sections & BENCH_CROSSOVER) {
        if (d.type == EM_CPU) {
            r->xo_skipped = true;
            snprintf(r->xo_reason, sizeof r->xo_reason,
                     "the device is the CPU: there is nothing to compare it with (use --device cuda:N or opencl:N)");
        } else {
            run_xo(r, &r->xo_matmul, true, p);
            run_xo(r, &r->xo_add, false, p);
        }
    }
    if (p) fprintf(p, "\r%80s\r", "");
    em_clear_error();
}

static int failed_in(const bench_time *t, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += !t[i].ok && t[i].error[0];
    return k;
}

int bench_failures(const bench_results *r) {
    int k = 0;
    if (r->o.sections & BENCH_MATMUL)
        for (int i = 0; i < r->o.ndtypes; i++) k += failed_in(r->matmul[i], r->o.nsizes);
    if (r->o.sections & BENCH_COPY) {
        k += failed_in(r->memcpy_ref, r->ncopies);
        if (r->host_device)
            k += failed_in(r->h2d_pageable, r->ncopies) + failed_in(r->h2d_pinned, r->ncopies) +
                 failed_in(r->d2h_pageable, r->ncopies) + failed_in(r->d2h_pinned, r->ncopies);
    }
    if (r->o.sections & BENCH_LAUNCH)
        k += failed_in(&r->launch_queued, 1) + failed_in(&r->launch_synced, 1) + failed_in(&r->launch_cpu, 1);
    if ((r->o.sections & BENCH_CROSSOVER) && !r->xo_skipped)
        for (int m = 0; m < 2; m++) {
            const bench_xo *x = m ? &r->xo_add : &r->xo_matmul;
            k += failed_in(x->cpu, x->n) + failed_in(x->dev, x->n) + failed_in(x->dev_copies, x->n);
        }
    return k;
}
