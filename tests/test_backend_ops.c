/* Backend conformance, in the spirit of ggml's test-backend-ops: every op of backend.h, on
 * every available device (cpu, each opencl:N, each cuda:N), for every dtype the backend
 * says it supports and in several layouts (contiguous, transposed, strided, offset views,
 * broadcast inputs, empty, odd and large sizes), against a naive reference computed here in
 * double. Errors are normalized squared errors with a limit per dtype; NaN/Inf must match;
 * integers must be exact. Each output is a view inside a larger tensor (margins and gaps):
 * elements outside the view must come back unchanged (the sentinel).
 *
 * Ops are called through each backend's table (with inputs prepared as core prepares them:
 * broadcast as stride-0 views) so that the outputs can be sentinel views; a second pass runs
 * the public API on every device to check the whole path. With PoCL, the test re-runs itself
 * with POCL_DEVICES="pthread pthread" for two OpenCL devices: copies opencl:0 -> opencl:1,
 * the device-mismatch error, and the whole suite on opencl:1. */
#include "backend_ops_util.h"
#include "backend_calls.h"

#define FOR_TARGETS for (int ti = 0; ti < g_ntargets; ti++)
#define TG (&g_targets[ti])

static int g_unsupported; /* public API expressions a backend declines: reported, not counted */

static bool supported(const target *tg, em_op op, em_dtype dt) { return op_supported(tg, op, dt); }

static const em_shape SHAPES[] = {{1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 5}}, {0, {0}}};
#define N_SHAPES 5

/* ---------------------------------------------------------------- fill, fill_affine */

static void test_fill(void) {
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (int si = 0; si < N_SHAPES; si++)
        for (int l = 0; l < L_COUNT; l++) {
            em_dtype dt = ALL_DTYPES[di];
            em_shape sh = SHAPES[si];
            int64_t n = shape_numel(sh);
            if (!has_entry(TG, be_has(TG->be, EM_OP_FILL, dt) && be_has(TG->be, EM_OP_FILL_AFFINE, dt), "fill")) continue;
            em_scope s = em_scope_begin();
            double value = is_float(dt) ? -2.25 : dt == EM_BOOL ? 1 : 7;
            double start = is_float(dt) ? -3 : dt == EM_U8 ? 1 : -3, step = is_float(dt) ? 0.5 : 2;
            double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
            snprintf(g_ctx, sizeof g_ctx, "%s fill %s %s", TG->name, em_dtype_name(dt), layout_name(l));
            outbuf ob = make_out(TG, dt, sh, (layout)l);
            for (int64_t i = 0; i < n; i++) ref[i] = dt_round(dt, value);
            CHECK(backend_ok(be_fill(TG->be, ob.view, value)) && check_out(&ob, ref, 0));
            snprintf(g_ctx, sizeof g_ctx, "%s fill_affine %s %s", TG->name, em_dtype_name(dt),
                     layout_name(l));
            outbuf oa = make_out(TG, dt, sh, (layout)l);
            for (int64_t i = 0; i < n; i++) ref[i] = dt_round(dt, start + (double)i * step);
            CHECK(backend_ok(be_fill_affine(TG->be, oa.view, start, step)) &&
                  check_out(&oa, ref, nmse_limit(dt)));
            free(ob.before);
            free(oa.before);
            free(ref);
            em_scope_end(s);
        }
}

/* ---------------------------------------------------------------- copy and casts */

static void test_copy_cast(void) {
    const layout in_l[] = {L_CONTIG, L_TRANSPOSED, L_OFFSET, L_STRIDED};
    const layout out_l[] = {L_CONTIG, L_STRIDED, L_CONTIG, L_OFFSET};
    const em_shape shapes[] = {{2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 3}}};
    FOR_TARGETS for (int a = 0; a < N_DTYPES; a++) for (int b = 0; b < N_DTYPES; b++)
        for (int si = 0; si < 3; si++) for (int li = 0; li < 4; li++) {
            em_dtype src = ALL_DTYPES[a], dst = ALL_DTYPES[b];
            em_shape sh = shapes[si];
            if (!has_entry(TG, be_has(TG->be, EM_OP_COPY, dst), "copy")) continue;
            int64_t n = shape_numel(sh);
            em_scope s = em_scope_begin();
            snprintf(g_ctx, sizeof g_ctx, "%s copy %s -> %s, %s -> %s", TG->name, em_dtype_name(src),
                     em_dtype_name(dst), layout_name(in_l[li]), layout_name(out_l[li]));
            double *v = gen(src, dst == EM_U8 ? V_POSITIVE : V_GENERAL, n);
            double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
            for (int64_t i = 0; i < n; i++) ref[i] = dt_round(dst, v[i]);
            em_tensor *in = make_tensor(TG, src, sh, v, in_l[li]);
            outbuf ob = make_out(TG, dst, sh, out_l[li]);
            CHECK(backend_ok(be_copy(TG->be, ob.view, in)) && check_out(&ob, ref, nmse_limit(dst)));
            free(v);
            free(ref);
            em_scope_end(s);
        }
}

/* ---------------------------------------------------------------- unary */

static double ipow(double b, double e) {
    double r = 1;
    for (int i = 0; i < (int)e; i++) r *= b;
    return r;
}

static double ref_unary(em_op op, double x, double p0, double p1, bool fl) {
    switch (op) {
    case EM_OP_NEG: return -x;
    case EM_OP_ABS: return fabs(x);
    case EM_OP_EXP: return exp(x);
    case EM_OP_LOG: return log(x);
    case EM_OP_SQRT: return sqrt(x);
    case EM_OP_RSQRT: return 1 / sqrt(x);
    case EM_OP_TANH: return tanh(x);
    case EM_OP_SIGMOID: return 1 / (1 + exp(-x));
    case EM_OP_RELU: return isnan(x) ? x : x > 0 ? x : 0;
    case EM_OP_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case EM_OP_SIGN: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case EM_OP_SQUARE: return x * x;
    case EM_OP_RECIPROCAL: return 1 / x;
    case EM_OP_ADD_SCALAR: return x + p0;
    case EM_OP_MUL_SCALAR: return x * p0;
    case EM_OP_DIV_SCALAR: return x / p0;
    case EM_OP_RSUB_SCALAR: return p0 - x;
    case EM_OP_POW_SCALAR: return fl ? pow(x, p0) : ipow(x, p0);
    case EM_OP_CLAMP: return isnan(x) ? x : x < p0 ? p0 : x > p1 ? p1 : x;
    default: return NAN;
    }
}

static value_kind unary_domain(em_op op) {
    switch (op) {
    case EM_OP_LOG: case EM_OP_SQRT: case EM_OP_RSQRT: case EM_OP_POW_SCALAR: return V_POSITIVE;
    case EM_OP_RECIPROCAL: return V_AWAY0;
    default: return V_GENERAL;
    }
}

static void unary_params(em_op op, bool fl, double *p) {
    p[0] = p[1] = 0;
    switch (op) {
    case EM_OP_ADD_SCALAR: p[0] = fl ? 1.5 : 3; break;
    case EM_OP_MUL_SCALAR: p[0] = fl ? 2.5 : -2; break;
    case EM_OP_DIV_SCALAR: p[0] = 4; break;
    case EM_OP_RSUB_SCALAR: p[0] = fl ? 1.25 : 5; break;
    case EM_OP_POW_SCALAR: p[0] = fl ? 2.5 : 3; break;
    case EM_OP_CLAMP: p[0] = fl ? -1.5 : -3; p[1] = fl ? 2.25 : 4; break;
    default: break;
    }
}

/* one unary case: input of shape `in_sh` (expanded to sh when they differ) */
static void unary_case(const target *tg, em_op op, em_dtype dt, em_shape sh, em_shape in_sh,
                       layout l, const double *special, int nspecial) {
    bool fl = is_float(dt);
    int64_t n = shape_numel(sh), in_n = shape_numel(in_sh);
    double p[2];
    unary_params(op, fl, p);
    em_scope s = em_scope_begin();
    double *v = gen(dt, unary_domain(op), in_n);
    for (int i = 0; i < nspecial && i < in_n; i++) v[i] = dt_round(dt, special[i]);
    em_tensor *in = make_tensor(tg, dt, in_sh, v, l);
    if (in_n != n) in = em_expand(in, sh);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        /* broadcasting [1, C] -> [R, C]: element i reads column i % C */
        double x = v[in_n == n ? i : i % (in_n ? in_n : 1)];
        ref[i] = dt_round(dt, ref_unary(op, x, p[0], p[1], fl));
    }
    outbuf ob = make_out(tg, dt, sh, l == L_TRANSPOSED ? L_CONTIG : l);
    CHECK(backend_ok(be_unary(tg->be, op, ob.view, in, p)) && check_out(&ob, ref, nmse_limit(dt)));
    free(v);
    free(ref);
    em_scope_end(s);
}

static void test_unary(void) {
    static const double special[] = {NAN, -INFINITY, INFINITY, -0.0, 0.0, 2.5, -2.5, 1.0};
    FOR_TARGETS for (int op = EM_OP_NEG; op <= EM_OP_CLAMP; op++) for (int di = 0; di < N_DTYPES; di++) {
        em_dtype dt = ALL_DTYPES[di];
        if (!supported(TG, (em_op)op, dt)) continue;
        for (int si = 0; si < N_SHAPES; si++) for (int l = 0; l < L_COUNT; l++) {
            snprintf(g_ctx, sizeof g_ctx, "%s unary op %d %s shape#%d", TG->name, op,
                     layout_name(l), si);
            unary_case(TG, (em_op)op, dt, SHAPES[si], SHAPES[si], (layout)l, NULL, 0);
        }
        snprintf(g_ctx, sizeof g_ctx, "%s unary op %d broadcast input", TG->name, op);
        unary_case(TG, (em_op)op, dt, EM_SHAPE(3, 5), EM_SHAPE(1, 5), L_CONTIG, NULL, 0);
        if (dt == EM_F32 || dt == EM_F64) {
            bool domain_ok = op == EM_OP_NEG || op == EM_OP_ABS || op == EM_OP_EXP ||
                             op == EM_OP_TANH || op == EM_OP_SIGMOID || op == EM_OP_RELU ||
                             op == EM_OP_SIGN || op == EM_OP_SQUARE || op == EM_OP_CLAMP ||
                             op == EM_OP_ADD_SCALAR || op == EM_OP_MUL_SCALAR;
            if (domain_ok) {
                snprintf(g_ctx, sizeof g_ctx, "%s unary op %d NaN/Inf/-0", TG->name, op);
                unary_case(TG, (em_op)op, dt, EM_SHAPE(8), EM_SHAPE(8), L_CONTIG, special, 8);
            }
        }
        if (dt == EM_F32 || dt == EM_F16) {
            snprintf(g_ctx, sizeof g_ctx, "%s unary op %d large", TG->name, op);
            unary_case(TG, (em_op)op, dt, EM_SHAPE(65537), EM_SHAPE(65537), L_CONTIG, NULL, 0);
        }
    }
}

/* ---------------------------------------------------------------- binary, where */

static double ref_binary(em_op op, double a, double b, bool fl) {
    switch (op) {
    case EM_OP_ADD: return a + b;
    case EM_OP_SUB: return a - b;
    case EM_OP_MUL: return a * b;
    case EM_OP_DIV: return a / b;
    case EM_OP_POW: return fl ? pow(a, b) : ipow(a, b);
    case EM_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case EM_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    case EM_OP_EQ: return a == b;
    case EM_OP_NE: return a != b;
    case EM_OP_LT: return a < b;
    case EM_OP_LE: return a <= b;
    case EM_OP_GT: return a > b;
    case EM_OP_GE: return a >= b;
    case EM_OP_LOGICAL_AND: return a != 0 && b != 0;
    default: return NAN;
    }
}

typedef struct bcase { em_shape out, a, b; layout la, lb, lo; } bcase;

static void binary_case(const target *tg, em_op op, em_dtype dt, const bcase *c,
                        const double *sa, const double *sb, int nspecial) {
    bool fl = is_float(dt), cmp = op >= EM_OP_EQ;
    em_dtype odt = cmp ? EM_BOOL : dt;
    int64_t n = shape_numel(c->out), na = shape_numel(c->a), nb = shape_numel(c->b);
    em_scope s = em_scope_begin();
    value_kind ka = op == EM_OP_POW ? V_POSITIVE : cmp && fl ? V_SMALLINT : V_GENERAL;
    value_kind kb = op == EM_OP_DIV ? V_AWAY0 : op == EM_OP_POW ? (fl ? V_UNIT : V_POSITIVE)
                    : cmp && fl ? V_SMALLINT : V_GENERAL;
    double *va = gen(dt, ka, na), *vb = gen(dt, kb, nb);
    for (int i = 0; i < nspecial; i++) {
        va[i] = dt_round(dt, sa[i]);
        vb[i] = dt_round(dt, sb[i]);
    }
    em_tensor *a = make_tensor(tg, dt, c->a, va, c->la), *b = make_tensor(tg, dt, c->b, vb, c->lb);
    if (na != n) a = em_expand(a, c->out);
    if (nb != n) b = em_expand(b, c->out);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        /* row-major index -> broadcast index for size-1 dims */
        int64_t ia = 0, ib = 0, rem = i, ma = 1, mb = 1;
        for (int d = c->out.ndim - 1; d >= 0; d--) {
            int64_t coord = rem % c->out.d[d];
            rem /= c->out.d[d];
            if (c->a.d[d] != 1) ia += coord * ma;
            if (c->b.d[d] != 1) ib += coord * mb;
            ma *= c->a.d[d];
            mb *= c->b.d[d];
        }
        ref[i] = dt_round(odt, ref_binary(op, va[ia], vb[ib], fl));
    }
    outbuf ob = make_out(tg, odt, c->out, c->lo);
    CHECK(backend_ok(be_binary(tg->be, op, ob.view, a, b)) && check_out(&ob, ref, nmse_limit(odt)));
    free(va);
    free(vb);
    free(ref);
    em_scope_end(s);
}

static const bcase BCASES[] = {
    {{2, {3, 5}}, {2, {3, 5}}, {2, {3, 5}}, L_CONTIG, L_CONTIG, L_CONTIG},
    {{2, {3, 5}}, {2, {3, 5}}, {2, {3, 5}}, L_TRANSPOSED, L_STRIDED, L_STRIDED},
    {{2, {3, 5}}, {2, {3, 5}}, {2, {1, 5}}, L_OFFSET, L_CONTIG, L_CONTIG},
    {{3, {2, 3, 4}}, {3, {2, 1, 4}}, {3, {2, 3, 4}}, L_CONTIG, L_TRANSPOSED, L_OFFSET},
    {{3, {2, 3, 4}}, {3, {2, 3, 1}}, {3, {1, 3, 4}}, L_STRIDED, L_CONTIG, L_CONTIG},
    {{1, {7}}, {1, {7}}, {1, {7}}, L_OFFSET, L_STRIDED, L_STRIDED},
    {{2, {0, 5}}, {2, {0, 5}}, {2, {1, 5}}, L_CONTIG, L_CONTIG, L_CONTIG},
    {{0, {0}}, {0, {0}}, {0, {0}}, L_CONTIG, L_CONTIG, L_CONTIG},
};

static void test_binary(void) {
    static const double sa[] = {NAN, 1, INFINITY, -INFINITY, 2, -0.0};
    static const double sb[] = {1, NAN, 3, -INFINITY, 2, 0.0};
    FOR_TARGETS for (int op = EM_OP_ADD; op <= EM_OP_LOGICAL_AND; op++) for (int di = 0; di < N_DTYPES; di++) {
        em_dtype dt = ALL_DTYPES[di];
        if (!supported(TG, (em_op)op, dt)) continue;
        for (size_t ci = 0; ci < sizeof BCASES / sizeof BCASES[0]; ci++) {
            snprintf(g_ctx, sizeof g_ctx, "%s binary op %d case %zu", TG->name, op, ci);
            binary_case(TG, (em_op)op, dt, &BCASES[ci], NULL, NULL, 0);
        }
        bool domain_ok = op != EM_OP_POW && op != EM_OP_DIV;
        if ((dt == EM_F32 || dt == EM_F64) && domain_ok) {
            snprintf(g_ctx, sizeof g_ctx, "%s binary op %d NaN/Inf", TG->name, op);
            bcase c = {{1, {6}}, {1, {6}}, {1, {6}}, L_CONTIG, L_CONTIG, L_CONTIG};
            binary_case(TG, (em_op)op, dt, &c, sa, sb, 6);
        }
        if (dt == EM_F32 && op == EM_OP_ADD) {
            snprintf(g_ctx, sizeof g_ctx, "%s binary add large", TG->name);
            bcase c = {{2, {257, 255}}, {2, {257, 255}}, {2, {1, 255}}, L_CONTIG, L_CONTIG, L_CONTIG};
            binary_case(TG, (em_op)op, dt, &c, NULL, NULL, 0);
        }
    }
}

static void test_where(void) {
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (size_t ci = 0; ci < sizeof BCASES / sizeof BCASES[0]; ci++) {
        em_dtype dt = ALL_DTYPES[di];
        const bcase *c = &BCASES[ci];
        int64_t n = shape_numel(c->out), na = shape_numel(c->a), nb = shape_numel(c->b);
        if (!has_entry(TG, be_has(TG->be, EM_OP_WHERE, dt), "where")) continue;
        em_scope s = em_scope_begin();
        snprintf(g_ctx, sizeof g_ctx, "%s where %s case %zu", TG->name, em_dtype_name(dt), ci);
        double *vc = gen(EM_BOOL, V_GENERAL, na), *va = gen(dt, V_GENERAL, nb), *vb = gen(dt, V_GENERAL, n);
        /* cond has a's shape and layout, a has b's, b is full size */
        em_tensor *cond = make_tensor(TG, EM_BOOL, c->a, vc, c->la);
        em_tensor *a = make_tensor(TG, dt, c->b, va, c->lb);
        em_tensor *b = make_tensor(TG, dt, c->out, vb, c->lo == L_STRIDED ? L_OFFSET : L_STRIDED);
        if (na != n) cond = em_expand(cond, c->out);
        if (nb != n) a = em_expand(a, c->out);
        double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) {
            int64_t ic = 0, ia = 0, rem = i, mc = 1, ma = 1;
            for (int d = c->out.ndim - 1; d >= 0; d--) {
                int64_t coord = rem % c->out.d[d];
                rem /= c->out.d[d];
                if (c->a.d[d] != 1) ic += coord * mc;
                if (c->b.d[d] != 1) ia += coord * ma;
                mc *= c->a.d[d];
                ma *= c->b.d[d];
            }
            ref[i] = vc[ic] ? va[ia] : vb[i];
        }
        outbuf ob = make_out(TG, dt, c->out, c->lo);
        CHECK(backend_ok(be_where(TG->be, ob.view, cond, a, b)) && check_out(&ob, ref, 0));
        free(vc);
        free(va);
        free(vb);
        free(ref);
        em_scope_end(s);
    }
}

/* ---------------------------------------------------------------- rng */

/* The same seed and offset give the same numbers on every device, bit for bit for every
 * kind (normal too: philox.h's Box-Muller uses no device log/sqrt/cos). */
static void test_rng_matches_cpu(void) {
    const target *cpu = &g_targets[0];
    FOR_TARGETS for (int di = 0; di < N_DTYPES; di++) for (int kind = 0; kind < 4; kind++) {
        em_dtype dt = ALL_DTYPES[di];
        if (ti == 0 || !has_entry(TG, be_has(TG->be, EM_OP_RNG, dt) && be_has(cpu->be, EM_OP_RNG, dt), "rng")) continue;
        em_scope s = em_scope_begin();
        double p0 = kind == EM_RNG_RANDINT ? -5 : kind == EM_RNG_BERNOULLI ? 0.3 : 0.5;
        double p1 = kind == EM_RNG_RANDINT ? (dt == EM_U8 || dt == EM_BOOL ? 2 : 1000) : 2.0;
        if ((dt == EM_U8 || dt == EM_BOOL) && kind == EM_RNG_RANDINT) p0 = 0;
        if (!is_float(dt) && kind != EM_RNG_RANDINT && kind != EM_RNG_BERNOULLI) { em_scope_end(s); continue; }
        snprintf(g_ctx, sizeof g_ctx, "%s rng kind %d %s vs cpu", TG->name, kind, em_dtype_name(dt));
        em_shape sh = EM_SHAPE(37, 29);
        outbuf oc = make_out(cpu, dt, sh, L_CONTIG), od = make_out(TG, dt, sh, L_STRIDED);
        bool ok = backend_ok(be_rng(cpu->be, oc.view, (em_rng_kind)kind, 1234567, 4096 + 3, p0, p1)) &&
                  backend_ok(be_rng(TG->be, od.view, (em_rng_kind)kind, 1234567, 4096 + 3, p0, p1));
        if (ok) {
            double *want = read_tensor(oc.view);
            ok = check_out(&od, want, 0);
            /* the CPU's own numbers must look like the distribution (not all equal) */
            int64_t distinct = 0;
            for (int64_t i = 1; i < shape_numel(sh); i++) distinct += want[i] != want[0];
            if (distinct == 0) {
                fprintf(stderr, "  %s: all %lld numbers are equal\n", g_ctx, (long long)shape_numel(sh));
                ok = false;
            }
            free(want);
        }
        CHECK(ok);
        free(oc.before);
        free(od.before);
        em_scope_end(s);
    }
}

/* ---------------------------------------------------------------- the public API */

/* The whole path (core's dispatch, promotion, broadcasting, views) on every device, each
 * result against a host reference. A backend that declines an op (EM_ERR_NOT_SUPPORTED)
 * is reported, not counted as passing. */
static void public_refs(const double *a, const double *b, const int64_t *idx, double **ref) {
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 12; j++) ref[0][i * 12 + j] = (float)((a[i * 12 + j] > 0 ? a[i * 12 + j] : 0) + b[j]);
    for (int i = 0; i < 5; i++) {
        double s = 0;
        for (int j = 0; j < 12; j++) s += a[i * 12 + j] * 0.5;
        ref[1][i] = (float)s;
    }
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 5; k++) {
            double s = 0;
            for (int j = 0; j < 12; j++) s += a[i * 12 + j] * a[k * 12 + j];
            ref[2][i * 5 + k] = (float)s;
        }
    for (int r = 0; r < 5; r++) { /* log_softmax over dim 0 of a^T = over row r of a */
        double m = -INFINITY, s = 0;
        for (int j = 0; j < 12; j++) m = fmax(m, a[r * 12 + j]);
        for (int j = 0; j < 12; j++) s += exp(a[r * 12 + j] - m);
        for (int j = 0; j < 12; j++) ref[3][j * 5 + r] = (float)(a[r * 12 + j] - m - log(s));
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 12; j++) ref[4][i * 12 + j] = (float)a[idx[i] * 12 + j];
    for (int i = 0; i < 5; i++) {
        int best = 0;
        for (int j = 1; j < 12; j++)
            if (a[i * 12 + j] > a[i * 12 + best]) best = j;
        ref[5][i] = best;
    }
    for (int i = 0; i < 60; i++) ref[6][i] = a[i] > b[i % 12];
    for (int j = 0; j < 12; j++) {
        double s = 0;
        for (int i = 0; i < 5; i++) s += dt_round(EM_F16, a[i * 12 + j]);
        ref[7][j] = dt_round(EM_F16, s / 5);
    }
}

static void test_public_api(void) {
    double va[60], vb[12], *ref[8];
    for (int i = 0; i < 60; i++) va[i] = gen_value(EM_F32, V_SMALLINT) + 0.25 * (i % 4);
    for (int i = 0; i < 12; i++) vb[i] = gen_value(EM_F32, V_GENERAL);
    static const int64_t idx[4] = {2, 0, 2, 1};
    static const int64_t numel[8] = {60, 5, 25, 60, 48, 5, 60, 12};
    static const em_dtype dts[8] = {EM_F32, EM_F32, EM_F32, EM_F32, EM_F32, EM_I64, EM_I32, EM_F16};
    for (int k = 0; k < 8; k++) ref[k] = malloc(sizeof(double) * (size_t)numel[k]);
    public_refs(va, vb, idx, ref);
    FOR_TARGETS {
        em_scope s = em_scope_begin();
        em_opts o = EM_OPTS(.device = TG->dev);
        em_tensor *a = em_from_data(va, EM_F64, EM_SHAPE(5, 12), o);
        em_tensor *b = em_from_data(vb, EM_F64, EM_SHAPE(12), o);
        em_tensor *ix = em_from_data(idx, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64, .device = TG->dev));
        for (int k = 0; k < 8; k++) {
            em_clear_error();
            em_tensor *got = NULL;
            switch (k) {
            case 0: got = em_add(em_relu(a), b); break;
            case 1: got = em_sum(em_mul_scalar(a, 0.5), EM_DIMS(1), false); break;
            case 2: got = em_matmul(a, em_reshape(em_transpose(a, 0, 1), EM_SHAPE(12, 5))); break;
            case 3: got = em_log_softmax(em_transpose(a, 0, 1), 0); break;
            case 4: got = em_index_select(a, 0, ix); break;
            case 5: got = em_argmax(a, 1, false); break;
            case 6: got = em_to_dtype(em_gt(a, b), EM_I32); break;
            default: got = em_mean(em_to_dtype(a, EM_F16), EM_DIMS(0), true); break;
            }
            snprintf(g_ctx, sizeof g_ctx, "%s public API expression %d", TG->name, k);
            if (!got && em_last_status() == EM_ERR_NOT_SUPPORTED) {
                op_declined(TG->be->name, "public_api", g_ctx, em_last_error());
                em_clear_error();
                g_unsupported++;
                continue;
            }
            if (!got) {
                fprintf(stderr, "  %s: %s\n", g_ctx, em_last_error());
                CHECK(got != NULL);
                continue;
            }
            CHECK(em_dtype_of(got) == dts[k]);
            CHECK(em_device_equal(em_device_of(got), TG->dev));
            CHECK(em_numel(got) == numel[k]);
            if (em_numel(got) != numel[k]) continue;
            double *g = read_tensor(got);
            CHECK(compare_values(g, ref[k], numel[k], dts[k], nmse_limit(dts[k])));
            free(g);
        }
        em_clear_error();
        em_scope_end(s);
    }
    for (int k = 0; k < 8; k++) free(ref[k]);
    /* random tensors: the same on every device for the same seed */
    em_scope s = em_scope_begin();
    em_tensor *want = NULL;
    FOR_TARGETS {
        em_manual_seed(42);
        em_tensor *r = em_rand(EM_SHAPE(1000), EM_OPTS(.device = TG->dev));
        CHECK(r != NULL);
        if (!r) break;
        if (ti == 0) want = r;
        else {
            snprintf(g_ctx, sizeof g_ctx, "%s em_rand vs cpu", TG->name);
            double *g = read_tensor(r), *w = read_tensor(want);
            CHECK(compare_values(g, w, 1000, EM_F32, 0));
            free(g);
            free(w);
        }
    }
    em_scope_end(s);
}

/* ---------------------------------------------------------------- two OpenCL devices */

static void test_cross_device(void) {
    if (em_device_count(EM_OPENCL) < 2) return;
    em_scope s = em_scope_begin();
    em_device d0 = EM_DEVICE(EM_OPENCL, 0), d1 = EM_DEVICE(EM_OPENCL, 1);
    double v[64];
    for (int i = 0; i < 64; i++) v[i] = gen_value(EM_F32, V_GENERAL);
    em_tensor *a = em_from_data(v, EM_F64, EM_SHAPE(8, 8), EM_OPTS(.device = d0));
    em_tensor *a1 = em_to(a, d1);
    em_tensor *t1 = em_to(em_transpose(a, 0, 1), d1); /* non-contiguous source */
    CHECK(a1 && em_device_equal(em_device_of(a1), d1));
    snprintf(g_ctx, sizeof g_ctx, "copy opencl:0 -> opencl:1");
    double *g = read_tensor(a1), *gt = read_tensor(t1), ref[64], reft[64];
    for (int i = 0; i < 64; i++) {
        ref[i] = (float)v[i];
        reft[i] = (float)v[(i % 8) * 8 + i / 8];
    }
    CHECK(compare_values(g, ref, 64, EM_F32, 0) && compare_values(gt, reft, 64, EM_F32, 0));
    free(g);
    free(gt);
    /* back again after an op on device 1, then an op on device 0 reading it */
    em_tensor *b0 = em_to(em_mul_scalar(a1, 2.0), d0);
    em_tensor *c = em_sub(b0, a);
    double *gc = read_tensor(c);
    snprintf(g_ctx, sizeof g_ctx, "opencl:1 -> opencl:0 round trip");
    CHECK(compare_values(gc, ref, 64, EM_F32, 0));
    free(gc);
    /* ops on tensors of two devices are refused, naming both */
    CHECK(em_add(a, a1) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl:1");
    CHECK(em_matmul(a1, a) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl:0");
    em_scope_end(s);
}

int main(void) {
    targets_init();
    printf("devices:");
    for (int i = 0; i < g_ntargets; i++) printf(" %s", g_targets[i].name);
    printf("\n");
    if (two_device_child()) CHECK(em_device_count(EM_OPENCL) == 2);
    RUN(test_fill);
    RUN(test_copy_cast);
    RUN(test_unary);
    RUN(test_binary);
    RUN(test_where);
    RUN(test_rng_matches_cpu);
    RUN(test_public_api);
    RUN(test_cross_device);
    if (!two_device_child()) RUN(test_two_opencl_devices);  /* backend_ops_util.h */
    printf("declined (failed when required, else skipped): %d (op, dtype) pairs by supports_op, %d public "
           "API expressions, %d missing entry points\n", g_declined_pairs, g_unsupported, g_declined_entries);
    declines_report();
    return test_summary();
}
