/* ember devices: not written yet (placeholder so the tool links). */
#include <stdio.h>
#include "commands.h"

int cmd_devices(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "ember devices: not implemented yet\n");
    return 2;
}
