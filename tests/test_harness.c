/* The harness of tests/test.h tested: each scenario runs as a child of this program that
 * fails, skips or passes on purpose (tests/test_scenario.h); the parent checks its exit
 * status and summary line.
 * Also: ctest maps the skip status to "skipped" for every registered test. */
#include "test_scenario.h"

/* ---- the children's cases ---- */
static void case_passes(void) { CHECK(1 + 1 == 2); }
static void case_fails(void) { CHECK(1 + 1 == 3); }
static void case_skips(void) { SKIP("nothing to run it on (%d devices)", 0); }
static void case_fails_then_skips(void) {
    CHECK(0);
    SKIP("too late: a check already failed");
}
static void case_leaves_error(void) { em_set_num_threads(0); }
static void case_marks_skip_and_goes_on(void) {
    test_skip("part of it could not run");
    CHECK(1);
}

/* The scenario named by EMBER_HARNESS_SCENARIO, as its own program's main. */
static int scenario(const char *name) {
    if (!strcmp(name, "check_before_run")) {
        CHECK(0); /* discarded by the old RUN */
        RUN(case_passes);
    } else if (!strcmp(name, "check_after_run")) {
        RUN(case_passes);
        CHECK(0);
    } else if (!strcmp(name, "all_skip")) {
        RUN(case_skips);
        test_skip_case("replay on nothing", "no such device");
    } else if (!strcmp(name, "some_skip")) {
        RUN(case_passes);
        RUN(case_skips);
        RUN(case_marks_skip_and_goes_on);
    } else if (!strcmp(name, "fail_beats_skip")) {
        RUN(case_fails_then_skips);
        RUN(case_skips);
    } else if (!strcmp(name, "one_fails")) {
        RUN(case_passes);
        RUN(case_fails);
    } else if (!strcmp(name, "pending_error")) {
        RUN(case_leaves_error);
    } else if (!strcmp(name, "passes")) {
        RUN(case_passes);
        RUN(case_passes);
    } else {
        return 3;
    }
    return test_summary();
}

/* ---- the parent ---- */
static void test_check_before_run_fails(void) {
    expect_scenario("check_before_run", 1, "1 passed, 1 failed, 0 skipped", "FAIL (outside any RUN)");
}
static void test_check_after_last_run_fails(void) {
    expect_scenario("check_after_run", 1, "1 passed, 1 failed, 0 skipped", "FAIL (outside any RUN)");
}
static void test_all_skipped_exits_77(void) {
    expect_scenario("all_skip", TEST_SKIP_CODE, "0 passed, 0 failed, 2 skipped",
           "SKIP case_skips: nothing to run it on (0 devices)");
    expect_scenario("all_skip", TEST_SKIP_CODE, "0 passed, 0 failed, 2 skipped", "SKIP replay on nothing: no such device");
}
static void test_some_skipped_counts_them(void) {
    expect_scenario("some_skip", 0, "1 passed, 0 failed, 2 skipped", "SKIP case_marks_skip_and_goes_on: part of it");
}
static void test_failure_beats_skip(void) {
    expect_scenario("fail_beats_skip", 1, "0 passed, 1 failed, 1 skipped", "FAIL case_fails_then_skips");
}
static void test_failed_case_fails(void) {
    expect_scenario("one_fails", 1, "1 passed, 1 failed, 0 skipped", "FAIL case_fails");
}
static void test_pending_error_fails(void) {
    expect_scenario("pending_error", 1, "0 passed, 1 failed, 0 skipped", "case_leaves_error left an error pending");
}
static void test_passing_passes(void) {
    expect_scenario("passes", 0, "2 passed, 0 failed, 0 skipped", "ok   case_passes");
}

/* The first argument of a CMake command line `cmd(ARG ...)`, with the bracket or quote that
 * CMake versions put around it skipped (3.x writes add_test([=[name]=] ...)); NULL when the
 * line is not that command. */
static const char *command_arg(const char *line, const char *cmd) {
    while (*line == ' ' || *line == '\t') line++;
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n)) return NULL;
    line += n;
    while (*line == ' ') line++;
    if (!strncmp(line, "[=[", 3)) line += 3;
    else if (*line == '"') line++;
    return line;
}

/* Every test ctest knows maps exit status 77 to "skipped" (CMakeLists.txt). Read from the
 * generated CTestTestfile.cmake: running ctest here would rewrite the log that
 * scripts/test.sh reads. */
static void test_ctest_maps_77_to_skipped(void) {
    const char *build = getenv("EMBER_BUILD_DIR");
    if (!build) SKIP("EMBER_BUILD_DIR not set: run me through ctest");
    char path[512];
    snprintf(path, sizeof path, "%s/CTestTestfile.cmake", build);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    static char line[1 << 16];
    int tests = 0, mapped = 0;
    while (fgets(line, sizeof line, f)) {
        const char *name;
        if ((name = command_arg(line, "add_test(")) && !strncmp(name, "test_", 5)) tests++;
        if ((name = command_arg(line, "set_tests_properties(")) && !strncmp(name, "test_", 5) &&
            (strstr(line, " SKIP_RETURN_CODE \"77\"") || strstr(line, " SKIP_RETURN_CODE 77")))
            mapped++;
    }
    fclose(f);
    if (tests == 0) fprintf(stderr, "  no add_test(test_...) lines in %s (a CMake that writes them differently?)\n", path);
    if (tests != mapped || tests < 20) fprintf(stderr, "  %d of %d tests map 77 to skipped\n", mapped, tests);
    CHECK(tests >= 20 && mapped == tests);
}

int main(void) {
    const char *s = getenv("EMBER_HARNESS_SCENARIO");
    if (s) return scenario(s);
    RUN(test_check_before_run_fails);
    RUN(test_check_after_last_run_fails);
    RUN(test_all_skipped_exits_77);
    RUN(test_some_skipped_counts_them);
    RUN(test_failure_beats_skip);
    RUN(test_failed_case_fails);
    RUN(test_pending_error_fails);
    RUN(test_passing_passes);
    RUN(test_ctest_maps_77_to_skipped);
    return test_summary();
}
