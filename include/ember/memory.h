/* Device memory: the per-device caching allocator's statistics and controls, as
 * torch.cuda.memory_allocated() / memory_reserved() / memory_stats() / empty_cache().
 *
 * "Allocated" is memory held by live tensors (block sizes, rounded up to 512 B);
 * "reserved" is what the allocator took from the device (segments), allocated or cached.
 * Every function takes a device ("cuda" without an index means the current one); a device
 * that never allocated reports zeros.
 *
 * Environment: EMBER_NO_CACHE=1 turns caching off (every allocation goes to the device).
 * EMBER_MEMORY_CAP="cpu=512MiB,opencl:0=0.5,cuda=8GB" limits what the allocator reserves
 * per device: bytes with a unit (B, KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB, or
 * K, M, G, T alone = powers of 1024) or a fraction (0 < f <= 1) of the device's total
 * memory. An entry applies to its device only; a bare value ("4GiB") to every device, below
 * a device type ("opencl=2G"), below one device ("opencl:0=1G"); the same device given twice
 * at one level is an error, and so is an empty entry ("cpu=5MiB,,"). EMBER_MEMORY_POLICY=pytorch follows PyTorch's caching policy exactly; the default
 * ("ember") differs in two points: before taking a new segment from the device, it gives back
 * the fully free cached segments of that pool, which best fit just found too small (this
 * halves peak reserved memory when shapes vary); and a small request that no small block fits
 * takes its 2 MiB segment out of a free block of the large pool when there is one, which goes
 * back to the large pool as soon as its last small block is freed, so the two pools share
 * memory (see docs/BENCHMARKS.md).
 * EMBER_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch's syntax, CUDA devices only): each pool
 * grows one reserved address range by mapping memory at its end instead of taking new segments,
 * so changing shapes do not fragment memory; empty_cache unmaps the free end. All of these are
 * read when a device first allocates or is first asked for statistics. */
#ifndef EMBER_MEMORY_H
#define EMBER_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/device.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes held by live allocations on d, and its peak since the last reset. A device value
 * that names no device (an unknown type, an index below -1, cpu:1) records EM_ERR_DEVICE and
 * gives 0, as do the other statistics below. */
EM_API int64_t em_memory_allocated(em_device d);
EM_API int64_t em_memory_max_allocated(em_device d); /* (the peak) */
/* Bytes the allocator holds from the device (allocated + cached), and its peak. */
EM_API int64_t em_memory_reserved(em_device d);
EM_API int64_t em_memory_max_reserved(em_device d);  /* (the peak) */
/* Set every peak to the current value (torch.cuda.reset_peak_memory_stats). */
EM_API void em_memory_reset_peak_stats(em_device d);
/* Zero the running totals, retry and out-of-memory counts (reset_accumulated_memory_stats). */
EM_API void em_memory_reset_accumulated_stats(em_device d);
/* Give every fully free cached segment back to the device (also on the CPU). Memory that
 * shares a segment with a live block stays reserved. */
EM_API em_status em_memory_empty_cache(em_device d);

/* One statistic, as PyTorch keeps them: current value, peak since reset, and the running
 * totals of increases ("allocated") and decreases ("freed"). */
typedef struct em_memory_stat { int64_t current, peak, allocated, freed; /* see above */ } em_memory_stat;

/* Index into the arrays of em_memory_stats: both pools, blocks <= 1 MiB, larger blocks. */
enum { EM_MEMORY_ALL = 0, EM_MEMORY_SMALL_POOL = 1, EM_MEMORY_LARGE_POOL = 2, EM_MEMORY_POOLS = 3 };

/* torch.cuda.memory_stats(): each statistic for all blocks, small and large ones. */
typedef struct em_memory_stats {
    em_memory_stat allocated_bytes[EM_MEMORY_POOLS];      /* live blocks (rounded sizes) */
    em_memory_stat active_bytes[EM_MEMORY_POOLS];         /* live blocks, plus freed ones still in use by a queue */
    em_memory_stat requested_bytes[EM_MEMORY_POOLS];      /* live blocks as requested (unrounded) */
    em_memory_stat reserved_bytes[EM_MEMORY_POOLS];       /* segments taken from the device, by the pool
                                                            that holds their memory (a small segment nested
                                                            in a large block's memory: the small pool's) */
    em_memory_stat inactive_split_bytes[EM_MEMORY_POOLS]; /* free blocks inside partly used segments
                                                            ("non-releasable": empty_cache cannot return them) */
    em_memory_stat allocation[EM_MEMORY_POOLS];           /* counts of live blocks */
    em_memory_stat active[EM_MEMORY_POOLS];               /* counts of active blocks */
    em_memory_stat segment[EM_MEMORY_POOLS];              /* counts of segments taken from the device
                                                            (nested ones are not) */
    em_memory_stat inactive_split[EM_MEMORY_POOLS];       /* counts of inactive split blocks */
    int64_t num_raw_allocs;      /* calls that took memory from the device */
    int64_t num_raw_frees;       /* segments given back */
    int64_t num_alloc_retries;   /* times the cache was freed to retry a failed allocation */
    int64_t num_ooms;            /* allocations that failed for good */
    int64_t num_stream_waits;    /* reuses of a block that had to wait for another queue */
    int64_t largest_free_block;  /* biggest cached block, in bytes */
    int64_t cached_segments;     /* fully free segments held (what empty_cache would return) */
    int64_t cap;                 /* the reservation cap in bytes, or -1 for none */
    bool caching;                /* false under EMBER_NO_CACHE=1 */
} em_memory_stats;

/* All statistics of device d. */
EM_API em_status em_memory_get_stats(em_device d, em_memory_stats *out);
/* A table like torch.cuda.memory_summary() written into buf (truncated to size, always
 * terminated). Returns the length of the full table, as snprintf does (0 on error). */
EM_API size_t em_memory_summary(em_device d, char *buf, size_t size);

/* Limit what the allocator reserves on d (bytes < 0 removes the cap). An allocation that
 * would pass the cap frees the cache, retries, then fails with EM_ERR_OUT_OF_MEMORY. */
EM_API em_status em_memory_set_cap(em_device d, int64_t bytes);
/* The cap as a fraction 0 < f <= 1 of the device's total memory (set_per_process_memory_fraction). */
EM_API em_status em_memory_set_cap_fraction(em_device d, double fraction);
/* The cap of d in bytes, or -1 for none. */
EM_API int64_t em_memory_get_cap(em_device d);
/* Reads d's part of EMBER_MEMORY_CAP and EMBER_MEMORY_POLICY now (otherwise they are read when
 * d first allocates, and a bad setting fails that allocation): EM_ERR_ARGUMENT naming the
 * variable and the entry, so that a program can refuse a bad setting before any work. */
EM_API em_status em_memory_check_env(em_device d);

/* Pinned (page-locked) host memory has its own cache: the same statistics (pool EM_MEMORY_ALL). */
EM_API em_status em_memory_get_pinned_stats(em_memory_stats *out);
/* Give every cached, unused pinned block back to the system. */
EM_API void em_memory_empty_pinned_cache(void);

/* Memory history, as torch.cuda.memory._record_memory_history: while on, every allocation and
 * free of every device's allocator is recorded (time, device, stream, address, size, the
 * thread's tag, and the device's allocated and reserved bytes after it), keeping the last
 * max_entries events. Turning it on starts a new recording; turning it off keeps the events
 * for em_memory_dump_history. `ember memory-timeline FILE.json -o out.svg` draws them. */
EM_API em_status em_memory_record_history(bool enabled, int64_t max_entries);
/* Write the recorded events as JSON (format "ember-memory-history", version 1: a "columns" list
 * and an "events" list of rows, oldest first; "dropped" counts events pushed out of the ring). */
EM_API em_status em_memory_dump_history(const char *path);
/* Events held now. */
EM_API int64_t em_memory_history_length(void);
/* The tag of the calling thread's allocations from now on (copied, at most 47 bytes; NULL or ""
 * for none): an op's or a layer's name, a phase of the step. em_memory_get_tag copies the
 * current one into buf (as snprintf) and returns its length, so a caller can set its own and
 * put the previous one back. nn's em_forward tags each module's allocations with its kind where
 * the caller set none. */
EM_API void em_memory_set_tag(const char *tag);
/* The calling thread's tag copied into buf (as snprintf); returns its length. */
EM_API size_t em_memory_get_tag(char *buf, size_t size);

/* Parse a byte count with an optional unit ("512MiB", "1.5GB", "4096"); EM_ERR_ARGUMENT if bad. */
EM_API em_status em_memory_parse_size(const char *s, int64_t *out);
/* Format bytes as PyTorch's OOM message does: "512 bytes", "1.50 KiB", "2.00 GiB". */
EM_API void em_memory_format_size(int64_t bytes, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
