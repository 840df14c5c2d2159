/* `ember finetune` under mpirun or `ember launch` without --zero: DistributedDataParallel. On
 * the tiny Llama (untied) and GPT-2 (tied embedding) folders, LoRA and --full on 2 ranks end on
 * the adapters / weights of one process with the same global batches (3 sequences a
 * micro-batch: the ranks get 1 and 2 rows), to the tolerance test_tool_finetune_zero explains
 * (2e-4 against 4 Adam steps of lr 1e-3: the ranks sum the gradients in another order), and
 * the first step's loss and gradient norm print the same (Adam's step barely changes with the
 * gradients' scale: the norm shows a reduction that averages where it should sum). Only
 * rank 0 writes: one "written" line, and the folder holds the same files, of the same sizes,
 * as the one-process run's, each loadable. Also: a micro-batch of 1 row (one rank computes
 * nothing) with --accumulate 3 and --checkpoint-activations, --amp bf16, the eval loss, a run
 * stopped by SIGTERM resumed on 2 ranks (bit for bit) and on 3, two PoCL devices, and a
 * --resume without a checkpoint failing on every rank instead of hanging. */
#include <dirent.h>
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

/* The largest |a - b| over two lists of tensors matched by name; INFINITY when they differ in
 * what they hold. */
static double max_named_diff(const em_named_tensor *a, int na, const em_named_tensor *b, int nb) {
    double worst = na == nb && na > 0 ? 0 : INFINITY;
    em_scope s = em_scope_begin();
    for (int i = 0; isfinite(worst) && i < na; i++) {
        em_tensor *y = NULL;
        for (int j = 0; j < nb && !y; j++)
            if (!strcmp(a[i].name, b[j].name)) y = b[j].tensor;
        em_tensor *x = a[i].tensor;
        em_tensor *d = y && em_numel(x) == em_numel(y) ? em_max(em_abs(em_sub(x, y)), EM_ALL_DIMS, false) : NULL;
        double v = d ? em_item(d) : INFINITY;
        if (!(v <= worst)) worst = v;
    }
    em_scope_end(s);
    return worst;
}

/* The weights of two model folders (one model.safetensors or the shards of an index). */
static double max_weight_diff(const char *dir_a, const char *dir_b) {
    em_model *a = em_model_load(dir_a, NULL), *b = em_model_load(dir_b, NULL);
    int n = a ? em_model_num_parameters(a) : 0;
    double worst = a && b && n > 0 && n == em_model_num_parameters(b) ? 0 : INFINITY;
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

/* The adapters of two adapter folders, each loaded onto the base model. */
static double max_adapter_diff(const char *model, const char *dir_a, const char *dir_b) {
    em_model *a = em_model_load(model, NULL), *b = em_model_load(model, NULL);
    double worst = INFINITY;
    if (a && b && em_model_lora_load(a, dir_a) == EM_OK && em_model_lora_load(b, dir_b) == EM_OK) {
        em_named_tensor pa[256], pb[256];
        int na = em_module_parameters(em_model_lora_module(a), pa, 256);
        int nb = em_module_parameters(em_model_lora_module(b), pb, 256);
        if (na <= 256 && nb <= 256) worst = max_named_diff(pa, na, pb, nb);
    }
    if (!isfinite(worst)) fprintf(stderr, "comparing %s and %s: %s\n", dir_a, dir_b, em_last_error());
    em_clear_error();
    em_model_free(a);
    em_model_free(b);
    return worst;
}

/* Do two folders hold the same names with the same sizes (the subfolders' too)? One writer
 * leaves no extra or partial file. */
static bool same_files(const char *dir_a, const char *dir_b) {
    DIR *d = opendir(dir_a);
    if (!d) return false;
    int na = 0, nb = 0;
    bool same = true;
    struct dirent *e;
    while (same && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/%s", dir_a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", dir_b, e->d_name);
        struct stat sa, sb;
        same = stat(pa, &sa) == 0 && stat(pb, &sb) == 0 && S_ISDIR(sa.st_mode) == S_ISDIR(sb.st_mode) &&
               (S_ISDIR(sa.st_mode) ? same_files(pa, pb) : sa.st_size == sb.st_size);
        if (!same) fprintf(stderr, "%s and %s differ\n", pa, pb);
        na++;
    }
    closedir(d);
    if (!(d = opendir(dir_b))) return false;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') nb++;
    closedir(d);
    if (na != nb) fprintf(stderr, "%s holds %d entries, %s %d\n", dir_a, na, dir_b, nb);
    return same && na == nb;
}

/* A number printed after `key` in out (the first occurrence after `from`), NAN if none. */
static double printed(const char *from, const char *key) {
    const char *at = strstr(from, key);
    return at ? atof(at + strlen(key)) : NAN;
}

static const char *const common = "--seq 32 --max-steps 4 --lr 1e-3 --seed 2 --warmup-steps 2 "
                                  "--weight-decay 0.1 --max-grad-norm 1";

/* One process with ref_options (NULL: the same), then 2 ranks (`ember launch` or mpirun) with
 * options, both with --batch-size 3 unless they give one: the adapters or weights within tol
 * (0: bit for bit), one writer, rank 0 alone printing. */
static void compare_on_two_ranks(const char *model, const char *ref_options, const char *options, const char *name,
                                 bool launch, double tol) {
    char args[1024], ref[128], mine[128], model_dir[128], opt_ref[256], opt_ddp[256];
    if (!ref_options) ref_options = options;
    snprintf(opt_ref, sizeof opt_ref, "%s%s", strstr(ref_options, "--batch-size") ? "" : "--batch-size 3 ",
             ref_options);
    snprintf(opt_ddp, sizeof opt_ddp, "%s%s", strstr(options, "--batch-size") ? "" : "--batch-size 3 ", options);
    snprintf(model_dir, sizeof model_dir, "tests/data/models/%s", model);
    snprintf(ref, sizeof ref, "%s/%s-ref", tmp, name);
    snprintf(mine, sizeof mine, "%s/%s-ddp", tmp, name);
    snprintf(args, sizeof args, "finetune %s --data %s %s %s --out %s", model_dir, text, common, opt_ref, ref);
    int st = tool_run(args, out, sizeof out);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    const char *step1 = strstr(out, "step 1/");
    double loss1 = step1 ? printed(step1, " loss ") : NAN, eval1 = printed(out, "eval loss ");
    double norm1 = step1 ? printed(step1, " grad_norm ") : NAN;
    if (launch) {
        snprintf(args, sizeof args, "launch -n 2 -- '%s' finetune %s --data %s %s %s --out %s", tool_path(), model_dir,
                 text, common, opt_ddp, mine);
        st = tool_run(args, out, sizeof out);
    } else {
        snprintf(args, sizeof args, "finetune %s --data %s %s %s --out %s", model_dir, text, common, opt_ddp, mine);
        st = mpi_tool(2, args);
    }
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(dist_count(out, "DistributedDataParallel over 2 ranks") == 1);   /* rank 0 alone prints */
    CHECK(dist_count(out, "step 4/4") == 1);
    bool full = strstr(options, "--full") != NULL;
    CHECK(dist_count(out, full ? "model written to" : "adapters written to") == 1);   /* one writer */
    /* the first step's loss and gradient norm: the same weights, the ranks' rows summed in
     * another order (the norm is what Adam's scale-free step would not show: a gradient
     * averaged where it should be summed, or not reduced at all) */
    step1 = strstr(out, "step 1/");
    double loss2 = step1 ? printed(step1, " loss ") : NAN, norm2 = step1 ? printed(step1, " grad_norm ") : NAN;
    CHECK(fabs(loss1 - loss2) <= 1e-4);
    CHECK(fabs(norm1 - norm2) <= 2e-3);
    if (!isnan(eval1)) {
        double eval2 = printed(out, "eval loss ");
        printf("  %s: eval loss %.6f on 1 process, %.6f on 2 ranks\n", name, eval1, eval2);
        CHECK(fabs(eval1 - eval2) <= 1e-3);
    }
    CHECK(same_files(ref, mine));
    double d = full ? max_weight_diff(ref, mine) : max_adapter_diff(model_dir, ref, mine);
    printf("  %s: 2 ranks against 1 process: max |w - w_1| %.3g\n", name, d);
    CHECK(d <= tol);
    if (strstr(options, "--merge")) {
        char ra[160], ma[160];
        snprintf(ra, sizeof ra, "%s/merged", ref);
        snprintf(ma, sizeof ma, "%s/merged", mine);
        d = max_weight_diff(ra, ma);
        printf("  %s: merged folders: max |w - w_1| %.3g\n", name, d);
        CHECK(d <= tol);
    }
}

static void test_lora(void) {
    compare_on_two_ranks("llama", NULL, "--merge --eval-fraction 0.1", "llama-lora", true, 2e-4);
    compare_on_two_ranks("gpt2", NULL, "--merge", "gpt2-lora", false, 2e-4);
}

static void test_full(void) {
    compare_on_two_ranks("llama", NULL, "--full", "llama-full", false, 2e-4);
    compare_on_two_ranks("gpt2", NULL, "--full --eval-fraction 0.1", "gpt2-full", false, 2e-4);
}

/* A micro-batch of 1 row: rank 0 computes no row of it (an empty sequence whose gradients are
 * zeros), so the sums are one process's, bit for bit; --accumulate 3 reduces once a step, and
 * the checkpointed layers recompute inside the backward. GPT-2's tied embedding with 1 row a
 * rank: its two gradients are added in another order. */
static void test_empty_rank_and_accumulation(void) {
    compare_on_two_ranks("llama", NULL, "--batch-size 1 --accumulate 3 --checkpoint-activations", "llama-acc", false,
                         0);
    compare_on_two_ranks("gpt2", NULL, "--full --batch-size 2 --accumulate 2", "gpt2-full-acc", false, 2e-4);
}

/* bf16 autocast rounds each GEMM's output to bf16, so a rank's 2 rows do not round as one
 * process's 3 do, and Adam's first steps turn that into up to lr on weights whose gradient is
 * near 0. One row a rank rounds as one process's micro-batches of one row: the 2-rank run with
 * --batch-size 2 is the one-process run with --batch-size 1 --accumulate 2, bit for bit (the
 * average of the ranks' doubled gradients is their exact sum). */
static void test_amp_bf16(void) {
    compare_on_two_ranks("llama", "--amp bf16 --batch-size 1 --accumulate 2", "--amp bf16 --batch-size 2",
                         "llama-bf16", false, 0);
    compare_on_two_ranks("gpt2", "--full --amp bf16 --batch-size 1 --accumulate 2", "--full --amp bf16 --batch-size 2",
                         "gpt2-full-bf16", false, 2e-4);
}

/* Stopped by SIGTERM on 2 ranks after step 2: rank 0 wrote the checkpoint alone; a resume on
 * 2 ranks ends on the uninterrupted 2-rank run's adapters, bit for bit, and one on 3 ranks
 * (the checkpoint's position counts the batches of all ranks) on the one-process run's, to
 * the tolerance of another summation order. */
static void test_resume(void) {
    static const char *const run = "finetune tests/data/models/llama --batch-size 3 --merge --eval-fraction 0.1";
    char args[1024], stopped[128], again[128], ref[128], ddp[128], file[256];
    snprintf(stopped, sizeof stopped, "%s/stopped", tmp);
    snprintf(again, sizeof again, "%s/stopped-3", tmp);
    snprintf(ref, sizeof ref, "%s/llama-lora-ref", tmp);   /* the runs of test_lora */
    snprintf(ddp, sizeof ddp, "%s/llama-lora-ddp", tmp);
    snprintf(args, sizeof args, "%s --data %s %s --out %s --interrupt-after 2", run, text, common, stopped);
    int st = mpi_tool(2, args);
    CHECK(st != 0);   /* mpirun reports the ranks' 143 (128 + SIGTERM) as a failure */
    CHECK(dist_count(out, "stopped by SIGTERM after step 2") == 1);
    snprintf(file, sizeof file, "%s/checkpoint.safetensors", stopped);
    CHECK(access(file, R_OK) == 0);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", stopped);
    CHECK(access(file, F_OK) != 0);
    snprintf(args, sizeof args, "cp -r '%s' '%s'", stopped, again);
    CHECK(system(args) == 0);
    snprintf(args, sizeof args, "%s --data %s %s --out %s --resume", run, text, common, stopped);
    st = mpi_tool(2, args);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(strstr(out, "(resumed)") != NULL && strstr(out, "step 3/4") != NULL && strstr(out, "step 2/4") == NULL);
    double d = max_adapter_diff("tests/data/models/llama", ddp, stopped);
    printf("  stopped on 2 ranks, resumed on 2: max |w - w_uninterrupted| %.3g\n", d);
    CHECK(d == 0);
    snprintf(args, sizeof args, "%s --data %s %s --out %s --resume", run, text, common, again);
    st = mpi_tool(3, args);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(dist_count(out, "DistributedDataParallel over 3 ranks") == 1);
    CHECK(strstr(out, "step 3/4") != NULL && strstr(out, "step 2/4") == NULL);
    d = max_adapter_diff("tests/data/models/llama", ref, again);
    printf("  stopped on 2 ranks, resumed on 3: max |w - w_1 process| %.3g\n", d);
    CHECK(d <= 2e-4);
}

/* Two PoCL devices, one a rank (opencl:LOCAL_RANK): the CPU's one-process adapters. */
static void test_two_opencl_devices(void) {
    if (em_device_count(EM_OPENCL) < 2)
        SKIP("two OpenCL devices needed (POCL_DEVICES='pthread pthread'), found %d%s%s", em_device_count(EM_OPENCL),
             em_device_available(EM_OPENCL) ? "" : ": ",
             em_device_available(EM_OPENCL) ? "" : em_device_unavailable_reason(EM_OPENCL));
    char args[1024], mine[128], ref[128];
    snprintf(ref, sizeof ref, "%s/llama-lora-ref", tmp);   /* from test_lora */
    snprintf(mine, sizeof mine, "%s/llama-opencl", tmp);
    snprintf(args, sizeof args, "-x POCL_DEVICES finetune tests/data/models/llama --data %s %s --merge "
             "--batch-size 3 --eval-fraction 0.1 --device opencl --out %s", text, common, mine);
    int st = mpi_tool(2, args);
    CHECK(st == 0);
    if (st != 0) fprintf(stderr, "%s\n", out);
    CHECK(strstr(out, "peak_device") != NULL);   /* the progress line of a device run */
    double d = max_adapter_diff("tests/data/models/llama", ref, mine);
    printf("  llama LoRA on 2 ranks with an OpenCL device each: max |w - w_1 process on the CPU| %.3g\n", d);
    CHECK(d <= 2e-4);
}

/* A --resume with no checkpoint: every rank fails with the message, none waits for the others. */
static void test_resume_without_checkpoint(void) {
    char args[1024];
    snprintf(args, sizeof args, "finetune tests/data/models/llama --data %s %s --batch-size 3 --out %s/none --resume",
             text, common, tmp);
    int st = mpi_tool(2, args);
    CHECK(st != 0 && st != 124);   /* 124: timeout's, a hang */
    CHECK(dist_count(out, "--resume:") == 2);
}

int main(void) {
    const char *why = dist_unavailable();
    if (!why && !tool_path()) why = "build/ember is missing";
    if (why) {
        test_skip_case("ember finetune under mpirun without --zero", "%s", why);
        return test_summary();
    }
    snprintf(tmp, sizeof tmp, "/tmp/ember_ddp_ft_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    snprintf(text, sizeof text, "%s/text.txt", tmp);
    FILE *f = fopen(text, "w");
    if (!f) return 1;
    for (int i = 0; i < 60; i++) fprintf(f, "Line %d of a plain text, with words to learn. ", i);
    fclose(f);
    RUN(test_lora);
    RUN(test_full);
    RUN(test_empty_rank_and_accumulation);
    RUN(test_amp_bf16);
    RUN(test_resume);
    RUN(test_two_opencl_devices);
    RUN(test_resume_without_checkpoint);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_summary();
}
