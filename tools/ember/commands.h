/* The `ember` subcommands: one file each (cmd_<name>.c), each with one entry point and the
 * table of its options (options.h), which main.c also reaches for `ember help`. */
#ifndef EMBER_TOOL_COMMANDS_H
#define EMBER_TOOL_COMMANDS_H

#include "options.h"

int cmd_devices(int argc, char **argv);
int cmd_smi(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_mem(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_finetune(int argc, char **argv);
int cmd_memory_timeline(int argc, char **argv);

extern const opt_command devices_options, smi_options, bench_options, train_options, eval_options, mem_options,
    launch_options, perplexity_options, tokenize_options, generate_options, finetune_options,
    memory_timeline_options;

#endif
