/* The fault sweep: one training step of an MLP (forward, cross-entropy, backward, Adam step,
 * checkpoint save) with its Nth allocation failing, for every N up to the step's count of
 * allocations, on the CPU and on OpenCL (PoCL). Two kinds of allocation are swept:
 *   - device (and pinned) allocation requests, through the memory layer's test hook
 *     (em__mem_debug_fail_request in src/memory/allocator.h);
 *   - Ember's host mallocs on the stepping thread, through -Wl,--wrap=malloc,calloc,
 *     realloc,strdup on this executable (CMakeLists.txt): only calls made from Ember's
 *     objects and this file are wrapped, never OpenBLAS's, PoCL's or libc's own.
 * Each failing step must return an error with a message and leave the model and optimizer
 * either untouched or fully stepped (never half-updated); the next step must then succeed
 * and give bit for bit what an undisturbed run gives; the checkpoint on disk must load and
 * be the old one or the new one, with no temporary file left behind; device memory must
 * come back to its level before the step. Host leaks are LeakSanitizer's (the ASan build).
 * On the CPU the sweep runs a second time with the forward in a bf16 autocast region: the
 * weights' casts, their float32 gradients straight from the bf16 products (matmul_widen) and
 * Adam's bf16 copies of the weights are then among the allocations that fail. */
#include "test.h"
#include <dirent.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include "memory/allocator.h"

/* ---------------------------------------------------------------- host malloc wrappers */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

/* Only the stepping thread counts: the CPU backend's workers would make the count vary. */
static _Thread_local int host_armed;  /* count (and maybe fail) only while a step runs */
static atomic_llong host_calls;       /* host allocations counted since arming */
static atomic_llong host_fail_at;     /* this call fails; 0: none */

static bool host_fails(void) {
    if (!host_armed) return false;
    long long n = atomic_fetch_add(&host_calls, 1) + 1;
    return n == atomic_load(&host_fail_at);
}

void *__wrap_malloc(size_t n) { return host_fails() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return host_fails() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return host_fails() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return host_fails() ? NULL : __real_strdup(s); }

static void host_arm(long long fail_at) {
    atomic_store(&host_fail_at, fail_at);
    atomic_store(&host_calls, 0);
    host_armed = 1;
}
static long long host_disarm(void) {
    host_armed = 0;
    return atomic_load(&host_calls);
}

/* ---------------------------------------------------------------- the step */

enum { IN = 12, HID = 16, OUT = 5, BATCH = 8, NPARAM = 4, NSTATE = 2 * NPARAM };
enum kind { DEVICE, HOST };

typedef struct net {
    em_module *m;
    em_optimizer *o;
} net;

static char dir[64], ckpt[96];
static em_tensor *xs, *ys;
static bool g_amp; /* the forward in a CPU bf16 autocast region */

static net net_new(em_device d) {
    em_manual_seed(1234);
    net n;
    n.m = em_nn_sequential(em_nn_linear(IN, HID), em_nn_relu(), em_nn_linear(HID, OUT));
    CHECK(n.m != NULL);
    CHECK_OK(em_module_to(n.m, d));
    n.o = em_adam(n.m, 0.05);
    CHECK(n.o != NULL);
    return n;
}

static void net_free(net n) {
    em_optim_free(n.o);
    em_module_free(n.m);
}

static em_status step(net n) {
    em_scope s = em_scope_begin();
    em_status st = em_zero_grad(n.o);
    if (st == EM_OK) {
        em_autocast ac = {0};
        if (g_amp) ac = em_autocast_begin(EM_CPU, EM_BF16);
        em_tensor *loss = g_amp && ac.depth == 0 ? NULL : em_cross_entropy(em_forward(n.m, xs), ys, 0.0);
        if (ac.depth > 0 && em_autocast_end(ac) != EM_OK) loss = NULL;
        st = loss ? em_backward(loss) : em_last_status();
        if (st == EM_OK) st = em_step(n.o);
        if (st == EM_OK) {
            const char *k[] = {"step"}, *v[] = {"1"};
            st = em_checkpoint_save(ckpt, n.m, n.o, k, v, 1);
        }
    }
    em_scope_end(s);
    if (st == EM_OK && em_failed()) st = em_last_status();
    return st;
}

/* Every parameter and Adam moment, flattened onto the host (NSTATE + NPARAM arrays). */
typedef struct snap {
    float v[NPARAM + NSTATE][IN * HID];
    int64_t n[NPARAM + NSTATE];
    int64_t steps;
} snap;

static void take(net n, snap *out) {
    memset(out, 0, sizeof *out);
    em_named_tensor p[NPARAM];
    CHECK(em_module_parameters(n.m, p, NPARAM) == NPARAM);
    static const char *names[] = {"exp_avg", "exp_avg_sq"};
    em_scope s = em_scope_begin();
    for (int i = 0; i < NPARAM + NSTATE; i++) {
        em_tensor *t = i < NPARAM ? p[i].tensor
                                  : em_optim_state(n.o, p[(i - NPARAM) / 2].tensor, names[(i - NPARAM) % 2]);
        if (!t) continue;   /* no moments before the first step (else a scope's reference) */
        em_tensor *c = em_contiguous(em_cpu(t));
        CHECK(c != NULL && em_numel(c) <= IN * HID);
        if (c) {
            out->n[i] = em_numel(c);
            memcpy(out->v[i], em_data_ptr(c), (size_t)out->n[i] * sizeof(float));
        }
    }
    em_scope_end(s);
    out->steps = em_optim_steps(n.o);
}

static bool same(const snap *a, const snap *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

/* Only the checkpoint itself in the directory: no temporary left behind. */
static int dir_entries(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static void sweep(em_device d, enum kind kind) {
    const char *what = kind == DEVICE ? "device allocation" : "host allocation";
    em_manual_seed(99);
    em_scope s = em_scope_begin();
    xs = em_keep(em_to(em_randn(EM_SHAPE(BATCH, IN), EM_OPTS(0)), d));
    ys = em_keep(em_to(em_randint(0, OUT, EM_SHAPE(BATCH), EM_OPTS(.dtype = EM_I64)), d));
    em_scope_end(s);
    CHECK(xs && ys);

    /* The undisturbed run: states before, after one and after two steps; N = the count. */
    snap *ref = calloc(3, sizeof *ref), *now = calloc(1, sizeof *now), *disk = calloc(1, sizeof *disk);
    net r = net_new(d);
    take(r, &ref[0]);
    CHECK_OK(em_checkpoint_save(ckpt, r.m, r.o, NULL, NULL, 0));
    int64_t base = em_memory_allocated(d);
    em__mem_debug_fail_request(0);
    host_arm(0);
    CHECK_OK(step(r));
    long long hosts = host_disarm();
    int64_t count = kind == DEVICE ? em__mem_debug_requests() : hosts;
    take(r, &ref[1]);
    CHECK_OK(em_zero_grad(r.o));
    int64_t base1 = em_memory_allocated(d);  /* parameters, moments and data after a step */
    CHECK_OK(step(r));
    take(r, &ref[2]);
    net_free(r);
    CHECK(!same(&ref[0], &ref[1]) && !same(&ref[1], &ref[2]));
    CHECK(count > 0);

    int failed = 0, recovered = 0;
    /* EMBER_SWEEP_ONLY=N runs only N (to debug one failure under LeakSanitizer) */
    const char *only = getenv("EMBER_SWEEP_ONLY");
    for (int64_t nth = 1; nth <= count; nth++) {
        if (only && atoll(only) != nth) continue;
        net n = net_new(d);
        CHECK_OK(em_checkpoint_save(ckpt, n.m, n.o, NULL, NULL, 0));
        CHECK(em_memory_allocated(d) == base);
        if (kind == DEVICE) em__mem_debug_fail_request(nth);
        else host_arm(nth);
        em_status st = step(n);
        if (kind == HOST) host_disarm();
        em__mem_debug_fail_request(0);
        bool ok = true;
        if (st != EM_OK) {
            failed++;
            if (!em_failed() || !em_last_error()[0]) {
                fprintf(stderr, "  %s %lld: failed without a message\n", what, (long long)nth);
                ok = false;
            }
            em_clear_error();
        } else {
            recovered++;
        }
        /* Untouched or fully stepped: never half. */
        take(n, now);
        int at = same(now, &ref[0]) ? 0 : same(now, &ref[1]) ? 1 : -1;
        /* Nothing of the step's temporaries is still held (gradients aside). */
        CHECK_OK(em_zero_grad(n.o));
        int64_t want = at == 1 ? base1 : base;
        /* autocast: Adam's bf16 copies of the weights (each under 512 bytes: one allocator
         * block) are a cache; a step whose copy could not be allocated goes on without it, and
         * the next step casts instead (checked bit for bit below) */
        int64_t slack = g_amp && at == 1 ? NPARAM * 512 : 0, have = em_memory_allocated(d);
        if (at >= 0 && (have > want || have < want - slack)) {
            fprintf(stderr, "  %s %lld: %lld bytes more allocated than after an undisturbed step\n", what,
                    (long long)nth, (long long)(em_memory_allocated(d) - want));
            ok = false;
        }
        if (at < 0 || (st == EM_OK && at != 1)) {
            fprintf(stderr, "  %s %lld (%s): model/optimizer half updated\n", what, (long long)nth,
                    em_status_name(st));
            ok = false;
        }
        /* The file on disk is whole: the old checkpoint or the new one. */
        if (dir_entries() != 1) {
            fprintf(stderr, "  %s %lld: %d files in the checkpoint directory\n", what, (long long)nth, dir_entries());
            ok = false;
        }
        net l = net_new(d);
        if (em_checkpoint_load(ckpt, l.m, l.o, NULL) != EM_OK) {
            fprintf(stderr, "  %s %lld: the checkpoint no longer loads: %s\n", what, (long long)nth, em_last_error());
            em_clear_error();
            ok = false;
        } else {
            take(l, disk);
            if (!same(disk, &ref[0]) && !same(disk, &ref[1])) {
                fprintf(stderr, "  %s %lld: the checkpoint is neither the old nor the new one\n", what, (long long)nth);
                ok = false;
            }
        }
        net_free(l);
        /* The next step succeeds and gives the undisturbed result. */
        if (at >= 0) {
            em_status st2 = step(n);
            take(n, now);
            if (st2 != EM_OK || !same(now, &ref[at + 1])) {
                fprintf(stderr, "  %s %lld: the next step %s\n", what, (long long)nth,
                        st2 != EM_OK ? em_last_error() : "differs from an undisturbed step");
                em_clear_error();
                ok = false;
            }
        }
        net_free(n);
        CHECK(ok);
        if (!ok && getenv("EMBER_SWEEP_STOP")) break;
    }
    printf("%s: %s sweep: N = %lld allocations in one step; %d failed cleanly, %d recovered\n",
           em_device_str(d).s, what, (long long)count, failed, recovered);
    CHECK(only || failed + recovered == count);
    CHECK(failed > 0);
    em_release(xs);
    em_release(ys);
    free(ref);
    free(now);
    free(disk);
}

static void test_cpu_device(void) { sweep(EM_DEVICE_CPU, DEVICE); }
static void test_cpu_host(void) { sweep(EM_DEVICE_CPU, HOST); }
static void test_cpu_amp_bf16(void) {
    g_amp = true;
    sweep(EM_DEVICE_CPU, DEVICE);
    sweep(EM_DEVICE_CPU, HOST);
    g_amp = false;
}

static void test_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_device d;
    CHECK_OK(em_device_parse("opencl:0", &d));
    sweep(d, DEVICE);
    sweep(d, HOST);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ember-sweep-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(ckpt, sizeof ckpt, "%s/step.safetensors", dir);
    RUN(test_cpu_device);
    RUN(test_cpu_host);
    RUN(test_cpu_amp_bf16);
    RUN(test_opencl);
    remove(ckpt);
    rmdir(dir);
    return test_summary();
}
