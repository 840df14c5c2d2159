/* `ember launch`: torchrun's variables per rank, "[rank R] " prefixes, a rank that fails or
 * is killed stops the job within seconds naming it and leaves no process behind, Ctrl-C
 * reaches every rank and launch exits 130; bad arguments are exit status 2 with a message.
 * Each case runs with the ranks started directly (--no-mpi) and through mpirun (--mpi,
 * skipped where mpirun is not installed). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include "test.h"
#include "tool_run.h"
#ifdef EMBER_HAVE_MPI
#include <mpi.h>
#endif

static char out[65536];
static char tmpdir[] = "/tmp/ember_launch_XXXXXX";

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* Does process pid still exist (a zombie counts: nobody reaped it)? */
static bool process_exists(int pid) {
    char p[64];
    snprintf(p, sizeof p, "/proc/%d", pid);
    return access(p, F_OK) == 0;
}

/* The pids the ranks wrote to tmpdir/<rank>.pid; none of them may be left. */
static int leftover_ranks(int n) {
    int left = 0;
    for (int r = 0; r < n; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.pid", tmpdir, r);
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (f) {
            if (fscanf(f, "%d", &pid) != 1) pid = 0;
            fclose(f);
            remove(path);
        }
        if (pid > 0 && process_exists(pid)) {
            fprintf(stderr, "  rank %d (pid %d) is still there\n", r, pid);
            left++;
        }
    }
    return left;
}

static void test_bad_arguments(void) {
    static const struct { const char *args, *want; } cases[] = {
        {"launch -- true", "-n N (the number of processes) is required"},
        {"launch -n 0 -- true", "-n expects"},
        {"launch -n two -- true", "-n expects"},
        {"launch -n 2000 -- true", "-n expects"},
        {"launch -n 2 true", "unexpected argument 'true': the program and its arguments go after '--'"},
        {"launch -n 2", "missing '--' before the program"},
        {"launch -n 2 --", "no program after '--'"},
        {"launch -n 2 --bogus -- true", "unknown option '--bogus'"},
        {"launch -n 2 -n 3 -- true", "given twice"},
        {"launch -n 2 --nproc 3 -- true", "given twice"},
        {"launch -n 2 --hosts no-such-host.invalid -- true", "unknown host 'no-such-host.invalid'"},
        {"launch -n 2 --hosts localhost,,localhost -- true", "an empty name"},
        {"launch -n 2 --hosts 'a b' -- true", "is not a host name"},
        {"launch -n 2 --hosts localhost,localhost -- true", "'localhost' is listed twice"},
        {"launch -n 1 --hosts localhost,127.0.0.1 -- true", "2 hosts for 1 process"},
        {"launch -n 2 --no-mpi --hosts localhost -- true", "--hosts needs mpirun"},
        {"launch -n 2 --mpi --no-mpi -- true", "contradict"},
        {"launch -n 2 --grace -1 -- true", "--grace expects"},
        {"launch -n 2 --master-port 70000 -- true", "--master-port expects"},
        {"launch -n 2 --hosts", "--hosts needs a value"},
        {"launch --rank-of-mpi -- true", "OMPI_COMM_WORLD_RANK is not set"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args = cases[i].args;
        int rc = tool_run(args, out, sizeof out);
        if (rc != 2 || !strstr(out, cases[i].want))
            fprintf(stderr, "  ember %s: status %d, output:\n%s\n  (expected status 2 and \"%s\")\n", args, rc, out,
                    cases[i].want);
        CHECK(rc == 2 && strstr(out, cases[i].want));
    }
    /* after '--' every argument is the program's, ember's own options and --help included */
    CHECK(tool_run("launch -n 1 --no-mpi -- sh -c 'echo child got $1 $2' sh --help --epochs", out, sizeof out) == 0);
    CHECK(strstr(out, "[rank 0] child got --help --epochs") != NULL);
    CHECK(tool_run("launch --help", out, sizeof out) == 0 && strstr(out, "Exit status: 0"));
    CHECK(tool_run("--help", out, sizeof out) == 0 && strstr(out, "launch"));
}

/* The ranks' variables, each line prefixed; a last line without a newline still comes out. */
static void check_env(const char *mode) {
    char args[1024];
    snprintf(args, sizeof args,
             "launch -n 3 %s -- sh -c 'echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
             "$MASTER_PORT ompi=${OMPI_COMM_WORLD_RANK:-none}\"; echo to-stderr >&2; printf last'",
             mode);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    int port = -1;
    for (int r = 0; r < 3; r++) {
        char want[128];
        snprintf(want, sizeof want, "[rank %d] env %d 3 %d 3 127.0.0.1 ", r, r, r);
        const char *line = strstr(out, want);
        CHECK(line != NULL);
        if (!line) continue;
        int p = atoi(line + strlen(want));
        CHECK(p > 0 && p < 65536);
        if (port < 0) port = p;
        CHECK(p == port);   /* one MASTER_PORT for the job */
        const char *ompi = strstr(line, "ompi=");
        char mine[16];
        snprintf(mine, sizeof mine, "ompi=%d", r);
        /* through mpirun Open MPI's variables are there too, and agree; directly they are not */
        CHECK(ompi && !strncmp(ompi, strcmp(mode, "--mpi") ? "ompi=none" : mine, strlen(strcmp(mode, "--mpi") ? "ompi=none" : mine)));
        snprintf(want, sizeof want, "[rank %d] to-stderr\n", r);
        CHECK(strstr(out, want) != NULL);
        snprintf(want, sizeof want, "[rank %d] last\n", r);
        CHECK(strstr(out, want) != NULL);
    }
    if (rc != 0 || port < 0) fprintf(stderr, "  output:\n%s\n", out);
}

/* Rank 1 fails (exit 3, or SIGKILL) while the others sleep: launch exits 1 within seconds,
 * naming it, and no rank is left. Rank 0 ignores SIGTERM: it needs the SIGKILL that follows
 * the grace period. */
static void check_failure(const char *mode, const char *how, const char *want) {
    char args[1024];
    snprintf(args, sizeof args,
             "launch -n 3 %s --grace 1 -- sh -c 'echo $$ > %s/$RANK.pid; if [ $RANK = 1 ]; then sleep 0.5; %s; fi; "
             "if [ $RANK = 0 ]; then trap \"\" TERM; fi; exec sleep 60'",
             mode, tmpdir, how);
    double t0 = now();
    int rc = tool_run(args, out, sizeof out);
    double took = now() - t0;
    printf("  %s, %s: status %d after %.2f s\n", mode, how, rc, took);
    CHECK(rc == 1);
    CHECK(took < 15.0);
    CHECK(strstr(out, want) != NULL);
    CHECK(strstr(out, "ember launch: failed: rank 1 ") != NULL);
    CHECK(leftover_ranks(3) == 0);
    if (rc != 1 || !strstr(out, want)) fprintf(stderr, "  output:\n%s\n", out);
}

/* Ctrl-C: SIGINT to launch reaches every rank (each says so and exits 0), launch exits 130. */
static void check_interrupt(const char *mode) {
    const char *ember = tool_path();
    char log[128], ready[128];
    snprintf(log, sizeof log, "%s/interrupt.log", tmpdir);
    char script[512];
    snprintf(script, sizeof script,
             "trap 'echo got SIGINT; exit 0' INT; trap 'echo got SIGTERM; exit 0' TERM; touch %s/ready.$RANK; "
             "while :; do sleep 0.05; done", tmpdir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execl(ember, "ember", "launch", "-n", "3", mode, "--", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0);
    if (pid <= 0) return;
    /* every rank up (its trap set) before the signal */
    double t0 = now();
    int up = 0;
    while (up < 3 && now() - t0 < 30) {
        up = 0;
        for (int r = 0; r < 3; r++) {
            snprintf(ready, sizeof ready, "%s/ready.%d", tmpdir, r);
            up += access(ready, F_OK) == 0;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(up == 3);
    kill(pid, SIGINT);
    double t1 = now();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0 && now() - t1 < 20) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    double took = now() - t1;
    if (waitpid(pid, &st, WNOHANG) == 0) {   /* still running: a failure, and clean up */
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        CHECK(!"ember launch did not exit within 20 s of SIGINT");
    }
    printf("  %s, SIGINT: status %d after %.2f s\n", mode, WIFEXITED(st) ? WEXITSTATUS(st) : -1, took);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    if (f) fclose(f);
    out[n] = '\0';
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] got SIGINT", r);
        CHECK(strstr(out, want) != NULL);
        snprintf(ready, sizeof ready, "%s/ready.%d", tmpdir, r);
        remove(ready);
    }
    CHECK(strstr(out, "ember launch: interrupted (SIGINT)") != NULL);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 130)) fprintf(stderr, "  output:\n%s\n", out);
    remove(log);
}

/* A program that cannot be run: every rank reports it, launch fails naming one. */
static void check_missing_program(const char *mode) {
    char args[256];
    snprintf(args, sizeof args, "launch -n 2 %s -- /nonexistent/program", mode);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 1);
    CHECK(strstr(out, "cannot run '/nonexistent/program'") != NULL);
    CHECK(strstr(out, "exited with status 127") != NULL);
    if (rc != 1) fprintf(stderr, "  ember %s: status %d, output:\n%s\n", args, rc, out);
}

/* A line longer than the launcher's first buffer (64 KiB) comes out whole, as one prefixed
 * line (it was cut into several "[rank N] " lines). Through mpirun with one rank only: Open
 * MPI forwards each rank's output in chunks, and interleaves the chunks of several ranks. */
static void check_long_line(const char *mode) {
    char path[128], args[1024];
    snprintf(path, sizeof path, "%s/long.out", tmpdir);
    enum { LONG = 300000 };
    int ranks = strcmp(mode, "--mpi") ? 2 : 1;
    snprintf(args, sizeof args, "launch -n %d %s -- sh -c 'head -c %d /dev/zero | tr \"\\000\" x; echo; echo after' "
             "> %s", ranks, mode, LONG, path);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    FILE *f = fopen(path, "r");
    static char text[2 * LONG + 4096];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    int lines = 0, whole = 0, after = 0;
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end) break;
        lines++;
        size_t len = (size_t)(end - line);
        bool prefixed = !strncmp(line, "[rank ", 6) && len > 9 && line[7] == ']';
        if (prefixed && len == 9 + LONG && strspn(line + 9, "x") == LONG) whole++;
        if (prefixed && len == 14 && !strncmp(line + 9, "after", 5)) after++;
    }
    printf("  %s, a %d-byte line from each of %d rank%s: %d lines out, %d of them whole\n", mode, LONG, ranks,
           ranks == 1 ? "" : "s", lines, whole);
    CHECK(lines == 2 * ranks && whole == ranks && after == ranks);
    remove(path);
}

static void run_mode(const char *mode) {
    check_env(mode);
    check_long_line(mode);
    check_failure(mode, "exit 3", "exited with status 3");
    check_failure(mode, "kill -9 $$", "was killed by signal 9 (SIGKILL)");
    check_interrupt(mode);
    check_missing_program(mode);
}

static void test_direct(void) { run_mode("--no-mpi"); }

static void test_mpirun(void) {
    if (!have_mpirun()) SKIP("mpirun (Open MPI) is not installed");
    run_mode("--mpi");
    /* --hosts: through mpirun, MASTER_ADDR the first host, torchrun's default port */
    int rc = tool_run("launch -n 2 --hosts localhost -- sh -c 'echo \"at $MASTER_ADDR:$MASTER_PORT $RANK/$WORLD_SIZE "
                      "local $LOCAL_RANK/$LOCAL_WORLD_SIZE\"'", out, sizeof out);
    CHECK(rc == 0);
    CHECK(strstr(out, "[rank 0] at localhost:29500 0/2 local 0/2") && strstr(out, "[rank 1] at localhost:29500 1/2 local 1/2"));
    if (rc != 0) fprintf(stderr, "  output:\n%s\n", out);
}

#ifdef EMBER_HAVE_MPI
/* This program as a rank under `ember launch` (argv[1] == "--mpi-rank"): the ranks must be
 * one MPI job (what Ember's distributed layer needs, include/ember/dist.h) whose ranks are
 * torchrun's RANK and WORLD_SIZE. Prints "mpi rank R of N sum S" (S: the ranks summed over
 * MPI) or why not, and exits non-zero then. */
static int mpi_rank_main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = -1, size = -1, sum = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    bool agree = r && w && atoi(r) == rank && atoi(w) == size;
    printf("mpi rank %d of %d sum %d%s\n", rank, size, sum, agree ? "" : " (RANK/WORLD_SIZE disagree)");
    MPI_Finalize();
    return agree ? 0 : 1;
}

/* An MPI program under `ember launch`: one job of 3 ranks, the allreduce across all of them. */
static void test_mpi_job(void) {
    if (!have_mpirun()) SKIP("mpirun (Open MPI) is not installed");
    char self[PATH_MAX], args[PATH_MAX + 256];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return;
    self[n] = '\0';
    /* Open MPI's own allocations outlive MPI_Finalize: LeakSanitizer must not fail the ranks
     * for them (an ASan build); the launcher keeps its leak check */
    snprintf(args, sizeof args, "launch -n 3 -- env ASAN_OPTIONS=detect_leaks=0 '%s' --mpi-rank", self);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] mpi rank %d of 3 sum 3\n", r, r);
        CHECK(strstr(out, want) != NULL);
    }
    if (rc != 0) fprintf(stderr, "  output:\n%s\n", out);
}
#endif

int main(int argc, char **argv) {
#ifdef EMBER_HAVE_MPI
    if (argc > 1 && !strcmp(argv[1], "--mpi-rank")) return mpi_rank_main(argc, argv);
#else
    (void)argc, (void)argv;
#endif
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_bad_arguments);
    RUN(test_direct);
    RUN(test_mpirun);
#ifdef EMBER_HAVE_MPI
    RUN(test_mpi_job);
#else
    test_skip_case("test_mpi_job", "this build has no MPI (EMBER_HAVE_MPI)");
#endif
    rmdir(tmpdir);
    return test_summary();
}
