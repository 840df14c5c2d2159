/* The `ember` command's input and output as a pipeline sees them:
 *  - a checkpoint is opened and read once by each command, so it can come through a pipe
 *    (`cat ck | ember eval /dev/stdin`), for the MLP's and the GPT's checkpoints and for
 *    `ember mem --model`;
 *  - every command checks that its output reached standard output: written to /dev/full
 *    (a full disk), each exits with status 1 and says so instead of exiting 0 with its
 *    results lost. */
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static char dir[64];                 /* everything this test writes */
static char out[1 << 16];

/* Runs `sh -c SCRIPT` ("@E" stands for the ember binary, "@" for the test's folder) with
 * stderr joined to stdout into out; the exit status, or -1. */
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

/* ---- a small Fashion-MNIST (64 train, 32 test samples), as test_tool_bad_inputs makes ---- */

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

static bool make_data(void) {
    static const char *const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char p[256];
    snprintf(p, sizeof p, "%s/data", dir);
    mkdir(p, 0700);
    bool ok = true;
    for (int k = 0; k < 4; k++) {
        snprintf(p, sizeof p, "%s/data/%s", dir, names[k]);
        ok = ok && write_idx(p, k < 2 ? 64 : 32, k % 2 ? 0 : 28);
    }
    return ok;
}

#define SMALL "--device cpu --data @/data --train-samples 64 --test-samples 32 --threads 1"
#define GPT "--text tests/data/gpt_tiny.txt --context 16 --d-model 32 --layers 1 --heads 2 --batch-size 4 " \
            "--threads 1 --sample-chars 10 --device cpu"

static bool ready;   /* the data and both checkpoints exist */

static void test_setup(void) {
    CHECK(make_data());
    int rc = run_sh("@E train " SMALL " --epochs 1 --batch-size 16 --checkpoint @/mlp.safetensors");
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0);
    rc = run_sh("@E train --model gpt " GPT " --epochs 1 --steps-per-epoch 2 --checkpoint @/gpt.safetensors");
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0);
    ready = test__checks_failed_in_case == 0;
}

static double number_after(const char *key) {
    const char *p = strstr(out, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* Each command reads its checkpoint once: a pipe, which can be read only once, works. */
static void test_checkpoint_through_a_pipe(void) {
    if (!ready) SKIP("the setup failed");
    CHECK(run_sh("@E eval @/mlp.safetensors --device cpu --data @/data") == 0);
    double from_file = number_after("test accuracy ");
    int rc = run_sh("cat @/mlp.safetensors | @E eval /dev/stdin --device cpu --data @/data");
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0 && strstr(out, "/dev/stdin on cpu: test accuracy"));
    CHECK(number_after("test accuracy ") == from_file);
    rc = run_sh("cat @/mlp.safetensors | @E mem --model /dev/stdin --batch 8");
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0 && strstr(out, "/dev/stdin: 203530 parameters"));
    rc = run_sh("cat @/gpt.safetensors | @E eval /dev/stdin --text tests/data/gpt_tiny.txt --device cpu");
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0 && strstr(out, "/dev/stdin (GPT,") && strstr(out, "val loss"));
    /* a bad one through a pipe is still named and refused */
    rc = run_sh("head -c 100 @/mlp.safetensors | @E eval /dev/stdin --device cpu --data @/data");
    CHECK(rc == 1 && strstr(out, "/dev/stdin"));
}

/* stdout on a full disk: status 1 and a message, never 0 with the results lost. */
static void test_write_errors_on_stdout(void) {
    if (!ready) SKIP("the setup failed");
    static const char *const commands[] = {
        "eval @/mlp.safetensors --device cpu --data @/data",
        "eval @/gpt.safetensors --text tests/data/gpt_tiny.txt --device cpu",
        "mem 7B",
        "mem 7B --json",
        "mem --model @/mlp.safetensors",
        "mem --model mlp --batch 8 --mode full",
        "smi -L",
        "smi --query-gpu=name,memory.total --format=csv",
        "train " SMALL " --epochs 1 --batch-size 16 --checkpoint none",
        "train --model gpt " GPT " --epochs 1 --steps-per-epoch 1 --checkpoint none",
        "devices",
        "--version",
        "help mem",
        "launch -n 1 --no-mpi -- echo hello",
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char script[1024];
        snprintf(script, sizeof script, "@E %s > /dev/full", commands[i]);
        int rc = run_sh(script);
        bool ok = rc == 1 && (strstr(out, "cannot write the output: ") || strstr(out, "could not write the report"));
        printf("  ember %s > /dev/full: status %d\n", commands[i], rc);
        if (!ok) fprintf(stderr, "    %s\n", out);
        CHECK(ok);
    }
    /* the same commands with a reader: status 0 */
    CHECK(run_sh("@E mem 7B --json > /dev/null") == 0);
    CHECK(run_sh("@E launch -n 1 --no-mpi -- echo hello > /dev/null") == 0);
}

int main(void) {
    (void)tool_run;   /* run_sh, with pipes and redirections, is used instead */
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    snprintf(dir, sizeof dir, "/tmp/ember_tool_io_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    RUN(test_setup);
    RUN(test_checkpoint_through_a_pipe);
    RUN(test_write_errors_on_stdout);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
