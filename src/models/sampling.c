/* Choosing the next token from a row of logits on the host: transformers' logits processors
 * (repetition penalty, temperature, top-k, top-p) in its order and arithmetic (float32, the
 * penalty and temperature as float32 scalars), then the argmax or a draw from Ember's Philox
 * generator, so that a seed gives the same tokens whichever device computed the logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate_internal.h"
#include "../util/errors.h"

em_status em__sampling_check(const em_sampling *s, const char *op) {
    if (!s) return EM_OK;
    if (!(s->temperature >= 0) || isinf(s->temperature))
        return em_error(EM_ERR_ARGUMENT, "%s: temperature must be 0 (greedy) or a positive number, got %g", op,
                        s->temperature);
    if (s->top_k < 0)
        return em_error(EM_ERR_ARGUMENT, "%s: top_k must be 0 (all tokens) or positive, got %lld", op,
                        (long long)s->top_k);
    if (!(s->top_p >= 0 && s->top_p <= 1))
        return em_error(EM_ERR_ARGUMENT, "%s: top_p must be in [0, 1] (0 or 1: all tokens), got %g", op, s->top_p);
    if (!(s->repetition_penalty >= 0) || isinf(s->repetition_penalty))
        return em_error(EM_ERR_ARGUMENT, "%s: repetition_penalty must be a positive number (0 or 1: none), got %g",
                        op, s->repetition_penalty);
    return EM_OK;
}

static int desc_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Indices sorted by their score, ascending (as transformers' top-p sorts); the scores for the
 * comparison come through a file-scope pointer because qsort has no context argument. The
 * sort runs on one thread's stack frame at a time: sort_scores is thread-local. */
static _Thread_local const float *sort_scores;
static int asc_index(const void *a, const void *b) {
    float x = sort_scores[*(const int64_t *)a], y = sort_scores[*(const int64_t *)b];
    if (x != y) return x < y ? -1 : 1;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    return (i > j) - (i < j);
}

em_status em__logits_process_seen(float *scores, int64_t vocab, const uint8_t *seen, const em_sampling *s,
                                  em_sample_scratch *scratch) {
    if (!s) return EM_OK;
    if (seen && s->repetition_penalty > 0 && s->repetition_penalty != 1) {
        float penalty = (float)s->repetition_penalty;
        for (int64_t i = 0; i < vocab; i++)
            if (seen[i]) scores[i] = scores[i] < 0 ? scores[i] * penalty : scores[i] / penalty;
    }
    if (s->temperature == 0) return EM_OK;
    if (s->temperature != 1) {
        float t = (float)s->temperature;
        for (int64_t i = 0; i < vocab; i++) scores[i] = scores[i] / t;
    }
    if (s->top_k > 0 && s->top_k < vocab) {
        memcpy(scratch->values, scores, (size_t)vocab * sizeof *scores);
        qsort(scratch->values, (size_t)vocab, sizeof *scratch->values, desc_float);
        float kth = scratch->values[s->top_k - 1];
        for (int64_t i = 0; i < vocab; i++)
            if (scores[i] < kth) scores[i] = -INFINITY;
    }
    if (s->top_p > 0 && s->top_p < 1) {
        /* only the entries still finite take part: a removed one has probability 0 and sorts
         * first, where it adds nothing to the cumulative sum */
        int64_t n = 0;
        float max = -INFINITY;
        for (int64_t i = 0; i < vocab; i++)
            if (scores[i] > -INFINITY) {
                scratch->order[n++] = i;
                if (scores[i] > max) max = scores[i];
            }
        if (n == 0) return EM_OK;
        sort_scores = scores;
        qsort(scratch->order, (size_t)n, sizeof *scratch->order, asc_index);
        double z = 0;
        for (int64_t j = 0; j < n; j++) z += exp((double)scores[scratch->order[j]] - max);
        double cum = 0, cut = 1 - s->top_p;
        for (int64_t j = 0; j < n - 1; j++) {   /* the most likely one always stays */
            cum += exp((double)scores[scratch->order[j]] - max) / z;
            if (cum <= cut) scores[scratch->order[j]] = -INFINITY;
            else break;
        }
    }
    return EM_OK;
}

int64_t em__sample_from(const float *scores, int64_t vocab, const em_sampling *s, uint64_t counter) {
    int64_t best = -1;
    for (int64_t i = 0; i < vocab; i++)
        if (scores[i] > -INFINITY && !isnan(scores[i]) && (best < 0 || scores[i] > scores[best])) best = i;
    if (best < 0) {
        em_error(EM_ERR_ARGUMENT, "em_sample_token: no token is left to choose (every score is -inf or NaN)");
        return -1;
    }
    if (!s || s->temperature == 0) return best;
    double max = scores[best], z = 0;
    for (int64_t i = 0; i < vocab; i++)
        if (scores[i] > -INFINITY) z += exp((double)scores[i] - max);
    double target = em__philox_uniform_f64(s->seed, counter) * z, cum = 0;
    int64_t last = best;
    for (int64_t i = 0; i < vocab; i++) {
        if (!(scores[i] > -INFINITY)) continue;
        cum += exp((double)scores[i] - max);
        last = i;
        if (cum > target) return i;
    }
    return last;   /* the sum's rounding left target at its very end */
}

em_status em__sample_scratch_init(em_sample_scratch *scratch, int64_t vocab) {
    scratch->values = malloc((size_t)vocab * sizeof *scratch->values);
    scratch->order = malloc((size_t)vocab * sizeof *scratch->order);
    if (!scratch->values || !scratch->order) {
        em__sample_scratch_free(scratch);
        return em_error(EM_ERR_OUT_OF_MEMORY, "generation: out of memory for the sampling's %lld scores",
                        (long long)vocab);
    }
    return EM_OK;
}

void em__sample_scratch_free(em_sample_scratch *scratch) {
    free(scratch->values);
    free(scratch->order);
    scratch->values = NULL;
    scratch->order = NULL;
}

em_status em_logits_process(float *scores, int64_t vocab, const int64_t *context, int64_t n_context,
                            const em_sampling *s) {
    const char *op = "em_logits_process";
    if (!scores || vocab < 1) return em_error(EM_ERR_ARGUMENT, "%s: expected scores and a vocabulary of at least 1, "
                                              "got %s and %lld", op, scores ? "scores" : "NULL", (long long)vocab);
    if (n_context < 0 || (n_context > 0 && !context))
        return em_error(EM_ERR_ARGUMENT, "%s: context must hold n_context (%lld) ids", op, (long long)n_context);
    if (em__sampling_check(s, op) != EM_OK) return em_last_status();
    if (!s) return EM_OK;
    uint8_t *seen = calloc((size_t)vocab, 1);
    em_sample_scratch scratch = {0};
    if (!seen) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
    if (em__sample_scratch_init(&scratch, vocab) != EM_OK) {
        free(seen);
        return em_last_status();
    }
    for (int64_t i = 0; i < n_context; i++)
        if (context[i] >= 0 && context[i] < vocab) seen[context[i]] = 1;
    em_status st = em__logits_process_seen(scores, vocab, seen, s, &scratch);
    em__sample_scratch_free(&scratch);
    free(seen);
    return st;
}

int64_t em_sample_token(const float *scores, int64_t vocab, const em_sampling *s, uint64_t counter) {
    if (!scores || vocab < 1) {
        em_error(EM_ERR_ARGUMENT, "em_sample_token: expected scores and a vocabulary of at least 1, got %s and %lld",
                 scores ? "scores" : "NULL", (long long)vocab);
        return -1;
    }
    if (em__sampling_check(s, "em_sample_token") != EM_OK) return -1;
    return em__sample_from(scores, vocab, s, counter);
}
