/* Generation (include/ember/generate.h): the prompts left-padded into one batch and run once
 * through the model with a cache sized for the whole generation, then one forward of one
 * token per row per step; each step's last logits come to the host in float32, where
 * sampling.c chooses the tokens, the decode streams turn them into text, and the stop rules
 * and the callback are checked. Also em_lm, a model folder's model and tokenizer together. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate_internal.h"
#include "../util/errors.h"

#define DEFAULT_NEW_TOKENS 32
/* Eager one-token steps before the decode step is captured: the kernels it launches are
 * compiled and loaded before the recording. */
#define DECODE_GRAPH_WARMUP 1

static atomic_int g_static_decode = -1;

int em__generate_static_decode(int mode) { return atomic_exchange(&g_static_decode, mode); }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void em_generation_free(em_generation *g) {
    if (!g) return;
    for (int64_t r = 0; g->row && r < g->rows; r++) {
        free(g->row[r].prompt);
        free(g->row[r].tokens);
        free(g->row[r].text);
    }
    free(g->row);
    memset(g, 0, sizeof *g);
}

/* Appends s[0..n) to a row's NUL-terminated text (capacity *cap). */
static em_status text_append(em_generated_row *row, size_t *cap, const char *s, size_t n) {
    if (row->text_len + n + 1 > *cap) {
        size_t want = *cap * 2 > row->text_len + n + 1 ? *cap * 2 : row->text_len + n + 1;
        char *t = realloc(row->text, want);
        if (!t) return em_error(EM_ERR_OUT_OF_MEMORY, "em_generate: out of memory for the text");
        row->text = t;
        *cap = want;
    }
    if (n) memcpy(row->text + row->text_len, s, n);
    row->text_len += n;
    row->text[row->text_len] = '\0';
    return EM_OK;
}

/* Whether the row's text holds one of the stop strings at a place that ends after byte
 * `before` (the text the last token added completes it or reaches into it). */
static bool stop_found(const em_generated_row *row, size_t before, const char *const *stop, int n_stop) {
    for (int i = 0; i < n_stop; i++) {
        size_t n = strlen(stop[i]);
        if (n > row->text_len) continue;
        size_t first = before >= n ? before - n + 1 : 0;
        for (size_t p = first; p + n <= row->text_len; p++)
            if (memcmp(row->text + p, stop[i], n) == 0) return true;
    }
    return false;
}

/* The logits [rows, 1, vocab] of a forward as float32 on the host. */
static em_status fetch_logits(em_tensor *logits, float *host, int64_t rows, int64_t vocab) {
    if (!logits) return em_last_status();
    em_tensor *f = em_to_dtype(logits, EM_F32);
    if (!f) return em_last_status();
    return em_copy_to_host(f, host, (size_t)(rows * vocab) * sizeof *host);
}

static bool is_eos(int64_t id, const int64_t *eos, int n_eos) {
    for (int i = 0; i < n_eos; i++)
        if (eos[i] == id) return true;
    return false;
}

/* The one-token step in the static decode form (models_internal.h's em_kv_cache): its inputs
 * are device tensors that outlive a graph, written before each step, and its output is the
 * float32 logits tensor it writes, read after it; on CUDA the step is recorded once and
 * replayed for every later token (em_graph_step_run). */
typedef struct static_decode {
    em_model *m;
    em_kv_cache *cache;
    em_tensor *ids, *positions;   /* int64 [rows, 1] on the model's device */
    em_tensor *logits;            /* float32 [rows, 1, vocab] on the model's device */
    em_graph_step *graph;         /* NULL: run eagerly */
} static_decode;

static em_status static_decode_step(void *ctx) {
    static_decode *d = ctx;
    em_scope s = em_scope_begin();
    em_tensor *logits = em_model_forward(d->m, d->ids, &(em_forward_opts){.position_ids = d->positions,
                                                                            .cache = d->cache,
                                                                            .logits_to_keep = 1});
    em_status st = logits ? em_copy_(d->logits, logits) : em_last_status();
    em_scope_end(s);
    return st;
}

/* Everything a generation holds while it runs. */
typedef struct gen_state {
    int64_t rows, vocab, longest, max_new;
    int64_t *ids, *mask, *positions;   /* the prefill's [rows, longest]; then a step's [rows] */
    float *logits;                     /* [rows, vocab] */
    uint8_t *seen;                     /* [rows, vocab] for the repetition penalty, or NULL */
    bool *done;
    size_t *text_cap;
    em_decode_stream **streams;        /* per row, with a tokenizer */
    em_sample_scratch scratch;
    em_kv_cache *cache;
    static_decode *decode;             /* the static decode form's step, or NULL: dynamic */
    const em_tokenizer *tok;           /* NULL: no text */
} gen_state;

static void gen_state_free(gen_state *g) {
    free(g->ids);
    free(g->mask);
    free(g->positions);
    free(g->logits);
    free(g->seen);
    free(g->done);
    free(g->text_cap);
    for (int64_t r = 0; g->streams && r < g->rows; r++) em_decode_stream_free(g->streams[r]);
    free(g->streams);
    em__sample_scratch_free(&g->scratch);
    if (g->decode) {   /* the graph first: its memory is released with it */
        em_graph_step_free(g->decode->graph);
        em_release(g->decode->ids);
        em_release(g->decode->positions);
        em_release(g->decode->logits);
        free(g->decode);
    }
    em_kv_cache_free(g->cache);
}

/* The arguments' checks, with what was expected and what was found. */
static em_status check_args(em_model *m, const em_tokenizer *tok, const int64_t *const *prompts,
                            const int64_t *lengths, int64_t rows, const em_generate_opts *o, int64_t *longest) {
    const char *op = "em_generate";
    if (!m) return em_error(EM_ERR_ARGUMENT, "%s: argument 'm' is NULL", op);
    if (rows < 1) return em_error(EM_ERR_ARGUMENT, "%s: rows must be at least 1, got %lld", op, (long long)rows);
    if (!prompts || !lengths) return em_error(EM_ERR_ARGUMENT, "%s: prompts and lengths must not be NULL", op);
    if (o->max_new_tokens < 0)
        return em_error(EM_ERR_ARGUMENT, "%s: max_new_tokens must be at least 1 (0: %d), got %lld", op,
                        DEFAULT_NEW_TOKENS, (long long)o->max_new_tokens);
    if (em__sampling_check(&o->sampling, op) != EM_OK) return em_last_status();
    if (o->n_eos < 0 || (o->n_eos > 0 && !o->eos_ids))
        return em_error(EM_ERR_ARGUMENT, "%s: eos_ids must hold n_eos (%d) ids", op, o->n_eos);
    if (o->n_stop < 0 || (o->n_stop > 0 && !o->stop))
        return em_error(EM_ERR_ARGUMENT, "%s: stop must hold n_stop (%d) strings", op, o->n_stop);
    if (o->n_stop > 0 && !tok)
        return em_error(EM_ERR_ARGUMENT, "%s: stop strings are matched on the text, which needs a tokenizer", op);
    for (int i = 0; i < o->n_stop; i++)
        if (!o->stop[i] || !o->stop[i][0])
            return em_error(EM_ERR_ARGUMENT, "%s: stop string %d is %s; each must have at least one byte", op, i,
                            o->stop[i] ? "empty" : "NULL");
    const em_model_config *cfg = em_model_config_of(m);
    *longest = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!prompts[r] || lengths[r] < 1)
            return em_error(EM_ERR_ARGUMENT, "%s: prompt %lld has no ids (each needs at least one)", op, (long long)r);
        for (int64_t i = 0; i < lengths[r]; i++)
            if (prompts[r][i] < 0 || prompts[r][i] >= cfg->vocab_size)
                return em_error(EM_ERR_ARGUMENT, "%s: prompt %lld's id %lld at position %lld is outside the model's "
                                "vocabulary [0, %lld)", op, (long long)r, (long long)prompts[r][i], (long long)i,
                                (long long)cfg->vocab_size);
        if (lengths[r] > *longest) *longest = lengths[r];
    }
    int64_t max_new = o->max_new_tokens ? o->max_new_tokens : DEFAULT_NEW_TOKENS;
    int64_t need = *longest + max_new;
    if (cfg->family == EM_MODEL_GPT2 && need > cfg->max_position_embeddings)
        return em_error(EM_ERR_ARGUMENT, "%s: a prompt of %lld ids and %lld new tokens need %lld positions; GPT-2 has "
                        "%lld (n_positions)", op, (long long)*longest, (long long)max_new, (long long)need,
                        (long long)cfg->max_position_embeddings);
    if (cfg->sliding_window && need > cfg->sliding_window)
        return em_error(EM_ERR_NOT_SUPPORTED, "%s: a prompt of %lld ids and %lld new tokens need %lld positions, past "
                        "the sliding window of %lld, which Ember does not apply", op, (long long)*longest,
                        (long long)max_new, (long long)need, (long long)cfg->sliding_window);
    return EM_OK;
}

/* One row's new token: kept, decoded, handed to the callback, checked against the stop rules.
 * *go_on turns false when the callback asks to stop. */
static em_status take_token(gen_state *g, em_generated_row *row, int64_t r, int64_t id, const em_generate_opts *o,
                            const int64_t *eos, int n_eos, bool *go_on) {
    row->tokens[row->n_tokens++] = id;
    if (g->seen) g->seen[r * g->vocab + id] = 1;
    const char *piece = NULL;
    size_t len = 0, before = row->text_len;
    if (g->streams) {
        /* a model may have more ids than its tokenizer (vocabularies padded to a multiple): such
         * an id has no text, as transformers decodes it */
        if (id < em_tokenizer_vocab_size(g->tok) &&
            em_decode_stream_step(g->streams[r], id, &piece, &len) != EM_OK)
            return em_last_status();
        if (!piece) piece = "";
        if (text_append(row, &g->text_cap[r], piece, len) != EM_OK) return em_last_status();
    }
    if (o->on_token && !o->on_token(r, id, piece, len, o->user)) *go_on = false;
    if (!o->ignore_eos && is_eos(id, eos, n_eos)) {
        g->done[r] = true;
        row->finish = EM_FINISH_EOS;
    } else if (o->n_stop && stop_found(row, before, o->stop, o->n_stop)) {
        g->done[r] = true;
        row->finish = EM_FINISH_STOP;
    }
    return EM_OK;
}

/* Host ids or positions [rows, cols] as a tensor on the model's device, marked in [0, bound):
 * generation wrote them itself (prompts checked by check_args, sampled ids, positions within
 * the cache), so the lookups need not read them back to check them. */
static em_tensor *device_indices(em_model *m, const int64_t *v, int64_t rows, int64_t cols, int64_t bound) {
    em_tensor *t = em_to(em_from_data(v, EM_I64, EM_SHAPE(rows, cols), EM_OPTS(.dtype = EM_I64)), m->device);
    if (t) em__index_mark_in_range(t, bound);
    return t;
}

/* Whether the one-token steps take the static form (em__generate_static_decode), set up then;
 * out->decode_graph says how they will run. */
static em_status static_decode_start(em_model *m, gen_state *g, em_generation *out) {
    int mode = atomic_load(&g_static_decode);
    const char *why = NULL;
    bool cuda = m->device.type == EM_CUDA, graphs = em_graph_available(m->device, &why);
    if (mode == 0 || (mode < 0 && !(cuda && graphs))) {
        snprintf(out->decode_graph, sizeof out->decode_graph, "off (%s)",
                 mode == 0 ? "the dynamic decode form was asked for" : why ? why : "graphs are CUDA's");
        return EM_OK;
    }
    static_decode *d = calloc(1, sizeof *d);
    if (!d) return em_error(EM_ERR_OUT_OF_MEMORY, "em_generate: out of host memory");
    g->decode = d;
    d->m = m;
    d->cache = g->cache;
    if (em__kv_cache_static_begin(g->cache) != EM_OK) return em_last_status();
    em_opts io = EM_OPTS(.dtype = EM_I64, .device = m->device);
    em_scope s = em_scope_begin();
    em_tensor *ids = em_zeros(EM_SHAPE(g->rows, 1), io), *pos = em_zeros(EM_SHAPE(g->rows, 1), io);
    em_tensor *logits = em_zeros(EM_SHAPE(g->rows, 1, g->vocab), EM_OPTS(.dtype = EM_F32, .device = m->device));
    if (ids && pos && logits) {
        d->ids = em_keep(ids);
        d->positions = em_keep(pos);
        d->logits = em_keep(logits);
    }
    em_scope_end(s);
    if (!d->logits) return em_last_status();
    if (graphs && !(d->graph = em_graph_step_new(m->device, DECODE_GRAPH_WARMUP))) return em_last_status();
    snprintf(out->decode_graph, sizeof out->decode_graph, "%s%s%s", graphs ? "no step ran" : "off (",
             graphs ? "" : why ? why : "no graphs here", graphs ? "" : ")");
    return EM_OK;
}

/* One step of the static form: the ids and positions (g->ids, g->positions [rows]) and the
 * cache's write position copied to the device, the step run or replayed, its logits read. */
static em_status static_decode_run(gen_state *g, int64_t slot) {
    static_decode *d = g->decode;
    em_kv_cache *c = g->cache;
    em_scope s = em_scope_begin();
    em_tensor *ids = em_from_data(g->ids, EM_I64, EM_SHAPE(g->rows, 1), EM_OPTS(.dtype = EM_I64));
    em_tensor *pos = em_from_data(g->positions, EM_I64, EM_SHAPE(g->rows, 1), EM_OPTS(.dtype = EM_I64));
    em_tensor *at = em_from_data(&slot, EM_I64, EM_SHAPE(1), EM_OPTS(.dtype = EM_I64));
    em_status st = ids && pos && at ? EM_OK : em_last_status();
    if (st == EM_OK) st = em_copy_(d->ids, ids);
    if (st == EM_OK) st = em_copy_(d->positions, pos);
    if (st == EM_OK) st = em_copy_(c->write_pos, at);
    em_scope_end(s);
    if (st != EM_OK) return st;
    /* sampled ids (or the pad id) are in the vocabulary, and positions below the cache's
     * length, which check_args held within the model's positions: the lookups need not read
     * them back */
    em__index_mark_in_range(d->ids, g->vocab);
    em__index_mark_in_range(d->positions, c->capacity);
    c->length = slot;   /* a replay does not run the forward's host side, which counts it */
    if (d->graph) {
        em_tensor *inputs[3] = {d->ids, d->positions, c->write_pos};
        uint64_t key = (uint64_t)g->rows * 0x9E3779B97F4A7C15ull ^ (uint64_t)c->capacity << 8 ^
                       (uint64_t)em_dtype_of(c->k[0]);
        st = em_graph_step_run(d->graph, inputs, 3, key, static_decode_step, d);
    } else {
        st = static_decode_step(d);
    }
    if (st != EM_OK) return st;
    return em_copy_to_host(d->logits, g->logits, (size_t)(g->rows * g->vocab) * sizeof *g->logits);
}

/* out's note on the decode steps' graph, from the step's counts. */
static void static_decode_note(const gen_state *g, em_generation *out) {
    em_graph_step_stats st;
    if (!g->decode || !g->decode->graph || em_graph_step_get_stats(g->decode->graph, &st) != EM_OK) return;
    out->graph_replays = st.replays;
    if (st.failed_captures)
        snprintf(out->decode_graph, sizeof out->decode_graph, "decode eager (capture failed: %.150s)",
                 st.last_failure);
    else if (st.replays)
        snprintf(out->decode_graph, sizeof out->decode_graph, "decode replayed (%lld of %lld steps, %lld capture%s)",
                 (long long)st.replays, (long long)(st.replays + st.eager_runs), (long long)st.captures,
                 st.captures == 1 ? "" : "s");
    else
        snprintf(out->decode_graph, sizeof out->decode_graph, "decode eager (%lld steps, fewer than the warm-up)",
                 (long long)st.eager_runs);
}

static em_status run(em_model *m, const em_tokenizer *tok, gen_state *g, const em_generate_opts *o,
                     em_generation *out) {
    const em_model_config *cfg = em_model_config_of(m);
    int64_t rows = g->rows, V = g->vocab, L = g->longest;
    const int64_t *eos = o->eos_ids ? o->eos_ids : cfg->eos_token_ids;
    int n_eos = o->eos_ids ? o->n_eos : cfg->n_eos;
    int64_t pad = cfg->pad_token_id >= 0 && cfg->pad_token_id < V ? cfg->pad_token_id : 0;
    bool padded = false;
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = out->row[r].n_prompt, start = L - n;
        padded |= start > 0;
        for (int64_t i = 0; i < L; i++) {
            bool real = i >= start;
            g->ids[r * L + i] = real ? out->row[r].prompt[i - start] : pad;
            g->mask[r * L + i] = real;
            g->positions[r * L + i] = real ? i - start : 1;   /* cumsum(mask) - 1, 1 at the padding */
        }
        if (g->streams)   /* the prompt first, so that the generation decodes as its continuation */
            for (int64_t i = 0; i < n; i++) {
                const char *piece;
                size_t len;
                if (out->row[r].prompt[i] < em_tokenizer_vocab_size(tok) &&
                    em_decode_stream_step(g->streams[r], out->row[r].prompt[i], &piece, &len) != EM_OK)
                    return em_last_status();
            }
        if (g->seen)
            for (int64_t i = 0; i < n; i++) g->seen[r * V + out->row[r].prompt[i]] = 1;
    }

    double t0 = now_seconds();
    em_scope scope = em_scope_begin();
    int64_t cap = g->cache->capacity;
    em_tensor *ids = device_indices(m, g->ids, rows, L, V);
    em_tensor *mask = padded ? em_from_data(g->mask, EM_I64, EM_SHAPE(rows, L), EM_OPTS(.dtype = EM_I64)) : NULL;
    em_tensor *pos = device_indices(m, g->positions, rows, L, cap);
    em_status st = ids && pos && (mask || !padded)
                       ? fetch_logits(em_model_forward(m, ids, &(em_forward_opts){.attention_mask = mask,
                                                                                 .position_ids = pos,
                                                                                 .cache = g->cache,
                                                                                 .logits_to_keep = 1}),
                                      g->logits, rows, V)
                       : em_last_status();
    em_scope_end(scope);
    if (st != EM_OK) return st;
    double t1 = now_seconds();
    out->prefill_seconds = t1 - t0;

    bool go_on = true;
    for (int64_t step = 0;; step++) {
        for (int64_t r = 0; r < rows; r++) {
            if (g->done[r]) continue;
            float *scores = g->logits + r * V;
            if (em__logits_process_seen(scores, V, g->seen ? g->seen + r * V : NULL, &o->sampling, &g->scratch) !=
                EM_OK)
                return em_last_status();
            int64_t id = em__sample_from(scores, V, &o->sampling, (uint64_t)r << 32 | (uint64_t)step);
            if (id < 0) return em__model_error_prefix("em_generate (row %lld, step %lld)", (long long)r,
                                                      (long long)step);
            if (take_token(g, &out->row[r], r, id, o, eos, n_eos, &go_on) != EM_OK) return em_last_status();
            out->generated_tokens++;
            if (step > 0) out->decode_tokens++;
        }
        bool all_done = true;
        for (int64_t r = 0; r < rows; r++) {
            if (!g->done[r] && (!go_on || step + 1 == g->max_new)) {
                g->done[r] = true;
                out->row[r].finish = go_on ? EM_FINISH_LENGTH : EM_FINISH_CALLBACK;
            }
            all_done &= g->done[r];
        }
        if (all_done) break;
        for (int64_t r = 0; r < rows; r++) {
            g->ids[r] = g->done[r] ? pad : out->row[r].tokens[step];
            g->positions[r] = out->row[r].n_prompt + step;
        }
        if (g->decode) {
            if ((st = static_decode_run(g, L + step)) != EM_OK) return st;
            out->steps++;
            continue;
        }
        scope = em_scope_begin();
        ids = device_indices(m, g->ids, rows, 1, V);
        pos = device_indices(m, g->positions, rows, 1, cap);
        st = ids && pos ? fetch_logits(em_model_forward(m, ids, &(em_forward_opts){.position_ids = pos,
                                                                                  .cache = g->cache,
                                                                                  .logits_to_keep = 1}),
                                       g->logits, rows, V)
                        : em_last_status();
        em_scope_end(scope);
        if (st != EM_OK) return st;
        out->steps++;
    }
    for (int64_t r = 0; g->streams && r < rows; r++) {   /* what the decoder still held back */
        const char *piece;
        size_t len;
        if (em_decode_stream_finish(g->streams[r], &piece, &len) != EM_OK ||
            text_append(&out->row[r], &g->text_cap[r], piece, len) != EM_OK)
            return em_last_status();
    }
    out->decode_seconds = now_seconds() - t1;
    static_decode_note(g, out);
    return EM_OK;
}

static em_status generate_rows(em_model *m, const em_tokenizer *tok, const int64_t *const *prompts,
                               const int64_t *lengths, int64_t rows, const em_generate_opts *opts,
                               em_generation *out) {
    if (!out) return em_error(EM_ERR_ARGUMENT, "em_generate: argument 'out' is NULL");
    memset(out, 0, sizeof *out);
    em_generate_opts o = opts ? *opts : (em_generate_opts){0};
    gen_state g = {.rows = rows, .tok = tok};
    if (check_args(m, tok, prompts, lengths, rows, &o, &g.longest) != EM_OK) return em_last_status();
    const em_model_config *cfg = em_model_config_of(m);
    g.vocab = cfg->vocab_size;
    g.max_new = o.max_new_tokens ? o.max_new_tokens : DEFAULT_NEW_TOKENS;
    bool penalty = o.sampling.repetition_penalty > 0 && o.sampling.repetition_penalty != 1;
    size_t cells = (size_t)(rows * g.longest);
    out->rows = rows;
    out->row = calloc((size_t)rows, sizeof *out->row);
    g.ids = malloc(cells * sizeof *g.ids);
    g.mask = malloc(cells * sizeof *g.mask);
    g.positions = malloc(cells * sizeof *g.positions);
    g.logits = malloc((size_t)(rows * g.vocab) * sizeof *g.logits);
    g.seen = penalty ? calloc((size_t)(rows * g.vocab), 1) : NULL;
    g.done = calloc((size_t)rows, sizeof *g.done);
    g.text_cap = calloc((size_t)rows, sizeof *g.text_cap);
    g.streams = tok ? calloc((size_t)rows, sizeof *g.streams) : NULL;
    em_status st = EM_OK;
    if (!out->row || !g.ids || !g.mask || !g.positions || !g.logits || (penalty && !g.seen) || !g.done ||
        !g.text_cap || (tok && !g.streams))
        st = em_error(EM_ERR_OUT_OF_MEMORY, "em_generate: out of memory for %lld rows", (long long)rows);
    for (int64_t r = 0; st == EM_OK && r < rows; r++) {
        em_generated_row *row = &out->row[r];
        row->n_prompt = lengths[r];
        row->prompt = malloc((size_t)lengths[r] * sizeof *row->prompt);
        row->tokens = malloc((size_t)g.max_new * sizeof *row->tokens);
        if (tok) {
            g.text_cap[r] = 64;
            row->text = malloc(g.text_cap[r]);
        }
        if (!row->prompt || !row->tokens || (tok && !row->text)) {
            st = em_error(EM_ERR_OUT_OF_MEMORY, "em_generate: out of memory for %lld new tokens", (long long)g.max_new);
            break;
        }
        memcpy(row->prompt, prompts[r], (size_t)lengths[r] * sizeof *row->prompt);
        if (row->text) row->text[0] = '\0';
        out->prompt_tokens += lengths[r];
        if (tok && !(g.streams[r] = em_decode_stream_new(tok, EM_DECODE_SKIP_SPECIAL))) st = em_last_status();
    }
    if (st == EM_OK) st = em__sample_scratch_init(&g.scratch, g.vocab);
    if (st == EM_OK && !(g.cache = em_kv_cache_new(m, rows, g.longest + g.max_new))) st = em_last_status();
    if (st == EM_OK) {
        out->kv_cache_bytes = em_kv_cache_nbytes(g.cache);
        st = static_decode_start(m, &g, out);
        if (st == EM_OK) st = run(m, tok, &g, &o, out);
    }
    gen_state_free(&g);
    if (st != EM_OK) em_generation_free(out);
    return st;
}

/* ---- em_lm ---- */
struct em_lm {
    em_model *model;
    em_tokenizer *tok;
};

em_lm *em_lm_load(const char *dir, const em_model_opts *opts) {
    if (!dir) {
        em_error(EM_ERR_ARGUMENT, "em_lm_load: dir is NULL");
        return NULL;
    }
    em_lm *lm = calloc(1, sizeof *lm);
    if (!lm) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_lm_load: out of host memory");
        return NULL;
    }
    if (!(lm->model = em_model_load(dir, opts)) || !(lm->tok = em_tokenizer_load(dir))) {
        em_lm_free(lm);
        return NULL;
    }
    int64_t tv = em_tokenizer_vocab_size(lm->tok), mv = em_model_config_of(lm->model)->vocab_size;
    if (tv > mv) {
        em_error(EM_ERR_ARGUMENT, "em_lm_load(%s): the tokenizer has ids up to %lld but the model's vocabulary is %lld "
                 "(config.json's vocab_size): they do not belong together", dir, (long long)(tv - 1), (long long)mv);
        em_lm_free(lm);
        return NULL;
    }
    return lm;
}

void em_lm_free(em_lm *lm) {
    if (!lm) return;
    em_tokenizer_free(lm->tok);
    em_model_free(lm->model);
    free(lm);
}

em_model *em_lm_model(const em_lm *lm) {
    if (!lm) em_error(EM_ERR_ARGUMENT, "em_lm_model: argument 'lm' is NULL");
    return lm ? lm->model : NULL;
}

const em_tokenizer *em_lm_tokenizer(const em_lm *lm) {
    if (!lm) em_error(EM_ERR_ARGUMENT, "em_lm_tokenizer: argument 'lm' is NULL");
    return lm ? lm->tok : NULL;
}

em_status em_lm_tokenize(const em_lm *lm, const char *text, int64_t **ids, int64_t *n) {
    if (!lm || !text || !ids || !n)
        return em_error(EM_ERR_ARGUMENT, "em_lm_tokenize: lm, text, ids and n must not be NULL");
    *ids = NULL;
    *n = 0;
    size_t len = strlen(text), count = 0;
    if (em_tokenizer_encode_i64(lm->tok, text, len, EM_TOKENIZE_ADD_SPECIAL, NULL, 0, &count) != EM_OK)
        return em_last_status();
    int64_t *buf = malloc((count ? count : 1) * sizeof *buf);
    if (!buf) return em_error(EM_ERR_OUT_OF_MEMORY, "em_lm_tokenize: out of memory for %zu ids", count);
    if (em_tokenizer_encode_i64(lm->tok, text, len, EM_TOKENIZE_ADD_SPECIAL, buf, count, &count) != EM_OK) {
        free(buf);
        return em_last_status();
    }
    *ids = buf;
    *n = (int64_t)count;
    return EM_OK;
}

em_status em_lm_generate(em_lm *lm, const char *const *prompts, int64_t rows, const em_generate_opts *opts,
                         em_generation *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!lm || !prompts || !out || rows < 1)
        return em_error(EM_ERR_ARGUMENT, "em_lm_generate: expected lm, prompts, out and rows >= 1 (rows: %lld)",
                        (long long)rows);
    int64_t **ids = calloc((size_t)rows, sizeof *ids), *lengths = calloc((size_t)rows, sizeof *lengths);
    em_status st = ids && lengths ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "em_lm_generate: out of memory");
    for (int64_t r = 0; st == EM_OK && r < rows; r++) {
        if (!prompts[r]) st = em_error(EM_ERR_ARGUMENT, "em_lm_generate: prompt %lld is NULL", (long long)r);
        else if (em_lm_tokenize(lm, prompts[r], &ids[r], &lengths[r]) != EM_OK) st = em_last_status();
        else if (lengths[r] == 0)
            st = em_error(EM_ERR_ARGUMENT, "em_lm_generate: prompt %lld encodes to no ids (an empty text, and the "
                          "tokenizer adds no BOS)", (long long)r);
    }
    if (st == EM_OK) st = em_generate(lm->model, lm->tok, (const int64_t *const *)ids, lengths, rows, opts, out);
    for (int64_t r = 0; ids && r < rows; r++) free(ids[r]);
    free(ids);
    free(lengths);
    return st;
}

/* Inference only: in no-grad mode, so that a model with trainable LoRA adapters records no
 * graph (and its adapters' outputs may be written into the cache). */
em_status em_generate(em_model *m, const em_tokenizer *tok, const int64_t *const *prompts, const int64_t *lengths,
                      int64_t rows, const em_generate_opts *opts, em_generation *out) {
    em_grad_mode g = em_no_grad_begin();
    em_status st = generate_rows(m, tok, prompts, lengths, rows, opts, out);
    em_no_grad_end(g);
    return st;
}
