/* `ember memory-timeline` end to end: a history recorded here (the CPU's allocator, tagged
 * allocations) is drawn as PNG and SVG by the built command, and tests/plot_check.py finds the
 * bands' fixed colours (plot.h) in each picture. The reader (tools/ember/memory_history.c) is
 * checked on its own: the rows by column name, escapes, and files that are not a history. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "tool_run.h"
#include "../tools/ember/plot.h"
#include "../tools/ember/memory_history.c"

static char out[65536];
static char dir[64];
static bool have_python;

static bool picture_ok(const char *path, int w, int h, const char *present, const char *absent) {
    char cmd[1024], buf[4096];
    snprintf(cmd, sizeof cmd, "python3 tests/plot_check.py '%s' %d %d --present %s --absent %s 2>&1", path, w, h,
             present, absent);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    printf("  %s", buf);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_reader(void) {
    const char *text =
        "{\"version\": 1, \"extra\": {\"x\": [1, true, null, \"\\u00e9\"]}, \"format\": \"ember-memory-history\","
        " \"columns\": [\"tag\", \"time_ns\", \"action\", \"device\", \"stream\", \"address\", \"size\", \"unused\","
        " \"allocated\", \"reserved\"], \"dropped\": 2,"
        " \"events\": [[\"a\\\"b\\u00e9\", 5, \"alloc\", \"cuda:1\", 3, 4096, 512, {\"k\": 1}, 512, 2097152],"
        "              [\"\", 7.5e1, \"free\", \"cpu\", 0, 4096, 512, [], 0, 2097152]]}";
    mh_history h;
    char why[256];
    CHECK(mh_parse(text, strlen(text), &h, why, sizeof why));
    CHECK(h.n == 2 && h.dropped == 2);
    if (h.n == 2) {
        CHECK(!strcmp(h.events[0].tag, "a\"b\xc3\xa9") && h.events[0].t_ns == 5 && h.events[0].alloc);
        CHECK(!strcmp(h.events[0].device, "cuda:1") && h.events[0].stream == 3 && h.events[0].address == 4096);
        CHECK(h.events[0].size == 512 && h.events[0].allocated == 512 && h.events[0].reserved == 2097152);
        CHECK(!h.events[1].alloc && h.events[1].t_ns == 75 && !strcmp(h.events[1].device, "cpu"));
    }
    mh_free(&h);
    static const char *const bad[][2] = {
        {"[1, 2]", "at byte 0: expected a JSON object"},
        {"{\"format\": \"other\"}", "\"format\" is not \"ember-memory-history\""},
        {"{\"format\": \"ember-memory-history\", \"columns\": [\"time_ns\"], \"events\": []}",
         "\"columns\" lacks \"action\""},
        {"{\"format\": \"ember-memory-history\"}", "not a memory history: no \"events\""},
        {"{\"format\": \"ember-memory-history\", \"columns\": [\"time_ns\", \"action\", \"device\", \"stream\", "
         "\"address\", \"size\", \"tag\", \"allocated\", \"reserved\"], \"events\": [[1, \"grow\", \"cpu\", 0, 1, 1, "
         "\"\", 1, 1]]}",
         "an action is neither alloc nor free"},
        {"{\"format\": \"ember-memory-history\", \"events\": [", "\"events\" comes before \"columns\""},
        {"{\"format\": \"ember-memory-history\", \"x\": [1, 2", "expected , or ]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        CHECK(!mh_parse(bad[i][0], strlen(bad[i][0]), &h, why, sizeof why));
        if (!strstr(why, bad[i][1])) fprintf(stderr, "  case %zu: %s\n", i, why);
        CHECK(strstr(why, bad[i][1]) != NULL);
    }
}

/* A recorded history with five tags, drawn in both formats: four bands, the fifth tag in the
 * band under the total. */
static void test_timeline_pictures(void) {
    if (!have_python) SKIP("python3 is not installed (scripts/setup.sh installs it)");
    char hist[128];
    snprintf(hist, sizeof hist, "%s/history.json", dir);
    CHECK_OK(em_memory_record_history(true, 10000));
    em_tensor *keep[12];
    static const char *const tags[5] = {"weights", "activations", "grads", "optimizer", "workspace"};
    /* The picture's x axis is time: 20 ms between events, so that each band is drawn at least
     * that wide however the machine's load spreads the calls themselves. */
    for (int i = 0; i < 12; i++) {
        em_memory_set_tag(tags[i % 5]);
        keep[i] = em_empty(EM_SHAPE(50000 * (i + 1)), EM_OPTS(0));
        usleep(20000);
    }
    em_memory_set_tag(NULL);
    for (int i = 11; i >= 0; i -= 2) em_release(keep[i]), usleep(20000);
    for (int i = 10; i >= 0; i -= 2) em_release(keep[i]), usleep(20000);
    CHECK_OK(em_memory_record_history(false, 0));
    CHECK_OK(em_memory_dump_history(hist));
    char present[128], absent[16];
    snprintf(present, sizeof present, "%06x,%06x,%06x,%06x,%06x,%06x", PLOT_RGB_MEM_TAG0, PLOT_RGB_MEM_TAG1,
             PLOT_RGB_MEM_TAG2, PLOT_RGB_MEM_TAG3, PLOT_RGB_MEM_TOTAL, PLOT_RGB_MEM_RESERVED);
    snprintf(absent, sizeof absent, ",");
    static const char *const ext[] = {"png", "svg"};
    for (int i = 0; i < 2; i++) {
        char file[128], args[512];
        snprintf(file, sizeof file, "%s/timeline.%s", dir, ext[i]);
        snprintf(args, sizeof args, "memory-timeline %s -o %s", hist, file);
        int rc = tool_run(args, out, sizeof out);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "%s\n", out);
        CHECK(picture_ok(file, PLOT_MEMORY_W, PLOT_FIG_H, present, absent));
    }
    /* --top 1: one band */
    char file[128], args[512];
    snprintf(file, sizeof file, "%s/top1.svg", dir);
    snprintf(args, sizeof args, "memory-timeline %s -o %s --top 1 --device cpu", hist, file);
    CHECK(tool_run(args, out, sizeof out) == 0);
    snprintf(present, sizeof present, "%06x,%06x", PLOT_RGB_MEM_TAG0, PLOT_RGB_MEM_TOTAL);
    snprintf(absent, sizeof absent, "%06x", PLOT_RGB_MEM_TAG1);
    CHECK(picture_ok(file, PLOT_MEMORY_W, PLOT_FIG_H, present, absent));
    /* errors: a device without events, a file that is not a history, no output */
    snprintf(args, sizeof args, "memory-timeline %s -o %s --device cuda:3", hist, file);
    CHECK(tool_run(args, out, sizeof out) == 1 && strstr(out, "no event of cuda:3 in the history"));
    snprintf(args, sizeof args, "memory-timeline tests/plot_check.py -o %s", file);
    CHECK(tool_run(args, out, sizeof out) == 1 && strstr(out, "at byte 0: expected a JSON object"));
    snprintf(args, sizeof args, "memory-timeline %s", hist);
    CHECK(tool_run(args, out, sizeof out) == 2 && strstr(out, "-o/--output PATH is required"));
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    RUN(test_reader);
    int rc = tool_run("memory-timeline x.json -o /nonexistent-folder/x.png", out, sizeof out);
    if (rc == 2 && strstr(out, "built without cairo")) {
        test_skip_case("timeline pictures", "this ember was built without cairo (libcairo2-dev): the picture is "
                       "refused, as checked");
        return test_summary();
    }
    snprintf(dir, sizeof dir, "/tmp/ember_test_memtl_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    have_python = system("python3 -c 'import zlib, xml.etree.ElementTree' >/dev/null 2>&1") == 0;
    RUN(test_timeline_pictures);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
