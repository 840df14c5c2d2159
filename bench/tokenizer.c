/* Tokenizer benchmark: load a tokenizer.json, encode a text (about 1 MB in
 * bench/run_tokenizer.sh) as one string and line by line, decode the ids whole and token by
 * token. bench/tokenizer_hf.py measures Hugging Face's tokenizers on the same files and prints
 * the same keys.
 * Usage: bench_tokenizer TOKENIZER TEXT   (a tokenizer.json or its folder; a text file)
 * Prints "key value" lines: the best of 5 runs of each, wall-clock seconds of one thread, and
 * a checksum of the ids that the Python side prints too (the same ids, the same sum). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ember/ember.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER TEXT\n");
        return 2;
    }
    size_t len;
    char *text = read_file(argv[2], &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[2]);
        return 1;
    }
    double t0 = now();
    em_tokenizer *tok = em_tokenizer_load(argv[1]);
    double load = now() - t0;
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", em_last_error());
        free(text);
        return 1;
    }
    size_t n = 0;
    if (em_tokenizer_encode(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, NULL, 0, &n) != EM_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", em_last_error());
        return 1;
    }
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    char *out = malloc(len * 2 + 64);
    double encode = 1e30, decode = 1e30, stream = 1e30;
    size_t out_len = 0;
    for (int r = 0; r < 5; r++) {
        t0 = now();
        if (em_tokenizer_encode(tok, text, len, EM_TOKENIZE_ADD_SPECIAL, ids, n, &n) != EM_OK) return 1;
        double t = now() - t0;
        if (t < encode) encode = t;
        t0 = now();
        if (em_tokenizer_decode(tok, ids, n, 0, out, len * 2 + 64, &out_len) != EM_OK) return 1;
        t = now() - t0;
        if (t < decode) decode = t;
        t0 = now();
        em_decode_stream *s = em_decode_stream_new(tok, 0);
        size_t streamed = 0, pn;
        const char *piece;
        for (size_t i = 0; i < n; i++) {
            em_decode_stream_step(s, ids[i], &piece, &pn);
            streamed += pn;
        }
        em_decode_stream_finish(s, &piece, &pn);
        streamed += pn;
        em_decode_stream_free(s);
        t = now() - t0;
        if (t < stream) stream = t;
        if (streamed != out_len) return fprintf(stderr, "bench_tokenizer: the stream differs\n"), 1;
    }
    /* line by line (as a data set is prepared), one thread */
    double lines = 1e30;
    size_t line_tokens = 0;
    size_t cap = 1 << 16;
    int32_t *line_ids = malloc(cap * sizeof *line_ids);
    for (int r = 0; r < 5; r++) {
        t0 = now();
        line_tokens = 0;
        for (size_t a = 0; a < len;) {
            size_t e = a;
            while (e < len && text[e] != '\n') e++;
            size_t k = 0;
            if (em_tokenizer_encode(tok, text + a, e - a, 0, line_ids, cap, &k) != EM_OK) return 1;
            line_tokens += k;
            a = e + 1;
        }
        double t = now() - t0;
        if (t < lines) lines = t;
    }
    free(line_ids);
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum = (sum * 31 + (unsigned long long)ids[i]) % 1000000007ull;
    printf("implementation ember\n");
    printf("vocab %lld\n", (long long)em_tokenizer_vocab_size(tok));
    printf("text_bytes %zu\n", len);
    printf("tokens %zu\n", n);
    printf("ids_checksum %llu\n", sum);
    printf("load_s %.4f\n", load);
    printf("encode_s %.4f\n", encode);
    printf("encode_mb_s %.2f\n", (double)len / encode / 1e6);
    printf("encode_tokens_s %.0f\n", (double)n / encode);
    printf("lines_tokens %zu\n", line_tokens);
    printf("lines_encode_s %.4f\n", lines);
    printf("decode_s %.4f\n", decode);
    printf("stream_decode_s %.4f\n", stream);
    free(out);
    free(ids);
    free(text);
    em_tokenizer_free(tok);
    return 0;
}
