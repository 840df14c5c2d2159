/* ember: the command-line tool. Dispatches to one subcommand. */
#include <stdio.h>
#include <string.h>
#include <ember/ember.h>
#include "commands.h"

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *help;
} commands[] = {
    {"devices", cmd_devices, "list devices: availability, names, memory, compute units, auto-selection"},
    {"smi", cmd_smi, "nvidia-smi style queries (--query-gpu=... --format=csv,noheader)"},
    {"bench", cmd_bench, "matmul TFLOPS, transfer bandwidth, launch latency, CPU/device crossover"},
    {"train", cmd_train, "train the 784-256-10 MLP on Fashion-MNIST"},
    {"eval", cmd_eval, "evaluate a checkpoint on the Fashion-MNIST test set"},
    {"mem", cmd_mem, "estimate the memory a model needs (inference, fine-tuning, LoRA)"},
    /* launching processes (issue 15) */
    {"launch", cmd_launch, "start N processes of a program with torchrun's variables (Ember's torchrun)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: ember <command> [options]   (ember <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("ember %d.%d.%d\n", EMBER_VERSION_MAJOR, EMBER_VERSION_MINOR, EMBER_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
