/* ember bench: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_bench(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember bench: not implemented yet\n");
    return 2;
}
