/* `ember finetune` under `ember launch -n N`, mpirun or srun (finetune_dist.c): the ranks'
 * parts of every batch and, without --zero, DistributedDataParallel over the trained weights.
 * With one process every function here changes nothing. */
#ifndef EMBER_TOOL_FINETUNE_DIST_H
#define EMBER_TOOL_FINETUNE_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

/* Joins the job when a launcher started several processes (train_dist_init: a device and a
 * share of the cores per rank, stdout silenced on ranks other than 0); with --zero and one
 * process, a group of one. 0, or 1 with the message printed. */
int finetune_dist_init(const char *tool, em_device *device, bool threads_given, bool zero);
/* Without --zero on several ranks: wraps the trained module (the adapters, or with --full the
 * whole model) in DDP, which checks that every rank holds the same parameters and broadcasts
 * rank 0's. batch: the global batch, for the message. 0, or 1 with the message printed. */
int finetune_dist_wrap(const char *tool, em_module *trained, int64_t batch);
/* This rank's rows of a micro-batch of `rows`: a contiguous 1/N of them (maybe none), the
 * split --zero uses too. */
void finetune_dist_rows(int64_t rows, int64_t *first, int64_t *count);
/* Whether the next backward all-reduces the gradients: false for the micro-batches of a step
 * before its last (PyTorch's no_sync), so a step communicates once. */
void finetune_dist_sync_next(bool sync);
/* The sum of x over the ranks. */
double finetune_dist_sum(double x);
/* Did any rank say so? (every rank calls it at the same point) */
bool finetune_dist_any(bool mine);
/* Unhooks and frees the DDP wrapper (training is over); nothing without one. */
void finetune_dist_unwrap(void);
/* Frees the DDP wrapper if still there and leaves the job. */
void finetune_dist_finish(void);

#endif
