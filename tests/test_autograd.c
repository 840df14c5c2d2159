/* Gradient checks by central finite differences (float64) for every differentiable op,
 * with broadcasting, views and non-contiguous inputs. Each check compares the analytic
 * gradient of sum(f(x) * w) (w a fixed random weight, so every output element matters
 * differently) with (L(x + h) - L(x - h)) / 2h for every element of every input. */
#include "test.h"

#define H 1e-6
#define TOL 1e-6

typedef em_tensor *(*fn_t)(em_tensor **x);

enum { RANDN = 0, POSITIVE = 1, FIXED = 2 };

static double loss_of(fn_t f, em_tensor **x, em_tensor *w) {
    em_scope s = em_scope_begin();
    em_tensor *y = f(x);
    double v = y ? em_item(em_sum(em_mul(y, w), EM_ALL_DIMS, false)) : NAN;
    em_scope_end(s);
    return v;
}

/* n inputs of the given shapes; kinds[i]: RANDN, POSITIVE (in [0.5, 2)) or FIXED (not
 * differentiated, e.g. a divisor held constant). */
static void gradcheck_(const char *name, fn_t f, int n, const em_shape *shapes, const int *kinds) {
    em_scope s = em_scope_begin();
    em_tensor *x[8];
    for (int i = 0; i < n; i++) {
        em_opts o = {.dtype = EM_F64};
        x[i] = kinds && kinds[i] == POSITIVE ? em_add_scalar(em_mul_scalar(em_rand(shapes[i], o), 1.5), 0.5)
                                              : em_randn(shapes[i], o);
        x[i] = em_contiguous(x[i]);
        if (!kinds || kinds[i] != FIXED) CHECK_OK(em_set_requires_grad(x[i], true));
    }
    em_tensor *y = f(x);
    CHECK(y != NULL);
    if (!y) {
        fprintf(stderr, "  %s: forward failed: %s\n", name, em_last_error());
        em_clear_error();
        em_scope_end(s);
        return;
    }
    em_tensor *w = em_randn(em_shape_of(y), EM_OPTS(.dtype = EM_F64));
    if (em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)) != EM_OK) {
        fprintf(stderr, "  %s: backward failed: %s\n", name, em_last_error());
        CHECK(0);
        em_clear_error();
    }
    em_grad_mode g = em_no_grad_begin();
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (kinds && kinds[i] == FIXED) continue;
        em_tensor *grad = em_grad(x[i]);
        CHECK(grad != NULL);
        if (!grad) continue;
        CHECK(em_dtype_of(grad) == EM_F64);
        int64_t numel = em_numel(x[i]);
        double *xd = em_data_ptr(x[i]);
        double *gd = em_data_ptr(em_contiguous(grad));
        for (int64_t j = 0; j < numel; j++) {
            double keep = xd[j];
            xd[j] = keep + H;
            double lp = loss_of(f, x, w);
            xd[j] = keep - H;
            double lm = loss_of(f, x, w);
            xd[j] = keep;
            double num = (lp - lm) / (2 * H);
            if (!(fabs(num - gd[j]) <= TOL + TOL * fabs(num))) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s: input %d element %lld: analytic %.9g, numeric %.9g\n", name, i,
                            (long long)j, gd[j], num);
            }
        }
    }
    CHECK(bad == 0);
    em_no_grad_end(g);
    em_scope_end(s);
}

#define GRADCHECK(f, ...)                                                                  \
    gradcheck_(#f, f, (int)(sizeof((em_shape[]){__VA_ARGS__}) / sizeof(em_shape)),        \
               (em_shape[]){__VA_ARGS__}, NULL)
#define GRADCHECK_K(f, kinds, ...)                                                         \
    gradcheck_(#f, f, (int)(sizeof((em_shape[]){__VA_ARGS__}) / sizeof(em_shape)),        \
               (em_shape[]){__VA_ARGS__}, (kinds))

/* ---- functions under test ---- */
static em_tensor *f_add(em_tensor **x) { return em_add(x[0], x[1]); }
static em_tensor *f_sub(em_tensor **x) { return em_sub(x[0], x[1]); }
static em_tensor *f_mul(em_tensor **x) { return em_mul(x[0], x[1]); }
static em_tensor *f_square_self(em_tensor **x) { return em_mul(x[0], x[0]); }
static em_tensor *f_div(em_tensor **x) { return em_div(x[0], x[1]); }
static em_tensor *f_pow(em_tensor **x) { return em_pow(x[0], x[1]); }
static em_tensor *f_maximum(em_tensor **x) { return em_maximum(x[0], x[1]); }
static em_tensor *f_minimum(em_tensor **x) { return em_minimum(x[0], x[1]); }
static em_tensor *f_add_scalar(em_tensor **x) { return em_add_scalar(x[0], 2.5); }
static em_tensor *f_sub_scalar(em_tensor **x) { return em_sub_scalar(x[0], 2.5); }
static em_tensor *f_mul_scalar(em_tensor **x) { return em_mul_scalar(x[0], -1.5); }
static em_tensor *f_div_scalar(em_tensor **x) { return em_div_scalar(x[0], 4.0); }
static em_tensor *f_pow_scalar3(em_tensor **x) { return em_pow_scalar(x[0], 3.0); }
static em_tensor *f_pow_scalar_half(em_tensor **x) { return em_pow_scalar(x[0], 0.5); }
static em_tensor *f_pow_scalar0(em_tensor **x) { return em_pow_scalar(x[0], 0.0); }
static em_tensor *f_clamp(em_tensor **x) { return em_clamp(x[0], -0.5, 0.7); }
static em_tensor *f_clamp_lo(em_tensor **x) { return em_clamp(x[0], -0.3, INFINITY); }
static em_tensor *f_neg(em_tensor **x) { return em_neg(x[0]); }
static em_tensor *f_abs(em_tensor **x) { return em_abs(x[0]); }
static em_tensor *f_exp(em_tensor **x) { return em_exp(x[0]); }
static em_tensor *f_log(em_tensor **x) { return em_log(x[0]); }
static em_tensor *f_sqrt(em_tensor **x) { return em_sqrt(x[0]); }
static em_tensor *f_tanh(em_tensor **x) { return em_tanh(x[0]); }
static em_tensor *f_sigmoid(em_tensor **x) { return em_sigmoid(x[0]); }
static em_tensor *f_relu(em_tensor **x) { return em_relu(x[0]); }
static em_tensor *f_gelu(em_tensor **x) { return em_gelu(x[0]); }
static em_tensor *f_gelu_wide(em_tensor **x) { return em_gelu(em_mul_scalar(x[0], 4.0)); }
static em_tensor *f_gelu_tiny(em_tensor **x) { return em_gelu(em_mul_scalar(x[0], 1e-4)); }
static em_tensor *f_where(em_tensor **x) { return em_where(em_gt(x[0], x[1]), x[1], x[2]); }
static em_tensor *f_sum_all(em_tensor **x) { return em_sum(x[0], EM_ALL_DIMS, false); }
static em_tensor *f_sum_dim(em_tensor **x) { return em_sum(x[0], EM_DIMS(1), false); }
static em_tensor *f_sum_keep(em_tensor **x) { return em_sum(x[0], EM_DIMS(0, 2), true); }
static em_tensor *f_sum_neg(em_tensor **x) { return em_sum(x[0], EM_DIMS(-1), false); }
static em_tensor *f_mean_all(em_tensor **x) { return em_mean(x[0], EM_ALL_DIMS, false); }
static em_tensor *f_mean_dim(em_tensor **x) { return em_mean(x[0], EM_DIMS(0), true); }
static em_tensor *f_max_dim(em_tensor **x) { return em_max(x[0], EM_DIMS(1), false); }
static em_tensor *f_max_all(em_tensor **x) { return em_max(x[0], EM_ALL_DIMS, false); }
static em_tensor *f_min_keep(em_tensor **x) { return em_min(x[0], EM_DIMS(0), true); }
static em_tensor *f_matmul(em_tensor **x) { return em_matmul(x[0], x[1]); }
static em_tensor *f_matmul_t(em_tensor **x) { return em_matmul(x[0], em_transpose(x[1], 0, 1)); }
/* addmm with Linear's layout (bias, x, w.t()): the fused path (beta = alpha = 1) */
static em_tensor *f_addmm_linear(em_tensor **x) { return em_addmm(x[0], x[1], em_transpose(x[2], 0, 1), 1, 1); }
static em_tensor *f_addmm(em_tensor **x) { return em_addmm(x[0], x[1], x[2], 1, 1); }
static em_tensor *f_addmm_scaled(em_tensor **x) { return em_addmm(x[0], x[1], x[2], 0.5, -2.0); }
static em_tensor *f_softmax1(em_tensor **x) { return em_softmax(x[0], 1); }
static em_tensor *f_softmax0(em_tensor **x) { return em_softmax(x[0], 0); }
static em_tensor *f_log_softmax(em_tensor **x) { return em_log_softmax(x[0], -1); }
static em_tensor *f_view(em_tensor **x) { return em_mul(em_view(x[0], EM_SHAPE(4, 3)), x[1]); }
static em_tensor *f_reshape_t(em_tensor **x) { return em_reshape(em_transpose(x[0], 0, 1), EM_SHAPE(12)); }
static em_tensor *f_permute(em_tensor **x) { return em_mul(em_permute(x[0], EM_DIMS(2, 0, 1)), x[1]); }
static em_tensor *f_transpose(em_tensor **x) { return em_exp(em_transpose(x[0], 0, 1)); }
static em_tensor *f_narrow(em_tensor **x) { return em_narrow(x[0], 1, 1, 2); }
static em_tensor *f_slice_step(em_tensor **x) { return em_slice(x[0], 0, 1, 5, 2); }
static em_tensor *f_select(em_tensor **x) { return em_select(x[0], 1, 2); }
static em_tensor *f_select_neg(em_tensor **x) { return em_select(x[0], 0, -1); }
static em_tensor *f_expand(em_tensor **x) { return em_expand(x[0], EM_SHAPE(2, 3, 4)); }
static em_tensor *f_squeeze(em_tensor **x) { return em_squeeze(x[0], 1); }
static em_tensor *f_unsqueeze(em_tensor **x) { return em_mul(em_unsqueeze(x[0], 1), x[1]); }
static em_tensor *f_flatten(em_tensor **x) { return em_flatten(x[0], 1, -1); }
static em_tensor *f_contiguous(em_tensor **x) { return em_contiguous(em_transpose(x[0], 0, 1)); }
static em_tensor *f_clone(em_tensor **x) { return em_clone(x[0]); }
static em_tensor *f_cat0(em_tensor **x) {
    em_tensor *ts[3] = {x[0], x[1], x[2]};
    return em_cat(ts, 3, 0);
}
static em_tensor *f_cat1(em_tensor **x) {
    em_tensor *ts[2] = {x[0], x[1]};
    return em_cat(ts, 2, -1);
}
static em_tensor *f_stack(em_tensor **x) {
    em_tensor *ts[2] = {x[0], x[1]};
    return em_stack(ts, 2, 1);
}
static em_tensor *g_index;
static em_tensor *f_index_select0(em_tensor **x) { return em_index_select(x[0], 0, g_index); }
static em_tensor *f_index_select1(em_tensor **x) { return em_index_select(x[0], 1, g_index); }
static em_tensor *f_gather1(em_tensor **x) { return em_gather(x[0], 1, g_index); }
static em_tensor *f_gather0(em_tensor **x) { return em_gather(x[0], 0, g_index); }
static em_tensor *f_diamond(em_tensor **x) {
    em_tensor *y = em_tanh(x[0]);
    return em_add(em_mul(y, y), em_exp(y));
}
static em_tensor *f_mlp(em_tensor **x) {
    em_tensor *h = em_relu(em_add(em_matmul(x[0], em_transpose(x[1], 0, 1)), x[2]));
    return em_log_softmax(em_matmul(h, x[3]), 1);
}

static void test_binary(void) {
    GRADCHECK(f_add, EM_SHAPE(3, 4), EM_SHAPE(3, 4));
    GRADCHECK(f_add, EM_SHAPE(3, 4), EM_SHAPE(4));
    GRADCHECK(f_add, EM_SHAPE(2, 1, 3), EM_SHAPE(4, 1));
    GRADCHECK(f_sub, EM_SHAPE(3, 4), EM_SHAPE(3, 1));
    GRADCHECK(f_sub, EM_SHAPE0, EM_SHAPE(2, 3));
    GRADCHECK(f_mul, EM_SHAPE(3, 4), EM_SHAPE(1, 4));
    GRADCHECK(f_mul, EM_SHAPE(2, 3, 4), EM_SHAPE0);
    GRADCHECK(f_square_self, EM_SHAPE(5));
    GRADCHECK_K(f_div, ((int[]){RANDN, POSITIVE}), EM_SHAPE(3, 4), EM_SHAPE(4));
    GRADCHECK_K(f_pow, ((int[]){POSITIVE, RANDN}), EM_SHAPE(3, 4), EM_SHAPE(3, 4));
    GRADCHECK_K(f_pow, ((int[]){POSITIVE, RANDN}), EM_SHAPE(3, 1), EM_SHAPE(4));
    GRADCHECK(f_maximum, EM_SHAPE(3, 4), EM_SHAPE(3, 4));
    GRADCHECK(f_minimum, EM_SHAPE(3, 4), EM_SHAPE(4));
}

static void test_scalar_ops(void) {
    GRADCHECK(f_add_scalar, EM_SHAPE(3, 4));
    GRADCHECK(f_sub_scalar, EM_SHAPE(3, 4));
    GRADCHECK(f_mul_scalar, EM_SHAPE(3, 4));
    GRADCHECK(f_div_scalar, EM_SHAPE(3, 4));
    GRADCHECK(f_pow_scalar3, EM_SHAPE(3, 4));
    GRADCHECK_K(f_pow_scalar_half, ((int[]){POSITIVE}), EM_SHAPE(3, 4));
    GRADCHECK(f_pow_scalar0, EM_SHAPE(3, 4));
    GRADCHECK(f_clamp, EM_SHAPE(4, 5));
    GRADCHECK(f_clamp_lo, EM_SHAPE(4, 5));
}

static void test_unary(void) {
    GRADCHECK(f_neg, EM_SHAPE(3, 4));
    GRADCHECK(f_abs, EM_SHAPE(3, 4));
    GRADCHECK(f_exp, EM_SHAPE(3, 4));
    GRADCHECK_K(f_log, ((int[]){POSITIVE}), EM_SHAPE(3, 4));
    GRADCHECK_K(f_sqrt, ((int[]){POSITIVE}), EM_SHAPE(3, 4));
    GRADCHECK(f_tanh, EM_SHAPE(3, 4));
    GRADCHECK(f_sigmoid, EM_SHAPE(3, 4));
    GRADCHECK(f_relu, EM_SHAPE(3, 4));
    GRADCHECK(f_gelu, EM_SHAPE(3, 4));
    GRADCHECK(f_gelu_wide, EM_SHAPE(3, 4));
    GRADCHECK(f_gelu_tiny, EM_SHAPE(3, 4));
    GRADCHECK_K(f_where, ((int[]){FIXED, RANDN, RANDN}), EM_SHAPE(3, 4), EM_SHAPE(3, 4), EM_SHAPE(4));
    GRADCHECK(f_diamond, EM_SHAPE(2, 3));
}

static void test_reductions(void) {
    GRADCHECK(f_sum_all, EM_SHAPE(3, 4));
    GRADCHECK(f_sum_all, EM_SHAPE0);
    GRADCHECK(f_sum_dim, EM_SHAPE(3, 4));
    GRADCHECK(f_sum_keep, EM_SHAPE(2, 3, 4));
    GRADCHECK(f_sum_neg, EM_SHAPE(2, 3, 4));
    GRADCHECK(f_mean_all, EM_SHAPE(3, 4));
    GRADCHECK(f_mean_dim, EM_SHAPE(3, 4));
    GRADCHECK(f_max_dim, EM_SHAPE(3, 4));
    GRADCHECK(f_max_all, EM_SHAPE(3, 4));
    GRADCHECK(f_min_keep, EM_SHAPE(3, 4));
}

/* max with ties shares the gradient evenly, as PyTorch's amax */
static void test_max_ties(void) {
    em_scope s = em_scope_begin();
    double v[4] = {1, 3, 3, 2};
    em_tensor *x = em_from_data(v, EM_F64, EM_SHAPE(4), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    CHECK_OK(em_backward(em_max(x, EM_ALL_DIMS, false)));
    double g[4] = {0};
    CHECK_OK(em_copy_to_host(em_grad(x), g, sizeof g));
    CHECK_NEAR(g[0], 0.0, 0);
    CHECK_NEAR(g[1], 0.5, 0);
    CHECK_NEAR(g[2], 0.5, 0);
    CHECK_NEAR(g[3], 0.0, 0);
    em_tensor *a = em_from_data(v, EM_F64, EM_SHAPE(4), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *b = em_full(EM_SHAPE(4), 3.0, EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    CHECK_OK(em_backward(em_sum(em_maximum(a, b), EM_ALL_DIMS, false)));
    CHECK_OK(em_copy_to_host(em_grad(a), g, sizeof g));
    CHECK(g[0] == 0 && g[1] == 0.5 && g[2] == 0.5 && g[3] == 0);
    em_scope_end(s);
}

static void test_matmul(void) {
    GRADCHECK(f_matmul, EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_matmul, EM_SHAPE(4), EM_SHAPE(4, 5));
    GRADCHECK(f_matmul, EM_SHAPE(3, 4), EM_SHAPE(4));
    GRADCHECK(f_matmul, EM_SHAPE(4), EM_SHAPE(4));
    GRADCHECK(f_matmul, EM_SHAPE(2, 3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_matmul, EM_SHAPE(1, 3, 4), EM_SHAPE(2, 4, 5));
    GRADCHECK(f_matmul, EM_SHAPE(4), EM_SHAPE(2, 4, 5));
    GRADCHECK(f_matmul, EM_SHAPE(2, 3, 4), EM_SHAPE(4));
    GRADCHECK(f_matmul_t, EM_SHAPE(3, 4), EM_SHAPE(5, 4));
    GRADCHECK(f_mlp, EM_SHAPE(3, 4), EM_SHAPE(5, 4), EM_SHAPE(5), EM_SHAPE(5, 3));
}

static void test_addmm(void) {
    GRADCHECK(f_addmm_linear, EM_SHAPE(5), EM_SHAPE(3, 4), EM_SHAPE(5, 4));
    GRADCHECK(f_addmm, EM_SHAPE(3, 5), EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_addmm, EM_SHAPE(1, 5), EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_addmm, EM_SHAPE(3, 1), EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_addmm, EM_SHAPE0, EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    GRADCHECK(f_addmm_scaled, EM_SHAPE(5), EM_SHAPE(3, 4), EM_SHAPE(4, 5));
    /* the fused path records PyTorch's node */
    em_scope s = em_scope_begin();
    em_tensor *b = em_zeros(EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    em_tensor *y = em_addmm(b, em_ones(EM_SHAPE(3, 4), (em_opts){0}), em_ones(EM_SHAPE(4, 2), (em_opts){0}), 1, 1);
    CHECK(y && em_grad_fn_name(y) && !strcmp(em_grad_fn_name(y), "AddmmBackward0"));
    em_scope_end(s);
}

static void test_softmax(void) {
    GRADCHECK(f_softmax1, EM_SHAPE(3, 4));
    GRADCHECK(f_softmax0, EM_SHAPE(3, 4));
    GRADCHECK(f_log_softmax, EM_SHAPE(2, 3, 4));
}

static void test_indexing(void) {
    int64_t idx[4] = {2, 0, 2, 1};
    g_index = em_from_data(idx, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    GRADCHECK(f_index_select0, EM_SHAPE(3, 2));
    GRADCHECK(f_index_select1, EM_SHAPE(2, 3, 2));
    GRADCHECK(f_index_select0, EM_SHAPE(3));
    em_release(g_index);
    int64_t gidx[6] = {1, 1, 0, 3, 2, 0};
    g_index = em_from_data(gidx, EM_I64, EM_SHAPE(3, 2), EM_OPTS(.dtype = EM_I64));
    GRADCHECK(f_gather1, EM_SHAPE(3, 4));
    GRADCHECK(f_gather1, EM_SHAPE(4, 4)); /* index smaller than the input in dim 0 */
    em_release(g_index);
    int64_t g0[4] = {0, 2, 1, 1};
    g_index = em_from_data(g0, EM_I64, EM_SHAPE(2, 2), EM_OPTS(.dtype = EM_I64));
    GRADCHECK(f_gather0, EM_SHAPE(3, 3));
    em_release(g_index);
    g_index = NULL;
}

static void test_join(void) {
    GRADCHECK(f_cat0, EM_SHAPE(2, 3), EM_SHAPE(1, 3), EM_SHAPE(3, 3));
    GRADCHECK(f_cat1, EM_SHAPE(2, 3), EM_SHAPE(2, 1));
    GRADCHECK(f_stack, EM_SHAPE(2, 3), EM_SHAPE(2, 3));
}

static void test_views(void) {
    GRADCHECK(f_view, EM_SHAPE(3, 4), EM_SHAPE(4, 3));
    GRADCHECK(f_reshape_t, EM_SHAPE(3, 4));
    GRADCHECK(f_permute, EM_SHAPE(2, 3, 4), EM_SHAPE(4, 2, 3));
    GRADCHECK(f_transpose, EM_SHAPE(3, 4));
    GRADCHECK(f_narrow, EM_SHAPE(3, 4));
    GRADCHECK(f_slice_step, EM_SHAPE(6, 2));
    GRADCHECK(f_select, EM_SHAPE(3, 4));
    GRADCHECK(f_select_neg, EM_SHAPE(3, 4));
    GRADCHECK(f_expand, EM_SHAPE(3, 1));
    GRADCHECK(f_expand, EM_SHAPE(4));
    GRADCHECK(f_squeeze, EM_SHAPE(3, 1, 4));
    GRADCHECK(f_unsqueeze, EM_SHAPE(3, 4), EM_SHAPE(2, 4));
    GRADCHECK(f_flatten, EM_SHAPE(2, 3, 4));
    GRADCHECK(f_contiguous, EM_SHAPE(3, 4));
    GRADCHECK(f_clone, EM_SHAPE(3, 4));
}

/* A float32 graph gives float32 gradients that agree with the float64 ones. */
static void test_f32(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(4, 5), EM_OPTS(.requires_grad = true));
    em_tensor *x64 = em_to_dtype(em_detach(x), EM_F64);
    CHECK_OK(em_set_requires_grad(x64, true));
    CHECK_OK(em_backward(em_sum(em_log_softmax(em_tanh(x), 1), EM_DIMS(0, 1), false)));
    CHECK_OK(em_backward(em_sum(em_log_softmax(em_tanh(x64), 1), EM_DIMS(0, 1), false)));
    em_tensor *g = em_grad(x), *g64 = em_grad(x64);
    CHECK(em_dtype_of(g) == EM_F32);
    float a[20];
    double b[20];
    CHECK_OK(em_copy_to_host(g, a, sizeof a));
    CHECK_OK(em_copy_to_host(g64, b, sizeof b));
    for (int i = 0; i < 20; i++) CHECK_NEAR(a[i], b[i], 1e-5);
    em_scope_end(s);
}

/* Casts and promotion: each gradient comes back in its input's dtype. */
static void test_dtypes(void) {
    em_scope s = em_scope_begin();
    double xv[3] = {0.5, -1.25, 2.0}, wv[3] = {3.0, -0.5, 0.25};
    em_tensor *x = em_from_data(xv, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *w = em_from_data(wv, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F32));
    em_tensor *y = em_to_dtype(x, EM_F32);
    CHECK(em_requires_grad(y));
    CHECK_OK(em_backward(em_sum(em_mul(y, w), EM_ALL_DIMS, false)));
    em_tensor *g = em_grad(x);
    CHECK(g && em_dtype_of(g) == EM_F64);
    double gv[3] = {0};
    CHECK_OK(em_copy_to_host(g, gv, sizeof gv));
    for (int i = 0; i < 3; i++) CHECK_NEAR(gv[i], wv[i], 0);
    /* f32 * f64 promotes to f64; the f32 operand's gradient is f32 */
    em_tensor *a = em_from_data(xv, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F32, .requires_grad = true));
    em_tensor *b = em_from_data(wv, EM_F64, EM_SHAPE(3), EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *p = em_mul(a, b);
    CHECK(em_dtype_of(p) == EM_F64);
    CHECK_OK(em_backward(em_sum(p, EM_ALL_DIMS, false)));
    CHECK(em_dtype_of(em_grad(a)) == EM_F32);
    CHECK(em_dtype_of(em_grad(b)) == EM_F64);
    float ga[3];
    double gb[3];
    CHECK_OK(em_copy_to_host(em_grad(a), ga, sizeof ga));
    CHECK_OK(em_copy_to_host(em_grad(b), gb, sizeof gb));
    for (int i = 0; i < 3; i++) {
        CHECK_NEAR(ga[i], wv[i], 0);
        CHECK_NEAR(gb[i], xv[i], 0);
    }
    em_scope_end(s);
}

int main(void) {
    em_manual_seed(42);
    RUN(test_binary);
    RUN(test_scalar_ops);
    RUN(test_unary);
    RUN(test_reductions);
    RUN(test_max_ties);
    RUN(test_matmul);
    RUN(test_addmm);
    RUN(test_softmax);
    RUN(test_indexing);
    RUN(test_join);
    RUN(test_views);
    RUN(test_f32);
    RUN(test_dtypes);
    return test_summary();
}
