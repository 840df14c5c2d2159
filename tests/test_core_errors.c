/* The sticky thread-local error state. */
#include <pthread.h>
#include "test_core_util.h"

static void test_first_error_wins(void) {
    CHECK(!em_failed());
    CHECK(em_last_status() == EM_OK);
    CHECK(strcmp(em_last_error(), "") == 0);
    CHECK(em_error(EM_ERR_SHAPE, "first %d", 1) == EM_ERR_SHAPE);
    CHECK(em_error(EM_ERR_DTYPE, "second %s", "x") == EM_ERR_DTYPE); /* returns its code anyway */
    CHECK(em_failed());
    CHECK(em_last_status() == EM_ERR_SHAPE);
    CHECK(strcmp(em_last_error(), "first 1") == 0);
    em_clear_error();
    CHECK(!em_failed());
    CHECK(em_error(EM_ERR_DTYPE, "now %s", "this") == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "now this");
}

static void test_long_message_truncated(void) {
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    em_error(EM_ERR_IO, "%s", big);
    CHECK(strlen(em_last_error()) == sizeof(((em_error_state *)0)->message) - 1);
    em_clear_error();
}

static void test_save_restore(void) {
    em_error(EM_ERR_ARGUMENT, "kept");
    em_error_state s;
    em__error_save(&s);
    em_clear_error();
    em_error(EM_ERR_OUT_OF_MEMORY, "transient");
    CHECK(em_last_status() == EM_ERR_OUT_OF_MEMORY);
    em__error_restore(&s);
    CHECK_ERROR(EM_ERR_ARGUMENT, "kept");
    /* Saving "no error" and restoring it clears. */
    em__error_save(&s);
    em_error(EM_ERR_IO, "x");
    em__error_restore(&s);
    CHECK(!em_failed());
}

static void test_status_names(void) {
    CHECK(strcmp(em_status_name(EM_OK), "ok") == 0);
    CHECK(strcmp(em_status_name(EM_ERR_OUT_OF_MEMORY), "out of memory") == 0);
    for (int s = EM_OK; s <= EM_ERR_INTERNAL; s++) {
        const char *n = em_status_name((em_status)s);
        CHECK(n && *n && strcmp(n, "unknown status") != 0);
    }
    CHECK(strcmp(em_status_name((em_status)999), "unknown status") == 0);
}

/* NULL propagation: a failing chain keeps its first error. */
static void test_null_propagation(void) {
    em_tensor *bad = em_zeros(EM_SHAPE(-1), (em_opts){0});
    CHECK(bad == NULL);
    CHECK(em_last_status() == EM_ERR_SHAPE);
    char first[1024];
    snprintf(first, sizeof first, "%s", em_last_error());
    em_tensor *r = em_exp(em_add(bad, bad));
    CHECK(r == NULL);
    CHECK(em_last_status() == EM_ERR_SHAPE);
    CHECK(strcmp(em_last_error(), first) == 0);
    em_clear_error();
    /* With nothing pending, a NULL argument is itself reported. */
    CHECK(em_exp(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_exp: argument 'a' is NULL");
    CHECK(em_copy_(NULL, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_copy_: argument 'dst' is NULL");
}

static void *other_thread(void *arg) {
    (void)arg;
    bool clean = !em_failed(); /* the main thread's error is not visible here */
    em_error(EM_ERR_BACKEND, "thread");
    bool mine = em_last_status() == EM_ERR_BACKEND;
    em_clear_error();
    return (void *)(intptr_t)(clean && mine);
}

static void test_thread_local(void) {
    em_error(EM_ERR_IO, "main");
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, other_thread, NULL) == 0);
    pthread_join(th, &ok);
    CHECK(ok == (void *)1);
    CHECK_ERROR(EM_ERR_IO, "main");
}

int main(void) {
    RUN(test_first_error_wins);
    RUN(test_long_message_truncated);
    RUN(test_save_restore);
    RUN(test_status_names);
    RUN(test_null_propagation);
    RUN(test_thread_local);
    return test_summary();
}
