/* ember tokenize: the ids a model folder's tokenizer (tokenizer.json, Hugging Face's format)
 * gives a text, or with --decode the text of ids, through include/ember/tokenizer.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "commands.h"
#include "options.h"
#include "text_io.h"

static const char *const tool = "ember tokenize";

enum { T_JSON, T_FILE, T_NO_SPECIAL, T_SPECIAL_AS_TEXT, T_DECODE };
static const opt_spec tokenize_table[] = {
    [T_JSON] = OPTION_FLAG("--json", "one JSON object: the ids, their tokens and the text they decode to"),
    [T_FILE] = OPTION_STRING("--file", "PATH", "read the text from PATH (- for standard input) instead of TEXT"),
    [T_NO_SPECIAL] = OPTION_FLAG("--no-special", "leave out the special tokens the tokenizer's template adds (a BOS)"),
    [T_SPECIAL_AS_TEXT] = OPTION_FLAG("--special-as-text",
                                      "read special tokens written in the text (<|endoftext|>) as plain text"),
    [T_DECODE] = OPTION_FLAG("--decode", "the other way: TEXT is ids (separated by commas or spaces); print their text"),
};
OPT_TABLE_FITS(tokenize_table);

const opt_command tokenize_options = {
    .name = "ember tokenize",
    .usage = "ember tokenize MODEL_DIR TEXT [options]\nember tokenize MODEL_DIR --file PATH [options]\n"
             "ember tokenize MODEL_DIR --decode IDS [options]",
    .about = "The token ids of a text, as Hugging Face's tokenizers gives them for the model's tokenizer.json "
             "(byte-level BPE as GPT-2, Llama 3 and Qwen2 use, SentencePiece-style BPE with byte fallback as Llama 2 "
             "and Mistral use), with the special tokens its template adds. The ids are printed on one line, "
             "separated by spaces.",
    .positional = "MODEL_DIR TEXT",
    .max_positional = 2,
    .positional_help = "a model folder with a tokenizer.json (its tokenizer_config.json and generation_config.json "
                       "give the special ids), or a tokenizer.json itself; then the text",
    .extra = "MODEL_DIR and one TEXT (quote a text with spaces)",
    .options = tokenize_table,
    .count = OPT_COUNT(tokenize_table),
    .epilogue = "The text is UTF-8; bytes that are not are read as U+FFFD, as tokenizers reads them.",
    .exit_status = "0 done; 1 the tokenizer cannot be read or the text not encoded; 2 bad arguments",
};

/* Ids written as decimal numbers separated by commas or white space. */
static int parse_ids(const char *s, int64_t **out, size_t *n) {
    size_t cap = 16;
    int64_t *v = malloc(cap * sizeof *v);
    *n = 0;
    while (v) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        if (*s < '0' || *s > '9') {
            fprintf(stderr, "%s: --decode: expected ids (whole numbers separated by commas or spaces), found '%.20s'\n",
                    tool, s);
            free(v);
            return 2;
        }
        errno = 0;
        char *end;
        unsigned long long id = strtoull(s, &end, 10);
        if (errno || id > INT64_MAX) {
            fprintf(stderr, "%s: --decode: the id '%.*s' is too large\n", tool, (int)(end - s), s);
            free(v);
            return 2;
        }
        if (*n == cap) {
            int64_t *nv = realloc(v, cap * 2 * sizeof *nv);
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        v[(*n)++] = (int64_t)id;
        s = end;
    }
    if (!v) {
        fprintf(stderr, "%s: out of memory\n", tool);
        return 1;
    }
    *out = v;
    return 0;
}

static int report(const em_tokenizer *tok, const int64_t *ids, size_t n, bool json) {
    if (!json) {
        for (size_t i = 0; i < n; i++) printf("%s%lld", i ? " " : "", (long long)ids[i]);
        printf("\n");
        return 0;
    }
    size_t len = 0;
    if (em_tokenizer_decode_i64(tok, ids, n, 0, NULL, 0, &len) != EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        return 1;
    }
    char *text = malloc(len + 1);
    if (!text || em_tokenizer_decode_i64(tok, ids, n, 0, text, len + 1, &len) != EM_OK) {
        fprintf(stderr, "%s: %s\n", tool, text ? em_last_error() : "out of memory");
        free(text);
        return 1;
    }
    printf("{\"ids\": [");
    for (size_t i = 0; i < n; i++) printf("%s%lld", i ? ", " : "", (long long)ids[i]);
    printf("], \"tokens\": [");
    for (size_t i = 0; i < n; i++) {
        size_t tn = 0;
        const char *t = em_tokenizer_id_to_token(tok, ids[i], &tn);
        if (i) printf(", ");
        if (t) tool_json_string(stdout, t, tn);
        else printf("null"), em_clear_error();   /* an id no token has */
    }
    printf("], \"count\": %zu, \"text\": ", n);
    tool_json_string(stdout, text, len);
    printf("}\n");
    free(text);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    opt_result opts;
    int status = opt_parse(&tokenize_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    const char *dir = opts.nargs > 0 ? opts.args[0] : NULL, *text = opts.nargs > 1 ? opts.args[1] : NULL;
    if (!dir) return opt_usage_error(&tokenize_options, stderr, "expected MODEL_DIR (a folder with a tokenizer.json)");
    if (v[T_FILE].given && text)
        return opt_usage_error(&tokenize_options, stderr, "give the text as TEXT or with --file, not both");
    if (!v[T_FILE].given && !text)
        return opt_usage_error(&tokenize_options, stderr, "expected TEXT after MODEL_DIR (or --file PATH)");
    if (v[T_DECODE].given && (v[T_NO_SPECIAL].given || v[T_SPECIAL_AS_TEXT].given))
        return opt_usage_error(&tokenize_options, stderr, "--decode takes ids: --no-special and --special-as-text "
                               "are for encoding");

    char *owned = NULL;
    size_t len = text ? strlen(text) : 0;
    if (v[T_FILE].given && !(text = owned = tool_read_all(tool, v[T_FILE].text, &len))) return 1;
    int64_t *ids = NULL;
    size_t n = 0;
    if (v[T_DECODE].given) {
        int rc = parse_ids(text, &ids, &n);
        if (rc) {
            free(owned);
            return rc;
        }
    }
    em_tokenizer *tok = em_tokenizer_load(dir);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", tool, em_last_error());
        free(owned);
        free(ids);
        return 1;
    }
    int rc = 0;
    if (v[T_DECODE].given) {
        if (!v[T_JSON].given) {   /* the text alone, as it decodes */
            size_t tl = 0;
            char *out = NULL;
            em_status st = em_tokenizer_decode_i64(tok, ids, n, 0, NULL, 0, &tl);
            if (st == EM_OK && !(out = malloc(tl + 1))) st = em_error(EM_ERR_OUT_OF_MEMORY, "out of memory");
            if (st == EM_OK) st = em_tokenizer_decode_i64(tok, ids, n, 0, out, tl + 1, &tl);
            if (st == EM_OK) {
                fwrite(out, 1, tl, stdout);
                putchar('\n');
            } else {
                fprintf(stderr, "%s: %s\n", tool, em_last_error());
                rc = 1;
            }
            free(out);
        } else {
            rc = report(tok, ids, n, true);
        }
    } else {
        unsigned flags = (v[T_NO_SPECIAL].given ? 0 : EM_TOKENIZE_ADD_SPECIAL) |
                         (v[T_SPECIAL_AS_TEXT].given ? EM_TOKENIZE_SPECIAL_AS_TEXT : 0);
        em_status st = em_tokenizer_encode_i64(tok, text, len, flags, NULL, 0, &n);
        if (st == EM_OK && !(ids = malloc((n ? n : 1) * sizeof *ids))) st = em_error(EM_ERR_OUT_OF_MEMORY, "out of memory");
        if (st == EM_OK) st = em_tokenizer_encode_i64(tok, text, len, flags, ids, n, &n);
        if (st == EM_OK) {
            rc = report(tok, ids, n, v[T_JSON].given);
        } else {
            fprintf(stderr, "%s: %s\n", tool, em_last_error());
            rc = 1;
        }
    }
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "%s: could not write the output\n", tool);
        rc = 1;
    }
    em_tokenizer_free(tok);
    free(ids);
    free(owned);
    return rc;
}
