/* The memory history (include/ember/memory.h: em_memory_record_history, em_memory_dump_history,
 * em_memory_set_tag) on the CPU's caching allocator, read back with Ember's JSON parser: every
 * allocation and free in order, with its size, device, stream, tag, time and the running
 * allocated bytes; the ring keeps the last entries; nn's layers tag their allocations. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>
#include <ember/memory.h>
#include "data/json.h"

static const em_device CPU = {EM_CPU, 0};

/* The dump as parsed JSON (freed by the caller), or a failed check. */
static bool dump(em__json *out) {
    char path[] = "/tmp/ember-memhist-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return false;
    close(fd);
    bool ok = em_memory_dump_history(path) == EM_OK;
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 24);
    size_t n = f ? fread(text, 1, (1 << 24) - 1, f) : 0;
    if (f) fclose(f);
    unlink(path);
    ok = ok && em__json_parse_file("history", text, n, out) == EM_OK;
    free(text);
    return ok;
}

static const em__json *row(const em__json *j, int i) { return &em__json_get(j, "events")->items[i]; }
static const char *col_s(const em__json *r, int c) { return r->items[c].str; }
static double col_n(const em__json *r, int c) { return r->items[c].num; }
enum { T, ACTION, DEVICE, STREAM, ADDRESS, SIZE, REQUESTED, TAG, ALLOCATED, RESERVED };

static void test_every_alloc_and_free_in_order(void) {
    em_memory_empty_cache(CPU);
    int64_t base = em_memory_allocated(CPU);
    CHECK_OK(em_memory_record_history(true, 1000));
    em_memory_set_tag("inputs");
    em_tensor *a = em_empty(EM_SHAPE(1000), EM_OPTS(0));          /* 4000 B, rounded to 4096 */
    em_memory_set_tag("weights \"w\"");
    em_tensor *b = em_empty(EM_SHAPE(300, 1000), EM_OPTS(0));     /* 1.2 MB: the large pool */
    em_memory_set_tag(NULL);
    em_release(a);
    em_release(b);
    CHECK_OK(em_memory_record_history(false, 0));
    em_tensor *c = em_empty(EM_SHAPE(10), EM_OPTS(0));            /* not recorded */
    em_release(c);
    CHECK(em_memory_history_length() == 4);
    em__json j;
    CHECK(dump(&j));
    const em__json *ev = em__json_get(&j, "events");
    CHECK(!strcmp(em__json_get(&j, "format")->str, "ember-memory-history"));
    CHECK(em__json_get(&j, "columns")->count == 10 && ev && ev->count == 4);
    if (ev && ev->count == 4) {
        const char *actions[4] = {"alloc", "alloc", "free", "free"};
        const char *tags[4] = {"inputs", "weights \"w\"", "", ""};
        double sizes[4] = {4096, 1200128, 4096, 1200128}, requested[4] = {4000, 1200000, 0, 0};
        double alloc_after[4] = {4096, 4096 + 1200128, 1200128, 0};
        for (int i = 0; i < 4; i++) {
            const em__json *r = row(&j, i);
            CHECK(r->count == 10 && !strcmp(col_s(r, ACTION), actions[i]) && !strcmp(col_s(r, DEVICE), "cpu"));
            CHECK(col_n(r, SIZE) == sizes[i] && col_n(r, STREAM) == 0);
            CHECK(col_n(r, ALLOCATED) == (double)base + alloc_after[i]);
            CHECK(col_n(r, RESERVED) >= col_n(r, ALLOCATED));
            if (i < 2) CHECK(col_n(r, REQUESTED) == requested[i] && !strcmp(col_s(r, TAG), tags[i]));
            if (i > 0) CHECK(col_n(r, T) >= col_n(row(&j, i - 1), T));
        }
        /* a free names the block its allocation did */
        CHECK(col_n(row(&j, 2), ADDRESS) == col_n(row(&j, 0), ADDRESS));
        CHECK(col_n(row(&j, 3), ADDRESS) == col_n(row(&j, 1), ADDRESS));
    }
    em__json_free(&j);
    CHECK(!em_failed());
}

static void test_ring_keeps_the_last_entries(void) {
    CHECK_OK(em_memory_record_history(true, 3));
    for (int i = 0; i < 5; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "t%d", i);
        em_memory_set_tag(tag);
        em_tensor *t = em_empty(EM_SHAPE(16), EM_OPTS(0));
        em_release(t);
    }
    em_memory_set_tag(NULL);
    em__json j;
    CHECK(dump(&j));
    CHECK(em__json_get(&j, "events")->count == 3 && em__json_get(&j, "dropped")->num == 7);
    CHECK(!strcmp(col_s(row(&j, 0), TAG), "t3") && !strcmp(col_s(row(&j, 0), ACTION), "free"));
    CHECK(!strcmp(col_s(row(&j, 2), TAG), "t4") && em__json_get(&j, "recording")->b);
    em__json_free(&j);
    CHECK_OK(em_memory_record_history(false, 0));
    CHECK(em_memory_record_history(true, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "max_entries must be > 0");
    CHECK(em_memory_dump_history("/nonexistent-dir/x.json") == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "cannot write /nonexistent-dir/x.json");
}

static void test_layers_tag_their_allocations(void) {
    em_module *lin = em_nn_linear(8, 4);
    em_tensor *x = em_ones(EM_SHAPE(2, 8), EM_OPTS(0));
    CHECK_OK(em_memory_record_history(true, 100));
    em_tensor *y = em_forward(lin, x);
    char tag[64];
    CHECK(em_memory_get_tag(tag, sizeof tag) == 0);             /* the layer put it back */
    em_memory_set_tag("mine");
    em_tensor *z = em_forward(lin, x);                          /* the caller's tag wins */
    em_memory_set_tag(NULL);
    CHECK_OK(em_memory_record_history(false, 0));
    em__json j;
    CHECK(dump(&j));
    const em__json *ev = em__json_get(&j, "events");
    int linear = 0, mine = 0;
    for (int i = 0; ev && i < ev->count; i++) {
        if (!strcmp(col_s(&ev->items[i], TAG), "Linear")) linear++;
        if (!strcmp(col_s(&ev->items[i], TAG), "mine")) mine++;
    }
    CHECK(linear >= 1 && mine >= 1);
    em__json_free(&j);
    em_release(y);
    em_release(z);
    em_release(x);
    em_module_free(lin);
    CHECK(!em_failed());
}

int main(void) {
    RUN(test_every_alloc_and_free_in_order);
    RUN(test_ring_keeps_the_last_entries);
    RUN(test_layers_tag_their_allocations);
    return test_summary();
}
