/* f32 GEMM through oneDNN's dnnl_sgemm for the shapes where it beats OpenBLAS (see the header).
 * Debian's oneDNN runs on OpenMP: a call would start omp_get_max_threads() threads, which spin
 * while idle and fight Ember's own pool for the cores, so around each call the calling thread's
 * OpenMP thread count is 1 and then what it was (an OpenMP ICV is per thread: a caller's own
 * OpenMP code keeps its setting). */
#include "cpu_sgemm_dnnl.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef EMBER_HAVE_DNNL
#include <dlfcn.h>
#include <dnnl.h>
#endif

enum { POLICY_AUTO, POLICY_DNNL, POLICY_OPENBLAS };
static const char *const policy_names[] = {"auto", "dnnl", "openblas"};
static atomic_int g_policy = -1;
static pthread_once_t g_policy_once = PTHREAD_ONCE_INIT;

static int policy_parse(const char *name) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, policy_names[i])) {
#ifndef EMBER_HAVE_DNNL
            if (i == POLICY_DNNL) return -1;
#endif
            return i;
        }
    return -1;
}

static void policy_init(void) {
    int p = policy_parse(getenv("EMBER_CPU_SGEMM")); /* an unknown value keeps the default */
    int unset = -1;
    atomic_compare_exchange_strong(&g_policy, &unset, p >= 0 ? p : POLICY_AUTO);
}

static int policy(void) {
    pthread_once(&g_policy_once, policy_init);
    return atomic_load(&g_policy);
}

bool em__cpu_sgemm_policy(const char *name) {
    int p = policy_parse(name);
    if (p < 0) return false;
    pthread_once(&g_policy_once, policy_init);
    atomic_store(&g_policy, p);
    return true;
}

const char *em__cpu_sgemm_policy_name(void) { return policy_names[policy()]; }

#ifdef EMBER_HAVE_DNNL
static bool g_avx512;
static void (*g_omp_set_num_threads)(int);
static int (*g_omp_get_max_threads)(void);
static pthread_once_t g_dnnl_once = PTHREAD_ONCE_INIT;

static void dnnl_init(void) {
    __builtin_cpu_init();
    g_avx512 = __builtin_cpu_supports("avx512f");
    /* libgomp comes with libdnnl when its runtime is OpenMP; absent otherwise (nothing to set) */
    void *set = dlsym(RTLD_DEFAULT, "omp_set_num_threads"), *get = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    if (set && get) {
        memcpy(&g_omp_set_num_threads, &set, sizeof set);
        memcpy(&g_omp_get_max_threads, &get, sizeof get);
    }
}

bool em__cpu_sgemm_dnnl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    int p = policy();
    if (p == POLICY_OPENBLAS) return false;
    pthread_once(&g_dnnl_once, dnnl_init);
    if (p == POLICY_AUTO && (!g_avx512 || m * n * k < EM_SGEMM_DNNL_MIN_MACS || k < EM_SGEMM_DNNL_MIN_K)) return false;
    int omp_threads = g_omp_get_max_threads ? g_omp_get_max_threads() : 1;
    if (omp_threads != 1) g_omp_set_num_threads(1);
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    if (omp_threads != 1) g_omp_set_num_threads(omp_threads);
    return st == dnnl_success;
}
#else
bool em__cpu_sgemm_dnnl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
    return false;
}
#endif
