/* The allocator under real tensors on the CPU backend: statistics, reuse, a real OOM under
 * a cap and recovery, the environment (in child processes), pinned tensors. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"
#include "core/tensor_impl.h"

#define MiB ((int64_t)1 << 20)
#define CPU EM_DEVICE_CPU

static em_tensor *f32(int64_t n) {
    return em_empty(EM_SHAPE(n), EM_OPTS(.dtype = EM_F32));
}

static void test_tensor_stats(void) {
    CHECK_OK(em_memory_empty_cache(CPU));
    int64_t a0 = em_memory_allocated(CPU), r0 = em_memory_reserved(CPU);
    em_tensor *t = f32(1000);                        /* 4000 B -> a 4096 B block in a 2 MiB segment */
    CHECK(t != NULL);
    CHECK(em_memory_allocated(CPU) - a0 == 4096);
    CHECK(em_memory_reserved(CPU) - r0 == 2 * MiB);
    em_memory_stats s;
    CHECK_OK(em_memory_get_stats(CPU, &s));
    CHECK(s.requested_bytes[0].current >= 4000);
    em_release(t);
    CHECK(em_memory_allocated(CPU) == a0);
    CHECK(em_memory_reserved(CPU) - r0 == 2 * MiB);  /* cached, like torch's reserved memory */
    CHECK_OK(em_memory_empty_cache(CPU));
    CHECK(em_memory_reserved(CPU) == r0 - (a0 ? 0 : r0));
}

static void test_tensor_reuse(void) {
    em_tensor *a = f32(256 * 1024);                  /* 1 MiB */
    void *pa = em__host_ptr(a);
    em_release(a);
    em_tensor *b = f32(250 * 1024);                  /* fits the same cached block */
    CHECK(em__host_ptr(b) == pa);
    em_scope sc = em_scope_begin();
    for (int i = 0; i < 100; i++) CHECK(em_zeros(EM_SHAPE(64, 64), EM_OPTS(.dtype = EM_F32)) != NULL);
    em_scope_end(sc);
    em_memory_stats s;
    CHECK_OK(em_memory_get_stats(CPU, &s));
    int64_t raw = s.num_raw_allocs;
    sc = em_scope_begin();
    for (int i = 0; i < 100; i++) CHECK(em_zeros(EM_SHAPE(64, 64), EM_OPTS(.dtype = EM_F32)) != NULL);
    em_scope_end(sc);
    CHECK_OK(em_memory_get_stats(CPU, &s));
    CHECK(s.num_raw_allocs == raw);                  /* the second round came from the cache */
    em_release(b);
}

static const char *title(em_device_type t) {
    return t == EM_CPU ? "CPU" : t == EM_CUDA ? "CUDA" : t == EM_OPENCL ? "OpenCL" : "MPS";
}

/* A real out-of-memory under a cap, then recovery, on one device. */
static void oom_under_cap(em_device dev) {
    char want[128];
    CHECK_OK(em_memory_empty_cache(dev));
    int64_t base = em_memory_reserved(dev);
    CHECK_OK(em_memory_set_cap(dev, base + 64 * MiB));
    em_opts o = EM_OPTS(.dtype = EM_F32, .device = dev);
    em_tensor *x = em_full(EM_SHAPE(10, MiB), 3.0, o);              /* 40 MiB */
    CHECK(x != NULL);
    if (!x) return;
    em_tensor *y = em_empty(EM_SHAPE(10 * MiB), o);
    CHECK(y == NULL);
    snprintf(want, sizeof want, "%s out of memory. Tried to allocate 40.00 MiB.", title(dev.type));
    CHECK(strstr(em_last_error(), want) != NULL);
    snprintf(want, sizeof want, "Device %s has ", em_device_str(dev).s);
    CHECK(strstr(em_last_error(), want) != NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "(em_memory_set_cap); this request would take reserved memory past it");
    float *host = malloc(50 * MiB);                                 /* the live tensor is untouched */
    CHECK_OK(em_copy_to_host(x, host, 40 * MiB));
    CHECK(host[0] == 3.0f && host[10 * MiB - 1] == 3.0f);
    em_memory_stats s;
    CHECK_OK(em_memory_get_stats(dev, &s));
    CHECK(s.num_ooms >= 1);
    em_release(x);
    y = em_empty(EM_SHAPE(10 * MiB), o);                            /* reuses x's cached block */
    CHECK(y != NULL);
    em_release(y);
    em_tensor *z = em_zeros(EM_SHAPE(50 * MiB / 4), o);             /* gives the cache back, then fits */
    CHECK(z != NULL && !em_failed());
    if (z) {
        CHECK_OK(em_copy_to_host(z, host, 50 * MiB));
        CHECK(host[0] == 0.0f && host[50 * MiB / 4 - 1] == 0.0f);
    }
    free(host);
    em_release(z);
    CHECK_OK(em_device_synchronize(dev));
    CHECK_OK(em_memory_empty_cache(dev));
    CHECK(em_memory_reserved(dev) == base);
    CHECK_OK(em_memory_set_cap(dev, -1));
}

/* On the CPU and on every other device this build can use (OpenCL on PoCL, CUDA with a GPU). */
static void test_real_oom_under_cap(void) {
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        int n = em_device_count((em_device_type)t);
        em_clear_error();
        for (int i = 0; i < n && i < 2; i++) oom_under_cap(EM_DEVICE((em_device_type)t, i));
    }
    CHECK_OK(em_memory_set_cap_fraction(CPU, 0.5));                /* half the machine's memory */
    em_device_props p;
    CHECK_OK(em_device_get_props(CPU, &p));
    CHECK(em_memory_get_cap(CPU) == (int64_t)(0.5 * (double)p.total_memory));
    CHECK_OK(em_memory_set_cap(CPU, -1));
}

/* Run this program again as `child NAME` with an environment variable set: the allocator
 * reads the environment when a device first allocates, so it needs a fresh process. */
static int in_child(const char *var, const char *value, const char *name) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 98;
    self[n] = '\0';
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv(var, value, 1);
        execl(self, self, "child", name, (char *)NULL);
        _exit(97);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

static int child_cap(void) {
    em_tensor *a = f32(MiB);                         /* 4 MiB: within 8 MiB */
    em_tensor *b = f32(2 * MiB);                     /* 8 MiB more: past the cap */
    int ok = a && !b && em_last_status() == EM_ERR_OUT_OF_MEMORY &&
             strstr(em_last_error(), "Cap: 8.00 MiB (EMBER_MEMORY_CAP)") != NULL;
    em_release(a);
    em_release(b);
    return ok ? 0 : 1;
}

static int child_no_cache(void) {
    em_tensor *a = f32(1000);
    int64_t r = em_memory_reserved(CPU);
    em_release(a);
    em_memory_stats s;
    em_memory_get_stats(CPU, &s);
    return r == 4096 && em_memory_reserved(CPU) == 0 && !s.caching ? 0 : 1;
}

#if !defined(__SANITIZE_ADDRESS__)
static int64_t resident_bytes(void) {
    long pages = 0, resident = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    if (f) fclose(f);
    return resident < 0 ? -1 : (int64_t)resident * sysconf(_SC_PAGESIZE);
}
#endif

/* The peak policy in a fresh process, under a training step's shape of use (activations of
 * one size, then gradients of another, three times): reserved memory stays at the allocated
 * peak, and what the cache gives back leaves the process. The default (Ember's) keeps more. */
static int child_peak(const char *policy) {
    bool peak = !strcmp(policy, "peak");
    em_opts o = EM_OPTS(.dtype = EM_F32);
    for (int step = 0; step < 3; step++) {
        em_tensor *act[6], *grad[3];
        for (int i = 0; i < 6; i++) act[i] = em_ones(EM_SHAPE(2 * MiB), o);   /* 8 MiB each, touched */
        for (int i = 0; i < 6; i++) em_release(act[i]);
        for (int i = 0; i < 3; i++) grad[i] = em_ones(EM_SHAPE(4 * MiB), o);  /* 16 MiB each */
        for (int i = 0; i < 3; i++) em_release(grad[i]);
    }
    if (em_failed()) return 2;
    int64_t over = em_memory_max_reserved(CPU) - em_memory_max_allocated(CPU);
    if (!peak) return over >= 8 * MiB ? 0 : 3;   /* the default: 20 MiB segments, split */
    if (over > 4 * MiB) return 4;                /* the small pool's one segment at most */
#if defined(__SANITIZE_ADDRESS__)
    fprintf(stderr, "  skip: the resident memory check (AddressSanitizer quarantines freed memory)\n");
#else
    int64_t before = resident_bytes();
    if (em_memory_empty_cache(CPU) != EM_OK) return 5;
    int64_t after = resident_bytes();
    if (before < 0 || after < 0 || before - after < 40 * MiB) {
        fprintf(stderr, "  resident %lld -> %lld bytes after emptying a cache of %lld\n", (long long)before,
                (long long)after, (long long)em_memory_max_allocated(CPU));
        return 6;
    }
#endif
    return 0;
}

/* A segment given up for a new one of another size lends it its pages (they move, and
 * nothing new is faulted in and cleared): the new block holds the old one's values. */
static int child_recycle(void) {
#if defined(__SANITIZE_ADDRESS__)
    fprintf(stderr, "  skip: pages are moved only between mapped blocks, and under AddressSanitizer blocks "
            "come from malloc\n");
    return 0;
#else
    em_opts o = EM_OPTS(.dtype = EM_F32);
    em_tensor *a = em_full(EM_SHAPE(4 * MiB), 7.0, o);   /* 16 MiB: the peak */
    em_release(a);
    em_tensor *b = em_empty(EM_SHAPE(2 * MiB), o);       /* 8 MiB: the 16 MiB segment is given up */
    if (!b) return 2;
    const float *p = em__host_ptr(b);
    /* the blocks start at staggered offsets into their first page and only whole 2 MiB pages
     * move (cpu_backend.c): but for 4 KiB at either end, every value is the old block's */
    int64_t sevens = 0;
    for (int64_t i = 1024; i < 2 * MiB - 1024; i++) sevens += p[i] == 7.0f;
    em_memory_stats s;
    em_memory_get_stats(CPU, &s);
    em_release(b);
    if (sevens != 2 * MiB - 2048 || s.reserved_bytes[0].current > 10 * MiB) {
        fprintf(stderr, "  %lld of %lld values carried over, reserved %lld bytes\n", (long long)sevens,
                (long long)(2 * MiB - 2048), (long long)s.reserved_bytes[0].current);
        return 3;
    }
    return 0;
#endif
}

/* Under a cap, a request the recycled pages cannot make fit is a clear out-of-memory error;
 * the segment it was to take pages from is gone, nothing else is lost, and the next request
 * that fits is served. */
static int child_peak_cap(void) {
    em_opts o = EM_OPTS(.dtype = EM_F32);
    em_tensor *a = em_full(EM_SHAPE(4 * MiB), 1.0, o);   /* 16 MiB */
    em_tensor *keep = em_full(EM_SHAPE(MiB), 2.0, o);    /* 4 MiB, live throughout */
    if (!a || !keep) return 2;
    em_release(a);
    em_tensor *big = em_empty(EM_SHAPE(8 * MiB), o);     /* 32 MiB: past the 24 MiB cap */
    if (big || em_last_status() != EM_ERR_OUT_OF_MEMORY || !strstr(em_last_error(), "Tried to allocate 32.00 MiB"))
        return 3;
    em_clear_error();
    em_tensor *b = em_full(EM_SHAPE(2 * MiB), 3.0, o);   /* 8 MiB: fits */
    em_tensor *sum = em_sum(keep, EM_ALL_DIMS, false);
    bool kept = b && sum && em_item(sum) == 2.0 * MiB;
    em_release(sum);
    em_release(b);
    if (!kept) return 4;
    em_release(keep);
    return em_memory_empty_cache(CPU) == EM_OK && em_memory_reserved(CPU) <= 2 * MiB ? 0 : 5;
}

static void test_cpu_peak_policy(void) {
    CHECK(in_child("EMBER_MEMORY_CAP", "cpu=24MiB", "peak_cap") == 0);
    CHECK(in_child("EMBER_MEMORY_POLICY", "peak", "recycle") == 0);
    CHECK(in_child("EMBER_MEMORY_POLICY", "peak", "peak") == 0);
    CHECK(in_child("EMBER_MEMORY_POLICY", "", "peak_default") == 0);
}

static int child_bad_cap(void) {
    em_tensor *a = f32(10);
    return !a && em_last_status() == EM_ERR_ARGUMENT && strstr(em_last_error(), "EMBER_MEMORY_CAP") ? 0 : 1;
}

/* em_memory_check_env reports a bad setting before anything is allocated (and a good one is
 * no error); then the allocation fails as well, with the same message. */
static int child_check_env(void) {
    if (em_memory_check_env(EM_DEVICE_CPU) != EM_ERR_ARGUMENT || !strstr(em_last_error(), "EMBER_MEMORY_CAP"))
        return 1;
    em_clear_error();
    return child_bad_cap();
}

static int child_check_env_ok(void) {
    return em_memory_check_env(EM_DEVICE_CPU) == EM_OK && em_memory_check_env(EM_DEVICE(EM_OPENCL, -1)) == EM_OK ? 0 : 1;
}

static void test_environment(void) {
    CHECK(in_child("EMBER_MEMORY_CAP", "cpu=8MiB", "cap") == 0);
    CHECK(in_child("EMBER_NO_CACHE", "1", "no_cache") == 0);
    CHECK(in_child("EMBER_MEMORY_CAP", "cpu=lots", "bad_cap") == 0);
    CHECK(in_child("EMBER_MEMORY_CAP", "cpu=5MiB,,", "check_env") == 0);
    CHECK(in_child("EMBER_MEMORY_CAP", "cpu=12QB", "check_env") == 0);
    CHECK(in_child("EMBER_MEMORY_POLICY", "tensorflow", "check_env_policy") == 0);
    CHECK(in_child("EMBER_MEMORY_CAP", "cuda=1G", "check_env_ok") == 0);
}

static int child_check_env_policy(void) {
    return em_memory_check_env(EM_DEVICE_CPU) == EM_ERR_ARGUMENT && strstr(em_last_error(), "EMBER_MEMORY_POLICY") ? 0 : 1;
}

/* A device value that names no device is an error for the statistics, not a silent 0. */
static void test_statistics_of_no_device(void) {
    const em_device bad[] = {{(em_device_type)99, 0}, EM_DEVICE(EM_OPENCL, -5), EM_DEVICE(EM_CPU, 1),
                             EM_DEVICE(EM_CUDA, 1000)};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(em_memory_allocated(bad[i]) == 0);
        CHECK_ERROR(EM_ERR_DEVICE, "em_memory_allocated: no such device");
        CHECK(em_memory_max_reserved(bad[i]) == 0);
        CHECK_ERROR(EM_ERR_DEVICE, "em_memory_max_reserved: no such device");
        CHECK(em_memory_check_env(bad[i]) == EM_ERR_DEVICE);
        em_clear_error();
    }
    /* a real device that never allocated is 0, and no error */
    CHECK(em_memory_allocated(EM_DEVICE(EM_MPS, 0)) == 0 && !em_failed());
}

static void test_pinned_tensor(void) {
    em_memory_stats s0, s1;
    CHECK_OK(em_memory_get_pinned_stats(&s0));
    em_tensor *t = em_empty(EM_SHAPE(1000), EM_OPTS(.dtype = EM_F32, .pin_memory = true));
    CHECK(t != NULL);
    CHECK_OK(em_memory_get_pinned_stats(&s1));
    CHECK(s1.allocated_bytes[0].current - s0.allocated_bytes[0].current == 4096);
    CHECK(s1.requested_bytes[0].current - s0.requested_bytes[0].current == 4000);
    em_release(t);
    CHECK_OK(em_memory_get_pinned_stats(&s1));
    CHECK(s1.allocated_bytes[0].current == s0.allocated_bytes[0].current);
    em_memory_empty_pinned_cache();
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "child")) {
        if (!strcmp(argv[2], "cap")) return child_cap();
        if (!strcmp(argv[2], "no_cache")) return child_no_cache();
        if (!strcmp(argv[2], "peak")) return child_peak("peak");
        if (!strcmp(argv[2], "peak_default")) return child_peak("default");
        if (!strcmp(argv[2], "recycle")) return child_recycle();
        if (!strcmp(argv[2], "peak_cap")) { setenv("EMBER_MEMORY_POLICY", "peak", 1); return child_peak_cap(); }
        if (!strcmp(argv[2], "bad_cap")) return child_bad_cap();
        if (!strcmp(argv[2], "check_env")) return child_check_env();
        if (!strcmp(argv[2], "check_env_policy")) return child_check_env_policy();
        if (!strcmp(argv[2], "check_env_ok")) return child_check_env_ok();
        return 96;
    }
    unsetenv("EMBER_NO_CACHE");
    unsetenv("EMBER_MEMORY_CAP");
    RUN(test_tensor_stats);
    RUN(test_tensor_reuse);
    RUN(test_real_oom_under_cap);
    RUN(test_environment);
    RUN(test_cpu_peak_policy);
    RUN(test_statistics_of_no_device);
    RUN(test_pinned_tensor);
    return test_summary();
}
