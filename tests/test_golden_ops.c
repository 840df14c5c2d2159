/* Golden tests against PyTorch: replays every case of tests/data/golden_ops.bin (made by
 * scripts/golden_ops.py, which documents the format) through Ember on every available
 * device, and compares dtype, shape and values with per-dtype tolerances. Each case on
 * each device counts as one test; the first mismatching elements are printed.
 * EMBER_GOLDEN_FILTER=substring replays only the cases whose name contains it. */
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "required_ops.h"

#define G_MAX_PARAMS 16
#define G_MAX_INPUTS 8

typedef struct gtensor {
    em_dtype dtype;
    int layout; /* 0 contiguous, 1 transposed (last two dims), 2 strided (every other element) */
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* in the file buffer; stored layout */
    size_t nbytes;
} gtensor;

typedef struct gcase {
    char name[128];
    char op[32];
    int nparams;
    double params[G_MAX_PARAMS];
    int ninputs;
    gtensor inputs[G_MAX_INPUTS];
    bool expect_error;
    em_status error;
    gtensor expected;
} gcase;

typedef struct gfile {
    uint8_t *buf;
    size_t size;
    int ncases;
    gcase *cases;
} gfile;

/* ---- parsing (every read is bounds-checked: a damaged file fails, it never crashes) ---- */

typedef struct rd { const uint8_t *p, *end; char err[160]; } rd;

static bool take(rd *r, void *dst, size_t n, const char *what) {
    if (r->err[0]) return false;
    if ((size_t)(r->end - r->p) < n) {
        snprintf(r->err, sizeof r->err, "truncated while reading %s", what);
        return false;
    }
    if (dst) memcpy(dst, r->p, n);
    r->p += n;
    return true;
}

static bool take_str(rd *r, char *dst, size_t size, const char *what) {
    uint16_t n = 0;
    if (!take(r, &n, 2, what)) return false;
    if (n >= size) {
        snprintf(r->err, sizeof r->err, "%s is %u bytes long, at most %zu expected", what, n, size - 1);
        return false;
    }
    if (!take(r, dst, n, what)) return false;
    dst[n] = '\0';
    return true;
}

static bool take_tensor(rd *r, gtensor *t) {
    uint8_t h[3];
    if (!take(r, h, 3, "tensor header")) return false;
    if (h[0] >= EM_DTYPE_COUNT || h[1] > 2 || h[2] > EM_MAX_DIMS) {
        snprintf(r->err, sizeof r->err, "bad tensor header: dtype %u, layout %u, ndim %u", h[0], h[1], h[2]);
        return false;
    }
    t->dtype = (em_dtype)h[0];
    t->layout = h[1];
    t->ndim = h[2];
    if ((t->layout == 1 && t->ndim < 2) || (t->layout == 2 && t->ndim < 1)) {
        snprintf(r->err, sizeof r->err, "layout %d needs more than %d dims", t->layout, t->ndim);
        return false;
    }
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (!take(r, &t->shape[i], 8, "shape")) return false;
        if (t->shape[i] < 0 || t->shape[i] > (1 << 24) || (t->numel *= t->shape[i]) > (1 << 24)) {
            snprintf(r->err, sizeof r->err, "bad shape (dim %d is %lld)", i, (long long)t->shape[i]);
            return false;
        }
    }
    size_t stored = (size_t)t->numel * (t->layout == 2 ? 2 : 1);
    t->nbytes = stored * em_dtype_size(t->dtype);
    t->data = r->p;
    return take(r, NULL, t->nbytes, "tensor data");
}

static bool take_case(rd *r, gcase *c) {
    uint8_t n;
    if (!take_str(r, c->name, sizeof c->name, "case name") || !take_str(r, c->op, sizeof c->op, "op name"))
        return false;
    if (!take(r, &n, 1, "parameter count")) return false;
    if (n > G_MAX_PARAMS) return snprintf(r->err, sizeof r->err, "%u parameters", n), false;
    c->nparams = n;
    for (int i = 0; i < n; i++)
        if (!take(r, &c->params[i], 8, "parameter")) return false;
    if (!take(r, &n, 1, "input count")) return false;
    if (n > G_MAX_INPUTS) return snprintf(r->err, sizeof r->err, "%u inputs", n), false;
    c->ninputs = n;
    for (int i = 0; i < n; i++)
        if (!take_tensor(r, &c->inputs[i])) return false;
    if (!take(r, &n, 1, "expectation")) return false;
    if (n > 1) return snprintf(r->err, sizeof r->err, "bad expectation kind %u", n), false;
    c->expect_error = n == 1;
    if (c->expect_error) {
        if (!take(r, &n, 1, "error code")) return false;
        if (n == EM_OK || n > EM_ERR_INTERNAL) return snprintf(r->err, sizeof r->err, "bad error code %u", n), false;
        c->error = (em_status)n;
        return true;
    }
    if (!take_tensor(r, &c->expected)) return false;
    if (c->expected.layout != 0) return snprintf(r->err, sizeof r->err, "expected output not contiguous"), false;
    return true;
}

/* Parse buf (the file now owns it). Returns false and a message in err on a bad file. */
static bool gfile_parse(gfile *g, uint8_t *buf, size_t size, char *err, size_t errsize) {
    memset(g, 0, sizeof *g);
    g->buf = buf;
    g->size = size;
    rd r = {buf, buf + size, ""};
    char magic[8];
    uint32_t version = 0, n = 0;
    if (take(&r, magic, 8, "magic") && memcmp(magic, "EMGOLD01", 8) != 0) snprintf(r.err, sizeof r.err, "bad magic");
    take(&r, &version, 4, "version");
    take(&r, &n, 4, "case count");
    if (!r.err[0] && (version != 1 || n > 100000))
        snprintf(r.err, sizeof r.err, "version %u with %u cases", version, n);
    if (!r.err[0]) {
        g->cases = calloc(n ? n : 1, sizeof *g->cases);
        for (uint32_t i = 0; i < n && !r.err[0]; i++) {
            if (take_case(&r, &g->cases[i])) g->ncases++;
            else {
                char tmp[sizeof r.err];
                memcpy(tmp, r.err, sizeof tmp);
                snprintf(r.err, sizeof r.err, "case %u: %.120s", i, tmp);
            }
        }
        if (!r.err[0] && r.p != r.end) snprintf(r.err, sizeof r.err, "%zu bytes after the last case", (size_t)(r.end - r.p));
    }
    if (r.err[0]) snprintf(err, errsize, "%s", r.err);
    return !r.err[0];
}

static void gfile_free(gfile *g) {
    free(g->cases);
    free(g->buf);
    memset(g, 0, sizeof *g);
}

static bool gfile_load(gfile *g, char *err, size_t errsize) {
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/golden_ops.bin", dir && *dir ? dir : "tests/data");
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, errsize, "cannot open %.200s", path), false;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
    bool ok = size > 0 && buf && fread(buf, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    if (!ok) {
        free(buf);
        return snprintf(err, errsize, "cannot read %.200s", path), false;
    }
    return gfile_parse(g, buf, (size_t)size, err, errsize);
}

/* ---- element decoding, independent of Ember's own conversions ---- */

static double f16_value(uint16_t h) {
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static double elem(const uint8_t *p, em_dtype dt, int64_t i) {
    union { float f; uint32_t u; } fb;
    switch (dt) {
    case EM_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    case EM_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
    case EM_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return f16_value(v); }
    case EM_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); fb.u = (uint32_t)v << 16; return fb.f; }
    case EM_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case EM_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case EM_U8: return p[i];
    case EM_BOOL: return p[i] != 0;
    default: return NAN;
    }
}

/* ---- tolerances ---- */

static bool op_in(const char *op, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(op, *list)) return true;
    return false;
}
/* Pure copies: bit-exact (the sign of zero included; any NaN matches any NaN). */
static const char *const copy_ops[] = {"to", "contiguous", "cat", "stack", "index_select", "gather", NULL};
/* Exact in any correct implementation: selections and comparisons. */
static const char *const exact_ops[] = {"neg", "abs", "relu", "maximum", "minimum", "max", "min", "argmax",
                                        "argmin", "clamp", "where", "one_hot", "eq", "ne", "lt", "le",
                                        "gt", "ge", NULL};
/* Ops that sum many terms: the order of summation may differ from PyTorch's. */
static const char *const accum_ops[] = {"sum", "mean", "matmul", "softmax", "log_softmax", NULL};

static void tolerance(const char *op, em_dtype dt, double *rtol, double *atol) {
    bool acc = op_in(op, accum_ops);
    switch (dt) {
    case EM_F64: *rtol = acc ? 1e-10 : 1e-12; *atol = acc ? 1e-10 : 1e-12; break;
    case EM_F32: *rtol = acc ? 1e-4 : 1e-5; *atol = acc ? 1e-4 : 1e-6; break;
    case EM_F16: *rtol = acc ? 4e-3 : 2e-3; *atol = acc ? 2e-3 : 1e-4; break;  /* 1 ulp = 2^-10 relative */
    case EM_BF16: *rtol = acc ? 2e-2 : 1e-2; *atol = acc ? 1e-2 : 1e-3; break; /* 1 ulp = 2^-7 relative */
    default: *rtol = 0; *atol = 0; break;                                       /* integers, bool */
    }
    if (op_in(op, exact_ops) || op_in(op, copy_ops)) *rtol = *atol = 0;
}

/* ---- replay ---- */

static em_tensor *make_input(const gtensor *g, em_device dev) {
    em_shape stored = {g->ndim, {0}};
    for (int i = 0; i < g->ndim; i++) stored.d[i] = g->shape[i];
    if (g->layout == 1) {
        int64_t t = stored.d[g->ndim - 1];
        stored.d[g->ndim - 1] = stored.d[g->ndim - 2];
        stored.d[g->ndim - 2] = t;
    } else if (g->layout == 2) {
        stored.d[g->ndim - 1] *= 2;
    }
    /* the file's bytes are unaligned: hand Ember an aligned copy */
    void *aligned = malloc(g->nbytes ? g->nbytes : 1);
    if (!aligned) return NULL;
    memcpy(aligned, g->data, g->nbytes);
    em_tensor *host = em_from_data(aligned, g->dtype, stored, EM_OPTS(.dtype = g->dtype));
    free(aligned);
    em_tensor *on = em_to(host, dev);
    em_release(host);
    if (!on || g->layout == 0) return on;
    em_tensor *v = g->layout == 1 ? em_transpose(on, -1, -2)
                                  : em_slice(on, -1, 0, stored.d[g->ndim - 1], 2);
    em_release(on);
    return v;
}

typedef em_tensor *(*binary_fn)(em_tensor *, em_tensor *);
typedef em_tensor *(*scalar_fn)(em_tensor *, double);
typedef em_tensor *(*unary_fn)(em_tensor *);
typedef em_tensor *(*reduce_fn)(em_tensor *, em_dims, bool);

static const struct { const char *name; binary_fn fn; } binary_ops[] = {
    {"add", em_add}, {"sub", em_sub}, {"mul", em_mul}, {"div", em_div}, {"pow", em_pow},
    {"maximum", em_maximum}, {"minimum", em_minimum}, {"eq", em_eq}, {"ne", em_ne},
    {"lt", em_lt}, {"le", em_le}, {"gt", em_gt}, {"ge", em_ge}};
static const struct { const char *name; scalar_fn fn; } scalar_ops[] = {
    {"add_scalar", em_add_scalar}, {"sub_scalar", em_sub_scalar}, {"mul_scalar", em_mul_scalar},
    {"div_scalar", em_div_scalar}, {"pow_scalar", em_pow_scalar}};
static const struct { const char *name; unary_fn fn; } unary_ops[] = {
    {"neg", em_neg}, {"abs", em_abs}, {"exp", em_exp}, {"log", em_log}, {"sqrt", em_sqrt},
    {"tanh", em_tanh}, {"sigmoid", em_sigmoid}, {"relu", em_relu}, {"gelu", em_gelu},
    {"contiguous", em_contiguous}};
static const struct { const char *name; reduce_fn fn; } reduce_ops[] = {
    {"sum", em_sum}, {"mean", em_mean}, {"max", em_max}, {"min", em_min}};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Runs c's op on the inputs; NULL with an error pending when it fails. `known` is set
 * to false for an op name this test does not know (a newer data file). */
static em_tensor *run_op(const gcase *c, em_tensor **in, bool *known) {
    const char *op = c->op;
    const double *p = c->params;
    *known = true;
    for (int i = 0; i < COUNT(binary_ops); i++)
        if (!strcmp(op, binary_ops[i].name) && c->ninputs == 2) return binary_ops[i].fn(in[0], in[1]);
    for (int i = 0; i < COUNT(scalar_ops); i++)
        if (!strcmp(op, scalar_ops[i].name) && c->nparams == 1) return scalar_ops[i].fn(in[0], p[0]);
    for (int i = 0; i < COUNT(unary_ops); i++)
        if (!strcmp(op, unary_ops[i].name) && c->ninputs == 1) return unary_ops[i].fn(in[0]);
    for (int i = 0; i < COUNT(reduce_ops); i++)
        if (!strcmp(op, reduce_ops[i].name) && c->nparams >= 1) {
            em_dims dims = EM_ALL_DIMS;
            dims.n = c->nparams - 1;
            for (int d = 0; d < dims.n && d < EM_MAX_DIMS; d++) dims.d[d] = (int)p[d + 1];
            return reduce_ops[i].fn(in[0], dims, p[0] != 0);
        }
    if (!strcmp(op, "clamp") && c->nparams == 2) return em_clamp(in[0], p[0], p[1]);
    if (!strcmp(op, "where") && c->ninputs == 3) return em_where(in[0], in[1], in[2]);
    if (!strcmp(op, "argmax") && c->nparams == 2) return em_argmax(in[0], (int)p[0], p[1] != 0);
    if (!strcmp(op, "argmin") && c->nparams == 2) return em_argmin(in[0], (int)p[0], p[1] != 0);
    if (!strcmp(op, "matmul") && c->ninputs == 2) return em_matmul(in[0], in[1]);
    if (!strcmp(op, "softmax") && c->nparams == 1) return em_softmax(in[0], (int)p[0]);
    if (!strcmp(op, "log_softmax") && c->nparams == 1) return em_log_softmax(in[0], (int)p[0]);
    if (!strcmp(op, "index_select") && c->nparams == 1) return em_index_select(in[0], (int)p[0], in[1]);
    if (!strcmp(op, "gather") && c->nparams == 1) return em_gather(in[0], (int)p[0], in[1]);
    if (!strcmp(op, "cat") && c->nparams == 1) return em_cat(in, c->ninputs, (int)p[0]);
    if (!strcmp(op, "stack") && c->nparams == 1) return em_stack(in, c->ninputs, (int)p[0]);
    if (!strcmp(op, "one_hot") && c->nparams == 1) return em_one_hot(in[0], (int64_t)p[0]);
    if (!strcmp(op, "to") && !c->expect_error) return em_to_dtype(in[0], c->expected.dtype);
    *known = false;
    return NULL;
}

typedef enum { R_PASS, R_FAIL, R_UNSUPPORTED } result;

/* Details are printed for the first failures on a device only (a backend that fails
 * everything would otherwise bury the summary). */
static bool g_verbose = true;
#define NOTE(...) (g_verbose ? (void)fprintf(stderr, __VA_ARGS__) : (void)0)

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

/* Compares out with the expected tensor; prints the first mismatches. */
static bool compare(const gcase *c, const char *where, em_tensor *out, em_device dev) {
    const gtensor *e = &c->expected;
    if (em_dtype_of(out) != e->dtype) {
        NOTE("  %s %s: dtype %s, expected %s\n", where, c->name, em_dtype_name(em_dtype_of(out)),
                em_dtype_name(e->dtype));
        return false;
    }
    em_shape s = em_shape_of(out);
    bool same = s.ndim == e->ndim;
    for (int i = 0; same && i < s.ndim; i++) same = s.d[i] == e->shape[i];
    if (!same) {
        char a[128], b[128];
        shape_str(a, sizeof a, s.ndim, s.d);
        shape_str(b, sizeof b, e->ndim, e->shape);
        NOTE("  %s %s: shape %s, expected %s\n", where, c->name, a, b);
        return false;
    }
    if (!em_device_equal(em_device_of(out), dev)) {
        NOTE("  %s %s: result on %s\n", where, c->name, em_device_str(em_device_of(out)).s);
        return false;
    }
    uint8_t *got = malloc(e->nbytes ? e->nbytes : 1);
    if (!got || em_copy_to_host(out, got, e->nbytes) != EM_OK) {
        NOTE("  %s %s: copy to host failed: %s\n", where, c->name, em_last_error());
        free(got);
        return false;
    }
    double rtol, atol;
    tolerance(c->op, e->dtype, &rtol, &atol);
    bool bitwise = op_in(c->op, copy_ops);
    size_t esz = em_dtype_size(e->dtype);
    int bad = 0;
    for (int64_t i = 0; i < e->numel; i++) {
        double g = elem(got, e->dtype, i), x = elem(e->data, e->dtype, i);
        bool ok;
        if (isnan(x) || isnan(g)) ok = isnan(x) && isnan(g);
        else if (bitwise) ok = !memcmp(got + (size_t)i * esz, e->data + (size_t)i * esz, esz);
        else if (isinf(x) || isinf(g)) ok = g == x;
        else ok = fabs(g - x) <= atol + rtol * fabs(x);
        if (!ok && ++bad <= 5)
            NOTE("  %s %s: element %lld is %.9g, expected %.9g (rtol %g, atol %g)\n", where, c->name,
                    (long long)i, g, x, rtol, atol);
    }
    if (bad > 5) NOTE("  %s %s: %d of %lld elements differ\n", where, c->name, bad, (long long)e->numel);
    free(got);
    return bad == 0;
}

static result replay(const gcase *c, em_device dev) {
    char where[48];
    snprintf(where, sizeof where, "[%s]", em_device_str(dev).s);
    em_clear_error();
    em_tensor *in[G_MAX_INPUTS] = {0};
    for (int i = 0; i < c->ninputs; i++) in[i] = make_input(&c->inputs[i], dev);
    bool known = true; /* run_op is skipped when making the inputs failed */
    em_tensor *out = em_failed() ? NULL : run_op(c, in, &known);
    result r;
    if (em_failed() && !out && dev.type != EM_CPU && em_last_status() == EM_ERR_NOT_SUPPORTED &&
        !(c->expect_error && c->error == EM_ERR_NOT_SUPPORTED)) {
        /* a failure when tests/required_ops.txt requires the op of this backend, else a skip */
        const char *backend = em_device_type_name(dev.type);
        if (op_required(backend, c->op)) {
            NOTE("  %s %s: declined %s, which %s requires of %s: %s\n", where, c->name, c->op,
                 REQUIRED_OPS_FILE, backend, em_last_error());
            r = R_FAIL;
        } else {
            op_declined(backend, c->op, c->name, em_last_error());
            r = R_UNSUPPORTED;
        }
    } else if (!known && !em_failed()) {
        NOTE("  %s %s: unknown op '%s'\n", where, c->name, c->op);
        r = R_FAIL;
    } else if (c->expect_error) {
        r = !out && em_last_status() == c->error ? R_PASS : R_FAIL;
        if (r == R_FAIL)
            NOTE("  %s %s: expected error '%s', got %s%s%s\n", where, c->name, em_status_name(c->error),
                    out ? "a result" : em_status_name(em_last_status()), out ? "" : ": ", out ? "" : em_last_error());
    } else if (!out) {
        NOTE("  %s %s: failed: %s\n", where, c->name, em_last_error());
        r = R_FAIL;
    } else {
        r = compare(c, where, out, dev) ? R_PASS : R_FAIL;
        if (em_failed()) {
            NOTE("  %s %s: error left pending: %s\n", where, c->name, em_last_error());
            r = R_FAIL;
        }
    }
    em_release(out);
    for (int i = 0; i < c->ninputs; i++) em_release(in[i]);
    em_clear_error();
    return r;
}

/* ---- tests ---- */

static gfile g_file;
static bool g_loaded;

static void test_file_loads_and_covers_every_op(void) {
    CHECK(g_loaded);
    if (!g_loaded) return;
    static const char *const ops[] = {
        "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
        "add_scalar", "sub_scalar", "mul_scalar", "div_scalar", "pow_scalar", "clamp", "neg", "abs", "exp",
        "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "where", "sum", "mean", "max", "min", "argmax",
        "argmin", "matmul", "softmax", "log_softmax", "index_select", "gather", "cat", "stack", "one_hot",
        "to", "contiguous", "promote_types", NULL};
    for (const char *const *op = ops; *op; op++) {
        int n = 0;
        for (int i = 0; i < g_file.ncases; i++) n += !strcmp(g_file.cases[i].op, *op);
        if (n == 0) fprintf(stderr, "  no case for op %s\n", *op);
        CHECK(n > 0);
    }
    /* every dtype as an input and as an output, every layout, and some expected errors */
    bool in_dt[EM_DTYPE_COUNT] = {0}, out_dt[EM_DTYPE_COUNT] = {0}, layout[3] = {0};
    int errors = 0;
    for (int i = 0; i < g_file.ncases; i++) {
        const gcase *c = &g_file.cases[i];
        for (int j = 0; j < c->ninputs; j++) {
            in_dt[c->inputs[j].dtype] = true;
            layout[c->inputs[j].layout] = true;
        }
        if (c->expect_error) errors++;
        else out_dt[c->expected.dtype] = true;
    }
    for (int d = 0; d < EM_DTYPE_COUNT; d++) CHECK(in_dt[d] && out_dt[d]);
    CHECK(layout[0] && layout[1] && layout[2]);
    CHECK(errors > 0);
}

static void test_damaged_files_are_rejected(void) {
    if (!g_loaded) return;
    /* every truncation inside the first cases, and a few flipped header bytes */
    size_t limit = g_file.size < 3000 ? g_file.size : 3000;
    for (size_t n = 0; n < limit; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, g_file.buf, n);
        gfile g;
        char err[200] = "";
        bool ok = gfile_parse(&g, copy, n, err, sizeof err);
        CHECK(!ok && err[0]);
        gfile_free(&g);
    }
    static const size_t offsets[] = {0, 8, 12, 16}; /* magic, version, count, first name length */
    for (int k = 0; k < COUNT(offsets); k++) {
        uint8_t *copy = malloc(g_file.size);
        memcpy(copy, g_file.buf, g_file.size);
        copy[offsets[k]] ^= 0xFF;
        gfile g;
        char err[200] = "";
        CHECK(!gfile_parse(&g, copy, g_file.size, err, sizeof err));
        gfile_free(&g);
    }
}

static void test_promote_types(void) {
    if (!g_loaded) return;
    int n = 0;
    for (int i = 0; i < g_file.ncases; i++) {
        const gcase *c = &g_file.cases[i];
        if (strcmp(c->op, "promote_types") || c->nparams != 2) continue;
        em_dtype a = (em_dtype)c->params[0], b = (em_dtype)c->params[1];
        em_dtype got = em_promote_types(a, b);
        if (got != c->expected.dtype)
            fprintf(stderr, "  promote_types(%s, %s) = %s, expected %s\n", em_dtype_name(a), em_dtype_name(b),
                    em_dtype_name(got), em_dtype_name(c->expected.dtype));
        CHECK(got == c->expected.dtype);
        n++;
    }
    CHECK(n == EM_DTYPE_COUNT * EM_DTYPE_COUNT);
}

/* Every case on one device; each case is one passed or failed test. */
static void replay_device(em_device dev) {
    const char *filter = getenv("EMBER_GOLDEN_FILTER");
    int pass = 0, fail = 0, unsupported = 0;
    for (int i = 0; i < g_file.ncases; i++) {
        const gcase *c = &g_file.cases[i];
        if (!strcmp(c->op, "promote_types")) continue;
        if (filter && *filter && !strstr(c->name, filter)) continue;
        g_verbose = fail < 20;
        switch (replay(c, dev)) {
        case R_PASS: pass++; test__passed++; break;
        case R_FAIL: fail++; test__failed++; fprintf(stderr, "FAIL golden %s [%s]\n", c->name, em_device_str(dev).s); break;
        case R_UNSUPPORTED: unsupported++; break;
        }
    }
    if (fail > 20) fprintf(stderr, "  [%s] details shown for the first 20 failures only\n", em_device_str(dev).s);
    printf("%-9s golden cases: %d passed, %d failed, %d not supported by this backend\n", em_device_str(dev).s,
           pass, fail, unsupported);
}

int main(void) {
    char err[256] = "";
    g_loaded = gfile_load(&g_file, err, sizeof err);
    if (!g_loaded) fprintf(stderr, "golden data: %s\n", err);
    RUN(test_file_loads_and_covers_every_op);
    RUN(test_damaged_files_are_rejected);
    RUN(test_promote_types);
    static const em_device_type types[] = {EM_CPU, EM_OPENCL, EM_CUDA, EM_MPS};
    for (int t = 0; g_loaded && t < COUNT(types); t++) {
        if (!em_device_available(types[t])) {
            char name[48];
            snprintf(name, sizeof name, "golden replay on %s", em_device_type_name(types[t]));
            test_skip_case(name, "not available: %s", em_device_unavailable_reason(types[t]));
            continue;
        }
        for (int i = 0; i < em_device_count(types[t]); i++) replay_device(EM_DEVICE(types[t], i));
    }
    em_clear_error();
    gfile_free(&g_file);
    declines_report();
    return test_summary();
}
