/* Request-level fault injection for the fault sweep (tests/test_fault_sweep.c): see
 * em__mem_debug_fail_request in allocator.h. Raw-allocation faults are in config.c. */
#include <stdatomic.h>
#include "internal.h"

static atomic_llong debug_requests;     /* requests counted since the last arming */
static atomic_llong debug_fail_request; /* the request number that fails; 0: none */

void em__mem_debug_fail_request(int64_t nth) {
    atomic_store(&debug_fail_request, 0);
    atomic_store(&debug_requests, 0);
    atomic_store(&debug_fail_request, nth > 0 ? nth : 0);
}

int64_t em__mem_debug_requests(void) {
    return atomic_load(&debug_requests);
}

bool em__mem_debug_request_fails(void) {
    int64_t n = atomic_fetch_add_explicit(&debug_requests, 1, memory_order_relaxed) + 1;
    int64_t f = atomic_load_explicit(&debug_fail_request, memory_order_relaxed);
    return f > 0 && n == f;
}
