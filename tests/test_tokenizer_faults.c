/* The tokenizer when memory runs out: loading a tokenizer.json, encoding and decoding (whole
 * and streamed) with Ember's Nth host allocation failing, for every N up to the call's count
 * (malloc, calloc, realloc and strdup are wrapped for Ember's objects and this file:
 * -Wl,--wrap in CMakeLists.txt; PCRE2's and ICU's own allocations are not). Each failing call
 * must answer EM_ERR_OUT_OF_MEMORY with a message, never crash; the same call then succeeds
 * with the same answer as an undisturbed one. Leaks are LeakSanitizer's (the ASan build). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <ember/tokenizer.h>
#include "test.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

static _Thread_local int armed;
static atomic_llong calls, fail_at;

static bool fails(void) {
    if (!armed) return false;
    return atomic_fetch_add(&calls, 1) + 1 == atomic_load(&fail_at);
}

void *__wrap_malloc(size_t n) { return fails() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return fails() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return fails() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fails() ? NULL : __real_strdup(s); }

static void arm(long long n) {
    atomic_store(&fail_at, n);
    atomic_store(&calls, 0);
    armed = 1;
}

static long long disarm(void) {
    armed = 0;
    return atomic_load(&calls);
}

/* Every stage kind in one small file: a normalizer, added tokens (raw and normalized), a
 * pre-tokenizer sequence, byte fallback, a template, a decoder sequence. */
static const char json[] =
    "{\"added_tokens\": ["
    "  {\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    "  {\"id\": 9, \"content\": \"xyz\", \"special\": false, \"normalized\": true, \"single_word\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"_\"},"
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"_\"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "   {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}+\"}, \"behavior\": \"Isolated\", \"invert\": false},"
    "   {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\", \"split\": true}]},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\","
    "   \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\":"
    "   \"<s>\", \"ids\": [0], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"_\"},"
    "   \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    "   {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": {\"<s>\": 0,"
    "   \"<unk>\": 1, \"_\": 2, \"a\": 3, \"b\": 4, \"_a\": 5, \"ab\": 6, \"<0xC3>\": 7, \"<0xA9>\": 8, \"1\": 10,"
    "   \"2\": 11, \"12\": 12},"
    "   \"merges\": [[\"_\", \"a\"], [\"a\", \"b\"], [\"1\", \"2\"]]}}";

static const char text[] = "ab 12 <s>\xc3\xa9" "ab xyz bab 1212";

typedef struct result {
    int32_t ids[64];
    size_t n;
    char text[128];
    size_t len;
} result;

/* One load + encode + decode + stream; EM_OK and r filled, or the first failure's status. */
static em_status run_once(result *r) {
    memset(r, 0, sizeof *r);
    em_tokenizer *tok = em_tokenizer_from_json(json, strlen(json), "faults.json");
    if (!tok) return em_last_status();
    em_status st = em_tokenizer_encode(tok, text, strlen(text), EM_TOKENIZE_ADD_SPECIAL, r->ids, 64, &r->n);
    if (st == EM_OK) st = em_tokenizer_decode(tok, r->ids, r->n, 0, r->text, sizeof r->text, &r->len);
    em_decode_stream *s = st == EM_OK ? em_decode_stream_new(tok, EM_DECODE_SKIP_SPECIAL) : NULL;
    if (st == EM_OK && !s) st = em_last_status();
    for (size_t i = 0; s && i <= r->n && st == EM_OK; i++) {
        const char *piece;
        size_t pn;
        st = i < r->n ? em_decode_stream_step(s, r->ids[i], &piece, &pn) : em_decode_stream_finish(s, &piece, &pn);
    }
    em_decode_stream_free(s);
    em_tokenizer_free(tok);
    return st;
}

static void test_every_allocation_fails_once(void) {
    result want, got;
    arm(0);
    CHECK_OK(run_once(&want));
    long long total = disarm();
    CHECK(want.n > 8 && want.len > 10);
    CHECK(total > 50);
    int failures = 0;
    for (long long n = 1; n <= total; n++) {
        arm(n);
        em_status st = run_once(&got);
        disarm();
        if (st == EM_OK) {   /* a failure inside PCRE2's own allocator cannot be swept: nothing failed */
            CHECK(got.n == want.n && !memcmp(got.ids, want.ids, want.n * sizeof *want.ids));
            continue;
        }
        failures++;
        if (st != EM_ERR_OUT_OF_MEMORY || !em_last_error()[0]) {
            fprintf(stderr, "  allocation %lld failing: %s \"%s\"\n", n, em_status_name(st), em_last_error());
            CHECK(st == EM_ERR_OUT_OF_MEMORY);
        }
        em_clear_error();
        CHECK_OK(run_once(&got));   /* and then it works, with the same answer */
        CHECK(got.n == want.n && !memcmp(got.ids, want.ids, want.n * sizeof *want.ids));
        CHECK(got.len == want.len && !memcmp(got.text, want.text, want.len));
    }
    printf("     %lld allocations, %d failed calls, each out of memory\n", total, failures);
    CHECK(failures > total / 2);
}

int main(void) {
    RUN(test_every_allocation_fails_once);
    return test_summary();
}
