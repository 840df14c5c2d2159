/* Gradient accumulation (what `ember train --accumulate N` does, tools/ember/train_ckpt.c):
 * backward of mean-loss / N over N micro-batches of B leaves in .grad the gradient of one
 * batch of N * B, for cross-entropy and MSE; without the / N it would be N times larger
 * (the check that the comparison can fail). */
#include "test.h"

#define MAXP 16

static void grads_now(em_module *m, em_tensor **out, int *np) {
    em_named_tensor ps[MAXP];
    *np = em_module_parameters(m, ps, MAXP);
    for (int i = 0; i < *np; i++) {
        em_tensor *g = em_grad(ps[i].tensor);
        out[i] = g ? em_clone(g) : NULL;
        em_set_grad(ps[i].tensor, NULL);
    }
}

static double worst_diff(em_tensor **a, em_tensor **b, int n, double scale_b) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        CHECK(a[i] && b[i]);
        if (!a[i] || !b[i]) return INFINITY;
        double d = em_item(em_max(em_abs(em_sub(a[i], em_mul_scalar(b[i], scale_b))), EM_ALL_DIMS, false));
        if (d > w) w = d;
    }
    return w;
}

static em_tensor *loss_of(em_module *m, em_tensor *x, em_tensor *y, bool mse) {
    em_tensor *out = em_forward(m, x);
    return mse ? em_mse_loss(out, y) : em_cross_entropy(out, y, 0.0);
}

static void check_accumulation(bool mse) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    const int64_t N = 4, B = 8, d = 12, c = 5;
    em_module *m = em_nn_sequential(em_nn_linear(d, 16), em_nn_tanh(), em_nn_linear(16, c));
    em_tensor *x = em_randn(EM_SHAPE(N * B, d), EM_OPTS(0));
    em_tensor *y = mse ? em_randn(EM_SHAPE(N * B, c), EM_OPTS(0))
                       : em_randint(0, c, EM_SHAPE(N * B), EM_OPTS(.dtype = EM_I64));
    em_tensor *whole[MAXP], *acc[MAXP], *unscaled[MAXP];
    int np = 0, np2 = 0, np3 = 0;
    CHECK_OK(em_backward(loss_of(m, x, y, mse)));
    grads_now(m, whole, &np);
    for (int k = 0; k < N; k++)
        CHECK_OK(em_backward(em_div_scalar(loss_of(m, em_narrow(x, 0, k * B, B), em_narrow(y, 0, k * B, B), mse),
                                           (double)N)));
    grads_now(m, acc, &np2);
    for (int k = 0; k < N; k++)
        CHECK_OK(em_backward(loss_of(m, em_narrow(x, 0, k * B, B), em_narrow(y, 0, k * B, B), mse)));
    grads_now(m, unscaled, &np3);
    CHECK(np == 4 && np2 == np && np3 == np);
    double w = worst_diff(whole, acc, np, 1.0);
    printf("  %s: max |grad(batch %lld) - sum of %lld micro-batch grads / %lld| = %.2e\n", mse ? "mse" : "cross-entropy",
           (long long)(N * B), (long long)N, (long long)N, w);
    CHECK(w <= 1e-6);
    CHECK(worst_diff(whole, unscaled, np, 1.0) > 1e-3);     /* without / N: N times too large */
    CHECK(worst_diff(whole, unscaled, np, 1.0 / N) <= 1e-6);
    em_module_free(m);
    em_scope_end(s);
}

static void test_cross_entropy(void) { check_accumulation(false); }
static void test_mse(void) { check_accumulation(true); }

int main(void) {
    RUN(test_cross_entropy);
    RUN(test_mse);
    return test_summary();
}
