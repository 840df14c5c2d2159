/* ember eval: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_eval(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember eval: not implemented yet\n");
    return 2;
}
