/* Text generation with a language model (include/ember/models.h) and its tokenizer
 * (include/ember/tokenizer.h): prefill the prompts, then one token per step with a key-value
 * cache allocated once, each token chosen greedily or drawn, and handed to a callback with
 * its text as it comes.
 *
 *   em_lm *lm = em_lm_load("Llama-3.2-1B", &(em_model_opts){.dtype = EM_BF16});
 *   const char *prompt = "The capital of France is";
 *   em_generation g;
 *   em_lm_generate(lm, &prompt, 1, &(em_generate_opts){.max_new_tokens = 64,
 *                  .sampling = {.temperature = 0.7, .top_p = 0.9, .seed = 1}}, &g);
 *   printf("%s\n", g.row[0].text);
 *   em_generation_free(&g);
 *   em_lm_free(lm);
 *
 * What transformers' generate() does, step for step:
 *   - the logits processors in its order: the repetition penalty (CTRL's: each id already in
 *     the row's prompt or generation, its logit divided by the penalty when positive,
 *     multiplied when negative), then, when sampling, the temperature (logits / T), top-k
 *     (every logit below the k-th largest removed: ties with it stay) and top-p (the
 *     smallest set of most likely tokens whose probability exceeds top_p stays, and always
 *     the most likely one); removed logits are -inf. Greedy (temperature 0) applies the
 *     penalty and takes the first largest logit, as do_sample=False does;
 *   - a draw is made on the host from the processed float32 logits with Ember's Philox
 *     generator (em__philox_uniform_f64: the seed and a counter, row << 32 | step): the
 *     inverse of the cumulative distribution over the ids in order. The same seed gives the
 *     same tokens on every device (up to logits that the devices round differently exactly
 *     at a boundary between two tokens' probabilities);
 *   - several prompts run as one batch: left-padded, with the attention mask and the
 *     position ids transformers builds (cumsum(mask) - 1), one forward per step for all of
 *     them. A row that has finished is fed padding while the others go on; a row's tokens
 *     are those it would get alone (the padding is masked out, the penalty ignores it);
 *   - a row stops at an end-of-sequence id (kept as its last token), when its text contains a
 *     stop string that the last token's text completes or reaches into (the token stays),
 *     after max_new_tokens, or when the callback says so.
 *
 * Errors follow Ember's model: a status, em_last_error() says what was expected and what was
 * found; nothing stays allocated after an error. */
#ifndef EMBER_GENERATE_H
#define EMBER_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/error.h>
#include <ember/models.h>
#include <ember/tokenizer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How each token is chosen. Zeroed: greedy, no penalty. */
typedef struct em_sampling {
    double temperature;        /* 0: greedy (argmax); > 0: draw from softmax(logits / temperature) */
    int64_t top_k;             /* when drawing, keep the top_k largest logits (and ties); 0: all */
    double top_p;              /* when drawing, keep the most likely tokens up to probability top_p; 0 or 1: all */
    double repetition_penalty; /* > 1 discourages ids already seen, < 1 favours them; 0 or 1: none */
    uint64_t seed;             /* the draws' seed: the same seed, the same tokens */
} em_sampling;

/* Applies s's logits processors to scores[0..vocab) in place, in transformers' order (see
 * above): the repetition penalty over the ids context[0..n_context) (each distinct id once;
 * ids outside [0, vocab) are ignored), then, when s->temperature > 0, temperature, top-k and
 * top-p. Removed entries become -INFINITY. s NULL: nothing to do. */
EM_API em_status em_logits_process(float *scores, int64_t vocab, const int64_t *context, int64_t n_context,
                                   const em_sampling *s);
/* The id chosen from processed scores[0..vocab): the first largest with s->temperature 0 (or
 * s NULL), else a draw from their softmax with the uniform number of (s->seed, counter).
 * -1 and an error when no score is finite or above -inf. */
EM_API int64_t em_sample_token(const float *scores, int64_t vocab, const em_sampling *s, uint64_t counter);

/* Why a row stopped. */
typedef enum em_finish_reason {
    EM_FINISH_LENGTH,   /* max_new_tokens were generated */
    EM_FINISH_EOS,      /* an end-of-sequence id (the row's last token) */
    EM_FINISH_STOP,     /* a stop string appeared in the row's text */
    EM_FINISH_CALLBACK, /* the callback returned false */
} em_finish_reason;

/* Called once per generated token of each row, in row order within a step: the row, the
 * token id, and the text it adds (valid until the callback returns; often empty, e.g. for a
 * character whose bytes span several tokens, or special tokens; never broken UTF-8; NULL with
 * len 0 without a tokenizer). Return true to go on, false to stop the whole generation
 * (every unfinished row ends with EM_FINISH_CALLBACK, this token kept). */
typedef bool (*em_token_callback)(int64_t row, int64_t token, const char *text, size_t len, void *user);

/* How to generate. Zeroed: 32 new tokens, greedy, the model's end-of-sequence ids. */
typedef struct em_generate_opts {
    int64_t max_new_tokens;       /* the most tokens each row gets; 0: 32 */
    em_sampling sampling;         /* how each token is chosen */
    const int64_t *eos_ids;       /* end-of-sequence ids; NULL: the model's (generation_config.json) */
    int n_eos;                    /* how many eos_ids */
    bool ignore_eos;              /* true: no end-of-sequence id stops a row */
    const char *const *stop;      /* stop strings (UTF-8, not empty); need a tokenizer */
    int n_stop;                   /* how many stop strings */
    em_token_callback on_token;   /* NULL: none */
    void *user;                   /* handed to on_token */
} em_generate_opts;

/* One row's result. */
typedef struct em_generated_row {
    int64_t *prompt;          /* the prompt's ids */
    int64_t n_prompt;         /* how many */
    int64_t *tokens;          /* the generated ids (an end-of-sequence id included) */
    int64_t n_tokens;         /* how many */
    char *text;               /* the generated ids' text, special tokens left out (NUL-terminated;
                               * NULL without a tokenizer) */
    size_t text_len;          /* its length in bytes */
    em_finish_reason finish;  /* why it stopped */
} em_generated_row;

/* A generation's results and what it cost. */
typedef struct em_generation {
    int64_t rows;               /* prompts */
    em_generated_row *row;      /* one per prompt, in order */
    int64_t prompt_tokens;      /* the prompts' ids over all rows (padding not counted) */
    int64_t generated_tokens;   /* generated ids over all rows */
    int64_t decode_tokens;      /* of those, the ones that needed a step after the prefill */
    int64_t steps;              /* forwards after the prefill (one per step for all rows) */
    double prefill_seconds;     /* the prompts' forward, up to the first tokens' logits on the host */
    double decode_seconds;      /* every later step, with sampling and callbacks */
    size_t kv_cache_bytes;      /* the key-value cache's keys and values */
    int64_t graph_replays;      /* decode steps replayed from a CUDA graph (the capturing one included) */
    char decode_graph[192];     /* how the one-token steps ran: from a CUDA graph, or eager and why */
} em_generation;
/* Frees what g holds and zeroes it; NULL or a zeroed g is ignored. */
EM_API void em_generation_free(em_generation *g);

/* Generates from rows prompts of ids: prompts[r][0..lengths[r]) (each at least one id in
 * [0, vocab_size)). tok may be NULL: then no text, and no stop strings. The cache holds
 * the longest prompt + max_new_tokens positions. *out is filled on success (free it with
 * em_generation_free), zeroed on error. opts NULL: zeroed. */
EM_API em_status em_generate(em_model *m, const em_tokenizer *tok, const int64_t *const *prompts,
                             const int64_t *lengths, int64_t rows, const em_generate_opts *opts, em_generation *out);

/* ---- a model folder with its tokenizer ---- */
typedef struct em_lm em_lm; /* a model and its tokenizer (opaque) */
/* Loads dir's model (em_model_load with opts) and its tokenizer.json (em_tokenizer_load).
 * NULL and an error when either fails, or when the tokenizer has ids the model has not. */
EM_API em_lm *em_lm_load(const char *dir, const em_model_opts *opts);
EM_API void em_lm_free(em_lm *lm);                          /* NULL is ignored */
EM_API em_model *em_lm_model(const em_lm *lm);              /* owned by lm */
EM_API const em_tokenizer *em_lm_tokenizer(const em_lm *lm); /* owned by lm */
/* Encodes text as a prompt (with the special tokens the tokenizer's template adds, a BOS,
 * as transformers' tokenizer(text) does): *ids (malloc'ed, release it with free()) and *n.
 * Special tokens written in the text are read as such. */
EM_API em_status em_lm_tokenize(const em_lm *lm, const char *text, int64_t **ids, int64_t *n);
/* em_generate over rows texts, each encoded by em_lm_tokenize. */
EM_API em_status em_lm_generate(em_lm *lm, const char *const *prompts, int64_t rows, const em_generate_opts *opts,
                                em_generation *out);

#ifdef __cplusplus
}
#endif
#endif
