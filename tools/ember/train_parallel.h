/* `ember train --devices A,B`: DataParallel over several devices of this process
 * (include/ember/parallel.h). cmd_train.c parses the option and calls these. */
#ifndef EMBER_TOOL_TRAIN_PARALLEL_H
#define EMBER_TOOL_TRAIN_PARALLEL_H

#include <stdbool.h>
#include <ember/ember.h>

#define TRAIN_MAX_DEVICES 16

/* "opencl:0,opencl:1" or "cpu,opencl:0": 2 to TRAIN_MAX_DEVICES existing devices, none twice.
 * Prints why not ("tool: --devices ...") and returns false. */
bool train_parse_devices(const char *tool, const char *v, em_device *devs, int *n);
/* "opencl:0,opencl:1" into buf. */
void train_devices_str(const em_device *devs, int n, char *buf, size_t size);

#endif
