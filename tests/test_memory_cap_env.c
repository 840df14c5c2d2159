/* EMBER_MEMORY_CAP: every form the variable accepts, read for every device type. An entry
 * for one device must never cap another (cuda=100MiB used to cap the CPU); a bare value
 * caps every device; the more specific entry wins whatever the order; a malformed or
 * repeated entry is an error for the device that reads it. */
#include <stdlib.h>
#include "test.h"
#include "memory/internal.h"

#define MiB ((int64_t)1 << 20)

/* What EMBER_MEMORY_CAP=spec gives device d: its cap in bytes (-1: none), its fraction (0:
 * none), and whether it is an error. */
typedef struct outcome { int64_t cap; double fraction; bool error; } outcome;

static outcome read_cap(const char *spec, em_device d) {
    mem_state st = {.dev = d, .cap = -1};
    setenv("EMBER_MEMORY_CAP", spec, 1);
    em__mem_config_from_env(&st);
    unsetenv("EMBER_MEMORY_CAP");
    return (outcome){st.cap, st.cap_fraction, st.config_error[0] != '\0'};
}

static const em_device devices[] = {
    {EM_CPU, 0}, {EM_CUDA, 0}, {EM_CUDA, 1}, {EM_MPS, 0}, {EM_OPENCL, 0}, {EM_OPENCL, 1},
};
#define NDEV ((int)(sizeof devices / sizeof devices[0]))

static int cases_run;

/* expect[i] is the outcome for devices[i] */
static void check_spec(const char *spec, const outcome *expect) {
    for (int i = 0; i < NDEV; i++) {
        outcome o = read_cap(spec, devices[i]);
        bool ok = o.cap == expect[i].cap && o.fraction == expect[i].fraction && o.error == expect[i].error;
        if (!ok)
            fprintf(stderr, "  EMBER_MEMORY_CAP='%s' on %s: cap %lld fraction %g error %d, expected %lld %g %d\n", spec,
                    em_device_str(devices[i]).s, (long long)o.cap, o.fraction, o.error, (long long)expect[i].cap,
                    expect[i].fraction, expect[i].error);
        CHECK(ok);
        cases_run++;
    }
}

#define NONE {-1, 0, false}
#define BYTES(b) {(b), 0, false}
#define FRAC(f) {-1, (f), false}
#define ERR {-1, 0, true}

static void test_one_device_type_caps_only_that_type(void) {
    /* order: cpu, cuda:0, cuda:1, mps, opencl:0, opencl:1 */
    check_spec("cuda=100MiB", (outcome[]){NONE, BYTES(100 * MiB), BYTES(100 * MiB), NONE, NONE, NONE});
    check_spec("cpu=100MiB", (outcome[]){BYTES(100 * MiB), NONE, NONE, NONE, NONE, NONE});
    check_spec("mps=1GB", (outcome[]){NONE, NONE, NONE, BYTES(1000000000), NONE, NONE});
    check_spec("opencl=0.5", (outcome[]){NONE, NONE, NONE, NONE, FRAC(0.5), FRAC(0.5)});
    check_spec("CUDA = 2G", (outcome[]){NONE, BYTES(2048 * MiB), BYTES(2048 * MiB), NONE, NONE, NONE});
}

static void test_one_device_index_caps_only_that_device(void) {
    check_spec("cuda:1=8MiB", (outcome[]){NONE, NONE, BYTES(8 * MiB), NONE, NONE, NONE});
    check_spec("opencl:0=0.25", (outcome[]){NONE, NONE, NONE, NONE, FRAC(0.25), NONE});
    check_spec("cpu:0=3MB", (outcome[]){BYTES(3000000), NONE, NONE, NONE, NONE, NONE});
    check_spec("mps:0=1KiB", (outcome[]){NONE, NONE, NONE, BYTES(1024), NONE, NONE});
}

static void test_bare_value_caps_every_device(void) {
    check_spec("512MiB", (outcome[]){BYTES(512 * MiB), BYTES(512 * MiB), BYTES(512 * MiB), BYTES(512 * MiB),
                                     BYTES(512 * MiB), BYTES(512 * MiB)});
    check_spec("0.5", (outcome[]){FRAC(0.5), FRAC(0.5), FRAC(0.5), FRAC(0.5), FRAC(0.5), FRAC(0.5)});
    check_spec("  1000 ", (outcome[]){BYTES(1000), BYTES(1000), BYTES(1000), BYTES(1000), BYTES(1000), BYTES(1000)});
}

static void test_lists_and_precedence(void) {
    check_spec("cpu=512MiB,opencl:0=0.5,cuda=8GB",
               (outcome[]){BYTES(512 * MiB), BYTES(8000000000), BYTES(8000000000), NONE, FRAC(0.5), NONE});
    /* the specific entry wins in either order */
    check_spec("opencl=2MiB,opencl:1=1MiB", (outcome[]){NONE, NONE, NONE, NONE, BYTES(2 * MiB), BYTES(1 * MiB)});
    check_spec("opencl:1=1MiB,opencl=2MiB", (outcome[]){NONE, NONE, NONE, NONE, BYTES(2 * MiB), BYTES(1 * MiB)});
    check_spec("4MiB,cuda=1MiB", (outcome[]){BYTES(4 * MiB), BYTES(1 * MiB), BYTES(1 * MiB), BYTES(4 * MiB),
                                             BYTES(4 * MiB), BYTES(4 * MiB)});
    check_spec("cuda=1MiB,4MiB", (outcome[]){BYTES(4 * MiB), BYTES(1 * MiB), BYTES(1 * MiB), BYTES(4 * MiB),
                                             BYTES(4 * MiB), BYTES(4 * MiB)});
}

static void test_bad_entries_are_errors(void) {
    /* malformed anywhere in the list: every device that reads it reports it */
    check_spec("cpu=12QB", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("tpu=1G", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("cuda:x=1G", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("cuda=-1G", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("cpu=", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("1e300", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    /* an empty entry is a missing one, not nothing: every device reports it */
    check_spec("cpu=5MiB,,", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec(" , cpu=1MiB", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("cpu=1MiB,", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("cuda=1G, ,cpu=1MiB", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    /* the same device twice at one level: an error where it applies only */
    check_spec("cpu=1G,cpu=2G", (outcome[]){ERR, NONE, NONE, NONE, NONE, NONE});
    check_spec("1G,2G", (outcome[]){ERR, ERR, ERR, ERR, ERR, ERR});
    check_spec("opencl:1=1G,opencl:1=2G", (outcome[]){NONE, NONE, NONE, NONE, NONE, ERR});
}

static void test_long_value_is_read_whole(void) {
    /* 100 entries for other devices, then the CPU's: nothing is cut at a buffer's end */
    char spec[4096] = "";
    for (int i = 0; i < 100; i++) {
        size_t n = strlen(spec);
        snprintf(spec + n, sizeof spec - n, "opencl:%d=1MiB,", i + 2);
    }
    strcat(spec, "cpu=7MiB");
    check_spec(spec, (outcome[]){BYTES(7 * MiB), NONE, NONE, NONE, NONE, NONE});
}

int main(void) {
    unsetenv("EMBER_MEMORY_POLICY");
    RUN(test_one_device_type_caps_only_that_type);
    RUN(test_one_device_index_caps_only_that_device);
    RUN(test_bare_value_caps_every_device);
    RUN(test_lists_and_precedence);
    RUN(test_bad_entries_are_errors);
    RUN(test_long_value_is_read_whole);
    printf("  %d (EMBER_MEMORY_CAP, device) pairs checked\n", cases_run);
    return test_summary();
}
