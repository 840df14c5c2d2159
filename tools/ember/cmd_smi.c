/* ember smi: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_smi(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember smi: not implemented yet\n");
    return 2;
}
