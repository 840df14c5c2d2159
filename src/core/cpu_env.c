/* The CPU's floating-point environment and vector features: em_set_flush_denormal (the
 * calling thread's MXCSR; the CPU backend's workers follow the flag, cpu_threads.c) and
 * em_cpu_features for `ember devices` and the benchmarks. */
#include <ember/device.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define EM_X86 1
#else
#define EM_X86 0
#endif

static atomic_bool g_flush_denormal;

bool em_set_flush_denormal(bool on) {
#if EM_X86
    /* MXCSR bit 15: flush-to-zero, bit 6: denormals-are-zero (every x86-64 CPU has both) */
    unsigned csr = _mm_getcsr();
    csr = on ? (csr | 0x8040u) : (csr & ~0x8040u);
    _mm_setcsr(csr);
    atomic_store(&g_flush_denormal, on);
    return true;
#else
    (void)on;
    return false;
#endif
}

bool em_get_flush_denormal(void) { return atomic_load_explicit(&g_flush_denormal, memory_order_relaxed); }

#if EM_X86
/* cpuid leaf 7 bits GCC 12's __builtin_cpu_supports does not name */
static bool leaf7(int sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(7, (unsigned)sub, &r[0], &r[1], &r[2], &r[3])) return false;
    return (r[reg] >> bit) & 1u;
}
#endif

static char g_features[256];
static pthread_once_t g_features_once = PTHREAD_ONCE_INIT;

static void detect_features(void) {
    char *buf = g_features;
    size_t size = sizeof g_features;
#if EM_X86
    __builtin_cpu_init();
    /* __builtin_cpu_supports also checks that the OS saves the AVX/AVX-512 registers */
    struct { const char *name; bool has; } f[] = {
        {"sse4.2", __builtin_cpu_supports("sse4.2")},
        {"avx", __builtin_cpu_supports("avx")},
        {"avx2", __builtin_cpu_supports("avx2")},
        {"fma", __builtin_cpu_supports("fma")},
        {"avx512f", __builtin_cpu_supports("avx512f")},
        {"avx512bw", __builtin_cpu_supports("avx512bw")},
        {"avx512vl", __builtin_cpu_supports("avx512vl")},
        {"avx512_vnni", __builtin_cpu_supports("avx512vnni")},
        {"avx512_bf16", __builtin_cpu_supports("avx512f") && leaf7(1, 0, 5)},
        {"avx512_fp16", __builtin_cpu_supports("avx512f") && leaf7(0, 3, 23)},
        {"amx_tile", leaf7(0, 3, 24)},
        {"amx_bf16", leaf7(0, 3, 22)},
        {"amx_int8", leaf7(0, 3, 25)},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].has) {
            size_t len = strlen(buf);
            snprintf(buf + len, size - len, "%s%s", len ? " " : "", f[i].name);
        }
#endif
    if (!buf[0]) snprintf(buf, size, "none");
}

const char *em_cpu_features(void) {
    pthread_once(&g_features_once, detect_features);
    return g_features;
}

int em_cpu_fma_lanes(void) {
#if EM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
    return 0;
}
