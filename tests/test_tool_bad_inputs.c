/* The `ember` command against bad input, as a hostile or careless user gives it: options,
 * device strings, environment variables, output paths, corrupt checkpoints (safetensors),
 * corrupt IDX data directories and forged checkpoint metadata. Each case is a row
 * {arguments, environment, exit status, a fragment of the message}; a case passes when the
 * command exits with that status (not a signal, not a timeout), says the fragment, and no
 * sanitizer reports anything. The summary line counts the cases and the clean errors
 * (docs/HARDENING.md, "Bad inputs"). */
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"

static char dir[64];            /* everything this test writes */
static char out[1 << 16];
static int tried, clean;        /* bad inputs run, and those that gave a clean error */
static bool have_opencl;

#define NEED_OPENCL 1u

typedef struct bad_case {
    const char *args;   /* after "ember"; "@" stands for the test's directory */
    const char *env;    /* "NAME=value" set for this run only, or NULL */
    int rc;             /* the exit status expected */
    const char *msg;    /* a fragment the output must hold ("@" as in args) */
    unsigned need;
} bad_case;

/* s with every "@" replaced by the test's directory. */
static void expand(const char *s, char *buf, size_t size) {
    size_t n = 0;
    for (; *s && n + 1 < size; s++) {
        if (*s == '@') n += (size_t)snprintf(buf + n, size - n, "%s", dir);
        else buf[n++] = *s;
        if (n >= size) n = size - 1;
    }
    buf[n] = '\0';
}

/* Runs `ember ARGS` under a time limit; the exit status, or -1 when it was killed or
 * timed out. */
static int run_ember(const char *args, const char *env) {
    char name[256] = "", *value = NULL, tmp[256];
    if (env) {
        expand(env, tmp, sizeof tmp);
        char *eq = strchr(tmp, '=');
        if (eq) *eq = '\0', value = eq + 1;
        memcpy(name, tmp, sizeof name);
        setenv(name, value ? value : "", 1);
    }
    /* a command that hangs or reads without end must not hang the test: 120 s, then KILL */
    const char *ember = tool_path();
    char cmd[PATH_MAX + 9000];
    snprintf(cmd, sizeof cmd, "timeout -s KILL 120 '%s' %s 2>&1", ember, args);
    FILE *p = popen(cmd, "r");
    int rc = -1;
    if (p) {
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        char sink[4096];
        while (fread(sink, 1, sizeof sink, p) > 0) {}
        int st = pclose(p);
        rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (rc == 137 || rc == 124) rc = -1;   /* timeout's statuses */
    }
    if (env) unsetenv(name);
    return rc;
}

static void run_cases(const bad_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const bad_case *c = &cases[i];
        if ((c->need & NEED_OPENCL) && !have_opencl) {
            printf("  (skipped, no OpenCL device: ember %s)\n", c->args);
            continue;
        }
        char args[16384], msg[1024];
        expand(c->args, args, sizeof args);
        expand(c->msg, msg, sizeof msg);
        int rc = run_ember(args, c->env);
        bool sanitizer = strstr(out, "Sanitizer") || strstr(out, "runtime error:");
        bool ok = rc == c->rc && strstr(out, msg) && !sanitizer;
        tried++;
        clean += ok;
        if (!ok)
            fprintf(stderr, "  %s%sember %.300s -> %d (expected %d and \"%s\"): %.2000s\n", c->env ? c->env : "",
                    c->env ? " " : "", args, rc, c->rc, msg, out);
        CHECK(ok);
    }
}

#define RUN_CASES(a) run_cases(a, sizeof a / sizeof a[0])

/* ---- files ---- */

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = b ? fread(b, 1, (size_t)len, f) : 0;
    if (b) b[*n] = '\0';
    fclose(f);
    return b;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

/* An IDX file of n images (rows x cols bytes, type 0x08) or, with rows = 0, n labels. */
static unsigned char *idx_bytes(int n, int rows, int cols, size_t *len) {
    int ndim = rows ? 3 : 1;
    size_t hdr = 4 + 4 * (size_t)ndim, body = (size_t)n * (rows ? (size_t)rows * (size_t)cols : 1);
    unsigned char *b = calloc(hdr + body + 1, 1);
    b[2] = 0x08;
    b[3] = (unsigned char)ndim;
    put_be32(b + 4, (uint32_t)n);
    if (rows) put_be32(b + 8, (uint32_t)rows), put_be32(b + 12, (uint32_t)cols);
    for (size_t i = 0; i < body; i++) b[hdr + i] = rows ? (unsigned char)(i * 7 % 256) : (unsigned char)(i % 10);
    *len = hdr + body;
    return b;
}

static const char *const idx_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

/* A directory @/name holding a small valid Fashion-MNIST (64 train, 32 test samples). */
static void make_data_dir(const char *name) {
    char d[256], p[512];
    snprintf(d, sizeof d, "%s/%s", dir, name);
    mkdir(d, 0700);
    for (int k = 0; k < 4; k++) {
        size_t len;
        unsigned char *b = idx_bytes(k < 2 ? 64 : 32, k % 2 ? 0 : 28, 28, &len);
        snprintf(p, sizeof p, "%s/%s", d, idx_names[k]);
        CHECK(write_file(p, b, len));
        free(b);
    }
}

/* @/name: the valid directory with file k replaced by `data`, or by a link to `link`. */
static void corrupt_data_dir(const char *name, int k, const void *data, size_t len, const char *link) {
    make_data_dir(name);
    char p[512];
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, idx_names[k]);
    unlink(p);
    if (link) CHECK(symlink(link, p) == 0);
    else CHECK(write_file(p, data, len));
}

/* @/name: the good checkpoint with its JSON header edited (from -> to, first match), the
 * length prefix and padding fixed so that only the edit is wrong. */
static void edit_header(const char *name, const char *from, const char *to) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/good.safetensors", dir);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    CHECK(tool_edit_safetensors_header(src, dst, from, to));
}

/* @/name: the first `keep` bytes of the good checkpoint, then `extra` bytes of `fill`. */
static void cut_checkpoint(const char *name, size_t keep, size_t extra, int fill) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/good.safetensors", dir);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    size_t n;
    unsigned char *b = read_file(src, &n);
    if (keep > n) keep = n;
    unsigned char *o = malloc(keep + extra + 1);
    memcpy(o, b, keep);
    memset(o + keep, fill, extra);
    CHECK(write_file(dst, o, keep + extra));
    free(o);
    free(b);
}

/* ---- the cases ---- */

#define SMALL "--data @/data --train-samples 64 --test-samples 32 --threads 1"

static void test_setup_trains_on_the_small_data(void) {
    make_data_dir("data");
    char link[128];
    snprintf(link, sizeof link, "%s/zero_link", dir);
    CHECK(symlink("/dev/zero", link) == 0);
    /* the good checkpoint every corruption starts from, and proof that the data is valid */
    char args[1024];
    expand("train --device cpu --epochs 1 --batch-size 16 " SMALL " --checkpoint @/good.safetensors", args, sizeof args);
    int rc = run_ember(args, NULL);
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0);
    expand("eval @/good.safetensors --device cpu --data @/data", args, sizeof args);
    rc = run_ember(args, NULL);
    if (rc) fprintf(stderr, "%s\n", out);
    CHECK(rc == 0 && strstr(out, "test accuracy"));
}

static void test_options(void) {
    static const bad_case cases[] = {
        /* ember itself */
        {"", NULL, 2, "usage: ember <command>", 0},
        {"frobnicate", NULL, 2, "unknown command 'frobnicate'", 0},
        /* train: values */
        {"train --epochs -1", NULL, 2, "--epochs expects an integer from 0 to 1000000000, got '-1'", 0},
        {"train --epochs 99999999999999999999", NULL, 2, "got '99999999999999999999' (out of range)", 0},
        {"train --epochs 1x", NULL, 2, "got '1x' (not a number)", 0},
        {"train --epochs ''", NULL, 2, "got '' (empty)", 0},
        {"train --epochs ' 3'", NULL, 2, "(not a number)", 0},
        {"train --epochs 0x10", NULL, 2, "(not a number)", 0},
        {"train --batch-size 0", NULL, 2, "--batch-size expects an integer from 1 to 1073741824, got '0'", 0},
        {"train --batch-size 9999999999", NULL, 2, "--batch-size expects an integer from 1 to 1073741824", 0},
        {"train --threads 0", NULL, 2, "--threads expects an integer from 1 to 4096", 0},
        {"train --threads 100000", NULL, 2, "--threads expects an integer from 1 to 4096", 0},
        {"train --seed -5", NULL, 2, "--seed expects an integer >= 0, got '-5'", 0},
        {"train --seed 18446744073709551616", NULL, 2, "(out of range)", 0},
        {"train --max-steps 0", NULL, 2, "--max-steps expects an integer from 1 to", 0},
        {"train --train-samples -3", NULL, 2, "--train-samples expects an integer from 1 to", 0},
        {"train --test-samples abc", NULL, 2, "--test-samples expects an integer from 1 to", 0},
        {"train --lr abc", NULL, 2, "--lr expects a number >= 0 and <= 1e+06, got 'abc'", 0},
        /* convolution and pooling: the model's name */
        {"train --model resnet", NULL, 2, "--model expects mlp, cnn or gpt, got 'resnet'", 0},
        {"train --model", NULL, 2, "--model needs a value", 0},
        {"train --lr -0.1", NULL, 2, "--lr expects a number >= 0", 0},
        {"train --lr nan", NULL, 2, "got 'nan' (not a number)", 0},
        {"train --lr inf", NULL, 2, "got 'inf' (not a number)", 0},
        {"train --lr 1e999", NULL, 2, "got '1e999' (out of range)", 0},
        {"train --lr 0.1.2", NULL, 2, "(not a number)", 0},
        {"train --momentum 1.5", NULL, 2, "--momentum expects a number >= 0 and <= 1", 0},
        {"train --weight-decay -1", NULL, 2, "--weight-decay expects a number >= 0", 0},
        {"train --optimizer lamb", NULL, 2, "--optimizer expects adam, adamw or sgd, got 'lamb'", 0},
        {"train --optimizer ''", NULL, 2, "--optimizer expects adam, adamw or sgd, got ''", 0},
        /* train: form */
        {"train --bogus", NULL, 2, "unknown option '--bogus'", 0},
        {"train stray", NULL, 2, "unexpected argument 'stray'", 0},
        {"train --batch-size", NULL, 2, "--batch-size needs a value", 0},
        {"train --epochs 1 --epochs 2", NULL, 2, "--epochs is given twice", 0},
        {"train --lr 0.1 --lr 0.2", NULL, 2, "--lr is given twice", 0},
        {"train --resume --resume --checkpoint none", NULL, 2, "--resume is given twice", 0},
        {"train --device cpu --device cpu", NULL, 2, "--device is given twice", 0},
        {"train --checkpoint none --checkpoint none", NULL, 2, "--checkpoint is given twice", 0},
        {"train --resume --checkpoint none", NULL, 2, "--resume needs a --checkpoint file", 0},
        /* eval */
        {"eval --batch-size 0", NULL, 2, "--batch-size expects an integer from 1 to", 0},
        {"eval --threads -1", NULL, 2, "--threads expects an integer from 1 to 4096", 0},
        {"eval --test-samples 1e3", NULL, 2, "--test-samples expects an integer from 1 to", 0},
        {"eval a.safetensors b.safetensors", NULL, 2, "unexpected argument 'b.safetensors': one CHECKPOINT only", 0},
        {"eval --device cpu --device cpu", NULL, 2, "--device is given twice", 0},
        {"eval --bogus x", NULL, 2, "unknown option '--bogus'", 0},
        {"eval --data", NULL, 2, "option --data needs a value", 0},
        {"eval ''", NULL, 2, "the CHECKPOINT path is empty", 0},
        {"eval @/missing.safetensors --device cpu --data @/data", NULL, 1, "@/missing.safetensors: cannot open", 0},
        {"eval @ --device cpu --data @/data", NULL, 1, "is a directory, expected a file", 0},
        /* mem */
        {"mem", NULL, 2, "give a parameter count", 0},
        {"mem 7B --params 5B", NULL, 2, "the parameter count is given twice", 0},
        {"mem 7B 5B", NULL, 2, "unexpected argument '5B': one parameter count only", 0},
        {"mem 7B --model cnn", NULL, 2, "give either a parameter count or --model cnn, not both", 0},
        {"mem --model cnn --hidden 64", NULL, 2, "--hidden, --layers and --seq come from the CNN", 0},
        {"mem 7B --json --json", NULL, 2, "--json is given twice", 0},
        {"mem 7B --ranks 3", NULL, 2, "--ranks goes with --zero S", 0},
        {"mem 7B --zero 2", NULL, 2, "--zero needs --ranks N", 0},
        {"mem 7B --zero 4 --ranks 2", NULL, 2, "--zero expects an integer from 0 to 3, got '4'", 0},
        {"mem 7B --zero 1 --ranks 2 --optim sgd", NULL, 2, "--zero counts Adam's two states per parameter", 0},
        {"mem 7B --zero 1 --ranks 2 --mode lora", NULL, 2, "--zero estimates full fine-tuning: --mode lora does not apply", 0},
        {"mem --model cnn --zero 1 --ranks 2", NULL, 2, "--zero takes a parameter count or a Hugging Face model folder", 0},
        {"mem 7B --hidden 0", NULL, 2, "--hidden expects an integer from 1 to 1000000000, got '0'", 0},
        {"mem 7B --layers 2000000000", NULL, 2, "--layers expects an integer from 1 to 1000000000", 0},
        {"mem 7B --batch x --seq 2", NULL, 2, "--batch expects an integer from 1 to 1000000000, got 'x'", 0},
        {"mem 7B --lora-rank 5000", NULL, 2, "--lora-rank 5000 is larger than the model's hidden size", 0},
        {"mem 7B --lora-rank 100 --hidden 64 --layers 4", NULL, 2, "--lora-rank 100 is larger than the model's hidden size (64)", 0},
        {"mem 7B --lora-targets 1000", NULL, 2, "--lora-targets 1000:", 0},
        {"mem 1K --lora-rank 8 --mode lora", NULL, 2, "would hold more parameters than the model's 1000", 0},
        {"mem 7X", NULL, 2, "cannot read the parameter count '7X'", 0},
        {"mem 0", NULL, 2, "the parameter count must be at least 1", 0},
        {"mem 7B --dtype f8", NULL, 2, "--dtype expects f16, bf16 or f32, got 'f8'", 0},
        {"mem 7B --mode half", NULL, 2, "--mode expects all, inference, full or lora, got 'half'", 0},
        {"mem 7B --optim lion", NULL, 2, "lion", 0},
        {"mem 7B --act-bytes 0 --batch 1", NULL, 2, "--act-bytes expects a size above 0 bytes", 0},
        {"mem 7B --act-bytes 12QB --batch 1", NULL, 2, "--act-bytes: cannot read the size '12QB'", 0},
        {"mem 7B --act-bytes 1MB", NULL, 2, "--act-bytes needs --batch", 0},
        {"mem 7B --batch 2", NULL, 2, "activations need both --batch and --seq", 0},
        {"mem --model @/missing.safetensors", NULL, 1, "@/missing.safetensors: cannot open", 0},
        {"mem 7B --model @/good.safetensors", NULL, 2, "give either a parameter count or --model", 0},
        {"mem --model @/good.safetensors --hidden 5", NULL, 2, "come from the checkpoint with --model", 0},
        {"mem --model @/good.safetensors --lora-rank 1000", NULL, 2, "--lora-rank 1000 is larger than the model's widest Linear layer (784)", 0},
        {"mem --model @/good.safetensors --lora-rank 300", NULL, 2, "LoRA rank 300: the adapters (391800 parameters) would be larger than the model (203530 parameters)", 0},
        {"mem 7B --bogus x", NULL, 2, "unknown option '--bogus'", 0},
        {"mem 7B --hidden", NULL, 2, "option --hidden needs a value", 0},
        /* smi */
        {"smi --query-gpu=name", NULL, 2, "--query-gpu needs --format", 0},
        {"smi --query-gpu=nam --format=csv", NULL, 2, "Field \"nam\" is not a valid field", 0},
        {"smi --query-gpu= --format=csv", NULL, 2, "--query-gpu lists no fields", 0},
        {"smi --query-gpu=name --format=tsv", NULL, 2, "unknown --format option \"tsv\"", 0},
        {"smi --query-gpu=name --format=noheader", NULL, 2, "--format must include csv", 0},
        {"smi --query-gpu=name --query-gpu=index --format=csv", NULL, 2, "--query-gpu is given twice", 0},
        {"smi --query-gpu=name --format=csv --format=csv", NULL, 2, "--format is given twice", 0},
        {"smi --query-gpu", NULL, 2, "--query-gpu needs a value", 0},
        {"smi --bogus", NULL, 2, "unknown option '--bogus'", 0},
        /* bench */
        {"bench --sizes 0", NULL, 2, "bad size '0': expected a whole number from 1 to 32768", 0},
        {"bench --sizes 99999", NULL, 2, "expected a whole number from 1 to 32768", 0},
        {"bench --sizes 1,,2", NULL, 2, "bad size list", 0},
        {"bench --dtype f8", NULL, 2, "unknown dtype 'f8'", 0},
        {"bench --dtype i32", NULL, 2, "unknown dtype 'i32'", 0},
        {"bench --only everything", NULL, 2, "unknown section 'everything'", 0},
        {"bench --min-time 0", NULL, 2, "--min-time expects a number >= 0.001 and <= 60, got '0' (out of range)", 0},
        {"bench --min-time 61", NULL, 2, "--min-time expects a number >= 0.001 and <= 60, got '61'", 0},
        {"bench --json --json", NULL, 2, "--json is given twice", 0},
        {"bench --device cpu --device cpu", NULL, 2, "--device is given twice", 0},
        {"bench --device", NULL, 2, "option --device needs a value", 0},
        {"bench stray", NULL, 2, "unexpected argument 'stray'", 0},
    };
    RUN_CASES(cases);
    /* smi: a list longer than any fixed buffer is read whole; the last bad field is named whole */
    char args[8192] = "smi --format=csv,noheader --query-gpu=";
    for (int i = 0; i < 300; i++) strcat(args, "name,");
    strcat(args, "namx");
    const bad_case long_list[] = {{args, NULL, 2, "Field \"namx\" is not a valid field", 0}};
    RUN_CASES(long_list);
}

/* The rules one option parser (tools/ember/options.c) gives every command: each option once,
 * values read whole and in decimal, in range and not underflowing, no value taken from the
 * next option, nothing silently left unused; tests/test_tool_options.c probes every option of
 * every table the same way. */
static void test_option_rules(void) {
    static const bad_case cases[] = {
        {"--version x", NULL, 2, "--version takes no arguments, got 'x'", 0},
        {"--help x", NULL, 2, "--help takes no arguments, got 'x'", 0},
        {"help train extra", NULL, 2, "unexpected argument 'extra'", 0},
        {"devices --json --json", NULL, 2, "--json is given twice: give each option once", 0},
        {"devices --json=yes", NULL, 2, "--json takes no value, got '--json=yes'", 0},
        {"devices extra", NULL, 2, "unexpected argument 'extra'", 0},
        {"smi --format=csv", NULL, 2, "--format formats --query-gpu's output: it needs --query-gpu", 0},
        {"smi --format csv,noheader", NULL, 2, "it needs --query-gpu", 0},
        {"smi -L --query-gpu=name --format=csv", NULL, 2, "-L and --query-gpu cannot go together", 0},
        {"smi --list-gpus -L", NULL, 2, "-L is given twice (first as --list-gpus)", 0},
        {"smi --query-gpu=name --format", NULL, 2, "option --format needs a value", 0},
        {"train --lr 1e-400", NULL, 2, "--lr expects a number >= 0 and <= 1e+06, got '1e-400' (underflows to 0)", 0},
        {"train --momentum=1e-320", NULL, 2, "got '1e-320' (underflows: below the smallest normal double", 0},
        {"train --weight-decay 0x10", NULL, 2, "got '0x10' (not a number)", 0},
        {"train --lr 0x1p-3", NULL, 2, "got '0x1p-3' (not a number)", 0},
        {"train --seed 0x10", NULL, 2, "--seed expects an integer >= 0, got '0x10' (not a number)", 0},
        {"train --epochs 3e0", NULL, 2, "got '3e0' (not a number)", 0},
        {"train --epochs=5x", NULL, 2, "got '5x' (not a number)", 0},
        {"train --epoch 3", NULL, 2, "unknown option '--epoch' (did you mean --epochs?)", 0},
        {"train --checkpoint --resume", NULL, 2,
         "option --checkpoint needs a value (the next argument, '--resume', is an option)", 0},
        {"train --resume=yes", NULL, 2, "--resume takes no value", 0},
        {"train --amp=f32", NULL, 2, "--amp expects bf16 or f16, got 'f32'", 0},
        {"train --amp f16 --loss-scale 1e-50", NULL, 2, "got '1e-50' (underflows to 0 in float32", 0},
        {"train --model gpt --lr 1e-400", NULL, 2, "(underflows to 0)", 0},
        {"train --model gpt --epochs 1 --epochs=2", NULL, 2, "--epochs is given twice", 0},
        {"train --model gpt --contxt 8", NULL, 2, "unknown option '--contxt' (did you mean --context?)", 0},
        {"eval --threads 0x4", NULL, 2, "got '0x4' (not a number)", 0},
        {"eval --threads=4 --threads 4", NULL, 2, "--threads is given twice", 0},
        {"eval --test-sample 3", NULL, 2, "did you mean --test-samples?", 0},
        {"eval @/good.safetensors --text x --device cpu", NULL, 2, "--text goes with a GPT checkpoint", 0},
        {"mem 7B --act-bytes 0x10 --batch 1", NULL, 2, "--act-bytes: cannot read the size '0x10'", 0},
        {"mem 7B --act-bytes ' 5MB' --batch 1", NULL, 2, "--act-bytes: cannot read the size ' 5MB'", 0},
        {"mem 7B --act-bytes 1e-400GB --batch 1", NULL, 2, "got '1e-400GB' (underflows to 0)", 0},
        {"mem 0x10", NULL, 2, "cannot read the parameter count '0x10'", 0},
        {"mem ' 7B'", NULL, 2, "cannot read the parameter count ' 7B'", 0},
        {"mem 7B --lora-rank 0x8", NULL, 2, "got '0x8' (not a number)", 0},
        {"mem 7B --dtype bf16 --dtype=f16", NULL, 2, "--dtype is given twice", 0},
        {"mem 7B --master-weights --master-weights", NULL, 2, "--master-weights is given twice", 0},
        {"bench --min-time 1e-400", NULL, 2, "got '1e-400' (underflows to 0)", 0},
        {"bench --min-time 0x1", NULL, 2, "got '0x1' (not a number)", 0},
        {"bench --quick --quick", NULL, 2, "--quick is given twice", 0},
        {"bench --sizes 64 --sizes=128", NULL, 2, "--sizes is given twice", 0},
        {"bench --plot", NULL, 2, "option --plot needs a value", 0},
        {"launch -n 0x2 -- true", NULL, 2, "-n expects an integer from 1 to 1024, got '0x2' (not a number)", 0},
        {"launch -n 2 --grace 1e1 -- true", NULL, 2, "got '1e1' (not a number)", 0},
        {"launch -n 2 --mpi --mpi -- true", NULL, 2, "--mpi is given twice", 0},
        {"launch -n 2 --master-addr -- true", NULL, 2,
         "option --master-addr needs a value (the next argument, '--', is an option)", 0},
        {"launch -n 2 --master-port=99999 -- true", NULL, 2, "--master-port expects an integer from 1 to 65535", 0},
    };
    RUN_CASES(cases);
}

static void test_devices_and_environment(void) {
    static const bad_case cases[] = {
        /* device strings, for each command that takes one */
        {"train --device tpu:0 --checkpoint none", NULL, 2, "--device: invalid device string 'tpu:0'", 0},
        {"train --device cuda:99 --checkpoint none", NULL, 2, "--device: device cuda:99", 0},
        {"train --device opencl:99 --checkpoint none", NULL, 2, "opencl:99", 0},
        {"train --device cpu:1 --checkpoint none", NULL, 2, "the CPU is cpu or cpu:0", 0},
        {"train --device cuda:-1 --checkpoint none", NULL, 2, "invalid device string 'cuda:-1'", 0},
        {"train --device opencl:01 --checkpoint none", NULL, 2, "invalid device string 'opencl:01'", 0},
        {"train --device '' --checkpoint none", NULL, 2, "invalid device string ''", 0},
        {"train --device CPU --checkpoint none", NULL, 2, "invalid device string 'CPU'", 0},
        {"train --device cuda:99999999999 --checkpoint none", NULL, 2, "invalid device string", 0},
        {"eval --device tpu", NULL, 2, "--device: invalid device string 'tpu'", 0},
        {"eval --device cuda:99", NULL, 2, "cuda:99", 0},
        {"eval --device opencl:99", NULL, 2, "opencl:99", 0},
        {"bench --device tpu", NULL, 2, "unknown device 'tpu'", 0},
        {"bench --device cuda:99", NULL, 2, "cuda:99", 0},
        {"bench --device opencl:99", NULL, 2, "opencl:99", 0},
        /* EMBER_DEVICE is checked as --device is, wherever it decides */
        {"train --checkpoint none " SMALL, "EMBER_DEVICE=garbage", 2, "EMBER_DEVICE: invalid device string 'garbage'", 0},
        {"train --checkpoint none " SMALL, "EMBER_DEVICE=cuda:99", 2, "EMBER_DEVICE: device cuda:99", 0},
        {"train --checkpoint none " SMALL, "EMBER_DEVICE=opencl:99", 2, "EMBER_DEVICE: device opencl:99", 0},
        {"train --device auto --checkpoint none " SMALL, "EMBER_DEVICE=garbage", 2, "EMBER_DEVICE: invalid", 0},
        {"eval @/good.safetensors --data @/data", "EMBER_DEVICE=cuda:99", 2, "EMBER_DEVICE: device cuda:99", 0},
        {"eval @/good.safetensors --data @/data", "EMBER_DEVICE=garbage", 2, "EMBER_DEVICE: invalid device string", 0},
        {"bench --only launch --min-time 0.001", "EMBER_DEVICE=garbage", 2, "EMBER_DEVICE: unknown device 'garbage'", 0},
        {"bench --only launch --min-time 0.001", "EMBER_DEVICE=cuda:99", 2, "EMBER_DEVICE: ", 0},
        /* memory caps: another device's cap does not apply; bad ones are errors */
        {"train --device cpu --epochs 2 --checkpoint none --max-steps 1 " SMALL, "EMBER_MEMORY_CAP=cuda=100MiB", 0,
         "stopped (--max-steps)", 0},
        {"train --device cpu --epochs 2 --checkpoint none --max-steps 1 " SMALL, "EMBER_MEMORY_CAP=opencl:0=1MiB", 0,
         "stopped (--max-steps)", 0},
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_CAP=cpu=64KiB", 1, "Cap: 64.00 KiB", 0},
        /* a bad setting is a usage error found before any work, as a bad EMBER_DEVICE is */
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_CAP=cpu=12QB", 2,
         "ember train: EMBER_MEMORY_CAP: cannot read 'cpu=12QB'", 0},
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_CAP=cpu=1G,cpu=2G", 2,
         "EMBER_MEMORY_CAP: two entries give the cap of the same device", 0},
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_CAP=tpu=1G", 2,
         "EMBER_MEMORY_CAP: cannot read 'tpu=1G'", 0},
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_CAP=cpu=5MiB,,", 2,
         "EMBER_MEMORY_CAP: an empty entry in 'cpu=5MiB,,'", 0},
        {"train --device cpu --epochs 1 --checkpoint none " SMALL, "EMBER_MEMORY_POLICY=tensorflow", 2,
         "EMBER_MEMORY_POLICY: unknown policy 'tensorflow'", 0},
        {"eval @/good.safetensors --device cpu --data @/data", "EMBER_MEMORY_CAP=cpu=12QB", 2,
         "ember eval: EMBER_MEMORY_CAP: cannot read 'cpu=12QB'", 0},
        {"train --model gpt --device cpu --text tests/data/gpt_tiny.txt --checkpoint none", "EMBER_MEMORY_CAP=1G,2G", 2,
         "EMBER_MEMORY_CAP: two entries give the cap of the same device", 0},
        {"bench --device cpu --only matmul --sizes 512 --dtype f32 --min-time 0.001", "EMBER_MEMORY_CAP=cpu=1MiB", 1,
         "1 measurement failed", 0},
        {"bench --device opencl:0 --only matmul --sizes 16 --dtype f32 --min-time 0.001", "EMBER_OPENCL_GEMM=bogus", 1,
         "EMBER_OPENCL_GEMM='bogus' is not understood", NEED_OPENCL},
        {"train --device opencl:0 --epochs 1 --checkpoint none " SMALL, "EMBER_OPENCL_GEMM=fast", 1,
         "EMBER_OPENCL_GEMM='fast' is not understood", NEED_OPENCL},
        {"train --device cpu --epochs 1 --checkpoint none --train-samples 64 --test-samples 32", "EMBER_DATA_DIR=@/none",
         1, "not found in @/none", 0},
    };
    RUN_CASES(cases);
}

static void test_output_paths_fail_before_training(void) {
    /* each is refused before the data is read: the command takes well under a second */
    char long_name[300], long_path[5000], args[6000];
    memset(long_name, 'n', 256);
    long_name[256] = '\0';
    snprintf(long_path, sizeof long_path, "%s/", dir);
    while (strlen(long_path) < 4200) strcat(long_path, "d/");
    strcat(long_path, "x.safetensors");
    static const bad_case fixed[] = {
        {"train --checkpoint @/missing/x.safetensors " SMALL, NULL, 2, "the folder '@/missing' does not exist", 0},
        {"train --checkpoint @ " SMALL, NULL, 2, "is a folder: expected a regular file", 0},
        {"train --checkpoint @/ " SMALL, NULL, 2, "names a folder: expected a file path", 0},
        {"train --checkpoint @/. " SMALL, NULL, 2, "names a folder", 0},
        {"train --checkpoint '' " SMALL, NULL, 2, "--checkpoint is empty", 0},
        /* a link to a device, never the device itself: a binary that failed to refuse it would
         * rename its checkpoint over the link, where over /dev/null (as root) it would
         * replace the machine's /dev/null */
        {"train --checkpoint @/zero_link " SMALL, NULL, 2, "is not a regular file", 0},
        {"train --checkpoint @/data/train-images-idx3-ubyte/x " SMALL, NULL, 2, "is not a folder", 0},
        {"train --checkpoint /proc/ember-test.safetensors " SMALL, NULL, 2, "cannot create a file in the folder '/proc'", 0},
        {"train --resume --checkpoint @/missing.safetensors " SMALL, NULL, 2,
         "--resume: cannot read the checkpoint '@/missing.safetensors': No such file or directory", 0},
        /* --logdir, checked as --checkpoint is (a missing folder is made, with its parents) */
        {"train --logdir '' " SMALL, NULL, 2, "--logdir is empty: expected a folder", 0},
        {"train --logdir @/good.safetensors " SMALL, NULL, 2, "'@/good.safetensors' is a file, not a folder", 0},
        {"train --logdir @/good.safetensors/logs/x " SMALL, NULL, 2, "--logdir '@/good.safetensors/logs/x': '@/good.safetensors' is a file", 0},
        {"train --logdir @/zero_link " SMALL, NULL, 2, "is a device or another special file, not a folder", 0},
        {"train --logdir /proc/ember-test-logs/a " SMALL, NULL, 2, "cannot create a file in the folder '/proc'", 0},
    };
    RUN_CASES(fixed);
    snprintf(args, sizeof args, "train --checkpoint @/%s " SMALL, long_name);
    char args2[6000];
    snprintf(args2, sizeof args2, "train --checkpoint %s " SMALL, long_path);
    const bad_case made[] = {
        {args, NULL, 2, "the file name is 256 bytes long: the limit is 255 bytes (NAME_MAX)", 0},
        {args2, NULL, 2, "bytes long: the limit is 4095 bytes (PATH_MAX)", 0},
    };
    RUN_CASES(made);
    /* a name of exactly 255 bytes trains and saves */
    long_name[255] = '\0';
    snprintf(args, sizeof args, "train --device cpu --epochs 2 --max-steps 1 --checkpoint @/%s " SMALL, long_name);
    char exp[6000];
    expand(args, exp, sizeof exp);
    CHECK(run_ember(exp, NULL) == 0 && strstr(out, "checkpoint saved to"));
}

static void test_corrupt_checkpoints(void) {
    size_t n;
    char good[256];
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    unsigned char *b = read_file(good, &n);
    CHECK(b != NULL);
    free(b);
    uint64_t hl = 0;
    {
        unsigned char *g = read_file(good, &n);
        for (int k = 7; k >= 0; k--) hl = hl << 8 | g[k];
        free(g);
    }
    /* cut at many places, and with bytes after the end */
    size_t cuts[] = {0, 1, 7, 8, 9, 16, 8 + (size_t)hl / 2, 8 + (size_t)hl - 1, 8 + (size_t)hl, 8 + (size_t)hl + 1,
                     n / 2, n - 4, n - 1};
    char name[64];
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(name, sizeof name, "cut%zu.safetensors", i);
        cut_checkpoint(name, cuts[i], 0, 0);
    }
    cut_checkpoint("trail1.safetensors", n, 1, 0);
    cut_checkpoint("trail4k.safetensors", n, 4096, 0xab);
    {   /* two files end to end */
        unsigned char *g = read_file(good, &n);
        unsigned char *two = malloc(2 * n);
        memcpy(two, g, n);
        memcpy(two + n, g, n);
        char p[256];
        snprintf(p, sizeof p, "%s/twice.safetensors", dir);
        CHECK(write_file(p, two, 2 * n));
        free(two);
        free(g);
    }
    /* header edits: each makes exactly one thing wrong */
    edit_header("dtype.safetensors", "\"F32\"", "\"F16\"");
    edit_header("dtype2.safetensors", "\"F32\"", "\"Q4\"");
    edit_header("dtype3.safetensors", "\"F32\"", "32");
    edit_header("shape.safetensors", "[256,784]", "[256,785]");
    edit_header("shape2.safetensors", "[256,784]", "[256,-784]");
    edit_header("shape3.safetensors", "[256,784]", "[256,784,1,1,1,1,1,1,1]");
    edit_header("shape4.safetensors", "[256,784]", "[99999999999999999999,784]");
    edit_header("offsets.safetensors", "\"data_offsets\":[0,", "\"data_offsets\":[4,");
    edit_header("offsets2.safetensors", "\"data_offsets\":[", "\"data_offsets\":[-1,");
    edit_header("offsets3.safetensors", "\"data_offsets\":[", "\"data_offsets\":[1e3,");
    edit_header("json.safetensors", "{", "{{");
    edit_header("json2.safetensors", "\"dtype\"", "\"dtype");
    edit_header("json3.safetensors", "\"__metadata__\":{", "\"__metadata__\":{\"k\":1,");
    edit_header("json4.safetensors", "\"__metadata__\":{", "\"__metadata__\":[");
    edit_header("dup.safetensors", "\"__metadata__\":{", "\"__metadata__\":{\"format\":\"x\",");
    edit_header("format.safetensors", "ember.checkpoint.v1", "ember.checkpoint.v0");
    edit_header("noopt.safetensors", "\"optimizer\":", "\"optimiser\":");
    edit_header("name.safetensors", "\"0.weight\"", "\"0.wieght\"");
    static const char *files[] = {"cut0", "cut1", "cut2", "cut3", "cut4", "cut5", "cut6", "cut7", "cut8", "cut9",
                                  "cut10", "cut11", "cut12", "trail1", "trail4k", "twice", "dtype", "dtype2",
                                  "dtype3", "shape", "shape2", "shape3", "shape4", "offsets", "offsets2",
                                  "offsets3", "json", "json2", "json3", "json4", "dup"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a1[512], a2[512], a3[512], m[256];
        snprintf(a1, sizeof a1, "eval @/%s.safetensors --device cpu --data @/data", files[i]);
        snprintf(a2, sizeof a2, "mem --model @/%s.safetensors", files[i]);
        snprintf(a3, sizeof a3, "train --device cpu --resume --checkpoint @/%s.safetensors " SMALL, files[i]);
        snprintf(m, sizeof m, "@/%s.safetensors", files[i]);
        const bad_case cases[] = {{a1, NULL, 1, m, 0}, {a2, NULL, 1, m, 0}, {a3, NULL, 1, "cannot resume", 0}};
        RUN_CASES(cases);
    }
    {   /* a state dict without a floating-point tensor: no parameters, and ember mem says what it found */
        char p[256];
        snprintf(p, sizeof p, "%s/ints.safetensors", dir);
        em_scope s = em_scope_begin();
        em_tensor *t[2] = {em_arange(0, 6, 1, EM_OPTS(.dtype = EM_I64)), em_zeros(EM_SHAPE(3), EM_OPTS(.dtype = EM_I32))};
        CHECK(em_safetensors_save(p, (const char *[]){"steps", "index"}, t, 2) == EM_OK);
        em_scope_end(s);
    }
    /* checkpoints that are fine as files but not as `ember train` checkpoints */
    static const bad_case cases[] = {
        {"mem --model @/ints.safetensors", NULL, 1, "no parameters to count: the file's 2 tensors are all integer or "
                                                    "bool ('index' is int32); parameters are float32, float16 or bfloat16", 0},
        {"train --device cpu --resume --checkpoint @/format.safetensors " SMALL, NULL, 1, "is not an Ember checkpoint", 0},
        {"train --device cpu --resume --checkpoint @/name.safetensors " SMALL, NULL, 1, "cannot resume", 0},
        {"eval @/name.safetensors --device cpu --data @/data", NULL, 1, "cannot load @/name.safetensors", 0},
        {"train --device cpu --resume --checkpoint @/noopt.safetensors " SMALL, NULL, 1, "holds no optimizer state", 0},
        {"train --device cpu --optimizer sgd --resume --checkpoint @/good.safetensors " SMALL, NULL, 1,
         "holds adam state, but the optimizer is sgd", 0},
        /* devices and links with nothing to read, or no end */
        {"eval /dev/zero --device cpu --data @/data", NULL, 1, "/dev/zero: bad safetensors header at byte 8: expected '{'", 0},
        {"eval /dev/urandom --device cpu --data @/data", NULL, 1, "/dev/urandom: header length", 0},
        {"eval /dev/null --device cpu --data @/data", NULL, 1, "truncated at byte 0: expected an 8-byte header length", 0},
        {"mem --model /dev/zero", NULL, 1, "/dev/zero: bad safetensors header", 0},
        {"mem --model /dev/urandom", NULL, 1, "/dev/urandom: header length", 0},
        {"train --device cpu --resume --checkpoint @/zero_link " SMALL, NULL, 2, "is not a regular file", 0},
        {"eval /proc/self/status --device cpu --data @/data", NULL, 1, "/proc/self/status", 0},
    };
    RUN_CASES(cases);
}

/* The good checkpoint with train.KEY's value replaced. */
static void forge(const char *name, const char *key, const char *value) {
    char from[160], to[160];
    char src[256];
    snprintf(src, sizeof src, "%s/good.safetensors", dir);
    size_t n;
    unsigned char *b = read_file(src, &n);
    /* the value written: find "key":"...", replace the whole pair */
    char pattern[80];
    snprintf(pattern, sizeof pattern, "\"%s\":\"", key);
    char *hit = n > 8 ? strstr((char *)b + 8, pattern) : NULL;   /* the header: after the length */
    CHECK(hit != NULL);
    const char *val = hit ? hit + strlen(pattern) : "";
    const char *v = hit ? strchr(val, '"') : NULL;   /* the value's closing quote */
    size_t old_len = v ? (size_t)(v - val) : 0;
    snprintf(from, sizeof from, "%s%.*s\"", pattern, (int)old_len, val);
    snprintf(to, sizeof to, "%s%s\"", pattern, value);
    free(b);
    edit_header(name, from, to);
}

static void test_forged_metadata(void) {
    static const struct { const char *key, *value, *msg; int rc; } forged[] = {
        {"train.epoch", "99999999999999999999", "'train.epoch' = '99999999999999999999' (out of range)", 1},
        {"train.epoch", "-1", "'train.epoch' = '-1' (out of range)", 1},
        {"train.epoch", "1x", "'train.epoch' = '1x' (not a number)", 1},
        {"train.epoch", "", "'train.epoch' = '' (empty)", 1},
        {"train.batch", "9223372036854775807", "'train.batch' = '9223372036854775807' (out of range)", 1},
        {"train.batch", "0x10", "(not a number)", 1},
        {"train.seed", "-3", "'train.seed' = '-3' (out of range)", 1},
        {"train.batch_size", "0", "'train.batch_size' = '0' (out of range)", 1},
        {"train.batch_size", "99999999999", "'train.batch_size' = '99999999999' (out of range)", 1},
        {"train.loss_sum", "nan", "'train.loss_sum' = 'nan' (not a number)", 1},
        {"train.loss_sum", "1e999", "'train.loss_sum' = '1e999' (out of range)", 1},
        {"train.loss_sum", "-1", "(out of range)", 1},
        {"train.steps", "-1", "'train.steps' = '-1' (out of range)", 1},
        {"optimizer.steps", "99999999999999999999", "bad or missing 'optimizer.steps' / 'optimizer.lr'", 1},
        {"optimizer.steps", "-1", "bad or missing 'optimizer.steps'", 1},
        {"optimizer.lr", "1e999", "bad or missing 'optimizer.steps' / 'optimizer.lr'", 1},
        {"optimizer.lr", "inf", "bad or missing", 1},
        {"optimizer.lr", "0.001 ", "bad or missing", 1},
        {"optimizer.0.weight.step", "18446744073709551616", "missing or bad metadata 'optimizer.0.weight.step'", 1},
        /* counts that fit but leave no room to count the next step on */
        {"optimizer.steps", "9223372036854775807", "bad or missing 'optimizer.steps'", 1},
        {"optimizer.0.weight.step", "9223372036854775807", "missing or bad metadata 'optimizer.0.weight.step'", 1},
    };
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        char name[64], args[512];
        snprintf(name, sizeof name, "forged%zu.safetensors", i);
        forge(name, forged[i].key, forged[i].value);
        snprintf(args, sizeof args, "train --device cpu --resume --checkpoint @/%s " SMALL, name);
        const bad_case c[] = {{args, NULL, forged[i].rc, forged[i].msg, 0}};
        RUN_CASES(c);
    }
    forge("forged_model.safetensors", "model", "resnet");
    /* a CNN's and a GPT's checkpoints: --resume takes the model from the checkpoint */
    char args[1024];
    expand("train --model cnn --device cpu --epochs 1 --batch-size 32 " SMALL " --checkpoint @/cnn.safetensors", args,
           sizeof args);
    CHECK(run_ember(args, NULL) == 0);
    expand("train --model gpt --device cpu --text tests/data/gpt_tiny.txt --context 8 --d-model 16 --layers 1 "
           "--heads 2 --epochs 1 --steps-per-epoch 1 --sample-chars 0 --threads 1 --checkpoint @/gpt.safetensors",
           args, sizeof args);
    CHECK(run_ember(args, NULL) == 0);
    /* resuming with a seed, batch size or training split unlike the checkpoint's would change
     * the batch order; another model cannot take the checkpoint's weights */
    static const bad_case cases[] = {
        {"train --device cpu --resume --seed 5 --checkpoint @/good.safetensors " SMALL, NULL, 2,
         "--resume: --seed 5 is unlike the checkpoint's 0", 0},
        {"train --device cpu --resume --batch-size 8 --checkpoint @/good.safetensors " SMALL, NULL, 2,
         "--resume: --batch-size 8 is unlike the checkpoint's 16", 0},
        {"train --device cpu --resume --checkpoint @/good.safetensors --data @/data --train-samples 32", NULL, 2,
         "--resume: this run trains on 32 samples, the checkpoint's run on 64; a resumed run keeps the batch order it "
         "started with (give --train-samples 64)", 0},
        {"train --device cpu --resume --model cnn --checkpoint @/good.safetensors " SMALL, NULL, 2,
         "--resume: --model cnn is unlike the checkpoint's model, mlp (@/good.safetensors)", 0},
        {"train --device cpu --resume --model mlp --checkpoint @/cnn.safetensors " SMALL, NULL, 2,
         "--model mlp is unlike the checkpoint's model, cnn", 0},
        {"train --device cpu --resume --checkpoint @/gpt.safetensors " SMALL, NULL, 2,
         "--resume: @/gpt.safetensors is a GPT's checkpoint (ember train --model gpt), which --resume cannot continue",
         0},
        {"train --device cpu --resume --checkpoint @/forged_model.safetensors " SMALL, NULL, 1,
         "cannot resume: @/forged_model.safetensors: metadata 'model' = 'resnet': expected mlp or cnn", 0},
        /* not an error: a CNN's checkpoint resumes as the CNN, --model left out */
        {"train --device cpu --resume --epochs 2 --batch-size 32 --checkpoint @/cnn.safetensors " SMALL, NULL, 0,
         "training CNN: Conv2d", 0},
    };
    RUN_CASES(cases);
}

static void test_corrupt_data_directories(void) {
    size_t len;
    unsigned char *img = idx_bytes(32, 28, 28, &len), *bad = malloc(len + 64);
    struct { const char *name; int k; size_t cut; int poke_at; int poke; const char *link; const char *msg; } dirs[] = {
        {"d_trunc_hdr", 2, 6, -1, 0, NULL, "truncated at byte 6"},
        {"d_trunc_data", 2, 1000, -1, 0, NULL, "truncated at byte 1000"},
        {"d_empty", 2, 0, -1, 0, NULL, "truncated at byte 0"},
        {"d_magic", 2, 0, 0, 0x1f, NULL, "not an IDX file"},
        {"d_type", 2, 0, 2, 0x07, NULL, "bad IDX element type 0x07"},
        {"d_ndim", 2, 0, 3, 9, NULL, "IDX file has 9 dimensions"},
        {"d_dims", 2, 0, 4, 0xff, NULL, "IDX dimensions at bytes 4-15 describe more than"},
        {"d_rows", 2, 0, 11, 27, NULL, "unexpected data"},
        {"d_zero_link", 2, 0, -1, 0, "/dev/zero", "bad IDX element type 0x00"},
        {"d_random_link", 2, 0, -1, 0, "/dev/urandom", "not an IDX file"},
        {"d_null_link", 2, 0, -1, 0, "/dev/null", "truncated at byte 0"},
        {"d_dir", 2, 0, -1, 0, "/tmp", "is a directory, expected a file"},
        {"d_labels_zero", 3, 0, -1, 0, "/dev/zero", "bad IDX element type 0x00"},
        {"d_labels_trunc", 3, 5, -1, 0, NULL, "truncated at byte 5"},
        {"d_dangling", 2, 0, -1, 0, "/nonexistent/file", "not found in"},
    };
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        const unsigned char *src = img;
        size_t n = len;
        unsigned char *lbl = NULL;
        if (dirs[i].k == 3) {
            lbl = idx_bytes(32, 0, 0, &n);
            src = lbl;
        }
        memcpy(bad, src, n);
        if (dirs[i].cut || !strcmp(dirs[i].name, "d_empty")) n = dirs[i].cut;
        if (dirs[i].poke_at >= 0) bad[dirs[i].poke_at] = (unsigned char)dirs[i].poke;
        corrupt_data_dir(dirs[i].name, dirs[i].k, bad, n, dirs[i].link);
        free(lbl);
        char a1[512], a2[512];
        snprintf(a1, sizeof a1, "eval @/good.safetensors --device cpu --data @/%s", dirs[i].name);
        snprintf(a2, sizeof a2, "train --device cpu --epochs 1 --checkpoint none --data @/%s", dirs[i].name);
        const bad_case cases[] = {{a1, NULL, 1, dirs[i].msg, 0}, {a2, NULL, 1, dirs[i].msg, 0}};
        RUN_CASES(cases);
    }
    /* a trailing byte, images and labels that disagree, splits without samples, small images */
    memcpy(bad, img, len);
    bad[len] = 0;
    corrupt_data_dir("d_trailing", 2, bad, len + 1, NULL);
    unsigned char *lbl33 = idx_bytes(33, 0, 0, &len);
    corrupt_data_dir("d_count", 3, lbl33, len, NULL);
    free(lbl33);
    size_t none_len, none_l_len;
    unsigned char *none = idx_bytes(0, 28, 28, &none_len), *none_l = idx_bytes(0, 0, 0, &none_l_len);
    corrupt_data_dir("d_no_test", 2, none, none_len, NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/d_no_test/t10k-labels-idx1-ubyte", dir);
    CHECK(write_file(p, none_l, none_l_len));
    make_data_dir("d_no_train");
    snprintf(p, sizeof p, "%s/d_no_train/train-images-idx3-ubyte", dir);
    CHECK(write_file(p, none, none_len));
    snprintf(p, sizeof p, "%s/d_no_train/train-labels-idx1-ubyte", dir);
    CHECK(write_file(p, none_l, none_l_len));
    free(none);
    free(none_l);
    unsigned char *small = idx_bytes(32, 27, 27, &len);
    corrupt_data_dir("d_27x27", 2, small, len, NULL);
    free(small);
    /* labels outside the classes 0-9: found when the split is loaded, before any training,
     * naming the file, the sample and the value (u8 files, and int32 files for -1 and 2^31-1) */
    static const struct { const char *name; int k; unsigned char type; int64_t value; } labels[] = {
        {"d_label200_test", 3, 0x08, 200}, {"d_label200_train", 1, 0x08, 200},
        {"d_label_neg_test", 3, 0x0C, -1}, {"d_label_max_train", 1, 0x0C, 2147483647},
    };
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++) {
        int n = labels[i].k == 1 ? 64 : 32, width = labels[i].type == 0x0C ? 4 : 1;
        unsigned char *l = calloc(8 + (size_t)n * 4, 1);
        l[2] = labels[i].type;
        l[3] = 1;
        put_be32(l + 4, (uint32_t)n);
        for (int j = 0; j < n; j++) {
            uint32_t v = j == 5 ? (uint32_t)labels[i].value : (uint32_t)(j % 10);
            if (width == 4) put_be32(l + 8 + 4 * j, v);
            else l[8 + j] = (unsigned char)v;
        }
        corrupt_data_dir(labels[i].name, labels[i].k, l, 8 + (size_t)n * (size_t)width, NULL);
        free(l);
        char a1[512], a2[512], m[256];
        snprintf(a1, sizeof a1, "train --device cpu --epochs 1 --checkpoint none --data @/%s", labels[i].name);
        snprintf(a2, sizeof a2, "eval @/good.safetensors --device cpu --data @/%s", labels[i].name);
        snprintf(m, sizeof m, "%s: the label of sample 5 is %lld: Fashion-MNIST's classes are 0 to 9",
                 idx_names[labels[i].k], (long long)labels[i].value);
        /* eval reads the test split only: a bad training label is none of its business */
        const bad_case c[] = {{a1, NULL, 1, m, 0}, {a2, NULL, labels[i].k == 3 ? 1 : 0,
                                                   labels[i].k == 3 ? m : "test accuracy", 0}};
        RUN_CASES(c);
    }
    static const bad_case cases[] = {
        {"eval @/good.safetensors --device cpu --data @/d_trailing", NULL, 1, "unexpected data at byte", 0},
        {"eval @/good.safetensors --device cpu --data @/d_count", NULL, 1, "33", 0},
        {"eval @/good.safetensors --device cpu --data @/d_no_test", NULL, 1, "the Fashion-MNIST test split holds no samples", 0},
        {"train --device cpu --epochs 1 --checkpoint none --data @/d_no_train", NULL, 1,
         "the Fashion-MNIST training split holds no samples", 0},
        {"eval @/good.safetensors --device cpu --data @/d_27x27", NULL, 1,
         "t10k-images-idx3-ubyte: expected 28x28 Fashion-MNIST images, found 27x27", 0},
        {"eval @/good.safetensors --device cpu --data @/data --test-samples 33", NULL, 1,
         "--test-samples 33: the Fashion-MNIST test split has only 32 samples", 0},
        {"train --device cpu --epochs 1 --checkpoint none --data @/data --train-samples 65", NULL, 1,
         "--train-samples 65: the Fashion-MNIST training split has only 64 samples", 0},
        {"eval @/good.safetensors --device cpu --data @/missing", NULL, 1, "not found in @/missing", 0},
        {"eval @/good.safetensors --device cpu --data @/good.safetensors", NULL, 1, "not found in", 0},
    };
    RUN_CASES(cases);
    free(img);
    free(bad);
}

static void test_long_data_path_is_found(void) {
    /* a --data path past the old 1023-byte buffers: found (it used to be "not found") */
    char deep[2048];
    snprintf(deep, sizeof deep, "%s", dir);
    while (strlen(deep) < 1100) {
        strcat(deep, "/dddddddddddddddddddddddddddddddddddddddddddddddd");
        mkdir(deep, 0700);
    }
    for (int k = 0; k < 4; k++) {
        char link[2300], target[512];
        snprintf(link, sizeof link, "%s/%s", deep, idx_names[k]);
        snprintf(target, sizeof target, "%s/data/%s", dir, idx_names[k]);
        CHECK(symlink(target, link) == 0);
    }
    char args[2600];
    snprintf(args, sizeof args, "eval %s/good.safetensors --device cpu --data %s", dir, deep);
    int rc = run_ember(args, NULL);
    if (rc) fprintf(stderr, "%.500s\n", out);
    CHECK(rc == 0 && strstr(out, "test accuracy"));
}

int main(void) {
    (void)tool_run;   /* run_ember, with a time limit and an environment, is used instead */
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_bad_inputs_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    have_opencl = em_device_available(EM_OPENCL) && em_device_count(EM_OPENCL) > 0;
    em_clear_error();
/* RUN, then how many bad inputs the group tried */
#define RUN_GROUP(fn)                                            \
    do {                                                         \
        int before = tried;                                      \
        RUN(fn);                                                 \
        printf("     %d bad inputs\n", tried - before);           \
    } while (0)
    RUN(test_setup_trains_on_the_small_data);
    RUN_GROUP(test_options);
    RUN_GROUP(test_option_rules);
    RUN_GROUP(test_devices_and_environment);
    RUN_GROUP(test_output_paths_fail_before_training);
    RUN_GROUP(test_corrupt_checkpoints);
    RUN_GROUP(test_forged_metadata);
    RUN_GROUP(test_corrupt_data_directories);
    RUN(test_long_data_path_is_found);
    printf("bad inputs: %d tried, %d gave a clean error (the expected status and message, no signal, no "
           "sanitizer report)\n", tried, clean);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
