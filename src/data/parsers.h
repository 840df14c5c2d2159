/* File parsers over plain memory (no tensors), shared by the tensor-level loaders in
 * src/data/, the fuzz targets in fuzz/ and the tests. Every parser is bounds-checked,
 * never reads outside [buf, buf + len), never aborts, and on failure records an error
 * (em_error) that starts with `name` and gives the byte offset, then returns its code.
 * On failure the output holds nothing to free (but freeing it is harmless). */
#ifndef EM_DATA_PARSERS_H
#define EM_DATA_PARSERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/dtype.h>
#include <ember/io.h>
#include <ember/tensor.h>

/* Parsed files are refused above this many bytes of array data (a sane bound that keeps
 * the size arithmetic far from overflow). */
#define EM__MAX_ARRAY_BYTES ((uint64_t)1 << 40)

/* A dense row-major array in host byte order. */
typedef struct em__array {
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    void *data;   /* nbytes long; may point into the parsed buffer when !owned (unaligned) */
    bool owned;   /* data was malloc'ed by the parser */
} em__array;

void em__array_free(em__array *a);

/* numel of shape[0..ndim) times elem_size, checked against overflow and
 * EM__MAX_ARRAY_BYTES; false when it does not fit. */
bool em__shape_bytes(int ndim, const int64_t *shape, size_t elem_size, int64_t *numel,
                     size_t *nbytes);

/* IDX: magic 0x00 0x00 <dtype> <ndim>, ndim big-endian u32 dims, then big-endian data.
 * Gzip input (1f 8b) is inflated first; offsets in errors then count decompressed bytes. */
em_status em__idx_parse(const char *name, const void *buf, size_t len, em__array *out);

/* .npy versions 1.0, 2.0 and 3.0. */
em_status em__npy_parse(const char *name, const void *buf, size_t len, em__array *out);
/* The complete .npy header (magic, version, length, dict, padding) for dtype and shape.
 * Returns its length, or 0 with an error when dtype has no .npy spelling. */
size_t em__npy_header(em_dtype dt, int ndim, const int64_t *shape, char *out, size_t cap);

/* Numeric CSV: x gets float32 [rows, features]; y (when a label column is chosen) gets
 * int64 [rows]; y may be NULL to treat every column as a feature. */
em_status em__csv_parse(const char *name, const void *buf, size_t len, const em_csv_opts *o,
                        em__array *x, em__array *y);

/* safetensors */
typedef struct em__st_tensor {
    char *name;
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    uint64_t begin, end;      /* byte offsets in the data section (after the header) */
} em__st_tensor;

typedef struct em__st_file {
    int count;
    em__st_tensor *tensors;   /* sorted by begin */
    int meta_count;
    char **meta_keys, **meta_values;
    size_t data_start;        /* 8 + header length */
} em__st_file;

/* The header's limit, as in the reference implementation. */
#define EM__ST_MAX_HEADER ((uint64_t)100000000)

em_status em__safetensors_parse(const char *name, const void *buf, size_t len,
                                em__st_file *out);
/* The pieces of em__safetensors_parse, for a reader that holds only the start of the file:
 * the header length from the first 8 of avail bytes (checked against the file's length and
 * the limit), then the header from avail >= 8 + that length bytes, checked as a file of
 * file_len bytes (everything but the tensors' values), then each tensor's bytes (a BOOL
 * tensor holds only 0 and 1; at: their file offset, for the message). */
em_status em__safetensors_header_length(const char *name, const void *buf, size_t avail, uint64_t file_len,
                                        uint64_t *hl);
em_status em__safetensors_parse_header(const char *name, const void *buf, size_t avail, uint64_t file_len,
                                       em__st_file *out);
em_status em__st_check_values(const char *name, const em__st_tensor *t, const uint8_t *bytes, uint64_t at);
void em__st_file_free(em__st_file *f);
/* "F32", ...; NULL for a dtype safetensors cannot name. */
const char *em__st_dtype_name(em_dtype dt);

/* A safetensors header for n tensors given in the order their data will be written
 * (names must already be sorted and unique): JSON padded with spaces to a multiple of 8,
 * preceded by its 8-byte little-endian length. Malloc'ed; *len gets the total size. */
char *em__st_header(int n, const char *const *names, const em_dtype *dtypes,
                    const em_shape *shapes, size_t *len);
/* The same with a "__metadata__" map of nmeta string pairs. */
char *em__st_header_meta(int n, const char *const *names, const em_dtype *dtypes, const em_shape *shapes,
                         int nmeta, const char *const *keys, const char *const *values, size_t *len);

/* ---- files (src/data/file.c) ---- */
/* A format's size from its first len bytes: EM_OK with *total set to the whole file's size
 * (0: not known yet, keep reading), or the parser's error when these bytes already show a
 * bad file. */
typedef em_status (*em__size_fn)(const char *name, const uint8_t *buf, size_t len, uint64_t *total);
/* A whole file in memory, read with read(). Never mapped: a mapping of a file that another
 * process truncates meanwhile faults (SIGBUS) when the missing pages are read, while read()
 * reports the end; a regular file that ends before the size it had when opened is an error. */
typedef struct em__file_map {
    const uint8_t *data;
    size_t len;
    void *heap;       /* free this */
} em__file_map;

em_status em__file_map_open(const char *path, em__file_map *m);
void em__file_map_close(em__file_map *m);

/* A file read piece by piece where its reader wants (a safetensors file's header, then each
 * tensor straight into its memory): a regular file with pread() at each offset, anything
 * else (a pipe) read whole first, as em__file_map_open_sized does. */
typedef struct em__file_in {
    const char *path;
    int fd;           /* a regular file, or -1 */
    uint64_t size;    /* its size when opened (a stream: the bytes read) */
    em__file_map mem; /* a stream's bytes */
} em__file_in;

em_status em__file_in_open(const char *path, em__file_in *f, em__size_fn size);
/* n bytes at offset off into dst. A regular file that ends before them (it shrank after it was
 * opened) is an error naming the file and the bytes. */
em_status em__file_in_read(em__file_in *f, uint64_t off, void *dst, size_t n);
void em__file_in_close(em__file_in *f);

/* A file that is not a regular file (a pipe, /dev/zero, /dev/urandom) has no size to map:
 * it is read until its header says it must have ended, or up to this many bytes. */
#define EM__MAX_STREAM_BYTES ((size_t)1 << 30)
/* The limit in force (EM__MAX_STREAM_BYTES unless a test lowered it); returns the old one. */
size_t em__set_stream_limit(size_t bytes);

/* em__file_map_open that asks size() while reading a stream, and never reads more than
 * one byte past the total it gives (that byte lets the parser report trailing data). */
em_status em__file_map_open_sized(const char *path, em__file_map *m, em__size_fn size);
em_status em__idx_size(const char *name, const uint8_t *buf, size_t len, uint64_t *total);
em_status em__safetensors_size(const char *name, const uint8_t *buf, size_t len, uint64_t *total);

/* Atomic writer: data goes to a temporary file in the destination's directory; commit fsyncs
 * it, renames it over the destination and fsyncs the directory. Any failure (including in
 * commit) removes the temporary file and leaves the destination untouched. The destination is
 * path, or, when path is a symbolic link, the file it leads to (the link stays). A replaced
 * file keeps its mode (and its owner, where the process may set it); a new one gets the
 * umask's. The writer holds a lock on its temporary, which tells a later save's cleanup that
 * it is alive (file.c). */
typedef struct em__atomic_file {
    int fd;
    char *path;       /* as given, for messages */
    char *dest;       /* the file replaced */
    char *tmp_path;
} em__atomic_file;

em_status em__atomic_open(em__atomic_file *f, const char *path);
em_status em__atomic_write(em__atomic_file *f, const void *data, size_t n);
em_status em__atomic_commit(em__atomic_file *f);
void em__atomic_abort(em__atomic_file *f);   /* safe to call after commit or twice */

#endif
