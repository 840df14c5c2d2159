/* `ember train` under mpirun, srun or `ember launch`: DistributedDataParallel over the
 * ranks (train_dist.c). cmd_train.c calls these at a few points; with one process they
 * change nothing. */
#ifndef EMBER_TOOL_TRAIN_DIST_H
#define EMBER_TOOL_TRAIN_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <ember/ember.h>

/* Joins the job when a launcher started more than one process (else does nothing): picks
 * this rank's device (cuda:LOCAL_RANK, opencl:LOCAL_RANK mod count, or the CPU), shares
 * the cores among the ranks on this host unless threads_given, and silences stdout on
 * ranks other than 0. 0 on success, 1 (message printed) on failure. */
int train_dist_init(const char *tool, em_device *device, bool threads_given);
bool train_dist_active(void);
/* Rank 0, or the only process: the one that prints and writes checkpoints. */
bool train_dist_is_main(void);
int train_dist_rank(void);
int train_dist_world(void);
/* Wraps the model (broadcasting rank 0's weights); 0 or 1 (message printed). */
int train_dist_wrap(const char *tool, em_module *model);
/* This rank's shard of the data. */
void train_dist_loader_opts(em_loader_opts *o);
/* Any rank asked to stop (a signal, --max-steps): every rank stops at the same step. */
bool train_dist_agree_stop(bool stop);
/* The mean of x over the ranks. */
double train_dist_mean(double x);
/* x summed over the ranks (x alone without ranks; NAN when the all-reduce fails). */
double train_dist_sum(double x);
/* Where the progress display goes (NULL-safe /dev/null on ranks other than 0). */
FILE *train_dist_progress_out(void);
/* A checkpoint written by `from` ranks resumed on this run's ranks: the position in the
 * epoch counted in samples, converted to this run's batches (says so when it changes). */
void train_dist_convert_position(int64_t from_world, int64_t *batch, double *loss_sum);
void train_dist_finish(void);

#endif
