/* A module for test_sanitizer_leaks: memory whose only pointer is a thread-local variable of a
 * dlopen'd library, as PoCL's and Open MPI's components hold theirs. glibc allocates such a
 * library's thread-local block with malloc in each thread that first touches it. */
#include <stdlib.h>

static __thread void *held;

void thread_local_holder_hold(size_t bytes);
void thread_local_holder_hold(size_t bytes) { held = malloc(bytes); }
