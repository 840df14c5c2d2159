/* The inside of em_dataset, shared by dataset.c and loader.c. */
#ifndef EM_DATA_DATASET_H
#define EM_DATA_DATASET_H

#include <ember/data.h>

struct em_dataset {
    em_tensor *x;   /* [N, ...] float32, CPU, contiguous (owned reference) */
    em_tensor *y;   /* [N] int64, CPU, contiguous, or NULL */
    int64_t n;
};

#endif
