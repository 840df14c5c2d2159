/* TensorBoard summaries: a writer of TensorBoard's event files (scalars, histograms of a
 * tensor, text), readable by `tensorboard --logdir DIR` and its EventAccumulator. */
#ifndef EMBER_SUMMARY_H
#define EMBER_SUMMARY_H

#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An open event file: events.out.tfevents.TIME.HOST.PID in the writer's folder. One
 * thread at a time. Every record is written whole and flushed to the file before the call
 * returns, so a process killed at any point leaves a file TensorBoard reads. */
typedef struct em_summary_writer em_summary_writer;

/* Creates the folder dir (and its parents) if missing and opens a new event file in it,
 * starting with the file_version event ("brain.Event:2"). NULL and an EM_ERR_IO error
 * naming the folder when it cannot be made or written; nothing is left allocated. */
EM_API em_summary_writer *em_summary_writer_open(const char *dir);

/* The path of w's event file (owned by w; valid until em_summary_writer_close). */
EM_API const char *em_summary_writer_path(const em_summary_writer *w);

/* Appends a scalar (Summary.Value.simple_value, a float) under tag at step. */
EM_API em_status em_summary_add_scalar(em_summary_writer *w, const char *tag, double value, int64_t step);

/* Appends a histogram of t's values (any device and float or integer dtype; NaNs are an
 * error) under tag at step: min, max, count, sum, sum of squares and 30 equal-width
 * buckets between min and max. */
EM_API em_status em_summary_add_histogram(em_summary_writer *w, const char *tag, em_tensor *t, int64_t step);

/* Appends a text summary (TensorBoard's text plugin: a string tensor, Markdown) under tag
 * at step. */
EM_API em_status em_summary_add_text(em_summary_writer *w, const char *tag, const char *text, int64_t step);

/* Forces the written records to the disk (fsync): records already reach the file on
 * every add; this also survives a crash of the machine. */
EM_API em_status em_summary_writer_flush(em_summary_writer *w);

/* Flushes and closes the file and frees w (NULL is allowed); EM_ERR_IO if the final
 * flush or close failed (w is freed in any case). */
EM_API em_status em_summary_writer_close(em_summary_writer *w);

#ifdef __cplusplus
}
#endif
#endif
