/* Perplexity by Hugging Face's strided windows (the perplexity guide of transformers'
 * documentation): windows of max_length ids start every stride ids; a window's labels before
 * the previous window's end are masked (-100), the model's loss is the mean negative
 * log-likelihood of the rest (each predicted from the ids before it), and the guide sums each
 * loss times its number of valid labels less one ("the internal label shift") and divides by
 * the sum of those counts. The window's logits are computed only for the positions whose
 * predictions are scored (logits_to_keep). */
#include <math.h>
#include <stdlib.h>

#include "models_internal.h"

static em_status perplexity_windows(em_model *m, const int64_t *ids, int64_t n, const em_perplexity_opts *opts,
                                    em_perplexity *out) {
    if (!m || !ids || !out) return em_error(EM_ERR_ARGUMENT, "em_model_perplexity: NULL argument");
    em_perplexity_opts o = opts ? *opts : (em_perplexity_opts){0};
    int64_t max_length = o.max_length ? o.max_length : m->cfg.max_position_embeddings;
    if (n < 2) return em_error(EM_ERR_ARGUMENT, "em_model_perplexity: %lld ids: a perplexity needs at least 2", (long long)n);
    if (max_length < 2 || o.stride < 0)
        return em_error(EM_ERR_ARGUMENT, "em_model_perplexity: max_length (%lld) must be at least 2 and stride (%lld) "
                        "not negative", (long long)max_length, (long long)o.stride);
    if (m->cfg.family == EM_MODEL_GPT2 && max_length > m->cfg.max_position_embeddings)
        return em_error(EM_ERR_ARGUMENT, "em_model_perplexity: max_length %lld is past GPT-2's n_positions (%lld)",
                        (long long)max_length, (long long)m->cfg.max_position_embeddings);
    int64_t stride = o.stride ? o.stride : (max_length + 1) / 2;
    double nll_sum = 0;
    int64_t count = 0, windows = 0, prev_end = 0;
    for (int64_t begin = 0; begin < n; begin += stride) {
        int64_t end = begin + max_length < n ? begin + max_length : n, len = end - begin;
        int64_t target = end - prev_end;   /* the labels this window scores (the last `target` of it) */
        int64_t first = len - target > 1 ? len - target : 1;   /* the first scored label's index */
        int64_t scored = len - first;
        if (scored > 0) {
            em_scope s = em_scope_begin();
            em_tensor *window = em_from_data(ids + begin, EM_I64, EM_SHAPE(1, len), EM_OPTS(.dtype = EM_I64));
            /* the logits at first - 1 .. len - 2 predict the labels first .. len - 1 */
            em_tensor *logits = em_model_forward(m, window, &(em_forward_opts){.logits_to_keep = scored + 1});
            em_tensor *pred = logits ? em_narrow(em_to_dtype(em_reshape(logits, EM_SHAPE(scored + 1, -1)), EM_F32), 0,
                                                 0, scored) : NULL;
            em_tensor *labels = em_from_data(ids + begin + first, EM_I64, EM_SHAPE(scored),
                                             EM_OPTS(.dtype = EM_I64, .device = m->device));
            double loss = em_item(em_cross_entropy(pred, labels, 0.0));
            em_scope_end(s);
            if (em_failed()) return em_last_status();
            /* the guide's weight: valid labels less one (for the first window, exactly the count) */
            int64_t weight = (len < target ? len : target) - 1;
            nll_sum += loss * (double)weight;
            count += weight;
            windows++;
        }
        prev_end = end;
        if (end == n) break;
    }
    if (count <= 0)
        return em_error(EM_ERR_ARGUMENT, "em_model_perplexity: no token was scored (stride %lld, max_length %lld, %lld "
                        "ids)", (long long)stride, (long long)max_length, (long long)n);
    out->nll = nll_sum / (double)count;
    out->perplexity = exp(out->nll);
    out->tokens = count;
    out->windows = windows;
    return EM_OK;
}

/* Inference only: in no-grad mode, so that a model with trainable LoRA adapters records no
 * graph (and its adapters' outputs may be written into the cache). */
em_status em_model_perplexity(em_model *m, const int64_t *ids, int64_t n, const em_perplexity_opts *opts,
                              em_perplexity *out) {
    em_grad_mode g = em_no_grad_begin();
    em_status st = perplexity_windows(m, ids, n, opts, out);
    em_no_grad_end(g);
    return st;
}
