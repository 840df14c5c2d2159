/* The CPU backend's thread pool. Between jobs a worker polls for the next one for a fraction
 * of a millisecond (a decoder's jobs come back to back), then sleeps on a condition variable,
 * so an idle pool does not keep taking cycles that vCPUs sharing a core would need. The
 * caller always takes part, and small work runs inline on it. */
#ifndef EM_BACKENDS_CPU_THREADS_H
#define EM_BACKENDS_CPU_THREADS_H

#include <stdint.h>

/* Work below this many elements is never handed to another thread. */
#define EM_CPU_MIN_GRAIN 32768

typedef void (*em_cpu_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Call fn(ctx, begin, end) over disjoint ranges covering [0, n), each at least `grain`
 * long (except the last), on up to em_get_num_threads() threads; returns when all are done.
 * Runs inline when n < 2 * grain, with one thread, or when called from inside a job. */
void em__cpu_parallel_for(int64_t n, int64_t grain, em_cpu_range_fn fn, void *ctx);

/* Threads a job may use now (em_get_num_threads(), at least 1). */
int em__cpu_num_threads(void);

#endif
