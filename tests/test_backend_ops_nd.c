/* Backend conformance, part two (see test_backend_ops.c for the method): reductions,
 * matmul, softmax and the indexing ops, on every device, dtype and layout, against naive
 * double-precision references, with sentinel outputs; and again on two PoCL devices. */
#include "backend_ops_util.h"
#include "backend_calls.h"

#define FOR_TARGETS for (int ti = 0; ti < g_ntargets; ti++)
#define TG (&g_targets[ti])

static int g_declined;

/* A backend answer of EM_ERR_NOT_SUPPORTED is a decline (a failure when tests/required_ops.txt
 * requires the op of the backend, else a skip); anything else must be OK. */
static bool run_ok(const target *tg, const char *op, em_status s) {
    if (s == EM_ERR_NOT_SUPPORTED) {
        op_declined(tg->be->name, op, g_ctx, em_last_error());
        em_clear_error();
        g_declined++;
        return false;
    }
    CHECK(backend_ok(s));
    return s == EM_OK;
}

/* row-major index -> element offset for a contiguous shape's coordinates */
static void coords_of(int64_t i, em_shape sh, int64_t *c) {
    for (int d = sh.ndim - 1; d >= 0; d--) {
        c[d] = sh.d[d] ? i % sh.d[d] : 0;
        i = sh.d[d] ? i / sh.d[d] : 0;
    }
}
static int64_t index_of(const int64_t *c, em_shape sh) {
    int64_t i = 0;
    for (int d = 0; d < sh.ndim; d++) i = i * sh.d[d] + c[d];
    return i;
}

/* ---------------------------------------------------------------- reductions */

typedef struct rcase { em_shape sh; bool red[EM_MAX_DIMS]; } rcase;
static const rcase RCASES[] = {
    {{2, {5, 7}}, {0, 1}}, {{2, {5, 7}}, {1, 0}}, {{2, {5, 7}}, {1, 1}},
    {{3, {3, 4, 5}}, {0, 1, 0}}, {{3, {3, 4, 5}}, {1, 0, 1}}, {{3, {3, 4, 5}}, {0, 0, 1}},
    {{2, {2, 300}}, {0, 1}}, {{2, {300, 3}}, {1, 0}}, {{1, {7}}, {1}},
    {{2, {1, 70000}}, {0, 1}}, {{2, {0, 5}}, {0, 1}}, {{2, {5, 0}}, {0, 1}},
};

static void reduce_case(const target *tg, em_op op, em_dtype dt, const rcase *c, layout lin,
                        bool nan_first) {
    bool arg = op == EM_OP_ARGMAX || op == EM_OP_ARGMIN;
    em_shape sh = c->sh, osh = c->sh;
    int nred = 0;
    int64_t rlen = 1;
    for (int d = 0; d < sh.ndim; d++)
        if (c->red[d]) {
            osh.d[d] = 1;
            nred++;
            rlen *= sh.d[d];
        }
    if (arg && nred != 1) return;
    if (rlen == 0 && op != EM_OP_SUM && op != EM_OP_MEAN) return;
    int64_t n = shape_numel(sh), on = shape_numel(osh);
    em_scope s = em_scope_begin();
    bool big = n > 10000;
    value_kind k = big ? V_UNIT : (op == EM_OP_SUM || op == EM_OP_MEAN) ? V_GENERAL : V_SMALLINT;
    double *v = gen(dt, k, n);
    if (nan_first && n > 3) v[3] = v[1] = NAN;
    em_tensor *in = make_tensor(tg, dt, sh, v, lin);
    em_dtype odt = arg ? EM_I64 : dt;
    double *ref = malloc(sizeof(double) * (size_t)(on ? on : 1));
    int64_t c0[EM_MAX_DIMS], cc[EM_MAX_DIMS];
    for (int64_t o = 0; o < on; o++) {
        coords_of(o, osh, c0);
        double acc = op == EM_OP_MAX ? -INFINITY : op == EM_OP_MIN ? INFINITY : 0;
        int64_t best = -1, r = 0;
        for (int64_t i = 0; i < n; i++) { /* every input element of this output, in order */
            coords_of(i, sh, cc);
            bool mine = true;
            for (int d = 0; d < sh.ndim; d++)
                if (!c->red[d] && cc[d] != c0[d]) mine = false;
            if (!mine) continue;
            double x = v[i];
            if (op == EM_OP_SUM || op == EM_OP_MEAN) acc += x;
            else if (op == EM_OP_MAX) acc = isnan(x) || isnan(acc) ? NAN : fmax(acc, x);
            else if (op == EM_OP_MIN) acc = isnan(x) || isnan(acc) ? NAN : fmin(acc, x);
            else {
                bool better = best < 0 ||
                              (isnan(x) ? !isnan(acc) : !isnan(acc) && (op == EM_OP_ARGMAX ? x > acc : x < acc));
                if (better) {
                    acc = x;
                    best = r;
                }
            }
            r++;
        }
        ref[o] = arg ? (double)best : dt_round(dt, op == EM_OP_MEAN ? acc / (double)rlen : acc);
    }
    outbuf ob = make_out(tg, odt, osh, lin == L_CONTIG ? L_STRIDED : L_CONTIG);
    bool red[EM_MAX_DIMS];
    memcpy(red, c->red, sizeof red);
    /* bf16 and f16 sums round once at the end; the large case accumulates 70000 values */
    double limit = nmse_limit(odt);
    if (run_ok(tg, "reduce", be_reduce(tg->be, op, ob.view, in, red))) CHECK(check_out(&ob, ref, limit));
    else free(ob.before);
    free(v);
    free(ref);
    em_scope_end(s);
}

static void test_reduce(void) {
    FOR_TARGETS for (int op = EM_OP_SUM; op <= EM_OP_ARGMIN; op++) for (int di = 0; di < N_DTYPES; di++) {
        em_dtype dt = ALL_DTYPES[di];
        if (!op_supported(TG, (em_op)op, dt)) continue;
        for (size_t ci = 0; ci < sizeof RCASES / sizeof RCASES[0]; ci++) for (int l = 0; l < 3; l++) {
            if (RCASES[ci].sh.d[1] == 70000 && (l != 0 || (!is_float(dt) && dt != EM_I64))) continue;
            snprintf(g_ctx, sizeof g_ctx, "%s reduce op %d %s case %zu %s", TG->name, op,
                     em_dtype_name(dt), ci, layout_name(l));
            reduce_case(TG, (em_op)op, dt, &RCASES[ci], (layout)l, false);
        }
        if (dt == EM_F32 || dt == EM_F64) {
            snprintf(g_ctx, sizeof g_ctx, "%s reduce op %d %s with NaN", TG->name, op, em_dtype_name(dt));
            reduce_case(TG, (em_op)op, dt, &RCASES[1], L_CONTIG, true);
            reduce_case(TG, (em_op)op, dt, &RCASES[6], L_CONTIG, true);
        }
    }
}

/* ---------------------------------------------------------------- matmul */

typedef struct mcase { em_shape a, b, bfull; layout la, lb, lo; } mcase;
static const mcase MCASES[] = {
    {{2, {1, 1}}, {2, {1, 1}}, {2, {1, 1}}, L_CONTIG, L_CONTIG, L_CONTIG},
    {{2, {3, 5}}, {2, {5, 7}}, {2, {5, 7}}, L_CONTIG, L_CONTIG, L_STRIDED},
    {{2, {33, 17}}, {2, {17, 65}}, {2, {17, 65}}, L_TRANSPOSED, L_CONTIG, L_CONTIG},
    {{2, {64, 64}}, {2, {64, 64}}, {2, {64, 64}}, L_CONTIG, L_TRANSPOSED, L_OFFSET},
    {{2, {1, 40}}, {2, {40, 1}}, {2, {40, 1}}, L_STRIDED, L_OFFSET, L_CONTIG},
    {{3, {2, 3, 4}}, {3, {2, 4, 5}}, {3, {2, 4, 5}}, L_OFFSET, L_STRIDED, L_CONTIG},
    {{3, {2, 3, 4}}, {3, {1, 4, 5}}, {3, {2, 4, 5}}, L_CONTIG, L_CONTIG, L_STRIDED},
    {{4, {2, 2, 9, 3}}, {4, {2, 1, 3, 6}}, {4, {2, 2, 3, 6}}, L_TRANSPOSED, L_CONTIG, L_CONTIG},
    {{2, {3, 0}}, {2, {0, 4}}, {2, {0, 4}}, L_CONTIG, L_CONTIG, L_STRIDED},
    {{2, {0, 3}}, {2, {3, 4}}, {2, {3, 4}}, L_CONTIG, L_CONTIG, L_CONTIG},
};

static void test_matmul(void) {
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (size_t ci = 0; ci < sizeof MCASES / sizeof MCASES[0]; ci++) {
        em_dtype dt = ALL_DTYPES[di];
        const mcase *c = &MCASES[ci];
        if (dt == EM_BOOL || !has_entry(TG, be_has(TG->be, EM_OP_MATMUL, dt), "matmul")) continue;
        int nd = c->a.ndim;
        int64_t M = c->a.d[nd - 2], K = c->a.d[nd - 1], N = c->b.d[nd - 1];
        em_shape os = c->a;
        os.d[nd - 1] = N;
        for (int d = 0; d < nd - 2; d++) os.d[d] = c->bfull.d[d] > os.d[d] ? c->bfull.d[d] : os.d[d];
        int64_t batch = 1, on = shape_numel(os);
        for (int d = 0; d < nd - 2; d++) batch *= os.d[d];
        em_scope s = em_scope_begin();
        snprintf(g_ctx, sizeof g_ctx, "%s matmul %s case %zu", TG->name, em_dtype_name(dt), ci);
        double *va = gen(dt, V_GENERAL, shape_numel(c->a)), *vb = gen(dt, V_GENERAL, shape_numel(c->b));
        em_tensor *a = make_tensor(TG, dt, c->a, va, c->la), *b = make_tensor(TG, dt, c->b, vb, c->lb);
        if (shape_numel(c->b) != shape_numel(c->bfull)) b = em_expand(b, c->bfull);
        double *ref = malloc(sizeof(double) * (size_t)(on ? on : 1));
        for (int64_t bi = 0; bi < batch; bi++) {
            /* b's batch index: the output's batch coordinates, 0 where b has size 1 */
            int64_t bb = 0, rem = bi, mul = 1;
            for (int d = nd - 3; d >= 0; d--) {
                int64_t coord = rem % os.d[d];
                rem /= os.d[d];
                bb += (c->b.d[d] == 1 ? 0 : coord) * mul;
                mul *= c->b.d[d];
            }
            for (int64_t m = 0; m < M; m++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++) acc += va[bi * M * K + m * K + k] * vb[bb * K * N + k * N + j];
                    ref[bi * M * N + m * N + j] = dt_round(dt, acc);
                }
        }
        outbuf ob = make_out(TG, dt, os, c->lo);
        if (run_ok(TG, "matmul", be_matmul(TG->be, ob.view, a, b))) CHECK(check_out(&ob, ref, nmse_limit(dt)));
        else free(ob.before);
        free(va);
        free(vb);
        free(ref);
        em_scope_end(s);
    }
}

/* ---------------------------------------------------------------- softmax */

typedef struct scase { em_shape sh; int dim; } scase;
static const scase SCASES[] = {
    {{2, {4, 10}}, 1}, {{2, {100, 10}}, 1}, {{2, {3, 300}}, 1}, {{2, {5, 7}}, 0},
    {{3, {2, 3, 4}}, 1}, {{2, {0, 5}}, 1}, {{1, {6}}, 0},
};

static void test_softmax(void) {
    FOR_TARGETS for (int di = 0; di < 4; di++) for (size_t ci = 0; ci < sizeof SCASES / sizeof SCASES[0]; ci++)
        for (int lg = 0; lg < 2; lg++) for (int l = 0; l < 3; l++) {
            em_dtype dt = ALL_DTYPES[di];
            const scase *c = &SCASES[ci];
            if (!has_entry(TG, be_has(TG->be, EM_OP_SOFTMAX, dt), "softmax")) continue;
            int64_t n = shape_numel(c->sh), L = c->sh.d[c->dim];
            em_scope s = em_scope_begin();
            snprintf(g_ctx, sizeof g_ctx, "%s %ssoftmax %s case %zu %s", TG->name, lg ? "log_" : "",
                     em_dtype_name(dt), ci, layout_name(l));
            double *v = gen(dt, V_GENERAL, n);
            em_tensor *in = make_tensor(TG, dt, c->sh, v, (layout)l);
            double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
            int64_t cc[EM_MAX_DIMS];
            for (int64_t i = 0; i < n; i++) {
                coords_of(i, c->sh, cc);
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < L; j++) {
                    cc[c->dim] = j;
                    m = fmax(m, v[index_of(cc, c->sh)]);
                }
                for (int64_t j = 0; j < L; j++) {
                    cc[c->dim] = j;
                    sum += exp(v[index_of(cc, c->sh)] - m);
                }
                ref[i] = dt_round(dt, lg ? v[i] - m - log(sum) : exp(v[i] - m) / sum);
            }
            outbuf ob = make_out(TG, dt, c->sh, l == L_CONTIG ? L_STRIDED : L_CONTIG);
            if (run_ok(TG, lg ? "log_softmax" : "softmax", be_softmax(TG->be, ob.view, in, c->dim, lg)))
                CHECK(check_out(&ob, ref, nmse_limit(dt)));
            else free(ob.before);
            free(v);
            free(ref);
            em_scope_end(s);
        }
}

/* ---------------------------------------------------------------- indexing */

static em_tensor *index_tensor(const target *tg, const int64_t *vals, int64_t n, bool strided) {
    double v[64];
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    return make_tensor(tg, EM_I64, (em_shape){1, {n}}, v, strided ? L_STRIDED : L_CONTIG);
}

static void test_index_select(void) {
    static const int64_t idx[] = {2, 0, 2, 1, 3};
    const struct { em_shape sh; int dim; int64_t n; } cases[] = {
        {{2, {5, 6}}, 0, 5}, {{2, {5, 6}}, 1, 4}, {{3, {2, 4, 4}}, 1, 5}, {{3, {2, 3, 4}}, 2, 3}, {{2, {4, 0}}, 0, 2},
    };
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (int ci = 0; ci < 5; ci++) for (int l = 0; l < 3; l++) {
        em_dtype dt = ALL_DTYPES[di];
        if (!has_entry(TG, be_has(TG->be, EM_OP_INDEX_SELECT, dt), "index_select")) continue;
        em_shape sh = cases[ci].sh, osh = sh;
        int dim = cases[ci].dim;
        osh.d[dim] = cases[ci].n;
        int64_t n = shape_numel(sh), on = shape_numel(osh);
        em_scope s = em_scope_begin();
        snprintf(g_ctx, sizeof g_ctx, "%s index_select %s case %d %s", TG->name, em_dtype_name(dt), ci,
                 layout_name(l));
        double *v = gen(dt, V_GENERAL, n);
        em_tensor *in = make_tensor(TG, dt, sh, v, (layout)l);
        em_tensor *ix = index_tensor(TG, idx, cases[ci].n, l == 2);
        double *ref = malloc(sizeof(double) * (size_t)(on ? on : 1));
        int64_t cc[EM_MAX_DIMS];
        for (int64_t i = 0; i < on; i++) {
            coords_of(i, osh, cc);
            cc[dim] = idx[cc[dim]];
            ref[i] = v[index_of(cc, sh)];
        }
        outbuf ob = make_out(TG, dt, osh, l == L_CONTIG ? L_STRIDED : L_CONTIG);
        if (run_ok(TG, "index_select", be_index_select(TG->be, ob.view, in, dim, ix))) CHECK(check_out(&ob, ref, 0));
        else free(ob.before);
        free(v);
        free(ref);
        em_scope_end(s);
    }
}

static void test_gather(void) {
    const struct { em_shape in, ix; int dim; } cases[] = {
        {{2, {4, 5}}, {2, {4, 3}}, 1}, {{2, {4, 5}}, {2, {2, 5}}, 0}, {{3, {2, 3, 4}}, {3, {2, 2, 6}}, 2},
    };
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (int ci = 0; ci < 3; ci++) for (int l = 0; l < 3; l++) {
        em_dtype dt = ALL_DTYPES[di];
        if (!has_entry(TG, be_has(TG->be, EM_OP_GATHER, dt), "gather")) continue;
        em_shape sh = cases[ci].in, xs = cases[ci].ix;
        int dim = cases[ci].dim;
        int64_t n = shape_numel(sh), on = shape_numel(xs);
        em_scope s = em_scope_begin();
        snprintf(g_ctx, sizeof g_ctx, "%s gather %s case %d %s", TG->name, em_dtype_name(dt), ci, layout_name(l));
        double *v = gen(dt, V_GENERAL, n), *xv = malloc(sizeof(double) * (size_t)on);
        for (int64_t i = 0; i < on; i++) xv[i] = lcg() % sh.d[dim];
        em_tensor *in = make_tensor(TG, dt, sh, v, (layout)l);
        em_tensor *ix = make_tensor(TG, EM_I64, xs, xv, l == 1 ? L_STRIDED : L_CONTIG);
        double *ref = malloc(sizeof(double) * (size_t)on);
        int64_t cc[EM_MAX_DIMS];
        for (int64_t i = 0; i < on; i++) {
            coords_of(i, xs, cc);
            cc[dim] = (int64_t)xv[i];
            ref[i] = v[index_of(cc, sh)];
        }
        outbuf ob = make_out(TG, dt, xs, l == L_CONTIG ? L_STRIDED : L_CONTIG);
        if (run_ok(TG, "gather", be_gather(TG->be, ob.view, in, dim, ix))) CHECK(check_out(&ob, ref, 0));
        else free(ob.before);
        free(v);
        free(xv);
        free(ref);
        em_scope_end(s);
    }
}

/* index_add (scatter = false) and scatter_add (scatter = true): duplicates accumulate */
static void test_accumulate(bool scatter) {
    static const int64_t idx[] = {1, 4, 1, 0, 3, 1, 2};
    const struct { em_shape out, src; int dim; } cases[] = {
        {{2, {5, 4}}, {2, {6, 4}}, 0}, {{2, {3, 5}}, {2, {3, 7}}, 1}, {{2, {4, 5}}, {2, {4, 3}}, 1}, {{2, {4, 5}}, {2, {6, 5}}, 0},
    };
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (int ci = 0; ci < 4; ci++) for (int l = 0; l < 2; l++) {
        em_dtype dt = ALL_DTYPES[di];
        if (dt == EM_BOOL) continue;
        if (!has_entry(TG, scatter ? be_has(TG->be, EM_OP_SCATTER_ADD, dt) : be_has(TG->be, EM_OP_INDEX_ADD, dt),
                       scatter ? "scatter_add" : "index_add"))
            continue;
        em_shape os = cases[ci].out, ss = cases[ci].src;
        int dim = cases[ci].dim;
        if (!scatter && ci >= 2) continue;
        int64_t on = shape_numel(os), sn = shape_numel(ss), L = ss.d[dim];
        em_scope s = em_scope_begin();
        snprintf(g_ctx, sizeof g_ctx, "%s %s %s case %d %s", TG->name, scatter ? "scatter_add" : "index_add",
                 em_dtype_name(dt), ci, layout_name(l));
        double *sv = gen(dt, dt == EM_U8 ? V_POSITIVE : V_GENERAL, sn), *xv = malloc(sizeof(double) * (size_t)sn);
        em_tensor *src = make_tensor(TG, dt, ss, sv, l ? L_TRANSPOSED : L_CONTIG), *ix;
        if (scatter) {
            for (int64_t i = 0; i < sn; i++) xv[i] = lcg() % os.d[dim];
            ix = make_tensor(TG, EM_I64, ss, xv, l ? L_STRIDED : L_CONTIG);
        } else {
            for (int64_t i = 0; i < L; i++) xv[i] = (double)(idx[i] % os.d[dim]);
            ix = make_tensor(TG, EM_I64, (em_shape){1, {L}}, xv, l ? L_STRIDED : L_CONTIG);
        }
        outbuf ob = make_out(TG, dt, os, l ? L_STRIDED : L_OFFSET);
        double *ref = read_tensor(ob.view); /* starts from the view's current values */
        int64_t cc[EM_MAX_DIMS];
        for (int64_t i = 0; i < sn; i++) {
            coords_of(i, ss, cc);
            cc[dim] = (int64_t)(scatter ? xv[i] : xv[cc[dim]]);
            int64_t o = index_of(cc, os);
            ref[o] = dt_round(dt, ref[o] + sv[i]);
        }
        em_status st = scatter ? be_scatter_add(TG->be, ob.view, dim, ix, src)
                               : be_index_add(TG->be, ob.view, dim, ix, src);
        if (run_ok(TG, scatter ? "scatter_add" : "index_add", st)) CHECK(check_out(&ob, ref, nmse_limit(dt)));
        else free(ob.before);
        (void)on;
        free(sv);
        free(xv);
        free(ref);
        em_scope_end(s);
    }
}
static void test_index_add(void) { test_accumulate(false); }
static void test_scatter_add(void) { test_accumulate(true); }

int main(void) {
    targets_init();
    printf("devices:");
    for (int i = 0; i < g_ntargets; i++) printf(" %s", g_targets[i].name);
    printf("\n");
    if (two_device_child()) CHECK(em_device_count(EM_OPENCL) == 2);
    RUN(test_reduce);
    RUN(test_matmul);
    RUN(test_softmax);
    RUN(test_index_select);
    RUN(test_gather);
    RUN(test_index_add);
    RUN(test_scatter_add);
    if (!two_device_child()) RUN(test_two_opencl_devices);
    printf("declined (failed when required, else skipped): %d cases, %d (op, dtype) pairs, %d missing "
           "entry points\n", g_declined, g_declined_pairs, g_declined_entries);
    declines_report();
    return test_summary();
}
