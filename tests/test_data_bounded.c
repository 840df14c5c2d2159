/* Reading hostile files: a stream (pipe, /dev/zero, /dev/urandom) is read no further than
 * its header says (plus one byte, to see trailing data), or up to a fixed limit; trailing
 * bytes after a safetensors file's data are rejected as the reference reader does; the
 * atomic writer's temporary name fits NAME_MAX, and a killed save's temporary file is
 * removed by the next save of the same file. */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "test.h"
#include "data/parsers.h"

static char dir[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Peak resident memory of this process, in MiB. */
static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* A small valid safetensors file in memory: what em_safetensors_save writes. */
static unsigned char *small_file(size_t *len) {
    char path[128];
    snprintf(path, sizeof path, "%s/small.safetensors", dir);
    em_scope s = em_scope_begin();
    em_tensor *t = em_arange(0, 6, 1, EM_OPTS(.dtype = EM_F32));
    const char *names[] = {"w"};
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    em_scope_end(s);
    FILE *f = fopen(path, "rb");
    unsigned char *b = malloc(4096);
    *len = f ? fread(b, 1, 4096, f) : 0;
    if (f) fclose(f);
    return b;
}

static void test_dev_zero_and_urandom_fail_at_once(void) {
    static const char *devs[] = {"/dev/zero", "/dev/urandom"};
    for (int i = 0; i < 2; i++) {
        double t0 = now(), rss0 = peak_rss_mib();
        em_safetensors *st = em_safetensors_load(devs[i], EM_DEVICE_CPU);
        double dt = now() - t0, grew = peak_rss_mib() - rss0;
        printf("  safetensors %s: %.3f s, peak RSS +%.1f MiB: %s\n", devs[i], dt, grew, em_last_error());
        CHECK(!st);
        CHECK(em_last_status() == EM_ERR_FORMAT && strstr(em_last_error(), devs[i]));
        CHECK(strstr(em_last_error(), "expected") != NULL);
        em_clear_error();
        CHECK(dt < 5 && grew < 64);
        /* an IDX file that is a link to the device */
        char img[128], lbl[128];
        snprintf(img, sizeof img, "%s/img-%d", dir, i);
        snprintf(lbl, sizeof lbl, "%s/lbl-%d", dir, i);
        CHECK(symlink(devs[i], img) == 0 && symlink(devs[i], lbl) == 0);
        t0 = now();
        em_dataset *ds = em_dataset_idx(img, lbl, 1.0);
        dt = now() - t0;
        printf("  IDX link to %s: %.3f s: %s\n", devs[i], dt, em_last_error());
        CHECK(!ds && em_last_status() == EM_ERR_FORMAT && strstr(em_last_error(), img));
        em_clear_error();
        CHECK(dt < 5 && peak_rss_mib() - rss0 < 64);
    }
}

/* A FIFO at path fed by a child: `head` then `tail_len` more bytes (SIZE_MAX: endless). */
static pid_t feed_fifo(const char *path, const void *head, size_t head_len, size_t tail_len) {
    unlink(path);
    if (mkfifo(path, 0600) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    signal(SIGPIPE, SIG_DFL);
    int fd = open(path, O_WRONLY);
    if (fd < 0) _exit(1);
    if (write(fd, head, head_len) != (ssize_t)head_len) _exit(2);
    static char zeros[65536];
    for (size_t sent = 0; sent < tail_len;) {
        size_t n = tail_len - sent < sizeof zeros ? tail_len - sent : sizeof zeros;
        ssize_t w = write(fd, zeros, n);
        if (w <= 0) _exit(0);
        sent += (size_t)w;
    }
    _exit(0);
}

static void reap(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void test_pipe_is_read_as_far_as_the_header_says(void) {
    size_t len;
    unsigned char *b = small_file(&len);
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", dir);
    /* exactly the file: it loads */
    pid_t pid = feed_fifo(fifo, b, len, 0);
    em_safetensors *st = em_safetensors_load(fifo, EM_DEVICE_CPU);
    CHECK(st && em_safetensors_count(st) == 1);
    em_safetensors_free(st);
    reap(pid);
    /* the file, then zeros without end: refused as trailing data, at once */
    double t0 = now(), rss0 = peak_rss_mib();
    pid = feed_fifo(fifo, b, len, SIZE_MAX);
    st = em_safetensors_load(fifo, EM_DEVICE_CPU);
    double dt = now() - t0;
    printf("  valid file + endless zeros through a pipe: %.3f s: %s\n", dt, em_last_error());
    CHECK(!st && strstr(em_last_error(), "unexpected data at byte"));
    em_clear_error();
    CHECK(dt < 5 && peak_rss_mib() - rss0 < 64);
    reap(pid);
    /* a header that claims more than a stream may hold: refused before reading it */
    char big[256];
    int n = snprintf(big, sizeof big, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776],"
                     "\"data_offsets\":[0,4398046511104]}}      ");
    unsigned char head[264];
    n -= n % 8;
    for (int k = 0; k < 8; k++) head[k] = (unsigned char)((uint64_t)n >> (8 * k));
    memcpy(head + 8, big, (size_t)n);
    pid = feed_fifo(fifo, head, 8 + (size_t)n, SIZE_MAX);
    st = em_safetensors_load(fifo, EM_DEVICE_CPU);
    CHECK(!st && strstr(em_last_error(), "read only up to"));
    printf("  a stream that claims 4 TiB: %s\n", em_last_error());
    em_clear_error();
    reap(pid);
    free(b);
}

static void test_stream_without_a_size_stops_at_the_limit(void) {
    /* a gzip IDX stream's size is only known by inflating: the fixed limit bounds it */
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/pipe.idx", dir);
    const unsigned char gz[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    size_t old = em__set_stream_limit((size_t)16 << 20);   /* the same rule, at 16 MiB */
    double t0 = now();
    pid_t pid = feed_fifo(fifo, gz, sizeof gz, SIZE_MAX);
    em_dataset *ds = em_dataset_idx(fifo, fifo, 1.0);
    double dt = now() - t0;
    CHECK(em__set_stream_limit(old) == (size_t)16 << 20 && old == EM__MAX_STREAM_BYTES);
    printf("  endless gzip stream: %.2f s: %s\n", dt, em_last_error());
    CHECK(!ds && strstr(em_last_error(), "not a regular file and longer than 16777216 bytes"));
    em_clear_error();
    reap(pid);
}

static void test_trailing_bytes_are_rejected(void) {
    size_t len;
    unsigned char *b = small_file(&len);
    em__st_file f;
    CHECK_OK(em__safetensors_parse("t", b, len, &f));
    em__st_file_free(&f);
    unsigned char *longer = calloc(len + 3, 1);
    memcpy(longer, b, len);
    CHECK(em__safetensors_parse("t", longer, len + 3, &f) == EM_ERR_FORMAT);
    char want[96];
    snprintf(want, sizeof want, "unexpected data at byte %zu", len);
    CHECK_ERROR(EM_ERR_FORMAT, want);
    /* a header without tensors and a data section that is not empty */
    static const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' ', 0};
    CHECK_OK(em__safetensors_parse("t", empty, sizeof empty - 1, &f));
    em__st_file_free(&f);
    CHECK(em__safetensors_parse("t", empty, sizeof empty, &f) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "unexpected data at byte 16");
    free(longer);
    free(b);
}

static int count_temps(const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] == '.' && !strncmp(e->d_name + 1, prefix, strlen(prefix)) && strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* A writer's lock on its temporary, as file.c takes it (an open file description lock). */
static int lock_whole(int fd) {
    struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_OFD_SETLK, &l);
}

static void test_long_names_and_stale_temporaries(void) {
    em_scope s = em_scope_begin();
    em_tensor *t = em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F32));
    const char *names[] = {"w"};
    /* a name of exactly NAME_MAX bytes saves; one byte more is a clear error */
    char name[NAME_MAX + 2], path[512];
    memset(name, 'n', NAME_MAX);
    name[NAME_MAX] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    em_safetensors *st = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(st != NULL);
    em_safetensors_free(st);
    strcat(name, "n");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(em_safetensors_save(path, names, &t, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "over the limit of 255 bytes (NAME_MAX)");
    /* a device (here through a link) is never replaced by a save */
    char link[128];
    snprintf(link, sizeof link, "%s/device_link", dir);
    CHECK(symlink("/dev/zero", link) == 0);
    CHECK(em_safetensors_save(link, names, &t, 1) == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "cannot replace the file: it is a device, not a regular file");
    struct stat ls;
    CHECK(lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode));
    CHECK(em_safetensors_save(dir, names, &t, 1) == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "cannot replace the file: it is a directory");
    /* leftovers of a killed save: a file nobody holds locked goes, a live writer's (locked)
     * stays, whatever process id its name carries (here a dead one's, as a writer's in another
     * PID namespace looks from here) */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char stale[256], live[256], other[256];
    snprintf(stale, sizeof stale, "%s/.ck.safetensors.tmp.%d.%d.123450", dir, (int)dead, (int)dead);
    snprintf(live, sizeof live, "%s/.ck.safetensors.tmp.%d.%d.123451", dir, (int)dead, (int)dead);
    snprintf(other, sizeof other, "%s/.ck.safetensors.tmpfile", dir);   /* not ours: not a temporary's name */
    const char *made[] = {stale, live, other};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(made[i], "w");
        CHECK(f != NULL);
        if (f) fclose(f);
    }
    int held = open(live, O_WRONLY);
    CHECK(held >= 0 && lock_whole(held) == 0);
    CHECK(count_temps("ck.safetensors") == 2);
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    CHECK(access(stale, F_OK) != 0);
    CHECK(access(live, F_OK) == 0);
    CHECK(access(other, F_OK) == 0);
    CHECK(count_temps("ck.safetensors") == 1);
    close(held);   /* its writer is gone: the next save removes it */
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    CHECK(access(live, F_OK) != 0);
    CHECK(count_temps("ck.safetensors") == 0);
    /* the same with a name long enough that its temporaries carry a shortened prefix */
    memset(name, 'L', NAME_MAX);
    name[NAME_MAX] = '\0';
    char long_stale[512];
    snprintf(long_stale, sizeof long_stale, "%s/.%.*s.tmp.%d.%d.99", dir, NAME_MAX - 49, name, (int)dead, (int)dead);
    FILE *f = fopen(long_stale, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    CHECK(access(long_stale, F_OK) != 0);
    em_scope_end(s);
}

static float first_value(const char *path) {
    em_safetensors *st = em_safetensors_load(path, EM_DEVICE_CPU);
    float v = NAN;
    if (st) {
        em_scope s = em_scope_begin();
        v = (float)em_item(em_select(em_safetensors_get(st, "w"), 0, 0));
        em_scope_end(s);
        em_safetensors_free(st);
    }
    em_clear_error();
    return v;
}

static void save_value(const char *path, float v) {
    em_scope s = em_scope_begin();
    em_tensor *t = em_full(EM_SHAPE(2), v, EM_OPTS(0));
    const char *names[] = {"w"};
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    em_scope_end(s);
}

/* A save writes through symbolic links to the file they lead to (the link stays a link, in
 * its folder; the temporary is made beside the target), keeps a replaced file's mode and
 * owner, and gives a new file the umask's mode. (It replaced the link with a regular file,
 * leaving the target stale, and a chmod 600 checkpoint became 0644.) */
static void test_save_through_links_keeping_modes(void) {
    char sub[200], target[256], link[256], chain[256], dangling[256], made[256], loop_a[256], loop_b[256];
    snprintf(sub, sizeof sub, "%s/real", dir);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(target, sizeof target, "%s/model.safetensors", sub);
    snprintf(link, sizeof link, "%s/model_link.safetensors", dir);
    snprintf(chain, sizeof chain, "%s/chain.safetensors", dir);
    save_value(target, 1);
    CHECK(symlink("real/model.safetensors", link) == 0);   /* relative to the link's folder */
    CHECK(symlink(link, chain) == 0);                        /* a link to the link */
    save_value(link, 2);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(first_value(target) == 2);
    save_value(chain, 3);
    CHECK(lstat(chain, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(first_value(target) == 3);
    CHECK(count_temps("model.safetensors") == 0);
    /* a dangling link: its target is created */
    snprintf(dangling, sizeof dangling, "%s/dangling.safetensors", dir);
    snprintf(made, sizeof made, "%s/made.safetensors", sub);
    CHECK(symlink(made, dangling) == 0);
    save_value(dangling, 4);
    CHECK(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(first_value(made) == 4);
    /* a loop of links is an error naming it, and changes nothing */
    snprintf(loop_a, sizeof loop_a, "%s/loop_a", dir);
    snprintf(loop_b, sizeof loop_b, "%s/loop_b", dir);
    CHECK(symlink(loop_b, loop_a) == 0 && symlink(loop_a, loop_b) == 0);
    em_scope s = em_scope_begin();
    em_tensor *t = em_ones(EM_SHAPE(2), EM_OPTS(0));
    const char *names[] = {"w"};
    CHECK(em_safetensors_save(loop_a, names, &t, 1) == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "cannot follow the symbolic link");
    em_scope_end(s);
    /* modes: a replaced file keeps its own, through a link too */
    CHECK(chmod(target, 0600) == 0);
    save_value(link, 5);
    CHECK(stat(target, &st) == 0 && (st.st_mode & 07777) == 0600);
    CHECK(chmod(target, 0640) == 0);
    save_value(target, 6);
    CHECK(stat(target, &st) == 0 && (st.st_mode & 07777) == 0640);
    CHECK(first_value(target) == 6);
    /* a new file: the umask's mode */
    char fresh[256];
    mode_t old_mask = umask(027);
    snprintf(fresh, sizeof fresh, "%s/fresh_027.safetensors", dir);
    save_value(fresh, 7);
    CHECK(stat(fresh, &st) == 0 && (st.st_mode & 07777) == 0640);
    umask(077);
    snprintf(fresh, sizeof fresh, "%s/fresh_077.safetensors", dir);
    save_value(fresh, 7);
    CHECK(stat(fresh, &st) == 0 && (st.st_mode & 07777) == 0600);
    umask(old_mask);
    /* the owner: only root may give a file to another user */
    if (geteuid() != 0) {
        test_skip_case("test_save_through_links_keeping_modes (owner part)", "not root: cannot make a file of another owner");
        return;
    }
    CHECK(chown(target, 1234, 4321) == 0);
    save_value(link, 8);
    CHECK(stat(target, &st) == 0 && st.st_uid == 1234 && st.st_gid == 4321 && (st.st_mode & 07777) == 0640);
    CHECK(first_value(target) == 8);
}

/* The smallest process id above 1 that no process here has (a writer's in another PID
 * namespace or on another host looks like that from here), or 0. */
static pid_t unused_pid(void) {
    for (pid_t p = 2; p < 4096; p++)
        if (kill(p, 0) != 0 && errno == ESRCH) return p;
    return 0;
}

/* In the child: save `path` atomically from a process whose id, seen from here, is nobody's:
 * write, report through ready, wait for go, commit. Exit 0 when the commit succeeded. */
static void slow_writer(const char *path, int ready, int go) {
    em__atomic_file f;
    char c = 0;
    bool ok = em__atomic_open(&f, path) == EM_OK && em__atomic_write(&f, "live writer", 11) == EM_OK;
    ok = write(ready, ok ? "y" : "n", 1) == 1 && ok;
    ok = read(go, &c, 1) == 1 && ok;
    if (ok && em__atomic_commit(&f) != EM_OK) {
        fprintf(stderr, "  the live writer's commit failed: %s\n", em_last_error());
        ok = false;
    }
    em__atomic_abort(&f);
    _exit(ok ? 0 : 1);
}

/* Two processes save one file: a writer in another PID namespace (its process id there is one
 * that does not exist here) is in the middle of its save when this process saves the same
 * file. The cleanup of this save must leave the writer's temporary alone, so that its commit
 * succeeds. (Judged by its name's process id, the temporary was removed and the writer failed
 * with "cannot replace the file: No such file or directory".) */
static void test_live_writer_in_another_pid_namespace(void) {
    pid_t want = unused_pid();
    if (want < 3) SKIP("no free process id to give the writer (found %d)", (int)want);
    char path[256];
    snprintf(path, sizeof path, "%s/shared.safetensors", dir);
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t outer = fork();
    if (outer == 0) {
        close(ready[0]);
        close(go[1]);
        if (unshare(CLONE_NEWPID) != 0) _exit(77);
        /* the namespace's first child is its init (pid 1): it forks until a child gets the
         * wanted id (ids are handed out in order from 1) and returns that child's status */
        pid_t init = fork();
        if (init < 0) _exit(78);
        if (init > 0) {
            int st = 0;
            waitpid(init, &st, 0);
            _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 79);
        }
        for (;;) {
            pid_t c = fork();
            if (c < 0) _exit(78);
            if (c == 0) {
                if (getpid() == want) slow_writer(path, ready[1], go[0]);
                _exit(getpid() > want ? 80 : 0);
            }
            int st = 0;
            waitpid(c, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 79);
            if (c == want) _exit(0);
        }
    }
    close(ready[1]);
    close(go[0]);
    char c = 0;
    ssize_t got = read(ready[0], &c, 1);
    int status = 0;
    if (got != 1) {   /* the child could not make the namespace or the writer */
        waitpid(outer, &status, 0);
        close(ready[0]);
        close(go[1]);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) SKIP("cannot make a PID namespace here: %s", "unshare(CLONE_NEWPID) failed");
        CHECK(!"the writer in the PID namespace did not start");
        return;
    }
    CHECK(c == 'y');
    CHECK(count_temps("shared.safetensors") == 1);
    em_scope s = em_scope_begin();
    em_tensor *t = em_ones(EM_SHAPE(2), EM_OPTS(0));
    const char *names[] = {"w"};
    CHECK_OK(em_safetensors_save(path, names, &t, 1));
    em_scope_end(s);
    CHECK(count_temps("shared.safetensors") == 1);   /* the writer's, still there */
    CHECK(write(go[1], "g", 1) == 1);
    CHECK(waitpid(outer, &status, 0) == outer && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    char buf[32] = {0};
    if (f) {
        len = fread(buf, 1, sizeof buf, f);
        fclose(f);
    }
    CHECK(len == 11 && !memcmp(buf, "live writer", 11));   /* the writer's save landed last */
    CHECK(count_temps("shared.safetensors") == 0);
    printf("  a writer with process id %d in its own PID namespace kept its temporary through another save\n",
           (int)want);
    close(ready[0]);
    close(go[1]);
}

int main(void) {
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_bounded_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    RUN(test_dev_zero_and_urandom_fail_at_once);
    RUN(test_pipe_is_read_as_far_as_the_header_says);
    RUN(test_stream_without_a_size_stops_at_the_limit);
    RUN(test_trailing_bytes_are_rejected);
    RUN(test_long_names_and_stale_temporaries);
    RUN(test_live_writer_in_another_pid_namespace);
    RUN(test_save_through_links_keeping_modes);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
