/* `ember train`'s side outputs failing mid-run: a --plot picture or a --logdir event file that
 * cannot be written (a full disk, a file-size limit, a temporary name taken) must not end
 * training without its checkpoint. The checkpoint of every epoch comes first; the failure is
 * one warning and training goes on; with --strict-logs training stops after the checkpoint is
 * saved, with status 1. The MLP and the GPT alike.
 *
 * The faults: the picture's temporary file name (".ember-plot.<pid>.0.tmp", the pid of the
 * process a shell execs) made a folder first, so the first picture cannot be created; the
 * log under `ulimit -f 1` (512-byte files); the log on a 4 KiB tmpfs in a mount namespace of
 * its own (skipped where `unshare -m` is not allowed). */
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static char dir[64];
static char out[1 << 16];

/* `sh -c SCRIPT` with "@E" the ember binary and "@" the test's folder, stderr joined. */
static int run_sh(const char *script) {
    char cmd[8192];
    size_t n = 0;
    for (const char *s = script; *s && n + 1 < sizeof cmd; s++) {
        if (s[0] == '@' && s[1] == 'E') n += (size_t)snprintf(cmd + n, sizeof cmd - n, "'%s'", tool_path()), s++;
        else if (*s == '@') n += (size_t)snprintf(cmd + n, sizeof cmd - n, "%s", dir);
        else cmd[n++] = *s;
        if (n >= sizeof cmd) n = sizeof cmd - 1;
    }
    cmd[n] = '\0';
    char full[8300];
    snprintf(full, sizeof full, "exec 2>&1; %s", cmd);   /* $$ in cmd: the shell that execs */
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* A metadata value of the checkpoint @/name, as an integer; -1 when missing. */
static long long meta_of(const char *name, const char *key) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    const char *v = f ? em_safetensors_metadata(f, key) : NULL;
    long long r = v ? atoll(v) : -1;
    em_safetensors_free(f);
    em_clear_error();
    return r;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

static bool write_idx(const char *path, int n, int rows) {
    int ndim = rows ? 3 : 1;
    size_t hdr = 4 + 4 * (size_t)ndim, body = (size_t)n * (rows ? (size_t)rows * (size_t)rows : 1);
    unsigned char *b = calloc(hdr + body, 1);
    if (!b) return false;
    b[2] = 0x08;
    b[3] = (unsigned char)ndim;
    put_be32(b + 4, (uint32_t)n);
    if (rows) put_be32(b + 8, (uint32_t)rows), put_be32(b + 12, (uint32_t)rows);
    for (size_t i = 0; i < body; i++) b[hdr + i] = rows ? (unsigned char)(i * 7 % 256) : (unsigned char)(i % 10);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b, 1, hdr + body, f) == hdr + body;
    if (f && fclose(f) != 0) ok = false;
    free(b);
    return ok;
}

static bool have_cairo;

static void test_setup(void) {
    static const char *const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char p[256];
    snprintf(p, sizeof p, "%s/data", dir);
    CHECK(mkdir(p, 0700) == 0);
    for (int k = 0; k < 4; k++) {
        snprintf(p, sizeof p, "%s/data/%s", dir, names[k]);
        CHECK(write_idx(p, k < 2 ? 64 : 32, k % 2 ? 0 : 28));
    }
    int rc = run_sh("@E train --plot @/probe.png --epochs 0 --device cpu --checkpoint none --data @/data");
    have_cairo = !(rc == 2 && strstr(out, "built without cairo"));
}

#define SMALL "--device cpu --data @/data --train-samples 64 --test-samples 32 --batch-size 16 --threads 1"
/* the first picture of the process the shell execs cannot be created */
#define TAKE_PLOT_NAME "mkdir @/.ember-plot.$$.0.tmp && exec "

static void test_plot_failure_keeps_training(void) {
    if (!have_cairo) SKIP("built without cairo: --plot is refused before training");
    int rc = run_sh(TAKE_PLOT_NAME "@E train " SMALL " --epochs 3 --plot @/a.png --checkpoint @/a.safetensors");
    printf("  --plot failing at epoch 1: status %d, %d epochs, checkpoint at epoch %lld\n", rc,
           count(out, ": train loss "), meta_of("a.safetensors", "train.epoch"));
    CHECK(rc == 0);
    CHECK(count(out, "warning: --plot: cannot create a file in the folder") == 1);
    CHECK(count(out, "training goes on without it") == 1);
    CHECK(count(out, ": train loss ") == 3);
    CHECK(meta_of("a.safetensors", "train.epoch") == 3);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    /* --strict-logs: the epoch's checkpoint is saved, then training stops with status 1 */
    rc = run_sh(TAKE_PLOT_NAME "@E train " SMALL " --epochs 3 --plot @/b.png --checkpoint @/b.safetensors --strict-logs");
    printf("  the same with --strict-logs: status %d, %d epochs, checkpoint at epoch %lld\n", rc,
           count(out, ": train loss "), meta_of("b.safetensors", "train.epoch"));
    CHECK(rc == 1);
    CHECK(count(out, ": train loss ") == 1 && meta_of("b.safetensors", "train.epoch") == 1);
    CHECK(strstr(out, "stopped (--strict-logs: a --logdir or --plot write failed) at epoch 2, batch 0") != NULL);
    /* and it resumes from there */
    rc = run_sh("@E train " SMALL " --epochs 3 --checkpoint @/b.safetensors --resume");
    CHECK(rc == 0 && meta_of("b.safetensors", "train.epoch") == 3);
}

static void test_gpt_plot_failure_keeps_training(void) {
    if (!have_cairo) SKIP("built without cairo: --plot is refused before training");
    const char *gpt = "@E train --model gpt --text tests/data/gpt_tiny.txt --context 16 --d-model 32 --layers 1 "
                      "--heads 2 --batch-size 4 --threads 1 --sample-chars 0 --device cpu --steps-per-epoch 3 "
                      "--epochs 2";
    char script[1024];
    snprintf(script, sizeof script, TAKE_PLOT_NAME "%s --plot @/g.png --checkpoint @/g.safetensors", gpt);
    int rc = run_sh(script);
    printf("  ember train --model gpt, --plot failing at epoch 1: status %d, checkpoint at step %lld\n", rc,
           meta_of("g.safetensors", "train.steps"));
    CHECK(rc == 0 && count(out, "warning: --plot") == 1 && count(out, ": train loss ") == 2);
    CHECK(meta_of("g.safetensors", "train.steps") == 6);
    snprintf(script, sizeof script, TAKE_PLOT_NAME "%s --plot @/h.png --checkpoint @/h.safetensors --strict-logs", gpt);
    rc = run_sh(script);
    CHECK(rc == 1 && count(out, ": train loss ") == 1 && meta_of("h.safetensors", "train.steps") == 3);
    if (rc != 1) fprintf(stderr, "%s\n", out);
}

/* The event file under a 512-byte file-size limit (SIGXFSZ ignored, so writes fail with
 * EFBIG): one warning, every epoch trained. No checkpoint: it would not fit either. */
static void test_logdir_file_size_limit(void) {
    int rc = run_sh("trap '' XFSZ; ulimit -f 1 && exec @E train " SMALL " --epochs 3 --checkpoint none "
                    "--logdir @/logs --log-every 1");
    printf("  --logdir under ulimit -f 1: status %d, %d epochs, %d warnings\n", rc, count(out, ": train loss "),
           count(out, "warning: --logdir"));
    CHECK(rc == 0 && count(out, ": train loss ") == 3);
    CHECK(count(out, "warning: --logdir: cannot write the log") == 1 && strstr(out, "File too large"));
    if (rc != 0) fprintf(stderr, "%s\n", out);
}

/* The event file on a full disk: a 4 KiB tmpfs, the checkpoint beside it on the real disk. */
static void test_logdir_full_disk(void) {
    if (run_sh("unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs /mnt' 2>&1") != 0)
        SKIP("no mount namespace for a small tmpfs here (unshare -m: %.200s)", out);
    char p[128];
    snprintf(p, sizeof p, "%s/full", dir);
    CHECK(mkdir(p, 0700) == 0);
    const char *mount = "unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs @/full && exec @E train " SMALL
                        " --epochs 4 --logdir @/full/logs --log-every 1 ";
    char script[2048];
    snprintf(script, sizeof script, "%s --checkpoint @/f.safetensors'", mount);
    int rc = run_sh(script);
    printf("  --logdir on a full 4 KiB disk: status %d, %d epochs, %d warnings, checkpoint at epoch %lld\n", rc,
           count(out, ": train loss "), count(out, "warning: --logdir"), meta_of("f.safetensors", "train.epoch"));
    CHECK(rc == 0 && count(out, ": train loss ") == 4 && meta_of("f.safetensors", "train.epoch") == 4);
    CHECK(count(out, "warning: --logdir") == 1 && strstr(out, "No space left on device"));
    if (rc != 0) fprintf(stderr, "%s\n", out);
    snprintf(script, sizeof script, "%s --checkpoint @/s.safetensors --strict-logs'", mount);
    rc = run_sh(script);
    int epochs = count(out, ": train loss ");
    long long saved = meta_of("s.safetensors", "train.epoch");
    printf("  the same with --strict-logs: status %d after %d epochs, checkpoint at epoch %lld\n", rc, epochs, saved);
    /* stopped where the write failed, mid-epoch or at an epoch's end: the checkpoint holds
     * every epoch printed (and, mid-epoch, the batches of the next one) */
    CHECK(rc == 1 && epochs < 4 && strstr(out, "stopped (--strict-logs"));
    CHECK(saved == epochs);
}

int main(void) {
    (void)tool_run;   /* run_sh, with pipes and redirections, is used instead */
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    snprintf(dir, sizeof dir, "/tmp/ember_train_outputs_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    RUN(test_setup);
    RUN(test_plot_failure_keeps_training);
    RUN(test_gpt_plot_failure_keeps_training);
    RUN(test_logdir_file_size_limit);
    RUN(test_logdir_full_disk);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
