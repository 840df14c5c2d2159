/* CUDA on a machine without a driver (this machine and CI): the backend says why it is
 * unavailable, nothing CUDA can be created, and everything on the CPU keeps working.
 * On a machine that has libcuda.so.1 the same checks turn into consistency checks. */
#include "test.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Is there a driver at all? Asked independently of Ember's loader. */
static bool driver_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) dlclose(h);
    return h != NULL;
}

static void test_reason(void) {
    const char *r = em_device_unavailable_reason(EM_CUDA);
    printf("     cuda: %s\n", r ? r : "available");
    if (!driver_present()) {
        CHECK(!em_device_available(EM_CUDA));
        CHECK(em_device_count(EM_CUDA) == 0);
        CHECK(r && !strncmp(r, "no driver: libcuda.so.1 not found (looked in ", 45));
        CHECK(r && strstr(r, "/usr/local/cuda/lib64"));
    } else if (em_device_available(EM_CUDA)) {
        CHECK(r == NULL && em_device_count(EM_CUDA) > 0);
    } else {
        /* a driver without a usable device */
        CHECK(r && (!strncmp(r, "no device: ", 11) || !strncmp(r, "no driver: ", 11) ||
                    !strncmp(r, "driver failed: ", 15)));
    }
}

static void test_tensor_on_cuda_fails_clearly(void) {
    if (em_device_available(EM_CUDA)) return; /* covered by the GPU tests where there is one */
    em_device d;
    CHECK_OK(em_device_parse("cuda", &d));
    em_tensor *t = em_zeros(EM_SHAPE(2, 3), EM_OPTS(.device = d));
    CHECK(t == NULL);
    em_status s = em_last_status();
    CHECK(s == EM_ERR_UNAVAILABLE || s == EM_ERR_DEVICE);
    CHECK(strstr(em_last_error(), em_device_unavailable_reason(EM_CUDA)) != NULL);
    em_clear_error();

    em_tensor *c = em_ones(EM_SHAPE(4), EM_OPTS(0));
    CHECK(c != NULL);
    em_tensor *moved = em_to(c, EM_DEVICE(EM_CUDA, 1));
    CHECK(moved == NULL);
    CHECK(em_last_status() == EM_ERR_UNAVAILABLE || em_last_status() == EM_ERR_DEVICE);
    em_clear_error();
    em_device_props p;
    CHECK(em_device_get_props(EM_DEVICE(EM_CUDA, 0), &p) != EM_OK);
    em_clear_error();
    CHECK(em_device_synchronize(EM_DEVICE(EM_CUDA, 0)) != EM_OK);
    em_clear_error();
    em_release(c);
}

static void test_cpu_keeps_working(void) {
    em_device d = em_device_auto();
    if (!em_device_available(EM_CUDA)) CHECK(d.type != EM_CUDA);
    em_tensor *a = em_full(EM_SHAPE(2, 2), 1.5, EM_OPTS(0));
    em_tensor *b = em_arange(0, 4, 1, EM_OPTS(0));
    em_tensor *bv = b ? em_view(b, EM_SHAPE(2, 2)) : NULL;
    em_tensor *c = em_add(a, bv);
    float got[4] = {0};
    CHECK_OK(em_copy_to_host(c, got, sizeof got));
    for (int i = 0; i < 4; i++) CHECK_NEAR(got[i], 1.5 + i, 1e-6);
    em_release(c);
    em_release(bv);
    em_release(b);
    em_release(a);
}

/* Child mode: a fresh process with EMBER_CUDA_PATH at an empty dir and the trace on. */
static int child_empty_path(const char *dir, const char *trace_file) {
    if (!freopen(trace_file, "w", stderr)) return 3;
    const char *r = em_device_unavailable_reason(EM_CUDA);
    fflush(stderr);
    if (!r || !strstr(r, "no driver") || !strstr(r, dir)) {
        printf("child: reason \"%s\" lacks \"no driver\" or %s\n", r ? r : "(null)", dir);
        return 1;
    }
    return em_device_count(EM_CUDA) == 0 ? 0 : 2;
}

static void test_empty_cuda_path_in_fresh_process(void) {
    if (driver_present()) return; /* the default path would find the driver anyway */
    char dir[] = "/tmp/ember-cuda-path-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char trace[64];
    snprintf(trace, sizeof trace, "%s.trace", dir);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("EMBER_CUDA_PATH", dir, 1);
        setenv("EMBER_CUDA_TRACE", "1", 1);
        char *args[] = {"test_cuda_unavailable", "--child", dir, trace, NULL};
        execv("/proc/self/exe", args);
        _exit(4);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* the trace says where libcuda.so.1 was looked for, EMBER_CUDA_PATH first */
    FILE *f = fopen(trace, "r");
    char text[8192] = "";
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    char expect[128];
    snprintf(expect, sizeof expect, "tried %s/libcuda.so.1", dir);
    char *first = strstr(text, expect), *sys = strstr(text, "tried /usr/local/cuda/lib64/libcuda.so.1");
    CHECK(first != NULL && sys != NULL && first < sys);
    unlink(trace);
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) return child_empty_path(argv[2], argv[3]);
    RUN(test_empty_cuda_path_in_fresh_process); /* first: before this process loads anything */
    RUN(test_reason);
    RUN(test_tensor_on_cuda_fails_clearly);
    RUN(test_cpu_keeps_working);
    return test_summary();
}
