/* Whole-file input (mmap) and atomic output (temporary file, fsync, rename) for the
 * parsers and writers in src/data/. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parsers.h"
#include "../core/internal_api.h"

void em__array_free(em__array *a) {
    if (!a) return;
    if (a->owned) free(a->data);
    a->data = NULL;
    a->owned = false;
}

bool em__shape_bytes(int ndim, const int64_t *shape, size_t elem_size, int64_t *numel,
                     size_t *nbytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return false;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > EM__MAX_ARRAY_BYTES / d) return false;
        n *= d;
    }
    /* n <= 2^40 here, so n * elem_size (<= 8) cannot overflow */
    if (n * elem_size > EM__MAX_ARRAY_BYTES) return false;
    if (numel) *numel = (int64_t)n;
    if (nbytes) *nbytes = (size_t)(n * elem_size);
    return true;
}

/* ---- reading ---- */

static em_status read_all_fd(int fd, const char *path, em__file_map *m) {
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
    for (;;) {
        if (len == cap) {
            uint8_t *nb = (cap > ((size_t)1 << 40)) ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return em_error(EM_ERR_IO, "%s: read failed at byte %zu: %s", path, len, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    m->heap = buf;
    m->data = buf;
    m->len = len;
    return EM_OK;
}

em_status em__file_map_open(const char *path, em__file_map *m) {
    memset(m, 0, sizeof *m);
    if (!path) return em_error(EM_ERR_ARGUMENT, "file path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_error(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return em_error(EM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return em_error(EM_ERR_IO, "%s: is a directory, expected a file", path);
    }
    em_status s = EM_OK;
    if (S_ISREG(st.st_mode) && st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            m->map_base = p;
            m->map_len = (size_t)st.st_size;
            m->data = p;
            m->len = (size_t)st.st_size;
        } else {
            s = read_all_fd(fd, path, m);
        }
    } else {
        s = read_all_fd(fd, path, m);
    }
    close(fd);
    return s;
}

void em__file_map_close(em__file_map *m) {
    if (!m) return;
    if (m->map_base) munmap(m->map_base, m->map_len);
    free(m->heap);
    memset(m, 0, sizeof *m);
}

/* ---- atomic writing ---- */

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

em_status em__atomic_open(em__atomic_file *f, const char *path) {
    f->fd = -1;
    f->path = NULL;
    f->tmp_path = NULL;
    if (!path || !*path) return em_error(EM_ERR_ARGUMENT, "output path is NULL or empty");
    size_t n = strlen(path);
    if (path[n - 1] == '/') return em_error(EM_ERR_ARGUMENT, "%s: output path names a directory", path);
    f->path = strdup(path);
    f->tmp_path = malloc(n + 64);
    if (!f->path || !f->tmp_path) {
        em__atomic_abort(f);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    /* ".<name>.tmp.<pid>.<tid>.<nanoseconds>": unique per thread and attempt; O_EXCL
     * guarantees we never clobber anything, and the mode honours the umask. */
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(f->tmp_path, n + 64, "%.*s.%s.tmp.%ld.%ld.%ld%d", (int)dir_len, path,
                 path + dir_len, (long)getpid(), (long)gettid(), (long)ts.tv_nsec, attempt);
        f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f->fd >= 0) return EM_OK;
        if (errno != EEXIST) break;
    }
    int e = errno;
    char *dir = dir_of(path);
    em_error(EM_ERR_IO, "%s: cannot create a temporary file in directory '%s': %s", path,
             dir ? dir : "?", strerror(e));
    free(dir);
    em__atomic_abort(f);
    return EM_ERR_IO;
}

em_status em__atomic_write(em__atomic_file *f, const void *data, size_t n) {
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < ((size_t)1 << 30) ? n - done : ((size_t)1 << 30);
        ssize_t w = write(f->fd, p + done, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            em_error(EM_ERR_IO, "%s: write failed: %s", f->path, strerror(e));
            em__atomic_abort(f);
            return EM_ERR_IO;
        }
        done += (size_t)w;
    }
    return EM_OK;
}

em_status em__atomic_commit(em__atomic_file *f) {
    if (fsync(f->fd) != 0) {
        em_error(EM_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
        em__atomic_abort(f);
        return EM_ERR_IO;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        em_error(EM_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
        em__atomic_abort(f);
        return EM_ERR_IO;
    }
    if (rename(f->tmp_path, f->path) != 0) {
        em_error(EM_ERR_IO, "%s: cannot replace the file: %s", f->path, strerror(errno));
        em__atomic_abort(f);
        return EM_ERR_IO;
    }
    /* The rename is durable once the directory is synced; a failure here leaves the new
     * file in place, so it is not reported. */
    char *dir = dir_of(f->path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    free(f->tmp_path);
    f->tmp_path = NULL;
    em__atomic_abort(f);
    return EM_OK;
}

void em__atomic_abort(em__atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->tmp_path);
    f->tmp_path = NULL;
    free(f->path);
    f->path = NULL;
}
