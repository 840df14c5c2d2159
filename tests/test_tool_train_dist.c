/* `ember train` under mpirun: DistributedDataParallel on 2 ranks, rank 0 alone printing and
 * writing the checkpoint, which resumes on 1 and on 3 ranks; and a rank killed with SIGKILL
 * mid-epoch ends the job, non-zero and naming the rank, within 30 s. */
#include <dirent.h>
#include <signal.h>
#include <time.h>
#include "test.h"
#include "tool_run.h"
#include "dist_run.h"

static char out[1 << 16];
static char ckpt[PATH_MAX];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mpirun -np n ember ARGS, output joined into out. */
static int mpi_tool(int n, const char *args) {
    char cmd[PATH_MAX * 2 + 512];
    snprintf(cmd, sizeof cmd, "timeout -k 5 300 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np %d '%s' %s 2>&1",
             n, tool_path(), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t used = fread(out, 1, sizeof out - 1, p);
    out[used] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_ddp_train_and_resume(void) {
    char args[PATH_MAX + 256];
    snprintf(ckpt, sizeof ckpt, "/tmp/ember-test-ddp-%d.safetensors", (int)getpid());
    snprintf(args, sizeof args, "train --device cpu --epochs 1 --train-samples 2000 --test-samples 500 --checkpoint %s --max-steps 6", ckpt);
    int st = mpi_tool(2, args);
    CHECK(st == 0);
    CHECK(strstr(out, "DistributedDataParallel over 2 ranks") != NULL);
    CHECK(dist_count(out, "training Linear(784, 256)") == 1); /* rank 0 alone prints */
    CHECK(dist_count(out, "stopped (--max-steps) at epoch 1, batch 6") == 1);
    CHECK(access(ckpt, R_OK) == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    /* 2 ranks x 6 batches of 64 = 768 samples: batch 4 on 3 ranks (floor), batch 12 on 1 */
    snprintf(args, sizeof args, "train --device cpu --epochs 1 --train-samples 2000 --test-samples 500 --checkpoint %s --resume", ckpt);
    st = mpi_tool(3, args);
    CHECK(st == 0);
    CHECK(strstr(out, "written by 2 ranks, this run has 3: batch 6 of the epoch becomes batch 4") != NULL);
    CHECK(dist_count(out, "epoch 1/1: train loss") == 1);
    if (st != 0) fprintf(stderr, "%s\n", out);
    /* the 3-rank run wrote an end-of-epoch checkpoint; one process continues it */
    snprintf(args, sizeof args, "train --device cpu --epochs 2 --train-samples 2000 --test-samples 500 --checkpoint %s --resume", ckpt);
    st = tool_run(args, out, sizeof out);
    CHECK(st == 0);
    CHECK(strstr(out, "resumed from") != NULL && strstr(out, "epoch 2/2: train loss") != NULL);
    if (st != 0) fprintf(stderr, "%s\n", out);
    unlink(ckpt);
}

/* The pid of mpirun's child with OMPI_COMM_WORLD_RANK=rank, or -1. */
static pid_t rank_pid(pid_t mpirun, int rank) {
    char path[64], want[48];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    DIR *d = opendir("/proc");
    if (!d) return -1;
    pid_t found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ppid = 0;
        char comm[64];
        if (fscanf(f, "%*d (%63[^)]) %*c %d", comm, &ppid) != 2) ppid = 0;
        fclose(f);
        if (ppid != mpirun) continue;
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        f = fopen(path, "r");
        if (!f) continue;
        char env[1 << 15];
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i += strlen(env + i) + 1) {
            env[n] = '\0';
            if (!strcmp(env + i, want)) found = pid;
        }
    }
    closedir(d);
    return found;
}

static void test_rank_killed(void) {
    char log[64];
    snprintf(log, sizeof log, "/tmp/ember-test-kill-%d.log", (int)getpid());
    fflush(stdout); /* the child must not flush this process's buffered lines again */
    fflush(stderr);
    pid_t mpirun = fork();
    if (mpirun == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(127);
        execlp("mpirun", "mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader,tcp", "-np", "2",
               tool_path(), "train", "--device", "cpu", "--epochs", "100", "--train-samples", "20000", "--test-samples",
               "500", "--checkpoint", "none", (char *)NULL);
        _exit(127);
    }
    CHECK(mpirun > 0);
    /* wait for training to be under way (the first progress line) */
    bool started = false;
    for (int i = 0; i < 600 && !started; i++) {
        usleep(100000);
        FILE *f = fopen(log, "r");
        if (!f) continue;
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        fclose(f);
        started = strstr(out, "steps") != NULL;
    }
    CHECK(started);
    pid_t victim = rank_pid(mpirun, 1);
    CHECK(victim > 0);
    int status = 0;
    double t0 = now_s();
    if (victim > 0) kill(victim, SIGKILL);
    /* the job must end by itself within 30 s */
    bool ended = false;
    while (!ended && now_s() - t0 < 60) {
        if (waitpid(mpirun, &status, WNOHANG) == mpirun) ended = true;
        else usleep(50000);
    }
    double took = now_s() - t0;
    if (!ended) {
        kill(mpirun, SIGKILL);
        waitpid(mpirun, &status, 0);
    }
    CHECK(ended && took < 30);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f) fclose(f);
    /* Open MPI's launcher names the rank and its signal */
    CHECK(strstr(out, "rank 1") != NULL && strstr(out, "signal 9") != NULL);
    printf("rank 1 killed: the job ended after %.2f s, exit %d\n", took, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (!(ended && took < 30)) fprintf(stderr, "%s\n", out);
    unlink(log);
}

int main(void) {
    if (dist_mode()) return 1;
    const char *why = dist_unavailable();
    if (!why && !tool_path()) why = "the ember command is not built";
    if (why) {
        test_skip_case("test_tool_train_dist", "%s", why);
        return test_summary();
    }
    if (access("/usr/share/datasets/fashion-mnist", R_OK) != 0 && !getenv("EMBER_DATA_DIR")) {
        test_skip_case("test_tool_train_dist", "Fashion-MNIST is not installed (dataset-fashion-mnist)");
        return test_summary();
    }
    RUN(test_ddp_train_and_resume);
    RUN(test_rank_killed);
    return test_summary();
}
