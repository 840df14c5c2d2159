/* ember: the command-line tool. Dispatches to one subcommand. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ember/ember.h>
#include "commands.h"
#include "model_gpt.h"   /* ember train --model gpt's table */

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
    {"launch", cmd_launch, "start N processes of a program with torchrun's variables (Ember's torchrun)"},
    {"perplexity", cmd_perplexity, "the perplexity of a text under a Hugging Face model folder"},
    {"tokenize", cmd_tokenize, "the token ids of a text with a model's tokenizer.json (and back: --decode)"},
    {"generate", cmd_generate, "continue a text with a model folder's language model, streamed, with tokens/s"},
    {"finetune", cmd_finetune, "LoRA fine-tuning of a model folder on text or prompt/completion JSONL (PEFT folders)"},
    {"memory-timeline", cmd_memory_timeline, "draw a memory history (em_memory_dump_history's JSON) as a timeline"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* Every option table, by the words that select it: `ember help --options|--man WORDS`, and
 * the man page's sections in this order. */
static const struct {
    const char *words;
    const opt_command *options;
} tables[] = {
    {"devices", &devices_options}, {"smi", &smi_options},   {"bench", &bench_options},
    {"train", &train_options},     {"train --model gpt", &gpt_train_options},
    {"eval", &eval_options},       {"mem", &mem_options},   {"launch", &launch_options},
    {"perplexity", &perplexity_options}, {"tokenize", &tokenize_options},
    {"generate", &generate_options}, {"finetune", &finetune_options}, {"memory-timeline", &memory_timeline_options},
};

static void usage(FILE *f) {
    fprintf(f, "usage: ember <command> [options]   (ember help <command> for its options)\n"
               "       ember --version | --help\n\ncommands:\n");
    int width = 4;   /* the longest name's, so that the help texts line up */
    for (size_t i = 0; i < NCOMMANDS; i++)
        if ((int)strlen(commands[i].name) > width) width = (int)strlen(commands[i].name);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-*s %s\n", width, commands[i].name, commands[i].help);
    fprintf(f, "  %-*s %s\n", width, "help", "the options of a command: ember help <command>");
    fprintf(f, "\n  ember help --options <command>   its options as a table, one per line (tab-separated: name,\n"
               "                                   alias, kind, metavar, min, max, flags, choices) for scripts\n"
               "  ember help --man [<command>]     the man page's section of a command (roff), or every one\n");
    /* ---- command conventions: exit status, the same for every command ---- */
    fprintf(f, "\nexit status:\n"
               "  0    done\n"
               "  1    failed: a file that cannot be read or written, a device error, a measurement\n"
               "       that failed; the message on stderr says what and why\n"
               "  2    usage: an unknown command or option, an option given twice, a bad or missing\n"
               "       value, an argument too many (ember train also checks its files and folders before\n"
               "       it starts: one it cannot use is a usage error)\n"
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

/* What a command printed must reach its reader: the output is flushed and closed here, and a
 * write that failed (a full disk, /dev/full, a closed pipe's EIO) turns a success into exit
 * status 1 with a message, so that a script never takes lost results for results. */
static int finish_output(const char *command, int rc) {
    errno = 0;
    bool failed = fflush(stdout) != 0;
    int err = errno;
    if (ferror(stdout)) failed = true;   /* an earlier write failed, its bytes dropped */
    if (fclose(stdout) != 0 && !failed) failed = true, err = errno;
    if (!failed || rc != 0) return rc;   /* a command that failed has said why already */
    fprintf(stderr, "ember %s: cannot write the output: %s\n", command,
            err ? strerror(err) : "a write to standard output failed");
    return 1;
}

/* The option table selected by words[0..n) ("train", or "train --model gpt"), or NULL. */
static const opt_command *table_of(int n, char **words) {
    char key[128] = "";
    for (int i = 0; i < n; i++) {
        if (strlen(key) + strlen(words[i]) + 2 > sizeof key) return NULL;
        if (i) strcat(key, " ");
        strcat(key, words[i]);
    }
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (!strcmp(key, tables[i].words)) return tables[i].options;
    return NULL;
}

/* ember help [COMMAND [ARGS...]]: the command's own --help text (ARGS as `--model gpt` select
 * another table), and its status; ember help --options|--man COMMAND: the table's forms for
 * scripts and the man page. */
static int help(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    bool as_table = !strcmp(argv[1], "--options"), as_man = !strcmp(argv[1], "--man");
    if (as_table || as_man) {
        if (as_man && argc == 2) {   /* the whole COMMANDS section */
            for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
                char title[64];
                snprintf(title, sizeof title, "ember %s", tables[i].words);
                opt_print_man(tables[i].options, title, stdout);
            }
            return 0;
        }
        const opt_command *t = argc > 2 ? table_of(argc - 2, argv + 2) : NULL;
        if (!t) {
            fprintf(stderr, "ember help: %s %s: expected a command (", argv[1], argc > 2 ? "names no command" : "needs a command");
            for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
                fprintf(stderr, "%s'%s'", i ? ", " : "", tables[i].words);
            fprintf(stderr, ")\n");
            return 2;
        }
        if (as_table) opt_print_table(t, stdout);
        else {
            char title[160] = "ember";
            for (int i = 2; i < argc; i++) strcat(title, " "), strcat(title, argv[i]);
            opt_print_man(t, title, stdout);
        }
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* the command's own arguments with --help after them: `ember help train --model gpt` */
            char **args = calloc((size_t)argc + 1, sizeof *args);
            if (!args) {
                fprintf(stderr, "ember help: out of memory\n");
                return 1;
            }
            for (int k = 1; k < argc; k++) args[k - 1] = argv[k];
            args[argc - 1] = "--help";
            int rc = commands[i].run(argc, args);
            free(args);
            return rc;
        }
    fprintf(stderr, "ember help: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

static int run_command(int argc, char **argv);

int main(int argc, char **argv) {
    int rc = run_command(argc, argv);
    return finish_output(argc > 1 ? argv[1] : "", rc);
}

static int run_command(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    bool is_help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"), is_version = !strcmp(argv[1], "--version");
    if ((is_help || is_version) && argc > 2) {   /* `ember --version x`: a mistake, not a version */
        fprintf(stderr, "ember: %s takes no arguments, got '%s'\n", argv[1], argv[2]);
        return 2;
    }
    if (is_help) {
        usage(stdout);
        return 0;
    }
    if (is_version) {
        printf("ember %s\n", EMBER_VERSION_STRING);
        if (strcmp(em_version(), EMBER_VERSION_STRING))   /* a libember.so of another version */
            printf("library %s\n", em_version());
        return 0;
    }
    if (!strcmp(argv[1], "help")) return help(argc - 1, argv + 1);
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
