/* ember launch: Ember's torchrun. Starts N copies of a program with torchrun's variables
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes
 * every line they print with "[rank R] ", forwards Ctrl-C and SIGTERM to all of them, and
 * when one dies (a non-zero status or a signal) stops the others (SIGTERM, then SIGKILL
 * after a grace period) and exits naming it. No rank outlives it: each is in a process
 * group of its own that the launcher signals, and dies with the launcher (PDEATHSIG).
 *
 * Two ways to start the ranks:
 *   - through mpirun (the default where mpirun is installed; required with --hosts): Ember's
 *     distributed processes talk over Open MPI and must be one MPI job (include/ember/dist.h).
 *     mpirun starts `ember launch --rank-of-mpi -- PROGRAM ARGS` once per rank; that inner
 *     launcher sets torchrun's variables from Open MPI's, prefixes the rank's output, and
 *     reports its rank's death on stderr in a line the outer launcher recognizes.
 *     Open MPI turns SIGINT into SIGTERM for the ranks; to let Ctrl-C reach them as SIGINT
 *     the outer launcher sends mpirun SIGUSR2 (which it forwards) and the inner one turns it
 *     back into SIGINT.
 *   - directly (--no-mpi, or no mpirun): fork and exec, on this host only. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>
#include "commands.h"
#include "options.h"

static const char *const tool = "ember launch";

#define MAX_RANKS 1024
#define MAX_HOSTS 256
/* A rank's line is read into a buffer of LINE_START_BYTES that doubles as a longer line
 * needs, up to LINE_MAX_BYTES: a line up to that stays one prefixed line; one longer is
 * cut into pieces of that size, each prefixed (the launcher's memory stays bounded). */
#define LINE_START_BYTES 65536
#define LINE_MAX_BYTES ((size_t)64 << 20)
/* The line an inner launcher prints when its rank dies; the outer one looks for it. */
#define DEATH_MARK "ember launch: rank "

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

enum { L_NPROC, L_HOSTS, L_MPI, L_NO_MPI, L_MASTER_ADDR, L_MASTER_PORT, L_GRACE, L_RANK_OF_MPI };
static const opt_spec launch_table[] = {
    [L_NPROC] = {.name = "--nproc", .alias = "-n", .kind = OPT_INT, .metavar = "N", .imin = 1, .imax = MAX_RANKS,
                 .help = "processes in all"},
    [L_HOSTS] = OPTION_LIST("--hosts", "A,B",
                            "spread them over these hosts (through mpirun, in blocks: ranks 0..N/H-1 on A, ...); "
                            "MASTER_ADDR is the first host"),
    [L_MPI] = OPTION_FLAG("--mpi", "start them through mpirun (the default when mpirun is installed; Open MPI's "
                                   "OMPI_COMM_WORLD_* variables are then set too)"),
    [L_NO_MPI] = OPTION_FLAG("--no-mpi", "start them directly (fork and exec), on this host: for programs that do "
                                         "not use Ember's distributed layer (em_dist_init needs one MPI job)"),
    [L_MASTER_ADDR] = OPTION_STRING("--master-addr", "ADDR", "MASTER_ADDR (default 127.0.0.1, or the first of --hosts)"),
    [L_MASTER_PORT] = OPTION_INT("--master-port", "P", 1, 65535,
                                 "MASTER_PORT (default: a free port here; 29500 with --hosts)"),
    [L_GRACE] = OPTION_INT("--grace", "S", 0, 3600,
                           "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)"),
    /* the launcher mpirun starts once per rank (see the top of this file) */
    [L_RANK_OF_MPI] = {.name = "--rank-of-mpi", .kind = OPT_FLAG, .flags = OPT_HIDDEN,
                       .help = "this process is one rank under mpirun: set torchrun's variables from Open MPI's"},
};
OPT_TABLE_FITS(launch_table);

const opt_command launch_options = {
    .name = "ember launch",
    .usage = "ember launch -n N [options] -- PROGRAM [ARGS...]",
    .about = "Ember's torchrun: start N processes of PROGRAM with torchrun's variables set (RANK, WORLD_SIZE, "
             "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each line of their output prefixed with "
             "\"[rank R] \". Everything after '--' is PROGRAM's.",
    .extra = "the program and its arguments go after '--' (ember launch -n 2 -- PROGRAM ARGS)",
    .rest_after_dashdash = true,
    .options = launch_table,
    .count = OPT_COUNT(launch_table),
    .epilogue =
        "When a rank exits with a non-zero status or is killed by a signal, the others get SIGTERM (SIGKILL after "
        "the grace period) and launch exits naming the rank and how it ended. Ctrl-C (SIGINT) and SIGTERM go to "
        "every rank; a second one kills them at once. Under mpirun, SIGUSR2 is how Ctrl-C reaches the ranks: a "
        "program must leave it alone. mpirun's own settings come from the environment (OMPI_MCA_*, e.g. "
        "OMPI_MCA_plm_rsh_agent); EMBER_*, POCL_* and OMP_NUM_THREADS are passed on to every host.",
    .exit_status = "0 every rank exited 0; 1 a rank failed (or could not be started); 2 bad arguments; 128" OPT_NBSP
                   "+" OPT_NBSP "N stopped by signal N (130 for Ctrl-C)",
};

/* ---- signals: a self-pipe the poll loop reads ---- */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR2};

static bool catch_signals(void) {
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++) {
        struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        sigaction(caught[i], &sa, NULL);
    }
    /* a reader of our output that goes away (| head) must not kill the launcher and, through
     * PDEATHSIG, every rank: writes then fail with EPIPE and the ranks run on */
    signal(SIGPIPE, SIG_IGN);
    return true;
}

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGPIPE: return "SIGPIPE";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return "a signal";
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- children and their output ---- */

typedef struct stream {
    int fd;          /* -1 once closed */
    int out;         /* where its lines go: STDOUT_FILENO or STDERR_FILENO */
    char *buf;
    size_t len, cap;
} stream;

typedef struct child {
    pid_t pid;
    int rank;        /* for the prefix and messages; -1: no prefix (mpirun) */
    bool reaped;
    int status;
    stream s[2];
} child;

/* The first error writing the ranks' output to standard output (0: none): the launcher
 * then exits 1 saying so, as every command does when its output is lost. */
static int stdout_error;

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {   /* a full disk, or the reader went away: the ranks go on, the status says it */
            if (fd == STDOUT_FILENO && !stdout_error) stdout_error = w < 0 ? errno : EIO;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* A stream's buffer of LINE_START_BYTES; false when out of memory. */
static bool stream_alloc(stream *s) {
    s->len = 0;
    s->cap = LINE_START_BYTES;
    return (s->buf = malloc(s->cap)) != NULL;
}

/* One line (without its newline) with the child's prefix. */
static void emit(const child *c, const stream *s, const char *line, size_t n, bool *death_seen, char *death,
                 size_t death_size) {
    char prefix[32] = "";
    if (c->rank >= 0) snprintf(prefix, sizeof prefix, "[rank %d] ", c->rank);
    size_t pl = strlen(prefix);
    char *out = malloc(pl + n + 1);
    if (!out) return;
    memcpy(out, prefix, pl);
    memcpy(out + pl, line, n);
    out[pl + n] = '\n';
    write_all(s->out, out, pl + n + 1);
    free(out);
    /* an inner launcher's report of its rank's death (outer launcher, mpirun's stderr) */
    if (death && !*death_seen && n > strlen(DEATH_MARK) && !strncmp(line, DEATH_MARK, strlen(DEATH_MARK)) &&
        (memmem(line, n, "exited with status", 18) || memmem(line, n, "killed by", 9))) {
        size_t k = n < death_size - 1 ? n : death_size - 1;
        memcpy(death, line + strlen("ember launch: "), k - strlen("ember launch: "));
        death[k - strlen("ember launch: ")] = '\0';
        *death_seen = true;
    }
}

/* Read what is there; emit whole lines (and a too-long or final partial one). */
static void pump(child *c, stream *s, bool *death_seen, char *death, size_t death_size) {
    for (;;) {
        if (s->len == s->cap) {   /* a line longer than the buffer: a larger one, or out in pieces */
            char *grown = s->cap < LINE_MAX_BYTES ? realloc(s->buf, 2 * s->cap) : NULL;
            if (grown) {
                s->buf = grown;
                s->cap *= 2;
            } else {
                emit(c, s, s->buf, s->len, death_seen, death, death_size);
                s->len = 0;
            }
        }
        ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {   /* EOF or an error: the last partial line, then closed */
            if (s->len) emit(c, s, s->buf, s->len, death_seen, death, death_size);
            s->len = 0;
            close(s->fd);
            s->fd = -1;
            return;
        }
        size_t start = 0, end = s->len + (size_t)r;
        for (size_t i = s->len; i < end; i++)
            if (s->buf[i] == '\n') {
                emit(c, s, s->buf + start, i - start, death_seen, death, death_size);
                start = i + 1;
            }
        memmove(s->buf, s->buf + start, end - start);
        s->len = end - start;
    }
}

typedef struct launch_opts {
    int64_t nproc, grace, master_port;
    const char *master_addr;
    char *hosts[MAX_HOSTS];
    int nhosts;
    int mpi;              /* 1 through mpirun, 0 directly, -1 auto */
    bool rank_of_mpi;     /* the inner launcher */
    char **argv;          /* PROGRAM ARGS..., NULL-terminated */
} launch_opts;

/* Start argv with stdin from /dev/null and stdout/stderr into pipes, in a process group of
 * its own, dying with this process. env: "NAME=value" strings set in the child only. */
static bool start_child(child *c, char *const *argv, char *const *env, int nenv) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "%s: cannot make a pipe: %s\n", tool, strerror(errno));
        goto fail;
    }
    pid_t parent = getpid();
    /* signals blocked across the fork: until the child has put back the default actions, a
     * signal to it would run this process's handler there and write into our signal pipe */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        fprintf(stderr, "%s: cannot start %s: fork: %s\n", tool, argv[0], strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);   /* the launcher died before the line above */
        for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++) signal(caught[i], SIG_DFL);
        signal(SIGPIPE, SIG_DFL);   /* an ignored signal stays ignored across exec */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        for (int i = 0; i < nenv; i++) putenv(env[i]);
        execvp(argv[0], argv);
        dprintf(STDERR_FILENO, "ember launch: cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);   /* also here: signals sent before the child ran setpgid still reach it */
    close(out[1]);
    close(err[1]);
    c->pid = pid;
    c->reaped = false;
    c->s[0].fd = out[0], c->s[0].out = STDOUT_FILENO, c->s[0].len = 0;
    c->s[1].fd = err[0], c->s[1].out = STDERR_FILENO, c->s[1].len = 0;
    for (int k = 0; k < 2; k++) fcntl(c->s[k].fd, F_SETFL, O_NONBLOCK);
    return true;
fail:
    for (int k = 0; k < 2; k++) {
        if (out[k] >= 0) close(out[k]);
        if (err[k] >= 0) close(err[k]);
    }
    return false;
}

static void signal_all(child *c, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (c[i].pid > 0 && !c[i].reaped) kill(-c[i].pid, sig);
}

/* "exited with status 3" / "was killed by signal 9 (SIGKILL)" */
static void describe_status(int status, char *buf, size_t size) {
    if (WIFEXITED(status)) snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(status), sig_name(WTERMSIG(status)));
    else snprintf(buf, size, "ended with wait status %d", status);
}

/* Signal every process whose parent is this one (the children left, and the descendants
 * orphaned onto this subreaper); returns how many there were. */
static int signal_own_children(int sig) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int count = 0;
    pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *close_paren = strrchr(buf, ')');   /* the name may hold spaces and ')' */
        char state;
        int ppid;
        if (close_paren && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == me && state != 'Z') {
            kill((pid_t)atoi(e->d_name), sig);
            count++;
        }
    }
    closedir(d);
    return count;
}

/* Once every rank has ended: what they left running (a rank's background job, an inner
 * launcher orphaned by mpirun) gets SIGTERM, then SIGKILL after a second, and is reaped, so
 * that no process of the job outlives the launcher and none stays a zombie. */
static void stop_leftovers(bool report) {
    double t0 = now();
    bool termed = false, killed = false;
    for (;;) {
        pid_t p = waitpid(-1, NULL, WNOHANG);
        if (p > 0) continue;
        if (p < 0) break;   /* no children at all */
        if (!termed) {
            int k = signal_own_children(SIGTERM);
            if (k && report) fprintf(stderr, "%s: stopping %d process%s the ranks left running\n", tool, k, k == 1 ? "" : "es");
            termed = true;
        } else if (!killed && now() - t0 > 1.0) {
            signal_own_children(SIGKILL);
            killed = true;
        } else if (now() - t0 > 5.0) {
            break;   /* unkillable (stuck in the kernel): give up rather than hang */
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Which role the supervisor plays. */
typedef enum role { ROLE_DIRECT, ROLE_OUTER_MPI, ROLE_INNER } role;

/* Watch the children until every one has ended and its output is drained. Returns the
 * launcher's exit status. */
static int supervise(child *c, int n, role r, double grace) {
    int interrupted = 0;   /* the first stop signal */
    bool failing = false;  /* a rank died: the others are being stopped */
    char failure[256] = "";
    char death[256] = "";
    bool death_seen = false;
    double deadline = -1;  /* when the stopped ranks get SIGKILL */
    bool killed = false;
    int alive = n;
    double drain_until = -1;
    for (;;) {
        int open_fds = 0;
        struct pollfd pfd[1 + 2 * MAX_RANKS];
        stream *which[1 + 2 * MAX_RANKS];
        child *owner[1 + 2 * MAX_RANKS];
        pfd[0] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        int np = 1;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 2; k++)
                if (c[i].s[k].fd >= 0) {
                    pfd[np] = (struct pollfd){.fd = c[i].s[k].fd, .events = POLLIN};
                    which[np] = &c[i].s[k];
                    owner[np++] = &c[i];
                    open_fds++;
                }
        if (alive == 0 && (open_fds == 0 || (drain_until >= 0 && now() > drain_until))) break;
        int ready = poll(pfd, (nfds_t)np, 100);
        if (ready < 0 && errno != EINTR) break;
        for (int i = 1; i < np && ready > 0; i++)
            if (pfd[i].revents) pump(owner[i], which[i], &death_seen, r == ROLE_OUTER_MPI ? death : NULL, sizeof death);
        /* signals */
        unsigned char sigs[64];
        ssize_t got;
        while ((got = read(sig_pipe[0], sigs, sizeof sigs)) > 0)
            for (ssize_t k = 0; k < got; k++) {
                int sig = sigs[k];
                if (sig == SIGCHLD) continue;
                if (sig == SIGUSR2 && r != ROLE_INNER) continue;
                if (sig == SIGUSR2) sig = SIGINT;   /* the outer launcher's Ctrl-C, through mpirun */
                if (interrupted) {   /* a second one: at once */
                    signal_all(c, n, SIGKILL);
                    killed = true;
                    continue;
                }
                interrupted = sig;
                /* mpirun turns SIGINT into SIGTERM for its ranks; SIGUSR2 it passes on */
                int fwd = r == ROLE_OUTER_MPI && sig == SIGINT ? SIGUSR2 : sig;
                if (r != ROLE_INNER)
                    fprintf(stderr, "%s: %s: passing it to every rank (a second one kills them)\n", tool, sig_name(sig));
                signal_all(c, n, fwd);
                if (deadline < 0) deadline = now() + grace;
            }
        /* ended children; as the subreaper, orphaned descendants too (reaped, nothing else) */
        for (;;) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p <= 0) break;
            int i = 0;
            while (i < n && c[i].pid != p) i++;
            if (i == n || c[i].reaped) continue;
            c[i].reaped = true;
            c[i].status = st;
            alive--;
            if (alive == 0) drain_until = now() + 2.0;   /* grandchildren may hold the pipes */
            bool bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            if (!bad || failing || interrupted) continue;
            char how[96];
            describe_status(st, how, sizeof how);
            if (r == ROLE_OUTER_MPI) {
                snprintf(failure, sizeof failure, "mpirun %s", how);
            } else {
                snprintf(failure, sizeof failure, "rank %d (pid %d) %s", c[i].rank, (int)c[i].pid, how);
                /* DEATH_MARK: the outer launcher reads this line */
                fprintf(stderr, "%s: %s%s\n", tool, failure,
                        r == ROLE_DIRECT && alive ? "; stopping the other ranks" : "");
            }
            failing = true;
            if (alive) {
                signal_all(c, n, SIGTERM);
                deadline = now() + grace;
            }
        }
        if (deadline >= 0 && !killed && alive && now() > deadline) {
            if (r != ROLE_INNER)
                fprintf(stderr, "%s: %d process%s still running %.0f s after SIGTERM: SIGKILL\n", tool, alive,
                        alive == 1 ? "" : "es", grace);
            if (r == ROLE_OUTER_MPI && !interrupted) signal_all(c, n, SIGTERM);
            signal_all(c, n, SIGKILL);
            killed = true;
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            if (c[i].s[k].fd >= 0) close(c[i].s[k].fd);
            c[i].s[k].fd = -1;
        }
    stop_leftovers(r != ROLE_INNER);
    if (r == ROLE_INNER) {
        /* the rank's own status, so that mpirun sees a failure as a failure; also after a
         * Ctrl-C: a rank that handled it and exited 0 must not make mpirun abort the job (and
         * SIGTERM the ranks still handling theirs). The outer launcher knows it interrupted. */
        int st = c[0].status;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
    if (interrupted) {
        fprintf(stderr, "%s: interrupted (%s)\n", tool, sig_name(interrupted));
        return 128 + interrupted;
    }
    if (failing) {
        fprintf(stderr, "%s: failed: %s\n", tool, death_seen ? death : failure);
        return 1;
    }
    return 0;
}

/* ---- arguments ---- */

static bool valid_host_name(const char *h) {
    if (!*h || strlen(h) > 253) return false;
    for (const char *p = h; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '-' || *p == '_'))
            return false;
    return true;
}

/* "A,B": names that resolve, none twice. */
static bool parse_hosts(const char *v, launch_opts *o) {
    char *copy = strdup(v);
    if (!copy) return false;
    bool ok = true;
    char *save = NULL;
    if (!*v || v[0] == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,")) {
        fprintf(stderr, "%s: --hosts expects host names separated by commas (A,B), got '%s' (an empty name)\n", tool, v);
        ok = false;
    }
    for (char *h = strtok_r(copy, ",", &save); ok && h; h = strtok_r(NULL, ",", &save)) {
        if (!valid_host_name(h)) {
            fprintf(stderr, "%s: --hosts: '%s' is not a host name (letters, digits, '.', '-', '_')\n", tool, h);
            ok = false;
            break;
        }
        for (int i = 0; i < o->nhosts; i++)
            if (!strcmp(o->hosts[i], h)) {
                fprintf(stderr, "%s: --hosts: '%s' is listed twice\n", tool, h);
                ok = false;
            }
        if (!ok) break;
        if (o->nhosts == MAX_HOSTS) {
            fprintf(stderr, "%s: --hosts: more than %d hosts\n", tool, MAX_HOSTS);
            ok = false;
            break;
        }
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int e = getaddrinfo(h, NULL, &hints, &res);
        if (e != 0) {
            fprintf(stderr, "%s: --hosts: unknown host '%s': %s\n", tool, h, gai_strerror(e));
            ok = false;
            break;
        }
        freeaddrinfo(res);
        o->hosts[o->nhosts] = strdup(h);
        if (!o->hosts[o->nhosts]) ok = false;
        else o->nhosts++;
    }
    free(copy);
    return ok;
}

static int parse(int argc, char **argv, launch_opts *o) {
    *o = (launch_opts){.grace = 5, .mpi = -1};
    opt_result opts;
    int status = opt_parse(&launch_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    if (v[L_MPI].given && v[L_NO_MPI].given) {
        fprintf(stderr, "%s: --mpi and --no-mpi contradict each other\n", tool);
        return 2;
    }
    o->mpi = v[L_MPI].given ? 1 : v[L_NO_MPI].given ? 0 : -1;
    o->rank_of_mpi = v[L_RANK_OF_MPI].given;
    o->nproc = v[L_NPROC].i;
    if (v[L_GRACE].given) o->grace = v[L_GRACE].i;
    o->master_port = v[L_MASTER_PORT].i;
    if (v[L_MASTER_ADDR].given) {
        o->master_addr = v[L_MASTER_ADDR].text;
        if (!valid_host_name(o->master_addr)) {
            fprintf(stderr, "%s: --master-addr expects a host name or address, got '%s'\n", tool, o->master_addr);
            return 2;
        }
    }
    if (v[L_HOSTS].given && !parse_hosts(v[L_HOSTS].text, o)) return 2;
    if (!opts.dashdash) {
        fprintf(stderr, "%s: missing '--' before the program to run (ember launch -n 2 -- PROGRAM ARGS)\n", tool);
        return 2;
    }
    if (opts.nrest == 0) {
        fprintf(stderr, "%s: no program after '--' (ember launch -n 2 -- PROGRAM ARGS)\n", tool);
        return 2;
    }
    o->argv = opts.rest;
    if (o->rank_of_mpi) return -1;
    if (o->nproc == 0) {
        fprintf(stderr, "%s: -n N (the number of processes) is required\n", tool);
        return 2;
    }
    if (o->nhosts && o->mpi == 0) {
        fprintf(stderr, "%s: --hosts needs mpirun; it cannot go with --no-mpi\n", tool);
        return 2;
    }
    if (o->nhosts > o->nproc) {
        fprintf(stderr, "%s: %d hosts for %lld process%s: each host needs at least one\n", tool, o->nhosts,
                (long long)o->nproc, o->nproc == 1 ? "" : "es");
        return 2;
    }
    return -1;
}

/* mpirun on PATH? */
static bool have_mpirun(void) {
    const char *path = getenv("PATH");
    if (!path) return false;
    char *copy = strdup(path), *save = NULL;
    bool found = false;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !found; d = strtok_r(NULL, ":", &save)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/mpirun", d);
        found = access(p, X_OK) == 0;
    }
    free(copy);
    return found;
}

/* A TCP port free on this host now (what torchrun's rendezvous would take). */
static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 29500;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 29500;
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

static void free_opts(launch_opts *o) {
    for (int i = 0; i < o->nhosts; i++) free(o->hosts[i]);
}

/* The inner launcher under mpirun: this rank's torchrun variables from Open MPI's. */
static int run_rank_of_mpi(launch_opts *o) {
    const char *names[][2] = {{"RANK", "OMPI_COMM_WORLD_RANK"}, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"},
                              {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
                              {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}};
    static char env[4][64];
    char *envp[4];
    for (int k = 0; k < 4; k++) {
        const char *v = getenv(names[k][1]);
        if (!v) {
            fprintf(stderr, "%s: --rank-of-mpi: %s is not set (this option is for ember launch itself, under mpirun)\n",
                    tool, names[k][1]);
            return 2;
        }
        snprintf(env[k], sizeof env[k], "%s=%s", names[k][0], v);
        envp[k] = env[k];
    }
    /* mpirun may be killed with SIGKILL: then this rank stops too */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    child c = {.rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), .s = {{.fd = -1}, {.fd = -1}}};
    bool ok = false;
    bool bufs = stream_alloc(&c.s[0]);
    if (!stream_alloc(&c.s[1])) bufs = false;
    if (bufs) ok = start_child(&c, o->argv, envp, 4);
    int rc = ok ? supervise(&c, 1, ROLE_INNER, (double)o->grace) : 1;
    if (!ok) fprintf(stderr, DEATH_MARK "%d could not be started (exited with status 1)\n", c.rank);
    for (int k = 0; k < 2; k++) free(c.s[k].buf);
    return rc;
}

static int run(launch_opts *o) {
    if (!catch_signals()) {
        fprintf(stderr, "%s: cannot make a pipe: %s\n", tool, strerror(errno));
        return 1;
    }
    if (o->rank_of_mpi) return run_rank_of_mpi(o);
    /* every process of the job that loses its parent comes here, to be stopped and reaped */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    bool mpi = o->mpi == 1 || o->nhosts > 0 || (o->mpi == -1 && have_mpirun());
    if (mpi && !have_mpirun()) {
        fprintf(stderr, "%s: %s needs mpirun (Open MPI: apt-get install openmpi-bin), which is not on PATH\n", tool,
                o->nhosts ? "--hosts" : "--mpi");
        return 1;
    }
    char addr[300], port[32];
    snprintf(addr, sizeof addr, "MASTER_ADDR=%s", o->master_addr ? o->master_addr : o->nhosts ? o->hosts[0] : "127.0.0.1");
    snprintf(port, sizeof port, "MASTER_PORT=%d",
             o->master_port ? (int)o->master_port : o->nhosts ? 29500 : free_port());
    int nchild = mpi ? 1 : (int)o->nproc;
    child *c = calloc((size_t)nchild, sizeof *c);
    char **margv = NULL;
    int rc = 1, started = 0;
    if (!c) {
        fprintf(stderr, "%s: out of memory\n", tool);
        goto done;
    }
    for (int i = 0; i < nchild; i++)
        for (int k = 0; k < 2; k++) c[i].s[k].fd = -1;
    for (int i = 0; i < nchild; i++)
        for (int k = 0; k < 2; k++)
            if (!stream_alloc(&c[i].s[k])) {
                fprintf(stderr, "%s: out of memory\n", tool);
                goto done;
            }
    if (mpi) {
        /* mpirun ... ember launch --rank-of-mpi --grace G -- PROGRAM ARGS */
        char self[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) {
            fprintf(stderr, "%s: cannot find the ember executable (/proc/self/exe): %s\n", tool, strerror(errno));
            goto done;
        }
        self[len] = '\0';
        int nargs = 0;
        while (o->argv[nargs]) nargs++;
        margv = calloc((size_t)nargs + 128, sizeof *margv);   /* mpirun's own arguments: under 100 */
        char np[32], grace[32], hosts[MAX_HOSTS * 64 + 1] = "";
        snprintf(np, sizeof np, "%lld", (long long)o->nproc);
        snprintf(grace, sizeof grace, "%lld", (long long)o->grace);
        /* blocks of ceil(N / H) ranks per host, as torchrun's nodes */
        int64_t per = o->nhosts ? (o->nproc + o->nhosts - 1) / o->nhosts : 0;
        for (int h = 0; h < o->nhosts; h++) {
            size_t used = strlen(hosts);
            snprintf(hosts + used, sizeof hosts - used, "%s%s:%lld", h ? "," : "", o->hosts[h], (long long)per);
        }
        if (!margv) {
            fprintf(stderr, "%s: out of memory\n", tool);
            goto done;
        }
        int m = 0;
        margv[m++] = "mpirun";
        margv[m++] = "--allow-run-as-root";
        margv[m++] = "--oversubscribe";
        margv[m++] = "-np";
        margv[m++] = np;
        if (o->nhosts) {
            margv[m++] = "--host";
            margv[m++] = hosts;
        }
        /* the variables the ranks need on other hosts too: torchrun's rendezvous, Ember's and
         * PoCL's settings (mpirun passes the whole environment only to ranks on this host) */
        static char *const exported[] = {"MASTER_ADDR", "MASTER_PORT"};
        for (size_t k = 0; k < 2; k++) margv[m++] = "-x", margv[m++] = exported[k];
        static char names[32][128];   /* at most 32 such variables: a bound on margv */
        int nnames = 0;
        for (char **e = environ; *e; e++) {
            const char *eq = strchr(*e, '=');
            size_t len = eq ? (size_t)(eq - *e) : 0;
            bool ours = !strncmp(*e, "EMBER_", 6) || !strncmp(*e, "POCL_", 5) || !strncmp(*e, "OMP_NUM_THREADS=", 16);
            if (!ours || !len || len >= sizeof names[0] || nnames == 32) continue;
            memcpy(names[nnames], *e, len);
            names[nnames][len] = '\0';
            margv[m++] = "-x";
            margv[m++] = names[nnames++];
        }
        margv[m++] = self;
        margv[m++] = "launch";
        margv[m++] = "--rank-of-mpi";
        margv[m++] = "--grace";
        margv[m++] = grace;
        margv[m++] = "--";
        for (int k = 0; k < nargs; k++) margv[m++] = o->argv[k];
        margv[m] = NULL;
        char *env[] = {addr, port};
        c[0].rank = -1;
        if (!start_child(&c[0], margv, env, 2)) goto done;
        started = 1;
    } else {
        for (int i = 0; i < nchild; i++) {
            char rank[32], world[32], local[32], lworld[32];
            snprintf(rank, sizeof rank, "RANK=%d", i);
            snprintf(world, sizeof world, "WORLD_SIZE=%lld", (long long)o->nproc);
            snprintf(local, sizeof local, "LOCAL_RANK=%d", i);
            snprintf(lworld, sizeof lworld, "LOCAL_WORLD_SIZE=%lld", (long long)o->nproc);
            char *env[] = {rank, world, local, lworld, addr, port};
            c[i].rank = i;
            if (!start_child(&c[i], o->argv, env, 6)) break;
            started++;
        }
        if (started < nchild) {   /* stop what started */
            fprintf(stderr, "%s: rank %d could not be started; stopping the others\n", tool, started);
            signal_all(c, started, SIGKILL);
            for (int i = 0; i < started; i++) waitpid(c[i].pid, NULL, 0);
            goto done;
        }
    }
    rc = supervise(c, started, mpi ? ROLE_OUTER_MPI : ROLE_DIRECT, (double)o->grace);
done:
    for (int i = 0; c && i < nchild; i++)
        for (int k = 0; k < 2; k++) {
            if (c[i].s[k].fd >= 0) close(c[i].s[k].fd);
            free(c[i].s[k].buf);
        }
    free(c);
    free(margv);
    return rc;
}

int cmd_launch(int argc, char **argv) {
    launch_opts o;
    int rc = parse(argc, argv, &o);
    if (rc < 0) rc = run(&o);
    free_opts(&o);
    fflush(stdout);
    if (stdout_error && rc == 0) {
        fprintf(stderr, "%s: cannot write the output: %s\n", tool, strerror(stdout_error));
        rc = 1;
    }
    return rc;
}
