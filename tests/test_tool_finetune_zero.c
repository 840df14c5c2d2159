/* `ember finetune --full --zero S` under mpirun: on the tiny Llama (untied) and GPT-2 (tied)
 * folders, ZeRO stages 1, 2 and 3 on 2 ranks end on the weights of the unsharded --full run of
 * the same global batches (3 sequences a micro-batch: the ranks get 1 and 2 rows), with weight
 * decay on the matrices only and clipping at a norm the gradients exceed. One process under
 * --zero 3 is the same computation in the same order for the untied Llama, so it must agree to
 * rounding (GPT-2's tied embedding sums its two gradients in another order); on 2 ranks
 * the gradients are summed in another order, which Adam's first steps (an update of about lr
 * whatever the gradient's size) turn into differences of a few percent of lr on the
 * elements whose gradient is near 0: the tolerance is 2e-4 against steps of lr = 1e-3 (4
 * steps move a weight by up to 4e-3). A run stopped by SIGTERM on 2 ranks resumes from its
 * sharded checkpoint on 3 ranks and ends where the uninterrupted 2-rank run does; `ember mem
 * --zero 3` names the largest unit the command sharded; two PoCL devices, one a rank, give the
 * CPU's weights. Bad input:
 * --zero 4, --zero without --full, a resume with the other kind of checkpoint. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "tool_run.h"
#include "dist_run.h"

static char out[1 << 16];
static char tmp[64], text[128];

/* mpirun -np n ember ARGS into out (tool_run.h) */
static int mpi_tool(int n, const char *args) { return tool_run_mpi(n, args, out, sizeof out); }

/* The largest |a - b| over the weights of two model folders (loaded as Ember loads them: one
 * model.safetensors or the shards of an index); INFINITY when one does not load or they differ
 * in what they hold. */
static double max_weight_diff(const char *dir_a, const char *dir_b) {
    em_model *a = em_model_load(dir_a, NULL), *b = em_model_load(dir_b, NULL);
    int n = a ? em_model_num_parameters(a) : 0;
    double worst = a && b && n == em_model_num_parameters(b) ? 0 : INFINITY;
    em_scope s = em_scope_begin();
    for (int i = 0; isfinite(worst) && i < n; i++) {
        const char *name = NULL;
        em_tensor *x = em_model_parameter(a, i, &name), *y = name ? em_model_parameter_by_name(b, name) : NULL;
        em_tensor *d = x && y && em_numel(x) == em_numel(y) ? em_max(em_abs(em_sub(x, y)), EM_ALL_DIMS, false) : NULL;
        double v = d ? em_item(d) : INFINITY;
        if (!(v <= worst)) worst = v;
    }
    em_scope_end(s);
    if (!isfinite(worst)) fprintf(stderr, "comparing %s and %s: %s\n", dir_a, dir_b, em_last_error());
    em_clear_error();
    em_model_free(a);
    em_model_free(b);
    return worst;
}

/* Stage 3 writes a file per unit with an index (ZeRO gathers one unit at a time); the others
 * one model.safetensors. */
static bool written_per_unit(const char *dir) {
    char index[256], single[256];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    return access(index, R_OK) == 0 && access(single, F_OK) != 0;
}

static const char *const common = "--full --seq 32 --batch-size 3 --max-steps 4 --lr 1e-3 --seed 2 --warmup-steps 2 "
                                  "--weight-decay 0.1 --max-grad-norm 1";

static void test_stages_match_unsharded(void) {
    static const char *const models[] = {"llama", "gpt2"};
    char args[1024], ref[128], mine[128];
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        snprintf(ref, sizeof ref, "%s/%s-ref", tmp, models[k]);
        snprintf(args, sizeof args, "finetune tests/data/models/%s --data %s %s --out %s", models[k], text, common, ref);
        CHECK(tool_run(args, out, sizeof out) == 0);
        CHECK(strstr(out, "grad_norm") != NULL);
        /* the norm must exceed 1 for the clipping to be exercised: the first step's does */
        const char *g = strstr(out, "grad_norm ");
        CHECK(g && atof(g + 10) > 1.0);
        /* one process: the same sums in the same order */
        snprintf(mine, sizeof mine, "%s/%s-one", tmp, models[k]);
        snprintf(args, sizeof args, "finetune tests/data/models/%s --data %s %s --zero 3 --out %s", models[k], text,
                 common, mine);
        CHECK(tool_run(args, out, sizeof out) == 0);
        /* ember mem's largest unit is the one the command sharded */
        const char *at = strstr(out, "the largest ");
        long long trained_unit = at ? atoll(at + strlen("the largest ")) : -1;
        snprintf(args, sizeof args, "mem --model tests/data/models/%s --zero 3 --ranks 2 --dtype f32", models[k]);
        CHECK(tool_run(args, out, sizeof out) == 0);
        at = strstr(out, "+ working set");
        at = at ? strstr(at, "the largest unit (") : NULL;
        CHECK(at && trained_unit > 0 && atoll(at + strlen("the largest unit (")) == trained_unit);
        double d = max_weight_diff(ref, mine);
        printf("  %s, --zero 3 on 1 process: max |w - w_unsharded| %.3g\n", models[k], d);
        /* GPT-2's tied embedding: ZeRO reduces the projection's gradient before the lookup's
         * rows are added to it (two sums where one process without ZeRO accumulates the rows
         * onto the projection's), so its rounding differs as on 2 ranks */
        CHECK(d <= (k == 0 ? 1e-6 : 2e-4));
        for (int stage = 1; stage <= 3; stage++) {
            snprintf(mine, sizeof mine, "%s/%s-z%d", tmp, models[k], stage);
            snprintf(args, sizeof args, "finetune tests/data/models/%s --data %s %s --zero %d --out %s", models[k],
                     text, common, stage, mine);
            int st = mpi_tool(2, args);
            CHECK(st == 0);
            if (st != 0) fprintf(stderr, "%s\n", out);
            char banner[96];
            snprintf(banner, sizeof banner, "ZeRO stage %d over 2 ranks", stage);
            CHECK(dist_count(out, banner) == 1);                  /* rank 0 alone prints */
            CHECK(dist_count(out, "peak_alloc") >= 2);            /* each rank its own peak */
            CHECK(dist_count(out, "model written to") == 1);      /* rank 0 alone writes */
            CHECK(written_per_unit(mine) == (stage == 3));
            d = max_weight_diff(ref, mine);
            printf("  %s, --zero %d on 2 ranks: max |w - w_unsharded| %.3g\n", models[k], stage, d);
            CHECK(d <= 2e-4);
        }
    }
}

static void test_resume_on_other_ranks(void) {
    char args[1024], dir[128], whole[128];
    snprintf(dir, sizeof dir, "%s/stopped", tmp);
    snprintf(whole, sizeof whole, "%s/llama-z3", tmp);   /* from the test above */
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s %s --zero 3 --out %s --interrupt-after 2",
             text, common, dir);
    int st = mpi_tool(2, args);
    CHECK(st != 0);   /* mpirun reports the ranks' 143 (128 + SIGTERM) as a failure */
    CHECK(strstr(out, "stopped by SIGTERM after step 2") != NULL);
    char file[256];
    snprintf(file, sizeof file, "%s/checkpoint.zero/rank-1.safetensors", dir);
    CHECK(access(file, R_OK) == 0);
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s %s --zero 3 --out %s --resume", text,
             common, dir);
    st = mpi_tool(3, args);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(strstr(out, "(resumed)") != NULL && strstr(out, "step 3/4") != NULL && strstr(out, "step 2/4") == NULL);
    double d = max_weight_diff(whole, dir);
    printf("  stopped on 2 ranks, resumed on 3: max |w - w_uninterrupted| %.3g\n", d);
    CHECK(d <= 1e-5);
}

/* Two PoCL devices, one a rank (ember launch's opencl:LOCAL_RANK): the same weights as the
 * CPU's unsharded run, to the tolerance of two ranks. */
static void test_two_opencl_devices(void) {
    if (em_device_count(EM_OPENCL) < 2)
        SKIP("two OpenCL devices needed (POCL_DEVICES='pthread pthread'), found %d%s%s", em_device_count(EM_OPENCL),
             em_device_available(EM_OPENCL) ? "" : ": ",
             em_device_available(EM_OPENCL) ? "" : em_device_unavailable_reason(EM_OPENCL));
    char args[1024], mine[128], ref[128];
    snprintf(ref, sizeof ref, "%s/llama-ref", tmp);   /* from the first test */
    snprintf(mine, sizeof mine, "%s/llama-opencl", tmp);
    snprintf(args, sizeof args, "-x POCL_DEVICES finetune tests/data/models/llama --data %s %s --zero 3 --device "
             "opencl --out %s", text, common, mine);
    int st = mpi_tool(2, args);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(strstr(out, "peak_device") != NULL);   /* the progress line of a device run */
    double d = max_weight_diff(ref, mine);
    printf("  llama, --zero 3 on 2 ranks with an OpenCL device each: max |w - w_unsharded on the CPU| %.3g\n", d);
    CHECK(d <= 2e-4);
}

static void test_bad_input(void) {
    char args[1024];
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s --full --zero 4 --out %s/x", text, tmp);
    CHECK(tool_run(args, out, sizeof out) == 2 && strstr(out, "--zero expects an integer from 1 to 3") != NULL);
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s --zero 2 --out %s/x", text, tmp);
    CHECK(tool_run(args, out, sizeof out) == 2 && strstr(out, "--zero shards a full fine-tuning (--full)") != NULL);
    /* the unsharded run's checkpoint resumed with --zero, and the sharded one without */
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s %s --zero 2 --out %s/llama-ref --resume",
             text, common, tmp);
    CHECK(tool_run(args, out, sizeof out) == 1 && strstr(out, "resume it without --zero") != NULL);
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s %s --out %s/stopped --resume", text, common,
             tmp);
    CHECK(tool_run(args, out, sizeof out) == 1 && strstr(out, "resume it with --zero") != NULL);
}

int main(void) {
    const char *why = dist_unavailable();
    if (!why && !tool_path()) why = "build/ember is missing";
    if (why) {
        test_skip_case("ember finetune --full --zero under mpirun", "%s", why);
        return test_summary();
    }
    snprintf(tmp, sizeof tmp, "/tmp/ember_zero_ft_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    snprintf(text, sizeof text, "%s/text.txt", tmp);
    FILE *f = fopen(text, "w");
    if (!f) return 1;
    for (int i = 0; i < 60; i++) fprintf(f, "Line %d of a plain text, with words to learn. ", i);
    fclose(f);
    RUN(test_stages_match_unsharded);
    RUN(test_resume_on_other_ranks);
    RUN(test_two_opencl_devices);
    RUN(test_bad_input);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_summary();
}
