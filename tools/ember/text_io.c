/* Text in and JSON out for the commands (text_io.h). */
#include "text_io.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The most bytes taken from a stream (a pipe, standard input, a character device, a /proc
 * file), as the library's own readers take: /dev/zero has no end, and read "to its end" it
 * would take all memory. A regular file is read whole, whatever its size. */
#define TEXT_STREAM_LIMIT ((size_t)1 << 30)

char *tool_read_all(const char *tool, const char *path, size_t *len) {
    bool is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: cannot open: %s\n", tool, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    bool stat_ok = fstat(fileno(f), &st) == 0;
    if (!stat_ok || S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, stat_ok ? "is a folder, not a file" : strerror(errno));
        if (!is_stdin) fclose(f);
        return NULL;
    }
    /* a regular file's size is known (a /proc file says 0): one allocation, and no limit but
     * memory; anything else is read up to the limit, and one byte more says it went on */
    bool sized = S_ISREG(st.st_mode) && st.st_size > 0;
    if (sized && (uint64_t)st.st_size >= SIZE_MAX / 2) {
        fprintf(stderr, "%s: %s: %lld bytes do not fit in memory\n", tool, path, (long long)st.st_size);
        if (!is_stdin) fclose(f);
        return NULL;
    }
    size_t limit = sized ? SIZE_MAX / 2 : TEXT_STREAM_LIMIT + 1;
    size_t cap = sized ? (size_t)st.st_size + 2 : (size_t)1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t wanted = cap;   /* what an allocation that failed asked for */
    while (buf && n <= limit - 1) {
        if (n + 1 >= cap) {   /* room for the NUL, always */
            size_t ncap = cap < limit / 2 ? cap * 2 : limit + 1;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                wanted = ncap;
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t want = cap - n - 1;
        if (want > limit - n) want = limit - n;
        size_t got = fread(buf + n, 1, want, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = !buf || ferror(f);
    int err = errno;
    if (!is_stdin) fclose(f);
    if (failed) {
        if (!buf) fprintf(stderr, "%s: %s: out of memory reading it (%zu bytes asked for)\n", tool, path, wanted);
        else fprintf(stderr, "%s: %s: read failed: %s\n", tool, path, strerror(err));
        free(buf);
        return NULL;
    }
    if (!sized && n > TEXT_STREAM_LIMIT) {
        fprintf(stderr, "%s: %s: not a regular file, and it goes on past %zu bytes (1 GiB, the most read from a "
                "stream): give the text as a file\n", tool, path, TEXT_STREAM_LIMIT);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

void tool_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void tool_json_ids(FILE *f, const int64_t *ids, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)ids[i]);
    fputc(']', f);
}
