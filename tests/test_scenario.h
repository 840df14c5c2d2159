/* Tests of the test machinery itself: the program re-runs itself with
 * EMBER_HARNESS_SCENARIO=<name>, where main runs one scenario that passes, fails or skips
 * on purpose, and the parent checks the child's exit status and output:
 *   int main(void) { const char *s = getenv("EMBER_HARNESS_SCENARIO"); if (s) return scenario(s); ... }
 *   static void test_x(void) { expect_scenario("name", 1, "0 passed, 1 failed, 0 skipped", "FAIL case"); } */
#ifndef EMBER_TEST_SCENARIO_H
#define EMBER_TEST_SCENARIO_H

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test.h"

typedef struct scenario_run {
    int status; /* exit status, or -1 */
    char *out;  /* stdout and stderr together; free it */
} scenario_run;

static scenario_run run_scenario(const char *name) {
    size_t cap = 1 << 16, n = 0;
    scenario_run c = {.status = -1, .out = calloc(cap, 1)};
    int fd[2];
    if (!c.out || pipe(fd) != 0) return c;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        setenv("EMBER_HARNESS_SCENARIO", name, 1);
        execl("/proc/self/exe", "scenario", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    ssize_t r;
    while (n < cap - 1 && (r = read(fd[0], c.out + n, cap - 1 - n)) > 0) n += (size_t)r;
    c.out[n] = '\0';
    close(fd[0]);
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) c.status = WEXITSTATUS(st);
    return c;
}

/* The scenario must exit with `status` and print `summary` and (when given) `also`. */
static void expect_scenario(const char *name, int status, const char *summary, const char *also) {
    scenario_run c = run_scenario(name);
    bool ok = c.out && c.status == status && strstr(c.out, summary) && (!also || strstr(c.out, also));
    if (!ok)
        fprintf(stderr, "  scenario %s: exit %d (expected %d), expected \"%s\"%s%s in:\n%s\n", name, c.status,
                status, summary, also ? " and " : "", also ? also : "", c.out ? c.out : "");
    CHECK(ok);
    free(c.out);
}

#endif
