/* CPU backend: sum/mean/max/min over every subset of dims, argmax/argmin over each dim,
 * every dtype and input layout, against a naive reference; NaN rules; thread determinism. */
#include "test_cpu_util.h"
#include "backend_calls.h"

typedef struct tshape { int ndim; int64_t d[4]; } tshape;
static const tshape shapes[] = {
    {1, {1}}, {1, {7}}, {1, {1023}}, {2, {3, 5}}, {3, {4, 1, 7}}, {2, {33, 31}}, {3, {5, 6, 7}},
    {4, {2, 3, 4, 5}}, {2, {0, 3}}, {0, {0}}, {2, {1023, 7}}, {2, {64, 1000}}, {2, {3, 100003}}, {1, {100003}},
    {2, {100003, 3}},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
#define BIG(s) ((s) >= 10)

static bool is_int(em_dtype dt) { return !em_dtype_is_floating_test(dt); }
static bool is_arg(em_op op) { return op == EM_OP_ARGMAX || op == EM_OP_ARGMIN; }

/* The naive reference for every output (keepdim shape), in one pass over the input. */
typedef struct refacc { double sum, best; uint64_t isum; int64_t count, best_i; } refacc;

static refacc *reference(em_op op, ttensor *in, const em_tensor *out, const bool *red) {
    int nd = in->t.ndim;
    int64_t n = tt_numel(&in->t), no = tt_numel(out);
    refacc *r = calloc((size_t)(no > 0 ? no : 1), sizeof *r);
    for (int64_t o = 0; o < no; o++) r[o].best_i = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, idx[EM_MAX_DIMS], o = 0, along = 0;
        for (int d = nd - 1; d >= 0; d--) { idx[d] = rem % in->t.shape[d]; rem /= in->t.shape[d]; }
        for (int d = 0; d < nd; d++) {
            o = o * out->shape[d] + (red[d] ? 0 : idx[d]);
            if (red[d]) along = idx[d];
        }
        refacc *a = &r[o];
        double v = tt_get(in, i);
        a->count++;
        a->sum += v;
        a->isum += (uint64_t)tt_get_i64(in, i);
        bool take;
        switch (op) {
        case EM_OP_MAX: case EM_OP_ARGMAX: take = a->best_i < 0 || (!isnan(a->best) && (v > a->best || isnan(v))); break;
        case EM_OP_MIN: case EM_OP_ARGMIN: take = a->best_i < 0 || (!isnan(a->best) && (v < a->best || isnan(v))); break;
        default: take = false;
        }
        if (take) { a->best = v; a->best_i = along; }
    }
    return r;
}

static double ref_value(em_op op, const refacc *a, bool fl, bool *is_nan) {
    *is_nan = false;
    switch (op) {
    case EM_OP_SUM: return fl ? a->sum : (double)(int64_t)a->isum;
    case EM_OP_MEAN: return a->sum / (double)a->count;
    case EM_OP_MAX: case EM_OP_MIN: *is_nan = isnan(a->best); return a->best;
    default: return (double)a->best_i;
    }
}

static int64_t wrap_to(int64_t v, em_dtype dt) {
    return dt == EM_I32 ? (int32_t)(uint32_t)(uint64_t)v : dt == EM_U8 ? (uint8_t)(uint64_t)v : dt == EM_BOOL ? v != 0 : v;
}

static void check_reduce(em_op op, em_dtype dt, int s, int li, int lo, const bool *red, int *bad) {
    const tshape *sh = &shapes[s];
    int64_t oshape[EM_MAX_DIMS];
    for (int d = 0; d < sh->ndim; d++) oshape[d] = red[d] ? 1 : sh->d[d];
    ttensor *in = tt_make(dt, sh->ndim, sh->d, (tlayout)li);
    ttensor *out = tt_make(is_arg(op) ? EM_I64 : dt, sh->ndim, oshape, (tlayout)lo);
    if (dt == EM_U8) tt_fill_random(in, 0, 255);
    else tt_fill_random(in, -100, 100);
    em_status st = be_reduce(&em__cpu_backend, op, &out->t, &in->t, red);
    int64_t rn = 1;
    for (int d = 0; d < sh->ndim; d++) if (red[d]) rn *= sh->d[d];
    if (rn == 0 && op != EM_OP_SUM && op != EM_OP_MEAN && tt_numel(&out->t) > 0) {
        if (st != EM_ERR_ARGUMENT && (*bad)++ < 10) fprintf(stderr, "  %s of empty dim did not fail\n", "max");
        em_clear_error();
        tt_free(in); tt_free(out);
        return;
    }
    CHECK_OK(st);
    int64_t n = tt_numel(&out->t);
    refacc *ref = reference(op, in, &out->t, red);
    for (int64_t o = 0; o < n; o++) {
        bool isn;
        double want = ref_value(op, &ref[o], em_dtype_is_floating_test(dt), &isn), got = tt_get(out, o);
        bool ok;
        if (is_arg(op)) ok = tt_get_i64(out, o) == (int64_t)want;
        else if (is_int(dt)) ok = tt_get_i64(out, o) == wrap_to((int64_t)want, dt);
        else if (isn) ok = isnan(got);
        else {
            double w = dt == EM_F32 ? (float)want : dt == EM_F16 ? em_f16_to_f32(em_f32_to_f16((float)want))
                     : dt == EM_BF16 ? em_bf16_to_f32(em_f32_to_bf16((float)want)) : want;
            ok = tt_close(got, w, tt_tol(dt, want) + 1e-9);
        }
        if (!ok && (*bad)++ < 10) {
            fprintf(stderr, "  reduce op %d %s shape#%d %s->%s mask", (int)op, dtype_names[dt], s, tlayout_name[li],
                    tlayout_name[lo]);
            for (int d = 0; d < sh->ndim; d++) fprintf(stderr, "%d", red[d]);
            fprintf(stderr, " [%lld]: got %.9g want %.9g\n", (long long)o, got, want);
        }
    }
    if (!tt_guard_ok(out) && (*bad)++ < 10) fprintf(stderr, "  reduce: guard bytes changed\n");
    free(ref);
    tt_free(in);
    tt_free(out);
}

static void test_reduce_all(void) {
    int bad = 0, ran = 0;
    const em_op ops[] = {EM_OP_SUM, EM_OP_MEAN, EM_OP_MAX, EM_OP_MIN, EM_OP_ARGMAX, EM_OP_ARGMIN};
    for (int oi = 0; oi < 6; oi++)
        for (int di = 0; di < 8; di++) {
            em_dtype dt = all_dtypes[di];
            if (!be_has(&em__cpu_backend, ops[oi], dt)) continue;
            for (int s = 0; s < NSHAPES; s++) {
                int nd = shapes[s].ndim;
                for (int mask = 0; mask < (1 << nd) || (nd == 0 && mask == 0); mask++) {
                    bool red[EM_MAX_DIMS] = {false};
                    int cnt = 0;
                    for (int d = 0; d < nd; d++) cnt += red[d] = (mask >> d) & 1;
                    if (is_arg(ops[oi]) && cnt != 1) continue;
                    if (!is_arg(ops[oi]) && nd > 0 && cnt == 0 && mask != 0) continue;
                    for (int li = 0; li < L_LAYOUT_COUNT; li++)
                        for (int lo = 0; lo < 2; lo++) {
                            if (BIG(s) && (lo != 0 || (li != L_CONTIG && li != L_TRANSPOSED) || di > 1)) continue;
                            if (BIG(s) && ops[oi] != EM_OP_SUM && ops[oi] != EM_OP_ARGMAX && li != L_CONTIG) continue;
                            check_reduce(ops[oi], dt, s, li, lo == 0 ? L_CONTIG : L_SLICED, red, &bad);
                            ran++;
                        }
                    if (nd == 0) break;
                }
            }
        }
    CHECK(bad == 0);
    CHECK(ran > 1000);
}

/* NaN propagates through max/min; argmax/argmin return the first NaN (PyTorch). Ties: first index. */
static void test_reduce_nan_and_ties(void) {
    int64_t shape[2] = {3, 600}, oshape[2] = {1, 600}, rshape[2] = {3, 1};
    ttensor *x = tt_make(EM_F32, 2, shape, L_CONTIG);
    for (int i = 0; i < 1800; i++) tt_set(x, i, (i % 600) % 5);
    tt_set(x, 600 + 17, NAN); /* column 17, row 1 */
    tt_set(x, 1200 + 17, NAN);
    tt_set(x, 1200 + 18, NAN);
    tt_set(x, 0 * 600 + 500, 9); /* row 0 col 500 */
    ttensor *m = tt_make(EM_F32, 2, oshape, L_CONTIG), *am = tt_make(EM_I64, 2, oshape, L_CONTIG);
    bool red0[2] = {true, false}, red1[2] = {false, true};
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_MAX, &m->t, &x->t, red0));
    CHECK(isnan(tt_get(m, 17)) && isnan(tt_get(m, 18)) && tt_get(m, 500) == 9 && tt_get(m, 4) == 4);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_MIN, &m->t, &x->t, red0));
    CHECK(isnan(tt_get(m, 17)) && tt_get(m, 500) == 0);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_ARGMAX, &am->t, &x->t, red0));
    CHECK(tt_get_i64(am, 17) == 1 && tt_get_i64(am, 18) == 2 && tt_get_i64(am, 500) == 0 && tt_get_i64(am, 4) == 0);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_ARGMIN, &am->t, &x->t, red0));
    CHECK(tt_get_i64(am, 17) == 1 && tt_get_i64(am, 3) == 0);
    ttensor *r = tt_make(EM_I64, 2, rshape, L_CONTIG), *rm = tt_make(EM_F32, 2, rshape, L_CONTIG);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_ARGMAX, &r->t, &x->t, red1));
    CHECK(tt_get_i64(r, 0) == 500 && tt_get_i64(r, 1) == 17 && tt_get_i64(r, 2) == 17);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_ARGMIN, &r->t, &x->t, red1));
    CHECK(tt_get_i64(r, 0) == 0 && tt_get_i64(r, 1) == 17 && tt_get_i64(r, 2) == 17);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_MAX, &rm->t, &x->t, red1));
    CHECK(tt_get(rm, 0) == 9 && isnan(tt_get(rm, 1)));
    tt_free(x); tt_free(m); tt_free(am); tt_free(r); tt_free(rm);
}

/* A long f32 sum is accurate (double accumulation) and identical for 1 and 2 threads. */
static void test_reduce_threads(void) {
    int64_t n = 3000001, shape[1] = {3000001}, one[1] = {1};
    ttensor *x = tt_make(EM_F32, 1, shape, L_CONTIG);
    for (int64_t i = 0; i < n; i++) tt_set(x, i, (i % 3 == 0) ? 0.1 : -0.05);
    ttensor *s1 = tt_make(EM_F32, 1, one, L_CONTIG), *s2 = tt_make(EM_F32, 1, one, L_CONTIG);
    bool red[1] = {true};
    em_set_num_threads(1);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_SUM, &s1->t, &x->t, red));
    em_set_num_threads(2);
    CHECK_OK(be_reduce(&em__cpu_backend, EM_OP_SUM, &s2->t, &x->t, red));
    CHECK(memcmp(tt_ptr(s1, 0), tt_ptr(s2, 0), 4) == 0);
    double want = 0;
    for (int64_t i = 0; i < n; i++) want += (double)(float)((i % 3 == 0) ? 0.1 : -0.05);
    CHECK_NEAR(tt_get(s1, 0), want, fabs(want) * 1e-6 + 1e-3);
    tt_free(x); tt_free(s1); tt_free(s2);
}

int main(void) {
    RUN(test_reduce_all);
    RUN(test_reduce_nan_and_ties);
    RUN(test_reduce_threads);
    return test_summary();
}
