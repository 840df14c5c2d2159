/* ember: the command-line tool. Dispatches to one subcommand. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
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
    fprintf(f, "usage: ember <command> [options]   (ember help <command> for its options)\n"
               "       ember --version | --help\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-8s %s\n", "help", "the options of a command: ember help <command>");
    /* ---- command conventions (issue 17): exit status, the same for every command ---- */
    fprintf(f, "\nexit status:\n"
               "  0    done\n"
               "  1    failed: a file that cannot be read or written, a device error, a measurement\n"
               "       that failed; the message on stderr says what and why\n"
               "  2    usage: an unknown command or option, a bad or missing value (ember train also\n"
               "       checks its files and folders before it starts: one it cannot use is a usage error)\n"
               "  130  interrupted by Ctrl-C (SIGINT); ember train saves its checkpoint first, and\n"
               "       exits with 128 + N for SIGTERM (143) and SIGHUP (129) as well\n");
}

/* Ctrl-C in a command without a handler of its own (ember train has one): the conventional
 * status 130 as an exit code, so that callers that read codes rather than signals see it. */
static void on_interrupt(int sig) {
    static const char msg[] = "\nember: interrupted\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    _exit(128 + sig);
}

/* ember help [COMMAND]: the command's own --help text, and its status. */
static int help(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            char *args[] = {argv[1], "--help", NULL};
            return commands[i].run(2, args);
        }
    fprintf(stderr, "ember help: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("ember %s\n", EMBER_VERSION_STRING);
        if (strcmp(em_version(), EMBER_VERSION_STRING))   /* a libember.so of another version */
            printf("library %s\n", em_version());
        return 0;
    }
    if (!strcmp(argv[1], "help")) return help(argc - 1, argv + 1);
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
