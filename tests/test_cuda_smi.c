/* `ember smi` as a user runs it: the built tool (next to this test) is executed and its
 * output parsed like a script parsing nvidia-smi would. Without NVIDIA GPUs (this machine,
 * CI) the query answers for the OpenCL devices and the CPU; with GPUs, for the GPUs. */
#include "test.h"

#include <libgen.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/cuda/cuda_smi.h"

static char g_tool[1024];

/* Run `ember smi ARGS` (stderr too when both); returns the exit status, output in out. */
static int run(const char *args, bool both, char *out, size_t size) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' smi %s%s", g_tool, args, both ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The rows the query should print, counted independently of the tool. */
static int expected_rows(bool *gpus) {
    em_cuda_smi_gpu g[64];
    int n = em__cuda_smi_query(g, 64, NULL, NULL);
    *gpus = n > 0;
    return n > 0 ? n : em_device_count(EM_OPENCL) + 1;
}

static void test_query_csv_like_nvidia_smi(void) {
    char out[16384];
    int rc = run("--query-gpu=name,memory.used,memory.total,utilization.gpu,memory.free,index,"
                 "driver_version,temperature.gpu --format=csv", false, out, sizeof out);
    CHECK(rc == 0);
    static const char header[] = "name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
                                 "memory.free [MiB], index, driver_version, temperature.gpu\n";
    CHECK(!strncmp(out, header, strlen(header)));
    bool gpus = false;
    int rows = expected_rows(&gpus);
    CHECK(count_lines(out) == 1 + rows);
    if (gpus) return; /* the CPU row below is only printed without GPUs */
    /* the last row is the CPU: index "cpu", what cannot be known is [N/A] */
    char *last = out + strlen(out) - 1;
    *last = '\0';
    last = strrchr(out, '\n') + 1;
    CHECK(strstr(last, ", [N/A], ") != NULL);           /* utilization.gpu */
    CHECK(strstr(last, ", cpu, ") != NULL);             /* index */
    CHECK(!strcmp(last + strlen(last) - 7, ", [N/A]")); /* temperature.gpu */
    em_device_props p;
    CHECK_OK(em_device_get_props(EM_DEVICE_CPU, &p));
    char total[64];
    snprintf(total, sizeof total, ", %lld MiB, ", (long long)(p.total_memory >> 20));
    CHECK(strstr(last, total) != NULL);
}

static void test_noheader_nounits(void) {
    char out[16384];
    CHECK(run("--query-gpu=memory.total,index,utilization.gpu --format=csv,noheader,nounits", false,
              out, sizeof out) == 0);
    bool gpus = false;
    CHECK(count_lines(out) == expected_rows(&gpus));
    /* every row starts with a bare number of MiB */
    for (char *line = out; *line; line = strchr(line, '\n') + 1) {
        char *end = NULL;
        long long mib = strtoll(line, &end, 10);
        CHECK(end != line && mib > 0 && !strncmp(end, ", ", 2));
        if (!strchr(line, '\n')) break;
    }
    CHECK(strstr(out, "MiB") == NULL && strstr(out, "%") == NULL);
}

static void test_bad_queries_exit_2(void) {
    char out[4096];
    CHECK(run("--query-gpu=name,bogus --format=csv", true, out, sizeof out) == 2);
    CHECK(strstr(out, "Field \"bogus\" is not a valid field to query.") != NULL);
    CHECK(run("--query-gpu=name", true, out, sizeof out) == 2);
    CHECK(strstr(out, "--format") != NULL);
    CHECK(run("--query-gpu=name --format=xml", true, out, sizeof out) == 2);
}

static void test_table(void) {
    char out[16384];
    CHECK(run("", false, out, sizeof out) == 0);
    CHECK(strstr(out, "EMBER-SMI") && strstr(out, "Memory-Usage") && strstr(out, "| cpu "));
    const char *reason = em_device_unavailable_reason(EM_CUDA);
    if (reason) {
        char line[600];
        snprintf(line, sizeof line, "cuda: %s\n", reason);
        CHECK(strstr(out, line) != NULL); /* the table says why there is no GPU */
    }
    CHECK(run("-L", false, out, sizeof out) == 0);
    CHECK(strstr(out, "cpu: ") != NULL);
}

int main(void) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { fprintf(stderr, "cannot find this test's directory\n"); return 1; }
    self[n] = '\0';
    snprintf(g_tool, sizeof g_tool, "%s/ember", dirname(self));
    if (access(g_tool, X_OK) != 0) {
        fprintf(stderr, "the ember tool is not built at %s\n", g_tool);
        return 1;
    }
    RUN(test_query_csv_like_nvidia_smi);
    RUN(test_noheader_nounits);
    RUN(test_bad_queries_exit_2);
    RUN(test_table);
    return test_summary();
}
