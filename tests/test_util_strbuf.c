/* src/util/strbuf: the fixed kind keeps snprintf's contract, the growing kind grows. */
#include "test.h"
#include "util/strbuf.h"

static void test_fixed_fits(void) {
    char buf[32];
    em_strbuf b = em__sb_fixed(buf, sizeof buf);
    em__sb_str(&b, "ab");
    em__sb_printf(&b, "%d-%s", 42, "x");
    em__sb_spaces(&b, 3);
    em__sb_put(&b, "zzz", 1);
    CHECK(!strcmp(buf, "ab42-x   z"));
    CHECK(b.len == strlen("ab42-x   z"));
}

static void test_fixed_truncates_and_counts(void) {
    char buf[8];
    memset(buf, '#', sizeof buf);
    em_strbuf b = em__sb_fixed(buf, sizeof buf);
    em__sb_str(&b, "hello");
    em__sb_printf(&b, "%s", " world");   /* only "he" more fits */
    CHECK(!strcmp(buf, "hello w"));
    em__sb_str(&b, "!!");                  /* nothing fits, still counted */
    em__sb_spaces(&b, 40);
    CHECK(!strcmp(buf, "hello w"));
    CHECK(b.len == strlen("hello world!!") + 40);
    char small[1] = {'#'};
    em_strbuf one = em__sb_fixed(small, 1);
    em__sb_put(&one, "abc", 3);
    CHECK(small[0] == '\0' && one.len == 3);
    em_strbuf count = em__sb_fixed(NULL, 0);  /* measuring only */
    em__sb_printf(&count, "%05d", 7);
    em__sb_str(&count, "ab");
    CHECK(count.len == 7 && !count.oom);
}

static void test_growing(void) {
    em_strbuf b = em__sb_growing();
    for (int i = 0; i < 1000; i++) em__sb_printf(&b, "%d,", i % 10);
    em__sb_spaces(&b, 100);
    em__sb_put(&b, "end", 3);
    CHECK(!b.oom && b.len == 2000 + 100 + 3 && strlen(b.s) == b.len);
    CHECK(!strncmp(b.s, "0,1,2,", 6) && !strcmp(b.s + b.len - 4, " end"));
    char big[600];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    em__sb_printf(&b, "[%s]", big);        /* one append larger than the buffer has grown */
    CHECK(b.len == 2103 + 601 && b.s[b.len - 1] == ']' && b.s[2103] == '[' && b.cap > b.len);
    em__sb_free(&b);
    CHECK(b.s == NULL && b.len == 0);
}

int main(void) {
    RUN(test_fixed_fits);
    RUN(test_fixed_truncates_and_counts);
    RUN(test_growing);
    return test_summary();
}
