/* Machinery for tests/test_backend_ops.c: the devices under test, host-side dtype
 * conversions written independently of Ember's, input layouts, output buffers with
 * sentinels, and the comparison against a double-precision reference. */
#ifndef EMBER_BACKEND_OPS_UTIL_H
#define EMBER_BACKEND_OPS_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/backend.h"
#include "backends/cpu/cpu_internal.h"
#include "backend_calls.h"
#include "core/tensor_impl.h"
#include "required_ops.h"
#include "test.h"

/* ---- devices under test: cpu, every opencl:N, every cuda:N ---- */
typedef struct target {
    em_device dev;
    const em_backend *be;
    char name[32];
} target;
static target g_targets[32];
static int g_ntargets;

static void targets_init(void) {
    g_ntargets = 0;
    em_device_type types[] = {EM_CPU, EM_OPENCL, EM_CUDA};
    for (int t = 0; t < 3; t++) {
        int n = em_device_count(types[t]);
        for (int i = 0; i < n && g_ntargets < 32; i++) {
            target *tg = &g_targets[g_ntargets];
            tg->dev = EM_DEVICE(types[t], i);
            tg->be = em__backend_for(types[t]);
            snprintf(tg->name, sizeof tg->name, "%s", em_device_str(tg->dev).s);
            if (tg->be) g_ntargets++;
        }
    }
    em_clear_error();
}

static const em_dtype ALL_DTYPES[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8, EM_BOOL};
#define N_DTYPES 8
static bool is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

/* ---- host conversions, independent of Ember's (round to nearest even) ---- */
static uint16_t h_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xff, m = x & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
    int ee = (int)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(sign | 0x7c00u);
    if (ee <= 0) { /* subnormal half */
        if (ee < -10) return (uint16_t)sign;
        m |= 0x800000u;
        int shift = 14 - ee;
        uint32_t hm = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1))) hm++;
        return (uint16_t)(sign | hm);
    }
    uint32_t hm = m >> 13, rem = m & 0x1fffu;
    uint32_t h = sign | ((uint32_t)ee << 10) | hm;
    if (rem > 0x1000u || (rem == 0x1000u && (hm & 1))) h++;
    return (uint16_t)h;
}
static float h_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    float f;
    if (e == 0) f = ldexpf((float)m, -24);
    else if (e == 31) f = m ? NAN : INFINITY;
    else f = ldexpf((float)(m | 0x400u), (int)e - 25);
    uint32_t x;
    memcpy(&x, &f, 4);
    x |= sign;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t h_f32_to_bf16(float f) { return test_f32_to_bf16(f); }
static float h_bf16_to_f32(uint16_t h) { return test_bf16_to_f32(h); }

/* v as stored in dt (floats rounded, integers truncated toward zero and wrapped) */
static double dt_round(em_dtype dt, double v) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F64: return v;
    case EM_F16: return h_f16_to_f32(h_f32_to_f16((float)v));
    case EM_BF16: return h_bf16_to_f32(h_f32_to_bf16((float)v));
    case EM_I64: return (double)(int64_t)v;
    case EM_I32: return (double)(int32_t)(uint32_t)(uint64_t)(int64_t)v;
    case EM_U8: return (double)(uint8_t)(uint64_t)(int64_t)v;
    case EM_BOOL: return v != 0;
    default: return v;
    }
}

static void encode(em_dtype dt, const double *v, int64_t n, void *out) {
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case EM_F32: ((float *)out)[i] = (float)v[i]; break;
        case EM_F64: ((double *)out)[i] = v[i]; break;
        case EM_F16: ((uint16_t *)out)[i] = h_f32_to_f16((float)v[i]); break;
        case EM_BF16: ((uint16_t *)out)[i] = h_f32_to_bf16((float)v[i]); break;
        case EM_I64: ((int64_t *)out)[i] = (int64_t)v[i]; break;
        case EM_I32: ((int32_t *)out)[i] = (int32_t)(int64_t)v[i]; break;
        case EM_U8: ((uint8_t *)out)[i] = (uint8_t)(int64_t)v[i]; break;
        case EM_BOOL: ((uint8_t *)out)[i] = v[i] != 0; break;
        default: break;
        }
    }
}

static void decode(em_dtype dt, const void *in, int64_t n, double *v) {
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case EM_F32: v[i] = ((const float *)in)[i]; break;
        case EM_F64: v[i] = ((const double *)in)[i]; break;
        case EM_F16: v[i] = h_f16_to_f32(((const uint16_t *)in)[i]); break;
        case EM_BF16: v[i] = h_bf16_to_f32(((const uint16_t *)in)[i]); break;
        case EM_I64: v[i] = (double)((const int64_t *)in)[i]; break;
        case EM_I32: v[i] = ((const int32_t *)in)[i]; break;
        case EM_U8: v[i] = ((const uint8_t *)in)[i]; break;
        case EM_BOOL: v[i] = ((const uint8_t *)in)[i]; break;
        default: break;
        }
    }
}

/* ---- deterministic inputs (a test-local LCG, not Ember's RNG) ---- */
static uint64_t g_lcg = 88172645463325252ull;
static uint32_t lcg(void) {
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_lcg >> 33);
}
typedef enum { V_GENERAL, V_POSITIVE, V_AWAY0, V_SMALLINT, V_UNIT } value_kind;
/* values exact in every float dtype (multiples of 1/32 with few bits) */
static double gen_value(em_dtype dt, value_kind k) {
    if (dt == EM_BOOL) return lcg() % 2;
    if (!is_float(dt)) {
        if (k == V_POSITIVE || k == V_AWAY0) return 1 + lcg() % 9;
        if (dt == EM_U8) return lcg() % 16;
        return (double)(int)(lcg() % 21) - 10;
    }
    double u = (double)(lcg() % 257) / 32.0; /* 0 .. 8 */
    switch (k) {
    case V_POSITIVE: return 0.125 + u;
    case V_AWAY0: return (lcg() % 2 ? 1 : -1) * (0.5 + u / 2);
    case V_SMALLINT: return (double)(int)(lcg() % 7) - 3;
    case V_UNIT: return u / 8 - 0.5;
    default: return u - 4;
    }
}
static double *gen(em_dtype dt, value_kind k, int64_t n) {
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = dt_round(dt, gen_value(dt, k));
    return v;
}

static int64_t shape_numel(em_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return n;
}

/* ---- input tensors in a layout, holding vals (row-major) ---- */
typedef enum { L_CONTIG, L_TRANSPOSED, L_STRIDED, L_OFFSET, L_COUNT } layout;
static const char *layout_name(layout l) {
    static const char *n[] = {"contiguous", "transposed", "strided", "offset"};
    return n[l];
}

static em_tensor *make_tensor(const target *tg, em_dtype dt, em_shape sh, const double *vals,
                              layout l) {
    int64_t n = shape_numel(sh);
    int nd = sh.ndim;
    em_opts o = EM_OPTS(.dtype = dt, .device = tg->dev);
    if (l == L_TRANSPOSED && nd >= 2) {
        em_shape ts = sh;
        ts.d[nd - 1] = sh.d[nd - 2];
        ts.d[nd - 2] = sh.d[nd - 1];
        int64_t R = sh.d[nd - 2], C = sh.d[nd - 1], B = (R * C != 0) ? n / (R * C) : 0;
        double *tv = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t b = 0; b < B; b++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) tv[b * R * C + c * R + r] = vals[b * R * C + r * C + c];
        void *buf = malloc(8 * (size_t)(n ? n : 1));
        encode(dt, tv, n, buf);
        em_tensor *t = em_from_data(buf, dt, ts, o);
        free(tv);
        free(buf);
        return em_transpose(t, nd - 2, nd - 1);
    }
    if ((l == L_STRIDED || l == L_TRANSPOSED) && nd >= 1) {
        /* every other element of the last dim, starting at 1, of a wider tensor */
        em_shape ws = sh;
        int64_t L = sh.d[nd - 1];
        ws.d[nd - 1] = 2 * L + 1;
        int64_t wn = shape_numel(ws), rows = L ? n / L : 0;
        double *wv = malloc(sizeof(double) * (size_t)(wn ? wn : 1));
        for (int64_t i = 0; i < wn; i++) wv[i] = dt_round(dt, -99);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < L; c++) wv[r * (2 * L + 1) + 1 + 2 * c] = vals[r * L + c];
        void *buf = malloc(8 * (size_t)(wn ? wn : 1));
        encode(dt, wv, wn, buf);
        em_tensor *w = em_from_data(buf, dt, ws, o);
        free(wv);
        free(buf);
        return em_slice(w, nd - 1, 1, 1 + 2 * L, 2);
    }
    if (l == L_OFFSET && nd >= 1) {
        /* rows 1 .. of a tensor with two more rows */
        em_shape ws = sh;
        ws.d[0] = sh.d[0] + 2;
        int64_t wn = shape_numel(ws), row = sh.d[0] ? n / sh.d[0] : 0;
        double *wv = malloc(sizeof(double) * (size_t)(wn ? wn : 1));
        for (int64_t i = 0; i < wn; i++) wv[i] = dt_round(dt, -77);
        for (int64_t i = 0; i < n; i++) wv[row + i] = vals[i];
        void *buf = malloc(8 * (size_t)(wn ? wn : 1));
        encode(dt, wv, wn, buf);
        em_tensor *w = em_from_data(buf, dt, ws, o);
        free(wv);
        free(buf);
        return em_narrow(w, 0, 1, sh.d[0]);
    }
    void *buf = malloc(8 * (size_t)(n ? n : 1));
    encode(dt, vals, n, buf);
    em_tensor *t = em_from_data(buf, dt, sh, o);
    free(buf);
    return t;
}

/* ---- outputs: a view inside a larger tensor whose other elements must not change ---- */
typedef struct outbuf {
    em_tensor *big, *view;
    em_dtype dt;
    int64_t big_n;
    unsigned char *before; /* big's bytes before the op */
} outbuf;

static outbuf make_out(const target *tg, em_dtype dt, em_shape sh, layout l) {
    outbuf ob = {0};
    ob.dt = dt;
    int nd = sh.ndim;
    em_shape bs = sh;
    if (nd == 0) bs = EM_SHAPE(3);
    else {
        bs.d[0] = sh.d[0] + 2;
        if (l == L_STRIDED || l == L_TRANSPOSED) bs.d[nd - 1] = 2 * sh.d[nd - 1] + (nd == 1 ? 5 : 1);
    }
    ob.big_n = shape_numel(bs);
    double *v = malloc(sizeof(double) * (size_t)ob.big_n);
    for (int64_t i = 0; i < ob.big_n; i++) v[i] = dt_round(dt, 50 + (double)(i % 37));
    size_t es = em_dtype_size(dt);
    ob.before = malloc(es * (size_t)ob.big_n);
    encode(dt, v, ob.big_n, ob.before);
    free(v);
    ob.big = em_from_data(ob.before, dt, bs, EM_OPTS(.dtype = dt, .device = tg->dev));
    bool strided = l == L_STRIDED || l == L_TRANSPOSED;
    if (nd == 0) {
        ob.view = em_select(ob.big, 0, 1);
    } else if (nd == 1 && strided) {
        ob.view = em_slice(ob.big, 0, 3, 3 + 2 * sh.d[0], 2);
    } else {
        em_tensor *t = em_narrow(ob.big, 0, 1, sh.d[0]);
        if (strided) t = em_slice(t, nd - 1, 1, 1 + 2 * sh.d[nd - 1], 2);
        ob.view = t;
    }
    /* the view must have exactly the requested shape */
    if (ob.view && (em_ndim(ob.view) != nd || shape_numel(em_shape_of(ob.view)) != shape_numel(sh))) {
        fprintf(stderr, "  make_out: view has the wrong shape\n");
        abort();
    }
    return ob;
}

/* Compare: tolerance as normalized squared error by dtype; NaN/Inf must match. */
static double nmse_limit(em_dtype dt) {
    switch (dt) {
    case EM_F32: return 1e-9;
    case EM_F64: return 1e-20;
    case EM_F16: return 1e-6;
    case EM_BF16: return 1e-4;
    default: return 0;
    }
}

static char g_ctx[256]; /* what the current case is, for failure messages */

/* got vs ref over n elements: prints the first mismatches; returns true when they agree */
static bool compare_values(const double *got, const double *ref, int64_t n, em_dtype dt,
                           double limit) {
    if (n <= 0) return true;
    double num = 0, den = 0;
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (isnan(r) || isnan(g) || isinf(r) || isinf(g)) {
            bool same = (isnan(r) && isnan(g)) || (g == r);
            if (!same && bad < 0) bad = i;
            continue;
        }
        if (limit == 0 && g != r && bad < 0) bad = i;
        num += (g - r) * (g - r);
        den += r * r;
    }
    double nmse = den > 0 ? num / den : num;
    if (bad >= 0 || nmse > limit) {
        int64_t i = bad >= 0 ? bad : 0;
        if (bad < 0)
            for (int64_t j = 0; j < n; j++)
                if (fabs(got[j] - ref[j]) > fabs(got[i] - ref[i])) i = j;
        fprintf(stderr, "  %s [%s]: nmse %.3g (limit %.3g); element %lld: got %.9g, expected %.9g\n",
                g_ctx, em_dtype_name(dt), nmse, limit, (long long)i, got[i], ref[i]);
        return false;
    }
    return true;
}

/* Read a tensor (any layout) to host doubles, row-major. */
static double *read_tensor(const em_tensor *t) {
    int64_t n = em_numel(t);
    size_t es = em_dtype_size(em_dtype_of(t));
    void *raw = malloc(es * (size_t)(n ? n : 1));
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (em_copy_to_host(t, raw, es * (size_t)n) != EM_OK) {
        fprintf(stderr, "  %s: reading back failed: %s\n", g_ctx, em_last_error());
        em_clear_error();
        for (int64_t i = 0; i < n; i++) v[i] = NAN;
    } else {
        decode(em_dtype_of(t), raw, n, v);
    }
    free(raw);
    return v;
}

/* Check an outbuf after the op: its view against ref, everything else unchanged. */
static bool check_out(outbuf *ob, const double *ref, double limit) {
    bool ok = true;
    size_t es = em_dtype_size(ob->dt);
    unsigned char *after = malloc(es * (size_t)ob->big_n);
    if (em_copy_to_host(ob->big, after, es * (size_t)ob->big_n) != EM_OK) {
        fprintf(stderr, "  %s: reading back failed: %s\n", g_ctx, em_last_error());
        em_clear_error();
        free(after);
        free(ob->before);
        return false;
    }
    /* which elements of big belong to the view */
    const em_tensor *v = ob->view;
    int64_t n = em_numel(v);
    unsigned char *mine = calloc((size_t)ob->big_n, 1);
    double *got = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, pos = v->offset - ob->big->offset;
        for (int d = v->ndim - 1; d >= 0; d--) {
            pos += (rem % v->shape[d]) * v->strides[d];
            rem /= v->shape[d];
        }
        mine[pos] = 1;
        decode(ob->dt, after + (size_t)pos * es, 1, &got[i]);
    }
    ok = compare_values(got, ref, n, ob->dt, limit);
    for (int64_t p = 0; p < ob->big_n; p++) {
        if (!mine[p] && memcmp(after + (size_t)p * es, ob->before + (size_t)p * es, es) != 0) {
            fprintf(stderr, "  %s: sentinel element %lld outside the output was overwritten\n",
                    g_ctx, (long long)p);
            ok = false;
            break;
        }
    }
    free(mine);
    free(got);
    free(after);
    free(ob->before);
    ob->before = NULL;
    return ok;
}

/* em_op's names, as tests/required_ops.txt spells them: the op list's (src/kernels/op_list.h) */
#define TEST_OP_NAME_(NAME, name, dtypes, gpu) #name,
static const char *op_name(em_op op) {
    static const char *const names[] = {EMK_OPS_ALL(TEST_OP_NAME_)};
    _Static_assert(sizeof names / sizeof names[0] == EM_OP_COUNT, "one name per em_op");
    return (int)op >= 0 && op < EM_OP_COUNT ? names[op] : "?";
}

/* Does the backend support (op, dt)? A pair the CPU reference declines too is not a case
 * (core casts first); any other decline is a failure when tests/required_ops.txt requires
 * the op of the backend, else reported as skipped. Never counted as passing. */
static int g_declined_pairs;
static bool op_supported(const target *tg, em_op op, em_dtype dt) {
    if (be_has(tg->be, op, dt)) return true;
    if (em__op_dtype_ok(op, dt)) { /* the CPU reference's dtypes */
        char ctx[96], float_only[40];
        snprintf(ctx, sizeof ctx, "%s %s %s", tg->name, op_name(op), em_dtype_name(dt));
        /* "op:float" in the list: required on the floating dtypes only */
        snprintf(float_only, sizeof float_only, "%s:float", op_name(op));
        bool required = op_required(tg->be->name, op_name(op)) ||
                        (em_dtype_is_floating(dt) && op_required(tg->be->name, float_only));
        op_declined_as(tg->be->name, op_name(op), required, ctx, "supports answers false");
        g_declined_pairs++;
    }
    return false;
}

/* Does the backend have this entry point? A missing one is a failure when the op is
 * required of the backend (tests/required_ops.txt), else reported once per device as
 * skipped; never counted as passing. */
static int g_declined_entries;
static bool has_entry(const target *tg, bool present, const char *what) {
    static char seen[64][48];
    static int nseen;
    if (present) return true;
    char key[48];
    snprintf(key, sizeof key, "%s/%s", tg->name, what);
    for (int i = 0; i < nseen; i++)
        if (strcmp(seen[i], key) == 0) {
            if (op_required(tg->be->name, what)) test__checks_failed_in_case++;
            return false;
        }
    if (nseen < 64) snprintf(seen[nseen++], sizeof seen[0], "%s", key);
    op_declined(tg->be->name, what, tg->name, "no entry point");
    g_declined_entries++;
    return false;
}

/* A backend status that must be OK; prints the error. */
static bool backend_ok(em_status s) {
    if (s == EM_OK) return true;
    fprintf(stderr, "  %s: backend returned %s: %s\n", g_ctx, em_status_name(s), em_last_error());
    em_clear_error();
    return false;
}

/* ---- the two-device run ---- */
static bool two_device_child(void) { return getenv("EMBER_TEST_TWO_DEVICES") != NULL; }

/* Re-run this program with two PoCL devices (POCL_DEVICES="pthread pthread") and the
 * GPU-style kernels (EMBER_OPENCL_CPU_KERNELS=0); the child's exit status is this case's
 * result. */
static void test_two_opencl_devices(void) {
    em_device_props p;
    if (em_device_count(EM_OPENCL) < 1 || em_device_get_props(EM_DEVICE(EM_OPENCL, 0), &p) != EM_OK ||
        !strstr(p.name, "pthread")) {
        em_clear_error();
        SKIP("the two-device run needs PoCL's pthread device");
    }
    printf("--- again with POCL_DEVICES=\"pthread pthread\" EMBER_OPENCL_CPU_KERNELS=0 ---\n");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("POCL_DEVICES", "pthread pthread", 1);
        setenv("EMBER_TEST_TWO_DEVICES", "1", 1);
        /* and the kernels a GPU would run (e.g. the tiled matmul), not the CPU-device ones */
        setenv("EMBER_OPENCL_CPU_KERNELS", "0", 1);
        execl("/proc/self/exe", "two-device run", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("--- end of the two-device run ---\n");
}

#endif
