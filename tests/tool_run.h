/* Running the `ember` command from a test: it is built next to the test executables. */
#ifndef EMBER_TEST_TOOL_RUN_H
#define EMBER_TEST_TOOL_RUN_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The path of build/ember, found from this test's own path; NULL if it is missing. */
static const char *tool_path(void) {
    static char path[PATH_MAX];
    if (path[0]) return path;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return NULL;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return NULL;
    *slash = '\0';
    snprintf(path, sizeof path, "%.*s/ember", (int)(sizeof path - 8), self);
    return access(path, X_OK) == 0 ? path : NULL;
}

/* Runs the shell command cmd; out receives its standard output (truncated to size - 1; the
 * rest is read and dropped). Returns the exit status, or -1 when it could not run or was
 * killed. */
static inline int tool_command(const char *cmd, char *out, size_t size) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0, got;
    char sink[4096];
    while ((got = fread(n + 1 < size ? out + n : sink, 1, n + 1 < size ? size - 1 - n : sizeof sink, p)) > 0)
        if (n + 1 < size) n += got;
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `ember ARGS` with stderr joined to stdout; out receives the output (truncated to
 * size - 1). Returns the exit status, or -1 when it could not run or was killed. */
static int tool_run(const char *args, char *out, size_t size) {
    const char *ember = tool_path();
    if (!ember) return -1;
    char cmd[PATH_MAX + 4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", ember, args);
    return tool_command(cmd, out, size);
}

/* `mpirun -np n ember ARGS` (on one host, over shared memory or TCP, at most 300 s), output
 * joined into out (truncated to size - 1); a leading "-x VAR" in args is mpirun's, passing
 * VAR on to the ranks. Returns the exit status, or -1 when it could not run or was killed. */
static inline int tool_run_mpi(int n, const char *args, char *out, size_t size) {
    const char *ember = tool_path();
    if (!ember) return -1;
    char cmd[PATH_MAX * 2 + 1024], mpi_opts[64] = "";
    if (!strncmp(args, "-x ", 3)) {
        const char *end = strchr(args + 3, ' ');
        snprintf(mpi_opts, sizeof mpi_opts, "%.*s", end ? (int)(end - args) : 0, args);
        args = end ? end + 1 : args;
    }
    snprintf(cmd, sizeof cmd, "timeout -k 5 300 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp "
             "%s -np %d '%s' %s 2>&1", mpi_opts, n, ember, args);
    return tool_command(cmd, out, size);
}

/* dst: the safetensors file src with the first `from` in its JSON header replaced by `to` (the
 * header's length rewritten and padded to 8 bytes with spaces, the data as it was): a forged
 * checkpoint for the tests of what --resume refuses. False when src cannot be read, has no
 * `from`, or dst cannot be written. */
static inline bool tool_edit_safetensors_header(const char *src, const char *dst, const char *from, const char *to) {
    FILE *f = fopen(src, "rb");
    if (!f) return false;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = len >= 8 ? malloc((size_t)len) : NULL;
    bool ok = b && fread(b, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    uint64_t hl = 0;
    for (int k = 7; ok && k >= 0; k--) hl = hl << 8 | b[k];
    ok = ok && hl <= (uint64_t)len - 8;
    char *hdr = ok ? strndup((const char *)b + 8, (size_t)hl) : NULL;
    char *hit = hdr ? strstr(hdr, from) : NULL;
    size_t body = ok ? (size_t)len - 8 - (size_t)hl : 0, cap = (size_t)hl + strlen(to) + 8;
    char *edited = hit ? calloc(cap, 1) : NULL;
    ok = edited != NULL;
    if (ok) {
        size_t pre = (size_t)(hit - hdr), el;
        memcpy(edited, hdr, pre);
        strcpy(edited + pre, to);
        strcat(edited, hit + strlen(from));
        for (el = strlen(edited); el % 8; el++) edited[el] = ' ';
        unsigned char n8[8];
        for (int k = 0; k < 8; k++) n8[k] = (unsigned char)((uint64_t)el >> (8 * k));
        f = fopen(dst, "wb");
        ok = f && fwrite(n8, 1, 8, f) == 8 && fwrite(edited, 1, el, f) == el &&
             fwrite(b + 8 + hl, 1, body, f) == body;
        if (f && fclose(f) != 0) ok = false;
    }
    free(edited);
    free(hdr);
    free(b);
    return ok;
}

#endif
