/* An embedding's gradient into a .grad that exists already (a tied head's, which backward
 * reaches first): autograd adds the looked-up rows' gradient into it in place
 * (src/autograd/engine.c, em__index_add_summed_ in src/core/ops_index.c) instead of making a
 * dense [vocab, hidden] gradient and adding that. Checked: the values are bit for bit those of
 * the dense gradient's sum (repeated ids summed first, in order), the .grad keeps its memory,
 * and backward's peak stays far below one [vocab, hidden] buffer; a .grad the caller holds is
 * replaced, not written; a first gradient and the in-place add's refusals. */
#include <stdlib.h>
#include "test.h"
#include "core/internal_api.h"

#define VOCAB 4096
#define HIDDEN 32
#define N_IDS 48

/* ids with repeats, out of order: each value 0..15 (scaled into the vocabulary) 3 times */
static em_tensor *ids_with_repeats(void) {
    int64_t v[N_IDS];
    for (int i = 0; i < N_IDS; i++) v[i] = (int64_t)((i * 7) % 16) * 251 % VOCAB;
    return em_from_data(v, EM_I64, EM_SHAPE(N_IDS), EM_OPTS(.dtype = EM_I64));
}

/* w's gradient from a head: sum(x @ w^T * k), which backward reaches before the embedding */
static em_tensor *head_loss(em_tensor *w, em_tensor *x, em_tensor *k) {
    return em_sum(em_mul(em_matmul(x, em_transpose(w, 0, 1)), k), EM_ALL_DIMS, false);
}

static void test_tied_gradient_added_in_place(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *w = em_randn(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(.requires_grad = true));
    em_tensor *x = em_randn(EM_SHAPE(3, HIDDEN), EM_OPTS(0)), *k = em_randn(EM_SHAPE(3, VOCAB), EM_OPTS(0));
    em_tensor *ids = ids_with_repeats(), *r = em_randn(EM_SHAPE(N_IDS, HIDDEN), EM_OPTS(0));
    CHECK_OK(em_backward(head_loss(w, x, k)));
    em_tensor *before;
    void *at;
    {
        em_scope in = em_scope_begin();
        em_tensor *g = em_grad(w);
        at = em_data_ptr(g);
        before = em_keep(em_clone(g));
        em_scope_end(in); /* our reference to the .grad goes: only w holds it */
    }
    em_tensor *loss = em_sum(em_mul(em_embedding(ids, w, EM_NO_PADDING_IDX), r), EM_ALL_DIMS, false);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    CHECK_OK(em_backward(loss));
    int64_t grew = em_memory_max_allocated(EM_DEVICE_CPU) - base;
    /* the rows' gradient and one buffer of its distinct rows: a few KiB, where the dense
     * gradient alone is VOCAB x HIDDEN floats (512 KiB) */
    CHECK(grew < (int64_t)(VOCAB * HIDDEN * sizeof(float)) / 8);
    em_tensor *g = em_grad(w);
    CHECK(g && em_data_ptr(g) == at);
    em_tensor *dense = em_index_add(em_zeros(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(0)), 0, ids, r, 1.0);
    CHECK(test_same_bits(g, em_add(before, dense)));
    em_release(before);
    em_scope_end(s);
}

/* The caller holds the .grad: it is left as it was, and w gets the sum in a new tensor. */
static void test_held_gradient_is_replaced(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(6);
    em_tensor *w = em_randn(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(.requires_grad = true));
    em_tensor *x = em_randn(EM_SHAPE(3, HIDDEN), EM_OPTS(0)), *k = em_randn(EM_SHAPE(3, VOCAB), EM_OPTS(0));
    em_tensor *ids = ids_with_repeats(), *r = em_randn(EM_SHAPE(N_IDS, HIDDEN), EM_OPTS(0));
    CHECK_OK(em_backward(head_loss(w, x, k)));
    em_tensor *held = em_grad(w), *was = em_clone(held);
    CHECK_OK(em_backward(em_sum(em_mul(em_embedding(ids, w, EM_NO_PADDING_IDX), r), EM_ALL_DIMS, false)));
    CHECK(test_same_bits(held, was));
    em_tensor *g = em_grad(w);
    CHECK(g && em_data_ptr(g) != em_data_ptr(held));
    CHECK(test_same_bits(g, em_add(was, em_index_add(em_zeros(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(0)), 0, ids, r, 1.0))));
    em_scope_end(s);
}

/* No .grad yet: the formula's dense gradient becomes it. */
static void test_first_gradient(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_tensor *w = em_randn(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(.requires_grad = true));
    em_tensor *ids = ids_with_repeats(), *r = em_randn(EM_SHAPE(N_IDS, HIDDEN), EM_OPTS(0));
    CHECK_OK(em_backward(em_sum(em_mul(em_embedding(ids, w, EM_NO_PADDING_IDX), r), EM_ALL_DIMS, false)));
    CHECK(test_same_bits(em_grad(w), em_index_add(em_zeros(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(0)), 0, ids, r, 1.0)));
    em_scope_end(s);
}

/* The in-place adds refuse what autograd could see change, or cannot add into in place. */
static void test_in_place_add_refusals(void) {
    em_scope s = em_scope_begin();
    em_tensor *ids = ids_with_repeats(), *r = em_randn(EM_SHAPE(N_IDS, HIDDEN), EM_OPTS(0));
    em_tensor *param = em_zeros(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(.requires_grad = true));
    CHECK(em__index_add_summed_(param, 0, ids, r) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "outside autograd") != NULL);
    em_clear_error();
    em_tensor *cols = em_zeros(EM_SHAPE(HIDDEN, VOCAB), EM_OPTS(0));
    CHECK(em__index_add_(em_transpose(cols, 0, 1), 0, ids, r) == EM_ERR_ARGUMENT); /* not contiguous */
    CHECK(strstr(em_last_error(), "contiguous") != NULL);
    em_clear_error();
    em_tensor *small = em_zeros(EM_SHAPE(10, HIDDEN), EM_OPTS(0));
    CHECK(em__index_add_summed_(small, 0, ids, r) == EM_ERR_ARGUMENT); /* ids up to 3765 */
    CHECK(strstr(em_last_error(), "out of bounds") != NULL);
    em_clear_error();
    CHECK(em__index_add_summed_(NULL, 0, ids, r) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "NULL") != NULL);
    em_clear_error();
    em_tensor *none = em_from_data(NULL, EM_I64, EM_SHAPE(0), EM_OPTS(.dtype = EM_I64));
    em_tensor *dst = em_ones(EM_SHAPE(VOCAB, HIDDEN), EM_OPTS(0)), *same = em_clone(dst);
    CHECK_OK(em__index_add_summed_(dst, 0, none, em_zeros(EM_SHAPE(0, HIDDEN), EM_OPTS(0))));
    CHECK(test_same_bits(dst, same)); /* no index: nothing added */
    em_scope_end(s);
}

/* The in-place scatter_add (the fused loss's target term): the out-of-place op's bits, and
 * the same refusals as the in-place index_add, the destination unchanged by each. */
static void test_in_place_scatter_add(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    em_tensor *dst = em_randn(EM_SHAPE(4, 6), EM_OPTS(0));
    em_tensor *idx = em_from_data((int64_t[]){5, 0, 3, 3}, EM_I64, EM_SHAPE(4, 1), EM_OPTS(.dtype = EM_I64));
    em_tensor *src = em_randn(EM_SHAPE(4, 1), EM_OPTS(0));
    em_tensor *want = em_scatter_add(dst, 1, idx, src), *before = em_clone(dst);
    CHECK_OK(em__scatter_add_(dst, -1, idx, src)); /* dim wrapped as the op wraps it */
    CHECK(test_same_bits(dst, want));
    em_tensor *kept = em_clone(dst);
    em_tensor *bad = em_from_data((int64_t[]){6, 0, 0, 0}, EM_I64, EM_SHAPE(4, 1), EM_OPTS(.dtype = EM_I64));
    CHECK(em__scatter_add_(dst, 1, bad, src) == EM_ERR_ARGUMENT); /* index 6 in a dim of 6 */
    CHECK(strstr(em_last_error(), "out of bounds") != NULL);
    em_clear_error();
    CHECK(em__scatter_add_(dst, 1, idx, em_randn(EM_SHAPE(3, 1), EM_OPTS(0))) == EM_ERR_SHAPE);
    CHECK(strstr(em_last_error(), "no larger than src") != NULL);
    em_clear_error();
    CHECK(em__scatter_add_(dst, 1, idx, em_to_dtype(src, EM_F64)) == EM_ERR_DTYPE);
    em_clear_error();
    CHECK(em__scatter_add_(em_transpose(em_zeros(EM_SHAPE(6, 4), EM_OPTS(0)), 0, 1), 1, idx, src) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "contiguous") != NULL);
    em_clear_error();
    CHECK(em__scatter_add_(em_zeros(EM_SHAPE(4, 6), EM_OPTS(.requires_grad = true)), 1, idx, src) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "outside autograd") != NULL);
    em_clear_error();
    CHECK(em__scatter_add_(NULL, 1, idx, src) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK(test_same_bits(dst, kept));
    CHECK(!test_same_bits(dst, before));
    em_scope_end(s);
}

int main(void) {
    RUN(test_tied_gradient_added_in_place);
    RUN(test_held_gradient_is_replaced);
    RUN(test_first_gradient);
    RUN(test_in_place_add_refusals);
    RUN(test_in_place_scatter_add);
    return test_summary();
}
