/* Whole-file and piecewise input (read and pread, never mmap: see parsers.h) and atomic
 * output (temporary file, fsync, rename) for the parsers and writers in src/data/. */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static _Atomic size_t stream_limit = EM__MAX_STREAM_BYTES;

size_t em__set_stream_limit(size_t bytes) {
    return atomic_exchange(&stream_limit, bytes ? bytes : EM__MAX_STREAM_BYTES);
}

/* A stream (pipe, character device, /proc file) read into memory: until its end, until one
 * byte past the size its header gives, or up to the stream limit, never more (reading
 * /dev/zero to its "end" would take all memory). */
static em_status read_stream(int fd, const char *path, em__size_fn size, em__file_map *m) {
    size_t cap = 1 << 16, len = 0;
    uint64_t total = 0;   /* the whole file's size, once size() knows it */
    const size_t max = atomic_load(&stream_limit);
    uint8_t *buf = malloc(cap);
    if (!buf) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
    for (;;) {
        size_t limit = total ? (size_t)total + 1 : max + 1;
        if (len >= limit) break;
        if (len == cap) {
            size_t ncap = cap * 2 < limit ? cap * 2 : limit;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file (%zu bytes so far)", path, len);
            }
            buf = nb;
            cap = ncap;
        }
        size_t want = (cap < limit ? cap : limit) - len;
        ssize_t r = read(fd, buf + len, want);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return em_error(EM_ERR_IO, "%s: read failed at byte %zu: %s", path, len, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
        if (size && !total) {
            em_status s = size(path, buf, len, &total);
            if (s != EM_OK) {
                free(buf);
                return s;
            }
            if (total > max) {
                free(buf);
                return em_error(EM_ERR_FORMAT, "%s: the header describes a %llu-byte file, but a file that is not a regular "
                                "file (a pipe or device) is read only up to %zu bytes", path,
                                (unsigned long long)total, max);
            }
        }
    }
    if (len > max) {
        free(buf);
        return em_error(EM_ERR_FORMAT, "%s: not a regular file and longer than %zu bytes: stopped reading "
                        "(expected a file whose header gives its size, or a stream of at most %zu bytes)",
                        path, max, max);
    }
    m->heap = buf;
    m->data = buf;
    m->len = len;
    return EM_OK;
}

em_status em__file_map_open(const char *path, em__file_map *m) {
    return em__file_map_open_sized(path, m, NULL);
}

/* Opens path for reading and stats it; a directory is refused. */
static em_status open_input(const char *path, int *fd, struct stat *st) {
    *fd = -1;
    if (!path) return em__error_unless_pending(EM_ERR_ARGUMENT, "file path is NULL");
    if (!*path) return em_error(EM_ERR_ARGUMENT, "file path is empty");
    int d = open(path, O_RDONLY | O_CLOEXEC);
    if (d < 0) return em_error(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(d, st) != 0) {
        int e = errno;
        close(d);
        return em_error(EM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st->st_mode)) {
        close(d);
        return em_error(EM_ERR_IO, "%s: is a directory, expected a file", path);
    }
    *fd = d;
    return EM_OK;
}

/* n bytes at off with pread, or an error saying where the file ended (it was `size` bytes
 * when it was opened). */
static em_status read_at(int fd, const char *path, uint64_t size, uint64_t off, void *dst, size_t n) {
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < ((size_t)1 << 30) ? n - done : ((size_t)1 << 30);
        ssize_t r = pread(fd, (uint8_t *)dst + done, chunk, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            return em_error(EM_ERR_IO, "%s: read failed at byte %llu: %s", path, (unsigned long long)(off + done),
                            strerror(e));
        }
        if (r == 0)
            return em_error(EM_ERR_IO, "%s: the file ends at byte %llu, but it had %llu bytes when it was opened: "
                            "it was truncated or replaced while being read (expected bytes %llu-%llu)", path,
                            (unsigned long long)(off + done), (unsigned long long)size, (unsigned long long)off,
                            (unsigned long long)(off + n - 1));
        done += (size_t)r;
    }
    return EM_OK;
}

em_status em__file_map_open_sized(const char *path, em__file_map *m, em__size_fn size) {
    memset(m, 0, sizeof *m);
    int fd;
    struct stat st;
    em_status s = open_input(path, &fd, &st);
    if (s != EM_OK) return s;
    if (S_ISREG(st.st_mode) && st.st_size > 0) {   /* size 0: a /proc file, read as a stream */
        /* what the file held when opened: bytes it gains later are not read, bytes it loses are an error */
        size_t len = (size_t)st.st_size;
        uint8_t *buf = malloc(len);
        if (!buf) s = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file (%zu bytes)", path, len);
        else s = read_at(fd, path, len, 0, buf, len);
        if (s == EM_OK) {
            m->heap = buf;
            m->data = buf;
            m->len = len;
        } else {
            free(buf);
        }
    } else {
        s = read_stream(fd, path, size, m);
    }
    close(fd);
    return s;
}

void em__file_map_close(em__file_map *m) {
    if (!m) return;
    free(m->heap);
    memset(m, 0, sizeof *m);
}

em_status em__file_in_open(const char *path, em__file_in *f, em__size_fn size) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = path;
    int fd;
    struct stat st;
    em_status s = open_input(path, &fd, &st);
    if (s != EM_OK) return s;
    if (S_ISREG(st.st_mode) && st.st_size > 0) {
        f->fd = fd;
        f->size = (uint64_t)st.st_size;
        return EM_OK;
    }
    s = read_stream(fd, path, size, &f->mem);
    close(fd);
    f->size = f->mem.len;
    return s;
}

em_status em__file_in_read(em__file_in *f, uint64_t off, void *dst, size_t n) {
    if (f->fd >= 0) return read_at(f->fd, f->path, f->size, off, dst, n);
    if (off > f->mem.len || n > f->mem.len - off)   /* the caller checked against size: not reached */
        return em_error(EM_ERR_INTERNAL, "%s: bytes %llu-%llu lie past the %zu bytes read", f->path,
                        (unsigned long long)off, (unsigned long long)(off + n), f->mem.len);
    if (n) memcpy(dst, f->mem.data + off, n);
    return EM_OK;
}

void em__file_in_close(em__file_in *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    em__file_map_close(&f->mem);
}

/* ---- atomic writing ---- */

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* The temporary name is ".<name>.tmp.<pid>.<tid>.<nanoseconds><attempt>"; a long name is
 * shortened to its first TMP_PREFIX_MAX bytes so that the temporary name stays within
 * NAME_MAX (255 bytes) whenever the name itself does. */
#define TMP_SUFFIX_MAX 48   /* ".tmp." + 3 numbers of at most 10, 10 and 9 digits + attempt + dots */
#define TMP_PREFIX_MAX (NAME_MAX - 1 - TMP_SUFFIX_MAX)

/* A temporary file belongs to a live writer while its writer holds an exclusive lock on it
 * (an open file description lock, F_OFD_SETLK: it conflicts between processes, hosts sharing
 * an NFS folder through its lock service, and threads of one process alike, and it goes away
 * with the writer, however it dies). A process id in the name cannot tell that: in another
 * PID namespace (a container) or on another host the same number is another process or none.
 * The cleanup takes a shared lock on a candidate; only if it gets it, and the name still
 * names that file, does it remove it, still holding the lock. A writer that finds its new
 * temporary locked, or removed by then, tries another name (see lock_new_temp). */
static int ofd_lock(int fd, short type) {
    struct flock l = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_OFD_SETLK, &l);
}

/* Removes the temporary files an earlier save of the same file left behind when its writer
 * died (SIGKILL, power loss): those nobody holds locked. A concurrent save keeps its file,
 * from whatever process, namespace or host it runs. On a filesystem without locks nothing
 * is removed. */
static void remove_stale_temps(const char *dir, const char *prefix, size_t prefix_len) {
    DIR *d = opendir(dir);
    if (!d) return;
    int dfd = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] != '.' || strncmp(n + 1, prefix, prefix_len) || strncmp(n + 1 + prefix_len, ".tmp.", 5)) continue;
        const char *p = n + 1 + prefix_len + 5;
        char *end;
        for (int field = 0; field < 2; field++) {   /* <pid>.<tid>. */
            strtol(p, &end, 10);
            if (end == p || *end != '.') break;
            p = end + 1;
        }
        if (end == p || !*p || strspn(p, "0123456789") != strlen(p)) continue;
        int fd = openat(dfd, n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        struct stat held, named;
        if (fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && ofd_lock(fd, F_RDLCK) == 0 &&
            fstatat(dfd, n, &named, AT_SYMLINK_NOFOLLOW) == 0 && held.st_dev == named.st_dev &&
            held.st_ino == named.st_ino)
            (void)unlinkat(dfd, n, 0);
        close(fd);   /* releases the lock */
    }
    closedir(d);
}

/* Takes the writer's lock on a temporary just created as fd at tmp_path. False when a
 * cleanup got there first (it holds a lock on it, or has removed it): the caller closes it
 * and tries another name. A filesystem without locks leaves it unlocked, which is safe: the
 * cleanup cannot lock it either, so it never removes it. */
static bool lock_new_temp(int fd, const char *tmp_path) {
    if (ofd_lock(fd, F_WRLCK) != 0) return errno != EAGAIN && errno != EACCES;
    struct stat held, named;
    return fstat(fd, &held) == 0 && stat(tmp_path, &named) == 0 && held.st_dev == named.st_dev &&
           held.st_ino == named.st_ino;
}

/* The file a save to path replaces: path itself or, through symbolic links (up to 40, as the
 * kernel follows), the file the last one names, so that a link stays a link and its target
 * gets the new contents (a dangling link's target is created). Malloc'ed; NULL with an error. */
static char *final_target(const char *path) {
    char *cur = strdup(path);
    for (int hops = 0; cur; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;   /* a new file, or not a link */
        char *link = malloc(PATH_MAX);
        ssize_t len = link ? readlink(cur, link, PATH_MAX) : -1;
        if (hops == 40 || len <= 0 || len >= PATH_MAX) {
            em_error(EM_ERR_IO, "%s: cannot follow the symbolic link '%s': %s", path, cur,
                     hops == 40 ? "more than 40 links in a row" : len < 0 ? strerror(errno) : "its target is too long");
            free(link);
            free(cur);
            return NULL;
        }
        link[len] = 0;
        char *next = NULL;
        if (link[0] == '/') {
            next = strdup(link);
        } else {   /* relative to the link's own folder */
            const char *slash = strrchr(cur, '/');
            size_t dir_len = slash ? (size_t)(slash - cur) + 1 : 0;
            if ((next = malloc(dir_len + (size_t)len + 1))) {
                memcpy(next, cur, dir_len);
                memcpy(next + dir_len, link, (size_t)len + 1);
            }
        }
        free(link);
        free(cur);
        cur = next;
    }
    em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory following symbolic links", path);
    return NULL;
}

em_status em__atomic_open(em__atomic_file *f, const char *path) {
    f->fd = -1;
    f->path = NULL;
    f->dest = NULL;
    f->tmp_path = NULL;
    if (!path) return em__error_unless_pending(EM_ERR_ARGUMENT, "output path is NULL");
    if (!*path) return em_error(EM_ERR_ARGUMENT, "output path is empty");
    if (path[strlen(path) - 1] == '/') return em_error(EM_ERR_ARGUMENT, "%s: output path names a directory", path);
    char *dest = final_target(path);
    if (!dest) return em_last_status();
    size_t n = strlen(dest);
    const char *slash = strrchr(dest, '/');
    size_t dir_len = slash ? (size_t)(slash - dest) + 1 : 0;
    const char *base = dest + dir_len;
    size_t base_len = n - dir_len;
    em_status bad = EM_OK;
    if (base_len == 0 || !strcmp(base, ".") || !strcmp(base, ".."))
        bad = em_error(EM_ERR_ARGUMENT, "%s: output path names a directory", path);
    else if (base_len > NAME_MAX)
        bad = em_error(EM_ERR_ARGUMENT, "%s: the file name is %zu bytes long, over the limit of %d bytes (NAME_MAX)",
                       path, base_len, NAME_MAX);
    /* the rename at commit would replace whatever is there: never a device or a folder (as
     * root, saving to /dev/null would replace the machine's /dev/null with a file) */
    struct stat st;
    bool exists = bad == EM_OK && stat(dest, &st) == 0;
    if (exists && !S_ISREG(st.st_mode))
        bad = em_error(EM_ERR_IO, "%s: cannot replace the file: it is %s, not a regular file", path,
                       S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                                          : "a pipe or socket");
    if (bad != EM_OK) {
        free(dest);
        return bad;
    }
    size_t prefix_len = base_len < TMP_PREFIX_MAX ? base_len : TMP_PREFIX_MAX;
    f->path = strdup(path);
    f->dest = dest;
    f->tmp_path = malloc(dir_len + prefix_len + TMP_SUFFIX_MAX + 2);
    if (!f->path || !f->tmp_path) {
        em__atomic_abort(f);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    char *dir = dir_of(dest);
    if (dir) remove_stale_temps(dir, base, prefix_len);
    /* unique per thread and attempt; O_EXCL guarantees we never clobber anything. A new file
     * gets the umask's mode (0666 less the umask, as open would give it); a replaced one keeps
     * its mode and, where this process may give it, its owner: the temporary starts private
     * (0600) and takes them before any data is written, so the contents are never readable
     * by more than the old file allowed. */
    int err = EEXIST;   /* why no temporary could be made */
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(f->tmp_path, dir_len + prefix_len + TMP_SUFFIX_MAX + 2, "%.*s.%.*s.tmp.%ld.%ld.%ld%d", (int)dir_len,
                 dest, (int)prefix_len, base, (long)getpid(), (long)gettid(), (long)ts.tv_nsec, attempt);
        f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, exists ? 0600 : 0666);
        if (f->fd < 0) {
            if (errno != EEXIST) {
                err = errno;
                break;
            }
            continue;
        }
        if (!lock_new_temp(f->fd, f->tmp_path)) {   /* a cleanup took it: it removes it */
            close(f->fd);
            f->fd = -1;
            continue;
        }
        if (exists) {
            if (fchown(f->fd, st.st_uid, st.st_gid) != 0) { /* another owner: only root may give it */ }
            if (fchmod(f->fd, st.st_mode & 07777) != 0) {
                int e = errno;
                em_error(EM_ERR_IO, "%s: cannot give the new file the mode of the old one (%04o): %s", path,
                         (unsigned)(st.st_mode & 07777), strerror(e));
                free(dir);
                em__atomic_abort(f);
                return EM_ERR_IO;
            }
        }
        free(dir);
        return EM_OK;
    }
    em_error(EM_ERR_IO, "%s: cannot create a temporary file in directory '%s': %s", path,
             dir ? dir : "?", strerror(err));
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
    /* renamed while still open: closing releases the writer's lock, and until the name is
     * gone a cleanup must find it locked. The data is on disk (fsync), so close has nothing
     * left to report. */
    if (rename(f->tmp_path, f->dest) != 0) {
        em_error(EM_ERR_IO, "%s: cannot replace the file: %s", f->path, strerror(errno));
        em__atomic_abort(f);
        return EM_ERR_IO;
    }
    close(f->fd);
    f->fd = -1;
    /* The rename is durable once the directory is synced; a failure here leaves the new
     * file in place, so it is not reported. */
    char *dir = dir_of(f->dest);
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
    free(f->dest);
    f->dest = NULL;
}
