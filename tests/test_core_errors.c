/* The thread-local error state: a call's own failure is the error shown; a NULL argument keeps
 * the error that made it. */
#include <pthread.h>
#include "test_core_util.h"

static void test_latest_error_shown(void) {
    CHECK(!em_failed());
    CHECK(em_last_status() == EM_OK);
    CHECK(strcmp(em_last_error(), "") == 0);
    CHECK(em_error(EM_ERR_SHAPE, "first %d", 1) == EM_ERR_SHAPE);
    CHECK(em_error(EM_ERR_DTYPE, "second %s", "x") == EM_ERR_DTYPE);
    CHECK(em_failed());
    CHECK(em_last_status() == EM_ERR_DTYPE);
    CHECK(strcmp(em_last_error(), "second x") == 0);
    /* the internal form for a failure caused by an earlier one keeps that one */
    CHECK(em__error_unless_pending(EM_ERR_IO, "caused") == EM_ERR_DTYPE);
    CHECK(strcmp(em_last_error(), "second x") == 0);
    unsigned long seq = em__error_seq();
    em_error(EM_ERR_IO, "counted");
    CHECK(em__error_seq() == seq + 1);
    em_clear_error();
    CHECK(em__error_unless_pending(EM_ERR_IO, "now %d", 2) == EM_ERR_IO);
    CHECK_ERROR(EM_ERR_IO, "now 2");
    CHECK(em_error(EM_OK, "nothing") == EM_OK && !em_failed());
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

/* A stale error never hides a new one, and a NULL never hides its cause: both orders of a
 * NULL argument and a bad value, across layers (data, optim, core, nn). */
static void test_stale_error_not_shown(void) {
    em_scope s = em_scope_begin();
    em_module *fc = em_nn_linear(4, 2);
    CHECK(fc != NULL);
    /* a NULL argument first, then a call with a bad value: the bad value is reported */
    CHECK(em_dataset_normalize(NULL, 0.0, 1.0) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "em_dataset_normalize: argument 'ds' is NULL") != NULL);
    CHECK(em_sgd(fc, -1.0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate: -1");
    /* the other order: the NULL (a failed call's result) keeps the error that caused it */
    CHECK(em_sgd(fc, -1.0) == NULL);
    CHECK(em_dataset_normalize(NULL, 0.0, 1.0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Invalid learning rate: -1");
    /* an earlier failure, then a valid call: it runs, and the error stays pending */
    CHECK(em_zeros(EM_SHAPE(-2), (em_opts){0}) == NULL);
    em_tensor *ok = em_ones(EM_SHAPE(2), (em_opts){0});
    CHECK(ok != NULL);
    CHECK(em_failed());
    CHECK(em_last_status() == EM_ERR_SHAPE);
    /* then a shape error of its own: the new one is shown */
    CHECK(em_add(ok, em_ones(EM_SHAPE(3), (em_opts){0})) == NULL);
    CHECK(em_last_status() == EM_ERR_SHAPE && strstr(em_last_error(), "em_add") != NULL);
    em_clear_error();
    /* a layer's own failure after an unrelated one names the layer */
    em_error(EM_ERR_IO, "unrelated");
    CHECK(em_forward(fc, em_ones(EM_SHAPE(3, 5), (em_opts){0})) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "Linear(in_features=4, out_features=2, bias=True): ");
    /* an optional argument left NULL is not taken for a failure: a Conv2d without bias runs */
    em_error(EM_ERR_IO, "unrelated");
    em_tensor *y = em_conv2d(em_ones(EM_SHAPE(1, 1, 3, 3), (em_opts){0}), em_ones(EM_SHAPE(2, 1, 3, 3), (em_opts){0}),
                             NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1);
    CHECK(y != NULL && em_numel(y) == 2);
    CHECK_ERROR(EM_ERR_IO, "unrelated");
    em_scope_end(s);
    em_module_free(fc);
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
    RUN(test_latest_error_shown);
    RUN(test_long_message_truncated);
    RUN(test_save_restore);
    RUN(test_status_names);
    RUN(test_null_propagation);
    RUN(test_stale_error_not_shown);
    RUN(test_thread_local);
    return test_summary();
}
