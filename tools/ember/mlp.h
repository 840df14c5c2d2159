/* What `ember train` and `ember eval` share: the seed's model, the data, evaluation, and
 * the small helpers for devices, output files and output. */
#ifndef EMBER_TOOL_MLP_H
#define EMBER_TOOL_MLP_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

/* The seed's model: Linear(784, 256), ReLU, Linear(256, 10). */
em_module *mlp_new(void);

/* Fashion-MNIST's train or test split from dir (NULL: the Debian package or EMBER_DATA_DIR),
 * the first limit samples only when limit > 0. Pixels in [0, 1], as torchvision's ToTensor.
 * An empty split, or a limit (given as option `opt`) beyond the split's size, is an error. */
em_dataset *mlp_dataset(const char *dir, bool train, int64_t limit, const char *opt);

typedef struct mlp_eval {
    double accuracy;        /* fraction correct */
    double loss;            /* mean cross-entropy */
    int64_t samples;
    double seconds;         /* the whole pass, data movement included */
} mlp_eval;
/* Accuracy and loss of m over ds on device, batches of batch_size, without gradients. */
em_status mlp_evaluate(em_module *m, const em_dataset *ds, em_device device, int64_t batch_size, mlp_eval *out);

/* "auto" or a device string, given as `what` (an option's name, or EMBER_DEVICE); prints
 * the error and returns false if the device is unknown or unavailable. "auto" is
 * EMBER_DEVICE when that is set (then checked the same way), else em_device_auto(). */
bool mlp_parse_device(const char *tool, const char *what, const char *s, em_device *out);
/* The device when none was named: EMBER_DEVICE, checked, or auto-selection. */
bool mlp_default_device(const char *tool, em_device *out);
/* EMBER_MEMORY_CAP and EMBER_MEMORY_POLICY for the CPU (the data lives there) and the n
 * devices a command will use, checked before any work, as EMBER_DEVICE is: prints the bad
 * entry and returns false. */
bool mlp_check_memory_env(const char *tool, const em_device *devices, int n);
/* An output file given as option `opt`, checked before any work: not empty, within
 * PATH_MAX and NAME_MAX, not a directory or a device, in an existing folder where a file
 * can be created. Prints why not and returns false. */
bool mlp_check_output(const char *tool, const char *opt, const char *path);
/* An output folder given as option `opt` (made when missing, with its missing parents),
 * checked before any work: not empty, within PATH_MAX, a folder where a file can be created,
 * or else a path whose nearest existing folder lets one be made. Prints why not and returns
 * false. */
bool mlp_check_folder(const char *tool, const char *opt, const char *path);

double mlp_now(void);   /* monotonic seconds */
/* "allocated 1.2 MiB, peak 3.4 MiB, reserved 4.0 MiB" for device d. */
void mlp_memory_line(em_device d, char *buf, size_t size);

#endif
