/* Reading and writing tensors: IDX (MNIST), .npy, numeric CSV and safetensors.
 *
 * Every loader returns a CPU tensor (a new reference, scoped like every Ember result),
 * or NULL and an error that names the file and the byte offset of the problem:
 *   "train-images-idx3-ubyte.gz: truncated at byte 16: expected 47040000 bytes of pixel
 *    data, found 1200".
 * Every writer takes tensors on any device (they are copied to the host) and writes
 * atomically: a temporary file in the same directory, fsync, rename. On failure the
 * old file (if any) is left as it was and the temporary file is removed. A path that is a
 * symbolic link is written through: the file it leads to is replaced, the link stays. A
 * replaced file keeps its mode (and its owner, where the process may give it); a new one
 * gets the umask's mode. */
#ifndef EMBER_IO_H
#define EMBER_IO_H

#include <ember/export.h>
#include <ember/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX (the MNIST / Fashion-MNIST format), raw or gzip-compressed ---- */
/* Shape as stored; dtype u8 for 0x08, float32 for 0x0D, float64 for 0x0E, int32 for the
 * integer codes 0x09 (i8), 0x0B (i16) and 0x0C (i32), which Ember widens. */
EM_API em_tensor *em_load_idx(const char *path);

/* ---- NumPy .npy (format versions 1.0, 2.0, 3.0; C order, little-endian) ---- */
/* dtypes <f4 <f8 <f2 <i8 <i4 |u1 |b1; fortran_order and big-endian are "not supported". */
EM_API em_tensor *em_load_npy(const char *path);
/* Writes a version 1.0 file (2.0 if the header needs it). bfloat16 has no .npy dtype: error. */
EM_API em_status em_save_npy(const char *path, em_tensor *t);

/* ---- numeric CSV ---- */
#define EM_CSV_NO_LABEL INT32_MIN /* em_csv_opts.label_column: no label column */
/* How to read a CSV file; zeroed: no header, label in column 0, commas. */
typedef struct em_csv_opts {
    bool header;       /* the first row holds column names: skip it (its width is still checked) */
    int label_column;  /* the label's column, from 0; negative counts from the end (-1: last);
                        * EM_CSV_NO_LABEL: every column is a feature. Zeroed: column 0. */
    char delimiter;    /* 0 means ',' */
} em_csv_opts;
#define EM_CSV_OPTS(...) ((em_csv_opts){__VA_ARGS__}) /* EM_CSV_OPTS(.header = true) */
/* Features as float32 [rows, columns without the label]. When labels is not NULL and a
 * label column is chosen, *labels gets int64 [rows] (label values must be integers).
 * Empty lines are skipped; a ragged row or a field that is not a number is an error that
 * names the line and column. */
EM_API em_tensor *em_load_csv(const char *path, em_csv_opts opts, em_tensor **labels);

/* ---- safetensors ---- */
/* Dtype names F32 F64 F16 BF16 I64 I32 U8 BOOL. Header names are sorted, the header is
 * padded with spaces to a multiple of 8 bytes, and data follows in the same order. The header
 * is UTF-8 JSON: a name, key or value that is not UTF-8 is refused (EM_ERR_ARGUMENT). */
EM_API em_status em_safetensors_save(const char *path, const char *const *names,
                              em_tensor *const *tensors, int n);
/* The same with a "__metadata__" map: nmeta (key, value) string pairs. */
EM_API em_status em_safetensors_save_meta(const char *path, const char *const *names, em_tensor *const *tensors,
                                   int n, const char *const *keys, const char *const *values, int nmeta);

typedef struct em_safetensors em_safetensors; /* a loaded safetensors file */
/* Read a whole file; every tensor is placed on device (a copy). NULL and an error on failure.
 * A file the reference reader refuses is refused (a header that is not UTF-8, tensors that
 * overlap, leave a gap or are followed by more bytes). The file is read, never mapped: one
 * that shrinks while it loads is an error (EM_ERR_IO), not a crash. It is opened and read
 * once (a pipe or /dev/stdin works), so what is read is one version of it:
 * em_module_load_safetensors, em_checkpoint_load_safetensors and em_estimate_safetensors then
 * take what they need from the loaded file, never rereading it. */
EM_API em_safetensors *em_safetensors_load(const char *path, em_device device);
EM_API int em_safetensors_count(const em_safetensors *st); /* tensors in the file */
/* The path the file was loaded from (messages name it); NULL for NULL. */
EM_API const char *em_safetensors_path(const em_safetensors *st);
/* The i-th name in file order (sorted by data offset); NULL if i is out of range. */
EM_API const char *em_safetensors_name(const em_safetensors *st, int i);
/* The tensor called name: a new reference (scoped). NULL and EM_ERR_ARGUMENT if absent. */
EM_API em_tensor *em_safetensors_get(const em_safetensors *st, const char *name);
/* A "__metadata__" value, or NULL when the file has no such key. */
EM_API const char *em_safetensors_metadata(const em_safetensors *st, const char *key);
/* Releases the file's references; tensors handed out by get stay valid. NULL is ignored. */
EM_API void em_safetensors_free(em_safetensors *st);

#ifdef __cplusplus
}
#endif
#endif
