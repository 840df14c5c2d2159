/* Unary (with scalar parameters), binary (arithmetic and comparisons) and where.
 * Each op has one contiguous kernel per compute type (f32, f64, i64). Contiguous operands
 * that already have the compute type go straight to it; anything else (strided, broadcast,
 * f16/bf16, i32/u8/bool) is converted through small blocks. Integer math wraps like
 * two's complement and x / 0 gives 0: no undefined behaviour for any input. */
#include "cpu_internal.h"
#include "cpu_vmath.h"

typedef void (*un_kernel)(const void *in, void *out, int64_t n, const double *p);
typedef void (*bin_kernel)(const void *a, const void *b, void *out, int64_t n);

#define OP_NAME(NAME, name, dtypes, gpu) #name,
static const char *const g_op_names[EM_OP_COUNT] = {EMK_OPS_ALL(OP_NAME)};
#undef OP_NAME

const char *em__cpu_op_name(em_op op) {
    return (int)op >= 0 && op < EM_OP_COUNT ? g_op_names[op] : "unknown op";
}

/* ---- kernels ----
 * Each op has restrict-qualified loops (which the compiler vectorizes at -O2) for the three
 * ways out may relate to the inputs: distinct, out == a (in place), out == b; plus a plain
 * loop for out == a == b. PCONV turns a double parameter into the compute type. */
#define VLOOP EM_CPU_VLOOP
#define UOP_P(T, SFX, NAME, EXPR, PCONV)                                                 \
    static void un_##SFX##_##NAME##_r(const T *restrict x, T *restrict o, int64_t n, T a, T b) { \
        VLOOP(n, T v = x[i]; o[i] = (EXPR);)                                             \
    }                                                                                    \
    static void un_##SFX##_##NAME##_i(T *restrict o, int64_t n, T a, T b) {              \
        VLOOP(n, T v = o[i]; o[i] = (EXPR);)                                             \
    }                                                                                    \
    static void un_##SFX##_##NAME(const void *vin, void *vout, int64_t n, const double *p) { \
        T a = p ? PCONV(p[0]) : 0, b = p ? PCONV(p[1]) : 0;                              \
        if (vin == vout) un_##SFX##_##NAME##_i(vout, n, a, b);                           \
        else un_##SFX##_##NAME##_r(vin, vout, n, a, b);                                  \
    }
#define BOP_T(T, OT, SFX, NAME, EXPR) BOP_L(T, OT, SFX, NAME, EXPR, VLOOP)
#define BOP_L(T, OT, SFX, NAME, EXPR, LOOP)                                              \
    static void bin_##SFX##_##NAME##_r(const T *restrict x, const T *restrict y, OT *restrict o, int64_t n) { \
        LOOP(n, T a = x[i]; T b = y[i]; o[i] = (OT)(EXPR);)                              \
    }                                                                                    \
    static void bin_##SFX##_##NAME##_ia(OT *restrict o, const T *restrict y, int64_t n) { \
        LOOP(n, T a = (T)o[i]; T b = y[i]; o[i] = (OT)(EXPR);)                           \
    }                                                                                    \
    static void bin_##SFX##_##NAME##_ib(const T *restrict x, OT *restrict o, int64_t n) { \
        LOOP(n, T a = x[i]; T b = (T)o[i]; o[i] = (OT)(EXPR);)                           \
    }                                                                                    \
    static void bin_##SFX##_##NAME(const void *va, const void *vb, void *vout, int64_t n) { \
        if (vout != va && vout != vb) {                                                  \
            bin_##SFX##_##NAME##_r(va, vb, vout, n);                                     \
        } else if (vout != vb) {                                                         \
            bin_##SFX##_##NAME##_ia(vout, vb, n);                                        \
        } else if (vout != va) {                                                         \
            bin_##SFX##_##NAME##_ib(va, vout, n);                                        \
        } else { /* a op a into a */                                                     \
            OT *o = vout;                                                                \
            for (int64_t k = 0; k < n; k++) {                                            \
                T a = (T)o[k], b = a;                                                    \
                o[k] = (OT)(EXPR);                                                       \
            }                                                                            \
        }                                                                                \
    }
#define FPARAM(x) (x)
#define UOP(T, SFX, NAME, EXPR) UOP_P(T, SFX, NAME, EXPR, (T)FPARAM)
#define BOP(T, SFX, NAME, EXPR) BOP_T(T, T, SFX, NAME, EXPR)
/* comparisons narrow to bytes: a plain loop, which the loop vectorizer packs 16 at a time
 * (the blocks of 8 that help the arithmetic ops left it at a quarter of mul's speed) */
#define PLAIN_LOOP(n, BODY) for (int64_t i = 0; i < (n); i++) { BODY }
#define COP(T, SFX, NAME, EXPR) BOP_L(T, uint8_t, SFX, NAME, EXPR, PLAIN_LOOP)

#define FLOAT_KERNELS(T, SFX)                                                            \
    UOP(T, SFX, neg, -v)                                                                 \
    UOP(T, SFX, abs, MF(fabs)(v))                                                        \
    UOP(T, SFX, exp, MF(exp)(v))                                                         \
    UOP(T, SFX, log, MF(log)(v))                                                         \
    UOP(T, SFX, sqrt, MF(sqrt)(v))                                                       \
    UOP(T, SFX, rsqrt, (T)1 / MF(sqrt)(v))                                               \
    UOP(T, SFX, tanh, MF(tanh)(v))                                                       \
    UOP(T, SFX, sigmoid, (T)1 / ((T)1 + MF(exp)(-v)))                                    \
    UOP(T, SFX, relu, v < 0 ? (T)0 : v)                                                  \
    UOP(T, SFX, sign, (T)((v > 0) - (v < 0)))                                            \
    UOP(T, SFX, square, v * v)                                                           \
    UOP(T, SFX, reciprocal, (T)1 / v)                                                    \
    UOP(T, SFX, add_scalar, v + a)                                                       \
    UOP(T, SFX, mul_scalar, v * a)                                                       \
    UOP(T, SFX, div_scalar, v / a)                                                       \
    UOP(T, SFX, rsub_scalar, a - v)                                                      \
    UOP(T, SFX, pow_scalar, a == 2 ? v * v : a == 1 ? v : a == (T)0.5 ? MF(sqrt)(v) : MF(pow)(v, a)) \
    UOP(T, SFX, clamp, v < a ? a : v > b ? b : v)                                        \
    BOP(T, SFX, add, a + b)                                                              \
    BOP(T, SFX, sub, a - b)                                                              \
    BOP(T, SFX, mul, a * b)                                                              \
    BOP(T, SFX, div, a / b)                                                              \
    BOP(T, SFX, pow, MF(pow)(a, b))                                                      \
    BOP(T, SFX, maximum, (a > b || a != a) ? a : b)                                      \
    BOP(T, SFX, minimum, (a < b || a != a) ? a : b)                                      \
    COP(T, SFX, eq, a == b)                                                              \
    COP(T, SFX, ne, a != b)                                                              \
    COP(T, SFX, lt, a < b)                                                               \
    COP(T, SFX, le, a <= b)                                                              \
    COP(T, SFX, gt, a > b)                                                               \
    COP(T, SFX, ge, a >= b)                                                              \
    COP(T, SFX, logical_and, (a != 0) & (b != 0))

#define MF(fn) fn##f
FLOAT_KERNELS(float, f32)
#undef MF
#define MF(fn) fn
FLOAT_KERNELS(double, f64)
UOP(double, f64, gelu, 0.5 * v * (1 + erf(v * 0.70710678118654752440)))
#undef MF
/* f32 GELU: the vectorized erf (cpu_vmath.c; glibc's erff is a scalar call per element) */
static void un_f32_gelu(const void *vin, void *vout, int64_t n, const double *p) {
    (void)p;
    em__cpu_vgelu_f32(vin, vout, n);
}

/* ---- integer kernels: int64 math, wrapping through uint64 ---- */
static inline int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t safe_div(int64_t a, int64_t b) {
    if (b == 0) return 0;                     /* C leaves it undefined; PyTorch raises */
    if (b == -1) return wrap_sub(0, a);       /* INT64_MIN / -1 wraps */
    return a / b;
}
/* a^e with wrapping; negative e gives 0 except for bases 1 and -1 (PyTorch refuses them). */
static inline int64_t ipow(int64_t a, int64_t e) {
    if (e < 0) return a == 1 ? 1 : a == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, base = (uint64_t)a;
    while (e) {
        if (e & 1) r *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)r;
}

#define UOPI(NAME, EXPR) UOP_P(int64_t, i64, NAME, EXPR, em__cpu_param_i64)
UOPI(neg, wrap_sub(0, v))
UOPI(abs, v < 0 ? wrap_sub(0, v) : v)
UOPI(sign, (v > 0) - (v < 0))
UOPI(square, wrap_mul(v, v))
UOPI(relu, v < 0 ? 0 : v)
UOPI(add_scalar, wrap_add(v, a))
UOPI(mul_scalar, wrap_mul(v, a))
UOPI(rsub_scalar, wrap_sub(a, v))
UOPI(pow_scalar, ipow(v, a))
UOPI(clamp, v < a ? a : v > b ? b : v)
BOP(int64_t, i64, add, wrap_add(a, b))
BOP(int64_t, i64, sub, wrap_sub(a, b))
BOP(int64_t, i64, mul, wrap_mul(a, b))
BOP(int64_t, i64, div, safe_div(a, b))
BOP(int64_t, i64, pow, ipow(a, b))
BOP(int64_t, i64, maximum, a > b ? a : b)
BOP(int64_t, i64, minimum, a < b ? a : b)
COP(int64_t, i64, eq, a == b)
COP(int64_t, i64, ne, a != b)
COP(int64_t, i64, lt, a < b)
COP(int64_t, i64, le, a <= b)
COP(int64_t, i64, gt, a > b)
COP(int64_t, i64, ge, a >= b)
COP(int64_t, i64, logical_and, (a != 0) & (b != 0))

/* ---- kernel tables, indexed by op ---- */
#define UROW(SFX) \
    [EM_OP_NEG] = un_##SFX##_neg, [EM_OP_ABS] = un_##SFX##_abs, [EM_OP_SIGN] = un_##SFX##_sign, \
    [EM_OP_SQUARE] = un_##SFX##_square, [EM_OP_RELU] = un_##SFX##_relu,                       \
    [EM_OP_ADD_SCALAR] = un_##SFX##_add_scalar, [EM_OP_MUL_SCALAR] = un_##SFX##_mul_scalar,   \
    [EM_OP_RSUB_SCALAR] = un_##SFX##_rsub_scalar, [EM_OP_POW_SCALAR] = un_##SFX##_pow_scalar, \
    [EM_OP_CLAMP] = un_##SFX##_clamp
#define UROW_FLOAT(SFX) \
    UROW(SFX), [EM_OP_EXP] = un_##SFX##_exp, [EM_OP_LOG] = un_##SFX##_log,                   \
    [EM_OP_SQRT] = un_##SFX##_sqrt, [EM_OP_RSQRT] = un_##SFX##_rsqrt,                          \
    [EM_OP_TANH] = un_##SFX##_tanh, [EM_OP_SIGMOID] = un_##SFX##_sigmoid,                      \
    [EM_OP_GELU] = un_##SFX##_gelu, [EM_OP_RECIPROCAL] = un_##SFX##_reciprocal,                \
    [EM_OP_DIV_SCALAR] = un_##SFX##_div_scalar
#define BROW(SFX) \
    [EM_OP_ADD] = bin_##SFX##_add, [EM_OP_SUB] = bin_##SFX##_sub, [EM_OP_MUL] = bin_##SFX##_mul, \
    [EM_OP_DIV] = bin_##SFX##_div, [EM_OP_POW] = bin_##SFX##_pow,                                \
    [EM_OP_MAXIMUM] = bin_##SFX##_maximum, [EM_OP_MINIMUM] = bin_##SFX##_minimum,                \
    [EM_OP_EQ] = bin_##SFX##_eq, [EM_OP_NE] = bin_##SFX##_ne, [EM_OP_LT] = bin_##SFX##_lt,       \
    [EM_OP_LE] = bin_##SFX##_le, [EM_OP_GT] = bin_##SFX##_gt, [EM_OP_GE] = bin_##SFX##_ge,       \
    [EM_OP_LOGICAL_AND] = bin_##SFX##_logical_and

static const un_kernel g_un_f32[EM_OP_COUNT] = {UROW_FLOAT(f32)};
static const un_kernel g_un_f64[EM_OP_COUNT] = {UROW_FLOAT(f64)};
static const un_kernel g_un_i64[EM_OP_COUNT] = {UROW(i64)};
static const bin_kernel g_bin_f32[EM_OP_COUNT] = {BROW(f32)};
static const bin_kernel g_bin_f64[EM_OP_COUNT] = {BROW(f64)};
static const bin_kernel g_bin_i64[EM_OP_COUNT] = {BROW(i64)};

static bool is_predicate(em_op op) { return op >= EM_OP_EQ && op <= EM_OP_LOGICAL_AND; }

/* ---- the loops ---- */
#define BLOCK 256

typedef struct ew_ctx {
    em_dtype in_dt, out_dt;
    em_dtype ct;      /* compute type of the inputs */
    em_dtype res_dt;  /* the kernel's result type: ct, or EM_BOOL for predicates */
    un_kernel uk;
    bin_kernel bk;
    const double *params;
} ew_ctx;

/* A contiguous compute-type view of operand run p, either p itself or converted into buf. */
static const void *as_input(const ew_ctx *c, const char *p, int64_t stride, int64_t m, void *buf) {
    if (c->in_dt == c->ct && stride == (int64_t)em__cpu_esize(c->ct)) return p;
    em__cpu_cast_block(buf, (int64_t)em__cpu_esize(c->ct), c->ct, p, stride, c->in_dt, m);
    return buf;
}

static void unary_blocks(const ew_ctx *c, char **d, const int64_t *st, int64_t n, int64_t rs, bool direct_out);
static void binary_blocks(const ew_ctx *c, char **d, const int64_t *st, int64_t n, int64_t rs, bool direct_out);

static void unary_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    const ew_ctx *c = arg;
    int64_t rs = (int64_t)em__cpu_esize(c->res_dt);
    bool direct_out = c->out_dt == c->res_dt && st[0] == rs;
    if (direct_out && c->in_dt == c->ct && st[1] == (int64_t)em__cpu_esize(c->ct)) {
        c->uk(d[1], d[0], n, c->params);
        return;
    }
    unary_blocks(c, d, st, n, rs, direct_out);
}

/* Kept out of line: its 4 KB of buffers would make every fast call pay stack probes. */
static __attribute__((noinline)) void unary_blocks(const ew_ctx *c, char **d, const int64_t *st, int64_t n,
                                                   int64_t rs, bool direct_out) {
    _Alignas(64) unsigned char bin[BLOCK * 8], bout[BLOCK * 8];
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        const void *x = as_input(c, d[1] + off * st[1], st[1], m, bin);
        void *o = direct_out ? (void *)(d[0] + off * st[0]) : (void *)bout;
        c->uk(x, o, m, c->params);
        if (!direct_out) em__cpu_cast_block(d[0] + off * st[0], st[0], c->out_dt, (const char *)bout, rs, c->res_dt, m);
    }
}

static void binary_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    const ew_ctx *c = arg;
    int64_t rs = (int64_t)em__cpu_esize(c->res_dt), cs = (int64_t)em__cpu_esize(c->ct);
    bool direct_out = c->out_dt == c->res_dt && st[0] == rs;
    if (direct_out && c->in_dt == c->ct && st[1] == cs && st[2] == cs) {
        c->bk(d[1], d[2], d[0], n);
        return;
    }
    binary_blocks(c, d, st, n, rs, direct_out);
}

static __attribute__((noinline)) void binary_blocks(const ew_ctx *c, char **d, const int64_t *st, int64_t n,
                                                    int64_t rs, bool direct_out) {
    _Alignas(64) unsigned char ba[BLOCK * 8], bb[BLOCK * 8], bout[BLOCK * 8];
    /* a broadcast operand (stride 0: x > 0) is the same block every time: convert it once */
    int64_t m0 = n < BLOCK ? n : BLOCK;
    const void *x0 = st[1] == 0 ? as_input(c, d[1], 0, m0, ba) : NULL;
    const void *y0 = st[2] == 0 ? as_input(c, d[2], 0, m0, bb) : NULL;
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        const void *x = x0 ? x0 : as_input(c, d[1] + off * st[1], st[1], m, ba);
        const void *y = y0 ? y0 : as_input(c, d[2] + off * st[2], st[2], m, bb);
        void *o = direct_out ? (void *)(d[0] + off * st[0]) : (void *)bout;
        c->bk(x, y, o, m);
        if (!direct_out) em__cpu_cast_block(d[0] + off * st[0], st[0], c->out_dt, (const char *)bout, rs, c->res_dt, m);
    }
}

/* If t (with out's shape) repeats a contiguous block over its leading dims (strides 0 there,
 * row-major after), the block's length; else 0. A contiguous tensor's block is all of it. */
static int64_t repeat_period(const em_tensor *t) {
    int64_t expect = 1;
    int d = t->ndim - 1;
    for (; d >= 0; d--) {
        if (t->shape[d] == 1) continue;
        if (t->strides[d] != expect) break;
        expect *= t->shape[d];
    }
    for (; d >= 0; d--)
        if (t->shape[d] != 1 && t->strides[d] != 0) return 0;
    return expect;
}

static em_status not_supported(em_op op, em_dtype dt) {
    return em_error(EM_ERR_NOT_SUPPORTED, "cpu: %s is not supported for dtype %s", em__cpu_op_name(op),
                    em_dtype_name(dt));
}

em_status em__cpu_unary(em_op op, em_tensor *out, const em_tensor *in, const double *params) {
    if (op > EM_OP_CLAMP || !em__op_dtype_ok(op, in->dtype)) return not_supported(op, in->dtype);
    ew_ctx c = {in->dtype, out->dtype, em__cpu_compute_type(in->dtype), em__cpu_compute_type(in->dtype),
                NULL, NULL, params};
    c.uk = c.ct == EM_F32 ? g_un_f32[op] : c.ct == EM_F64 ? g_un_f64[op] : g_un_i64[op];
    if (!c.uk) return not_supported(op, in->dtype);
    if (op >= EM_OP_ADD_SCALAR && !params)
        return em_error(EM_ERR_INTERNAL, "cpu: %s needs its scalar parameters", em__cpu_op_name(op));
    if (op == EM_OP_RELU && em__cpu_relu_bf16_applies(out, in)) { /* bf16 without the float32 round trip */
        em__cpu_relu_bf16(out, in);
        return EM_OK;
    }
    int64_t n = em__cpu_numel(out);
    if (n < EM_CPU_PARALLEL_ELEMS && in->dtype == c.ct && out->dtype == c.res_dt && em__cpu_is_contiguous(out) &&
        em__cpu_is_contiguous(in)) { /* small and dense: straight to the kernel */
        if (n > 0) c.uk(em__host_ptr(in), em__host_ptr(out), n, params);
        return EM_OK;
    }
    const em_tensor *ts[2] = {out, in};
    cpu_iter it;
    em__cpu_iter_init(&it, 2, ts, false);
    em__cpu_iter_run(&it, unary_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}

/* Small dense out, one operand a broadcast scalar: the scalar repeated once into a block,
 * then the kernel straight over the other operand (the iterator would convert the scalar
 * into every block again: 5x the time of the op on a [64, 256] tensor). */
static __attribute__((noinline)) void binary_scalar(const ew_ctx *c, const em_tensor *a, const em_tensor *b,
                                                    em_tensor *out, int64_t n, bool a_scalar) {
    _Alignas(64) unsigned char rep[BLOCK * 8];
    size_t es = em__cpu_esize(c->ct), os = em__cpu_esize(c->res_dt);
    const char *xs = em__host_ptr(a_scalar ? a : b), *xd = em__host_ptr(a_scalar ? b : a);
    int64_t m0 = n < BLOCK ? n : BLOCK;
    for (int64_t k = 0; k < m0; k++) memcpy(rep + (size_t)k * es, xs, es);
    char *xo = em__host_ptr(out);
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        const char *d = xd + (size_t)off * es;
        if (a_scalar) c->bk(rep, d, xo + (size_t)off * os, m);
        else c->bk(d, rep, xo + (size_t)off * os, m);
    }
}

em_status em__cpu_binary(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b) {
    if (op < EM_OP_ADD || op > EM_OP_LOGICAL_AND || !em__op_dtype_ok(op, a->dtype))
        return not_supported(op, a->dtype);
    if (a->dtype != b->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: %s got inputs of dtypes %s and %s (core casts them to one)",
                        em__cpu_op_name(op), em_dtype_name(a->dtype), em_dtype_name(b->dtype));
    em_dtype ct = em__cpu_compute_type(a->dtype);
    ew_ctx c = {a->dtype, out->dtype, ct, is_predicate(op) ? EM_BOOL : ct, NULL, NULL, NULL};
    c.bk = ct == EM_F32 ? g_bin_f32[op] : ct == EM_F64 ? g_bin_f64[op] : g_bin_i64[op];
    int64_t n = em__cpu_numel(out);
    if (n < EM_CPU_PARALLEL_ELEMS && a->dtype == ct && out->dtype == c.res_dt && em__cpu_is_contiguous(out)) {
        /* small, dense out: inputs dense or repeating a dense block (a bias row): rows of the
         * shortest block straight to the kernel, no iterator */
        int64_t pa = repeat_period(a), pb = repeat_period(b), p = pa < pb ? pa : pb;
        if (p == n || (p >= 16 && n > 0)) {
            size_t es = em__cpu_esize(ct), os = em__cpu_esize(c.res_dt);
            const char *xa = em__host_ptr(a), *xb = em__host_ptr(b);
            char *xo = em__host_ptr(out);
            int64_t oa = 0, ob = 0; /* offsets into a and b; each period is a multiple of p */
            for (int64_t r = 0; r < n; r += p) {
                c.bk(xa + (size_t)oa * es, xb + (size_t)ob * es, xo + (size_t)r * os, p);
                if ((oa += p) == pa) oa = 0;
                if ((ob += p) == pb) ob = 0;
            }
            return EM_OK;
        }
        if ((pa == 1 && pb == n) || (pb == 1 && pa == n)) { /* dense with a scalar (x > 0, g * 0.5) */
            binary_scalar(&c, a, b, out, n, pa == 1);
            return EM_OK;
        }
    }
    const em_tensor *ts[3] = {out, a, b};
    cpu_iter it;
    em__cpu_iter_init(&it, 3, ts, false);
    em__cpu_iter_run(&it, binary_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}

/* ---- where: out = cond ? a : b, moving bytes of out's element size ---- */
/* Strided select of T-sized elements; the contiguous forms (the second operand a scalar, as
 * in relu's backward where(x > 0, g, 0), or a tensor) get loops the compiler vectorizes. */
#define WHERE_TYPED(T)                                                                           \
    do {                                                                                         \
        if (st[0] == sizeof(T) && st[1] == 1 && st[2] == sizeof(T) && (st[3] == 0 || st[3] == sizeof(T))) { \
            T *o_ = (T *)o;                                                                      \
            const T *a_ = (const T *)a, *b_ = (const T *)b;                                      \
            if (st[3] == 0) {                                                                    \
                T bv = *b_;                                                                      \
                for (int64_t k = 0; k < n; k++) {  /* masks, not branches: conditions are random */ \
                    T m_ = (T)0 - (T)(c[k] != 0);                                                \
                    o_[k] = (T)((a_[k] & m_) | (bv & (T)~m_));                                   \
                }                                                                                \
            } else {                                                                             \
                for (int64_t k = 0; k < n; k++) {                                                \
                    T m_ = (T)0 - (T)(c[k] != 0);                                                \
                    o_[k] = (T)((a_[k] & m_) | (b_[k] & (T)~m_));                                \
                }                                                                                \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        for (int64_t k = 0; k < n; k++, o += st[0], c += st[1], a += st[2], b += st[3])         \
            *(T *)o = *c ? *(const T *)a : *(const T *)b;                                        \
        return;                                                                                  \
    } while (0)

static void where_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    size_t es = *(const size_t *)arg;
    char *o = d[0];
    const char *c = d[1], *a = d[2], *b = d[3];
    switch (es) {
    case 1: WHERE_TYPED(uint8_t);
    case 2: WHERE_TYPED(uint16_t);
    case 4: WHERE_TYPED(uint32_t);
    case 8: WHERE_TYPED(uint64_t);
    default:
        for (int64_t k = 0; k < n; k++, o += st[0], c += st[1], a += st[2], b += st[3])
            memmove(o, *c ? a : b, es);
    }
}
#undef WHERE_TYPED

em_status em__cpu_where(em_tensor *out, const em_tensor *cond, const em_tensor *a, const em_tensor *b) {
    if (cond->dtype != EM_BOOL || a->dtype != out->dtype || b->dtype != out->dtype)
        return em_error(EM_ERR_INTERNAL, "cpu: where expects a bool condition and inputs of out's dtype %s",
                        em_dtype_name(out->dtype));
    size_t es = em__cpu_esize(out->dtype);
    const em_tensor *ts[4] = {out, cond, a, b};
    cpu_iter it;
    em__cpu_iter_init(&it, 4, ts, false);
    em__cpu_iter_run(&it, where_loop, &es, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}
