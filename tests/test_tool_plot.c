/* `ember bench --plot` and `ember train --plot` end to end: each picture is rendered as PNG
 * and as SVG by the built command, then tests/plot_check.py decodes it (PNG: signature,
 * CRCs, IHDR size, the image data inflated and unfiltered; SVG: XML with the expected
 * width and height) and looks for every series' fixed colour (plot.h) among the pixels or
 * the strokes, and for the absence of the series that must not be there. Bad paths (a
 * missing folder, an unknown extension, a folder) fail before any work with exit 2, a
 * clear message and no file left behind. */
#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include "test.h"
#include "tool_run.h"
#include "../tools/ember/plot.h"

#define OUT_SIZE 65536
static char out[OUT_SIZE];
static char dir[64];
static bool have_python, have_data;

static void path_in(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/%s", dir, name); }

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Files in dir whose name starts with prefix (the temporary files the writer makes). */
static int files_starting(const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* Runs the checker on path: the size, then the colours that must be there and must not. */
static bool picture_ok(const char *path, int w, int h, const char *present, const char *absent) {
    char cmd[1024], buf[4096];
    snprintf(cmd, sizeof cmd, "python3 tests/plot_check.py '%s' %d %d --present %s --absent %s 2>&1", path, w, h,
             present, absent[0] ? absent : ",");
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    printf("  %s", buf);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* "rrggbb" of a plot.h colour. */
static const char *hex(uint32_t rgb, char buf[7]) {
    snprintf(buf, 7, "%06x", (unsigned)(rgb & 0xffffff));
    return buf;
}

/* a,b,c of up to 8 colours (0 ends the list) */
static const char *list(char *buf, size_t size, ...) {
    va_list ap;
    va_start(ap, size);
    buf[0] = '\0';
    char h[7];
    for (int k = 0; k < 8; k++) {
        uint32_t c = va_arg(ap, uint32_t);
        if (!c) break;
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%s%s", len ? "," : "", hex(c, h));
    }
    va_end(ap);
    return buf;
}

#define BENCH_FAST "bench --quick --min-time 0.002 --only matmul,crossover --sizes 32,64 --dtype f32,bf16"

static void test_bench_plot_opencl(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    char present[128], absent[64];
    list(present, sizeof present, PLOT_RGB_CPU, PLOT_RGB_DEVICE, PLOT_RGB_DEVICE_COPIES, PLOT_RGB_F32, PLOT_RGB_BF16, 0);
    list(absent, sizeof absent, PLOT_RGB_F16, PLOT_RGB_F64, 0);   /* dtypes not asked for */
    static const char *const ext[] = {"png", "svg"};
    for (int i = 0; i < 2; i++) {
        char file[128], args[512];
        snprintf(file, sizeof file, "%s/bench.%s", dir, ext[i]);
        snprintf(args, sizeof args, BENCH_FAST " --device opencl:0 --plot %s", file);
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "%s\n", out);
        CHECK(strstr(out, "crossover: cpu vs opencl:0") != NULL);   /* the report as without --plot */
        CHECK(picture_ok(file, PLOT_BENCH_W, PLOT_FIG_H, present, absent));
    }
    CHECK(files_starting(".ember-plot") == 0);   /* no temporary file left */
}

/* On the CPU there is no crossover: the picture has the matmul panel only, no fake series. */
static void test_bench_plot_cpu_has_no_crossover(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    char present[64], absent[64], file[128], args[512];
    list(present, sizeof present, PLOT_RGB_F32, PLOT_RGB_BF16, 0);
    list(absent, sizeof absent, PLOT_RGB_CPU, PLOT_RGB_DEVICE, PLOT_RGB_DEVICE_COPIES, PLOT_RGB_F16, 0);
    static const char *const ext[] = {"png", "svg"};
    for (int i = 0; i < 2; i++) {
        snprintf(file, sizeof file, "%s/bench-cpu.%s", dir, ext[i]);
        snprintf(args, sizeof args, BENCH_FAST " --device cpu --plot %s", file);
        CHECK(tool_run(args, out, sizeof out) == 0);
        CHECK(strstr(out, "crossover: cpu vs cpu, f32, median time per op: skipped") != NULL);
        CHECK(picture_ok(file, PLOT_BENCH_W, PLOT_FIG_H, present, absent));
    }
}

#define TRAIN_FAST "train --device cpu --train-samples 640 --test-samples 200 --threads 1 --checkpoint none --log-every 2"

static void test_train_plot_mlp_and_cnn(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char present[128], absent[64];
    list(present, sizeof present, PLOT_RGB_STEP_LOSS, PLOT_RGB_TRAIN_LOSS, PLOT_RGB_TEST_LOSS, PLOT_RGB_ACCURACY, 0);
    list(absent, sizeof absent, PLOT_RGB_VAL_LOSS, 0);
    static const char *const cases[][2] = {{"mlp", "png"}, {"mlp", "svg"}, {"cnn", "png"}};
    for (int i = 0; i < 3; i++) {
        char file[128], args[512];
        snprintf(file, sizeof file, "%s/train-%s.%s", dir, cases[i][0], cases[i][1]);
        snprintf(args, sizeof args, TRAIN_FAST " --model %s --epochs 2 --plot %s", cases[i][0], file);
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "%s\n", out);
        CHECK(strstr(out, "plot: ") && strstr(out, file));
        CHECK(picture_ok(file, PLOT_TRAIN_W, PLOT_FIG_H, present, absent));
    }
    CHECK(files_starting(".ember-plot") == 0);
}

/* A run stopped mid-way (--max-steps in epoch 2) still leaves epoch 1's picture. */
static void test_train_plot_written_every_epoch(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    if (!have_data) SKIP("Fashion-MNIST is not installed (a failure: see main)");
    char file[128], args[512], present[64], absent[32];
    path_in(file, sizeof file, "stopped.png");
    /* 640 samples, batch 64: 10 steps an epoch; stop at step 15 */
    snprintf(args, sizeof args, TRAIN_FAST " --epochs 5 --max-steps 15 --plot %s", file);
    CHECK(tool_run(args, out, sizeof out) == 0);
    CHECK(strstr(out, "stopped (--max-steps) at epoch 2") != NULL);
    list(present, sizeof present, PLOT_RGB_STEP_LOSS, PLOT_RGB_ACCURACY, 0);
    list(absent, sizeof absent, PLOT_RGB_VAL_LOSS, 0);
    CHECK(picture_ok(file, PLOT_TRAIN_W, PLOT_FIG_H, present, absent));
}

static void test_train_plot_gpt(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    char present[64], absent[64];
    list(present, sizeof present, PLOT_RGB_STEP_LOSS, PLOT_RGB_TRAIN_LOSS, PLOT_RGB_VAL_LOSS, 0);
    list(absent, sizeof absent, PLOT_RGB_TEST_LOSS, PLOT_RGB_ACCURACY, 0);   /* no accuracy for a language model */
    static const char *const ext[] = {"png", "svg"};
    for (int i = 0; i < 2; i++) {
        char file[128], args[768];
        snprintf(file, sizeof file, "%s/gpt.%s", dir, ext[i]);
        snprintf(args, sizeof args,
                 "train --model gpt --device cpu --text tests/data/gpt_tiny.txt --epochs 2 --steps-per-epoch 20 "
                 "--context 16 --d-model 32 --heads 2 --layers 1 --batch-size 8 --sample-chars 0 --threads 1 "
                 "--checkpoint none --plot %s", file);
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "%s\n", out);
        CHECK(picture_ok(file, PLOT_GPT_W, PLOT_FIG_H, present, absent));
    }
}

/* Bad paths: exit 2 before any work, a message naming the problem, nothing written. */
static void test_bad_plot_paths(void) {
    char args[768], missing[128], jpg[128];
    path_in(missing, sizeof missing, "no-such-folder/p.png");
    path_in(jpg, sizeof jpg, "p.jpg");
    static const char *const cmds[] = {"bench --device cpu --quick --only launch", TRAIN_FAST " --epochs 1",
                                       "train --model gpt --device cpu --text tests/data/gpt_tiny.txt --checkpoint none"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s --plot %s", cmds[i], missing);
        CHECK(tool_run(args, out, sizeof out) == 2);
        CHECK(strstr(out, "--plot") && strstr(out, "does not exist"));
        CHECK(!strstr(out, "training") && !strstr(out, "ember bench on"));   /* failed before any work */
        snprintf(args, sizeof args, "%s --plot %s", cmds[i], jpg);
        CHECK(tool_run(args, out, sizeof out) == 2);
        CHECK(strstr(out, "unknown picture format") && strstr(out, ".png or .svg"));
        CHECK(!exists(jpg));
        snprintf(args, sizeof args, "%s --plot %s", cmds[i], dir);   /* a folder, no extension */
        CHECK(tool_run(args, out, sizeof out) == 2);
    }
    /* a folder named like a picture */
    char folder[128];
    path_in(folder, sizeof folder, "folder.png");
    CHECK(mkdir(folder, 0700) == 0);
    snprintf(args, sizeof args, "bench --device cpu --quick --only launch --plot %s", folder);
    CHECK(tool_run(args, out, sizeof out) == 2);
    CHECK(strstr(out, "is a folder") != NULL);
    rmdir(folder);
    CHECK(files_starting(".ember-plot") == 0);
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    /* built without cairo, --plot is refused: the one thing left to check */
    int rc = tool_run("bench --device cpu --plot /nonexistent-folder/x.png", out, sizeof out);
    if (rc == 2 && strstr(out, "built without cairo")) {
        test_skip_case("plots", "this ember was built without cairo (libcairo2-dev): --plot is refused, as checked");
        return test_summary();
    }
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_plot_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    have_python = system("python3 -c 'import zlib, xml.etree.ElementTree' >/dev/null 2>&1") == 0;
    em_dataset *probe = em_dataset_fashion_mnist(NULL, false);
    have_data = probe != NULL;
    /* scripts/setup.sh installs the data: without it this test fails rather than skips */
    if (!have_data) fprintf(stderr, "Fashion-MNIST is not installed: %s\n", em_last_error());
    CHECK(have_data);
    em_clear_error();
    em_dataset_free(probe);
    RUN(test_bench_plot_opencl);
    RUN(test_bench_plot_cpu_has_no_crossover);
    RUN(test_train_plot_mlp_and_cnn);
    RUN(test_train_plot_written_every_epoch);
    RUN(test_train_plot_gpt);
    RUN(test_bad_plot_paths);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
