/* Running a test's own executable as N MPI ranks: the ctest process is the parent (not an
 * MPI program); it starts `mpirun -np N SELF` with EMBER_TEST_DIST_MODE naming what the
 * ranks do, and checks what they printed. Every rank prints "rank R: PASS <mode>" or
 * "rank R: FAIL ..." lines; mpirun joins their output. */
#ifndef EMBER_TESTS_DIST_RUN_H
#define EMBER_TESTS_DIST_RUN_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Why ranks cannot be started here, or NULL when they can. */
static inline const char *dist_unavailable(void) {
#ifndef EMBER_HAVE_MPI
    return "built without MPI (EMBER_HAVE_MPI)";
#else
    if (system("command -v mpirun >/dev/null 2>&1") != 0) return "mpirun is not installed (Debian's openmpi-bin)";
    return NULL;
#endif
}

/* Is this process one of the ranks (started by dist_run)? Its mode, or NULL. */
static inline const char *dist_mode(void) { return getenv("EMBER_TEST_DIST_MODE"); }

/* mpirun -np n SELF with EMBER_TEST_DIST_MODE=mode (and `extra_env`, "A=1 B=2" or ""),
 * output (stdout + stderr) into out. Returns the exit status, -1 if it did not run. */
static inline int dist_run(int n, const char *mode, const char *extra_env, char *out, size_t size) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = '\0';
    /* under ASan: Open MPI's own allocations are suppressed (tests/lsan.supp; ctest runs in
     * the source tree), with full stacks so that frames in MPI's unloaded components are
     * still attributed to libmpi */
    char cwd[PATH_MAX], lsan[PATH_MAX + 128];
    const char *data = getenv("EMBER_TEST_DATA"); /* <source>/tests/data, set by CMake */
    if (data) snprintf(cwd, sizeof cwd, "%s/..", data);
    else if (!getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    else strncat(cwd, "/tests", sizeof cwd - strlen(cwd) - 1);
    snprintf(lsan, sizeof lsan, "LSAN_OPTIONS=suppressions=%s/lsan.supp:print_suppressions=0 "
             "ASAN_OPTIONS=%s%sfast_unwind_on_malloc=0", cwd, getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "",
             getenv("ASAN_OPTIONS") ? ":" : "");
    char cmd[3 * PATH_MAX + 1024];
    /* --oversubscribe: more ranks than cores; --allow-run-as-root: CI runs as root;
     * --mca btl self,vader,tcp: shared memory and loopback only */
    snprintf(cmd, sizeof cmd,
             "env %s EMBER_TEST_DIST_MODE=%s %s timeout -k 5 240 mpirun --oversubscribe --allow-run-as-root "
             "--mca btl self,vader,tcp -np %d '%s' 2>&1",
             lsan, mode, extra_env ? extra_env : "", n, self);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got, used = 0;
    char sink[4096];
    while ((got = fread(used + 1 < size ? out + used : sink, 1, used + 1 < size ? size - 1 - used : sizeof sink, p)) > 0)
        if (used + 1 < size) used += got;
    out[used] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Prints a run that failed to stderr: the title, then the lines that say why (a sanitizer's
 * report with the frames after it, a failed check, a signal, an MPI abort), then the whole
 * output. The reasons come first because a long log is read, or cut, from its start: three
 * ranks' passing cases would otherwise push them out of view. */
static inline void dist_print_failure(const char *title, const char *out) {
    static const char *const why[] = {"Sanitizer", "SUMMARY:", "runtime error", "Assertion", "FAIL", "CHECK(",
                                      "left an error pending", "signal", "Abort", "abort", "MPI_ABORT",
                                      "terminated", "Killed"};
    fflush(stdout);
    fprintf(stderr, "---- %s ----\n", title);
    int shown = 0, follow = 0;
    for (const char *line = out; *line && shown < 60;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char text[512];
        size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
        memcpy(text, line, n);
        text[n] = '\0';
        bool hit = follow > 0;
        for (size_t i = 0; !hit && i < sizeof why / sizeof why[0]; i++) hit = strstr(text, why[i]) != NULL;
        if (hit) {
            fprintf(stderr, "%s%s\n", follow > 0 ? "  " : "why: ", text);
            shown++;
        }
        /* a sanitizer's report: its first frames name the place */
        if (strstr(text, "ERROR: ") && strstr(text, "Sanitizer")) follow = 16;
        else if (follow > 0) follow--;
        line += len + (end != NULL);
    }
    if (!shown) fprintf(stderr, "why: no rank said (the exit status above is mpirun's)\n");
    fprintf(stderr, "---- the whole output ----\n%s\n", out);
}

/* How many lines of out contain s. */
static inline int dist_count(const char *out, const char *s) {
    int n = 0;
    for (const char *p = out; (p = strstr(p, s)) != NULL; p += strlen(s)) n++;
    return n;
}

#endif
