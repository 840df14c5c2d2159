/* CPU backend: unary, binary and where over every dtype and layout, against references
 * computed here in double (floats) or exact wrapping int64 (integers). */
#include "test_cpu_util.h"
#include "backend_calls.h"

typedef struct tshape { int ndim; int64_t d[3]; } tshape;
static const tshape shapes[] = {
    {1, {0}}, {1, {1}}, {1, {7}}, {1, {1023}}, {2, {3, 5}}, {3, {4, 1, 7}}, {2, {33, 31}}, {0, {0}}, {1, {100003}},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
#define BIG(s) (shapes[s].d[0] > 5000)
/* the big size runs for one dtype of each kind (it exercises threading, not conversions) */
#define BIG_DTYPE(dt) ((dt) == EM_F32 || (dt) == EM_BF16 || (dt) == EM_I32)

static const char *op_name(em_op op) {
    static const char *const n[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
        "gelu", "sign", "square", "reciprocal", "add_scalar", "mul_scalar", "div_scalar", "rsub_scalar",
        "pow_scalar", "clamp", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
        "le", "gt", "ge", "logical_and"};
    return n[op];
}

static bool is_int(em_dtype dt) { return dt == EM_I64 || dt == EM_I32 || dt == EM_U8 || dt == EM_BOOL; }

/* An int64 result stored into dt (two's complement wrap; bool: nonzero). */
static int64_t wrap_to(uint64_t v, em_dtype dt) {
    switch (dt) {
    case EM_I32: return (int32_t)(uint32_t)v;
    case EM_U8: return (uint8_t)v;
    case EM_BOOL: return v != 0;
    default: return (int64_t)v;
    }
}
static double round_to(double v, em_dtype dt) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F16: return em_f16_to_f32(em_f32_to_f16((float)v));
    case EM_BF16: return em_bf16_to_f32(em_f32_to_bf16((float)v));
    default: return v;
    }
}

static double ref_unary_f(em_op op, double v, const double *p) {
    switch (op) {
    case EM_OP_NEG: return -v;
    case EM_OP_ABS: return fabs(v);
    case EM_OP_EXP: return exp(v);
    case EM_OP_LOG: return log(v);
    case EM_OP_SQRT: return sqrt(v);
    case EM_OP_RSQRT: return 1 / sqrt(v);
    case EM_OP_TANH: return tanh(v);
    case EM_OP_SIGMOID: return 1 / (1 + exp(-v));
    case EM_OP_RELU: return v < 0 ? 0 : v;
    case EM_OP_GELU: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case EM_OP_SIGN: return v > 0 ? 1 : v < 0 ? -1 : 0;
    case EM_OP_SQUARE: return v * v;
    case EM_OP_RECIPROCAL: return 1 / v;
    case EM_OP_ADD_SCALAR: return v + p[0];
    case EM_OP_MUL_SCALAR: return v * p[0];
    case EM_OP_DIV_SCALAR: return v / p[0];
    case EM_OP_RSUB_SCALAR: return p[0] - v;
    case EM_OP_POW_SCALAR: return pow(v, p[0]);
    default: return v < p[0] ? p[0] : v > p[1] ? p[1] : v; /* clamp */
    }
}

static uint64_t ipow_ref(int64_t a, int64_t e) {
    if (e < 0) return a == 1 ? 1 : a == -1 ? (uint64_t)((e % 2) ? -1 : 1) : 0;
    uint64_t r = 1;
    for (int64_t i = 0; i < e; i++) r *= (uint64_t)a;
    return r;
}

static uint64_t ref_unary_i(em_op op, int64_t v, const double *p) {
    int64_t a = p ? (int64_t)p[0] : 0, b = p ? (int64_t)p[1] : 0;
    switch (op) {
    case EM_OP_NEG: return 0 - (uint64_t)v;
    case EM_OP_ABS: return v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    case EM_OP_SIGN: return (uint64_t)(int64_t)((v > 0) - (v < 0));
    case EM_OP_SQUARE: return (uint64_t)v * (uint64_t)v;
    case EM_OP_RELU: return v < 0 ? 0 : (uint64_t)v;
    case EM_OP_ADD_SCALAR: return (uint64_t)v + (uint64_t)a;
    case EM_OP_MUL_SCALAR: return (uint64_t)v * (uint64_t)a;
    case EM_OP_RSUB_SCALAR: return (uint64_t)a - (uint64_t)v;
    case EM_OP_POW_SCALAR: return ipow_ref(v, a);
    default: return (uint64_t)(v < a ? a : v > b ? b : v);
    }
}

/* Inputs in a range where the op is defined for the dtype. */
static void fill_inputs(ttensor *x, em_op op, int which) {
    em_dtype dt = x->t.dtype;
    if (dt == EM_U8) { tt_fill_random(x, 0, 255); return; }
    if (is_int(dt)) {
        if (op == EM_OP_POW && which == 1) tt_fill_random(x, -2, 6);
        else if (op == EM_OP_POW) tt_fill_random(x, -5, 5);
        else tt_fill_random(x, -100, 100);
        return;
    }
    if (op == EM_OP_LOG || op == EM_OP_SQRT || op == EM_OP_RSQRT || (op == EM_OP_POW && which == 0) ||
        op == EM_OP_POW_SCALAR)
        tt_fill_random(x, 0.25, 8);
    else if (op == EM_OP_POW)
        tt_fill_random(x, -2, 2);
    else
        tt_fill_random(x, -6, 6);
}

static const double unary_params[EM_OP_CLAMP + 1][2] = {
    [EM_OP_ADD_SCALAR] = {3, 0}, [EM_OP_MUL_SCALAR] = {-2, 0}, [EM_OP_DIV_SCALAR] = {4, 0},
    [EM_OP_RSUB_SCALAR] = {5, 0}, [EM_OP_POW_SCALAR] = {3, 0},  [EM_OP_CLAMP] = {-2, 3},
};

static int check_unary(em_op op, em_dtype dt, int s, int li, int lo, const double *p, int *bad) {
    const tshape *sh = &shapes[s];
    ttensor *in = tt_make(dt, sh->ndim, sh->d, (tlayout)li);
    ttensor *out = tt_make(dt, sh->ndim, sh->d, (tlayout)lo);
    fill_inputs(in, op, 0);
    CHECK_OK(be_unary(&em__cpu_backend, op, &out->t, &in->t, p));
    int64_t n = tt_numel(&out->t);
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        double got = tt_get(out, i), want;
        if (is_int(dt)) {
            want = (double)wrap_to(ref_unary_i(op, tt_get_i64(in, i), p), dt);
            ok = tt_get_i64(out, i) == (int64_t)want;
        } else {
            double r = ref_unary_f(op, tt_get(in, i), p);
            want = round_to(r, dt);
            ok = tt_close(got, want, tt_tol(dt, r));
        }
        if (!ok && (*bad)++ < 10)
            fprintf(stderr, "  %s %s shape#%d %s->%s [%lld] in %g: got %.9g want %.9g\n", em_dtype_name(dt),
                    op_name(op), s, tlayout_name[li], tlayout_name[lo], (long long)i, tt_get(in, i), got, want);
    }
    if (!tt_guard_ok(out) && (*bad)++ < 10) fprintf(stderr, "  unary %s: guard bytes changed\n", op_name(op));
    tt_free(in);
    tt_free(out);
    return 0;
}

/* (in, out) and (a, b, out) layout combinations: every layout on every operand position,
 * plus the mixed ones that take the block-conversion paths. */
static const int pairs[][2] = {
    {L_CONTIG, L_CONTIG}, {L_BCAST0, L_CONTIG}, {L_TRANSPOSED, L_CONTIG}, {L_SLICED, L_SLICED},
    {L_CONTIG, L_TRANSPOSED}, {L_TRANSPOSED, L_SLICED}, {L_BCAST0, L_TRANSPOSED},
};
#define NPAIRS (int)(sizeof pairs / sizeof pairs[0])
static const int triples[][3] = {
    {L_CONTIG, L_CONTIG, L_CONTIG}, {L_CONTIG, L_BCAST0, L_CONTIG}, {L_BCAST0, L_CONTIG, L_CONTIG},
    {L_TRANSPOSED, L_TRANSPOSED, L_TRANSPOSED}, {L_SLICED, L_CONTIG, L_TRANSPOSED}, {L_CONTIG, L_SLICED, L_SLICED},
    {L_TRANSPOSED, L_BCAST0, L_SLICED}, {L_SLICED, L_SLICED, L_CONTIG}, {L_BCAST0, L_BCAST0, L_CONTIG},
    {L_TRANSPOSED, L_CONTIG, L_CONTIG},
};
#define NTRIPLES (int)(sizeof triples / sizeof triples[0])

static void test_unary(void) {
    int bad = 0, ran = 0;
    for (int op = EM_OP_NEG; op <= EM_OP_CLAMP; op++)
        for (int di = 0; di < 8; di++) {
            em_dtype dt = all_dtypes[di];
            if (!be_has(&em__cpu_backend, (em_op)op, dt)) continue;
            const double *p = op >= EM_OP_ADD_SCALAR ? unary_params[op] : NULL;
            for (int s = 0; s < NSHAPES; s++)
                for (int pi = 0; pi < NPAIRS; pi++) {
                    if (BIG(s) && (pi > 1 || !BIG_DTYPE(dt))) continue;
                    check_unary((em_op)op, dt, s, pairs[pi][0], pairs[pi][1], p, &bad);
                    ran++;
                }
        }
    /* other exponents take other paths (x*x, sqrt, pow) */
    const double exps[][2] = {{2, 0}, {0.5, 0}, {1, 0}, {-1.5, 0}, {0, 0}};
    for (int e = 0; e < 5; e++)
        for (int di = 0; di < 4; di++) check_unary(EM_OP_POW_SCALAR, all_dtypes[di], 3, L_SLICED, L_CONTIG, exps[e], &bad);
    CHECK(bad == 0);
    CHECK(ran > 500);
}

/* supports answers for the elementwise ops and reductions as PyTorch would: float-only math
 * is float-only, bool is limited. */
static void test_supports_op(void) {
    CHECK(be_has(&em__cpu_backend, EM_OP_EXP, EM_F16));
    CHECK(!be_has(&em__cpu_backend, EM_OP_EXP, EM_I64));
    CHECK(!be_has(&em__cpu_backend, EM_OP_MEAN, EM_I32));
    CHECK(!be_has(&em__cpu_backend, EM_OP_NEG, EM_BOOL));
    CHECK(be_has(&em__cpu_backend, EM_OP_EQ, EM_BOOL));
    CHECK(be_has(&em__cpu_backend, EM_OP_ARGMAX, EM_U8));
    CHECK(!be_has(&em__cpu_backend, EM_OP_COUNT, EM_F32));
    for (int op = 0; op <= EM_OP_ARGMIN; op++) CHECK(be_has(&em__cpu_backend, (em_op)op, EM_F32));
    /* bool: exactly what PyTorch does on bool without promotion (sum promotes to int64 first) */
    const em_op on_bool[] = {EM_OP_ADD, EM_OP_MUL, EM_OP_MAXIMUM, EM_OP_MINIMUM, EM_OP_EQ, EM_OP_NE,
                             EM_OP_LT, EM_OP_LE, EM_OP_GT, EM_OP_GE, EM_OP_LOGICAL_AND, EM_OP_MAX,
                             EM_OP_MIN, EM_OP_ARGMAX, EM_OP_ARGMIN};
    for (int op = 0; op <= EM_OP_ARGMIN; op++) {
        bool want = false;
        for (size_t k = 0; k < sizeof on_bool / sizeof on_bool[0]; k++) want |= on_bool[k] == (em_op)op;
        if (be_has(&em__cpu_backend, (em_op)op, EM_BOOL) != want)
            fprintf(stderr, "  supports(op %d, bool) should be %s\n", op, want ? "true" : "false");
        CHECK(be_has(&em__cpu_backend, (em_op)op, EM_BOOL) == want);
    }
    int64_t shape[1] = {3};
    ttensor *x = tt_make(EM_I64, 1, shape, L_CONTIG), *y = tt_make(EM_I64, 1, shape, L_CONTIG);
    tt_fill_random(x, 1, 5);
    CHECK(be_unary(&em__cpu_backend, EM_OP_EXP, &y->t, &x->t, NULL) == EM_ERR_NOT_SUPPORTED);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "exp");
    tt_free(x);
    tt_free(y);
}

static double ref_binary_f(em_op op, double a, double b) {
    switch (op) {
    case EM_OP_ADD: return a + b;
    case EM_OP_SUB: return a - b;
    case EM_OP_MUL: return a * b;
    case EM_OP_DIV: return a / b;
    case EM_OP_POW: return pow(a, b);
    case EM_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case EM_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    case EM_OP_EQ: return a == b;
    case EM_OP_NE: return a != b;
    case EM_OP_LT: return a < b;
    case EM_OP_LE: return a <= b;
    case EM_OP_GT: return a > b;
    case EM_OP_GE: return a >= b;
    default: return a != 0 && b != 0;
    }
}

static uint64_t ref_binary_i(em_op op, int64_t a, int64_t b) {
    switch (op) {
    case EM_OP_ADD: return (uint64_t)a + (uint64_t)b;
    case EM_OP_SUB: return (uint64_t)a - (uint64_t)b;
    case EM_OP_MUL: return (uint64_t)a * (uint64_t)b;
    case EM_OP_DIV: return b == 0 ? 0 : b == -1 ? 0 - (uint64_t)a : (uint64_t)(a / b);
    case EM_OP_POW: return ipow_ref(a, b);
    case EM_OP_MAXIMUM: return (uint64_t)(a > b ? a : b);
    case EM_OP_MINIMUM: return (uint64_t)(a < b ? a : b);
    default: return (uint64_t)ref_binary_f(op, (double)a, (double)b);
    }
}

static void check_binary(em_op op, em_dtype dt, int s, int la, int lb, int lo, bool inplace, int *bad) {
    const tshape *sh = &shapes[s];
    bool pred = op >= EM_OP_EQ;
    em_dtype odt = pred ? EM_BOOL : dt;
    ttensor *a = tt_make(dt, sh->ndim, sh->d, (tlayout)la), *b = tt_make(dt, sh->ndim, sh->d, (tlayout)lb);
    fill_inputs(a, op, 0);
    fill_inputs(b, op, 1);
    int64_t n = tt_numel(&a->t);
    /* make some elements equal so that eq/le/ge see ties */
    if (lb != L_BCAST0 && la != L_BCAST0)
        for (int64_t i = 0; i < n; i += 3) tt_set(b, i, tt_get(a, i));
    double *av = malloc(sizeof(double) * (size_t)(n + 1)), *bv = malloc(sizeof(double) * (size_t)(n + 1));
    int64_t *ai = malloc(sizeof(int64_t) * (size_t)(n + 1)), *bi = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        av[i] = tt_get(a, i); bv[i] = tt_get(b, i);
        ai[i] = tt_get_i64(a, i); bi[i] = tt_get_i64(b, i);
    }
    ttensor *out = inplace ? a : tt_make(odt, sh->ndim, sh->d, (tlayout)lo);
    CHECK_OK(be_binary(&em__cpu_backend, op, &out->t, &a->t, &b->t));
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        double got = tt_get(out, i), want;
        if (is_int(dt)) {
            want = (double)wrap_to(ref_binary_i(op, ai[i], bi[i]), odt);
            ok = tt_get_i64(out, i) == (int64_t)want;
        } else {
            double r = ref_binary_f(op, av[i], bv[i]);
            want = round_to(r, odt);
            ok = tt_close(got, want, pred ? 0 : tt_tol(dt, r));
        }
        if (!ok && (*bad)++ < 10)
            fprintf(stderr, "  %s %s shape#%d %s,%s->%s%s [%lld] %g,%g: got %.9g want %.9g\n", em_dtype_name(dt),
                    op_name(op), s, tlayout_name[la], tlayout_name[lb], tlayout_name[lo], inplace ? " inplace" : "",
                    (long long)i, av[i], bv[i], got, want);
    }
    if ((!tt_guard_ok(out) || !tt_guard_ok(b)) && (*bad)++ < 10)
        fprintf(stderr, "  binary %s: guard bytes changed\n", op_name(op));
    free(av); free(bv); free(ai); free(bi);
    if (!inplace) tt_free(out);
    tt_free(a);
    tt_free(b);
}

static void test_binary(void) {
    int bad = 0, ran = 0;
    for (int op = EM_OP_ADD; op <= EM_OP_LOGICAL_AND; op++)
        for (int di = 0; di < 8; di++) {
            em_dtype dt = all_dtypes[di];
            if (!be_has(&em__cpu_backend, (em_op)op, dt)) continue;
            for (int s = 0; s < NSHAPES; s++)
                for (int ti = 0; ti < NTRIPLES; ti++) {
                    if (BIG(s) && (ti > 1 || !BIG_DTYPE(dt))) continue;
                    check_binary((em_op)op, dt, s, triples[ti][0], triples[ti][1], triples[ti][2], false, &bad);
                    ran++;
                }
            if (op < EM_OP_EQ) {
                check_binary((em_op)op, dt, 6, L_SLICED, L_BCAST0, L_SLICED, true, &bad);
                if (BIG_DTYPE(dt)) check_binary((em_op)op, dt, 8, L_CONTIG, L_CONTIG, L_CONTIG, true, &bad);
            }
        }
    CHECK(bad == 0);
    CHECK(ran > 1000);
}

/* Integer corner cases that are undefined in C give defined results (UBSan-clean). */
static void test_integer_corners(void) {
    int64_t shape[1] = {6};
    ttensor *a = tt_make(EM_I64, 1, shape, L_CONTIG), *b = tt_make(EM_I64, 1, shape, L_CONTIG);
    ttensor *o = tt_make(EM_I64, 1, shape, L_CONTIG);
    const int64_t av[6] = {INT64_MIN, 7, -7, INT64_MAX, 5, INT64_MIN};
    const int64_t bv[6] = {-1, 0, 2, 1, -2, 0};
    for (int i = 0; i < 6; i++) {
        memcpy(tt_ptr(a, i), &av[i], 8);
        memcpy(tt_ptr(b, i), &bv[i], 8);
    }
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_DIV, &o->t, &a->t, &b->t));
    CHECK(tt_get_i64(o, 0) == INT64_MIN);
    CHECK(tt_get_i64(o, 1) == 0);
    CHECK(tt_get_i64(o, 2) == -3);
    CHECK(tt_get_i64(o, 4) == -2);
    CHECK(tt_get_i64(o, 5) == 0);
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_ADD, &o->t, &a->t, &b->t));
    CHECK(tt_get_i64(o, 3) == INT64_MIN);
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_MUL, &o->t, &a->t, &a->t));
    CHECK(tt_get_i64(o, 0) == 0);
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_NEG, &o->t, &a->t, NULL));
    CHECK(tt_get_i64(o, 0) == INT64_MIN);
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_ABS, &o->t, &a->t, NULL));
    CHECK(tt_get_i64(o, 0) == INT64_MIN);
    double p[2] = {-INFINITY, INFINITY};
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_CLAMP, &o->t, &a->t, p));
    for (int i = 0; i < 6; i++) CHECK(tt_get_i64(o, i) == av[i]);
    ttensor *a32 = tt_make(EM_I32, 1, shape, L_CONTIG), *b32 = tt_make(EM_I32, 1, shape, L_CONTIG);
    ttensor *o32 = tt_make(EM_I32, 1, shape, L_CONTIG);
    tt_set(a32, 0, INT32_MIN);
    tt_set(b32, 0, -1);
    for (int i = 1; i < 6; i++) { tt_set(a32, i, 9); tt_set(b32, i, 0); }
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_DIV, &o32->t, &a32->t, &b32->t));
    CHECK(tt_get_i64(o32, 0) == INT32_MIN);
    CHECK(tt_get_i64(o32, 1) == 0);
    tt_free(a); tt_free(b); tt_free(o); tt_free(a32); tt_free(b32); tt_free(o32);
}

/* NaN propagates through maximum/minimum and clamp, as in PyTorch. */
static void test_nan_semantics(void) {
    int64_t shape[1] = {4};
    ttensor *a = tt_make(EM_F32, 1, shape, L_CONTIG), *b = tt_make(EM_F32, 1, shape, L_CONTIG);
    ttensor *o = tt_make(EM_F32, 1, shape, L_CONTIG);
    const double av[4] = {NAN, 1, NAN, -0.0}, bv[4] = {1, NAN, NAN, 2};
    for (int i = 0; i < 4; i++) { tt_set(a, i, av[i]); tt_set(b, i, bv[i]); }
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_MAXIMUM, &o->t, &a->t, &b->t));
    CHECK(isnan(tt_get(o, 0)) && isnan(tt_get(o, 1)) && isnan(tt_get(o, 2)) && tt_get(o, 3) == 2);
    CHECK_OK(be_binary(&em__cpu_backend, EM_OP_MINIMUM, &o->t, &a->t, &b->t));
    CHECK(isnan(tt_get(o, 0)) && isnan(tt_get(o, 1)) && isnan(tt_get(o, 2)));
    double p[2] = {0, 1};
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_CLAMP, &o->t, &a->t, p));
    CHECK(isnan(tt_get(o, 0)) && tt_get(o, 1) == 1);
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_RELU, &o->t, &a->t, NULL));
    CHECK(isnan(tt_get(o, 0)));
    CHECK_OK(be_unary(&em__cpu_backend, EM_OP_SIGN, &o->t, &a->t, NULL));
    CHECK(tt_get(o, 0) == 0); /* PyTorch: sign(nan) = 0 */
    tt_free(a); tt_free(b); tt_free(o);
}

static void test_where(void) {
    int bad = 0;
    for (int di = 0; di < 8; di++)
        for (int s = 0; s < NSHAPES; s++)
            for (int lc = 0; lc < L_LAYOUT_COUNT; lc++)
                for (int la = 0; la < L_LAYOUT_COUNT; la++)
                    for (int lo = 0; lo < 3; lo++) {
                        em_dtype dt = all_dtypes[di];
                        if (BIG(s) && (lc != L_CONTIG || la != L_CONTIG || lo != L_CONTIG || !BIG_DTYPE(dt))) continue;
                        const tshape *sh = &shapes[s];
                        ttensor *c = tt_make(EM_BOOL, sh->ndim, sh->d, (tlayout)lc);
                        ttensor *a = tt_make(dt, sh->ndim, sh->d, (tlayout)la);
                        ttensor *b = tt_make(dt, sh->ndim, sh->d, L_TRANSPOSED);
                        ttensor *o = tt_make(dt, sh->ndim, sh->d, (tlayout)lo);
                        tt_fill_random(c, 0, 1);
                        tt_fill_random(a, -50, 50);
                        tt_fill_random(b, -50, 50);
                        CHECK_OK(be_where(&em__cpu_backend, &o->t, &c->t, &a->t, &b->t));
                        int64_t n = tt_numel(&o->t);
                        for (int64_t i = 0; i < n; i++) {
                            double want = tt_get(c, i) ? tt_get(a, i) : tt_get(b, i);
                            if (tt_get(o, i) != want && bad++ < 10)
                                fprintf(stderr, "  where %s [%lld]: got %g want %g\n", dtype_names[di], (long long)i,
                                        tt_get(o, i), want);
                        }
                        if (!tt_guard_ok(o)) bad++;
                        tt_free(c); tt_free(a); tt_free(b); tt_free(o);
                    }
    CHECK(bad == 0);
}

int main(void) {
    RUN(test_unary);
    RUN(test_supports_op);
    RUN(test_binary);
    RUN(test_integer_corners);
    RUN(test_nan_semantics);
    RUN(test_where);
    return test_summary();
}
