/* ember eval: load a checkpoint of the seed's MLP (written by `ember train`, or any
 * safetensors file with its state dict) and report test accuracy, loss and throughput. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "commands.h"
#include "mlp.h"
#include "model_cnn.h"
#include "model_gpt.h"

static const char *const tool = "ember eval";

static void usage(FILE *f) {
    fprintf(f,
            "usage: ember eval [CHECKPOINT] [options]\n"
            "Test accuracy, loss and throughput of a model `ember train` wrote (the seed's MLP or the\n"
            "CNN, as the checkpoint's \"model\" metadata says) on Fashion-MNIST.\n\n"
            "  CHECKPOINT           safetensors file from `ember train` (default ember-mlp.safetensors)\n"
            "  --device D           auto (default), cpu, cuda:N, opencl:N\n"
            "  --batch-size N       samples per forward pass (default 1000)\n"
            "  --threads N          CPU threads (default: every core)\n"
            "  --data DIR           directory of the IDX files (default: the Debian package's)\n"
            "  --test-samples N     the first N test samples only\n");
}

int cmd_eval(int argc, char **argv) {
    const char *path = NULL, *dir = NULL;
    em_device dev = EM_DEVICE_CPU;
    bool device_set = false;
    int64_t batch = 1000, threads = 0, limit = 0;
    mlp_seen seen = {0};
    for (int i = 1; i < argc; i++) { /* a GPT checkpoint (ember train --model gpt) has its own evaluation */
        if (argv[i][0] == '-' && argv[i][1]) {
            i++;
            continue;
        }
        if (gpt_is_checkpoint(argv[i])) return gpt_eval_main(argv[i], argc, argv);
        break;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (a[0] != '-' || !a[1]) {
            if (path) {   /* one checkpoint: a second one is a mistake, not a replacement */
                fprintf(stderr, "%s: unexpected argument '%s': one CHECKPOINT only (already '%s')\n", tool, a, path);
                return 2;
            }
            path = a;
            continue;
        } else if (i + 1 >= argc || (strcmp(a, "--device") && strcmp(a, "--batch-size") && strcmp(a, "--threads") &&
                                     strcmp(a, "--data") && strcmp(a, "--test-samples"))) {
            fprintf(stderr, "%s: %s '%s'\n", tool, i + 1 >= argc ? "missing value or unknown option" : "unknown option", a);
            usage(stderr);
            return 2;
        }
        if (!mlp_once(tool, &seen, a)) return 2;
        const char *v = argv[++i];
        if (!strcmp(a, "--device")) ok = mlp_parse_device(tool, a, v, &dev), device_set = true;
        else if (!strcmp(a, "--batch-size")) ok = mlp_parse_int(tool, a, v, 1, (int64_t)1 << 30, &batch);
        else if (!strcmp(a, "--threads")) ok = mlp_parse_int(tool, a, v, 1, 4096, &threads);
        else if (!strcmp(a, "--test-samples")) ok = mlp_parse_int(tool, a, v, 1, (int64_t)1 << 50, &limit);
        else dir = v;
        if (!ok) return 2;
    }
    if (!path) path = "ember-mlp.safetensors";
    if (!*path) {
        fprintf(stderr, "%s: the CHECKPOINT path is empty\n", tool);
        return 2;
    }
    if (!device_set && !mlp_default_device(tool, &dev)) return 2;   /* starts every backend: only when asked */
    if (threads) em_set_num_threads((int)threads);
    int rc = 1;
    /* the checkpoint first: a bad one is reported before the data is read */
    const char *kind = model_of_checkpoint(path);
    em_module *model = kind ? model_new(kind) : NULL;
    em_dataset *test = NULL;
    if (!model) {
        fprintf(stderr, "%s: %s%s\n", tool, kind ? "" : "cannot load: ", em_last_error());
    } else if (em_module_load(model, path) != EM_OK || em_module_to(model, dev) != EM_OK) {
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
