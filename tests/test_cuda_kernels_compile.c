/* Every shared kernel program (src/kernels/NAME.k, as the CUDA backend builds it) compiles
 * with NVRTC to PTX for compute_80 and compute_90, and ptxas accepts that PTX for sm_80
 * and sm_90 with no per-thread stack frame in any kernel (ptxas -v; layouts are read in
 * place, see layout.h). Needs no GPU: NVRTC and ptxas are compilers. Without NVRTC this test FAILS,
 * saying where it looked: CI's image has the CUDA toolkit, so a missing NVRTC is a broken
 * machine, not a reason to skip.
 *
 * Results are cached in the kernel cache dir (EMBER_CACHE_DIR, else ~/.cache/ember): the
 * PTX by hash(source, arch, NVRTC version), and "ptxas accepted it, no stack" by hash(PTX, arch,
 * ptxas version), so a rerun over unchanged kernels takes a second. EMBER_CUDA_CHECK_FRESH=1
 * ignores both caches (scripts/check_cuda_kernels.sh sets it). */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_kernels.h"

extern char **environ;

static const int archs[] = {80, 90};
#define NARCH 2

static bool fresh(void) {
    const char *f = getenv("EMBER_CUDA_CHECK_FRESH");
    return f && *f && strcmp(f, "0") != 0;
}

/* ptxas next to NVRTC's toolkit, or on PATH. */
static bool find_ptxas(char *path, size_t size) {
    const char *cands[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i] || !*cands[i]) continue;
        snprintf(path, size, "%s/bin/ptxas", cands[i]);
        if (access(path, X_OK) == 0) return true;
    }
    const char *env = getenv("PATH");
    char *dirs = env ? strdup(env) : NULL, *save = NULL;
    for (char *d = dirs ? strtok_r(dirs, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, size, "%s/ptxas", d);
        if (access(path, X_OK) == 0) { free(dirs); return true; }
    }
    free(dirs);
    return false;
}

static void ptxas_version(const char *ptxas, char *out, size_t size) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", ptxas);
    FILE *p = popen(cmd, "r");
    out[0] = '\0';
    char line[256];
    while (p && fgets(line, sizeof line, p)) /* the last line names the release */
        snprintf(out, size, "%s", line);
    if (p) pclose(p);
    out[strcspn(out, "\n")] = '\0';
}

/* One ptxas run in flight. */
typedef struct job {
    pid_t pid;
    char ptx_file[96];
    char log_file[96];   /* ptxas -v: registers and stack frame per kernel */
    const char *program;
    int arch;
    em_cuda_cache_key key;
} job;

static job jobs[64];
static int njobs;
static char g_dir[1024], g_ptxas[512], g_ptxas_version[256];

static void start_ptxas(const char *program, int arch, const char *ptx, size_t n) {
    char arch_s[16];
    snprintf(arch_s, sizeof arch_s, "%d", arch);
    const char *parts[] = {"ptxas accepted, no stack frame", ptx, arch_s, g_ptxas_version};
    em_cuda_cache_key key = em__cuda_cache_key(parts, 4);
    size_t got = 0;
    char *mark = fresh() ? NULL : em__cuda_cache_load(g_dir, key, "ok", "ptxas", &got);
    if (mark) { /* this very PTX was accepted by this very ptxas before */
        printf("     %-14s sm_%d: ptxas ok, no stack frame (cached)\n", program, arch);
        free(mark);
        return;
    }
    if (njobs == (int)(sizeof jobs / sizeof jobs[0])) { CHECK(!"too many ptxas jobs"); return; }
    job *j = &jobs[njobs];
    snprintf(j->ptx_file, sizeof j->ptx_file, "/tmp/ember-ptx-XXXXXX");
    int fd = mkstemp(j->ptx_file);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, ptx, n) == (ssize_t)n);
    close(fd);
    char arch_opt[32];
    snprintf(arch_opt, sizeof arch_opt, "-arch=sm_%d", arch);
    snprintf(j->log_file, sizeof j->log_file, "/tmp/ember-ptxas-XXXXXX");
    int log = mkstemp(j->log_file);
    CHECK(log >= 0);
    if (log < 0) { unlink(j->ptx_file); return; }
    close(log);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, j->log_file, O_WRONLY | O_TRUNC, 0);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *argv[] = {g_ptxas, "-v", arch_opt, j->ptx_file, "-o", "/dev/null", NULL};
    CHECK(posix_spawn(&j->pid, g_ptxas, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    j->program = program;
    j->arch = arch;
    j->key = key;
    njobs++;
}

/* From ptxas -v's log: how many kernels, and the largest per-thread stack frame (naming
 * its kernel). Layouts are read in place (__grid_constant__, layout.h), so no library
 * kernel should need one: a frame here means a struct parameter copied per thread. */
static int stack_frames(const char *log_file, int *kernels, char *worst, size_t size) {
    FILE *f = fopen(log_file, "r");
    char line[512], entry[128] = "";
    int max = 0;
    *kernels = 0;
    worst[0] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        const char *e = strstr(line, "Compiling entry function '");
        int bytes = 0;
        if (e) {
            snprintf(entry, sizeof entry, "%s", e + strlen("Compiling entry function '"));
            entry[strcspn(entry, "'")] = '\0';
            ++*kernels;
        } else if (strstr(line, "bytes stack frame") && sscanf(line, " %d bytes stack frame", &bytes) == 1 &&
                   bytes > max) {
            max = bytes;
            snprintf(worst, size, "%s", entry);
        }
    }
    if (f) fclose(f);
    return max;
}

static void finish_ptxas(void) {
    for (int i = 0; i < njobs; i++) {
        int status = 0;
        CHECK(waitpid(jobs[i].pid, &status, 0) == jobs[i].pid);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        int kernels = 0;
        char worst[128];
        int stack = stack_frames(jobs[i].log_file, &kernels, worst, sizeof worst);
        printf("     %-14s sm_%d: ptxas %s, %d kernels, largest stack frame %d bytes%s%s\n",
               jobs[i].program, jobs[i].arch, ok ? "ok" : "FAILED", kernels, stack,
               stack ? " in " : "", stack ? worst : "");
        CHECK(ok);
        CHECK(kernels > 0);
        CHECK(stack == 0);
        if (ok && kernels > 0 && stack == 0) em__cuda_cache_store(g_dir, jobs[i].key, "ok", "ptxas", "ok", 2);
        unlink(jobs[i].ptx_file);
        unlink(jobs[i].log_file);
    }
    njobs = 0;
}

/* Library kernels that must come out of each program under their C names (extern "C"),
 * since the backend looks them up by name. */
static const struct { const char *program, *entries[4]; } expected[] = {
    {"elementwise.k", {"unary_f32", "binary_bf16", "copy_f16_i64", "fill_4"}},
    {"index.k", {"index_select_8", "gather_2", "index_add_f32", "scatter_add_i64"}},
    {"matmul.k", {"matmul_f32", "matmul_f16", "matmul_i64", "matmul_f64"}},
    {"reduce.k", {"reduce_wg_f32", "reduce_wi_bf16", "argreduce_wg_f64", "argreduce_wi_u8"}},
    {"softmax.k", {"softmax_f32", "softmax_f16", "softmax_bf16", "softmax_f64"}},
    {"rng.k", {"rng_f32", "rng_i64", "rng_bf16", "rng_b8"}},
};

static void check_entries(const char *program, const char *ptx) {
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        if (strcmp(expected[i].program, program)) continue;
        for (int e = 0; e < 4; e++) {
            char pat[80];
            snprintf(pat, sizeof pat, ".entry %s(", expected[i].entries[e]);
            if (!strstr(ptx, pat)) printf("     %s: no kernel %s in the PTX\n", program, expected[i].entries[e]);
            CHECK(strstr(ptx, pat) != NULL);
        }
    }
}

static void test_every_program_compiles_and_assembles(void) {
    int major = 0, minor = 0;
    const char *reason = NULL;
    if (!em__cuda_nvrtc(&major, &minor, &reason)) {
        fprintf(stderr, "  NVRTC is required to check the CUDA kernels and was not found: %s\n"
                        "  (install the CUDA toolkit, or set EMBER_CUDA_PATH to its lib64)\n", reason);
        CHECK(!"NVRTC found");
        return;
    }
    em__cuda_cache_dir(g_dir, sizeof g_dir);
    bool have_ptxas = find_ptxas(g_ptxas, sizeof g_ptxas);
    if (have_ptxas) ptxas_version(g_ptxas, g_ptxas_version, sizeof g_ptxas_version);
    printf("     NVRTC %d.%d; ptxas: %s%s%s; cache: %s%s\n", major, minor,
           have_ptxas ? g_ptxas : "not found (PTX is not assembled)", have_ptxas ? ", " : "",
           g_ptxas_version, g_dir[0] ? g_dir : "(none)", fresh() ? " (ignored)" : "");

    int n = em__cuda_program_count();
    CHECK(n >= 6);
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        char *text = em__cuda_program_text(i, &name);
        CHECK(text != NULL);
        if (!text) continue;
        em_cuda_source src = {name, text};
        for (int a = 0; a < NARCH; a++) {
            size_t size = 0;
            bool cached = false;
            char *ptx = fresh() ? em__cuda_compile(&src, NULL, 0, archs[a], false, NULL, 0, &size)
                                : em__cuda_compile_cached(&src, NULL, 0, archs[a], false, NULL, 0,
                                                          &size, &cached);
            if (!ptx) {
                fprintf(stderr, "  %s\n", em_last_error());
                em_clear_error();
                CHECK(!"compiled");
                continue;
            }
            printf("     %-14s compute_%d: %zu bytes of PTX%s\n", name, archs[a], size,
                   cached ? " (cached)" : "");
            CHECK(size > 0 && strstr(ptx, ".version") && strstr(ptx, ".target sm_"));
            check_entries(name, ptx);
            if (have_ptxas) start_ptxas(name, archs[a], ptx, size);
            free(ptx);
        }
        free(text);
    }
    finish_ptxas();
}

/* A kernel with an error must fail with NVRTC's log in the message, not crash. */
static void test_compile_error_is_reported(void) {
    if (!em__cuda_nvrtc(NULL, NULL, NULL)) return; /* reported above */
    em_cuda_source bad = {"bad.k", "extern \"C\" __global__ void k(float *x) { x[0] = undefined_thing; }\n"};
    size_t n = 0;
    CHECK(em__cuda_compile(&bad, NULL, 0, 80, false, NULL, 0, &n) == NULL);
    CHECK_ERROR(EM_ERR_BACKEND, "undefined_thing");
}

/* EMBER_CUDA_PREWARM_SM=90 (scripts/gpu_prepare.sh): every program's image as a device of
 * compute capability 9.0 loads it (a CUBIN for sm_90, with the backend's own options), into
 * the kernel cache, so that a GPU machine given that cache compiles nothing. */
static void test_prewarm(void) {
    const char *sm = getenv("EMBER_CUDA_PREWARM_SM");
    if (!sm || !*sm) {
        test_skip_case("kernel cache for a GPU", "EMBER_CUDA_PREWARM_SM is not set (scripts/gpu_prepare.sh sets it)");
        return;
    }
    int cc = atoi(sm), supported[64], n = 0, arch = 0;
    bool cubin = false;
    const em_nvrtc_api *nv = em__cuda_nvrtc(NULL, NULL, NULL);
    if (!nv) return; /* reported above */
    if (nv->nvrtcGetNumSupportedArchs && nv->nvrtcGetSupportedArchs && nv->nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS &&
        n > 0 && n <= 64)
        nv->nvrtcGetSupportedArchs(supported);
    else
        n = 0;
    em__cuda_pick_target(cc, supported, n, &arch, &cubin);
    CHECK(arch > 0);
    int made = 0;
    for (int i = 0; i < em__cuda_program_count(); i++) {
        const char *name = NULL;
        char *text = em__cuda_program_text(i, &name);
        size_t size = 0;
        char *image = text ? em__cuda_program_image(name, text, arch, cubin, &size) : NULL;
        CHECK(image != NULL && size > 0);
        made += image != NULL;
        free(image);
        free(text);
    }
    printf("     %d programs cached as %s_%d for compute capability %d\n", made, cubin ? "sm" : "compute", arch, cc);
}

int main(void) {
    RUN(test_every_program_compiles_and_assembles);
    RUN(test_compile_error_is_reported);
    RUN(test_prewarm);
    return test_summary();
}

#else
static void test_nvrtc_needs_cuda_headers(void) {
    fprintf(stderr, "  Ember was built without the CUDA headers (/usr/local/cuda/include/cuda.h), "
                    "so NVRTC cannot be used: install the CUDA toolkit and rebuild\n");
    CHECK(!"built with the CUDA headers");
}
int main(void) {
    RUN(test_nvrtc_needs_cuda_headers);
    return test_summary();
}
#endif
