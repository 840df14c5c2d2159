/* ember train: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_train(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember train: not implemented yet\n");
    return 2;
}
