/* ember devices: what torch.cuda.is_available() / device_count() / get_device_name() /
 * get_device_properties() tell, for every device type, and which device auto-selection
 * picks and why. Exits 0 whether or not there is a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "commands.h"
#include "devices_report.h"
#include "options.h"

enum { D_JSON };
static const opt_spec devices_table[] = {
    [D_JSON] = OPTION_FLAG("--json", "one JSON object instead of text (memory in bytes, null when unknown)"),
};
OPT_TABLE_FITS(devices_table);

const opt_command devices_options = {
    .name = "ember devices",
    .usage = "ember devices [--json]",
    .about = "For each device type (cpu, cuda, mps, opencl): whether it is available and, if not, why; how many "
             "devices it has; each device's name, total and free memory, compute units (and compute capability "
             "for CUDA); then the device auto-selection picks (CUDA, then MPS, then an OpenCL GPU, then the CPU) "
             "and why.",
    .options = devices_table,
    .count = OPT_COUNT(devices_table),
    .epilogue = "Environment: EMBER_DEVICE=<device> (e.g. cpu, cuda:1, opencl:0) overrides auto-selection.",
    .exit_status = "0 done, whether or not there is a GPU; 1 the report could not be written; 2 bad arguments",
};

int cmd_devices(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&devices_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    bool json = opts.v[D_JSON].given;
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
