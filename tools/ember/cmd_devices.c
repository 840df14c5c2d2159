/* ember devices: what torch.cuda.is_available() / device_count() / get_device_name() /
 * get_device_properties() tell, for every device type, and which device auto-selection
 * picks and why. Exits 0 whether or not there is a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "commands.h"
#include "devices_report.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ember devices [--json]\n"
            "\n"
            "For each device type (cpu, cuda, mps, opencl): whether it is available and, if not,\n"
            "why; how many devices it has; each device's name, total and free memory, compute\n"
            "units (and compute capability for CUDA); then the device auto-selection picks\n"
            "(CUDA, then MPS, then an OpenCL GPU, then the CPU) and why.\n"
            "\n"
            "  --json   one JSON object instead of text (memory in bytes, null when unknown)\n"
            "  --help   this text\n"
            "\n"
            "Environment: EMBER_DEVICE=<device> (e.g. cpu, cuda:1, opencl:0) overrides auto-selection.\n");
}

int cmd_devices(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "ember devices: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    devrep_report *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "ember devices: out of memory\n");
        return 1;
    }
    devrep_gather(r);
    int rc = json ? devrep_write_json(stdout, r) : devrep_write_text(stdout, r);
    free(r);
    if (fflush(stdout) != 0 || rc != 0) {
        fprintf(stderr, "ember devices: could not write the report\n");
        return 1;
    }
    return 0;
}
