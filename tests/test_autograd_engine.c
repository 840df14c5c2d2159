/* The autograd engine's semantics: accumulation, retain_graph, no-grad mode, version
 * counters, error messages, explicit gradients, deep graphs and lifetimes. */
#include "test.h"
#include "core/tensor_impl.h"

/* A leaf requiring grad with values v0 + 0.25 * i (row-major). */
static em_tensor *leaf(double v0, em_shape shape) {
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++) n *= shape.d[i];
    em_tensor *t = em_reshape(em_arange(v0, v0 + 0.25 * (double)n - 0.125, 0.25, (em_opts){0}), shape);
    t = em_clone(t);
    CHECK_OK(em_set_requires_grad(t, true));
    return t;
}

static double grad_at(em_tensor *t, int64_t i) {
    em_tensor *g = em_grad(t);
    if (!g) return NAN;
    em_tensor *flat = em_reshape(em_contiguous(g), EM_SHAPE(-1));
    return em_item(em_select(flat, 0, i));
}

static void test_accumulation(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(3, 4));
    CHECK(em_grad(x) == NULL);
    CHECK(!em_failed());
    CHECK_OK(em_backward(em_sum(em_mul_scalar(x, 2.0), EM_ALL_DIMS, false)));
    CHECK_NEAR(grad_at(x, 5), 2.0, 0);
    CHECK_OK(em_backward(em_sum(em_mul_scalar(x, 3.0), EM_ALL_DIMS, false)));
    CHECK_NEAR(grad_at(x, 5), 5.0, 0);
    /* a reference the user holds does not change under later accumulation */
    em_tensor *held = em_grad(x);
    CHECK_OK(em_backward(em_sum(x, EM_ALL_DIMS, false)));
    CHECK_NEAR(em_item(em_select(em_select(held, 0, 1), 0, 1)), 5.0, 0);
    CHECK_NEAR(grad_at(x, 5), 6.0, 0);
    CHECK_OK(em_zero_grad_tensor(x));
    CHECK_NEAR(grad_at(x, 5), 0.0, 0);
    CHECK_OK(em_set_grad(x, NULL));
    CHECK(em_grad(x) == NULL);
    /* a tensor used twice gets both contributions: d/dx sum(x*x + x) = 2x + 1 */
    CHECK_OK(em_backward(em_sum(em_add(em_mul(x, x), x), EM_ALL_DIMS, false)));
    CHECK_NEAR(grad_at(x, 2), 2 * 1.5 + 1, 1e-6);
    /* set_grad checks the shape */
    CHECK(em_set_grad(x, em_zeros(EM_SHAPE(4, 3), (em_opts){0})) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "does not match");
    em_scope_end(s);
}

static void test_retain_graph(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(0.0, EM_SHAPE(2, 2));
    em_tensor *y = em_sum(em_exp(x), EM_ALL_DIMS, false);
    CHECK_OK(em_backward_with(y, NULL, true));
    CHECK_OK(em_backward_with(y, NULL, true));
    CHECK_NEAR(grad_at(x, 0), 2.0, 1e-6);
    CHECK_OK(em_backward(y)); /* the last one may free the graph */
    CHECK_NEAR(grad_at(x, 0), 3.0, 1e-6);
    CHECK(em_backward(y) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "Trying to backward through the graph a second time");
    CHECK_NEAR(grad_at(x, 0), 3.0, 1e-6); /* nothing was accumulated by the failed call */
    /* a graph that saved nothing can be walked again, as in PyTorch */
    em_tensor *z = em_sum(em_add(x, x), EM_ALL_DIMS, false);
    CHECK_OK(em_backward(z));
    CHECK_OK(em_backward(z));
    em_scope_end(s);
}

static void test_no_grad(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(3));
    CHECK(em_is_grad_enabled());
    em_grad_mode g = em_no_grad_begin();
    CHECK(!em_is_grad_enabled());
    em_tensor *y = em_mul(x, x);
    CHECK(!em_requires_grad(y));
    CHECK(em_grad_fn_name(y) == NULL);
    em_grad_mode inner = em_no_grad_begin(); /* nested guards restore in order */
    em_no_grad_end(inner);
    CHECK(!em_is_grad_enabled());
    em_grad_mode on = em_set_grad_enabled(true);
    CHECK(em_requires_grad(em_mul(x, x)));
    em_no_grad_end(on);
    CHECK(!em_is_grad_enabled());
    em_no_grad_end(g);
    CHECK(em_is_grad_enabled());
    em_tensor *z = em_mul(x, x);
    CHECK(em_requires_grad(z));
    CHECK(em_grad_fn_name(z) && !strcmp(em_grad_fn_name(z), "MulBackward0"));
    CHECK(!em_is_leaf(z) && em_is_leaf(x));
    /* backward itself works in no-grad mode */
    em_tensor *loss = em_sum(z, EM_ALL_DIMS, false);
    g = em_no_grad_begin();
    CHECK_OK(em_backward(loss));
    em_no_grad_end(g);
    CHECK_NEAR(grad_at(x, 1), 2 * 1.25, 1e-6);
    /* detach cuts the history */
    CHECK(!em_requires_grad(em_detach(z)));
    em_scope_end(s);
}

static void test_version_counter(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(3, 4));
    em_tensor *a = em_ones(EM_SHAPE(3, 4), (em_opts){0});
    em_tensor *y = em_sum(em_mul(x, a), EM_ALL_DIMS, false); /* saves a */
    unsigned saved = atomic_load(&a->storage->version);
    CHECK_OK(em_add_(a, a, 1.0));
    CHECK_OK(em_mul_scalar_(a, 0.5));
    unsigned now = atomic_load(&a->storage->version);
    CHECK(now == saved + 2);
    CHECK(em_backward(y) == EM_ERR_AUTOGRAD);
    char want[256];
    snprintf(want, sizeof want,
             "one of the variables needed for gradient computation has been modified by an inplace "
             "operation: [torch.FloatTensor [3, 4]] is at version %u; expected version %u instead",
             now, saved);
    CHECK_ERROR(EM_ERR_AUTOGRAD, want);
    CHECK(em_grad(x) == NULL); /* checked before anything was accumulated */
    /* a view of the saved tensor shares its version counter */
    em_tensor *b = em_ones(EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_F64));
    em_tensor *x2 = leaf(0.0, EM_SHAPE(2, 3));
    em_tensor *y2 = em_sum(em_mul(em_to_dtype(x2, EM_F64), b), EM_ALL_DIMS, false);
    CHECK_OK(em_fill_(em_select(b, 0, 1), 3.0));
    CHECK(em_backward(y2) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "[torch.DoubleTensor [2, 3]] is at version");
    em_scope_end(s);
}

static void test_errors(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(3));
    /* non-scalar */
    CHECK(em_backward(em_mul_scalar(x, 2.0)) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "grad can be implicitly created only for scalar outputs");
    /* nothing requires grad */
    em_tensor *c = em_ones(EM_SHAPE(3), (em_opts){0});
    CHECK(em_backward(em_sum(c, EM_ALL_DIMS, false)) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "element 0 of tensors does not require grad and does not have a grad_fn");
    /* through a non-differentiable op: integers carry no gradient */
    em_tensor *i = em_to_dtype(em_mul_scalar(x, 3.0), EM_I64);
    CHECK(i && !em_requires_grad(i));
    CHECK(em_backward(em_sum(i, EM_ALL_DIMS, false)) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "element 0 of tensors does not require grad");
    CHECK(!em_requires_grad(em_argmax(x, 0, false)));
    /* requires_grad: floating leaves only */
    CHECK(em_set_requires_grad(em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_I64)), true) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "only Tensors of floating point dtype can require gradients");
    CHECK(em_set_requires_grad(em_mul(x, x), false) == EM_ERR_AUTOGRAD);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "you can only change requires_grad flags of leaf variables");
    /* explicit gradients: shape must match */
    CHECK(em_backward_with(em_mul_scalar(x, 2.0), em_ones(EM_SHAPE(4), (em_opts){0}), false) == EM_ERR_SHAPE);
    CHECK_ERROR(EM_ERR_SHAPE, "Mismatch in shape");
    CHECK(em_backward(NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    em_scope_end(s);
}

static void test_explicit_grad(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(2, 3));
    em_tensor *gv = em_reshape(em_arange(1, 7, 1, (em_opts){0}), EM_SHAPE(2, 3));
    CHECK_OK(em_backward_with(em_mul_scalar(x, 3.0), gv, false));
    CHECK_NEAR(grad_at(x, 4), 15.0, 0);
    /* the given gradient tensor is not modified by later accumulation */
    CHECK_OK(em_backward_with(x, gv, false)); /* backward on a leaf accumulates gv itself */
    CHECK_NEAR(grad_at(x, 4), 20.0, 0);
    CHECK_OK(em_backward_with(x, gv, false));
    CHECK_NEAR(em_item(em_select(em_select(gv, 0, 1), 0, 1)), 5.0, 0);
    em_scope_end(s);
}

/* The caller's gradient, passed along unchanged by nodes whose formula is the identity
 * (add_scalar, twice here), never becomes a leaf's .grad itself: writing into the caller's
 * tensor afterwards must not change the leaf's gradient. (The engine takes a gradient
 * without a copy only when it made it and holds the only references; here the caller's
 * references alone already forbid it.) */
static void test_passed_through_grad_not_taken(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(2, 3));
    em_tensor *gv = em_full(EM_SHAPE(2, 3), 2.0, (em_opts){0});
    CHECK_OK(em_backward_with(em_add_scalar(em_add_scalar(x, 1.0), 2.0), gv, false));
    CHECK_OK(em_fill_(gv, 7.0));
    CHECK_NEAR(grad_at(x, 4), 2.0, 0);
    CHECK_OK(em_backward_with(em_add_scalar(em_add_scalar(x, 1.0), 2.0), gv, false));
    CHECK_NEAR(grad_at(x, 4), 9.0, 0);
    CHECK_NEAR(em_item(em_select(em_select(gv, 0, 1), 0, 1)), 7.0, 0);
    em_scope_end(s);
}

/* A long chain: the walk and the release are iterative, so depth is not limited by the stack. */
static void test_deep_chain(void) {
    const int depth = 100000;
    em_tensor *x = em_ones(EM_SHAPE(1), (em_opts){0});
    CHECK_OK(em_set_requires_grad(x, true));
    em_tensor *y = em_retain(x);
    for (int i = 0; i < depth && y; i++) {
        em_tensor *n = em_add_scalar(y, 1e-6);
        em_release(y);
        y = n;
    }
    CHECK(y != NULL);
    em_tensor *loss = em_sum(y, EM_ALL_DIMS, false);
    CHECK_OK(em_backward(loss));
    em_tensor *g = em_grad(x);
    CHECK_NEAR(em_item(g), 1.0, 0);
    em_release(g);
    em_release(loss);
    em_release(y); /* frees 100000 nodes without recursion */
    em_release(x);
}

/* Graph lifetime: the graph keeps exactly what backward needs after the user's handles go. */
static void test_graph_outlives_scope(void) {
    em_scope s0 = em_scope_begin();
    em_tensor *x = em_keep(leaf(0.5, EM_SHAPE(4)));
    em_scope_end(s0);
    em_tensor *loss;
    {
        em_scope s = em_scope_begin();
        em_tensor *h = em_sigmoid(em_mul_scalar(x, 2.0));
        loss = em_keep(em_sum(em_mul(h, h), EM_ALL_DIMS, false));
        em_scope_end(s); /* h and the product are released: the graph holds what it saved */
    }
    CHECK_OK(em_backward(loss));
    em_tensor *g = em_grad(x);
    CHECK(g != NULL);
    /* d/dx sigmoid(2x)^2 = 2 s * s (1 - s) * 2 */
    double xv = 0.5, sg = 1 / (1 + exp(-2 * xv));
    em_tensor *g0 = em_select(g, 0, 0);
    CHECK_NEAR(em_item(g0), 4 * sg * sg * (1 - sg), 1e-6);
    em_release(g0);
    em_release(g);
    em_release(loss);
    em_release(x);
}

/* A leaf's first gradient may take the formula's fresh result instead of a copy; it must
 * never alias a tensor someone else still holds: the caller's gradient, another leaf's. */
static void test_gradients_never_alias(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_SHAPE(3), EM_OPTS(.requires_grad = true));
    em_tensor *b = em_ones(EM_SHAPE(3), EM_OPTS(.requires_grad = true));
    em_tensor *g = em_full(EM_SHAPE(3), 2.0, EM_OPTS(0));
    CHECK(em_backward_with(em_add(a, b), g, false) == EM_OK);   /* add passes g through */
    CHECK(em_fill_(g, 5.0) == EM_OK);
    CHECK(em_item(em_sum(em_grad(a), EM_ALL_DIMS, false)) == 6.0);
    CHECK(em_item(em_sum(em_grad(b), EM_ALL_DIMS, false)) == 6.0);
    CHECK(em_fill_(em_grad(a), 0.0) == EM_OK);
    CHECK(em_item(em_sum(em_grad(b), EM_ALL_DIMS, false)) == 6.0);
    /* a fresh result (mul's) becomes the gradient; accumulating again adds in place */
    em_tensor *c = em_full(EM_SHAPE(3), 3.0, EM_OPTS(.requires_grad = true));
    em_tensor *y = em_sum(em_mul(c, c), EM_ALL_DIMS, false);
    CHECK(em_backward_with(y, NULL, true) == EM_OK);
    em_tensor *first = em_grad(c);
    CHECK(em_item(em_sum(first, EM_ALL_DIMS, false)) == 18.0);
    CHECK(em_backward(y) == EM_OK);
    CHECK(em_item(em_sum(em_grad(c), EM_ALL_DIMS, false)) == 36.0);
    /* the root itself a leaf: its gradient is a copy of the caller's */
    em_tensor *d = em_zeros(EM_SHAPE(3), EM_OPTS(.requires_grad = true));
    CHECK(em_backward_with(d, g, false) == EM_OK);
    CHECK(em_fill_(g, 1.0) == EM_OK);
    CHECK(em_item(em_sum(em_grad(d), EM_ALL_DIMS, false)) == 15.0);
    em_scope_end(s);
    CHECK(!em_failed());
}

/* A node's gradient summed from several consumers (the engine adds in place into a sum only
 * it holds): right values, and a gradient shared with another node (add passes its incoming
 * gradient to both inputs) is never changed under that node. */
static void test_node_accumulation(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = leaf(1.0, EM_SHAPE(3, 5));
    em_tensor *h = em_mul_scalar(x, 2.0);            /* three consumers of h */
    em_tensor *r = em_add(em_add(h, em_mul(h, h)), em_mul_scalar(h, 3.0));
    CHECK_OK(em_backward(em_sum(em_mul_scalar(r, 0.5), EM_ALL_DIMS, false)));
    for (int64_t i = 0; i < 15; i += 7) {
        double hv = 2.0 * (1.0 + 0.25 * (double)i);
        CHECK_NEAR(grad_at(x, i), 0.5 * 2.0 * (1.0 + 2.0 * hv + 3.0), 1e-4);
    }
    em_tensor *y = leaf(0.5, EM_SHAPE(4, 3));
    em_tensor *a = em_mul_scalar(y, 2.0), *k = em_mul_scalar(y, 3.0);
    /* a and k first get one shared tensor; each gets a second gradient later */
    em_tensor *t = em_add(em_add(em_mul(a, a), em_mul(k, k)), em_add(a, k));
    /* (x 0.5: t's gradient a contiguous tensor of its own, not sum's expanded one) */
    CHECK_OK(em_backward(em_sum(em_mul_scalar(t, 0.5), EM_ALL_DIMS, false)));
    for (int64_t i = 0; i < 12; i += 5) {
        double av = 2.0 * (0.5 + 0.25 * (double)i), kv = 1.5 * av;
        CHECK_NEAR(grad_at(y, i), 0.5 * (2.0 * (1.0 + 2.0 * av) + 3.0 * (1.0 + 2.0 * kv)), 1e-4);
    }
    em_scope_end(s);
}

int main(void) {
    RUN(test_accumulation);
    RUN(test_retain_graph);
    RUN(test_no_grad);
    RUN(test_version_counter);
    RUN(test_errors);
    RUN(test_explicit_grad);
    RUN(test_passed_through_grad_not_taken);
    RUN(test_deep_chain);
    RUN(test_graph_outlives_scope);
    RUN(test_gradients_never_alias);
    RUN(test_node_accumulation);
    return test_summary();
}
