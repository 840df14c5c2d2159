/* The leak checker under the suite's own sanitizer options (scripts/test.sh --sanitize).
 * GCC 12's runtime guesses the layout of a thread's dynamically allocated TLS block (a
 * dlopen'd library's __thread data) from its address, and where the guess is wrong its leak
 * checker's tracer dies at exit ("Tracer caught signal 11 ... LeakSanitizer has encountered
 * a fatal error") after every case passed. The suite turns that guess off
 * (intercept_tls_get_addr=0); these cases check that it then neither crashes on such a
 * block nor stops finding a real leak. Each case runs this program again as a child with
 * the environment's ASAN_OPTIONS and LSAN_OPTIONS and reads how it ended. */
#include "test.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif

enum { HELD_BYTES = 12345, LOST_BYTES = 777 };

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cond = PTHREAD_COND_INITIALIZER;
static int held_done;

/* a thread that stores a block in the module's thread-local and stays alive to the end, so
 * that the leak check at exit stops it with its TLS in place */
static void *holder_thread(void *hold_fn) {
    void (*hold)(size_t) = (void (*)(size_t))(uintptr_t)hold_fn;
    hold(HELD_BYTES);
    pthread_mutex_lock(&held_lock);
    held_done = 1;
    pthread_cond_signal(&held_cond);
    pthread_mutex_unlock(&held_lock);
    for (;;) pause();
    return NULL;
}

/* the child: 0 when it reached the end of main (the leak check runs after) */
static int child(const char *mode) {
    const char *module = getenv("EMBER_TEST_TLS_MODULE");
    void *h = module ? dlopen(module, RTLD_NOW) : NULL;
    if (!h) {
        fprintf(stderr, "child: cannot load the module %s: %s\n", module ? module : "(unset)", dlerror());
        return 2;
    }
    void *sym = dlsym(h, "thread_local_holder_hold");
    if (!sym) return 2;
    pthread_t t;
    if (pthread_create(&t, NULL, holder_thread, sym) != 0) return 2;
    pthread_mutex_lock(&held_lock);
    while (!held_done) pthread_cond_wait(&held_cond, &held_lock);
    pthread_mutex_unlock(&held_lock);
    if (strcmp(mode, "leak") == 0) {
        static void *volatile lost;
        lost = malloc(LOST_BYTES);
        memset(lost, 1, LOST_BYTES);
        lost = NULL; /* the only pointer is gone: a direct leak */
    }
    printf("child: end of main\n");
    fflush(stdout);
    return 0;
}

/* runs this program as a child in `mode`; its output (stdout + stderr) into out */
static int run_child(const char *mode, char *out, size_t size) {
    char self[PATH_MAX], cmd[PATH_MAX + 64];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' --child %s 2>&1", self, mode);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t used = fread(out, 1, size - 1, p);
    out[used] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static char out[1 << 16];

/* why this program's cases cannot run here, or NULL */
static const char *not_ready(void) {
#ifndef HAVE_ASAN
    return "not a sanitizer build (scripts/test.sh --sanitize runs this)";
#endif
    if (!getenv("EMBER_TEST_TLS_MODULE")) return "EMBER_TEST_TLS_MODULE is not set (CMake sets it)";
    return NULL;
}

static void test_thread_local_root_is_not_a_crash(void) {
    if (not_ready()) SKIP("%s", not_ready());
    int rc = run_child("hold", out, sizeof out);
    if (rc != 0 || strstr(out, "Tracer caught") || strstr(out, "LeakSanitizer"))
        fprintf(stderr, "  ASAN_OPTIONS=%s\n  the child's output:\n%s\n",
                getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "(unset)", out);
    CHECK(rc == 0);
    CHECK(strstr(out, "child: end of main") != NULL);
    CHECK(strstr(out, "Tracer caught") == NULL); /* the tracer survived the thread-local block */
    CHECK(strstr(out, "LeakSanitizer") == NULL); /* and the block it holds is not a leak */
}

static void test_real_leak_is_found(void) {
    if (not_ready()) SKIP("%s", not_ready());
    int rc = run_child("leak", out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "Direct leak of %d byte", LOST_BYTES);
    if (rc == 0 || !strstr(out, want)) fprintf(stderr, "  the child's output:\n%s\n", out);
    CHECK(rc != 0);
    CHECK(strstr(out, want) != NULL);
    CHECK(strstr(out, "Tracer caught") == NULL);
    char held[64];
    snprintf(held, sizeof held, "of %d byte", HELD_BYTES);
    CHECK(strstr(out, held) == NULL); /* the thread-local's block is still reached */
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
    RUN(test_thread_local_root_is_not_a_crash);
    RUN(test_real_leak_is_found);
    return test_summary();
}
