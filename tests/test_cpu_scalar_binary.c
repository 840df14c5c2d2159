/* The CPU's small dense binary path with a 0-d (broadcast) operand on either side
 * (cpu_elementwise.c, binary_scalar): every element against the scalar formula, for
 * non-commutative ops, comparisons (bool out), in place (em_add_ with a scalar tensor), sizes
 * around its 256-element block, f32/f64/i64; plus where with a scalar second operand. */
#include <math.h>
#include <stdint.h>
#include <ember/ember.h>
#include "test.h"

static double expect(int op, double a, double b) {
    switch (op) {
    case 0: return a - b;
    case 1: return a / b;
    case 2: return a < b;
    case 3: return a > b;
    case 4: return a > b ? a : b;
    default: return a * b;
    }
}

static em_tensor *apply(int op, em_tensor *a, em_tensor *b) {
    switch (op) {
    case 0: return em_sub(a, b);
    case 1: return em_div(a, b);
    case 2: return em_lt(a, b);
    case 3: return em_gt(a, b);
    case 4: return em_maximum(a, b);
    default: return em_mul(a, b);
    }
}

static void test_scalar_either_side(void) {
    static const int64_t sizes[] = {1, 7, 255, 256, 257, 1000};
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_I64};
    int bad = 0, checked = 0;
    for (int di = 0; di < 3; di++)
        for (int si = 0; si < 6; si++)
            for (int op = 0; op < 6; op++) {
                if (op == 1 && dts[di] == EM_I64) continue; /* true division promotes: not this path */
                em_scope s = em_scope_begin();
                int64_t n = sizes[si];
                em_tensor *x = em_arange(0, (double)n, 1, EM_OPTS(.dtype = dts[di]));
                x = em_sub_scalar(x, (double)(n / 3)); /* negatives, zero and positives */
                em_tensor *c = em_scalar(3, EM_OPTS(.dtype = dts[di]));
                for (int left = 0; left < 2; left++) {
                    em_tensor *r = left ? apply(op, c, x) : apply(op, x, c);
                    CHECK(r && em_numel(r) == n);
                    if (!r) continue;
                    em_tensor *rd = em_to_dtype(r, EM_F64), *xd = em_to_dtype(x, EM_F64);
                    const double *pr = em_data_ptr(rd), *px = em_data_ptr(xd);
                    for (int64_t i = 0; i < n; i++) {
                        double e = left ? expect(op, 3, px[i]) : expect(op, px[i], 3);
                        if (dts[di] == EM_F32) e = (double)(float)e;
                        checked++;
                        if (!(pr[i] == e || (isnan(pr[i]) && isnan(e))) && bad++ < 5)
                            fprintf(stderr, "  dtype %s n %lld op %d left %d [%lld]: %g, expected %g\n",
                                    em_dtype_name(dts[di]), (long long)n, op, left, (long long)i, pr[i], e);
                    }
                }
                em_scope_end(s);
            }
    CHECK(bad == 0);
    CHECK(checked > 10000);
}

/* In place: out is the dense operand itself. */
static void test_scalar_in_place(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_arange(0, 600, 1, EM_OPTS(.dtype = EM_F32));
    CHECK_OK(em_add_(x, em_scalar(0.5, EM_OPTS(.dtype = EM_F32)), 2.0));
    const float *p = em_data_ptr(x);
    int bad = 0;
    for (int i = 0; i < 600; i++) bad += p[i] != (float)i + 1.0f;
    CHECK(bad == 0);
    em_scope_end(s);
}

/* where(mask, g, 0), relu's backward: g where mask, else 0, around the block size. */
static void test_where_scalar(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *g = em_randn(EM_SHAPE(3, 301), EM_OPTS(0)), *y = em_randn(EM_SHAPE(3, 301), EM_OPTS(0));
    em_tensor *zero = em_scalar(0, EM_OPTS(0));
    em_tensor *mask = em_gt(y, zero), *r = em_where(mask, g, zero);
    CHECK(r && em_numel(r) == 903);
    const float *pg = em_data_ptr(g), *py = em_data_ptr(y), *pr = em_data_ptr(r);
    int bad = 0;
    for (int i = 0; i < 903; i++) bad += pr[i] != (py[i] > 0 ? pg[i] : 0.0f);
    CHECK(bad == 0);
    em_scope_end(s);
}

int main(void) {
    RUN(test_scalar_either_side);
    RUN(test_scalar_in_place);
    RUN(test_where_scalar);
    return test_summary();
}
