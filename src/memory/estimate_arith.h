/* The arithmetic of a memory estimate (src/memory/estimate.c) from plain numbers. What the
 * optimizer keeps per parameter comes from the caller (src/optim/estimate.c, which knows the
 * optimizers), so memory knows no optimizer. Reached by optim through core's internal_api.h. */
#ifndef EM_MEMORY_ESTIMATE_ARITH_H
#define EM_MEMORY_ESTIMATE_ARITH_H

#include <ember/estimate.h>

/* What fine-tuning's optimizer keeps, as the estimate counts and explains it. */
typedef struct em_estimate_states {
    int per_param;      /* parameter-sized states per trainable parameter */
    const char *what;   /* the optimizer-states line's words: "Adam keeps 2 states (exp_avg, exp_avg_sq)" */
    const char *name;   /* the optimizer in the workspace line's words: "adam" */
} em_estimate_states;

/* em_estimate_memory (include/ember/estimate.h) with o->optimizer's states given; states
 * NULL: the caller knows no such optimizer, an EM_ERR_ARGUMENT like a bad mode's. */
em_status em__estimate_memory(const em_estimate_opts *o, const em_estimate_states *states, em_estimate *out);

#endif
