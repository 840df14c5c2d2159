/* ember mem: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_mem(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember mem: not implemented yet\n");
    return 2;
}
