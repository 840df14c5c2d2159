/* The `ember` subcommands: one file each (cmd_<name>.c), one entry point each. */
#ifndef EMBER_TOOL_COMMANDS_H
#define EMBER_TOOL_COMMANDS_H

int cmd_devices(int argc, char **argv);
int cmd_smi(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_mem(int argc, char **argv);
/* launching processes (issue 15) */
int cmd_launch(int argc, char **argv);

#endif
