/* Inside src/models: the pieces of generation that generate.c and sampling.c share. */
#ifndef EM_GENERATE_INTERNAL_H
#define EM_GENERATE_INTERNAL_H

#include <stdint.h>
#include <ember/ember.h>
#include <ember/generate.h>
#include "models_internal.h"

/* Work space of one row's processing, vocab entries each (allocated once per generation). */
typedef struct em_sample_scratch {
    float *values;    /* top-k's sorted copy */
    int64_t *order;   /* top-p's ids by score */
} em_sample_scratch;
em_status em__sample_scratch_init(em_sample_scratch *scratch, int64_t vocab);
void em__sample_scratch_free(em_sample_scratch *scratch);   /* zeroes it; a zeroed one is ignored */

/* The checks of an em_sampling's values (NULL passes), errors prefixed by op. */
em_status em__sampling_check(const em_sampling *s, const char *op);
/* em_logits_process with the ids seen as a mask seen[0..vocab) (NULL: none). */
em_status em__logits_process_seen(float *scores, int64_t vocab, const uint8_t *seen, const em_sampling *s,
                                  em_sample_scratch *scratch);
/* em_sample_token without the argument checks. */
int64_t em__sample_from(const float *scores, int64_t vocab, const em_sampling *s, uint64_t counter);

/* Which form the one-token decode steps take: -1 the default (the static form, replayed from
 * a CUDA graph, on CUDA only), 1 the static form on every device (tests: it must give the
 * dynamic form's tokens), 0 the dynamic form everywhere. Returns the previous setting. */
int em__generate_static_decode(int mode);

#endif
