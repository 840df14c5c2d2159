/* A backend cannot pass the conformance and golden tests by declining: tests/required_ops.txt
 * lists the ops each backend must support; declining one of them fails the case, declining
 * an op off the list is reported as skipped. Each scenario runs as a child
 * (tests/test_scenario.h) around a fake backend: the CPU backend with holes in it. */
/* only the decline machinery of backend_ops_util.h is used here, not its comparisons */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "backend_ops_util.h"
#include "test_scenario.h"

/* the CPU backend, except that it declines exp and matmul */
static bool holey_supports(const em_op_call *c) {
    return c->op != EM_OP_EXP && c->op != EM_OP_MATMUL && em__cpu_backend.supports(c);
}

static target holey_target(const char *backend_name) {
    static em_backend be;
    be = em__cpu_backend;
    be.name = backend_name;
    be.supports = holey_supports;
    target tg = {.dev = EM_DEVICE_CPU, .be = &be};
    snprintf(tg.name, sizeof tg.name, "%s:0", backend_name);
    return tg;
}

static const char *g_backend; /* the scenario's fake backend's name */

static void case_declines_exp(void) {
    target tg = holey_target(g_backend);
    CHECK(op_supported(&tg, EM_OP_ADD, EM_F32));
    CHECK(!op_supported(&tg, EM_OP_EXP, EM_F32));
    /* exp on int64 is not a case: the CPU reference declines it too (core casts first) */
    CHECK(!op_supported(&tg, EM_OP_EXP, EM_I64));
}

static void case_lacks_matmul(void) {
    target tg = holey_target(g_backend);
    CHECK(has_entry(&tg, be_has(tg.be, EM_OP_NEG, EM_F32), "unary"));
    CHECK(!has_entry(&tg, be_has(tg.be, EM_OP_MATMUL, EM_F32), "matmul"));
}

static void case_golden_style_decline(void) {
    /* the golden replay's path: a decline of the public op "cat" */
    bool failed = op_declined(g_backend, "cat", "golden cat_dim0", "not supported here");
    CHECK(failed == op_required(g_backend, "cat"));
}

static int scenario(const char *name) {
    /* "opencl" requires exp, matmul and cat; "nullbackend" has no line in the list */
    g_backend = !strncmp(name, "listed ", 7) ? "opencl" : "nullbackend";
    if (strstr(name, "exp")) RUN(case_declines_exp);
    if (strstr(name, "matmul")) RUN(case_lacks_matmul);
    if (strstr(name, "golden")) RUN(case_golden_style_decline);
    declines_report();
    return test_summary();
}

static void test_required_op_declined_fails(void) {
    expect_scenario("listed exp", 1, "0 passed, 1 failed, 0 skipped",
                    "opencl:0 exp float32: opencl declined exp, which tests/required_ops.txt requires of it");
}
static void test_required_entry_point_missing_fails(void) {
    expect_scenario("listed matmul", 1, "0 passed, 1 failed, 0 skipped", "opencl declined matmul");
}
static void test_required_golden_op_declined_fails(void) {
    expect_scenario("listed golden", 1, "0 passed, 1 failed, 0 skipped", "opencl declined cat");
}
static void test_unlisted_declines_are_skips(void) {
    /* each case passes what it checks; the declines become one skipped case per op */
    expect_scenario("unlisted exp matmul golden", 0, "3 passed, 0 failed, 3 skipped",
                    "SKIP nullbackend exp: declined in 1 case(s), not required by tests/required_ops.txt");
    expect_scenario("unlisted exp matmul golden", 0, "3 passed, 0 failed, 3 skipped", "SKIP nullbackend matmul");
}

/* The committed list names every op the conformance and golden tests ask of the GPU backends:
 * every elementwise op and reduction, and the tensor ops every backend runs. */
static void test_list_covers_the_gpu_backends(void) {
    for (int op = 0; op <= EM_OP_ARGMIN; op++) {
        char float_only[40];
        snprintf(float_only, sizeof float_only, "%s:float", op_name((em_op)op));
        CHECK(op_required("opencl", op_name((em_op)op)) || op_required("opencl", float_only));
        CHECK(op_required("cuda", op_name((em_op)op)) || op_required("cuda", float_only));
        CHECK(op_required("cpu", op_name((em_op)op)));
    }
    const char *entries[] = {"fill", "copy", "where", "matmul", "softmax", "log_softmax", "index_select",
                             "gather", "index_add", "scatter_add", "rng", "public_api", "to", "cat"};
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) CHECK(op_required("opencl", entries[i]));
    CHECK(!op_required("mps", "add"));
}

int main(void) {
    const char *s = getenv("EMBER_HARNESS_SCENARIO");
    if (s) return scenario(s);
    RUN(test_required_op_declined_fails);
    RUN(test_required_entry_point_missing_fails);
    RUN(test_required_golden_op_declined_fails);
    RUN(test_unlisted_declines_are_skips);
    RUN(test_list_covers_the_gpu_backends);
    return test_summary();
}
