/* ember eval: load a checkpoint of the seed's MLP (written by `ember train`, or any
 * safetensors file with its state dict) and report test accuracy, loss and throughput. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "commands.h"
#include "mlp.h"
#include "model_cnn.h"
#include "model_gpt.h"
#include "options.h"

static const char *const tool = "ember eval";

enum { E_DEVICE, E_BATCH_SIZE, E_THREADS, E_DATA, E_TEST_SAMPLES, E_TEXT };
static const opt_spec eval_table[] = {
    [E_DEVICE] = OPTION_DEVICE("--device", "auto (default), cpu, cuda:N, opencl:N"),
    [E_BATCH_SIZE] = OPTION_INT("--batch-size", "N", 1, (int64_t)1 << 30, "samples per forward pass (default 1000)"),
    [E_THREADS] = OPTION_INT("--threads", "N", 1, 4096, "CPU threads (default: every core)"),
    [E_DATA] = OPTION_STRING("--data", "DIR", "directory of the IDX files (default: the Debian package's)"),
    [E_TEST_SAMPLES] = OPTION_INT("--test-samples", "N", 1, (int64_t)1 << 50, "the first N test samples only"),
    [E_TEXT] = OPTION_STRING("--text", "PATH",
                             "a GPT checkpoint's text: the validation loss is over its last 10% (default: the "
                             "text `ember train --model gpt` trains on by default)"),
};
OPT_TABLE_FITS(eval_table);

const opt_command eval_options = {
    .name = "ember eval",
    .usage = "ember eval [CHECKPOINT] [options]",
    .about = "Test accuracy, loss and throughput of a model `ember train` wrote (the seed's MLP or the CNN, as the "
             "checkpoint's \"model\" metadata says) on Fashion-MNIST; for a GPT checkpoint (ember train --model "
             "gpt), the validation loss on its text and a sample.",
    .positional = "CHECKPOINT",
    .positional_help = "safetensors file from `ember train` (default ember-mlp.safetensors)",
    .extra = "one CHECKPOINT only",
    .options = eval_table,
    .count = OPT_COUNT(eval_table),
    .epilogue = "A GPT checkpoint takes --text, --device and --threads; the others are for the MLP and the CNN.",
    .exit_status = "0 done; 1 the checkpoint or the data cannot be read, or the evaluation failed; 2 bad arguments",
};

int cmd_eval(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&eval_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    const char *path = opts.positional, *dir = v[E_DATA].text;
    em_device dev = EM_DEVICE_CPU;
    bool device_set = v[E_DEVICE].given;
    int64_t batch = v[E_BATCH_SIZE].given ? v[E_BATCH_SIZE].i : 1000;
    int64_t threads = v[E_THREADS].given ? v[E_THREADS].i : 0, limit = v[E_TEST_SAMPLES].i;
    if (device_set && !mlp_parse_device(tool, "--device", v[E_DEVICE].text, &dev)) return 2;
    if (!path) path = "ember-mlp.safetensors";
    if (!*path) {
        fprintf(stderr, "%s: the CHECKPOINT path is empty\n", tool);
        return 2;
    }
    if (!mlp_check_memory_env(tool, NULL, 0)) return 2;   /* the CPU's: the checkpoint is read into it */
    /* the checkpoint first, read once: its metadata says which model it holds, and the same
     * read is what is loaded (a pipe works; a save replacing the file meanwhile cannot mix
     * two versions); a bad one is reported before the data is read */
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    const char *kind = file ? model_of_file(file) : NULL;
    if (!kind) {
        fprintf(stderr, "%s: cannot load: %s\n", tool, em_last_error());
        em_safetensors_free(file);
        return 1;
    }
    if (!strcmp(kind, "gpt")) {   /* a GPT checkpoint (ember train --model gpt) has its own evaluation */
        static const int mlp_only[] = {E_BATCH_SIZE, E_DATA, E_TEST_SAMPLES};
        for (size_t k = 0; k < sizeof mlp_only / sizeof mlp_only[0]; k++)
            if (v[mlp_only[k]].given) {
                fprintf(stderr, "%s: %s is a GPT checkpoint: options are --text PATH, --device D, --threads N "
                        "(got '%s')\n", tool, path, v[mlp_only[k]].as);
                em_safetensors_free(file);
                return 2;
            }
        bool usable = (device_set || mlp_default_device(tool, &dev)) && mlp_check_memory_env(tool, &dev, 1);
        int rc = usable ? gpt_eval_main(file, v[E_TEXT].text, dev, threads) : 2;
        em_safetensors_free(file);
        return rc;
    }
    if (v[E_TEXT].given) {
        fprintf(stderr, "%s: --text goes with a GPT checkpoint (ember train --model gpt); %s is the %s's\n", tool, path,
                !strcmp(kind, "cnn") ? "CNN" : "MLP");
        em_safetensors_free(file);
        return 2;
    }
    if ((!device_set && !mlp_default_device(tool, &dev)) ||   /* starts every backend: only when asked */
        !mlp_check_memory_env(tool, &dev, 1)) {
        em_safetensors_free(file);
        return 2;
    }
    if (threads) em_set_num_threads((int)threads);
    int rc = 1;
    em_module *model = model_new(kind);
    bool loaded = model && em_module_load_safetensors(model, file) == EM_OK && em_module_to(model, dev) == EM_OK;
    em_safetensors_free(file);   /* the weights are in the model now */
    em_dataset *test = NULL;
    if (!model) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
    } else if (!loaded) {
        fprintf(stderr, "%s: cannot load %s: %s\n", tool, path, em_last_error());
    } else if (!(test = mlp_dataset(dir, false, limit, "--test-samples"))) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
    } else {
        mlp_eval ev;
        em_memory_reset_peak_stats(dev);
        if (mlp_evaluate(model, test, dev, batch, &ev) != EM_OK) {
            fprintf(stderr, "%s: evaluation failed: %s\n", tool, em_last_error());
        } else {
            char mem[160];
            mlp_memory_line(dev, mem, sizeof mem);
            printf("%s on %s: test accuracy %.2f%% (%" PRId64 " samples), loss %.4f, %.0f samples/s (%.3f s), "
                   "memory %s\n",
                   path, em_device_str(dev).s, 100.0 * ev.accuracy, ev.samples, ev.loss,
                   ev.seconds > 0 ? (double)ev.samples / ev.seconds : 0, ev.seconds, mem);
            rc = 0;
        }
    }
    em_module_free(model);
    em_dataset_free(test);
    em_memory_empty_cache(dev);
    em_memory_empty_cache(EM_DEVICE_CPU);
    em_memory_empty_pinned_cache();
    return rc;
}
