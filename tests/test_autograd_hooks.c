/* Autograd's gradient-ready hooks (em_autograd_add_grad_hook): called once per leaf
 * accumulation with the .grad already updated, then once with NULL at the end of a backward
 * that succeeded; an error from a hook ends the backward. */
#include "test.h"

typedef struct seen {
    em_tensor *leaves[8];
    double grad_sums[8];
    int n, ends;
    em_tensor *fail_on;
} seen;

static em_status record(void *ctx, em_tensor *leaf) {
    seen *s = ctx;
    if (!leaf) {
        s->ends++;
        return EM_OK;
    }
    if (leaf == s->fail_on) return em_error(EM_ERR_ARGUMENT, "hook refuses this leaf");
    if (s->n < 8) {
        em_scope sc = em_scope_begin();
        em_tensor *g = em_grad(leaf);
        s->grad_sums[s->n] = g ? em_item(em_sum(g, EM_ALL_DIMS, false)) : NAN;
        em_scope_end(sc);
        s->leaves[s->n++] = leaf;
    }
    return EM_OK;
}

static void test_order_and_values(void) {
    em_scope sc = em_scope_begin();
    em_tensor *a = em_full(EM_SHAPE(3), 2, EM_OPTS(.requires_grad = true));
    em_tensor *b = em_full(EM_SHAPE(3), 5, EM_OPTS(.requires_grad = true));
    seen s = {0};
    int id = em_autograd_add_grad_hook(record, &s);
    CHECK(id >= 0);
    /* loss = sum(a * b) + sum(b): b's gradient is ready only after both paths */
    em_tensor *loss = em_add(em_sum(em_mul(a, b), EM_ALL_DIMS, false), em_sum(b, EM_ALL_DIMS, false));
    CHECK_OK(em_backward(loss));
    int a_calls = 0, b_calls = 0;
    for (int i = 0; i < s.n; i++) {
        if (s.leaves[i] == a) {
            a_calls++;
            CHECK(s.grad_sums[i] == 15); /* d/da = b: 3 * 5, already in a's .grad */
        }
        if (s.leaves[i] == b) b_calls++;
    }
    CHECK(a_calls == 1 && b_calls >= 1);
    CHECK(s.ends == 1);
    /* the last call for b sees its full gradient: a + 1 = 3 per element */
    for (int i = s.n - 1; i >= 0; i--)
        if (s.leaves[i] == b) {
            CHECK(s.grad_sums[i] == 9);
            break;
        }
    /* a failing hook fails the backward; no end call */
    s = (seen){.fail_on = a};
    loss = em_sum(em_mul(a, b), EM_ALL_DIMS, false);
    CHECK(em_backward(loss) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "hook refuses this leaf");
    CHECK(s.ends == 0);
    /* removed: not called any more */
    em_autograd_remove_grad_hook(id);
    s = (seen){0};
    CHECK_OK(em_backward(em_sum(em_mul(a, b), EM_ALL_DIMS, false)));
    CHECK(s.n == 0 && s.ends == 0);
    em_autograd_remove_grad_hook(id); /* twice, and out of range: ignored */
    em_autograd_remove_grad_hook(-1);
    CHECK(em_autograd_add_grad_hook(NULL, NULL) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'fn' is NULL");
    em_scope_end(sc);
}

static void test_table_full(void) {
    int ids[64];
    seen s = {0};
    for (int i = 0; i < 64; i++) ids[i] = em_autograd_add_grad_hook(record, &s);
    CHECK(ids[63] >= 0);
    CHECK(em_autograd_add_grad_hook(record, &s) == -1);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "64 hooks");
    for (int i = 0; i < 64; i++) em_autograd_remove_grad_hook(ids[i]);
    int id = em_autograd_add_grad_hook(record, &s);
    CHECK(id >= 0);
    em_autograd_remove_grad_hook(id);
}

int main(void) {
    RUN(test_order_and_values);
    RUN(test_table_full);
    return test_summary();
}
