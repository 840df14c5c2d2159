/* `ember train` and `ember eval` end to end: one epoch on Fashion-MNIST reaches 80% test
 * accuracy; a run stopped (--max-steps, Ctrl-C) and resumed ends exactly where an
 * uninterrupted run does, also when resumed on another device; PoCL trains like the CPU;
 * eval reproduces the accuracy training reported; bad arguments fail cleanly. */
#include <signal.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <time.h>
#include "test.h"
#include "tool_run.h"

#define OUT_SIZE 65536
static char out[OUT_SIZE];
static char dir[64];
static bool have_data;

static double find_number_after(const char *text, const char *key, bool last) {
    const char *hit = NULL;
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
        hit = p;
        if (!last) break;
    }
    return hit ? strtod(hit + strlen(key), NULL) : NAN;
}

/* Largest absolute difference over every tensor of two checkpoints (names must match);
 * INFINITY when they differ in names or shapes or a file cannot be read. */
static double checkpoint_diff(const char *a, const char *b) {
    em_safetensors *fa = em_safetensors_load(a, EM_DEVICE_CPU), *fb = em_safetensors_load(b, EM_DEVICE_CPU);
    double worst = fa && fb && em_safetensors_count(fa) == em_safetensors_count(fb) ? 0 : INFINITY;
    for (int i = 0; isfinite(worst) && i < em_safetensors_count(fa); i++) {
        em_scope s = em_scope_begin();
        const char *name = em_safetensors_name(fa, i);
        em_tensor *x = em_safetensors_get(fa, name), *y = em_safetensors_get(fb, name);
        em_tensor *d = x && y ? em_max(em_abs(em_sub(x, y)), EM_ALL_DIMS, false) : NULL;
        double v = d ? em_item(d) : INFINITY;
        if (!(v <= worst)) worst = v;
        if (!d) fprintf(stderr, "  checkpoint_diff: '%s' missing or unlike\n", name);
        em_scope_end(s);
    }
    em_clear_error();
    em_safetensors_free(fa);
    em_safetensors_free(fb);
    return worst;
}

static void path_in(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/%s", dir, name); }

static void test_one_epoch_reaches_80_percent(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char ckpt[128], args[512];
    path_in(ckpt, sizeof ckpt, "full.safetensors");
    snprintf(args, sizeof args, "train --device cpu --epochs 1 --checkpoint %s", ckpt);
    int rc = tool_run(args, out, sizeof out);
    CHECK(rc == 0);
    double acc = find_number_after(out, "test accuracy ", true);
    printf("  1 epoch, batch 64, Adam: test accuracy %.2f%%\n", acc);
    CHECK(acc >= 80.0);
    CHECK(strstr(out, "samples/s") && strstr(out, "memory allocated") && strstr(out, "peak") &&
          strstr(out, "reserved"));
    CHECK(strstr(out, "epoch 1/1 938/938 steps") != NULL);   /* plain progress lines off a tty */
    /* eval of the checkpoint: the same accuracy as training reported */
    snprintf(args, sizeof args, "eval %s --device cpu", ckpt);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK_NEAR(find_number_after(out, "test accuracy ", false), acc, 0.005);
    if (rc) fprintf(stderr, "%s\n", out);
}

/* 2000 samples, batch 64: 32 steps per epoch */
#define SMALL "--train-samples 2000 --test-samples 500 --threads 1 --seed 3"

static void test_resume_matches_uninterrupted(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char a[128], b[128], args[512];
    path_in(a, sizeof a, "a.safetensors");
    path_in(b, sizeof b, "b.safetensors");
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 2 --checkpoint %s", a);
    CHECK(tool_run(args, out, sizeof out) == 0);
    double acc_a = find_number_after(out, "test accuracy ", true);
    /* stop mid-way through epoch 2, then go on */
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 2 --max-steps 41 --checkpoint %s", b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "stopped (--max-steps) at epoch 2, batch 9 (41 steps)") != NULL);
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 2 --resume --checkpoint %s", b);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "resumed from") && strstr(out, "epoch 2, batch 9 (41 steps done)"));
    double acc_b = find_number_after(out, "test accuracy ", true);
    double diff = checkpoint_diff(a, b);
    printf("  resumed vs uninterrupted: max |difference| %g over weights and Adam state; accuracy %.2f%% / %.2f%%\n",
           diff, acc_a, acc_b);
    CHECK(diff == 0);
    CHECK(acc_a == acc_b);
}

static void test_pocl_trains_like_cpu_and_resumes_across_devices(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    char cpu[128], cl[128], moved[128], args[512];
    path_in(cpu, sizeof cpu, "cpu.safetensors");
    path_in(cl, sizeof cl, "cl.safetensors");
    path_in(moved, sizeof moved, "moved.safetensors");
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 1 --checkpoint %s", cpu);
    CHECK(tool_run(args, out, sizeof out) == 0);
    double loss_cpu = find_number_after(out, "train loss ", true);
    snprintf(args, sizeof args, "train " SMALL " --device opencl:0 --epochs 1 --checkpoint %s", cl);
    CHECK(tool_run(args, out, sizeof out) == 0);
    double loss_cl = find_number_after(out, "train loss ", true);
    double d = checkpoint_diff(cpu, cl);
    printf("  opencl:0 vs cpu after 32 Adam steps: train loss %.6f / %.6f, max |weight difference| %g\n", loss_cl,
           loss_cpu, d);
    CHECK(d < 1e-3);
    CHECK_NEAR(loss_cl, loss_cpu, 1e-4 * fabs(loss_cpu));
    /* half on the CPU, the rest on opencl:0: model and Adam state move with the checkpoint */
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 1 --max-steps 16 --checkpoint %s", moved);
    CHECK(tool_run(args, out, sizeof out) == 0);
    snprintf(args, sizeof args, "train " SMALL " --device opencl:0 --epochs 1 --resume --checkpoint %s", moved);
    CHECK(tool_run(args, out, sizeof out) == 0);
    d = checkpoint_diff(cpu, moved);
    printf("  16 steps on cpu then 16 on opencl:0 vs 32 on cpu: max |difference| %g\n", d);
    CHECK(d < 1e-3);
}

/* Starts a long `ember train` writing to ckpt and log, waits until its second epoch has
 * begun, sends sig, and waits for it. Returns the wait status; *seconds from the signal to
 * the exit. */
static int train_then_signal(int sig, const char *ckpt, const char *log, double *seconds) {
    const char *ember = tool_path();
    unlink(log);      /* an old log would say "started" before this child does */
    fflush(stdout);   /* or the child's freopen writes our buffered lines a second time */
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || !freopen(log, "a", stderr)) _exit(99);
        execl(ember, "ember", "train", "--device", "cpu", "--epochs", "1000", "--train-samples", "2000",
              "--test-samples", "100", "--threads", "1", "--checkpoint", ckpt, (char *)NULL);
        _exit(98);
    }
    CHECK(pid > 0);
    /* interrupt once training has visibly started (the first quarter-epoch line) */
    bool started = false;
    for (int i = 0; i < 3000 && !started; i++) {
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(out, 1, sizeof out - 1, f);
            out[n] = '\0';
            fclose(f);
            started = strstr(out, "epoch 2/1000") != NULL;
        }
        if (!started) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    CHECK(started);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(pid, sig);
    int st = 0;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f) fclose(f);
    if (!started) fprintf(stderr, "%s\n", out);
    return st;
}

static void test_ctrl_c_saves_and_resumes(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char ckpt[128], log[128];
    path_in(ckpt, sizeof ckpt, "int.safetensors");
    path_in(log, sizeof log, "int.log");
    double seconds;
    int st = train_then_signal(SIGINT, ckpt, log, &seconds);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130);
    CHECK(strstr(out, "interrupted at epoch") && strstr(out, "checkpoint saved to"));
    CHECK(find_number_after(out, "interrupted at epoch ", true) >= 2);
    em_safetensors *meta = em_safetensors_load(ckpt, EM_DEVICE_CPU);
    CHECK(meta && em_safetensors_metadata(meta, "train.epoch") && em_safetensors_metadata(meta, "optimizer.steps"));
    int64_t done = meta ? atoll(em_safetensors_metadata(meta, "optimizer.steps")) : 0;
    em_safetensors_free(meta);
    char args[512];
    snprintf(args, sizeof args, "train --device cpu --epochs 1000 --train-samples 2000 --test-samples 100 "
             "--threads 1 --resume --max-steps %lld --checkpoint %s", (long long)done + 3, ckpt);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "resumed from") && strstr(out, "stopped (--max-steps)"));
}

/* What Slurm and Kubernetes send before SIGKILL, and a closed terminal: the same as Ctrl-C,
 * with 128 + the signal as the exit status, well within their 30 s grace. */
static void test_sigterm_and_sighup_save(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    static const struct { int sig; const char *name; } sigs[] = {{SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}};
    for (int i = 0; i < 2; i++) {
        char ckpt[128], log[128];
        path_in(ckpt, sizeof ckpt, sigs[i].sig == SIGTERM ? "term.safetensors" : "hup.safetensors");
        path_in(log, sizeof log, sigs[i].sig == SIGTERM ? "term.log" : "hup.log");
        double seconds;
        int st = train_then_signal(sigs[i].sig, ckpt, log, &seconds);
        printf("  %s: exit status %d after %.3f s\n", sigs[i].name, WIFEXITED(st) ? WEXITSTATUS(st) : -1, seconds);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 128 + sigs[i].sig);
        CHECK(strstr(out, "interrupted at epoch") && strstr(out, sigs[i].name) && strstr(out, "checkpoint saved to"));
        CHECK(seconds < 10);
        em_safetensors *meta = em_safetensors_load(ckpt, EM_DEVICE_CPU);
        CHECK(meta && em_safetensors_metadata(meta, "train.batch") && em_safetensors_metadata(meta, "optimizer.steps"));
        em_safetensors_free(meta);
        em_clear_error();
    }
    /* documented where a user looks */
    CHECK(tool_run("train --help", out, sizeof out) == 0);
    CHECK(strstr(out, "SIGTERM") && strstr(out, "SIGHUP") && strstr(out, "128 + the signal"));
}

/* --lr with --resume replaces the checkpoint's learning rate, and says so. */
static void test_lr_with_resume_is_honoured(void) {
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char ckpt[128], args[512];
    path_in(ckpt, sizeof ckpt, "lr.safetensors");
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 2 --max-steps 5 --checkpoint %s", ckpt);
    CHECK(tool_run(args, out, sizeof out) == 0);
    snprintf(args, sizeof args, "train " SMALL " --device cpu --epochs 2 --max-steps 7 --resume --lr 0.25 --checkpoint %s",
             ckpt);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "--lr 0.25 replaces the checkpoint's learning rate 0.001") && strstr(out, "adam lr 0.25"));
    em_safetensors *meta = em_safetensors_load(ckpt, EM_DEVICE_CPU);
    const char *lr = meta ? em_safetensors_metadata(meta, "optimizer.lr") : NULL;
    CHECK(lr && atof(lr) == 0.25);
    em_safetensors_free(meta);
    /* --seed unlike the checkpoint's would change the batch order: refused */
    snprintf(args, sizeof args, "train --train-samples 2000 --test-samples 500 --threads 1 --seed 4 --device cpu "
             "--epochs 2 --resume --checkpoint %s", ckpt);
    CHECK(tool_run(args, out, sizeof out) == 2);
    CHECK(strstr(out, "--seed 4 is unlike the checkpoint's 3") != NULL);
}

static void test_bad_arguments(void) {
    static const struct { const char *args; int rc; const char *msg; } cases[] = {
        {"train --optimizer lamb", 2, "--optimizer expects adam, adamw or sgd, got 'lamb'"},
        {"train --epochs -1", 2, "--epochs expects an integer from 0 to 1000000000, got '-1'"},
        {"train --lr abc", 2, "--lr expects a number >= 0 and <= 1e+06, got 'abc'"},
        {"train --device tpu:0", 2, "--device:"},
        {"train --device opencl:7", 2, "opencl:7"},
        {"train --bogus", 2, "unknown option '--bogus'"},
        {"train --batch-size", 2, "--batch-size needs a value"},
        {"train --resume --checkpoint none", 2, "--resume needs a --checkpoint file"},
        {"train --data /nonexistent/dir --epochs 1", 1, "not found in /nonexistent/dir"},
        {"eval /nonexistent/x.safetensors --test-samples 10", 1, "/nonexistent/x.safetensors"},
        {"eval --batch-size 0", 2, "--batch-size expects an integer from 1 to"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!have_data && cases[i].rc == 1 && strstr(cases[i].args, "eval")) continue;
        int rc = tool_run(cases[i].args, out, sizeof out);
        bool ok = rc == cases[i].rc && strstr(out, cases[i].msg);
        if (!ok) fprintf(stderr, "  ember %s -> %d, output: %s\n", cases[i].args, rc, out);
        CHECK(ok);
    }
    /* a file that is not a checkpoint cannot be resumed from, and is left alone */
    char junk[128], args[256];
    path_in(junk, sizeof junk, "junk.safetensors");
    FILE *f = fopen(junk, "w");
    if (f) fputs("not a safetensors file", f), fclose(f);
    snprintf(args, sizeof args, "train --resume --checkpoint %s --train-samples 100 --test-samples 10", junk);
    if (have_data) {
        CHECK(tool_run(args, out, sizeof out) == 1);
        CHECK(strstr(out, "cannot resume") && strstr(out, junk));
    }
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_train_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    em_dataset *probe = em_dataset_fashion_mnist(NULL, false);
    have_data = probe != NULL;
    /* scripts/setup.sh installs the data: without it this test fails rather than skips */
    if (!have_data) fprintf(stderr, "Fashion-MNIST is not installed: %s\n", em_last_error());
    CHECK(have_data);
    em_clear_error();
    em_dataset_free(probe);
    RUN(test_one_epoch_reaches_80_percent);
    RUN(test_resume_matches_uninterrupted);
    RUN(test_pocl_trains_like_cpu_and_resumes_across_devices);
    RUN(test_ctrl_c_saves_and_resumes);
    RUN(test_sigterm_and_sighup_save);
    RUN(test_lr_with_resume_is_honoured);
    RUN(test_bad_arguments);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
