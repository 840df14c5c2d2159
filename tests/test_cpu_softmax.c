/* CPU backend: softmax / log-softmax along every dim, float dtypes, layouts, odd sizes. */
#include "test_cpu_util.h"
#include "backend_calls.h"

typedef struct tshape { int ndim; int64_t d[4]; } tshape;
static const tshape shapes[] = {
    {1, {1}}, {1, {7}}, {1, {1023}}, {2, {3, 5}}, {3, {4, 1, 7}}, {2, {33, 31}}, {4, {2, 3, 4, 5}},
    {2, {0, 3}}, {0, {0}}, {1, {100003}}, {2, {1500, 10}},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static void check_softmax(em_dtype dt, int s, int dim, int li, int lo, bool lg, int *bad) {
    const tshape *sh = &shapes[s];
    ttensor *in = tt_make(dt, sh->ndim, sh->d, (tlayout)li), *out = tt_make(dt, sh->ndim, sh->d, (tlayout)lo);
    tt_fill_random(in, -8, 8);
    CHECK_OK(be_softmax(&em__cpu_backend, &out->t, &in->t, dim, lg));
    int64_t n = tt_numel(&in->t), len = sh->ndim ? sh->d[dim] : 1, inner = 1;
    for (int d = dim + 1; d < sh->ndim; d++) inner *= sh->d[d];
    double *rmax = malloc(sizeof(double) * (size_t)(n + 1)), *rsum = malloc(sizeof(double) * (size_t)(n + 1));
    bool *done = calloc((size_t)(n + 1), 1);
    for (int64_t i = 0; i < n; i++) {
        /* the row through element i: positions i0 + j * inner; its stats computed once */
        int64_t pos = (i / inner) % len, i0 = i - pos * inner;
        if (!done[i0]) {
            double mm = -INFINITY, ss = 0;
            for (int64_t j = 0; j < len; j++) mm = fmax(mm, tt_get(in, i0 + j * inner));
            for (int64_t j = 0; j < len; j++) ss += exp(tt_get(in, i0 + j * inner) - mm);
            rmax[i0] = mm;
            rsum[i0] = ss;
            done[i0] = true;
        }
        double m = rmax[i0], sum = rsum[i0];
        double x = tt_get(in, i), want = lg ? x - m - log(sum) : exp(x - m) / sum;
        double tol = tt_tol(dt, want) * (lg ? 4 : 2) + (dt == EM_F32 ? 1e-6 : dt == EM_F64 ? 1e-14 : 0);
        if (!tt_close(tt_get(out, i), want, tol) && (*bad)++ < 10)
            fprintf(stderr, "  %s %s shape#%d dim %d %s->%s [%lld]: got %.9g want %.9g\n", lg ? "log_softmax" : "softmax",
                    dtype_names[dt], s, dim, tlayout_name[li], tlayout_name[lo], (long long)i, tt_get(out, i), want);
    }
    free(rmax);
    free(rsum);
    free(done);
    if (!tt_guard_ok(out) && (*bad)++ < 10) fprintf(stderr, "  softmax: guard bytes changed\n");
    tt_free(in);
    tt_free(out);
}

static void test_softmax_all(void) {
    int bad = 0, ran = 0;
    for (int di = 0; di < 4; di++)
        for (int s = 0; s < NSHAPES; s++)
            for (int dim = 0; dim < (shapes[s].ndim ? shapes[s].ndim : 1); dim++)
                for (int li = 0; li < L_LAYOUT_COUNT; li++)
                    for (int lo = 0; lo < 3; lo++)
                        for (int lg = 0; lg < 2; lg++) {
                            if (s >= 9 && (li > 1 || lo > 0)) continue;
                            check_softmax(all_dtypes[di], s, dim, li, lo, lg, &bad);
                            ran++;
                        }
    CHECK(bad == 0);
    CHECK(ran > 500);
}

/* Large inputs stay finite; -inf entries get 0; a NaN poisons its row; integers are refused. */
static void test_softmax_special(void) {
    int64_t shape[2] = {3, 3};
    ttensor *x = tt_make(EM_F32, 2, shape, L_CONTIG), *y = tt_make(EM_F32, 2, shape, L_CONTIG);
    const double v[9] = {1000, 1001, 1002, -INFINITY, 0, 0, NAN, 1, 2};
    for (int i = 0; i < 9; i++) tt_set(x, i, v[i]);
    CHECK_OK(be_softmax(&em__cpu_backend, &y->t, &x->t, 1, false));
    CHECK_NEAR(tt_get(y, 2), exp(0) / (exp(-2) + exp(-1) + 1), 1e-6);
    CHECK(tt_get(y, 3) == 0);
    CHECK_NEAR(tt_get(y, 4), 0.5, 1e-7);
    CHECK(isnan(tt_get(y, 6)) && isnan(tt_get(y, 7)) && isnan(tt_get(y, 8)));
    CHECK_OK(be_softmax(&em__cpu_backend, &y->t, &x->t, 1, true));
    CHECK_NEAR(tt_get(y, 2), -log(exp(-2) + exp(-1) + 1), 1e-5);
    CHECK(isinf(tt_get(y, 3)) && tt_get(y, 3) < 0);
    ttensor *xi = tt_make(EM_I64, 2, shape, L_CONTIG), *yi = tt_make(EM_I64, 2, shape, L_CONTIG);
    CHECK(be_softmax(&em__cpu_backend, &yi->t, &xi->t, 1, false) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "softmax");
    tt_free(x); tt_free(y); tt_free(xi); tt_free(yi);
}

int main(void) {
    RUN(test_softmax_all);
    RUN(test_softmax_special);
    return test_summary();
}
