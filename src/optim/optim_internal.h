/* Internal switches of the optimizers, for tests and benchmarks. */
#ifndef EM_OPTIM_INTERNAL_H
#define EM_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/optim.h>

/* fused = false makes every em_step take the op-by-op path (the reference the backends'
 * fused kernels are checked against); true (the default) uses them where they apply. */
void em__optim_set_fused(em_optimizer *opt, bool fused);
/* How many parameter updates a fused kernel has done (proves which path ran). */
int64_t em__optim_fused_updates(const em_optimizer *opt);

#endif
